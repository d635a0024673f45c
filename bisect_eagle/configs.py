"""Reading a model directory's ``config.json``: one place for the error a user sees when it is missing or broken."""

from __future__ import annotations

import json
from pathlib import Path

from bisect_eagle.errors import BadInput


def read_config_json(directory: str | Path, what: str) -> dict:
    """``directory/config.json`` as a dict; ``what`` names the directory's role in the error message."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise BadInput(f"{path}: not found ({what} must be a directory with config.json)")
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise BadInput(f"{path}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise BadInput(f"{path}: expected a JSON object, found {type(cfg).__name__}")
    return cfg
