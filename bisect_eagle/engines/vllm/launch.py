"""How one trial's vLLM server is launched: argv (a list, never a shell string), environment,
per-trial draft copy.

The launch command (``engine.vllm.launch_command``, default ``python -m
vllm.entrypoints.openai.api_server``) gets ``--model``, ``--tensor-parallel-size``,
``--host``/``--port``, ``--speculative-config`` (JSON: ``method`` ``eagle3``/``eagle``, ``model`` =
the per-trial draft copy, ``num_speculative_tokens`` = ``num_steps``), ``--dtype`` when the trial
sets it explicitly, one flag per ``settings.server_args`` entry (``enforce_eager: true`` →
``--enforce-eager``; ``max_model_len: 512`` → ``--max-model-len 512``; ``false`` → left out, or
``--no-x`` for a ``--x/--no-x`` flag that defaults on, see :func:`trial_args`; null → left out) and
``engine.vllm.extra_args`` verbatim.

The environment is the inherited one plus ``settings.env``, plus ``VLLM_HOST_IP`` = the server's
host when the trial does not set it: without it vLLM's engine message queue binds to the machine's
non-loopback address.

The draft copy symlinks every file of the draft and writes ``config.json`` with the trial's ids, in
vLLM's convention, at the top level (``eagle_aux_hidden_state_layer_ids``), the first place vLLM
reads (:mod:`.ids`).
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bisect_eagle.artifacts.configs import read_config_json
from bisect_eagle.artifacts.layers import fc_width_refusal
from bisect_eagle.engines import launch as shared
from bisect_eagle.engines.launch import (
    Arg,
    check_layer_ids,
    flag_name,
    grouped_args,
    value_arg,
    write_draft_copy,
)

# the engine's, planner's and tests' name
from bisect_eagle.engines.launch import argv_tokens as argv_tokens
from bisect_eagle.engines.vllm.ids import draft_ids
from bisect_eagle.errors import BadInput
from bisect_eagle.keys import IDS_KEY
from bisect_eagle.spec.schema import VllmServer
from bisect_eagle.spec.settings import LiveSettings

if TYPE_CHECKING:
    from bisect_eagle.engines.plan import TrialPlan

# speculative_algorithm -> vLLM's SpeculativeConfig.method
METHODS = {"EAGLE3": "eagle3", "EAGLE": "eagle"}
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
MANAGED_FLAGS = {
    "--model": "model",
    "--host": "host",
    "--port": "port",
    "--speculative-config": "speculative_config",
    "-sc": "speculative_config",
    "--spec-method": "spec_method",
    "--spec-model": "spec_model",
    "--spec-tokens": "spec_tokens",
    "--dtype": "dtype",
    "--tensor-parallel-size": "tensor_parallel_size",
    "-tp": "tensor_parallel_size",
}
# inherited variables worth recording
INHERITED_PREFIXES = ("VLLM_", "CUDA_", "NCCL_", "TORCH_", "OMP_", "HF_")
HEAD = shared.HeadFlags(engine="vllm", model_flag="--model", tp_flag="--tensor-parallel-size")


def managed_dest(flag: str) -> str | None:
    """The engine-set parser dest a flag (or its dotted JSON form, ``--speculative-config.method``)
    targets."""
    head = flag.split("=", 1)[0]
    return MANAGED_FLAGS.get(head) or MANAGED_FLAGS.get(head.split(".", 1)[0])


def server_arg(key: str, value: Any, *, dest_of: dict[str, str] | None = None) -> Arg | None:
    """One ``settings.server_args`` entry as a flag; None for false/null (the server's own default).

    ``dest_of`` maps the installed parser's flags to their dests (from the oracle), so an alias of a
    managed flag is refused too. Raises :class:`BadInput` for a flag the engine sets itself or a
    value it cannot pass.
    """
    origin = f"settings.server_args.{key}"
    flag = flag_name(key)
    dest = managed_dest(flag) or (dest_of or {}).get(flag.split(".", 1)[0])
    if dest in MANAGED:
        raise BadInput(f"{origin}: {flag} is set by the engine; use {MANAGED[dest]} instead")
    return value_arg(flag, value, origin)


def extra_args(tokens: Iterable[str]) -> list[Arg]:
    """``engine.vllm.extra_args`` grouped into flags with their values (``--a=1`` kept as one
    token).

    Args:
        tokens: the setting's tokens, verbatim.

    Returns:
        One :class:`Arg` per flag (a token starting with ``-``), with its values.

    Raises:
        BadInput: a flag the engine sets itself, or a value before the first flag.
    """

    def check(token: str) -> None:
        """Refuse a flag the engine sets itself.

        Args:
            token: a flag token.

        Raises:
            BadInput: the flag is one the engine manages.
        """
        dest = managed_dest(token)
        if dest in MANAGED:
            raise BadInput(
                f"engine.vllm.extra_args: {token} is set by the engine; use {MANAGED[dest]} instead"
            )

    return grouped_args(
        tokens,
        origin="engine.vllm.extra_args",
        is_flag=lambda token: token.startswith("-"),
        check=check,
    )


def args_at(args: Sequence[Arg], *, port: str, draft_dir: str) -> list[Arg]:
    """``args`` with ``--port`` and the speculative config's ``model`` (the draft copy) set: the
    only two values that differ between the planned launch, the one vLLM's oracle judges and the one
    a trial starts."""
    out = []
    for arg in args:
        if arg.flag == "--port":
            arg = Arg(arg.flag, (port,), arg.origin)
        elif managed_dest(arg.flag) == "speculative_config" and arg.values:
            spec = {**json.loads(arg.values[0]), "model": draft_dir}
            arg = Arg(arg.flag, (json.dumps(spec, sort_keys=True),), arg.origin)
        out.append(arg)
    return out


@dataclass(frozen=True)
class Launch:
    """How a vLLM plan launches, bound to the plan's fingerprint: made by the planner with the plan,
    and the only thing a trial launches (never a plan made again at launch time).

    Args:
        fingerprint: the plan's.
        args: the flags in clear; the port and the draft copy are set per launch (:meth:`argv`).
        env: what the server process gets on top of the inherited environment.
        top_level_ids: the ids the draft copy's config.json carries at the top level (None: the
            draft's own).
    """

    fingerprint: str
    args: tuple[Arg, ...]
    env: dict[str, str]
    top_level_ids: list[int] | None

    def argv(self, command: Sequence[str], *, port: int, draft_dir: Path) -> list[str]:
        """The launch command's argv with this trial's port and draft copy.

        Args:
            command: the launch command's tokens.
            port: the port this launch listens on.
            draft_dir: this trial's draft copy.

        Returns:
            The whole argv: ``command`` then the flags.
        """
        return [
            *command,
            *argv_tokens(args_at(self.args, port=str(port), draft_dir=str(draft_dir))),
        ]


def launch_of(plan: TrialPlan) -> Launch:
    """The launch a vllm ``plan`` carries, bound to the plan's fingerprint
    (:func:`bisect_eagle.engines.launch.bound_launch`).

    Args:
        plan: a plan made by :class:`~bisect_eagle.engines.vllm.planner.Planner`.

    Returns:
        Its launch; a plan without one, or with another plan's, raises ``RuntimeError`` (a bug).
    """
    return shared.bound_launch(plan, Launch, engine="vllm")


def speculative_config(settings: LiveSettings, draft_dir: Path | str) -> dict[str, Any]:
    """The ``--speculative-config`` object of a speculative trial."""
    if settings.speculative_algorithm not in METHODS:
        raise BadInput(
            f"speculative_algorithm {settings.speculative_algorithm!r}: the vllm engine runs "
            f"{sorted(METHODS)}"
        )
    return {
        "method": METHODS[settings.speculative_algorithm],
        "model": str(draft_dir),
        "num_speculative_tokens": settings.num_steps,
    }


def trial_args(
    settings: LiveSettings,
    *,
    server: VllmServer,
    target: Path,
    draft_dir: Path | str | None,
    port: int,
    negated: Iterable[str] = (),
    dest_of: dict[str, str] | None = None,
) -> list[Arg]:
    """The flags of one trial's server (after the launch command).

    ``negated``: ``server_args`` keys set to false whose flag is a ``--x/--no-x`` flag that defaults
    on; they become ``--no-x`` (leaving them out would keep them on).

    Args:
        settings: the trial's settings.
        server: the spec's ``engine.vllm`` settings.
        target: the target model's path.
        draft_dir: the trial's draft copy; None for the baseline.
        port: the port the server listens on.
        negated: ``server_args`` keys to write as ``--no-x``.
        dest_of: the installed parser's flag -> dest; None when unknown.

    Returns:
        The flags: the shared head, ``--speculative-config`` (not for the baseline), ``--dtype``
        when set, ``server_args``, then ``extra_args``.

    Raises:
        BadInput: a ``server_args`` or ``extra_args`` flag the engine sets itself, or a value no
            flag can carry.
    """
    args = HEAD.args(settings, server=server, target=target, draft_dir=draft_dir, port=port)
    if not settings.is_baseline:
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


def vllm_env(settings: LiveSettings, *, host: str) -> tuple[dict[str, str], list[str]]:
    """The variables set for the trial (``settings.env`` plus ``VLLM_HOST_IP``) and notes about
    them."""
    env = dict(settings.env)
    notes: list[str] = []
    if "VLLM_HOST_IP" not in env:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            notes.append(
                f"engine.vllm.host {host!r} is not an IP address: VLLM_HOST_IP is not set, and "
                "vLLM binds its engine message queue to the machine's own address"
            )
        else:
            env["VLLM_HOST_IP"] = host
    return env, notes


def launch_text(argv: list[str], env: dict[str, str], *, environ: dict[str, str]) -> str:
    """launch_command.txt of a vLLM trial: :func:`bisect_eagle.engines.launch.launch_text` (its
    arguments and its text) with vLLM's inherited prefixes, :data:`INHERITED_PREFIXES`."""
    return shared.launch_text(argv, env, environ=environ, prefixes=INHERITED_PREFIXES)


# --------------------------------------------------------------------------------------------------
# per-trial draft directory


def draft_config_patch(vllm_ids: list[int]) -> dict[str, list[int]]:
    """The config.json change that makes vLLM capture ``vllm_ids``: the top-level key, read before
    any other.

    Args:
        vllm_ids: vLLM aux layer ids.

    Returns:
        The top-level ids key mapped to a copy of ``vllm_ids``.

    Raises:
        BadInput: an empty list, a non-integer or a repeated id.
    """
    check_layer_ids(IDS_KEY, vllm_ids)
    return {IDS_KEY: list(vllm_ids)}


def prepare_draft_dir(draft: Path, vllm_ids: list[int] | None, *, out_dir: Path) -> Path:
    """A copy of ``draft`` at ``out_dir``: every file symlinked except config.json, which gets
    ``vllm_ids`` at the top level (None keeps the draft's own config).

    The id count must equal the width the draft's ``fc`` takes
    (:func:`~bisect_eagle.engines.vllm.ids.draft_ids`). The directory is built beside ``out_dir``
    and renamed into place, so it is never half-written.

    Args:
        draft: the draft directory.
        vllm_ids: the trial's vLLM aux layer ids; None keeps the draft's config.
        out_dir: where the copy goes; it must not exist.

    Returns:
        ``out_dir``.

    Raises:
        BadInput: the draft's config is unreadable, the id count is not the fc width, the ids are
            bad, or ``out_dir`` exists.
    """
    draft = Path(draft).resolve()
    config = read_config_json(draft, "the draft")
    if vllm_ids is not None:
        info = draft_ids(config)
        refusal = fc_width_refusal(
            vllm_ids, width=info.fc_width, where=str(draft / "config.json"), said_by=info.fc_source
        )
        if refusal is not None:
            raise BadInput(refusal)
        config = {**config, **draft_config_patch(vllm_ids)}
    return write_draft_copy(draft, config, out_dir=out_dir)
