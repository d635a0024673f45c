"""The ``sglang`` engine: one SGLang server per live trial, planned by SGLang itself, measured over HTTP, torn down.

:meth:`SglangEngine.plan` is :mod:`.planner` (SGLang's parser and resolution decide before anything starts).
:meth:`SglangEngine.run` of a plan, never planned again: take its launch (:func:`~.launch.launch_of`: the plan's
own flags, bound to its fingerprint) with the trial's port and draft copy; copy the draft directory with the plan's
config patch; start the server in its own process group on a free port with its output in
``<trial dir>/server.log``; wait for ``/health_generate``
(failing fast when the process exits); read the effective settings back from ``/server_info``; warm up,
``POST /flush_cache``, run the measured requests (:mod:`.client`); read the server's own accept length as a
cross-check; then SIGTERM, grace, SIGKILL of the whole group and wait for the port and the GPUs to be
released. A server that will not go away blocks the next launch loudly (a ``launch_error`` trial) instead of
stacking servers.

Failures are trials with a class (:mod:`.failures`), the log tail in ``failure_detail`` and the whole log
(secret values scrubbed) in the ``server.log`` artifact; every trial, failed or not, carries
``launch_command.txt``, ``effective.json`` and ``server.log``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bisect_eagle.artifacts.prompts import Prompt, load_prompts
from bisect_eagle.engines.base import Engine, RequestRecord, TrialResult, failed
from bisect_eagle.engines.plan import TrialPlan
from bisect_eagle.engines.procs import gpus
from bisect_eagle.engines.procs import server as procs
from bisect_eagle.engines.sglang.client import BatchResult, RequestError, SglangClient
from bisect_eagle.engines.sglang.failures import classify_failure
from bisect_eagle.engines.sglang.launch import launch_of, launch_text, prepare_draft_dir
from bisect_eagle.engines.sglang.planner import Planner
from bisect_eagle.engines.sglang.readback import (
    effective_from_server,
    hist_and_rates,
    readback_differences,
    server_accept_length,
    server_summary,
)
from bisect_eagle.errors import BadInput
from bisect_eagle.spec.schema import SglangServer, Spec
from bisect_eagle.spec.settings import LiveSettings
from bisect_eagle.tracking.redact import Scrubber


@dataclass
class _Leftover:
    """A server whose teardown did not finish: the next launch waits for it or fails."""

    server: procs.ServerProcess
    host: str
    port: int
    reason: str


class SglangEngine(Engine):
    """Live trials on SGLang (or any server speaking its launch flags and HTTP API, e.g. ``bisect-eagle serve``)."""

    name = "sglang"

    def __init__(self, server: SglangServer, *, target: Path, draft: Path, prompts: Path | None, log_dir: Path,
                 check: bool = True):
        self.server = server
        self.target, self.draft = Path(target), Path(draft)
        self.prompts_path = None if prompts is None else Path(prompts)
        self.log_dir = Path(log_dir).resolve()  # the server may run elsewhere than here: absolute paths only
        self.planner = Planner(server, self.target, self.draft, self.log_dir, check=check)
        self._prompts: list[Prompt] | None = None
        self._leftover: _Leftover | None = None
        self._seq: int | None = None
        self._shown_port: int | None = None
        self._gpu_before: dict[int, int] | None = None  # device memory before the last launch (gpus.device_baseline)

    @classmethod
    def from_spec(cls, spec: Spec, log_dir: Path, *, check: bool = True) -> SglangEngine:
        """The engine of an ``engine.kind: sglang`` spec (nothing is probed or written until used)."""
        server = spec.engine.sglang
        if spec.target is None and server.model_path is None:
            raise BadInput(f"{spec.source}: key 'target' is missing (or set engine.sglang.model_path)")
        target = spec.target if spec.target is not None else Path(server.model_path or "")
        if spec.draft is None:
            raise BadInput(f"{spec.source}: key 'draft' is missing (give a path, or 'scenario: NAME')")
        return cls(server, target=target, draft=spec.draft, prompts=spec.prompts, log_dir=log_dir, check=check)

    @classmethod
    def export(cls, spec: Spec, settings: LiveSettings, *, effective: Mapping[str, Any], port: int,
               python: str | None = None) -> dict[str, Any]:
        """The SGLang launch of a logged trial (:meth:`Engine.export`; :mod:`.export`)."""
        from bisect_eagle.engines.sglang.export import export

        return export(spec, settings, effective=effective, port=port, python=python)

    # -- plan -------------------------------------------------------------------------------------------

    def plan(self, settings: LiveSettings) -> TrialPlan:
        """The trial as SGLang will run it (see :mod:`.planner`); writes nothing, starts only the oracle."""
        if self._shown_port is None:  # the argv shows a port free now; each launch picks its own
            self._shown_port = procs.free_port(self.server.host)
        return self.planner.plan(settings, port=self._shown_port,
                                 draft_dir=self.log_dir / f"{self._next_seq():03d}-trial" / "draft")

    def _next_seq(self) -> int:
        if self._seq is None:
            self._seq = next_trial_number(self.log_dir)
        return self._seq

    def _load_prompts(self, need: int) -> list[Prompt]:
        """The first ``need`` prompts, tokenized by the target's tokenizer (loaded once)."""
        from transformers import AutoTokenizer

        if self.prompts_path is None:
            raise BadInput("a live sglang trial needs the spec's key 'prompts'")
        if self._prompts is None:
            tok_dir = self.server.model_path or str(self.target)
            tokenizer = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
            self._prompts = load_prompts(self.prompts_path, tokenizer)
        if need > len(self._prompts):
            raise BadInput(f"{self.prompts_path}: warmup_prompts + num_prompts = {need}, but the file has only "
                           f"{len(self._prompts)} prompts")
        return self._prompts[:need]

    # -- teardown of a previous server ------------------------------------------------------------------

    def _still_blocked(self) -> str | None:
        """Why the previous server still blocks a launch, or None once it is gone."""
        left = self._leftover
        if left is None:
            return None
        alive = [p.pid for p in left.server.alive()]
        if alive:
            procs.stop_server(left.server, grace_s=0.0)
            alive = [p.pid for p in left.server.alive()]
        gpu = gpus.wait_gpu_release(pids=left.server.seen, timeout_s=0.0, baseline=self._gpu_before)
        port_free = procs.port_is_free(left.host, left.port)
        if not alive and gpu.status != "held" and port_free:
            self._leftover = None
            return None
        return (f"the previous server is not gone ({left.reason}; now: processes {alive}, GPU memory {gpu.status} "
                f"({gpu.reason}), port {left.port} {'free' if port_free else 'taken'}); refusing to start another")

    def _teardown(self, server: procs.ServerProcess, port: int) -> tuple[dict[str, Any], list[str]]:
        """Stop the server and wait for its port and GPUs; (report, warnings). Remembers a server that stays."""
        s = self.server
        stop = procs.stop_server(server, grace_s=s.stop_grace_s)
        port_s = procs.wait_port_free(s.host, port, timeout_s=s.gpu_release_timeout_s)
        gpu = gpus.wait_gpu_release(pids=server.seen, timeout_s=s.gpu_release_timeout_s, baseline=self._gpu_before)
        report = {"signal": stop.signal, "stop_s": round(stop.stop_s, 3), "exit_code": stop.exit_code,
                  "port_free_s": None if port_s is None else round(port_s, 3), "gpu_release": gpu.status,
                  "gpu_release_s": None if gpu.seconds is None else round(gpu.seconds, 3),
                  "gpu_release_method": gpu.method, "gpu_release_detail": gpu.reason,
                  "pids": sorted(server.seen), "survivors": stop.survivors,
                  "orphans": [o.__dict__ for o in stop.orphans]}
        warnings, reasons = list(stop.warnings), []
        if stop.signal == "SIGKILL":
            warnings.append(f"the server did not exit within {s.stop_grace_s:g} s of SIGTERM "
                            "(engine.sglang.stop_grace_s) and was killed with SIGKILL")
        if stop.survivors:
            reasons.append(f"processes {stop.survivors} survived SIGKILL")
        if port_s is None:
            reasons.append(f"port {port} still taken after {s.gpu_release_timeout_s:g} s")
        if gpu.status == "held":
            reasons.append(f"{gpu.reason} after {s.gpu_release_timeout_s:g} s")
        if reasons:
            reason = "; ".join(reasons)
            self._leftover = _Leftover(server, s.host, port, reason)
            warnings.append(f"teardown incomplete: {reason}; the next launch waits for it or fails")
        return report, warnings

    # -- one trial --------------------------------------------------------------------------------------

    def run(self, plan: TrialPlan) -> TrialResult:
        """One live trial on a fresh server; failures come back as failed trials with a class.

        Args:
            plan: a plan of this engine's :meth:`plan` (run as planned: never planned again).

        Raises:
            BadInput: ``plan`` is refused, or the draft cannot be copied for it.
            RuntimeError: ``plan`` carries no launch of its own identity (:func:`~.launch.launch_of`; a bug).
        """
        if plan.refusal is not None:
            raise BadInput(plan.refusal)
        launch = launch_of(plan)
        settings = plan.settings
        requested, planned = plan.requested, dict(plan.effective)
        warnings = list(plan.warnings)
        seq = self._next_seq()
        self._seq = seq + 1
        trial_dir = self.log_dir / f"{seq:03d}-{plan.fingerprint}"
        scrub = Scrubber(settings.env, settings.server_args)
        blocked = self._still_blocked()
        if blocked is not None:
            return failed(
                self.name,
                requested=requested,
                effective=planned,
                cls="launch_error",
                detail=blocked,
                warnings=warnings,
                artifacts={
                    "launch_command.txt": "(not launched)\n",
                    "effective.json": _dump(planned),
                    "server.log": "",
                },
            )
        prompts = self._load_prompts(settings.warmup_prompts + settings.num_prompts)
        port = procs.free_port(self.server.host)
        argv = [*self.planner.command, *launch.argv(port=port, draft_dir=trial_dir / "draft")]
        if not settings.is_baseline:
            prepare_draft_dir(self.draft, config_patch=plan.config_patch, out_dir=trial_dir / "draft")
        trial_dir.mkdir(parents=True, exist_ok=True)
        version = self.planner.flags().version if self.planner.flags() else None
        command_text = (
            launch_text(argv, dict(settings.env), environ=dict(os.environ)) + f"\n# server version: {version}\n"
        )
        (trial_dir / "launch_command.txt").write_text(command_text)
        self._gpu_before = gpus.device_baseline({**os.environ, **settings.env})
        try:
            server = procs.start_server(
                argv,
                {**os.environ, **settings.env},
                log_path=trial_dir / "server.log",
                log_dir=self.log_dir,
                host=self.server.host,
                port=port,
                grace_s=self.server.stop_grace_s,
                meta={"trial": seq, "trial_dir": str(trial_dir), "fingerprint": plan.fingerprint},
            )
        except OSError as e:
            return failed(
                self.name,
                requested=requested,
                effective=planned,
                cls="launch_error",
                detail=f"cannot start {argv[0]}: {e}",
                warnings=warnings,
                artifacts={"launch_command.txt": command_text, "effective.json": _dump(planned), "server.log": ""},
            )
        client = SglangClient(
            f"http://{self.server.host}:{port}",
            self.server.request_timeout_s,
            api_key=settings.server_args.get("api_key"),
        )
        try:
            result = self._measure(
                settings,
                prompts=prompts,
                server=server,
                client=client,
                requested=requested,
                planned=planned,
                warnings=warnings,
                scrub=scrub,
            )
        finally:
            teardown, teardown_warnings = self._teardown(server, port)
            client.close()
        result.warnings += teardown_warnings
        log_text = scrub(procs.read_log(server.log_path))
        server.log_path.write_text(log_text)  # the local copy too: no secret the server printed stays on disk
        result.artifacts.update(
            {
                "launch_command.txt": command_text,
                "effective.json": _dump(result.effective),
                "server.log": log_text,
                "teardown.json": _dump(teardown),
            }
        )
        (trial_dir / "effective.json").write_text(result.artifacts["effective.json"])
        body = {k: v for k, v in result.to_json().items() if k != "artifacts"}
        (trial_dir / "result.json").write_text(scrub(_dump(body)))
        return result

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
        """Readiness, read-back, warm-up, flush, benchmark; a failed trial on any failure."""
        s = self.server

        def fail(phase: str, effective: dict, timed_out: bool = False, reason: str = "") -> TrialResult:
            cls, why = classify_failure(phase, procs.read_log(server.log_path), timed_out=timed_out)
            code = server.popen.poll()
            parts = [why, f"({reason})" if reason else "", f"exit code {code}" if code is not None else "running"]
            detail = " ".join(p for p in parts if p) + "\n--- server log tail ---\n" + procs.log_tail(server.log_path)
            return failed(
                self.name, requested=requested, effective=effective, cls=cls, detail=scrub(detail), warnings=warnings
            )

        state = client.wait_ready(server.exited, timeout_s=s.ready_timeout_s)
        if state != "ready":
            return fail("start" if state == "exited" else "ready_timeout", planned)
        server.snapshot()
        try:
            info = client.server_info()
        except RequestError as e:
            return fail("benchmark", planned, e.timed_out, str(e))
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
            return fail("benchmark", effective, e.timed_out, str(e))
        return self._result(
            settings, requested=requested, effective=effective, batch=batch, info=after, warnings=warnings
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
        """The measured trial: throughput, accept length (SGLang's definition, :mod:`.readback`), warnings."""
        records = []
        spec = not settings.is_baseline
        for c in batch.completions:
            # SGLang omits spec_verify_ct for a request with no verify step (it ended on its prefill token)
            verify = c.verify_ct if spec else c.completion_tokens
            records.append(RequestRecord(id=c.id, prompt_tokens=c.prompt_tokens, completion_tokens=c.completion_tokens,
                                         verify_steps=verify or 0, latency_s=c.latency_s))
        tokens = sum(r.completion_tokens for r in records)
        verify_total = sum(r.verify_steps for r in records)
        accept = tokens / verify_total if verify_total else float("nan")
        num_steps = int(effective.get("num_steps") or 0)
        hist, rates = hist_and_rates(batch.completions, num_steps) if spec else ({1: tokens}, [])
        if spec and accept == 1.0:
            warnings.append(
                "accept length is exactly 1.00: aux hidden-state capture is broken, or the algorithm is "
                "EAGLE with an EAGLE-3 draft (use EAGLE3); not a weak draft"
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
            artifacts={"server_info.json": _dump(server_summary(info))},
        )

    def close(self) -> None:
        """Stop a server left from an incomplete teardown, if any, and the SGLang oracle."""
        if self._leftover is not None:
            procs.stop_server(self._leftover.server, grace_s=0.0)
            self._leftover = None
        self.planner.close()


def _dump(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n"


def next_trial_number(log_dir: Path) -> int:
    """1 + the highest ``NNN-`` trial directory number already in ``log_dir``."""
    numbers = [int(p.name[:3]) for p in log_dir.glob("[0-9][0-9][0-9]-*") if p.is_dir()] if log_dir.is_dir() else []
    return max(numbers, default=0) + 1
