"""The sglang engine's plan: the exact launch of one trial, judged by the installed SGLang before
anything starts.

For a request the planner

1. applies the speculative rules and resolves the layer ids (``null`` → the draft's own nested
   ``eagle_config`` ids, the only ones SGLang reads; see
   ``docs/sglang-facts.md#where-sglang-reads-the-ids``), checking them against the target's depth
   with the target family's capture rule (:mod:`bisect_eagle.artifacts.layers`);
2. builds the argv (:mod:`.launch`) and adapts it to the installed server's flags (:mod:`.flags`);
3. asks SGLang itself (:mod:`.oracle`): its parser (invalid values, ambiguous or unknown flags) and,
   when the target's ``config.json`` is readable here, ``ServerArgs.resolve_once`` (DSA page size,
   backend limits, the ``topk == 1`` override, max running requests …). A refusal quotes SGLang and
   nothing is launched. On a host without the launch's accelerators (a laptop planning the 8-GPU
   node's trials) resolution does not run: the plan is usable and ``checked`` says ``resolution
   needs the node's GPUs: not resolved here``; missing hardware is never reported as SGLang refusing
   the config;
4. refuses trees that ask for more draft tokens than SGLang can select
   (``docs/sglang-facts.md#tree-candidate-bound``; SGLang itself fails only at CUDA-graph capture);
5. writes the effective settings: resolved values, the environment SGLang will run with
   (``docs/sglang-facts.md#environment-sglang-sets``), server args that differ from SGLang's
   defaults;
6. keeps the launch (:class:`~.launch.Launch`: the flags in clear, bound to the plan's fingerprint)
   in the plan, so a trial starts from the plan it was given and is never planned twice.

``speculative_adaptive: true`` becomes ``--speculative-adaptive`` (speculative trials only) and
``speculative_adaptive: true`` in the effective settings when SGLang's resolution keeps it on; when
resolution turns it off (``topk > 1``, attention DP …) the key is left out, with SGLang's reason as
a warning, so the trial is the static one SGLang runs. Without resolution, ``num_steps`` must be one
of the default adaptive config's candidate steps, as SGLang checks at start
(``docs/sglang-facts.md#speculative-adaptive``).

Pinned acceptance (``pinned_acceptance``) becomes SGLang's simulated acceptance (``srt/environ.py``,
``speculative/spec_utils.py``): ``SGLANG_SIMULATE_ACC_LEN`` = the profile's accept length ``1 +
sum(rates)``, ``SGLANG_SIMULATE_ACC_METHOD=match-expected`` (each verify step accepts the floor or
the ceiling of the length minus one drafts, weighted to match the mean) and
``SGLANG_SIMULATE_ACC_TOKEN_MODE=real-draft-token`` (the accepted drafts are emitted as drafted, the
bonus token is the target's; the default ``fixed`` emits token id 100). SGLang pins one mean accept
length, not a per-position profile: the effective profile is the minimum-variance one of that length
(:func:`~bisect_eagle.spec.settings.profile_for_accept_length`), with a warning when the request
asked for another shape. ``real-draft-token`` needs ``topk == 1`` (SGLang raises at the first verify
otherwise) and the adaptive controller would pick ``num_steps`` from the simulated acceptance: both
are refused with a pin. The variables are in the plan's ``env`` (and the launch's); a trial's own
``SGLANG_SIMULATE_*`` entries are refused with a pin and left as they are without one.

Without SGLang the same plan is built with the project's own rules and says ``not checked against
SGLang``. An installed SGLang that is not a release those rules are tested with
(:data:`~.rules.TESTED_SGLANG`) refuses every plan with one line naming the version and the
interpreter: the planner does not guess another release's rules.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, cast

from bisect_eagle.artifacts import capture, layers
from bisect_eagle.artifacts.draft import read_draft_config
from bisect_eagle.engines.launch import explicit_server_args, inherited_env, negated_keys
from bisect_eagle.engines.plan import TrialPlan, make_plan
from bisect_eagle.engines.planner import BasePlanner, server_limits
from bisect_eagle.engines.sglang import flags as flagmod
from bisect_eagle.engines.sglang.launch import (
    DRAFT_FLAG,
    PORT_FLAG,
    Arg,
    Launch,
    argv_tokens,
    draft_config_patch,
    flag_name,
    trial_args,
    with_values,
)
from bisect_eagle.engines.sglang.oracle import Oracle, interpreter, parser_spec
from bisect_eagle.engines.sglang.rules import (
    adaptive_steps,
    resolved_adaptive,
    speculative_effective,
    tree_bound,
    untested_version,
)
from bisect_eagle.errors import BadInput
from bisect_eagle.keys import IDS_KEY
from bisect_eagle.spec.schema import SglangServer
from bisect_eagle.spec.settings import ADAPTIVE, PINNED, LiveSettings, profile_for_accept_length
from bisect_eagle.tracking.redact import redact_env

ENGINE = "sglang"
# variables SGLang's launcher overwrites whatever the trial sets (0.5.23, entrypoints/engine.py)
SET_BY_SGLANG = {
    "CUDA_DEVICE_MAX_CONNECTIONS": "8",
}
IGNORED_ENV = ("SGLANG_ENABLE_SPEC_V2",)  # read nowhere in SGLang 0.5.23
SIMULATE_ENV = (
    "SGLANG_SIMULATE_ACC_LEN",
    "SGLANG_SIMULATE_ACC_METHOD",
    "SGLANG_SIMULATE_ACC_TOKEN_MODE",
)
# inherited variables the plan shows (they change the server)
PLANNED_INHERITED = ("NCCL_", "SGLANG_", "SGL_")
RESOLVED_SERVER = (
    "attention_backend",
    "speculative_draft_attention_backend",
    "page_size",
    "max_running_requests",
    "cuda_graph_max_bs_decode",
    "disable_custom_all_reduce",
    "speculative_adaptive",
    "mem_fraction_static",
    "disable_overlap_schedule",
)


@dataclass
class _Draft:
    """What SGLang will read from the draft's config.json (None when it cannot be read here)."""

    ids: list[int] | None
    trained: tuple[int, str] | None
    note: str = ""


@dataclass
class Planner(BasePlanner):
    """Plans SGLang trials for one server spec
    (:class:`~bisect_eagle.engines.planner.BasePlanner`); holds the oracle and the probed flags
    (both started on first use)."""

    server: SglangServer
    _flags: flagmod.ServerFlags | None = field(default=None, init=False)
    _draft: _Draft | None = field(default=None, init=False)

    engine: ClassVar[str] = ENGINE
    label: ClassVar[str] = "SGLang"

    # -- what the installed server is
    # ---------------------------------------------------------------------

    def _resolve_command(self) -> list[str]:
        try:
            return flagmod.launch_executable(list(self.server.launch_command), self.server.python)
        except BadInput as e:
            self._note = self._note or str(e)
            head = self.server.launch_command[0]
            python = (
                self.server.python
                if self.server.python and Path(head).name.startswith("python")
                else head
            )
            return [python, *self.server.launch_command[1:]]

    def _start_oracle(self) -> Oracle | None:
        spec = parser_spec(list(self.server.launch_command))
        if spec is None:
            return None
        python = interpreter(
            launch_command=list(self.server.launch_command), python=self.server.python, parser=spec
        )
        return Oracle.shared(python=python, parser=spec)

    def oracle(self) -> Oracle | None:
        """The SGLang oracle (:meth:`BasePlanner.oracle`).

        Returns:
            The oracle process, or None.
        """
        return cast("Oracle | None", super().oracle())

    def flags(self) -> flagmod.ServerFlags | None:
        """The server's flags: from its own parser, else its ``--help``; None (with a note) when
        neither runs.

        Returns:
            The flags (probed once, then kept), or None.
        """
        if self._flags is None and self._note is None and self.check:
            desc = self.description()
            if desc is not None:
                self._flags = flagmod.ServerFlags(
                    tuple(self.command), desc.flags, desc.version, "parser"
                )
            else:
                command = self.command
                if self._note is None:
                    try:
                        self._flags = flagmod.probe_help(
                            command, shown=flagmod.shown(self.server.launch_command)
                        )
                    except BadInput as e:
                        self._note = str(e)
        return self._flags

    def version(self) -> str | None:
        """SGLang's version: its own parser's answer, else its ``--help`` probe's; None when
        neither says.

        Returns:
            The version string, or None.
        """
        desc = self.description()
        flags = self.flags()
        return desc.version if desc is not None else (flags.version if flags is not None else None)

    def version_refusal(self) -> str | None:
        """A refusal when the installed SGLang (:meth:`version`) is not a tested release
        (:func:`~.rules.untested_version`); None for a tested or unknown one, and for other
        servers."""
        if parser_spec(list(self.server.launch_command)) != "sglang":
            return None
        return untested_version(
            self.version(),
            (self._oracle.python if self._oracle is not None else None)
            or self.server.python
            or self.command[0],
        )

    def _unchecked(self, why: str) -> str:
        return f"flags from --help only; {why}" if self._flags is not None else why

    # -- the draft and the target
    # ------------------------------------------------------------------------

    def draft_info(self) -> _Draft:
        if self._draft is None:
            path = self.draft / "config.json"
            # a spec for another machine: the server reads the draft at launch
            if not path.is_file():
                self._draft = _Draft(
                    None,
                    None,
                    f"{path} is not on this machine; the server reads the draft's own ids at "
                    "launch",
                )
                return self._draft
            cfg = read_draft_config(self.draft)
            self._draft = _Draft(cfg.nested_ids, cfg.sglang_fc_aux())
        return self._draft

    # -- the plan
    # ----------------------------------------------------------------------------------------

    def plan(self, settings: LiveSettings, *, port: int, draft_dir: Path) -> TrialPlan:
        """The trial's plan (:meth:`BasePlanner.plan`), with its :class:`~.launch.Launch` in
        ``private["launch"]`` and the simulated-acceptance variables in ``private["env"]``.

        Args:
            settings: the trial's requested settings.
            port: the port the plan's argv shows.
            draft_dir: the draft copy the plan's argv shows.

        Returns:
            The plan; a refused one (speculative rules, version, ids, flags, SGLang's own checks)
            carries the reason.
        """
        effective, warnings, refusal = speculative_effective(settings)
        refusal = refusal or self.version_refusal()
        if refusal is not None:
            return make_plan(
                ENGINE,
                settings,
                effective=effective,
                refusal=refusal,
                checked=self.checked_by(False, ""),
            )
        cfg = self.target_config
        ids, id_warnings, refusal = self._ids(settings, cfg)
        warnings += id_warnings
        effective[IDS_KEY] = ids
        try:
            patch = (
                None
                if settings.is_baseline or settings.eagle_aux_hidden_state_layer_ids is None
                else draft_config_patch(list(ids or []))
            )
            args = trial_args(
                settings,
                server=self.server,
                target=self.target,
                draft_dir=None if settings.is_baseline else draft_dir,
                port=port,
            )
            args += self._negated_defaults(settings)
            if settings.speculative_adaptive and not settings.is_baseline:
                args.append(Arg("--speculative-adaptive", (), ADAPTIVE))
            shown = flagmod.shown(self.server.launch_command)
            args, notes = flagmod.adapt_args(args, self.flags(), shown_command=shown)
        except BadInput as e:
            return self.refused(settings, effective, warnings, str(e), "")
        warnings += notes
        refusal = refusal or tree_bound(settings)
        resolved, resolve_note = None, "resolution skipped"
        oracle = self.oracle()
        if refusal is None and oracle is not None and oracle.available:
            draft_here = settings.is_baseline or (self.draft / "config.json").is_file()
            can_resolve = cfg is not None and draft_here
            resolve_note = (
                "resolved"
                if can_resolve
                else (
                    "resolution skipped: "
                    f"{Path(self.server.model_path or self.target)}/config.json or "
                    f"{self.draft}/config.json is not readable here"
                )
            )
            verdict = oracle.judge(_judged_argv(args, self.draft), resolve=can_resolve)
            if verdict is not None and not verdict.ok:
                where = f" ({verdict.where})" if verdict.where else ""
                refusal = f"SGLang refuses this launch: {verdict.error}{where}"
            elif verdict is not None:
                resolved = verdict.resolved
                if resolved is None and verdict.unresolved:
                    # this host's devices, not the config: no refusal
                    resolve_note = verdict.unresolved
                elif resolved is None and can_resolve:
                    resolve_note = "this parser has no settings resolution"
        if refusal is None and resolved is None:
            refusal = adaptive_steps(settings)
        env, env_warnings = sglang_env(settings)
        warnings += env_warnings + resolved_adaptive(settings, effective, resolved)
        effective.update(self._server_fields(settings, resolved))
        simulated, pin_warnings, pin_refusal = simulated_acceptance(settings, effective)
        warnings += pin_warnings
        refusal = refusal or pin_refusal
        effective["env"] = {**env, **simulated}
        plan = self.made(
            settings,
            effective,
            warnings,
            refusal,
            argv=[*self.command, *argv_tokens(args)],
            env={**settings.env, **simulated},
            config_patch=patch,
            checked=self.checked_by(resolved is not None, resolve_note),
        )
        return replace(
            plan,
            private={
                "launch": Launch(fingerprint=plan.fingerprint, args=tuple(args)),
                "env": simulated,
            },
        )

    def _ids(
        self, s: LiveSettings, cfg: dict | None
    ) -> tuple[list[int] | None, list[str], str | None]:
        """(ids SGLang will read, warnings, refusal): the request's, else the draft's own nested
        ids."""
        if s.is_baseline:
            return None, [], None
        draft = self.draft_info()
        warnings = [draft.note] if draft.note else []
        ids = s.eagle_aux_hidden_state_layer_ids
        if ids is None:
            if draft.ids is None and not draft.note:
                warnings.append(
                    f"{self.draft}/config.json has no eagle_config.{IDS_KEY}: SGLang silently "
                    f"captures its default layers; set {IDS_KEY}"
                )
            return draft.ids, warnings, None
        too_wide = (
            None
            if draft.trained is None
            else layers.fc_width_refusal(
                ids,
                width=draft.trained[0],
                said_by=draft.trained[1],
                where=f"{self.draft / 'config.json'}",
            )
        )
        if too_wide is not None:
            return ids, warnings, too_wide
        n = layers.target_depth(cfg) if cfg else None
        if isinstance(n, int):
            conv = capture.sglang_convention(cfg.get("model_type"), layers.target_architecture(cfg))
            try:
                layers.ids_to_canonical(ids, conv, num_layers=n)
            except layers.LayerIdError as e:
                # SGLang takes -1 raw there: its rule decides
                if not (conv == "sglang-deepseek" and -1 in ids):
                    return ids, warnings, f"{IDS_KEY} {ids}: {e} ({conv} rule)"
            # SGLang's own capture rule, for SGLang launches (the stand-in server has its own
            # capture)
            refusal = (
                self._captured(list(ids), cfg, n)
                if parser_spec(list(self.server.launch_command)) == "sglang"
                else None
            )
            if refusal is not None:
                return ids, warnings, refusal
        return ids, warnings, None

    def capture(self, ids: list[int] | None, cfg: dict, n: int) -> capture.SglangCapture:
        """Which hidden states SGLang captures for ``ids`` on this target: SGLang's own hook of the
        target's model class when the oracle runs it, else the project's table (labelled not checked
        against SGLang).

        Args:
            ids: the layer ids; None for SGLang's default.
            cfg: the target's config.json.
            n: the target's layer count.

        Returns:
            The capture: the layers SGLang captures, each id's hidden state, and who said so.
        """
        arch = layers.target_architecture(cfg)
        rule = capture.capture_rule(cfg.get("model_type"), arch)
        predicted = capture.predicted_capture(ids, rule, num_layers=n)
        oracle = self.oracle()
        if arch is None or oracle is None or oracle.parser != "sglang" or not oracle.available:
            return predicted
        answer = oracle.capture(arch, cfg, ids)
        one = (answer or {}).get("answers", {}).get(json.dumps(ids))
        if not one:
            return predicted
        desc = self.description()
        who = (
            f"SGLang {desc.version} {answer['class']}"
            if desc and desc.version
            else f"SGLang {answer['class']}"
        )
        failure = (
            "counted" if answer.get("counted") else ("index" if one.get("error") else rule.failure)
        )
        final = bool(answer.get("final_captured"))
        reach = (
            f"hidden_states[{n}] (the final state) is captured"
            if final
            else f"only hidden_states[0..{n - 1}] (layer inputs) are captured"
        )
        words = (
            f"{answer['class']}.set_eagle3_layers_to_capture maps ids to layers_to_capture "
            f"{one.get('layers_to_capture')}; {reach}"
        )
        return capture.SglangCapture(
            ids,
            one.get("layers_to_capture"),
            list(one.get("captures") or []),
            one.get("error"),
            words,
            who,
            failure,
        )

    def _captured(self, ids: list[int], cfg: dict, n: int) -> str | None:
        """A refusal when SGLang would never capture one of ``ids`` (a launch that can only
        fail)."""
        cap = self.capture(ids, cfg, n)
        if cap.error is not None:
            return (
                f"{IDS_KEY} {ids}: SGLang's capture hook raises {cap.error} at start-up "
                f"({cap.rule}; {cap.checked})"
            )
        if not cap.missed:
            return None
        how = {
            "counted": (
                "start-up fails at the first forward with "
                f"'captured {len(ids) - len(cap.missed)} of {len(ids)} aux hidden states'"
            ),
            "index": "start-up fails with IndexError",
        }.get(
            cap.failure,
            f"the draft gets {len(ids) - len(cap.missed)} aux states where fc takes {len(ids)}: a "
            "shape error in fc",
        )
        return (
            f"{IDS_KEY} {ids}: SGLang never captures the state of id(s) {cap.missed} on this "
            f"{n}-layer target ({cap.rule}), so {how}; checked by {cap.checked}"
        )

    def _negated_defaults(self, s: LiveSettings) -> list[Arg]:
        """``server_args.x: false`` for a flag that defaults on: ``--no-x`` (a plain omission would
        keep it on)."""
        return [
            Arg("--no-" + flag_name(key)[2:], (), f"settings.server_args.{key}")
            for key in negated_keys(s.server_args, self.description())
        ]

    def _server_fields(self, s: LiveSettings, resolved: dict[str, Any] | None) -> dict[str, Any]:
        """device, dtype, concurrency, server_args and ``server``: explicit defaults dropped,
        resolved values in."""
        desc = self.description()
        out: dict[str, Any] = {}
        for key in ("device", "dtype"):
            explicit = getattr(s, key) if key in s.model_fields_set else None
            out[key] = (resolved or {}).get(key) or explicit or "auto"
        out["server_args"] = explicit_server_args(
            s.server_args, desc, resolved=resolved is not None, resolved_dests=RESOLVED_SERVER
        )
        if resolved is not None:
            out["num_steps"] = (
                resolved.get("speculative_num_steps") or 0 if not s.is_baseline else 0
            )
            if not s.is_baseline:
                out["topk"] = resolved.get("speculative_eagle_topk")
                out["num_draft_tokens"] = resolved.get("speculative_num_draft_tokens")
            out.update(
                server_limits(s, resolved, keys=RESOLVED_SERVER, limit="max_running_requests")
            )
        return out


# the port never changes SGLang's verdict: one value keeps the oracle's cache warm
JUDGED_PORT = "30000"


def _judged_argv(args: Sequence[Arg], draft: Path) -> list[str]:
    """The argv SGLang judges: the trial's, with the draft read from its source directory (the
    per-trial copy is made only at launch; resolution reads the draft's config) and one fixed
    port."""
    return argv_tokens(with_values(args, {DRAFT_FLAG: str(draft), PORT_FLAG: JUDGED_PORT}))


def simulated_acceptance(
    s: LiveSettings, effective: dict[str, Any]
) -> tuple[dict[str, str], list[str], str | None]:
    """SGLang's simulated acceptance for a pinned trial (module docstring): (the variables to set,
    warnings, refusal).

    Sets ``effective["pinned_acceptance"]`` to the profile SGLang runs (the minimum-variance one of
    the requested accept length, over the effective ``num_steps``); nothing for a natural trial.
    """
    rates = s.pinned_acceptance
    if rates is None:
        return {}, [], None
    own = [k for k in SIMULATE_ENV if k in s.env]
    if own:
        return (
            {},
            [],
            (
                f"{PINNED} sets {', '.join(SIMULATE_ENV)} itself; drop env.{own[0]} from the trial "
                "(two simulations of one server cannot both hold)"
            ),
        )
    if s.topk != 1:
        return (
            {},
            [],
            (
                f"{PINNED} with topk {s.topk}: SGLang's simulated acceptance with real draft "
                "tokens raises 'SGLANG_SIMULATE_ACC_LEN with real draft tokens currently requires "
                "speculative_eagle_topk=1.' at the first verify step; pin a chain (topk 1)"
            ),
        )
    if s.speculative_adaptive:
        return (
            {},
            [],
            (
                f"{PINNED} with speculative_adaptive: SGLang's adaptive controller picks num_steps "
                "from the acceptance it observes, which the simulation sets; pin a static num_steps"
            ),
        )
    steps = effective.get("num_steps") or s.num_steps
    length = 1 + sum(rates)
    profile = profile_for_accept_length(min(length, steps + 1.0), steps)
    warnings = (
        [
            f"SGLang pins one mean accept length (SGLANG_SIMULATE_ACC_LEN={length:.6g}), not a "
            f"per-position profile: each verify step accepts {int(length - 1)} or "
            f"{int(length - 1) + 1} drafts, i.e. the profile {profile} instead of the requested "
            f"{rates}"
        ]
        if any(abs(a - b) > 1e-9 for a, b in zip(profile, rates, strict=True))
        else []
    )
    warnings.append(
        "acceptance is simulated (SGLang's real-draft-token mode): accepted drafts are emitted as "
        "drafted, so the output is not the target's greedy text; the trial measures cost at a "
        "pinned accept length"
    )
    effective[PINNED] = profile
    return (
        {
            "SGLANG_SIMULATE_ACC_LEN": f"{length:.6g}",
            "SGLANG_SIMULATE_ACC_METHOD": "match-expected",
            "SGLANG_SIMULATE_ACC_TOKEN_MODE": "real-draft-token",
        },
        warnings,
        None,
    )


def sglang_env(
    s: LiveSettings, environ: Mapping[str, str] | None = None
) -> tuple[dict[str, str], list[str]]:
    """The trial's environment as SGLang 0.5.23 will run it, and warnings about what it overrides.

    The server inherits the controller's environment (``environ``, default ``os.environ``) under the
    trial's ``env``: inherited ``NCCL_*`` and ``SGLANG_*`` variables (:data:`PLANNED_INHERITED`,
    secrets left out) the trial does not set are part of the plan, and SGLang's own rules see them
    as it will (``NCCL_NVLS_ENABLE=1`` exported in the shell stays 1). ``NCCL_NVLS_ENABLE`` and
    ``NCCL_CUMEM_ENABLE`` unset become ``0`` (``1`` with ``--enable-nccl-nvls`` /
    ``--enable-symm-mem``); ``CUDA_DEVICE_MAX_CONNECTIONS`` is always 8; ``SGLANG_ENABLE_SPEC_V2``
    is read nowhere.
    """
    inherited = {
        k: v
        for k, v in inherited_env(
            dict(os.environ if environ is None else environ), PLANNED_INHERITED
        ).items()
        if k not in s.env and k not in IGNORED_ENV
    }
    env = {**inherited, **s.env}
    shown = ", ".join(f"{k}={v}" for k, v in redact_env(inherited).items())
    warnings = (
        [f"inherited from the controller's environment (the trial does not set them): {shown}"]
        if inherited
        else []
    )
    on = bool(s.server_args.get("enable_nccl_nvls") or s.server_args.get("enable_symm_mem"))
    if "NCCL_NVLS_ENABLE" not in env or on:
        env["NCCL_NVLS_ENABLE"] = str(int(on))
    symm = bool(s.server_args.get("enable_symm_mem"))
    if "NCCL_CUMEM_ENABLE" not in env or symm:
        env["NCCL_CUMEM_ENABLE"] = str(int(symm))
    for name, value in SET_BY_SGLANG.items():
        if name in env and env[name] != value:
            warnings.append(
                f"env.{name}={env[name]} is overwritten to {value} by SGLang's launcher"
            )
        env[name] = value
    for name in IGNORED_ENV:
        if name in env:
            warnings.append(
                f"env.{name} is read nowhere in SGLang 0.5.23; it does not change the trial"
            )
            del env[name]
    return env, warnings
