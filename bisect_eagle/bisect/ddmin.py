"""Isolating delta debugging between a good and a bad configuration: three-valued, memoised, self-contained.

A *change* is a name (one setting, or a group of settings applied together); a *configuration* is the set
of changes applied to the good configuration: the empty set is the good configuration, the set of every
change the bad one. An oracle judges a configuration GOOD, BAD or UNRESOLVED (it crashed or could not be
judged: git bisect's ``skip``).

:func:`isolate` is ``dd`` of Zeller & Hildebrandt (TSE 2002, "Simplifying and Isolating Failure-Inducing
Input"): split the current difference into ``n`` parts; a part added to the passing side that fails, or
removed from the failing side that passes, becomes the new difference (cases 1, 2); otherwise a part that
moves one side without flipping it shrinks the difference by that part (cases 3, 4); otherwise the
granularity doubles, until the difference is 1-minimal. Probes are issued lazily and memoised, so at
``n = 2`` one probe halves the difference (``c✓ ∪ Δ1`` *is* ``c✗ − Δ2``): a single culprit among ``n``
changes costs ``⌈log2 n⌉`` probes.

:func:`find_culprits` answers two questions, which can have different answers:

- **breaking sets**: sets of changes that, *applied to the good configuration*, break it. Each is
  1-minimal (remove any one change and it no longer breaks the good configuration). The first is isolated
  by ``dd``; when the isolated change is harmless alone, its interacting partners are isolated among the
  changes that were on the passing side. That cause is then reverted from the bad configuration and the
  search repeats while the rest still fails, so independent causes are each reported.
- **the repair set**: a set of changes whose *removal from the bad configuration* repairs it, 1-minimal
  (put any one back and it fails again), found by shrinking the union of the breaking sets one change at a
  time. Two changes that fail only together form one breaking set of two, while reverting either one alone
  repairs the bad configuration, so the repair set holds one of them.

Not every breaking set is enumerated: a breaking set hidden in the bad configuration by a change that
compensates it is found only if reverting the causes found before leaves the rest failing.

**Every answer is verified before it is returned as isolated**, by one probe more each, asked of the oracle
anew once the search is done (so judged against everything measured by then: the final limit and noise
estimate). Each breaking set, applied to the good configuration, must be BAD; the repair set, reverted from
the *bad configuration as it is* -- with the differences the caller set aside as not changes (``inert``)
still applied, since the bad configuration holds them -- must be GOOD. When it is BAD, the inert differences
that make it BAD (isolated by ``dd`` between the repair without and with them) are not harmless after all:
they become changes and the search runs again (every probe memoised), until the answer verifies. An answer
that still fails its verification is reported as :attr:`BisectStatus.INTERACTION`, with the sets and the
measured values in the notes; one whose verification could not be judged is ambiguous.

For ``c`` culprit changes among ``n`` it needs at most :func:`probe_bound` probes (the two endpoints and the
verification included) when no probe is UNRESOLVED and no inert difference turns out to be a change
(:attr:`Culprits.probe_bound` adds the rounds after such a finding); UNRESOLVED probes only cost more probes,
and a difference that cannot be narrowed because of them is reported as ambiguous.

Written here rather than taken from a library: picire (last release 21.8, Aug 2021) implements ddmin and a
parallel ddmin with a two-valued outcome, not isolating ``dd`` with UNRESOLVED; debuggingbook's
``DeltaDebugger.min_arg_diff`` is isolating ``dd`` but is teaching code for function arguments, not a
library to depend on. This module imports only the standard library, so it can be read and tested alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal

ChangeSet = frozenset[str]


class ProbeOutcome(str, Enum):
    """A probe's verdict; the values are git bisect's marks, as written in a bisect log."""

    GOOD = "good"
    BAD = "bad"
    UNRESOLVED = "skip"


class BisectStatus(str, Enum):
    """How a bisect ended."""

    ISOLATED = "isolated"  # breaking sets (and a repair set) found
    GOOD_NOT_GOOD = "good-not-good"  # the good configuration is not judged GOOD
    BAD_NOT_BAD = "bad-not-bad"  # the bad configuration is not judged BAD
    AMBIGUOUS = "ambiguous"  # UNRESOLVED probes kept a difference from being narrowed
    INTERACTION = "interaction"  # an answer failed its verification (the sets and the measured values: notes)


@dataclass(frozen=True)
class Answer:
    """What an oracle says about one configuration."""

    outcome: ProbeOutcome
    detail: str = ""
    cached: bool = False  # answered without a new measurement


@dataclass
class Probe:
    """One configuration the search asked about, in the order asked."""

    applied: tuple[str, ...]  # change names, in difference order
    outcome: ProbeOutcome
    detail: str = ""
    cached: bool = False
    verifies: Literal["breaking", "repair"] | None = None  # asked to verify an answer (see :class:`Verification`)


Oracle = Callable[[ChangeSet], Answer]
BisectProgress = Callable[[str], None]


class ProbeMemo:
    """Asks the oracle once per configuration and keeps every probe in order."""

    def __init__(self, order: Sequence[str], oracle: Oracle):
        self.order = list(order)
        self.oracle = oracle
        self.known: dict[ChangeSet, ProbeOutcome] = {}
        self.number: dict[ChangeSet, int] = {}  # configuration -> its probe's number (1-based, in asking order)
        self.probes: list[Probe] = []

    def sorted(self, config: ChangeSet) -> tuple[str, ...]:
        return tuple(c for c in self.order if c in config)

    def peek(self, config: ChangeSet) -> ProbeOutcome | None:
        return self.known.get(config)

    def __call__(self, config: ChangeSet) -> ProbeOutcome:
        config = frozenset(config)
        if config not in self.known:
            answer = self.oracle(config)
            self.known[config] = answer.outcome
            self.probes.append(Probe(self.sorted(config), answer.outcome, answer.detail, answer.cached))
            self.number[config] = len(self.probes)
        return self.known[config]

    def verify(self, config: ChangeSet, check: Literal["breaking", "repair"]) -> ProbeOutcome:
        """Ask the oracle about ``config`` again, with everything known by now (a verification): one probe more.

        A configuration probed before is asked anew (the oracle judges its measurement against the final limit and
        noise estimate, sampling it more if needed); its latest verdict is what the search knows from then on.
        """
        config = frozenset(config)
        answer = self.oracle(config)
        self.known[config] = answer.outcome
        self.probes.append(Probe(self.sorted(config), answer.outcome, answer.detail, answer.cached, check))
        self.number[config] = len(self.probes)
        return answer.outcome


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


def probe_bound(culprits: int, changes: int, *, breaking: int | None = None) -> int:
    """``2·c·⌈log2 n⌉ + 2 + c + (b + 1)``: most probes for ``c`` culprit changes among ``n`` without UNRESOLVED probes.

    ``2·c·⌈log2 n⌉ + 2`` isolates the causes (endpoints included); ``c`` more check that the repair set is
    1-minimal; ``b + 1`` verify the answers (one probe per breaking set, one for the repair set; ``b ≤ c``).

    Args:
        culprits: changes in the breaking sets.
        changes: changes searched.
        breaking: breaking sets (default: ``c``, the most there can be).
    """
    c = max(culprits, 1)
    b = c if breaking is None else breaking
    return 2 * c * math.ceil(math.log2(max(changes, 1))) + 2 + c + b + 1


def _reduce(passing: ChangeSet, failing: ChangeSet, parts: list[list[str]], test: ProbeMemo) -> tuple | None:
    """One step of dd: the next (passing, failing, n), or None when no case applies at this granularity."""
    n = len(parts)

    def shrink_to_part() -> tuple | None:  # cases 1 and 2, from what is known so far
        for part in parts:
            grown, cut = passing | set(part), failing - set(part)
            if test.peek(grown) is ProbeOutcome.BAD:
                return passing, grown, 2
            if test.peek(cut) is ProbeOutcome.GOOD:
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
        if test.peek(grown) is ProbeOutcome.GOOD:
            return grown, failing, max(n - 1, 2)
        if test.peek(cut) is ProbeOutcome.BAD:
            return passing, cut, max(n - 1, 2)
    return None


def isolate(
    passing: ChangeSet, failing: ChangeSet, *, test: ProbeMemo, progress: BisectProgress | None = None
) -> tuple[ChangeSet, ChangeSet]:
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


def shrink(items: Sequence[str], holds: Callable[[ChangeSet], bool]) -> tuple[str, ...]:
    """A 1-minimal subset of ``items`` (for which ``holds`` is true) for which ``holds`` stays true.

    Drops one item at a time while the rest still holds; at the end no single item can be dropped.
    """
    kept = list(items)
    dropped = True
    while dropped:
        dropped = False
        for item in kept:
            rest = [k for k in kept if k != item]
            if holds(frozenset(rest)):
                kept, dropped = rest, True
                break
    return tuple(kept)


@dataclass(frozen=True)
class Verification:
    """One answer checked by a probe of the configuration it names."""

    check: Literal["breaking", "repair"]  # a breaking set applied to good; the repair set reverted from bad
    changes: tuple[str, ...]  # the set checked
    applied: tuple[str, ...]  # the configuration probed (names applied to the good configuration)
    expected: ProbeOutcome  # BAD for a breaking set, GOOD for the repair set
    outcome: ProbeOutcome
    probe: int  # the number of the probe that measured it (1-based, as in :attr:`Culprits.probes`)
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome is self.expected


@dataclass(frozen=True)
class Round:
    """One search over a list of changes; later rounds follow inert differences found to be changes."""

    changes: int  # changes searched
    culprits: int  # changes in the breaking sets found
    breaking: int  # breaking sets found
    inert: int  # inert differences held by the bad configuration
    isolating: int = 0  # inert differences this round's search started from after isolating them (0: first)
    among: int = 0  # inert differences they were isolated among


@dataclass
class Culprits:
    """What :func:`find_culprits` established (see the module docstring for the two kinds of answer)."""

    status: BisectStatus
    breaking: list[tuple[str, ...]] = field(default_factory=list)  # each breaks the good configuration
    repair: tuple[str, ...] | None = None  # reverted from the bad configuration, repairs it (None: unknown)
    probes: list[Probe] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    verifications: list[Verification] = field(default_factory=list)  # of the last round's answers
    promoted: list[str] = field(default_factory=list)  # inert differences that turned out to be changes
    rounds: list[Round] = field(default_factory=list)

    @property
    def verified(self) -> bool:
        """Every answer was checked by a probe and held (and there was a repair set to check)."""
        return bool(self.verifications) and all(v.ok for v in self.verifications) and any(
            v.check == "repair" for v in self.verifications)

    @property
    def probe_bound(self) -> int:
        """The most probes this search could need without UNRESOLVED probes: :func:`probe_bound` per round, plus
        isolating the inert differences that became changes (``2·p·⌈log2 k⌉ + 1`` for ``p`` among ``k``: the
        probe with all ``k`` and the isolation)."""
        if not self.rounds:
            return probe_bound(0, 0)
        return sum(probe_bound(r.culprits, r.changes, breaking=r.breaking)
                   + (2 * r.isolating * math.ceil(math.log2(max(r.among, 1))) + 1 if r.isolating else 0)
                   for r in self.rounds)

    @property
    def culprits(self) -> list[str]:
        """All changes of all breaking sets, each once, in the order found."""
        out: list[str] = []
        for cause in self.breaking:
            out.extend(c for c in cause if c not in out)
        return out

    @property
    def unresolved(self) -> list[tuple[str, ...]]:
        return [p.applied for p in self.probes if p.outcome is ProbeOutcome.UNRESOLVED]


def _with_partners(diff: ChangeSet, context: ChangeSet, test: ProbeMemo,
                   progress: BisectProgress | None) -> tuple[ChangeSet, str]:
    """Grow an isolated change into a failing cause: the partners it needs from ``context``."""
    cause = frozenset(diff)
    while True:
        alone = test(cause)
        if alone is ProbeOutcome.BAD:
            return cause, ""
        if alone is ProbeOutcome.UNRESOLVED:
            return cause, f"{'+'.join(test.sorted(cause))} applied alone could not be judged; partners not checked"
        if progress:
            progress(f"{'+'.join(test.sorted(cause))} alone is good: looking for the settings it interacts with")
        passing, failing = isolate(cause, cause | context, test=test, progress=progress)
        partners = failing - passing
        cause = cause | partners
        context = passing - cause
        if len(partners) > 1:
            return cause, f"could not separate {', '.join(test.sorted(partners))} (unresolved probes)"


def _search(order: Sequence[str], test: ProbeMemo, result: Culprits, progress: BisectProgress | None) -> None:
    """One round: the breaking sets and the repair set among ``order`` (good = none applied, bad = all applied)."""
    everything = frozenset(order)
    result.status, result.breaking, result.repair = BisectStatus.ISOLATED, [], None
    if test(frozenset()) is not ProbeOutcome.GOOD:
        result.status = BisectStatus.GOOD_NOT_GOOD
        result.notes.append("the good configuration is not judged good; nothing to isolate")
        return
    if test(everything) is not ProbeOutcome.BAD:
        result.status = BisectStatus.BAD_NOT_BAD
        result.notes.append("the bad configuration is not judged bad; nothing to isolate")
        return
    reverted: ChangeSet = frozenset()
    while True:
        rest = everything - reverted
        if reverted:
            verdict = test(rest)
            if verdict is ProbeOutcome.GOOD:
                break
            if verdict is ProbeOutcome.UNRESOLVED:
                result.notes.append("the bad configuration with the culprits reverted could not be judged; "
                                    "there may be more culprits, and no repair set is established")
                return
        passing, failing = isolate(frozenset(), rest, test=test, progress=progress)
        diff = failing - passing
        if len(diff) > 1:
            result.status = BisectStatus.AMBIGUOUS
            result.breaking.append(test.sorted(diff))
            result.notes.append(f"could not narrow {', '.join(test.sorted(diff))} further (unresolved probes)")
            return
        cause, note = _with_partners(diff, passing, test, progress)
        if note:
            result.status = BisectStatus.AMBIGUOUS
            result.breaking.append(test.sorted(cause))
            result.notes.append(note)
            return
        if len(cause) > 1:
            cause = frozenset(shrink(test.sorted(cause), lambda c: test(c) is ProbeOutcome.BAD))
        result.breaking.append(test.sorted(cause))
        reverted |= cause
    if progress and len(reverted) > 1:
        progress(f"checking which of {', '.join(test.sorted(reverted))} must be reverted to repair the bad "
                 "configuration")
    result.repair = shrink(test.sorted(reverted), lambda r: test(everything - r) is ProbeOutcome.GOOD)


def _verify(order: Sequence[str], inert: Sequence[str], test: ProbeMemo, result: Culprits,
            progress: BisectProgress | None) -> list[Verification]:
    """Probe each answer as it is meant: breaking sets applied to good, the repair set reverted from bad as it is."""
    checks = []
    for cause in result.breaking:
        config = frozenset(cause)
        checks.append(("breaking", cause, config, ProbeOutcome.BAD))
    if result.repair is not None:
        config = (frozenset(order) - set(result.repair)) | set(inert)
        if progress:
            shown = ", ".join(result.repair) or "nothing"
            held = f" (the bad configuration's {', '.join(inert)} kept)" if inert else ""
            progress(f"verifying: the bad configuration with {shown} reverted{held} must be good")
        checks.append(("repair", result.repair, config, ProbeOutcome.GOOD))
    out = []
    for check, changes, config, expected in checks:
        outcome = test.verify(config, check)
        probe = test.probes[-1]
        out.append(Verification(check, tuple(changes), test.sorted(config), expected, outcome, test.number[config],
                                probe.detail))
    return out


def _hidden_culprits(passing: ChangeSet, hidden: Sequence[str], test: ProbeMemo,
                     progress: BisectProgress | None) -> list[str]:
    """The inert differences that break ``passing`` (GOOD) when added: ``dd`` between it and it with all of them."""
    failing = passing | set(hidden)
    if test(failing) is not ProbeOutcome.BAD:
        return []
    low, high = isolate(passing, failing, test=test, progress=progress)
    return [n for n in hidden if n in high - low]


def _measured(v: Verification) -> str:
    return f"probe {v.probe}: {v.outcome.name}" + (f", {v.detail}" if v.detail else "")


def find_culprits(order: Sequence[str], oracle: Oracle, *, inert: Sequence[str] = (),
                  progress: BisectProgress | None = None) -> Culprits:
    """Breaking sets and a verified repair set among ``order`` (good = none applied, bad = all applied).

    Args:
        order: the changes, in the order they are split.
        oracle: judges a configuration (a set of names applied to the good configuration).
        inert: requested differences set aside as not changes; the bad configuration holds them, so the repair set
            is verified with them applied, and those that make it fail become changes (module docstring).
        progress: called with one line per step.
    """
    test = ProbeMemo([*order, *inert], oracle)
    result = Culprits(BisectStatus.ISOLATED, probes=test.probes)
    changes, hidden = list(order), list(inert)
    isolating = among = 0
    failed: list[Verification] = []

    def promote(found: list[str]) -> str:
        """Make inert differences changes for the next round; the note's ending."""
        nonlocal hidden, isolating, among
        result.promoted += found
        isolating, among = len(found), len(hidden)
        changes.extend(found)
        hidden = [n for n in hidden if n not in found]
        return f"bisect continues with {', '.join(found)} as {'a change' if len(found) == 1 else 'changes'}"

    while True:
        _search(changes, test, result, progress)
        result.rounds.append(Round(len(changes), len(result.culprits), len(result.breaking), len(hidden), isolating,
                                   among))
        everything = frozenset(changes)
        if result.status is BisectStatus.BAD_NOT_BAD and hidden and test.peek(everything) is ProbeOutcome.GOOD:
            found = _hidden_culprits(everything, hidden, test, progress)  # the bad configuration holds them
            if found:
                result.notes[-1] = (f"the changes applied to the good configuration judge GOOD, but BAD with "
                                    f"{', '.join(found)} too, as the bad configuration holds them: {promote(found)}")
                continue
        if result.status is not BisectStatus.ISOLATED:
            result.verifications = []
            return result
        result.verifications = _verify(changes, hidden, test, result, progress)
        failed = [v for v in result.verifications if not v.ok]
        if not failed or result.repair is None:  # no repair set: the repaired configuration could not be judged
            if failed:
                break
            return result
        repair = next((v for v in failed if v.check == "repair"), None)
        if any(v.check == "breaking" for v in failed) or repair is None:
            break
        if repair.outcome is ProbeOutcome.UNRESOLVED:
            result.status = BisectStatus.AMBIGUOUS
            result.notes.append(f"the repair set {' + '.join(repair.changes) or '(none)'}, reverted from the bad "
                                f"configuration, could not be judged ({_measured(repair)}); it is not verified")
            return result
        repaired = everything - set(repair.changes)
        if not hidden or test(repaired) is not ProbeOutcome.GOOD:
            break
        if progress:
            progress(f"the repair set fails with {', '.join(hidden)} kept: looking for the ones that matter")
        found = _hidden_culprits(repaired, hidden, test, progress)
        if not found:
            break
        without = test.probes[test.number[repaired] - 1]
        names = ", ".join(found)
        result.notes.append(
            f"not a change alone from either end, but it matters: {names}. The repair set "
            f"{' + '.join(repair.changes) or '(none)'} reverted from the bad configuration is {repair.outcome.name} "
            f"with {names} kept ({_measured(repair)}) and GOOD without (probe {test.number[repaired]}: "
            f"{without.detail}); {promote(found)}")
    result.status = BisectStatus.INTERACTION
    for v in failed:
        what = ("applied to the good configuration" if v.check == "breaking"
                else "reverted from the bad configuration")
        result.notes.append(f"the {'breaking' if v.check == 'breaking' else 'repair'} set "
                            f"{' + '.join(v.changes) or '(none)'} {what} measured {v.outcome.name}, not "
                            f"{v.expected.name} ({_measured(v)}): the changes interact beyond what the search "
                            "isolates; the answer is not isolated")
    return result
