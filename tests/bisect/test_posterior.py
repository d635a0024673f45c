"""Each candidate set's probability: its prior (doctor's findings, the plans' masks) updated by the
probes."""

from __future__ import annotations

import pytest

from bisect_eagle.bisect.posterior import (
    BASE_PRIOR,
    FLAGGED_PRIOR,
    change_priors,
    posterior_bad,
    prior_bad,
    set_probability,
)


def test_a_flagged_change_has_more_prior_mass():
    priors = change_priors(["wiring", "nccl"], flagged=["wiring"])
    assert priors == {"wiring": FLAGGED_PRIOR, "nccl": BASE_PRIOR}
    assert prior_bad(["wiring"], priors) > prior_bad(["nccl"], priors)
    assert prior_bad(["wiring", "nccl"], priors) == pytest.approx(
        1 - (1 - FLAGGED_PRIOR) * (1 - BASE_PRIOR)
    )


def test_the_evidence_moves_the_prior_and_a_missing_verdict_leaves_it():
    assert posterior_bad(0.2, None) == 0.2
    assert posterior_bad(0.2, 0.5) == pytest.approx(0.2)  # samples that cannot tell
    assert posterior_bad(0.2, 0.999) > 0.99 and posterior_bad(0.6, 0.001) < 0.01
    # the same samples, a flagged change: likelier
    assert posterior_bad(0.6, 0.9) > posterior_bad(0.2, 0.9)


def test_a_sets_probability_needs_it_bad_and_each_part_good():
    priors = change_priors(["a", "b", "c"], flagged=[])
    below = {frozenset({"a", "b"}): 0.999, frozenset({"a"}): 0.001, frozenset({"b"}): 0.002}
    assert set_probability(["a", "b"], below, priors) > 0.98
    below[frozenset({"a"})] = 0.99  # a alone likely breaks it too: {a, b} is likely not minimal
    assert set_probability(["a", "b"], below, priors) < 0.2
    # never judged: its prior
    assert set_probability(["c"], below, priors) == pytest.approx(BASE_PRIOR)
