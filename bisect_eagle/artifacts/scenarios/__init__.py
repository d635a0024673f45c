"""Scenarios shipped inside the package, found from any directory after install."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from bisect_eagle.errors import BadInput

ROOT = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Scenario:
    """Paths and metadata of a shipped scenario."""

    name: str
    root: Path

    @property
    def target(self) -> Path:
        return self.root / "target"

    @property
    def draft(self) -> Path:
        return self.root / "draft"

    @property
    def dump(self) -> Path:
        return self.root / "dump"

    @property
    def prompts(self) -> Path:
        return self.root / "prompts.jsonl"

    @property
    def meta(self) -> dict:
        return json.loads((self.root / "scenario.json").read_text())


def names() -> list[str]:
    """The shipped scenarios.

    Returns:
        Their names, sorted: every directory under the package holding a ``scenario.json``.
    """
    return sorted(p.parent.name for p in ROOT.glob("*/scenario.json"))


def get(name: str) -> Scenario:
    """The shipped scenario ``name``, or an error listing the shipped ones.

    Args:
        name: a scenario's directory name (``tiny``).

    Returns:
        The scenario's paths inside the installed package.

    Raises:
        BadInput: no shipped scenario of that name.
    """
    root = ROOT / name
    if not (root / "scenario.json").is_file():
        raise BadInput(
            f"unknown scenario {name!r}; shipped scenarios: {', '.join(names()) or 'none'}"
        )
    return Scenario(name, root)
