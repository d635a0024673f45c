"""The engine interface: ``LiveSettings`` → :meth:`Engine.plan` → :class:`TrialPlan` →
:meth:`Engine.run` → :class:`TrialResult`.

The plan is the engine's own statement of what it will run (effective settings, identity, warnings,
the launch where there is one); planning is cheap and never loads a model, starts a server or writes
a file.

Every engine (``local``: in-process PyTorch; ``sglang``: one server per trial) measures the same
way: warm-up requests excluded, wall-clock output tokens per second over the measured requests,
accept length per verify step (accepted drafts + the bonus token), and the effective settings next
to the requested ones. A trial that fails is a result with ``status = "failed"`` and a failure
class, never an exception, so a study goes on; only bad input raises
(:class:`~bisect_eagle.errors.BadInput`).

An engine that can run the baseline and a speculative config on the same prompts, interleaved per
prompt, implements :meth:`Engine.run_paired` (the local engine does): a :class:`PairedResult` with
the geometric mean of the per-prompt tok/s ratios and its confidence interval, which a drift of the
machine's load cancels from.

A server engine can measure several benchmark *rounds* on one launch (:meth:`Engine.run_rounds`,
with :attr:`Engine.rounds_share_launch`): the measured requests again on the running server, its
cache flushed between rounds. Rounds cost a benchmark's seconds where a launch costs minutes on a
large target, so the confirmation samples whichever of the two units the measured noise says is
enough (:mod:`bisect_eagle.search.study.confirm`); :func:`combine_rounds` makes one result of them.
"""

from __future__ import annotations

import abc
import dataclasses
import math
import statistics
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

from bisect_eagle.engines.plan import TrialPlan, acceptance_kind
from bisect_eagle.errors import BadInput
from bisect_eagle.perf.benchmark import STEADY_STATE, Benchmark
from bisect_eagle.spec.schema import Spec
from bisect_eagle.spec.settings import LiveSettings
from bisect_eagle.stats import log_values

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
    # target verify forwards (SGLang's spec_verify_ct); = completion_tokens for no-spec
    verify_steps: int
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
    # Σ completion tokens / Σ verify steps over measured requests
    accept_length: float = float("nan")
    # tokens per verify step -> count
    accept_length_hist: dict[int, int] = field(default_factory=dict)
    # conditional: P(draft k accepted | draft k-1 accepted), over the drafts judged
    # (spec.settings.unconditional_rates turns it into a profile for pinned_acceptance)
    accept_rate_per_position: list[float] = field(default_factory=list)
    requests: list[RequestRecord] = field(default_factory=list)
    wall_s: float = 0.0
    model_s: float = 0.0  # time inside model forwards (local engine), for overhead accounting
    server_accept_length: float | None = None  # the server's own counter, as a cross-check (sglang)
    failure_class: FailureClass | None = None
    failure_detail: str | None = None
    warnings: list[str] = field(default_factory=list)
    # file name -> text (launch command, logs, ...)
    artifacts: dict[str, str] = field(default_factory=dict)
    # per benchmark round on this launch (:func:`combine_rounds`): metric -> its value in each round
    round_values: dict[str, list[float]] = field(default_factory=dict)
    # seconds of the launch outside the measured rounds (start, warm-up, teardown)
    launch_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def acceptance(self) -> str:
        """``pinned`` when the trial pinned its acceptance (its accept length was set, its tok/s
        measures cost alone), else ``natural``."""
        return acceptance_kind(self.effective)

    @property
    def rounds(self) -> int:
        """Benchmark rounds this result measured on its launch (1 unless :meth:`Engine.run_rounds`
        ran more)."""
        return max((len(v) for v in self.round_values.values()), default=1)

    def metrics(self) -> dict[str, float]:
        """Flat numeric metrics for tracking.

        Returns:
            Metric name -> value: speed, accept length and wall time always; per-position accept
            rates, request medians and totals, server accept length, per-round spread and launch
            time when known.
        """
        out = {
            "output_tok_s": self.output_tok_s,
            "accept_length": self.accept_length,
            "wall_s": self.wall_s,
        }
        for k, rate in enumerate(self.accept_rate_per_position):
            out[f"accept_rate_pos_{k}"] = rate
        if self.requests:
            out["latency_s_median"] = statistics.median(r.latency_s for r in self.requests)
            out["completion_tokens"] = float(sum(r.completion_tokens for r in self.requests))
        if self.server_accept_length is not None:
            out["server_accept_length"] = self.server_accept_length
        if self.rounds > 1:
            out["rounds"] = float(self.rounds)
            for name, values in self.round_values.items():
                logs = log_values(values)
                if logs is not None:
                    out[f"{name}_round_sd_log"] = statistics.stdev(logs)
        if self.launch_s is not None:
            out["launch_s"] = self.launch_s
        return out

    def to_json(self) -> dict[str, Any]:
        """The result as stored with each trial: every field, with the derived acceptance kind.

        Returns:
            The fields by name, ``acceptance`` and each request's ``accept_length`` added, the
            histogram's keys as strings.
        """
        d = asdict(self)
        d["acceptance"] = self.acceptance
        d["requests"] = [{**asdict(r), "accept_length": r.accept_length} for r in self.requests]
        d["accept_length_hist"] = {str(k): v for k, v in sorted(self.accept_length_hist.items())}
        return d


@dataclass(kw_only=True)
class PairedResult:
    """A speculative trial and the baseline on the same prompts, interleaved per prompt
    (:meth:`Engine.run_paired`).

    ``ratios[i]`` is prompt i's speculative tok/s ÷ its baseline tok/s; ``speedup`` their geometric
    mean; ``lower``/``upper`` its two-sided ``confidence`` interval (Student t on the log ratios;
    equal to ``speedup`` with fewer than two prompts).
    """

    candidate: TrialResult
    baseline: TrialResult
    ratios: list[float]
    speedup: float
    lower: float
    upper: float
    confidence: float

    def to_json(self) -> dict[str, Any]:
        """The speedup, its interval and the per-prompt ratios, JSON-ready.

        Returns:
            ``speedup``, ``lower``, ``upper``, ``confidence`` and ``ratios`` (not the two results).
        """
        return {
            "speedup": self.speedup,
            "lower": self.lower,
            "upper": self.upper,
            "confidence": self.confidence,
            "ratios": self.ratios,
        }


# what each round of a launch records (round_values)
ROUND_METRICS = ("output_tok_s", "accept_length")


def combine_rounds(results: list[TrialResult]) -> TrialResult:
    """One result of benchmark rounds measured on one launch (``results`` in round order, all ok).

    Throughput is the geometric mean of the rounds' tok/s (noise is relative,
    :mod:`bisect_eagle.stats`); accept length the mean of the rounds' own (each engine's definition;
    the rounds measure the same requests); the requests are every round's (ids get a ``@r<round>``
    suffix after the first round); ``round_values`` keeps each round's tok/s and accept length; the
    warnings are every round's, the artifacts the first round's.
    """
    if len(results) == 1:
        return results[0]
    first = results[0]
    requests = [
        dataclasses.replace(q, id=q.id if i == 0 else f"{q.id}@r{i}")
        for i, r in enumerate(results)
        for q in r.requests
    ]
    hist: dict[int, int] = {}
    for r in results:
        for k, v in r.accept_length_hist.items():
            hist[k] = hist.get(k, 0) + v
    logs = log_values([r.output_tok_s for r in results])
    return dataclasses.replace(
        first,
        output_tok_s=math.exp(statistics.fmean(logs)) if logs else float("nan"),
        accept_length=statistics.fmean(r.accept_length for r in results),
        accept_length_hist=hist,
        requests=requests,
        wall_s=sum(r.wall_s for r in results),
        model_s=sum(r.model_s for r in results),
        warnings=list(dict.fromkeys(w for r in results for w in r.warnings)),
        round_values={m: [getattr(r, m) for r in results] for m in ROUND_METRICS},
    )


def failed(
    engine: str, *, requested: dict, effective: dict, cls: FailureClass, detail: str, **extra: Any
) -> TrialResult:
    """A failed trial of a known class.

    Args:
        engine: the engine's name (:attr:`Engine.name`).
        requested, effective: the plan's requested and effective settings (redacted).
        cls: one of :data:`FAILURE_CLASSES` (anything else raises ``ValueError``).
        detail: why, for a person (a server's log tail, the exception).
        extra: any other :class:`TrialResult` field (``warnings``, ``artifacts`` ...).

    Returns:
        A ``failed`` :class:`TrialResult` with ``failure_class`` and ``failure_detail`` set.

    Raises:
        ValueError: ``cls`` is not a failure class.
    """
    if cls not in FAILURE_CLASSES:
        raise ValueError(f"unknown failure class {cls!r}")
    return TrialResult(
        engine=engine,
        status="failed",
        requested=requested,
        effective=effective,
        failure_class=cls,
        failure_detail=detail,
        **extra,
    )


class Engine(abc.ABC):
    """Plans and runs live trials. Engines may keep models loaded between trials; ``close`` releases
    everything.

    Construction and :meth:`plan` are cheap (no model load, no server, no file written); models load
    on the first :meth:`run`.
    """

    name: str
    # how a trial's tok/s is measured: the throughput model to fit
    benchmark: ClassVar[Benchmark] = STEADY_STATE
    # whether decoding maps target tokens into the draft vocabulary with ``t2d``
    reads_t2d: ClassVar[bool] = False
    # metrics one measurement of a plan gives exactly (greedy accept length on an engine whose
    # decoding is bit-reproducible): the confirmation and the bisect measure them once
    # (bisect_eagle.stats.deterministic)
    deterministic_metrics: ClassVar[tuple[str, ...]] = ()
    # whether :meth:`run_rounds` measures its rounds on one launch (the server engines); otherwise
    # each round would be a launch of its own and callers run one round per launch
    rounds_share_launch: ClassVar[bool] = False
    # what the engine is doing, one short line at a time (loading, warm-up, measuring request 3/8),
    # for a command that shows progress; None: nobody listens
    progress: Callable[[str], None] | None = None

    @classmethod
    def from_spec(cls, spec: Spec, log_dir: Path) -> Engine:
        """The engine of ``spec`` (cheap: nothing loads, starts or is written), keeping per-trial
        logs in ``log_dir``.

        Raises:
            BadInput: the spec lacks what this engine needs, or this engine is not built from specs.
        """
        raise BadInput(f"the {cls.name} engine is not built from a spec")

    def check_launchable(self) -> None:
        """Raise :class:`BadInput` (naming the key and the fix) when this machine cannot start this
        engine's trials at all; called before a study creates anything. Engines that start nothing
        of their own pass.
        """
        return None

    @classmethod
    def versions(cls, spec: Spec) -> dict[str, str]:
        """Versions of what this engine runs that this interpreter's packages do not name (a server
        in an environment of its own), as a study's parent-run params (``version.<name>``); cheap,
        never raises.

        Args:
            spec: the study's spec (its engine settings name the server's environment).

        Returns:
            Name -> version; empty here and wherever nothing is known.
        """
        return {}

    @classmethod
    def export(
        cls,
        spec: Spec,
        settings: LiveSettings,
        *,
        effective: Mapping[str, Any],
        port: int,
        python: str | None = None,
    ) -> dict[str, Any]:
        """How to serve a logged trial of this engine on a server: the launch that runs what it
        measured.

        Args:
            spec: the study's spec (its target, draft and ``engine.sglang`` server settings).
            settings: the settings the trial requested (as logged: secret values redacted).
            effective: the effective settings of the trial's plan (as logged): what was measured.
            port: the exported server's port.
            python: an interpreter that has the server (its parser checks the command); default the
                spec's.

        Returns:
            ``argv``, ``command`` (one shell line), ``env`` (secret values as ``$NAME``),
            ``draft_config`` and ``draft_config_patch`` (None for the baseline / the draft's own
            ids), ``checked``, ``refusal``, ``fingerprint`` and ``warnings`` of the served plan.

        Raises:
            BadInput: this engine has no export.
        """
        raise BadInput(f"the {cls.name} engine has no export")

    @abc.abstractmethod
    def plan(self, settings: LiveSettings) -> TrialPlan:
        """What this engine will run for ``settings``: effective settings, fingerprint, warnings or
        a refusal.

        Args:
            settings: the trial's requested settings.

        Returns:
            The plan; a refused one carries ``refusal`` instead of raising.
        """

    @abc.abstractmethod
    def run(self, plan: TrialPlan) -> TrialResult:
        """Run one planned live trial (a no-speculation baseline when ``plan.is_baseline``).

        A refused plan (``plan.refusal``) raises :class:`~bisect_eagle.errors.BadInput`; callers
        check first.

        Args:
            plan: a plan of this engine's :meth:`plan`.

        Returns:
            The trial's result; failures come back as failed results with a class.
        """

    def run_rounds(self, plan: TrialPlan, *, rounds: int) -> TrialResult:
        """``rounds`` benchmark rounds of ``plan`` on one launch, combined (:func:`combine_rounds`);
        the rounds actually measured are ``result.rounds`` (fewer when a round fails or the engine
        cannot flush its cache: a warning says so).

        Args:
            plan: a plan of this engine's :meth:`plan`.
            rounds: benchmark rounds wanted (≥ 1).

        Returns:
            The combined result (here: one :meth:`run`).

        Raises:
            ValueError: ``rounds > 1`` on an engine whose rounds do not share a launch
                (:attr:`rounds_share_launch`).
        """
        if rounds > 1 and not self.rounds_share_launch:
            raise ValueError(f"the {self.name} engine measures one round per launch")
        return combine_rounds([self.run(plan)])

    def run_paired(
        self, plan: TrialPlan, baseline: TrialPlan, *, confidence: float = 0.95
    ) -> PairedResult | None:
        """``plan`` and the no-speculation ``baseline`` on the same prompts, interleaved per prompt;
        None when this engine cannot pair them (each is then measured with :meth:`run`).

        Args:
            plan: the speculative trial's plan.
            baseline: the baseline's plan.
            confidence: the level of the speedup's interval, in (0, 1).

        Returns:
            Both results and the speedup; None here (no pairing).
        """
        return None

    def _progress(self, message: str) -> None:
        """Tell :attr:`progress` what the engine does now (nothing when nobody listens)."""
        if self.progress is not None:
            self.progress(message)

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Release models, servers and ports."""

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
