"""A bisect's report: the answers with their verification and interactions, as JSON, as the parent
run's tags and description, and as the probes' run names."""

from __future__ import annotations

import collections
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bisect_eagle.bisect.changes import Change, Side
from bisect_eagle.bisect.culprits import Culprits
from bisect_eagle.bisect.ddmin import BisectStatus, ChangeSet
from bisect_eagle.bisect.endpoints import Endpoint
from bisect_eagle.bisect.judge import Judge
from bisect_eagle.bisect.posterior import set_probability
from bisect_eagle.bisect.prober import Prober
from bisect_eagle.tracking.runs import Tracking
from bisect_eagle.trials.launches import launch_unit


@dataclass
class BisectReport:
    """The result of a bisect, as printed and logged (the module docstring says what each set
    means)."""

    status: BisectStatus
    good: str
    bad: str
    judge: dict[str, Any]
    changes: list[Change]
    breaking: list[list[str]]  # each, applied to the good configuration, breaks it
    # removed from the bad configuration, repairs it (None: not established)
    repair: list[str] | None
    culprits: list[Change]  # the changes of all breaking sets
    probes: list[dict[str, Any]]
    unresolved: list[list[str]]
    live_trials: int  # distinct plans measured
    samples: int  # engine runs
    probe_bound: int
    # what the engine runs cost: server launches (the local engine's runs; standalone: 0)
    launches: int
    launch_unit: str  # "launches" or "runs" (trials.launches.launch_unit)
    notes: list[str]
    parent_run_id: str
    log: str
    # requested differences the plans do not tell apart
    not_changes: list[str] = field(default_factory=list)
    verification: list[dict[str, Any]] = field(default_factory=list)  # each answer's checking probe
    # every answer checked and held (the repair set measured GOOD on the bad config)
    verified: bool = False
    # one line per repair that needs a masked pair
    interactions: list[str] = field(default_factory=list)
    # not-changes alone that verification showed to matter
    promoted: list[str] = field(default_factory=list)
    # each breaking set: changes, probability, verified
    sets: list[dict[str, Any]] = field(default_factory=list)
    # configurations that may hold another breaking set
    unknown: list[list[str]] = field(default_factory=list)
    # familywise α, looks K, level α/K, looks used
    error_control: dict[str, Any] = field(default_factory=dict)
    expected_launches: int = 0  # said before the first probe
    experiment: str = ""  # the MLflow experiment of the bisect's runs
    tracking_uri: str = ""  # the store
    max_launches: int = 0  # the budget (bisect.max_launches)
    scrub: Callable[[str], str] = field(default=lambda text: text, repr=False)

    def checks_of(self, name: str) -> list[dict[str, Any]]:
        """The verification probes whose checked set holds the change ``name``."""
        return [v for v in self.verification if name in v["changes"]]

    def to_json(self) -> dict[str, Any]:
        """The report as ``bisect-eagle bisect --json`` writes it and the parent run keeps it.

        Returns:
            Every field as plain JSON data (each change with its verification probes, the counts of
            probes used), secret values scrubbed.
        """

        def change(c: Change) -> dict[str, Any]:
            return {**c.to_json(), "verification": self.checks_of(c.name)}

        body = {
            "status": self.status.value,
            "good": self.good,
            "bad": self.bad,
            "judge": self.judge,
            "changes": [change(c) for c in self.changes],
            "not_changes": self.not_changes,
            "breaking_sets": self.breaking,
            "sets": self.sets,
            "unknown": self.unknown,
            "repair_set": self.repair,
            "culprits": [change(c) for c in self.culprits],
            "verified": self.verified,
            "verification": self.verification,
            "interactions": self.interactions,
            "promoted": self.promoted,
            "probes": self.probes,
            "unresolved": self.unresolved,
            "probes_used": len(self.probes),
            "verification_probes": sum(bool(p.get("verifies")) for p in self.probes),
            "probe_bound": self.probe_bound,
            "live_trials": self.live_trials,
            "samples": self.samples,
            "launches": self.launches,
            "launch_unit": self.launch_unit,
            "expected_launches": self.expected_launches,
            "max_launches": self.max_launches,
            "error_control": self.error_control,
            "notes": self.notes,
            "parent_run_id": self.parent_run_id,
            "experiment": self.experiment,
            "log": self.log,
        }
        return _scrubbed(json.loads(json.dumps(body, default=str)), self.scrub)


def _report(
    result: Culprits,
    prober: Prober,
    *,
    changes: list[Change],
    good: Endpoint,
    bad: Endpoint,
    parent: str,
    log_path: Path,
    priors: dict[str, float],
    expected: int,
    max_launches: int,
    sides: list[dict[str, Any]] | None = None,
) -> BisectReport:
    by_name = {c.name: c for c in changes}
    probes = []
    asked: collections.Counter[ChangeSet] = collections.Counter()
    first_of: dict[str, int] = {}  # fingerprint -> the probe that measured it
    below: dict[ChangeSet, float | None] = {}
    for i, p in enumerate(result.probes, 1):
        config = frozenset(p.applied)
        rec = prober.record(config, asked[config])
        asked[config] += 1
        entry = {
            "applied": list(p.applied),
            "outcome": p.outcome.name,
            "detail": prober.scrub(p.detail),
            "cached": p.cached,
            "verifies": p.verifies,
            **rec.to_json(),
        }
        fp = entry.get("fingerprint")
        if fp and rec.source == "measured" and fp not in first_of:
            first_of[fp] = i
        entry["measured_by"] = first_of.get(fp) if rec.source == "memory" else None
        probes.append(entry)
        replayed = {"BAD": 1.0, "GOOD": 0.0}.get(p.outcome.name) if rec.source == "replay" else None
        below[config] = entry["p_below"] if entry["p_below"] is not None else replayed
    culprits = [by_name[n] for n in result.culprits]
    judge = prober.judge
    verification = [
        {
            "check": v.check,
            "changes": list(v.changes),
            "applied": list(v.applied),
            "expected": v.expected.name,
            "outcome": v.outcome.name,
            "ok": v.ok,
            "probe": v.probe,
            "value": probes[v.probe - 1].get("value"),
            "median": probes[v.probe - 1].get("median"),
            "detail": prober.scrub(v.detail),
        }
        for v in result.verifications
    ]
    status, notes = result.status, [prober.scrub(n) for n in result.notes]
    # never unverified
    if status is BisectStatus.ISOLATED and result.repair is not None and not result.verified:
        status = BisectStatus.INTERACTION
        notes.append(
            "the repair set was not measured GOOD on the bad configuration; the answer is not "
            "isolated"
        )
    checked = {tuple(v.changes): v.ok for v in result.verifications if v.check == "breaking"}
    sets = [
        {
            "changes": list(b),
            "probability": round(set_probability(b, below, priors), 4),
            "verified": checked.get(tuple(b), False),
        }
        for b in result.breaking
    ]
    for entry, side in zip(sets, sides or [], strict=False):  # acceptance or cost (bisect/sides.py)
        entry.update(side)
    repair = None if result.repair is None else list(result.repair)
    launches = 0 if prober.standalone else prober.samples
    return BisectReport(
        status=status,
        good=good.label,
        bad=bad.label,
        judge={**judge.settings(), "limit": judge.limit, "noise": judge.noise.to_json()},
        changes=changes,
        breaking=[list(c) for c in result.breaking],
        repair=repair,
        culprits=culprits,
        probes=probes,
        unresolved=[list(u) for u in result.unresolved],
        live_trials=prober.measured,
        samples=prober.samples,
        probe_bound=result.probe_bound,
        launches=launches,
        launch_unit=launch_unit(prober.ctx.spec),
        notes=notes,
        parent_run_id=parent,
        log=str(log_path),
        verification=verification,
        verified=result.verified,
        interactions=[
            prober.scrub(line)
            for line in interactions(
                changes, breaking=result.breaking, repair=result.repair, probes=probes
            )
        ],
        promoted=list(result.promoted),
        sets=sets,
        unknown=[list(prober_sorted(prober, u)) for u in result.unknown],
        error_control={
            "familywise": round(1 - judge.confidence, 6),
            "looks": judge.comparisons,
            "level": judge.level,
            "looks_used": judge.looks,
        },
        expected_launches=expected,
        max_launches=max_launches,
    )


def prober_sorted(prober: Prober, config: ChangeSet) -> tuple[str, ...]:
    """A configuration's changes in the bisect's order."""
    return tuple(n for n in prober.order if n in config)


def plan_line(judge: Judge, *, expected: int, max_launches: int, standalone: bool) -> str:
    """What the bisect will spend and how sure each verdict is, said before the first probe."""
    if standalone:
        return "standalone accuracy is deterministic: one standalone trial per wiring, no launch"
    return (
        f"expect about {expected} launches (budget {max_launches}: --max-launches); each verdict "
        f"at level {judge.level:.2g} = {1 - judge.confidence:g} / {judge.comparisons} looks, so "
        f"the chance of any false culprit in this bisect is at most {1 - judge.confidence:g}"
    )


def interactions(
    changes: list[Change],
    *,
    breaking: list[tuple[str, ...]],
    repair: tuple[str, ...] | None,
    probes: list[dict[str, Any]],
) -> list[str]:
    """One line per answer that needs a masked change together with what masks it.

    Args:
        changes: the changes, with what masks each.
        breaking: the breaking sets.
        repair: the repair set (None: not established).
        probes: the probes as reported (to quote the measured value of reverting the masker alone).

    Returns:
        The lines, change by change; empty when no answer needs a masked change.
    """
    by_name = {c.name: c for c in changes}
    searched = {c.name for c in changes}
    out = []

    def named(names: Sequence[str], side: Side) -> str:
        return ", ".join(f"{n}={by_name[n].values(side)}" for n in names)

    for c in changes:
        hiders = [m for m in c.masked_by.get("bad", ()) if repair is not None and m in repair]
        if hiders and repair is not None and c.name in repair:
            line = f"{named(hiders, 'bad')} hides {c.name} in the bad configuration: revert both"
            if len(hiders) > 1:
                line = line.replace("revert both", "revert all of them")
            alone = next(
                (
                    p
                    for p in probes
                    if set(p["applied"]) >= searched - set(hiders)
                    and not set(p["applied"]) & set(hiders)
                    and p["outcome"] != "UNRESOLVED"
                ),
                None,
            )
            if alone is not None:
                value = "" if alone.get("value") is None else f", measured {alone['value']:.4g}"
                line += f" (reverting {', '.join(hiders)} alone: {alone['outcome']}{value})"
            out.append(line)
        for cause in breaking:
            hidden_by = [m for m in c.masked_by.get("good", ()) if m in cause]
            if hidden_by and c.name in cause:
                out.append(
                    f"{c.name} breaks the good configuration only together with "
                    f"{', '.join(hidden_by)} ({named(hidden_by, 'good')} hides it there)"
                )
    return out


def name_probes(tracking: Tracking, report: BisectReport) -> None:
    """Name each probe's run after its number, the changes it applied and its outcome."""
    for i, p in enumerate(report.probes, 1):
        if p.get("child_run_id"):
            applied = "+" + ",".join(p["applied"]) if p["applied"] else "good config"
            tracking.rename(p["child_run_id"], f"probe {i:02d} {applied}: {p['outcome']}")
            tracking.log(p["child_run_id"], tags={"role": "bisect-probe", "probe": str(i)})


def _cell(value: Any) -> str:
    return (
        "-"
        if value is None
        else f"{value:.4g}"
        if isinstance(value, float)
        else str(value).replace("|", "/")
    )


def probe_run(p: dict[str, Any]) -> tuple[str | None, str]:
    """The run that measured a probe and how it was answered: its own new run when measured now,
    else the run measured before (this bisect's earlier probe, or a run of an earlier bisect or
    study), never the pointer run."""
    if p.get("source") == "measured":
        return p.get("child_run_id") or p.get("run_id"), ""
    if p.get("source") == "memory":
        return p.get("run_id"), f"probe {p['measured_by']}'s run" if p.get(
            "measured_by"
        ) else "measured above"
    if p.get("source") == "cache":
        return p.get("run_id"), "an earlier run"
    return None, "replayed from the log"


def bisect_description(body: dict[str, Any], experiment_id: str) -> str:
    """The bisect parent run's markdown: the culprits with their probabilities, the error control,
    and the probes as evidence (each linked to the run that measured it)."""
    j = body["judge"]
    lines = [
        f"## Bisect: {body['status']}",
        "",
        f"Good: `{body['good']}`; bad: `{body['bad']}`.",
        "",
    ]
    if body["sets"]:
        lines.append(
            "**Breaking sets** (each, applied to the good configuration, breaks it; probability: "
            "the posterior that it is a minimal breaking set, given the probes):"
        )
        lines += [
            f"- {' + '.join(f'`{n}`' for n in s['changes'])}: probability {s['probability']:.3f}"
            + (f"; acts on **{s['side']}** ({s['side_detail']})" if s.get("side") else "")
            for s in body["sets"]
        ]
    else:
        lines.append("No breaking set found.")
    if body.get("unknown"):
        lines += [
            "",
            "**Not known** (another breaking set may lie within these; they could not be judged):",
        ]
        lines += [f"- {' + '.join(f'`{n}`' for n in u)}" for u in body["unknown"]]
    if body["repair_set"] is not None:
        lines += [
            "",
            "**Repair set** (reverted from the bad configuration, repairs it): "
            + (" + ".join(f"`{n}`" for n in body["repair_set"]) or "none"),
        ]
    masked = [
        (c["name"], side, by)
        for c in body["changes"]
        for side, by in c.get("masked_by", {}).items()
    ]
    if masked:
        lines += [
            "",
            "**Masked changes** (inert alone at one end, hidden there by other settings):",
        ]
        lines += [
            f"- `{n}`: hidden in the {side} configuration by "
            + (" + ".join(f"`{b}`" for b in by) or "a combination")
            for n, side, by in masked
        ]
    for line in body.get("interactions", []):
        lines += ["", f"**Interaction:** {line}"]
    if body.get("verification"):
        lines += [
            "",
            "**Verification** ("
            + ("every answer held" if body.get("verified") else "NOT verified")
            + "):",
        ]
        for v in body["verification"]:
            what = (
                "applied to the good configuration"
                if v["check"] == "breaking"
                else "reverted from the bad configuration"
            )
            lines.append(
                f"- {v['check']} set {' + '.join(f'`{n}`' for n in v['changes']) or 'none'} "
                f"{what}: {v['outcome']} (expected {v['expected']}; probe {v['probe']}, "
                f"{_cell(v['value'])})"
            )
    limit = "-" if j.get("limit") is None else f"{j['limit']:.4g}"
    if body.get("launches") is not None:
        lines += [
            "",
            f"Cost: {body['launches']} {body.get('launch_unit', 'launches')} (expected about "
            f"{body.get('expected_launches', '-')}, budget {body.get('max_launches', '-')}) for "
            f"{body['live_trials']} live trials and {len(body['probes'])} probes; without "
            f"unresolved probes this search needs at most {body['probe_bound']} probes.",
        ]
    ec = body.get("error_control") or {}
    if ec:
        lines += [
            "",
            f"Error control: each verdict at level {ec['level']:.2g} = {ec['familywise']:g} / "
            f"{ec['looks']} looks ({ec['looks_used']} used), so the chance of any false culprit is "
            f"at most {ec['familywise']:g}.",
        ]
    lines += [
        "",
        f"Judged by `{j['metric']}` (geometric mean over each configuration's launches) against "
        f"the limit {limit}.",
        "",
        "| probe | changes applied | outcome | value | launches | run |",
        "|---|---|---|---|---|---|",
    ]
    for i, p in enumerate(body["probes"], 1):
        run, how = probe_run(p)
        link = f"[{run[:8]}](#/experiments/{experiment_id}/runs/{run})" if run else "-"
        if how:
            link = f"{link} ({how})" if run else how
        verifies = f" (verifies the {p['verifies']} set)" if p.get("verifies") else ""
        lines.append(
            f"| {i}{verifies} | {', '.join(p['applied']) or '(good config)'} | {p['outcome']} | "
            f"{_cell(p.get('value'))} | {len(p.get('samples') or [])} | {link} |"
        )
    for note in body["notes"]:
        lines += ["", f"Note: {note}"]
    return "\n".join(lines)


def _scrubbed(value: Any, scrub: Callable[[str], str]) -> Any:
    """``value`` (JSON data) with every string scrubbed."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, list):
        return [_scrubbed(v, scrub) for v in value]
    if isinstance(value, dict):
        return {k: _scrubbed(v, scrub) for k, v in value.items()}
    return value
