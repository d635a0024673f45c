"""Wiring rules: the grammar, resolution against a dump, and the fc width check."""

import pytest
import torch

from bisect_eagle.artifacts.wiring import EMB, WiringError, check_width, parse_rule


@pytest.mark.parametrize(
    ("text", "n", "expected"),
    [
        ("[:-1]", 4, [0, 1, 2]),
        ("[1:]", 4, [1, 2, 3]),
        ("[0:3]", 4, [0, 1, 2]),
        ("[::2]", 4, [0, 2]),
        ("[0,1,2]", 4, [0, 1, 2]),
        ("[ 0 , -2 ]", 4, [0, 2]),
        ("[emb,0,1]", 4, [EMB, 0, 1]),
        ("[2,0,1]", 4, [2, 0, 1]),
    ],
)
def test_select(text, n, expected):
    assert parse_rule(text).select(n) == expected


@pytest.mark.parametrize("text", ["[:-1", "1:", "[a,b]", "[0;1]", "[emb:]", "[::0]", ""])
def test_bad_grammar(text):
    with pytest.raises(WiringError):
        parse_rule(text)


def test_index_out_of_range():
    with pytest.raises(WiringError, match="index 5 is outside a dump of 4 states"):
        parse_rule("[0,5]").select(4)


def test_width_message():
    with pytest.raises(
        WiringError, match=r"fc expects 3 × 128 = 384 inputs; rule \[0,1\] gives 2 tensors = 256"
    ):
        check_width(parse_rule("[0,1]"), 4, hidden=128, fc_in=384)
    assert check_width(parse_rule("[:-1]"), 4, hidden=128, fc_in=384) == [0, 1, 2]


def test_apply_concatenates_in_rule_order_and_embeds():
    states = [torch.full((3, 2), float(i)) for i in range(4)]
    ids = torch.tensor([1, 0, 1])
    embed = torch.tensor([[10.0, 11.0], [20.0, 21.0]])
    out = parse_rule("[emb,2]").apply(states, ids, embed=embed)
    assert out.tolist() == [[20, 21, 2, 2], [10, 11, 2, 2], [20, 21, 2, 2]]
    with pytest.raises(WiringError, match="no target embedding"):
        parse_rule("[emb,2]").apply(states, ids, embed=None)
