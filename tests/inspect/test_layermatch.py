"""Layer fingerprinting recovers which target layer each dumped or server-captured tensor came
from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch

from bisect_eagle.artifacts.draft import load_draft
from bisect_eagle.artifacts.dumps import DumpReader
from bisect_eagle.artifacts.target import load_target
from bisect_eagle.engines.local import SpeculativeDecoder
from bisect_eagle.errors import BadInput
from bisect_eagle.inspect.layermatch import fetch_server_states, match_layers

ROOT = Path(__file__).resolve().parents[2]
MIN_SEPARATION = 10.0  # the runner-up is at least 10x farther than the match


# two spinning threads on a shared 2-core box are ~20x slower
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def model(tiny):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_target(tiny.target)[0]
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def specforge_dump(tiny, tmp_path_factory) -> Path:
    """A second dump of the tiny target, made by the generator at other layers and in SpecForge
    format."""
    out = tmp_path_factory.mktemp("sf") / "dump"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "make_tiny_scenario.py"),
            "dump",
            str(out),
            "--layers",
            "3,7,11",
            "--format",
            "specforge",
            "--samples",
            "4",
            "--target",
            str(tiny.target),
        ],
        check=True,
        capture_output=True,
        timeout=120,
        env=ENV,
    )
    return out


def test_shipped_dump_is_matched_to_its_true_layers(tiny, model):
    loaded = load_draft(tiny.draft, target=tiny.target)
    fp = match_layers(model, DumpReader(tiny.dump), samples=4, draft=loaded)
    truth = tiny.meta["aux_layer_ids"]["hidden_states"]  # [2, 6, 10]
    assert [m.index for m in fp.matches] == [*truth, 12]
    # legacy dumps keep the final state pre-norm
    assert [m.normed for m in fp.matches] == [False] * 4
    assert [m.ids["sglang"] for m in fp.matches[:3]] == tiny.meta["aux_layer_ids"]["sglang"]
    assert [m.ids["vllm"] for m in fp.matches[:3]] == truth
    for m in fp.matches:
        assert m.similarity > 0.999 and abs(m.norm_ratio - 1) < 0.01
        assert m.separation > MIN_SEPARATION, (m.label, m.runner_up, m.separation)
        assert m.first_values == pytest.approx(m.target_first_values, abs=0.1)
    assert fp.recommended["eagle_aux_hidden_state_layer_ids"] == [1, 5, 9]
    assert fp.recommended["rule"] == "[:-1]" and fp.notes == []


def test_specforge_dump_at_other_layers_with_normed_final_state(tiny, model, specforge_dump):
    loaded = load_draft(tiny.draft, target=tiny.target)
    fp = match_layers(model, DumpReader(specforge_dump), samples=4, draft=loaded)
    assert [(m.index, m.normed) for m in fp.matches] == [
        (4, False),
        (8, False),
        (12, False),
        (12, True),
    ]
    assert [m.ids["sglang"] for m in fp.matches[:3]] == [3, 7, 11]
    assert fp.matches[3].ids == {"sglang": None, "vllm": None, "specforge": None}
    assert all(m.separation > MIN_SEPARATION and m.similarity > 0.999 for m in fp.matches)
    assert fp.recommended["eagle_aux_hidden_state_layer_ids"] == [3, 7, 11]
    # the shipped draft reads layers 1, 5, 9, which this dump lacks
    assert fp.recommended["rule"] is None
    assert any("never captured by SGLang" in n for n in fp.notes)
    assert any("does not hold hs[2], hs[6], hs[10]" in n for n in fp.notes)
    no_draft = match_layers(model, DumpReader(specforge_dump), samples=2)
    assert no_draft.recommended["rule"] == "[:-1]"


def _server(model, ids: list[int]) -> httpx.Client:
    """A stand-in server whose /generate returns the aux states captured at SGLang ``ids``."""
    decoder = SpeculativeDecoder(model, None, ids, 0)

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        assert request.url.path == "/generate" and body["return_hidden_states"] is True
        states = decoder.aux_hidden_states(body["input_ids"])
        return httpx.Response(
            200, json={"text": "x", "meta_info": {"hidden_states": states.tolist()}}
        )

    return httpx.Client(transport=httpx.MockTransport(handle))


def test_server_capture_is_matched_and_compared_with_the_dump(tiny, model):
    right = match_layers(
        model,
        DumpReader(tiny.dump),
        samples=1,
        server_url="http://127.0.0.1:1",
        client=_server(model, [1, 5, 9]),
    )
    server = [m for m in right.matches if m.source == "server"]
    assert [m.index for m in server] == [2, 6, 10] and all(
        m.separation > MIN_SEPARATION for m in server
    )
    assert right.recommended["server_hidden_states"] == [2, 6, 10] and right.notes == []
    wrong = match_layers(
        model,
        DumpReader(tiny.dump),
        samples=1,
        server_url="http://127.0.0.1:1",
        client=_server(model, [-1, 1, 5]),
    )
    assert [m.index for m in wrong.matches if m.source == "server"] == [0, 2, 6]
    assert any("the server captures hs[0, 2, 6]" in n for n in wrong.notes)


def test_bad_server_answers_are_clear_errors():
    def no_states(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"text": "x", "meta_info": {}})

    with pytest.raises(BadInput, match="no meta_info.hidden_states"):
        fetch_server_states(
            "http://127.0.0.1:1",
            [1, 2, 3],
            client=httpx.Client(transport=httpx.MockTransport(no_states)),
        )

    def wrong_rows(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, json={"meta_info": {"hidden_states": torch.zeros(2, 8).tolist()}}
        )

    with pytest.raises(BadInput, match=r"shape \[2, 8\]; expected \[3, k × hidden\]"):
        fetch_server_states(
            "http://127.0.0.1:1",
            [1, 2, 3],
            client=httpx.Client(transport=httpx.MockTransport(wrong_rows)),
        )


def test_cli_json(tiny):
    code = (
        "import sys; from bisect_eagle import cli; from bisect_eagle.cli import fingerprint as m; "
        "'fingerprint' in {c.name for c in cli.app.registered_commands} or m.register(cli.app); "
        "cli.main()"
    )
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "fingerprint",
            "--scenario",
            "tiny",
            "--samples",
            "2",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )
    assert out.returncode == 0, out.stderr
    obj = json.loads(out.stdout)
    assert [m["index"] for m in obj["matches"]] == [2, 6, 10, 12]
    assert obj["recommended"]["eagle_aux_hidden_state_layer_ids"] == [1, 5, 9]
    assert all(m["separation"] > MIN_SEPARATION for m in obj["matches"])
    missing = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "fingerprint",
            "--dump",
            "/nonexistent",
            "--target",
            str(tiny.target),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )
    assert (
        missing.returncode == 2
        and missing.stderr.strip() == "error: /nonexistent: dump directory not found"
    )
