"""The changes a bisect searches: what differs between the good and the bad configuration *as the engine runs them*.

Settings are flat names as a spec writes them (LiveSettings fields, ``env.NAME``, ``server_args.flag``).
A requested difference is a change only when the engine's plans tell it apart: the list is the smallest
set of requested differences that, applied to the good configuration, plans to the bad configuration's
fingerprint, trying to drop first the settings whose effective values are equal at both ends. So a setting
the engine ignores (``env.*`` or ``concurrency`` on the local engine), an explicit default equal to the
default, the draft's own layer ids written out, or a value the engine overrides from another change
(``num_draft_tokens`` under ``topk == 1``) is not a change.

A change is applied with its requested bad value (in clear: secrets must reach the engine); what is shown
is the plan's effective value, where secrets are already redacted.
"""

from __future__ import annotations

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
    good: dict[str, Any]  # setting -> requested value in the good configuration (None: unset); may be secret
    bad: dict[str, Any]  # setting -> requested value in the bad configuration (None: unset); may be secret
    shown: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # effective (good, bad), redacted

    def values(self, side: Side) -> Any:
        """The good or bad value as the engine runs it (a dict of values for a group); secrets redacted."""
        i = 0 if side == "good" else 1
        raw = redact_mapping(self.good if side == "good" else self.bad)
        resolved = {k: self.shown[k][i] if k in self.shown else v for k, v in raw.items()}
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


def flat_effective(effective: dict[str, Any]) -> dict[str, Any]:
    """A plan's effective settings with nested ``env``/``server_args`` as ``env.NAME``/``server_args.flag``."""
    out: dict[str, Any] = {}
    for key, value in effective.items():
        if key in ("env", "server_args") and isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in sorted(value.items())})
        else:
            out[key] = value
    return out


def _order(name: str) -> tuple[int, int, str]:
    """LiveSettings fields in declaration order, then ``env.*``, then ``server_args.*``, each by name."""
    fields = list(LiveSettings.model_fields)
    if name in fields:
        return 0, fields.index(name), ""
    kind = name.partition(".")[0]
    return {"env": 1, "server_args": 2}.get(kind, 3), 0, name


def requested_differences(good: dict[str, Any], bad: dict[str, Any]) -> list[str]:
    """Names whose requested values differ (flat settings; an absent name is unset), in a stable order."""
    return sorted((n for n in {*good, *bad} if good.get(n) != bad.get(n)), key=_order)


def apply_changes(base: dict[str, Any], changes: Sequence[Change]) -> dict[str, Any]:
    """``base`` (flat settings) with the bad values of ``changes``."""
    values = dict(base)
    for c in changes:
        values.update(c.bad)
    return values


def _apply_names(good: dict[str, Any], bad: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
    return {**good, **{n: bad.get(n) for n in names}}


def list_changes(
    good: dict[str, Any], bad: dict[str, Any], *, plan: FlatPlanner, groups: Sequence[Sequence[str]] = ()
) -> list[Change]:
    """The changes from ``good`` to ``bad`` (flat requested settings), one per setting or group (module docstring).

    ``plan`` turns flat settings into the engine's plan; the good and bad plans decide what differs.
    """
    good_plan, bad_plan = plan(good), plan(bad)
    good_eff, bad_eff = flat_effective(good_plan.effective), flat_effective(bad_plan.effective)
    requested = requested_differences(good, bad)
    if good_plan.fingerprint == bad_plan.fingerprint:
        return []
    equal = [n for n in requested if good_eff.get(n) == bad_eff.get(n)]
    kept = list(requested)
    for name in [*equal, *(n for n in requested if n not in equal)]:
        trial = [n for n in kept if n != name]
        try:
            same = plan(_apply_names(good, bad, trial)).fingerprint == bad_plan.fingerprint
        except Exception:  # a combination the engine cannot even plan: the name stays a change
            same = False
        if same:
            kept = trial
    out: list[Change] = []
    taken: set[str] = set()
    for name in kept:
        if name in taken:
            continue
        group = next((g for g in groups if name in g), [name])
        members = [n for n in kept if n in group]
        taken.update(members)
        shown = {n: (good_eff.get(n), bad_eff.get(n)) for n in members if n in good_eff or n in bad_eff}
        out.append(Change("+".join(members), {n: good.get(n) for n in members}, {n: bad.get(n) for n in members},
                          shown))
    return out


def explain_no_changes(good: dict[str, Any], bad: dict[str, Any], *, changes: Sequence[Change]) -> list[str]:
    """Requested differences that are not changes (ignored by the engine, defaults, or implied by others)."""
    changed = {n for c in changes for n in c.good}
    return [n for n in requested_differences(good, bad) if n not in changed]
