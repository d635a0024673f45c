"""Which process owns a run: ``host:pid:start-time``, and whether that process still runs (a run
left RUNNING by a process killed outright is ended by the next command)."""

from __future__ import annotations

import os
import socket


def owner_id() -> str:
    """This process as ``host:pid:start-time`` (stale-trial detection when resuming).

    Returns:
        ``"host:pid:start"``, the start time in whole seconds since the epoch (:func:`owner_alive`
        reads it back).
    """
    import psutil

    return f"{socket.gethostname()}:{os.getpid()}:{int(psutil.Process().create_time())}"


def owner_alive(owner: str) -> bool | None:
    """Whether the process named by :func:`owner_id` still runs; None when it ran on another host.

    Args:
        owner: an :func:`owner_id` value (a run's ``owner`` tag; empty when it has none).

    Returns:
        True when a process of that pid and start time runs on this host, False when none does; None
        when ``owner`` names another host or is not an owner id.
    """
    import psutil

    host, _, rest = owner.partition(":")
    pid_text, _, start = rest.partition(":")
    if host != socket.gethostname() or not pid_text.isdigit():
        return None
    try:
        return int(psutil.Process(int(pid_text)).create_time()) == int(start or 0)
    except psutil.NoSuchProcess:
        return False
