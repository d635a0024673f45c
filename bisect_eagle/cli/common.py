"""Small helpers shared by the command modules: scenario path defaults and JSON output."""

from __future__ import annotations

import json
import math
from pathlib import Path

import typer

from bisect_eagle import scenarios
from bisect_eagle.errors import BadInput


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
