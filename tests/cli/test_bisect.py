"""`bisect-eagle bisect` on the tiny scenario: exact culprits within the probe bound, caching,
replay, crashes, two overlapping breaking sets on the stand-in server, and the table at 80 columns
in a terminal.

Subprocesses get generous time limits (a loaded machine is slow, not wrong); one that runs past them
fails saying the machine was too slow."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bisect_eagle.bisect.ddmin import ProbeOutcome
from bisect_eagle.bisect.log import parse_log
from bisect_eagle.bisect.run import BisectOptions, run_bisect
from bisect_eagle.engines.base import Engine, TrialResult, failed
from bisect_eagle.engines.plan import TrialPlan, make_plan
from bisect_eagle.engines.sglang.rules import speculative_effective
from bisect_eagle.errors import BadInput
from bisect_eagle.spec.settings import LiveSettings
from bisect_eagle.tracking.runs import Tracking

from helpers import ctrl_c_heard

ROOT = Path(__file__).resolve().parents[2]
GOOD = ROOT / "experiments" / "tiny.yaml"
BAD = ROOT / "experiments" / "tiny-broken.yaml"
# the incident's two mistakes, see tiny-broken.yaml
PLANTED = {"eagle_aux_hidden_state_layer_ids", "num_steps"}
# accept length only
FAST = ["--set", "num_prompts=2", "--set", "warmup_prompts=0", "--set", "max_new_tokens=16"]
CLI = (
    "import sys; from bisect_eagle import cli; from bisect_eagle.cli import bisect as m; 'bisect' "
    "in {c.name for c in cli.app.registered_commands} or m.register(cli.app); cli.main()"
)
# one OpenMP thread: on a shared 2-core machine two spinning threads make a tiny trial ~20x slower
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


LIMIT_S = 1800  # a bisect of the tiny scenario takes under a minute on a quiet 2-core machine


def _run(
    argv: list[str], *, cwd: Path, env: dict | None = None, limit_s: float = LIMIT_S
) -> subprocess.CompletedProcess:
    """``argv`` to its end, or a failure saying the machine was too slow (never a bare
    TimeoutExpired)."""
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=limit_s, cwd=cwd, env=env or ENV
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"machine too slow: {' '.join(argv[3:6])} ... ran past {limit_s:.0f} s")


def _bisect(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    return _run(
        [
            sys.executable,
            "-c",
            CLI,
            "bisect",
            "--metric",
            "accept_length",
            *FAST,
            "--tracking-uri",
            f"sqlite:///{tmp / 'mlflow.db'}",
            "--json",
            *args,
        ],
        cwd=tmp,
    )


@pytest.fixture(scope="module")
def first(tiny, tmp_path_factory) -> tuple[Path, dict]:
    tmp = tmp_path_factory.mktemp("bisect")
    out = _bisect(tmp, "--good", str(GOOD), "--bad", str(BAD), "--log", str(tmp / "b.log"))
    assert out.returncode == 0, out.stderr
    return tmp, json.loads(out.stdout)


def test_names_exactly_the_planted_culprits_within_the_bound(first):
    _, report = first
    n, c = len(report["changes"]), len(report["culprits"])
    # the local engine ignores env.* and server_args.*, and num_draft_tokens 16 runs as num_steps +
    # 1: the plans tell the two configurations apart only by the two planted mistakes
    assert [x["name"] for x in report["changes"]] == [
        "eagle_aux_hidden_state_layer_ids",
        "num_steps",
    ]
    assert set(report["not_changes"]) == {
        "num_draft_tokens",
        "env.NCCL_ALGO",
        "env.NCCL_PROTO",
        "server_args.disable_custom_all_reduce",
        "server_args.cuda_graph_max_bs",
    }
    assert report["status"] == "isolated"
    assert {x["name"] for x in report["culprits"]} == PLANTED
    assert sorted(map(sorted, report["breaking_sets"])) == [
        ["eagle_aux_hidden_state_layer_ids"],
        ["num_steps"],
    ]
    # independent mistakes: both must be reverted
    assert sorted(report["repair_set"]) == sorted(PLANTED)
    wiring = next(x for x in report["culprits"] if x["name"] == "eagle_aux_hidden_state_layer_ids")
    assert (wiring["good"], wiring["bad"]) == ([1, 5, 9], [-1, 1, 5])
    b = len(report["breaking_sets"])
    # + one verification probe per answer, + one completeness check: after the first set, the bad
    # configuration with it reverted (BAD: the second set); after the second, that configuration is
    # the good one (nothing is left)
    bound = 2 * c * (n - 1).bit_length() + 2 + c + b + 1 + 1
    assert report["probes_used"] == len(report["probes"]) <= report["probe_bound"] == bound
    assert [sorted(s["changes"]) for s in report["sets"]] == sorted(
        map(sorted, report["breaking_sets"])
    )
    # deterministic: near certain
    assert all(s["probability"] > 0.99 and s["verified"] for s in report["sets"])
    # judged by accept length: both mistakes act on acceptance (nothing to pin)
    assert {s["changes"][0]: s["side"] for s in report["sets"]} == {
        "eagle_aux_hidden_state_layer_ids": "acceptance",
        "num_steps": "acceptance",
    }
    assert report["unknown"] == [] and report["error_control"]["familywise"] == 0.05
    assert report["verified"] and report["verification_probes"] == b + 1
    repair = next(v for v in report["verification"] if v["check"] == "repair")
    # bad as it is
    assert repair["outcome"] == "GOOD" and set(repair["applied"]) == set(report["not_changes"])
    assert report["unresolved"] == []
    first_probe, second = report["probes"][:2]
    assert first_probe["applied"] == [] and first_probe["outcome"] == "GOOD"
    assert len(second["applied"]) == n and second["outcome"] == "BAD"
    # the local engine declares greedy accept length deterministic: one sample per endpoint and per
    # probe
    assert len(first_probe["samples"]) == len(second["samples"]) == 1
    measured = [p["fingerprint"] for p in report["probes"] if p["source"] == "measured"]
    assert len(measured) == len(set(measured)) == report["live_trials"]  # one measurement per plan
    # one sample each: no repeats of the endpoints
    assert report["samples"] == report["live_trials"]


def test_one_child_run_per_probe_under_the_parent(first):
    tmp, report = first
    tracking, parent = Tracking.of_run(f"sqlite:///{tmp / 'mlflow.db'}", report["parent_run_id"])
    children = tracking.child_runs(report["parent_run_id"])
    assert sorted(r.info.run_id for r in children) == sorted(
        p["child_run_id"] for p in report["probes"]
    )
    assert report["live_trials"] == sum(p["source"] == "measured" for p in report["probes"])
    assert parent.data.tags["outcome"] == "isolated"
    assert set(parent.data.tags["culprits"].split(",")) == PLANTED
    assert {r.data.tags["bisect_outcome"] for r in children} == {"GOOD", "BAD"}
    assert tracking.experiment_name().endswith(" / bisect")  # apart from the search's trials
    names = [r.info.run_name for r in children]
    assert len(set(names)) == len(names)
    assert all(re.fullmatch(r"probe \d\d (\+\S+|good config): (GOOD|BAD)", n) for n in names), names
    note = parent.data.tags["mlflow.note.content"]
    assert "**Breaking sets**" in note and "- `num_steps`" in note and "**Repair set**" in note
    # the evidence: one linked row per probe
    assert note.count("](#/experiments/") == len(report["probes"])
    assert "probes.png" in {a.path for a in tracking.client.list_artifacts(report["parent_run_id"])}


def test_rerun_costs_nothing_and_replay_follows_edited_marks(first):
    tmp, report = first
    again = _bisect(tmp, "--good", str(GOOD), "--bad", str(BAD), "--log", str(tmp / "again.log"))
    assert again.returncode == 0, again.stderr
    second = json.loads(again.stdout)
    assert (
        second["live_trials"] == second["samples"] == 0
        and {x["name"] for x in second["culprits"]} == PLANTED
    )
    good_run, bad_run = report["probes"][0]["run_id"], report["probes"][1]["run_id"]
    by_runs = _bisect(
        tmp,
        "--good",
        good_run,
        "--bad",
        bad_run,
        "--spec",
        str(GOOD),
        "--log",
        str(tmp / "runs.log"),
    )
    assert by_runs.returncode == 0, by_runs.stderr
    from_runs = json.loads(by_runs.stdout)
    assert from_runs["good"] == f"run:{good_run}" and from_runs["live_trials"] == 0
    assert {x["name"] for x in from_runs["culprits"]} == PLANTED
    log = tmp / "b.log"
    lines = log.read_text().splitlines()
    edited = [
        ("good" + line[3:])
        if line.startswith("bad num_steps ") or line == "bad num_steps"
        else line
        for line in lines
    ]
    assert edited != lines
    (tmp / "edited.log").write_text("\n".join(edited) + "\n")
    replay = _run(
        [
            sys.executable,
            "-c",
            CLI,
            "bisect",
            "--replay",
            str(tmp / "edited.log"),
            "--tracking-uri",
            f"sqlite:///{tmp / 'mlflow.db'}",
            "--log",
            str(tmp / "r.log"),
            "--json",
        ],
        cwd=tmp,
    )
    assert replay.returncode in (0, 1), replay.stderr
    replayed = json.loads(replay.stdout)
    logged = {tuple(applied) for _, applied, _ in parse_log(tmp / "edited.log").marks}
    assert all(p["source"] == "replay" for p in replayed["probes"] if tuple(p["applied"]) in logged)
    alone = [p for p in replayed["probes"] if p["applied"] == ["num_steps"]]
    # the edited mark ...
    assert alone and all(p["outcome"] == "GOOD" and p["source"] == "replay" for p in alone)
    assert replayed["breaking_sets"] != report["breaking_sets"]  # ... and changes the answer
    assert parse_log(tmp / "r.log").header["good"] == str(GOOD)


def test_a_planted_token_appears_nowhere(first):
    """The bad spec carries env.HF_TOKEN: the local engine ignores it (not a change), and no output
    shows it."""
    import yaml

    tmp, _ = first
    token = "hf_cli_planted_987"
    raw = yaml.safe_load(BAD.read_text())
    raw["engine"]["settings"]["env.HF_TOKEN"] = token
    bad = tmp / "broken-with-token.yaml"
    bad.write_text(yaml.safe_dump(raw))
    out = _bisect(
        tmp,
        "--good",
        str(GOOD),
        "--bad",
        str(bad),
        "--log",
        str(tmp / "token.log"),
        "--set",
        "env.MY_TOKEN=x7q-cli-typed",
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert {x["name"] for x in report["culprits"]} == PLANTED and "env.HF_TOKEN" in report[
        "not_changes"
    ]
    tracking, _ = Tracking.of_run(f"sqlite:///{tmp / 'mlflow.db'}", report["parent_run_id"])
    for text in (
        out.stdout,
        out.stderr,
        (tmp / "token.log").read_text(),
        tracking.read_text(report["parent_run_id"], "result.json"),
        tracking.read_text(report["parent_run_id"], "bisect.log"),
    ):
        assert token not in text and "x7q-cli-typed" not in text
    only = tmp / "token-only.yaml"
    raw = yaml.safe_load(GOOD.read_text())
    raw["engine"]["settings"].update(
        {"env.HF_TOKEN": token, "env.NCCL_ALGO": "Ring", "concurrency": 4}
    )
    only.write_text(yaml.safe_dump(raw))
    same = _bisect(tmp, "--good", str(GOOD), "--bad", str(only))
    assert (
        same.returncode == 2
        and "nothing to bisect" in same.stderr
        and "plan the same trial" in same.stderr
    )
    assert "env.HF_TOKEN" in same.stderr and token not in same.stderr + same.stdout


def test_a_wiring_hidden_by_eagle_is_reverted_with_the_algorithm(tiny, tmp_path):
    """The incident's masked pair on the tiny scenario: the bad deployment says EAGLE (the layer ids
    are unused) and feeds a wrong wiring, next to harmless not-changes. Reverting the algorithm
    alone exposes the wiring; the repair set is both, and every answer is a probe shown in the
    output."""
    import yaml

    raw = yaml.safe_load(GOOD.read_text())
    raw["name"] = "tiny-eagle-masked"
    raw.pop("space")
    raw["engine"]["settings"].update(
        {
            "speculative_algorithm": "EAGLE",
            "eagle_aux_hidden_state_layer_ids": [-1, 1, 5],
            "num_draft_tokens": 16,
            "env.NCCL_ALGO": "Tree",
            "server_args.cuda_graph_max_bs": 8,
        }
    )
    bad = tmp_path / "eagle-masked.yaml"
    bad.write_text(yaml.safe_dump(raw))
    out = _bisect(
        tmp_path, "--good", str(GOOD), "--bad", str(bad), "--log", str(tmp_path / "m.log")
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    wiring, algo = "eagle_aux_hidden_state_layer_ids", "speculative_algorithm"
    # the wiring is a change, masked by EAGLE
    assert [c["name"] for c in report["changes"]] == [algo, wiring]
    assert report["changes"][1]["masked_by"] == {"bad": [algo]}
    assert (report["changes"][1]["good"], report["changes"][1]["bad"]) == ([1, 5, 9], [-1, 1, 5])
    assert set(report["not_changes"]) == {
        "num_draft_tokens",
        "env.NCCL_ALGO",
        "server_args.cuda_graph_max_bs",
    }
    assert report["status"] == "isolated" and report["verified"]
    assert sorted(report["breaking_sets"]) == [[wiring], [algo]] and sorted(
        report["repair_set"]
    ) == [wiring, algo]
    limit = report["judge"]["limit"]
    checks = {(v["check"], tuple(v["changes"])): v for v in report["verification"]}
    for name in (algo, wiring):
        v = checks[("breaking", (name,))]
        assert v["applied"] == [name] and v["outcome"] == "BAD" and v["value"] < limit
    repair = checks[("repair", tuple(report["repair_set"]))]
    assert repair["outcome"] == "GOOD" and repair["value"] >= limit
    # the bad deployment with both reverted, as it is
    assert set(repair["applied"]) == set(report["not_changes"])
    for v in report["verification"]:
        assert report["probes"][v["probe"] - 1]["verifies"] == v["check"]
    # with two changes, the bad configuration with the algorithm alone reverted is the wiring alone
    # applied to good
    only_algo = next(p for p in report["probes"] if p["applied"] == [wiring])
    assert only_algo["outcome"] == "BAD" and only_algo["value"] < limit
    assert report["interactions"] == [
        f"{algo}=EAGLE hides {wiring} in the bad configuration: revert both (reverting {algo} "
        f"alone: BAD, measured {only_algo['value']:.4g})"
    ]
    assert report["probes_used"] <= report["probe_bound"]
    human = _run(
        [
            sys.executable,
            "-c",
            CLI,
            "bisect",
            "--metric",
            "accept_length",
            *FAST,
            "--tracking-uri",
            f"sqlite:///{tmp_path / 'mlflow.db'}",
            "--good",
            str(GOOD),
            "--bad",
            str(bad),
            "--log",
            str(tmp_path / "again.log"),
        ],
        cwd=tmp_path,
        env={**ENV, "COLUMNS": "250"},
    )
    assert human.returncode == 0, human.stderr
    text = " ".join(human.stdout.split())
    assert f"interaction: {algo}=EAGLE hides {wiring} in the bad configuration: revert both" in text
    assert re.search(
        rf"repairs the bad configuration when reverted from it: ({algo} \+ {wiring}|{wiring} \+ "
        rf"{algo}) "
        r"\(verified: probe \d+ measured GOOD, [\d.]+\)",
        text,
    ), text
    assert re.search(
        rf"breaks the good configuration when applied to it: {wiring} \(set \d, probability "
        r"[\d.]+\) \(verified: probe \d+ measured BAD",
        text,
    ), text
    # good's
    assert text.endswith(
        "experiment 'tiny / bisect': bisect-eagle ui --tracking-uri sqlite:///mlflow.db"
    )


class ScriptedEngine(Engine):
    """Accept length 1.0 for the planted mistakes, 3.0 otherwise; crashes or fails where told.

    Like a server engine it runs ``env`` and ``server_args``, so they are changes here.
    """

    name = "scripted"

    def __init__(self, crash):
        self.crash = crash
        self.runs = 0

    def plan(self, settings: LiveSettings) -> TrialPlan:
        effective, warnings, refusal = speculative_effective(settings)
        if effective["eagle_aux_hidden_state_layer_ids"] is None:
            effective["eagle_aux_hidden_state_layer_ids"] = [1, 5, 9]
        return make_plan(
            self.name, settings, effective=effective, warnings=warnings, refusal=refusal
        )

    def run(self, plan: TrialPlan) -> TrialResult:
        self.runs += 1
        settings, effective = plan.settings, plan.effective
        kind = self.crash(settings)
        if kind == "raise":
            raise BadInput("scripted: this combination cannot start")
        if kind == "fail":
            return failed(
                self.name,
                requested=plan.requested,
                effective=effective,
                cls="capture_error",
                detail="captured 2 of 3 aux hidden states",
            )
        broken = -1 in effective["eagle_aux_hidden_state_layer_ids"] or effective["num_steps"] == 1
        al = 1.0 if broken else 3.0
        return TrialResult(
            engine=self.name,
            status="ok",
            requested=plan.requested,
            effective=effective,
            output_tok_s=10 * al,
            accept_length=al,
        )


def _crash(settings: LiveSettings) -> str | None:
    """A partial configuration with one NCCL variable but not the other cannot start; one with the
    cuda-graph flag alone fails at capture."""
    env, args = settings.env, settings.server_args
    if ("NCCL_ALGO" in env) != ("NCCL_PROTO" in env):
        return "raise"
    if "cuda_graph_max_bs" in args and "disable_custom_all_reduce" not in args:
        return "fail"
    return None


def test_crashing_probes_are_unresolved_and_the_bisect_still_ends(tiny, tmp_path):
    engine = ScriptedEngine(_crash)
    seen: list[str] = []
    opts = BisectOptions(
        good=str(GOOD),
        bad=str(BAD),
        metric="accept_length",
        tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
        log_path=tmp_path / "b.log",
    )
    report = run_bisect(opts, engine_factory=lambda spec: engine, progress=seen.append).to_json()
    # num_draft_tokens runs as num_steps + 1 on every engine: not a change
    assert len(report["changes"]) == 6
    assert {x["name"] for x in report["culprits"]} == PLANTED and report["status"] == "isolated"
    assert report["unresolved"], "the scripted crash was never probed"
    skipped = [p for p in report["probes"] if p["outcome"] == "UNRESOLVED"]
    assert [p["applied"] for p in skipped] == report["unresolved"]
    assert all(
        "scripted: this combination cannot start" in p["detail"] or "capture_error" in p["detail"]
        for p in skipped
    )
    assert any("settings left (~" in m for m in seen)
    marks = parse_log(tmp_path / "b.log").marks
    assert [m[0] for m in marks].count(ProbeOutcome.UNRESOLVED) == len(skipped)
    assert report["live_trials"] == sum(p["source"] == "measured" for p in report["probes"])
    assert engine.runs == report["samples"]
    tracking, _ = Tracking.of_run(f"sqlite:///{tmp_path / 'mlflow.db'}", report["parent_run_id"])
    children = tracking.child_runs(report["parent_run_id"])
    assert sorted(r.info.run_id for r in children) == sorted(
        p["child_run_id"] for p in report["probes"]
    )
    assert {r.data.tags["bisect_outcome"] for r in children} == {"GOOD", "BAD", "UNRESOLVED"}


def test_bad_input_is_one_line_and_exit_2(tiny, tmp_path):
    out = _run(
        [sys.executable, "-c", CLI, "bisect", "--good", str(GOOD), "--bad", "nope.yaml"],
        cwd=tmp_path,
    )
    assert out.returncode == 2
    assert (
        out.stderr.strip()
        == f"error: --bad nope.yaml: no such file: {(tmp_path / 'nope.yaml').resolve()}"
    )
    same = _run(
        [
            sys.executable,
            "-c",
            CLI,
            "bisect",
            "--good",
            str(GOOD),
            "--bad",
            str(GOOD),
            "--tracking-uri",
            f"sqlite:///{tmp_path / 'm.db'}",
        ],
        cwd=tmp_path,
    )
    assert same.returncode == 2 and "nothing to bisect" in same.stderr
    budget = _run(
        [
            sys.executable,
            "-c",
            CLI,
            "bisect",
            "--good",
            str(GOOD),
            "--bad",
            str(BAD),
            "--max-launches",
            "0",
            "--tracking-uri",
            f"sqlite:///{tmp_path / 'b.db'}",
        ],
        cwd=tmp_path,
    )
    assert (
        budget.returncode == 2
        and budget.stderr.strip() == "error: --max-launches must be >= 1, got 0"
    )
    assert not (tmp_path / "b.db").exists()


def test_standalone_accuracy_probes_see_only_the_wiring(tiny, tmp_path):
    def no_engine(spec):
        raise AssertionError("standalone probes need no live engine")

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        opts = BisectOptions(
            good=str(GOOD),
            bad=str(BAD),
            metric="standalone_accuracy",
            tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
            log_path=tmp_path / "s.log",
        )
        report = run_bisect(opts, engine_factory=no_engine).to_json()
    finally:
        torch.set_num_threads(threads)
    # a standalone probe's plan is the wiring alone: steps, NCCL and server flags are not changes
    assert [c["name"] for c in report["changes"]] == ["eagle_aux_hidden_state_layer_ids"]
    assert report["breaking_sets"] == [["eagle_aux_hidden_state_layer_ids"]]
    # one standalone trial per wiring; every other probe shares a fingerprint
    assert report["live_trials"] == 2
    good_acc, bad_acc = report["probes"][0]["median"], report["probes"][1]["median"]
    assert good_acc == pytest.approx(tiny.meta["training_accuracy"]["full_vocab"], abs=0.05)
    assert bad_acc < 0.9 * good_acc


PTY_DRIVER = """
import sys
sys.path.insert(0, {tests!r})
import bisect_eagle.engines
from fake_engine import FakeEngine
bisect_eagle.engines.make_engine = lambda spec, log_dir=None: FakeEngine(sleep_s={sleep})
sys.argv = ["bisect-eagle", "bisect", "--good", {good!r}, "--bad", {bad!r},
            "--metric", "accept_length", "--repeats", "1", "--tracking-uri", {uri!r}]
from bisect_eagle.cli import main
main()
"""
ELAPSED = re.compile(r"elapsed (\d+:\d\d:\d\d)")


@pytest.mark.system
def test_the_bisect_status_line_changes_at_least_every_10_s_with_a_slow_engine(tmp_path):
    """In a terminal, with every probe sample taking 11 s, the status line under the events shows
    the latest event
    and an elapsed clock that moves: no 10 s without a change, though events come 11 s apart."""
    from helpers import screen_in_a_pty

    sleep_s = 11.0
    code = PTY_DRIVER.format(
        tests=str(ROOT / "tests"),
        sleep=sleep_s,
        good=str(GOOD),
        bad=str(BAD),
        uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
    )
    seen, rc = screen_in_a_pty(code, cwd=tmp_path, timeout_s=900)
    assert rc == 0, "\n".join(text for _, text in seen[-40:])
    changes, last = [], None
    for at, text in seen:
        found = ELAPSED.search(text)
        if found and found.group(1) != last:
            changes.append(at)
            last = found.group(1)
    events = [at for at, text in seen if not ELAPSED.search(text)]
    assert events[-1] - events[0] > 3 * sleep_s  # several slow samples were measured
    assert (
        len(changes) > 3 * sleep_s
        and max(b - a for a, b in zip(changes, changes[1:], strict=False)) < 10
    )
    assert any("breaks the good configuration" in text for _, text in seen)


PTY_80 = """
import os, sys
os.environ["COLUMNS"] = "80"
sys.path.insert(0, {tests!r})
import bisect_eagle.engines
from fake_engine import FakeEngine
bisect_eagle.engines.make_engine = lambda spec, log_dir=None: FakeEngine()
sys.argv = ["bisect-eagle", "bisect", "--good", {good!r}, "--bad", {bad!r},
            "--metric", "accept_length", "--repeats", "1", "--tracking-uri", {uri!r}]
from bisect_eagle.cli import main
main()
"""
HEADERS = ("setting", "good", "bad", "breaks", "repair")


def test_the_bisect_table_fits_80_columns_in_a_terminal_and_no_header_is_cut_mid_word(tmp_path):
    """In a pseudo-terminal 80 columns wide: every line fits, the table's header cells hold whole
    words only (a header wraps between words), and the last line names the experiment and the
    command that opens it."""
    from helpers import screen_in_a_pty

    code = PTY_80.format(
        tests=str(ROOT / "tests"),
        good=str(GOOD),
        bad=str(BAD),
        uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
    )
    seen, rc = screen_in_a_pty(code, cwd=tmp_path, timeout_s=LIMIT_S)
    lines = [text for _, text in seen]
    assert rc == 0, "\n".join(lines[-40:])
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    top = next(i for i, line in enumerate(lines) if line.startswith("┏"))
    assert lines[top].endswith("┓")  # the whole table, not cropped at the right edge
    header = lines[top + 1 : next(i for i in range(top, len(lines)) if lines[i].startswith("┡"))]
    cells = [[c.strip() for c in row.strip().strip("┃").split("┃")] for row in header]
    words = {w for h in HEADERS for w in h.split()}
    assert all(w in words for row in cells for cell in row for w in cell.split()), cells
    assert [" ".join(filter(None, col)) for col in zip(*cells, strict=True)] == list(HEADERS)
    assert any("breaks the good configuration when applied to it" in line for line in lines)
    assert lines[-1].startswith("experiment 'tiny / bisect': bisect-eagle ui") or (
        " ".join(lines[-2:]).startswith("experiment 'tiny / bisect': bisect-eagle ui")
    ), lines[-3:]


class Wrapped(Engine):
    """The tiny scenario's stand-in server (one ``bisect-eagle serve`` per launch) with its
    throughput made exact from what the server measured (:meth:`tok_s`): a tiny model's tok/s on a
    loaded CPU is noise; its accept length, natural (greedy) or pinned (seeded draws), is not."""

    deterministic_metrics = ("output_tok_s", "accept_length")

    def __init__(self, inner: Engine):
        self.inner = inner

    def plan(self, settings: LiveSettings) -> TrialPlan:
        return self.inner.plan(settings)

    def run(self, plan: TrialPlan) -> TrialResult:
        result = self.inner.run(plan)
        if result.ok:
            result.output_tok_s = self.tok_s(
                result, {k: str(v) for k, v in (plan.effective.get("env") or {}).items()}
            )
        return result

    def tok_s(self, result: TrialResult, env: dict[str, str]) -> float:
        raise NotImplementedError

    def close(self) -> None:
        self.inner.close()


class PlantedFaults(Wrapped):
    """Two cost-side faults planted on what the stand-in measures
    (``experiments/tiny-sglang.yaml``), as the NCCL fault of the stand-in does for one variable:
    ``NCCL_ALGO=Tree`` with ``NCCL_PROTO=Simple`` halves the throughput, and so does
    ``NCCL_PROTO=Simple`` with ``NCCL_IB_HCA=mlx5``; each alone costs nothing. Throughput is ``10
    ×`` the server's measured accept length."""

    name = "planted"

    def tok_s(self, result: TrialResult, env: dict[str, str]) -> float:
        simple = env.get("NCCL_PROTO") == "Simple"
        slow = simple and (env.get("NCCL_ALGO") == "Tree" or env.get("NCCL_IB_HCA") == "mlx5")
        return 10 * result.accept_length * (0.5 if slow else 1.0)


@pytest.mark.system
def test_two_overlapping_breaking_sets_on_the_stand_in_server_are_both_reported(tiny, tmp_path):
    """{NCCL_ALGO, NCCL_PROTO} and {NCCL_PROTO, NCCL_IB_HCA} share NCCL_PROTO: after the first is
    found, the bad configuration with NCCL_ALGO reverted still breaks (it holds the second), so the
    second is found too; with NCCL_PROTO reverted, or NCCL_ALGO and NCCL_IB_HCA, it is good: no
    third set. NCCL_DEBUG changes nothing."""
    import yaml

    from bisect_eagle.engines import make_engine

    good = ROOT / "experiments" / "tiny-sglang.yaml"
    raw = yaml.safe_load(good.read_text())
    raw["name"] = "tiny-sglang-overlap"
    raw["engine"]["settings"].update(
        {
            "env.NCCL_ALGO": "Tree",
            "env.NCCL_PROTO": "Simple",
            "env.NCCL_IB_HCA": "mlx5",
            "env.NCCL_DEBUG": "INFO",
        }
    )
    bad = tmp_path / "overlap.yaml"
    bad.write_text(yaml.safe_dump(raw))
    opts = BisectOptions(
        good=str(good),
        bad=str(bad),
        tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
        log_path=tmp_path / "o.log",
        overrides={"num_prompts": 2, "max_new_tokens": 12},
    )
    report = run_bisect(
        opts, engine_factory=lambda spec: PlantedFaults(make_engine(spec, tmp_path / "logs"))
    )
    body = report.to_json()
    assert body["status"] == "isolated", body["notes"]
    assert sorted(map(sorted, body["breaking_sets"])) == [
        ["env.NCCL_ALGO", "env.NCCL_PROTO"],
        ["env.NCCL_IB_HCA", "env.NCCL_PROTO"],
    ]
    assert body["repair_set"] == ["env.NCCL_PROTO"]
    assert all(s["probability"] > 0.99 for s in body["sets"]) and body["unknown"] == []
    tracking, parent = Tracking.of_run(f"sqlite:///{tmp_path / 'mlflow.db'}", body["parent_run_id"])
    sets = {
        parent.data.tags[f"breaking_set_{i}"]: parent.data.metrics[f"breaking_set_{i}_probability"]
        for i in (1, 2)
    }
    assert set(sets) == {"env.NCCL_ALGO + env.NCCL_PROTO", "env.NCCL_IB_HCA + env.NCCL_PROTO"}
    assert all(p > 0.99 for p in sets.values())


class StandInCost(Wrapped):
    """Throughput: the server's measured accept length over a fixed :data:`CYCLE_S` plus the wait
    the stand-in adds to every target forward for the plan's environment (its own rule,
    :func:`~bisect_eagle.engines.serve.app.simulation`: ``NCCL_PROTO=LL``, the cost-side fault)."""

    name = "stand-in-cost"
    CYCLE_S = 0.01

    def tok_s(self, result: TrialResult, env: dict[str, str]) -> float:
        from bisect_eagle.engines.serve.app import simulation

        return result.accept_length / (
            self.CYCLE_S + simulation({"NCCL_PROTO": env.get("NCCL_PROTO", "")}, None)[1]
        )


@pytest.mark.system
def test_a_wiring_fault_and_the_stand_ins_cost_fault_are_one_on_each_side(tmp_path):
    """The bad configuration holds a wrong wiring (the embedding and layers 1, 5: the incident's
    false fix) and NCCL_PROTO=LL. Each breaks the good one alone. Probed again with acceptance
    pinned to the good configuration's (the stand-in serves SGLANG_SIMULATE_ACC_LEN as SGLang does),
    the wiring recovers: acceptance. NCCL_PROTO=LL
    keeps the good accept length, so pinning cannot recover it: cost, without a launch."""
    import yaml

    from bisect_eagle.engines import make_engine

    good = ROOT / "experiments" / "tiny-sglang.yaml"
    raw = yaml.safe_load(good.read_text())
    raw["name"] = "tiny-sglang-sides"
    raw["engine"]["settings"].update(
        {"eagle_aux_hidden_state_layer_ids": [-1, 1, 5], "env.NCCL_PROTO": "LL"}
    )
    bad = tmp_path / "sides.yaml"
    bad.write_text(yaml.safe_dump(raw))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    report = run_bisect(
        BisectOptions(
            good=str(good),
            bad=str(bad),
            tracking_uri=uri,
            log_path=tmp_path / "s.log",
            overrides={"num_prompts": 2, "max_new_tokens": 12},
        ),
        engine_factory=lambda spec: StandInCost(make_engine(spec, tmp_path / "logs")),
    )
    body = report.to_json()
    assert body["status"] == "isolated", body["notes"]
    sides = {tuple(s["changes"]): s for s in body["sets"]}
    assert {k: s["side"] for k, s in sides.items()} == {
        ("eagle_aux_hidden_state_layer_ids",): "acceptance",
        ("env.NCCL_PROTO",): "cost",
    }, sides
    wiring = sides[("eagle_aux_hidden_state_layer_ids",)]["pinned"]
    assert (
        wiring["accept_length"]
        > 0.9 * wiring["good_accept_length"]
        > wiring["natural_accept_length"]
    )
    tracking, parent = Tracking.of_run(uri, body["parent_run_id"])
    assert sorted(parent.data.tags[f"breaking_set_{i}_side"] for i in (1, 2)) == [
        "acceptance",
        "cost",
    ]
    pinned = [
        r
        for r in tracking.child_runs(body["parent_run_id"])
        if r.data.tags.get("role") == "bisect-side-probe"
    ]
    # NCCL_PROTO=LL keeps the good acceptance:
    assert [r.data.tags["acceptance"] for r in pinned] == ["pinned"]
    # pinning it could not recover it, no launch needed
    assert sides[("env.NCCL_PROTO",)]["pinned"] is None


KILLED_DRIVER = """
import sys
sys.path.insert(0, {tests!r})
import bisect_eagle.engines
from fake_engine import FakeEngine
bisect_eagle.engines.make_engine = lambda spec, log_dir=None: FakeEngine(sleep_s={sleep})
sys.argv = ["bisect-eagle", "bisect", "--metric", "accept_length", "--repeats", "1",
            "--tracking-uri", {uri!r}, *{extra!r}]
from bisect_eagle.cli import main
main()
"""


def test_a_replay_after_a_sigkill_ends_the_killed_bisects_runs(tmp_path):
    """SIGKILL reaches no handler: the bisect's parent and the probe it was measuring (each trial
    sleeps 20 s) stay RUNNING. The next bisect in that experiment (here the replay of the dead one's
    log) ends them KILLED, outcome ``interrupted``, and says so; its own runs finish."""
    import signal
    import time

    uri, log = f"sqlite:///{tmp_path / 'mlflow.db'}", str(tmp_path / "b.log")

    def driver(sleep: float, *extra: str) -> list[str]:
        code = KILLED_DRIVER.format(
            tests=str(ROOT / "tests"), sleep=sleep, uri=uri, extra=list(extra)
        )
        return [sys.executable, "-c", code]

    errors = tmp_path / "slow.err"
    with errors.open("w") as err:
        slow = subprocess.Popen(
            driver(20.0, "--good", str(GOOD), "--bad", str(BAD), "--log", log),
            cwd=tmp_path,
            env=ENV,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    deadline = time.monotonic() + LIMIT_S
    # once the first probe is logged, the parent and the second probe's run are open while its trial
    # sleeps
    try:
        while (
            not (Path(log).exists() and _running(uri) >= 2)
            and slow.poll() is None
            and time.monotonic() < deadline
        ):
            time.sleep(0.5)
    finally:
        if slow.poll() is None:
            os.killpg(slow.pid, signal.SIGKILL)
        slow.wait()
    assert _running(uri) >= 2, errors.read_text()[-3000:]
    out = _run(driver(0.0, "--replay", log), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "a killed bisect left RUNNING in this experiment: KILLED now" in out.stderr
    assert _running(uri) == 0
    tracking = Tracking.open(uri, "tiny / bisect")
    killed = [
        r
        for r in tracking.client.search_runs(
            [tracking.experiment_id], "attributes.status = 'KILLED'"
        )
    ]
    assert len(killed) >= 2 and all(r.data.tags["outcome"] == "interrupted" for r in killed)


def _running(uri: str) -> int:
    """The RUNNING runs of the tiny bisect experiment in ``uri`` (0 before it exists)."""
    import mlflow

    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name("tiny / bisect")
    if experiment is None:
        return 0
    return len(client.search_runs([experiment.experiment_id], "attributes.status = 'RUNNING'"))


@pytest.mark.system  # four real bisects killed mid-probe (~50 s each): CI's system step
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_bisect_and_its_replay_killed_by_a_signal_leave_no_run_running(tmp_path, sig):
    """SIGTERM or Ctrl-C while a probe is measured (each trial sleeps 20 s): the bisect ends its
    probe's run and its own KILLED, ``outcome=interrupted``; so does a ``--replay`` of its log
    interrupted the same way."""
    import time

    uri, log = f"sqlite:///{tmp_path / 'mlflow.db'}", str(tmp_path / "b.log")

    def interrupted(*extra: str) -> None:
        code = KILLED_DRIVER.format(
            tests=str(ROOT / "tests"), sleep=20.0, uri=uri, extra=list(extra)
        )
        before = _running(uri)
        errors = tmp_path / "err.txt"
        with errors.open("w") as err:
            proc = subprocess.Popen(
                [sys.executable, "-c", code],
                cwd=tmp_path,
                env=ENV,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
                preexec_fn=ctrl_c_heard,
            )
        deadline = time.monotonic() + LIMIT_S
        try:  # the parent and a probe's run are open while its trial sleeps
            while (
                not (Path(log).exists() and _running(uri) >= before + 2)
                and proc.poll() is None
                and time.monotonic() < deadline
            ):
                time.sleep(0.5)
            assert proc.poll() is None, errors.read_text()[-3000:]
            os.killpg(proc.pid, sig)
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        assert _running(uri) == 0, errors.read_text()[-3000:]

    interrupted("--good", str(GOOD), "--bad", str(BAD), "--log", log)
    assert Path(log).exists()
    interrupted("--replay", log)
    tracking = Tracking.open(uri, "tiny / bisect")
    parents = tracking.client.search_runs([tracking.experiment_id], "tags.role = 'bisect'")
    assert len(parents) == 2 and {(r.info.status, r.data.tags["outcome"]) for r in parents} == {
        ("KILLED", "interrupted")
    }
