"""Every layer-id convention converts to and from the canonical hidden_states index,
table-driven."""

import pytest

from bisect_eagle.artifacts import layers
from bisect_eagle.artifacts.layers import LayerIdError

# (convention, depth, id, canonical index)
CASES = [
    ("sglang", 61, -1, 0),
    ("sglang", 61, 2, 3),
    ("sglang", 61, 30, 31),
    ("sglang", 61, 58, 59),
    ("sglang", 61, 60, 61),
    ("specforge", 61, 1, 2),
    ("specforge", 61, 29, 30),
    ("specforge", 61, 57, 58),
    ("vllm", 61, 0, 0),
    ("vllm", 61, 2, 2),
    ("vllm", 61, 30, 30),
    ("vllm", 61, 61, 61),
    ("speculators", 61, 58, 58),
    ("eagle", 61, 2, 2),
    ("eagle", 61, 58, 58),
    ("speculators-legacy", 61, 2, 3),
    ("speculators-legacy", 61, 60, 61),
    ("sglang", 32, -1, 0),
    ("sglang", 32, 1, 2),
    ("sglang", 32, 15, 16),
    ("sglang", 32, 28, 29),
    ("specforge", 32, 1, 2),
    ("specforge", 32, 15, 16),
    ("specforge", 32, 28, 29),
    ("vllm", 32, 2, 2),
    ("vllm", 32, 16, 16),
    ("vllm", 32, 29, 29),
    ("vllm", 32, 32, 32),
    ("eagle", 32, 29, 29),
    ("speculators-legacy", 32, 31, 32),
    ("speculators-legacy", 32, 16, 17),
]


@pytest.mark.parametrize(("conv", "n", "layer_id", "index"), CASES)
def test_round_trip(conv, n, layer_id, index):
    assert layers.to_canonical(layer_id, conv, num_layers=n) == index
    assert layers.from_canonical(index, conv, num_layers=n) == layer_id


# (convention, depth, default canonical indices)
DEFAULTS = [
    ("sglang", 61, [2, 30, 58]),
    ("specforge", 61, [2, 30, 58]),
    ("vllm", 61, [2, 30, 58]),
    ("eagle", 61, [2, 30, 58]),
    ("speculators", 61, [2, 30, 58, 61]),
    ("speculators-legacy", 61, [3, 31, 59, 61]),
    ("sglang", 32, [2, 16, 29]),
    ("specforge", 32, [2, 16, 29]),
    ("vllm", 32, [2, 16, 29]),
    ("speculators", 32, [2, 16, 29, 32]),
    ("speculators-legacy", 32, [3, 17, 30, 32]),
]


@pytest.mark.parametrize(("conv", "n", "expected"), DEFAULTS)
def test_defaults(conv, n, expected):
    assert layers.default_canonical(conv, n) == expected


def test_seed_wirings_on_61_layers():
    """The incident's [2,30,58] (output-of) and the broken [-1,2,30] "fix" are different hidden
    states."""
    assert layers.ids_to_canonical([2, 30, 58], "sglang", num_layers=61) == [3, 31, 59]
    assert layers.ids_to_canonical([-1, 2, 30], "sglang", num_layers=61) == [0, 3, 31]
    assert layers.canonical_to_ids([3, 31, 59], "vllm", num_layers=61) == [3, 31, 59]


def test_deepseek_list_rule():
    # first id 1 -> output-of (+1); otherwise input-to (no shift)
    assert layers.ids_to_canonical([1, 30, 58], "sglang-deepseek", num_layers=61) == [2, 31, 59]
    assert layers.ids_to_canonical([2, 30, 58], "sglang-deepseek", num_layers=61) == [2, 30, 58]
    for idx in ([2, 31, 59], [2, 30, 58], [3, 31, 59]):
        ids = layers.canonical_to_ids(idx, "sglang-deepseek", num_layers=61)
        assert layers.ids_to_canonical(ids, "sglang-deepseek", num_layers=61) == idx
    with pytest.raises(LayerIdError, match="first id of 1"):
        layers.canonical_to_ids([1, 30], "sglang-deepseek", num_layers=61)


def test_gptoss_list_rule():
    assert layers.ids_to_canonical([24, 30, 36], "sglang-gptoss", num_layers=36) == [24, 30, 36]
    assert layers.ids_to_canonical([24, 30, 35], "sglang-gptoss", num_layers=36) == [25, 31, 36]
    assert layers.canonical_to_ids([25, 31, 36], "sglang-gptoss", num_layers=36) == [24, 30, 35]


@pytest.mark.parametrize(
    ("conv", "n", "bad"),
    [
        ("sglang", 61, -2),
        ("sglang", 61, 61),
        ("vllm", 32, -1),
        ("vllm", 32, 33),
        ("speculators-legacy", 32, 32),
    ],
)
def test_out_of_range(conv, n, bad):
    with pytest.raises(LayerIdError, match=f"{conv} layer id {bad} is outside"):
        layers.to_canonical(bad, conv, num_layers=n)


def test_index_without_id_and_unknown_convention():
    with pytest.raises(LayerIdError, match="has no speculators-legacy layer id"):
        layers.from_canonical(0, "speculators-legacy", num_layers=32)
    with pytest.raises(LayerIdError, match="unknown layer-id convention 'sgl'"):
        layers.to_canonical(1, "sgl", num_layers=32)


def test_describe():
    assert layers.describe(0, 12) == "embedding"
    assert layers.describe(6, 12) == "layer 5 output"
    assert layers.describe(12, 12) == "layer 11 output (final, pre-norm)"


def test_the_fc_width_rule_is_one_count_and_one_line():
    config = {"where": "d/config.json", "said_by": "num_aux_hidden_states"}
    assert layers.fc_width_refusal([1, 5, 9], width=3, **config) is None
    assert layers.fc_width_refusal([1, 5], width=3, **config) == (
        "d/config.json: the draft's fc takes 3 aux layers (num_aux_hidden_states); "
        "eagle_aux_hidden_state_layer_ids [1, 5] has 2"
    )
    named = layers.fc_width_refusal(
        (2, 6, 10, 12), width=3, where="w", said_by="s", named="layer_ids"
    )
    assert named == "w: the draft's fc takes 3 aux layers (s); layer_ids [2, 6, 10, 12] has 4"
