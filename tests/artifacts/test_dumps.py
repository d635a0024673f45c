"""Dump readers: both formats read to the same Sample shape; damaged files give one-line errors
naming them."""

import pytest
import torch

from bisect_eagle.artifacts.dumps import DumpError, DumpReader, write_sample


def _write(tmp_path, fmt, n=3, s=6, h=4):
    g = torch.Generator().manual_seed(0)
    written = []
    for i in range(n):
        ids = torch.randint(0, 50, (s,), generator=g)
        mask = torch.ones(s, dtype=torch.long)
        aux = [torch.randn(s, h, generator=g) for _ in range(3)]
        final = torch.randn(s, h, generator=g)
        write_sample(
            tmp_path,
            i,
            fmt=fmt,
            input_ids=ids,
            loss_mask=mask,
            aux=aux,
            final=final,
            dtype=torch.float32,
        )
        written.append((ids, aux, final))
    return written


@pytest.mark.parametrize("fmt", ["speculators-legacy", "specforge"])
def test_round_trip(tmp_path, fmt):
    written = _write(tmp_path, fmt)
    reader = DumpReader(tmp_path)
    assert reader.fmt == fmt
    samples = list(reader)
    assert len(samples) == 3
    for sample, (ids, aux, final) in zip(samples, written, strict=True):
        assert torch.equal(sample.input_ids, ids)
        assert len(sample.states) == 4
        for got, want in zip(sample.states, [*aux, final], strict=True):
            torch.testing.assert_close(got, want)
        assert sample.final_normed is (fmt == "specforge")
        assert sample.mask_offset == (1 if fmt == "speculators-legacy" else 0)


def test_specforge_layout_on_disk(tmp_path):
    _write(tmp_path, "specforge", n=1)
    f = tmp_path / "rows_0-2000" / "data_0.ckpt"
    obj = torch.load(f, weights_only=True)
    assert obj["aux_hidden_state"].shape == (1, 6, 12) and obj["hidden_state"].shape == (1, 6, 4)


def test_samples_are_streamed_in_index_order(tmp_path):
    _write(tmp_path, "speculators-legacy", n=12)
    names = [s.source.name for s in DumpReader(tmp_path).head(12)]
    assert names == [f"data_{i}.pt" for i in range(12)]  # data_10 after data_9, not after data_1


def test_truncated_file_names_the_file(tmp_path):
    _write(tmp_path, "speculators-legacy")
    bad = tmp_path / "data_1.pt"
    bad.write_bytes(bad.read_bytes()[:100])
    with pytest.raises(DumpError) as e:
        list(DumpReader(tmp_path))
    msg = str(e.value)
    assert str(bad) in msg and "\n" not in msg


def test_skip_bad_counts(tmp_path):
    _write(tmp_path, "speculators-legacy", n=4)
    (tmp_path / "data_2.pt").write_bytes(b"garbage")
    reader = DumpReader(tmp_path, skip_bad=True)
    assert len(list(reader)) == 3
    assert len(reader.skipped) == 1 and "data_2.pt" in reader.skipped[0]


def test_missing_key_and_bad_lengths(tmp_path):
    torch.save({"input_ids": torch.arange(4), "loss_mask": torch.ones(4)}, tmp_path / "data_0.pt")
    with pytest.raises(DumpError, match="key 'hidden_states' is missing"):
        list(DumpReader(tmp_path))
    torch.save(
        {
            "input_ids": torch.arange(4),
            "loss_mask": torch.ones(4),
            "hidden_states": [torch.zeros(4, 2), torch.zeros(3, 2)],
        },
        tmp_path / "data_0.pt",
    )
    with pytest.raises(DumpError, match=r"tensor 'hidden_states\[1\]' has 3 rows, input_ids 4"):
        list(DumpReader(tmp_path))


def test_pickled_objects_are_refused(tmp_path):
    """weights_only loading: an arbitrary pickled object is not executed or accepted."""
    import pickle
    from pathlib import PurePosixPath

    (tmp_path / "data_0.pt").write_bytes(pickle.dumps({"x": PurePosixPath("/")}))
    with pytest.raises(DumpError, match="cannot read"):
        list(DumpReader(tmp_path))


def test_empty_or_mixed_directory(tmp_path):
    with pytest.raises(DumpError, match="no data_"):
        DumpReader(tmp_path)
    with pytest.raises(DumpError, match="not found"):
        DumpReader(tmp_path / "nope")
    _write(tmp_path, "speculators-legacy", n=1)
    _write(tmp_path, "specforge", n=1)
    with pytest.raises(DumpError, match="holds both"):
        DumpReader(tmp_path)


def test_non_finite_states_are_refused_or_skipped(tmp_path):
    _write(tmp_path, "speculators-legacy", n=3)
    obj = torch.load(tmp_path / "data_1.pt", weights_only=True)
    obj["hidden_states"][2][4, 1] = float("inf")
    torch.save(obj, tmp_path / "data_1.pt")
    with pytest.raises(
        DumpError, match=r"data_1.pt: tensor 'hidden_states\[2\]' holds 1 NaN or inf values"
    ):
        list(DumpReader(tmp_path))
    reader = DumpReader(tmp_path, skip_bad=True)
    assert [s.source.name for s in reader] == ["data_0.pt", "data_2.pt"]
    assert len(reader.skipped) == 1 and "data_1.pt" in reader.skipped[0]
    # per pass
    assert [s.source.name for s in reader.head(1)] == ["data_0.pt"] and reader.skipped == []


def test_token_ids_against_the_vocabulary(tmp_path):
    _write(tmp_path, "specforge", n=2)  # token ids < 50
    assert len(list(DumpReader(tmp_path, vocab_size=50))) == 2
    with pytest.raises(
        DumpError, match=r"'input_ids' holds token id 4\d, outside the target vocabulary \[0, 40\)"
    ):
        list(DumpReader(tmp_path, vocab_size=40))


def test_states_name_their_tensors_and_masks_may_be_float(tmp_path):
    torch.save(
        {
            "input_ids": torch.arange(4)[None],
            "loss_mask": torch.tensor([[0.0, 1.0, 1.0, 0.0]]),
            "hidden_states": [torch.zeros(1, 4, 2), torch.ones(4, 2)],
        },
        tmp_path / "data_0.pt",
    )
    (s,) = DumpReader(tmp_path)
    assert s.loss_mask.tolist() == [False, True, True, False] and s.width == 2
    assert [s.state_name(i) for i in range(2)] == ["hidden_states[0]", "hidden_states[1]"]


def test_later_samples_must_match_the_first(tmp_path):
    _write(tmp_path, "speculators-legacy", n=2)
    obj = torch.load(tmp_path / "data_1.pt", weights_only=True)
    obj["hidden_states"] = obj["hidden_states"][1:]
    torch.save(obj, tmp_path / "data_1.pt")
    with pytest.raises(
        DumpError,
        match="data_1.pt: key 'hidden_states' gives 3 states 4 wide; the first sample's gives 4 "
        "states 4 wide",
    ):
        list(DumpReader(tmp_path))
