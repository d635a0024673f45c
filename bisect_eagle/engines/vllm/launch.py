"""How one trial's vLLM server is launched: argv (a list, never a shell string), environment, per-trial draft copy.

The launch command (``engine.vllm.launch_command``, default ``python -m vllm.entrypoints.openai.api_server``) gets
``--model``, ``--tensor-parallel-size``, ``--host``/``--port``, ``--speculative-config`` (JSON: ``method``
``eagle3``/``eagle``, ``model`` = the per-trial draft copy, ``num_speculative_tokens`` = ``num_steps``), ``--dtype``
when the trial sets it explicitly, one flag per ``settings.server_args`` entry (``enforce_eager: true`` →
``--enforce-eager``; ``max_model_len: 512`` → ``--max-model-len 512``; ``false`` → left out, or ``--no-x`` for a
``--x/--no-x`` flag that defaults on, see :func:`trial_args`; null → left out) and ``engine.vllm.extra_args``
verbatim.

The environment is the inherited one plus ``settings.env``, plus ``VLLM_HOST_IP`` = the server's host when the trial
does not set it: without it vLLM's engine message queue binds to the machine's non-loopback address.

The draft copy symlinks every file of the draft and writes ``config.json`` with the trial's ids, in vLLM's
convention, at the top level (``eagle_aux_hidden_state_layer_ids``), the first place vLLM reads (:mod:`.ids`).
"""

from __future__ import annotations

import ipaddress
import json
import shlex
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bisect_eagle.artifacts.configs import read_config_json
from bisect_eagle.engines.vllm.ids import IDS_KEY, draft_ids
from bisect_eagle.errors import BadInput
from bisect_eagle.spec.schema import VllmServer
from bisect_eagle.spec.settings import LiveSettings
from bisect_eagle.tracking.redact import is_secret_name, redact_argv

METHODS = {"EAGLE3": "eagle3", "EAGLE": "eagle"}  # speculative_algorithm -> vLLM's SpeculativeConfig.method
MANAGED = {  # parser dest the engine sets itself -> the setting that controls it
    "model": "engine.vllm.model_path (or the spec's target)",
    "model_tag": "engine.vllm.model_path (or the spec's target)",
    "host": "engine.vllm.host",
    "port": "the engine (a free port per trial)",
    "speculative_config": "speculative_algorithm, num_steps and the spec's draft",
    "spec_method": "speculative_algorithm",
    "spec_model": "the spec's draft (copied per trial)",
    "spec_tokens": "num_steps",
    "dtype": "dtype",
    "tensor_parallel_size": "engine.vllm.tp",
}
MANAGED_FLAGS = {"--model": "model", "--host": "host", "--port": "port", "--speculative-config": "speculative_config",
                 "-sc": "speculative_config", "--spec-method": "spec_method", "--spec-model": "spec_model",
                 "--spec-tokens": "spec_tokens", "--dtype": "dtype", "--tensor-parallel-size": "tensor_parallel_size",
                 "-tp": "tensor_parallel_size"}
INHERITED_PREFIXES = ("VLLM_", "CUDA_", "NCCL_", "TORCH_", "OMP_", "HF_")  # inherited variables worth recording


@dataclass(frozen=True)
class Arg:
    """One flag of the launch command, its values and the setting it came from."""

    flag: str
    values: tuple[str, ...]
    origin: str


def flag_name(key: str) -> str:
    """``server_args`` key → flag: ``max_model_len`` → ``--max-model-len`` (a dotted key keeps its dots)."""
    return "--" + key.strip().lstrip("-").replace("_", "-")


def managed_dest(flag: str) -> str | None:
    """The engine-set parser dest a flag (or its dotted JSON form, ``--speculative-config.method``) targets."""
    head = flag.split("=", 1)[0]
    return MANAGED_FLAGS.get(head) or MANAGED_FLAGS.get(head.split(".", 1)[0])


def server_arg(key: str, value: Any, *, dest_of: dict[str, str] | None = None) -> Arg | None:
    """One ``settings.server_args`` entry as a flag; None for false/null (the server's own default).

    ``dest_of`` maps the installed parser's flags to their dests (from the oracle), so an alias of a managed flag
    is refused too. Raises :class:`BadInput` for a flag the engine sets itself or a value it cannot pass.
    """
    origin = f"settings.server_args.{key}"
    flag = flag_name(key)
    dest = managed_dest(flag) or (dest_of or {}).get(flag.split(".", 1)[0])
    if dest in MANAGED:
        raise BadInput(f"{origin}: {flag} is set by the engine; use {MANAGED[dest]} instead")
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


def extra_args(tokens: Iterable[str]) -> list[Arg]:
    """``engine.vllm.extra_args`` grouped into flags with their values (``--a=1`` kept as one token)."""
    args: list[Arg] = []
    for token in tokens:
        if token.startswith("-"):
            dest = managed_dest(token)
            if dest in MANAGED:
                raise BadInput(f"engine.vllm.extra_args: {token} is set by the engine; use {MANAGED[dest]} instead")
            args.append(Arg(token, (), "engine.vllm.extra_args"))
        elif not args:
            raise BadInput(f"engine.vllm.extra_args: expected a flag (--name) first, found {token!r}")
        else:
            args[-1] = Arg(args[-1].flag, (*args[-1].values, token), args[-1].origin)
    return args


def speculative_config(settings: LiveSettings, draft_dir: Path | str) -> dict[str, Any]:
    """The ``--speculative-config`` object of a speculative trial."""
    if settings.speculative_algorithm not in METHODS:
        raise BadInput(f"speculative_algorithm {settings.speculative_algorithm!r}: the vllm engine runs "
                       f"{sorted(METHODS)}")
    return {"method": METHODS[settings.speculative_algorithm], "model": str(draft_dir),
            "num_speculative_tokens": settings.num_steps}


def trial_args(
    settings: LiveSettings, *, server: VllmServer, target: Path, draft_dir: Path | str | None, port: int,
    negated: Iterable[str] = (), dest_of: dict[str, str] | None = None,
) -> list[Arg]:
    """The flags of one trial's server (after the launch command).

    ``negated``: ``server_args`` keys set to false whose flag is a ``--x/--no-x`` flag that defaults on; they become
    ``--no-x`` (leaving them out would keep them on).
    """
    args = [
        Arg("--model", (str(server.model_path or target),), "engine.vllm.model_path"),
        Arg("--tensor-parallel-size", (str(server.tp),), "engine.vllm.tp"),
        Arg("--host", (server.host,), "engine.vllm.host"),
        Arg("--port", (str(port),), "engine"),
    ]
    if not settings.is_baseline:
        if draft_dir is None:
            raise BadInput("a speculative trial needs a draft directory")
        spec = json.dumps(speculative_config(settings, draft_dir), sort_keys=True)
        args.append(Arg("--speculative-config", (spec,), "speculative_algorithm, num_steps, draft"))
    if "dtype" in settings.model_fields_set:
        args.append(Arg("--dtype", (settings.dtype,), "dtype"))
    negate = set(negated)
    for key, value in settings.server_args.items():
        if key in negate:
            name = flag_name(key)
            args.append(Arg("--no-" + name[2:], (), f"settings.server_args.{key}"))
            continue
        arg = server_arg(key, value, dest_of=dest_of)
        if arg is not None:
            args.append(arg)
    return args + extra_args(server.extra_args)


def argv_tokens(args: list[Arg]) -> list[str]:
    return [token for arg in args for token in (arg.flag, *arg.values)]


def vllm_env(settings: LiveSettings, *, host: str) -> tuple[dict[str, str], list[str]]:
    """The variables set for the trial (``settings.env`` plus ``VLLM_HOST_IP``) and notes about them."""
    env = dict(settings.env)
    notes: list[str] = []
    if "VLLM_HOST_IP" not in env:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            notes.append(f"engine.vllm.host {host!r} is not an IP address: VLLM_HOST_IP is not set, and vLLM binds "
                         "its engine message queue to the machine's own address")
        else:
            env["VLLM_HOST_IP"] = host
    return env, notes


def inherited_env(environ: dict[str, str]) -> dict[str, str]:
    """Inherited variables that change how a server runs (VLLM_*, CUDA_*, NCCL_* ...), secrets left out."""
    return {k: v for k, v in sorted(environ.items()) if k.startswith(INHERITED_PREFIXES) and not is_secret_name(k)}


def launch_text(argv: list[str], env: dict[str, str], *, environ: dict[str, str]) -> str:
    """launch_command.txt: the command as one shell-quoted line, the trial's variables and the inherited ones."""
    lines = ["# command", shlex.join(redact_argv(argv)), "", "# environment set for this trial"]
    lines += [f"{k}={v}" for k, v in sorted(env.items()) if not is_secret_name(k)]
    hidden = sum(1 for k in env if is_secret_name(k))
    if hidden:
        lines.append(f"# ({hidden} secret variable(s) set, not shown)")
    lines += ["", "# inherited environment that affects the server"]
    lines += [f"{k}={v}" for k, v in inherited_env(environ).items() if k not in env]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------
# per-trial draft directory


def draft_config_patch(vllm_ids: list[int]) -> dict[str, list[int]]:
    """The config.json change that makes vLLM capture ``vllm_ids``: the top-level key, read before any other."""
    if not vllm_ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in vllm_ids):
        raise BadInput(f"{IDS_KEY}: expected a non-empty list of integers, found {vllm_ids!r}")
    if len(set(vllm_ids)) != len(vllm_ids):
        raise BadInput(f"{IDS_KEY}: {vllm_ids} repeats an id; each layer is captured once")
    return {IDS_KEY: list(vllm_ids)}


def prepare_draft_dir(draft: Path, vllm_ids: list[int] | None, *, out_dir: Path) -> Path:
    """A copy of ``draft`` at ``out_dir``: every file symlinked except config.json, which gets ``vllm_ids`` at the
    top level (None keeps the draft's own config).

    The id count must equal the width the draft's ``fc`` takes (:func:`~bisect_eagle.engines.vllm.ids.draft_ids`).
    The directory is built beside ``out_dir`` and renamed into place, so it is never half-written.
    """
    draft = Path(draft).resolve()
    config = read_config_json(draft, "the draft")
    if vllm_ids is not None:
        info = draft_ids(config)
        if len(vllm_ids) != info.fc_width:
            raise BadInput(f"{draft / 'config.json'}: key {info.fc_source} gives {info.fc_width} aux layers, the width "
                           f"fc takes; {IDS_KEY} {vllm_ids} has {len(vllm_ids)}")
        config = {**config, **draft_config_patch(vllm_ids)}
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
