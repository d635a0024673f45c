"""The bad-input corpus beyond the data files (tests/bad_data_cases.py): specs, prompts and the
flags of every command. Each case breaks one thing and says which file (or flag) and which key the
one-line error must name.

A case is ``(id, build)``; ``build(tmp)`` writes what it needs under ``tmp`` and returns
:class:`Bad`: the full ``bisect-eagle`` argument list, the culprit (a path or a flag) and the key
(None when the culprit says it all).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from bad_data_cases import CASES as DATA_CASES
from bad_data_cases import NO_CUDA_DEVICE

ROOT = Path(__file__).resolve().parents[2]
WIRING = "eagle_aux_hidden_state_layer_ids"


@dataclass
class Bad:
    args: list[str]
    culprit: Path | str
    key: str | None


# -- builders
# ----------------------------------------------------------------------------------------------


def _tiny_spec(engine: str) -> dict[str, Any]:
    name = "tiny.yaml" if engine == "local" else "tiny-sglang.yaml"
    return yaml.safe_load((ROOT / "experiments" / name).read_text())


def spec_case(
    edit: Callable[[dict], object],
    key: str | None,
    *,
    engine: str = "local",
    command: str = "run",
    culprit: Callable[[Path, Path], Path | str] | None = None,
) -> Callable[[Path], Bad]:
    """A tiny spec (local or sglang engine) with ``edit`` applied, given to ``command``."""

    def build(tmp: Path) -> Bad:
        raw = _tiny_spec(engine)
        edit(raw)
        path = tmp / "spec.yaml"
        path.write_text(yaml.safe_dump(raw))
        args = (
            [command, str(path)]
            if command in ("run", "worker", "doctor", "ui")
            else [command, "--spec", str(path)]
        )
        return Bad(args, culprit(tmp, path) if culprit else path, key)

    return build


def settings(**values: Any) -> Callable[[dict], None]:
    return lambda raw: raw["engine"]["settings"].update(values)


def top(**values: Any) -> Callable[[dict], None]:
    return lambda raw: raw.update(values)


def space(**params: Any) -> Callable[[dict], None]:
    return lambda raw: raw.setdefault("space", {}).update(params)


def wirings(*items: dict) -> Callable[[dict], None]:
    return lambda raw: raw["standalone"].update(wirings=list(items))


def prompts_case(lines: list[str] | bytes, key: str | None, **edit: Any) -> Callable[[Path], Bad]:
    """The tiny spec with its prompts replaced by ``lines`` (a list of JSONL lines, or raw
    bytes)."""

    def build(tmp: Path) -> Bad:
        prompts = tmp / "prompts.jsonl"
        if isinstance(lines, bytes):
            prompts.write_bytes(lines)
        else:
            prompts.write_text("\n".join(lines) + "\n")
        raw = _tiny_spec("local")
        raw["prompts"] = str(prompts)
        raw["engine"]["settings"].update(edit)
        path = tmp / "spec.yaml"
        path.write_text(yaml.safe_dump(raw))
        return Bad(["run", str(path)], prompts, key)

    return build


def good_lines(n: int) -> list[str]:
    return [json.dumps({"id": f"q{i}", "prompt": f"question {i}"}) for i in range(n)]


def data_in_spec(name: str, key: str) -> Callable[[Path], Bad]:
    """A bad draft, dump or target of the data corpus, named by a spec's ``key`` and given to
    ``run``."""

    def build(tmp: Path) -> Bad:
        bad = dict(DATA_CASES)[name](tmp)
        raw = _tiny_spec("local")
        raw[key] = bad.args[1]
        path = tmp / "spec.yaml"
        path.write_text(yaml.safe_dump(raw))
        return Bad(["run", str(path)], bad.culprit, bad.key)

    return build


def raw_spec(text: str, key: str | None, command: str = "run") -> Callable[[Path], Bad]:
    def build(tmp: Path) -> Bad:
        path = tmp / "spec.yaml"
        path.write_text(text)
        return Bad([command, str(path)], path, key)

    return build


def flags(*args: str, culprit: str, key: str | None = None) -> Callable[[Path], Bad]:
    return lambda tmp: Bad(list(args), culprit, key)


def missing(tmp: Path, *names: str) -> str:
    return str(tmp.joinpath(*names))


def _space_ids(raw: dict) -> None:
    """Ids searched as a categorical (no stage 1), one choice with id 77 on the 12-layer tiny
    target."""
    raw["standalone"]["wirings"] = []
    raw.setdefault("space", {})[WIRING] = {
        "type": "categorical",
        "choices": [[1, 5, 9], [1, 5, 77]],
    }


# -- the corpus
# ----------------------------------------------------------------------------------------------

SPEC_CASES: list[tuple[str, Callable[[Path], Bad]]] = [
    ("num-prompts-zero", spec_case(settings(num_prompts=0), "num_prompts")),
    ("num-prompts-negative", spec_case(settings(num_prompts=-2), "num_prompts")),
    ("num-prompts-true", spec_case(settings(num_prompts=True), "num_prompts")),
    ("max-new-tokens-zero", spec_case(settings(max_new_tokens=0), "max_new_tokens")),
    ("max-new-tokens-negative", spec_case(settings(max_new_tokens=-5), "max_new_tokens")),
    ("warmup-prompts-negative", spec_case(settings(warmup_prompts=-1), "warmup_prompts")),
    ("concurrency-zero", spec_case(settings(concurrency=0), "concurrency")),
    ("temperature-nan", spec_case(settings(temperature=float("nan")), "temperature")),
    (
        "num-steps-zero-fixed",
        spec_case(
            lambda raw: (raw.pop("space"), raw["engine"]["settings"].update(num_steps=0)),
            "engine.settings.num_steps",
        ),
    ),
    ("baseline-nan", spec_case(top(baseline=float("nan")), "baseline")),
    ("baseline-negative", spec_case(top(baseline=-90.0), "baseline")),
    ("baseline-true", spec_case(top(baseline=True), "baseline")),
    (
        "space-num-steps-0-0",
        spec_case(space(num_steps={"type": "int", "low": 0, "high": 0}), "space.num_steps"),
    ),
    (
        "space-num-steps-negative",
        spec_case(space(num_steps={"type": "int", "low": -3, "high": -1}), "space.num_steps"),
    ),
    (
        "space-num-steps-choice-zero",
        spec_case(
            space(num_steps={"type": "categorical", "choices": [0, 2]}),
            "space.num_steps.choices[0]",
        ),
    ),
    (
        "space-num-prompts-choice-zero",
        spec_case(
            lambda raw: (
                raw["engine"]["settings"].pop("num_prompts"),
                space(num_prompts={"type": "categorical", "choices": [0, 2]})(raw),
            ),
            "space.num_prompts.choices[0]",
        ),
    ),
    (
        "space-low-above-high",
        spec_case(space(num_steps={"type": "int", "low": 4, "high": 2}), "space.num_steps"),
    ),
    ("ids-repeated", spec_case(settings(**{WIRING: [5, 5, 9]}), WIRING)),
    ("ids-as-string", spec_case(settings(**{WIRING: "1,5,9"}), WIRING)),
    (
        "ids-out-of-range-fixed",
        spec_case(settings(**{WIRING: [1, 5, 14]}), f"engine.settings.{WIRING}"),
    ),
    ("ids-out-of-range-space", spec_case(_space_ids, f"space.{WIRING}.choices[1]")),
    (
        "wiring-ids-out-of-range",
        spec_case(wirings({"layer_ids": [0, 4, 40]}), "standalone.wirings[0].layer_ids"),
    ),
    (
        "wiring-ids-repeated",
        spec_case(wirings({"layer_ids": [4, 4, 8]}), "standalone.wirings[0].layer_ids"),
    ),
    (
        "wiring-rule-repeated",
        spec_case(wirings({"rule": "[emb,emb,0]"}), "standalone.wirings[0].rule"),
    ),
    ("wiring-rule-garbage", spec_case(wirings({"rule": "[x]"}), "standalone.wirings[0].rule")),
    ("dump-layer-ids-repeated", spec_case(top(dump_layer_ids=[1, 5, 5]), "dump_layer_ids")),
    ("dump-layer-ids-out-of-range", spec_case(top(dump_layer_ids=[1, 5, 12]), "dump_layer_ids")),
    ("spec-device-banana", spec_case(settings(device="banana"), "engine.settings.device")),
    ("spec-device-no-cuda", spec_case(settings(device=NO_CUDA_DEVICE), "engine.settings.device")),
    ("target-missing", spec_case(top(target="/nonexistent/target"), "target")),
    ("draft-missing", spec_case(top(draft="/nonexistent/draft"), "draft")),
    ("dump-missing", spec_case(top(dump="/nonexistent/dump"), "dump")),
    ("prompts-missing", spec_case(top(prompts="/nonexistent/p.jsonl"), "prompts")),
    (
        "max-live-trials-zero",
        spec_case(lambda raw: raw["search"].update(max_live_trials=0), "search.max_live_trials"),
    ),
    ("ratio-zero", spec_case(lambda raw: raw["criterion"].update(ratio=0), "criterion.ratio")),
    ("unknown-key", spec_case(top(bogus=1), "bogus")),
    ("unknown-setting", spec_case(settings(num_stepz=3), "num_stepz")),
    ("unknown-scenario", spec_case(top(scenario="nope"), "scenario")),
    ("spec-not-yaml", raw_spec("name: [unclosed\n", None)),
    ("spec-not-a-mapping", raw_spec("- a\n- b\n", None)),
    (
        "sglang-ids-out-of-range",
        spec_case(settings(**{WIRING: [1, 5, 77]}), f"engine.settings.{WIRING}", engine="sglang"),
    ),
    ("sglang-num-prompts-zero", spec_case(settings(num_prompts=0), "num_prompts", engine="sglang")),
    (
        "sglang-adaptive-twice-fixed",
        spec_case(
            settings(speculative_adaptive=True, server_args={"speculative_adaptive": True}),
            "server_args.speculative_adaptive",
            engine="sglang",
        ),
    ),
    (
        "sglang-adaptive-searched-and-fixed",
        spec_case(
            lambda raw: (
                settings(**{"server_args.speculative_adaptive": True})(raw),
                space(speculative_adaptive={"type": "categorical", "choices": [False, True]})(raw),
            ),
            "server_args.speculative_adaptive",
            engine="sglang",
        ),
    ),
    (
        "adaptive-not-a-boolean",
        spec_case(settings(speculative_adaptive="on"), "speculative_adaptive"),
    ),
    (
        "sglang-prompts-missing-live",
        spec_case(top(prompts="/nonexistent/bench.jsonl"), "prompts", engine="sglang"),
    ),
    (
        "worker-spec-ids-repeated",
        spec_case(settings(**{WIRING: [5, 5, 9]}), WIRING, command="worker"),
    ),
    (
        "doctor-spec-num-prompts-zero",
        spec_case(settings(num_prompts=0), "num_prompts", command="doctor"),
    ),
    ("live-spec-baseline-nan", spec_case(top(baseline=float("nan")), "baseline", command="live")),
    ("ui-spec-unknown-key", spec_case(top(bogus=1), "bogus", command="ui")),
    ("bisect-good-spec-num-prompts-zero", lambda tmp: _bisect_spec(tmp, "--good")),
    ("bisect-bad-spec-ids-out-of-range", lambda tmp: _bisect_spec(tmp, "--bad")),
    # bounded inputs: lengths MLflow and a terminal accept, YAML that cannot expand, flag values as
    # a command has
    ("description-100kb", spec_case(top(description="x" * 100_000), "description")),
    ("name-10kb", spec_case(top(name="n" * 10_000), "name")),
    # a name is a label: it names the server logs' folder, and is printed as part of a line
    ("name-path-escape", spec_case(top(name="../../../x"), "name", engine="sglang")),
    ("name-absolute", spec_case(top(name="/tmp/elsewhere"), "name", engine="sglang")),
    ("name-newline", spec_case(top(name="two\nlines"), "name")),
    # a boolean is not a number; a server needs a program to launch
    (
        "max-launches-true",
        spec_case(lambda raw: raw["search"].update(max_launches=True), "search.max_launches"),
    ),
    ("repeats-true", spec_case(lambda raw: raw["search"].update(repeats=True), "search.repeats")),
    (
        "startup-trials-true",
        spec_case(lambda raw: raw["search"].update(startup_trials=True), "search.startup_trials"),
    ),
    (
        "max-live-trials-true",
        spec_case(lambda raw: raw["search"].update(max_live_trials=True), "search.max_live_trials"),
    ),
    (
        "sglang-launch-command-empty",
        spec_case(
            lambda raw: raw["engine"]["sglang"].update(launch_command=[]),
            "engine.sglang.launch_command",
            engine="sglang",
        ),
    ),
    (
        "vllm-launch-command-empty",
        spec_case(
            lambda raw: raw["engine"].update(kind="vllm", vllm={"launch_command": []}),
            "engine.vllm.launch_command",
            engine="sglang",
        ),
    ),
    (
        "yaml-alias-bomb",
        raw_spec(
            "name: bomb\nscenario: tiny\nengine:\n  settings:\n    server_args:\n"
            + "".join(
                f"      k{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9) if i else 'x'}]\n"
                for i in range(8)
            ),
            None,
        ),
    ),
    (
        "spec-over-a-megabyte",
        raw_spec("name: big\nscenario: tiny\n" + "# padding\n" * 120_000, None),
    ),
    (
        "server-args-nested",
        spec_case(
            settings(server_args={"attention_backend": {"nested": [1, [2]]}}),
            "server_args.attention_backend",
        ),
    ),
    (
        "confirm-min-above-max",
        spec_case(
            lambda raw: raw["search"].update(confirm={"min_pairs": 8, "max_pairs": 2}),
            "search.confirm",
        ),
    ),
    (
        "wiring-rule-index-beyond-dump",
        spec_case(wirings({"rule": "[0,1,7]"}), "standalone.wirings[0]"),
    ),
    ("wiring-rule-empty-slice", spec_case(wirings({"rule": "[5:2]"}), "standalone.wirings[0]")),
    ("wiring-rule-too-few-states", spec_case(wirings({"rule": "[0,1]"}), "standalone.wirings[0]")),
    ("wiring-ids-too-few", spec_case(wirings({"layer_ids": [1, 5]}), "standalone.wirings[0]")),
    (
        "space-refused-whole",
        spec_case(
            lambda raw: raw["engine"]["settings"].update(speculative_adaptive=True, topk=2),
            "refuses all",
        ),
    ),
]


def _bisect_spec(tmp: Path, side: str) -> Bad:
    """``bisect`` with one side's spec broken (a count of 0 on the good side, id 77 on the bad
    side)."""
    edit = settings(num_prompts=0) if side == "--good" else settings(**{WIRING: [1, 5, 77]})
    bad = spec_case(edit, "num_prompts" if side == "--good" else WIRING)(tmp)
    other = str(ROOT / "experiments" / ("tiny-broken.yaml" if side == "--good" else "tiny.yaml"))
    pair = [bad.args[1], other] if side == "--good" else [other, bad.args[1]]
    return Bad(["bisect", "--good", pair[0], "--bad", pair[1]], bad.culprit, bad.key)


PROMPTS_CASES: list[tuple[str, Callable[[Path], Bad]]] = [
    ("prompts-too-few", prompts_case(good_lines(3), None)),
    ("prompts-too-few-for-space", lambda tmp: _space_prompts(tmp)),
    ("prompts-bad-json", prompts_case([*good_lines(2), "{not json", *good_lines(4)], None)),
    (
        "prompts-no-prompt-key",
        prompts_case([*good_lines(1), '{"id": "x", "text": "hi"}', *good_lines(4)], "prompt"),
    ),
    ("prompts-empty-prompt", prompts_case(['{"id": "x", "prompt": ""}', *good_lines(5)], "prompt")),
    (
        "prompts-repeated-id",
        prompts_case([*good_lines(5), '{"id": "q0", "prompt": "again"}'], "id"),
    ),
    ("prompts-not-an-object", prompts_case(['["hi"]', *good_lines(5)], None)),
    (
        "prompts-bad-messages",
        prompts_case(['{"messages": [{"role": "user"}]}', *good_lines(5)], "messages"),
    ),
    ("prompts-bool-id", prompts_case(['{"id": true, "prompt": "hi"}', *good_lines(5)], "id")),
    ("prompts-not-utf8", prompts_case(b"\xff\xfe\x00bad", None)),
    ("prompts-a-directory", lambda tmp: _prompts_dir(tmp)),
]


def _prompts_dir(tmp: Path) -> Bad:
    bad = prompts_case(good_lines(6), None)(tmp)
    prompts = Path(bad.culprit)
    prompts.unlink()
    prompts.mkdir()
    return bad


def _space_prompts(tmp: Path) -> Bad:
    """Six prompts suffice for the fixed settings (1 + 4), not for the top of a searched num_prompts
    (1 + 8)."""
    bad = prompts_case(good_lines(6), None)(tmp)
    raw = yaml.safe_load(Path(bad.args[1]).read_text())
    del raw["engine"]["settings"]["num_prompts"]
    raw["space"]["num_prompts"] = {"type": "categorical", "choices": [2, 8]}
    Path(bad.args[1]).write_text(yaml.safe_dump(raw))
    return bad


DATA_IN_SPEC_CASES: list[tuple[str, Callable[[Path], Bad]]] = [
    (f"spec-{name}", data_in_spec(name, key))
    for name, key in [
        ("dump-hidden-states-list-of-ints", "dump"),
        ("dump-nan-aux", "dump"),
        ("draft-ids-as-string", "draft"),
        ("draft-lm-head-shape", "draft"),
        ("draft-hidden-size-big", "draft"),
        ("target-pickle-only", "target"),
    ]
]

TINY_ARGS = ["--scenario", "tiny"]

FLAG_CASES: list[tuple[str, Callable[[Path], Bad]]] = [
    ("no-command", flags(culprit="Missing command")),
    ("unknown-command", flags("frobnicate", culprit="frobnicate")),
    ("run-unknown-flag", flags("run", "--bogus", culprit="--bogus")),
    (
        "run-max-live-trials-zero",
        flags("run", "--max-live-trials", "0", culprit="--max-live-trials"),
    ),
    ("run-max-wall-s-zero", flags("run", "--max-wall-s", "0", culprit="--max-wall-s")),
    (
        "run-spec-missing",
        lambda tmp: Bad(["run", missing(tmp, "absent.yaml")], missing(tmp, "absent.yaml"), None),
    ),
    ("worker-wait-negative", flags("worker", "--wait-s", "-1", culprit="--wait-s")),
    ("live-set-no-equals", flags("live", *TINY_ARGS, "--set", "num_steps", culprit="--set")),
    (
        "live-set-num-prompts-zero",
        flags("live", *TINY_ARGS, "--set", "num_prompts=0", culprit="--set", key="num_prompts"),
    ),
    (
        "live-set-ids-repeated",
        flags("live", *TINY_ARGS, "--set", f"{WIRING}=[5,5,9]", culprit="--set", key=WIRING),
    ),
    (
        "live-set-ids-string",
        flags("live", *TINY_ARGS, "--set", f"{WIRING}=1,5,9", culprit="--set", key=WIRING),
    ),
    (
        "live-set-device-banana",
        flags("live", *TINY_ARGS, "--set", "device=banana", culprit="--set device"),
    ),
    (
        "live-set-unknown",
        flags("live", *TINY_ARGS, "--set", "num_stepz=2", culprit="--set", key="num_stepz"),
    ),
    (
        "live-baseline-conflict",
        flags(
            "live",
            *TINY_ARGS,
            "--baseline",
            "--set",
            "speculative_algorithm=EAGLE3",
            culprit="--baseline",
        ),
    ),
    ("live-no-paths", flags("live", culprit="--target")),
    (
        "live-prompts-missing",
        lambda tmp: Bad(
            ["live", *TINY_ARGS, "--prompts", missing(tmp, "p.jsonl")],
            missing(tmp, "p.jsonl"),
            None,
        ),
    ),
    (
        "live-target-missing",
        lambda tmp: Bad(
            ["live", *TINY_ARGS, "--target", missing(tmp, "t")], missing(tmp, "t"), None
        ),
    ),
    (
        "live-spec-missing",
        lambda tmp: Bad(["live", "--spec", missing(tmp, "s.yaml")], missing(tmp, "s.yaml"), None),
    ),
    ("standalone-rule-garbage", flags("standalone", *TINY_ARGS, "--rule", "[x]", culprit="--rule")),
    ("standalone-no-paths", flags("standalone", culprit="--draft")),
    (
        "standalone-samples-text",
        flags("standalone", *TINY_ARGS, "--samples", "many", culprit="--samples"),
    ),
    (
        "fingerprint-samples-zero",
        flags("fingerprint", *TINY_ARGS, "--samples", "0", culprit="--samples"),
    ),
    (
        "fingerprint-dump-missing",
        lambda tmp: Bad(
            ["fingerprint", *TINY_ARGS, "--dump", missing(tmp, "d")], missing(tmp, "d"), None
        ),
    ),
    ("fingerprint-no-paths", flags("fingerprint", culprit="--dump")),
    (
        "doctor-spec-missing",
        lambda tmp: Bad(["doctor", missing(tmp, "s.yaml")], missing(tmp, "s.yaml"), None),
    ),
    ("doctor-no-spec", flags("doctor", culprit="'spec'")),
    ("export-port-zero", flags("export", "--port", "0", culprit="--port")),
    ("export-port-text", flags("export", "--port", "http", culprit="--port")),
    ("reproduce-no-run-id", flags("reproduce", culprit="'run_id'")),
    ("reproduce-repeats-zero", flags("reproduce", "abc", "--repeats", "0", culprit="--repeats")),
    ("ui-port-zero", flags("ui", "--port", "0", culprit="--port")),
    ("ui-port-too-big", flags("ui", "--port", "70000", culprit="--port")),
    ("bisect-nothing", flags("bisect", culprit="--good")),
    (
        "bisect-good-missing",
        lambda tmp: Bad(
            [
                "bisect",
                "--good",
                missing(tmp, "g.yaml"),
                "--bad",
                str(ROOT / "experiments" / "tiny-broken.yaml"),
            ],
            "--good",
            None,
        ),
    ),
    (
        "tracking-uri-ftp-password",
        flags("run", "--tracking-uri", "ftp://user:password@127.0.0.1/x", culprit="--tracking-uri"),
    ),
    (
        "tracking-uri-malformed",
        flags("run", "--tracking-uri", "http://[::1", culprit="--tracking-uri"),
    ),
    (
        "storage-not-a-database",
        flags("run", "--storage", "ftp://user:password@127.0.0.1/x", culprit="--storage"),
    ),
    (
        "bisect-replay-not-utf8",
        lambda tmp: (
            tmp.joinpath("b.log").write_bytes(b"\xff\xfe not a log\n"),
            Bad(["bisect", "--replay", str(tmp / "b.log")], tmp / "b.log", None),
        )[1],
    ),
    (
        "report-postgres-unreachable",
        flags(
            "report",
            "--tracking-uri",
            "postgresql://u:pw@127.0.0.1:9/mlflow",
            culprit="tracking URI",
        ),
    ),
    (
        "bisect-set-no-equals",
        flags(
            "bisect",
            "--good",
            str(ROOT / "experiments" / "tiny.yaml"),
            "--bad",
            str(ROOT / "experiments" / "tiny-broken.yaml"),
            "--set",
            "oops",
            culprit="--set",
        ),
    ),
]

CASES = [*SPEC_CASES, *PROMPTS_CASES, *DATA_IN_SPEC_CASES, *FLAG_CASES]
