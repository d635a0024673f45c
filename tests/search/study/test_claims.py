"""The claims table: one owner per fingerprint and study, takeover from dead owners, release,
waiting."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import pytest

from bisect_eagle.search.study.claims import Claims
from bisect_eagle.tracking.owner import owner_id


@pytest.fixture
def url(tmp_path) -> str:
    return f"sqlite:///{tmp_path}/optuna.db"


@pytest.fixture(scope="module")
def dead_owner() -> str:
    """The owner id of a process of this host that has exited."""
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return f"{socket.gethostname()}:{done.stdout.strip()}:0"


def test_one_owner_per_fingerprint_across_connections(url):
    me, other = Claims(url, "s"), Claims(url, "s")  # two processes' views of one database
    assert me.claim("fp1", trial=0, owner=owner_id()) == (True, None)
    won, existing = other.claim("fp1", trial=1, owner="elsewhere:1:1")
    assert (
        not won
        and existing.trial == 0
        and existing.state == "running"
        and existing.owner == owner_id()
    )
    # studies apart
    assert Claims(url, "another-study").claim("fp1", trial=0, owner=owner_id()) == (True, None)
    assert [c.fingerprint for c in other.all()] == ["fp1"]


def test_a_claim_beyond_the_budget_is_given_back_at_once(url):
    claims = Claims(url, "s")
    assert claims.claim_within("a", trial=0, owner=owner_id(), limit=1) == (True, None)
    assert claims.claim_within("b", trial=1, owner=owner_id(), limit=1) == (False, None)  # 2nd of 1
    assert [c.fingerprint for c in claims.all()] == ["a"]  # released: it may be measured again
    won, existing = claims.claim_within("a", trial=2, owner="elsewhere:1:1", limit=5)
    assert not won and existing.trial == 0  # a lost race names the holder, as claim does


def test_a_claimed_block_records_its_result_releases_on_raise_and_holds_nothing_it_lost(url):
    claims = Claims(url, "s")
    with claims.claimed("a", trial=0, owner=owner_id(), limit=5) as claim:
        assert claim.won and claim.other is None
        assert claims.get("a").state == "running"
        claim.finished = ("ok", 2.5, "r0")
    assert (claims.get("a").state, claims.get("a").value, claims.get("a").run_id) == (
        "ok",
        2.5,
        "r0",
    )
    with pytest.raises(KeyboardInterrupt), claims.claimed("b", trial=1, owner=owner_id(), limit=5):
        raise KeyboardInterrupt  # interrupted: released, measured again
    assert claims.get("b") is None
    with claims.claimed("a", trial=2, owner="elsewhere:1:1", limit=5) as lost:
        assert not lost.won and lost.other.run_id == "r0"  # another's result, to reuse
    with claims.claimed("c", trial=3, owner=owner_id(), limit=1) as beyond:
        assert not beyond.won and beyond.other is None  # beyond the budget: given back
    assert [c.fingerprint for c in claims.all()] == ["a"]


def test_position_counts_the_budget_in_claim_order(url):
    claims = Claims(url, "s")
    for i, fp in enumerate(("a", "b", "c")):
        claims.claim(fp, trial=i, owner=owner_id())
    Claims(url, "other").claim("x", trial=0, owner=owner_id())
    assert [claims.position(fp) for fp in ("a", "b", "c")] == [1, 2, 3]
    with pytest.raises(KeyError):
        claims.position("never-claimed")


def test_finish_keeps_the_claim_and_release_only_drops_running_ones(url):
    claims = Claims(url, "s")
    claims.claim("done", trial=0, owner=owner_id())
    claims.claim("lost", trial=1, owner=owner_id())
    claims.finish("done", state="failed", value=None, run_id="r0")
    claims.release("done")  # finished: never measured again
    claims.release("lost")  # interrupted: measured again
    assert [(c.fingerprint, c.state, c.run_id) for c in claims.all()] == [("done", "failed", "r0")]
    assert claims.claim("lost", trial=2, owner=owner_id()) == (True, None)


def test_a_dead_owners_running_claim_is_taken_over_but_not_another_hosts(url, dead_owner):
    claims = Claims(url, "s")
    claims.claim("orphan", trial=0, owner=dead_owner)
    assert claims.claim("orphan", trial=5, owner=owner_id()) == (True, None)
    taken = claims.get("orphan")
    assert taken.owner == owner_id() and taken.trial == 5
    # liveness unknown there: left alone
    claims.claim("remote", trial=1, owner="some-other-host:1:1")
    won, existing = claims.claim("remote", trial=6, owner=owner_id())
    assert not won and existing.owner == "some-other-host:1:1"


def test_wait_done_returns_the_winners_result(url):
    claims = Claims(url, "s")
    claims.claim("fp", trial=0, owner=owner_id())

    def finish_soon() -> None:
        time.sleep(0.3)
        Claims(url, "s").finish("fp", state="ok", value=12.5, run_id="run-1")

    t = threading.Thread(target=finish_soon)
    t.start()
    done = claims.wait_done("fp", timeout_s=30, poll_s=0.1)
    t.join()
    assert done is not None and done.state == "ok" and done.value == 12.5 and done.run_id == "run-1"


def test_wait_done_gives_none_when_released_dead_or_timed_out(url, dead_owner):
    claims = Claims(url, "s")
    assert claims.wait_done("never-claimed", timeout_s=5) is None  # released (or never there)
    claims.claim("orphan", trial=0, owner=dead_owner)
    start = time.monotonic()
    assert claims.wait_done("orphan", timeout_s=30) is None  # its owner died: do not wait
    claims.claim("slow", trial=1, owner=owner_id())
    assert claims.wait_done("slow", timeout_s=0.3, poll_s=0.05) is None
    assert time.monotonic() - start < 5


def test_one_reaper_per_silent_trial_of_a_study(url):
    """Two processes that both failed the same silent trial: only the first cleans up after it."""
    a, b, other_study = Claims(url, "s"), Claims(url, "s"), Claims(url, "t")
    results = []
    threads = [
        threading.Thread(target=lambda c=c: results.append(c.take_reap(3, reaper=str(id(c)))))
        for c in (a, b)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False, True]
    assert a.take_reap(3, reaper="again") is False
    assert other_study.take_reap(3, reaper="x") is True  # trial numbers are per study
