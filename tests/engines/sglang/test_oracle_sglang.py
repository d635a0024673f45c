"""Plans judged by SGLang 0.5.23 itself: its parser and settings resolution, run in its own
environment.

Skipped where no SGLang environment exists (``scripts/setup_sglang_env.sh``); CI always has one and
sets ``BISECT_EAGLE_REQUIRE_SGLANG=1`` so a missing one fails instead.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from sglang_helpers import EXPERIMENTS
from sglang_oracle import sglang_python

from bisect_eagle.engines import make_engine
from bisect_eagle.search.space import SearchSpace
from bisect_eagle.spec.load import load_spec

from helpers import cli_in_process

FIXTURES = Path(__file__).resolve().parent / "fixtures"


# SGLang's own ``prepare_server_args`` (parser + ServerArgs, as ``sglang serve`` starts) on each
# argv read from stdin, one verdict line each: an argparse exit or a ServerArgs error is a refusal.
# One interpreter answers a module's checks (SGLang's import is most of a check's time).
PARSE_MANY = """import json, sys
from sglang.srt.server_args import prepare_server_args
for line in sys.stdin:
    try:
        prepare_server_args(json.loads(line))
        print("accepted", flush=True)
    except BaseException as e:
        print("refused", type(e).__name__, flush=True)
"""
_CHECKERS: dict[str, subprocess.Popen] = {}


@pytest.fixture(scope="module", autouse=True)
def _checkers():
    """The module's SGLang checker processes, ended with it."""
    yield
    for proc in _CHECKERS.values():
        proc.kill()
        proc.wait(timeout=30)
    _CHECKERS.clear()


def sglang_accepts_all(python: str, argvs: list[list[str]]) -> list[bool]:
    """Whether SGLang's own ``prepare_server_args`` (in ``python``, apart from the oracle the plans
    were judged by) accepts each argv."""
    proc = _CHECKERS.get(python)
    if proc is None:
        proc = _CHECKERS[python] = subprocess.Popen(
            [python, "-c", PARSE_MANY],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
    verdicts = []
    for argv in argvs:
        proc.stdin.write(json.dumps(argv) + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        assert line.startswith(("accepted", "refused")), f"SGLang's checker said {line!r}"
        verdicts.append(line.startswith("accepted"))
    return verdicts


def sglang_accepts(python: str, argv: list[str]) -> bool:
    """:func:`sglang_accepts_all` of one argv."""
    return sglang_accepts_all(python, [argv])[0]


def server_argv(argv: list[str]) -> list[str]:
    """The arguments after ``python -m sglang.launch_server``."""
    return argv[argv.index("sglang.launch_server") + 1 :]


def cli(*args: str, cwd: Path) -> tuple[int, dict | None, str]:
    """``bisect-eagle ARGS`` in this process (:func:`helpers.cli_in_process`): its exit code, its
    JSON output and all it printed."""
    res = cli_in_process(*args, cwd=cwd)
    body = json.loads(res.stdout) if res.stdout.strip() else None
    return res.returncode, body, res.stdout + res.stderr


def dry_run(*args: str, python: str, cwd: Path) -> tuple[int, dict | None, str]:
    return cli("live", "--dry-run", "--json", "--sglang-python", python, *args, cwd=cwd)


def test_glm5_dry_run_argv_is_accepted_by_sglangs_parser(tmp_path):
    python = sglang_python()
    code, body, out = dry_run(
        "--spec", str(EXPERIMENTS / "glm5-8gpu.yaml"), python=python, cwd=tmp_path
    )
    assert code == 0, out
    plan = body["plan"]
    assert (
        plan["checked"].startswith("SGLang 0.5.23 parser")
        and "resolution skipped" in plan["checked"]
    )
    assert (
        "--cuda-graph-max-bs-decode" in plan["argv"] and "--cuda-graph-max-bs" not in plan["argv"]
    )
    assert sglang_accepts(python, server_argv(plan["argv"]))
    assert list(tmp_path.iterdir()) == []  # a dry run writes nothing


@pytest.mark.parametrize(
    "sets,reason",
    [
        (["--set", "server_args.attention_backend=cutlass_mla"], "invalid choice: 'cutlass_mla'"),
        (
            ["--set", "topk=2", "--set", "num_steps=1", "--set", "num_draft_tokens=8"],
            "organize_draft_results",
        ),
        (["--set", "server_args.cuda_graph_max_bs_prefill=lots"], "invalid int value: 'lots'"),
    ],
)
def test_refused_before_launch_with_sglangs_reason(sets, reason, tmp_path):
    glm5 = str(EXPERIMENTS / "glm5-8gpu.yaml")
    code, body, out = dry_run("--spec", glm5, *sets, python=sglang_python(), cwd=tmp_path)
    assert code == 2 and reason in body["plan"]["refusal"] and "Traceback" not in out
    assert list(tmp_path.iterdir()) == []


def test_the_batch_check_refuses_what_the_single_check_refuses():
    python = sglang_python()
    good = ["--model-path", "/m", "--tp-size", "1"]
    bad = [*good, "--no-such-flag"]
    assert sglang_accepts(python, good) and not sglang_accepts(python, bad)
    assert sglang_accepts_all(python, [good, bad, good]) == [True, False, True]


def test_every_planned_value_of_every_shipped_spec_is_accepted_or_refused_by_sglang(tmp_path):
    """Each space value once (around the spec's fixed settings): SGLang's parser accepts what the
    plan lets through.

    The only refusals are SGLang's own parser/resolution errors and the tree-candidate bound.
    """
    python = sglang_python()
    for path in sorted(EXPERIMENTS.glob("*.yaml")):
        raw = yaml.safe_load(path.read_text())
        if raw.get("engine", {}).get("kind") != "sglang" or "sglang" not in " ".join(
            raw["engine"]
            .get("sglang", {})
            .get("launch_command", ["python", "-m", "sglang.launch_server"])
        ):
            continue
        spec = load_spec(path)
        spec.engine.sglang.python = python
        space = SearchSpace(spec.space, spec.engine.settings, str(path))
        engine = make_engine(spec, tmp_path / "logs")
        accepted: list[tuple[dict, list[str]]] = []
        with engine:
            for name in space.order:
                for value in space.values(name) or []:
                    sampled = {name: value, **({"topk": 2} if name == "num_draft_tokens" else {})}
                    plan = engine.plan(space.settings(sampled))
                    if plan.refusal is None:
                        accepted.append((sampled, server_argv(list(plan.argv))))
                    else:
                        assert any(
                            r in plan.refusal
                            for r in (
                                "SGLang refuses",
                                "organize_draft_results",
                                "num_draft_tokens is required",
                            )
                        ), plan.refusal
        verdicts = sglang_accepts_all(python, [argv for _, argv in accepted])
        refused = [(path.name, s) for (s, _), ok in zip(accepted, verdicts, strict=True) if not ok]
        assert accepted and not refused, refused
    assert not (tmp_path / "logs").exists()


def tiny_sglang_spec(tmp_path: Path, python: str) -> Path:
    spec = {
        "name": "tiny-real-sglang",
        "scenario": "tiny",
        "engine": {
            "kind": "sglang",
            "settings": {"device": "cpu", "max_new_tokens": 8},
            "sglang": {
                "launch_command": ["python", "-m", "sglang.launch_server"],
                "python": python,
            },
        },
    }
    path = tmp_path / "tiny-real.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_resolution_on_a_readable_target_fills_sglangs_own_values(tmp_path):
    python = sglang_python()
    spec = tiny_sglang_spec(tmp_path, python)
    code, body, out = dry_run(
        "--spec", str(spec), "--set", "num_draft_tokens=8", python=python, cwd=tmp_path
    )
    assert code == 0, out
    plan = body["plan"]
    assert plan["checked"] == "SGLang 0.5.23 parser and resolution"
    eff = plan["effective"]
    # SGLang's own rules
    assert eff["num_draft_tokens"] == 4 and eff["server"]["max_running_requests"] == 48
    assert eff["server"]["attention_backend"] == "torch_native" and eff["device"] == "cpu"
    code, body, _ = dry_run(
        "--spec",
        str(spec),
        "--set",
        "topk=2",
        "--set",
        "num_draft_tokens=4",
        "--set",
        "server_args.page_size=16",
        "--set",
        "server_args.attention_backend=torch_native",
        python=python,
        cwd=tmp_path,
    )
    assert (
        code == 2
        and "ValueError: speculative_eagle_topk > 1 with page_size > 1" in body["plan"]["refusal"]
    )
    assert "speculative_hook.py" in body["plan"]["refusal"]  # where SGLang refused it


def test_explicit_resolved_default_is_the_same_trial_as_unset(tmp_path):
    python = sglang_python()
    spec = tiny_sglang_spec(tmp_path, python)
    fps = {
        dry_run("--spec", str(spec), *extra, python=python, cwd=tmp_path)[1]["plan"]["fingerprint"]
        for extra in (
            [],
            ["--set", "server_args.attention_backend=torch_native"],
            ["--set", "server_args.page_size=1"],
        )
    }
    assert len(fps) == 1
    other = dry_run(
        "--spec",
        str(spec),
        "--set",
        "server_args.attention_backend=triton",
        python=python,
        cwd=tmp_path,
    )[1]
    assert other["plan"]["fingerprint"] not in fps


def test_failure_fixtures_still_match_sglangs_source():
    python = sglang_python()
    root = subprocess.run(
        [
            python,
            "-c",
            # found, not imported (importing SGLang takes seconds)
            "import importlib.util as u; "
            "print(u.find_spec('sglang').submodule_search_locations[0])",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    src = Path(root) / "srt"
    assert (
        "captured {self._idx} of {self._num_captures} aux hidden states"
        in (src / "layers" / "aux_hidden_states.py").read_text()
    )
    assert (
        "Not enough memory. Please try to increase --mem-fraction-static."
        in (src / "model_executor" / "pool_configurator.py").read_text()
    )
    assert 'prog="sglang serve"' in (src / "server_args.py").read_text()
    engine_py = (src / "entrypoints" / "engine.py").read_text()
    assert (
        'os.environ["NCCL_NVLS_ENABLE"]' in engine_py
        and 'os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "8"' in engine_py
    )
    assert "SGLANG_ENABLE_SPEC_V2" not in (src / "environ.py").read_text()


def test_export_prints_a_command_sglangs_parser_accepts(tmp_path):
    """A logged trial of the tiny study, exported for SGLang: the installed SGLang's parser takes it
    verbatim."""
    from helpers import tiny_fake_study

    python = sglang_python()
    uri, out, _ = tiny_fake_study(tmp_path)
    assert out.best is not None
    code, body, said = cli(
        "export",
        out.best["run_id"],
        "--tracking-uri",
        uri,
        "--sglang-python",
        python,
        "--json",
        cwd=tmp_path,
    )
    assert code == 0, said
    assert body["checked"].startswith("SGLang 0.5.23 parser") and body["refusal"] is None
    assert sglang_accepts(python, server_argv(body["argv"]))


def test_adaptive_is_resolved_turned_off_or_refused_by_sglang(tmp_path):
    """One planner, one SGLang interpreter: what SGLang's resolution makes of
    --speculative-adaptive."""
    from bisect_eagle.artifacts import scenarios
    from bisect_eagle.engines.sglang.planner import Planner
    from bisect_eagle.spec.schema import SglangServer
    from bisect_eagle.spec.settings import parse_settings

    tiny = scenarios.get("tiny")
    planner = Planner(SglangServer(python=sglang_python()), tiny.target, tiny.draft)

    def plan(**kw):
        return planner.plan(
            parse_settings({"device": "cpu", **kw}, "test"),
            port=30000,
            draft_dir=tmp_path / "draft",
        )

    try:
        on = plan(num_steps=3, speculative_adaptive=True)
        assert on.checked == "SGLang 0.5.23 parser and resolution" and on.refusal is None, (
            on.refusal
        )
        assert (
            on.effective["speculative_adaptive"] is True
            and on.effective["server"]["speculative_adaptive"] is True
        )
        assert on.effective["num_draft_tokens"] == 4 and "--speculative-adaptive" in on.argv
        assert (
            plan(num_steps=3, speculative_adaptive=False).fingerprint
            == plan(num_steps=3).fingerprint
        )
        steps4 = plan(num_steps=4, speculative_adaptive=True)
        assert (
            "ValueError: --speculative-num-steps=4 is not in the adaptive config candidate_steps "
            "[0, 1, 3, 5, 7]"
            in steps4.refusal
            and "speculative_hook.py" in steps4.refusal
        )
        tree = plan(topk=4, num_draft_tokens=8, speculative_adaptive=True)
        assert tree.refusal is None and "speculative_adaptive" not in tree.effective
        assert tree.effective["server"]["speculative_adaptive"] is False
        assert tree.fingerprint == plan(topk=4, num_draft_tokens=8).fingerprint
        off = [w for w in tree.warnings if "turned off by SGLang" in w]
        assert len(off) == 1 and "only topk=1 is supported" in off[0], tree.warnings
    finally:
        planner.close()
