"""Stage 1: each candidate wiring's standalone accuracy, and the gate that decides which wirings go live.

A rule is evaluated over the dump's own tensors. Layer ids (SGLang convention) that the dump holds become a
rule over it; ids it does not hold are recomputed by the target for the dump's own ``input_ids`` (hooks at
the canonical indices, see :mod:`bisect_eagle.target`) and scored by the same batching as
:func:`bisect_eagle.standalone.evaluate`. Every candidate maps to the SGLang layer ids stage 2 searches:
the dump's states are ``dump_layer_ids`` plus the final state (id ``N - 1``), and ``emb`` is id ``-1``.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from bisect_eagle import layers
from bisect_eagle.dumps import DumpReader, Sample
from bisect_eagle.errors import BadInput
from bisect_eagle.spec import Spec
from bisect_eagle.standalone import StandaloneResult, evaluate
from bisect_eagle.tracking import Tracking
from bisect_eagle.wiring import EMB, parse_rule


@dataclass
class Candidate:
    """One wiring to score: the rule over the states it is scored on, and the live layer ids it means."""

    label: str
    layer_ids: list[int]  # SGLang convention
    rule: str  # over the dump's states (source "dump") or over the recomputed states (source "target")
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
    passed: bool = False
    run_id: str | None = None
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def scores(self) -> dict[str, Any]:
        """What scoring alone says (no gate decision: that needs every wiring's score)."""
        d = self.to_json()
        d.pop("passed")
        return d


def dump_ids(spec: Spec, num_layers: int) -> list[int]:
    """SGLang ids of the dump's states: its aux layers, then the final pre-norm state (id N - 1)."""
    if spec.dump_layer_ids is None:
        raise BadInput(f"{spec.source}: key 'dump_layer_ids' is missing; it says which layers the dump holds")
    layers.ids_to_canonical(spec.dump_layer_ids, "sglang", num_layers=num_layers)
    return [*spec.dump_layer_ids, num_layers - 1]


def candidates(spec: Spec, num_layers: int) -> list[Candidate]:
    """The spec's wirings as candidates; two wirings with the same live ids are one candidate."""
    out: dict[tuple[int, ...], Candidate] = {}
    for i, w in enumerate(spec.standalone.wirings):
        where = f"{spec.source}: standalone.wirings[{i}] ({w.label})"
        try:
            c = _from_rule(w.label, w.rule, spec, num_layers) if w.rule else _from_ids(w.label, w.layer_ids, spec,
                                                                                     num_layers)
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
    return Candidate(label, list(layer_ids), f"[{','.join(str(i) for i in range(len(canon)))}]", "target")


class RecomputedDump:
    """The dump's samples with states recomputed by the target at canonical indices (a DumpReader stand-in)."""

    def __init__(self, reader: DumpReader, model, indices: list[int], num_layers: int):
        self.reader = reader
        self.model = model
        self.indices = indices
        self.num_layers = num_layers
        self.path = reader.path
        self.skipped = reader.skipped

    def __iter__(self) -> Iterator[Sample]:
        from bisect_eagle.target import capture_hidden

        final = self.num_layers
        for s in self.reader:
            with torch.inference_mode(), capture_hidden(self.model, [*self.indices, final]) as got:
                self.model(input_ids=s.input_ids[None], logits_to_keep=1)
                states = [got[i][0].float() for i in self.indices] + [got[final][0].float()]
            yield Sample(
                s.input_ids, s.loss_mask, states, final_normed=False, mask_offset=s.mask_offset, source=s.source
            )

    def head(self, n: int) -> Iterator[Sample]:
        return itertools.islice(iter(self), n)


class Scorer:
    """Scores candidates of one spec; the draft, the target head and (when needed) the target load once."""

    def __init__(self, spec: Spec):
        from bisect_eagle.draft import load_draft
        from bisect_eagle.target import TargetHead

        self.spec = spec
        self.paths = spec.paths()
        self.head = TargetHead.load(self.paths["target"])
        self.num_layers = self.head.num_layers
        self.loaded = load_draft(self.paths["draft"], target=self.paths["target"])
        self._model = None

    def candidates(self) -> list[Candidate]:
        return candidates(self.spec, self.num_layers)

    def _target_model(self):
        from bisect_eagle.target import load_target

        if self._model is None:
            self._model, _ = load_target(self.paths["target"])
        return self._model

    def score(self, c: Candidate) -> Verdict:
        """Standalone accuracy of one candidate (the gate is applied later by :func:`apply_gate`)."""
        st = self.spec.standalone
        reader: DumpReader | RecomputedDump = DumpReader(Path(self.paths["dump"]))
        if c.source == "target":
            indices = layers.ids_to_canonical(c.layer_ids, "sglang", num_layers=self.num_layers)
            reader = RecomputedDump(reader, self._target_model(), indices, self.num_layers)
        try:
            result = evaluate(
                self.loaded, reader, head=self.head, rule=parse_rule(c.rule), samples=st.samples or None, steps=st.steps
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
        notes=notes,
    )


def apply_gate(verdicts: list[Verdict], *, margin: float, reference: float | None) -> float:
    """Mark verdicts within ``margin`` of the reference (default: the best accuracy) as passed; returns it."""
    if not verdicts:
        raise BadInput("the standalone gate needs at least one wiring")
    ref = max(v.accuracy for v in verdicts) if reference is None else reference
    for v in verdicts:
        v.passed = v.accuracy >= ref - margin
    return ref


def record_gate(tracking: Tracking, verdicts: list[Verdict], *, reference: float, margin: float) -> None:
    """Write the gate's decision onto each verdict's run: ``standalone.json`` and the ``verdict`` tag rewritten
    with ``passed``, the tag ``gate`` (pass | reject), the metrics ``gate_reference`` and ``gate_threshold``."""
    for v in verdicts:
        if v.run_id is None:
            continue
        body = {**v.to_json(), "gate": {"reference": reference, "margin": margin, "threshold": reference - margin}}
        tracking.log_texts(v.run_id, {"standalone.json": json.dumps(body, indent=2)})
        tracking.log(
            v.run_id,
            metrics={"gate_reference": reference, "gate_threshold": reference - margin},
            tags={"gate": "pass" if v.passed else "reject", "verdict": json.dumps(v.to_json())},
        )
