"""The vllm engine's plan: the exact launch of one trial, judged by the installed vLLM before
anything starts.

For a request the planner

1. applies vLLM's speculative rules: EAGLE-3 (or EAGLE) with a chain of ``num_steps`` drafts
   (``num_speculative_tokens``), verified as ``num_steps + 1`` tokens; ``topk > 1`` (trees) and
   ``speculative_adaptive`` (an SGLang mode) are refused, ``num_draft_tokens`` is fixed at
   ``num_steps + 1``;
2. resolves the aux layer ids in vLLM's convention (:mod:`.ids`): requested ids (SGLang's convention
   for the target's family) → canonical index = vLLM id, written at the top level of the per-trial
   draft copy; ``null`` → what vLLM reads from the draft itself (top-level ids, else
   ``eagle_config``'s **verbatim**, else its default), with a warning when a draft's nested
   SGLang-convention ids will be read one layer shallower; ids outside ``[0, N]`` (``-1`` above all:
   vLLM starts, then its engine dies at the first request) are refused;
3. builds the argv (:mod:`.launch`) and the trial's environment;
4. asks vLLM itself (:mod:`.oracle`): its parser and entry-point checks, and, when the target's and
   the draft's ``config.json`` are readable here, ``create_engine_config`` under the trial's
   environment, with a throwaway draft copy carrying the trial's ids; vLLM's own aux-layer
   resolution then decides the ids. A refusal quotes vLLM and nothing is launched;
5. writes the effective settings: the resolved values (dtype, device, max model length, scheduler,
   cache and parallel settings, the aux layer ids), the environment (variables vLLM does not know
   dropped, with a warning), server args that differ from vLLM's defaults.

Pinned acceptance (``pinned_acceptance``) becomes vLLM's synthetic rejection sampling:
``"rejection_sample_method": "synthetic"`` with ``"synthetic_acceptance_rates"`` = the profile (one
unconditional rate per position, vLLM's own meaning: ``vllm/config/speculative.py``) in
``--speculative-config``; vLLM pins the whole per-position profile. Its CPU build has no synthetic
mode: the server starts and answers ``/health``, then its engine dies at the first request with
``AssertionError: Synthetic acceptance not supported with CPU sampling``
(``vllm/utils/cpu_triton_utils.py:330``). A pinned plan that vLLM resolves to the CPU platform, or
that asks for ``device: cpu``, is refused before launch quoting it; one not resolved here carries a
warning.

Without vLLM the same plan is built with the project's own reading of vLLM's rules and says
``not checked against vLLM``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar, cast

from bisect_eagle.artifacts.layers import LayerIdError, fc_width_refusal
from bisect_eagle.engines.launch import explicit_server_args, negated_keys
from bisect_eagle.engines.plan import TrialPlan, natural_unmarked
from bisect_eagle.engines.planner import BasePlanner, read_json, server_limits
from bisect_eagle.engines.vllm import ids as idmod
from bisect_eagle.engines.vllm.launch import (
    Arg,
    Launch,
    args_at,
    argv_tokens,
    managed_dest,
    trial_args,
    vllm_env,
)
from bisect_eagle.engines.vllm.oracle import (
    Description,
    Oracle,
    VllmVerdict,
    interpreter,
    resolve_executable,
)
from bisect_eagle.errors import BadInput
from bisect_eagle.keys import IDS_KEY
from bisect_eagle.spec.schema import VllmServer
from bisect_eagle.spec.settings import ADAPTIVE, PINNED, LiveSettings

ENGINE = "vllm"
# the port never changes vLLM's verdict: one value keeps the oracle's cache warm
JUDGED_PORT = "30000"
# where the trial's draft copy stands in a judged argv
DRAFT_PLACEHOLDER = "/bisect-eagle/per-trial-draft-copy"
CPU_SYNTHETIC = (
    "'AssertionError: Synthetic acceptance not supported with CPU sampling' "
    "(vllm/utils/cpu_triton_utils.py:330)"
)
# vLLM's resolved values recorded under effective["server"] (oracle_script._resolved)
RESOLVED_SERVER = (
    "max_model_len",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "distributed_executor_backend",
    "max_num_seqs",
    "max_num_batched_tokens",
    "async_scheduling",
    "block_size",
    "enable_prefix_caching",
    "kv_cache_memory_bytes",
    "gpu_memory_utilization",
    "enforce_eager",
    "seed",
)


@dataclass
class _Ids:
    """The aux layer ids of one trial: what vLLM will capture and how the engine gets it there."""

    # vLLM ids (= hidden_states indices); None: unknown here (vLLM decides at launch)
    vllm: list[int] | None
    top_level: list[int] | None  # written at the top level of the draft copy (requested ids only)
    source: str  # "request" | "top-level" | "eagle_config" | "default" | "unknown"
    warnings: list[str] = field(default_factory=list)
    refusal: str | None = None


@dataclass
class Planner(BasePlanner):
    """Plans vLLM trials for one server spec
    (:class:`~bisect_eagle.engines.planner.BasePlanner`); holds the oracle (started on first
    use)."""

    server: VllmServer

    engine: ClassVar[str] = ENGINE
    label: ClassVar[str] = "vLLM"
    resolution: ClassVar[str] = "engine-args resolution"
    without_check: ClassVar[str] = "planned without vLLM"

    # -- the installed server
    # ----------------------------------------------------------------------------

    def _resolve_command(self) -> list[str]:
        """The launch command with ``engine.vllm.python`` in place of a leading ``python``, resolved
        here when it can be (else as written: a spec for another machine)."""
        cmd = list(self.server.launch_command)
        if self.server.python and Path(cmd[0]).name.startswith("python"):
            cmd[0] = self.server.python
        try:
            cmd[0] = resolve_executable(cmd[0], where="engine.vllm.launch_command")
        except BadInput as e:
            self._note = self._note or str(e)
        return cmd

    def _start_oracle(self) -> Oracle:
        return Oracle.shared(
            python=interpreter(
                launch_command=list(self.server.launch_command), python=self.server.python
            )
        )

    def oracle(self) -> Oracle | None:
        """The vLLM oracle (:meth:`BasePlanner.oracle`).

        Returns:
            The oracle process, or None.
        """
        return cast("Oracle | None", super().oracle())

    # -- the target and the draft
    # -------------------------------------------------------------------------

    @cached_property
    def draft_config(self) -> dict | None:
        return read_json(self.draft / "config.json")

    def _depth(self) -> tuple[int | None, str | None]:
        cfg = self.target_config or {}
        text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
        n = text.get("num_hidden_layers")
        return (n if isinstance(n, int) and not isinstance(n, bool) else None), text.get(
            "model_type"
        )

    # -- the plan
    # ----------------------------------------------------------------------------------------

    def plan(self, settings: LiveSettings, *, port: int, draft_dir: Path) -> TrialPlan:
        """The trial's plan (:meth:`BasePlanner.plan`), with its :class:`~.launch.Launch` in
        ``private["launch"]`` and vLLM's resolution log in ``private["vllm_log"]``.

        To resolve the trial's own draft config, the oracle judges a throwaway copy in a temporary
        directory of its own, removed once it has answered.

        Args:
            settings: the trial's requested settings.
            port: the port the plan's argv shows.
            draft_dir: the draft copy the plan's argv shows.

        Returns:
            The plan; a refused one (speculative rules, ids, flags, vLLM's own checks) carries the
            reason.
        """
        effective, warnings, refusal = _speculative(settings)
        n, model_type = self._depth()
        ids = (
            _Ids(None, None, "baseline")
            if settings.is_baseline
            else self._ids(settings, n, model_type)
        )
        warnings += ids.warnings
        refusal = refusal or ids.refusal
        shown_draft = None if settings.is_baseline else Path(draft_dir)
        desc = self.description()
        env, env_notes = vllm_env(settings, host=self.server.host)  # what the server process gets
        warnings += env_notes
        try:
            args = trial_args(
                settings,
                server=self.server,
                target=self.target,
                draft_dir=shown_draft,
                port=port,
                negated=self._negated(settings, desc),
                dest_of=desc.dest_of() if desc is not None else None,
            )
        except BadInput as e:
            return self.refused(
                settings, effective, warnings, str(e), "refused before vLLM was asked"
            )
        args = synthetic_args(args, settings)
        warnings += _repeated_flags(args, desc)
        verdict, note = None, "refused before vLLM was asked"
        oracle = self.oracle()
        if refusal is None and oracle is not None and oracle.available:
            verdict, note = self._judge(oracle, settings, args, env, ids)
            if verdict is not None and not verdict.ok:
                where = f" ({verdict.where})" if verdict.where else ""
                refusal = f"vLLM refuses this launch: {verdict.error}{where}"
                note = {
                    "parse": "refused by its parser",
                    "validate": "refused by the entry point's argument checks",
                }.get(verdict.stage, note)
        resolved = verdict.resolved if verdict is not None and verdict.ok else None
        judged_all = resolved is not None or (verdict is not None and verdict.stage == "config")
        if resolved is not None and not settings.is_baseline:
            refusal, more = _resolved_ids(ids, resolved, n)
            warnings += more
        cpu_refusal, cpu_warnings = cpu_synthetic(settings, resolved)
        refusal = refusal or cpu_refusal
        warnings += cpu_warnings
        effective_env, env_warnings = _known_env(env, resolved, self.version())
        warnings += env_warnings
        effective.update(self._server_fields(settings, resolved, desc))
        if not settings.is_baseline:
            used = ids.vllm is not None and ids.source != "unused"
            effective[IDS_KEY] = (
                idmod.from_vllm(ids.vllm, model_type=model_type, num_layers=n)
                if used
                else None
                if ids.source == "unused"
                else settings.eagle_aux_hidden_state_layer_ids
            )
            effective["vllm_aux_layer_ids"] = ids.vllm if used else None
        effective["env"] = effective_env
        argv = [*self.command, *argv_tokens(args)]
        plan = self.made(
            settings,
            effective,
            warnings,
            refusal,
            argv=argv,
            env=env,
            checked=self.checked_by(judged_all, note),
            config_patch=None if ids.top_level is None else {IDS_KEY: list(ids.top_level)},
        )
        launch = Launch(
            plan.fingerprint,
            tuple(args),
            dict(env),
            None if ids.top_level is None else list(ids.top_level),
        )
        return replace(
            plan,
            private={
                "launch": launch,
                "vllm_log": list(verdict.log) if verdict is not None else [],
            },
        )

    def _ids(self, s: LiveSettings, n: int | None, model_type: str | None) -> _Ids:
        """The aux layer ids vLLM will capture, by the project's reading of vLLM's rules
        (:mod:`.ids`)."""
        draft = idmod.draft_ids(self.draft_config) if self.draft_config is not None else None
        requested = s.eagle_aux_hidden_state_layer_ids
        if s.speculative_algorithm != "EAGLE3":
            notes = (
                [f"{IDS_KEY} are not used by speculative_algorithm {s.speculative_algorithm}"]
                if requested is not None
                else []
            )
            return _Ids(None, None, "unused", notes)
        if requested is not None:
            try:
                vllm_ids = idmod.to_vllm(requested, model_type=model_type, num_layers=n)
            except LayerIdError as e:
                return _Ids(None, None, "request", refusal=f"{IDS_KEY} {requested}: {e}")
            notes = (
                []
                if n is not None
                else [
                    f"{self.target}/config.json is not readable here: the requested ids are "
                    "converted with SGLang's default +1 rule, unchecked against the depth"
                ]
            )
            too_wide = (
                None
                if draft is None
                else fc_width_refusal(
                    requested,
                    width=draft.fc_width,
                    where=f"{self.draft}/config.json",
                    said_by=f"{draft.fc_source}; {idmod.FC_WIDTH}",
                )
            )
            if too_wide is not None:
                return _Ids(vllm_ids, vllm_ids, "request", notes, refusal=too_wide)
            return _Ids(
                vllm_ids,
                vllm_ids,
                "request",
                notes,
                refusal=idmod.refusal(
                    vllm_ids, num_layers=n, source=f"from the request {requested}"
                ),
            )
        if draft is None:
            return _Ids(
                None,
                None,
                "unknown",
                [
                    f"{self.draft}/config.json is not readable here; vLLM reads the draft's own "
                    "ids at launch"
                ],
            )
        found, source = draft.read
        notes = []
        if source == "eagle_config":
            notes.append(
                f"{self.draft}/config.json has no top-level {IDS_KEY}: vLLM reads eagle_config's "
                f"{found} verbatim as vLLM ids (hidden_states {found}), where SGLang reads the "
                f"same ids as hidden_states {[i + 1 for i in found]}; for a draft trained in "
                f"SGLang's convention set {IDS_KEY} ({idmod.READS})"
            )
        if found is None:
            found = idmod.default_ids(n) if n is not None else None
            notes.append(
                f"{self.draft}/config.json declares no aux layer ids: vLLM captures its default "
                f"layers {found if found is not None else '(2, N//2, N-3)'}; set {IDS_KEY}"
            )
        refusal = (
            None
            if found is None
            else idmod.refusal(found, num_layers=n, source=f"the draft's {source} ids")
        )
        if found is not None and draft is not None and refusal is None:
            refusal = fc_width_refusal(
                found,
                width=draft.fc_width,
                where=f"{self.draft}/config.json",
                said_by=f"{draft.fc_source}; {idmod.FC_WIDTH}",
                named=f"the ids vLLM would capture ({source})",
            )
        return _Ids(found, None, source, notes, refusal)

    def _judge(
        self, oracle: Oracle, s: LiveSettings, args: list[Arg], env: dict[str, str], ids: _Ids
    ) -> tuple[VllmVerdict | None, str]:
        """vLLM's verdict on the trial (resolution only when the target and the draft are readable
        here)."""
        target_here = self.target_config is not None
        draft_here = s.is_baseline or self.draft_config is not None
        resolve = target_here and draft_here
        note = (
            "resolved"
            if resolve
            else (
                f"resolution skipped: {Path(self.server.model_path or self.target)}/config.json or "
                f"{self.draft}/config.json is not readable here"
            )
        )
        draft = (
            None
            if s.is_baseline
            else {
                "source": str(self.draft.resolve()),
                "top_level_ids": ids.top_level,
                "placeholder": DRAFT_PLACEHOLDER,
            }
        )
        verdict = oracle.judge(
            _judged_argv(args), env=env, draft=draft if resolve else None, resolve=resolve
        )
        return verdict, note

    def _negated(self, s: LiveSettings, desc: Description | None) -> list[str]:
        """``server_args.x: false`` for a ``--x/--no-x`` flag that defaults on (a plain omission
        would keep it on)."""
        return negated_keys(s.server_args, desc)

    def _server_fields(
        self, s: LiveSettings, resolved: dict[str, Any] | None, desc: Description | None
    ) -> dict[str, Any]:
        """dtype, device, concurrency, server_args and ``server``: explicit defaults dropped,
        resolved values in."""
        out: dict[str, Any] = {}
        explicit_dtype = s.dtype if "dtype" in s.model_fields_set else None
        out["dtype"] = (resolved or {}).get("dtype") or explicit_dtype or "auto"
        out["device"] = (resolved or {}).get("device_type") or "auto"
        out["server_args"] = explicit_server_args(
            s.server_args, desc, resolved=resolved is not None, resolved_dests=RESOLVED_SERVER
        )
        if resolved is not None:
            spec = resolved.get("speculative")
            if isinstance(spec, dict) and not s.is_baseline:
                out["num_steps"] = spec.get("num_speculative_tokens", s.num_steps)
                out["num_draft_tokens"] = out["num_steps"] + 1
                out["speculative_method"] = spec.get("method")
            out.update(server_limits(s, resolved, keys=RESOLVED_SERVER, limit="max_num_seqs"))
        return out


def synthetic_args(args: list[Arg], s: LiveSettings) -> list[Arg]:
    """``args`` with a pinned trial's profile in ``--speculative-config`` (vLLM's synthetic
    rejection sampling); unchanged for a natural trial."""
    if s.pinned_acceptance is None:
        return args
    out = []
    for arg in args:
        if managed_dest(arg.flag) == "speculative_config":
            spec = {
                **json.loads(arg.values[0]),
                "rejection_sample_method": "synthetic",
                "synthetic_acceptance_rates": [float(r) for r in s.pinned_acceptance],
            }
            arg = Arg(arg.flag, (json.dumps(spec, sort_keys=True),), f"{arg.origin}, {PINNED}")
        out.append(arg)
    return out


def cpu_synthetic(s: LiveSettings, resolved: dict[str, Any] | None) -> tuple[str | None, list[str]]:
    """(refusal, warnings) of a pinned trial on vLLM's CPU build, which has no synthetic sampling
    (module docstring).

    Refused when vLLM resolved the CPU platform (``resolved["device_type"]``) or the trial asks for
    ``device: cpu``; a warning when the platform is not known here.
    """
    if s.pinned_acceptance is None:
        return None, []
    platform = (resolved or {}).get("device_type")
    cpu = (
        platform == "cpu"
        if platform is not None
        else ("device" in s.model_fields_set and s.device == "cpu")
    )
    if cpu:
        return (
            f"{PINNED} on vLLM's CPU build: its sampler has no synthetic mode, so the server would "
            f"start and its engine die at the first request with {CPU_SYNTHETIC}; pin acceptance "
            "on a GPU build of vLLM or on the local engine"
        ), []
    if platform is None:
        return None, [
            "vLLM's platform is not resolved here: on its CPU build this pinned trial's engine "
            f"dies at the first request with {CPU_SYNTHETIC}"
        ]
    return None, []


def _speculative(s: LiveSettings) -> tuple[dict[str, Any], list[str], str | None]:
    """vLLM's speculative rules applied: (effective fields in clear, warnings, refusal or None)."""
    effective = natural_unmarked(s.model_dump(mode="json"))
    effective.pop(ADAPTIVE, None)
    if s.is_baseline:
        effective.update(
            num_steps=0, topk=0, num_draft_tokens=0, eagle_aux_hidden_state_layer_ids=None
        )
        if "device" in s.model_fields_set:
            return (
                effective,
                ["device is not a vLLM argument: vLLM picks its platform itself"],
                None,
            )
        return effective, [], None
    warnings: list[str] = []
    refusal = None
    if s.num_steps < 1:
        refusal = (
            "num_steps must be >= 1 for speculative decoding (vLLM's num_speculative_tokens), got "
            f"{s.num_steps}"
        )
    elif s.topk != 1:
        refusal = (
            f"topk {s.topk}: vLLM's EAGLE proposes one chain of num_steps drafts (topk 1); draft "
            "trees need vLLM's speculative_token_tree, which this engine does not set"
        )
    elif s.speculative_adaptive:
        refusal = (
            "speculative_adaptive is SGLang's --speculative-adaptive; vLLM 0.32 has no adaptive "
            "speculation"
        )
    if s.num_draft_tokens is not None and s.num_draft_tokens != s.num_steps + 1 and refusal is None:
        warnings.append(
            f"vLLM verifies num_steps + 1 = {s.num_steps + 1} tokens per step "
            f"(num_speculative_tokens {s.num_steps}); num_draft_tokens {s.num_draft_tokens} is not "
            "a vLLM setting and is ignored"
        )
    if "device" in s.model_fields_set:
        warnings.append("device is not a vLLM argument: vLLM picks its platform itself")
    effective.update(
        topk=1 if refusal is None else s.topk,
        num_draft_tokens=s.num_steps + 1 if refusal is None else s.num_draft_tokens,
    )
    return effective, warnings, refusal


def _resolved_ids(
    ids: _Ids, resolved: dict[str, Any], n: int | None
) -> tuple[str | None, list[str]]:
    """vLLM's own aux-layer resolution over the project's reading: (refusal or None, warnings)."""
    spec = resolved.get("speculative") if isinstance(resolved.get("speculative"), dict) else {}
    got, source = spec.get("aux_layer_ids"), spec.get("aux_layer_source", "")
    if not isinstance(got, list) or spec.get("method") != "eagle3":
        return None, []
    notes = []
    if ids.vllm is not None and got != ids.vllm:
        notes.append(
            f"vLLM's own resolution captures aux layers {got} ({source}), not {ids.vllm} as read "
            "here"
        )
    ids.vllm = got
    return idmod.refusal(
        got, num_layers=n, source=f"{source}, resolved by vLLM ({spec.get('aux_layer_how')})"
    ), notes


def _known_env(
    env: dict[str, str], resolved: dict[str, Any] | None, version: str | None
) -> tuple[dict[str, str], list[str]]:
    """The effective environment: ``VLLM_*`` variables vLLM does not know are dropped, with a
    warning."""
    unknown = ((resolved or {}).get("env") or {}).get("unknown") or []
    dropped = [k for k in unknown if k.startswith("VLLM_") and k in env]
    warnings = [
        f"env.{k} is not a variable vLLM {version or ''} knows (vllm/envs.py "
        "environment_variables; vLLM logs 'Unknown vLLM environment variable detected'); it does "
        "not change the trial"
        for k in dropped
    ]
    return {k: v for k, v in env.items() if k not in dropped}, warnings


def _repeated_flags(args: list[Arg], desc: Description | None) -> list[str]:
    """A warning per parser dest given more than once: vLLM's parser keeps the last one,
    silently."""
    by_dest: dict[str, list[Arg]] = {}
    for arg in args:
        flag = arg.flag.split("=", 1)[0]
        opt = desc.by_flag.get(flag) if desc is not None else None
        dest = opt.dest if opt is not None else flag.removeprefix("--no-").removeprefix("--")
        by_dest.setdefault(dest, []).append(arg)
    out = []
    for given in by_dest.values():
        if len(given) > 1:
            last = given[-1]
            shown = " ".join([last.flag, *last.values])
            out.append(
                f"{', '.join(f'{a.flag} ({a.origin})' for a in given)}: the same vLLM argument is "
                f"given {len(given)} times and vLLM's parser keeps the last one, {shown}"
            )
    return out


def _judged_argv(args: list[Arg]) -> list[str]:
    """The argv vLLM judges: the trial's, with one fixed port and the draft copy at
    :data:`DRAFT_PLACEHOLDER`."""
    return argv_tokens(args_at(args, port=JUDGED_PORT, draft_dir=DRAFT_PLACEHOLDER))
