"""``bisect-eagle doctor``: static checks of a spec before any GPU time is spent; each finding has a
severity and a fix.

Reads only configs, safetensors headers and one dump sample (pickle-free); runs no model. The
engine's own plan (:mod:`bisect_eagle.engines.plan`) is checked first: for an sglang spec that is
SGLang's parser and resolution when it can run here. Then what the upstream code implies
(``docs/sglang-facts.md``): SGLang reads capture ids only from nested ``eagle_config`` (vLLM only
from the top level) and silently falls back to its defaults; each model family reads the ids by its
own rule (``capture.sglang_convention``), so the same ids reach different layers on llama and on
GLM-5; ``-1`` and the final layer break on some families; ``topk == 1`` overrides
``num_draft_tokens``; ``EAGLE`` with an EAGLE-3 draft runs at accept length 1.0; a draft vocabulary
needs ``d2t``; and the draft must be fed the layers of the dump it was trained on.

The checks see through masks: under ``speculative_algorithm: EAGLE`` the layer ids are unused, so a
wrong wiring changes nothing today, but the fix of the algorithm (``EAGLE3``) exposes it. Its
findings are reported anyway, as *latent* (``latent: true``, the message says what hides them).

Modules: :mod:`.core` (findings, the spec's facts, the run), :mod:`.ids` (where and which layers),
:mod:`.model` (draft, dump, algorithm, vocabulary).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from bisect_eagle.artifacts import capture, layers
from bisect_eagle.artifacts.target import read_target_config
from bisect_eagle.doctor.ids import IdChecks
from bisect_eagle.doctor.model import DraftInfo, ModelChecks, read_draft
from bisect_eagle.engines import engine_kind, make_engine
from bisect_eagle.engines.base import Engine
from bisect_eagle.engines.plan import TrialPlan
from bisect_eagle.errors import BadInput
from bisect_eagle.keys import IDS_KEY
from bisect_eagle.spec.schema import Spec
from bisect_eagle.spec.settings import LiveSettings

Severity = Literal["error", "warning", "info"]
SEVERITIES: tuple[Severity, ...] = ("error", "warning", "info")
KNOWN_VERSIONS = ((0, 5, 5), (0, 5, 23))
# ids the plan refuses per trial (a space choice: a warning)
CANDIDATE_REFUSALS = ("minus-one", "final-layer-id")


@dataclass
class Finding:
    """One problem (or note) and how to fix it."""

    code: str
    severity: Severity
    where: str  # file and key
    message: str
    fix: str
    # unused today (hidden by another setting); the fix of that setting exposes it
    latent: bool = False

    def to_json(self) -> dict[str, Any]:
        """The finding as plain data (``doctor --json``, a bisect's report).

        Returns:
            Every field by name (``dataclasses.asdict``).
        """
        return asdict(self)


def _version(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts) or None


def installed_sglang() -> str | None:
    """The SGLang version installed beside bisect-eagle (None: not here; give --sglang-version)."""
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


class Doctor(IdChecks, ModelChecks):
    """Collects the findings of one spec."""

    def __init__(self, spec: Spec, sglang_version: str | None = None):
        self.spec = spec
        self.src = str(spec.source)
        self.findings: list[Finding] = []
        self._engine: Engine | None = None
        # whose loader reads the draft's ids, and how
        self.reader = engine_kind(spec.engine.kind).id_reader
        self.version_text = sglang_version or (
            installed_sglang() if self.reader.sglang_capture else None
        )
        self.version = _version(self.version_text)
        paths = spec.paths()
        self.target_cfg = read_target_config(paths["target"])
        self.draft: DraftInfo = read_draft(Path(paths["draft"]))
        self.dump = Path(paths["dump"])
        text = (
            self.target_cfg.get("text_config")
            if isinstance(self.target_cfg.get("text_config"), dict)
            else {}
        )
        try:  # a multimodal wrapper (Kimi-K2.5) keeps its depth and width in text_config
            self.num_layers = int(layers.target_depth(self.target_cfg))
            self.hidden = int(self.target_cfg.get("hidden_size", text.get("hidden_size")))
        except (KeyError, TypeError, ValueError):
            raise BadInput(
                f"{paths['target']}/config.json: keys 'num_hidden_layers' and 'hidden_size' are "
                "required (at the top level or in text_config)"
            ) from None
        self.model_type = str(self.target_cfg.get("model_type") or "")
        architecture = layers.target_architecture(self.target_cfg)
        # SGLang's capture rule of the target's model class (the table kept equal to SGLang's own
        # hook)
        self.capture = capture.capture_rule(self.model_type, architecture)
        self.family = self.capture.rule if self.reader.sglang_capture else "sglang"
        self.settings: LiveSettings = spec.fixed_settings()

    def add(self, code: str, severity: Severity, *, where: str, message: str, fix: str) -> None:
        """Record one finding.

        Args:
            code: the finding's stable code (``plan-refused``, ``fc-width`` ...).
            severity: ``error``, ``warning`` or ``info``.
            where: the file and key it is about.
            message: what is wrong, with the numbers.
            fix: what to change.
        """
        self.findings.append(Finding(code, severity, where, message, fix))

    def check_fed_wiring(self) -> None:
        """The ids fed to the draft: range, width, the dump's layers; latent while EAGLE leaves them
        unused."""
        ids, conv, where = self.fed_ids()
        algorithm = self.settings.speculative_algorithm
        if (
            ids is None
            or self.settings.is_baseline
            or (algorithm != "EAGLE3" and not self.draft.is_eagle3)
        ):
            return  # an EAGLE (not EAGLE-3) draft reads no aux ids at all: nothing to expose
        first = len(self.findings)
        if self.check_ids(ids, conv, where=where) and self.check_fc_width(ids, where):
            self.check_wiring(ids, conv, where=where)
        if algorithm == "EAGLE3":
            return
        hidden = (
            f"latent while speculative_algorithm is {algorithm} (the ids are unused: the draft "
            "gets the final state)"
        )
        for i, f in enumerate(self.findings[first:], start=first):
            self.findings[i] = Finding(
                f.code,
                f.severity,
                f.where,
                f"{hidden}; switching to EAGLE3 exposes it: {f.message}",
                f.fix + " (before switching to EAGLE3)",
                latent=True,
            )

    def refused_candidate(self, first: int, ids: list[int]) -> None:
        """A space candidate that only its own trials cannot run: where the engine's plan refuses
        those trials before launch (SGLang never captures ``-1`` or the final state on that model
        class, quoting the rule), the errors about the candidate become warnings (the rest of the
        space runs). What the plan does not refuse (a failure only at start-up) stays an error."""
        if not any(
            f.severity == "error" and f.code in CANDIDATE_REFUSALS for f in self.findings[first:]
        ):
            return
        refusal = self.plan(self.settings.model_copy(update={IDS_KEY: list(ids)})).refusal
        if refusal is None:
            return
        for i, f in enumerate(self.findings[first:], start=first):
            if f.severity == "error" and f.code in CANDIDATE_REFUSALS:
                self.findings[i] = Finding(
                    f.code,
                    "warning",
                    f.where,
                    f"{f.message}; the plan refuses this candidate's trials before launch, the "
                    "rest of the space runs",
                    f.fix,
                    f.latent,
                )

    def engine_sglang_version(self) -> str | None:
        """The version of the SGLang the spec's engine runs (``engine.sglang.python``, asked through
        its oracle), where none is installed beside bisect-eagle and none was given; None when it
        cannot be asked."""
        if self._engine is None:
            self._engine = make_engine(self.spec)
        planner = getattr(self._engine, "planner", None)
        desc = (
            planner.description()
            if planner is not None and hasattr(planner, "description")
            else None
        )
        return getattr(desc, "version", None)

    def plan(self, settings: LiveSettings) -> TrialPlan:
        """The engine's plan of ``settings`` (one engine, and for sglang one oracle, per diagnosis).

        Args:
            settings: the live settings to plan.

        Returns:
            The engine's plan (its refusal included).
        """
        if self._engine is None:
            self._engine = make_engine(self.spec)
        return self._engine.plan(settings)

    def check_plan(self) -> None:
        """The engine's own plan of the fixed settings: a refusal that no other check explained is
        an error.

        For an sglang spec this is SGLang's parser and resolution when they run here (invalid
        values, DSA constraints); its warnings are what the other checks report in detail. Where
        this host lacks the node's accelerators, SGLang's resolution did not run: a note says so
        (not an error, not a refusal).
        """
        from bisect_eagle.engines.sglang.oracle_script import NOT_RESOLVED_HERE

        where = f"{self.src}: engine.settings"
        plan = self.plan(self.settings)
        if plan.refusal is None and NOT_RESOLVED_HERE in (plan.checked or ""):
            self.add(
                "plan-not-resolved-here",
                "info",
                where=where,
                message=f"the {plan.engine} plan is checked by {plan.checked}",
                fix="run doctor on the node (or a host with its GPUs) for SGLang's resolved "
                "values; the plan is usable as it is",
            )
        if plan.refusal is not None and not any(f.severity == "error" for f in self.findings):
            self.add(
                "plan-refused",
                "error",
                where=where,
                message=f"the {plan.engine} engine refuses this trial: {plan.refusal}",
                fix="fix the setting it names (checked by "
                + (plan.checked or "the engine's own rules")
                + ")",
            )

    def run(self) -> list[Finding]:
        """Every check of the spec, the engine closed after.

        Returns:
            The findings, in the order the checks found them.
        """
        try:
            return self._run()
        finally:
            if self._engine is not None:
                self._engine.close()
                self._engine = None

    def _run(self) -> list[Finding]:
        if self.version_text is None and self.reader.sglang_capture:
            self.version_text = self.engine_sglang_version()
            self.version = _version(self.version_text)
        self.check_algorithm()
        self.check_location()
        self.check_vocab()
        self.check_draft_tokens()
        self.check_fed_wiring()
        space = self.spec.space.get(IDS_KEY)
        for i, choice in enumerate(space.choices or [] if space else []):
            if isinstance(choice, list):
                w = f"{self.src}: space.{IDS_KEY}.choices[{i}]"
                first = len(self.findings)
                if self.check_ids(choice, self.family, where=w):
                    self.check_fc_width(choice, w)
                self.refused_candidate(first, choice)
        for i, wiring in enumerate(self.spec.standalone.wirings):
            if wiring.layer_ids is not None:
                w = f"{self.src}: standalone.wirings[{i}].layer_ids"
                if self.check_ids(wiring.layer_ids, self.family, where=w):
                    self.check_fc_width(wiring.layer_ids, w)
        self.check_dump()
        self.check_plan()
        return by_severity(self.findings)


def by_severity(findings: list[Finding]) -> list[Finding]:
    """``findings`` errors first, then warnings, then notes (in their order within a severity).

    Args:
        findings: the findings, in any order.

    Returns:
        A new sorted list (a stable sort: order kept within a severity).
    """
    order = {s: i for i, s in enumerate(SEVERITIES)}
    return sorted(findings, key=lambda f: order[f.severity])


def diagnose(spec: Spec, sglang_version: str | None = None) -> list[Finding]:
    """All findings for ``spec`` (errors first).

    Args:
        spec: the spec, loaded without its input checks (``load_spec(..., check_inputs=False)``).
        sglang_version: the SGLang version to judge against (``doctor --sglang-version``); None: the
            one installed beside bisect-eagle, else the one the spec's engine runs, when it can be
            asked.

    Returns:
        The findings, errors first (:func:`by_severity`); empty when nothing is wrong.

    Raises:
        BadInput: what the checks cannot start without: a target, draft or dump path missing from
            the spec, an unreadable target config.json (or one without the depth and width), or a
            draft whose config or safetensors headers cannot be read.
    """
    return Doctor(spec, sglang_version).run()


def summary(findings: list[Finding]) -> dict[str, Any]:
    """The findings as ``doctor --json`` writes them.

    Args:
        findings: the findings (:func:`diagnose`).

    Returns:
        ``{"ok", "counts", "findings"}``: ``ok`` when no finding is an error, the count of each
        severity, and each finding's :meth:`Finding.to_json`.
    """
    counts = {s: sum(f.severity == s for f in findings) for s in SEVERITIES}
    return {
        "ok": counts["error"] == 0,
        "counts": counts,
        "findings": [f.to_json() for f in findings],
    }
