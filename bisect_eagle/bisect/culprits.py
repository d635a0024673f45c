"""The answers of a bisect, verified: breaking sets and the repair set found by delta debugging
(:mod:`.ddmin`), each re-measured before it is reported (the repair set reverted from the bad
configuration must judge GOOD, each breaking set applied to the good one BAD), with the not-changes
that turn out to matter turned into changes and searched again. Standard library only, as
:mod:`.ddmin`."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from bisect_eagle.bisect.ddmin import (
    BisectProgress,
    BisectStatus,
    ChangeSet,
    Oracle,
    Probe,
    ProbeMemo,
    ProbeOutcome,
    isolate,
    probe_bound,
    shrink,
)


@dataclass(frozen=True)
class Verification:
    """One answer checked by a probe of the configuration it names."""

    # a breaking set applied to good; the repair set reverted from bad
    check: Literal["breaking", "repair"]
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
    """One search over a list of changes; later rounds follow inert differences found to be
    changes."""

    changes: int  # changes searched
    culprits: int  # changes in the breaking sets found
    breaking: int  # breaking sets found
    inert: int  # inert differences held by the bad configuration
    # inert differences this round's search started from after isolating them (0: first)
    isolating: int = 0
    among: int = 0  # inert differences they were isolated among
    # completeness checks this round could ask (:func:`completeness_checks`, after each set found)
    checks: int = 0


@dataclass
class Culprits:
    """What :func:`find_culprits` established (see the module docstring for the two kinds of
    answer)."""

    status: BisectStatus
    # each breaks the good configuration
    breaking: list[tuple[str, ...]] = field(default_factory=list)
    # reverted from the bad configuration, repairs it (None: unknown)
    repair: tuple[str, ...] | None = None
    probes: list[Probe] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    verifications: list[Verification] = field(default_factory=list)  # of the last round's answers
    # inert differences that turned out to be changes
    promoted: list[str] = field(default_factory=list)
    rounds: list[Round] = field(default_factory=list)
    # could hold another breaking set; not judged
    unknown: list[ChangeSet] = field(default_factory=list)
    checks: int = 0  # completeness checks of the current round

    @property
    def verified(self) -> bool:
        """Every answer was checked by a probe and held (and there was a repair set to check)."""
        return (
            bool(self.verifications)
            and all(v.ok for v in self.verifications)
            and any(v.check == "repair" for v in self.verifications)
        )

    @property
    def probe_bound(self) -> int:
        """The most probes this search could need without UNRESOLVED probes: :func:`probe_bound` per
        round, its completeness checks, plus isolating the inert differences that became changes
        (``2·p·⌈log2 k⌉ + 1`` for ``p`` among ``k``: the probe with all ``k`` and the isolation)."""
        if not self.rounds:
            return probe_bound(0, 0)
        return sum(
            probe_bound(r.culprits, r.changes, breaking=r.breaking)
            + r.checks
            + (2 * r.isolating * math.ceil(math.log2(max(r.among, 1))) + 1 if r.isolating else 0)
            for r in self.rounds
        )

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


def expected_probes(changes: int, likely: int) -> int:
    """About how many distinct configurations a search of ``changes`` changes judges when ``likely``
    of them are culprits (at least one), each a breaking set of its own: the two endpoints, ``⌈log2
    n⌉`` to isolate each, and a completeness check after each (its repair set and verification are
    answered by the same configurations)."""
    c = max(1, min(likely, changes))
    return 2 + c * math.ceil(math.log2(max(changes, 2))) + c


def _with_partners(
    diff: ChangeSet, context: ChangeSet, test: ProbeMemo, progress: BisectProgress | None
) -> tuple[ChangeSet, str]:
    """Grow an isolated change into a failing cause: the partners it needs from ``context``."""
    cause = frozenset(diff)
    while True:
        alone = test(cause)
        if alone is ProbeOutcome.BAD:
            return cause, ""
        if alone is ProbeOutcome.UNRESOLVED:
            return (
                cause,
                f"{'+'.join(test.sorted(cause))} applied alone could not be judged; partners not "
                "checked",
            )
        if progress:
            progress(
                f"{'+'.join(test.sorted(cause))} alone is good: looking for the settings it "
                "interacts with"
            )
        passing, failing = isolate(cause, cause | context, test=test, progress=progress)
        partners = failing - passing
        cause = cause | partners
        context = passing - cause
        if len(partners) > 1:
            return (
                cause,
                f"could not separate {', '.join(test.sorted(partners))} (unresolved probes)",
            )


def minimal_hitting_sets(sets: Sequence[ChangeSet]) -> list[ChangeSet]:
    """Every minimal set of changes that holds at least one change of each of ``sets`` (all
    non-empty): reverting one of them from the bad configuration leaves none of ``sets`` whole.
    Smallest first, then in name order."""
    if not sets:
        return [frozenset()]
    hits = {frozenset(choice) for choice in itertools.product(*(sorted(s) for s in sets))}
    minimal = [h for h in hits if not any(other < h for other in hits)]
    return sorted(minimal, key=lambda h: (len(h), sorted(h)))


def completeness_checks(
    everything: ChangeSet, found: Sequence[ChangeSet], masked: dict[str, tuple[str, ...]]
) -> list[ChangeSet]:
    """The configurations that hold every breaking set not found yet, if there is one (module
    docstring).

    A breaking set not in ``found`` holds no found set whole (it would not be minimal), so it lies
    in the bad configuration with a minimal hitting set of ``found`` reverted. One that a change
    hides in the bad configuration (``masked``: change -> the changes that hide it there, as the
    plans show) lies there with its maskers reverted as well.

    Args:
        everything: the bad configuration (every change applied).
        found: the breaking sets found so far.
        masked: each change hidden in the bad configuration, and by what.
    """
    out: list[ChangeSet] = []
    for hit in minimal_hitting_sets(found):
        rest = everything - hit
        variants = [rest] + [
            rest - set(by)
            for name, by in sorted(masked.items())
            if name in rest and by and set(by) <= rest
        ]
        out += [v for v in variants if v and v not in out]
    return out


def _search(
    order: Sequence[str],
    test: ProbeMemo,
    result: Culprits,
    progress: BisectProgress | None,
    masked: dict[str, tuple[str, ...]],
) -> None:
    """One round: every minimal breaking set and the repair set among ``order`` (good = none
    applied, bad = all)."""
    everything = frozenset(order)
    result.status, result.breaking, result.repair, result.unknown = (
        BisectStatus.ISOLATED,
        [],
        None,
        [],
    )
    if test(frozenset()) is not ProbeOutcome.GOOD:
        result.status = BisectStatus.GOOD_NOT_GOOD
        result.notes.append("the good configuration is not judged good; nothing to isolate")
        return
    if test(everything) is not ProbeOutcome.BAD:
        result.status = BisectStatus.BAD_NOT_BAD
        result.notes.append("the bad configuration is not judged bad; nothing to isolate")
        return
    found: list[ChangeSet] = []
    witness: ChangeSet | None = everything
    while witness is not None:
        passing, failing = isolate(frozenset(), witness, test=test, progress=progress)
        diff = failing - passing
        if len(diff) > 1:
            _unsettled(
                result, test, failing, f"could not narrow {', '.join(test.sorted(diff))} further"
            )
            return
        cause, note = _with_partners(diff, passing, test, progress)
        if note:
            _unsettled(result, test, cause | passing, note)
            return
        if len(cause) > 1:
            cause = frozenset(shrink(test.sorted(cause), lambda c: test(c) is ProbeOutcome.BAD))
        if cause in found:  # only unresolved probes can lead back to a set found before
            result.status = BisectStatus.AMBIGUOUS
            result.notes.append(
                f"the search led back to {' + '.join(test.sorted(cause))} (unresolved probes)"
            )
            return
        found.append(cause)
        result.breaking.append(test.sorted(cause))
        witness = _next_witness(everything, found, masked, test, result, progress)
    if result.unknown:
        result.status = BisectStatus.PARTIAL
        shown = "; ".join(" + ".join(test.sorted(u)) for u in result.unknown)
        result.notes.append(
            f"partial: another breaking set may lie within {shown} (not judged: "
            f"{'the budget is spent' if test.spent() else 'unresolved probes'})"
        )
    if progress and len(found) > 1:
        progress(
            f"checking which of {', '.join(test.sorted(frozenset().union(*found)))} must be "
            "reverted to repair the bad configuration"
        )
    union = test.sorted(frozenset().union(*found))
    repaired = everything - set(union)
    if repaired in result.unknown or test.peek(repaired) is ProbeOutcome.UNRESOLVED:
        result.notes.append(
            "the bad configuration with every breaking set reverted could not be judged; no repair "
            "set is established"
        )
        return
    result.repair = shrink(union, lambda r: test(everything - r) is ProbeOutcome.GOOD)


def _unsettled(result: Culprits, test: ProbeMemo, region: ChangeSet, why: str) -> None:
    """A breaking set lies in ``region`` (a BAD configuration) but could not be isolated: it is
    :attr:`Culprits.unknown`, never reported as a breaking set. ``partial`` when the budget is
    spent, else ``ambiguous`` (unresolved probes)."""
    spent = test.spent()
    result.status = BisectStatus.PARTIAL if spent else BisectStatus.AMBIGUOUS
    result.unknown.append(region)
    result.notes.append(
        f"{why} ({'the budget is spent' if spent else 'unresolved probes'}); a breaking set lies "
        f"within {' + '.join(test.sorted(region))}"
    )


def _next_witness(
    everything: ChangeSet,
    found: list[ChangeSet],
    masked: dict[str, tuple[str, ...]],
    test: ProbeMemo,
    result: Culprits,
    progress: BisectProgress | None,
) -> ChangeSet | None:
    """A configuration judged BAD that holds no found set whole (another breaking set lies in it),
    or None when every completeness check is GOOD or could not be judged (those are
    :attr:`Culprits.unknown`)."""
    checks = completeness_checks(everything, found, masked)
    result.checks += len(checks)
    if progress:
        sets = "; ".join(" + ".join(test.sorted(f)) for f in found)
        progress(
            f"found {sets}: {len(checks)} configuration{'' if len(checks) == 1 else 's'} to judge "
            "for another breaking set"
        )
    result.unknown = []
    for config in checks:
        if test.spent():
            result.unknown.append(config)
            continue
        verdict = test(config)
        if verdict is ProbeOutcome.BAD:
            result.unknown = []
            return config
        if verdict is ProbeOutcome.UNRESOLVED:
            result.unknown.append(config)
    return None


def _verify(
    order: Sequence[str],
    inert: Sequence[str],
    test: ProbeMemo,
    result: Culprits,
    progress: BisectProgress | None,
) -> list[Verification]:
    """Probe each answer as it is meant: breaking sets applied to good, the repair set reverted from
    bad as it is."""
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
        out.append(
            Verification(
                check,
                tuple(changes),
                test.sorted(config),
                expected,
                outcome,
                test.number[config],
                probe.detail,
            )
        )
    return out


def _hidden_culprits(
    passing: ChangeSet, hidden: Sequence[str], test: ProbeMemo, progress: BisectProgress | None
) -> list[str]:
    """The inert differences that break ``passing`` (GOOD) when added: ``dd`` between it and it with
    all of them."""
    failing = passing | set(hidden)
    if test(failing) is not ProbeOutcome.BAD:
        return []
    low, high = isolate(passing, failing, test=test, progress=progress)
    return [n for n in hidden if n in high - low]


def _measured(v: Verification) -> str:
    return f"probe {v.probe}: {v.outcome.name}" + (f", {v.detail}" if v.detail else "")


def find_culprits(
    order: Sequence[str],
    oracle: Oracle,
    *,
    inert: Sequence[str] = (),
    progress: BisectProgress | None = None,
    masked: dict[str, tuple[str, ...]] | None = None,
    spent: Callable[[], bool] | None = None,
) -> Culprits:
    """Every minimal breaking set and a verified repair set among ``order`` (good = none applied,
    bad = all).

    Args:
        order: the changes, in the order they are split.
        oracle: judges a configuration (a set of names applied to the good configuration).
        inert: requested differences set aside as not changes; the bad configuration holds them, so
            the repair set is verified with them applied, and those that make it fail become changes
            (module docstring).
        progress: called with one line per step.
        masked: each change hidden in the bad configuration, and by which changes (the plans'
            masks): where another breaking set may hide.
        spent: whether the bisect's budget is spent (no more probes are asked; what is not known is
            reported).
    """
    test = ProbeMemo([*order, *inert], oracle, spent=spent)
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
        return (
            f"bisect continues with {', '.join(found)} as "
            f"{'a change' if len(found) == 1 else 'changes'}"
        )

    while True:
        result.checks = 0
        _search(changes, test, result, progress, masked or {})
        result.rounds.append(
            Round(
                len(changes),
                len(result.culprits),
                len(result.breaking),
                len(hidden),
                isolating,
                among,
                result.checks,
            )
        )
        everything = frozenset(changes)
        if (
            result.status is BisectStatus.BAD_NOT_BAD
            and hidden
            and test.peek(everything) is ProbeOutcome.GOOD
        ):
            # the bad configuration holds them
            found = _hidden_culprits(everything, hidden, test, progress)
            if found:
                result.notes[-1] = (
                    "the changes applied to the good configuration judge GOOD, but BAD with "
                    f"{', '.join(found)} too, as the bad configuration holds them: {promote(found)}"
                )
                continue
        if result.status not in (BisectStatus.ISOLATED, BisectStatus.PARTIAL):
            result.verifications = []
            return result
        result.verifications = _verify(changes, hidden, test, result, progress)
        failed = [v for v in result.verifications if not v.ok]
        # no repair set: the repaired configuration could not be judged
        if not failed or result.repair is None:
            if failed:
                break
            return result
        repair = next((v for v in failed if v.check == "repair"), None)
        if any(v.check == "breaking" for v in failed) or repair is None:
            break
        if repair.outcome is ProbeOutcome.UNRESOLVED:
            result.status = BisectStatus.AMBIGUOUS
            result.notes.append(
                f"the repair set {' + '.join(repair.changes) or '(none)'}, reverted from the bad "
                f"configuration, could not be judged ({_measured(repair)}); it is not verified"
            )
            return result
        repaired = everything - set(repair.changes)
        if not hidden or test(repaired) is not ProbeOutcome.GOOD:
            break
        if progress:
            progress(
                f"the repair set fails with {', '.join(hidden)} kept: looking for the ones that "
                "matter"
            )
        found = _hidden_culprits(repaired, hidden, test, progress)
        if not found:
            break
        without = test.probes[test.number[repaired] - 1]
        names = ", ".join(found)
        result.notes.append(
            f"not a change alone from either end, but it matters: {names}. The repair set "
            f"{' + '.join(repair.changes) or '(none)'} reverted from the bad configuration is "
            f"{repair.outcome.name} with {names} kept ({_measured(repair)}) and GOOD without "
            f"(probe {test.number[repaired]}: {without.detail}); {promote(found)}"
        )
    result.status = BisectStatus.INTERACTION
    for v in failed:
        what = (
            "applied to the good configuration"
            if v.check == "breaking"
            else "reverted from the bad configuration"
        )
        result.notes.append(
            f"the {'breaking' if v.check == 'breaking' else 'repair'} set "
            f"{' + '.join(v.changes) or '(none)'} {what} measured {v.outcome.name}, not "
            f"{v.expected.name} ({_measured(v)}): the changes interact beyond what the search "
            "isolates; the answer is not isolated"
        )
    return result
