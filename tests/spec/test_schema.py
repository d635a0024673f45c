"""Experiment spec validation: every error names the file, the key and what was expected."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bisect_eagle.artifacts import scenarios
from bisect_eagle.errors import BadInput
from bisect_eagle.spec.load import load_spec
from bisect_eagle.spec.schema import DEFAULT_SPEC, settings_from

ROOT = Path(__file__).resolve().parents[2]

BASE = """\
name: t
target: target
draft: draft
dump: dump
prompts: prompts.jsonl
dump_layer_ids: [1, 5, 9]
"""


def write(tmp_path: Path, extra: str) -> Path:
    """A spec next to links named as BASE names them, to the tiny scenario's inputs (load_spec reads
    them)."""
    tiny = scenarios.get("tiny")
    for name, key in (
        ("target", "target"),
        ("draft", "draft"),
        ("dump", "dump"),
        ("prompts.jsonl", "prompts"),
    ):
        if not (tmp_path / name).exists():
            (tmp_path / name).symlink_to(getattr(tiny, key))
    path = tmp_path / "spec.yaml"
    path.write_text(BASE + extra)
    return path


def test_valid_spec_resolves_paths_and_settings(tmp_path):
    spec = load_spec(
        write(
            tmp_path,
            """
engine: {kind: local, settings: {num_prompts: 4, env.NCCL_ALGO: Ring}}
space:
  num_steps: {type: int, low: 1, high: 4}
  env.NCCL_PROTO: {type: categorical, choices: [LL, Simple, null]}
  num_draft_tokens: {type: categorical, choices: [4, 8], when: {topk: [2, 4]}}
  topk: {type: categorical, choices: [1, 2]}
standalone:
  wirings: [{rule: "[:-1]"}, {layer_ids: [0, 4, 8]}]
""",
        )
    )
    assert spec.target == (tmp_path / "target").resolve()
    fixed = spec.fixed_settings()
    assert fixed.num_prompts == 4 and fixed.env == {"NCCL_ALGO": "Ring"}
    assert spec.standalone.wirings[1].label == "[0, 4, 8]"


@pytest.mark.parametrize(
    "extra, words",
    [
        ("bogus: 1\n", ["'bogus'", "Extra inputs"]),
        ("search: {sampler: annealing}\n", ["search.sampler", "'tpe'", "annealing"]),
        ("space: {num_stepz: {type: int, low: 1, high: 3}}\n", ["num_stepz", "expected one of"]),
        (
            "space: {num_steps: {type: int, low: 5, high: 3}}\n",
            ["space.num_steps", "'low' <= 'high'"],
        ),
        (
            "space: {num_steps: {type: categorical, choices: [1, x]}}\n",
            ["space.num_steps.choices[1]", "'x'"],
        ),
        (
            "engine: {settings: {num_steps: 3}}\nspace: {num_steps: {type: int, low: 1, high: "
            "3}}\n",
            ["num_steps", "also fixed"],
        ),
        (
            "standalone: {wirings: [{rule: '[:-1]'}]}\nspace: {eagle_aux_hidden_state_layer_ids: "
            "{type: categorical, choices: [[1, 5, 9]]}}\n",
            ["standalone.wirings", "eagle_aux_hidden_state_layer_ids"],
        ),
        (
            "space: {topk: {type: categorical, choices: [1], when: {env.NOPE: [1]}}}\n",
            ["space.topk.when", "env.NOPE"],
        ),
        ("search: {prune_below: 0.5}\n", ["prune_below", "repeats"]),
        ("standalone: {reference: training, wirings: [{rule: '[:-1]'}]}\n", ["training_accuracy"]),
        ("criterion: {metric: latency}\n", ["criterion.metric", "latency"]),
        ("baseline: fast\n", ["baseline", "fast"]),
        (
            "standalone: {wirings: [{rule: '[:-1]', layer_ids: [1, 2, 3]}]}\n",
            ["standalone.wirings[0]", "exactly one"],
        ),
    ],
)
def test_bad_specs_name_file_key_and_expectation(tmp_path, extra, words):
    path = write(tmp_path, extra)
    with pytest.raises(BadInput) as e:
        load_spec(path)
    msg = str(e.value)
    assert str(path) in msg
    for w in words:
        assert w in msg, msg


def test_not_yaml_and_not_a_mapping(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(BadInput, match="not valid YAML"):
        load_spec(bad)
    bad.write_text("- a\n- b\n")
    with pytest.raises(BadInput, match="expected a mapping at the top level, found list"):
        load_spec(bad)
    with pytest.raises(BadInput, match="spec file not found"):
        load_spec(tmp_path / "missing.yaml")


def test_settings_from_dotted_and_nested_names():
    s = settings_from(
        {
            "env.NCCL_MIN_NCHANNELS": 4,
            "env.UNSET": None,
            "server_args.disable_cuda_graph": True,
            "env": {"A": "1"},
            "num_steps": 2,
        },
        "here",
    )
    assert s.env == {"NCCL_MIN_NCHANNELS": "4", "A": "1"}
    assert s.server_args == {"disable_cuda_graph": True}
    assert s.num_steps == 2
    with pytest.raises(BadInput, match="here: key 'env.X': expected a string"):
        settings_from({"env.X": [1]}, "here")


def test_default_spec_is_the_shipped_tiny_experiment():
    assert DEFAULT_SPEC.read_text() == (ROOT / "experiments" / "tiny.yaml").read_text()
    spec = load_spec(DEFAULT_SPEC)
    labels = [w.rule or w.layer_ids for w in spec.standalone.wirings]
    for wiring in ("[:-1]", "[1:]", "[emb,0,1]", [0, 4, 8], [2, 6, 10]):
        assert wiring in labels
    wrong = load_spec(ROOT / "experiments" / "tiny-wrong-only.yaml")
    assert [w.rule for w in wrong.standalone.wirings] == ["[1:]", "[emb,0,1]"]


def test_an_sglang_spec_may_name_paths_of_another_machine_but_a_live_run_needs_the_prompts():
    from bisect_eagle.spec.checks import check_live_inputs

    # /models/... and /data/... are not here
    spec = load_spec(ROOT / "experiments" / "glm5-8gpu.yaml")
    assert str(spec.target) == "/models/GLM-5-NVFP4"
    with pytest.raises(
        BadInput, match=r"glm5-8gpu.yaml: key 'prompts': /data/glm5-eagle3/bench-prompts.jsonl does"
    ):
        check_live_inputs(spec)


@pytest.mark.parametrize(
    "extra, words",
    [
        ("engine: {settings: {num_prompts: 0}}\n", ["'num_prompts'", "greater than or equal to 1"]),
        (
            "engine: {settings: {eagle_aux_hidden_state_layer_ids: [5, 5, 9]}}\n",
            ["layer id 5 repeats"],
        ),
        (
            "engine: {settings: {eagle_aux_hidden_state_layer_ids: '1,5,9'}}\n",
            ["found the string '1,5,9'"],
        ),
        ("baseline: .nan\n", ["'baseline'", "positive finite"]),
        ("space: {num_steps: {type: int, low: -3, high: -1}}\n", ["space.num_steps.low", ">= 1"]),
        (
            "standalone: {wirings: [{rule: '[emb,emb,0]'}]}\n",
            ["standalone.wirings[0].rule", "twice"],
        ),
        (
            "space: {eagle_aux_hidden_state_layer_ids: {type: categorical, choices: [[1, 5, "
            "77]]}}\n",
            ["space.eagle_aux_hidden_state_layer_ids.choices[0]", "77", "12-layer"],
        ),
        (
            "engine: {settings: {num_prompts: 30}}\n",
            ["key 'prompts'", "prompts.jsonl", "= 32 are needed"],
        ),
        # a launch budget that cannot run one live trial
        ("search: {max_launches: 0}\n", ["'search.max_launches'", "greater than or equal to 1"]),
        (
            "search: {max_launches: 1}\n",
            ["'search.max_launches' is 1", "the 2 launches of the baseline and one live"],
        ),
        (
            "search: {max_launches: 5, repeats: 3}\n",
            ["is 5", "6 launches", "search.repeats 3 each"],
        ),
        (
            "baseline: 90\nsearch: {max_launches: 2, repeats: 3}\n",
            ["is 2", "3 launches of one live trial"],
        ),
    ],
)
def test_bounds_repeats_ids_and_prompts_are_refused_at_load(tmp_path, extra, words):
    path = write(tmp_path, extra)
    with pytest.raises(BadInput) as e:
        load_spec(path)
    for w in [str(path), *words]:
        assert w in str(e.value), str(e.value)


def test_speculative_adaptive_is_one_setting_searchable_and_folded_from_its_flag_spelling(tmp_path):
    spec = load_spec(
        write(
            tmp_path,
            """
engine: {kind: local, settings: {num_prompts: 4}}
space:
  speculative_adaptive: {type: categorical, choices: [false, true]}
""",
        )
    )
    assert spec.fixed_settings().speculative_adaptive is False
    assert (
        settings_from(
            {**spec.engine.settings, "speculative_adaptive": True}, "here"
        ).speculative_adaptive
        is True
    )
    folded = settings_from(
        {"server_args.speculative_adaptive": True, "server_args.page_size": 16}, "here"
    )
    assert folded.speculative_adaptive is True and folded.server_args == {"page_size": 16}
    assert "speculative_adaptive" in folded.model_fields_set  # what `requested` shows
    assert settings_from({"server_args": {"speculative_adaptive": None}}, "here").server_args == {}
    unset_flag = settings_from(
        {"speculative_adaptive": True, "server_args": {"speculative_adaptive": None}}, "here"
    )
    # null is unset, not a second value
    assert unset_flag.speculative_adaptive is True and unset_flag.server_args == {}
    nulled = load_spec(
        write(
            tmp_path,
            """
engine:
  kind: local
  settings: {speculative_adaptive: true, server_args: {speculative_adaptive: null}}
""",
        )
    )  # a spec may null the flag spelling beside the field
    assert nulled.fixed_settings().speculative_adaptive is True
    with pytest.raises(
        BadInput,
        match="here: speculative_adaptive and server_args.speculative_adaptive are the same",
    ):
        settings_from(
            {"speculative_adaptive": False, "server_args.speculative_adaptive": True}, "here"
        )
    with pytest.raises(BadInput, match="here: key 'speculative_adaptive': expected true or false"):
        settings_from({"speculative_adaptive": 1}, "here")


@pytest.mark.parametrize(
    "extra, words",
    [
        (
            "engine: {settings: {server_args.speculative_adaptive: true}}\nspace: "
            "{speculative_adaptive: {type: categorical, choices: [false, true]}}\n",
            ["key 'server_args.speculative_adaptive'", "keep 'speculative_adaptive'"],
        ),
        (
            "space: {speculative_adaptive: {type: categorical, choices: [false, true]}, "
            "server_args.speculative_adaptive: {type: categorical, choices: [true]}}\n",
            ["server_args.speculative_adaptive"],
        ),
        (
            "groups: [[num_steps, server_args.speculative_adaptive]]\n",
            ["groups", "as 'speculative_adaptive'"],
        ),
        (
            "space: {speculative_adaptive: {type: categorical, choices: [false, 'on']}}\n",
            ["space.speculative_adaptive.choices[1]", "true or false"],
        ),
    ],
)
def test_speculative_adaptive_named_twice_or_not_a_boolean_is_refused_at_load(
    tmp_path, extra, words
):
    path = write(tmp_path, extra)
    with pytest.raises(BadInput) as e:
        load_spec(path)
    assert str(path) in str(e.value) and all(w in str(e.value) for w in words), str(e.value)


def test_a_launch_budget_is_optional_and_read_as_given(tmp_path):
    assert load_spec(write(tmp_path, "")).search.max_launches is None
    assert load_spec(write(tmp_path, "search: {max_launches: 2}\n")).search.max_launches == 2
    assert (
        load_spec(write(tmp_path, "baseline: 90\nsearch: {max_launches: 1}\n")).search.max_launches
        == 1
    )


# SGLang 0.5.23's --dtype choices
SGLANG_DTYPES = ["auto", "half", "float16", "bfloat16", "float", "float32"]


@pytest.mark.parametrize("dtype", SGLANG_DTYPES)
def test_dtype_takes_each_of_sglangs_choices_fixed_and_searched(tmp_path, dtype):
    fixed = load_spec(write(tmp_path, f"engine: {{kind: local, settings: {{dtype: {dtype}}}}}\n"))
    assert fixed.fixed_settings().dtype == dtype
    searched = load_spec(
        write(tmp_path, f"space: {{dtype: {{type: categorical, choices: [{dtype}, float32]}}}}\n")
    )
    assert searched.space["dtype"].choices == [dtype, "float32"]


def test_a_dtype_sglang_refuses_is_refused_naming_the_file_and_key(tmp_path):
    path = write(tmp_path, "engine: {kind: local, settings: {dtype: fp8}}\n")
    with pytest.raises(BadInput) as e:
        load_spec(path)
    assert str(path) in str(e.value) and "key 'dtype'" in str(e.value) and "'auto'" in str(e.value)
    assert "\n" not in str(e.value)


def test_the_dtype_choices_are_sglangs_own():
    """The settings' dtype names are the installed SGLang parser's --dtype choices (skips without
    SGLang)."""
    import json
    import subprocess

    from sglang_oracle import sglang_python

    from bisect_eagle.spec.settings import TORCH_DTYPE_NAMES, LiveSettings

    code = (
        "import argparse, json; from sglang.srt.server_args import ServerArgs; p = "
        "argparse.ArgumentParser(); ServerArgs.add_cli_args(p); print(json.dumps([a.choices for a "
        "in p._actions if a.dest == 'dtype'][0]))"
    )
    out = subprocess.run(
        [sglang_python(), "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    choices = json.loads(out.stdout.strip().splitlines()[-1])
    assert choices == SGLANG_DTYPES
    assert list(LiveSettings.model_fields["dtype"].annotation.__args__) == choices
    assert set(TORCH_DTYPE_NAMES) == set(choices)


@pytest.mark.parametrize(
    "fixed, override",
    [
        (
            {"server_args": {"speculative_adaptive": False, "page_size": 64}},
            {"speculative_adaptive": True},
        ),
        ({"server_args.speculative_adaptive": False}, {"speculative_adaptive": True}),
        ({"speculative_adaptive": False}, {"server_args.speculative_adaptive": True}),
        (
            {"speculative_adaptive": False, "server_args": {"page_size": 64}},
            {"server_args": {"speculative_adaptive": True}},
        ),
    ],
)
def test_an_override_of_adaptive_in_either_spelling_replaces_the_specs_in_either(fixed, override):
    from bisect_eagle.spec.schema import with_overrides

    s = settings_from(with_overrides(fixed, override), "--set")
    assert s.speculative_adaptive is True and "speculative_adaptive" not in s.server_args
    if "server_args" in fixed and "server_args" not in override:
        assert s.server_args == {"page_size": 64}  # the spec's other flags are kept
    with pytest.raises(
        BadInput, match="--set: speculative_adaptive and server_args.speculative_adaptive"
    ):
        settings_from({**fixed, **override}, "--set")  # a plain merge names the flag twice


def test_with_overrides_leaves_other_settings_as_a_plain_merge():
    from bisect_eagle.spec.schema import with_overrides

    fixed = {
        "num_steps": 3,
        "server_args": {"speculative_adaptive": False},
        "env.NCCL_ALGO": "Ring",
    }
    assert with_overrides(fixed, {"num_steps": 5}) == {**fixed, "num_steps": 5}
    assert with_overrides(fixed, {}) == fixed


NOT_LABELS = [
    "../../../x",
    "/abs/name",
    "a/b",
    "a\\b",
    "..",
    ".hidden",
    "two\nlines",
    "tab\there",
    "bell\a",
    "trailing ",
    " leading",
    "n" * 101,
    "",
]


@pytest.mark.parametrize("name", NOT_LABELS)
def test_a_name_that_is_not_a_label_is_refused_at_load(tmp_path, name):
    path = write(tmp_path, "")
    path.write_text(path.read_text().replace("name: t\n", f"name: {json.dumps(name)}\n"))
    with pytest.raises(BadInput) as e:
        load_spec(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: key 'name'") and "\n" not in msg, msg


@pytest.mark.parametrize("name", ["t", "glm5-nvfp4-8gpu", "tiny_2.1", "GLM 5 at TP 8", "n" * 100])
def test_a_label_is_a_name(tmp_path, name):
    path = write(tmp_path, "")
    path.write_text(path.read_text().replace("name: t\n", f"name: {json.dumps(name)}\n"))
    assert load_spec(path).name == name


NUMBER_KEYS = [
    "search.max_launches",
    "search.max_live_trials",
    "search.repeats",
    "search.startup_trials",
    "search.seed",
    "search.max_wall_s",
    "search.confirm.min_pairs",
    "engine.sglang.tp",
    "engine.vllm.ready_timeout_s",
    "training_accuracy",
    "standalone.samples",
    "criterion.ratio",
]


@pytest.mark.parametrize("key", NUMBER_KEYS)
@pytest.mark.parametrize("value", ["true", "false"])
def test_a_boolean_is_not_a_number(tmp_path, key, value):
    *parents, leaf = key.split(".")
    extra = "".join(f"{'  ' * i}{p}:\n" for i, p in enumerate(parents))
    extra += f"{'  ' * len(parents)}{leaf}: {value}\n"
    path = write(tmp_path, extra)
    with pytest.raises(BadInput) as e:
        load_spec(path)
    assert str(e.value).startswith(f"{path}: key '{key}': expected a number, not a boolean"), str(
        e.value
    )


def test_a_boolean_range_bound_is_not_a_number(tmp_path):
    path = write(tmp_path, "space: {num_steps: {type: int, low: true, high: 3}}\n")
    with pytest.raises(
        BadInput, match=r"key 'space.num_steps.low': expected a number, not a boolean"
    ):
        load_spec(path)


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
@pytest.mark.parametrize("command", ["[]", "['']", "['  ', -m, x]"])
def test_an_empty_launch_command_is_refused_at_load(tmp_path, kind, command):
    path = write(tmp_path, f"engine: {{kind: {kind}, {kind}: {{launch_command: {command}}}}}\n")
    with pytest.raises(BadInput) as e:
        load_spec(path)
    msg = str(e.value)
    assert (
        msg.startswith(f"{path}: key 'engine.{kind}.launch_command': expected the program")
        and "\n" not in msg
    )
