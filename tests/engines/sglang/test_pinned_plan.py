"""The sglang plan of a pinned trial: SGLang's simulated-acceptance variables, what SGLang can pin,
refusals.

Planned for ``python -m sglang.launch_server`` with the project's own rules (``check=False``): the
variables are environment, which SGLang's parser never sees.
"""

from __future__ import annotations

import pytest
from sglang_helpers import plan, tiny_planner

from bisect_eagle.artifacts import scenarios
from bisect_eagle.engines.sglang.planner import Planner
from bisect_eagle.spec.schema import SglangServer
from bisect_eagle.tracking.redact import hidden


@pytest.fixture(scope="module")
def planner() -> Planner:
    return tiny_planner()


def test_a_pinned_plan_carries_sglangs_simulation_in_its_environment(planner):
    natural = plan(planner)
    pinned = plan(planner, pinned_acceptance=[1.0, 1.0, 0.0])
    assert (
        pinned.refusal is None and pinned.acceptance == "pinned" and natural.acceptance == "natural"
    )
    want = {
        "SGLANG_SIMULATE_ACC_LEN": "3",
        "SGLANG_SIMULATE_ACC_METHOD": "match-expected",
        "SGLANG_SIMULATE_ACC_TOKEN_MODE": "real-draft-token",
    }
    # what the launch adds to the server's environment, in clear
    assert pinned.private["env"] == want
    # shown as planned; the project's one redaction policy hides a value whose name has a word
    # ending in TOKEN
    shown = {**want, "SGLANG_SIMULATE_ACC_TOKEN_MODE": hidden("real-draft-token")}
    assert {k: pinned.env[k] for k in want} == shown
    assert {k: pinned.effective["env"][k] for k in want} == shown
    assert pinned.effective["pinned_acceptance"] == [1.0, 1.0, 0.0]
    assert (
        "pinned_acceptance" not in natural.effective
        and "SGLANG_SIMULATE_ACC_LEN" not in natural.effective["env"]
    )
    assert pinned.fingerprint != natural.fingerprint
    assert pinned.argv == natural.argv  # no flag: SGLang reads the simulation from its environment
    assert any("not the target's greedy text" in w for w in pinned.warnings)


def test_sglang_pins_one_mean_accept_length_not_a_profile(planner):
    shaped = plan(planner, pinned_acceptance=[0.9, 0.6, 0.3])
    flat = plan(planner, pinned_acceptance=[1.0, 0.8, 0.0])
    assert shaped.env["SGLANG_SIMULATE_ACC_LEN"] == flat.env["SGLANG_SIMULATE_ACC_LEN"] == "2.8"
    assert shaped.effective["pinned_acceptance"] == pytest.approx([1.0, 0.8, 0.0])
    assert shaped.fingerprint == flat.fingerprint  # SGLang runs them alike: one trial
    warning = next(w for w in shaped.warnings if "one mean accept length" in w)
    assert "accepts 1 or 2 drafts" in warning and "[0.9, 0.6, 0.3]" in warning
    assert not any("one mean accept length" in w for w in flat.warnings)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"topk": 4, "num_draft_tokens": 8}, "requires speculative_eagle_topk=1"),
        ({"num_steps": 3, "speculative_adaptive": True}, "adaptive controller"),
        ({"env": {"SGLANG_SIMULATE_ACC_LEN": "2"}}, "drop env.SGLANG_SIMULATE_ACC_LEN"),
    ],
)
def test_what_sglang_cannot_pin_is_refused_before_launch(planner, settings, message):
    p = plan(planner, **settings, pinned_acceptance=[1.0, 0.5, 0.0])
    assert p.refusal is not None and message in p.refusal


def test_the_stand_in_serves_the_same_plan(tmp_path):
    """The stand-in reads the same variables (bisect_eagle.engines.serve), so its plan carries them
    too."""
    import sys

    tiny = scenarios.get("tiny")
    stand_in = Planner(
        SglangServer(launch_command=[sys.executable, "-m", "bisect_eagle.engines.serve"]),
        tiny.target,
        tiny.draft,
        check=False,
    )
    p = plan(stand_in, pinned_acceptance=[1.0, 0.5, 0.0])
    assert p.env["SGLANG_SIMULATE_ACC_LEN"] == "2.5" and p.refusal is None
