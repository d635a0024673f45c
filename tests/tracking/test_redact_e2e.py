"""No secret value is written or printed anywhere, end to end: secrets planted in the controller's
environment (``HF_TOKEN``, ``X_API_KEY``, ``DB_PASSWORD``, ``GH_PAT``, ``SGLANG_BEARER``,
``SGLANG_PASSPHRASE`` (no SGLang variables), and a Hugging Face-shaped token under a name that says
nothing), in a spec's ``env.HF_TOKEN``, ``env.HF_AUTH``, ``env.NCCL_PASSPHRASE`` (no NCCL variable),
``env.MY_CREDS``, the password of its ``env.DATABASE_URL``, a token-only URL, a token glued to
``-``, its ``server_args.api_key``, and its description (a URL password, an ``hf_`` token, an
``sk-`` key, a glued GitHub token), go through ``run`` (local engine, and the sglang engine with a
stand-in server that prints its environment), ``live`` (``--dry-run --json`` too), ``export``,
``reproduce`` and ``bisect``; then every byte under the working directory (the MLflow and Optuna
SQLite stores, artifacts, logs, bisect logs, trial directories) and every stdout and stderr is
searched for each value. A value under a known harmless name (``env.NCCL_ALGO=Ring``, an inherited
``SGLANG_LOG_GC``) is found in clear."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
# a Hugging Face token's shape, under a name that is not a secret's
SHAPED = "hf_" + "Yq7Lm2Pz9Xc4Vb8Nw3Kd"
ENV_SECRETS = {
    "HF_TOKEN": "hf-env-Zq81secret",
    "X_API_KEY": "xk-env-Pw27secret",
    "DB_PASSWORD": "db-env-Lm55secret",
    "GH_PAT": "ghpat-env-Rt42secret",
    "GREETING": SHAPED,
    "SGLANG_BEARER": "bearer-env-Jw58secret",
    "SGLANG_PASSPHRASE": "phrase-env-Nc63secret",
}
IN_CLEAR = {"NCCL_ALGO": "Ring", "SGLANG_LOG_GC": "1"}  # known harmless: written as they are
NCCL_PASSPHRASE = "nccl-phrase-Hd35secret"
MY_CREDS = "mycreds-spec-Wz19secret"
URL_TOKEN = "urltok-Fq72secret"
GLUED = "hf_" + "Gl8uedTok3nValue4Sweep"  # written glued: "x-hf_…", "build_ghp_…"
GLUED_GH = "ghp_" + "Gl8uedGithubTok3nSweep0123456789"
DESC_PASSWORD = "descpw-Kt27secret"
DESC_HF = "hf_" + "Desc7Lm2Pz9Xc4Vb8Nw3K"
DESC_SK = "sk-" + "desc" + "Qw81Er42Ty63Ui05Op97"
SPEC_TOKEN = "hf-spec-Tx93secret"
SPEC_AUTH = "hfauth-spec-Kq22secret"
URL_PASSWORD = "pwDbUrl77secret"
API_KEY = "sk-arg-Vb64secret"
BISECT_TOKEN = "hf-bisect-Qr17secret"
VALUES = [
    *ENV_SECRETS.values(),
    SPEC_TOKEN,
    SPEC_AUTH,
    URL_PASSWORD,
    API_KEY,
    BISECT_TOKEN,
    NCCL_PASSPHRASE,
    MY_CREDS,
    URL_TOKEN,
    GLUED,
    GLUED_GH,
    DESC_PASSWORD,
    DESC_HF,
    DESC_SK,
]
DESCRIPTION = (
    f"mirror at https://bob:{DESC_PASSWORD}@models.example.com/x, token {DESC_HF}, key {DESC_SK}, "
    f"built by build_{GLUED_GH}"
)
# the stand-in server, started through a shell that first prints the environment it was given (as
# some do)
PRINTS_ENV = [
    "sh",
    "-c",
    'env; exec "$0" serve "$@"',
    str(Path(sys.executable).parent / "bisect-eagle"),
]


class Session:
    """Commands run in one working directory with the planted environment; every output is kept."""

    def __init__(self, cwd: Path):
        self.cwd = cwd
        self.outputs: list[tuple[str, str]] = []
        self.env = {
            **os.environ,
            **ENV_SECRETS,
            "SGLANG_LOG_GC": IN_CLEAR["SGLANG_LOG_GC"],
            "OMP_NUM_THREADS": "1",
        }
        self.env.pop("MLFLOW_TRACKING_URI", None)

    def __call__(self, *args: str, codes: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [sys.executable, "-m", "bisect_eagle.cli", *args],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        self.outputs.append((" ".join(args[:1]) + " stdout", done.stdout))
        self.outputs.append((" ".join(args[:1]) + " stderr", done.stderr))
        assert done.returncode in codes, (args, done.returncode, done.stderr[-3000:])
        assert "Traceback" not in done.stderr, done.stderr[-3000:]
        return done


def _spec(tmp: Path, name: str, edit) -> Path:
    raw = yaml.safe_load((ROOT / "experiments" / name).read_text())
    raw["engine"]["settings"].update(
        {
            "env.HF_TOKEN": SPEC_TOKEN,
            "env.HF_AUTH": SPEC_AUTH,
            "env.DATABASE_URL": f"postgresql://u:{URL_PASSWORD}@127.0.0.1/db",
            "env.NCCL_PASSPHRASE": NCCL_PASSPHRASE,
            "env.MY_CREDS": MY_CREDS,
            "env.NCCL_ALGO": IN_CLEAR["NCCL_ALGO"],
            "env.MODEL_MIRROR": f"https://{URL_TOKEN}@hub.example.com/m",
            "env.BUILD_TAG": f"x-{GLUED}",
            "num_prompts": 2,
            "warmup_prompts": 1,
            "max_new_tokens": 8,
        }
    )
    raw["search"].update(
        max_live_trials=1, sampler="grid", max_wall_s=240, confirm={"enabled": False}
    )
    # no baseline trial to wait for
    raw.update(baseline=1.0, criterion={"metric": "accept_length", "ratio": 1.0})
    raw["description"] = DESCRIPTION
    raw["space"] = {"num_steps": {"type": "int", "low": 2, "high": 3}}
    edit(raw)
    path = tmp / f"secret-{name}"
    path.write_text(yaml.safe_dump(raw))
    return path


def _local(raw: dict) -> None:
    raw["engine"]["settings"]["server_args.api_key"] = API_KEY
    raw["standalone"].update(wirings=raw["standalone"]["wirings"][:2], samples=4)


def _sglang(raw: dict) -> None:
    raw["engine"]["sglang"]["launch_command"] = PRINTS_ENV
    raw["standalone"].update(wirings=raw["standalone"]["wirings"][:1], samples=2)


def _leaks(root: Path, outputs: list[tuple[str, str]]) -> list[str]:
    """Where each planted value shows up: files under ``root`` (bytes) and the commands' outputs."""
    found = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        found += [f"{path.relative_to(root)}: {v}" for v in VALUES if v.encode() in data]
    for name, text in outputs:
        found += [f"<{name}>: {v}" for v in VALUES if v in text]
    return found


@pytest.fixture(scope="module")
def session(tmp_path_factory) -> tuple[Session, Path]:
    """Every command once, in one working directory; the specs (which hold the secrets) live outside
    it."""
    specs = tmp_path_factory.mktemp("specs")
    cwd = tmp_path_factory.mktemp("work")
    run = Session(cwd)
    local = _spec(specs, "tiny.yaml", _local)
    sglang = _spec(specs, "tiny-sglang.yaml", _sglang)
    out = json.loads(run("run", str(local), "--json", codes=(0, 3)).stdout)
    trial = next(t["run_id"] for t in out["trials"] if t["run_id"] and t["value"] is not None)
    run("run", str(sglang), "--json", codes=(0, 1, 3))
    run("live", "--spec", str(local), "--json")
    run("live", "--spec", str(sglang), "--dry-run", "--json")
    run("export", trial, "--json")
    run("export", trial)
    run("reproduce", trial, "--json")
    bad = yaml.safe_load((ROOT / "experiments" / "tiny-broken.yaml").read_text())
    bad["engine"]["settings"]["env.HF_TOKEN"] = BISECT_TOKEN
    (specs / "broken.yaml").write_text(yaml.safe_dump(bad))
    run(
        "bisect",
        "--good",
        str(ROOT / "experiments" / "tiny.yaml"),
        "--bad",
        str(specs / "broken.yaml"),
        "--metric",
        "accept_length",
        "--set",
        "num_prompts=2",
        "--set",
        "warmup_prompts=0",
        "--set",
        "max_new_tokens=16",
        "--json",
        codes=(0, 1),
    )
    return run, cwd


def test_every_command_ran_and_wrote_its_stores(session):
    _, cwd = session
    names = {p.name for p in (cwd / "mlruns").rglob("*")}
    assert {"mlflow.db", "optuna.db"} <= names and any(n.endswith(".log") for n in names)


def test_no_planted_secret_is_written_or_printed(session):
    run, cwd = session
    assert _leaks(cwd, run.outputs) == []


def test_known_harmless_values_are_written_in_clear(session):
    _, cwd = session
    commands = [p.read_text() for p in cwd.rglob("launch_command.txt")]
    assert commands and all("export NCCL_ALGO=Ring" in text for text in commands)
    assert any("export SGLANG_LOG_GC=1" in text for text in commands)
    assert all("NCCL_PASSPHRASE, " in text or "NCCL_PASSPHRASE\n" in text for text in commands)
    assert b"Ring" in (cwd / "mlruns" / "mlflow.db").read_bytes()
