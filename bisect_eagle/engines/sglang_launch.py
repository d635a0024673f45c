"""How one trial's SGLang server is launched: argv (a list, never a shell string), environment, flag probe.

The launch command (``engine.sglang.launch_command``, default ``python -m sglang.launch_server``) gets
``--model-path``, the TP size, ``--host``/``--port``, the speculative flags and ``--speculative-draft-model-path``
pointing at a per-trial copy of the draft directory (weights symlinked, ``config.json`` with the trial's ids
in ``eagle_config.eagle_aux_hidden_state_layer_ids``, the only place SGLang reads them), then one flag per
``settings.server_args`` entry (``disable_custom_all_reduce: true`` → ``--disable-custom-all-reduce``;
``attention_backend: fa3`` → ``--attention-backend fa3``; false or null → flag left out, the server's
default) and ``engine.sglang.extra_args`` verbatim. ``settings.env`` is set on top of the inherited environment.

``device`` and ``dtype`` become ``--device``/``--dtype`` only when the trial's settings set them explicitly:
their defaults (cpu, float32) are the local engine's and would be wrong for a GPU server.

Before a launch the installed server is probed once (``<launch command> --help``; the version from the
``-m`` module's distribution or ``--version``). Flags renamed between SGLang releases are adapted (e.g.
``--cuda-graph-max-bs`` → ``--cuda-graph-max-bs-decode`` in 0.5.23, which rejects the old name as
ambiguous) and any flag the help does not list is refused before launching, naming the flag, where it
came from and the launch command. Every flag is used by its exact name, never by an argparse prefix.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bisect_eagle.configs import read_config_json
from bisect_eagle.errors import BadInput
from bisect_eagle.settings import SECRET_MARKERS, LiveSettings, apply_speculative_rules, is_secret
from bisect_eagle.spec import SglangServer

TP_FLAGS = ("--tp-size", "--tensor-parallel-size", "--tp")  # preferred first; all mean the same in SGLang
RENAMES: dict[str, tuple[str, ...]] = {  # requested flag -> its names in other SGLang releases
    "--cuda-graph-max-bs": ("--cuda-graph-max-bs-decode",),  # 0.5.23 split it into -decode / -prefill
    "--cuda-graph-max-bs-decode": ("--cuda-graph-max-bs",),
}
MANAGED = {  # flags the engine sets itself -> the setting that controls them
    "--model-path": "engine.sglang.model_path (or the spec's target)",
    "--host": "engine.sglang.host",
    "--port": "the engine (a free port per trial)",
    "--speculative-algorithm": "speculative_algorithm",
    "--speculative-draft-model-path": "the spec's draft (copied per trial)",
    "--speculative-num-steps": "num_steps",
    "--speculative-eagle-topk": "topk",
    "--speculative-num-draft-tokens": "num_draft_tokens",
    "--device": "device",
    "--dtype": "dtype",
    **{f: "engine.sglang.tp" for f in TP_FLAGS},
}
INHERITED_PREFIXES = ("NCCL_", "SGLANG_", "SGL_", "CUDA_", "TORCH_")  # inherited variables worth recording
_FLAG_RE = re.compile(r"(?<![\w-])--[A-Za-z0-9][\w-]*")


@dataclass(frozen=True)
class Arg:
    """One flag of the launch command, its values and the setting it came from."""

    flag: str
    values: tuple[str, ...]
    origin: str


@dataclass(frozen=True)
class ServerFlags:
    """What a probe of the installed server found."""

    command: tuple[str, ...]  # the launch command with its executable resolved
    flags: frozenset[str]
    version: str | None


@dataclass
class LaunchPlan:
    """Everything needed to start one trial's server, and what to tell the user about it."""

    argv: list[str]
    env: dict[str, str]  # variables set on top of the inherited environment
    draft_dir: Path | None
    config_patch: dict | None  # applied to the draft's config.json in draft_dir
    notes: list[str] = field(default_factory=list)  # flag adaptations and SGLang overrides to expect


# ---------------------------------------------------------------------------------------------------
# executable and probe


def resolve_executable(name: str) -> str:
    """Absolute path of a launch command's executable.

    A bare name is looked up next to the running interpreter first (this install's ``python`` and console
    scripts such as ``bisect-eagle``, found even when its virtual environment is not activated), then on PATH.
    """
    if os.sep in name:
        path = Path(name).expanduser()
        if path.is_file() and os.access(path, os.X_OK):
            return os.path.abspath(path)  # not resolve(): a venv's python is a symlink out of the venv
        raise BadInput(f"engine.sglang.launch_command: {name!r} is not an executable file")
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise BadInput(f"engine.sglang.launch_command: {name!r} was found neither in {beside.parent} nor on PATH")
    return found


def _version_of(command: list[str], flags: frozenset[str], timeout_s: float) -> str | None:
    """The server's version: of the ``-m`` module's distribution, else from ``--version``; None if neither."""
    if len(command) >= 3 and command[1] == "-m":
        probe = [command[0], "-c", "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))",
                 command[2].split(".")[0]]
    elif "--version" in flags:
        probe = [*command, "--version"]
    else:
        return None
    try:
        res = subprocess.run(probe, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = res.stdout.strip().splitlines()
    return lines[-1].strip() if res.returncode == 0 and lines else None


def probe_flags(launch_command: list[str], timeout_s: float = 300.0) -> ServerFlags:
    """Run ``<launch command> --help`` (and a version query) and collect the flags it lists."""
    if not launch_command:
        raise BadInput("engine.sglang.launch_command: expected a non-empty list, found []")
    command = [resolve_executable(launch_command[0]), *launch_command[1:]]
    shown = shlex.join(launch_command)
    try:
        res = subprocess.run([*command, "--help"], capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise BadInput(f"engine.sglang.launch_command: `{shown} --help` did not finish in {timeout_s:.0f} s") from None
    flags = frozenset(_FLAG_RE.findall(res.stdout))
    if res.returncode != 0 or "--port" not in flags:
        tail = " | ".join((res.stderr or res.stdout).strip().splitlines()[-3:])
        raise BadInput(f"engine.sglang.launch_command: `{shown} --help` exited {res.returncode} without listing "
                       f"server flags (expected at least --port); it said: {tail or '(nothing)'}")
    return ServerFlags(tuple(command), flags, _version_of(command, flags, min(timeout_s, 120.0)))


# ---------------------------------------------------------------------------------------------------
# argv and environment


def flag_name(key: str) -> str:
    """``server_args`` key → flag: ``disable_custom_all_reduce`` → ``--disable-custom-all-reduce``."""
    return "--" + key.strip().lstrip("-").replace("_", "-")


def server_arg(key: str, value: Any) -> Arg | None:
    """One ``settings.server_args`` entry as a flag; None for false/null (the server's own default)."""
    origin = f"settings.server_args.{key}"
    flag = flag_name(key)
    if flag in MANAGED:
        raise BadInput(f"{origin}: {flag} is set by the engine; use {MANAGED[flag]} instead")
    if value is None or value is False:
        return None
    if value is True:
        return Arg(flag, (), origin)
    if isinstance(value, dict):
        return Arg(flag, (json.dumps(value, sort_keys=True),), origin)
    if isinstance(value, list):
        if not value or any(isinstance(v, (dict, list)) for v in value):
            raise BadInput(f"{origin}: expected a scalar or a non-empty list of scalars, found {value!r}")
        return Arg(flag, tuple(str(v) for v in value), origin)
    return Arg(flag, (str(value),), origin)


def _extra_args(extra: list[str]) -> list[Arg]:
    """``engine.sglang.extra_args`` grouped into flags with their values (``--a=1`` kept as one token)."""
    args: list[Arg] = []
    for token in extra:
        if token.startswith("--"):
            args.append(Arg(token, (), "engine.sglang.extra_args"))
        elif not args:
            raise BadInput(f"engine.sglang.extra_args: expected a flag (--name) first, found {token!r}")
        else:
            args[-1] = Arg(args[-1].flag, (*args[-1].values, token), args[-1].origin)
    return args


def trial_args(
    settings: LiveSettings, server: SglangServer, target: Path, draft_dir: Path | None, port: int
) -> list[Arg]:
    """The flags of one trial's server, before adaptation to the installed version."""
    args = [
        Arg("--model-path", (str(server.model_path or target),), "engine.sglang.model_path"),
        Arg("--tp-size", (str(server.tp),), "engine.sglang.tp"),
        Arg("--host", (server.host,), "engine.sglang.host"),
        Arg("--port", (str(port),), "engine"),
    ]
    if not settings.is_baseline:
        if draft_dir is None:
            raise BadInput("a speculative trial needs a draft directory")
        expected, _ = apply_speculative_rules(settings)
        ndt = settings.num_draft_tokens if settings.num_draft_tokens is not None else expected.num_draft_tokens
        args += [
            Arg("--speculative-algorithm", (settings.speculative_algorithm,), "speculative_algorithm"),
            Arg("--speculative-draft-model-path", (str(draft_dir),), "draft"),
            Arg("--speculative-num-steps", (str(settings.num_steps),), "num_steps"),
            Arg("--speculative-eagle-topk", (str(settings.topk),), "topk"),
            Arg("--speculative-num-draft-tokens", (str(ndt),), "num_draft_tokens"),
        ]
    for key in ("device", "dtype"):
        if key in settings.model_fields_set:
            args.append(Arg(f"--{key}", (str(getattr(settings, key)),), key))
    for key, value in settings.server_args.items():
        arg = server_arg(key, value)
        if arg is not None:
            args.append(arg)
    return args + _extra_args(list(server.extra_args))


def adapt_args(args: list[Arg], flags: ServerFlags, shown_command: str) -> tuple[list[Arg], list[str]]:
    """Rename flags to what the installed server lists; refuse any it does not list. Returns (args, notes)."""
    out, notes = [], []
    for arg in args:
        name, eq, inline = arg.flag.partition("=")
        if name in TP_FLAGS:
            name = next((f for f in TP_FLAGS if f in flags.flags), name)
        elif name not in flags.flags and name in RENAMES:
            alt = next((f for f in RENAMES[name] if f in flags.flags), None)
            if alt is not None:
                notes.append(f"{name} ({arg.origin}) is {alt} in this server version; renamed")
                name = alt
        if name not in flags.flags:
            close = difflib.get_close_matches(name, sorted(flags.flags), n=3)
            hint = f"; close matches: {', '.join(close)}" if close else ""
            raise BadInput(f"{arg.origin}: flag {name} is not accepted by `{shown_command}` (its --help does not "
                           f"list it{hint})")
        out.append(Arg(name + eq + inline, arg.values, arg.origin))
    return out, notes


def flatten(args: list[Arg]) -> list[str]:
    return [token for arg in args for token in (arg.flag, *arg.values)]


def launch_command(
    settings: LiveSettings,
    server: SglangServer,
    target: Path,
    draft_dir: Path | None,
    port: int,
    flags: ServerFlags | None = None,
) -> tuple[list[str], dict[str, str]]:
    """(argv, environment variables added for the trial). With ``flags`` (a probe), adapted and checked."""
    argv, env, _ = _build(settings, server, target, draft_dir, port, flags)
    return argv, env


def _build(
    settings: LiveSettings,
    server: SglangServer,
    target: Path,
    draft_dir: Path | None,
    port: int,
    flags: ServerFlags | None,
) -> tuple[list[str], dict[str, str], list[str]]:
    if not server.launch_command:
        raise BadInput("engine.sglang.launch_command: expected a non-empty list, found []")
    args = trial_args(settings, server, Path(target), draft_dir, port)
    notes: list[str] = []
    command = list(server.launch_command)
    if flags is not None:
        args, notes = adapt_args(args, flags, shlex.join(server.launch_command))
        command = list(flags.command)
    for name in settings.env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise BadInput(f"settings.env: {name!r} is not a valid environment variable name")
    return [*command, *flatten(args)], dict(settings.env), notes


def is_secret_name(name: str) -> bool:
    """A flag or server-info key naming a secret: a word of it is TOKEN, KEY, SECRET or PASSWORD (``--api-key``,
    ``hf_token``; not ``--speculative-num-draft-tokens``)."""
    words = re.split(r"[-_]+", name.strip("-").upper())
    return any(w in SECRET_MARKERS or w.endswith(SECRET_MARKERS) for w in words)


def redact_argv(argv: list[str]) -> list[str]:
    """argv with the values of secret-named flags (``--api-key`` ...) replaced, safe to log."""
    out: list[str] = []
    hide_next = False
    for token in argv:
        if hide_next:
            out.append("<redacted>")
            hide_next = False
        elif token.startswith("--") and is_secret_name(token.partition("=")[0]):
            out.append(token.partition("=")[0] + "=<redacted>" if "=" in token else token)
            hide_next = "=" not in token
        else:
            out.append(token)
    return out


def inherited_env(environ: dict[str, str]) -> dict[str, str]:
    """Inherited variables that change how a server runs (NCCL_*, SGLANG_*, CUDA_* ...), secrets left out."""
    return {k: v for k, v in sorted(environ.items()) if k.startswith(INHERITED_PREFIXES) and not is_secret(k)}


def describe(argv: list[str], env: dict[str, str], environ: dict[str, str]) -> str:
    """launch_command.txt: the command as one shell-quoted line, the trial's variables and the inherited ones."""
    lines = ["# command", shlex.join(redact_argv(argv)), "", "# environment set for this trial"]
    lines += [f"{k}={v}" for k, v in sorted(env.items()) if not is_secret(k)]
    hidden = sum(1 for k in env if is_secret(k))
    if hidden:
        lines.append(f"# ({hidden} secret variable(s) set, not shown)")
    lines += ["", "# inherited environment that affects the server"]
    lines += [f"{k}={v}" for k, v in inherited_env(environ).items() if k not in env]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------
# per-trial draft directory


def draft_config_patch(layer_ids: list[int]) -> dict:
    """The config.json change that makes SGLang capture ``layer_ids``: nested under ``eagle_config``."""
    if not layer_ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in layer_ids):
        raise BadInput(f"eagle_aux_hidden_state_layer_ids: expected a non-empty list of integers, found {layer_ids!r}")
    if len(set(layer_ids)) != len(layer_ids):
        raise BadInput(f"eagle_aux_hidden_state_layer_ids: {layer_ids} repeats an id; each layer is captured once")
    return {"eagle_config": {"eagle_aux_hidden_state_layer_ids": list(layer_ids)}}


def trained_aux_count(config: dict) -> tuple[int, str]:
    """How many aux states the draft's ``fc`` takes, by SGLang's precedence: (count, the key it came from)."""
    eagle = config.get("eagle_config") if isinstance(config.get("eagle_config"), dict) else {}
    if isinstance(config.get("num_aux_hidden_states"), int):
        return config["num_aux_hidden_states"], "num_aux_hidden_states"
    if isinstance(eagle.get("eagle_aux_hidden_state_layer_ids"), list):
        return len(eagle["eagle_aux_hidden_state_layer_ids"]), "eagle_config.eagle_aux_hidden_state_layer_ids"
    if isinstance(config.get("eagle_aux_hidden_state_layer_ids"), list):
        return len(config["eagle_aux_hidden_state_layer_ids"]), "eagle_aux_hidden_state_layer_ids (top level)"
    return 3, "SGLang's default of 3"


def _merge(base: dict, patch: dict) -> dict:
    out = dict(base)
    for key, value in patch.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def prepare_draft_dir(draft: Path, layer_ids: list[int] | None, out_dir: Path) -> Path:
    """A copy of ``draft`` at ``out_dir``: every file symlinked except config.json, patched for ``layer_ids``.

    ``layer_ids`` None keeps the draft's own config. The id count must equal what the draft was trained on.
    The directory is built beside ``out_dir`` and renamed into place, so it is never half-written.
    """
    draft = Path(draft).resolve()
    cfg_path = draft / "config.json"
    config = read_config_json(draft, "the draft")
    if layer_ids is not None:
        count, source = trained_aux_count(config)
        if len(layer_ids) != count:
            raise BadInput(f"{cfg_path}: key {source} gives {count} aux layers, the width fc was trained on; "
                           f"eagle_aux_hidden_state_layer_ids {layer_ids} has {len(layer_ids)}")
        config = _merge(config, draft_config_patch(layer_ids))
    out_dir = Path(out_dir)
    if out_dir.exists():
        raise BadInput(f"{out_dir}: already exists; each trial gets a new draft directory")
    tmp = out_dir.with_name(out_dir.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    for entry in sorted(draft.iterdir()):
        if entry.name != "config.json":
            (tmp / entry.name).symlink_to(entry.resolve())
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tmp.rename(out_dir)
    return out_dir


def plan_trial(
    settings: LiveSettings,
    server: SglangServer,
    target: Path,
    trial_dir: Path,
    port: int,
    flags: ServerFlags | None,
) -> LaunchPlan:
    """The launch of one trial (argv, env, draft copy at ``trial_dir/draft``, notes); writes nothing."""
    draft_dir = None if settings.is_baseline else Path(trial_dir) / "draft"
    patch = None
    if not settings.is_baseline and settings.eagle_aux_hidden_state_layer_ids is not None:
        patch = draft_config_patch(settings.eagle_aux_hidden_state_layer_ids)
    argv, env, notes = _build(settings, server, target, draft_dir, port, flags)
    if not settings.is_baseline:
        _, rule_warnings = apply_speculative_rules(settings)
        notes += [f"expected server override: {w}" for w in rule_warnings]
    return LaunchPlan(argv, env, draft_dir, patch, notes)
