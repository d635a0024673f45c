"""Failure classes of an sglang trial, recognised on SGLang's own messages (fixtures from 0.5.23 in
the tests).

- ``bad_arguments``: the parser refused the argv (``sglang serve: error: …``, the prog has a space)
  or SGLang's settings resolution raised (a ``ValueError``/``AssertionError`` whose traceback passes
  through ``server_args.py`` or ``arg_groups/``) — normally caught by the plan before any launch;
- ``out_of_memory``: CUDA or host OOM in any phase;
- ``capture_error``: aux hidden-state capture or draft ``fc`` width errors (``captured 2 of 3 aux
  hidden states``, a size mismatch for ``fc.weight``; see ``docs/sglang-facts.md#final-layer-ids``);
- ``launch_error``: exited before ready for another reason; ``readiness_timeout``; ``hung_request``;
  ``crash_during_benchmark``.
"""

from __future__ import annotations

import re

from bisect_eagle.engines.base import FailureClass
from bisect_eagle.engines.served import FailureLog
from bisect_eagle.keys import IDS_KEY

_ARGPARSE = re.compile(r"^[\w.\- ]+: error: ", re.M)  # "sglang serve: error: ..."
_OOM = re.compile(r"out of memory|OutOfMemoryError|Not enough memory|not enough memory", re.I)
_CAPTURE = re.compile(r"captured \d+ of \d+ aux hidden states?", re.I)
_CAPTURE_KEYS = re.compile(
    rf"aux[_ ]hidden[_ ]state|{IDS_KEY}|layers_to_capture|"
    r"size mismatch for fc\.weight|fc takes \d+ inputs",
    re.I,
)
_ERROR_LINE = re.compile(r"Error|Exception|error:", re.M)


def _matching_line(pattern: re.Pattern, text: str, also: re.Pattern | None = None) -> str | None:
    for line in text.splitlines():
        if pattern.search(line) and (also is None or also.search(line)):
            return line.strip()
    return None


def _server_args_error(log: str) -> str | None:
    """The exception line of a traceback through SGLang's server_args.py (its own argument checks),
    if any."""
    in_trace = False
    for line in log.splitlines():
        if line.strip().startswith("File ") and ("server_args" in line or "arg_groups" in line):
            in_trace = True
        elif in_trace and line.startswith(("AssertionError", "ValueError")):
            return line.strip()
    return None


class SglangFailures(FailureLog):
    """SGLang's answers to :class:`~bisect_eagle.engines.served.FailureLog`'s questions (module
    docstring)."""

    engine = "sglang"
    ready_probe = "/health_generate"

    def bad_arguments(self, log: str) -> str | None:
        """The parser's error after its usage, else SGLang's own argument checks in
        server_args.py.

        Args:
            log: the server's log.

        Returns:
            The error line, or None.
        """
        line = _matching_line(_ARGPARSE, log)
        if line is not None and "usage:" in log:
            return line
        return _server_args_error(log)

    def out_of_memory(self, log: str) -> str | None:
        """The first line of the log that reports running out of memory.

        Args:
            log: the server's log.

        Returns:
            That line, stripped, or None.
        """
        return _matching_line(_OOM, log)

    def capture_error(self, log: str) -> str | None:
        """The first line of the log reporting an aux hidden-state capture or ``fc`` width error.

        Args:
            log: the server's log.

        Returns:
            That line, stripped, or None.
        """
        return _matching_line(_CAPTURE, log) or _matching_line(_CAPTURE_KEYS, log, also=_ERROR_LINE)

    def start_error(self, log: str) -> tuple[FailureClass, str]:
        """``launch_error`` with the log's last error line.

        Args:
            log: the log of a server that exited before it was ready.

        Returns:
            ``("launch_error", line)``; a fixed reason when the log has no error line.
        """
        last = _matching_line(_ERROR_LINE, "\n".join(reversed(log.splitlines())))
        return "launch_error", last or "the server exited before it was ready"


FAILURES = SglangFailures()
classify_failure = FAILURES.classify  # (failure class, why) of a failed trial: FailureLog.classify
