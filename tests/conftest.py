"""Shared fixtures: the shipped tiny scenario."""

import pytest

from bisect_eagle import scenarios


@pytest.fixture(scope="session")
def tiny() -> scenarios.Scenario:
    return scenarios.get("tiny")
