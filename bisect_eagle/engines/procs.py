"""Server processes: a free port, a process group of its own, and a teardown that leaves nothing behind.

A server is started with ``start_new_session=True`` so that it and every process it spawns (SGLang's
scheduler and detokenizer, one scheduler per TP rank) share one process group. Teardown is SIGTERM to the
group, a grace period, then SIGKILL to the group and to every process of it ever seen, and then waits
until the port can be bound again and, where NVML or ``nvidia-smi`` can tell, until no GPU holds memory
of those processes. Processes are tracked as :class:`psutil.Process` objects, which compare creation
times, so a recycled pid is never signalled.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import psutil

POLL_S = 0.05


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_is_free(host: str, port: int) -> bool:
    """True when a listener could bind ``host:port`` (connections in TIME_WAIT do not count, as for servers)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def wait_port_free(host: str, port: int, timeout_s: float) -> float | None:
    """Seconds until ``host:port`` could be bound, or None when it was still taken after ``timeout_s``."""
    start = time.monotonic()
    while True:
        if port_is_free(host, port):
            return time.monotonic() - start
        if time.monotonic() - start >= timeout_s:
            return None
        time.sleep(POLL_S)


@dataclass
class ServerProcess:
    """A launched server: its process (the group leader), its log file and every process of its group seen."""

    popen: subprocess.Popen
    log_path: Path
    log_file: IO[bytes]
    seen: dict[int, psutil.Process] = field(default_factory=dict)

    @property
    def pgid(self) -> int:
        return self.popen.pid  # a session leader's group id is its pid

    def exited(self) -> bool:
        return self.popen.poll() is not None

    def snapshot(self) -> list[int]:
        """Record the live members of the group (and the leader's descendants); return their pids."""
        found = {p.pid: p for p in group_members(self.pgid)}
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(self.popen.pid).children(recursive=True):
                found.setdefault(child.pid, child)
        for pid, proc in found.items():
            self.seen.setdefault(pid, proc)
        return sorted(found)

    def alive(self) -> list[psutil.Process]:
        """Processes of this server still running (zombies excluded); reaps the leader if it has exited."""
        self.popen.poll()
        out = {p.pid: p for p in group_members(self.pgid)}
        for pid, proc in self.seen.items():
            if pid not in out and _running(proc):
                out[pid] = proc
        return list(out.values())


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def group_members(pgid: int) -> list[psutil.Process]:
    """Running (non-zombie) processes whose process group is ``pgid``."""
    out = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return out


def start_server(argv: list[str], env: dict[str, str], log_path: Path) -> ServerProcess:
    """Start ``argv`` (never through a shell) in a new session, stdout and stderr appended to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_file = open(log_path, "ab")  # noqa: SIM115 (closed by stop_server)
    try:
        popen = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
    except OSError:
        log_file.close()
        raise
    server = ServerProcess(popen, log_path, log_file)
    server.snapshot()
    return server


@dataclass
class StopReport:
    """How a server went away."""

    signal: str  # "none" (had exited) | "SIGTERM" | "SIGKILL"
    stop_s: float
    exit_code: int | None
    survivors: list[int]  # pids still running after SIGKILL (a stuck process: the next launch must not stack)


def _signal_all(server: ServerProcess, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(server.pgid, sig)
    for proc in server.alive():
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)


def _wait_gone(server: ServerProcess, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if not server.alive():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)


def stop_server(server: ServerProcess, grace_s: float, kill_wait_s: float = 10.0) -> StopReport:
    """SIGTERM the whole group, wait up to ``grace_s``, then SIGKILL whatever is left; closes the log."""
    start = time.monotonic()
    server.snapshot()
    used = "none"
    if server.alive():
        used = "SIGTERM"
        _signal_all(server, signal.SIGTERM)
        if not _wait_gone(server, grace_s):
            used = "SIGKILL"
            _signal_all(server, signal.SIGKILL)
            _wait_gone(server, kill_wait_s)
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.popen.wait(timeout=kill_wait_s)
    server.log_file.close()
    survivors = sorted(p.pid for p in server.alive())
    return StopReport(used, time.monotonic() - start, server.popen.poll(), survivors)


# ---------------------------------------------------------------------------------------------------
# GPU memory


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
    """Wait until no GPU holds memory of ``pids``, at most ``timeout_s``."""
    start = time.monotonic()
    wanted = set(pids)
    while True:
        usage = gpu_memory_by_pid()
        if usage is None:
            return GpuRelease("unchecked")
        holders = {pid: mib for pid, mib in usage.items() if pid in wanted}
        if not holders:
            return GpuRelease("released", time.monotonic() - start)
        if time.monotonic() - start >= timeout_s:
            return GpuRelease("held", None, holders)
        time.sleep(0.5)


def read_log(path: Path, max_bytes: int = 1 << 20) -> str:
    """The log's text; when longer than ``max_bytes``, its head and tail with a marker between them."""
    if not path.is_file():
        return ""
    data = path.read_bytes()
    if len(data) > max_bytes:
        half = max_bytes // 2
        cut = len(data) - 2 * half
        data = data[:half] + f"\n[... {cut} bytes cut ...]\n".encode() + data[-half:]
    return data.decode("utf-8", errors="replace")


def log_tail(path: Path, lines: int = 60) -> str:
    """The last ``lines`` lines of a log."""
    return "\n".join(read_log(path).splitlines()[-lines:])
