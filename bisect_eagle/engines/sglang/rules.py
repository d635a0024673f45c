"""SGLang's speculative rules that the planner applies before asking SGLang itself: how many draft tokens a tree
can select, the step counts of adaptive speculation, and what SGLang's resolution made of an adaptive request; and
the SGLang releases those rules are tested with (:data:`TESTED_SGLANG`; another release is refused, not guessed)."""

from __future__ import annotations

from typing import Any

from bisect_eagle.engines.sglang.oracle_script import ADAPTIVE_OFF
from bisect_eagle.perf.adaptive import DEFAULT_ADAPTIVE_CONFIG
from bisect_eagle.spec.settings import ADAPTIVE, LiveSettings, adaptive_off_warning

TESTED_SGLANG = ("0.5.23",)  # the SGLang releases the planner's rules and the oracle are tested with (pyproject pin)
# the candidate_steps of every bucket of SGLang 0.5.23's DEFAULT_ADAPTIVE_CONFIG (the table's one home: perf/adaptive)
ADAPTIVE_STEPS = tuple(sorted({s for slot in DEFAULT_ADAPTIVE_CONFIG.values() for s in slot["candidate_steps"]}))


def untested_version(version: str | None, where: str) -> str | None:
    """A one-line refusal when the SGLang at ``where`` is a release the planner is not tested with (None: tested or
    unknown). The planner's own rules (the environment SGLang's launcher sets, adaptive candidate steps, the tree
    bound, the capture fallback table) are those releases'; on another one it refuses to guess."""
    if version is None or version in TESTED_SGLANG:
        return None
    return (f"SGLang {version} ({where}) is not a release the sglang planner is tested with "
            f"({', '.join(TESTED_SGLANG)}); its rules would be guesses there: install sglang=={TESTED_SGLANG[-1]} in "
            "that environment (pip install 'bisect-eagle[sglang]') or point engine.sglang.python / --sglang-python "
            "at one")


def tree_bound(s: LiveSettings) -> str | None:
    """SGLang selects ``num_draft_tokens - 1`` of ``topk + (num_steps - 1)·topk²`` tree candidates."""
    if s.is_baseline or s.topk <= 1 or s.num_draft_tokens is None:
        return None
    candidates = s.topk + (s.num_steps - 1) * s.topk ** 2
    if s.num_draft_tokens - 1 > candidates:
        return (f"num_draft_tokens {s.num_draft_tokens} with topk {s.topk} and num_steps {s.num_steps}: SGLang "
                f"selects num_draft_tokens - 1 = {s.num_draft_tokens - 1} of topk + (num_steps - 1)·topk² = "
                f"{candidates} candidates (srt/speculative/eagle_utils.py organize_draft_results) and fails at "
                "draft CUDA-graph capture; lower num_draft_tokens or raise num_steps")
    return None


def adaptive_steps(s: LiveSettings) -> str | None:
    """SGLang's start-up check of adaptive ``num_steps`` against its default config's candidates (when the
    server's own resolution did not run and no ``speculative_adaptive_config`` replaces the defaults)."""
    if not s.speculative_adaptive or s.is_baseline or s.topk != 1 or "speculative_adaptive_config" in s.server_args:
        return None
    if s.num_steps in ADAPTIVE_STEPS:
        return None
    return (f"--speculative-num-steps={s.num_steps} is not in the adaptive config candidate_steps "
            f"{list(ADAPTIVE_STEPS)}. Pass one of those values. (SGLang 0.5.23 refuses to start: "
            "srt/arg_groups/speculative_hook.py _init_adaptive_speculative_params)")


def resolved_adaptive(s: LiveSettings, effective: dict[str, Any], resolved: dict[str, Any] | None) -> list[str]:
    """``speculative_adaptive`` as SGLang resolved it, in ``effective`` (the key only when on); a warning when
    SGLang turned off a mode the project's own rules kept on (those that turned it off already warned)."""
    if resolved is None or s.is_baseline or not effective.get(ADAPTIVE):
        return []
    if resolved.get(ADAPTIVE):
        effective[ADAPTIVE] = True
        return []
    effective.pop(ADAPTIVE, None)
    return [adaptive_off_warning(resolved.get(ADAPTIVE_OFF) or "its settings resolution disabled it")]
