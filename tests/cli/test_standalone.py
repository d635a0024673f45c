"""`bisect-eagle standalone` as a user runs it: JSON keys, exit code 2 with one-line errors."""

import json
import subprocess
import sys


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bisect_eagle.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_json_output(tiny):
    out = _cli("standalone", "--scenario", "tiny", "--rule", "[:-1]", "--samples", "8", "--json")
    assert out.returncode == 0, out.stderr
    obj = json.loads(out.stdout)
    assert obj["rule"] == "[:-1]" and obj["samples"] == 8 and obj["tokens"] > 0
    assert 0 <= obj["accuracy"]["draft_vocab"] <= 1 and 0 <= obj["accuracy"]["full_vocab"] <= 1
    assert len(obj["per_position"]) == 3 and "alignment" in obj


def test_wrong_width_exits_2_with_the_width_message(tiny):
    out = _cli("standalone", "--scenario", "tiny", "--rule", "[0,1]", "--json")
    assert out.returncode == 2
    assert (
        out.stderr.strip()
        == "error: fc expects 3 × 192 = 576 inputs; rule [0,1] gives 2 tensors = 384"
    )
    assert out.stdout == ""


def test_truncated_dump_file_is_named(tiny, tmp_path):
    import shutil

    dump = tmp_path / "dump"
    shutil.copytree(tiny.dump, dump)
    bad = dump / "data_3.pt"
    bad.write_bytes(bad.read_bytes()[:1000])
    out = _cli("standalone", "--scenario", "tiny", "--dump", str(dump), "--json")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0]
    ok = _cli("standalone", "--scenario", "tiny", "--dump", str(dump), "--skip-bad", "--json")
    assert ok.returncode == 0 and len(json.loads(ok.stdout)["skipped_files"]) == 1


def test_unknown_scenario_and_bad_rule():
    out = _cli("standalone", "--scenario", "huge")
    assert out.returncode == 2 and "unknown scenario 'huge'" in out.stderr
    out = _cli("standalone", "--scenario", "tiny", "--rule", "[x]")
    assert out.returncode == 2 and "does not parse" in out.stderr


def test_help_lists_commands():
    out = _cli("--help")
    assert out.returncode == 0 and "standalone" in out.stdout
