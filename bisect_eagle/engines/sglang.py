"""The ``sglang`` engine: one SGLang server per live trial, measured over HTTP, always torn down.

A trial: probe the installed server once (flags, version); build the launch (:mod:`.sglang_launch`) and
refuse unknown flags before anything starts; copy the draft directory for the trial's layer ids; start the
server in its own process group on a free port with its output in ``<trial dir>/server.log``; wait for
``/health_generate`` (failing fast when the process exits); read the effective settings back from
``/server_info``; warm up, ``POST /flush_cache``, run the measured requests (:mod:`.sglang_client`); read the
server's own accept length as a cross-check; then SIGTERM, grace, SIGKILL of the whole group and wait for
the port and the GPUs to be released. A server that will not go away blocks the next launch loudly (a
``launch_error`` trial) instead of stacking servers.

Failures are trials with a class (``engines.base.FAILURE_CLASSES``), the log tail in ``failure_detail``
and the whole log in the ``server.log`` artifact; every trial, failed or not, carries ``launch_command.txt``,
``effective.json`` and ``server.log``. ``effective`` holds the LiveSettings fields as the server ran them
plus ``server``: what the server reports about itself (version, max_running_requests, ...).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bisect_eagle.engines import procs
from bisect_eagle.engines.base import Engine, RequestRecord, TrialResult, failed
from bisect_eagle.engines.sglang_client import Batch, Completion, RequestError, SglangClient
from bisect_eagle.engines.sglang_launch import (
    LaunchPlan,
    ServerFlags,
    describe,
    is_secret_name,
    plan_trial,
    prepare_draft_dir,
    probe_flags,
    resolve_executable,
)
from bisect_eagle.errors import BadInput
from bisect_eagle.prompts import Prompt, load_prompts
from bisect_eagle.settings import LiveSettings, apply_speculative_rules, is_secret, trial_fingerprint
from bisect_eagle.spec import SglangServer, Spec

SERVER_INFO_FIELDS = {  # LiveSettings field -> /server_info key
    "speculative_algorithm": "speculative_algorithm",
    "num_steps": "speculative_num_steps",
    "topk": "speculative_eagle_topk",
    "num_draft_tokens": "speculative_num_draft_tokens",
    "eagle_aux_hidden_state_layer_ids": "eagle_aux_hidden_state_layer_ids",  # bisect-eagle serve only
    "device": "device",
    "dtype": "dtype",
}
SPECULATIVE_FIELDS = ("num_steps", "topk", "num_draft_tokens", "eagle_aux_hidden_state_layer_ids")
EXPLICIT_ONLY = ("device", "dtype")  # compared only when the request sets them (see sglang_launch)
SERVER_KEYS = (  # what the server says about itself, recorded under effective["server"]
    "version", "max_running_requests", "tp_size", "dp_size", "ep_size", "attention_backend",
    "speculative_draft_attention_backend", "cuda_graph_max_bs", "cuda_graph_max_bs_decode", "disable_cuda_graph",
    "disable_custom_all_reduce", "enable_nccl_nvls", "enable_symm_mem", "mem_fraction_static", "page_size",
    "chunked_prefill_size", "disable_overlap_schedule", "aux_hidden_state_indices",
)
_ARGPARSE = re.compile(r"^\S+: error: ", re.M)
_OOM = re.compile(r"out of memory|OutOfMemoryError|Not enough memory", re.I)
_CAPTURE = re.compile(r"captured \d+ of \d+ aux hidden states?", re.I)
_CAPTURE_KEYS = re.compile(r"aux[_ ]hidden[_ ]state|eagle_aux_hidden_state_layer_ids|layers_to_capture|"
                           r"size mismatch for fc\.weight|fc takes \d+ inputs", re.I)
_ERROR_LINE = re.compile(r"Error|Exception|error:", re.M)


def _matching_line(pattern: re.Pattern, text: str, also: re.Pattern | None = None) -> str | None:
    for line in text.splitlines():
        if pattern.search(line) and (also is None or also.search(line)):
            return line.strip()
    return None


def _server_args_error(log: str) -> str | None:
    """The exception line of a traceback through SGLang's server_args.py (its own argument checks), if any."""
    in_trace = False
    for line in log.splitlines():
        if line.strip().startswith("File ") and "server_args" in line:
            in_trace = True
        elif in_trace and line.startswith(("AssertionError", "ValueError")):
            return line.strip()
    return None


def classify_failure(phase: str, log: str, timed_out: bool = False) -> tuple[str, str]:
    """(failure class, the log line or reason behind it) for a trial that failed in ``phase``.

    ``phase``: "start" (exited before ready), "ready_timeout" or "benchmark". Out of memory and capture or
    draft-config errors are recognised in any phase; argparse errors (and SGLang's own argument checks in
    server_args.py) only before ready.
    """
    if phase == "start":
        line = _matching_line(_ARGPARSE, log)
        if line is not None and "usage:" in log:
            return "bad_arguments", line
        line = _server_args_error(log)
        if line is not None:
            return "bad_arguments", line
    line = _matching_line(_OOM, log)
    if line is not None:
        return "out_of_memory", line
    line = _matching_line(_CAPTURE, log) or _matching_line(_CAPTURE_KEYS, log, also=_ERROR_LINE)
    if line is not None:
        return "capture_error", line
    if phase == "start":
        last = _matching_line(_ERROR_LINE, "\n".join(reversed(log.splitlines())))
        return "launch_error", last or "the server exited before it was ready"
    if phase == "ready_timeout":
        return "readiness_timeout", "the server did not answer /health_generate in time"
    if timed_out:
        return "hung_request", "a request got no answer within engine.sglang.request_timeout_s"
    return "crash_during_benchmark", "a request failed during the benchmark"


# ---------------------------------------------------------------------------------------------------
# effective settings


def _redact(info: dict) -> dict:
    """/server_info without secret-named keys (SGLang reports ``api_key`` among its args)."""
    return {k: ("<redacted>" if is_secret_name(k) else v) for k, v in info.items()}


def draft_dir_ids(draft_dir: Path | None) -> list[int] | None:
    """The ids SGLang will read from a draft directory: nested ``eagle_config`` ids, or None (its default)."""
    if draft_dir is None:
        return None
    cfg = json.loads((draft_dir / "config.json").read_text())
    eagle = cfg.get("eagle_config")
    ids = eagle.get("eagle_aux_hidden_state_layer_ids") if isinstance(eagle, dict) else None
    return list(ids) if isinstance(ids, list) else None


def effective_settings(settings: LiveSettings, info: dict, written_ids: list[int] | None) -> dict[str, Any]:
    """The trial's settings as the server reports running them (LiveSettings fields + ``server``)."""
    expected, _ = apply_speculative_rules(settings)
    out = expected.model_dump(mode="json")
    if not settings.is_baseline:
        out["eagle_aux_hidden_state_layer_ids"] = written_ids
    for name, key in SERVER_INFO_FIELDS.items():
        if key in info and not (settings.is_baseline and name in SPECULATIVE_FIELDS):
            out[name] = info[key]
    if out["speculative_algorithm"] is None:
        out["speculative_algorithm"] = "none"
    mrr = info.get("max_running_requests")
    if isinstance(mrr, int) and mrr < settings.concurrency:
        out["concurrency"] = mrr
    out["server_args"] = {k: info.get(k, v) for k, v in settings.server_args.items()}
    out["server"] = {k: info[k] for k in SERVER_KEYS if k in info}
    return out


def differences(settings: LiveSettings, effective: dict[str, Any]) -> list[str]:
    """Warnings for settings the server runs differently from the request (unset requests excluded)."""
    requested = settings.model_dump(mode="json")
    notes = []
    for key, want in requested.items():
        if key in ("server_args", "env") or want is None or key not in effective:
            continue
        if (settings.is_baseline and key in SPECULATIVE_FIELDS) or (
            key in EXPLICIT_ONLY and key not in settings.model_fields_set
        ):
            continue
        if effective[key] != want:
            notes.append(f"effective {key} = {effective[key]!r}, requested {want!r} (read back from /server_info)")
    for key, want in requested.get("server_args", {}).items():
        got = effective.get("server_args", {}).get(key, want)
        if want is not None and got != want:
            notes.append(f"effective server_args.{key} = {got!r}, requested {want!r} (read back from /server_info)")
    return notes


# ---------------------------------------------------------------------------------------------------
# measurement → result


def _hist_and_rates(completions: Sequence[Completion], num_steps: int) -> tuple[dict[int, int], list[float]]:
    """Tokens-per-verify-step histogram and P(draft k accepted | drafts before it accepted).

    Exact when the server lists each step (``bisect-eagle serve``); from SGLang's correct-drafts histogram
    otherwise, where a step is assumed to have proposed ``num_steps`` drafts.
    """
    steps: list[tuple[int, int]] = []  # (drafts proposed, tokens emitted)
    for c in completions:
        emitted, drafted = c.meta.get("bisect_eagle_accepted_per_step"), c.meta.get("bisect_eagle_drafted_per_step")
        if isinstance(emitted, list) and isinstance(drafted, list):
            steps += list(zip(drafted, emitted, strict=True))
        elif c.histogram is not None:
            steps += [(num_steps, correct + 1) for correct, n in enumerate(c.histogram) for _ in range(n)]
    hist = dict(sorted(Counter(e for _, e in steps).items()))
    reached, passed = [0] * num_steps, [0] * num_steps
    for drafted, emitted in steps:
        for k in range(min(drafted, emitted, num_steps)):
            reached[k] += 1
            passed[k] += k < emitted - 1
    return hist, [p / r if r else float("nan") for p, r in zip(passed, reached, strict=True)]


def _server_accept_length(info: dict) -> float | None:
    """Mean over DP ranks of the server's own ``avg_spec_accept_length`` (None when not reported)."""
    states = info.get("internal_states")
    if not isinstance(states, list):
        return None
    values = [s["avg_spec_accept_length"] for s in states
              if isinstance(s, dict) and isinstance(s.get("avg_spec_accept_length"), (int, float))]
    return statistics.fmean(values) if values else None


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

    def __init__(self, server: SglangServer, target: Path, draft: Path, prompts: Path, log_dir: Path):
        self.server = server
        self.target, self.draft, self.prompts_path = Path(target), Path(draft), Path(prompts)
        self.log_dir = Path(log_dir).resolve()  # the server may run elsewhere than here: absolute paths only
        self._flags: ServerFlags | None = None
        self._prompts: list[Prompt] | None = None
        self._leftover: _Leftover | None = None
        self._seq = next_trial_number(self.log_dir)

    @classmethod
    def from_spec(cls, spec: Spec, log_dir: Path) -> SglangEngine:
        """The engine of an ``engine.kind: sglang`` spec."""
        p = spec.paths()
        return cls(spec.engine.sglang, p["target"], p["draft"], p["prompts"], log_dir)

    # -- setup ------------------------------------------------------------------------------------------

    def flags(self) -> ServerFlags:
        """The installed server's flags and version (probed once)."""
        if self._flags is None:
            self._flags = probe_flags(list(self.server.launch_command))
        return self._flags

    def _load_prompts(self, need: int) -> list[Prompt]:
        """The first ``need`` prompts, tokenized by the target's tokenizer (loaded once)."""
        from transformers import AutoTokenizer

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
            procs.stop_server(left.server, 0.0)
            alive = [p.pid for p in left.server.alive()]
        gpu = procs.wait_gpu_release(list(left.server.seen), 0.0)
        port_free = procs.port_is_free(left.host, left.port)
        if not alive and gpu.status != "held" and port_free:
            self._leftover = None
            return None
        return (f"the previous server is not gone ({left.reason}; now: processes {alive}, GPU memory by pid "
                f"{gpu.holders}, port {left.port} {'free' if port_free else 'taken'}); refusing to start another")

    def _teardown(self, server: procs.ServerProcess, port: int) -> tuple[dict[str, Any], list[str]]:
        """Stop the server and wait for its port and GPUs; (report, warnings). Remembers a server that stays."""
        s = self.server
        stop = procs.stop_server(server, s.stop_grace_s)
        port_s = procs.wait_port_free(s.host, port, s.gpu_release_timeout_s)
        gpu = procs.wait_gpu_release(list(server.seen), s.gpu_release_timeout_s)
        report = {"signal": stop.signal, "stop_s": round(stop.stop_s, 3), "exit_code": stop.exit_code,
                  "port_free_s": None if port_s is None else round(port_s, 3), "gpu_release": gpu.status,
                  "gpu_release_s": None if gpu.seconds is None else round(gpu.seconds, 3),
                  "pids": sorted(server.seen), "survivors": stop.survivors}
        warnings, reasons = [], []
        if stop.signal == "SIGKILL":
            warnings.append(f"the server did not exit within {s.stop_grace_s:g} s of SIGTERM "
                            "(engine.sglang.stop_grace_s) and was killed with SIGKILL")
        if stop.survivors:
            reasons.append(f"processes {stop.survivors} survived SIGKILL")
        if port_s is None:
            reasons.append(f"port {port} still taken after {s.gpu_release_timeout_s:g} s")
        if gpu.status == "held":
            reasons.append(f"GPU memory still held by pids {gpu.holders} (MiB) after {s.gpu_release_timeout_s:g} s")
        if reasons:
            reason = "; ".join(reasons)
            self._leftover = _Leftover(server, s.host, port, reason)
            warnings.append(f"teardown incomplete: {reason}; the next launch waits for it or fails")
        return report, warnings

    # -- one trial --------------------------------------------------------------------------------------

    def run(self, settings: LiveSettings) -> TrialResult:
        """One live trial on a fresh server; failures come back as failed trials with a class."""
        requested = settings.model_dump(mode="json")
        expected, warnings = apply_speculative_rules(settings)
        expected_dict = expected.model_dump(mode="json")
        trial_dir = self.log_dir / trial_dir_name(self._seq, requested)
        self._seq += 1
        blocked = self._still_blocked()
        if blocked is not None:
            return failed(self.name, requested, expected_dict, "launch_error", blocked, warnings=warnings,
                          artifacts={"launch_command.txt": "(not launched)\n",
                                     "effective.json": _dump(expected_dict), "server.log": ""})
        flags = self.flags()
        prompts = self._load_prompts(settings.warmup_prompts + settings.num_prompts)
        port = procs.free_port(self.server.host)
        plan = plan_trial(settings, self.server, self.target, trial_dir, port, flags)
        warnings += [n for n in plan.notes if not n.startswith("expected server override")]
        written_ids = self._prepare_draft(settings, plan, warnings)  # creates trial_dir/draft, or refuses first
        trial_dir.mkdir(parents=True, exist_ok=True)
        command_text = describe(plan.argv, plan.env, dict(os.environ)) + f"\n# server version: {flags.version}\n"
        (trial_dir / "launch_command.txt").write_text(command_text)
        try:
            server = procs.start_server(plan.argv, {**os.environ, **plan.env}, trial_dir / "server.log")
        except OSError as e:
            return failed(self.name, requested, expected_dict, "launch_error", f"cannot start {plan.argv[0]}: {e}",
                          warnings=warnings, artifacts={"launch_command.txt": command_text,
                                                        "effective.json": _dump(expected_dict), "server.log": ""})
        client = SglangClient(f"http://{self.server.host}:{port}", self.server.request_timeout_s)
        try:
            result = self._measure(settings, prompts, server, client, requested, expected_dict, written_ids, warnings)
        finally:
            teardown, teardown_warnings = self._teardown(server, port)
            client.close()
        result.warnings += teardown_warnings
        log_text = procs.read_log(server.log_path)
        result.artifacts.update({
            "launch_command.txt": command_text,
            "effective.json": _dump(result.effective),
            "server.log": log_text,
            "teardown.json": _dump(teardown),
        })
        (trial_dir / "effective.json").write_text(result.artifacts["effective.json"])
        (trial_dir / "result.json").write_text(_dump({k: v for k, v in result.to_json().items() if k != "artifacts"}))
        return result

    def _prepare_draft(self, settings: LiveSettings, plan: LaunchPlan, warnings: list[str]) -> list[int] | None:
        if plan.draft_dir is None:
            return None
        prepare_draft_dir(self.draft, settings.eagle_aux_hidden_state_layer_ids, plan.draft_dir)
        ids = draft_dir_ids(plan.draft_dir)
        if ids is None:
            warnings.append(f"{self.draft}/config.json has no eagle_config.eagle_aux_hidden_state_layer_ids: SGLang "
                            "silently captures its default layers; set eagle_aux_hidden_state_layer_ids")
        return ids

    def _measure(
        self,
        settings: LiveSettings,
        prompts: list[Prompt],
        server: procs.ServerProcess,
        client: SglangClient,
        requested: dict,
        expected: dict,
        written_ids: list[int] | None,
        warnings: list[str],
    ) -> TrialResult:
        """Readiness, read-back, warm-up, flush, benchmark; a failed trial on any failure."""
        s = self.server

        def fail(phase: str, effective: dict, timed_out: bool = False, reason: str = "") -> TrialResult:
            cls, why = classify_failure(phase, procs.read_log(server.log_path), timed_out)
            code = server.popen.poll()
            parts = [why, f"({reason})" if reason else "", f"exit code {code}" if code is not None else "running"]
            detail = " ".join(p for p in parts if p) + "\n--- server log tail ---\n" + procs.log_tail(server.log_path)
            return failed(self.name, requested, effective, cls, detail, warnings=warnings)

        state = client.wait_ready(server.exited, s.ready_timeout_s)
        if state != "ready":
            return fail("start" if state == "exited" else "ready_timeout", expected)
        server.snapshot()
        try:
            info = client.server_info()
        except RequestError as e:
            return fail("benchmark", expected, e.timed_out, str(e))
        effective = effective_settings(settings, info, written_ids)
        warnings += differences(settings, effective)
        sampling = {"max_new_tokens": settings.max_new_tokens, "temperature": settings.temperature}
        warm = [(p.id, p.input_ids) for p in prompts[: settings.warmup_prompts]]
        measured = [(p.id, p.input_ids) for p in prompts[settings.warmup_prompts :]]
        try:
            if warm:
                client.run_batch(warm, sampling, settings.concurrency)
            client.flush_cache()
            batch = client.run_batch(measured, sampling, settings.concurrency)
            server.snapshot()
            after = client.server_info()
        except RequestError as e:
            return fail("benchmark", effective, e.timed_out, str(e))
        return self._result(settings, requested, effective, batch, after, warnings)

    def _result(
        self, settings: LiveSettings, requested: dict, effective: dict, batch: Batch, info: dict, warnings: list[str]
    ) -> TrialResult:
        """The measured trial: throughput, accept length and its distribution, warnings."""
        records = []
        spec = not settings.is_baseline
        missing = 0
        for c in batch.completions:
            verify = c.verify_ct if c.verify_ct is not None else (None if spec else c.completion_tokens)
            missing += verify is None
            records.append(RequestRecord(c.id, c.prompt_tokens, c.completion_tokens, verify or 0, c.latency_s))
        tokens = sum(r.completion_tokens for r in records)
        verify_total = sum(r.verify_steps for r in records)
        if missing:
            warnings.append(f"{missing} answers carry no meta_info.spec_verify_ct; accept length is not measured")
        accept = tokens / verify_total if verify_total and not missing else float("nan")
        num_steps = int(effective.get("num_steps") or 0)
        hist, rates = _hist_and_rates(batch.completions, num_steps) if spec else ({1: tokens}, [])
        if spec and accept == 1.0:
            warnings.append("accept length is exactly 1.00: aux hidden-state capture is broken, or the algorithm is "
                            "EAGLE with an EAGLE-3 draft (use EAGLE3); not a weak draft")
        return TrialResult(
            self.name, "ok", requested, effective,
            output_tok_s=tokens / batch.wall_s if batch.wall_s > 0 else float("nan"),
            accept_length=accept, accept_length_hist=hist, accept_rate_per_position=rates,
            requests=records, wall_s=batch.wall_s,
            server_accept_length=_server_accept_length(info) if spec else None,
            warnings=warnings,
            artifacts={"server_info.json": _dump(_redact(info))},
        )

    def close(self) -> None:
        """Stop a server left from an incomplete teardown, if any."""
        if self._leftover is not None:
            procs.stop_server(self._leftover.server, 0.0)
            self._leftover = None


def _dump(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n"


def next_trial_number(log_dir: Path) -> int:
    """1 + the highest ``NNN-`` trial directory number already in ``log_dir``."""
    numbers = [int(p.name[:3]) for p in log_dir.glob("[0-9][0-9][0-9]-*") if p.is_dir()] if log_dir.is_dir() else []
    return max(numbers, default=0) + 1


def trial_dir_name(seq: int, requested: dict[str, Any]) -> str:
    return f"{seq:03d}-{trial_fingerprint(requested)}"


# ---------------------------------------------------------------------------------------------------
# dry run


@dataclass
class DryRun:
    """The launches a run would make, without making them."""

    plans: list[tuple[LiveSettings, LaunchPlan]]
    version: str | None
    flag_check: str  # "checked against `<cmd> --help`" or why not

    def text(self) -> str:
        """Human-readable: one block per trial with the exact command and its environment."""
        out = [f"# flags: {self.flag_check}; server version: {self.version or 'unknown'}"]
        for i, (_, plan) in enumerate(self.plans, 1):
            out += ["", f"## trial {i}", shlex.join(plan.argv)]
            out += [f"  env {k}={'<redacted>' if is_secret(k) else v}" for k, v in sorted(plan.env.items())]
            if plan.config_patch is not None:
                out.append(f"  {plan.draft_dir}/config.json gets {json.dumps(plan.config_patch)} "
                           f"(other files symlinked from the draft)")
            elif plan.draft_dir is not None:
                out.append(f"  {plan.draft_dir}: the draft's files symlinked, config.json unchanged")
            out += [f"  note: {n}" for n in plan.notes]
        return "\n".join(out) + "\n"

    def to_json(self) -> dict[str, Any]:
        return {
            "flag_check": self.flag_check,
            "version": self.version,
            "trials": [
                {"requested": s.model_dump(mode="json"), "argv": p.argv,
                 "env": {k: ("<redacted>" if is_secret(k) else v) for k, v in p.env.items()},
                 "draft_dir": str(p.draft_dir) if p.draft_dir else None, "config_patch": p.config_patch,
                 "notes": p.notes}
                for s, p in self.plans
            ],
        }


def dry_run(spec: Spec, settings: Sequence[LiveSettings], log_dir: Path, check_flags: bool = True) -> DryRun:
    """The exact launches for ``settings`` under ``spec``, nothing started or written.

    The draft's config.json is not read: each plan shows the patch the trial's copy would get, so a spec for
    a remote GPU machine can be checked anywhere. With ``check_flags`` the launch command is probed
    (``--help``); when it cannot run here the plans are shown unchecked and ``flag_check`` says why.
    """
    server = spec.engine.sglang
    target = spec.target if spec.target is not None else Path(server.model_path or "")
    if spec.target is None and server.model_path is None:
        raise BadInput(f"{spec.source}: key 'target' is missing (or set engine.sglang.model_path)")
    flags: ServerFlags | None = None
    if check_flags:
        try:
            flags = probe_flags(list(server.launch_command))
            flag_check = f"checked against `{shlex.join(server.launch_command)} --help`"
        except BadInput as e:
            flag_check = f"NOT checked ({e})"
    else:
        flag_check = "not checked (flag check off)"
    log_dir = Path(log_dir).resolve()
    seq = next_trial_number(log_dir)
    plans = []
    for i, s in enumerate(settings):
        trial_dir = log_dir / trial_dir_name(seq + i, s.model_dump(mode="json"))
        plan = plan_trial(s, server, target, trial_dir, procs.free_port(server.host), flags)
        if flags is None:
            plan.argv[0] = _resolved_or_given(plan.argv[0])
        plan.notes.append("the port is picked free at launch; this one was free now")
        plans.append((s, plan))
    return DryRun(plans, flags.version if flags else None, flag_check)


def _resolved_or_given(executable: str) -> str:
    try:
        return resolve_executable(executable)
    except BadInput:
        return executable
