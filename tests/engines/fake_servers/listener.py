"""A stand-in server for the process tests: listens on 127.0.0.1:PORT and waits to be ended.

``--child`` starts a child in its process group (like SGLang's scheduler); ``--daemon`` double-forks
a daemon (``setsid``, so outside the group) that keeps the listening socket; ``--ignore-term``
ignores SIGTERM. Each process appends ``role pid`` to ``--pids`` once it is up.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time


def note(path: str | None, role: str, pid: int | None = None) -> None:
    if path:
        with open(path, "a") as f:
            f.write(f"{role} {pid or os.getpid()}\n")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--pids")
    p.add_argument("--child", action="store_true")
    p.add_argument("--daemon", action="store_true")
    p.add_argument("--ignore-term", action="store_true")
    a = p.parse_args()
    if a.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", a.port))
    sock.listen()
    if a.child:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        note(a.pids, "child", child.pid)
    if a.daemon:
        first = os.fork()
        if first == 0:
            os.setsid()
            if os.fork() > 0:
                os._exit(0)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            note(a.pids, "daemon")
            time.sleep(600)  # holds the listening socket
            os._exit(0)
        os.waitpid(first, 0)
    note(a.pids, "server")
    time.sleep(600)


if __name__ == "__main__":
    main()
