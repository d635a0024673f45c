"""The server-trial lifecycle shared by the engines that run one HTTP server per trial (``sglang``, ``vllm``).

:class:`ServedEngine` holds what both do the same way: number the trial directories, load the prompts once, refuse
to launch while a previous server is not gone, start the server in its own process group on a free port with its
output in ``<trial dir>/server.log``, measure it over HTTP, tear it down (SIGTERM, grace, SIGKILL of the whole
group, wait for the port and the GPUs) and record the trial's artifacts with secrets scrubbed. Each engine
subclasses it with what differs: how a plan becomes an argv and environment (:meth:`ServedEngine._launch`), its
HTTP client (:attr:`ServedEngine.client_class`) and its measurement (:meth:`ServedEngine._measure`). Shared so the
two engines launch, refuse and tear down their servers in one way.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from bisect_eagle.artifacts.prompts import Prompt, load_prompts
from bisect_eagle.engines.base import Engine, TrialResult, combine_rounds, failed
from bisect_eagle.engines.oracle import InterpreterDied, died_line
from bisect_eagle.engines.plan import TrialPlan
from bisect_eagle.engines.procs import gpus
from bisect_eagle.engines.procs import server as procs
from bisect_eagle.errors import BadInput
from bisect_eagle.spec.settings import LiveSettings
from bisect_eagle.tracking.redact import Scrubber

# whether the interpreter has a module, found without importing it (a server's import takes seconds to minutes)
FIND_MODULE = "import importlib.util, sys; print(importlib.util.find_spec(sys.argv[1]) is not None)"


@dataclass
class Leftover:
    """A server whose teardown did not finish: the next launch waits for it or fails."""

    server: procs.ServerProcess
    host: str
    port: int
    reason: str


@dataclass
class ServedLaunch:
    """One trial's server launch, made by :meth:`ServedEngine._launch`.

    ``text`` is launch_command.txt as a failed start records it; ``saved_text`` as the trial directory and a
    started trial record it.
    """

    argv: list[str]
    env: dict[str, str]  # the trial's own variables (GPU baseline)
    process_env: dict[str, str]  # the server's whole environment
    text: str
    saved_text: str


class ServedEngine(Engine):
    """An engine that runs one server per trial (subclasses: the sglang and vllm engines).

    Subclasses set :attr:`name` and :attr:`client_class`, set :attr:`planner` in ``__init__`` after calling
    :meth:`_init_served`, and implement :meth:`_launch` and :meth:`_measure`.
    """

    client_class: ClassVar[type]
    rounds_share_launch: ClassVar[bool] = True

    def _init_served(self, server: Any, *, target: Path, draft: Path, prompts: Path | None, log_dir: Path) -> None:
        self.server = server
        self.target, self.draft = Path(target), Path(draft)
        self.prompts_path = None if prompts is None else Path(prompts)
        self.log_dir = Path(log_dir).resolve()  # the server may run elsewhere than here: absolute paths only
        self._prompts: list[Prompt] | None = None
        self._leftover: Leftover | None = None
        self._seq: int | None = None
        self._shown_port: int | None = None
        self._gpu_before: dict[int, int] | None = None  # device memory before the last launch (gpus.device_baseline)

    def check_launchable(self) -> None:
        """The launch command's executable is here, and an interpreter started with ``-m MODULE`` has that module
        (found, not imported): a missing, dying (:class:`~bisect_eagle.engines.oracle.InterpreterDied`) or
        server-less interpreter would otherwise create a study and a FAILED baseline, one launch later. A plan for
        another machine (a dry run) is never checked."""
        command = list(self.planner.command)
        key = f"engine.{self.name}.{'python' if self.server.python else 'launch_command'}"
        exe = command[0]
        if not (Path(exe).is_file() and os.access(exe, os.X_OK)) and shutil.which(exe) is None:
            raise BadInput(f"key {key!r}: {exe} is not an executable on this machine; point it at the "
                           f"{self.name} environment (scripts/setup_{self.name}_env.sh makes one)")
        if len(command) < 3 or command[1] != "-m":
            return
        module = command[2].split(".")[0]
        try:
            done = subprocess.run([exe, "-c", FIND_MODULE, module], capture_output=True, text=True, timeout=120,
                                  start_new_session=True)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise BadInput(f"key {key!r}: {exe} did not run ({e})") from None
        if done.returncode != 0 or done.stdout.strip() not in ("True", "False"):  # it died before it could answer
            raise InterpreterDied(f"key {key!r}: " + died_line(
                exe, done.returncode, done.stderr, fix=f"point it at a working {self.name} environment "
                f"(scripts/setup_{self.name}_env.sh makes one)"))
        if done.stdout.strip() != "True":
            raise BadInput(f"key {key!r}: {exe} has no {module!r} module, so `{' '.join(command[:3])}` cannot "
                           f"start; point it at an environment with {module} (scripts/setup_{self.name}_env.sh)")

    @classmethod
    def from_spec(cls, spec: Any, log_dir: Path, *, check: bool = True) -> ServedEngine:
        """The engine of a spec of this kind (``spec.engine.<name>``); nothing is probed or written until used.

        Args:
            spec: the validated spec.
            log_dir: where the per-trial server logs and draft copies go.
            check: judge plans by the server's own parser (its oracle) when it is at hand.
        """
        server, target = cls._served_args(spec)
        return cls(server, target=target, draft=spec.draft, prompts=spec.prompts, log_dir=log_dir, check=check)

    @classmethod
    def _served_args(cls, spec: Any) -> tuple[Any, Path]:
        """``(engine.<name>, target)`` of a spec; :class:`BadInput` when the target or the draft is missing."""
        server = getattr(spec.engine, cls.name)
        if spec.target is None and server.model_path is None:
            raise BadInput(f"{spec.source}: key 'target' is missing (or set engine.{cls.name}.model_path)")
        target = spec.target if spec.target is not None else Path(server.model_path or "")
        if spec.draft is None:
            raise BadInput(f"{spec.source}: key 'draft' is missing (give a path, or 'scenario: NAME')")
        return server, target

    def _next_seq(self) -> int:
        if self._seq is None:
            self._seq = next_trial_number(self.log_dir)
        return self._seq

    def _planned_port(self) -> int:
        """The port a plan's argv shows: one free now (each launch picks its own)."""
        if self._shown_port is None:
            self._shown_port = procs.free_port(self.server.host)
        return self._shown_port

    def _load_prompts(self, need: int) -> list[Prompt]:
        """The first ``need`` prompts, tokenized by the target's tokenizer (loaded once)."""
        from transformers import AutoTokenizer

        if self.prompts_path is None:
            raise BadInput(f"a live {self.name} trial needs the spec's key 'prompts'")
        if self._prompts is None:
            tokenizer = AutoTokenizer.from_pretrained(self.server.model_path or str(self.target), local_files_only=True)
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
                            f"(engine.{self.name}.stop_grace_s) and was killed with SIGKILL")
        if stop.survivors:
            reasons.append(f"processes {stop.survivors} survived SIGKILL")
        if port_s is None:
            reasons.append(f"port {port} still taken after {s.gpu_release_timeout_s:g} s")
        if gpu.status == "held":
            reasons.append(f"{gpu.reason} after {s.gpu_release_timeout_s:g} s")
        if reasons:
            reason = "; ".join(reasons)
            self._leftover = Leftover(server, s.host, port, reason)
            warnings.append(f"teardown incomplete: {reason}; the next launch waits for it or fails")
        return report, warnings

    # -- one trial --------------------------------------------------------------------------------------

    def _check_plan(self, plan: TrialPlan) -> None:
        """Raise before anything happens when ``plan`` cannot be run by this engine (beyond its refusal)."""

    def _launch(self, plan: TrialPlan, *, trial_dir: Path, port: int) -> ServedLaunch:
        """The trial's argv and environment; prepares the draft copy and creates ``trial_dir``."""
        raise NotImplementedError

    def _measure(self, settings: LiveSettings, *, prompts: list[Prompt], server: procs.ServerProcess, client: Any,
                 requested: dict, planned: dict, warnings: list[str], scrub: Scrubber) -> TrialResult:
        """Readiness, read-back, warm-up, the measured requests; a failed trial on any failure."""
        raise NotImplementedError

    def _measure_again(self, settings: LiveSettings, *, server: procs.ServerProcess, client: Any, first: TrialResult,
                       scrub: Scrubber) -> TrialResult | None:
        """One more benchmark round on the running server of ``first``'s round: its cache flushed, the measured
        requests again; None (with a warning on ``first``) when this server's cache cannot be flushed."""
        raise NotImplementedError

    def run(self, plan: TrialPlan) -> TrialResult:
        """One live trial on a fresh server (one benchmark round): :meth:`run_rounds` with ``rounds=1``."""
        return self.run_rounds(plan, rounds=1)

    def run_rounds(self, plan: TrialPlan, *, rounds: int) -> TrialResult:
        """One launch of a fresh server measuring ``rounds`` benchmark rounds (its cache flushed between them);
        failures come back as failed trials with a class (a round after the first that fails fails the trial).

        Args:
            plan: a plan of this engine's :meth:`plan` (run as planned).
            rounds: benchmark rounds on this launch (≥ 1).

        Raises:
            BadInput: ``plan`` is refused (callers check ``plan.refusal`` first), or the draft cannot be copied.
        """
        start = time.perf_counter()
        if plan.refusal is not None:
            raise BadInput(plan.refusal)
        self._check_plan(plan)
        settings = plan.settings
        requested, planned = plan.requested, dict(plan.effective)
        warnings = list(plan.warnings)
        seq = self._next_seq()
        self._seq = seq + 1
        trial_dir = self.log_dir / f"{seq:03d}-{plan.fingerprint}"
        scrub = Scrubber({"env": settings.env, "server_args": settings.server_args})
        blocked = self._still_blocked()
        if blocked is not None:
            return failed(self.name, requested=requested, effective=planned, cls="launch_error", detail=blocked,
                          warnings=warnings, artifacts={"launch_command.txt": "(not launched)\n",
                                                        "effective.json": dump(planned), "server.log": ""})
        prompts = self._load_prompts(settings.warmup_prompts + settings.num_prompts)
        port = procs.free_port(self.server.host)
        launch = self._launch(plan, trial_dir=trial_dir, port=port)
        argv = launch.argv
        (trial_dir / "launch_command.txt").write_text(scrub(launch.saved_text))  # secrets by value too
        self._gpu_before = gpus.device_baseline({**os.environ, **launch.env})
        try:
            server = procs.start_server(argv, launch.process_env, log_path=trial_dir / "server.log",
                                        log_dir=self.log_dir, host=self.server.host, port=port,
                                        grace_s=self.server.stop_grace_s,
                                        meta={"trial": seq, "trial_dir": str(trial_dir),
                                              "fingerprint": plan.fingerprint})
        except OSError as e:
            return failed(self.name, requested=requested, effective=planned, cls="launch_error",
                          detail=f"cannot start {argv[0]}: {e}", warnings=warnings,
                          artifacts={"launch_command.txt": scrub(launch.text), "effective.json": dump(planned),
                                     "server.log": ""})
        client = self.client_class(f"http://{self.server.host}:{port}", self.server.request_timeout_s,
                                   api_key=settings.server_args.get("api_key"))
        try:
            result = self._measure(settings, prompts=prompts, server=server, client=client, requested=requested,
                                   planned=planned, warnings=warnings, scrub=scrub)
            done = [result]
            while result.ok and len(done) < rounds:
                again = self._measure_again(settings, server=server, client=client, first=result, scrub=scrub)
                if again is None:
                    break
                if not again.ok:
                    result = again
                    break
                done.append(again)
            if result.ok:
                result = combine_rounds(done)
        finally:
            teardown, teardown_warnings = self._teardown(server, port)
            client.close()
        result.warnings += teardown_warnings
        log_text = scrub(procs.read_log(server.log_path))
        server.log_path.write_text(log_text)  # the local copy too: no secret the server printed stays on disk
        result.artifacts.update({"launch_command.txt": scrub(launch.saved_text),
                                 "effective.json": dump(result.effective), "server.log": log_text,
                                 "teardown.json": dump(teardown)})
        (trial_dir / "effective.json").write_text(result.artifacts["effective.json"])
        if result.ok:
            result.launch_s = max(0.0, time.perf_counter() - start - result.wall_s)
        body = {k: v for k, v in result.to_json().items() if k != "artifacts"}
        (trial_dir / "result.json").write_text(scrub(dump(body)))
        return result

    def close(self) -> None:
        """Stop a server left from an incomplete teardown, if any, and the engine's oracle."""
        if self._leftover is not None:
            procs.stop_server(self._leftover.server, grace_s=0.0)
            self._leftover = None
        self.planner.close()


def dump(obj: Any) -> str:
    """An artifact's JSON text: indented, keys sorted, anything else as its ``str``."""
    return json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n"


def next_trial_number(log_dir: Path) -> int:
    """1 + the highest ``NNN-`` trial directory number already in ``log_dir``."""
    numbers = [int(p.name[:3]) for p in log_dir.glob("[0-9][0-9][0-9]-*") if p.is_dir()] if log_dir.is_dir() else []
    return max(numbers, default=0) + 1
