"""Failure classes of a vllm trial, recognised on vLLM 0.32's own messages (real fixtures in the
tests).

- ``bad_arguments``: the parser refused the argv (``api_server.py: error: …`` after a ``usage:``
  block, exit status 2), or the engine-args resolution raised before any engine started (a traceback
  through ``engine/arg_utils.py``, ``vllm/config/`` or the entry point's argument checks, e.g.
  pydantic's ``ValidationError: 1 validation error for SpeculativeConfig``) — normally caught by the
  plan before any launch;
- ``out_of_memory``: the KV cache does not fit (CPU: ``Available memory on node … is less than
  requested memory for kv``; any device: ``… KV cache is needed, which is larger than the available
  KV cache memory``; GPU: ``No available memory for the cache blocks``, ``… is less than desired GPU
  memory utilization``), or an allocator's out-of-memory error, in any phase;
- ``capture_error``: the engine died in the draft's aux hidden-state input (a fatal EngineCore
  traceback through ``combine_hidden_states``, the draft's ``fc``): what ids outside ``[0, N]`` do,
  at the first request;
- ``launch_error``: exited before ready for another reason; ``readiness_timeout``: ``/health`` never
  answered 200 in time; ``hung_request``: a request got no answer in time;
  ``crash_during_benchmark``: the engine died (``EngineDeadError``) or a request failed otherwise.
"""

from __future__ import annotations

import re

from bisect_eagle.engines.base import FailureClass
from bisect_eagle.engines.served import FailureLog

# "api_server.py: error: ..." / "vllm serve: error: ..."
_ARGPARSE = re.compile(r"^[\w.\- ]+: error: ", re.M)
_OOM = re.compile(
    r"out of memory|OutOfMemoryError|can't allocate memory|is less than requested memory for kv|"
    r"is less than desired (?:GPU|CPU) memory utilization|KV cache is needed, which is larger than "
    r"the available "
    r"KV cache memory|No available memory for the cache blocks",
    re.I,
)
_PREFIX = re.compile(r"^\((?:EngineCore|APIServer|Worker)[^)]*\) \w+ [\d-]+ [\d:]+ \[[^\]]+\] ?")
_EXC = re.compile(
    r"^(?:[\w.]+\.)?(\w+(?:Error|Exception|Exit)\b|AssertionError|KeyError|KeyboardInterrupt)(?::|$)"
)
_CONFIG_FRAMES = (
    "vllm/engine/arg_utils.py",
    "vllm/config/",
    "entrypoints/launchers/cli_args.py",
    "entrypoints/launchers/launcher.py",
    "pydantic/",
)
_FATAL = ("EngineCore encountered a fatal error", "EngineCore failed to start")


def _body(line: str) -> str:
    """A log line without vLLM's ``(EngineCore pid=…) ERROR 12-01 09:28:35 [core.py:1512]``
    prefix."""
    return _PREFIX.sub("", line)


def _tracebacks(log: str) -> list[tuple[list[str], str]]:
    """Every traceback in the log: (its ``File`` lines, its exception line), prefixes stripped."""
    out: list[tuple[list[str], str]] = []
    frames: list[str] | None = None
    for raw in log.splitlines():
        line = _body(raw)
        if line.startswith("Traceback (most recent call last):"):
            frames = []
        elif frames is not None:
            if (
                line.startswith("  File ")
                or line.startswith("    ")
                or not line.strip()
                or line.startswith("  [")
            ):
                if line.startswith("  File "):
                    frames.append(line.strip())
            else:
                if _EXC.match(line.strip()):
                    out.append((frames, line.strip()))
                frames = None
    return out


def _first(pattern: re.Pattern, log: str) -> str | None:
    for line in log.splitlines():
        if pattern.search(line):
            return _body(line).strip()
    return None


def engine_fatal(log: str) -> tuple[list[str], str] | None:
    """The EngineCore's fatal traceback (frames, exception line), when the log has one."""
    lines = log.splitlines()
    start = next((i for i, line in enumerate(lines) if any(f in line for f in _FATAL)), None)
    if start is None:
        return None
    found = _tracebacks("\n".join(lines[start:]))
    return found[0] if found else None


class VllmFailures(FailureLog):
    """vLLM's answers to :class:`~bisect_eagle.engines.served.FailureLog`'s questions (module
    docstring)."""

    engine = "vllm"
    ready_probe = "GET /health with 200"

    def bad_arguments(self, log: str) -> str | None:
        """The parser's error after its usage (the engine-args resolution's are
        :meth:`start_error`'s).

        Args:
            log: the server's log.

        Returns:
            The error line, or None.
        """
        line = _first(_ARGPARSE, log)
        return line if line is not None and "usage:" in log else None

    def out_of_memory(self, log: str) -> str | None:
        """The first line of the log that reports running out of memory.

        Args:
            log: the server's log.

        Returns:
            That line, or None.
        """
        return _first(_OOM, log)

    def capture_error(self, log: str) -> str | None:
        """The EngineCore's fatal error when it was raised in the draft's aux hidden-state input.

        Args:
            log: the server's log.

        Returns:
            The error with where it happened, or None.
        """
        fatal = engine_fatal(log)
        if fatal is not None and any(
            "combine_hidden_states" in f or "aux_hidden" in f for f in fatal[0]
        ):
            return f"{fatal[1]} (in the draft's aux hidden-state input, combine_hidden_states)"
        return None

    def start_error(self, log: str) -> tuple[FailureClass, str]:
        """``bad_arguments`` for a traceback through vLLM's config code, else ``launch_error``
        with the EngineCore's fatal error or the last traceback.

        Args:
            log: the log of a server that exited before it was ready.

        Returns:
            (``bad_arguments`` or ``launch_error``, the error line); a fixed reason when the log has
            no traceback.
        """
        for frames, exc in _tracebacks(log):
            if any(any(c in f for c in _CONFIG_FRAMES) for f in frames):
                return "bad_arguments", exc
        fatal = engine_fatal(log)
        if fatal is not None:
            return "launch_error", fatal[1]
        found = _tracebacks(log)
        return "launch_error", found[-1][1] if found else "the server exited before it was ready"

    def crash(self, log: str) -> str:
        """The EngineCore's fatal error, else its death, else a failed request.

        Args:
            log: the log of a server whose request failed.

        Returns:
            Why, for a person.
        """
        fatal = engine_fatal(log)
        if fatal is not None:
            return f"the engine died: {fatal[1]}"
        if "EngineDeadError" in log:
            return "the engine died (EngineDeadError)"
        return "a request failed during the benchmark"


FAILURES = VllmFailures()
classify_failure = FAILURES.classify  # (failure class, why) of a failed trial: FailureLog.classify
