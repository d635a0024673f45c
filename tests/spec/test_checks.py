"""Pre-flight checks of the data inputs (validate_data), device names (check_device) and target
directories:
what they accept, what they refuse with one line, and that they write nothing."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from bisect_eagle.artifacts.devices import check_device
from bisect_eagle.artifacts.target import (
    TargetHead,
    check_target_weights,
    load_target,
    read_target_info,
)
from bisect_eagle.errors import BadInput
from bisect_eagle.spec.checks import validate_data

from helpers import random_draft, write_fake_target


def test_the_tiny_scenario_passes_and_reports_what_it_read(tiny, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    facts = validate_data(target=tiny.target, draft=tiny.draft, dump=tiny.dump)
    assert (facts.target.num_hidden_layers, facts.target.hidden_size, facts.target.vocab_size) == (
        12,
        192,
        257,
    )
    assert facts.draft.layer_ids == [1, 5, 9] and facts.draft.config_file.layout == "specforge"
    assert facts.dump_format == "speculators-legacy" and len(facts.first_sample.states) == 4
    assert list(tmp_path.iterdir()) == []


def test_each_input_is_optional():
    facts = validate_data()
    assert (facts.target, facts.draft, facts.dump_format, facts.first_sample) == (
        None,
        None,
        None,
        None,
    )


def test_draft_against_target(tmp_path):
    from bisect_eagle.artifacts.draft import save_draft

    model = random_draft()  # vocab 32, hidden 16
    save_draft(model, tmp_path / "sf", layout="specforge", layer_ids=[1, 5, 9])
    ok = write_fake_target(tmp_path / "ok", model.embed_tokens.weight.detach().clone())
    assert validate_data(target=ok, draft=tmp_path / "sf").draft.config.vocab_size == 32
    other = write_fake_target(tmp_path / "other", torch.randn(40, 16))
    with pytest.raises(
        BadInput,
        match=rf"{tmp_path / 'sf' / 'config.json'}: key 'vocab_size' is 32; the target's "
        r"vocab_size .* is 40",
    ):
        validate_data(target=other, draft=tmp_path / "sf")
    wide = write_fake_target(tmp_path / "wide", torch.randn(32, 24))
    with pytest.raises(
        BadInput,
        match="key 'target_hidden_size' gives a target hidden size of 16; the target's hidden_size",
    ):
        validate_data(target=wide, draft=tmp_path / "sf")


def test_skip_bad_passes_over_a_bad_first_sample(tiny, tmp_path):
    dump = tmp_path / "dump"
    dump.mkdir()
    for i in range(2):
        shutil.copy(tiny.dump / f"data_{i}.pt", dump / f"data_{i}.pt")
    (dump / "data_0.pt").write_bytes(b"junk")
    with pytest.raises(BadInput, match="data_0.pt: cannot read"):
        validate_data(dump=dump)
    assert validate_data(dump=dump, skip_bad=True).first_sample.source == dump / "data_1.pt"
    (dump / "data_1.pt").write_bytes(b"junk")
    with pytest.raises(
        BadInput, match=r"no usable samples \(2 bad files skipped, the first: .*data_0.pt"
    ):
        validate_data(dump=dump, skip_bad=True)


def test_check_device():
    check_device("cpu", "spec.yaml: engine.settings.device")
    for bad, text in [
        ("banana", "is not a torch device"),
        ("meta", "is not supported"),
        ("cuda:x", "is not a torch device"),
        (0, "is not a device name"),
    ]:
        with pytest.raises(
            BadInput, match=f"^spec.yaml: engine.settings.device: device {bad!r} {text}"
        ):
            check_device(bad, "spec.yaml: engine.settings.device")  # type: ignore[arg-type]
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(BadInput, match="^--device: device 'cuda:99' but "):
        check_device("cuda:99", "--device")
    if count == 0:
        with pytest.raises(BadInput, match="CUDA is not available on this machine"):
            check_device("cuda", "--device")
    else:
        check_device("cuda:0", "--device")


def test_sharded_target_is_read_through_its_index(tiny, tmp_path):
    out = tmp_path / "t"
    out.mkdir()
    shutil.copy(tiny.target / "config.json", out / "config.json")
    state = load_file(str(tiny.target / "model.safetensors"))
    names = sorted(state)
    half = len(names) // 2
    shards = {"a.safetensors": names[:half], "b.safetensors": names[half:]}
    for fname, keys in shards.items():
        save_file({k: state[k] for k in keys}, str(out / fname))
    index = {"weight_map": {k: fname for fname, keys in shards.items() for k in keys}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    assert check_target_weights(out) == read_target_info(tiny.target)
    torch.testing.assert_close(TargetHead.load(out).lm_head, TargetHead.load(tiny.target).lm_head)
    (out / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(BadInput, match="model.safetensors.index.json: key 'weight_map' is missing"):
        check_target_weights(out)


def test_load_target_never_unpickles(tiny, tmp_path):
    out = tmp_path / "t"
    out.mkdir()
    shutil.copy(tiny.target / "config.json", out / "config.json")
    torch.save({"lm_head.weight": torch.zeros(2, 2)}, out / "pytorch_model.bin")
    with pytest.raises(
        BadInput, match=r"pytorch_model.bin: pickle weights, which bisect-eagle never loads"
    ):
        load_target(out)
