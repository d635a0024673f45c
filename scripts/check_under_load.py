"""Does ``bisect-eagle run`` reach the same verdict on a busy machine? Run it N times beside CPU
burners.

Starts ``--burners`` CPU-bound processes (each a Python busy loop in its own process group), then
runs ``bisect-eagle run --json`` (the embedded tiny spec unless ``--spec``) ``--runs`` times, each
from a fresh empty directory, and compares what each run concluded: whether the target was reached
and confirmed, and the best wiring. The burners are stopped however the check ends. Prints one line
per run, then one JSON object; exits 0 when every run agrees, 1 when they differ.

    python scripts/check_under_load.py                       # 3 runs beside 2 burners
    python scripts/check_under_load.py --runs 2 --max-live-trials 2
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import typer

app = typer.Typer(add_completion=False)
BURN = "while True:\n    pass\n"


def start_burners(n: int) -> list[subprocess.Popen]:
    """``n`` CPU-bound processes, each the leader of its own process group."""
    return [
        subprocess.Popen([sys.executable, "-c", BURN], start_new_session=True) for _ in range(n)
    ]


def stop_burners(procs: list[subprocess.Popen]) -> None:
    """SIGKILL each burner's process group (they hold no state) and reap it."""
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def one_run(*, spec: Path | None, max_live_trials: int | None, timeout_s: float) -> dict[str, Any]:
    """``bisect-eagle run --json`` from a fresh empty directory: its verdict, best wiring and
    time."""
    with tempfile.TemporaryDirectory(prefix="under-load-") as cwd:
        argv = [sys.executable, "-m", "bisect_eagle.cli", "run", "--json"]
        if spec is not None:
            argv.insert(4, str(spec.resolve()))
        if max_live_trials is not None:
            argv += ["--max-live-trials", str(max_live_trials)]
        env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
        t0 = time.monotonic()
        done = subprocess.run(
            argv,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            start_new_session=True,
        )
        elapsed = time.monotonic() - t0
    if done.returncode not in (0, 3) or not done.stdout.strip():
        return {
            "exit": done.returncode,
            "error": done.stderr.strip().splitlines()[-1:],
            "elapsed_s": elapsed,
        }
    out = json.loads(done.stdout)
    best = out.get("best") or {}
    return {
        "exit": done.returncode,
        "target_reached": out["target_reached"],
        "verdict": "reached" if out["target_reached"] else "not reached",
        "best_wiring": (best.get("params") or {}).get("eagle_aux_hidden_state_layer_ids"),
        "live_trials": out["counts"]["live_measured"],
        "stop_reason": out["stop_reason"],
        "elapsed_s": elapsed,
    }


@app.command()
def main(
    runs: int = typer.Option(3, min=2, help="Runs to compare."),
    burners: int = typer.Option(2, min=0, help="CPU-bound processes beside each run."),
    spec: Path = typer.Option(None, help="Spec to run (default: the embedded tiny spec)."),
    max_live_trials: int = typer.Option(None, min=1, help="Passed to `run --max-live-trials`."),
    timeout_s: float = typer.Option(1800, min=1, help="Seconds one run may take."),
) -> None:
    """Run ``bisect-eagle run`` ``runs`` times beside ``burners`` busy loops; exit 1 unless all
    agree."""
    procs = start_burners(burners)
    results = []
    try:
        for i in range(runs):
            r = one_run(spec=spec, max_live_trials=max_live_trials, timeout_s=timeout_s)
            results.append(r)
            print(
                f"run {i + 1}/{runs}: exit {r['exit']}, {r.get('verdict', r.get('error'))}, best "
                f"wiring {r.get('best_wiring')}, {r.get('live_trials')} live trials, "
                f"{r['elapsed_s']:.0f} s",
                flush=True,
            )
    finally:
        stop_burners(procs)
    keys = [(r["exit"], r.get("verdict"), r.get("best_wiring")) for r in results]
    same = len(set(map(json.dumps, keys))) == 1 and "error" not in results[0]
    print(json.dumps({"same": same, "burners": burners, "runs": results}))
    raise typer.Exit(0 if same else 1)


if __name__ == "__main__":
    app()
