"""The MLflow UI, served by `bisect-eagle ui`'s server helpers and opened in headless Chromium after a study and a
bisect: the parent run shows the verdict and links the best child; the best child shows its effective params and
its per-position acceptance curve; the bisect's probes are in their own experiment, not among the search's trials;
the saved view of the live trials opens sorted, with its columns. Without Chromium, the view's state, its tag and
its URL are checked against what the installed MLflow's runs page reads (its JS bundle).
"""

from __future__ import annotations

import html
import json
import re
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from bisect_eagle.bisect.run import bisect_experiment
from bisect_eagle.cli.ui import (
    LIVE_VIEW_KEY,
    VIEW_PARAM,
    VIEW_TAG,
    live_view_state,
    run_url,
    runs_url,
    save_live_view,
    searched_params,
    start_ui_server,
    stop_ui_server,
    wait_ready,
)
from bisect_eagle.spec.load import load_spec
from bisect_eagle.spec.schema import DEFAULT_SPEC
from bisect_eagle.tracking.runs import Tracking

from helpers import tiny_fake_bisect, tiny_fake_study

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
needs_chromium = pytest.mark.skipif(not CHROMIUM.exists(),
                                    reason="/usr/bin/chromium is absent (Debian: apt-get install -y chromium)")
RUNS_PAGE_FACETS = ("searchFilter", "orderByKey", "orderByAsc", "startTime", "lifecycleFilter", "modelVersionFilter",
                    "datasetsFilter")  # with any of these in the URL the runs page ignores a saved view


def free_ui_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

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


class Running:
    """A stand-in for the server's process that has not exited."""

    returncode = None

    def poll(self) -> int | None:
        return None


def test_wait_ready_returns_once_the_server_answers_health():
    paths: list[str] = []

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the http.server name)
            paths.append(self.path)
            self.send_response(200 if len(paths) >= 3 else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        wait_ready(Running(), server.server_address[1], timeout_s=30)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert paths == ["/health"] * 3


def test_wait_ready_gives_up_after_its_timeout():
    port = free_ui_port()  # nothing listens there
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=rf"^mlflow server did not answer on 127\.0\.0\.1:{port} within 0\.3 s$"):
        wait_ready(Running(), port, timeout_s=0.3)
    assert 0.3 <= time.monotonic() - start < 3


def test_wait_ready_fails_at_once_when_the_server_exited():
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"^mlflow server exited with code 3 before it was ready$"):
        wait_ready(proc, free_ui_port(), timeout_s=60)
    assert time.monotonic() - start < 1


def chromium(url: str, profile: Path, *extra: str, budget_ms: int = 15000, width: int = 1400) -> str:
    argv = [str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},1800",
            f"--virtual-time-budget={budget_ms}", *extra, url]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=True)
    return html.unescape(done.stdout)


def dom_of(url: str, profile: Path, expected: str, *, width: int = 1400) -> str:
    """The page's DOM once it shows ``expected`` (a loaded machine renders late: up to three tries)."""
    dom = ""
    for attempt in range(3):
        dom = chromium(url, profile.with_name(f"{profile.name}-{attempt}"), "--dump-dom",
                       budget_ms=15000 * (attempt + 1), width=width)
        if expected in dom:
            break
    return dom


def run_names(dom: str, experiment_id: str) -> list[str]:
    return re.findall(rf'href="#/experiments/{experiment_id}/runs/[0-9a-f]+"><span[^>]*>([^<]*)<', dom)


@needs_chromium
def test_the_parent_run_page_shows_the_verdict_and_links_the_best_child(served, tmp_path):
    root, out, _, port = served
    url = run_url(port, experiment_id=out.experiment_id, run_id=out.parent_run_id)
    dom = dom_of(url, tmp_path / "profile", "Target")
    assert "Target reached" in dom or "Target not reached" in dom
    assert f'href="#/experiments/{out.experiment_id}/runs/{out.best["run_id"]}"' in dom
    assert f"bisect-eagle export {out.best['run_id']}" in dom
    chromium(url, tmp_path / "profile-shot", f"--screenshot={root / 'parent.png'}")
    assert (root / "parent.png").stat().st_size > 10_000


@needs_chromium
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


@needs_chromium
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


@needs_chromium
def test_the_live_trials_view_opens_best_first_with_the_columns_that_matter(served, tmp_path):
    """Wide enough for every column (the grid renders only the columns in sight; the assistant panel takes a third)."""
    _, out, _, port = served
    tracking = Tracking.open(out.tracking_uri, "tiny")
    searched = searched_params(load_spec(DEFAULT_SPEC))
    view = save_live_view(tracking.client, out.experiment_id, study=out.study, metric=out.metric, searched=searched)
    dom = dom_of(runs_url(port, out.experiment_id, view=view), tmp_path / "profile", "live ", width=2600)
    shown = run_names(dom, out.experiment_id)
    assert shown and all(n.startswith("live ") for n in shown)
    assert shown[0] == tracking.get_run(out.best["run_id"]).info.run_name
    headers = set(re.findall(r'col-id="([^"]+)"', dom))
    wanted = live_view_state(study=out.study, metric=out.metric, searched=searched)["selectedColumns"]
    assert set(wanted) <= headers, sorted(set(wanted) - headers)
    assert {"metrics.`output_tok_s_ratio_to_baseline`", "params.`num_steps`", "tags.`stage`"} <= headers
    assert "params.`requested.num_draft_tokens`" not in headers  # only the selected columns, not every param
    assert "bisect-eagle: live trials of" in dom  # the view is named in the page's "Views" menu


def test_searched_params_are_the_wiring_and_the_space():
    spec = load_spec(DEFAULT_SPEC)
    assert searched_params(spec) == ["eagle_aux_hidden_state_layer_ids", "num_steps", "num_draft_tokens"]
    spec.standalone.wirings = []
    assert searched_params(spec) == ["num_steps", "num_draft_tokens"]


def test_the_live_view_state_filters_sorts_and_selects_columns():
    state = live_view_state(study="tiny-1", metric="accept_length", searched=["num_steps"])
    assert state["searchFilter"] == "tags.study = 'tiny-1' and tags.stage = 'live'"
    assert state["orderByKey"] == "metrics.`accept_length`" and state["orderByAsc"] is False
    assert state["selectedColumns"] == [
        "metrics.`accept_length`", "metrics.`accept_length_ratio_to_baseline`", "metrics.`output_tok_s`",
        "metrics.`output_tok_s_ratio_to_baseline`", "params.`num_steps`", "tags.`stage`"]
    tok_s = live_view_state(study="s", metric="output_tok_s", searched=[])["selectedColumns"]
    assert tok_s[:2] == ["metrics.`output_tok_s`", "metrics.`output_tok_s_ratio_to_baseline`"]
    assert len(tok_s) == len(set(tok_s)) == 5


def test_the_view_is_one_experiment_tag_in_the_runs_page_envelope(tmp_path):
    tracking = Tracking.open(f"sqlite:///{tmp_path}/mlflow.db", "views")
    for study in ("s-1", "s-2"):
        key = save_live_view(tracking.client, tracking.experiment_id, study=study, metric="accept_length",
                             searched=["num_steps"])
    tags = tracking.client.get_experiment(tracking.experiment_id).tags
    assert [k for k in tags if k.startswith(VIEW_TAG)] == [VIEW_TAG + key]  # replaced, not one per study
    envelope = json.loads(tags[VIEW_TAG + LIVE_VIEW_KEY])
    assert envelope["name"] == "bisect-eagle: live trials of s-2"
    assert isinstance(envelope["createdAt"], int) and envelope["updatedAt"] >= envelope["createdAt"]
    assert json.loads(envelope["state"]) == live_view_state(study="s-2", metric="accept_length", searched=["num_steps"])


def test_the_view_url_carries_no_facet_that_would_override_it():
    url = runs_url(5000, "7", view=LIVE_VIEW_KEY)
    assert url == (f"http://127.0.0.1:5000/#/experiments/7/runs?{VIEW_PARAM}={LIVE_VIEW_KEY}"
                   "&compareRunsMode=TABLE&workflowType=machine_learning")
    assert not any(f"{facet}=" in url for facet in RUNS_PAGE_FACETS)
    assert runs_url(5000, None) == "http://127.0.0.1:5000/"


def test_the_installed_runs_page_reads_what_ui_writes():
    """The names ui relies on are in the installed MLflow's UI bundle (a newer MLflow that drops one fails here)."""
    import mlflow

    bundle = Path(mlflow.__file__).parent / "server" / "js" / "build" / "static" / "js"
    text = "".join(p.read_text(errors="replace") for p in bundle.glob("*.js"))
    for name in (VIEW_PARAM, VIEW_TAG, '"compareRunsMode"', '"workflowType"', "createdAt", "selectedColumns",
                 *(f'"{facet}"' for facet in RUNS_PAGE_FACETS)):
        assert name in text, name
