"""The MLflow UI, served by `bisect-eagle ui`'s server helpers and opened in headless Chromium after
a study and a bisect: the parent run shows the verdict and links the best child, and its verdict,
target and deploy command lie in the part of its description shown before "Show more"; the best
child shows its effective params and its per-position acceptance curve; the bisect's probes are in
their own experiment, not among the search's trials; the saved view of the live trials opens best
first by the exact criterion metric, with the baseline row, its columns whole and the headline
metrics rounded (the trials' display tags), and its chart view opens on the criterion metric.
Without Chromium, the view's state, its tag and its URL are checked against what the installed
MLflow's runs page reads (its JS bundle).

Where layout matters (what a collapsed description or a column shows), the test asks the page itself
over Chromium's DevTools protocol (aiohttp, a dependency of MLflow, speaks its WebSocket).
"""

from __future__ import annotations

import asyncio
import html
import io
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from bisect_eagle.bisect.run import bisect_experiment
from bisect_eagle.cli.ui import (
    LEFT_OUT_STAGES,
    LIVE_VIEW_KEY,
    RUN_NAME_COLUMN,
    VIEW_PARAM,
    VIEW_TAG,
    NotReady,
    WaitClock,
    column_width,
    live_view_state,
    run_url,
    runs_url,
    save_live_view,
    save_view,
    searched_params,
    start_ui_server,
    stop_ui_server,
    wait_ready,
)
from bisect_eagle.poll import wait_until
from bisect_eagle.spec.load import load_spec
from bisect_eagle.spec.schema import DEFAULT_SPEC
from bisect_eagle.tracking.runs import Tracking

from helpers import MARK_ENV, marked_processes, new_mark, run_cli, tiny_fake_bisect, tiny_fake_study

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="/usr/bin/chromium is absent (Debian: apt-get install -y chromium)",
)


def needs_chromium(test):
    """A test that opens the UI in headless Chromium: skipped without it, and a system test (a
    study, a bisect, an MLflow server and a browser: CI's own step)."""
    return pytest.mark.system(_chromium(test))


RUNS_PAGE_FACETS = (
    "searchFilter",
    "orderByKey",
    "orderByAsc",
    "startTime",
    "lifecycleFilter",
    "modelVersionFilter",
    # with any of these in the URL the runs page ignores a saved view
    "datasetsFilter",
)


def free_ui_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A tiny-scenario study (real stage 1, fake live engine) and a bisect in a fresh store; a
    server on it."""
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
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        wait_ready(Running(), server.server_address[1], timeout_s=30)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert paths == ["/health"] * 3


def test_wait_ready_gives_up_after_its_timeout_and_shows_the_time_waited():
    port = free_ui_port()  # nothing listens there
    ticks: list[float] = []
    start = time.monotonic()
    with pytest.raises(
        NotReady, match=rf"^mlflow server did not answer on 127\.0\.0\.1:{port} within 0\.3 s$"
    ) as e:
        wait_ready(Running(), port, timeout_s=0.3, tick=ticks.append)
    assert not e.value.exited and time.monotonic() - start >= 0.3
    assert len(ticks) >= 2 and ticks == sorted(ticks) and ticks[0] < 0.3


def test_wait_ready_fails_without_waiting_out_its_timeout_when_the_server_exited():
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    ticks: list[float] = []
    with pytest.raises(
        NotReady, match=r"^mlflow server exited with code 3 before it was ready$"
    ) as e:
        wait_ready(proc, free_ui_port(), timeout_s=3600, tick=ticks.append)
    assert e.value.exited and ticks and ticks[-1] < 3600  # the first poll saw the exit


def test_the_wait_clock_rewrites_one_line_on_a_terminal_and_writes_a_line_now_and_then_elsewhere():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Terminal()
    shown = WaitClock("waiting", timeout_s=600, stream=screen)
    for t in (0.0, 0.4, 1.2, 61.0):
        shown(t)
    shown.done(62.5)
    assert screen.getvalue() == (
        "\rwaiting: 0:00 of at most 10:00 (--timeout)\rwaiting: 0:01 of at most 10:00 "
        "(--timeout)\rwaiting: 1:01 of at most 10:00 (--timeout)\rwaiting: answered after 1:02\n"
    )
    log = io.StringIO()
    shown = WaitClock("waiting", timeout_s=3600, stream=log, every_s=15)
    for t in (0.0, 1.0, 14.9, 15.0, 40.0):
        shown(t)
    shown.done(41)
    expected = [f"waiting: {t} of at most 1:00:00 (--timeout)" for t in ("0:00", "0:15", "0:40")]
    assert log.getvalue().splitlines() == [*expected, "waiting: answered after 0:41"]


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory) -> str:
    """An MLflow store with its tables and no experiment of the spec."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path_factory.mktemp('store')}/mlflow.db"
    MlflowClient(tracking_uri=uri).search_experiments()
    return uri


@pytest.mark.parametrize(
    "server, code, said",
    [
        (
            "import time; time.sleep(600)",
            3,
            "mlflow server did not answer on 127.0.0.1:{port} within 1 s; a loaded machine may "
            "need longer: give a longer --timeout",
        ),
        (
            "print('Traceback (most recent call last):'); print('OSError: the store is locked'); "
            "raise SystemExit(4)",
            1,
            "mlflow server exited with code 4 before it was ready; its last line: OSError: the "
            "store is locked",
        ),
    ],
)
def test_a_server_that_never_answers_is_one_line_and_no_traceback(
    empty_store, tmp_path, monkeypatch, capsys, server, code, said
):
    """A stand-in for ``mlflow server`` that never answers (--timeout 1) or dies at once: the time
    waited, then one error line naming the server's log, kept; no process left."""
    import bisect_eagle.cli.ui as ui_cli

    mark = new_mark()
    monkeypatch.setenv(MARK_ENV, mark)
    monkeypatch.setattr(ui_cli, "server_argv", lambda uri, port: [sys.executable, "-c", server])
    port = free_ui_port()
    got, out, err = run_cli(
        ["ui", "--tracking-uri", empty_store, "--port", str(port), "--timeout", "1"],
        monkeypatch,
        capsys,
    )
    assert got == code and out == ""
    lines = err.splitlines()
    assert (
        lines[0]
        == f"waiting for the MLflow server on 127.0.0.1:{port}: 0:00 of at most 0:01 (--timeout)"
    )
    assert (
        lines[-1].startswith(f"error: {said.format(port=port)}") and lines[-1].count("error:") == 1
    ), lines
    log = Path(re.search(r"log: (\S+)\)$", lines[-1]).group(1))
    assert log.is_file() and log.name.startswith(f"bisect-eagle-ui-{port}-")
    # no traceback of ours
    assert all(line.startswith("waiting for the MLflow server") for line in lines[:-1])
    assert marked_processes(mark) == []
    log.unlink()


@pytest.mark.parametrize("asked,seen", [(None, "false"), ("true", "true")])
def test_mlflows_job_runners_stay_off_unless_asked_for(
    empty_store, tmp_path, monkeypatch, asked, seen
):
    """The server starts without MLflow's job runners (a pool of processes nothing here uses); a
    user who set MLFLOW_SERVER_ENABLE_JOB_EXECUTION keeps their value."""
    import bisect_eagle.cli.ui as ui_cli

    if asked is None:
        monkeypatch.delenv(ui_cli.JOB_EXECUTION, raising=False)
    else:
        monkeypatch.setenv(ui_cli.JOB_EXECUTION, asked)
    said = tmp_path / "env.txt"
    server = (
        "import os, pathlib; "
        f"pathlib.Path({str(said)!r}).write_text(os.environ[{ui_cli.JOB_EXECUTION!r}])"
    )
    monkeypatch.setattr(ui_cli, "server_argv", lambda uri, port: [sys.executable, "-c", server])
    proc = ui_cli.start_ui_server(empty_store, free_ui_port())
    assert proc.wait(timeout=600) == 0
    assert said.read_text() == seen


def test_a_port_taken_leaves_no_log_behind(empty_store, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        code, _, err = run_cli(
            ["ui", "--tracking-uri", empty_store, "--port", str(port)], monkeypatch, capsys
        )
    assert code == 2 and err.startswith(f"error: --port {port}: 127.0.0.1:{port} is taken")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.system
def test_ui_beside_cpu_burners_prints_the_url_not_a_traceback(empty_store, tmp_path):
    """`bisect-eagle ui` on a machine kept busy by a busy loop per core: MLflow's server answers
    late, the time waited is shown, and the URL comes, not a traceback."""
    mark = new_mark()
    env = {**{k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}, MARK_ENV: mark}
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in range(os.cpu_count() or 2)
    ]
    port = free_ui_port()
    err = tmp_path / "stderr.txt"
    with err.open("w") as stderr:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bisect_eagle.cli",
                "ui",
                "--tracking-uri",
                empty_store,
                "--port",
                str(port),
            ],
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
            cwd=tmp_path,
            start_new_session=True,
        )
    # read from the pipe's descriptor: a buffered readline would hold the URL's line unseen by
    # select
    said_out = ""
    try:
        deadline = time.monotonic() + 1200
        while f"http://127.0.0.1:{port}/" not in said_out:
            if proc.poll() is not None or time.monotonic() > deadline:
                break
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if ready:
                said_out += os.read(proc.stdout.fileno(), 65536).decode(errors="replace")
    finally:
        for burner in burners:
            os.killpg(burner.pid, signal.SIGKILL)
            burner.wait()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # ui stops its server on SIGTERM
        proc.wait(timeout=120)
    said = err.read_text()
    if f"http://127.0.0.1:{port}/" not in said_out and proc.returncode is None:
        pytest.fail(
            "`bisect-eagle ui` printed no URL within 1200 s: the machine was too slow",
            pytrace=False,
        )
    assert f"http://127.0.0.1:{port}/" in said_out, (said_out, said)
    assert (
        "Traceback" not in said
        and f"waiting for the MLflow server on 127.0.0.1:{port}: 0:00" in said
    ), said
    assert "answered after" in said
    assert wait_until(lambda: marked_processes(mark) == [], timeout_s=60)  # the server went with ui


def chromium(
    url: str, profile: Path, *extra: str, budget_ms: int = 15000, width: int = 1400
) -> str:
    argv = [
        str(CHROMIUM),
        *FLAGS,
        f"--user-data-dir={profile}",
        f"--window-size={width},1800",
        f"--virtual-time-budget={budget_ms}",
        *extra,
        url,
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=True)
    return html.unescape(done.stdout)


def dom_of(url: str, profile: Path, expected: str, *, width: int = 1400) -> str:
    """The page's DOM once it shows ``expected`` (a loaded machine renders late: up to three
    tries)."""
    dom = ""
    for attempt in range(3):
        dom = chromium(
            url,
            profile.with_name(f"{profile.name}-{attempt}"),
            "--dump-dom",
            budget_ms=15000 * (attempt + 1),
            width=width,
        )
        if expected in dom:
            break
    return dom


def run_names(dom: str, experiment_id: str) -> list[str]:
    return re.findall(
        rf'href="#/experiments/{experiment_id}/runs/[0-9a-f]+"><span[^>]*>([^<]*)<', dom
    )


def page_value(
    url: str, expression: str, profile: Path, *, width: int = 1400, timeout_s: float = 120
) -> Any:
    """The first value other than null of the JavaScript ``expression`` on the page at ``url``,
    evaluated every half second in headless Chromium over its DevTools protocol (a loaded machine
    renders late); None when the page never gives one within ``timeout_s``."""
    import aiohttp

    port = free_ui_port()
    argv = [
        str(CHROMIUM),
        *FLAGS,
        f"--user-data-dir={profile}",
        f"--window-size={width},1800",
        f"--remote-debugging-port={port}",
        "about:blank",
    ]
    browser = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    async def poll() -> Any:
        deadline = time.monotonic() + timeout_s
        async with aiohttp.ClientSession() as session:
            while True:  # the DevTools endpoint answers once the browser is up
                try:
                    targets = await (await session.get(f"http://127.0.0.1:{port}/json/list")).json()
                    break
                except aiohttp.ClientError:
                    if time.monotonic() > deadline:
                        return None
                    await asyncio.sleep(0.2)
            page = next(t for t in targets if t["type"] == "page")
            async with session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                calls = 0

                async def call(method: str, **params: Any) -> dict[str, Any]:
                    nonlocal calls
                    calls += 1
                    await ws.send_json({"id": calls, "method": method, "params": params})
                    # events (no id) and nothing else come between a call and its answer
                    while True:
                        answer = await ws.receive_json()
                        if answer.get("id") == calls:
                            return answer["result"]

                await call("Page.navigate", url=url)
                while time.monotonic() < deadline:
                    value = (
                        await call("Runtime.evaluate", expression=expression, returnByValue=True)
                    )["result"]
                    if value.get("value") is not None:
                        return value["value"]
                    await asyncio.sleep(0.5)
        return None

    try:
        return asyncio.run(poll())
    finally:
        browser.kill()
        browser.wait()


# The part of the parent run's description in sight before "Show more": the box that clips it
# (overflow hidden, a max-height) around the first needle and, for each needle, whether its text is
# in that box and its lines end above the box's bottom edge; null until the first needle is on the
# page.
SHOWN_BEFORE_SHOW_MORE = """((needles) => {
  const first = (root, needle) => {
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const at = node.textContent.indexOf(needle);
      if (at >= 0) {
        const range = document.createRange();
        range.setStart(node, at);
        range.setEnd(node, at + needle.length);
        return range;
      }
    }
    return null;
  };
  const anchor = first(document.body, needles[0]);
  if (!anchor) return null;
  let box = anchor.startContainer.parentElement;
  const clipped = (el) => {
    const style = getComputedStyle(el);
    return style.overflow === "hidden" && style.maxHeight !== "none";
  };
  while (box && !clipped(box)) {
    box = box.parentElement;
  }
  if (!box) return {collapsed: false};
  const clip = box.getBoundingClientRect();
  const inside = {};
  for (const needle of needles) {
    const range = first(box, needle);
    const r = range && range.getBoundingClientRect();
    // a line box overhangs its block by half its leading (a heading's 22 px line in an 18 px block)
    inside[needle] = Boolean(r) && r.height > 0
      && r.top >= clip.top - r.height / 4 && r.bottom <= clip.bottom;
  }
  const showMore = [...document.querySelectorAll("button")]
    .some(b => b.textContent.trim() === "Show more");
  return {collapsed: true, showMore, inside, clipHeight: clip.height};
})(NEEDLES)"""

# Every header and cell of the runs table with its text: [header?, column id, text, whether the text
# ends inside its cell, its row's index (null for a header)]; null until the table shows the column
# ``LAST``.
TABLE_TEXT = """(() => {
  const cells = [...document.querySelectorAll(".ag-header-cell[col-id], .ag-cell[col-id]")];
  if (!cells.some(c => c.getAttribute("col-id") === LAST)) return null;
  const deepest = (el) => {
    const next = [...el.children].find(c => c.textContent.trim() === el.textContent.trim());
    return next ? deepest(next) : el;
  };
  return cells.filter(c => c.textContent.trim()).map(c => {
    const range = document.createRange();
    range.selectNodeContents(deepest(c));
    const whole = range.getBoundingClientRect().right <= c.getBoundingClientRect().right;
    const row = c.closest(".ag-row");
    return [c.classList.contains("ag-header-cell"), c.getAttribute("col-id"), c.textContent.trim(),
            whole, row && row.getAttribute("row-index")];
  });
})()"""


@needs_chromium
def test_the_parent_run_page_shows_the_verdict_and_links_the_best_child(served, tmp_path):
    root, out, _, port = served
    url = run_url(port, experiment_id=out.experiment_id, run_id=out.parent_run_id)
    dom = dom_of(url, tmp_path / "profile", "Target")
    assert "Target reached" in dom or "Target not reached" in dom
    assert f'href="#/experiments/{out.experiment_id}/runs/{out.best["run_id"]}"' in dom
    assert f"bisect-eagle export {out.best['run_id'][:8]}" in dom
    chromium(url, tmp_path / "profile-shot", f"--screenshot={root / 'parent.png'}")
    assert (root / "parent.png").stat().st_size > 10_000


@needs_chromium
def test_the_study_page_shows_verdict_target_and_deploy_command_before_show_more(served, tmp_path):
    """The description's collapsed box (MLflow shows its first 100 px until "Show more") holds the
    answer."""
    _, out, _, port = served
    verdict = "Target reached" if out.target_reached else "Target not reached"
    export = f"bisect-eagle export {out.best['run_id'][:8]} --tracking-uri {out.tracking_uri}"
    needles = [export, verdict, "target ≥"]
    shown = page_value(
        run_url(port, experiment_id=out.experiment_id, run_id=out.parent_run_id),
        SHOWN_BEFORE_SHOW_MORE.replace("NEEDLES", json.dumps(needles)),
        tmp_path / "profile",
    )
    assert shown is not None, "the description never showed"
    # the rest is behind "Show more", not expanded
    assert shown["collapsed"] and shown["showMore"], shown
    assert shown["inside"] == dict.fromkeys(needles, True), shown


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
    curve = Tracking.open(out.tracking_uri, "tiny").client.get_metric_history(
        best, "accept_rate_per_position"
    )
    assert [m.step for m in curve] == list(range(int(run.data.params["num_steps"])))


@needs_chromium
def test_the_best_trials_page_leads_with_its_description_and_its_own_metrics(served, tmp_path):
    """No system metric is listed before the trial's own (they are off unless asked for), and its
    description says what it measured against the baseline, the criterion metric first."""
    _, out, _, port = served
    run = Tracking.open(out.tracking_uri, "tiny").get_run(out.best["run_id"])
    note = run.data.tags["mlflow.note.content"]
    assert (
        note.startswith(f"**Live trial `{run.data.tags['trial']}`**: ok")
        and "accept_length " in note
    )
    dom = dom_of(
        run_url(port, experiment_id=out.experiment_id, run_id=out.best["run_id"]),
        tmp_path / "profile",
        "the baseline",
    )
    assert "the baseline" in dom and "accept_length_ratio_to_baseline" in dom
    assert "system/" not in dom and not any(k.startswith("system/") for k in run.data.metrics)


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
def test_the_bisect_run_page_shows_each_changes_good_and_bad_value(served, tmp_path):
    _, out, bisect, port = served
    tracking, parent = Tracking.of_run(out.tracking_uri, bisect.parent_run_id)
    wiring = "eagle_aux_hidden_state_layer_ids"
    assert (
        parent.data.params[f"change.{wiring}.good"],
        parent.data.params[f"change.{wiring}.bad"],
    ) == ("[1, 5, 9]", "[-1, 1, 5]")  # tiny.yaml vs tiny-broken.yaml
    dom = dom_of(
        run_url(port, experiment_id=tracking.experiment_id, run_id=bisect.parent_run_id),
        tmp_path / "profile",
        f"change.{wiring}.bad",
    )
    for c in bisect.changes:
        settings = list(c.good)
        assert all(f"change.{s}.good" in dom and f"change.{s}.bad" in dom for s in settings), c.name
    assert "[-1, 1, 5]" in dom


@needs_chromium
def test_the_live_trials_view_opens_best_first_with_the_baseline_whole_columns_and_rounded_values(
    served, tmp_path
):
    """Wide enough for every column (the grid renders only the columns in sight; the assistant panel
    takes a third). The headline columns are the trials' display tags, rounded; the rows are sorted
    by the exact criterion metric, which is not among the columns: the same view sorted ascending
    lists the baseline first (MLflow's own order, newest first, puts it last)."""
    _, out, _, port = served
    tracking = Tracking.open(out.tracking_uri, "tiny")
    searched = searched_params(load_spec(DEFAULT_SPEC))
    view = save_live_view(
        tracking.client, out.experiment_id, study=out.study, metric=out.metric, searched=searched
    )
    url = runs_url(port, out.experiment_id, view=view)
    runs = {
        r.info.run_name: r
        for r in tracking.client.search_runs([out.experiment_id], f"tags.study = '{out.study}'")
    }
    stage = {n: r.data.tags.get("stage") for n, r in runs.items()}
    baseline = next(n for n, s in stage.items() if s == "baseline")
    dom = dom_of(url, tmp_path / "profile", f">{baseline}<", width=3000)
    shown = run_names(dom, out.experiment_id)
    # every live trial, then it
    assert [stage[n] for n in shown] == ["live"] * (len(shown) - 1) + ["baseline"]
    assert sorted(shown) == sorted(n for n, s in stage.items() if s in ("live", "baseline"))
    assert shown[0] == tracking.get_run(out.best["run_id"]).info.run_name
    exact = [runs[n].data.metrics[out.metric] for n in shown if out.metric in runs[n].data.metrics]
    # by the exact metric, not by its rounded tag's text
    assert exact == sorted(exact, reverse=True)
    state = live_view_state(study=out.study, metric=out.metric, searched=searched)
    save_view(
        tracking.client,
        out.experiment_id,
        key="ascending",
        name="ascending",
        state=state | {"orderByAsc": True},
    )
    ascending = dom_of(
        runs_url(port, out.experiment_id, view="ascending"),
        tmp_path / "profile-asc",
        f">{baseline}<",
        width=3000,
    )
    upward = run_names(ascending, out.experiment_id)
    # newest first would put it last
    assert sorted(upward) == sorted(shown) and upward[0] == baseline
    assert [
        runs[n].data.metrics[out.metric] for n in upward if out.metric in runs[n].data.metrics
    ] == sorted(exact)
    table = page_value(
        url,
        TABLE_TEXT.replace("LAST", json.dumps(state["selectedColumns"][-1])),
        tmp_path / "profile-layout",
        width=3000,
    )
    assert table is not None, "the table never showed its last column"
    headers = {col for header, col, *_ in table if header}
    assert set(state["selectedColumns"]) <= headers, sorted(set(state["selectedColumns"]) - headers)
    # only the selected columns, not every param
    assert "params.`requested.num_draft_tokens`" not in headers
    # the exact metrics are the charts' and report's
    assert not any(col.startswith("metrics.") for col in headers)
    ours = {RUN_NAME_COLUMN, *state["selectedColumns"]}
    cut = [(col, text) for _, col, text, whole, _ in table if col in ours and not whole]
    assert not cut, cut  # every header and value of the view's columns ends inside its cell
    # the cell starts with the run's colour
    name_of = {
        row: next(n for n in shown if text.endswith(n))
        for header, col, text, _, row in table
        if not header and col == RUN_NAME_COLUMN
    }
    cells = {
        (name_of[row], col.split("`")[1]): text
        for header, col, text, _, row in table
        if not header and col.startswith("tags.`shown.")
    }
    assert cells == {
        (n, col.split("`")[1]): runs[n].data.tags.get(col.split("`")[1], "-")
        for n in shown
        # "-": no such tag
        for col in state["selectedColumns"]
        if col.startswith("tags.`shown.")
    }
    assert [k for (n, k), text in cells.items() if n == baseline and text == "-"] == [
        # the baseline's ratios
        "shown.accept_length_ratio_to_baseline",
        "shown.output_tok_s_ratio_to_baseline",
    ]
    measured = [text for text in cells.values() if text != "-"]
    # 4 decimals at most
    assert all(re.fullmatch(r"\d+(\.\d{1,4})?×?", text) for text in measured), cells
    best = tracking.get_run(out.best["run_id"]).data.metrics["output_tok_s"]
    assert cells[(shown[0], "shown.output_tok_s")] == (
        f"{best:.1f}" if best >= 100 else f"{best:.3g}"
    )
    assert "bisect-eagle: live trials of" in dom  # the view is named in the page's "Views" menu


@needs_chromium
def test_the_compare_view_of_trial_runs_opens_on_the_criterion_metric(served, tmp_path):
    """A study judged by ``output_tok_s``, which MLflow's alphabetical default would put after
    ``accept_length``: the view's chart view opens on it, then its ratio and the other headline
    metric, model metrics before system metrics."""
    _, out, _, port = served
    tracking = Tracking.open(out.tracking_uri, "tiny")
    view = save_live_view(
        tracking.client,
        out.experiment_id,
        study=out.study,
        metric="output_tok_s",
        searched=searched_params(load_spec(DEFAULT_SPEC)),
    )
    dom = dom_of(
        runs_url(port, out.experiment_id, view=view, mode="CHART"),
        tmp_path / "profile",
        'title="accept_length_ratio_to_baseline"',
    )
    charts = re.findall(r'<h4[^>]*title="([^"]+)"', dom)
    assert charts[:4] == [
        "output_tok_s",
        "output_tok_s_ratio_to_baseline",
        "accept_length",
        "accept_length_ratio_to_baseline",
    ], charts
    assert dom.index("Model metrics") < dom.index("System metrics")


def test_searched_params_are_the_wiring_and_the_space():
    spec = load_spec(DEFAULT_SPEC)
    assert searched_params(spec) == [
        "eagle_aux_hidden_state_layer_ids",
        "num_steps",
        "num_draft_tokens",
    ]
    spec.standalone.wirings = []
    assert searched_params(spec) == ["num_steps", "num_draft_tokens"]


def test_the_live_view_state_filters_sorts_and_selects_columns():
    state = live_view_state(study="tiny-1", metric="accept_length", searched=["num_steps"])
    assert state["searchFilter"] == (
        "tags.study = 'tiny-1' and tags.stage != 'standalone' and tags.stage != 'confirm'"
    )
    assert LEFT_OUT_STAGES == ("standalone", "confirm")
    assert state["orderByKey"] == "metrics.`accept_length`" and state["orderByAsc"] is False
    assert state["selectedColumns"] == [
        "tags.`shown.accept_length`",
        "tags.`shown.accept_length_ratio_to_baseline`",
        "tags.`shown.output_tok_s`",
        "tags.`shown.output_tok_s_ratio_to_baseline`",
        "params.`num_steps`",
        "tags.`stage`",
    ]
    tok_s = live_view_state(study="s", metric="output_tok_s", searched=[])["selectedColumns"]
    assert tok_s[:2] == ["tags.`shown.output_tok_s`", "tags.`shown.output_tok_s_ratio_to_baseline`"]
    assert len(tok_s) == len(set(tok_s)) == 5


def test_the_live_view_gives_every_column_the_width_of_its_header():
    state = live_view_state(
        study="s", metric="accept_length", searched=["eagle_aux_hidden_state_layer_ids"]
    )
    # widths apply to listed columns
    assert state["columnOrder"] == [RUN_NAME_COLUMN, *state["selectedColumns"]]
    widths = state["columnWidths"]
    assert set(widths) == set(state["columnOrder"])
    assert (
        widths["tags.`shown.accept_length`"] == column_width("shown.accept_length") == 7 * 19 + 40
    )
    ratio = "shown.accept_length_ratio_to_baseline"
    assert widths[f"tags.`{ratio}`"] == 7 * len(ratio) + 40
    assert (
        widths["params.`eagle_aux_hidden_state_layer_ids`"]
        == 7 * len("eagle_aux_hidden_state_layer_ids") + 40
    )
    assert widths["tags.`stage`"] == 7 * len("stage") + 40


def test_the_live_view_charts_open_on_the_criterion_then_the_headline_metrics():
    state = live_view_state(study="s", metric="output_tok_s", searched=[])
    cards = state["compareRunCharts"]
    assert [c["metricKey"] for c in cards] == [
        "output_tok_s",
        "output_tok_s_ratio_to_baseline",
        "accept_length",
        "accept_length_ratio_to_baseline",
    ]
    model, system = state["compareRunSections"]
    assert (model["name"], system["name"]) == ("Model metrics", "System metrics")
    assert all(
        c["metricSectionId"] == model["uuid"] and c["type"] == "BAR" and not c["deleted"]
        for c in cards
    )
    # MLflow appends the other metrics' charts
    assert model["isReordered"] and system["isReordered"]
    assert len({c["uuid"] for c in cards}) == len(cards)


def test_the_view_is_one_experiment_tag_in_the_runs_page_envelope(tmp_path):
    tracking = Tracking.open(f"sqlite:///{tmp_path}/mlflow.db", "views")
    for study in ("s-1", "s-2"):
        key = save_live_view(
            tracking.client,
            tracking.experiment_id,
            study=study,
            metric="accept_length",
            searched=["num_steps"],
        )
    tags = tracking.client.get_experiment(tracking.experiment_id).tags
    # replaced, not one per study
    assert [k for k in tags if k.startswith(VIEW_TAG)] == [VIEW_TAG + key]
    envelope = json.loads(tags[VIEW_TAG + LIVE_VIEW_KEY])
    assert envelope["name"] == "bisect-eagle: live trials of s-2"
    assert isinstance(envelope["createdAt"], int) and envelope["updatedAt"] >= envelope["createdAt"]
    assert json.loads(envelope["state"]) == live_view_state(
        study="s-2", metric="accept_length", searched=["num_steps"]
    )


def test_the_view_url_carries_no_facet_that_would_override_it():
    url = runs_url(5000, "7", view=LIVE_VIEW_KEY)
    assert url == (
        f"http://127.0.0.1:5000/#/experiments/7/runs?{VIEW_PARAM}={LIVE_VIEW_KEY}&compareRunsMode=TABLE&workflowType=machine_learning"
    )
    assert not any(f"{facet}=" in url for facet in RUNS_PAGE_FACETS)
    assert runs_url(5000, None) == "http://127.0.0.1:5000/"
    charts = runs_url(5000, "7", view=LIVE_VIEW_KEY, mode="CHART")
    assert charts == url.replace("compareRunsMode=TABLE", "compareRunsMode=CHART")


def test_the_installed_runs_page_reads_what_ui_writes():
    """The names ui relies on are in the installed MLflow's UI bundle (a newer MLflow that drops one
    fails here), and every key of the view's state is one the runs page applies from a shared
    view."""
    import mlflow

    bundle = Path(mlflow.__file__).parent / "server" / "js" / "build" / "static" / "js"
    text = "".join(p.read_text(errors="replace") for p in bundle.glob("*.js"))
    for name in (
        VIEW_PARAM,
        VIEW_TAG,
        '"compareRunsMode"',
        '"workflowType"',
        "createdAt",
        '"Run Name"',
        '"Model metrics"',
        '"System metrics"',
        "isReordered",
        "metricSectionId",
        "runsCountToCompare",
        *(f'"{facet}"' for facet in RUNS_PAGE_FACETS),
    ):
        assert name in text, name
    ui_state = json.loads(re.search(r'\["selectedColumns","columnOrder",[^\]]*\]', text).group())
    not_shared = json.loads(re.search(r'\["runsExpanded","runsPinned",[^\]]*\]', text).group())
    state = live_view_state(study="s", metric="accept_length", searched=["num_steps"])
    applied = set(ui_state) - set(not_shared)
    assert set(state) - set(RUNS_PAGE_FACETS) <= applied, sorted(
        set(state) - set(RUNS_PAGE_FACETS) - applied
    )
