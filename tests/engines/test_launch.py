"""launch_command.txt (:func:`bisect_eagle.engines.launch.launch_text`): a script that, pasted into
a shell, sets exactly the trial's variables and runs exactly its command; no value or name is ever
run."""

from __future__ import annotations

import json
import subprocess
import sys

from bisect_eagle.engines.launch import export_line, launch_text

HOSTILE = {  # NCCL's own variables: the secret policy writes their values in clear
    "NCCL_ALGO": "Ring",
    "NCCL_SOCKET_IFNAME": "a b  c",
    "NCCL_TOPO_FILE": "$(touch pwned-subst)",
    "NCCL_NET": "`touch pwned-tick`",
    "NCCL_IB_HCA": 'it\'s "quoted"; touch pwned-semicolon',
    "NCCL_DEBUG_SUBSYS": "one\ntouch pwned-newline",
    "NCCL_PROTO": "",
}
SHOW_ENV = (
    "import json, os; print(json.dumps({k: v for k, v in os.environ.items() if "
    "k.startswith('NCCL_')}))"
)


def test_pasted_into_a_shell_it_sets_each_value_verbatim_and_runs_nothing_else(tmp_path):
    inherited = {"NCCL_DEBUG": "INFO; touch pwned-inherited", "PATH": "/usr/bin:/bin"}
    text = launch_text(
        [sys.executable, "-c", SHOW_ENV], HOSTILE, environ=inherited, prefixes=("NCCL_",)
    )
    script = tmp_path / "launch_command.txt"
    script.write_text(text)
    done = subprocess.run(
        ["bash", str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {**HOSTILE, "NCCL_DEBUG": "INFO; touch pwned-inherited"}
    assert list(tmp_path.iterdir()) == [script]  # nothing was run but the command


def test_the_variables_come_before_the_command():
    text = launch_text(
        ["srv", "--port", "30000"], {"NCCL_ALGO": "Tree"}, environ={}, prefixes=("NCCL_",)
    )
    lines = text.splitlines()
    assert lines.index("export NCCL_ALGO=Tree") < lines.index("srv --port 30000") == len(lines) - 1


def test_a_name_the_shell_cannot_set_is_quoted_too(tmp_path):
    line = export_line("X$(touch pwned)", "1")
    assert line == "export 'X$(touch pwned)'=1"
    done = subprocess.run(
        ["bash", "-c", line], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert "not a valid identifier" in done.stderr and list(tmp_path.iterdir()) == []
