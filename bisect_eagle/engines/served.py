"""The server-trial lifecycle shared by the engines that run one HTTP server per trial (``sglang``,
``vllm``).

:class:`ServedEngine` holds what both do the same way: plan with the engine's planner (a
:class:`~bisect_eagle.engines.planner.BasePlanner`), number the trial directories, load the prompts
once, refuse to launch while a previous server is not gone, start the server in its own process
group on a free port with its output in ``<trial dir>/server.log``, measure it over HTTP, tear it
down (SIGTERM, grace, SIGKILL of the whole group, wait for the port and the GPUs), record the
trial's artifacts with secrets scrubbed, classify a failed trial from the server's log
(:class:`FailureLog`: one order of the questions, each server's own answers) into one failure
detail, and frame a logged trial's export. Each engine subclasses it with what differs: its planner
(:attr:`ServedEngine.planner_class`), how a plan becomes an argv and environment
(:meth:`ServedEngine._launch`), its HTTP client (:attr:`ServedEngine.client_class`), its failure log
(:attr:`ServedEngine.failures`), its measurement (:meth:`ServedEngine._measure`) and what its export
adds (:attr:`ServedEngine.exporter`). Shared so the two engines plan, launch, refuse, fail, export
and tear down their servers in one way.
"""

from __future__ import annotations

import abc
import json
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from bisect_eagle.artifacts.prompts import Prompt, load_prompts
from bisect_eagle.engines.base import Engine, FailureClass, TrialResult, combine_rounds, failed
from bisect_eagle.engines.httpclient import RequestError
from bisect_eagle.engines.oracle import InterpreterDied, died_line
from bisect_eagle.engines.plan import TrialPlan
from bisect_eagle.engines.planner import BasePlanner
from bisect_eagle.engines.procs import gpus
from bisect_eagle.engines.procs import server as procs
from bisect_eagle.errors import BadInput
from bisect_eagle.spec.schema import ServerSpec, Spec
from bisect_eagle.spec.settings import LiveSettings
from bisect_eagle.tracking.redact import Scrubber, is_hidden

# whether the interpreter has a module, found without importing it (a server's import takes seconds
# to minutes)
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

    ``text`` is launch_command.txt as a failed start records it; ``saved_text`` as the trial
    directory and a started trial record it.
    """

    argv: list[str]
    env: dict[str, str]  # the trial's own variables (GPU baseline)
    process_env: dict[str, str]  # the server's whole environment
    text: str
    saved_text: str


class FailureLog(abc.ABC):
    """How one server's log says why a trial failed; :meth:`classify` asks the same questions in the
    same order for every server, each subclass answers them from its server's own messages.

    The order: before ready (phase ``start``), the server's refusal of its arguments
    (:meth:`bad_arguments`); in any phase, out of memory (:meth:`out_of_memory`), then the draft's
    aux hidden-state capture (:meth:`capture_error`); then by phase: another reason a start failed
    (:meth:`start_error`), a readiness timeout, a request that got no answer, a crash during the
    benchmark (:meth:`crash`).
    """

    engine: ClassVar[str]  # the engine whose request_timeout_s a hung request names
    ready_probe: ClassVar[str]  # what readiness waits for, as a failure says it

    @abc.abstractmethod
    def bad_arguments(self, log: str) -> str | None:
        """Args: log: the server's log. Returns: the line of the server refusing its arguments,
        or None."""

    @abc.abstractmethod
    def out_of_memory(self, log: str) -> str | None:
        """Args: log: the server's log. Returns: the line of an out-of-memory error, or None."""

    @abc.abstractmethod
    def capture_error(self, log: str) -> str | None:
        """Args: log: the server's log. Returns: the line of an aux hidden-state or ``fc`` width
        error, or None."""

    @abc.abstractmethod
    def start_error(self, log: str) -> tuple[FailureClass, str]:
        """Args: log: the log of a server that exited before ready for none of the reasons above.
        Returns: (its class, the line behind it)."""

    def crash(self, log: str) -> str:
        """Args: log: the log of a server whose request failed. Returns: why, for a person."""
        return "a request failed during the benchmark"

    def classify(
        self, phase: str, log: str, *, timed_out: bool = False
    ) -> tuple[FailureClass, str]:
        """(failure class, the log line or reason behind it) for a trial that failed in ``phase``.

        Args:
            phase: ``start`` (exited before ready), ``ready_timeout`` or ``benchmark``.
            log: the server's log.
            timed_out: the failed request got no answer in time.

        Returns:
            One of :data:`~bisect_eagle.engines.base.FAILURE_CLASSES` and why.
        """
        if phase == "start":
            line = self.bad_arguments(log)
            if line is not None:
                return "bad_arguments", line
        line = self.out_of_memory(log)
        if line is not None:
            return "out_of_memory", line
        line = self.capture_error(log)
        if line is not None:
            return "capture_error", line
        if phase == "start":
            return self.start_error(log)
        if phase == "ready_timeout":
            return "readiness_timeout", f"the server did not answer {self.ready_probe} in time"
        if timed_out:
            return (
                "hung_request",
                f"a request got no answer within engine.{self.engine}.request_timeout_s",
            )
        return "crash_during_benchmark", self.crash(log)


class ServedEngine(Engine):
    """An engine that runs one server per trial (subclasses: the sglang and vllm engines).

    Subclasses set :attr:`name`, :attr:`planner_class`, :attr:`client_class`, :attr:`failures` and
    :attr:`exporter`, and implement :meth:`_check_plan`, :meth:`_launch`, :meth:`_measure` and
    :meth:`_measure_again`.

    Args:
        server: the spec's ``engine.<name>``.
        target: the target model directory (also the tokenizer of the prompts).
        draft: the draft directory (copied per trial).
        prompts: the prompts JSONL file (None: a live trial refuses to run).
        log_dir: per-trial directories (server log, launch command, draft copy, result) go here.
        check: False: plan without the server's oracle (the project's own reading of its rules).
    """

    planner_class: ClassVar[type[BasePlanner]]
    client_class: ClassVar[type]
    failures: ClassVar[FailureLog]
    # the exported plan of a logged trial and what the export says besides export()'s keys (they
    # replace those of the same name): (planner, requested settings, *, effective, port) -> (plan,
    # extra); the planner is closed by export()
    exporter: ClassVar[Callable[..., tuple[TrialPlan, dict[str, Any]]]]
    rounds_share_launch: ClassVar[bool] = True
    planner: BasePlanner

    def __init__(
        self,
        server: ServerSpec,
        *,
        target: Path,
        draft: Path,
        prompts: Path | None,
        log_dir: Path,
        check: bool = True,
    ):
        self.server = server
        self.target, self.draft = Path(target), Path(draft)
        self.prompts_path = None if prompts is None else Path(prompts)
        # the server may run elsewhere than here: absolute paths only
        self.log_dir = Path(log_dir).resolve()
        self._prompts: list[Prompt] | None = None
        self._leftover: Leftover | None = None
        self._seq: int | None = None
        self._shown_port: int | None = None
        # device memory before the last launch (gpus.device_baseline)
        self._gpu_before: dict[int, int] | None = None
        self.planner = self.planner_class(server, self.target, self.draft, check=check)

    def check_launchable(self) -> None:
        """The launch command's executable is here, and an interpreter started with ``-m MODULE``
        has that module (found, not imported): a missing, dying
        (:class:`~bisect_eagle.engines.oracle.InterpreterDied`) or server-less interpreter would
        otherwise create a study and a FAILED baseline, one launch later. A plan for another machine
        (a dry run) is never checked."""
        command = list(self.planner.command)
        key = f"engine.{self.name}.{'python' if self.server.python else 'launch_command'}"
        exe = command[0]
        if not (Path(exe).is_file() and os.access(exe, os.X_OK)) and shutil.which(exe) is None:
            raise BadInput(
                f"key {key!r}: {exe} is not an executable on this machine; point it at the "
                f"{self.name} environment (scripts/setup_{self.name}_env.sh makes one)"
            )
        if len(command) < 3 or command[1] != "-m":
            return
        module = command[2].split(".")[0]
        try:
            done = subprocess.run(
                [exe, "-c", FIND_MODULE, module],
                capture_output=True,
                text=True,
                timeout=120,
                start_new_session=True,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise BadInput(f"key {key!r}: {exe} did not run ({e})") from None
        # it died before it could answer
        if done.returncode != 0 or done.stdout.strip() not in ("True", "False"):
            raise InterpreterDied(
                f"key {key!r}: "
                + died_line(
                    exe,
                    done.returncode,
                    done.stderr,
                    fix=f"point it at a working {self.name} environment "
                    f"(scripts/setup_{self.name}_env.sh makes one)",
                )
            )
        if done.stdout.strip() != "True":
            raise BadInput(
                f"key {key!r}: {exe} has no {module!r} module, so `{' '.join(command[:3])}` cannot "
                f"start; point it at an environment with {module} "
                f"(scripts/setup_{self.name}_env.sh)"
            )

    @classmethod
    def from_spec(cls, spec: Any, log_dir: Path, *, check: bool = True) -> ServedEngine:
        """The engine of a spec of this kind (``spec.engine.<name>``); nothing is probed or written
        until used.

        Args:
            spec: the validated spec.
            log_dir: where the per-trial server logs and draft copies go.
            check: judge plans by the server's own parser (its oracle) when it is at hand.
        """
        server, target = cls._served_args(spec)
        return cls(
            server,
            target=target,
            draft=spec.draft,
            prompts=spec.prompts,
            log_dir=log_dir,
            check=check,
        )

    @classmethod
    def _served_args(cls, spec: Any) -> tuple[Any, Path]:
        """``(engine.<name>, target)`` of a spec; :class:`BadInput` when the target or the draft is
        missing."""
        server = getattr(spec.engine, cls.name)
        if spec.target is None and server.model_path is None:
            raise BadInput(
                f"{spec.source}: key 'target' is missing (or set engine.{cls.name}.model_path)"
            )
        target = spec.target if spec.target is not None else Path(server.model_path or "")
        if spec.draft is None:
            raise BadInput(
                f"{spec.source}: key 'draft' is missing (give a path, or 'scenario: NAME')"
            )
        return server, target

    def plan(self, settings: LiveSettings) -> TrialPlan:
        """The trial as the server will run it (:meth:`BasePlanner.plan`, shown with a free port
        and the next trial directory's draft copy); writes nothing, starts only the oracle.

        Args:
            settings: the trial's requested settings.

        Returns:
            The plan, its launch kept in ``private`` for :meth:`run`.
        """
        return self.planner.plan(
            settings,
            port=self._planned_port(),
            draft_dir=self.log_dir / f"{self._next_seq():03d}-trial" / "draft",
        )

    # -- a logged trial's export -------------------------------------------------------------------

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
        """How to serve a logged trial on this engine's server (:meth:`Engine.export`: its arguments
        and the keys it returns): the trial planned again by this engine's planner
        (:attr:`exporter`: what was measured), the draft itself (or a copy beside it) in the argv;
        secret values never printed (``$NAME`` in the environment, a hash (``<redacted sha256:…>``)
        in the argv). Nothing is written.

        Args:
            spec: the study's spec.
            settings: the trial's requested settings (as logged).
            effective: the trial's effective settings (as logged).
            port: the exported server's port.
            python: the interpreter that has the server; None keeps the spec's.

        Returns:
            :meth:`Engine.export`'s keys, ``interpreter_note`` (what to point ``python3`` at on the
            node; None when
            the interpreter is known: :func:`node_argv`) and what :attr:`exporter` adds.

        Raises:
            BadInput: a speculative trial of a spec without a draft.
        """
        server = getattr(spec.engine, cls.name)
        if python:
            server = server.model_copy(update={"python": python})
        if spec.draft is None and not settings.is_baseline:
            raise BadInput(
                f"{spec.source}: key 'draft' is missing: a speculative trial cannot be exported"
            )
        target = spec.target if spec.target is not None else Path(server.model_path or "")
        draft = Path(spec.draft) if spec.draft is not None else Path(".")
        planner = cls.planner_class(server, Path(target), draft)
        try:
            plan, extra = cls.exporter(planner, settings, effective=effective, port=port)
        finally:
            planner.close()
        argv, note = cls._node_argv(list(plan.argv or []), server=server, checked=plan.checked)
        env = {k: (f"${k}" if is_hidden(v) else v) for k, v in (plan.env or {}).items()}
        return {
            "argv": argv,
            "command": shlex.join(argv),
            "env": env,
            "draft_config": None if settings.is_baseline else str(draft / "config.json"),
            "draft_config_patch": plan.config_patch,
            "checked": plan.checked,
            "refusal": plan.refusal,
            "fingerprint": plan.fingerprint,
            "warnings": list(plan.warnings),
            "interpreter_note": note,
            **extra,
        }

    @classmethod
    def _node_argv(
        cls, argv: list[str], *, server: ServerSpec, checked: str
    ) -> tuple[list[str], str | None]:
        """The exported argv as it runs on the node (:func:`node_argv`), and a note on its
        interpreter."""
        return node_argv(
            argv,
            launch_command=list(server.launch_command),
            python=server.python,
            checked=checked,
            label=cls.planner_class.label,
            key=cls.name,
        )

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
            tokenizer = AutoTokenizer.from_pretrained(
                self.server.model_path or str(self.target), local_files_only=True
            )
            self._prompts = load_prompts(self.prompts_path, tokenizer)
        if need > len(self._prompts):
            raise BadInput(
                f"{self.prompts_path}: warmup_prompts + num_prompts = {need}, but the file has "
                f"only {len(self._prompts)} prompts"
            )
        return self._prompts[:need]

    # -- teardown of a previous server
    # ------------------------------------------------------------------

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
        return (
            f"the previous server is not gone ({left.reason}; now: processes {alive}, GPU memory "
            f"{gpu.status} ({gpu.reason}), port {left.port} {'free' if port_free else 'taken'}); "
            "refusing to start another"
        )

    def _teardown(self, server: procs.ServerProcess, port: int) -> tuple[dict[str, Any], list[str]]:
        """Stop the server and wait for its port and GPUs; (report, warnings). Remembers a server
        that stays."""
        s = self.server
        stop = procs.stop_server(server, grace_s=s.stop_grace_s)
        port_s = procs.wait_port_free(s.host, port, timeout_s=s.gpu_release_timeout_s)
        gpu = gpus.wait_gpu_release(
            pids=server.seen, timeout_s=s.gpu_release_timeout_s, baseline=self._gpu_before
        )
        report = {
            "signal": stop.signal,
            "stop_s": round(stop.stop_s, 3),
            "exit_code": stop.exit_code,
            "port_free_s": None if port_s is None else round(port_s, 3),
            "gpu_release": gpu.status,
            "gpu_release_s": None if gpu.seconds is None else round(gpu.seconds, 3),
            "gpu_release_method": gpu.method,
            "gpu_release_detail": gpu.reason,
            "pids": sorted(server.seen),
            "survivors": stop.survivors,
            "orphans": [o.__dict__ for o in stop.orphans],
        }
        warnings, reasons = list(stop.warnings), []
        if stop.signal == "SIGKILL":
            warnings.append(
                f"the server did not exit within {s.stop_grace_s:g} s of SIGTERM "
                f"(engine.{self.name}.stop_grace_s) and was killed with SIGKILL"
            )
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

    # -- one trial
    # --------------------------------------------------------------------------------------

    @abc.abstractmethod
    def _check_plan(self, plan: TrialPlan) -> None:
        """Raise before anything happens when ``plan`` cannot be run by this engine (beyond its
        refusal).

        Args:
            plan: the plan about to run.

        Raises:
            RuntimeError: ``plan`` carries no launch of its own identity (a bug, never a trial
                outcome).
        """

    @abc.abstractmethod
    def _launch(self, plan: TrialPlan, *, trial_dir: Path, port: int) -> ServedLaunch:
        """The trial's argv and environment; prepares the draft copy and creates ``trial_dir``.

        Args:
            plan: the plan to run (checked by :meth:`_check_plan`).
            trial_dir: the trial's directory (created here).
            port: the port the server listens on.

        Returns:
            The launch: the plan's own argv with ``port`` and the draft copy, its environment and
            its text.
        """

    @abc.abstractmethod
    def _measure(
        self,
        settings: LiveSettings,
        *,
        prompts: list[Prompt],
        server: procs.ServerProcess,
        client: Any,
        requested: dict,
        planned: dict,
        warnings: list[str],
        scrub: Scrubber,
    ) -> TrialResult:
        """Read-back, warm-up, the measured requests of the first round, on a server that answers as
        ready.

        Args:
            settings: the trial's settings.
            prompts: the warm-up prompts, then the measured ones.
            server: the started server, ready.
            client: its :attr:`client_class` client.
            requested, planned: the plan's requested and effective settings.
            warnings: the plan's warnings (the result's, extended).
            scrub: the trial's secret scrubber.

        Returns:
            The measured trial, or a failed one (:meth:`_failure`) on any failure.
        """

    @abc.abstractmethod
    def _measure_again(
        self,
        settings: LiveSettings,
        *,
        server: procs.ServerProcess,
        client: Any,
        first: TrialResult,
        scrub: Scrubber,
    ) -> TrialResult | None:
        """One more benchmark round on the running server of ``first``'s round.

        Args:
            settings: the trial's settings.
            server, client: the running server and its client.
            first: the first round's result.
            scrub: the trial's secret scrubber.

        Returns:
            The round (its cache flushed, the measured requests again), a failed trial, or None
            (with a warning on ``first``) when this server's cache cannot be flushed.
        """

    def _settle(self, server: procs.ServerProcess) -> None:
        """Before a failed request is classified: let a server that is dying finish (default: at
        once)."""

    def _failure_notes(self, phase: str, log: str) -> list[str]:
        """What a failure detail says besides the class's reason, from the server's log (default:
        nothing)."""
        return []

    def _benchmark_failure(
        self,
        server: procs.ServerProcess,
        requested: dict,
        warnings: list[str],
        scrub: Scrubber,
        effective: dict,
        e: RequestError,
    ) -> TrialResult:
        """A request of the benchmark phase that failed, as a failed trial (:meth:`_failure`);
        positional, so that an engine binds its trial's first four with :func:`functools.partial`.

        Args:
            server: the trial's server.
            requested: the trial's requested settings.
            warnings: the trial's warnings.
            scrub: the trial's secret scrubber.
            effective: the trial's effective settings so far.
            e: the failed request.

        Returns:
            The failed trial, ``timed_out`` as the request was.
        """
        return self._failure(
            "benchmark",
            server=server,
            requested=requested,
            effective=effective,
            warnings=warnings,
            scrub=scrub,
            timed_out=e.timed_out,
            reason=str(e),
        )

    def _later_failure(
        self, server: procs.ServerProcess, first: TrialResult, scrub: Scrubber, e: RequestError
    ) -> TrialResult:
        """A request of a benchmark round after the first that failed, as a failed trial
        (:meth:`_failure`, ``later``); positional, so that an engine can bind its trial's first
        three with :func:`functools.partial`.

        Args:
            server: the trial's server.
            first: the launch's first round (its settings and warnings).
            scrub: the trial's secret scrubber.
            e: the failed request.

        Returns:
            The failed trial.
        """
        return self._failure(
            "benchmark",
            server=server,
            requested=first.requested,
            effective=first.effective,
            warnings=list(first.warnings),
            scrub=scrub,
            timed_out=e.timed_out,
            reason=str(e),
            later=True,
        )

    def _failure(
        self,
        phase: str,
        *,
        server: procs.ServerProcess,
        requested: dict,
        effective: dict,
        warnings: list[str],
        scrub: Scrubber,
        timed_out: bool = False,
        reason: str = "",
        later: bool = False,
    ) -> TrialResult:
        """A failed trial classified from the server's log at ``phase`` (:attr:`failures`), with its
        log tail.

        Args:
            phase: ``start``, ``ready_timeout`` or ``benchmark``.
            server: the trial's server.
            requested, effective: the trial's settings so far.
            warnings: the trial's warnings.
            scrub: the trial's secret scrubber (the detail quotes the log).
            timed_out: the failed request got no answer in time.
            reason: the client's error, shown in parentheses.
            later: the failure is in a benchmark round after the first.

        Returns:
            The failed trial: its class, and the reason, the server's state and its log tail as the
            detail.
        """
        if phase == "benchmark" and not timed_out:
            self._settle(server)
        log = procs.read_log(server.log_path)
        cls, why = self.failures.classify(phase, log, timed_out=timed_out)
        code = server.popen.poll()
        parts = [
            why,
            f"({reason})" if reason else "",
            "in a later benchmark round" if later else "",
            *self._failure_notes(phase, log),
            f"exit code {code}" if code is not None else "running",
        ]
        tail = procs.log_tail(server.log_path)
        detail = " ".join(p for p in parts if p) + "\n--- server log tail ---\n" + tail
        return failed(
            self.name,
            requested=requested,
            effective=effective,
            cls=cls,
            detail=scrub(detail),
            warnings=warnings,
        )

    def run(self, plan: TrialPlan) -> TrialResult:
        """One live trial on a fresh server (one benchmark round): :meth:`run_rounds` with
        ``rounds=1``.

        Args:
            plan: a plan of this engine's :meth:`plan`.

        Returns:
            The trial's result.
        """
        return self.run_rounds(plan, rounds=1)

    def run_rounds(self, plan: TrialPlan, *, rounds: int) -> TrialResult:
        """One launch of a fresh server measuring ``rounds`` benchmark rounds (its cache flushed
        between them); failures come back as failed trials with a class (a round after the first
        that fails fails the trial).

        Args:
            plan: a plan of this engine's :meth:`plan` (run as planned).
            rounds: benchmark rounds on this launch (≥ 1).

        Returns:
            The rounds combined; a failed result with its class when the launch or a round fails.

        Raises:
            BadInput: ``plan`` is refused (callers check ``plan.refusal`` first), or the draft
                cannot be copied.
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
            return failed(
                self.name,
                requested=requested,
                effective=planned,
                cls="launch_error",
                detail=blocked,
                warnings=warnings,
                artifacts={
                    "launch_command.txt": "(not launched)\n",
                    "effective.json": dump(planned),
                    "server.log": "",
                },
            )
        prompts = self._load_prompts(settings.warmup_prompts + settings.num_prompts)
        port = procs.free_port(self.server.host)
        launch = self._launch(plan, trial_dir=trial_dir, port=port)
        argv = launch.argv
        # secrets by value too
        (trial_dir / "launch_command.txt").write_text(scrub(launch.saved_text))
        self._gpu_before = gpus.device_baseline({**os.environ, **launch.env})
        try:
            server = procs.start_server(
                argv,
                launch.process_env,
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
                artifacts={
                    "launch_command.txt": scrub(launch.text),
                    "effective.json": dump(planned),
                    "server.log": "",
                },
            )
        client = self.client_class(
            f"http://{self.server.host}:{port}",
            self.server.request_timeout_s,
            api_key=settings.server_args.get("api_key"),
        )
        try:
            state = client.wait_ready(server.exited, timeout_s=self.server.ready_timeout_s)
            if state != "ready":
                phase = "start" if state == "exited" else "ready_timeout"
                result = self._failure(
                    phase,
                    server=server,
                    requested=requested,
                    effective=planned,
                    warnings=warnings,
                    scrub=scrub,
                )
            else:
                server.snapshot()
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
            done = [result]
            while result.ok and len(done) < rounds:
                again = self._measure_again(
                    settings, server=server, client=client, first=result, scrub=scrub
                )
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
        # the local copy too: no secret the server printed stays on disk
        server.log_path.write_text(log_text)
        result.artifacts.update(
            {
                "launch_command.txt": scrub(launch.saved_text),
                "effective.json": dump(result.effective),
                "server.log": log_text,
                "teardown.json": dump(teardown),
            }
        )
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


def node_argv(
    argv: list[str],
    *,
    launch_command: list[str],
    python: str | None,
    checked: str,
    label: str,
    key: str,
) -> tuple[list[str], str | None]:
    """An exported launch's argv as it runs on the node, and a note on its interpreter (None when it
    is known).

    Args:
        argv: the plan's argv, its program resolved on this machine.
        launch_command: the spec's ``engine.<key>.launch_command`` (``[python, -m, MODULE]``).
        python: the interpreter that has the server (spec or ``--<key>-python``), None when not
            given.
        checked: what checked the plan; ``not checked ...`` when this machine's interpreter cannot
            import the server.
        label: the server's name (``SGLang``, ``vLLM``).
        key: the engine's name (``sglang``, ``vllm``).

    Returns:
        ``argv`` as it is when its interpreter is known (given, named by the launch command, or this
        machine's that has the server), else ``python3`` in its place and what to point ``python3``
        at.
    """
    head = launch_command[0] if launch_command else ""
    known = python or "/" in head or not head.startswith("python")
    if known or not argv or not checked.startswith("not checked"):
        return argv, None
    return ["python3", *argv[1:]], (
        f"python3: the interpreter that has {label} on the node (its environment's bin/python); "
        f"set engine.{key}.python in the spec or give --{key}-python to print its path here"
    )


def dump(obj: Any) -> str:
    """An artifact's JSON text: indented, keys sorted, anything else as its ``str``.

    Args:
        obj: what to write.

    Returns:
        The text, ending in a newline.
    """
    return json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n"


def next_trial_number(log_dir: Path) -> int:
    """1 + the highest ``NNN-`` trial directory number already in ``log_dir``."""
    numbers = (
        [int(p.name[:3]) for p in log_dir.glob("[0-9][0-9][0-9]-*") if p.is_dir()]
        if log_dir.is_dir()
        else []
    )
    return max(numbers, default=0) + 1
