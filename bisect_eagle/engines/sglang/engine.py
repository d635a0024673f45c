"""The ``sglang`` engine: one SGLang server per live trial, planned by SGLang itself, measured over
HTTP, torn down.

:meth:`SglangEngine.plan` is :mod:`.planner` (SGLang's parser and resolution decide before anything
starts). :meth:`SglangEngine.run` of a plan, never planned again: take its launch
(:func:`~.launch.launch_of`: the plan's own flags, bound to its fingerprint) with the trial's port
and draft copy; copy the draft directory with the plan's config patch; start the server in its own
process group on a free port with its output in ``<trial dir>/server.log``; wait for
``/health_generate`` (failing fast when the process exits); read the effective settings back from
``/server_info``; warm up, ``POST /flush_cache``, run the measured requests (:mod:`.client`); read
the server's own accept length as a cross-check; then SIGTERM, grace, SIGKILL of the whole group and
wait for the port and the GPUs to be released. A server that will not go away blocks the next launch
loudly (a ``launch_error`` trial) instead of stacking servers.

Failures are trials with a class (:mod:`.failures`), the log tail in ``failure_detail`` and the
whole log (secret values scrubbed) in the ``server.log`` artifact; every trial, failed or not,
carries ``launch_command.txt``, ``effective.json`` and ``server.log``.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from bisect_eagle.artifacts.prompts import Prompt
from bisect_eagle.engines.base import RequestRecord, TrialResult
from bisect_eagle.engines.plan import TrialPlan
from bisect_eagle.engines.procs import server as procs
from bisect_eagle.engines.served import ServedEngine, ServedLaunch, dump
from bisect_eagle.engines.sglang.client import BatchResult, RequestError, SglangClient
from bisect_eagle.engines.sglang.export import export_plan, node_argv
from bisect_eagle.engines.sglang.failures import FAILURES
from bisect_eagle.engines.sglang.launch import launch_of, launch_text, prepare_draft_dir
from bisect_eagle.engines.sglang.planner import Planner
from bisect_eagle.engines.sglang.readback import (
    effective_from_server,
    hist_and_rates,
    readback_differences,
    server_accept_length,
    server_summary,
)
from bisect_eagle.spec.schema import ServerSpec
from bisect_eagle.spec.settings import LiveSettings
from bisect_eagle.tracking.redact import Scrubber


class SglangEngine(ServedEngine):
    """Live trials on SGLang (or any server speaking its launch flags and HTTP API, e.g.
    ``bisect-eagle serve``)."""

    name = "sglang"
    planner_class = Planner
    client_class = SglangClient
    failures = FAILURES
    exporter = staticmethod(export_plan)
    planner: Planner

    @classmethod
    def _node_argv(
        cls, argv: list[str], *, server: ServerSpec, checked: str
    ) -> tuple[list[str], str | None]:
        """The exported argv on the node (:func:`.export.node_argv`: the stand-in's runs as it
        is)."""
        return node_argv(
            argv, launch_command=list(server.launch_command), python=server.python, checked=checked
        )

    # -- one trial
    # --------------------------------------------------------------------------------------

    def _check_plan(self, plan: TrialPlan) -> None:
        """RuntimeError when ``plan`` carries no launch of its own identity
        (:func:`~.launch.launch_of`; a bug)."""
        launch_of(plan)

    def _launch(self, plan: TrialPlan, *, trial_dir: Path, port: int) -> ServedLaunch:
        """The plan's own flags with the trial's port and draft copy (made here with the plan's
        config patch)."""
        settings = plan.settings
        argv = [
            *self.planner.command,
            *launch_of(plan).argv(port=port, draft_dir=trial_dir / "draft"),
        ]
        if not settings.is_baseline:
            prepare_draft_dir(
                self.draft, config_patch=plan.config_patch, out_dir=trial_dir / "draft"
            )
        trial_dir.mkdir(parents=True, exist_ok=True)
        version = self.planner.flags().version if self.planner.flags() else None
        # the planner's own variables (pinned acceptance)
        env = {**settings.env, **plan.private.get("env", {})}
        command_text = (
            launch_text(argv, env, environ=dict(os.environ)) + f"\n# server version: {version}\n"
        )
        return ServedLaunch(argv, env, {**os.environ, **env}, command_text, command_text)

    def _measure(
        self,
        settings: LiveSettings,
        *,
        prompts: list[Prompt],
        server: procs.ServerProcess,
        client: SglangClient,
        requested: dict,
        planned: dict,
        warnings: list[str],
        scrub: Scrubber,
    ) -> TrialResult:
        """Read-back, warm-up, flush, benchmark; a failed trial on any failure."""

        fail = functools.partial(self._benchmark_failure, server, requested, warnings, scrub)

        try:
            info = client.server_info()
        except RequestError as e:
            return fail(planned, e)
        effective = effective_from_server(planned, info, baseline=settings.is_baseline)
        warnings += readback_differences(planned, effective)
        sampling = {"max_new_tokens": settings.max_new_tokens, "temperature": settings.temperature}
        warm = [(p.id, p.input_ids) for p in prompts[: settings.warmup_prompts]]
        measured = [(p.id, p.input_ids) for p in prompts[settings.warmup_prompts :]]
        try:
            if warm:
                client.run_batch(warm, sampling, concurrency=settings.concurrency)
            client.flush_cache()
            batch = client.run_batch(measured, sampling, concurrency=settings.concurrency)
            server.snapshot()
            after = client.server_info()
        except RequestError as e:
            return fail(effective, e)
        return self._result(
            settings,
            requested=requested,
            effective=effective,
            batch=batch,
            info=after,
            warnings=warnings,
        )

    def _measure_again(
        self,
        settings: LiveSettings,
        *,
        server: procs.ServerProcess,
        client: SglangClient,
        first: TrialResult,
        scrub: Scrubber,
    ) -> TrialResult:
        """Another round on the running server: ``/flush_cache``, the measured requests, the
        server's counters."""
        prompts = self._load_prompts(settings.warmup_prompts + settings.num_prompts)
        measured = [(p.id, p.input_ids) for p in prompts[settings.warmup_prompts :]]
        sampling = {"max_new_tokens": settings.max_new_tokens, "temperature": settings.temperature}
        try:
            client.flush_cache()
            batch = client.run_batch(measured, sampling, concurrency=settings.concurrency)
            server.snapshot()
            after = client.server_info()
        except RequestError as e:
            return self._later_failure(server, first, scrub, e)
        return self._result(
            settings,
            requested=first.requested,
            effective=first.effective,
            batch=batch,
            info=after,
            warnings=[],
        )

    def _result(
        self,
        settings: LiveSettings,
        *,
        requested: dict,
        effective: dict,
        batch: BatchResult,
        info: dict,
        warnings: list[str],
    ) -> TrialResult:
        """The measured trial: throughput, accept length (SGLang's definition, :mod:`.readback`),
        warnings."""
        records = []
        spec = not settings.is_baseline
        for c in batch.completions:
            # SGLang omits spec_verify_ct for a request with no verify step (it ended on its prefill
            # token)
            verify = c.verify_ct if spec else c.completion_tokens
            records.append(
                RequestRecord(
                    id=c.id,
                    prompt_tokens=c.prompt_tokens,
                    completion_tokens=c.completion_tokens,
                    verify_steps=verify or 0,
                    latency_s=c.latency_s,
                )
            )
        tokens = sum(r.completion_tokens for r in records)
        verify_total = sum(r.verify_steps for r in records)
        accept = tokens / verify_total if verify_total else float("nan")
        num_steps = int(effective.get("num_steps") or 0)
        hist, rates = hist_and_rates(batch.completions, num_steps) if spec else ({1: tokens}, [])
        if spec and accept == 1.0:
            warnings.append(
                "accept length is exactly 1.00: aux hidden-state capture is broken, or the "
                "algorithm is EAGLE with an EAGLE-3 draft (use EAGLE3); not a weak draft"
            )
        return TrialResult(
            engine=self.name,
            status="ok",
            requested=requested,
            effective=effective,
            output_tok_s=tokens / batch.wall_s if batch.wall_s > 0 else float("nan"),
            accept_length=accept,
            accept_length_hist=hist,
            accept_rate_per_position=rates,
            requests=records,
            wall_s=batch.wall_s,
            server_accept_length=server_accept_length(info) if spec else None,
            warnings=warnings,
            artifacts={"server_info.json": dump(server_summary(info))},
        )
