"""Isolating delta debugging between a good and a bad configuration, three-valued and replayable.

A *change* is one setting (or one group of settings that only make sense together) whose value differs
between the good and the bad configuration; a probe is the good configuration with a subset of the changes
applied, judged GOOD, BAD or UNRESOLVED (it crashed or could not be judged: git bisect's ``skip``).

:func:`isolate` is ``dd`` of Zeller & Hildebrandt (TSE 2002, "Simplifying and Isolating Failure-Inducing
Input"): split the current difference into ``n`` parts; a part added to the passing side that fails, or
removed from the failing side that passes, becomes the new difference (cases 1, 2); otherwise a part that
moves one side without flipping it shrinks the difference by that part (cases 3, 4); otherwise the
granularity doubles, until the difference is 1-minimal. Probes are issued lazily and memoised, so at
``n = 2`` one probe halves the difference (``c✓ ∪ Δ1`` *is* ``c✗ − Δ2``): a single culprit among ``n``
changes costs ``⌈log2 n⌉`` probes.

:func:`find_culprits` turns the isolated difference into *all* failure-inducing changes: it checks that the
isolated change fails on its own (when not, its interacting partners are isolated among the changes that
were on the passing side), reverts the cause found from the bad configuration, and repeats while the rest
still fails. For ``c`` culprits among ``n`` changes it needs at most ``2·c·⌈log2 n⌉ + 2`` probes (the two
endpoints included) when no probe is UNRESOLVED; UNRESOLVED probes only cost more probes, and a difference
that cannot be narrowed because of them is reported as ambiguous.

Written here rather than taken from a library: picire (last release 21.8, Aug 2021) implements ddmin and a
parallel ddmin with a two-valued outcome, not isolating dd with UNRESOLVED; debuggingbook's
``DeltaDebugger.min_arg_diff`` is isolating dd but is teaching code for function arguments, not a library
to depend on.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from bisect_eagle import layers
from bisect_eagle.engines import make_engine
from bisect_eagle.engines.base import Engine
from bisect_eagle.errors import BadInput
from bisect_eagle.settings import LiveSettings, parse_settings, trial_fingerprint
from bisect_eagle.spec import WIRING_SETTING as WIRING
from bisect_eagle.spec import Spec, check_setting_name, load_spec, settings_from
from bisect_eagle.tracking import Tracking, resolve_tracking_uri
from bisect_eagle.trials import TrialContext, TrialRecord, find_cached, run_live_trial

Config = frozenset[str]


class Outcome(str, Enum):
    """A probe's verdict; the values are git bisect's marks, as written in a bisect log."""

    GOOD = "good"
    BAD = "bad"
    UNRESOLVED = "skip"


@dataclass(frozen=True)
class Answer:
    """What an oracle says about one configuration."""

    outcome: Outcome
    detail: str = ""
    cached: bool = False  # answered without a new measurement (fingerprint cache, replayed log)


@dataclass
class Probe:
    """One configuration the search asked about, in the order asked."""

    applied: tuple[str, ...]  # change names, in difference order
    outcome: Outcome
    detail: str = ""
    cached: bool = False


Oracle = Callable[[Config], Answer]
Progress = Callable[[str], None]


class ProbeMemo:
    """Asks the oracle once per configuration and keeps every probe in order."""

    def __init__(self, order: Sequence[str], oracle: Oracle):
        self.order = list(order)
        self.oracle = oracle
        self.known: dict[Config, Outcome] = {}
        self.probes: list[Probe] = []

    def sorted(self, config: Config) -> tuple[str, ...]:
        return tuple(c for c in self.order if c in config)

    def peek(self, config: Config) -> Outcome | None:
        return self.known.get(config)

    def __call__(self, config: Config) -> Outcome:
        config = frozenset(config)
        if config not in self.known:
            answer = self.oracle(config)
            self.known[config] = answer.outcome
            self.probes.append(Probe(self.sorted(config), answer.outcome, answer.detail, answer.cached))
        return self.known[config]


def _split(items: list[str], n: int) -> list[list[str]]:
    """``items`` in ``n`` contiguous parts whose sizes differ by at most one."""
    size, extra = divmod(len(items), n)
    parts, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        parts.append(items[start:end])
        start = end
    return parts


def estimate_probes(k: int) -> int:
    """Rough number of probes left to isolate one culprit among ``k`` changes (binary search + a check)."""
    return math.ceil(math.log2(k)) + 1 if k > 1 else 1


def _reduce(passing: Config, failing: Config, parts: list[list[str]], test: ProbeMemo) -> tuple | None:
    """One step of dd: the next (passing, failing, n), or None when no case applies at this granularity."""
    n = len(parts)

    def shrink_to_part() -> tuple | None:  # cases 1 and 2, from what is known so far
        for part in parts:
            grown, cut = passing | set(part), failing - set(part)
            if test.peek(grown) is Outcome.BAD:
                return passing, grown, 2
            if test.peek(cut) is Outcome.GOOD:
                return cut, failing, 2
        return None

    for part in parts:
        for candidate in (passing | set(part), failing - set(part)):
            found = shrink_to_part()
            if found:
                return found
            test(candidate)
    found = shrink_to_part()
    if found:
        return found
    for part in parts:  # cases 3 and 4
        grown, cut = passing | set(part), failing - set(part)
        if test.peek(grown) is Outcome.GOOD:
            return grown, failing, max(n - 1, 2)
        if test.peek(cut) is Outcome.BAD:
            return passing, cut, max(n - 1, 2)
    return None


def isolate(
    passing: Config, failing: Config, test: ProbeMemo, progress: Progress | None = None
) -> tuple[Config, Config]:
    """dd: grow ``passing`` and shrink ``failing`` (known GOOD and BAD) until their difference is 1-minimal."""
    n = 2
    while True:
        delta = list(test.sorted(failing - passing))
        if len(delta) <= 1:
            return passing, failing
        if progress:
            progress(f"{len(delta)} settings left (~{estimate_probes(len(delta))} probes)")
        n = min(n, len(delta))
        step = _reduce(passing, failing, _split(delta, n), test)
        if step is not None:
            passing, failing, n = step
        elif n < len(delta):
            n = min(2 * n, len(delta))
        else:
            return passing, failing


@dataclass
class Culprits:
    """What :func:`find_culprits` established."""

    status: str  # isolated | good-not-good | bad-not-bad | ambiguous
    causes: list[tuple[str, ...]] = field(default_factory=list)  # each a minimal failing set of changes
    probes: list[Probe] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def culprits(self) -> list[str]:
        """All changes of all causes, each once, in cause order."""
        out: list[str] = []
        for cause in self.causes:
            out.extend(c for c in cause if c not in out)
        return out

    @property
    def unresolved(self) -> list[tuple[str, ...]]:
        return [p.applied for p in self.probes if p.outcome is Outcome.UNRESOLVED]


def _with_partners(diff: Config, context: Config, test: ProbeMemo, progress: Progress | None) -> tuple[Config, str]:
    """Grow an isolated change into a minimal failing cause: the partners it needs from ``context``."""
    cause = frozenset(diff)
    while True:
        alone = test(cause)
        if alone is Outcome.BAD:
            return cause, ""
        if alone is Outcome.UNRESOLVED:
            return cause, f"{'+'.join(test.sorted(cause))} applied alone could not be judged; partners not checked"
        if progress:
            progress(f"{'+'.join(test.sorted(cause))} alone is good: looking for the settings it interacts with")
        passing, failing = isolate(cause, cause | context, test, progress)
        partners = failing - passing
        cause = cause | partners
        context = passing - cause
        if len(partners) > 1:
            return cause, f"could not separate {', '.join(test.sorted(partners))} (unresolved probes)"


def find_culprits(order: Sequence[str], oracle: Oracle, progress: Progress | None = None) -> Culprits:
    """All minimal failure-inducing changes among ``order`` (good = none applied, bad = all applied)."""
    test = ProbeMemo(order, oracle)
    everything = frozenset(order)
    result = Culprits("isolated", probes=test.probes)
    if test(frozenset()) is not Outcome.GOOD:
        result.status = "good-not-good"
        result.notes.append("the good configuration is not judged good; nothing to isolate")
        return result
    if test(everything) is not Outcome.BAD:
        result.status = "bad-not-bad"
        result.notes.append("the bad configuration is not judged bad; nothing to isolate")
        return result
    reverted: Config = frozenset()
    while True:
        rest = everything - reverted
        if reverted:
            verdict = test(rest)
            if verdict is Outcome.GOOD:
                return result
            if verdict is Outcome.UNRESOLVED:
                result.notes.append("the bad configuration with the culprits reverted could not be judged; "
                                    "there may be more culprits")
                return result
        passing, failing = isolate(frozenset(), rest, test, progress)
        diff = failing - passing
        if len(diff) > 1:
            result.status = "ambiguous"
            result.causes.append(test.sorted(diff))
            result.notes.append(f"could not narrow {', '.join(test.sorted(diff))} further (unresolved probes)")
            return result
        cause, note = _with_partners(diff, passing, test, progress)
        result.causes.append(test.sorted(cause))
        if note:
            result.status = "ambiguous"
            result.notes.append(note)
            return result
        reverted |= cause


# ---------------------------------------------------------------------------------------------------
# the changes: settings that differ between the good and the bad configuration


@dataclass(frozen=True)
class Change:
    """One item of the difference: a setting, or a group of settings applied together."""

    name: str  # the setting's name, or the group's names joined by '+'
    good: dict[str, Any]  # setting -> value in the good configuration (None: unset)
    bad: dict[str, Any]  # setting -> value in the bad configuration (None: unset)
    shown: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # resolved (good, bad) where raw values hide it

    def values(self, side: str) -> Any:
        """The good or bad value (a dict of values for a group), resolved where the raw value is implicit."""
        raw = self.good if side == "good" else self.bad
        resolved = {k: self.shown[k][0 if side == "good" else 1] if k in self.shown else v for k, v in raw.items()}
        return next(iter(resolved.values())) if len(resolved) == 1 else resolved

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "settings": list(self.good), "good": self.values("good"),
                "bad": self.values("bad")}


def flat_settings(settings: LiveSettings) -> dict[str, Any]:
    """Settings as spec names: LiveSettings fields, ``env.NAME`` and ``server_args.flag``."""
    d = settings.model_dump(mode="json")
    env, args = d.pop("env"), d.pop("server_args")
    d.update({f"env.{k}": v for k, v in sorted(env.items())})
    d.update({f"server_args.{k}": v for k, v in sorted(args.items())})
    return d


def differences(good: dict[str, Any], bad: dict[str, Any], groups: Sequence[Sequence[str]] = (),
                wiring: tuple[Any, Any] | None = None) -> list[Change]:
    """The changes from ``good`` to ``bad`` (flat settings), one per setting or per group that differs.

    ``wiring`` gives the resolved good and bad layer ids (None in a spec means the draft's own ids): the
    wiring differs only when these do, and they are what a report shows.
    """
    names = list(dict.fromkeys([*good, *bad]))
    differ = [n for n in names if good.get(n) != bad.get(n)]
    if wiring is not None:
        if wiring[0] == wiring[1]:
            differ = [n for n in differ if n != WIRING]
        elif WIRING not in differ:
            differ.append(WIRING)
    shown = {WIRING: wiring} if wiring is not None else {}
    out: list[Change] = []
    taken: set[str] = set()
    for name in differ:
        if name in taken:
            continue
        group = next((g for g in groups if name in g), [name])
        members = [n for n in differ if n in group]
        taken.update(members)
        out.append(Change("+".join(members), {n: good.get(n) for n in members}, {n: bad.get(n) for n in members},
                          {n: v for n, v in shown.items() if n in members}))
    return out


def apply_changes(base: dict[str, Any], changes: Sequence[Change]) -> dict[str, Any]:
    """``base`` (flat settings) with the bad values of ``changes``."""
    values = dict(base)
    for c in changes:
        values.update(c.bad)
    return values


# ---------------------------------------------------------------------------------------------------
# judging a probe: one metric against a threshold, with a noise band from repeats

MAD_SCALE = 1.4826  # MAD × 1.4826 estimates the standard deviation of normally distributed noise


@dataclass
class Judge:
    """GOOD / BAD / UNRESOLVED from the median of ``repeats`` measurements of a higher-is-better metric.

    The limit is ``threshold`` if given, else ``ratio`` × the good configuration's median. Noise is the
    larger scaled MAD (1.4826 × median absolute deviation, a standard-deviation estimate robust to one
    outlier) of the probe and the good configuration; a probe is GOOD when its median is at least
    ``band`` noise units above the limit, BAD when that far below, and UNRESOLVED in between. With one
    repeat there is no noise estimate and the limit alone decides.
    """

    metric: str = "output_tok_s"
    ratio: float = 0.9
    threshold: float | None = None
    band: float = 2.0
    repeats: int = 1
    reference: float | None = None  # median of the good configuration
    reference_mad: float = 0.0

    @property
    def limit(self) -> float:
        if self.threshold is not None:
            return self.threshold
        if self.reference is None:
            raise ValueError("the judge needs the good configuration's measurement first")
        return self.ratio * self.reference

    def classify(self, median: float, mad: float) -> tuple[Outcome, str]:
        if not math.isfinite(median):
            return Outcome.UNRESOLVED, f"{self.metric} is not a number ({median})"
        margin = self.band * MAD_SCALE * max(mad, self.reference_mad)
        what = f"{self.metric} {median:.4g} (MAD {mad:.3g}) vs limit {self.limit:.4g} ± {margin:.3g}"
        if median >= self.limit + margin:
            return Outcome.GOOD, what
        if median < self.limit - margin:
            return Outcome.BAD, what
        return Outcome.UNRESOLVED, what + ": within the noise band"

    def settings(self) -> dict[str, Any]:
        return {"metric": self.metric, "ratio": self.ratio, "threshold": self.threshold, "band": self.band,
                "repeats": self.repeats}


# ---------------------------------------------------------------------------------------------------
# the bisect log: git bisect log/replay, one mark per probed configuration

LOG_MAGIC = "# bisect-eagle bisect log v1"
HEADER_KEYS = ("good", "bad", "judge", "set", "reference", "changes")


@dataclass
class BisectLog:
    """A replayable record of a bisect; marks (good | bad | skip) may be edited before ``--replay``."""

    good: str
    bad: str
    judge: dict[str, Any]
    overrides: dict[str, Any]
    changes: list[Change]
    reference: dict[str, float] | None = None
    marks: list[tuple[Outcome, tuple[str, ...], str]] = field(default_factory=list)

    def text(self) -> str:
        lines = [LOG_MAGIC, f"# good: {self.good}", f"# bad: {self.bad}", f"# judge: {json.dumps(self.judge)}",
                 f"# set: {json.dumps(self.overrides)}"]
        if self.reference is not None:
            lines.append(f"# reference: {json.dumps(self.reference)}")
        lines.append(f"# changes: {json.dumps([c.name for c in self.changes])}")
        for c in self.changes:
            lines.append(f"#   {c.name}: {json.dumps(c.values('good'))} -> {json.dumps(c.values('bad'))}")
        for outcome, applied, note in self.marks:
            lines.append(f"{outcome.value} {','.join(applied) or '-'}" + (f"  # {note}" if note else ""))
        return "\n".join(lines) + "\n"

    def write(self, path: Path) -> None:
        """Replace ``path`` atomically (a reader never sees half a log)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.text())
        os.replace(tmp, path)


@dataclass
class ParsedLog:
    """What ``--replay`` reads: the header values and the marks (checked against the changes later)."""

    header: dict[str, Any]
    marks: list[tuple[Outcome, tuple[str, ...], str]]


def parse_log(path: Path) -> ParsedLog:
    """Read a bisect log; errors name the file, the line and what was expected."""
    if not path.is_file():
        raise BadInput(f"{path}: bisect log not found")
    lines = path.read_text().splitlines()
    if not lines or lines[0].strip() != LOG_MAGIC:
        raise BadInput(f"{path}:1: expected {LOG_MAGIC!r}, found {lines[0] if lines else 'an empty file'!r}")
    header: dict[str, Any] = {}
    marks = []
    for number, line in enumerate(lines[1:], start=2):
        where = f"{path}:{number}"
        text = line.strip()
        if not text:
            continue
        if text.startswith("#"):
            key, sep, value = text[1:].strip().partition(": ")
            if sep and key in HEADER_KEYS:
                try:
                    header[key] = value if key in ("good", "bad") else json.loads(value)
                except json.JSONDecodeError as e:
                    raise BadInput(f"{where}: header {key!r} is not valid JSON ({e.msg})") from None
            continue
        body, _, note = text.partition("#")
        parts = body.split()
        if len(parts) != 2 or parts[0] not in [o.value for o in Outcome]:
            raise BadInput(f"{where}: expected '<good|bad|skip> <changes,comma,separated or ->', found {text!r}")
        applied = () if parts[1] == "-" else tuple(parts[1].split(","))
        marks.append((Outcome(parts[0]), applied, note.strip()))
    for key in ("good", "bad", "judge"):
        if key not in header:
            raise BadInput(f"{path}: header '# {key}: ...' is missing")
    return ParsedLog(header, marks)


# ---------------------------------------------------------------------------------------------------
# endpoints: a spec file or an MLflow run id

RUN_ID = re.compile(r"^[0-9a-f]{32}$")


@dataclass
class Endpoint:
    """One side of the bisect: its flat settings and, when it is a spec, the spec."""

    label: str
    settings: dict[str, Any]
    spec: Spec | None


def load_endpoint(text: str, flag: str, tracking_uri: str) -> Endpoint:
    """A spec file's fixed settings, or the requested settings of a logged live trial."""
    path = Path(text)
    if path.is_file():
        spec = load_spec(path)
        return Endpoint(str(path), flat_settings(spec.fixed_settings()), spec)
    if not RUN_ID.fullmatch(text):
        raise BadInput(f"{flag} {text}: not a spec file, nor an MLflow run id (32 hex digits)")
    tracking, _ = Tracking.of_run(tracking_uri, text)
    try:
        trial = json.loads(tracking.read_text(text, "trial.json"))
    except Exception as e:  # MLflow raises several types for a missing artifact
        raise BadInput(f"{flag} {text}: the run has no readable trial.json artifact ({type(e).__name__}); "
                       "give the run of a live trial") from None
    requested = trial.get("requested")
    if not isinstance(requested, dict):
        raise BadInput(f"{flag} {text}: trial.json has no 'requested' settings")
    return Endpoint(f"run:{text}", flat_settings(parse_settings(requested, f"{flag} {text}: trial.json requested")),
                    None)


DEPLOYMENT_KEYS = ("target", "draft", "prompts")


def deployment(good: Endpoint, bad: Endpoint, spec_path: Path | None) -> Spec:
    """The spec whose target, draft, prompts and engine every probe uses; both specs must agree on them."""
    specs = [e.spec for e in (good, bad) if e.spec is not None]
    if spec_path is not None:
        specs.insert(0, load_spec(spec_path))
    if not specs:
        raise BadInput("--good and --bad are both run ids: give --spec SPEC for the target, draft and engine")
    first = specs[0]
    for other in specs[1:]:
        for key in DEPLOYMENT_KEYS:
            if getattr(first, key) != getattr(other, key):
                raise BadInput(f"{other.source}: key {key!r} is {getattr(other, key)} but {first.source} has "
                               f"{getattr(first, key)}; bisect varies settings of one deployment")
        if first.engine.kind != other.engine.kind:
            raise BadInput(f"{other.source}: key 'engine.kind' is {other.engine.kind!r} but {first.source} has "
                           f"{first.engine.kind!r}; bisect varies settings of one engine")
    return first


def resolved_wiring(settings: dict[str, Any], spec: Spec) -> list[int]:
    """The SGLang ids a configuration feeds the draft: its own, else the draft config's."""
    ids = settings.get(WIRING)
    if ids is not None:
        return list(ids)
    from bisect_eagle.doctor import engine_family, read_draft
    from bisect_eagle.target import read_target_config

    n = int(read_target_config(spec.paths()["target"])["num_hidden_layers"])
    info = read_draft(Path(spec.paths()["draft"]))
    declared, conv = info.declared(engine_family(spec))
    if declared is None:
        raise BadInput(f"{info.path / 'config.json'}: no layer ids the {spec.engine.kind} engine reads")
    return layers.canonical_to_ids(layers.ids_to_canonical(declared, conv, n), "sglang", n)


# ---------------------------------------------------------------------------------------------------
# probing: a configuration -> a live (or standalone) trial, cached by fingerprint -> an outcome

STANDALONE_METRIC = "standalone_accuracy"
LIVE_METRICS = ("output_tok_s", "accept_length")


@dataclass
class ProbeRecord:
    """One probe's trial: measured now, reused by fingerprint, or replayed from a log."""

    source: str  # measured | cache (the MLflow store) | memory (an earlier probe of this bisect) | replay
    fingerprint: str = ""
    run_id: str | None = None  # the trial's run (for cached probes: the run measured earlier)
    child_run_id: str | None = None  # this probe's child run of the bisect
    median: float | None = None
    mad: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    effective: dict[str, Any] | None = None
    failure: str = ""  # why the trial could not be judged


class Prober:
    """The oracle of a live bisect: a configuration's settings, its trial (or a cached one), a verdict.

    Every probe that is not replayed gets a child run of the bisect: the live trial's own run when measured,
    else a small run pointing (tag ``cached_from``) at the run measured before. Each is tagged
    ``bisect_applied`` and ``bisect_outcome``. The log is rewritten after every probe.
    """

    def __init__(self, ctx: TrialContext, base: dict[str, Any], changes: dict[str, Change], judge: Judge,
                 log: BisectLog, log_path: Path, replayed: dict[Config, tuple[Outcome, str]],
                 progress: Progress | None = None):
        self.ctx = ctx
        self.base = base
        self.changes = changes
        self.order = list(changes)
        self.judge = judge
        self.log = log
        self.log_path = log_path
        self.replayed = replayed
        self.progress = progress
        self.seen: dict[str, ProbeRecord] = {}
        self.records: dict[Config, ProbeRecord] = {}
        self.measured = 0
        self._scorer = None
        self._started: str | None = None

    def settings(self, config: Config) -> LiveSettings:
        chosen = [self.changes[n] for n in self.order if n in config]
        return settings_from(apply_changes(self.base, chosen), "bisect probe " + ("+".join(config) or "(good)"))

    def applied(self, config: Config) -> str:
        return ",".join(n for n in self.order if n in config) or "-"

    def __call__(self, config: Config) -> Answer:
        if config in self.replayed:
            outcome, note = self.replayed[config]
            self.records[config] = ProbeRecord("replay")
            return self._done(config, Answer(outcome, f"replayed: {note}" if note else "replayed", cached=True))
        if self.judge.reference is None and self.judge.threshold is None and config:
            self._reference()
        self._started = None
        try:
            rec = self._trial(config)
        except Exception as e:  # a probe that cannot even run is unresolved, never the end of the bisect
            reason = str(e).splitlines()[0] if str(e) else ""
            rec = ProbeRecord("measured", child_run_id=self._started, failure=f"could not run: "
                              f"{type(e).__name__}: {reason}")
        self.records[config] = rec
        if rec.failure:
            answer = Answer(Outcome.UNRESOLVED, rec.failure, cached=rec.source != "measured")
        else:
            if not config and self.judge.reference is None and self.judge.threshold is None:
                self.judge.reference, self.judge.reference_mad = rec.median, rec.mad or 0.0
                self.log.reference = {"median": rec.median, "mad": rec.mad or 0.0}
            outcome, what = self.judge.classify(rec.median, rec.mad or 0.0)
            where = f"; {rec.source} run {rec.run_id}" if rec.run_id else ""
            answer = Answer(outcome, what + where, cached=rec.source != "measured")
        if rec.child_run_id:
            self.ctx.tracking.log(rec.child_run_id, tags={"bisect_outcome": answer.outcome.name,
                                                          "bisect_detail": answer.detail[:7900]})
        return self._done(config, answer)

    def _done(self, config: Config, answer: Answer) -> Answer:
        applied = tuple(n for n in self.order if n in config)
        self.log.marks.append((answer.outcome, applied, answer.detail))
        self.log.write(self.log_path)
        if self.progress:
            label = ", ".join(applied) or "none (the good configuration)"
            self.progress(f"probe {len(self.log.marks)}: changes applied: {label} -> {answer.outcome.name} "
                          f"({answer.detail})")
        return answer

    def _reference(self) -> None:
        """Measure the good configuration first when a replay starts without its reference value."""
        answer = self(frozenset())
        if self.judge.reference is None:
            raise BadInput(f"the good configuration could not be measured ({answer.detail}); nothing to compare with")

    def _trial(self, config: Config) -> ProbeRecord:
        settings = self.settings(config)
        if self.judge.metric == STANDALONE_METRIC:
            return self._standalone(settings, config)
        plan = self.ctx.plan(settings)
        effective, fp = plan.effective, plan.fingerprint
        if fp in self.seen:
            return self._reuse(self.seen[fp], "memory", config)
        found = self._cached(fp)
        if found is not None:
            rec = self._from_trial(found, "cache", effective)
            self.seen[fp] = rec
            return self._reuse(rec, "cache", config)
        self.measured += 1
        trial = run_live_trial(self.ctx, plan, stage="live", parent_run_id=self.ctx.parent_run_id,
                               tags={"bisect_applied": self.applied(config)}, on_start=self._on_start)
        rec = self._from_trial(trial, "measured", effective)
        rec.child_run_id = trial.run_id
        self.seen[fp] = rec
        return rec

    def _on_start(self, run_id: str) -> None:
        self._started = run_id

    def _from_trial(self, trial: TrialRecord, source: str, effective: dict[str, Any]) -> ProbeRecord:
        ok = trial.status == "ok"
        return ProbeRecord(
            source, trial.fingerprint, trial.run_id, None,
            median=trial.metrics.get(self.judge.metric) if ok else None,
            mad=trial.metrics.get(f"{self.judge.metric}_mad", 0.0) if ok else None,
            metrics=dict(trial.metrics), effective=trial.effective or effective,
            failure="" if ok else f"failed ({trial.failure_class}): {trial.failure_detail}")

    def _cached(self, fp: str) -> TrialRecord | None:
        """A stored trial of this fingerprint measured well enough for this judge, else None."""
        record = find_cached(self.ctx.tracking, fp)
        if record is None or record.status == "pruned":
            return None
        if record.status == "failed":
            return record
        enough = record.metrics.get("repeats", 1.0) >= self.judge.repeats
        noise_known = self.judge.repeats == 1 or f"{self.judge.metric}_mad" in record.metrics
        return record if enough and noise_known and self.judge.metric in record.metrics else None

    def _reuse(self, rec: ProbeRecord, source: str, config: Config) -> ProbeRecord:
        """A copy of an earlier trial's record, with a child run of the bisect pointing at that trial."""
        t = self.ctx.tracking
        child = t.start_run(f"bisect probe {self.applied(config)} ({source})",
                            {"stage": "bisect-cached", "fingerprint": rec.fingerprint, "cached_from": str(rec.run_id),
                             "bisect_applied": self.applied(config)}, parent_run_id=self.ctx.parent_run_id)
        t.log(child, metrics=rec.metrics)
        t.finish(child, "FINISHED")
        return ProbeRecord(source, rec.fingerprint, rec.run_id, child, rec.median, rec.mad, rec.metrics,
                           rec.effective, rec.failure)

    def _standalone(self, settings: LiveSettings, config: Config) -> ProbeRecord:
        """Standalone accuracy of the configuration's wiring (the other settings do not change it)."""
        from bisect_eagle.search.gate import Scorer, candidates
        from bisect_eagle.spec import Wiring
        from bisect_eagle.trials import run_standalone_trial

        spec = self.ctx.spec
        if self._scorer is None:
            self._scorer = Scorer(spec)
        ids = resolved_wiring({WIRING: settings.eagle_aux_hidden_state_layer_ids}, spec)
        fp = trial_fingerprint({"stage": "standalone", "layer_ids": ids})
        if fp in self.seen:
            return self._reuse(self.seen[fp], "memory", config)
        one = spec.model_copy(update={"standalone": spec.standalone.model_copy(
            update={"wirings": [Wiring(layer_ids=ids)]})})
        self.measured += 1
        verdict = run_standalone_trial(self.ctx, self._scorer, candidates(one, self._scorer.num_layers)[0])
        rec = ProbeRecord("measured", fp, verdict.run_id, verdict.run_id, verdict.accuracy, 0.0,
                          {STANDALONE_METRIC: verdict.accuracy}, {WIRING: ids})
        self.seen[fp] = rec
        return rec


# ---------------------------------------------------------------------------------------------------
# the whole bisect


@dataclass
class BisectOptions:
    """What the command line asks for."""

    good: str | None = None
    bad: str | None = None
    spec: Path | None = None
    metric: str | None = None  # default: the spec's criterion metric
    ratio: float = 0.9
    threshold: float | None = None
    band: float = 2.0
    repeats: int | None = None  # default: the spec's search.repeats
    overrides: dict[str, Any] = field(default_factory=dict)  # settings forced in every probe (e.g. fewer prompts)
    tracking_uri: str | None = None
    log_path: Path | None = None
    replay: Path | None = None


@dataclass
class BisectReport:
    """The result of a bisect, as printed and logged."""

    status: str
    good: str
    bad: str
    judge: dict[str, Any]
    differences: list[Change]
    causes: list[list[str]]
    culprits: list[Change]
    probes: list[dict[str, Any]]
    unresolved: list[list[str]]
    live_trials: int
    probe_bound: int
    notes: list[str]
    parent_run_id: str
    log: str

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status, "good": self.good, "bad": self.bad, "judge": self.judge,
            "differences": [c.to_json() for c in self.differences],
            "culprits": [c.to_json() for c in self.culprits], "causes": self.causes,
            "probes": self.probes, "unresolved": self.unresolved, "probes_used": len(self.probes),
            "probe_bound": self.probe_bound, "live_trials": self.live_trials, "notes": self.notes,
            "parent_run_id": self.parent_run_id, "log": self.log,
        }


def probe_bound(culprits: int, changes: int) -> int:
    """2·c·⌈log2 n⌉ + 2: the most probes isolating ``c`` culprits among ``n`` changes needs without skips."""
    return 2 * max(culprits, 1) * math.ceil(math.log2(max(changes, 1))) + 2


def _replay_options(opts: BisectOptions) -> tuple[BisectOptions, ParsedLog | None]:
    """Options with good, bad, judge and overrides taken from a replayed log."""
    if opts.replay is None:
        if not opts.good or not opts.bad:
            raise BadInput("give --good and --bad (spec files or MLflow run ids), or --replay LOG")
        return opts, None
    if opts.good or opts.bad:
        raise BadInput("--replay takes good and bad from the log; do not give --good/--bad with it")
    parsed = parse_log(opts.replay)
    judge = parsed.header["judge"]
    if not isinstance(judge, dict):
        raise BadInput(f"{opts.replay}: header 'judge' must be a JSON object")
    merged = BisectOptions(
        good=parsed.header["good"], bad=parsed.header["bad"], spec=opts.spec, metric=judge.get("metric"),
        ratio=float(judge.get("ratio", opts.ratio)), threshold=judge.get("threshold"),
        band=float(judge.get("band", opts.band)), repeats=judge.get("repeats"),
        overrides={**parsed.header.get("set", {}), **opts.overrides}, tracking_uri=opts.tracking_uri,
        log_path=opts.log_path, replay=opts.replay)
    return merged, parsed


def _judge(opts: BisectOptions, spec: Spec) -> Judge:
    metric = opts.metric or spec.criterion.metric
    if metric not in (*LIVE_METRICS, STANDALONE_METRIC):
        raise BadInput(f"--metric {metric!r}: expected one of {', '.join((*LIVE_METRICS, STANDALONE_METRIC))}")
    if opts.ratio <= 0:
        raise BadInput(f"--ratio must be > 0, got {opts.ratio}")
    if opts.band < 0:
        raise BadInput(f"--noise-band must be >= 0, got {opts.band}")
    repeats = opts.repeats if opts.repeats is not None else spec.search.repeats
    if repeats < 1:
        raise BadInput(f"--repeats must be >= 1, got {repeats}")
    return Judge(metric, opts.ratio, opts.threshold, opts.band, repeats)


def _probe_spec(spec: Spec, judge: Judge) -> Spec:
    """The deployment spec with the judge's metric and repeats (what the trial runner aggregates)."""
    if judge.metric == STANDALONE_METRIC:
        return spec
    return spec.model_copy(update={
        "criterion": spec.criterion.model_copy(update={"metric": judge.metric}),
        "search": spec.search.model_copy(update={"repeats": judge.repeats, "prune_below": None}),
    })


def run_bisect(opts: BisectOptions, engine_factory: Callable[[Spec], Engine] = make_engine,
               progress: Progress | None = None) -> BisectReport:
    """Isolate the changes that make the bad configuration fail, logging a parent run with a child per probe."""
    opts, parsed = _replay_options(opts)
    uri = resolve_tracking_uri(opts.tracking_uri)
    good, bad = load_endpoint(opts.good, "--good", uri), load_endpoint(opts.bad, "--bad", uri)
    spec = deployment(good, bad, opts.spec)
    judge = _judge(opts, spec)
    for name in opts.overrides:
        check_setting_name(name, "--set")
    base = {**good.settings, **opts.overrides}
    bad_values = {**bad.settings, **opts.overrides}
    groups = [*(good.spec.groups if good.spec else []), *(bad.spec.groups if bad.spec else [])]
    wiring = None
    if WIRING not in opts.overrides:
        wiring = (resolved_wiring(good.settings, spec), resolved_wiring(bad.settings, spec))
    changes = differences(base, bad_values, groups, wiring)
    if not changes:
        raise BadInput(f"{good.label} and {bad.label} have the same settings (after --set); nothing to bisect")
    log_path = opts.log_path or Path("mlruns") / "bisect" / f"bisect-{time.strftime('%Y%m%d-%H%M%S')}.log"
    log = BisectLog(_log_ref(opts.good), _log_ref(opts.bad), judge.settings(), dict(opts.overrides), changes)
    replayed: dict[Config, tuple[Outcome, str]] = {}
    if parsed is not None:
        replayed = _check_replay(parsed, changes, opts.replay)
        ref = parsed.header.get("reference")
        if isinstance(ref, dict) and "median" in ref:
            judge.reference, judge.reference_mad = float(ref["median"]), float(ref.get("mad", 0.0))
            log.reference = {"median": judge.reference, "mad": judge.reference_mad}
    tracking = Tracking.open(uri, spec.name)
    parent = tracking.start_run(
        f"bisect {Path(good.label).stem} vs {Path(bad.label).stem}",
        {"role": "bisect", "mlflow.note.content": f"bisect-eagle bisect: {good.label} (good) vs {bad.label} (bad)"},
        {"good": good.label, "bad": bad.label, **{f"judge.{k}": str(v) for k, v in judge.settings().items()},
         "changes": json.dumps([c.name for c in changes])[:6000], "set": json.dumps(opts.overrides)[:6000],
         **({"replay": str(opts.replay)} if opts.replay else {})})
    with tracking.ended_on_error(parent, "error"), (
            engine_factory(spec) if judge.metric != STANDALONE_METRIC else nullcontext()) as engine:
        ctx = TrialContext(spec=_probe_spec(spec, judge), tracking=tracking, study=f"bisect-{parent[:8]}",
                           parent_run_id=parent, engine=engine)
        prober = Prober(ctx, base, {c.name: c for c in changes}, judge, log, log_path, replayed, progress)
        result = find_culprits([c.name for c in changes], prober, progress)
    report = _report(result, prober, changes, judge, good, bad, parent, log_path)
    tracking.log_texts(parent, {"bisect.log": log.text(), "result.json": json.dumps(report.to_json(), indent=2,
                                                                                   default=str)})
    tracking.log(parent, metrics={"probes": float(len(report.probes)), "live_trials": float(report.live_trials),
                                  "probe_bound": float(report.probe_bound)},
                 tags={"outcome": report.status, "culprits": ",".join(c.name for c in report.culprits)[:7900]})
    tracking.finish(parent, "FINISHED")
    return report


def _log_ref(text: str) -> str:
    """A spec as an absolute path (a log replays from any directory), a run id as it is."""
    return str(Path(text).resolve()) if Path(text).is_file() else text


def _check_replay(parsed: ParsedLog, changes: list[Change], path: Path) -> dict[Config, tuple[Outcome, str]]:
    names = {c.name for c in changes}
    logged = parsed.header.get("changes")
    if logged is not None and sorted(logged) != sorted(names):
        raise BadInput(f"{path}: header 'changes' lists {logged}, but the configurations now differ in "
                       f"{sorted(names)}; the specs changed since the log was written")
    for _, applied, _ in parsed.marks:
        unknown = [a for a in applied if a not in names]
        if unknown:
            raise BadInput(f"{path}: a mark applies {unknown}, which is not one of the changes {sorted(names)}")
    return {frozenset(applied): (outcome, note) for outcome, applied, note in parsed.marks}


def _report(result: Culprits, prober: Prober, changes: list[Change], judge: Judge, good: Endpoint, bad: Endpoint,
            parent: str, log_path: Path) -> BisectReport:
    by_name = {c.name: c for c in changes}
    probes = []
    for p in result.probes:
        rec = prober.records.get(frozenset(p.applied)) or ProbeRecord("replay")
        probes.append({"applied": list(p.applied), "outcome": p.outcome.name, "detail": p.detail, "cached": p.cached,
                       "source": rec.source, "fingerprint": rec.fingerprint or None, "run_id": rec.run_id,
                       "child_run_id": rec.child_run_id, "median": rec.median, "mad": rec.mad,
                       "effective": rec.effective})
    culprits = [by_name[n] for n in result.culprits]
    return BisectReport(
        status=result.status, good=good.label, bad=bad.label, judge={**judge.settings(), "limit": _limit(judge)},
        differences=changes, causes=[list(c) for c in result.causes], culprits=culprits, probes=probes,
        unresolved=[list(u) for u in result.unresolved], live_trials=prober.measured,
        probe_bound=probe_bound(len(culprits), len(changes)), notes=result.notes, parent_run_id=parent,
        log=str(log_path))


def _limit(judge: Judge) -> float | None:
    return judge.limit if judge.threshold is not None or judge.reference is not None else None
