"""A stand-in controller for the process tests: starts one server with ``procs.start_server`` and
waits.

``controller.py LOG_DIR PORT GRACE -- ARGV...`` prints one JSON line (pgid, server pid, record path)
once the server is started, then sleeps until it is killed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from bisect_eagle.engines.procs import server as procs


def main() -> None:
    cut = sys.argv.index("--")
    log_dir, port, grace = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    argv = sys.argv[cut + 1 :]
    server = procs.start_server(
        argv,
        dict(os.environ),
        log_path=log_dir / "server.log",
        log_dir=log_dir,
        port=port,
        grace_s=grace,
        meta={"trial": 7},
    )
    print(
        json.dumps(
            {
                "pgid": server.pgid,
                "server_pid": server.server_pid,
                "record": str(server.record_path),
            }
        ),
        flush=True,
    )
    time.sleep(600)


if __name__ == "__main__":
    main()
