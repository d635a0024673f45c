"""The server-engine planner contract: both planners derive from one documented base, plan with
one signature, and say the same way what judged a plan when the server's oracle cannot run."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from bisect_eagle.artifacts import scenarios
from bisect_eagle.engines.planner import BasePlanner, read_json, server_limits
from bisect_eagle.engines.sglang.planner import Planner as SglangPlanner
from bisect_eagle.engines.vllm.planner import Planner as VllmPlanner
from bisect_eagle.errors import BadInput
from bisect_eagle.spec.schema import SglangServer, VllmServer
from bisect_eagle.spec.settings import LiveSettings

PLANNERS = [(SglangPlanner, SglangServer), (VllmPlanner, VllmServer)]


def test_both_planners_derive_from_the_base_and_implement_its_whole_contract():
    for planner, _ in PLANNERS:
        assert issubclass(planner, BasePlanner) and not inspect.isabstract(planner)
    with pytest.raises(TypeError, match="abstract"):
        BasePlanner(SglangServer(), Path("t"), Path("d"))  # type: ignore[abstract]


def test_the_base_documents_the_order_of_calls_and_each_abstract_method_its_arguments_or_result():
    assert "The order of calls" in (BasePlanner.__doc__ or "")
    for name in BasePlanner.__abstractmethods__:
        doc = inspect.getdoc(getattr(BasePlanner, name)) or ""
        assert "Returns:" in doc, name


def test_one_plan_signature():
    base = inspect.signature(BasePlanner.plan)
    for planner, _ in PLANNERS:
        assert inspect.signature(planner.plan).parameters.keys() == base.parameters.keys()


@pytest.mark.parametrize(
    ("planner", "server", "checked"),
    [
        (SglangPlanner, SglangServer, "not checked against SGLang (no oracle for this server)"),
        (VllmPlanner, VllmServer, "not checked against vLLM (planned without vLLM)"),
    ],
)
def test_a_plan_without_the_oracle_says_so_and_shows_the_port_and_draft_it_was_given(
    planner, server, checked, tmp_path
):
    tiny = scenarios.get("tiny")
    p = planner(
        server(launch_command=["python", "-m", "server"]), tiny.target, tiny.draft, check=False
    )
    plan = p.plan(LiveSettings(), port=31234, draft_dir=tmp_path / "shown-draft")
    assert (
        plan.checked == checked
        and p.oracle() is None
        and p.description() is None
        and p.version() is None
    )
    assert "31234" in plan.argv and str(tmp_path / "shown-draft") in " ".join(plan.argv)
    moved = p.plan(LiveSettings(), port=40000, draft_dir=tmp_path / "elsewhere")
    assert moved.fingerprint == plan.fingerprint  # neither enters the identity


class _Unstartable(BasePlanner):
    label = "Server"
    starts = 0

    def plan(self, settings, *, port, draft_dir):
        raise AssertionError("not planned here")

    def _resolve_command(self):
        return ["server"]

    def _start_oracle(self):
        type(self).starts += 1
        raise BadInput(f"{self.server.python} cannot import the server's parser")


def test_an_oracle_that_cannot_start_keeps_its_first_reason_for_the_plans_checked(tmp_path):
    p = _Unstartable(SglangServer(python="/opt/none/python"), tmp_path, tmp_path)
    assert p.oracle() is None and p.oracle() is None and _Unstartable.starts == 2
    assert (
        p.checked_by(False, "")
        == "not checked against Server (/opt/none/python cannot import the server's parser)"
    )
    p.close()  # nothing started: nothing to end


def test_the_target_config_is_read_once_and_a_bad_one_is_none(tmp_path):
    (tmp_path / "config.json").write_text('{"num_hidden_layers": 4}')
    p = VllmPlanner(VllmServer(), tmp_path, tmp_path, check=False)
    assert p.target_config == {"num_hidden_layers": 4}
    (tmp_path / "config.json").write_text("[1, 2]")
    assert (
        p.target_config == {"num_hidden_layers": 4} and read_json(tmp_path / "config.json") is None
    )
    assert read_json(tmp_path / "missing.json") is None


@pytest.mark.parametrize(
    ("resolved", "concurrency"),
    [({"max_num_seqs": 2, "seed": 0}, 2), ({"seed": 0}, 8), ({"max_num_seqs": None}, 8)],
)
def test_the_servers_limit_caps_the_concurrency(resolved, concurrency):
    out = server_limits(
        LiveSettings(concurrency=8), resolved, keys=("max_num_seqs", "seed"), limit="max_num_seqs"
    )
    assert out == {"server": {k: v for k, v in resolved.items()}, "concurrency": concurrency}
