"""Server processes: a free port, a supervised process group, and a teardown that leaves nothing
behind.

A server is started under a supervisor (:mod:`bisect_eagle.engines.procs.supervise`, where the
design is explained): a tiny process, the leader of a new session, that starts the server in its
group, adopts whatever double-forks away from it, and ends all of it when the controller dies, even
by SIGKILL. Each started server leaves a record, ``<log_dir>/servers/<pgid>.json``, removed on a
clean teardown; records of dead controllers are reaped by
:func:`~bisect_eagle.engines.procs.reap.reap_servers`.

Teardown is SIGTERM to the group, a grace period, then SIGKILL to the group and to every process of
it ever seen (those that left the group included), then, if the port is still taken, the server's
orphans that listen on it are found and ended (strangers are reported, never signalled). The engine
then waits until the port can be bound again and, where NVML or ``nvidia-smi`` can tell, until the
GPUs let go of the server's memory: by pid, or where pids cannot be matched (containers) by device
memory against the use before the launch (:mod:`bisect_eagle.engines.procs.gpus`). Processes are
tracked as :class:`psutil.Process` objects, which compare creation times, so a recycled pid is never
signalled.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil

from bisect_eagle.engines.procs.gpus import GpuRelease, gpu_memory_by_pid, wait_gpu_release
from bisect_eagle.engines.procs.reap import (
    Orphan,
    Reaped,
    ServerRecord,
    boot_id,
    end_port_orphans,
    reap_servers,
    records_dir,
    remove_record,
    start_time,
    write_record,
)
from bisect_eagle.engines.procs.supervise import (
    POLL_S,
    TOKEN_ENV,
    argv_digest,
    free_port,
    group_members,
    port_is_free,
    running,
    wait_port_free,
)

__all__ = [
    "POLL_S",
    "SUPERVISOR",
    "GpuRelease",
    "Orphan",
    "Reaped",
    "ServerProcess",
    "ServerRecord",
    "StopReport",
    "end_port_orphans",
    "free_port",
    "gpu_memory_by_pid",
    "group_members",
    "log_tail",
    "port_is_free",
    "read_log",
    "reap_servers",
    "records_dir",
    "start_server",
    "stop_server",
    "update_record",
    "wait_gpu_release",
    "wait_port_free",
]

SUPERVISOR = Path(__file__).with_name("supervise.py")
# for the supervisor to start the server (a Python start-up on a loaded machine)
START_TIMEOUT_S = 30.0


@dataclass
class ServerProcess:
    """A launched server: its supervisor (``popen``), its log and every process of the server seen.

    ``popen`` is the supervisor, the group leader; it exits when the server does, with the server's
    status. ``seen`` holds the server's own processes (not the supervisor), ``escaped`` those seen
    outside the group.
    """

    popen: subprocess.Popen
    log_path: Path
    log_file: IO[bytes]
    seen: dict[int, psutil.Process] = field(default_factory=dict)
    server_pid: int | None = None
    token: str = ""
    digest: str = ""
    host: str = "127.0.0.1"
    port: int | None = None
    record_path: Path | None = None
    escaped: set[int] = field(default_factory=set)

    @property
    def pgid(self) -> int:
        return self.popen.pid  # the supervisor leads a session of its own: its group id is its pid

    def exited(self) -> bool:
        """Whether the supervisor (and so the server) has exited; reaps it when it has.

        Returns:
            True once the supervisor's process has ended.
        """
        return self.popen.poll() is not None

    def snapshot(self) -> list[int]:
        """Record the live processes of the server (group members, the supervisor's descendants);
        their pids.

        Returns:
            The pids found now, sorted (the supervisor excluded).
        """
        members = {p.pid: p for p in group_members(self.pgid)}
        found = dict(members)
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(self.popen.pid).children(recursive=True):
                if running(child):
                    found.setdefault(child.pid, child)
        found.pop(self.popen.pid, None)
        for pid, proc in found.items():
            self.seen.setdefault(pid, proc)
            if pid not in members:
                self.escaped.add(pid)
        return sorted(found)

    def alive(self) -> list[psutil.Process]:
        """Processes of this server still running, supervisor included (zombies excluded); reaps the
        supervisor.

        Returns:
            The running processes: group members and every process seen before that still runs.
        """
        self.popen.poll()
        out = {p.pid: p for p in group_members(self.pgid)}
        for pid, proc in self.seen.items():
            if pid not in out and running(proc):
                out[pid] = proc
        return list(out.values())


def _handshake(fd: int, timeout_s: float) -> dict:
    """The supervisor's one-line answer: ``{"pid": N}`` or ``{"error": errno, ...}``; {} when it
    said nothing."""
    deadline = time.monotonic() + timeout_s
    buf = b""
    with os.fdopen(fd, "rb", buffering=0) as f:
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([f], [], [], left)[0]:
                break
            chunk = f.read(4096)
            if not chunk:
                break
            buf += chunk
    try:
        return json.loads(buf.split(b"\n")[0]) if b"\n" in buf else {}
    except ValueError:
        return {}


def start_server(
    argv: list[str],
    env: dict[str, str],
    *,
    log_path: Path,
    log_dir: Path | None = None,
    host: str = "127.0.0.1",
    port: int | None = None,
    grace_s: float = 10.0,
    meta: dict[str, Any] | None = None,
) -> ServerProcess:
    """Start ``argv`` (never through a shell) under a supervisor, stdout and stderr appended to
    ``log_path``.

    The server ends when the controller dies. With ``log_dir`` it is recorded in
    ``<log_dir>/servers/`` (``meta`` is stored there for :func:`reap_servers`' caller).
    ``host``/``port`` are where it listens: a teardown then ends orphans of it still holding the
    port. ``grace_s`` is the supervisor's SIGTERM grace when it ends the server after the
    controller's death. Raises OSError when ``argv`` cannot be started.

    Args:
        argv: the server's command line.
        env: the server's environment (the supervisor adds its token variable).
        log_path: the log file (created with its parents; appended to).
        log_dir: where to record the server for :func:`reap_servers`; None records nothing.
        host: the address the server listens on.
        port: the server's port; None when it has none to watch.
        grace_s: the supervisor's SIGTERM-to-SIGKILL seconds when the controller died.
        meta: stored in the record as is (trial number, run ids, ...); None stores ``{}``.

    Returns:
        The running server's handle; stop it with :func:`stop_server`.

    Raises:
        OSError: ``argv`` could not be started, or the supervisor did not report the server's pid.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(16)
    cmd = [
        sys.executable,
        "-I",
        str(SUPERVISOR),
        "--controller",
        str(os.getpid()),
        "--grace",
        f"{grace_s:g}",
        "--host",
        host,
    ]
    if port is not None:
        cmd += ["--port", str(port)]
    if log_dir is not None:
        records_dir(log_dir).mkdir(parents=True, exist_ok=True)
        cmd += ["--records", str(records_dir(log_dir).resolve())]
    log_file = open(log_path, "ab")  # noqa: SIM115 (closed by stop_server)
    read_fd, write_fd = os.pipe()
    try:
        popen = subprocess.Popen(
            [*cmd, "--status-fd", str(write_fd), "--", *argv],
            env={**env, TOKEN_ENV: token},
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            pass_fds=(write_fd,),
        )
    except OSError:
        os.close(read_fd)
        log_file.close()
        raise
    finally:
        os.close(write_fd)
    answer = _handshake(read_fd, START_TIMEOUT_S)
    if "pid" not in answer:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(popen.pid, signal.SIGKILL)
        popen.wait()
        log_file.close()
        if answer:
            raise OSError(
                answer.get("error") or 0,
                answer.get("strerror", "cannot start"),
                answer.get("filename"),
            )
        raise OSError(
            f"the server supervisor did not start {argv[0]} (exit code {popen.returncode}); see "
            f"{log_path}"
        )
    server = ServerProcess(
        popen,
        log_path,
        log_file,
        server_pid=int(answer["pid"]),
        token=token,
        digest=argv_digest(argv),
        host=host,
        port=port,
    )
    if log_dir is not None:
        record = ServerRecord(
            pgid=popen.pid,
            supervisor_start=start_time(popen.pid),
            server_pid=server.server_pid,
            server_start=start_time(server.server_pid),
            host=host,
            port=port,
            hostname=socket.gethostname(),
            boot_id=boot_id(),
            controller_pid=os.getpid(),
            controller_start=start_time(os.getpid()),
            started_at=time.time(),
            token=token,
            argv_digest=server.digest,
            log_path=str(log_path),
            meta=meta or {},
        )
        server.record_path = write_record(log_dir, record)
    server.snapshot()
    return server


def update_record(server: ServerProcess, **meta: Any) -> None:
    """Add ``meta`` (e.g. MLflow run ids known only after the start) to the server's record, if it
    has one."""
    path = server.record_path
    if path is None or not path.is_file():
        return
    record = ServerRecord.from_json(json.loads(path.read_text()))
    record.meta.update(meta)
    write_record(path.parent.parent, record)


@dataclass
class StopReport:
    """How a server went away."""

    signal: str  # "none" (had exited) | "SIGTERM" | "SIGKILL"
    stop_s: float
    exit_code: int | None
    # pids still running after SIGKILL (a stuck process: the next launch must not stack)
    survivors: list[int]
    # escaped processes, port orphans ended or left alone
    warnings: list[str] = field(default_factory=list)
    # listeners found on the port after the group was gone
    orphans: list[Orphan] = field(default_factory=list)


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


def stop_server(server: ServerProcess, *, grace_s: float, kill_wait_s: float = 10.0) -> StopReport:
    """SIGTERM the whole group, wait up to ``grace_s``, then SIGKILL whatever is left; closes the
    log.

    Then, with the group gone and the port still taken, ends the server's orphans listening on it
    (one warning each). The record is removed once nothing survived and the port is free.

    Args:
        server: the handle from :func:`start_server`.
        grace_s: seconds to wait after SIGTERM before SIGKILL (the port orphans get at most 5 s).
        kill_wait_s: seconds to wait after SIGKILL, and for the supervisor's exit.

    Returns:
        What was done: strongest signal, seconds, exit code, survivors, warnings and port orphans.
    """
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
    warnings = [
        f"pid {pid} had left the server's process group (setsid or a double fork); it was ended "
        "with the group"
        for pid in sorted(server.escaped)
        if pid not in survivors
    ]
    orphans: list[Orphan] = []
    port_free = (
        server.port is None or wait_port_free(server.host, server.port, timeout_s=0.5) is not None
    )
    if not survivors and not port_free and server.port is not None:
        orphans = end_port_orphans(
            server.host,
            server.port,
            token=server.token,
            digest=server.digest,
            known=server.seen,
            grace_s=min(grace_s, 5.0),
        )
        warnings += [o.warning() for o in orphans]
        port_free = port_is_free(server.host, server.port)
    if not survivors and port_free:
        remove_record(server.record_path)
    return StopReport(
        used, time.monotonic() - start, server.popen.poll(), survivors, warnings, orphans
    )


def read_log(path: Path, max_bytes: int = 1 << 20) -> str:
    """The log's text; when longer than ``max_bytes``, its head and tail with a marker between them.

    Args:
        path: the log file; a missing one reads as empty.
        max_bytes: the most bytes kept (half from the head, half from the tail).

    Returns:
        The text, decoded as UTF-8 with undecodable bytes replaced; "" when there is no file.
    """
    if not path.is_file():
        return ""
    data = path.read_bytes()
    if len(data) > max_bytes:
        half = max_bytes // 2
        cut = len(data) - 2 * half
        data = data[:half] + f"\n[... {cut} bytes cut ...]\n".encode() + data[-half:]
    return data.decode("utf-8", errors="replace")


def log_tail(path: Path, lines: int = 60) -> str:
    """The last ``lines`` lines of a log.

    Args:
        path: the log file (as :func:`read_log` reads it).
        lines: how many lines to keep.

    Returns:
        Those lines joined by newlines; "" when there is no log.
    """
    return "\n".join(read_log(path).splitlines()[-lines:])
