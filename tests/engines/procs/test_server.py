"""Server processes: supervised start, teardown, death with the controller, reaping, orphans on the
port.

The servers are ``fake_servers/listener.py`` (listens on 127.0.0.1, optionally a child, a
double-forked daemon holding the socket, SIGTERM ignored); the controller that is SIGKILLed is
``fake_servers/controller.py``. Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from bisect_eagle.engines.procs import server as procs
from bisect_eagle.engines.procs.reap import ServerRecord, read_records, write_record
from bisect_eagle.engines.procs.supervise import TOKEN_ENV, argv_digest

from helpers import own_children

HERE = Path(__file__).resolve().parents[1] / "fake_servers"
LISTENER = HERE / "listener.py"
CONTROLLER = HERE / "controller.py"
DEATH_S = 5.0  # how long a server may outlive its controller


def wait_for(check, timeout_s: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def pids_of(path: Path, *roles: str) -> dict[str, int]:
    """Wait until the listener wrote each of ``roles``; role -> pid."""

    def read():
        got = dict(line.split() for line in path.read_text().splitlines()) if path.is_file() else {}
        return {r: int(got[r]) for r in roles} if all(r in got for r in roles) else None

    return wait_for(read, what=f"{roles} in {path}")


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def listener(port: int, pids: Path, *flags: str) -> list[str]:
    return [sys.executable, str(LISTENER), "--port", str(port), "--pids", str(pids), *flags]


def kill_quietly(*pids: int, pids_file: Path | None = None, pgid: int | None = None) -> None:
    """SIGKILL what a test started, whatever state it failed in (no stray process outlives a failed
    test)."""
    if pids_file is not None and pids_file.is_file():
        pids = (*pids, *(int(line.split()[1]) for line in pids_file.read_text().splitlines()))
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    if pgid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


@pytest.fixture
def port() -> int:
    return procs.free_port()


def test_start_records_the_server_and_a_clean_stop_removes_everything(tmp_path, port):
    pids = tmp_path / "pids"
    server = procs.start_server(
        listener(port, pids, "--child"),
        dict(os.environ),
        log_path=tmp_path / "s.log",
        log_dir=tmp_path,
        port=port,
        grace_s=3,
        meta={"trial": 1},
    )
    try:
        got = pids_of(pids, "server", "child")
        rec = ServerRecord.from_json(json.loads(server.record_path.read_text()))
        assert server.record_path == tmp_path / "servers" / f"{server.pgid}.json"
        assert (rec.pgid, rec.server_pid, rec.port, rec.host, rec.controller_pid) == (
            server.pgid,
            got["server"],
            port,
            "127.0.0.1",
            os.getpid(),
        )
        assert rec.meta == {"trial": 1} and rec.controller_alive() and rec.token == server.token
        assert rec.argv_digest == argv_digest(
            listener(port, pids, "--child")
        ) and "--port" not in json.dumps(
            json.loads(server.record_path.read_text())
        )  # no command line in the record
        assert os.getpgid(got["server"]) == os.getpgid(got["child"]) == server.pgid
        assert psutil.Process(got["child"]).environ()[TOKEN_ENV] == server.token
        server.snapshot()
        # the supervisor is not one of the server's
        assert set(server.seen) == {got["server"], got["child"]}
        procs.update_record(server, run_id="abc")
        assert json.loads(server.record_path.read_text())["meta"] == {"trial": 1, "run_id": "abc"}
        assert not procs.port_is_free("127.0.0.1", port)
    finally:
        report = procs.stop_server(server, grace_s=5)
    assert (
        report.signal == "SIGTERM" and report.exit_code == -signal.SIGTERM and not report.survivors
    )
    assert not report.warnings and not server.record_path.exists()
    assert (
        not alive(got["server"])
        and not alive(got["child"])
        and procs.port_is_free("127.0.0.1", port)
    )


def test_the_supervisor_exits_with_the_servers_status_and_ends_what_it_left(tmp_path):
    code = (
        "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; "
        "time.sleep(600)']); sys.exit(3)"
    )
    server = procs.start_server(
        [sys.executable, "-c", code], {}, log_path=tmp_path / "s.log", log_dir=tmp_path
    )
    wait_for(server.exited, what="the server's exit")
    # its child was ended before the exit
    assert server.popen.returncode == 3 and not group_left(server.pgid)
    report = procs.stop_server(server, grace_s=1)
    assert report.signal == "none" and report.exit_code == 3 and not report.survivors
    assert not group_left(server.pgid) and not list((tmp_path / "servers").glob("*.json"))


def group_left(pgid: int) -> list[int]:
    return [p.pid for p in procs.group_members(pgid)]


def test_a_command_that_cannot_start_raises_oserror_and_leaves_nothing(tmp_path):
    with pytest.raises(OSError) as e:
        procs.start_server(
            [str(tmp_path / "no-such-server")], {}, log_path=tmp_path / "s.log", log_dir=tmp_path
        )
    assert e.value.errno == errno.ENOENT and "no-such-server" in str(e.value)
    assert not list((tmp_path / "servers").glob("*.json"))
    assert not [p for p in own_children() if alive(p.pid)]


def test_a_server_ignoring_sigterm_is_killed_and_a_sigterm_to_the_group_is_survived_by_nobody(
    tmp_path, port
):
    pids = tmp_path / "pids"
    server = procs.start_server(
        listener(port, pids, "--child", "--ignore-term"),
        {},
        log_path=tmp_path / "s.log",
        log_dir=tmp_path,
        port=port,
    )
    try:
        got = pids_of(pids, "server", "child")
    finally:
        report = procs.stop_server(server, grace_s=0.5)
    assert (
        report.signal == "SIGKILL" and report.exit_code == -signal.SIGKILL and not report.survivors
    )
    assert (
        not alive(got["server"])
        and not alive(got["child"])
        and procs.port_is_free("127.0.0.1", port)
    )


@pytest.mark.parametrize(
    "flags",
    [(), ("--child", "--daemon"), ("--child", "--ignore-term")],
    ids=["plain", "child-and-daemon", "ignores-sigterm"],
)
def test_sigkill_of_the_controller_ends_the_server_and_resume_reaps_the_record(
    tmp_path, port, flags
):
    pids, started = tmp_path / "pids", {"pgid": None}
    controller = subprocess.Popen(
        [
            sys.executable,
            str(CONTROLLER),
            str(tmp_path),
            str(port),
            "1",
            "--",
            *listener(port, pids, *flags),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert select.select([controller.stdout], [], [], 30)[0], (
            "the controller did not start the server"
        )
        started = json.loads(controller.stdout.readline())
        roles = ("server", *(r for r in ("child", "daemon") if f"--{r}" in flags))
        got = pids_of(pids, *roles)
        assert not procs.port_is_free("127.0.0.1", port)
        if "--daemon" in flags:
            assert os.getpgid(got["daemon"]) != started["pgid"]  # escaped the group
        controller.send_signal(signal.SIGKILL)
        controller.wait(10)
        everyone = [started["pgid"], *got.values()]
        wait_for(
            lambda: (
                not any(alive(pid) for pid in everyone) and procs.port_is_free("127.0.0.1", port)
            ),
            DEATH_S,
            "the server to die with its controller",
        )
    finally:
        kill_quietly(controller.pid, pids_file=pids, pgid=started["pgid"])
    note = json.loads(Path(started["record"]).read_text())["supervisor"]
    assert note["reason"] == "the controller died" and set(got.values()) <= set(note["ended"])
    assert note["signal"] == ("SIGKILL" if "--ignore-term" in flags else "SIGTERM")
    reaped = procs.reap_servers(tmp_path)
    assert [(r.status, r.record.meta, r.ended, r.port_free) for r in reaped] == [
        ("gone", {"trial": 7}, [], True)
    ]
    assert not Path(started["record"]).exists() and procs.reap_servers(tmp_path) == []


def _record(
    pgid: int,
    token: str,
    port: int,
    controller: tuple[int, float | None],
    hostname: str | None = None,
    **kw,
) -> ServerRecord:
    from bisect_eagle.engines.procs.reap import boot_id, start_time

    return ServerRecord(
        pgid=pgid,
        supervisor_start=start_time(pgid),
        server_pid=pgid,
        server_start=start_time(pgid),
        host="127.0.0.1",
        port=port,
        hostname=hostname or socket.gethostname(),
        boot_id=boot_id(),
        controller_pid=controller[0],
        controller_start=controller[1],
        started_at=time.time(),
        token=token,
        argv_digest="",
        log_path="s.log",
        **kw,
    )


def test_reap_servers_ends_the_groups_of_dead_controllers_only(tmp_path, port):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_start = psutil.Process(dead.pid).create_time()
    dead.wait()
    pids = tmp_path / "pids"
    server = subprocess.Popen(
        listener(port, pids, "--child"),
        env={**os.environ, TOKEN_ENV: "t0k"},
        start_new_session=True,
    )
    try:
        got = pids_of(pids, "server", "child")
        write_record(
            tmp_path, _record(server.pid, "t0k", port, (dead.pid, dead_start), meta={"trial": 3})
        )
        me = (os.getpid(), psutil.Process().create_time())
        write_record(tmp_path, _record(1, "x", port, me))  # a live controller: this process
        write_record(tmp_path, _record(2, "y", port, (dead.pid, dead_start), hostname="elsewhere"))
        reaped = procs.reap_servers(tmp_path, grace_s=2)
        assert len(reaped) == 1
        r = reaped[0]
        assert r.status == "reaped" and r.signal == "SIGTERM" and r.record.meta == {"trial": 3}
        assert set(r.ended) == {got["server"], got["child"]} and r.port_free and not r.survivors
        assert (
            not alive(got["server"])
            and not alive(got["child"])
            and procs.port_is_free("127.0.0.1", port)
        )
        assert sorted(p.name for p, _ in read_records(tmp_path)) == ["1.json", "2.json"]
        assert json.loads(json.dumps(r.to_json()))["record"]["pgid"] == server.pid
    finally:
        kill_quietly(server.pid, pids_file=pids)
        server.wait(10)


def _orphaned_daemon(tmp_path: Path, port: int, env: dict[str, str]) -> tuple[list[str], int]:
    """A daemon holding ``port`` whose server is dead: (the server's argv, the daemon's pid)."""
    pids = tmp_path / "pids"
    argv = listener(port, pids, "--daemon")
    server = subprocess.Popen(argv, env=env, start_new_session=True)
    try:
        got = pids_of(pids, "server", "daemon")
    finally:
        server.kill()
        server.wait(10)
    assert alive(got["daemon"]) and not procs.port_is_free("127.0.0.1", port)
    return argv, got["daemon"]


@pytest.mark.parametrize("by", ["token", "command line"])
def test_a_double_forked_orphan_is_found_by_port_and_ended(tmp_path, port, by):
    env = {**os.environ, TOKEN_ENV: "t0k"} if by == "token" else dict(os.environ)
    argv, daemon = _orphaned_daemon(tmp_path, port, env)
    try:
        orphans = procs.end_port_orphans(
            "127.0.0.1",
            port,
            token="t0k",
            digest=argv_digest(argv) if by == "command line" else "",
            grace_s=2,
        )
        assert [(o.pid, o.ended, o.signal) for o in orphans] == [(daemon, True, "SIGTERM")]
        warning = orphans[0].warning()
        assert by in orphans[0].reason and f"port {port}" in warning and f"pid {daemon}" in warning
        assert not alive(daemon) and procs.port_is_free("127.0.0.1", port)
    finally:
        kill_quietly(daemon)


def test_a_stranger_on_the_port_is_left_alone(tmp_path, port):
    argv, daemon = _orphaned_daemon(tmp_path, port, dict(os.environ))
    try:
        orphans = procs.end_port_orphans(
            "127.0.0.1", port, token="other", digest=argv_digest(["other"]), grace_s=1
        )
        assert [(o.pid, o.ended) for o in orphans] == [(daemon, False)] and "left alone" in orphans[
            0
        ].warning()
        assert alive(daemon) and not procs.port_is_free("127.0.0.1", port)
    finally:
        kill_quietly(daemon)


def test_stop_server_ends_a_daemon_that_left_the_group(tmp_path, port):
    pids = tmp_path / "pids"
    server = procs.start_server(
        listener(port, pids, "--child", "--daemon"),
        {},
        log_path=tmp_path / "s.log",
        log_dir=tmp_path,
        port=port,
    )
    try:
        got = pids_of(pids, "server", "child", "daemon")
        # adopted by the supervisor (a subreaper)
        assert psutil.Process(got["daemon"]).ppid() == server.pgid
    finally:
        report = procs.stop_server(server, grace_s=2)
        kill_quietly(pids_file=pids)
    assert (
        not report.survivors
        and not any(alive(p) for p in got.values())
        and procs.port_is_free("127.0.0.1", port)
    )
    assert any(
        f"pid {got['daemon']} had left the server's process group" in w for w in report.warnings
    )
    assert not server.record_path.exists()


def test_stop_server_ends_an_orphan_found_only_by_the_port(tmp_path, port):
    pids = tmp_path / "pids"
    server = procs.start_server(
        listener(port, pids, "--daemon"),
        {},
        log_path=tmp_path / "s.log",
        log_dir=tmp_path,
        port=port,
    )
    try:
        got = pids_of(pids, "server", "daemon")
        # the supervisor vanishes: the server dies with it, the daemon is orphaned
        os.kill(server.pgid, signal.SIGKILL)
        wait_for(lambda: not alive(got["server"]), what="the server to die with its supervisor")
        assert alive(got["daemon"]) and got["daemon"] not in server.seen
    finally:
        report = procs.stop_server(server, grace_s=2)
        kill_quietly(pids_file=pids)
    assert [(o.pid, o.ended) for o in report.orphans] == [(got["daemon"], True)]
    assert any(f"port {port} was still held" in w for w in report.warnings)
    assert (
        not alive(got["daemon"])
        and procs.port_is_free("127.0.0.1", port)
        and not server.record_path.exists()
    )


def test_a_server_started_from_a_thread_outlives_the_thread(tmp_path, port):
    """The parent-death-signal trap: the thread that forked exits, the controller lives on, so must
    the server."""
    pids, box = tmp_path / "pids", []
    thread = threading.Thread(
        target=lambda: box.append(
            procs.start_server(
                listener(port, pids), {}, log_path=tmp_path / "s.log", log_dir=tmp_path, port=port
            )
        )
    )
    thread.start()
    thread.join(30)
    server = box[0]
    try:
        got = pids_of(pids, "server")
        time.sleep(0.5)
        assert (
            alive(got["server"])
            and not server.exited()
            and not procs.port_is_free("127.0.0.1", port)
        )
    finally:
        report = procs.stop_server(server, grace_s=2)
    assert (
        report.signal == "SIGTERM"
        and not alive(got["server"])
        and procs.port_is_free("127.0.0.1", port)
    )
