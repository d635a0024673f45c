"""The supervisor between the controller and a server, and the process and port tools it shares with
the engine.

Why a supervisor. A trial's server must not outlive the controller (``bisect-eagle run``), even when
the controller is killed by SIGKILL and can run no cleanup of its own. Linux's parent-death signal
alone is not enough: ``PR_SET_PDEATHSIG`` fires when the *thread* that forked the child exits (a
worker thread that started the server would kill it while the controller lives on), it reaches only
the direct child (not SGLang's scheduler and detokenizer, nor anything they fork), and it cannot
clean up: it is one signal to one process. So the controller starts, in a new session, this small
script (stdlib and psutil only, run by path with ``python -I``: nothing of the package is imported,
the spec's ``PYTHON*`` variables cannot break it), and it starts the server:

- it is the process-group leader: the server and everything it spawns share its group (pgid = its
  pid);
- it is a child subreaper (``PR_SET_CHILD_SUBREAPER``): a process that double-forks and calls
  ``setsid`` to leave the group is re-parented to the supervisor instead of init, so it stays a
  known descendant;
- the server gets ``PR_SET_PDEATHSIG = SIGKILL`` against the supervisor, which is single-threaded,
  so the thread caveat does not apply: should the supervisor vanish, the server goes too;
- every ``POLL_S`` it checks ``os.getppid()``: when the controller dies, however it dies, the
  supervisor is re-parented and its parent pid changes (definitive, no race, no kernel version
  needed). It then ends the group and its descendants (SIGTERM, ``--grace`` seconds, SIGKILL), every
  process carrying the trial's token in its environment (``TOKEN_ENV``, set by the controller and
  inherited by everything the server starts, whatever its group or parent), then whatever of ours
  still listens on the port; it notes what it did in the server's record and exits;
- when the server exits by itself, the supervisor ends what the server left behind and exits with
  the server's own status (a signal death is re-raised), so ``Popen.poll()`` on the supervisor means
  "the server exited" with the server's exit code.

The controller stops a server by signalling the whole group (the supervisor included, which only
notes the signal and keeps waiting for the server): SIGTERM, grace, SIGKILL. Processes are handled
as :class:`psutil.Process` objects, which check creation times, so a recycled pid is never
signalled. Because the script imports nothing of the package, its waits are hand-written loops on
``POLL_S`` rather than :func:`bisect_eagle.poll.wait_until`, the poll helper everything else uses.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable

import psutil

TOKEN_ENV = "BISECT_EAGLE_SERVER_ID"  # a random value per server, inherited by all it starts
POLL_S = 0.05
KILL_WAIT_S = 5.0
LINGER_S = 2.0  # grace for what a server that exited by itself left behind
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


# --------------------------------------------------------------------------------------------------
# ports


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now.

    Args:
        host: the address to bind on.

    Returns:
        The port number the OS picked (another process may take it before it is used).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_is_free(host: str, port: int) -> bool:
    """True when a listener could bind ``host:port`` (connections in TIME_WAIT do not count, as for
    servers).

    Args:
        host: the address (IPv6 when it contains ``:``).
        port: the TCP port.

    Returns:
        Whether a bind with ``SO_REUSEADDR`` succeeds now.
    """
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def wait_port_free(host: str, port: int, *, timeout_s: float) -> float | None:
    """Seconds until ``host:port`` could be bound, or None when it was still taken after
    ``timeout_s``.

    Args:
        host: the address.
        port: the TCP port.
        timeout_s: the most seconds to wait.

    Returns:
        The seconds it took, or None when the port was still taken at ``timeout_s``.
    """
    start = time.monotonic()
    while True:
        if port_is_free(host, port):
            return time.monotonic() - start
        if time.monotonic() - start >= timeout_s:
            return None
        time.sleep(POLL_S)


def port_holders(port: int) -> tuple[list[psutil.Process], int]:
    """The processes listening on TCP ``port`` (any address), and how many listeners have no visible
    pid."""
    found: dict[int, psutil.Process] = {}
    hidden = 0
    try:
        conns = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:
        conns = []
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                conns += [c._replace(pid=proc.pid) for c in proc.net_connections(kind="tcp")]
    for c in conns:
        if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN:
            if c.pid is None:
                hidden += 1
                continue
            with contextlib.suppress(psutil.Error):
                found.setdefault(c.pid, psutil.Process(c.pid))
    return [p for p in found.values() if running(p)], hidden


# --------------------------------------------------------------------------------------------------
# processes


def running(proc: psutil.Process) -> bool:
    """Alive and not a zombie (a zombie has closed its files and holds no port or GPU memory)."""
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


def descendants(pid: int) -> list[psutil.Process]:
    """Running descendants of ``pid`` (none when it is gone)."""
    try:
        return [p for p in psutil.Process(pid).children(recursive=True) if running(p)]
    except psutil.Error:
        return []


def protected() -> set[int]:
    """This process and its ancestors: never signalled, whatever they carry."""
    out = {os.getpid()}
    with contextlib.suppress(psutil.Error):
        out |= {p.pid for p in psutil.Process().parents()}
    return out


def carries_token(proc: psutil.Process, token: str) -> bool:
    try:
        return bool(token) and proc.environ().get(TOKEN_ENV) == token
    except psutil.Error:
        return False


def token_bearers(token: str) -> list[psutil.Process]:
    """Running processes (readable by this user) whose environment carries ``token``."""
    keep = protected()
    return [
        p
        for p in psutil.process_iter()
        if p.pid not in keep and carries_token(p, token) and running(p)
    ]


def throttled(
    fn: Callable[[], list[psutil.Process]], every_s: float = 1.0
) -> Callable[[], list[psutil.Process]]:
    """``fn`` called at most once per ``every_s`` (a scan of every process's environment is not
    free)."""
    last: list = [float("-inf"), []]

    def call() -> list[psutil.Process]:
        if time.monotonic() - last[0] >= every_s:
            last[:] = [time.monotonic(), fn()]
        return last[1]

    return call


def argv_digest(argv: Iterable[str]) -> str:
    """A digest of a command line: records match processes by it without keeping secrets from the
    argv."""
    return hashlib.sha256("\0".join(argv).encode("utf-8", "surrogateescape")).hexdigest()


def why_ours(
    proc: psutil.Process,
    *,
    token: str = "",
    digest: str = "",
    known: dict[int, psutil.Process] | None = None,
) -> str | None:
    """Why ``proc`` belongs to the server (seen among its processes, its token, its command line),
    else None."""
    if proc.pid in protected():
        return None
    if known and known.get(proc.pid) == proc:  # psutil equality compares creation times
        return "was one of the server's processes"
    if carries_token(proc, token):
        return "carries the server's token in its environment"
    with contextlib.suppress(psutil.Error):
        if digest and argv_digest(proc.cmdline()) == digest:
            return "runs the server's command line"
    return None


def process_text(proc: psutil.Process) -> str:
    """``pid N (name)``; never the command line, which may hold secrets."""
    try:
        return f"pid {proc.pid} ({proc.name()})"
    except psutil.Error:
        return f"pid {proc.pid}"


def end_all(
    collect: Callable[[], Iterable[psutil.Process]],
    *,
    grace_s: float,
    reap: Callable[[], object] = lambda: None,
    kill_wait_s: float = KILL_WAIT_S,
) -> tuple[str, list[int], list[int]]:
    """SIGTERM what ``collect`` finds (re-collected while waiting), ``grace_s``, then SIGKILL the
    rest.

    Returns the strongest signal used ("none", "SIGTERM", "SIGKILL"), every pid signalled, and
    survivors.
    """
    keep = protected()
    seen: dict[int, psutil.Process] = {}
    termed: set[int] = set()

    def live() -> list[psutil.Process]:
        """The processes seen so far that still run (the ``keep`` pids excluded); reaps first.

        Returns:
            The running processes.
        """
        reap()
        for p in collect():
            if p.pid not in keep:
                seen.setdefault(p.pid, p)
        return [p for p in seen.values() if running(p)]

    def send(procs: list[psutil.Process], sig: signal.Signals) -> None:
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.send_signal(sig)

    alive, used = live(), "none"
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, kill_wait_s)):
        if not alive:
            break
        used = sig.name
        deadline = time.monotonic() + wait_s
        while alive:
            fresh = alive if sig == signal.SIGKILL else [p for p in alive if p.pid not in termed]
            send(fresh, sig)
            termed |= {p.pid for p in fresh}
            if time.monotonic() >= deadline:
                break
            time.sleep(POLL_S)
            alive = live()
    return used, sorted(seen), sorted(p.pid for p in alive)


# --------------------------------------------------------------------------------------------------
# the supervisor


_LIBC: list = []


def _prctl(option: int, arg: int) -> bool:
    """``prctl(option, arg)``; False where it is missing (not Linux: the getppid watch still
    works)."""
    try:
        if not _LIBC:
            _LIBC.append(ctypes.CDLL(None, use_errno=True))  # loaded before any fork
        return _LIBC[0].prctl(option, int(arg), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _reap_children(main_pid: int) -> int | None:
    """Reap every exited child (adopted orphans included); the main child's wait status once it
    exits."""
    status = None
    while True:
        try:
            pid, st = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return status
        if pid == 0:
            return status
        if pid == main_pid:
            status = st


def _note(record: str | None, note: dict) -> None:
    """Add what the supervisor did to the server's record (only while the record still exists)."""
    if not record or not os.path.exists(record):
        return
    with contextlib.suppress(OSError, ValueError):
        with open(record) as f:
            data = json.load(f)
        data["supervisor"] = note
        tmp = f"{record}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
        os.replace(tmp, record)


def _report(fd: int | None, message: dict) -> None:
    if fd is None:
        return
    with contextlib.suppress(OSError):
        os.write(fd, (json.dumps(message) + "\n").encode())
        os.close(fd)


def main(args: list[str] | None = None) -> int:
    """``supervise.py --controller PID [--grace S] [--host H --port N] [--records DIR] [--status-fd
    FD] -- ARGV``.

    Args:
        args: the command line without the program name; None reads ``sys.argv[1:]``.

    Returns:
        The exit code: 2 on a usage error, 1 when the controller is already gone, 127 when ``ARGV``
        cannot start, 0 when the controller died first; else the server's code (``128 - code`` after
        re-raising a signal it died of on itself).
    """
    args = list(sys.argv[1:] if args is None else args)
    if "--" not in args:
        print("usage: supervise.py --controller PID [options] -- ARGV...", file=sys.stderr)
        return 2
    cut = args.index("--")
    opts, argv = dict(zip(args[:cut:2], args[1:cut:2], strict=False)), args[cut + 1 :]
    controller = int(opts["--controller"])
    grace_s = float(opts.get("--grace", 10))
    port = int(opts["--port"]) if "--port" in opts else None
    host = opts.get("--host", "127.0.0.1")
    fd = int(opts["--status-fd"]) if "--status-fd" in opts else None
    record = os.path.join(opts["--records"], f"{os.getpid()}.json") if "--records" in opts else None
    token = os.environ.get(TOKEN_ENV, "")
    # noted, not obeyed: the controller signals the whole group and waits for the server
    stops: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: stops.append(signum))
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    if os.getppid() != controller:
        _report(
            fd,
            {
                "error": 0,
                "strerror": f"the controller (pid {controller}) is gone",
                "filename": None,
            },
        )
        return 1
    me = os.getpid()

    def die_with_me() -> None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != me:
            os._exit(1)

    try:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, preexec_fn=die_with_me)  # noqa: PLW1509
    except OSError as e:
        _report(
            fd, {"error": e.errno or 0, "strerror": e.strerror or str(e), "filename": e.filename}
        )
        return 127
    _report(fd, {"pid": child.pid})
    status = None
    while status is None and os.getppid() == controller:
        time.sleep(POLL_S)
        status = _reap_children(child.pid)
    orphaned = status is None  # the loop ended because the controller is gone
    if status is not None:
        child.returncode = os.waitstatus_to_exitcode(status)

    bearers = throttled(
        lambda: token_bearers(token) if orphaned or os.getppid() != controller else []
    )

    def ours() -> list[psutil.Process]:
        return group_members(me) + descendants(me) + bearers()

    used, ended, survivors = end_all(
        ours, grace_s=grace_s if orphaned else LINGER_S, reap=lambda: _reap_children(child.pid)
    )
    if orphaned or os.getppid() != controller:
        orphans = []
        if port is not None and not port_is_free(host, port):
            holders, _ = port_holders(port)
            mine = [p for p in holders if why_ours(p, token=token, digest=argv_digest(argv))]
            orphans = end_all(lambda: mine, grace_s=grace_s)[1]
        _note(
            record,
            {
                "reason": "the controller died",
                "at": time.time(),
                "signal": used,
                "ended": ended,
                "survivors": survivors,
                "port_orphans": orphans,
            },
        )
        return 0
    code = child.returncode if child.returncode is not None else 0
    if code < 0:  # die of the server's signal, so the controller's Popen reports it as the server's
        signal.signal(-code, signal.SIG_DFL)
        with contextlib.suppress(ValueError, OSError):
            import resource

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.kill(os.getpid(), -code)
        return 128 - code
    return code


if __name__ == "__main__":
    sys.exit(main())
