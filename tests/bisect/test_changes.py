"""The list of changes comes from the engine's plans: ignored settings, defaults and implied values
are not changes."""

from __future__ import annotations

from typing import Any

from fake_engine import FakeEngine

from bisect_eagle.bisect.changes import (
    apply_changes,
    describe_changes,
    explain_no_changes,
    flat_settings,
    list_changes,
    not_change_reasons,
    not_changes,
)
from bisect_eagle.engines.plan import TrialPlan, make_plan
from bisect_eagle.engines.sglang.rules import speculative_effective
from bisect_eagle.spec.schema import settings_from
from bisect_eagle.spec.settings import LiveSettings
from bisect_eagle.tracking.redact import hidden, is_hidden


def local_like(flat: dict[str, Any]) -> TrialPlan:
    """The fake engine's plan: like the local engine it ignores concurrency, env and server_args."""
    return FakeEngine().plan(settings_from(flat, "test"))


def server_like(flat: dict[str, Any]) -> TrialPlan:
    """A server engine's plan: env and server_args run; topk > 1 without a draft-token count
    defaults to 8."""
    settings = settings_from(flat, "test")
    if settings.topk > 1 and settings.num_draft_tokens is None:
        settings = settings.model_copy(update={"num_draft_tokens": 8})
    effective, warnings, refusal = speculative_effective(settings)
    if effective["eagle_aux_hidden_state_layer_ids"] is None:
        effective["eagle_aux_hidden_state_layer_ids"] = [1, 5, 9]
    effective["server_args"] = {"attention_backend": "flashinfer", **effective["server_args"]}
    return make_plan("server", settings, effective=effective, warnings=warnings, refusal=refusal)


def flat(**values: Any) -> dict[str, Any]:
    return flat_settings(settings_from(values, "test"))


def test_settings_the_engine_ignores_are_not_changes():
    good, bad = (
        flat(),
        flat(concurrency=4, **{"env.NCCL_ALGO": "Ring", "server_args.attention_backend": "triton"}),
    )
    assert list_changes(good, bad, plan=local_like) == []
    names = ["concurrency", "env.NCCL_ALGO", "server_args.attention_backend"]
    assert explain_no_changes(good, bad, changes=[]) == names
    # a server engine runs them all
    assert [c.name for c in list_changes(good, bad, plan=server_like)] == names


def test_defaults_written_out_and_the_drafts_own_ids_are_not_changes():
    good = flat()
    bad = flat(
        num_steps=3,
        eagle_aux_hidden_state_layer_ids=[1, 5, 9],
        **{"server_args.attention_backend": "flashinfer"},
    )
    assert list_changes(good, bad, plan=server_like) == []
    assert list_changes(good, bad, plan=local_like) == []


def test_a_value_the_engine_overrides_is_not_a_change():
    """topk 1 forces num_draft_tokens = num_steps + 1: 16 draft tokens next to num_steps 1 run as
    2."""
    good, bad = flat(), flat(num_steps=1, num_draft_tokens=16)
    changes = list_changes(good, bad, plan=local_like)
    assert [c.name for c in changes] == ["num_steps"]
    assert explain_no_changes(good, bad, changes=changes) == ["num_draft_tokens"]
    assert local_like(apply_changes(good, changes)).fingerprint == local_like(bad).fingerprint


def test_a_setting_needed_to_rebuild_the_bad_plan_stays_a_change():
    """With topk 2 the draft-token count matters: applying topk alone would plan a different
    trial."""
    good, bad = flat(), flat(topk=2, num_draft_tokens=4)
    changes = list_changes(good, bad, plan=server_like)
    assert [c.name for c in changes] == ["topk", "num_draft_tokens"]
    assert server_like(apply_changes(good, changes)).fingerprint == server_like(bad).fingerprint
    topk, ndt = changes
    # topk 1 hides it in the good one
    assert topk.masked_by == {} and ndt.masked_by == {"good": ("topk",)}
    # as it runs once topk is 2: the default 8
    assert (ndt.values("good"), ndt.values("bad")) == (8, 4)


def eagle_like(flat: dict[str, Any]) -> TrialPlan:
    """A server engine that, like the local one, leaves the layer ids unused under
    speculative_algorithm EAGLE."""
    settings = settings_from(flat, "test")
    if settings.topk > 1 and settings.num_draft_tokens is None:
        settings = settings.model_copy(update={"num_draft_tokens": 8})
    effective, warnings, refusal = speculative_effective(settings)
    ids = effective["eagle_aux_hidden_state_layer_ids"] or [1, 5, 9]
    effective["eagle_aux_hidden_state_layer_ids"] = (
        [] if settings.speculative_algorithm == "EAGLE" else ids
    )
    return make_plan("server", settings, effective=effective, warnings=warnings, refusal=refusal)


def test_a_setting_hidden_in_the_bad_configuration_is_a_change_masked_there():
    """EAGLE leaves the ids unused: reverting the wrong wiring alone from bad plans bad again, but
    applying it to good does not plan good. It is a change, masked in the bad configuration by the
    algorithm."""
    good = flat()
    bad = flat(
        speculative_algorithm="EAGLE",
        eagle_aux_hidden_state_layer_ids=[-1, 1, 5],
        max_new_tokens=32,
        **{"env.NCCL_ALGO": "Tree"},
    )
    changes = list_changes(good, bad, plan=eagle_like)
    without_wiring = [c for c in changes if c.name != "eagle_aux_hidden_state_layer_ids"]
    # yet a change
    assert (
        eagle_like(apply_changes(good, without_wiring)).fingerprint == eagle_like(bad).fingerprint
    )
    assert [c.name for c in changes] == [
        "speculative_algorithm",
        "eagle_aux_hidden_state_layer_ids",
        "max_new_tokens",
        "env.NCCL_ALGO",
    ]
    algo, wiring = changes[:2]
    assert wiring.masked_by == {"bad": ("speculative_algorithm",)} and algo.masked_by == {}
    # bad: as the repair exposes it
    assert (wiring.values("good"), wiring.values("bad")) == ([1, 5, 9], [-1, 1, 5])
    assert wiring.to_json()["masked_by"] == {"bad": ["speculative_algorithm"]}
    assert all(c.masked_by == {} for c in changes[2:])
    assert explain_no_changes(good, bad, changes=changes) == []


def test_a_difference_inert_from_both_ends_is_still_not_a_change():
    """topk 1 at both ends: num_draft_tokens is overridden in both, whatever else differs."""
    good, bad = flat(), flat(speculative_algorithm="EAGLE", num_draft_tokens=16)
    changes = list_changes(good, bad, plan=eagle_like)
    assert [c.name for c in changes] == ["speculative_algorithm"]
    assert [c.name for c in not_changes(good, bad, changes=changes)] == ["num_draft_tokens"]


def test_masked_by_several_settings_together():
    """A plan that uses x only when both a and b are set at their bad values: reverting a or b alone
    unmasks x."""

    def plan(values: dict[str, Any]) -> TrialPlan:
        settings = settings_from(values, "test")
        env = dict(settings.env)
        if env.get("A") == "1" and env.get("B") == "1":
            env.pop("X", None)
        return make_plan("server", settings, effective={"env": env})

    good = flat(**{"env.X": "0"})
    bad = flat(**{"env.A": "1", "env.B": "1", "env.X": "9"})
    x = next(c for c in list_changes(good, bad, plan=plan) if c.name == "env.X")
    assert x.masked_by == {"bad": ("env.A", "env.B")}  # each one alone, reverted, exposes it


def test_changes_show_effective_values_and_groups_apply_together():
    good = flat(**{"server_args.a": 1, "server_args.b": 2})
    bad = flat(
        num_steps=1,
        eagle_aux_hidden_state_layer_ids=[-1, 1, 5],
        **{"env.NCCL_ALGO": "Tree", "server_args.a": 5, "server_args.b": 6},
    )
    changes = list_changes(good, bad, plan=server_like, groups=[["server_args.a", "server_args.b"]])
    assert [c.name for c in changes] == [
        "eagle_aux_hidden_state_layer_ids",
        "num_steps",
        "env.NCCL_ALGO",
        "server_args.a+server_args.b",
    ]
    wiring = changes[0]
    # resolved by the plan
    assert (wiring.values("good"), wiring.values("bad")) == ([1, 5, 9], [-1, 1, 5])
    # applied as written: the draft's own ids
    assert wiring.good == {"eagle_aux_hidden_state_layer_ids": None}
    assert changes[3].to_json() == {
        "name": "server_args.a+server_args.b",
        "settings": ["server_args.a", "server_args.b"],
        "good": {"server_args.a": hidden(1), "server_args.b": hidden(2)},
        "bad": {"server_args.a": hidden(5), "server_args.b": hidden(6)},
        "masked_by": {},
    }
    assert apply_changes(good, changes[1:3]) == {**good, "num_steps": 1, "env.NCCL_ALGO": "Tree"}


def test_secret_values_are_applied_in_clear_and_shown_redacted():
    good, bad = flat(), flat(**{"env.HF_TOKEN": "hf_planted_value"})
    (change,) = list_changes(good, bad, plan=server_like)
    assert change.bad == {"env.HF_TOKEN": "hf_planted_value"}  # the engine must get the real value
    assert "hf_planted_value" not in str(change.to_json()) and is_hidden(change.values("bad"))
    assert list_changes(good, bad, plan=local_like) == []


def test_flat_settings_round_trip():
    s = LiveSettings(num_steps=2, env={"A": "1"}, server_args={"x": True})
    assert settings_from(flat_settings(s), "test") == s


def test_each_not_change_says_why_and_the_description_lists_both():
    good = flat()
    bad = flat(
        num_steps=1,
        num_draft_tokens=16,
        eagle_aux_hidden_state_layer_ids=[1, 5, 9],
        concurrency=4,
        **{"env.NCCL_ALGO": "Ring"},
    )
    changes = list_changes(good, bad, plan=local_like)
    reasons = not_change_reasons(good, bad, changes=changes, plan=local_like)
    assert reasons == {
        # the draft's own ids
        "eagle_aux_hidden_state_layer_ids": "the engine runs it as [1, 5, 9] at both ends",
        # topk 1: num_steps + 1
        "num_draft_tokens": "it follows from the other changes (it runs as 4 -> 2)",
        "concurrency": "the fake engine does not use it",
        "env.NCCL_ALGO": "the fake engine does not use it",
    }
    assert describe_changes(changes, reasons) == [
        "1 change to bisect (good -> bad, as the engine runs them):",
        "  num_steps: 3 -> 1",
        "4 requested differences not bisected:",
        *(f"  {name}: not a change, {why}" for name, why in reasons.items()),
    ]
    assert (
        not_change_reasons(
            good,
            flat(num_steps=1),
            changes=list_changes(good, flat(num_steps=1), plan=local_like),
            plan=local_like,
        )
        == {}
    )


def test_a_masked_change_says_what_hides_it():
    """topk 1 in the good configuration hides its num_draft_tokens: the bad one's matters only with
    its topk."""
    good, bad = flat(), flat(topk=2, num_draft_tokens=4)
    lines = describe_changes(list_changes(good, bad, plan=server_like), {})
    assert lines[0] == "2 changes to bisect (good -> bad, as the engine runs them):"
    assert lines[1] == "  topk: 1 -> 2"
    assert lines[2].startswith("  num_draft_tokens: ") and lines[2].endswith(
        "(hidden at good by topk)"
    )
    assert len(lines) == 3  # no not-changes: no line for them
