"""An engine's oracle whose interpreter exits before it answers is said at once as what it is: the
interpreter, its exit code and the last line it wrote on stderr, then the fix (not a wait for the
start timeout)."""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest

from bisect_eagle.engines.oracle import InterpreterDied
from bisect_eagle.engines.sglang.oracle import Oracle as SglangOracle
from bisect_eagle.engines.vllm.oracle import START_TIMEOUT_S
from bisect_eagle.engines.vllm.oracle import Oracle as VllmOracle

LAST_WORDS = "fatal: libpython3.11.so.1.0: cannot open shared object file"


def dying_interpreter(folder: Path, *, stderr: list[str], code: int = 3) -> Path:
    """An executable that writes ``stderr`` and exits with ``code`` at once, whatever it is
    asked."""
    path = folder / "python"
    path.write_text(
        "#!/bin/sh\n" + "".join(f"echo '{line}' >&2\n" for line in stderr) + f"exit {code}\n"
    )
    path.chmod(0o755)
    return path


def test_a_vllm_interpreter_that_exits_at_once_is_one_line_with_its_exit_code_and_last_stderr_line(
    tmp_path,
):
    python = dying_interpreter(tmp_path, stderr=["starting", LAST_WORDS])
    oracle = VllmOracle(python=str(python))
    started = time.monotonic()
    with pytest.raises(InterpreterDied) as died:
        oracle.describe()
    # told at once, not after the start timeout
    assert time.monotonic() - started < START_TIMEOUT_S / 10
    assert str(died.value) == (
        f"{python} exited before answering (exit code 3): {LAST_WORDS}; point engine.vllm.python "
        "(or --vllm-python) at an environment with vLLM (scripts/setup_vllm_env.sh)"
    )
    assert oracle.failure == str(died.value)


def test_a_silent_sglang_interpreter_that_exits_at_once_says_it_wrote_nothing(tmp_path):
    python = dying_interpreter(tmp_path, stderr=[], code=1)
    with pytest.raises(
        InterpreterDied,
        match=rf"^{python} exited before answering \(exit code 1\), writing nothing "
        r"on stderr; point engine\.sglang\.python \(or --sglang-python\)",
    ):
        SglangOracle(python=str(python), parser="sglang").describe()


def test_an_interpreter_that_answers_it_cannot_import_the_server_is_not_checked_not_dead(tmp_path):
    """This project's interpreter has no vLLM: the oracle answers so, and plans go on unchecked."""
    import sys

    oracle = VllmOracle(python=sys.executable)
    assert oracle.describe() is None and "cannot import vLLM" in oracle.failure


def test_a_process_keeps_one_oracle_per_interpreter_and_replaces_one_that_failed(
    tmp_path, monkeypatch
):
    """The stand-in's parser (this interpreter): one process answers every planner of a command,
    another interpreter or another ``SGLANG_*`` value gets its own, a failed one is started again,
    and :func:`close_shared` ends them all."""
    import sys

    from bisect_eagle.engines.oracle import close_shared
    from bisect_eagle.engines.sglang.oracle import STAND_IN_PARSER

    monkeypatch.delenv("SGLANG_LOG_GC", raising=False)
    one = SglangOracle.shared(python=sys.executable, parser=STAND_IN_PARSER)
    assert one.describe() is not None and one.is_shared
    pid = one._proc.pid
    assert SglangOracle.shared(python=sys.executable, parser=STAND_IN_PARSER) is one
    monkeypatch.setenv("SGLANG_LOG_GC", "1")  # an answer may depend on it: not the same oracle
    assert SglangOracle.shared(python=sys.executable, parser=STAND_IN_PARSER) is not one
    monkeypatch.delenv("SGLANG_LOG_GC")
    dead = dying_interpreter(tmp_path, stderr=[LAST_WORDS])
    broken = SglangOracle.shared(python=str(dead), parser=STAND_IN_PARSER)
    with pytest.raises(InterpreterDied):
        broken.describe()
    again = SglangOracle.shared(python=str(dead), parser=STAND_IN_PARSER)
    assert again is not broken and again.failure is None  # tried again, not the old failure
    close_shared()
    assert one._proc is None and (not psutil.pid_exists(pid) or _zombie(pid))


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


CONTROLLER = """import sys, time
from bisect_eagle.engines.sglang.oracle import Oracle, STAND_IN_PARSER
oracle = Oracle.shared(python=sys.executable, parser=STAND_IN_PARSER)
assert oracle.describe() is not None
print(oracle._proc.pid, flush=True)
time.sleep(600)
"""


def test_a_kept_oracle_exits_when_its_controller_is_killed_outright(tmp_path):
    """SIGKILL runs no exit handler: the oracle reads the end of its stdin and exits."""
    import signal
    import subprocess
    import sys

    controller = subprocess.Popen(
        [sys.executable, "-c", CONTROLLER], stdout=subprocess.PIPE, text=True, cwd=tmp_path
    )
    try:
        oracle_pid = int(controller.stdout.readline())
        assert psutil.pid_exists(oracle_pid)
    finally:
        controller.send_signal(signal.SIGKILL)
        controller.wait(timeout=30)
    deadline = time.monotonic() + 60
    while psutil.pid_exists(oracle_pid) and not _zombie(oracle_pid):
        assert time.monotonic() < deadline, "the oracle outlived its controller by a minute"
        time.sleep(0.2)
