"""The oracle script's own judgement of this host (no SGLang needed): resolution runs only where the
launch's accelerators are present; elsewhere the plan is not resolved here, never refused for
missing hardware."""

from __future__ import annotations

import argparse

import pytest

from bisect_eagle.engines.sglang import oracle_script
from bisect_eagle.engines.sglang.oracle_script import NOT_RESOLVED_HERE, missing_devices


def ns(**kw) -> argparse.Namespace:
    return argparse.Namespace(**{"device": None, "tp_size": 1, "pp_size": 1, "nnodes": 1, **kw})


def test_a_cpu_launch_is_resolved_anywhere():
    assert missing_devices(ns(device="cpu", tp_size=8)) is None


def test_a_node_launch_on_a_host_without_its_gpus_is_not_resolved_here(monkeypatch):
    monkeypatch.setattr(oracle_script, "device_count", lambda kind: 0)
    why = missing_devices(ns(tp_size=8))
    assert why.startswith(NOT_RESOLVED_HERE) and "needs 8 accelerator device(s) per node" in why
    assert "this host has 0" in why
    assert "needs 4 cuda device(s)" in missing_devices(
        ns(device="cuda", tp_size=4, pp_size=2, nnodes=2)
    )


@pytest.mark.parametrize(
    "have,tp,pp,nnodes,resolved",
    [
        (8, 8, 1, 1, True),
        (4, 8, 1, 1, False),
        (8, 8, 2, 2, True),
        (1, 1, 1, 1, True),
        (7, 4, 2, 1, False),
    ],
)
def test_resolution_needs_tp_times_pp_devices_per_node(monkeypatch, have, tp, pp, nnodes, resolved):
    monkeypatch.setattr(oracle_script, "device_count", lambda kind: have if kind == "cuda" else 0)
    why = missing_devices(ns(device="cuda", tp_size=tp, pp_size=pp, nnodes=nnodes))
    assert (why is None) == resolved, why


def test_auto_device_takes_the_first_accelerator_kind_present(monkeypatch):
    monkeypatch.setattr(oracle_script, "device_count", lambda kind: 8 if kind == "xpu" else 0)
    assert missing_devices(ns(tp_size=8)) is None
    assert "cuda device(s)" in missing_devices(ns(device="cuda", tp_size=8))


def test_this_cpu_torch_has_no_cuda_device():
    assert (
        oracle_script.device_count("cuda") == 0
        and oracle_script.device_count("no_such_backend") == 0
    )
