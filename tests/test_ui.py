"""The MLflow UI, served by `bisect-eagle ui`'s server helpers and opened in headless Chromium, lists a study's
parent run and its nested trial runs (standalone, baseline and live)."""

from __future__ import annotations

import html
import re
import subprocess
from pathlib import Path

import optuna
import pytest

from bisect_eagle.cli.ui import free_port, runs_url, start_server, stop_server, wait_ready
from bisect_eagle.search.study import Options, run_study
from bisect_eagle.spec import DEFAULT_SPEC, load_spec
from bisect_eagle.tracking import Tracking

from helpers import load_fake_engine

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = pytest.mark.skipif(not CHROMIUM.exists(),
                                reason="/usr/bin/chromium is absent (Debian: apt-get install -y chromium)")



@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A tiny-scenario study (real stage 1, fake live engine) in a fresh store, and an MLflow server on it."""
    root = tmp_path_factory.mktemp("ui")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = load_spec(DEFAULT_SPEC)
    spec.standalone.samples = 4
    uri = f"sqlite:///{root}/mlruns/mlflow.db"
    out = run_study(spec, Options(f"sqlite:///{root}/mlruns/optuna.db", uri), lambda s: load_fake_engine()())
    port = free_port()
    proc = start_server(uri, port, log=root / "server.log")
    try:
        wait_ready(proc, port)
        yield root, out, port
    finally:
        stop_server(proc)


def dump_dom(url: str, profile: Path) -> str:
    argv = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
            "--window-size=1400,2400", "--virtual-time-budget=15000", "--dump-dom", url]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
    return html.unescape(done.stdout)


def run_names(dom: str, experiment_id: str) -> list[str]:
    return re.findall(rf'href="#/experiments/{experiment_id}/runs/[0-9a-f]+"><span[^>]*>([^<]*)<', dom)


def test_runs_page_lists_the_parent_run_and_its_nested_trials(served, tmp_path):
    root, out, port = served
    children = Tracking.open(out.tracking_uri, "tiny").child_runs(out.parent_run_id)
    stages = {r.data.tags["stage"] for r in children}
    assert stages == {"standalone", "baseline", "live"}
    url = runs_url(port, out.experiment_id)
    assert url == f"http://127.0.0.1:{port}/#/experiments/{out.experiment_id}/runs"
    nested = dump_dom(url, tmp_path / "profile-nested")
    assert run_names(nested, out.experiment_id) == [out.study]  # the parent, its trials collapsed under it
    assert "runnamecellrenderer" in nested  # ... behind the row's expander button
    flat = dump_dom(f"{url}?orderByKey=attributes.run_name&orderByAsc=true", tmp_path / "profile-flat")
    shown = set(run_names(flat, out.experiment_id))
    assert out.study in shown
    assert {r.info.run_name for r in children} <= shown
