"""The contract of a server engine's planner: what one trial will launch, judged by the server's own
code first.

Each engine that runs one server per trial (``sglang``, ``vllm``) plans its trials with a subclass
of :class:`BasePlanner`; the engine (:class:`~bisect_eagle.engines.served.ServedEngine`) and its
export hold one and call it in the order :class:`BasePlanner` documents.
"""

from __future__ import annotations

import abc
import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar

from bisect_eagle.engines.oracle import Description, OracleProcess
from bisect_eagle.engines.plan import TrialPlan, make_plan
from bisect_eagle.errors import BadInput
from bisect_eagle.spec.schema import ServerSpec
from bisect_eagle.spec.settings import LiveSettings


@dataclass
class BasePlanner(abc.ABC):
    """Plans the trials of one server spec: each request becomes a
    :class:`~bisect_eagle.engines.plan.TrialPlan` whose argv, environment and effective settings are
    what the server will run, or a refusal before any launch.

    The order of calls:

    1. Construction is cheap: nothing is read, probed or started (``check=False`` plans with the
       project's own reading of the server's rules only: no oracle is ever started).
    2. :meth:`plan` is called once per trial (a study plans every config before it runs one; the
       export plans a logged trial again). Its first call starts the server's oracle through
       :meth:`oracle` (which calls :meth:`_start_oracle` once) and reads the target's
       ``config.json`` (:attr:`target_config`, once); later calls reuse both. :meth:`plan` writes
       nothing of the trial.
    3. At launch the engine runs the plan's own launch (bound to its fingerprint) after
       :attr:`command`, and records :meth:`version`; the plan is never made again.
    4. :meth:`close` ends the oracle; a later :meth:`plan` would start a new one.

    What a planner could not ask the server is never reported as the server refusing:
    :meth:`checked_by` states in the plan what judged it (``<server> <version> parser and
    resolution`` or ``not checked against <server> (why)``).

    Args:
        server: the spec's ``engine.<name>``.
        target: the target model directory (the launch's model unless ``server.model_path``).
        draft: the draft directory (each trial serves a copy of it).
        check: False: plan with the project's own rules only (no oracle, no probe of the server).
    """

    server: ServerSpec
    target: Path
    draft: Path
    check: bool = True
    _oracle: OracleProcess | None = field(default=None, init=False)
    # why the server could not be asked (the first reason)
    _note: str | None = field(default=None, init=False)

    engine: ClassVar[str]  # the engine's kind, named by every plan: "sglang", "vllm"
    label: ClassVar[str]  # the server's name in a plan's ``checked``: "SGLang", "vLLM"
    resolution: ClassVar[str] = "resolution"  # what the server's own settings resolution is called
    # why a plan is unchecked when ``check`` is False
    without_check: ClassVar[str] = "no oracle for this server"

    # -- the contract ------------------------------------------------------------------------------

    @abc.abstractmethod
    def plan(self, settings: LiveSettings, *, port: int, draft_dir: Path) -> TrialPlan:
        """The trial's plan, its launch (bound to its fingerprint) in ``private["launch"]``.

        Args:
            settings: the request.
            port: the port the shown argv names.
            draft_dir: the draft directory the shown argv names (a trial's per-trial copy, or the
                draft itself for an export). Neither ``port`` nor ``draft_dir`` enters the identity;
                a launch sets its own.

        Returns:
            The plan: effective settings with every default explicit, warnings, ``checked``
            (:meth:`checked_by`), and either a refusal or the argv, environment and draft config
            patch the server will run.
        """

    @abc.abstractmethod
    def _resolve_command(self) -> list[str]:
        """The launch command with its executable resolved on this machine (called once, by
        :attr:`command`).

        Returns:
            The command; as written when its executable is not here (a spec for another machine),
            with the reason kept in ``_note``.
        """

    @abc.abstractmethod
    def _start_oracle(self) -> OracleProcess | None:
        """The server's oracle for this spec (not yet asked anything); called by :meth:`oracle`
        until it is made.

        Returns:
            The oracle, or None when this server has none.

        Raises:
            BadInput: the server's interpreter is not here (:meth:`oracle` keeps the reason in
                ``_note``).
        """

    # -- shared ------------------------------------------------------------------------------------

    @cached_property
    def command(self) -> list[str]:
        """The launch command with its executable resolved here (once), or as written when it is
        not here."""
        return self._resolve_command()

    def oracle(self) -> OracleProcess | None:
        """The server's oracle, started on first use; None with ``check=False`` or when it cannot
        be made.

        Returns:
            The oracle process, or None (the reason is kept for the plans' notes).
        """
        if not self.check:
            return None
        if self._oracle is None:
            try:
                self._oracle = self._start_oracle()
            except BadInput as e:
                self._note = self._note or str(e)
                return None
        return self._oracle

    def description(self) -> Description | None:
        """The server's parser as its own code builds it; None when the oracle does not run.

        Returns:
            The parser's description, or None.
        """
        oracle = self.oracle()
        return oracle.describe() if oracle is not None else None

    def version(self) -> str | None:
        """The server's version by its own oracle; None when it does not run or does not say.

        Returns:
            The version string, or None.
        """
        desc = self.description()
        return desc.version if desc is not None else None

    def checked_by(self, resolved: bool, note: str) -> str:
        """What judged a plan, for its ``checked``.

        Args:
            resolved: the server's own settings resolution ran on the plan.
            note: why it did not (shown after the parser's name).

        Returns:
            ``<server> <version> parser and <resolution>``, ``<server> <version> parser (<note>)``,
            or ``not checked against <server> (why)`` when its oracle does not run.
        """
        desc = self.description()
        if desc is not None:
            who = f"{self.label} {desc.version}" if desc.version else f"`{desc.prog}`"
            return f"{who} parser and {self.resolution}" if resolved else f"{who} parser ({note})"
        oracle = self.oracle()
        why = (
            (oracle.failure if oracle is not None else None)
            or self._note
            or (self.without_check if not self.check else "no oracle for this server")
        )
        return f"not checked against {self.label} ({self._unchecked(why)})"

    def made(
        self,
        settings: LiveSettings,
        effective: dict[str, Any],
        warnings: list[str],
        refusal: str | None,
        **launch: Any,
    ) -> TrialPlan:
        """The plan of this planner's engine from what its steps made.

        Args:
            settings: the request.
            effective: its effective settings.
            warnings: its warnings.
            refusal: why it is refused, or None.
            **launch: the rest of :func:`~bisect_eagle.engines.plan.make_plan`'s arguments
                (``argv``, ``env``, ``config_patch``, ``checked``).

        Returns:
            The plan.
        """
        return make_plan(
            self.engine, settings, effective=effective, warnings=warnings, refusal=refusal, **launch
        )

    def refused(
        self,
        settings: LiveSettings,
        effective: dict[str, Any],
        warnings: list[str],
        refusal: str,
        note: str,
    ) -> TrialPlan:
        """A plan refused before its launch was built (a flag the server does not take, a value no
        flag carries).

        Args:
            settings: the request.
            effective: its effective settings so far.
            warnings: its warnings so far.
            refusal: why it is refused.
            note: what its ``checked`` says the server's resolution did not run for
                (:meth:`checked_by`).

        Returns:
            The refused plan.
        """
        return self.made(
            settings, effective, warnings, refusal, checked=self.checked_by(False, note)
        )

    def _unchecked(self, why: str) -> str:
        """What an unchecked plan says in its ``checked`` besides ``why`` (default: ``why``
        alone)."""
        return why

    @cached_property
    def target_config(self) -> dict | None:
        """The target's ``config.json`` (``server.model_path``, else ``target``); None when not
        readable here."""
        return read_json(Path(self.server.model_path or self.target) / "config.json")

    def close(self) -> None:
        """End the oracle, if it started and is this planner's own (a shared one,
        :meth:`~bisect_eagle.engines.oracle.OracleProcess.shared`, is kept for the process)."""
        if self._oracle is not None and not self._oracle.is_shared:
            self._oracle.close()


def read_json(path: Path) -> dict | None:
    """A JSON object file; None when it is missing, unreadable or not an object.

    Args:
        path: the file.

    Returns:
        The object, or None.
    """
    try:
        cfg = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return cfg if isinstance(cfg, dict) else None


def server_limits(
    s: LiveSettings, resolved: dict[str, Any], *, keys: tuple[str, ...], limit: str
) -> dict[str, Any]:
    """The server's resolved values a plan records, and the concurrency they allow.

    Args:
        s: the request.
        resolved: the server's own resolution of the launch.
        keys: the resolved values recorded under ``effective["server"]``.
        limit: the one of ``keys`` that caps running requests (SGLang's ``max_running_requests``,
            vLLM's ``max_num_seqs``).

    Returns:
        ``{"server": {key: value}, "concurrency": the request's, capped by the limit}``.
    """
    server = {k: resolved[k] for k in keys if k in resolved}
    cap = server.get(limit)
    concurrency = min(s.concurrency, cap) if isinstance(cap, int) else s.concurrency
    return {"server": server, "concurrency": concurrency}
