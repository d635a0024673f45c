"""Test helpers: small random drafts and fake target directories written to disk; the command line
run as a subprocess (a timeout fails saying the machine was too slow) and the processes a test
started, found by a mark in their environment."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from unittest import mock

import psutil
import torch
from safetensors.torch import save_file

from bisect_eagle.artifacts.draft import DraftConfig, Eagle3Draft, init_weights


def small_config(
    num_aux: int = 3, hidden: int = 16, vocab: int = 32, draft_vocab: int = 24
) -> DraftConfig:
    return DraftConfig(
        hidden_size=hidden,
        intermediate_size=32,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
        vocab_size=vocab,
        draft_vocab_size=draft_vocab,
        target_hidden_size=hidden,
        num_aux=num_aux,
    )


def random_draft(seed: int = 0, **kw) -> Eagle3Draft:
    """A draft with random weights, a random embedding and a valid draft-vocabulary map."""
    model = Eagle3Draft(small_config(**kw))
    init_weights(model, seed=seed, std=0.2)
    g = torch.Generator().manual_seed(seed + 1)
    c = model.config
    with torch.no_grad():
        model.embed_tokens.weight.copy_(torch.randn(c.vocab_size, c.hidden_size, generator=g))
        ids = torch.randperm(c.vocab_size, generator=g)[: c.draft_vocab_size].sort().values
        model.d2t.copy_(ids - torch.arange(c.draft_vocab_size))
        model.t2d.zero_()
        model.t2d[ids] = True
        for norm in (model.norm, model.midlayer.hidden_norm, model.midlayer.input_layernorm):
            norm.weight.copy_(1 + 0.1 * torch.randn(c.hidden_size, generator=g))
    return model.eval()


def write_fake_target(
    path: Path, embed: torch.Tensor, num_layers: int = 4, lm_head: torch.Tensor | None = None
) -> Path:
    """A target directory holding only what the head readers need (config + embed, norm,
    lm_head)."""
    import json

    path.mkdir(parents=True, exist_ok=True)
    v, h = embed.shape
    save_file(
        {
            "model.embed_tokens.weight": embed.contiguous(),
            "model.norm.weight": torch.ones(h),
            "lm_head.weight": (lm_head if lm_head is not None else torch.randn(v, h)).contiguous(),
        },
        str(path / "model.safetensors"),
    )
    (path / "config.json").write_text(
        json.dumps(
            {
                "num_hidden_layers": num_layers,
                "rms_norm_eps": 1e-6,
                "hidden_size": h,
                "vocab_size": v,
            }
        )
    )
    return path


def load_fake_engine():
    """The deterministic ``FakeEngine`` class of the search tests (``tests/fake_engine.py``)."""
    import importlib.util

    path = Path(__file__).resolve().parent / "fake_engine.py"
    spec = importlib.util.spec_from_file_location("fake_engine", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FakeEngine


def file_tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` with its size and mtime: what a refused command must leave as it
    found it."""
    return {str(p): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def run_cli(args: list[str], monkeypatch, capsys) -> tuple[int, str, str]:
    """``bisect-eagle ARGS`` in this process through the console entry point: (exit code, stdout,
    stderr)."""
    import sys

    from bisect_eagle.cli import main

    monkeypatch.setattr(sys, "argv", ["bisect-eagle", *args])
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else int(e.code is not None)
    out = capsys.readouterr()
    return code, out.out, out.err


def tiny_fake_study(root: Path):
    """The embedded tiny spec's study in fresh stores under ``root/mlruns``: real stage 1 on 4
    samples, the fake live engine. Returns (tracking URI, StudyOutcome, the fake engine class)."""
    import optuna

    from bisect_eagle.search.study import Options, run_study
    from bisect_eagle.spec.load import load_spec
    from bisect_eagle.spec.schema import DEFAULT_SPEC

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = load_spec(DEFAULT_SPEC)
    spec.standalone.samples = 4
    uri = f"sqlite:///{root}/mlruns/mlflow.db"
    fake = load_fake_engine()
    out = run_study(
        spec,
        options=Options(storage=f"sqlite:///{root}/mlruns/optuna.db", tracking_uri=uri),
        engine_factory=lambda s: fake(),
    )
    return uri, out, fake


SPLIT_SPEC = """\
name: split
scenario: tiny
dump_layer_ids: [1, 5, 9]
training_accuracy: 0.8992
engine:
  kind: local
  settings: {{device: cpu, num_prompts: 4, warmup_prompts: 1, max_new_tokens: 48}}
baseline: measure
criterion: {{metric: output_tok_s, ratio: {ratio}}}
standalone: {{wirings: [{{rule: "[:-1]"}}], steps: 3, samples: 4}}
space:
  num_steps: {{type: categorical, choices: [3]}}
search: {{sampler: grid, max_live_trials: 1}}
"""


def split_study(root: Path, *, ratio: float = 2.2):
    """A study of one live trial on the tiny scenario, to split: real stage 1 of the draft's own
    wiring on 4 samples, then the fake engine at 3 draft steps (accept length 2.8, 193 tok/s against
    a 100 tok/s baseline) against a target of ``ratio`` × the baseline's tok/s. Returns (spec path,
    tracking URI, StudyOutcome)."""
    import optuna

    from bisect_eagle.search.study import Options, run_study
    from bisect_eagle.spec.load import load_spec

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    root.mkdir(parents=True, exist_ok=True)
    spec = root / "split.yaml"
    spec.write_text(SPLIT_SPEC.format(ratio=ratio))
    uri = f"sqlite:///{root}/mlruns/mlflow.db"
    fake = load_fake_engine()
    opts = Options(storage=f"sqlite:///{root}/mlruns/optuna.db", tracking_uri=uri)
    out = run_study(load_spec(spec), options=opts, engine_factory=lambda s: fake())
    return spec, uri, out


def tiny_fake_bisect(root: Path, uri: str, fake):
    """tiny.yaml (good) vs tiny-broken.yaml (bad) with the fake engine, logged to ``uri``."""
    from bisect_eagle.bisect.run import BisectOptions, run_bisect

    experiments = Path(__file__).resolve().parents[1] / "experiments"
    return run_bisect(
        BisectOptions(
            good=str(experiments / "tiny.yaml"),
            bad=str(experiments / "tiny-broken.yaml"),
            metric="accept_length",
            repeats=1,
            tracking_uri=uri,
            log_path=root / "bisect.log",
        ),
        engine_factory=lambda s: fake(),
    )


def engine_python(found: str | None, *, engine: str, require: str, setup: str) -> str:
    """An engine's own interpreter, or skip the calling test; where CI requires the engine
    (``require=1``), fail.

    Args:
        found: the interpreter found (None: none here).
        engine: its name for the message (SGLang, vLLM).
        require: the environment variable CI sets to require it.
        setup: the script that makes the environment.
    """
    import os

    import pytest

    if found is None:
        if os.environ.get(require) == "1":
            pytest.fail(f"{require}=1 but no {engine} environment (bash {setup})")
        pytest.skip(f"no {engine} environment: bash {setup}")
    return found


def screen_in_a_pty(
    code: str, *, cwd: Path, timeout_s: float = 600
) -> tuple[list[tuple[float, str]], int]:
    """Run ``python -c code`` in a 120-column pseudo-terminal (stdin, stdout and stderr); every line
    or redraw it writes (ANSI codes removed), with the monotonic time it was read, and its exit code
    (killed at ``timeout_s``).
    """
    import os
    import pty
    import re
    import select
    import subprocess
    import sys
    import time

    ansi = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.update(COLUMNS="120", LINES="40", TERM="xterm", OMP_NUM_THREADS="1")
    env.pop("NO_COLOR", None)
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=cwd,
        env=env,
        stdin=follower,
        stdout=follower,
        stderr=follower,
        close_fds=True,
    )
    os.close(follower)
    seen: list[tuple[float, str]] = []
    buffer, deadline = "", time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.5)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(leader, 65536).decode(errors="replace")
            except OSError:  # the child closed the terminal
                break
            buffer += ansi.sub("", chunk)
            *pieces, buffer = re.split(r"[\r\n]", buffer)
            now = time.monotonic()
            seen += [(now, piece) for piece in pieces if piece.strip()]
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        os.close(leader)
    return seen, proc.returncode


# a whole tiny study on a 2-core machine at load 20 takes minutes; this is far beyond it
CLI_TIMEOUT_S = 1800.0
# in the environment of a test's commands, inherited by all they start
MARK_ENV = "BISECT_EAGLE_TEST_MARK"


def cli(
    *args: str,
    cwd: Path,
    timeout_s: float = CLI_TIMEOUT_S,
    env: dict[str, str] | None = None,
    mark: str | None = None,
) -> subprocess.CompletedProcess:
    """``bisect-eagle ARGS`` as a subprocess in its own process group, output captured, without
    ``MLFLOW_TRACKING_URI`` (the default store under ``cwd``).

    Args:
        args: the command line after ``bisect-eagle``.
        cwd: where it runs.
        timeout_s: past this the whole process group is killed and the test fails, saying the
            machine was too slow (a timeout is the machine's load, not the command's answer).
        env: the environment (default: this process's).
        mark: a token put in the environment as :data:`MARK_ENV`; :func:`marked_processes` finds
            what it started.

    Returns:
        The finished process (``returncode``, ``stdout``, ``stderr``).
    """
    import pytest

    env = {
        k: v for k, v in (os.environ if env is None else env).items() if k != "MLFLOW_TRACKING_URI"
    }
    if mark is not None:
        env[MARK_ENV] = mark
    argv = [sys.executable, "-m", "bisect_eagle.cli", *args]
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        pytest.fail(too_slow_line(e), pytrace=False)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def new_mark() -> str:
    """A fresh token for :func:`cli`'s ``mark``."""
    return uuid.uuid4().hex


def marked_processes(mark: str) -> list:
    """The running processes (``psutil.Process``) whose environment carries ``mark``: what a test's
    commands started, even after their parents exited, and nothing that another test or user runs;
    the oracles this process keeps for its life (:func:`kept_oracle`) are not the test's."""
    out = []
    for p in psutil.process_iter():
        try:
            if (
                p.environ().get(MARK_ENV) == mark
                and p.status() != psutil.STATUS_ZOMBIE
                and not kept_oracle(p)
            ):
                out.append(p)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return out


def kept_oracle(p: psutil.Process) -> bool:
    """Whether ``p`` is an engine oracle this process keeps (one per interpreter,
    :meth:`bisect_eagle.engines.oracle.OracleProcess.shared`; another test of the same worker may
    have started it, and it ends with the worker).

    Raises:
        psutil.Error: ``p`` is gone or not readable.
    """
    return p.ppid() == os.getpid() and any(
        part.endswith("oracle_script.py") for part in p.cmdline()
    )


def ctrl_c_heard() -> None:
    """``preexec_fn`` of a process a test sends SIGINT: Ctrl-C's default action, as at a terminal.

    A command a non-interactive shell starts in the background (``pytest ... &``, a CI script run
    that way) inherits SIGINT ignored, and an exec keeps it ignored; Python then never raises
    KeyboardInterrupt, so a Ctrl-C test would measure the shell, not the tool.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def own_children() -> list[psutil.Process]:
    """This process's live children (recursively), but the oracles it keeps for its life
    (:func:`kept_oracle`): what a test started and may have left behind."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and not kept_oracle(p):
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def cli_in_process(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``bisect-eagle ARGS`` through its console entry point (bad input exits 2 in one line), run in
    this process from ``cwd``, so that the engine oracles it asks are the ones this worker keeps
    (:meth:`bisect_eagle.engines.oracle.OracleProcess.shared`) instead of one started per command:
    its exit code and what it printed, as a finished subprocess."""
    from bisect_eagle.cli import main

    out, err = io.StringIO(), io.StringIO()
    code: object = 0
    with (
        contextlib.chdir(cwd),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
        mock.patch.object(sys, "argv", ["bisect-eagle", *args]),
    ):
        try:
            main()
        except SystemExit as e:
            code = e.code
    returncode = code if isinstance(code, int) else 0 if code is None else 1
    return subprocess.CompletedProcess(
        ["bisect-eagle", *args], returncode, out.getvalue(), err.getvalue()
    )


def too_slow_line(e: subprocess.TimeoutExpired) -> str:
    """What a test says of a subprocess that did not finish within its timeout: the machine was too
    slow, with its load (a timeout is the machine's load, not the command's answer).

    Args:
        e: the expired wait.

    Returns:
        One line naming the command (its first words) and the timeout.
    """
    cmd = e.cmd if isinstance(e.cmd, str) else " ".join(str(part) for part in e.cmd)
    if cmd.startswith(sys.executable + " -m bisect_eagle.cli "):
        cmd = "bisect-eagle " + cmd.removeprefix(sys.executable + " -m bisect_eagle.cli ")
    shown = cmd if len(cmd) <= 120 else cmd[:117] + "..."
    return (
        f"`{shown}` did not finish within {e.timeout:.3g} s: the machine was too slow "
        f"(load {os.getloadavg()[0]:.1f}); this says nothing about the command"
    )
