"""What a running server reports about itself, turned into the trial's effective settings and its
metrics.

The plan already holds what SGLang's resolution decided; ``/server_info`` confirms it on the live
server (``resolved_dict``; see ``docs/sglang-facts.md#http-endpoints``). A value the server runs
differently from the plan becomes a warning on the trial. ``/server_info`` also carries the launch
command, so only the keys in :data:`SERVER_KEYS` are kept, redacted by name.

Accept length follows SGLang's own ``spec_accept_length``: completion tokens over verify steps
(``spec_verify_ct``), the prefill token included
(``docs/sglang-facts.md#accept-length-and-metrics``); a request that ends on its prefill token
reports no ``spec_verify_ct`` and counts as 0 verify steps.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from typing import Any

from bisect_eagle.engines.sglang.client import Completion
from bisect_eagle.keys import IDS_KEY
from bisect_eagle.tracking.redact import redact_mapping

SERVER_INFO_FIELDS = {  # effective field -> /server_info key
    "speculative_algorithm": "speculative_algorithm",
    "num_steps": "speculative_num_steps",
    "topk": "speculative_eagle_topk",
    "num_draft_tokens": "speculative_num_draft_tokens",
    IDS_KEY: IDS_KEY,  # bisect-eagle serve only
    "device": "device",
    "dtype": "dtype",
    # only where the plan kept it on (SGLang may turn it off)
    "speculative_adaptive": "speculative_adaptive",
}
SPECULATIVE_FIELDS = ("num_steps", "topk", "num_draft_tokens", IDS_KEY)
SERVER_KEYS = (  # what the server says about itself, recorded under effective["server"]
    "version",
    "max_running_requests",
    "tp_size",
    "dp_size",
    "ep_size",
    "attention_backend",
    "speculative_draft_attention_backend",
    "cuda_graph_max_bs",
    "cuda_graph_max_bs_decode",
    "disable_custom_all_reduce",
    "enable_nccl_nvls",
    "enable_symm_mem",
    "mem_fraction_static",
    "page_size",
    "chunked_prefill_size",
    "disable_overlap_schedule",
    "aux_hidden_state_indices",
    "speculative_adaptive",
)


def server_summary(info: dict) -> dict[str, Any]:
    """The part of ``/server_info`` worth recording (never its launch command), secret-named keys
    redacted."""
    return redact_mapping({k: info[k] for k in SERVER_KEYS if k in info})


def effective_from_server(planned: dict[str, Any], info: dict, *, baseline: bool) -> dict[str, Any]:
    """The plan's effective settings overlaid with what the server reports running.

    Args:
        planned: the plan's effective settings.
        info: the server's /server_info answer.
        baseline: whether the trial is the baseline (its speculative fields stay as planned).

    Returns:
        A new dict: the reported fields, ``concurrency`` capped at ``max_running_requests``, and
        ``server`` with the server's summary.
    """
    out = dict(planned)
    for name, key in SERVER_INFO_FIELDS.items():
        if key in info and name in out and not (baseline and name in SPECULATIVE_FIELDS):
            out[name] = info[key]
    if out.get("speculative_algorithm") is None:
        out["speculative_algorithm"] = "none"
    mrr = info.get("max_running_requests")
    if (
        isinstance(mrr, int)
        and isinstance(out.get("concurrency"), int)
        and mrr < out["concurrency"]
    ):
        out["concurrency"] = mrr
    server = dict(out.get("server") or {})
    server.update(server_summary(info))
    out["server"] = server
    return out


def readback_differences(planned: dict[str, Any], effective: dict[str, Any]) -> list[str]:
    """Warnings for the settings SGLang's ``/server_info`` reports differently from the plan.

    Args:
        planned: the plan's effective settings (its ``server`` mapping: the planned server fields).
        effective: :func:`effective_from_server` of the running server.

    Returns:
        One warning per speculative or server field that differs; a planned None is not compared.
    """
    notes = []
    for key, want in planned.items():
        if key in ("server", "env", "server_args") or want is None or key not in effective:
            continue
        if effective[key] != want:
            notes.append(
                f"effective {key} = {effective[key]!r}, planned {want!r} (read back from "
                "/server_info)"
            )
    for key, want in (planned.get("server") or {}).items():
        got = effective.get("server", {}).get(key, want)
        if want is not None and got != want:
            notes.append(
                f"server reports {key} = {got!r}, planned {want!r} (read back from /server_info)"
            )
    return notes


def hist_and_rates(
    completions: Sequence[Completion], num_steps: int
) -> tuple[dict[int, int], list[float]]:
    """Tokens-per-verify-step histogram and P(draft k accepted | drafts before it accepted).

    Exact when the server lists each step (``bisect-eagle serve``); from SGLang's correct-drafts
    histogram otherwise, where a step is assumed to have proposed ``num_steps`` drafts.
    """
    steps: list[tuple[int, int]] = []  # (drafts proposed, tokens emitted)
    for c in completions:
        emitted, drafted = (
            c.meta.get("bisect_eagle_accepted_per_step"),
            c.meta.get("bisect_eagle_drafted_per_step"),
        )
        if isinstance(emitted, list) and isinstance(drafted, list):
            steps += list(zip(drafted, emitted, strict=True))
        elif c.histogram is not None:
            steps += [
                (num_steps, correct + 1) for correct, n in enumerate(c.histogram) for _ in range(n)
            ]
    hist = dict(sorted(Counter(e for _, e in steps).items()))
    reached, passed = [0] * num_steps, [0] * num_steps
    for drafted, emitted in steps:
        for k in range(min(drafted, emitted, num_steps)):
            reached[k] += 1
            passed[k] += k < emitted - 1
    return hist, [p / r if r else float("nan") for p, r in zip(passed, reached, strict=True)]


def server_accept_length(info: dict) -> float | None:
    """Mean over DP ranks of the server's own ``avg_spec_accept_length`` (None when not reported).

    SGLang folds it in only every 40 decode batches, so it is stale or absent on short runs: a
    cross-check.

    Args:
        info: the server's /server_info answer.

    Returns:
        The mean, or None.
    """
    states = info.get("internal_states")
    if not isinstance(states, list):
        return None
    values = [
        s["avg_spec_accept_length"]
        for s in states
        if isinstance(s, dict) and isinstance(s.get("avg_spec_accept_length"), (int, float))
    ]
    return statistics.fmean(values) if values else None
