"""Shared fixtures: the shipped tiny scenario. Tests run torch on one thread (and so do the servers
they start).

The tiny models are overhead-bound, and two OpenMP threads per process on a 2-core machine that is
also running a test server spin against each other (a trial can become 20-40x slower).
"""

import os
import subprocess

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from bisect_eagle.artifacts import scenarios  # noqa: E402

from helpers import too_slow_line  # noqa: E402

pytest_plugins = ("pytester",)

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny() -> scenarios.Scenario:
    return scenarios.get("tiny")


SYSTEM = "BISECT_EAGLE_SYSTEM_TESTS"


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers",
        "system: a heavy end-to-end test (minutes: whole studies, several servers, PostgreSQL, "
        f"Chromium); runs when {SYSTEM}=1, as CI's own step",
    )


def pytest_collection_modifyitems(config, items) -> None:
    """System tests run in CI's own step (``BISECT_EAGLE_SYSTEM_TESTS=1 pytest -m system``), not in
    every run."""
    if os.environ.get(SYSTEM) == "1":
        return
    skip = pytest.mark.skip(
        reason=f"heavy system test: set {SYSTEM}=1 (CI runs them as their own step)"
    )
    for item in items:
        if "system" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A subprocess a test waited on past its timeout fails saying the machine was too slow, with
    its load (:func:`helpers.too_slow_line`), not with the traceback of the wait."""
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is not None and call.excinfo.errisinstance(subprocess.TimeoutExpired):
        report.longrepr = too_slow_line(call.excinfo.value)
