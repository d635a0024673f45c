"""Isolating delta debugging between a good and a bad configuration: three-valued, memoised,
self-contained.

A *change* is a name (one setting, or a group of settings applied together); a *configuration* is
the set of changes applied to the good configuration: the empty set is the good configuration, the
set of every change the bad one. An oracle judges a configuration GOOD, BAD or UNRESOLVED (it
crashed or could not be judged: git bisect's ``skip``).

:func:`isolate` is ``dd`` of Zeller & Hildebrandt (TSE 2002, "Simplifying and Isolating
Failure-Inducing Input"): split the current difference into ``n`` parts; a part added to the passing
side that fails, or removed from the failing side that passes, becomes the new difference (cases 1,
2); otherwise a part that moves one side without flipping it shrinks the difference by that part
(cases 3, 4); otherwise the granularity doubles, until the difference is 1-minimal. Probes are
issued lazily and memoised, so at ``n = 2`` one probe halves the difference (``c✓ ∪ Δ1`` *is* ``c✗ −
Δ2``): a single culprit among ``n`` changes costs ``⌈log2 n⌉`` probes.

:func:`find_culprits` (:mod:`.culprits`) answers two questions, which can have different answers:

- **breaking sets**: *every* minimal set of changes that, *applied to the good configuration*,
  breaks it (each 1-minimal: remove any one change and it no longer breaks the good configuration).
  The first is isolated by ``dd`` in the bad configuration; when the isolated change is harmless
  alone, its interacting partners are isolated among the changes that were on the passing side. Then
  the rest of the structure is searched: a breaking set not found yet holds no found set whole, so
  it lies in the bad configuration with a *minimal hitting set* of the found sets reverted (one
  change of each reverted: for ``{A, B}`` found, the bad configuration without ``A``, and without
  ``B``; this is how ``{B, C}`` overlapping ``{A, B}`` is found). Each such configuration is probed;
  one that is BAD holds another breaking set, isolated by ``dd`` in it; when all are GOOD no other
  breaking set remains. A set a change hides in the bad configuration (the plans' masks: EAGLE hides
  the wiring) is looked for with its maskers reverted as well. This assumes that a set which breaks
  the good configuration still breaks it with more changes applied, except where the plans show a
  change hiding another; a compensation the plans do not show (a change that speeds up what another
  slows down) can still hide a set.
- **the repair set**: a set of changes whose *removal from the bad configuration* repairs it,
  1-minimal (put any one back and it fails again), found by shrinking the union of the breaking sets
  one change at a time. Two changes that fail only together form one breaking set of two, while
  reverting either one alone repairs the bad configuration, so the repair set holds one of them.

The search ends when every check is GOOD (``isolated``: complete) or when the budget is spent or a
check cannot be judged (``partial``, naming the configurations that may still hold another breaking
set).

**Every answer is verified before it is returned as isolated**, by one probe more each, asked of the
oracle anew once the search is done (so judged against everything measured by then: the final limit
and noise estimate). Each breaking set, applied to the good configuration, must be BAD; the repair
set, reverted from the *bad configuration as it is* -- with the differences the caller set aside as
not changes (``inert``) still applied, since the bad configuration holds them -- must be GOOD. When
it is BAD, the inert differences that make it BAD (isolated by ``dd`` between the repair without and
with them) are not harmless after all: they become changes and the search runs again (every probe
memoised), until the answer verifies. An answer that still fails its verification is reported as
:attr:`BisectStatus.INTERACTION`, with the sets and the measured values in the notes; one whose
verification could not be judged is ambiguous.

For ``c`` culprit changes among ``n`` it needs at most :func:`probe_bound` probes (the two endpoints
and the verification included) plus its completeness checks when no probe is UNRESOLVED and no inert
difference turns out to be a change (:attr:`Culprits.probe_bound
<bisect_eagle.bisect.culprits.Culprits.probe_bound>` adds the checks and the rounds after such a
finding); UNRESOLVED probes only cost more probes, and a difference that cannot be narrowed because
of them is reported as ambiguous.

Written here rather than taken from a library: picire (last release 21.8, Aug 2021) implements ddmin
and a parallel ddmin with a two-valued outcome, not isolating ``dd`` with UNRESOLVED;
debuggingbook's ``DeltaDebugger.min_arg_diff`` is isolating ``dd`` but is teaching code for function
arguments, not a library to depend on. This module imports only the standard library, so it can be
read and tested alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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

    ISOLATED = "isolated"  # every minimal breaking set found (completeness shown), and a repair set
    # breaking sets found and verified; whether another one remains is not known (notes)
    PARTIAL = "partial"
    GOOD_NOT_GOOD = "good-not-good"  # the good configuration is not judged GOOD
    BAD_NOT_BAD = "bad-not-bad"  # the bad configuration is not judged BAD
    AMBIGUOUS = "ambiguous"  # UNRESOLVED probes kept a difference from being narrowed
    # an answer failed its verification (the sets and the measured values: notes)
    INTERACTION = "interaction"


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
    # asked to verify an answer (see :class:`Verification`)
    verifies: Literal["breaking", "repair"] | None = None


Oracle = Callable[[ChangeSet], Answer]
BisectProgress = Callable[[str], None]


class ProbeMemo:
    """Asks the oracle once per configuration and keeps every probe in order."""

    def __init__(
        self, order: Sequence[str], oracle: Oracle, *, spent: Callable[[], bool] | None = None
    ):
        self.order = list(order)
        self.oracle = oracle
        self.spent: Callable[[], bool] = spent or (lambda: False)
        self.known: dict[ChangeSet, ProbeOutcome] = {}
        # configuration -> its probe's number (1-based, in asking order)
        self.number: dict[ChangeSet, int] = {}
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
            self.probes.append(
                Probe(self.sorted(config), answer.outcome, answer.detail, answer.cached)
            )
            self.number[config] = len(self.probes)
        return self.known[config]

    def verify(self, config: ChangeSet, check: Literal["breaking", "repair"]) -> ProbeOutcome:
        """Ask the oracle about ``config`` again, with everything known by now (a verification): one
        probe more.

        A configuration probed before is asked anew (the oracle judges its measurement against the
        final limit and noise estimate, sampling it more if needed); its latest verdict is what the
        search knows from then on.
        """
        config = frozenset(config)
        answer = self.oracle(config)
        self.known[config] = answer.outcome
        self.probes.append(
            Probe(self.sorted(config), answer.outcome, answer.detail, answer.cached, check)
        )
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
    """Rough number of probes left to isolate one culprit among ``k`` changes (binary search + a
    check)."""
    return math.ceil(math.log2(k)) + 1 if k > 1 else 1


def probe_bound(culprits: int, changes: int, *, breaking: int | None = None) -> int:
    """``2·c·⌈log2 n⌉ + 2 + c + (b + 1)``: most probes for ``c`` culprit changes among ``n`` without
    UNRESOLVED probes.

    ``2·c·⌈log2 n⌉ + 2`` isolates the causes (endpoints included); ``c`` more check that the repair
    set is 1-minimal; ``b + 1`` verify the answers (one probe per breaking set, one for the repair
    set; ``b ≤ c``).

    Args:
        culprits: changes in the breaking sets.
        changes: changes searched.
        breaking: breaking sets (default: ``c``, the most there can be).

    Returns:
        The bound on probes (``c`` taken as at least 1).
    """
    c = max(culprits, 1)
    b = c if breaking is None else breaking
    return 2 * c * math.ceil(math.log2(max(changes, 1))) + 2 + c + b + 1


def _reduce(
    passing: ChangeSet, failing: ChangeSet, parts: list[list[str]], test: ProbeMemo
) -> tuple | None:
    """One step of dd: the next (passing, failing, n), or None when no case applies at this
    granularity."""
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
    passing: ChangeSet,
    failing: ChangeSet,
    *,
    test: ProbeMemo,
    progress: BisectProgress | None = None,
) -> tuple[ChangeSet, ChangeSet]:
    """dd: grow ``passing`` and shrink ``failing`` (known GOOD and BAD) until their difference is
    1-minimal."""
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
