"""GPU memory after a server: whether it was released, decided by pid where pids can be trusted,
else by device.

One look at the GPUs (:func:`read_gpus`: NVML through ``pynvml`` when installed, else
``nvidia-smi``) gives the MiB each compute process holds, by the pid the tool reports, and the MiB
used on each device. The teardown waits (:func:`wait_gpu_release`) until a finished server's memory
is gone, by one of two methods:

- **pids**: no pid of the server is listed. Trusted only when the listing is non-empty and every pid
  in it names a process of this pid namespace.
- **device memory**: inside a container without the host's pid namespace, NVML reports host pids,
  which never match the pids seen here, and a container may list no process at all
  (docs/sglang-facts.md, "Process teardown"); matching pids would say "released" at once while the
  memory is still held. Then every GPU the server was given (``CUDA_VISIBLE_DEVICES`` of its
  environment, else all) must be back within max(512 MiB, 2 % of its memory) of its use recorded
  just before the launch (:func:`device_baseline`). Memory taken meanwhile by another tenant of
  those GPUs keeps the answer "held": from here it cannot be told apart.

"unchecked" when no GPU tool answers, or when the listing cannot be trusted and no pre-launch use
was recorded. A host pid that happens to equal a live pid here cannot be detected; it makes the
listing look trustworthy.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import psutil

from bisect_eagle.poll import wait_until

# a device is back to its pre-launch use within max(this, TOLERANCE_FRACTION of its memory)
TOLERANCE_MIB = 512
TOLERANCE_FRACTION = 0.02
MIB = 2**20


@dataclass(frozen=True)
class Device:
    """One GPU as the tool lists it: index, UUID, used and total memory in MiB."""

    index: int
    uuid: str
    used_mib: int
    total_mib: int


@dataclass(frozen=True)
class GpuReading:
    """One look at the GPUs: the tool that answered, MiB held per reported compute-process pid, the
    devices."""

    source: str
    by_pid: dict[int, int]
    devices: tuple[Device, ...]


def read_gpus() -> GpuReading | None:
    """The GPUs now, from NVML when ``pynvml`` is installed and answers, else ``nvidia-smi``; None
    without either."""
    return _nvml_reading() or _smi_reading()


def gpu_memory_by_pid() -> dict[int, int] | None:
    """MiB of GPU memory held per pid, as the tool reports pids, over all GPUs; None where no GPU
    tool answers."""
    reading = read_gpus()
    return None if reading is None else reading.by_pid


def _nvml_reading() -> GpuReading | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        by_pid: dict[int, int] = {}
        devices = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                by_pid[p.pid] = by_pid.get(p.pid, 0) + int((p.usedGpuMemory or 0) // MIB)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            devices.append(Device(i, uuid, int(mem.used // MIB), int(mem.total // MIB)))
        return GpuReading("NVML", by_pid, tuple(devices))
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


def _smi_reading() -> GpuReading | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    apps = _smi_rows(exe, "--query-compute-apps=pid,used_memory")
    gpus = _smi_rows(exe, "--query-gpu=index,uuid,memory.used,memory.total")
    if apps is None or gpus is None:
        return None
    by_pid: dict[int, int] = {}
    for row in apps:
        if len(row) == 2 and row[0].isdigit():
            by_pid[int(row[0])] = by_pid.get(int(row[0]), 0) + (
                int(row[1]) if row[1].isdigit() else 0
            )
    devices = tuple(
        Device(int(index), uuid, int(used), int(total))
        for index, uuid, used, total in (row for row in gpus if len(row) == 4)
        if index.isdigit() and used.isdigit() and total.isdigit()
    )  # a device without a memory figure ("[N/A]") is left out: it cannot be checked
    return GpuReading("nvidia-smi", by_pid, devices)


def _smi_rows(exe: str, query: str) -> list[list[str]] | None:
    try:
        res = subprocess.run(
            [exe, query, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if res.returncode != 0:
        return None
    return [
        [p.strip() for p in line.split(",")] for line in res.stdout.splitlines() if line.strip()
    ]


def visible_devices(devices: Sequence[Device], env: Mapping[str, str]) -> list[Device]:
    """The devices a process started with ``env`` can use: ``CUDA_VISIBLE_DEVICES`` by index or UUID
    prefix.

    Unset means all. An entry naming no listed device (a MIG id, ``-1``, a typo) also means all, so
    that a check over these devices never leaves out one the server may have used; an empty value
    means none.
    """
    spec = env.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return list(devices)
    chosen: list[Device] = []
    for token in (t.strip() for t in spec.split(",") if t.strip()):
        named = [
            d
            for d in devices
            if (int(token) == d.index if token.isdigit() else d.uuid.startswith(token))
        ]
        if not named:
            return list(devices)
        chosen += [d for d in named if d not in chosen]
    return chosen


def device_baseline(env: Mapping[str, str]) -> dict[int, int] | None:
    """MiB used now on each device a server started with ``env`` would use (index -> MiB); None
    without GPU tools.

    Read it right before the launch and give it to :func:`wait_gpu_release`, which needs it wherever
    pids cannot be matched.

    Args:
        env: the server's environment to come (its ``CUDA_VISIBLE_DEVICES`` picks the devices).

    Returns:
        Device index -> MiB in use, for the visible devices; None when no GPU tool can be read.
    """
    reading = read_gpus()
    if reading is None:
        return None
    return {d.index: d.used_mib for d in visible_devices(reading.devices, env)}


def tolerance_mib(total_mib: int) -> int:
    """How far above its pre-launch use a device of ``total_mib`` may stay and still count as
    released."""
    return max(TOLERANCE_MIB, int(total_mib * TOLERANCE_FRACTION))


def foreign_pids(pids: Iterable[int]) -> list[int]:
    """The pids that name no process in this pid namespace (pid 0 included): the tool reports
    another one's."""
    return sorted(p for p in pids if p <= 0 or not psutil.pid_exists(p))


@dataclass
class GpuRelease:
    """Whether the GPUs let go of a server's memory, and how that was decided.

    ``status``: released, held or unchecked. ``method``: "pids" or "device memory" (None when
    unchecked). ``holders``: pid -> MiB still held (pids); ``over``: device index -> MiB still above
    its pre-launch use (device memory). ``reason``: why it is held or unchecked, or which method
    decided and why.
    """

    status: str
    method: str | None = None
    seconds: float | None = None
    holders: dict[int, int] = field(default_factory=dict)
    over: dict[int, int] = field(default_factory=dict)
    reason: str = ""


def judge_release(
    reading: GpuReading | None, *, pids: Iterable[int], baseline: Mapping[int, int] | None
) -> GpuRelease:
    """Released, held or unchecked from one reading; ``seconds`` is left None
    (:func:`wait_gpu_release` sets it).

    By pids when the listing is trustworthy (non-empty, every pid exists here); otherwise by device
    memory against ``baseline`` (index -> MiB before the launch); with no baseline, an empty listing
    counts as released by pids and a listing of foreign pids is unchecked. None for ``reading`` is
    unchecked.
    """
    if reading is None:
        return GpuRelease("unchecked", reason="no GPU tool answers (neither NVML nor nvidia-smi)")
    foreign = foreign_pids(reading.by_pid)
    if reading.by_pid and not foreign:
        wanted = set(pids)
        holders = {pid: mib for pid, mib in reading.by_pid.items() if pid in wanted}
        if holders:
            return GpuRelease(
                "held",
                "pids",
                holders=holders,
                reason=f"GPU memory still held by pids {holders} (MiB, {reading.source})",
            )
        return GpuRelease(
            "released", "pids", reason=f"no pid of the server listed by {reading.source}"
        )
    why = (
        f"{reading.source} lists pids {foreign} that do not exist in this pid namespace (a "
        "container?)"
        if foreign
        else f"{reading.source} lists no compute process (in a container that proves nothing)"
    )
    if baseline is None:
        if foreign:
            return GpuRelease(
                "unchecked", reason=f"{why}, and no device memory was recorded before the launch"
            )
        return GpuRelease(
            "released", "pids", reason=f"{why}; no device memory recorded before the launch"
        )
    now = {d.index: d for d in reading.devices}
    missing = sorted(set(baseline) - set(now))
    over = {
        i: now[i].used_mib - before
        for i, before in sorted(baseline.items())
        if i in now and now[i].used_mib - before > tolerance_mib(now[i].total_mib)
    }
    if over or missing:
        levels = ", ".join(
            f"GPU {i} at {now[i].used_mib} MiB (was {baseline[i]}, tolerance "
            f"{tolerance_mib(now[i].total_mib)})"
            for i in over
        )
        gone = f"GPUs {missing} no longer listed" if missing else ""
        return GpuRelease(
            "held",
            "device memory",
            over=over,
            reason="GPU memory above its pre-launch use: "
            f"{'; '.join(x for x in (levels, gone) if x)} ({why})",
        )
    return GpuRelease(
        "released",
        "device memory",
        reason=f"GPUs {sorted(baseline)} back to their pre-launch use ({why})",
    )


def wait_gpu_release(
    *, pids: Iterable[int], timeout_s: float, baseline: Mapping[int, int] | None
) -> GpuRelease:
    """Wait until the GPUs let go of the memory of ``pids``, at most ``timeout_s``; checks at once,
    then ≤ 0.5 s apart.

    Each check is :func:`judge_release` of a fresh :func:`read_gpus` with ``baseline`` from
    :func:`device_baseline`. Returns "released" with the seconds it took, "unchecked" as soon as a
    check cannot tell, or, when the time is up, the last "held" answer with its holders or devices
    and its reason.

    Args:
        pids: the server's processes whose GPU memory must be let go.
        timeout_s: the most seconds to wait.
        baseline: device index -> MiB used before the launch (:func:`device_baseline`); None:
            unknown.

    Returns:
        The deciding :class:`GpuRelease`: released (with ``seconds``), unchecked, or the last
        held answer.
    """
    start = time.monotonic()
    wanted = set(pids)
    last = GpuRelease("held")

    def settled() -> GpuRelease | None:
        nonlocal last
        last = judge_release(read_gpus(), pids=wanted, baseline=baseline)
        if last.status == "released":
            last.seconds = time.monotonic() - start
        return None if last.status == "held" else last

    return (
        wait_until(
            settled,
            timeout_s=timeout_s,
            max_interval_s=0.5,
            what=f"GPU memory of pids {sorted(wanted)}",
        )
        or last
    )
