"""Small helpers shared by the command modules: scenario path defaults and JSON output."""

from __future__ import annotations

import json
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


def print_json(obj: object) -> None:
    typer.echo(json.dumps(obj, indent=2, default=str))
