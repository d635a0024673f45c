"""GPU memory by process: what the teardown waits on after a server's processes are gone.

NVML (``pynvml``) when installed, else ``nvidia-smi``; with neither, the release is "unchecked".
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass, field

from bisect_eagle.poll import wait_until


def gpu_memory_by_pid() -> dict[int, int] | None:
    """MiB of GPU memory held per pid, over all GPUs (NVML, else ``nvidia-smi``); None where neither exists."""
    try:
        import pynvml
    except ImportError:
        return _nvidia_smi_memory()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return _nvidia_smi_memory()
    try:
        out: dict[int, int] = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                out[p.pid] = out.get(p.pid, 0) + int((p.usedGpuMemory or 0) // 2**20)
        return out
    finally:
        pynvml.nvmlShutdown()


def _nvidia_smi_memory() -> dict[int, int] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        res = subprocess.run(
            [exe, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=30, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if res.returncode != 0:
        return None
    out: dict[int, int] = {}
    for line in res.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            mib = int(parts[1]) if parts[1].isdigit() else 0
            out[int(parts[0])] = out.get(int(parts[0]), 0) + mib
    return out


@dataclass
class GpuRelease:
    """Whether the GPUs let go of a server's memory: ``status`` is released, held or unchecked (no GPU tools)."""

    status: str
    seconds: float | None = None
    holders: dict[int, int] = field(default_factory=dict)  # pid -> MiB still held


def wait_gpu_release(pids: list[int], timeout_s: float) -> GpuRelease:
    """Wait until no GPU holds memory of ``pids``, at most ``timeout_s`` (checked at once, then at most 0.5 s apart).

    "released" with the seconds it took, "held" with the pids still holding memory when the time is up, or
    "unchecked" as soon as no GPU tool answers.
    """
    start = time.monotonic()
    wanted = set(pids)
    holders: dict[int, int] = {}

    def settled() -> GpuRelease | None:
        nonlocal holders
        usage = gpu_memory_by_pid()
        if usage is None:
            return GpuRelease("unchecked")
        holders = {pid: mib for pid, mib in usage.items() if pid in wanted}
        return None if holders else GpuRelease("released", time.monotonic() - start)

    found = wait_until(settled, timeout_s=timeout_s, max_interval_s=0.5, what=f"GPU memory of pids {sorted(wanted)}")
    return found or GpuRelease("held", None, holders)
