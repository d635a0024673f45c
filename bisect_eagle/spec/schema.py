"""Experiment spec: one YAML file says what to load, what may vary, what counts as success and where to log.

Validated with pydantic; an unknown key or a bad value is a :class:`BadInput` naming the file, the key,
what was expected and what was found. Relative paths are resolved against the spec file's directory.
``scenario: tiny`` fills target, draft, dump, prompts and the dump's layers from a shipped scenario.

Setting names (in ``engine.settings``, ``space`` and ``groups``) are :class:`LiveSettings` fields, or
``env.NAME`` for an environment variable of the server, or ``server_args.flag_name`` for a server flag.
The wiring (``eagle_aux_hidden_state_layer_ids``) is searched through ``standalone.wirings`` (gated by
standalone accuracy) or, without wirings, as an ordinary categorical of layer-id lists in ``space``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from bisect_eagle.errors import BadInput
from bisect_eagle.spec.settings import ADAPTIVE, LiveSettings, check_id_list, parse_settings

WIRING_SETTING = "eagle_aux_hidden_state_layer_ids"
CRITERION_METRICS = ("output_tok_s", "accept_length")
DEFAULT_SPEC = Path(__file__).resolve().parents[1] / "search" / "default_spec.yaml"
SPECULATIVE_COUNTS = ("num_steps", "topk")  # >= 1 in every speculative trial (0 is the baseline's)
ADAPTIVE_FLAG = f"server_args.{ADAPTIVE}"  # the field spelled as a flag, folded into it (settings.py)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Wiring(_Strict):
    """A candidate wiring: a rule over the dump's states, or layer ids (SGLang convention) to recompute."""

    rule: str | None = None
    layer_ids: list[int] | None = None
    name: str | None = None

    @field_validator("layer_ids", mode="before")
    @classmethod
    def _ids(cls, value: Any) -> Any:
        return check_id_list(value)

    @model_validator(mode="after")
    def _one_of(self) -> Wiring:
        if (self.rule is None) == (self.layer_ids is None):
            raise ValueError("give exactly one of 'rule' or 'layer_ids'")
        return self

    @property
    def label(self) -> str:
        return self.name or (self.rule if self.rule is not None else str(self.layer_ids))


class StandaloneStage(_Strict):
    """Stage 1: cheap standalone accuracy of each candidate wiring, and the gate to stage 2."""

    wirings: list[Wiring] = Field(default_factory=list)
    margin: float = Field(0.05, ge=0, le=1, description="keep wirings within this accuracy of the reference")
    reference: Literal["best", "training"] = "best"
    metric: Literal["full_vocab", "draft_vocab"] = "full_vocab"
    samples: int = Field(0, ge=0)
    steps: int = Field(3, ge=1)


class Param(_Strict):
    """One searched setting; ``when`` makes it conditional on other settings' values."""

    type: Literal["categorical", "int", "float"]
    choices: list[Any] | None = None
    low: float | None = None
    high: float | None = None
    step: float | None = None
    log: bool = False
    when: dict[str, list[Any]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _shape(self) -> Param:
        if self.type == "categorical":
            if not self.choices:
                raise ValueError("a categorical parameter needs a non-empty 'choices' list")
        elif self.low is None or self.high is None or self.low > self.high:
            raise ValueError(f"an {self.type} parameter needs 'low' <= 'high'")
        if self.type == "int" and any(v is not None and v != int(v) for v in (self.low, self.high, self.step)):
            raise ValueError("an int parameter needs integer 'low', 'high' and 'step'")
        if self.step is not None and self.step <= 0:
            raise ValueError("'step' must be > 0")
        if self.log and self.type != "categorical" and self.low <= 0:
            raise ValueError("a log-scaled parameter needs 'low' > 0")
        return self


class Criterion(_Strict):
    """Success: ``metric >= ratio × baseline`` (the incident's "reach the baseline tok/s" is ratio 1.0)."""

    metric: Literal["output_tok_s", "accept_length"] = "output_tok_s"
    ratio: float = Field(1.0, gt=0)


class Confirm(_Strict):
    """Before "target reached": the candidate and the baseline re-measured interleaved (A, B, A, B, ...) until a
    one-sided lower confidence bound on their ratio clears the criterion ratio, or ``max_pairs`` are spent
    (:mod:`bisect_eagle.search.study.confirm`). Not counted as live trials."""

    enabled: bool = True
    confidence: float = Field(0.95, gt=0, lt=1, description="one-sided, over all looks (union bound)")
    min_pairs: int = Field(3, ge=2, description="pairs before the first look")
    max_pairs: int = Field(12, ge=2, description="pair budget per candidate (looks at min_pairs, doubling)")


class Model(_Strict):
    """The throughput model in the search (:mod:`bisect_eagle.search.study.guide`): each untried config's tok/s
    (or accept length) predicted from stage 1 and the trials so far; the most likely to reach the target runs
    next, and a config whose ``optimism`` quantile misses the target is never launched."""

    enabled: bool = True
    optimism: float = Field(0.98, gt=0.5, lt=1, description="quantile of the prediction a skipped config misses")


class Search(_Strict):
    """Stage 2: the sampler, its seed and the budget (live trials count measured configs, not the baseline)."""

    sampler: Literal["tpe", "grid", "random"] = "tpe"
    seed: int = 0
    startup_trials: int = Field(10, ge=1, description="TPE's random start-up trials")
    max_live_trials: int = Field(20, ge=1)
    max_wall_s: float = Field(1800, gt=0)
    repeats: int = Field(1, ge=1, description="measurements per live config (median, MAD)")
    prune_below: float | None = Field(
        None, gt=0, le=1,
        description="with repeats > 1: stop repeating a config whose first measurement is below this "
        "fraction of the target (the trial is pruned)")
    confirm: Confirm = Field(default_factory=Confirm)
    model: Model = Field(default_factory=Model)


class Storage(_Strict):
    optuna: str | None = None  # SQLAlchemy URL; default sqlite:///mlruns/optuna.db
    tracking_uri: str | None = None  # default sqlite:///mlruns/mlflow.db, or $MLFLOW_TRACKING_URI
    study_name: str | None = None  # default: the spec's name and the start time


class SglangServer(_Strict):
    """How the sglang engine launches, waits for and stops one server per trial."""

    launch_command: list[str] = Field(default_factory=lambda: ["python", "-m", "sglang.launch_server"])
    python: str | None = None  # the interpreter that has SGLang (its own environment); replaces a leading python
    model_path: str | None = None  # default: the spec's target
    tp: int = Field(1, ge=1)
    host: str = "127.0.0.1"
    ready_timeout_s: float = Field(900, gt=0)
    request_timeout_s: float = Field(300, gt=0)
    stop_grace_s: float = Field(60, ge=0)
    gpu_release_timeout_s: float = Field(180, ge=0)
    extra_args: list[str] = Field(default_factory=list)


class EngineSpec(_Strict):
    kind: Literal["local", "sglang"] = "local"
    settings: dict[str, Any] = Field(default_factory=dict)  # fixed LiveSettings values
    sglang: SglangServer = Field(default_factory=SglangServer)


class Spec(_Strict):
    """A whole experiment."""

    name: str = Field(min_length=1)
    description: str = ""
    scenario: str | None = None
    target: Path | None = None
    draft: Path | None = None
    dump: Path | None = None
    prompts: Path | None = None
    dump_layer_ids: list[int] | None = None  # SGLang ids of the dump's aux states (the final state is implied)
    training_accuracy: float | None = Field(None, ge=0, le=1)
    engine: EngineSpec = Field(default_factory=EngineSpec)
    baseline: float | Literal["measure"] = "measure"
    criterion: Criterion = Field(default_factory=Criterion)
    standalone: StandaloneStage = Field(default_factory=StandaloneStage)
    space: dict[str, Param] = Field(default_factory=dict)
    groups: list[list[str]] = Field(default_factory=list)
    search: Search = Field(default_factory=Search)
    storage: Storage = Field(default_factory=Storage)
    source: Path | None = Field(None, exclude=True)

    @field_validator("dump_layer_ids", mode="before")
    @classmethod
    def _ids(cls, value: Any) -> Any:
        return check_id_list(value)

    @field_validator("baseline", mode="before")
    @classmethod
    def _baseline(cls, value: Any) -> Any:
        if isinstance(value, bool) or (isinstance(value, (int, float)) and not (math.isfinite(value) and value > 0)):
            raise ValueError("expected a positive finite number of the criterion's metric, or 'measure'")
        return value

    def fixed_settings(self) -> LiveSettings:
        """The engine's fixed settings as validated :class:`LiveSettings`."""
        return settings_from(self.engine.settings, f"{self.source}: engine.settings")

    def paths(self) -> dict[str, Path]:
        """target, draft, dump and prompts; an error names the missing one."""
        out = {}
        for key in ("target", "draft", "dump", "prompts"):
            value = getattr(self, key)
            if value is None:
                raise BadInput(f"{self.source}: key {key!r} is missing (give a path, or 'scenario: NAME')")
            out[key] = value
        return out


def settings_from(values: dict[str, Any], where: str) -> LiveSettings:
    """Settings from names as a spec writes them (``env.NAME``/``server_args.flag`` or nested dicts).

    A value of ``None`` for ``env.NAME`` or ``server_args.flag`` leaves that variable or flag unset.
    """
    nested: dict[str, Any] = {}
    for name, value in values.items():
        kind, _, key = name.partition(".")
        if kind in ("env", "server_args") and key:
            if value is not None:
                if kind == "env" and not isinstance(value, str):
                    value = _env_text(value, f"{where}: key {name!r}")
                nested.setdefault(kind, {})[key] = value
        elif name in ("env", "server_args") and isinstance(value, dict):
            nested.setdefault(name, {}).update(value)
        else:
            nested[name] = value
    return parse_settings(nested, where)


def _env_text(value: Any, where: str) -> str:
    """Environment values are strings; numbers and booleans are written the way a shell would."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, float)) and not (isinstance(value, float) and math.isnan(value)):
        return str(value)
    raise BadInput(f"{where}: expected a string (or number) for an environment variable, found {value!r}")


def check_setting_name(name: str, where: str) -> None:
    """A setting name must be a LiveSettings field, ``env.NAME`` or ``server_args.flag``."""
    if name.startswith(("env.", "server_args.")) and len(name.split(".", 1)[1]) > 0:
        return
    if name in LiveSettings.model_fields and name not in ("env", "server_args"):
        return
    fields = ", ".join(k for k in LiveSettings.model_fields if k not in ("env", "server_args"))
    raise BadInput(f"{where}: unknown setting {name!r}; expected one of {fields}, env.NAME or server_args.flag")
