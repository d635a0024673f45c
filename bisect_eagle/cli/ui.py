"""``bisect-eagle ui``: the MLflow UI for the store (``mlflow server`` on 127.0.0.1), with two URLs: the newest
study's parent run (its description is the answer: verdict, best config, export command) and its live trials, best
first. The runs URL uses the runs page's own query parameters (``searchFilter``, ``orderByKey``, ``orderByAsc``);
the experiment's ``mlflow.experimentKind`` tag (set by :mod:`bisect_eagle.tracking`) keeps MLflow 3 from opening
it in GenAI mode, and ``workflowType=machine_learning`` opens the UI in its "Model training" mode."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote, urlencode

import typer

from bisect_eagle.cli.report import URI_HELP
from bisect_eagle.errors import BadInput

MODE = {"workflowType": "machine_learning"}  # the UI's "Model training" mode (its mode switch sets this parameter)


def server_argv(tracking_uri: str, port: int) -> list[str]:
    """``mlflow server`` for a store, bound to 127.0.0.1 (artifacts served from where runs logged them)."""
    return [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", tracking_uri,
            "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]


def runs_url(port: int, experiment_id: str | None, *, study: str | None = None, metric: str | None = None) -> str:
    """The runs table of an experiment; with ``study``, its live trials only, best ``metric`` first."""
    base = f"http://127.0.0.1:{port}/"
    if not experiment_id:
        return base
    url = f"{base}#/experiments/{experiment_id}/runs"
    query = dict(MODE)
    if study is None:
        return f"{url}?{urlencode(query)}"
    query["searchFilter"] = f"tags.study = '{study}' and tags.stage = 'live'"
    if metric:
        query |= {"orderByKey": f"metrics.`{metric}`", "orderByAsc": "false"}
    return f"{url}?{urlencode(query, quote_via=quote)}"


def run_url(port: int, *, experiment_id: str, run_id: str) -> str:
    """One run's page (a study's parent run: the verdict, the best config and its link)."""
    return f"http://127.0.0.1:{port}/#/experiments/{experiment_id}/runs/{run_id}?{urlencode(MODE)}"


def port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def free_ui_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ui_server(tracking_uri: str, port: int, *, log: Path | None = None) -> subprocess.Popen:
    """Start ``mlflow server`` in its own process group (output to ``log``, else inherited)."""
    if not tracking_uri.startswith(("sqlite:", "postgresql", "mysql", "mssql")):
        raise BadInput(f"--tracking-uri {tracking_uri}: the UI serves a database store; for an http(s) tracking "
                       "server open that server instead")
    if not port_free(port):
        raise BadInput(f"--port {port}: something already listens on 127.0.0.1:{port}; give another --port")
    out = open(log, "w") if log else None  # noqa: SIM115 (owned by the child for its lifetime)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(server_argv(tracking_uri, port), stdout=out, stderr=subprocess.STDOUT if out else None,
                            start_new_session=True, env=env)


def wait_ready(proc: subprocess.Popen, port: int, *, timeout_s: float = 120.0) -> None:
    """Wait until the server answers /health; an exit or a timeout is an error."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited with code {proc.returncode} before it was ready")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"mlflow server did not answer on 127.0.0.1:{port} within {timeout_s:g} s")


def stop_ui_server(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the server's process group, then SIGKILL it after ``grace_s``."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        proc.wait()


def ui(
    spec: Path = typer.Argument(None, help="Spec whose experiment to open (default: the embedded tiny scenario spec)."),
    tracking_uri: str = typer.Option(None, help=URI_HELP),
    port: int = typer.Option(5000, min=1, max=65535, help="Port on 127.0.0.1."),
) -> None:
    """Serve the MLflow UI for the store and print the runs URL; Ctrl-C stops it."""
    from mlflow import MlflowClient

    from bisect_eagle.cli.run import load_spec_or_default, quiet_libraries, sigterm_as_exit
    from bisect_eagle.tracking import resolve_tracking_uri, sqlite_path

    quiet_libraries()
    sigterm_as_exit()
    s = load_spec_or_default(spec, live=False)
    uri = resolve_tracking_uri(tracking_uri, s.storage.tracking_uri)
    db = sqlite_path(uri)
    if db is not None and not db.is_file():
        raise BadInput(f"--tracking-uri {uri}: no MLflow store there yet (run `bisect-eagle run` first)")
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(s.name)
    studies = [] if experiment is None else client.search_runs(
        [experiment.experiment_id], "tags.role = 'study'", order_by=["attributes.start_time DESC"], max_results=1)
    proc = start_ui_server(uri, port)
    try:
        wait_ready(proc, port)
        print(f"MLflow UI for {uri} (Ctrl-C stops it)")
        if studies:
            parent = studies[0]
            print(f"study {parent.data.tags.get('study')}: the answer (verdict, best config):")
            print(f"  {run_url(port, experiment_id=experiment.experiment_id, run_id=parent.info.run_id)}")
            print("its live trials, best first:")
            live = runs_url(port, experiment.experiment_id, study=parent.data.tags.get("study"),
                            metric=parent.data.params.get("criterion.metric"))
            print(f"  {live}")
        else:
            print(f"  {runs_url(port, experiment.experiment_id if experiment else None)}")
        proc.wait()
    except KeyboardInterrupt:
        typer.echo("stopping the MLflow UI")
    finally:
        stop_ui_server(proc)


def register(app: typer.Typer) -> None:
    app.command("ui")(ui)
