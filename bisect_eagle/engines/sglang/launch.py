"""How one trial's SGLang server is launched: argv (a list, never a shell string), environment,
draft copy.

The launch command (``engine.sglang.launch_command``, default ``python -m sglang.launch_server``)
gets ``--model-path``, the TP size, ``--host``/``--port``, the speculative flags and
``--speculative-draft-model-path`` pointing at a per-trial copy of the draft directory (weights
symlinked, ``config.json`` with the plan's config patch: its ids in
``eagle_config.eagle_aux_hidden_state_layer_ids``, the only place SGLang reads them), then one flag
per ``settings.server_args`` entry (``disable_custom_all_reduce: true`` →
``--disable-custom-all-reduce``; ``attention_backend: fa3`` → ``--attention-backend fa3``; false or
null → flag left out, the server's default) and ``engine.sglang.extra_args`` verbatim.
``settings.env`` is set on top of the inherited environment.

``device`` and ``dtype`` become ``--device``/``--dtype`` only when the trial's settings set them
explicitly: their defaults (cpu, float32) are the local engine's and would be wrong for a GPU
server.

Flags are adapted to the installed server and checked by :mod:`.flags` and :mod:`.oracle`. A plan
carries its :class:`Launch` (the flags in clear, bound to the plan's fingerprint); a trial starts
from it with its own port and draft copy, never from a second plan.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bisect_eagle.artifacts.configs import read_config_json
from bisect_eagle.artifacts.draft import parse_draft_config
from bisect_eagle.artifacts.layers import fc_width_refusal
from bisect_eagle.engines import launch as shared
from bisect_eagle.engines.launch import (
    Arg,
    argv_tokens,
    check_layer_ids,
    flag_name,
    grouped_args,
    value_arg,
    write_draft_copy,
)
from bisect_eagle.engines.plan import TrialPlan
from bisect_eagle.engines.sglang.rules import apply_speculative_rules
from bisect_eagle.errors import BadInput
from bisect_eagle.keys import IDS_KEY
from bisect_eagle.spec.schema import SglangServer
from bisect_eagle.spec.settings import LiveSettings

TP_FLAGS = ("--tp-size", "--tensor-parallel-size")  # preferred first; both mean the same in SGLang
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
# inherited variables worth recording
INHERITED_PREFIXES = ("NCCL_", "SGLANG_", "SGL_", "CUDA_", "TORCH_")
HEAD = shared.HeadFlags(engine="sglang", model_flag="--model-path", tp_flag=TP_FLAGS[0])
# what differs between a plan and its launch
PORT_FLAG, DRAFT_FLAG = "--port", "--speculative-draft-model-path"


# --------------------------------------------------------------------------------------------------
# argv and environment


def server_arg(key: str, value: Any) -> Arg | None:
    """One ``settings.server_args`` entry as a flag; None for false/null (the server's own
    default)."""
    origin = f"settings.server_args.{key}"
    flag = flag_name(key)
    if flag in MANAGED:
        raise BadInput(f"{origin}: {flag} is set by the engine; use {MANAGED[flag]} instead")
    return value_arg(flag, value, origin)


def _extra_args(extra: list[str]) -> list[Arg]:
    """``engine.sglang.extra_args`` grouped into flags with their values (``--a=1`` kept as one
    token)."""
    return grouped_args(
        extra, origin="engine.sglang.extra_args", is_flag=lambda token: token.startswith("--")
    )


def trial_args(
    settings: LiveSettings, *, server: SglangServer, target: Path, draft_dir: Path | None, port: int
) -> list[Arg]:
    """The flags of one trial's server, before adaptation to the installed version.

    Args:
        settings: the trial's settings (its speculative fields and ``server_args``).
        server: the spec's ``engine.sglang`` settings.
        target: ``--model-path``, the target model's directory.
        draft_dir: ``--speculative-draft-model-path``, the trial's draft copy; None for the
            baseline, which runs no draft.
        port: ``--port``.

    Returns:
        The flags: the shared head, the speculative flags (not for the baseline), ``device`` and
        ``dtype`` when set, ``server_args``, then ``extra_args``.

    Raises:
        BadInput: a ``server_args`` key the engine sets itself or a value no flag can carry, or
            ``extra_args`` not starting with a flag.
    """
    args = HEAD.args(settings, server=server, target=target, draft_dir=draft_dir, port=port)
    if not settings.is_baseline:
        expected, _ = apply_speculative_rules(settings)
        ndt = (
            settings.num_draft_tokens
            if settings.num_draft_tokens is not None
            else expected.num_draft_tokens
        )
        args += [
            Arg(
                "--speculative-algorithm",
                (settings.speculative_algorithm,),
                "speculative_algorithm",
            ),
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


def with_values(args: Sequence[Arg], values: Mapping[str, str]) -> list[Arg]:
    """``args`` with the flags named in ``values`` (flag -> its one value) set to those values;
    others unchanged."""
    return [Arg(a.flag, (values[a.flag],), a.origin) if a.flag in values else a for a in args]


@dataclass(frozen=True, kw_only=True)
class Launch:
    """How a planned trial's server starts: the plan's flags in clear (never logged), bound to its
    fingerprint.

    Attributes:
        fingerprint: the identity of the plan this launch belongs to (:func:`launch_of` checks it).
        args: the flags after adaptation to the installed server, secrets in clear, with the plan's
            shown port and draft directory (:meth:`argv` sets the trial's own).
    """

    fingerprint: str
    args: tuple[Arg, ...]

    def argv(self, *, port: int, draft_dir: Path) -> list[str]:
        """The flags as launched: this trial's ``port`` and per-trial draft copy ``draft_dir``.

        Args:
            port: the port this launch listens on.
            draft_dir: this trial's draft copy.

        Returns:
            The argv tokens after the launch command.
        """
        return argv_tokens(
            with_values(self.args, {PORT_FLAG: str(port), DRAFT_FLAG: str(draft_dir)})
        )


def launch_of(plan: TrialPlan) -> Launch:
    """The launch of an sglang ``plan`` (made by
    :class:`~bisect_eagle.engines.sglang.planner.Planner`).

    Args:
        plan: an sglang plan.

    Returns:
        The launch it carries.

    Raises:
        RuntimeError: the plan has no launch, or its launch belongs to another identity (a plan
            changed after planning, or not made by the sglang planner): a bug, never a trial
            outcome.
    """
    return shared.bound_launch(plan, Launch, engine="sglang")


def launch_text(argv: list[str], env: dict[str, str], *, environ: dict[str, str]) -> str:
    """launch_command.txt of an SGLang trial: :func:`bisect_eagle.engines.launch.launch_text` (its
    arguments and its text) with SGLang's inherited prefixes, :data:`INHERITED_PREFIXES`."""
    return shared.launch_text(argv, env, environ=environ, prefixes=INHERITED_PREFIXES)


# --------------------------------------------------------------------------------------------------
# per-trial draft directory


def draft_config_patch(layer_ids: list[int]) -> dict:
    """The config.json change that makes SGLang capture ``layer_ids``: nested under
    ``eagle_config``.

    Raises:
        BadInput: ``layer_ids`` empty, not integers, or repeating an id.
    """
    check_layer_ids(IDS_KEY, layer_ids)
    return {"eagle_config": {IDS_KEY: list(layer_ids)}}


def _merge(base: dict, patch: dict) -> dict:
    out = dict(base)
    for key, value in patch.items():
        out[key] = (
            _merge(out[key], value)
            if isinstance(value, dict) and isinstance(out.get(key), dict)
            else value
        )
    return out


def prepare_draft_dir(draft: Path, *, config_patch: dict | None, out_dir: Path) -> Path:
    """A copy of ``draft`` at ``out_dir``: every file symlinked except config.json, which gets
    ``config_patch``.

    Args:
        draft: the draft directory.
        config_patch: the plan's draft config change
            (:attr:`~bisect_eagle.engines.plan.TrialPlan.config_patch`, from
            :func:`draft_config_patch`); None keeps the draft's own config. Its id count must be the
            one ``fc`` was trained on (:func:`~bisect_eagle.artifacts.layers.fc_width_refusal`).
        out_dir: where the copy goes; it must not exist. The directory is built beside it and
            renamed into place, so it is never half-written.

    Returns:
        ``out_dir``.

    Raises:
        BadInput: the draft's config is unreadable, the patch's ids do not fit ``fc``, or
            ``out_dir`` exists.
    """
    draft = Path(draft).resolve()
    cfg_path = draft / "config.json"
    config = read_config_json(draft, "the draft")
    if config_patch is not None:
        width, said_by = parse_draft_config(config, cfg_path).sglang_fc_aux()
        refusal = fc_width_refusal(
            config_patch["eagle_config"][IDS_KEY], width=width, where=str(cfg_path), said_by=said_by
        )
        if refusal is not None:
            raise BadInput(refusal)
        config = _merge(config, config_patch)
    return write_draft_copy(draft, config, out_dir=out_dir)
