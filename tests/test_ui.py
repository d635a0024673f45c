"""The MLflow UI, served by `bisect-eagle ui`'s server helpers and opened in headless Chromium after a study and a
bisect: the parent run shows the verdict and links the best child; the best child shows its effective params and
its per-position acceptance curve; the bisect's probes are in their own experiment, not among the search's trials.
"""

from __future__ import annotations

import html
import re
import subprocess
from pathlib import Path

import pytest

from bisect_eagle.cli.ui import free_ui_port, run_url, runs_url, start_ui_server, stop_ui_server, wait_ready
from bisect_eagle.search.bisect.run import bisect_experiment
from bisect_eagle.tracking import Tracking

from helpers import tiny_fake_bisect, tiny_fake_study

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
pytestmark = pytest.mark.skipif(not CHROMIUM.exists(),
                                reason="/usr/bin/chromium is absent (Debian: apt-get install -y chromium)")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A tiny-scenario study (real stage 1, fake live engine) and a bisect in a fresh store; a server on it."""
    root = tmp_path_factory.mktemp("ui")
    uri, out, fake = tiny_fake_study(root)
    bisect = tiny_fake_bisect(root, uri, fake)
    port = free_ui_port()
    proc = start_ui_server(uri, port, log=root / "server.log")
    try:
        wait_ready(proc, port)
        yield root, out, bisect, port
    finally:
        stop_ui_server(proc)


def chromium(url: str, profile: Path, *extra: str, budget_ms: int = 15000) -> str:
    argv = [str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", "--window-size=1400,1800",
            f"--virtual-time-budget={budget_ms}", *extra, url]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=True)
    return html.unescape(done.stdout)


def dom_of(url: str, profile: Path, expected: str) -> str:
    """The page's DOM once it shows ``expected`` (a loaded machine renders late: up to three tries)."""
    dom = ""
    for attempt in range(3):
        dom = chromium(url, profile.with_name(f"{profile.name}-{attempt}"), "--dump-dom",
                       budget_ms=15000 * (attempt + 1))
        if expected in dom:
            break
    return dom


def run_names(dom: str, experiment_id: str) -> list[str]:
    return re.findall(rf'href="#/experiments/{experiment_id}/runs/[0-9a-f]+"><span[^>]*>([^<]*)<', dom)


def test_the_parent_run_page_shows_the_verdict_and_links_the_best_child(served, tmp_path):
    root, out, _, port = served
    url = run_url(port, experiment_id=out.experiment_id, run_id=out.parent_run_id)
    dom = dom_of(url, tmp_path / "profile", "Target")
    assert "Target reached" in dom or "Target not reached" in dom
    assert f'href="#/experiments/{out.experiment_id}/runs/{out.best["run_id"]}"' in dom
    assert f"bisect-eagle export {out.best['run_id']}" in dom
    chromium(url, tmp_path / "profile-shot", f"--screenshot={root / 'parent.png'}")
    assert (root / "parent.png").stat().st_size > 10_000


def test_the_best_child_shows_effective_params_and_the_acceptance_curve(served, tmp_path):
    root, out, _, port = served
    best = out.best["run_id"]
    dom = dom_of(
        run_url(port, experiment_id=out.experiment_id, run_id=best),
        tmp_path / "profile",
        "eagle_aux_hidden_state_layer_ids",
    )
    assert "eagle_aux_hidden_state_layer_ids" in dom and "[1, 5, 9]" in dom
    assert "accept_rate_per_position" in dom
    run = Tracking.open(out.tracking_uri, "tiny").get_run(best)
    assert run.data.params["eagle_aux_hidden_state_layer_ids"] == "[1, 5, 9]"
    assert "None" not in run.data.params["eagle_aux_hidden_state_layer_ids"]
    curve = Tracking.open(out.tracking_uri, "tiny").client.get_metric_history(best, "accept_rate_per_position")
    assert [m.step for m in curve] == list(range(int(run.data.params["num_steps"])))


def test_bisect_runs_are_not_among_the_search_trials(served, tmp_path):
    _, out, bisect, port = served
    search = Tracking.open(out.tracking_uri, "tiny")
    flat = dom_of(
        runs_url(port, out.experiment_id) + "&orderByKey=attributes.run_name&orderByAsc=true",
        tmp_path / "profile",
        out.study,
    )
    shown = run_names(flat, out.experiment_id)
    assert out.study in shown and not any("probe" in n or "bisect" in n for n in shown)
    assert not search.client.search_runs([out.experiment_id], "tags.role = 'bisect'")
    probes = Tracking.of_run(out.tracking_uri, bisect.parent_run_id)
    assert probes[0].experiment_name() == bisect_experiment("tiny")
    names = [r.info.run_name for r in probes[0].child_runs(bisect.parent_run_id)]
    assert len(names) == len(set(names)) == len(bisect.probes)
    note = probes[1].data.tags["mlflow.note.content"]
    assert "**Breaking sets**" in note and "| probe | changes applied |" in note


def test_live_trials_url_filters_and_sorts_with_the_runs_page_parameters(served, tmp_path):
    _, out, _, port = served
    url = runs_url(port, out.experiment_id, study=out.study, metric=out.metric)
    assert "searchFilter=tags.study%20%3D%20" in url and "orderByKey=metrics.%60accept_length%60" in url
    dom = dom_of(url, tmp_path / "profile", "live ")
    shown = run_names(dom, out.experiment_id)
    assert shown and all(n.startswith("live ") for n in shown)
    assert shown[0] == Tracking.open(out.tracking_uri, "tiny").get_run(out.best["run_id"]).info.run_name
