"""Every command that takes a run id (`reproduce`, `export`, `bisect --good/--bad`) takes the 8
characters every table shows, or any unique prefix of at least 6; a short, unknown or ambiguous one
exits 2 with one line."""

from __future__ import annotations

import json
import types

import pytest

from bisect_eagle.bisect.endpoints import load_endpoint
from bisect_eagle.errors import BadInput
from bisect_eagle.tracking.runs import Tracking

from helpers import run_cli, tiny_fake_study


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A tiny-scenario study (real stage 1 on 4 samples, fake live engine) in a fresh store."""
    root = tmp_path_factory.mktemp("run-ids")
    uri, out, fake = tiny_fake_study(root)
    return uri, out, fake


@pytest.fixture(autouse=True)
def no_env_store(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def test_export_takes_the_8_characters_a_table_shows(store, monkeypatch, capsys):
    uri, out, _ = store
    best = out.best["run_id"]
    code, whole, _ = run_cli(["export", best, "--tracking-uri", uri], monkeypatch, capsys)
    assert code == 0
    code, short, err = run_cli(["export", best[:8], "--tracking-uri", uri], monkeypatch, capsys)
    assert code == 0, err
    assert short == whole and f"launch for trial {best[:8]}" in short


def test_reproduce_takes_a_prefix_and_records_the_whole_id(store, monkeypatch, capsys):
    import bisect_eagle.engines

    uri, out, fake = store
    best = out.best["run_id"]
    monkeypatch.setattr(bisect_eagle.engines, "make_engine", lambda spec, log_dir=None: fake())
    code, stdout, err = run_cli(
        ["reproduce", best[:6], "--tracking-uri", uri, "--json"], monkeypatch, capsys
    )
    assert code == 0, err
    got = json.loads(stdout)
    assert got["run_id"] == best and got["status"] == "ok"
    tracking, parent = Tracking.of_run(uri, got["new_run_id"])
    assert parent.data.tags["reproduces"] == best


def test_bisect_takes_a_prefix_for_an_endpoint(store):
    uri, out, _ = store
    best = out.best["run_id"]
    endpoint = load_endpoint(best[:8], flag="--good", tracking_uri=uri)
    assert endpoint.label == f"run:{best}" and endpoint.spec is None and endpoint.settings
    with pytest.raises(BadInput, match=r"^--bad run 'fffffff' not found"):
        load_endpoint("fffffff", flag="--bad", tracking_uri=uri)


@pytest.mark.parametrize("command", ["export", "reproduce"])
def test_a_short_or_unknown_id_exits_2_with_one_line(store, monkeypatch, capsys, command):
    uri, _, _ = store
    for text, says in (("abc12", "at least 6"), ("0000000000", "not found")):
        code, stdout, err = run_cli([command, text, "--tracking-uri", uri], monkeypatch, capsys)
        assert code == 2 and not stdout
        assert len(err.strip().splitlines()) == 1 and says in err and err.startswith("error: run ")


def test_an_ambiguous_prefix_exits_2_naming_the_candidates(store, monkeypatch, capsys):
    from mlflow.store.tracking import sqlalchemy_store

    uri, out, _ = store
    ids = ["beefed01" + "a" * 24, "beefed02" + "b" * 24]
    queue = list(ids)
    # two runs whose ids share 6 characters: MLflow's id generator patched
    with monkeypatch.context() as m:
        m.setattr(
            sqlalchemy_store,
            "uuid",
            types.SimpleNamespace(uuid4=lambda: types.SimpleNamespace(hex=queue.pop(0))),
        )
        tracking = Tracking.open(uri, "ambiguous")
        for i in range(2):
            tracking.start_run(f"r{i}", tags={"role": "unit"})
    for command in ("export", "reproduce"):
        code, _, err = run_cli([command, "beefed", "--tracking-uri", uri], monkeypatch, capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1
        assert "ambiguous" in err and ids[0][:8] in err and ids[1][:8] in err
