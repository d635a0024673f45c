"""Shared fixtures: the shipped tiny scenario. Tests run torch on one thread (and so do the servers they start).

The tiny models are overhead-bound, and two OpenMP threads per process on a 2-core machine that is also
running a test server spin against each other (a trial can become 20-40x slower).
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from bisect_eagle import scenarios  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny() -> scenarios.Scenario:
    return scenarios.get("tiny")
