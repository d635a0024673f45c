"""The installed server's flags: the executable that runs it, the flag list, and renames between
SGLang releases.

With an oracle (:mod:`.oracle`) the flags come from SGLang's own parser; otherwise from ``<launch
command> --help`` (any server speaking SGLang's flags). Flags renamed between releases are adapted
(``--cuda-graph-max-bs`` → ``--cuda-graph-max-bs-decode`` in 0.5.23, which rejects the old name as
ambiguous; see ``docs/sglang-facts.md#argument-parser``) and a flag the server does not list is
refused before anything starts. Every flag is used by its exact name, never by an argparse prefix.
When nothing can be probed (a dry run on a machine without SGLang), renames follow the newest
release this project was checked against.
"""

from __future__ import annotations

import difflib
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bisect_eagle.engines.sglang.launch import TP_FLAGS, Arg
from bisect_eagle.errors import BadInput

RENAMES: dict[str, tuple[str, ...]] = {  # requested flag -> its names in other SGLang releases
    # 0.5.23 split it into -decode / -prefill
    "--cuda-graph-max-bs": ("--cuda-graph-max-bs-decode",),
    "--cuda-graph-max-bs-decode": ("--cuda-graph-max-bs",),
}
NEWEST_NAMES = {"--cuda-graph-max-bs": "--cuda-graph-max-bs-decode"}  # unprobed: 0.5.23's names
_FLAG_RE = re.compile(r"(?<![\w-])--[A-Za-z0-9][\w-]*")


@dataclass(frozen=True)
class ServerFlags:
    """What a probe of the installed server found."""

    command: tuple[str, ...]  # the launch command with its executable resolved
    flags: frozenset[str]
    version: str | None
    source: str  # "parser" (the oracle) or "--help"


def resolve_executable(name: str, *, where: str = "engine.sglang.launch_command") -> str:
    """Absolute path of an executable; ``where`` names the setting it came from in errors.

    A bare name is looked up next to the running interpreter first (this install's ``python`` and
    console scripts such as ``bisect-eagle``, found even when its virtual environment is not
    activated), then on PATH.

    Args:
        name: a path (it contains a separator) or a bare name.
        where: the setting, for errors.

    Returns:
        The executable's absolute path (a path's symlinks kept).

    Raises:
        BadInput: a path that is not an executable file, or a name found nowhere.
    """
    if os.sep in name:
        path = Path(name).expanduser()
        if path.is_file() and os.access(path, os.X_OK):
            # not resolve(): a venv's python is a symlink out of the venv
            return os.path.abspath(path)
        raise BadInput(f"{where}: {name!r} is not an executable file")
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise BadInput(f"{where}: {name!r} was found neither in {beside.parent} nor on PATH")
    return found


def launch_executable(launch_command: list[str], python: str | None) -> list[str]:
    """The launch command with ``python`` replaced by ``engine.sglang.python`` when set, its
    executable resolved."""
    if not launch_command:
        raise BadInput("engine.sglang.launch_command: expected a non-empty list, found []")
    head = launch_command[0]
    if python and Path(head).name.startswith("python"):
        return [resolve_executable(python, where="engine.sglang.python"), *launch_command[1:]]
    return [resolve_executable(head), *launch_command[1:]]


def _version_of(command: list[str], flags: frozenset[str], timeout_s: float) -> str | None:
    """The server's version: of the ``-m`` module's distribution, else from ``--version``; None if
    neither."""
    if len(command) >= 3 and command[1] == "-m":
        probe = [
            command[0],
            "-c",
            "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))",
            command[2].split(".")[0],
        ]
    elif "--version" in flags:
        probe = [*command, "--version"]
    else:
        return None
    try:
        res = subprocess.run(probe, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = res.stdout.strip().splitlines()
    return lines[-1].strip() if res.returncode == 0 and lines else None


def probe_help(command: list[str], *, shown: str, timeout_s: float = 300.0) -> ServerFlags:
    """Run ``<launch command> --help`` (and a version query) and collect the flags it lists."""
    try:
        res = subprocess.run(
            [*command, "--help"], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        raise BadInput(
            f"engine.sglang.launch_command: `{shown} --help` did not finish in {timeout_s:.0f} s"
        ) from None
    flags = frozenset(_FLAG_RE.findall(res.stdout))
    if res.returncode != 0 or "--port" not in flags:
        tail = " | ".join((res.stderr or res.stdout).strip().splitlines()[-3:])
        raise BadInput(
            f"engine.sglang.launch_command: `{shown} --help` exited {res.returncode} without "
            f"listing server flags (expected at least --port); it said: {tail or '(nothing)'}"
        )
    return ServerFlags(
        tuple(command), flags, _version_of(command, flags, min(timeout_s, 120.0)), "--help"
    )


def adapt_args(
    args: list[Arg], flags: ServerFlags | None, *, shown_command: str
) -> tuple[list[Arg], list[str]]:
    """Rename flags to what the installed server lists; refuse any it does not list. Returns (args,
    notes).

    Without ``flags`` (nothing could be probed) renames follow :data:`NEWEST_NAMES` and nothing is
    refused.

    Args:
        args: the trial's flags.
        flags: the installed server's flags; None when they could not be probed.
        shown_command: the launch command as shown in errors.

    Returns:
        The adapted flags in order, and a note per rename.

    Raises:
        BadInput: a flag the installed server does not list (close matches named).
    """
    out, notes = [], []
    for arg in args:
        name, eq, inline = arg.flag.partition("=")
        if flags is None:
            if name in NEWEST_NAMES:
                notes.append(
                    f"{name} ({arg.origin}) written as {NEWEST_NAMES[name]}, its name in SGLang "
                    "0.5.23 (not probed here)"
                )
                name = NEWEST_NAMES[name]
            out.append(Arg(name + eq + inline, arg.values, arg.origin))
            continue
        if name in TP_FLAGS:
            name = next((f for f in TP_FLAGS if f in flags.flags), name)
        elif name not in flags.flags and name in RENAMES:
            alt = next((f for f in RENAMES[name] if f in flags.flags), None)
            if alt is not None:
                notes.append(f"{name} ({arg.origin}) is {alt} in this server version; renamed")
                name = alt
        if name not in flags.flags:
            close = difflib.get_close_matches(name, sorted(flags.flags), n=3)
            hint = f"; close matches: {', '.join(close)}" if close else ""
            raise BadInput(
                f"{arg.origin}: flag {name} is not accepted by `{shown_command}` ({flags.source} "
                f"does not list it{hint})"
            )
        out.append(Arg(name + eq + inline, arg.values, arg.origin))
    return out, notes


def shown(launch_command: list[str]) -> str:
    """The launch command as one shell-quoted line, for messages.

    Args:
        launch_command: the command's tokens.

    Returns:
        The line.
    """
    return shlex.join(launch_command)
