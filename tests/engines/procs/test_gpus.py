"""Waiting for the GPUs to let go of a server's memory, read from a stand-in ``nvidia-smi`` on PATH.

By pids where the listing names processes of this pid namespace; by device memory against the
pre-launch use where it lists pids unknown here (NVML's host pids inside a container) or nothing;
unchecked without tools. The stand-in answers each query from a list of canned outputs in turn (the
last one from then on).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from bisect_eagle.engines.procs import gpus

GPUS = "0, GPU-aaaa-0, {0}, 81559\n1, GPU-bbbb-1, {1}, 81559\n"  # index, uuid, used MiB, total MiB
TOL = gpus.tolerance_mib(81559)  # 2 % of 81559 MiB: 1631


class FakeSmi:
    """A ``nvidia-smi`` on PATH answering ``--query-compute-apps`` and ``--query-gpu`` from canned
    outputs."""

    def __init__(self, root: Path):
        self.root = root
        script = root / "bin" / "nvidia-smi"
        script.parent.mkdir()
        script.write_text(
            "#!/bin/sh\n"
            'case "$1" in --query-compute-apps=*) k=apps ;; --query-gpu=*) k=gpus ;; *) exit 2 ;; '
            "esac\n"
            f"d={root}\n"
            'n=$(( $(/bin/cat "$d/$k.calls" 2>/dev/null || echo 0) + 1 )); echo $n > '
            '"$d/$k.calls"\n'
            'last=$(/bin/cat "$d/$k.last"); [ $n -gt $last ] && n=$last\n'
            '/bin/cat "$d/$k.$n"\n'
        )
        script.chmod(0o755)
        self.bin = script.parent

    def answer(self, kind: str, *outputs: str) -> None:
        """``kind`` (apps or gpus) answers ``outputs`` in turn from now on, the last one
        repeated."""
        for i, text in enumerate(outputs, 1):
            (self.root / f"{kind}.{i}").write_text(text)
        (self.root / f"{kind}.last").write_text(str(len(outputs)))
        (self.root / f"{kind}.calls").unlink(missing_ok=True)

    def calls(self, kind: str) -> int:
        return int((self.root / f"{kind}.calls").read_text())


@pytest.fixture
def smi(tmp_path, monkeypatch) -> FakeSmi:
    fake = FakeSmi(tmp_path)
    monkeypatch.setenv("PATH", str(fake.bin))
    return fake


@pytest.fixture
def other_pid():
    """A live process of this namespace that is not the test: a stranger holding GPU memory."""
    proc = subprocess.Popen(["/bin/sleep", "30"])
    yield proc.pid
    proc.kill()
    proc.wait()


def absent_pid() -> int:
    """A pid no process of this namespace has: what NVML reports for a process seen from the
    host."""
    pid = 4_000_000
    while psutil.pid_exists(pid):
        pid -= 1
    return pid


# --------------------------------------------------------------------------------------------------
# pids of this namespace: matched by pid, whatever the devices say


def test_released_once_no_pid_of_the_server_holds_memory(smi, other_pid):
    me = os.getpid()
    smi.answer("apps", f"{me}, 500\n{other_pid}, 10\n", f"{me}, 20\n", f"{other_pid}, 10\n")
    # far above the baseline: the pids decide, not the devices
    smi.answer("gpus", GPUS.format(40000, 40000))
    got = gpus.wait_gpu_release(pids=[me, 99], timeout_s=10, baseline={0: 100, 1: 100})
    assert (
        got.status == "released"
        and got.method == "pids"
        and got.holders == {}
        and smi.calls("apps") == 3
    )
    # two pauses (0.05 s, then 0.1 s) before the third check
    assert got.seconds is not None and 0.1 <= got.seconds < 2


def test_held_when_the_time_is_up_with_the_pids_still_holding(smi, other_pid):
    me = os.getpid()
    smi.answer("apps", f"{me}, 500\n{other_pid}, 0\n")
    smi.answer("gpus", GPUS.format(100, 100))  # at the baseline: still the pids decide
    start = time.monotonic()
    got = gpus.wait_gpu_release(pids=[me, other_pid], timeout_s=0.3, baseline={0: 100, 1: 100})
    assert 0.3 <= time.monotonic() - start < 1.5
    assert got.status == "held" and got.method == "pids" and got.seconds is None
    assert (
        got.holders == {me: 500, other_pid: 0} and str(me) in got.reason and smi.calls("apps") >= 3
    )


def test_a_zero_timeout_checks_once(smi):
    smi.answer("apps", f"{os.getpid()}, 500\n")
    smi.answer("gpus", GPUS.format(100, 100))
    got = gpus.wait_gpu_release(pids=[os.getpid()], timeout_s=0.0, baseline=None)
    assert got.status == "held" and got.holders == {os.getpid(): 500} and smi.calls("apps") == 1


def test_unchecked_at_once_without_gpu_tools(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    got = gpus.wait_gpu_release(pids=[1234], timeout_s=10, baseline={0: 100})
    assert got.status == "unchecked" and got.method is None and "no GPU tool" in got.reason
    assert gpus.device_baseline({}) is None


def test_a_failing_tool_is_no_answer(smi):
    (smi.bin / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    assert gpus.read_gpus() is None


# --------------------------------------------------------------------------------------------------
# pids of another namespace (a container): device memory against the pre-launch use


def test_host_pids_fall_back_to_device_memory_and_wait_for_it_to_drop(smi):
    host = absent_pid()
    smi.answer("apps", f"{host}, 39000\n")
    high = GPUS.format(30000, 40000)
    smi.answer("gpus", GPUS.format(30000, 500), high, high, high, GPUS.format(30000, 500 + TOL))
    # GPU 0 is someone else's: not waited on
    baseline = gpus.device_baseline({"CUDA_VISIBLE_DEVICES": "1"})
    assert baseline == {1: 500}
    pid_only = gpus.judge_release(gpus.read_gpus(), pids=[os.getpid()], baseline=None)
    # never "released" on foreign pids
    assert pid_only.status == "unchecked" and str(host) in pid_only.reason
    got = gpus.wait_gpu_release(pids=[os.getpid()], timeout_s=10, baseline=baseline)
    assert got.status == "released" and got.method == "device memory" and got.over == {}
    assert smi.calls("gpus") == 5 and got.seconds is not None and 0.1 <= got.seconds < 2
    assert "do not exist in this pid namespace" in got.reason


def test_memory_that_never_drops_is_held_with_the_reason(smi):
    host = absent_pid()
    smi.answer("apps", f"{host}, 39000\n")
    smi.answer("gpus", GPUS.format(40000, 41000))
    start = time.monotonic()
    got = gpus.wait_gpu_release(pids=[os.getpid()], timeout_s=0.3, baseline={0: 500, 1: 500})
    assert 0.3 <= time.monotonic() - start < 1.5
    assert got.status == "held" and got.method == "device memory" and got.seconds is None
    assert got.over == {0: 39500, 1: 40500} and got.holders == {}
    assert "GPU 1 at 41000 MiB (was 500, tolerance 1631)" in got.reason and str(host) in got.reason


def test_an_empty_listing_is_checked_on_the_devices_when_a_baseline_exists(smi):
    smi.answer("apps", "")  # a container may list no process at all while one holds memory
    smi.answer("gpus", GPUS.format(40000, 100))
    held = gpus.wait_gpu_release(pids=[4242], timeout_s=0.0, baseline={0: 100, 1: 100})
    assert held.status == "held" and held.method == "device memory" and held.over == {0: 39900}
    assert "lists no compute process" in held.reason
    assert gpus.wait_gpu_release(pids=[4242], timeout_s=0.0, baseline=None).method == "pids"


def test_a_device_that_disappears_is_not_released(smi):
    smi.answer("apps", f"{absent_pid()}, 10\n")
    smi.answer("gpus", "0, GPU-aaaa-0, 100, 81559\n1, GPU-bbbb-1, [N/A], 81559\n")
    got = gpus.wait_gpu_release(pids=[1], timeout_s=0.0, baseline={0: 100, 1: 100})
    assert got.status == "held" and got.over == {} and "GPUs [1] no longer listed" in got.reason


def test_visible_devices_by_index_uuid_or_all():
    devs = [
        gpus.Device(0, "GPU-aaaa-0", 1, 10),
        gpus.Device(1, "GPU-bbbb-1", 1, 10),
        gpus.Device(2, "GPU-cc", 1, 10),
    ]
    assert gpus.visible_devices(devs, {}) == devs
    assert [
        d.index for d in gpus.visible_devices(devs, {"CUDA_VISIBLE_DEVICES": "2, GPU-aaaa"})
    ] == [2, 0]
    # unknown: check them all
    assert gpus.visible_devices(devs, {"CUDA_VISIBLE_DEVICES": "MIG-1234"}) == devs
    assert gpus.visible_devices(devs, {"CUDA_VISIBLE_DEVICES": ""}) == []
