"""Live settings' pinned acceptance: the profile's rules, profiles from an accept length or a
measured curve."""

import math

import pytest
from pydantic import ValidationError

from bisect_eagle.errors import BadInput
from bisect_eagle.spec.settings import (
    LiveSettings,
    parse_settings,
    profile_for_accept_length,
    unconditional_rates,
)


@pytest.mark.parametrize(
    ("length", "steps", "profile"),
    [
        (3.0, 3, [1.0, 1.0, 0.0]),
        (2.5, 3, [1.0, 0.5, 0.0]),
        (3.3, 3, [1.0, 1.0, 0.3]),
        (1.0, 2, [0.0, 0.0]),
        (4.0, 3, [1.0, 1.0, 1.0]),
        (1.75, 1, [0.75]),
    ],
)
def test_profile_for_accept_length_is_the_minimum_variance_schedule(length, steps, profile):
    got = profile_for_accept_length(length, steps)
    assert got == pytest.approx(profile)
    assert 1 + sum(got) == pytest.approx(length)
    LiveSettings(num_steps=steps, pinned_acceptance=got)  # a valid profile


@pytest.mark.parametrize("length", [4.01, 0.9, math.inf, math.nan])
def test_an_accept_length_out_of_reach_is_refused(length):
    with pytest.raises(BadInput, match=r"\[1, 4\]"):
        profile_for_accept_length(length, 3)


def test_unconditional_rates_are_the_running_product_of_a_measured_curve():
    assert unconditional_rates([0.9, 0.5, 0.5]) == pytest.approx([0.9, 0.45, 0.225])
    assert unconditional_rates([0.8, math.nan, 0.7]) == [0.8, 0.0, 0.0]  # a position never reached
    LiveSettings(num_steps=3, pinned_acceptance=unconditional_rates([1.0, 0.93, 0.97]))


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([0.5, 0.8, 0.1], "non-increasing"),
        ([1.2, 0.5, 0.0], "in \\[0, 1\\]"),
        ([1.0, 0.5], "num_steps is 3"),
        (3.0, "an accept length"),
        ([True, 0.5, 0.0], "boolean"),
    ],
)
def test_bad_profiles_name_the_key_and_the_fix(value, message):
    with pytest.raises(BadInput, match=message) as e:
        parse_settings({"pinned_acceptance": value}, "spec.yaml: engine.settings")
    assert "pinned_acceptance" in str(e.value) or "accept" in str(e.value)


def test_the_baseline_pins_nothing():
    with pytest.raises(ValidationError, match="the baseline"):
        LiveSettings(speculative_algorithm="none", pinned_acceptance=[1.0, 0.5, 0.0])
    assert not LiveSettings().pinned and LiveSettings(pinned_acceptance=[1, 1, 0]).pinned
