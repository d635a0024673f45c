"""The ``local`` engine's plan and measurement: one trial = warm-up, then measured requests decoded
greedily.

Plan (cheap: reads the target's and the draft's ``config.json``, loads no weights): SGLang's
speculative rules applied; the layer ids resolved to SGLang ids in capture (ascending) order, the
draft's own ids when none are given; fields the local engine ignores (``concurrency``, ``env``,
``server_args``) left out of the effective settings, so trials differing only in them are one trial.
Refused: SGLang's adaptive speculation (``speculative_adaptive``: this engine drafts a fixed
``num_steps``), tree drafting (``topk > 1``), sampling (``temperature != 0``), ids out of range,
repeated or of the wrong count for the draft's ``fc``, a device this machine does not have.

Pinned acceptance (``pinned_acceptance``): each measured request first gets its greedy continuation,
decoded naturally before the clock starts (once per prompt, device, dtype and length, kept for later
trials); the measured decode then verifies that continuation and draws how many drafts count as
accepted from the profile, seeded by the prompt (:class:`~bisect_eagle.engines.local.decoder.Pin`).
The output is the natural trial's token for token, every draft and verify forward runs as in a
natural round, and the accept length is the profile's.

Paired (:meth:`LocalEngine.run_paired`): the baseline and the speculative config decode the same
prompts one after the other, in alternating order (baseline first on even prompts), so a change of
the machine's load hits both sides of a prompt alike; the speedup is the geometric mean of the
per-prompt tok/s ratios.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from bisect_eagle.artifacts import layers
from bisect_eagle.artifacts.devices import check_device
from bisect_eagle.artifacts.draft import LoadedDraft, load_draft, read_draft_config
from bisect_eagle.artifacts.prompts import Prompt, load_prompts
from bisect_eagle.artifacts.target import load_target, read_target_config
from bisect_eagle.engines.base import Engine, PairedResult, RequestRecord, TrialResult, failed
from bisect_eagle.engines.local.decoder import Generation, Pin, SpeculativeDecoder, accept_rates
from bisect_eagle.engines.plan import TrialPlan, make_plan
from bisect_eagle.engines.sglang.rules import speculative_effective
from bisect_eagle.errors import BadInput
from bisect_eagle.keys import IDS_KEY
from bisect_eagle.perf.benchmark import Benchmark
from bisect_eagle.spec.schema import Spec
from bisect_eagle.spec.settings import LiveSettings, torch_dtype_name
from bisect_eagle.stats import paired_speedup

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
IGNORED = ("concurrency", "env", "server_args")  # settings only server engines use


class LocalEngine(Engine):
    """Live trials in this process; the target and the draft are loaded once per (device, dtype) and
    reused.

    A trial runs on ``settings.device`` in ``settings.dtype``. Requests run one at a time and decode
    greedily. Nothing is loaded until the first :meth:`run`.
    """

    name = "local"
    # whole requests, last drafts cut to fit
    benchmark = Benchmark(finite_horizon=True, truncate_drafts=True)
    reads_t2d = True
    # greedy only (temperature 0 is the one it accepts), on one process
    deterministic_metrics = ("accept_length",)

    def __init__(self, target: Path, draft: Path, prompts: Path):
        self.target_path, self.draft_path, self.prompts_path = (
            Path(target),
            Path(draft),
            Path(prompts),
        )
        self._models: dict[tuple[str, str], tuple[Any, LoadedDraft]] = {}
        self._prompts: list[Prompt] | None = None
        self.eos_token_id: int | None = None
        # greedy continuations for pinned trials: (device, dtype, prompt id, max_new_tokens) ->
        # tokens
        self._continuations: dict[tuple[str, str, str, int], list[int]] = {}

    @classmethod
    def from_spec(cls, spec: Spec, log_dir: Path | None = None) -> LocalEngine:
        """The engine of an ``engine.kind: local`` spec: its target, draft and prompts (nothing is
        loaded; it writes no logs, so ``log_dir`` is unused).

        Args:
            spec: the study spec.
            log_dir: unused.

        Returns:
            The engine, nothing loaded yet.
        """
        p = spec.paths()
        return cls(p["target"], p["draft"], p["prompts"])

    @classmethod
    def export(
        cls,
        spec: Spec,
        settings: LiveSettings,
        *,
        effective: Mapping[str, Any],
        port: int,
        python: str | None = None,
    ) -> dict[str, Any]:
        """A local trial served by SGLang (:meth:`Engine.export`): the sglang engine's export of the
        trial, in the dtype the local trial ran in unless it was requested explicitly (SGLang would
        pick its own).

        Args:
            spec: the study spec.
            settings: the trial's settings.
            effective: the trial's effective settings (their ``dtype`` when none was requested).
            port: the port the exported server listens on.
            python: the interpreter that runs SGLang; None lets the sglang engine choose.

        Returns:
            The sglang engine's export of the trial.
        """
        from bisect_eagle.engines.sglang import SglangEngine

        if "dtype" not in settings.model_fields_set:
            settings = settings.model_validate(
                {**settings.model_dump(exclude_unset=True), "dtype": effective["dtype"]}
            )
        return SglangEngine.export(spec, settings, effective=effective, port=port, python=python)

    # -- plan
    # -------------------------------------------------------------------------------------------

    @cached_property
    def num_layers(self) -> int:
        """The target's decoder layer count (from its config.json)."""
        cfg = read_target_config(self.target_path)
        n = cfg.get("num_hidden_layers")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise BadInput(
                f"{self.target_path}/config.json: key 'num_hidden_layers': expected a positive "
                f"integer, found {n!r}"
            )
        return n

    @cached_property
    def draft_ids(self) -> list[int]:
        """The draft's own aux layers as SGLang ids, ascending (what it was trained on)."""
        ids, convention = read_draft_config(self.draft_path).declared_ids(layers.LOCAL_READER)
        if ids is None:
            raise BadInput(
                f"{self.draft_path}/config.json declares no aux layer ids; set {IDS_KEY}"
            )
        canonical = layers.ids_to_canonical(ids, convention, num_layers=self.num_layers)
        return sorted(layers.canonical_to_ids(canonical, "sglang", num_layers=self.num_layers))

    def plan(self, settings: LiveSettings) -> TrialPlan:
        """The trial as this engine runs it (module docstring); never loads a model.

        Args:
            settings: the trial's settings.

        Returns:
            The plan: effective settings (torch's dtype, the layer ids), warnings, refusal.
        """
        effective, warnings, refusal = speculative_effective(settings)
        for key in IGNORED:
            effective.pop(key, None)
        # SGLang's aliases (half, float, auto) run as these
        effective["dtype"] = torch_dtype_name(settings.dtype)
        warnings += _local_notes(settings)
        refusal = _no_adaptive(settings) or refusal or _unsupported(settings)
        if refusal is None and not settings.is_baseline:
            ids, refusal = self._resolve_ids(settings)
            effective[IDS_KEY] = ids
        return make_plan(
            self.name, settings, effective=effective, warnings=warnings, refusal=refusal
        )

    def _resolve_ids(self, s: LiveSettings) -> tuple[list[int], str | None]:
        """(SGLang ids in capture order, refusal or None)."""
        if s.speculative_algorithm == "EAGLE":
            return [], None  # the final state feeds the draft; fc is skipped
        requested = s.eagle_aux_hidden_state_layer_ids
        if requested is None:
            return self.draft_ids, None
        ids = sorted(requested)  # LiveSettings already refused repeated ids
        try:
            layers.ids_to_canonical(ids, "sglang", num_layers=self.num_layers)
        except layers.LayerIdError as e:
            return ids, f"{IDS_KEY} {requested}: {e}"
        return ids, layers.fc_width_refusal(
            requested,
            width=len(self.draft_ids),
            where=f"{self.draft_path}/config.json",
            said_by="the aux layer ids it declares",
        )

    # -- run
    # --------------------------------------------------------------------------------------------

    def _load(self, device: str, dtype: str) -> tuple[Any, LoadedDraft]:
        """Target and draft for (device, dtype), loaded once; the tokenizer and prompts on the first
        call."""
        if (device, dtype) not in self._models:
            self._progress(f"loading the target and the draft ({device}, {dtype})")
            model, tokenizer = load_target(self.target_path, device=device, dtype=DTYPES[dtype])
            draft = load_draft(self.draft_path, target=self.target_path, device=device)
            draft.model.to(DTYPES[dtype])
            self._models[(device, dtype)] = (model, draft)
            if self._prompts is None:
                self._prompts = load_prompts(self.prompts_path, tokenizer)
                self.eos_token_id = tokenizer.eos_token_id
        return self._models[(device, dtype)]

    def close(self) -> None:
        self._models.clear()

    def _decoder(self, plan: TrialPlan) -> tuple[SpeculativeDecoder, dict[str, Any]]:
        """The decoder of a (checked) plan and its effective settings with the capture indices."""
        if plan.refusal is not None:
            raise BadInput(plan.refusal)
        s, effective = plan.settings, dict(plan.effective)
        model, draft = self._load(s.device, torch_dtype_name(s.dtype))
        baseline = s.is_baseline
        algorithm = "EAGLE3" if baseline else s.speculative_algorithm
        ids = None if baseline or algorithm == "EAGLE" else effective[IDS_KEY]
        decoder = SpeculativeDecoder(
            model, None if baseline else draft, ids, effective["num_steps"], s.device, algorithm
        )
        effective["aux_hidden_state_indices"] = None if baseline else decoder.indices
        return decoder, effective

    def _pins(
        self, plan: TrialPlan, decoder: SpeculativeDecoder, prompts: list[Prompt]
    ) -> dict[str, Pin]:
        """Per measured prompt id, the :class:`Pin` of a pinned plan (its continuation decoded now,
        unmeasured, or taken from an earlier trial); empty for a natural plan."""
        s = plan.settings
        if s.pinned_acceptance is None:
            return {}
        pins = {}
        for p in prompts:
            key = (s.device, torch_dtype_name(s.dtype), p.id, s.max_new_tokens)
            if key not in self._continuations:
                self._progress(
                    f"decoding the greedy continuation of prompt {p.id} (pinned acceptance)"
                )
                self._continuations[key] = decoder.generate(
                    p.input_ids, max_new_tokens=s.max_new_tokens, eos_token_id=self.eos_token_id
                ).tokens
            pins[p.id] = Pin.seeded(s.pinned_acceptance, p.input_ids, self._continuations[key])
        return pins

    def _one(
        self, decoder: SpeculativeDecoder, p: Prompt, max_new_tokens: int, pin: Pin | None = None
    ) -> tuple[RequestRecord, Generation]:
        t0 = time.perf_counter()
        g = decoder.generate(
            p.input_ids, max_new_tokens=max_new_tokens, eos_token_id=self.eos_token_id, pin=pin
        )
        record = RequestRecord(
            id=p.id,
            prompt_tokens=len(p.input_ids),
            completion_tokens=len(g.tokens),
            verify_steps=g.verify_steps,
            latency_s=time.perf_counter() - t0,
        )
        return record, g

    def _failure(self, plan: TrialPlan, effective: dict[str, Any], e: RuntimeError) -> TrialResult:
        if isinstance(e, torch.cuda.OutOfMemoryError):
            return failed(
                self.name,
                requested=plan.requested,
                effective=effective,
                cls="out_of_memory",
                detail=str(e),
                warnings=list(plan.warnings),
            )
        return failed(
            self.name,
            requested=plan.requested,
            effective=effective,
            cls="crash_during_benchmark",
            detail=f"{type(e).__name__}: {e}",
            warnings=list(plan.warnings),
        )

    def run(self, plan: TrialPlan) -> TrialResult:
        """One live trial: warm-up requests, then the measured ones, each decoded to completion.

        Args:
            plan: a plan from :meth:`plan`.

        Returns:
            The measured result; on a RuntimeError a failed one (``out_of_memory`` or
            ``crash_during_benchmark``).

        Raises:
            BadInput: ``plan`` is refused.
        """
        decoder, effective = self._decoder(plan)
        s = plan.settings
        warm, measured = self._split_prompts(s)
        try:
            for i, p in enumerate(warm):
                self._progress(f"warm-up request {i + 1}/{len(warm)}")
                decoder.generate(
                    p.input_ids, max_new_tokens=s.max_new_tokens, eos_token_id=self.eos_token_id
                )
            pins = self._pins(plan, decoder, measured)
            start = time.perf_counter()
            done = []
            for i, p in enumerate(measured):
                self._progress(f"measuring request {i + 1}/{len(measured)}")
                done.append(self._one(decoder, p, s.max_new_tokens, pins.get(p.id)))
            wall = time.perf_counter() - start
        except RuntimeError as e:  # torch.cuda.OutOfMemoryError is one
            return self._failure(plan, effective, e)
        return self._result(plan, effective, decoder, done, wall)

    def run_paired(
        self, plan: TrialPlan, baseline: TrialPlan, *, confidence: float = 0.95
    ) -> PairedResult | None:
        """``plan`` and ``baseline`` on the same prompts, interleaved per prompt (module docstring).

        None when either fails (run them alone to see why). The prompts and their counts are
        ``plan``'s.

        Args:
            plan: the trial's plan.
            baseline: the baseline's plan.
            confidence: the level of the speedup's interval, in (0, 1).

        Returns:
            Both results, the per-prompt speed ratios and the speedup's interval; None when
            either fails.

        Raises:
            BadInput: either plan is refused.
        """
        spec_dec, spec_eff = self._decoder(plan)
        base_dec, base_eff = self._decoder(baseline)
        s = plan.settings
        warm, measured = self._split_prompts(s)
        sides: dict[str, list[tuple[RequestRecord, Generation]]] = {"spec": [], "base": []}
        try:
            for i, p in enumerate(warm):
                self._progress(f"warm-up request {i + 1}/{len(warm)} (trial and baseline)")
                spec_dec.generate(
                    p.input_ids, max_new_tokens=s.max_new_tokens, eos_token_id=self.eos_token_id
                )
                base_dec.generate(
                    p.input_ids, max_new_tokens=s.max_new_tokens, eos_token_id=self.eos_token_id
                )
            pins = self._pins(plan, spec_dec, measured)
            for i, p in enumerate(measured):
                self._progress(
                    f"measuring request {i + 1}/{len(measured)} (trial and baseline, interleaved)"
                )
                order = (
                    (("base", base_dec), ("spec", spec_dec))
                    if i % 2 == 0
                    else (("spec", spec_dec), ("base", base_dec))
                )
                for side, decoder in order:
                    sides[side].append(
                        self._one(
                            decoder, p, s.max_new_tokens, pins.get(p.id) if side == "spec" else None
                        )
                    )
        except RuntimeError:
            return None
        ratios = [
            (a.completion_tokens / a.latency_s) / (b.completion_tokens / b.latency_s)
            for (a, _), (b, _) in zip(sides["spec"], sides["base"], strict=True)
        ]
        speedup, lower, upper = paired_speedup(ratios, confidence=confidence)
        cand = self._result(
            plan, spec_eff, spec_dec, sides["spec"], sum(r.latency_s for r, _ in sides["spec"])
        )
        base = self._result(
            baseline, base_eff, base_dec, sides["base"], sum(r.latency_s for r, _ in sides["base"])
        )
        return PairedResult(
            candidate=cand,
            baseline=base,
            ratios=ratios,
            speedup=speedup,
            lower=lower,
            upper=upper,
            confidence=confidence,
        )

    def _result(
        self,
        plan: TrialPlan,
        effective: dict[str, Any],
        decoder: SpeculativeDecoder,
        done: list[tuple[RequestRecord, Generation]],
        wall: float,
    ) -> TrialResult:
        """The trial's metrics from its measured requests."""
        records, gens = [r for r, _ in done], [g for _, g in done]
        requested, warnings = plan.requested, list(plan.warnings)
        tokens = sum(r.completion_tokens for r in records)
        verify = sum(r.verify_steps for r in records)
        return TrialResult(
            engine=self.name,
            status="ok",
            requested=requested,
            effective=effective,
            output_tok_s=tokens / wall,
            accept_length=tokens / verify if verify else float("nan"),
            accept_length_hist=dict(
                sorted(Counter(a for g in gens for a in g.accepted_per_step).items())
            ),
            accept_rate_per_position=accept_rates(gens, decoder.num_steps),
            requests=records,
            wall_s=wall,
            model_s=sum(g.model_s for g in gens),
            warnings=warnings,
        )

    def _split_prompts(self, s: LiveSettings) -> tuple[list[Prompt], list[Prompt]]:
        """(warm-up, measured) prompts: distinct, so no request reuses another's cache."""
        prompts = self._prompts or []
        need = s.warmup_prompts + s.num_prompts
        if need > len(prompts):
            raise BadInput(
                f"{self.prompts_path}: warmup_prompts + num_prompts = {need}, but the file has "
                f"only {len(prompts)} prompts"
            )
        return prompts[: s.warmup_prompts], prompts[s.warmup_prompts : need]


def _no_adaptive(s: LiveSettings) -> str | None:
    """The local engine has no adaptive mode; a speculative request for it is refused (the baseline
    has none)."""
    if s.speculative_adaptive and not s.is_baseline:
        return (
            "speculative_adaptive: the local engine has no adaptive mode (SGLang's "
            "--speculative-adaptive picks num_steps at run time); it drafts a fixed num_steps, set "
            "speculative_adaptive false"
        )
    return None


def _unsupported(s: LiveSettings) -> str | None:
    """Why the local engine cannot honour ``s`` (never silently changed), or None."""
    if not s.is_baseline and s.topk > 1:
        return (
            f"topk = {s.topk} (tree drafting) is not supported by the local engine; it drafts a "
            "chain, set topk = 1"
        )
    if s.temperature != 0.0:
        return (
            f"temperature = {s.temperature}: the local engine decodes greedily; set temperature = 0"
        )
    try:
        check_device(s.device, "device")
    except BadInput as e:
        return str(e)
    return None


def _local_notes(s: LiveSettings) -> list[str]:
    """Warnings about settings the local engine runs differently from what was requested."""
    notes = []
    if s.concurrency != 1:
        notes.append(
            f"concurrency {s.concurrency} requested; the local engine runs requests one at a time "
            "(1)"
        )
    if s.env or s.server_args:
        notes.append("env and server_args apply to server engines; the local engine ignores them")
    if s.speculative_algorithm == "EAGLE":
        notes.append(
            "speculative_algorithm EAGLE with an EAGLE-3 draft: the draft gets the target's final "
            "hidden state and fc is skipped, as SGLang does silently; expect accept length ~1.0 "
            "(use EAGLE3)"
        )
        if s.eagle_aux_hidden_state_layer_ids is not None:
            notes.append(f"{IDS_KEY} are not used by speculative_algorithm EAGLE")
    return notes
