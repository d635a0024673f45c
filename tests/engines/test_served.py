"""What a served engine checks before a study creates anything: that this machine can start its server at all."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bisect_eagle.engines.oracle import InterpreterDied
from bisect_eagle.engines.vllm import VllmEngine
from bisect_eagle.errors import BadInput
from bisect_eagle.spec.schema import VllmServer

FAKE = Path(__file__).resolve().parent / "vllm" / "fake_vllm.py"


def engine(tiny, tmp_path: Path, **server) -> VllmEngine:
    return VllmEngine(VllmServer(**server), target=tiny.target, draft=tiny.draft, prompts=tiny.prompts,
                      log_dir=tmp_path / "logs", check=False)


@pytest.mark.parametrize(("server", "message"), [
    ({"python": "/nonexistent/python"},
     "key 'engine.vllm.python': /nonexistent/python is not an executable on this machine"),
    ({"python": sys.executable},  # this project's interpreter: no vLLM in it
     f"key 'engine.vllm.python': {sys.executable} has no 'vllm' module, so `{sys.executable} -m "
     "vllm.entrypoints.openai.api_server` cannot start"),
    ({"launch_command": ["no-such-vllm-command", "serve"]},
     "key 'engine.vllm.launch_command': no-such-vllm-command is not an executable on this machine"),
])
def test_a_server_this_machine_cannot_start_is_refused_naming_the_key_and_the_fix(tiny, tmp_path, server, message):
    with pytest.raises(BadInput) as refused:
        engine(tiny, tmp_path, **server).check_launchable()
    assert str(refused.value).startswith(message) and "scripts/setup_vllm_env.sh" in str(refused.value)
    assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize("server", [
    {"launch_command": [sys.executable, str(FAKE)]},  # a script: nothing to find beyond the executable
    {"launch_command": ["python", "-m", "json.tool"], "python": sys.executable},  # a module the interpreter has
])
def test_a_server_this_machine_can_start_passes(tiny, tmp_path, server):
    engine(tiny, tmp_path, **server).check_launchable()


def test_an_interpreter_that_exits_at_once_is_refused_with_its_exit_code_and_last_stderr_line(tiny, tmp_path):
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\necho 'fatal: cannot open shared object file' >&2\nexit 127\n")
    python.chmod(0o755)
    with pytest.raises(InterpreterDied) as refused:
        engine(tiny, tmp_path, python=str(python)).check_launchable()
    assert str(refused.value) == (f"key 'engine.vllm.python': {python} exited before answering (exit code 127): "
                                  "fatal: cannot open shared object file; point it at a working vllm environment "
                                  "(scripts/setup_vllm_env.sh makes one)")
