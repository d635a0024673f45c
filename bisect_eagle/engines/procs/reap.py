"""Server records, and the reaping of servers whose controller died, and of orphans that hold a
port.

Every supervised server has a record, ``<log_dir>/servers/<pgid>.json`` (:class:`ServerRecord`),
written when it starts and removed on a clean teardown. A record that outlives its controller
(SIGKILL, a crash, a power cut) is found by :func:`reap_servers`, which ends whatever is left of
that server (its group, its supervisor, every process carrying its token), frees its port and
removes the record; ``run --resume`` calls it first. Records hold no command line (it may carry
secrets), only its digest.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bisect_eagle.engines.procs.supervise import (
    end_all,
    group_members,
    port_holders,
    port_is_free,
    process_text,
    running,
    throttled,
    token_bearers,
    why_ours,
)

RECORDS = "servers"


def records_dir(log_dir: Path) -> Path:
    """Where the records of the servers started with ``log_dir`` live."""
    return Path(log_dir) / RECORDS


def boot_id() -> str | None:
    with contextlib.suppress(OSError):
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return None


def start_time(pid: int) -> float | None:
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).create_time()
    return None


@dataclass
class ServerRecord:
    """One supervised server: enough to tell whether its controller lives and to end it if not."""

    pgid: int  # the supervisor's pid: group leader of the server and everything it starts
    supervisor_start: float | None
    server_pid: int
    server_start: float | None
    host: str  # the address the server binds
    port: int | None
    hostname: str  # the machine
    boot_id: str | None
    controller_pid: int
    controller_start: float | None
    started_at: float  # time.time()
    token: str  # in the environment of every process the server starts
    argv_digest: str
    log_path: str
    meta: dict[str, Any] = field(default_factory=dict)  # the caller's (trial number, run ids, ...)
    # what the supervisor did when it saw the controller die
    supervisor: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, data: dict) -> ServerRecord:
        """A record read back from its JSON; keys this version does not know are dropped.

        Args:
            data: the record file's parsed JSON.

        Returns:
            The record.
        """
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in names})

    def controller_alive(self) -> bool:
        """Whether the controller that started the server still runs (same pid *and* start time)."""
        if self.boot_id is not None and self.boot_id != boot_id():
            return False
        try:
            proc = psutil.Process(self.controller_pid)
            same = (
                self.controller_start is None
                or abs(proc.create_time() - self.controller_start) < 0.05
            )
            return same and running(proc)
        except psutil.Error:
            return False


def write_record(log_dir: Path, record: ServerRecord) -> Path:
    """Write ``record`` atomically; its path."""
    folder = records_dir(log_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{record.pgid}.json"
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(asdict(record), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def read_records(log_dir: Path) -> list[tuple[Path, ServerRecord | None]]:
    """Every record under ``log_dir`` (None for one that cannot be read)."""
    out: list[tuple[Path, ServerRecord | None]] = []
    folder = records_dir(log_dir)
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            out.append((path, ServerRecord.from_json(json.loads(path.read_text()))))
        except (OSError, ValueError, TypeError):
            out.append((path, None))
    return out


def remove_record(path: Path | None) -> None:
    if path is not None:
        path.unlink(missing_ok=True)
        for tmp in path.parent.glob(f"{path.name}.*.tmp"):
            tmp.unlink(missing_ok=True)


# --------------------------------------------------------------------------------------------------
# orphans on a port


@dataclass
class Orphan:
    """A process found listening on a server's port after the server's group was gone."""

    pid: int
    name: str  # "pid N (exe)"
    ended: bool  # False: not ours, left alone
    reason: str  # why it is ours, or why it was left
    signal: str = "none"
    port: int = 0

    def warning(self) -> str:
        """One line saying which process held the port, why it is the server's, and what was done.

        Returns:
            The warning text.
        """
        if self.ended:
            return (
                f"port {self.port} was still held after the server's process group was gone, by "
                f"{self.name}, which {self.reason} (it had escaped the group, e.g. a double-forked "
                f"daemon): ended with {self.signal}"
            )
        return f"port {self.port} is held by {self.name}, {self.reason}: left alone"


def end_port_orphans(
    host: str,
    port: int,
    *,
    token: str = "",
    digest: str = "",
    known: dict[int, psutil.Process] | None = None,
    grace_s: float = 5.0,
) -> list[Orphan]:
    """End the processes of a server still listening on ``port``; strangers are reported, never
    signalled.

    A listener is the server's when it was seen among its processes (``known``), carries its
    ``token`` in its environment, or runs its command line (``digest``, see
    :func:`~.supervise.argv_digest`).
    """
    holders, hidden = port_holders(port)
    out, mine = [], []
    for proc in holders:
        why = why_ours(proc, token=token, digest=digest, known=known)
        out.append(
            Orphan(
                proc.pid,
                process_text(proc),
                why is not None,
                why or "not started by this server",
                port=port,
            )
        )
        if why is not None:
            mine.append(proc)
    if mine:
        used, _, survivors = end_all(lambda: mine, grace_s=grace_s)
        for o in out:
            if o.ended:
                o.signal = used
                if o.pid in survivors:
                    o.ended, o.reason = False, f"{o.reason}, but survived SIGKILL"
    if hidden and not port_is_free(host, port):
        out.append(
            Orphan(
                0,
                f"{hidden} listener(s) of another user",
                False,
                "not visible to this user",
                port=port,
            )
        )
    return out


# --------------------------------------------------------------------------------------------------
# reaping after a dead controller


@dataclass
class Reaped:
    """What :func:`reap_servers` did about one record whose controller is dead."""

    path: Path
    record: ServerRecord | None  # None: the record could not be read (kept)
    # "reaped" | "gone" (nothing was left) | "incomplete" (survivors or port taken; record kept)
    status: str
    signal: str = "none"  # strongest signal sent: none | SIGTERM | SIGKILL
    ended: list[int] = field(default_factory=list)
    survivors: list[int] = field(default_factory=list)
    port_free: bool = True
    orphans: list[Orphan] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        """This result as JSON-ready data.

        Returns:
            The fields by name (``path`` a string, ``record`` a dict or None; orphans left out).
        """
        return {
            "path": str(self.path),
            "status": self.status,
            "signal": self.signal,
            "ended": self.ended,
            "survivors": self.survivors,
            "port_free": self.port_free,
            "warnings": self.warnings,
            "record": None if self.record is None else asdict(self.record),
        }


def _leftovers(
    rec: ServerRecord, bearers: Callable[[], list[psutil.Process]]
) -> list[psutil.Process]:
    """The server's processes still running: its supervisor and group (when still ours), its token
    bearers."""
    found: dict[int, psutil.Process] = {p.pid: p for p in bearers()}
    for pid, start in ((rec.pgid, rec.supervisor_start), (rec.server_pid, rec.server_start)):
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            if start is not None and abs(proc.create_time() - start) < 0.05 and running(proc):
                found[pid] = proc
    members = group_members(rec.pgid)
    if rec.pgid in found or any(p.pid in found for p in members):  # the group is still the server's
        for p in members:
            found.setdefault(p.pid, p)
    return list(found.values())


def reap_servers(log_dir: Path, *, host: str | None = None, grace_s: float = 5.0) -> list[Reaped]:
    """End the recorded servers under ``log_dir`` whose controller is dead, on machine ``host``.

    ``host`` is the machine's name (default ``socket.gethostname()``): records written on another
    machine sharing the directory are left alone, and so are records of live controllers (another
    ``run`` in progress, or this very process). For each other record: SIGTERM everything left of
    the server, ``grace_s``, SIGKILL; end whatever of it still holds the port; remove the record
    when nothing survived and the port is free. Returns one :class:`Reaped` per record handled (its
    ``record.meta`` is what the caller stored).

    Args:
        log_dir: the directory whose ``servers/`` holds the records.
        host: this machine's name; None means ``socket.gethostname()``.
        grace_s: seconds between SIGTERM and SIGKILL.

    Returns:
        One :class:`Reaped` per record handled, in the order the records were read.
    """
    host = host or socket.gethostname()
    out = []
    for path, rec in read_records(log_dir):
        age = 0.0
        if rec is None:
            with contextlib.suppress(OSError):
                age = time.time() - path.stat().st_mtime
            if age > 60:  # not a record being written: unreadable
                out.append(
                    Reaped(
                        path,
                        None,
                        "incomplete",
                        warnings=[f"{path}: unreadable server record, kept"],
                    )
                )
            continue
        if rec.hostname != host or rec.controller_alive():
            continue
        # rebooted since: nothing of it can run
        if rec.boot_id is not None and rec.boot_id != boot_id():
            remove_record(path)
            out.append(Reaped(path, rec, "gone"))
            continue
        bearers = throttled(lambda rec=rec: token_bearers(rec.token))
        used, ended, survivors = end_all(
            lambda rec=rec, b=bearers: _leftovers(rec, b), grace_s=grace_s
        )
        orphans: list[Orphan] = []
        if rec.port is not None and not port_is_free(rec.host, rec.port):
            orphans = end_port_orphans(
                rec.host, rec.port, token=rec.token, digest=rec.argv_digest, grace_s=grace_s
            )
        port_free = rec.port is None or port_is_free(rec.host, rec.port)
        done = not survivors and port_free
        status = (
            ("reaped" if ended or any(o.ended for o in orphans) else "gone")
            if done
            else "incomplete"
        )
        warnings = [o.warning() for o in orphans]
        if survivors:
            warnings.append(
                f"processes {survivors} of the server of pid {rec.pgid} survived SIGKILL"
            )
        if not port_free:
            warnings.append(f"port {rec.port} is still taken")
        if done:
            remove_record(path)
        out.append(Reaped(path, rec, status, used, ended, survivors, port_free, orphans, warnings))
    return out
