"""What a served engine checks before a study creates anything, how it classifies a failed trial
(one order of questions for every server), and that a subclass implements every hook."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bisect_eagle.engines.oracle import InterpreterDied
from bisect_eagle.engines.served import FailureLog, ServedEngine
from bisect_eagle.engines.vllm import VllmEngine
from bisect_eagle.errors import BadInput
from bisect_eagle.spec.schema import VllmServer

FAKE = Path(__file__).resolve().parent / "vllm" / "fake_vllm.py"


def engine(tiny, tmp_path: Path, **server) -> VllmEngine:
    return VllmEngine(
        VllmServer(**server),
        target=tiny.target,
        draft=tiny.draft,
        prompts=tiny.prompts,
        log_dir=tmp_path / "logs",
        check=False,
    )


@pytest.mark.parametrize(
    ("server", "message"),
    [
        (
            {"python": "/nonexistent/python"},
            "key 'engine.vllm.python': /nonexistent/python is not an executable on this machine",
        ),
        (
            {"python": sys.executable},  # this project's interpreter: no vLLM in it
            f"key 'engine.vllm.python': {sys.executable} has no 'vllm' module, so "
            f"`{sys.executable} -m vllm.entrypoints.openai.api_server` cannot start",
        ),
        (
            {"launch_command": ["no-such-vllm-command", "serve"]},
            "key 'engine.vllm.launch_command': no-such-vllm-command is not an executable on this "
            "machine",
        ),
    ],
)
def test_a_server_this_machine_cannot_start_is_refused_naming_the_key_and_the_fix(
    tiny, tmp_path, server, message
):
    with pytest.raises(BadInput) as refused:
        engine(tiny, tmp_path, **server).check_launchable()
    assert str(refused.value).startswith(message) and "scripts/setup_vllm_env.sh" in str(
        refused.value
    )
    assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize(
    "server",
    [
        # a script: nothing to find beyond the executable
        {"launch_command": [sys.executable, str(FAKE)]},
        # a module the interpreter has
        {"launch_command": ["python", "-m", "json.tool"], "python": sys.executable},
    ],
)
def test_a_server_this_machine_can_start_passes(tiny, tmp_path, server):
    engine(tiny, tmp_path, **server).check_launchable()


def test_an_interpreter_that_exits_at_once_is_refused_with_its_exit_code_and_last_stderr_line(
    tiny, tmp_path
):
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho 'fatal: cannot open shared object file' >&2\nexit 127\n")
    python.chmod(0o755)
    with pytest.raises(InterpreterDied) as refused:
        engine(tiny, tmp_path, python=str(python)).check_launchable()
    assert str(refused.value) == (
        f"key 'engine.vllm.python': {python} exited before answering (exit code 127): fatal: "
        "cannot open shared object file; point it at a working vllm environment "
        "(scripts/setup_vllm_env.sh makes one)"
    )


class _Answers(FailureLog):
    """A server whose log answers every question: the order of the questions decides the class."""

    engine = "demo"
    ready_probe = "/ready"

    def bad_arguments(self, log):
        return "usage error" if "usage" in log else None

    def out_of_memory(self, log):
        return "oom" if "oom" in log else None

    def capture_error(self, log):
        return "capture" if "capture" in log else None

    def start_error(self, log):
        return "launch_error", "exited"


@pytest.mark.parametrize(
    ("phase", "log", "timed_out", "expected"),
    [
        ("start", "usage oom capture", False, ("bad_arguments", "usage error")),
        # argument errors only before ready
        ("benchmark", "usage oom capture", False, ("out_of_memory", "oom")),
        ("ready_timeout", "usage capture", False, ("capture_error", "capture")),
        ("start", "", False, ("launch_error", "exited")),
        (
            "ready_timeout",
            "",
            False,
            ("readiness_timeout", "the server did not answer /ready in time"),
        ),
        (
            "benchmark",
            "",
            True,
            ("hung_request", "a request got no answer within engine.demo.request_timeout_s"),
        ),
        (
            "benchmark",
            "",
            False,
            ("crash_during_benchmark", "a request failed during the benchmark"),
        ),
    ],
)
def test_a_failure_is_classified_by_the_same_questions_in_the_same_order(
    phase, log, timed_out, expected
):
    assert _Answers().classify(phase, log, timed_out=timed_out) == expected


def test_a_served_engine_without_its_hooks_cannot_be_built(tiny, tmp_path):
    class Partial(ServedEngine):
        name = "partial"
        planner_class = VllmEngine.planner_class

        def _launch(self, plan, *, trial_dir, port):
            raise AssertionError

    with pytest.raises(TypeError, match="abstract"):
        Partial(VllmServer(), target=tiny.target, draft=tiny.draft, prompts=None, log_dir=tmp_path)
