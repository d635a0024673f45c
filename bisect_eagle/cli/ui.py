"""``bisect-eagle ui``: the MLflow UI for the store (``mlflow server`` on 127.0.0.1), with the runs URL."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import typer

from bisect_eagle.errors import BadInput


def server_argv(tracking_uri: str, port: int) -> list[str]:
    """``mlflow server`` for a store, bound to 127.0.0.1 (artifacts served from where runs logged them)."""
    return [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", tracking_uri,
            "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]


def runs_url(port: int, experiment_id: str | None) -> str:
    """The runs table of an experiment (the experiment page opens on GenAI traces otherwise)."""
    base = f"http://127.0.0.1:{port}/"
    return f"{base}#/experiments/{experiment_id}/runs" if experiment_id else base


def port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(tracking_uri: str, port: int, log: Path | None = None) -> subprocess.Popen:
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


def wait_ready(proc: subprocess.Popen, port: int, timeout_s: float = 120.0) -> None:
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


def stop_server(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
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
    tracking_uri: str = typer.Option(None, help="MLflow tracking URI (default $MLFLOW_TRACKING_URI, else "
                                     "sqlite:///mlruns/mlflow.db)."),
    port: int = typer.Option(5000, min=1, max=65535, help="Port on 127.0.0.1."),
) -> None:
    """Serve the MLflow UI for the store and print the runs URL; Ctrl-C stops it."""
    from mlflow import MlflowClient

    from bisect_eagle.cli.run import load_spec_or_default, quiet_libraries, sigterm_as_exit
    from bisect_eagle.tracking import resolve_tracking_uri, sqlite_path

    quiet_libraries()
    sigterm_as_exit()
    s = load_spec_or_default(spec)
    uri = resolve_tracking_uri(tracking_uri, s.storage.tracking_uri)
    db = sqlite_path(uri)
    if db is not None and not db.is_file():
        raise BadInput(f"--tracking-uri {uri}: no MLflow store there yet (run `bisect-eagle run` first)")
    experiment = MlflowClient(tracking_uri=uri).get_experiment_by_name(s.name)
    proc = start_server(uri, port)
    try:
        wait_ready(proc, port)
        url = runs_url(port, experiment.experiment_id if experiment else None)
        typer.echo(f"MLflow UI for {uri}: {url}  (Ctrl-C stops it)")
        proc.wait()
    except KeyboardInterrupt:
        typer.echo("stopping the MLflow UI")
    finally:
        stop_server(proc)


def register(app: typer.Typer) -> None:
    app.command("ui")(ui)
