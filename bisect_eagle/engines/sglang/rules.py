"""SGLang's speculative rules, in one place: how SGLang 0.5.23 turns a request's ``num_steps``,
``topk``, ``num_draft_tokens`` and ``speculative_adaptive`` into the values it runs, and what it
refuses. Every engine applies them: the sglang planner before (or where it cannot) ask SGLang
itself, the local engine and the stand-in server (``bisect-eagle serve``) because they mimic SGLang,
the doctor to say what a request becomes.

- :func:`apply_speculative_rules` / :func:`speculative_effective`: the baseline cleared,
  ``num_draft_tokens = num_steps + 1`` forced when ``topk == 1``, adaptive turned off for
  ``topk > 1`` (``srt/arg_groups/speculative_hook.py`` ``_handle_eagle_family`` and
  ``_maybe_disable_adaptive``);
- :func:`tree_bound`: how many draft tokens a tree can select (``srt/speculative/eagle_utils.py``
  ``organize_draft_results``);
- :func:`adaptive_steps` / :func:`resolved_adaptive`: the step counts of adaptive speculation
  (``_init_adaptive_speculative_params``) and what SGLang's resolution made of an adaptive request;
- :data:`TESTED_SGLANG`: the SGLang releases those rules are tested with (another release is
  refused, not guessed).

``docs/sglang-facts.md#speculative-settings`` holds the facts, each with the file and lines it
comes from.
"""

from __future__ import annotations

from typing import Any

from bisect_eagle.engines.plan import natural_unmarked
from bisect_eagle.engines.sglang.oracle_script import ADAPTIVE_OFF
from bisect_eagle.errors import BadInput
from bisect_eagle.keys import IDS_KEY
from bisect_eagle.perf.adaptive import DEFAULT_ADAPTIVE_CONFIG
from bisect_eagle.spec.settings import ADAPTIVE, LiveSettings

# the SGLang releases the planner's rules and the oracle are tested with (pyproject pin)
TESTED_SGLANG = ("0.5.23",)
# the candidate_steps of every bucket of SGLang 0.5.23's DEFAULT_ADAPTIVE_CONFIG (the table's one
# home: perf/adaptive)
ADAPTIVE_STEPS = tuple(
    sorted({s for slot in DEFAULT_ADAPTIVE_CONFIG.values() for s in slot["candidate_steps"]})
)


def untested_version(version: str | None, where: str) -> str | None:
    """A one-line refusal when the SGLang at ``where`` is a release the planner is not tested with
    (None: tested or unknown). The planner's own rules (the environment SGLang's launcher sets,
    adaptive candidate steps, the tree bound, the capture fallback table) are those releases'; on
    another one it refuses to guess."""
    if version is None or version in TESTED_SGLANG:
        return None
    return (
        f"SGLang {version} ({where}) is not a release the sglang planner is tested with "
        f"({', '.join(TESTED_SGLANG)}); its rules would be guesses there: install "
        f"sglang=={TESTED_SGLANG[-1]} in that environment (pip install 'bisect-eagle[sglang]') or "
        "point engine.sglang.python / --sglang-python at one"
    )


def tree_bound(s: LiveSettings) -> str | None:
    """SGLang selects ``num_draft_tokens - 1`` of ``topk + (num_steps - 1)·topk²`` tree
    candidates."""
    if s.is_baseline or s.topk <= 1 or s.num_draft_tokens is None:
        return None
    candidates = s.topk + (s.num_steps - 1) * s.topk**2
    if s.num_draft_tokens - 1 > candidates:
        return (
            f"num_draft_tokens {s.num_draft_tokens} with topk {s.topk} and num_steps "
            f"{s.num_steps}: SGLang selects num_draft_tokens - 1 = {s.num_draft_tokens - 1} of "
            f"topk + (num_steps - 1)·topk² = {candidates} candidates "
            "(srt/speculative/eagle_utils.py organize_draft_results) and fails at draft CUDA-graph "
            "capture; lower num_draft_tokens or raise num_steps"
        )
    return None


def adaptive_steps(s: LiveSettings) -> str | None:
    """SGLang's start-up check of adaptive ``num_steps`` against its default config's candidates
    (when the server's own resolution did not run and no ``speculative_adaptive_config`` replaces
    the defaults)."""
    if (
        not s.speculative_adaptive
        or s.is_baseline
        or s.topk != 1
        or "speculative_adaptive_config" in s.server_args
    ):
        return None
    if s.num_steps in ADAPTIVE_STEPS:
        return None
    return (
        f"--speculative-num-steps={s.num_steps} is not in the adaptive config candidate_steps "
        f"{list(ADAPTIVE_STEPS)}. Pass one of those values. (SGLang 0.5.23 refuses to start: "
        "srt/arg_groups/speculative_hook.py _init_adaptive_speculative_params)"
    )


def resolved_adaptive(
    s: LiveSettings, effective: dict[str, Any], resolved: dict[str, Any] | None
) -> list[str]:
    """``speculative_adaptive`` as SGLang resolved it, in ``effective`` (the key only when on); a
    warning when SGLang turned off a mode the project's own rules kept on (those that turned it off
    already warned)."""
    if resolved is None or s.is_baseline or not effective.get(ADAPTIVE):
        return []
    if resolved.get(ADAPTIVE):
        effective[ADAPTIVE] = True
        return []
    effective.pop(ADAPTIVE, None)
    return [
        adaptive_off_warning(resolved.get(ADAPTIVE_OFF) or "its settings resolution disabled it")
    ]


def apply_speculative_rules(s: LiveSettings) -> tuple[LiveSettings, list[str]]:
    """SGLang's EAGLE-family rules applied to a request: (effective settings, warnings about
    overrides).

    ``speculative_adaptive`` with ``topk > 1`` is turned off, as SGLang does with only a warning
    (``adaptive_unsupported_reason``; its reason quoted). Which ``num_steps`` adaptive accepts
    depends on the server's adaptive config; the sglang planner checks that
    (``docs/sglang-facts.md#speculative-adaptive``).

    Args:
        s: the requested settings.

    Returns:
        ``(effective, warnings)``: a baseline with every speculative field cleared; otherwise the
        settings with ``num_draft_tokens`` set (``num_steps + 1`` when ``topk == 1``) and adaptive
        turned off for ``topk > 1``, and one warning per value SGLang overrides.

    Raises:
        BadInput: a speculative request with ``num_steps < 1`` or ``topk < 1``, or ``topk > 1``
            without ``num_draft_tokens``.
    """
    if s.is_baseline:
        return s.model_copy(
            update={
                "num_steps": 0,
                "topk": 0,
                "num_draft_tokens": 0,
                IDS_KEY: None,
                ADAPTIVE: False,
            }
        ), []
    if s.num_steps < 1:
        raise BadInput(f"num_steps must be >= 1 for speculative decoding, got {s.num_steps}")
    if s.topk < 1:
        raise BadInput(f"topk must be >= 1, got {s.topk}")
    warnings = []
    if s.speculative_adaptive and s.topk != 1:
        warnings.append(
            adaptive_off_warning(f"speculative_eagle_topk={s.topk} (only topk=1 is supported)")
        )
        s = s.model_copy(update={ADAPTIVE: False})
    ndt = s.num_draft_tokens
    if s.topk == 1 and ndt != s.num_steps + 1:
        if ndt is not None:
            warnings.append(
                f"topk == 1 forces num_draft_tokens = num_steps + 1 = {s.num_steps + 1} (requested "
                f"{ndt}; SGLang overrides it with only a warning)"
            )
        ndt = s.num_steps + 1
    elif ndt is None:
        raise BadInput("num_draft_tokens is required when topk > 1")
    return s.model_copy(update={"num_draft_tokens": ndt}), warnings


def adaptive_off_warning(reason: str) -> str:
    """The warning of a request for adaptive speculation that SGLang turns off, with SGLang's
    ``reason``.

    Args:
        reason: why SGLang turns it off, in SGLang's words.

    Returns:
        One line saying the static ``num_steps`` runs instead.
    """
    return (
        f"{ADAPTIVE} is turned off by SGLang: {reason}; it runs the static num_steps, with only a "
        "warning"
    )


def speculative_effective(settings: LiveSettings) -> tuple[dict[str, Any], list[str], str | None]:
    """SGLang's speculative rules applied: (effective fields in clear, warnings, refusal or None).

    The baseline drops every speculative field to its neutral value; a request the rules refuse
    keeps its requested values and carries the reason. ``speculative_adaptive`` appears only when on
    and ``pinned_acceptance`` only when set, so the effective settings (and fingerprints) of configs
    without them are what they were before the fields existed.
    """
    try:
        eff, warnings = apply_speculative_rules(settings)
    except BadInput as e:
        return _adaptive_only_when_on(settings.model_dump(mode="json")), [], str(e)
    return _adaptive_only_when_on(eff.model_dump(mode="json")), warnings, None


def _adaptive_only_when_on(effective: dict[str, Any]) -> dict[str, Any]:
    if not effective.get(ADAPTIVE):
        effective.pop(ADAPTIVE, None)
    return natural_unmarked(effective)
