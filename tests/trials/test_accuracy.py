"""Standalone accuracy: alignment on a hand-computed example, and the tiny scenario's wiring
ranking."""

import pytest
import torch
from torch import nn

from bisect_eagle.artifacts.draft import DraftConfig, Eagle3Draft, LoadedDraft
from bisect_eagle.artifacts.dumps import DumpReader, Sample, write_sample
from bisect_eagle.artifacts.target import TargetHead
from bisect_eagle.artifacts.wiring import parse_rule
from bisect_eagle.errors import BadInput
from bisect_eagle.trials.accuracy import batches, evaluate

H = V = 8


def _head() -> TargetHead:
    eye = torch.eye(V)
    return TargetHead(embed=eye, norm_weight=torch.ones(H), lm_head=eye, eps=1e-6, num_layers=4)


def _onehot(ids, scale=5.0):
    return torch.nn.functional.one_hot(torch.tensor(ids), V).float() * scale


def _echo_draft(draft_vocab: int = V) -> LoadedDraft:
    """A draft whose step-0 pick is argmax of aux state 0 (fc selects it; attention and MLP add
    zero).

    Its vocabulary is target ids ``0 .. draft_vocab - 1``.
    """
    c = DraftConfig(
        hidden_size=H,
        intermediate_size=4,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=4,
        vocab_size=V,
        draft_vocab_size=draft_vocab,
        target_hidden_size=H,
        num_aux=3,
    )
    m = Eagle3Draft(c)
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
        m.fc.weight[:, :H] = torch.eye(H)
        m.lm_head.weight.copy_(torch.eye(V)[:draft_vocab])
        for norm in m.modules():
            if hasattr(norm, "eps"):
                norm.weight.fill_(1.0)
        m.embed_tokens.weight.copy_(torch.eye(V))
    assert isinstance(m.midlayer.mlp.down_proj, nn.Linear)
    return LoadedDraft(m.eval(), c, "speculators", [1, 2, 3], "vllm", path=None)  # type: ignore[arg-type]


# input ids x, the target's greedy tokens T (from the final state), and the draft's step-0 picks p
X = [3, 1, 4, 1, 5, 2]
T = [1, 4, 1, 5, 2, 6]
P = [4, 0, 5, 2, 7]  # row t is scored against T[t+1] = [4, 1, 5, 2, 6] -> hits at rows 0, 2, 3
MASK = [1, 1, 1, 1, 0, 1]


def _sample(offset: int) -> Sample:
    aux0 = _onehot([*P, 0])
    return Sample(
        torch.tensor(X),
        torch.tensor(MASK).bool(),
        [aux0, aux0 * 0, aux0 * 0, _onehot(T)],
        final_normed=False,
        mask_offset=offset,
        source=None,
    )  # type: ignore[arg-type]


def test_rows_alignment_by_hand():
    (b,) = batches(
        [_sample(1)],
        parse_rule("[:-1]"),
        head=_head(),
        draft_vocab=torch.arange(V),
        steps=2,
        max_rows=100,
    )
    assert b.aux.shape == (1, 5, 3 * H)
    # row t reads x[t+1]; step 1 reads x[t+2]; padded
    assert b.tokens[0].tolist() == [1, 4, 1, 5, 2, 0]
    assert b.full_labels[0].tolist() == [4, 1, 5, 2, 6, 0]  # row t is scored against T[t+1]
    # loss_mask[t+1] (speculators)
    assert b.valid[0].tolist() == [True, True, True, False, True, False]
    (sf,) = batches(
        [_sample(0)],
        parse_rule("[:-1]"),
        head=_head(),
        draft_vocab=torch.arange(V),
        steps=2,
        max_rows=100,
    )
    # loss_mask[t] (SpecForge)
    assert sf.valid[0].tolist() == [True, True, True, True, False, False]


def test_batches_pad_and_split_by_rows():
    short = _sample(1)
    short.input_ids, short.loss_mask = short.input_ids[:4], short.loss_mask[:4]
    short.states = [x[:4] for x in short.states]
    two = list(
        batches(
            [_sample(1), short],
            parse_rule("[:-1]"),
            head=_head(),
            draft_vocab=torch.arange(V),
            steps=1,
            max_rows=7,
        )
    )
    assert [b.aux.shape[:2] for b in two] == [(1, 5), (1, 3)]  # 5 + 3 rows > 7: two batches
    (one,) = batches(
        [_sample(1), short],
        parse_rule("[:-1]"),
        head=_head(),
        draft_vocab=torch.arange(V),
        steps=1,
        max_rows=8,
    )
    assert one.aux.shape[:2] == (2, 5) and one.valid[1].tolist() == [True, True, True, False, False]


def test_accuracy_by_hand(tmp_path):
    s = _sample(1)
    _write(tmp_path, s)
    result = evaluate(
        _echo_draft(), DumpReader(tmp_path), head=_head(), rule=parse_rule("[:-1]"), steps=1
    )
    # valid rows 0,1,2,4 (row 3 masked by loss_mask[4] = 0); hits at rows 0 and 2 -> 2 / 4
    assert result.tokens == 4 and result.samples == 1
    assert result.accuracy["full_vocab"] == pytest.approx(0.5)
    assert result.accuracy["draft_vocab"] == pytest.approx(0.5)
    assert result.simulated_accept_length == pytest.approx(0.5)


def test_full_vocab_counts_out_of_vocab_targets_as_misses(tmp_path):
    """Draft vocabulary = target ids 0..6. At position 5 the target prefers 7 (out of the draft
    vocabulary), then 6; the draft picks 6: a hit within the draft vocabulary, a miss in the full
    vocabulary."""
    s = _sample(1)
    s.states[0][4] = _onehot([6])[0]
    s.states[-1][5] = _onehot([7])[0] + _onehot([6], 3.0)[0]
    _write(tmp_path, s)
    result = evaluate(
        _echo_draft(draft_vocab=7),
        DumpReader(tmp_path),
        head=_head(),
        rule=parse_rule("[:-1]"),
        steps=1,
    )
    assert result.accuracy["full_vocab"] == pytest.approx(2 / 4)
    assert result.accuracy["draft_vocab"] == pytest.approx(3 / 4)


def test_wrong_width_rule_is_refused(tiny):
    from bisect_eagle.artifacts.draft import load_draft
    from bisect_eagle.artifacts.wiring import WiringError

    loaded = load_draft(tiny.draft, target=tiny.target)
    with pytest.raises(
        WiringError, match=r"fc expects 3 × 192 = 576 inputs; rule \[0,1\] gives 2 tensors = 384"
    ):
        evaluate(
            loaded,
            DumpReader(tiny.dump),
            head=TargetHead.load(tiny.target),
            rule=parse_rule("[0,1]"),
        )


def test_tiny_scenario_true_wiring_wins(tiny):
    """The incident's shape: the trained wiring matches training accuracy; [1:] and [emb,0,1] lose
    >= 5 points."""
    from bisect_eagle.artifacts.draft import load_draft

    loaded = load_draft(tiny.draft, target=tiny.target)
    head = TargetHead.load(tiny.target)
    acc = {
        rule: evaluate(
            loaded, DumpReader(tiny.dump), head=head, rule=parse_rule(rule), steps=1
        ).accuracy["full_vocab"]
        for rule in ("[:-1]", "[1:]", "[emb,0,1]")
    }
    training = tiny.meta["training_accuracy"]["full_vocab"]
    assert abs(acc["[:-1]"] - training) <= 0.02
    assert acc["[:-1]"] - acc["[1:]"] >= 0.05
    assert acc["[:-1]"] - acc["[emb,0,1]"] >= 0.05


def _write(tmp_path, s: Sample) -> None:
    write_sample(
        tmp_path,
        0,
        fmt="speculators-legacy",
        input_ids=s.input_ids,
        loss_mask=s.loss_mask.long(),
        aux=s.states[:-1],
        final=s.states[-1],
        dtype=torch.float32,
    )


def test_nothing_scored_is_an_error_not_an_accuracy(tmp_path):
    s = _sample(1)
    s.loss_mask = torch.zeros_like(s.loss_mask)
    _write(tmp_path, s)
    with pytest.raises(BadInput, match="no token is scored in the 1 samples read"):
        evaluate(
            _echo_draft(), DumpReader(tmp_path), head=_head(), rule=parse_rule("[:-1]"), steps=1
        )


def test_token_ids_and_width_are_checked_against_the_target(tmp_path):
    """Even through a reader made without the vocabulary (the search gate's), as the samples are
    scored."""
    s = _sample(1)
    s.input_ids = s.input_ids.clone()
    s.input_ids[2] = V + 3
    _write(tmp_path, s)
    with pytest.raises(
        BadInput,
        match=rf"data_0.pt: tensor 'input_ids' holds token id {V + 3}, outside the target "
        rf"vocabulary \[0, {V}\)",
    ):
        evaluate(
            _echo_draft(), DumpReader(tmp_path), head=_head(), rule=parse_rule("[:-1]"), steps=1
        )
    wide = TargetHead(
        embed=torch.eye(V, 2 * H),
        norm_weight=torch.ones(2 * H),
        lm_head=torch.eye(V, 2 * H),
        eps=1e-6,
        num_layers=4,
    )
    _write(tmp_path, _sample(1))
    with pytest.raises(
        BadInput, match=r"tensor 'hidden_states\[0\]' is 8 wide; the target's hidden_size is 16"
    ):
        evaluate(_echo_draft(), DumpReader(tmp_path), head=wide, rule=parse_rule("[:-1]"), steps=1)


def test_bad_counts_are_refused(tmp_path):
    _write(tmp_path, _sample(1))
    for kw, text in [
        ({"steps": 0}, "steps must be >= 1"),
        ({"samples": -2}, "samples must be >= 1"),
    ]:
        with pytest.raises(BadInput, match=text):
            evaluate(
                _echo_draft(), DumpReader(tmp_path), head=_head(), rule=parse_rule("[:-1]"), **kw
            )
