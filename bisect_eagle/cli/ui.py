"""``bisect-eagle ui``: the MLflow UI for the store (``mlflow server`` on 127.0.0.1), with three
URLs: the newest study's parent run (its description is the answer: verdict, best config, export
command), its live trials and baseline, best first, with the columns that matter, and their charts,
the criterion metric first.

The runs table opens in one of the runs page's saved views (MLflow >= 3.15: "Views -> Save as new
view" in the UI, shareable by URL): a view is the experiment tag ``mlflow.sharedViewState.<key>``
holding ``{"name", "createdAt", "updatedAt", "state"}`` with ``state`` the page's state as JSON, and
``#/experiments/<id>/runs?viewStateShareKey=<key>`` opens it. MLflow 3.17 applies from a view the
search facets (``searchFilter``, ``orderByKey``, ``orderByAsc``, ...) and these keys of the page's
UI state: ``selectedColumns``, ``columnOrder``, ``columnWidths``, ``runsHiddenMode``,
``compareRunCharts``, ``compareRunSections``, ``isAccordionReordered``, ``groupBy`` and a few
display switches (not the pinned, hidden or expanded runs). Columns are not a URL parameter of the
runs page in 3.17 (its own parameters are only the facets plus ``startTime``, ``lifecycleFilter``,
``modelVersionFilter``, ``datasetsFilter``, ``compareRunsMode`` and ``workflowType``), and a URL
that carries a facet makes the page ignore the view, so the view's URL carries none.

:func:`save_live_view` writes one view per experiment (key ``bisect-eagle-live-trials``, overwritten
by each ``ui``): the newest study's live trials and its baseline, best first by the exact criterion
metric, with the criterion metric, accept length, output tok/s and their ratios to the baseline as
the trials' display tags (``shown.<metric>``, rounded:
:func:`bisect_eagle.trials.record.shown_tags`), the searched params and the stage, each column as
wide as its header. MLflow 3.17 has no per-column number format (its runs table shows a metric's
value as logged: ``4.800000190734863``), and it sorts by ``orderByKey`` whether or not that column
is shown, so the view shows the tags and sorts by the metric (a run logged before the display tags
existed shows "-" there). MLflow's search has no OR and no IN for tags, so the view keeps the
study's runs whose stage is neither of :data:`LEFT_OUT_STAGES`. Its chart cards
(``compareRunsMode=CHART``, the "compare" view) open on the criterion metric, then the headline
metrics and their ratios (the exact metrics): without cards MLflow makes one per metric in
alphabetical order. Its sections are marked reordered, so a metric the cards do not name (the rest,
the system metrics in their own section after the model metrics) gets its chart appended after them
rather than sorted in among them, and ``isAccordionReordered`` keeps the sections in the view's
order (MLflow would sort a section of any other metric prefix before them). The experiment's
``mlflow.experimentKind`` tag (set by :mod:`bisect_eagle.tracking.runs`) keeps MLflow 3 from opening
it in GenAI mode, and ``workflowType=machine_learning`` opens the UI in its "Model training" mode.

The assistant panel: MLflow 3.17 opens it by itself on a browser's first visit to a server it
considers local (the page's host is ``localhost``, ``127.0.0.1`` or ``::1``) and remembers in the
browser's localStorage, per origin, that it did (``mlflow.assistant.fab.autoOpenedOnFirstLoad_v1``)
and whether the panel is open (``mlflow.assistant.panelOpen_v1``). ``mlflow server`` has no option
or environment variable that turns the panel off (``MLFLOW_ENABLE_REMOTE_ASSISTANT`` only opens its
API to remote clients) and the UI reads no URL parameter for it, so nothing on the server or URL
side keeps it closed. Closing it once is remembered per browser and port (hence the fixed default
port, 5000), and ``ui`` says so when it starts.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote, urlencode

import typer

from bisect_eagle.cli.common import URI_HELP
from bisect_eagle.errors import BadInput
from bisect_eagle.keys import IDS_KEY
from bisect_eagle.poll import wait_until
from bisect_eagle.spec.schema import Spec
from bisect_eagle.trials.record import HEADLINE, SHOWN_TAG, ratio_name

# the UI's "Model training" mode (its mode switch sets this parameter)
MODE = {"workflowType": "machine_learning"}
VIEW_TAG = "mlflow.sharedViewState."  # + key: a saved view of the runs page (MLflow >= 3.15)
VIEW_PARAM = "viewStateShareKey"  # the runs page's parameter that opens a saved view
LIVE_VIEW_KEY = "bisect-eagle-live-trials"
ASSISTANT_NOTE = (
    "MLflow opens its assistant panel on a browser's first visit: close it once\nand that browser "
    "keeps it closed on 127.0.0.1:{port}."
)
# a study's runs not in its view: stage 1 and the confirmation rounds
LEFT_OUT_STAGES = ("standalone", "confirm")
# MLflow's name of a chart section, the view's uuid
MODEL_SECTION = ("Model metrics", f"{LIVE_VIEW_KEY}-model")
SYSTEM_SECTION = ("System metrics", f"{LIVE_VIEW_KEY}-system")  # the ``system/*`` metrics' section
RUN_NAME_COLUMN = "attributes.`Run Name`"  # the runs table's column id of the run name
RUN_NAME_PX = 320  # a trial's run name ("live 003 ids=1,5,9 steps=6 topk=1") whole
CHAR_PX, PADDING_PX = 7, 40  # a character of a header; the sort arrow and the cell's padding
# MLflow's server answers in seconds on an idle machine, minutes on a loaded one
UI_TIMEOUT_S = 600.0
JOB_EXECUTION = "MLFLOW_SERVER_ENABLE_JOB_EXECUTION"  # MLflow's own switch for its job runners
# the server did not answer within --timeout (2 is bad input, 1 a server that died)
EXIT_NOT_SERVED = 3


def server_argv(tracking_uri: str, port: int) -> list[str]:
    """``mlflow server`` for a store, bound to 127.0.0.1 (artifacts served from where runs logged
    them)."""
    return [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        tracking_uri,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]


def searched_params(spec: Spec) -> list[str]:
    """The params a study of ``spec`` searches: the wiring (when stage 1 has candidates) and
    ``space``."""
    return ([IDS_KEY] if spec.standalone.wirings else []) + [n for n in spec.space if n != IDS_KEY]


def column(kind: str, name: str) -> str:
    """A runs-table column as the runs page names it: ``metrics.`accept_length```."""
    return f"{kind}.`{name}`"


def column_width(header: str) -> int:
    """Pixels that show ``header`` whole, with room for the sort arrow and the padding (the view's
    values are shorter than their headers: rounded metrics, the searched settings, the stage)."""
    return CHAR_PX * len(header) + PADDING_PX


def chart_card(metric: str) -> dict[str, Any]:
    """A bar chart card of ``metric`` in the model metrics section (MLflow turns it into a line
    chart where a run logged the metric at more than one step)."""
    return {
        "uuid": f"{LIVE_VIEW_KEY}-{metric}",
        "type": "BAR",
        "metricKey": metric,
        "displayName": metric,
        "metricSectionId": MODEL_SECTION[1],
        "runsCountToCompare": 10,
        "deleted": False,
        "isGenerated": True,
    }


def chart_sections() -> list[dict[str, Any]]:
    """The chart view's two sections, model metrics first, both marked reordered: MLflow appends the
    chart of a metric no card names after the cards of its section instead of sorting it in."""
    return [
        {
            "uuid": uuid,
            "name": name,
            "display": True,
            "isReordered": True,
            "deleted": False,
            "isGenerated": True,
        }
        for name, uuid in (MODEL_SECTION, SYSTEM_SECTION)
    ]


def live_view_state(*, study: str, metric: str, searched: list[str]) -> dict[str, Any]:
    """The runs page's state for a study's live trials and baseline: best ``metric`` first (the
    exact metric, not a shown column), the columns that matter at the widths of their headers (the
    headline metrics as their rounded display tags, ``metric`` first), and the chart view opening on
    ``metric``."""
    metrics = list(
        dict.fromkeys(m for name in (metric, *HEADLINE) for m in (name, ratio_name(name)))
    )
    columns = [column("tags", SHOWN_TAG + m) for m in metrics] + [
        column("params", p) for p in searched
    ]
    columns.append(column("tags", "stage"))
    widths = {c: column_width(c.split("`")[1]) for c in columns}
    left_out = " and ".join(f"tags.stage != '{stage}'" for stage in LEFT_OUT_STAGES)
    return {
        "searchFilter": f"tags.study = '{study}' and {left_out}",
        "orderByKey": column("metrics", metric),
        "orderByAsc": False,
        "selectedColumns": columns,
        "columnOrder": [RUN_NAME_COLUMN, *columns],
        "columnWidths": {RUN_NAME_COLUMN: RUN_NAME_PX, **widths},
        "compareRunCharts": [chart_card(m) for m in metrics],
        "compareRunSections": chart_sections(),
        "isAccordionReordered": True,
    }


def save_view(
    client: Any, experiment_id: str, *, key: str, name: str, state: dict[str, Any]
) -> None:
    """Save ``state`` as the experiment's runs-page view ``key`` (listed under "Views" as ``name``),
    replacing it."""
    now = int(time.time() * 1000)
    envelope = {"name": name, "createdAt": now, "updatedAt": now, "state": json.dumps(state)}
    client.set_experiment_tag(experiment_id, VIEW_TAG + key, json.dumps(envelope))


def save_live_view(
    client: Any, experiment_id: str, *, study: str, metric: str, searched: list[str]
) -> str:
    """The experiment's view of ``study``'s live trials (one per experiment, replaced); returns its
    key."""
    state = live_view_state(study=study, metric=metric, searched=searched)
    save_view(
        client,
        experiment_id,
        key=LIVE_VIEW_KEY,
        name=f"bisect-eagle: live trials of {study}",
        state=state,
    )
    return LIVE_VIEW_KEY


def runs_url(
    port: int, experiment_id: str | None, *, view: str | None = None, mode: str = "TABLE"
) -> str:
    """The runs page of an experiment, opened in saved view ``view`` when given, as its table or
    (``mode`` CHART) its charts."""
    base = f"http://127.0.0.1:{port}/"
    if not experiment_id:
        return base
    query = {VIEW_PARAM: view, "compareRunsMode": mode} if view else {}
    return f"{base}#/experiments/{experiment_id}/runs?{urlencode(query | MODE, quote_via=quote)}"


def run_url(port: int, *, experiment_id: str, run_id: str) -> str:
    """One run's page (a study's parent run: the verdict, the best config and its link)."""
    return f"http://127.0.0.1:{port}/#/experiments/{experiment_id}/runs/{run_id}?{urlencode(MODE)}"


def port_free(port: int) -> bool:
    """Whether the UI server could bind ``127.0.0.1:port``: nothing listens there and nothing holds
    it bound.

    Args:
        port: the TCP port.

    Returns:
        True when the bind succeeds now.
    """
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def start_ui_server(tracking_uri: str, port: int, *, log: Path | None = None) -> subprocess.Popen:
    """Start ``mlflow server`` in its own process group (output to ``log``, else inherited).

    MLflow's job runners (a pool of ``huey`` consumers, each importing MLflow, for its GenAI jobs)
    stay off unless ``MLFLOW_SERVER_ENABLE_JOB_EXECUTION`` is set: nothing here uses them, and on a
    busy machine their imports are most of the server's start (minutes on 2 cores)."""
    if not tracking_uri.startswith(("sqlite:", "postgresql", "mysql", "mssql")):
        raise BadInput(
            f"--tracking-uri {tracking_uri}: the UI serves a database store; for an http(s) "
            "tracking server open that server instead"
        )
    if not port_free(port):
        raise BadInput(
            f"--port {port}: 127.0.0.1:{port} is taken (a process listens on it or holds it "
            "bound); give another --port"
        )
    out = open(log, "w") if log else None  # noqa: SIM115 (owned by the child for its lifetime)
    env = {JOB_EXECUTION: "false", **os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        server_argv(tracking_uri, port),
        stdout=out,
        stderr=subprocess.STDOUT if out else None,
        start_new_session=True,
        env=env,
    )


class NotReady(RuntimeError):
    """The MLflow server exited before it answered (``exited`` True), or did not answer within the
    timeout."""

    def __init__(self, message: str, *, exited: bool):
        super().__init__(message)
        self.exited = exited


class WaitClock:
    """The time waited so far on stderr: one line rewritten in place on a terminal (each second),
    else a line every ``every_s`` (a log stays short)."""

    def __init__(
        self, what: str, *, timeout_s: float, stream: TextIO | None = None, every_s: float = 15.0
    ):
        self.what, self.timeout_s, self.every_s = what, timeout_s, every_s
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self.shown = -1

    def __call__(self, elapsed: float) -> None:
        """Show ``elapsed`` seconds (called at each poll; prints only when the shown figure
        changes)."""
        step = 1 if self.tty else self.every_s
        mark = int(elapsed // step)
        if mark == self.shown:
            return
        self.shown = mark
        text = f"{self.what}: {clock(elapsed)} of at most {clock(self.timeout_s)} (--timeout)"
        self.stream.write(f"\r{text}" if self.tty else f"{text}\n")
        self.stream.flush()

    def done(self, elapsed: float) -> None:
        """End the clock's line, saying how long it took.

        Args:
            elapsed: the seconds it took.
        """
        self.stream.write(
            f"{chr(13) if self.tty else ''}{self.what}: answered after {clock(elapsed)}\n"
        )
        self.stream.flush()


def clock(seconds: float) -> str:
    """``m:ss`` (``h:mm:ss`` from an hour on).

    Args:
        seconds: the duration (fractions dropped).

    Returns:
        The text.
    """
    s = int(seconds)
    return (
        f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
    )


def wait_ready(
    proc: subprocess.Popen,
    port: int,
    *,
    timeout_s: float = UI_TIMEOUT_S,
    tick: Callable[[float], None] = lambda elapsed: None,
) -> float:
    """Wait until the server answers /health.

    Args:
        proc: the server's process (an exit ends the wait at once).
        port: its port on 127.0.0.1.
        timeout_s: how long to wait.
        tick: called with the seconds waited so far at each poll (:class:`WaitClock` shows them).

    Returns:
        The seconds it took.

    Raises:
        NotReady: the server exited first, or did not answer within ``timeout_s``.
    """
    import httpx

    start = time.monotonic()

    def answers() -> bool:
        tick(time.monotonic() - start)
        if proc.poll() is not None:
            raise NotReady(
                f"mlflow server exited with code {proc.returncode} before it was ready", exited=True
            )
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    if not wait_until(
        answers, timeout_s=timeout_s, max_interval_s=0.5, what=f"mlflow server on port {port}"
    ):
        raise NotReady(
            f"mlflow server did not answer on 127.0.0.1:{port} within {timeout_s:g} s", exited=False
        )
    return time.monotonic() - start


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
    spec: Path = typer.Argument(
        None, help="Spec whose experiment to open (default: the embedded tiny scenario spec)."
    ),
    tracking_uri: str = typer.Option(None, help=URI_HELP),
    port: int = typer.Option(5000, min=1, max=65535, help="Port on 127.0.0.1."),
    timeout: float = typer.Option(
        UI_TIMEOUT_S,
        "--timeout",
        min=1,
        help="Seconds to wait for the MLflow server to answer (a loaded machine needs longer); the "
        "time waited is shown meanwhile.",
    ),
) -> None:
    """Serve the MLflow UI for the store and print the runs URL; Ctrl-C stops it.

    The server's output goes to a log file, removed when ``ui`` ends unless the server failed. Exit
    2 on bad input, 3 when the server has not answered within ``--timeout``, 1 when it exited (each
    one line, naming the log)."""
    from mlflow import MlflowClient

    from bisect_eagle.cli.common import load_spec_or_default, sigterm_as_exit
    from bisect_eagle.cli.logs import quiet_libraries
    from bisect_eagle.tracking.uris import resolve_tracking_uri, sqlite_path

    quiet_libraries()
    sigterm_as_exit()
    s = load_spec_or_default(spec, live=False)
    uri = resolve_tracking_uri(tracking_uri, s.storage.tracking_uri)
    db = sqlite_path(uri)
    if db is not None and not db.is_file():
        raise BadInput(
            f"--tracking-uri {uri}: no MLflow store there yet (run `bisect-eagle run` first)"
        )
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(s.name)
    studies = (
        []
        if experiment is None
        else client.search_runs(
            [experiment.experiment_id],
            "tags.role = 'study'",
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
    )
    view = None
    if studies:
        parent, metric = (
            studies[0],
            studies[0].data.params.get("criterion.metric", s.criterion.metric),
        )
        view = save_live_view(
            client,
            experiment.experiment_id,
            study=parent.data.tags.get("study", ""),
            metric=metric,
            searched=searched_params(s),
        )
    fd, name = tempfile.mkstemp(prefix=f"bisect-eagle-ui-{port}-", suffix=".log")
    os.close(fd)
    log = Path(name)
    try:
        proc = start_ui_server(uri, port, log=log)
    except BaseException:
        # bad input (the port taken, a store the UI cannot serve) leaves nothing behind
        log.unlink()
        raise
    failed = False
    try:
        waiting = WaitClock(f"waiting for the MLflow server on 127.0.0.1:{port}", timeout_s=timeout)
        try:
            waiting.done(wait_ready(proc, port, timeout_s=timeout, tick=waiting))
        except NotReady as e:
            failed = True
            _said_not_ready(e, log=log, waiting=waiting)
        print(f"MLflow UI for {uri} (Ctrl-C stops it)")
        print(ASSISTANT_NOTE.format(port=port))
        if studies:
            print(f"study {parent.data.tags.get('study')}: the answer (verdict, best config):")
            print(
                "  "
                + run_url(port, experiment_id=experiment.experiment_id, run_id=parent.info.run_id)
            )
            print(
                "its live trials and baseline, best first (a saved view of the runs page, under "
                "Views):"
            )
        print(f"  {runs_url(port, experiment.experiment_id if experiment else None, view=view)}")
        if view:
            charts = runs_url(port, experiment.experiment_id, view=view, mode="CHART")
            print(f"their charts, the criterion first:\n  {charts}")
        sys.stdout.flush()  # the URLs now, also into a pipe
        if proc.wait() != 0:
            failed = True
            _said_exit(proc.returncode, log=log)
    except KeyboardInterrupt:
        typer.echo("stopping the MLflow UI")
    finally:
        stop_ui_server(proc)
        if not failed:
            log.unlink(missing_ok=True)


def _last_line(log: Path) -> str:
    """The server log's last non-blank line (what it said before it died), secrets scrubbed, at most
    300 characters."""
    from bisect_eagle.tracking.redact import Scrubber

    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return Scrubber()(lines[-1][:300]) if lines else "nothing"


def _said_not_ready(e: NotReady, *, log: Path, waiting: WaitClock) -> None:
    """One line on stderr for a server that never answered, then the exit (1: it died; 3: not within
    --timeout)."""
    if waiting.tty:
        sys.stderr.write("\n")
    if e.exited:
        _said_exit(None, log=log, what=str(e))
    typer.echo(
        f"error: {e}; a loaded machine may need longer: give a longer --timeout (the server's log: "
        f"{log})",
        err=True,
    )
    raise typer.Exit(EXIT_NOT_SERVED)


def _said_exit(code: int | None, *, log: Path, what: str | None = None) -> None:
    """One line on stderr for a server that exited, with the last line it wrote; exit 1."""
    what = what or f"mlflow server exited with code {code}"
    typer.echo(f"error: {what}; its last line: {_last_line(log)} (its log: {log})", err=True)
    raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add the ``ui`` command to the command line.

    Args:
        app: the ``bisect-eagle`` application.
    """
    app.command("ui")(ui)
