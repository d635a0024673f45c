"""The stdlib-only part the oracle scripts share (``sglang/oracle_script.py``,
``vllm/oracle_script.py``).

The scripts run in the servers' own interpreters, which have the standard library and the server but
not this project, so this module imports nothing else and the scripts load it by file path
(``importlib.util.spec_from_file_location``), never as ``bisect_eagle.engines.oracle_common``. It
holds how an answer turns a server's values into JSON and how a parser's options are described
(:class:`~bisect_eagle.engines.oracle.Option` reads them back). Shared so both oracles describe
their parsers in one shape.
"""

from __future__ import annotations

import argparse


def plain(value):
    """``value`` as JSON can carry it: scalars kept, sequences and mappings walked, anything else as
    its ``str``.

    Args:
        value: any value.

    Returns:
        The JSON-safe value.
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return str(value)


def parser_options(parser: argparse.ArgumentParser, *, to_json=plain) -> list[dict]:
    """Every optional action of ``parser`` but help: flags, dest, default, choices, whether it takes
    a value and whether it is a ``--x/--no-x`` flag; values made JSON-safe by ``to_json`` (a
    script's own :func:`plain`).

    Args:
        parser: the server's parser.
        to_json: makes a default or a choice JSON-safe.

    Returns:
        One dict per option: ``flags``, ``dest``, ``default``, ``choices`` (None: any),
        ``takes_value``, ``boolean_optional``.
    """
    options = []
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        options.append(
            {
                "flags": list(action.option_strings),
                "dest": action.dest,
                "default": to_json(action.default),
                "choices": None if action.choices is None else [to_json(c) for c in action.choices],
                "takes_value": action.nargs != 0,
                "boolean_optional": isinstance(action, argparse.BooleanOptionalAction),
            }
        )
    return options
