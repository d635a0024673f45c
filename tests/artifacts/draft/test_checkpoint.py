"""Draft checkpoints: both layouts load to identical logits; loader errors name the file and key."""

import json

import pytest
import torch

from bisect_eagle.artifacts.draft import DraftLoadError, load_draft, save_draft
from bisect_eagle.errors import BadInput

from helpers import random_draft, write_fake_target


def _inputs(model, seed=3, t=7):
    g = torch.Generator().manual_seed(seed)
    c = model.config
    aux = torch.randn(2, t, c.num_aux * c.target_hidden_size, generator=g)
    tokens = torch.randint(0, c.vocab_size, (2, t + 2), generator=g)
    return aux, tokens


@torch.inference_mode()
def _logits(model, aux, tokens):
    return [model.logits(h) for h in model.ttt_forward(aux, tokens, steps=3)]


def test_both_layouts_give_identical_logits(tmp_path):
    model = random_draft()
    target = write_fake_target(tmp_path / "target", model.embed_tokens.weight.detach().clone())
    save_draft(model, tmp_path / "sf", layout="specforge", layer_ids=[1, 5, 9])
    save_draft(model, tmp_path / "spec", layout="speculators", layer_ids=[2, 6, 10])
    sf = load_draft(tmp_path / "sf", target=target)
    sp = load_draft(tmp_path / "spec")
    assert (sf.layout, sp.layout) == ("specforge", "speculators")
    # output-of ids [1,5,9] and input-to ids [2,6,10] are the same hidden states
    assert sf.aux_indices(12) == sp.aux_indices(12) == [2, 6, 10]
    aux, tokens = _inputs(model)
    expected = _logits(model, aux, tokens)
    for loaded in (sf, sp):
        for a, b in zip(_logits(loaded.model, aux, tokens), expected, strict=True):
            torch.testing.assert_close(a, b)
    assert torch.equal(sf.model.d2t, model.d2t) and torch.equal(sp.model.t2d, model.t2d)


def test_specforge_layout_on_disk(tmp_path):
    model = random_draft()
    save_draft(model, tmp_path / "sf", layout="specforge", layer_ids=[1, 5, 9])
    cfg = json.loads((tmp_path / "sf" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 5, 9]
    assert "eagle_aux_hidden_state_layer_ids" not in cfg  # nested only, as SGLang reads it
    from safetensors import safe_open

    with safe_open(str(tmp_path / "sf" / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "midlayer.self_attn.q_proj.weight" in keys and "embed_tokens.weight" not in keys


def test_double_norm_is_not_applied():
    """logits() norms once: an already-normed state gives other logits
    (docs/sglang-facts.md#final-state-norm)."""
    model = random_draft()
    h = torch.randn(1, 3, model.config.hidden_size) * 5
    once = model.logits(h)
    twice = model.lm_head(model.norm(model.norm(h)))
    assert torch.allclose(once, model.lm_head(model.norm(h)))
    assert not torch.allclose(once, twice)


def test_missing_embedding_needs_target(tmp_path):
    save_draft(random_draft(), tmp_path / "sf", layout="specforge", layer_ids=[1, 5, 9])
    with pytest.raises(DraftLoadError, match="no embed_tokens.weight"):
        load_draft(tmp_path / "sf")


def test_top_level_ids_in_specforge_layout_is_an_error(tmp_path):
    save_draft(random_draft(), tmp_path / "sf", layout="specforge", layer_ids=[1, 5, 9])
    cfg_path = tmp_path / "sf" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["eagle_aux_hidden_state_layer_ids"] = cfg.pop("eagle_config")[
        "eagle_aux_hidden_state_layer_ids"
    ]
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(
        DraftLoadError, match=r"eagle_config.eagle_aux_hidden_state_layer_ids' is missing"
    ):
        load_draft(tmp_path / "sf", target=tmp_path)


def test_fc_width_must_match_ids(tmp_path):
    model = random_draft()
    save_draft(model, tmp_path / "spec", layout="speculators", layer_ids=[2, 6, 10])
    cfg_path = tmp_path / "spec" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["eagle_aux_hidden_state_layer_ids"] = [2, 6]
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(
        BadInput,
        match=r"tensor .fc.weight.: the draft's fc takes 3 aux layers "
        r"\(48 inputs = 3 × target_hidden_size 16\); "
        r".*config.json's layer ids \[2, 6\] has 2",
    ):
        load_draft(tmp_path / "spec")


@pytest.mark.parametrize("key", ["norm_before_fc", "fc_norm"])
def test_unsupported_variants_are_refused(tmp_path, key):
    save_draft(
        random_draft(),
        tmp_path / "spec",
        layout="speculators",
        layer_ids=[2, 6, 10],
        extra_config={key: True},
    )
    with pytest.raises(
        DraftLoadError, match=f"'{key}' is true; this draft variant is not supported yet"
    ):
        load_draft(tmp_path / "spec")


def test_unknown_architecture_and_missing_config(tmp_path):
    with pytest.raises(BadInput, match="config.json: not found"):
        load_draft(tmp_path)
    save_draft(
        random_draft(),
        tmp_path / "sf",
        layout="specforge",
        layer_ids=[1, 5, 9],
        extra_config={"architectures": ["LlamaForCausalLM"]},
    )
    with pytest.raises(
        DraftLoadError, match=r"key 'architectures' is \['LlamaForCausalLM'\]; expected one of"
    ):
        load_draft(tmp_path / "sf")


def test_norm_before_residual_changes_the_output(tmp_path):
    model = random_draft()
    save_draft(model, tmp_path / "a", layout="speculators", layer_ids=[2, 6, 10])
    save_draft(
        model,
        tmp_path / "b",
        layout="speculators",
        layer_ids=[2, 6, 10],
        extra_config={"norm_before_residual": True},
    )
    a, b = load_draft(tmp_path / "a"), load_draft(tmp_path / "b")
    assert b.config.norm_before_residual and not a.config.norm_before_residual
    aux, tokens = _inputs(model)
    assert not torch.allclose(_logits(a.model, aux, tokens)[0], _logits(b.model, aux, tokens)[0])


def test_shipped_tiny_draft_loads(tiny):
    loaded = load_draft(tiny.draft, target=tiny.target)
    assert loaded.layout == "specforge"
    assert loaded.aux_indices(12) == tiny.meta["aux_layer_ids"]["hidden_states"]


def test_expected_shapes_are_the_modules_own(tiny):
    from bisect_eagle.artifacts.draft import expected_shapes, read_draft_config

    c = read_draft_config(tiny.draft).draft_config(3)
    from bisect_eagle.artifacts.draft import Eagle3Draft

    assert expected_shapes(c) == {k: tuple(v.shape) for k, v in Eagle3Draft(c).state_dict().items()}


def test_inspect_reads_headers_only_and_load_checks_the_values(tmp_path, tiny):
    """NaN weights pass the header check (no values read); loading names the file and the tensor."""
    import shutil

    from safetensors.torch import load_file, save_file

    from bisect_eagle.artifacts.draft import inspect_draft

    shutil.copytree(tiny.draft, tmp_path / "d")
    weights = tmp_path / "d" / "model.safetensors"
    state = load_file(str(weights))
    state["norm.weight"][3] = float("nan")
    save_file(state, str(weights))
    check = inspect_draft(tmp_path / "d")
    assert (check.layer_ids, check.id_convention, check.config.num_aux) == ([1, 5, 9], "sglang", 3)
    assert check.tensors["fc.weight"].shape == (192, 576) and check.tensors["t2d"].dtype == "BOOL"
    with pytest.raises(
        DraftLoadError, match=f"{weights}: tensor 'norm.weight' holds NaN or inf values"
    ):
        load_draft(tmp_path / "d", target=tiny.target)


def test_speculators_tensor_errors_use_the_stored_names(tmp_path):
    from safetensors.torch import load_file, save_file

    save_draft(random_draft(), tmp_path / "spec", layout="speculators", layer_ids=[2, 6, 10])
    path = tmp_path / "spec" / "model.safetensors"
    state = load_file(str(path))
    state["layers.0.self_attn.q_proj.weight"] = torch.zeros(3, 32)
    save_file(state, str(path))
    with pytest.raises(
        DraftLoadError, match=r"tensor 'layers.0.self_attn.q_proj.weight' has shape \[3, 32\]"
    ):
        load_draft(tmp_path / "spec")


def test_embedding_from_a_target_of_another_vocabulary_is_refused(tmp_path):
    model = random_draft()
    save_draft(model, tmp_path / "sf", layout="specforge", layer_ids=[1, 5, 9])
    target = write_fake_target(tmp_path / "target", torch.randn(40, 16))
    with pytest.raises(
        DraftLoadError,
        match=r"tensor 'model.embed_tokens.weight' has shape \[40, 16\]; the draft's",
    ):
        load_draft(tmp_path / "sf", target=target)
