"""The bisect log: git bisect's log/replay for configurations, one mark per probed configuration.

Format (``# bisect-eagle bisect log v1``): header lines ``# key: value`` (good, bad, judge, set,
reference, noise, changes, inert; JSON except good and bad), the changes with their good and bad
values as the engine runs them (a change masked at one end says by what), then one mark per probe:
``good|bad|skip <change,change,... or -> [# note]`` (a mark may name an inert difference: a
verification applies them as the bad configuration holds them). Marks may be edited before
``--replay``. Nothing secret is written: values come from the plans (redacted) and the caller scrubs
free text.

The same good and bad values go to the bisect's parent run as params (:func:`change_params`), so its
MLflow page and the runs table say what each change changed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bisect_eagle.bisect.changes import Change
from bisect_eagle.bisect.ddmin import ProbeOutcome
from bisect_eagle.errors import BadInput
from bisect_eagle.tracking.redact import redact_mapping

LOG_MAGIC = "# bisect-eagle bisect log v1"
HEADER_KEYS = ("good", "bad", "judge", "set", "reference", "noise", "changes", "inert")
Mark = tuple[ProbeOutcome, tuple[str, ...], str]
PARAM_CHARS = 6000  # MLflow's longest param value


@dataclass
class BisectLog:
    """A replayable record of a bisect; marks (good | bad | skip) may be edited before
    ``--replay``."""

    good: str
    bad: str
    judge: dict[str, Any]
    overrides: dict[str, Any]  # --set values (secret ones are written redacted)
    changes: list[Change]
    inert: list[str] = field(default_factory=list)  # requested differences that are not changes
    # {"samples": [...]}: the good configuration (ratio mode)
    reference: dict[str, Any] | None = None
    noise: dict[str, Any] | None = None  # {"sd_log": s, "dof": ν}: the pooled noise estimate
    marks: list[Mark] = field(default_factory=list)
    scrub: Callable[[str], str] = field(default=lambda text: text, repr=False)

    def text(self) -> str:
        """The log file's text: ``#`` header lines, then one mark a line.

        Returns:
            The text, newline-terminated, ``--set`` secrets redacted, passed through ``scrub``.
        """
        lines = [
            LOG_MAGIC,
            f"# good: {self.good}",
            f"# bad: {self.bad}",
            f"# judge: {json.dumps(self.judge)}",
            f"# set: {json.dumps(redact_mapping(self.overrides))}",
        ]
        if self.reference is not None:
            lines.append(f"# reference: {json.dumps(self.reference)}")
        if self.noise is not None:
            lines.append(f"# noise: {json.dumps(self.noise)}")
        lines.append(f"# changes: {json.dumps([c.name for c in self.changes])}")
        if self.inert:
            lines.append(f"# inert: {json.dumps(self.inert)}")
        for c in self.changes:
            masked = "".join(
                f"  (hidden in the {side} configuration by {', '.join(by) or 'a combination'})"
                for side, by in c.masked_by.items()
            )
            lines.append(
                f"#   {c.name}: {json.dumps(c.values('good'))} -> "
                f"{json.dumps(c.values('bad'))}{masked}"
            )
        for outcome, applied, note in self.marks:
            note = " ".join(note.split())  # one line per mark
            lines.append(
                f"{outcome.value} {','.join(applied) or '-'}" + (f"  # {note}" if note else "")
            )
        return self.scrub("\n".join(lines) + "\n")

    def write(self, path: Path) -> None:
        """Replace ``path`` atomically (a reader never sees half a log).

        Args:
            path: the log file; its folder is created if absent.
        """
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.text())
        os.replace(tmp, path)


def change_params(changes: Sequence[Change], scrub: Callable[[str], str]) -> dict[str, str]:
    """Each change's good and bad value as the log writes them (JSON; secrets redacted, then
    ``scrub`` applied), one param per setting and end: ``change.<setting>.good`` and
    ``change.<setting>.bad`` (each setting of a group), cut to MLflow's :data:`PARAM_CHARS`."""
    out: dict[str, str] = {}
    for c in changes:
        for side in ("good", "bad"):
            value = c.values(side)
            by_setting = value if len(c.good) > 1 else {next(iter(c.good)): value}
            for setting, v in by_setting.items():
                out[f"change.{setting}.{side}"] = scrub(json.dumps(v))[:PARAM_CHARS]
    return out


@dataclass
class ParsedLog:
    """What ``--replay`` reads: the header values and the marks (checked against the changes
    later)."""

    header: dict[str, Any]
    marks: list[Mark]


def parse_log(path: Path) -> ParsedLog:
    """Read a bisect log; errors name the file, the line and what was expected."""
    if not path.is_file():
        raise BadInput(f"{path}: bisect log not found")
    try:
        lines = path.read_text().splitlines()
    except UnicodeDecodeError as e:
        raise BadInput(
            f"{path}: not a bisect log (not UTF-8 text: {e.reason} at byte {e.start})"
        ) from None
    if not lines or lines[0].strip() != LOG_MAGIC:
        raise BadInput(
            f"{path}:1: expected {LOG_MAGIC!r}, found {lines[0] if lines else 'an empty file'!r}"
        )
    header: dict[str, Any] = {}
    marks = []
    for number, line in enumerate(lines[1:], start=2):
        where = f"{path}:{number}"
        text = line.strip()
        if not text:
            continue
        if text.startswith("#"):
            key, sep, value = text[1:].strip().partition(": ")
            if sep and key in HEADER_KEYS:
                try:
                    header[key] = value if key in ("good", "bad") else json.loads(value)
                except json.JSONDecodeError as e:
                    raise BadInput(f"{where}: header {key!r} is not valid JSON ({e.msg})") from None
            continue
        body, _, note = text.partition("#")
        parts = body.split()
        if len(parts) != 2 or parts[0] not in [o.value for o in ProbeOutcome]:
            raise BadInput(
                f"{where}: expected '<good|bad|skip> <changes,comma,separated or ->', found "
                f"{text!r}"
            )
        applied = () if parts[1] == "-" else tuple(parts[1].split(","))
        marks.append((ProbeOutcome(parts[0]), applied, note.strip()))
    for key in ("good", "bad", "judge"):
        if key not in header:
            raise BadInput(f"{path}: header '# {key}: ...' is missing")
    return ParsedLog(header, marks)
