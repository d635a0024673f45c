"""Small helpers shared by the command modules: quiet libraries, SIGTERM as an exit, the default spec, scenario
path defaults and JSON output."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import typer
import yaml

from bisect_eagle.artifacts import scenarios
from bisect_eagle.errors import BadInput

if TYPE_CHECKING:
    from bisect_eagle.spec.schema import Spec


def quiet_libraries() -> None:
    """Keep Optuna's per-trial lines, MLflow's store messages and artifact progress bars off the terminal."""
    import optuna

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # read when mlflow is imported: its store messages

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for name in ("mlflow", "alembic", "httpx"):
        logging.getLogger(name).setLevel(logging.WARNING)


def sigterm_as_exit() -> None:
    """SIGTERM unwinds like Ctrl-C (runs end KILLED, servers are torn down) instead of killing outright."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


def load_spec_or_default(spec: Path | None, *, live: bool = True) -> Spec:
    """The given spec, or the embedded default (the tiny scenario) when none is given, with all its inputs checked.

    ``live``: the command runs live trials here, so what the engine reads on this machine (the prompts, for an
    sglang spec whose other paths live on the server's machine) must be here too.
    """
    from bisect_eagle.spec.checks import check_live_inputs
    from bisect_eagle.spec.load import load_spec
    from bisect_eagle.spec.schema import DEFAULT_SPEC

    s = load_spec(spec or DEFAULT_SPEC)
    if live:
        check_live_inputs(s)
    return s


def resolve_paths(scenario: str | None, **paths: Path | None) -> dict[str, Path]:
    """Fill missing paths (``target``, ``draft``, ``dump``, ``prompts``) from a shipped scenario."""
    sc = scenarios.get(scenario) if scenario else None
    out = {}
    for key, value in paths.items():
        if value is None:
            if sc is None:
                raise BadInput(f"--{key} is required (or give --scenario NAME for a shipped scenario)")
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
    """Print one strict JSON object on stdout."""
    typer.echo(json.dumps(_strict(obj), indent=2, default=str, allow_nan=False))


URI_HELP = "MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlruns/mlflow.db)."


def open_study_run(spec: Path | None, *, tracking_uri: str | None, study_name: str | None):
    """(tracking, parent run) of a spec's study (default: its newest)."""
    from bisect_eagle.report.study import find_parent
    from bisect_eagle.tracking.redact import redact_url
    from bisect_eagle.tracking.runs import Tracking, resolve_tracking_uri
    from bisect_eagle.tracking.stores import check_stores

    s = load_spec_or_default(spec, live=False)
    uri = resolve_tracking_uri(tracking_uri, s.storage.tracking_uri)
    check_stores(storage=None, tracking_uri=uri)  # an unreachable store is one line within seconds
    reading(f"reading study {study_name or '(newest)'} of spec {s.name!r} from {redact_url(uri)}")
    tracking = Tracking.open(uri, s.name)
    return tracking, find_parent(tracking, study_name)


def reading(what: str, *, stream: Any = None) -> None:
    """Say on a terminal's stderr what a command is reading before a wait of seconds (``reading the dump ...``).

    Only where stderr is a terminal: a script or a pipe gets stdout unchanged and, on bad input, stderr's one line.
    """
    import shutil
    import textwrap

    stream = stream or sys.stderr
    if stream.isatty():
        width = shutil.get_terminal_size().columns
        print(textwrap.fill(f"… {what}", width=max(40, width), subsequent_indent="  ", break_on_hyphens=False,
                            break_long_words=True), file=stream, flush=True)


def num(value: object) -> str:
    """A metric for a person: 3 significant digits (one decimal from 100 up), '-' when absent."""
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "-"
    from bisect_eagle.trials.record import short_number  # here: trials/ imports MLflow, which --help does not need

    return short_number(float(value))  # type: ignore[arg-type]


RATIO_HEADER = "× baseline"  # the column of ratios to the baseline, beside the metric they divide


def times_baseline(ratio: float | None, baseline: float | None = None) -> str:
    """A ratio to the baseline in the one notation every command prints: ``1.04× baseline``, with the baseline's
    own value when given (``1.04× baseline 90.0``); '-' when absent."""
    if ratio is None or (isinstance(ratio, float) and pd.isna(ratio)):
        return "-"
    return f"{float(ratio):.2f}× baseline" + ("" if baseline is None else f" {num(baseline)}")


def trial_ref(name: str | None, run_id: str) -> str:
    """A trial as every command refers to it: its name and the run id a user copies (``live 003 (run 7ca37e03…)``,
    the id given whole or as a prefix), or ``run 7ca37e03…`` alone for a run without a name."""
    return f"{name} (run {run_id})" if name else f"run {run_id}"


def plural(count: int, noun: str, plural_form: str | None = None) -> str:
    """``1 error``, ``2 errors``, ``0 errors``: a count with its noun in the right number."""
    return f"{count} {noun if count == 1 else plural_form or noun + 's'}"


def parse_set(items: list[str]) -> dict[str, Any]:
    """``key=value`` flags to a mapping; values are YAML scalars or lists (``[5,9,11]``, ``4``, ``bfloat16``)."""
    values: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise BadInput(f"--set {item!r}: expected key=value, e.g. --set num_steps=4")
        try:
            values[key.strip()] = yaml.safe_load(raw)
        except yaml.YAMLError as e:
            raise BadInput(f"--set {item!r}: value is not a YAML scalar or list ({e.problem})") from None
    return values


VLLM_PYTHON_HELP = "Interpreter that has vLLM (its own environment); overrides engine.vllm.python."
SGLANG_PYTHON_HELP = "Interpreter that has SGLang (its own environment); overrides engine.sglang.python."


def use_pythons(spec: Spec, *, sglang: str | None, vllm: str | None) -> None:
    """``--sglang-python`` / ``--vllm-python``: the engines' interpreters for this invocation (plans are judged,
    and servers started, by those)."""
    def absolute(path: str) -> str:  # a path, not a name on PATH: from here, symlinks kept (a venv's python is one)
        return os.path.abspath(path) if "/" in path else path

    if sglang:
        spec.engine.sglang.python = absolute(sglang)
    if vllm:
        spec.engine.vllm.python = absolute(vllm)
