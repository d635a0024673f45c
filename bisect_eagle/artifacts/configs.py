"""Reading a model directory's ``config.json``: one place for the error a user sees when it is
missing or broken.

:func:`read_config_json` gives the raw object; :func:`validate_keys` checks it against a pydantic
model and turns the first validation error into one :class:`BadInput` line naming the file and the
key, e.g. ``…/config.json: key 'hidden_size': expected a valid integer, found 'big'``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from bisect_eagle.errors import BadInput

M = TypeVar("M", bound=BaseModel)
_UNION_MEMBER = re.compile(
    r"^(constrained-)?(str|int|float|bool|none|list\[.*\]|dict\[.*\]|function-\w+.*)$"
)
_PLAIN = {
    "a valid integer": "an integer",
    "a valid number": "a number",
    "a valid list": "a list",
    "a valid dictionary": "an object",
    "a valid boolean": "true or false",
    "a valid string": "a string",
    "greater than 0": "a number > 0",
}


def read_config_json(directory: str | Path, what: str) -> dict:
    """``directory/config.json`` as a dict.

    Args:
        directory: the model directory (a target, a draft).
        what: the directory's role, for the error message (``"an EAGLE-3 draft"``).

    Returns:
        The parsed JSON object.

    Raises:
        BadInput: the file is missing, not valid JSON, or not a JSON object.
    """
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise BadInput(f"{path}: not found ({what} must be a directory with config.json)")
    try:
        cfg = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadInput(f"{path}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise BadInput(f"{path}: expected a JSON object, found {type(cfg).__name__}")
    return cfg


def key_name(loc: tuple[str | int, ...], prefix: str = "") -> str:
    """A pydantic error location as the dotted key a user finds in the file: ``eagle_config.ids[1]``
    (the names pydantic gives the members of a union, ``constrained-str`` or ``list[...]``, are not
    keys: left out)."""
    out = prefix
    for part in loc:
        if isinstance(part, str) and _UNION_MEMBER.match(part):
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def validation_error(e: ValidationError, *, where: str | Path, prefix: str = "") -> BadInput:
    """The one way a pydantic error reaches a user: one :class:`BadInput` line naming ``where`` and
    the key.

    Args:
        e: the error of a ``model_validate`` call; its first error is reported.
        where: the file or flag the data came from.
        prefix: the key the validated data sits under in that file (``eagle_config``), if any.

    Returns:
        The error to raise: a :class:`BadInput` that a validator raised, as it was; a rule over
            several keys
        with its own message; else ``where: key 'k': expected E, found F`` (``F`` cut to 60
        characters; a rule's own message in place of ``expected E``).
    """
    err = e.errors()[0]
    inner = err.get("ctx", {}).get("error")
    if isinstance(inner, BadInput):
        return inner
    # a rule over several keys: its message names them (the input may hold secrets)
    if not err["loc"]:
        return BadInput(f"{where}: {inner or err['msg']}")
    key = key_name(tuple(err["loc"]), prefix)
    if err["type"] == "missing":
        return BadInput(f"{where}: key {key!r} is missing")
    found = repr(err.get("input"))
    found = found if len(found) <= 60 else found[:57] + "..."
    if err["type"] == "value_error":  # a rule's own message says what it expects
        return BadInput(f"{where}: key {key!r}: {inner or err['msg']} (found {found})")
    expected = str(err["msg"]).removeprefix("Input should be ")
    expected = (
        "an object" if expected.startswith("a valid dictionary") else _PLAIN.get(expected, expected)
    )
    return BadInput(f"{where}: key {key!r}: expected {expected}, found {found}")


def validate_keys(model: type[M], data: dict, *, path: Path, prefix: str = "") -> M:
    """``data`` as ``model``; the first error becomes one line naming ``path`` and the key (under
    ``prefix``)."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise validation_error(e, where=path, prefix=prefix) from None
