"""The changes a bisect searches: what differs between the good and the bad configuration *as the
engine runs them*.

Settings are flat names as a spec writes them (LiveSettings fields, ``env.NAME``,
``server_args.flag``). A requested difference is set aside as *not a change* only when the engine's
plans show it inert from **both** ends: applied alone to the good configuration it plans the good
configuration's fingerprint, and reverted alone from the bad configuration it plans the bad one's
(and the set of the rest still plans the bad configuration's fingerprint when applied to the good
one). So a setting the engine ignores (``env.*`` or ``concurrency`` on the local engine), an
explicit default equal to the default, the draft's own layer ids written out, or a value the engine
overrides at both ends (``num_draft_tokens`` under ``topk == 1`` on both sides) is not a change.

A difference inert from one end only is a change, *masked* at that end by the settings that hide it
there (:attr:`Change.masked_by`): under ``speculative_algorithm: EAGLE`` the layer ids are unused,
so a wrong wiring in a bad configuration that also says ``EAGLE`` changes nothing until the
algorithm is reverted; with ``topk == 1`` in the good configuration, the bad one's
``num_draft_tokens`` matters only together with its ``topk``. Dropping such a setting because one
end ignores it gives a false repair set.

A change is applied with its requested bad value (in clear: secrets must reach the engine); what is
shown is the plan's effective value, where secrets are already redacted (at a masked end: the value
as it runs with the maskers flipped, i.e. as the repair exposes it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from bisect_eagle.engines.plan import TrialPlan
from bisect_eagle.spec.settings import LiveSettings
from bisect_eagle.tracking.redact import redact_mapping

Side = Literal["good", "bad"]
FlatPlanner = Callable[[dict[str, Any]], TrialPlan]  # flat settings -> the engine's plan


@dataclass(frozen=True)
class Change:
    """One item of the difference: a setting, or a group of settings applied together."""

    name: str  # the setting's name, or the group's names joined by '+'
    # setting -> requested value in the good configuration (None: unset); may be secret
    good: dict[str, Any]
    # setting -> requested value in the bad configuration (None: unset); may be secret
    bad: dict[str, Any]
    # effective (good, bad), redacted
    shown: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    # end -> the changes whose values there hide this one (alone, it plans nothing new at that end)
    masked_by: dict[Side, tuple[str, ...]] = field(default_factory=dict)

    def values(self, side: Side) -> Any:
        """The good or bad value as the engine runs it (a dict of values for a group); secrets
        redacted.

        Args:
            side: ``"good"`` or ``"bad"``.

        Returns:
            The one setting's value, or a dict of setting -> value for a group; a setting
            with a shown form (``shown``) gives that form.
        """
        i = 0 if side == "good" else 1
        raw = redact_mapping(self.good if side == "good" else self.bad)
        resolved = {k: self.shown[k][i] if k in self.shown else v for k, v in raw.items()}
        return next(iter(resolved.values())) if len(resolved) == 1 else resolved

    def to_json(self) -> dict[str, Any]:
        """The change as a bisect's JSON report shows it (secret values redacted).

        Returns:
            ``name``, its ``settings``, the ``good`` and ``bad`` values (:meth:`values`) and
            ``masked_by``: side -> the settings that hide the change in that side's configuration.
        """
        return {
            "name": self.name,
            "settings": list(self.good),
            "good": self.values("good"),
            "bad": self.values("bad"),
            "masked_by": {side: list(m) for side, m in self.masked_by.items()},
        }


def flat_settings(settings: LiveSettings) -> dict[str, Any]:
    """Settings as spec names: LiveSettings fields, ``env.NAME`` and ``server_args.flag``."""
    d = settings.model_dump(mode="json")
    env, args = d.pop("env"), d.pop("server_args")
    d.update({f"env.{k}": v for k, v in sorted(env.items())})
    d.update({f"server_args.{k}": v for k, v in sorted(args.items())})
    return d


def flat_effective(effective: dict[str, Any]) -> dict[str, Any]:
    """A plan's effective settings with nested ``env``/``server_args`` as
    ``env.NAME``/``server_args.flag``."""
    out: dict[str, Any] = {}
    for key, value in effective.items():
        if key in ("env", "server_args") and isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in sorted(value.items())})
        else:
            out[key] = value
    return out


def _order(name: str) -> tuple[int, int, str]:
    """LiveSettings fields in declaration order, then ``env.*``, then ``server_args.*``, each by
    name."""
    fields = list(LiveSettings.model_fields)
    if name in fields:
        return 0, fields.index(name), ""
    kind = name.partition(".")[0]
    return {"env": 1, "server_args": 2}.get(kind, 3), 0, name


def requested_differences(good: dict[str, Any], bad: dict[str, Any]) -> list[str]:
    """Names whose requested values differ (flat settings; an absent name is unset), in a stable
    order."""
    return sorted((n for n in {*good, *bad} if good.get(n) != bad.get(n)), key=_order)


def apply_changes(base: dict[str, Any], changes: Sequence[Change]) -> dict[str, Any]:
    """``base`` (flat settings) with the bad values of ``changes``."""
    values = dict(base)
    for c in changes:
        values.update(c.bad)
    return values


def _apply_names(
    base: dict[str, Any], other: dict[str, Any], names: Sequence[str]
) -> dict[str, Any]:
    """``base`` with ``names`` taken from ``other``."""
    return {**base, **{n: other.get(n) for n in names}}


class _Plans:
    """Plans of flat settings, each planned once; a combination the engine cannot even plan is
    None."""

    def __init__(self, plan: FlatPlanner):
        self.plan = plan
        self.memo: dict[str, TrialPlan | None] = {}

    def __call__(self, flat: dict[str, Any]) -> TrialPlan | None:
        key = json.dumps(flat, sort_keys=True, default=str)  # in memory only (values may be secret)
        if key not in self.memo:
            try:
                self.memo[key] = self.plan(flat)
            except Exception:  # the name stays a change: an unplannable combination is not "inert"
                self.memo[key] = None
        return self.memo[key]

    def same(self, flat: dict[str, Any], fingerprint: str) -> bool:
        p = self(flat)
        return p is not None and p.fingerprint == fingerprint

    def differ(self, a: dict[str, Any], b: dict[str, Any]) -> bool:
        """Both plan, to different fingerprints."""
        pa, pb = self(a), self(b)
        return pa is not None and pb is not None and pa.fingerprint != pb.fingerprint


def _maskers(
    name: str, start: dict[str, Any], other: dict[str, Any], candidates: list[str], plans: _Plans
) -> list[str]:
    """The settings whose value at ``start`` hides ``name``: flipped to ``other``'s, ``name``
    changes the plan.

    Each single candidate that unmasks ``name`` alone; else a 1-minimal set of them that does
    together.
    """

    def unmasks(ms: Sequence[str]) -> bool:
        base = _apply_names(start, other, ms)
        return plans.differ(base, _apply_names(base, other, [name]))

    single = [m for m in candidates if unmasks([m])]
    if single or not candidates or not unmasks(candidates):
        return single
    kept = list(candidates)
    for m in list(kept):
        rest = [k for k in kept if k != m]
        if rest and unmasks(rest):
            kept = rest
    return kept


def list_changes(
    good: dict[str, Any],
    bad: dict[str, Any],
    *,
    plan: FlatPlanner,
    groups: Sequence[Sequence[str]] = (),
) -> list[Change]:
    """The changes from ``good`` to ``bad`` (flat requested settings), one per setting or group
    (module docstring).

    Args:
        good: the good configuration's flat requested settings.
        bad: the bad configuration's.
        plan: flat settings -> the engine's plan; the plans decide what differs and what masks what.
        groups: settings applied together as one change.
    """
    plans = _Plans(plan)
    good_plan, bad_plan = plan(good), plan(bad)
    good_fp, bad_fp = good_plan.fingerprint, bad_plan.fingerprint
    plans.memo[json.dumps(good, sort_keys=True, default=str)] = good_plan
    plans.memo[json.dumps(bad, sort_keys=True, default=str)] = bad_plan
    if good_fp == bad_fp:
        return []
    good_eff, bad_eff = flat_effective(good_plan.effective), flat_effective(bad_plan.effective)
    requested = requested_differences(good, bad)
    inert = {
        n: {
            "good": plans.same(_apply_names(good, bad, [n]), good_fp),
            "bad": plans.same(_apply_names(bad, good, [n]), bad_fp),
        }
        for n in requested
    }
    both = [n for n in requested if all(inert[n].values())]
    equal = [n for n in both if good_eff.get(n) == bad_eff.get(n)]
    kept = list(requested)
    # set aside while the rest rebuilds the bad plan
    for name in [*equal, *(n for n in both if n not in equal)]:
        trial = [n for n in kept if n != name]
        if plans.same(_apply_names(good, bad, trial), bad_fp):
            kept = trial
    group_of = {n: next((list(g) for g in groups if n in g), [n]) for n in kept}
    masks: dict[str, dict[Side, list[str]]] = {}
    shown: dict[str, tuple[Any, Any]] = {}
    for n in kept:
        others = [k for k in kept if k not in group_of[n]]
        masks[n] = {}
        values = [good_eff.get(n), bad_eff.get(n)]
        for i, (side, start, other) in enumerate((("good", good, bad), ("bad", bad, good))):
            if not inert[n][side]:
                continue
            by = _maskers(n, start, other, others, plans)
            masks[n][side] = by
            unmasked = plans(_apply_names(start, other, by)) if by else None
            # the value as it runs once the maskers are flipped (as the repair exposes it)
            if unmasked is not None:
                values[i] = flat_effective(unmasked.effective).get(n, values[i])
        if n in good_eff or n in bad_eff:
            shown[n] = (values[0], values[1])
    out: list[Change] = []
    taken: set[str] = set()
    for name in kept:
        if name in taken:
            continue
        members = [n for n in kept if n in group_of[name]]
        taken.update(members)
        out.append(
            Change(
                "+".join(members),
                {n: good.get(n) for n in members},
                {n: bad.get(n) for n in members},
                {n: shown[n] for n in members if n in shown},
            )
        )
    change_of = {n: c.name for c in out for n in c.good}
    final = []
    for c in out:
        masked: dict[Side, tuple[str, ...]] = {}
        for side in ("good", "bad"):
            if any(side in masks[n] for n in c.good):
                by = [change_of[m] for n in c.good for m in masks[n].get(side, [])]
                masked[side] = tuple(dict.fromkeys(by))
        final.append(Change(c.name, c.good, c.bad, c.shown, masked))
    return final


def with_masks(
    good: dict[str, Any],
    bad: dict[str, Any],
    change: Change,
    *,
    plan: FlatPlanner,
    changes: Sequence[Change],
) -> Change:
    """``change`` (a difference set aside as inert that turned out to matter) with what hides it at
    each end.

    Args:
        good: the good configuration's flat requested settings.
        bad: the bad configuration's.
        change: the difference, inert alone from both ends.
        plan: flat settings -> the engine's plan.
        changes: the other changes, which may hide it.
    """
    plans = _Plans(plan)
    names = [n for c in changes if c.name != change.name for n in c.good]
    change_of = {n: c.name for c in changes for n in c.good}
    masked: dict[Side, tuple[str, ...]] = {}
    for side, start, other in (("good", good, bad), ("bad", bad, good)):
        by = {change_of[m] for n in change.good for m in _maskers(n, start, other, names, plans)}
        masked[side] = tuple(c.name for c in changes if c.name in by)
    return Change(change.name, change.good, change.bad, change.shown, masked)


def not_changes(
    good: dict[str, Any], bad: dict[str, Any], *, changes: Sequence[Change]
) -> list[Change]:
    """The requested differences that are not changes, as changes (one per setting) that can still
    be applied."""
    return [
        Change(n, {n: good.get(n)}, {n: bad.get(n)})
        for n in explain_no_changes(good, bad, changes=changes)
    ]


def explain_no_changes(
    good: dict[str, Any], bad: dict[str, Any], *, changes: Sequence[Change]
) -> list[str]:
    """Requested differences that are not changes (ignored by the engine, defaults, or implied by
    others)."""
    changed = {n for c in changes for n in c.good}
    return [n for n in requested_differences(good, bad) if n not in changed]


def not_change_reasons(
    good: dict[str, Any], bad: dict[str, Any], *, changes: Sequence[Change], plan: FlatPlanner
) -> dict[str, str]:
    """Why each requested difference that is not a change (:func:`explain_no_changes`) is not one,
    from the plans of both ends: the engine does not use the setting, runs it with one value at both
    ends (a default, an override), or it follows from the other changes. Values are the plans'
    effective ones (secrets redacted).

    Args:
        good: the good configuration's flat requested settings.
        bad: the bad configuration's.
        changes: the changes (:func:`list_changes`).
        plan: flat settings -> the engine's plan.
    """
    names = explain_no_changes(good, bad, changes=changes)
    if not names:
        return {}
    good_plan, bad_plan = plan(good), plan(bad)
    good_eff, bad_eff = flat_effective(good_plan.effective), flat_effective(bad_plan.effective)
    reasons = {}
    for n in names:
        if n not in good_eff and n not in bad_eff:
            reasons[n] = f"the {good_plan.engine} engine does not use it"
        elif good_eff.get(n) == bad_eff.get(n):
            reasons[n] = f"the engine runs it as {good_eff.get(n)} at both ends"
        else:
            reasons[n] = (
                f"it follows from the other changes (it runs as {good_eff.get(n)} -> "
                f"{bad_eff.get(n)})"
            )
    return reasons


def describe_changes(changes: Sequence[Change], reasons: dict[str, str]) -> list[str]:
    """What a bisect will search, one line each, for a person before the first probe: every change
    with its good and bad value as the engine runs it (and what hides it at an end), then every
    not-change with why.

    Args:
        changes: the changes (:func:`list_changes`).
        reasons: the not-changes, name -> why (:func:`not_change_reasons`).
    """
    n = len(changes)
    lines = [f"{n} change{'' if n == 1 else 's'} to bisect (good -> bad, as the engine runs them):"]
    for c in changes:
        hidden = "; ".join(
            f"hidden at {side} by {', '.join(by) or 'a combination'}"
            for side, by in c.masked_by.items()
        )
        lines.append(
            f"  {c.name}: {c.values('good')} -> {c.values('bad')}"
            + (f" ({hidden})" if hidden else "")
        )
    if reasons:
        k = len(reasons)
        lines.append(f"{k} requested difference{'' if k == 1 else 's'} not bisected:")
        lines += [f"  {name}: not a change, {why}" for name, why in reasons.items()]
    return lines
