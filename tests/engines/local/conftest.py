"""The local engine's tests: one intra-op thread for every module here."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread: tiny matmuls on a shared 2-core machine slow down tenfold with more."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
