"""A study process for the kill/resume and two-worker tests: the real search code with the fake
engine.

usage: study_proc.py run|run-with-worker|resume|worker SPEC STORAGE TRACKING_URI SLEEP_S LOG [STUDY]
"""

from __future__ import annotations

import sys
from pathlib import Path

# tests/: the fake engine (run as a script)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import optuna  # noqa: E402
from fake_engine import FakeEngine  # noqa: E402

from bisect_eagle.cli.common import sigterm_as_exit  # noqa: E402
from bisect_eagle.search.study import Options, join_study, run_study  # noqa: E402
from bisect_eagle.spec.load import load_spec  # noqa: E402


def main() -> None:
    mode, spec_path, storage, tracking, sleep_s, log = sys.argv[1:7]
    study = sys.argv[7] if len(sys.argv) > 7 else None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sigterm_as_exit()
    spec = load_spec(spec_path)
    opts = Options(
        storage=storage, tracking_uri=tracking, study_name=study, resume=mode == "resume"
    )
    # run-with-worker: live trials wait for the worker, so both measure some
    ready = Path(log + ".worker-ready")
    engine = FakeEngine(
        sleep_s=float(sleep_s),
        log=Path(log),
        live_after=ready if mode == "run-with-worker" else None,
    )
    if mode == "worker":
        # ready once joined
        out = join_study(
            spec, options=opts, engine_factory=lambda s: ready.touch() or engine, wait_s=120
        )
    else:
        out = run_study(spec, options=opts, engine_factory=lambda s: engine)
    print(out.stop_reason, flush=True)


if __name__ == "__main__":
    main()
