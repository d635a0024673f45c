"""Small helpers shared by the command modules: what a command is doing while it waits
(:class:`Activity`), quiet libraries, SIGTERM as an exit, the default spec, scenario path defaults,
the store a reading command needs, and JSON output.

Nothing heavy is imported here at module level (pandas, MLflow, torch): every command module imports
this one, and a command says what it is doing before its own heavy imports."""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import typer

from bisect_eagle.errors import BadInput

if TYPE_CHECKING:
    from bisect_eagle.spec.schema import Spec

# when this process imported the command line: the clock every command shows
STARTED = time.monotonic()


def clock(seconds: float) -> str:
    """A duration as ``H:MM:SS``, the one time format of every progress line (elapsed and left
    alike).

    Args:
        seconds: the duration (negative counts as 0; fractions dropped).

    Returns:
        The text, hours unpadded.
    """
    s = max(0, int(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


class Activity:
    """What a command is doing while it waits, on stderr with the command's elapsed clock, so that
    no wait is silent.

    On a terminal: one live line, redrawn every quarter second (``⠋ reading the runs of study 'x'
    0:00:04``), cut to the terminal's width and cleared when the activity ends (the command's output
    follows it, unmixed). Off a terminal: a plain line (``[0:00:04] reading the runs of study 'x'``)
    for each step that goes on for more than :attr:`QUIET_S` (wrapped at the terminal's width, else
    80 columns), then ``still ...`` every :attr:`HEARTBEAT_S` while it lasts. Before
    :meth:`inputs_checked` a step is written only after :attr:`UNCHECKED_QUIET_S`: bad input,
    refused within seconds, leaves a pipe its one ``error:`` line.

    Use it as a context manager; call it with each new step (``activity("opening the store ...")``).
    """

    QUIET_S = 2.0
    UNCHECKED_QUIET_S = 15.0
    HEARTBEAT_S = 30.0
    TICK_S = 0.25

    def __init__(
        self, *, enabled: bool = True, stream: TextIO | None = None, since: float = STARTED
    ) -> None:
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and self.stream.isatty()
        self.since = since
        self.what: str | None = None
        self.step_at = 0.0
        self.said_at: float | None = None  # when the current step was last written off a terminal
        self.checked = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._drawn = False

    def __enter__(self) -> Activity:
        if self.enabled:
            self._thread = threading.Thread(target=self._run, name="activity", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __call__(self, what: str, *, said: bool = False) -> None:
        """The command's new step. ``said``: its line was printed already (off a terminal only
        heartbeats follow)."""
        with self._lock:
            self.what, self.step_at = what, time.monotonic()
            self.said_at = self.step_at if said else None
            if self.tty and not self._stop.is_set():
                self._draw()

    def inputs_checked(self) -> None:
        """The command's inputs were checked: from now on, off a terminal, a step is written after
        :attr:`QUIET_S`."""
        self.checked = True

    def close(self) -> None:
        """Stop the clock and clear the live line (idempotent)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2)
        with self._lock:
            if self._drawn:
                self.stream.write("\r\x1b[K")
                self.stream.flush()
                self._drawn = False

    def _run(self) -> None:
        while not self._stop.wait(self.TICK_S):
            with self._lock:
                if self.what is None:
                    continue
                if self.tty:
                    self._draw()
                else:
                    self._plain()

    def _draw(self) -> None:
        import shutil

        now = time.monotonic()
        width = max(20, shutil.get_terminal_size().columns) - 1
        tail = f"  {clock(now - self.since)}"
        head = f"{SPINNER[int(now / self.TICK_S) % len(SPINNER)]} {self.what}"
        if len(head) + len(tail) > width:
            head = head[: max(0, width - len(tail) - 1)] + "…"
        self.stream.write(f"\r{head}{tail}\x1b[K")
        self.stream.flush()
        self._drawn = True

    def _plain(self) -> None:
        import shutil
        import textwrap

        now = time.monotonic()
        quiet = self.QUIET_S if self.checked else self.UNCHECKED_QUIET_S
        if self.said_at is None and now - self.step_at >= quiet:
            line = f"[{clock(now - self.since)}] {self.what}"
        elif self.said_at is not None and now - self.said_at >= self.HEARTBEAT_S:
            line = f"[{clock(now - self.since)}] still: {self.what}"
        else:
            return
        width = max(40, shutil.get_terminal_size().columns)
        self.stream.write(
            textwrap.fill(line, width, subsequent_indent=" " * 10, break_on_hyphens=False) + "\n"
        )
        self.stream.flush()
        self.said_at = now


def sigterm_as_exit() -> None:
    """SIGTERM unwinds like Ctrl-C (runs end KILLED, servers are torn down) instead of killing
    outright."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


def load_spec_or_default(spec: Path | None, *, live: bool = True) -> Spec:
    """The given spec, or the embedded default (the tiny scenario) when none is given, with all its
    inputs checked.

    ``live``: the command runs live trials here, so what the engine reads on this machine (the
    prompts, for an sglang spec whose other paths live on the server's machine) must be here too.

    Args:
        spec: the spec's path; None for the embedded default.
        live: whether to check the inputs live trials read on this machine.

    Returns:
        The loaded spec.

    Raises:
        BadInput: a bad spec, or a missing or bad input.
    """
    from bisect_eagle.spec.checks import check_live_inputs
    from bisect_eagle.spec.load import load_spec
    from bisect_eagle.spec.schema import DEFAULT_SPEC

    s = load_spec(spec or DEFAULT_SPEC)
    if live:
        check_live_inputs(s)
    return s


def resolve_paths(scenario: str | None, **paths: Path | None) -> dict[str, Path]:
    """Fill missing paths (``target``, ``draft``, ``dump``, ``prompts``) from a shipped scenario.

    Args:
        scenario: a shipped scenario's name; None for none.
        paths: each path flag by name; None to take the scenario's.

    Returns:
        Every given key with its path.

    Raises:
        BadInput: a path missing without a scenario, or an unknown scenario.
    """
    from bisect_eagle.artifacts import scenarios

    sc = scenarios.get(scenario) if scenario else None
    out = {}
    for key, value in paths.items():
        if value is None:
            if sc is None:
                raise BadInput(
                    f"--{key} is required (or give --scenario NAME for a shipped scenario)"
                )
            value = getattr(sc, key)
        out[key] = Path(value)
    return out


def _strict(obj: object) -> object:
    """NaN/inf (a position never reached, a metric not measured) become null: strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_strict(v) for v in obj]
    return obj


def print_json(obj: object) -> None:
    """Print one strict JSON object on stdout.

    Args:
        obj: the object (non-finite floats as null; anything else not JSON as its ``str``).
    """
    typer.echo(json.dumps(_strict(obj), indent=2, default=str, allow_nan=False))


URI_HELP = "MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlruns/mlflow.db)."


def require_store(uri: str) -> None:
    """A command that reads runs refuses, creating nothing, a SQLite store that does not exist yet
    (``report`` or ``export`` before any ``run``): :class:`BadInput` saying to run ``bisect-eagle
    run`` first.

    Args:
        uri: the tracking URI (only ``sqlite:///`` ones are checked).

    Raises:
        BadInput: the SQLite file does not exist.
    """
    prefix = "sqlite:///"
    if not uri.startswith(prefix):
        return
    db = Path(uri[len(prefix) :])
    if db.exists():
        return
    where = db.parent
    shown = (
        f"./{where.relative_to(Path.cwd())}"
        if where.is_absolute() and where.is_relative_to(Path.cwd())
        else str(where)
    )
    raise BadInput(
        f"no runs in {shown} yet ({db} does not exist): run `bisect-eagle run` first, or give "
        "--tracking-uri of a store that has them"
    )


def open_study_run(
    spec: Path | None,
    *,
    tracking_uri: str | None,
    study_name: str | None,
    activity: Activity | None = None,
):
    """(tracking, parent run) of a spec's study (default: its newest), each step said on
    ``activity``; bad input (the spec, a store that does not exist yet or cannot be reached) is
    refused before anything is created. A store this process cannot write is opened read-only
    (``tracking.read_only``).

    Args:
        spec: the spec's path; None for the embedded default.
        tracking_uri: the ``--tracking-uri`` flag; None for the spec's or the default.
        study_name: the study; None for the spec's newest.
        activity: where to say each step; None says nothing.

    Returns:
        The opened tracking store and the study's parent run.

    Raises:
        BadInput: a bad spec, a store that does not exist or cannot be reached, or no such study.
    """
    say = activity or (lambda what: None)
    say(f"loading the spec {spec or '(the embedded tiny scenario)'} and checking its inputs")
    s = load_spec_or_default(spec, live=False)
    return open_study(s, tracking_uri=tracking_uri, study_name=study_name, activity=activity)


def open_study(
    s: Spec, *, tracking_uri: str | None, study_name: str | None, activity: Activity | None = None
):
    """(tracking, parent run) of the study of a loaded spec (default: its newest), as
    :func:`open_study_run` opens it.

    Args:
        s: the loaded spec.
        tracking_uri: the ``--tracking-uri`` flag; None for the spec's or the default.
        study_name: the study; None for the spec's newest.
        activity: where to say each step (told when the inputs are checked); None says nothing.

    Returns:
        The opened tracking store and the study's parent run.

    Raises:
        BadInput: a store that does not exist or cannot be reached, or no such study.
    """
    from bisect_eagle.tracking.redact import redact_url
    from bisect_eagle.tracking.stores import check_stores
    from bisect_eagle.tracking.uris import resolve_tracking_uri

    say = activity or (lambda what: None)
    uri = resolve_tracking_uri(tracking_uri, s.storage.tracking_uri)
    require_store(uri)
    check_stores(storage=None, tracking_uri=uri)  # an unreachable store is one line within seconds
    say(f"opening the tracking store {redact_url(uri)} (loading MLflow)")
    from bisect_eagle.report.study import find_parent
    from bisect_eagle.tracking.runs import Tracking

    # read-only where this process cannot write it
    tracking = Tracking.open(uri, s.name, reading=True)
    say(f"finding study {study_name or '(the newest)'} of spec {s.name!r}")
    parent = find_parent(tracking, study_name)
    if activity is not None:
        activity.inputs_checked()
    return tracking, parent


def num(value: object) -> str:
    """A metric for a person: 3 significant digits (one decimal from 100 up), '-' when absent.

    Args:
        value: a number; None or NaN is absent.

    Returns:
        The text.
    """
    if _absent(value):
        return "-"
    # here: trials/ imports MLflow, which --help does not need
    from bisect_eagle.trials.record import short_number

    return short_number(float(value))  # type: ignore[arg-type]


def _absent(value: object) -> bool:
    """None, NaN (pandas' missing value included) or pandas' NA."""
    if value is None:
        return True
    try:
        return math.isnan(float(value))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return type(value).__name__ in ("NAType", "NaTType")


RATIO_HEADER = "× baseline"  # the column of ratios to the baseline, beside the metric they divide


def times_baseline(ratio: float | None, baseline: float | None = None) -> str:
    """A ratio to the baseline in the one notation every command prints: ``1.04× baseline``, with
    the baseline's own value when given (``1.04× baseline 90.0``); '-' when absent.

    Args:
        ratio: the ratio; None or NaN is absent.
        baseline: the baseline's value; None leaves it out.

    Returns:
        The text.
    """
    if _absent(ratio):
        return "-"
    return f"{float(ratio):.2f}× baseline" + ("" if baseline is None else f" {num(baseline)}")


def trial_ref(name: str | None, run_id: str) -> str:
    """A trial as every command refers to it: its name and the 8 characters of its run id a user
    copies (every command takes them), ``live 003 (run 7ca37e03)``, or ``run 7ca37e03`` alone for a
    run without a name.

    Args:
        name: the trial's run name; None or empty for none.
        run_id: the MLflow run id.

    Returns:
        The reference.
    """
    return f"{name} (run {run_id[:8]})" if name else f"run {run_id[:8]}"


def plural(count: int, noun: str, plural_form: str | None = None) -> str:
    """``1 error``, ``2 errors``, ``0 errors``: a count with its noun in the right number.

    Args:
        count: how many.
        noun: the singular.
        plural_form: the plural; None adds ``s``.

    Returns:
        The text.
    """
    return f"{count} {noun if count == 1 else plural_form or noun + 's'}"


def parse_set(items: list[str]) -> dict[str, Any]:
    """``key=value`` flags to a mapping; values are YAML scalars or lists (``[5,9,11]``, ``4``,
    ``bfloat16``).

    Args:
        items: the ``--set`` values, in order (a later key wins).

    Returns:
        Setting name -> parsed value.

    Raises:
        BadInput: an item without ``=`` or a name, an unknown setting, or a value YAML cannot read.
    """
    import yaml

    values: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise BadInput(f"--set {item!r}: expected key=value, e.g. --set num_steps=4")
        check_setting_name(key.strip(), flag=f"--set {item}")
        try:
            values[key.strip()] = yaml.safe_load(raw)
        except yaml.YAMLError as e:
            raise BadInput(
                f"--set {item!r}: value is not a YAML scalar or list ({e.problem})"
            ) from None
    return values


def check_setting_name(name: str, *, flag: str) -> None:
    """A setting's name as ``--set`` takes it (a live setting, ``env.NAME`` or
    ``server_args.flag``); an unknown one is :class:`BadInput` with the closest known name
    (``unknown setting num_step; did you mean num_steps?``).

    Args:
        name: the setting's name.
        flag: the flag it came from, for the message.

    Raises:
        BadInput: an unknown name.
    """
    import difflib

    from bisect_eagle.spec.settings import LiveSettings

    kind, dot, key = name.partition(".")
    if dot and kind in ("env", "server_args") and key:
        return
    known = list(LiveSettings.model_fields)
    if name in known:
        return
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = (
        f"did you mean {close[0]}?"
        if close
        else f"the settings are {', '.join(known)}, env.NAME, server_args.flag"
    )
    raise BadInput(f"{flag}: unknown setting {name}; {hint}")


VLLM_PYTHON_HELP = "Interpreter that has vLLM (its own environment); overrides engine.vllm.python."
SGLANG_PYTHON_HELP = (
    "Interpreter that has SGLang (its own environment); overrides engine.sglang.python."
)


def use_pythons(spec: Spec, *, sglang: str | None, vllm: str | None) -> None:
    """``--sglang-python`` / ``--vllm-python``: the engines' interpreters for this invocation (plans
    are judged, and servers started, by those).

    Args:
        spec: the loaded spec, changed in place.
        sglang: ``--sglang-python``; None keeps ``engine.sglang.python``.
        vllm: ``--vllm-python``; None keeps ``engine.vllm.python``.
    """

    # a path, not a name on PATH: from here, symlinks kept (a venv's python is one)
    def absolute(path: str) -> str:
        """``path`` made absolute when it names a file; a bare name is left for PATH.

        Args:
            path: the flag's value.

        Returns:
            The path or the name.
        """
        return os.path.abspath(path) if "/" in path else path

    if sglang:
        spec.engine.sglang.python = absolute(sglang)
    if vllm:
        spec.engine.vllm.python = absolute(vllm)
