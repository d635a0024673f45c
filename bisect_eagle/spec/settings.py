"""Settings of one live trial and trial identity.

A trial is identified by the fingerprint of its *effective* settings, so two requests that an engine
runs identically (e.g. ``topk = 1`` with any ``num_draft_tokens``: SGLang forces ``num_steps + 1``,
a rule of :mod:`bisect_eagle.engines.sglang.rules`) are one trial and are never measured twice.

``speculative_adaptive`` is SGLang's ``--speculative-adaptive`` (``num_steps`` picked at run time
per batch-size bucket; ``docs/sglang-facts.md#speculative-adaptive``). It has one spelling in a
validated :class:`LiveSettings`: ``server_args.speculative_adaptive`` (how it was passed before it
was a field) is folded into the field, and giving both is refused, so one request never carries two
meanings of the same flag.

``pinned_acceptance`` pins acceptance instead of measuring it: one *unconditional* rate per draft
position (rate ``k`` = P(drafts 0..k all accepted), non-increasing, each in [0, 1], ``num_steps`` of
them), so the trial's accept length is ``1 + sum(rates)`` whatever the wiring, and its tok/s
measures the cost side alone (every draft and verify forward still runs). ``None`` (the default) is
natural acceptance. :func:`profile_for_accept_length` makes a profile from a mean accept length
(vLLM's minimum-variance schedule, which SGLang's ``match-expected`` simulation also draws);
:func:`unconditional_rates` turns a measured conditional curve (what the engines report as
``accept_rate_per_position``) into one.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from bisect_eagle.artifacts.configs import validation_error
from bisect_eagle.errors import BadInput
from bisect_eagle.keys import IDS_KEY

NUMERIC = (
    "num_steps",
    "topk",
    "num_draft_tokens",
    "max_new_tokens",
    "num_prompts",
    "warmup_prompts",
    "concurrency",
    "temperature",
)
ADAPTIVE = "speculative_adaptive"
PINNED = "pinned_acceptance"


# SGLang 0.5.23's (and vLLM's) --dtype names → the torch dtype an in-process trial runs in ("auto":
# the model's own dtype on a server; float32 in process, as ``bisect-eagle serve`` does)
TORCH_DTYPE_NAMES = {
    "auto": "float32",
    "half": "float16",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "float": "float32",
    "float32": "float32",
}


def torch_dtype_name(dtype: str) -> str:
    """The torch dtype name (``float32``, ``float16``, ``bfloat16``) an in-process trial runs
    ``dtype`` in.

    Args:
        dtype: a ``--dtype`` name :class:`LiveSettings` accepts (``auto``, ``half``, ``float16``,
            ``bfloat16``, ``float``, ``float32``).

    Returns:
        The torch dtype's name; ``auto`` runs in float32 in process.
    """
    return TORCH_DTYPE_NAMES[dtype]


MAX_VALUE = 4096  # characters of one setting's value (an environment variable, a flag)
Scalar = Annotated[str, Field(max_length=MAX_VALUE)] | bool | int | float | None


class LiveSettings(BaseModel):
    """What a live trial may vary. Layer ids use SGLang's convention (output of layer L; -1 =
    embedding)."""

    model_config = ConfigDict(extra="forbid")

    speculative_algorithm: Literal["EAGLE3", "EAGLE", "none"] = "EAGLE3"
    eagle_aux_hidden_state_layer_ids: list[int] | None = None  # None = the draft's own config
    # 0 only for the baseline (the spec refuses it for a speculative trial)
    num_steps: int = Field(3, ge=0)
    topk: int = Field(1, ge=0)
    num_draft_tokens: int | None = Field(None, ge=0)
    max_new_tokens: int = Field(64, ge=1)
    num_prompts: int = Field(8, ge=1)
    warmup_prompts: int = Field(2, ge=0)
    concurrency: int = Field(1, ge=1)
    temperature: float = Field(0.0, ge=0, allow_inf_nan=False)
    # SGLang's --speculative-adaptive (module docstring)
    speculative_adaptive: bool = Field(False, strict=True)
    device: str = "cpu"
    # SGLang's --dtype choices
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = "float32"
    env: dict[str, Annotated[str, Field(max_length=MAX_VALUE)]] = Field(default_factory=dict)
    # flag values as a command line holds them: scalars, or lists of scalars for nargs flags
    server_args: dict[str, Scalar | list[Scalar]] = Field(default_factory=dict)
    # unconditional acceptance per draft position (module docstring); None = natural acceptance
    pinned_acceptance: list[Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]] | None = None

    @model_validator(mode="before")
    @classmethod
    def _one_adaptive(cls, values: Any) -> Any:
        """``server_args.speculative_adaptive`` is the field spelled as a flag: folded into it (null
        = unset)."""
        if (
            not isinstance(values, dict)
            or not isinstance(values.get("server_args"), dict)
            or ADAPTIVE not in values["server_args"]
        ):
            return values
        server_args = dict(values["server_args"])
        flag = server_args.pop(ADAPTIVE)
        if ADAPTIVE in values and flag is not None:
            raise ValueError(
                f"{ADAPTIVE} and server_args.{ADAPTIVE} are the same SGLang flag "
                f"(--speculative-adaptive); give it once, as {ADAPTIVE}"
            )
        return {**values, "server_args": server_args, **({} if flag is None else {ADAPTIVE: flag})}

    @field_validator(PINNED, mode="before")
    @classmethod
    def _rates(cls, value: Any) -> Any:
        """A profile as written: a list of numbers (not booleans), non-increasing."""
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            raise ValueError(
                "expected one acceptance rate per draft position like [1.0, 0.8, 0.5], found the "
                f"number {value!r} (an accept length? bisect-eagle live --pin-acceptance {value} "
                "converts one)"
            )
        if isinstance(value, list):
            if any(isinstance(v, bool) for v in value):
                raise ValueError("expected acceptance rates in [0, 1], found a boolean")
            if value and all(isinstance(v, (int, float)) for v in value):
                check_profile(value)
        return value

    @model_validator(mode="after")
    def _profile_fits(self) -> LiveSettings:
        """A pinned profile has one rate per draft step, and only a speculative trial has drafts to
        accept."""
        rates = self.pinned_acceptance
        if rates is None:
            return self
        if self.is_baseline:
            raise ValueError(
                f"{PINNED} pins the acceptance of draft tokens; the baseline "
                "(speculative_algorithm none) drafts none"
            )
        if len(rates) != self.num_steps:
            raise ValueError(
                f"{PINNED} has {len(rates)} rates but num_steps is {self.num_steps}: give one "
                "unconditional rate per draft position"
            )
        return self

    @field_validator(*NUMERIC, mode="before")
    @classmethod
    def _not_bool(cls, value: Any) -> Any:
        """YAML's ``true`` is not a count (pydantic would read it as 1)."""
        if isinstance(value, bool):
            raise ValueError("expected a number, found a boolean")
        return value

    @field_validator(IDS_KEY, mode="before")
    @classmethod
    def _id_list(cls, value: Any) -> Any:
        return check_id_list(value)

    @property
    def is_baseline(self) -> bool:
        return self.speculative_algorithm == "none"

    @property
    def pinned(self) -> bool:
        """Whether acceptance is pinned (``pinned_acceptance``) rather than natural."""
        return self.pinned_acceptance is not None


def check_profile(rates: list[float]) -> None:
    """Raise ``ValueError`` unless ``rates`` is a non-empty, non-increasing list of rates in [0,
    1]."""
    if not rates:
        raise ValueError("expected at least one acceptance rate")
    bad = [r for r in rates if not 0 <= r <= 1]
    if bad:
        raise ValueError(f"acceptance rates must be in [0, 1], found {bad[0]!r}")
    rising = next((k for k in range(1, len(rates)) if rates[k] > rates[k - 1]), None)
    if rising is not None:
        raise ValueError(
            f"unconditional acceptance rates must be non-increasing (position {rising} cannot be "
            f"accepted more often than position {rising - 1}), found {rates}"
        )


def profile_for_accept_length(accept_length: float, num_steps: int) -> list[float]:
    """The non-increasing unconditional profile of ``num_steps`` rates whose accept length is
    ``accept_length``.

    The minimum-variance schedule (vLLM's ``synthetic_acceptance_length``; SGLang's
    ``match-expected`` simulation draws the same per-step counts): every position up to
    ``floor(accept_length - 1)`` always accepted, the next one with the fractional remainder, the
    rest never. ``1 + sum(profile) == accept_length``.

    Args:
        accept_length: tokens per verify step, the bonus token included: in ``[1, 1 + num_steps]``.
        num_steps: draft positions (≥ 1).

    Returns:
        ``num_steps`` rates in [0, 1], non-increasing.

    Raises:
        BadInput: ``accept_length`` outside ``[1, 1 + num_steps]`` or not finite, or ``num_steps <
            1``.
    """
    if num_steps < 1:
        raise BadInput(f"pinned acceptance needs draft steps; num_steps is {num_steps}")
    if not math.isfinite(accept_length) or not 1 <= accept_length <= 1 + num_steps:
        raise BadInput(
            f"accept length {accept_length!r} cannot be pinned with num_steps {num_steps}: it "
            f"counts the bonus token, so it lies in [1, {1 + num_steps}] (at most every draft "
            "accepted, plus one)"
        )
    drafts = accept_length - 1
    full = min(int(drafts), num_steps)
    return ([1.0] * full + [round(drafts - full, 12)] + [0.0] * num_steps)[:num_steps]


def unconditional_rates(conditional: list[float]) -> list[float]:
    """Per-position conditional rates ``P(k accepted | k-1 accepted)`` (each engine's
    ``accept_rate_per_position``) as unconditional ones ``P(0..k all accepted)``: their running
    product. A position no draft reached (NaN) and every one after it gets rate 0 (nothing measured
    there is accepted).

    Args:
        conditional: the measured curve, position 0 first.

    Returns:
        A profile for ``pinned_acceptance`` (non-increasing, in [0, 1], as long as ``conditional``).
    """
    out, running = [], 1.0
    for rate in conditional:
        running = (
            0.0 if rate is None or not math.isfinite(rate) else running * min(1.0, max(0.0, rate))
        )
        out.append(running)
    return out


def check_id_list(value: Any) -> Any:
    """A layer-id list as written (pydantic validator body): a list, not ``"1,5,9"``, with no
    repeated id."""
    if isinstance(value, str):
        raise ValueError(f"expected a list of layer ids like [1, 5, 9], found the string {value!r}")
    if isinstance(value, list):
        if any(isinstance(v, bool) for v in value):
            raise ValueError("expected integer layer ids, found a boolean")
        repeated = [
            v for i, v in enumerate(value) if isinstance(v, (int, float, str)) and v in value[:i]
        ]
        if repeated:
            raise ValueError(f"layer id {repeated[0]!r} repeats; each layer is captured once")
    return value


def parse_settings(values: dict[str, Any], where: str) -> LiveSettings:
    """Validate a settings mapping; errors name ``where`` (a file or flag), the key and the
    expectation.

    Args:
        values: :class:`LiveSettings` fields by name (``env`` and ``server_args`` as dicts).
        where: what the values came from (a file and key, or a flag).

    Returns:
        The validated settings.

    Raises:
        BadInput: an unknown key or a value the schema refuses, one line naming ``where`` and the
            key.
    """
    try:
        return LiveSettings.model_validate(values)
    except ValidationError as e:
        raise validation_error(e, where=where) from None
