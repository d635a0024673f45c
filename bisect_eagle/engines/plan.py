"""A trial's plan: what one engine will run for a request, decided by that engine before anything
starts.

The plan is the single source of a trial's identity and of what is logged about it. Every consumer
(the search's dedupe and claims, bisect's differences and probes, ``live --dry-run``, ``export``,
``reproduce``, ``doctor`` and MLflow params and run names) reads the plan and nothing else:

- ``effective``: the settings the engine will run, with every default made explicit (the draft's own
  layer ids resolved, the engine's defaults filled in) and every field the engine ignores removed.
  Secret values are shown hashed (``<redacted sha256:…>``, :mod:`bisect_eagle.tracking.redact`).
- ``fingerprint``: a hash of the engine name and ``effective`` in clear, so two configs
  differing only in a secret are two trials, and no value can be read from it.
- ``warnings``: settings the engine runs differently from the request; ``refusal``: why the engine
  cannot run it (a ``bad_arguments`` trial, never a launch).
- ``argv``/``env``/``config_patch`` where the engine launches a server; ``checked``: what validated
  the plan.

A trial with acceptance pinned (``pinned_acceptance``, :mod:`bisect_eagle.spec.settings`) carries
its profile in ``effective``, so it never shares a fingerprint with the natural trial of the same
settings; a natural trial's effective settings have no such key, so its fingerprint is what it was
before pinning existed. :attr:`TrialPlan.acceptance` names the kind (``pinned`` or ``natural``), as
the trial's MLflow run is tagged.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from bisect_eagle.spec.settings import PINNED, LiveSettings
from bisect_eagle.tracking.redact import redact_argv, redact_env, redact_mapping


@dataclass(frozen=True)
class TrialPlan:
    """One trial as an engine will run it (see the module docstring for each field's contract)."""

    engine: str
    # the request, as validated (secrets in clear: never log this object directly)
    settings: LiveSettings
    effective: dict[str, Any]  # redacted, engine-relevant, defaults explicit
    fingerprint: str
    warnings: tuple[str, ...] = ()
    refusal: str | None = None
    argv: tuple[str, ...] | None = None  # redacted
    env: dict[str, str] | None = None  # variables set for the trial, redacted
    config_patch: dict[str, Any] | None = None  # the draft config.json change
    checked: str = ""  # what validated this plan ("" = the engine's own rules only)
    # engine-only, unlogged
    private: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def is_baseline(self) -> bool:
        return self.settings.is_baseline

    @property
    def acceptance(self) -> str:
        """``pinned`` when the trial's acceptance is pinned (its accept length is set, not
        measured), else ``natural``."""
        return acceptance_kind(self.effective)

    @property
    def requested(self) -> dict[str, Any]:
        """The explicitly requested settings, redacted (what a user typed)."""
        return redact_mapping(self.settings.model_dump(mode="json", exclude_unset=True))

    def to_json(self) -> dict[str, Any]:
        """The plan as printed by ``live --dry-run --json`` and stored with each trial: nothing
        secret.

        Returns:
            ``engine``, ``fingerprint``, ``requested``, ``effective``, ``warnings``, ``refusal``,
            ``checked``, and ``argv``, ``env``, ``config_patch`` where set (all redacted).
        """
        out: dict[str, Any] = {
            "engine": self.engine,
            "fingerprint": self.fingerprint,
            "requested": self.requested,
            "effective": self.effective,
            "warnings": list(self.warnings),
            "refusal": self.refusal,
            "checked": self.checked or "the engine's own rules",
        }
        if self.argv is not None:
            out["argv"] = list(self.argv)
        if self.env is not None:
            out["env"] = dict(self.env)
        if self.config_patch is not None:
            out["config_patch"] = self.config_patch
        return out


def acceptance_kind(effective: dict[str, Any]) -> str:
    """``pinned`` or ``natural``: whether a plan's (or a logged trial's) effective settings pin
    acceptance.

    Args:
        effective: effective settings.

    Returns:
        ``pinned`` when ``pinned_acceptance`` is set, else ``natural``.
    """
    return "pinned" if effective.get(PINNED) is not None else "natural"


def canonical_hash(body: dict[str, Any]) -> str:
    """The one identity hash of every trial: 16 hex digits of SHA-256 over canonical JSON (sorted
    keys).

    Args:
        body: the JSON-able identity (values JSON cannot carry hash as their ``str``).

    Returns:
        The hash.
    """
    blob = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def fingerprint(engine: str, effective_in_clear: dict[str, Any]) -> str:
    """A live trial's identity: a hash of the engine and its effective settings, every value
    included (a hidden one too: two configs that differ only in a secret are two trials), none
    of them readable from it.

    Args:
        engine: the engine's name.
        effective_in_clear: the effective settings, not redacted.

    Returns:
        The 16-hex-digit :func:`canonical_hash`.
    """
    return canonical_hash({"engine": engine, **effective_in_clear})


def make_plan(
    engine: str,
    settings: LiveSettings,
    *,
    effective: dict[str, Any],
    warnings: list[str] | tuple[str, ...] = (),
    refusal: str | None = None,
    argv: list[str] | None = None,
    env: dict[str, str] | None = None,
    config_patch: dict[str, Any] | None = None,
    checked: str = "",
    private: dict[str, Any] | None = None,
) -> TrialPlan:
    """A plan from an engine's effective settings in clear: fingerprinted, then redacted for
    logging.

    Args:
        engine: the engine's name.
        settings: the requested settings.
        effective: the effective settings in clear (redacted in the plan).
        warnings: notes for the user (duplicates dropped).
        refusal: why the engine will not run it; None when it will.
        argv: the server's command line (redacted in the plan); None for an in-process engine.
        env: the trial's environment (redacted); None for an in-process engine.
        config_patch: the draft config.json changes; None when the draft is used as it is.
        checked: what checked the settings ("" shows as the engine's own rules).
        private: engine-only data kept with the plan (a planner's launch); None means empty.

    Returns:
        The plan.
    """
    return TrialPlan(
        engine=engine,
        settings=settings,
        effective=redact_mapping(effective),
        fingerprint=fingerprint(engine, effective),
        warnings=tuple(dict.fromkeys(warnings)),
        refusal=refusal,
        argv=None if argv is None else tuple(redact_argv(argv)),
        env=None if env is None else redact_env(env),
        config_patch=config_patch,
        checked=checked,
        private=private or {},
    )


def natural_unmarked(effective: dict[str, Any]) -> dict[str, Any]:
    """``effective`` without a ``pinned_acceptance`` key when acceptance is natural (None): a
    natural trial's fingerprint stays what it was before the field existed. Changes and returns
    ``effective``.

    Args:
        effective: effective settings, changed in place.

    Returns:
        ``effective`` itself.
    """
    if effective.get(PINNED) is None:
        effective.pop(PINNED, None)
    return effective
