"""One standalone trial: a candidate wiring scored by the draft's accuracy on the hidden states it
was trained on.

A rule is evaluated over the dump's own tensors. Layer ids (SGLang convention) that the dump holds
become a rule over it; ids it does not hold are recomputed by the target for the dump's own
``input_ids`` (hooks at the canonical indices, see :mod:`bisect_eagle.artifacts.target`) and scored
by the same batching as :func:`bisect_eagle.trials.accuracy.evaluate`. Every candidate maps to the
SGLang layer ids stage 2 searches: the dump's states are ``dump_layer_ids`` plus the final state (id
``N - 1``), and ``emb`` is id ``-1``. Each scored candidate is one MLflow child run
(:func:`run_standalone_trial`); the gate over all of them is :mod:`bisect_eagle.search.gate`.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from bisect_eagle.artifacts import layers
from bisect_eagle.artifacts.dumps import DumpReader, Sample
from bisect_eagle.artifacts.wiring import EMB, parse_rule
from bisect_eagle.engines.plan import canonical_hash
from bisect_eagle.errors import BadInput
from bisect_eagle.spec.schema import Spec
from bisect_eagle.trials.accuracy import StandaloneResult, evaluate
from bisect_eagle.trials.context import TrialContext
from bisect_eagle.trials.record import deployment_tags


def standalone_fingerprint(spec: Spec, layer_ids: list[int], *, rule: str, source: str) -> str:
    """Identity of a standalone trial: the wiring, the states it is scored on and how it is
    scored."""
    st = spec.standalone
    return canonical_hash(
        {
            "stage": "standalone",
            "layer_ids": layer_ids,
            "rule": rule,
            "source": source,
            "samples": st.samples,
            "steps": st.steps,
            "metric": st.metric,
        }
    )


def run_standalone_trial(ctx: TrialContext, scorer, *, candidate) -> Any:
    """A candidate wiring's stage-1 verdict: reused from this study's store, or scored and logged as
    a child run.

    Args:
        ctx: the study's trial context (its spec, store and parent run).
        scorer: the :class:`Scorer` of ``ctx.spec`` (anything with ``score(candidate)`` giving a
            :class:`Verdict`).
        candidate: the :class:`Candidate` to score.

    Returns:
        The :class:`Verdict`, its ``run_id`` the child run that scored it (the earlier one when
        reused); ``passed`` and ``threshold`` are left for the gate.

    Raises:
        BadInput: the scorer refuses the candidate (one line naming the spec and the wiring).
    """
    fp = standalone_fingerprint(
        ctx.spec, candidate.layer_ids, rule=candidate.rule, source=candidate.source
    )
    found = ctx.tracking.find_fingerprint(
        fp, stages=("standalone",), parent_run_id=ctx.parent_run_id
    )
    if found is not None:
        verdict = Verdict(**json.loads(found.data.tags["verdict"]))
        verdict.run_id = found.info.run_id
        return verdict
    st = ctx.spec.standalone
    run_id = ctx.tracking.start_run(
        f"standalone {candidate.label}",
        tags={
            "stage": "standalone",
            "fingerprint": fp,
            "study": ctx.study,
            "owner": ctx.owner,
            "wiring": candidate.label,
            **deployment_tags(ctx.spec),
        },
        params={
            "rule": candidate.rule,
            "layer_ids": json.dumps(candidate.layer_ids),
            "source": candidate.source,
            "samples": str(st.samples),
            "steps": str(st.steps),
            "metric": st.metric,
        },
        parent_run_id=ctx.parent_run_id,
    )
    with ctx.tracking.run_guard(run_id):
        verdict = scorer.score(candidate)
    verdict.run_id = run_id
    metrics = {
        "standalone_accuracy": verdict.accuracy,
        "simulated_accept_length": verdict.simulated_accept_length,
        "tokens": float(verdict.tokens),
    }
    # the gate's decision is written by record_gate once every wiring is scored
    scores = verdict.scores()
    ctx.tracking.log_texts(run_id, {"standalone.json": json.dumps(scores, indent=2)})
    ctx.tracking.log(run_id, metrics=metrics, tags={"outcome": "ok", "verdict": json.dumps(scores)})
    for vocab in ("full_vocab", "draft_vocab"):
        ctx.tracking.log_curve(
            run_id,
            f"standalone_acc_{vocab}_per_position",
            values=[pos[vocab] for pos in verdict.per_position],
        )
    ctx.tracking.finish(run_id, "FINISHED")
    return verdict


@dataclass
class Candidate:
    """One wiring to score: the rule over the states it is scored on, and the live layer ids it
    means."""

    label: str
    layer_ids: list[int]  # SGLang convention
    # over the dump's states (source "dump") or over the recomputed states (source "target")
    rule: str
    source: str  # "dump" | "target"


@dataclass
class Verdict:
    """A candidate's standalone result and whether it passed the gate."""

    label: str
    layer_ids: list[int]
    rule: str
    source: str
    accuracy: float
    simulated_accept_length: float
    per_position: list[dict[str, float]]
    tokens: int
    accuracy_sd: float = 0.0  # the accuracy's bootstrap standard error over the dump's samples
    passed: bool = False
    threshold: float | None = None  # the gate's threshold for this wiring (search.gate.apply_gate)
    run_id: str | None = None
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The verdict as plain data (the gate's record, a run's ``verdict`` tag without the gate).

        Returns:
            Every field by name (``dataclasses.asdict``).
        """
        return asdict(self)

    def scores(self) -> dict[str, Any]:
        """What scoring alone says (no gate decision: that needs every wiring's score)."""
        d = self.to_json()
        d.pop("passed")
        d.pop("threshold")
        return d


def dump_ids(spec: Spec, num_layers: int) -> list[int]:
    """SGLang ids of the dump's states: its aux layers, then the final pre-norm state (id N - 1)."""
    if spec.dump_layer_ids is None:
        raise BadInput(
            f"{spec.source}: key 'dump_layer_ids' is missing; it says which layers the dump holds"
        )
    layers.ids_to_canonical(spec.dump_layer_ids, "sglang", num_layers=num_layers)
    return [*spec.dump_layer_ids, num_layers - 1]


def candidates(spec: Spec, num_layers: int) -> list[Candidate]:
    """The spec's wirings as candidates; two wirings with the same live ids are one candidate.

    Args:
        spec: the spec (its ``standalone.wirings``, ``dump_layer_ids``).
        num_layers: the target's decoder layers N.

    Returns:
        One candidate per distinct set of live ids, in the spec's order, merged labels joined by
        `` = ``; a wiring whose states the dump holds is scored on the dump, else on states the
        target recomputes.

    Raises:
        BadInput: a wiring whose rule or ids do not fit (one line naming the spec and the wiring),
            or a rule without ``dump_layer_ids``.
    """
    out: dict[tuple[int, ...], Candidate] = {}
    for i, w in enumerate(spec.standalone.wirings):
        where = f"{spec.source}: standalone.wirings[{i}] ({w.label})"
        try:
            c = (
                _from_rule(w.label, w.rule, spec, num_layers)
                if w.rule
                else _from_ids(w.label, w.layer_ids, spec, num_layers)
            )
        except BadInput as e:
            raise BadInput(f"{where}: {e}") from None
        key = tuple(sorted(c.layer_ids))
        if key in out:
            out[key].label += f" = {c.label}"
        else:
            out[key] = c
    return list(out.values())


def _from_rule(label: str, text: str, spec: Spec, num_layers: int) -> Candidate:
    ids = dump_ids(spec, num_layers)
    rule = parse_rule(text)
    selected = rule.select(len(ids))
    return Candidate(label, [-1 if s == EMB else ids[int(s)] for s in selected], rule.text, "dump")


def _from_ids(label: str, layer_ids: list[int], spec: Spec, num_layers: int) -> Candidate:
    canon = layers.ids_to_canonical(layer_ids, "sglang", num_layers=num_layers)
    held = (
        layers.ids_to_canonical(dump_ids(spec, num_layers), "sglang", num_layers=num_layers)
        if spec.dump_layer_ids
        else []
    )
    if all(c == 0 or c in held for c in canon):
        items = ",".join(EMB if c == 0 else str(held.index(c)) for c in canon)
        return Candidate(label, list(layer_ids), f"[{items}]", "dump")
    return Candidate(
        label, list(layer_ids), f"[{','.join(str(i) for i in range(len(canon)))}]", "target"
    )


class RecomputedDump:
    """The dump's samples with states recomputed by the target at canonical indices (a DumpReader
    stand-in)."""

    def __init__(self, reader: DumpReader, model, indices: list[int], num_layers: int):
        self.reader = reader
        self.model = model
        self.indices = indices
        self.num_layers = num_layers
        self.path = reader.path
        self.skipped = reader.skipped

    def __iter__(self) -> Iterator[Sample]:
        from bisect_eagle.artifacts.target import capture_hidden

        final = self.num_layers
        for s in self.reader:
            with torch.inference_mode(), capture_hidden(self.model, [*self.indices, final]) as got:
                self.model(input_ids=s.input_ids[None], logits_to_keep=1)
                states = [got[i][0].float() for i in self.indices] + [got[final][0].float()]
            yield Sample(
                s.input_ids,
                s.loss_mask,
                states,
                final_normed=False,
                mask_offset=s.mask_offset,
                source=s.source,
            )

    def head(self, n: int) -> Iterator[Sample]:
        """The first ``n`` samples, recomputed (as :meth:`DumpReader.head`).

        Args:
            n: how many samples at most.

        Returns:
            A lazy iterator; each sample runs one target forward as it is reached.
        """
        return itertools.islice(iter(self), n)


class Scorer:
    """Scores candidates of one spec; the draft, the target head and (when needed) the target load
    once."""

    def __init__(self, spec: Spec):
        from bisect_eagle.artifacts.draft import load_draft
        from bisect_eagle.artifacts.target import TargetHead

        self.spec = spec
        self.paths = spec.paths()
        self.head = TargetHead.load(self.paths["target"])
        self.num_layers = self.head.num_layers
        self.loaded = load_draft(self.paths["draft"], target=self.paths["target"])
        self._model = None

    def candidates(self) -> list[Candidate]:
        """The spec's wirings as candidates for this target (:func:`candidates`).

        Returns:
            The candidates, in the spec's order.

        Raises:
            BadInput: a wiring that does not fit.
        """
        return candidates(self.spec, self.num_layers)

    def _target_model(self):
        from bisect_eagle.artifacts.target import load_target

        if self._model is None:
            self._model, _ = load_target(self.paths["target"])
        return self._model

    def score(self, c: Candidate) -> Verdict:
        """Standalone accuracy of one candidate (the gate is applied later by
        :func:`apply_gate`)."""
        st = self.spec.standalone
        reader: DumpReader | RecomputedDump = DumpReader(Path(self.paths["dump"]))
        if c.source == "target":
            indices = layers.ids_to_canonical(c.layer_ids, "sglang", num_layers=self.num_layers)
            reader = RecomputedDump(reader, self._target_model(), indices, self.num_layers)
        try:
            result = evaluate(
                self.loaded,
                reader,
                head=self.head,
                rule=parse_rule(c.rule),
                samples=st.samples or None,
                steps=st.steps,
            )
        except BadInput as e:
            raise BadInput(f"{self.spec.source}: standalone wiring {c.label}: {e}") from None
        return _verdict(c, result, st.metric)


def _verdict(c: Candidate, r: StandaloneResult, metric: str) -> Verdict:
    notes = []
    if c.layer_ids != sorted(c.layer_ids):
        notes.append(
            f"live engines concatenate aux states in ascending id order ({sorted(c.layer_ids)}), "
            f"not in this wiring's order {c.layer_ids}"
        )
    return Verdict(
        c.label,
        c.layer_ids,
        c.rule,
        c.source,
        r.accuracy[metric],
        r.simulated_accept_length,
        r.per_position,
        r.tokens,
        accuracy_sd=r.accuracy_sd.get(metric, 0.0),
        notes=notes,
    )
