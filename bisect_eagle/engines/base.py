"""The engine interface: ``LiveSettings`` → :meth:`Engine.plan` → :class:`TrialPlan` → :meth:`Engine.run` →
:class:`TrialResult`.

The plan is the engine's own statement of what it will run (effective settings, identity, warnings, the
launch where there is one); planning is cheap and never loads a model, starts a server or writes a file.

Every engine (``local``: in-process PyTorch; ``sglang``: one server per trial) measures the same way:
warm-up requests excluded, wall-clock output tokens per second over the measured requests, accept length
per verify step (accepted drafts + the bonus token), and the effective settings next to the requested ones.
A trial that fails is a result with ``status = "failed"`` and a failure class, never an exception, so a
study goes on; only bad input raises (:class:`~bisect_eagle.errors.BadInput`).

An engine that can run the baseline and a speculative config on the same prompts, interleaved per prompt,
implements :meth:`Engine.run_paired` (the local engine does): a :class:`PairedResult` with the geometric mean
of the per-prompt tok/s ratios and its confidence interval, which a drift of the machine's load cancels from.
"""

from __future__ import annotations

import abc
import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

from bisect_eagle.engines.plan import TrialPlan
from bisect_eagle.errors import BadInput
from bisect_eagle.perf.benchmark import STEADY_STATE, Benchmark
from bisect_eagle.spec.schema import Spec
from bisect_eagle.spec.settings import LiveSettings

Status = Literal["ok", "failed"]
FailureClass = Literal[
    "bad_arguments",  # the server exited before ready with an argument error
    "out_of_memory",
    "capture_error",  # aux hidden-state capture or draft config error ("captured 2 of 3 ...")
    "readiness_timeout",
    "crash_during_benchmark",
    "hung_request",
    "launch_error",  # exited before ready for another reason
]
FAILURE_CLASSES: tuple[FailureClass, ...] = get_args(FailureClass)


@dataclass(kw_only=True)
class RequestRecord:
    """One measured request."""

    id: str
    prompt_tokens: int
    completion_tokens: int
    verify_steps: int  # target verify forwards (SGLang's spec_verify_ct); = completion_tokens for no-spec
    latency_s: float

    @property
    def accept_length(self) -> float:
        return self.completion_tokens / self.verify_steps if self.verify_steps else float("nan")


@dataclass(kw_only=True)
class TrialResult:
    """What one live trial measured (or why it failed)."""

    engine: str
    status: Status
    requested: dict[str, Any]
    effective: dict[str, Any]
    output_tok_s: float = float("nan")
    accept_length: float = float("nan")  # Σ completion tokens / Σ verify steps over measured requests
    accept_length_hist: dict[int, int] = field(default_factory=dict)  # tokens per verify step -> count
    accept_rate_per_position: list[float] = field(default_factory=list)  # P(draft k accepted | k-1 accepted)
    requests: list[RequestRecord] = field(default_factory=list)
    wall_s: float = 0.0
    model_s: float = 0.0  # time inside model forwards (local engine), for overhead accounting
    server_accept_length: float | None = None  # the server's own counter, as a cross-check (sglang)
    failure_class: FailureClass | None = None
    failure_detail: str | None = None
    warnings: list[str] = field(default_factory=list)
    artifacts: dict[str, str] = field(default_factory=dict)  # file name -> text (launch command, logs, ...)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def metrics(self) -> dict[str, float]:
        """Flat numeric metrics for tracking."""
        out = {"output_tok_s": self.output_tok_s, "accept_length": self.accept_length, "wall_s": self.wall_s}
        for k, rate in enumerate(self.accept_rate_per_position):
            out[f"accept_rate_pos_{k}"] = rate
        if self.requests:
            out["latency_s_median"] = statistics.median(r.latency_s for r in self.requests)
            out["completion_tokens"] = float(sum(r.completion_tokens for r in self.requests))
        if self.server_accept_length is not None:
            out["server_accept_length"] = self.server_accept_length
        return out

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["requests"] = [{**asdict(r), "accept_length": r.accept_length} for r in self.requests]
        d["accept_length_hist"] = {str(k): v for k, v in sorted(self.accept_length_hist.items())}
        return d


@dataclass(kw_only=True)
class PairedResult:
    """A speculative trial and the baseline on the same prompts, interleaved per prompt (:meth:`Engine.run_paired`).

    ``ratios[i]`` is prompt i's speculative tok/s ÷ its baseline tok/s; ``speedup`` their geometric mean;
    ``lower``/``upper`` its two-sided ``confidence`` interval (Student t on the log ratios; equal to
    ``speedup`` with fewer than two prompts).
    """

    candidate: TrialResult
    baseline: TrialResult
    ratios: list[float]
    speedup: float
    lower: float
    upper: float
    confidence: float

    def to_json(self) -> dict[str, Any]:
        return {"speedup": self.speedup, "lower": self.lower, "upper": self.upper, "confidence": self.confidence,
                "ratios": self.ratios}


def failed(engine: str, *, requested: dict, effective: dict, cls: FailureClass, detail: str,
           **extra: Any) -> TrialResult:
    """A failed trial of a known class.

    Args:
        engine: the engine's name (:attr:`Engine.name`).
        requested, effective: the plan's requested and effective settings (redacted).
        cls: one of :data:`FAILURE_CLASSES` (anything else raises ``ValueError``).
        detail: why, for a person (a server's log tail, the exception).
        extra: any other :class:`TrialResult` field (``warnings``, ``artifacts`` ...).
    """
    if cls not in FAILURE_CLASSES:
        raise ValueError(f"unknown failure class {cls!r}")
    return TrialResult(engine=engine, status="failed", requested=requested, effective=effective, failure_class=cls,
                       failure_detail=detail, **extra)


class Engine(abc.ABC):
    """Plans and runs live trials. Engines may keep models loaded between trials; ``close`` releases everything.

    Construction and :meth:`plan` are cheap (no model load, no server, no file written); models load on the
    first :meth:`run`.
    """

    name: str
    benchmark: ClassVar[Benchmark] = STEADY_STATE  # how a trial's tok/s is measured: the throughput model to fit
    reads_t2d: ClassVar[bool] = False  # whether decoding maps target tokens into the draft vocabulary with ``t2d``
    # whose loader reads the draft's layer ids and whose capture rules apply: "sglang", "vllm" (the frameworks'
    # config readers, bisect_eagle.artifacts.draft.config) or "local" (bisect-eagle's own decoder)
    id_reader: ClassVar[str] = "sglang"
    # metrics one measurement of a plan gives exactly (greedy accept length on an engine whose decoding is
    # bit-reproducible): the confirmation and the bisect measure them once (bisect_eagle.stats.deterministic)
    deterministic_metrics: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_spec(cls, spec: Spec, log_dir: Path) -> Engine:
        """The engine of ``spec`` (cheap: nothing loads, starts or is written), keeping per-trial logs in ``log_dir``.

        Raises:
            BadInput: the spec lacks what this engine needs, or this engine is not built from specs.
        """
        raise BadInput(f"the {cls.name} engine is not built from a spec")

    @classmethod
    def versions(cls, spec: Spec) -> dict[str, str]:
        """Versions of what this engine runs that this interpreter's packages do not name (a server in an
        environment of its own), as a study's parent-run params (``version.<name>``); cheap, never raises."""
        return {}

    @classmethod
    def export(cls, spec: Spec, settings: LiveSettings, *, effective: Mapping[str, Any], port: int,
               python: str | None = None) -> dict[str, Any]:
        """How to serve a logged trial of this engine on a server: the launch that runs what it measured.

        Args:
            spec: the study's spec (its target, draft and ``engine.sglang`` server settings).
            settings: the settings the trial requested (as logged: secret values redacted).
            effective: the effective settings of the trial's plan (as logged): what was measured.
            port: the exported server's port.
            python: an interpreter that has the server (its parser checks the command); default the spec's.

        Returns:
            ``argv``, ``command`` (one shell line), ``env`` (secret values as ``$NAME``), ``draft_config`` and
            ``draft_config_patch`` (None for the baseline / the draft's own ids), ``checked``, ``refusal``,
            ``fingerprint`` and ``warnings`` of the served plan.

        Raises:
            BadInput: this engine has no export.
        """
        raise BadInput(f"the {cls.name} engine has no export")

    @abc.abstractmethod
    def plan(self, settings: LiveSettings) -> TrialPlan:
        """What this engine will run for ``settings``: effective settings, fingerprint, warnings or a refusal."""

    @abc.abstractmethod
    def run(self, plan: TrialPlan) -> TrialResult:
        """Run one planned live trial (a no-speculation baseline when ``plan.is_baseline``).

        A refused plan (``plan.refusal``) raises :class:`~bisect_eagle.errors.BadInput`; callers check first.
        """

    def run_paired(self, plan: TrialPlan, baseline: TrialPlan, *, confidence: float = 0.95) -> PairedResult | None:
        """``plan`` and the no-speculation ``baseline`` on the same prompts, interleaved per prompt; None when
        this engine cannot pair them (each is then measured with :meth:`run`)."""
        return None

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Release models, servers and ports."""

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
