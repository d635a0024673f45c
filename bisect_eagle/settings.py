"""Settings of one live trial, SGLang's own rules that turn requested into effective values, and trial identity.

A trial is identified by the fingerprint of its *effective* settings, so two requests that an engine runs
identically (e.g. ``topk = 1`` with any ``num_draft_tokens``: SGLang forces ``num_steps + 1``) are one
trial and are never measured twice.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bisect_eagle.errors import BadInput

SECRET_MARKERS = ("TOKEN", "KEY", "SECRET", "PASSWORD")


class LiveSettings(BaseModel):
    """What a live trial may vary. Layer ids use SGLang's convention (output of layer L; -1 = embedding)."""

    model_config = ConfigDict(extra="forbid")

    speculative_algorithm: Literal["EAGLE3", "EAGLE", "none"] = "EAGLE3"
    eagle_aux_hidden_state_layer_ids: list[int] | None = None  # None = the draft's own config
    num_steps: int = 3
    topk: int = 1
    num_draft_tokens: int | None = None
    max_new_tokens: int = 64
    num_prompts: int = 8
    warmup_prompts: int = 2
    concurrency: int = 1
    temperature: float = 0.0
    device: str = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    env: dict[str, str] = Field(default_factory=dict)
    server_args: dict[str, Any] = Field(default_factory=dict)

    @property
    def is_baseline(self) -> bool:
        return self.speculative_algorithm == "none"


def parse_settings(values: dict[str, Any], where: str) -> LiveSettings:
    """Validate a settings mapping; errors name ``where`` (a file or flag), the key and the expectation."""
    try:
        return LiveSettings.model_validate(values)
    except ValidationError as e:
        err = e.errors()[0]
        key = ".".join(str(p) for p in err["loc"]) or "(settings)"
        raise BadInput(f"{where}: key {key!r}: {err['msg']} (found {err.get('input')!r})") from None


def apply_speculative_rules(s: LiveSettings) -> tuple[LiveSettings, list[str]]:
    """SGLang's EAGLE-family rules applied to a request: (effective settings, warnings about overrides)."""
    if s.is_baseline:
        return s.model_copy(update={"num_steps": 0, "topk": 0, "num_draft_tokens": 0,
                                    "eagle_aux_hidden_state_layer_ids": None}), []
    if s.num_steps < 1:
        raise BadInput(f"num_steps must be >= 1 for speculative decoding, got {s.num_steps}")
    if s.topk < 1:
        raise BadInput(f"topk must be >= 1, got {s.topk}")
    warnings = []
    ndt = s.num_draft_tokens
    if s.topk == 1 and ndt != s.num_steps + 1:
        if ndt is not None:
            warnings.append(
                f"topk == 1 forces num_draft_tokens = num_steps + 1 = {s.num_steps + 1} "
                f"(requested {ndt}; SGLang overrides it with only a warning)"
            )
        ndt = s.num_steps + 1
    elif ndt is None:
        raise BadInput("num_draft_tokens is required when topk > 1")
    return s.model_copy(update={"num_draft_tokens": ndt}), warnings


def is_secret(name: str) -> bool:
    """Environment variables whose values must never be logged."""
    upper = name.upper()
    return any(m in upper for m in SECRET_MARKERS)


def public_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` without secrets (by name), safe to log."""
    return {k: v for k, v in env.items() if not is_secret(k)}


def trial_fingerprint(effective: dict[str, Any]) -> str:
    """Stable short hash of effective settings (sorted keys, canonical JSON)."""
    blob = json.dumps(effective, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
