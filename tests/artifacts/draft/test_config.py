"""The one reader of a draft's config.json: both layouts, where the ids were found, SGLang's fc
width, and one-line errors naming the file and the key."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bisect_eagle.artifacts.draft import DraftConfig, read_draft_config, save_draft
from bisect_eagle.artifacts.layers import LOCAL_READER, SGLANG_READER, VLLM_READER
from bisect_eagle.doctor import read_draft
from bisect_eagle.engines.serve import draft_layer_ids
from bisect_eagle.errors import BadInput

from helpers import random_draft

NESTED = "eagle_config.eagle_aux_hidden_state_layer_ids"


def _edited(tmp_path: Path, source: Path, edit) -> Path:
    out = tmp_path / "draft"
    shutil.copytree(source, out)
    cfg = json.loads((out / "config.json").read_text())
    edit(cfg)
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def _speculators(tmp_path: Path, **extra) -> Path:
    save_draft(
        random_draft(),
        tmp_path / "spec",
        layout="speculators",
        layer_ids=[2, 6, 10],
        extra_config=extra,
    )
    return tmp_path / "spec"


def test_specforge_layout(tiny):
    cf = read_draft_config(tiny.draft)
    assert (cf.layout, cf.architectures, cf.is_eagle3) == (
        "specforge",
        ["LlamaForCausalLMEagle3"],
        True,
    )
    assert (cf.hidden_size, cf.num_attention_heads, cf.num_key_value_heads, cf.head_dim) == (
        192,
        4,
        4,
        48,
    )
    assert (cf.vocab_size, cf.draft_vocab_size, cf.target_hidden_size) == (257, 96, 192)
    assert (cf.nested_ids, cf.top_level_ids, cf.ids_found, cf.layer_ids) == (
        [1, 5, 9],
        None,
        "nested",
        [1, 5, 9],
    )
    assert cf.path == tiny.draft / "config.json"
    assert (
        cf.sglang_fc_aux() == (3, NESTED) and cf.sglang_fc_aux()[0] * cf.target_hidden_size == 576
    )
    assert cf.declared_ids(SGLANG_READER) == cf.declared_ids(LOCAL_READER) == ([1, 5, 9], "sglang")
    # vLLM falls back to the nested ids, read as its own
    assert cf.declared_ids(VLLM_READER) == ([1, 5, 9], "vllm")
    assert cf.draft_config(3) == DraftConfig(
        hidden_size=192,
        intermediate_size=512,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=48,
        vocab_size=257,
        draft_vocab_size=96,
        target_hidden_size=192,
        num_aux=3,
    )


def test_speculators_layout_reads_the_nested_layer_keys_and_top_level_ids(tmp_path):
    cf = read_draft_config(_speculators(tmp_path))
    assert (cf.layout, cf.hidden_size, cf.vocab_size, cf.draft_vocab_size) == (
        "speculators",
        16,
        32,
        24,
    )
    assert (cf.ids_found, cf.layer_ids) == ("top-level", [2, 6, 10])
    assert cf.declared_ids(LOCAL_READER) == cf.declared_ids(VLLM_READER) == ([2, 6, 10], "vllm")
    assert cf.declared_ids(SGLANG_READER) == (None, "sglang")
    # SGLang sizes fc from num_aux_hidden_states, else the nested ids, else 3: top-level ids size
    # nothing
    assert cf.sglang_fc_aux() == (3, "SGLang's default of 3")


def test_sglang_fc_precedence(tmp_path):
    cf = read_draft_config(
        _speculators(
            tmp_path,
            num_aux_hidden_states=4,
            eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 2]},
        )
    )
    assert cf.sglang_fc_aux() == (4, "num_aux_hidden_states")
    assert cf.sglang_fc_aux()[0] * cf.target_hidden_size == 4 * 16
    # speculators: the top level first
    assert cf.nested_ids == [1, 2] and cf.ids_found == "top-level"


def test_ids_found_at_the_top_level_or_nowhere(tmp_path, tiny):
    def top(cfg):
        cfg["eagle_aux_hidden_state_layer_ids"] = cfg.pop("eagle_config")[
            "eagle_aux_hidden_state_layer_ids"
        ]

    cf = read_draft_config(_edited(tmp_path / "a", tiny.draft, top))
    assert (cf.ids_found, cf.layer_ids, cf.nested_ids) == ("top-level", [1, 5, 9], None)
    assert cf.sglang_fc_aux() == (3, "SGLang's default of 3")
    none = read_draft_config(_edited(tmp_path / "b", tiny.draft, lambda c: c.pop("eagle_config")))
    assert (none.ids_found, none.layer_ids) == ("none", None)


def test_unknown_architecture_still_reads(tmp_path, tiny):
    cf = read_draft_config(
        _edited(tmp_path, tiny.draft, lambda c: c.update(architectures=["LlamaForCausalLMEagle"]))
    )
    assert cf.layout == "unknown" and not cf.is_eagle3 and cf.nested_ids == [1, 5, 9]


def _set(key, value):
    return lambda cfg: cfg.__setitem__(key, value)


@pytest.mark.parametrize(
    "edit, text",
    [
        (_set("hidden_size", "big"), "key 'hidden_size': expected an integer, found 'big'"),
        (_set("hidden_size", 192.0), "key 'hidden_size': expected an integer, found 192.0"),
        (
            _set("num_attention_heads", True),
            "key 'num_attention_heads': expected an integer, found True",
        ),
        (_set("intermediate_size", 0), "key 'intermediate_size': expected a number > 0, found 0"),
        (lambda c: c.pop("vocab_size"), "key 'vocab_size' is missing"),
        (_set("architectures", "LlamaForCausalLMEagle3"), "key 'architectures': expected a list"),
        (_set("draft_vocab_size", "96"), "key 'draft_vocab_size': expected an integer, found '96'"),
        (
            _set("num_aux_hidden_states", -3),
            "key 'num_aux_hidden_states': expected a number > 0, found -3",
        ),
        (
            _set("eagle_config", {"eagle_aux_hidden_state_layer_ids": [1, "5", 9]}),
            f"key '{NESTED}[1]': expected an integer, found '5'",
        ),
        (
            _set("eagle_config", {"use_aux_hidden_state": "yes"}),
            "key 'eagle_config.use_aux_hidden_state': expected true or false, found 'yes'",
        ),
        (
            lambda c: c.update(num_attention_heads=7, head_dim=None),
            "key 'num_attention_heads': hidden_size 192 is not divisible by 7 heads",
        ),
        (
            _set("num_key_value_heads", 3),
            "key 'num_key_value_heads': 4 attention heads are not a multiple of 3",
        ),
    ],
)
def test_bad_keys_name_the_file_and_the_key(tmp_path, tiny, edit, text):
    with pytest.raises(BadInput) as e:
        read_draft_config(_edited(tmp_path, tiny.draft, edit))
    msg = str(e.value)
    assert (
        msg.startswith(f"{tmp_path / 'draft' / 'config.json'}: ")
        and text in msg
        and "\n" not in msg
    )


def test_speculators_keys_are_named_under_transformer_layer_config(tmp_path):
    path = _speculators(tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["transformer_layer_config"]["hidden_size"] = "big"
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        BadInput, match="key 'transformer_layer_config.hidden_size': expected an integer"
    ):
        read_draft_config(path)
    cfg.pop("transformer_layer_config")
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(BadInput, match="key 'transformer_layer_config' is missing"):
        read_draft_config(path)


def test_doctor_and_serve_read_through_it(tmp_path, tiny):
    info = read_draft(tiny.draft)
    assert info.file == read_draft_config(tiny.draft) and info.path == tiny.draft
    assert info.declared(SGLANG_READER) == ([1, 5, 9], "sglang") and info.shapes["fc.weight"] == [
        192,
        576,
    ]
    spec = read_draft(_speculators(tmp_path))
    # layers.0.* named as midlayer.*
    assert spec.shapes["midlayer.self_attn.q_proj.weight"] == [16, 32]
    assert draft_layer_ids(tiny.draft, 12) == ([1, 5, 9], None)
    # no nested ids: SGLang's defaults, said aloud
    ids, warning = draft_layer_ids(tmp_path / "spec", 12)
    assert ids == [1, 5, 8] and "no eagle_config.eagle_aux_hidden_state_layer_ids" in warning
