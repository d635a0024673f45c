"""The two ends of a bisect (a spec file or the MLflow run id of a live trial) and the deployment
they share."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bisect_eagle.artifacts import layers
from bisect_eagle.artifacts.target import read_target_config
from bisect_eagle.bisect.changes import flat_settings
from bisect_eagle.doctor.model import read_draft
from bisect_eagle.engines import engine_kind
from bisect_eagle.errors import BadInput
from bisect_eagle.keys import IDS_KEY
from bisect_eagle.spec.load import load_spec
from bisect_eagle.spec.schema import PATH_KEYS, Spec
from bisect_eagle.spec.settings import parse_settings
from bisect_eagle.tracking.runs import Tracking

# a run id or a prefix of it (Tracking.of_run resolves it)
RUN_ID = re.compile(r"^[0-9a-fA-F]{6,32}$")
DEPLOYMENT_KEYS = tuple(k for k in PATH_KEYS if k != "dump")  # a probe reads no dump


@dataclass
class Endpoint:
    """One side of the bisect: its flat requested settings and, when it is a spec, the spec."""

    label: str
    # flat (spec names); secret values in clear: never log this mapping directly
    settings: dict[str, Any]
    spec: Spec | None


def load_endpoint(text: str, *, flag: str, tracking_uri: str) -> Endpoint:
    """A spec file's fixed settings, or the requested settings of a logged live trial (its run id or
    a unique prefix of at least 6 characters)."""
    path = Path(text)
    if path.is_file():
        spec = load_spec(path)
        return Endpoint(str(path), flat_settings(spec.fixed_settings()), spec)
    if path.exists():
        raise BadInput(f"{flag} {text}: not a file (give a spec file, or an MLflow run id)")
    if not RUN_ID.fullmatch(text):
        if "/" in text or path.suffix in (".yaml", ".yml", ".json"):  # meant as a file
            raise BadInput(f"{flag} {text}: no such file: {path.resolve()}")
        raise BadInput(
            f"{flag} {text}: no such file, nor an MLflow run id (32 hex digits, or a unique prefix "
            "of at least 6)"
        )
    try:
        tracking, run = Tracking.of_run(tracking_uri, text)
    except BadInput as e:
        raise BadInput(f"{flag} {e}") from None
    text = run.info.run_id  # the whole id of a prefix
    try:
        trial = json.loads(tracking.read_text(text, "trial.json"))
    except Exception as e:  # MLflow raises several types for a missing artifact
        raise BadInput(
            f"{flag} {text}: the run has no readable trial.json artifact ({type(e).__name__}); "
            "give the run of a live trial"
        ) from None
    plan = trial.get("plan") if isinstance(trial, dict) else None
    # the plan's explicit request
    requested = plan.get("requested") if isinstance(plan, dict) else None
    if not isinstance(requested, dict):
        # trial.json before the plan held it
        requested = trial.get("requested") if isinstance(trial, dict) else None
    if not isinstance(requested, dict):
        raise BadInput(f"{flag} {text}: trial.json has no 'requested' settings")
    return Endpoint(
        f"run:{text}",
        flat_settings(parse_settings(requested, f"{flag} {text}: trial.json requested")),
        None,
    )


def deployment(good: Endpoint, bad: Endpoint, *, spec_path: Path | None) -> Spec:
    """The spec whose target, draft, prompts and engine every probe uses; both specs must agree on
    them.

    Args:
        good: the good endpoint (its spec is None when it is a run id).
        bad: the bad endpoint (likewise).
        spec_path: the ``--spec`` file, or None when not given; it is loaded and checked first.

    Returns:
        The first of ``--spec``'s, the good endpoint's and the bad endpoint's specs (all agree).

    Raises:
        BadInput: no spec at all (both endpoints are run ids and no ``--spec``), or two specs
            differ on a deployment key or on ``engine.kind``.
    """
    specs = [e.spec for e in (good, bad) if e.spec is not None]
    if spec_path is not None:
        specs.insert(0, load_spec(spec_path))
    if not specs:
        raise BadInput(
            "--good and --bad are both run ids: give --spec SPEC for the target, draft and engine"
        )
    first = specs[0]
    for other in specs[1:]:
        for key in DEPLOYMENT_KEYS:
            if getattr(first, key) != getattr(other, key):
                raise BadInput(
                    f"{other.source}: key {key!r} is {getattr(other, key)} but {first.source} has "
                    f"{getattr(first, key)}; bisect varies settings of one deployment"
                )
        if first.engine.kind != other.engine.kind:
            raise BadInput(
                f"{other.source}: key 'engine.kind' is {other.engine.kind!r} but {first.source} "
                f"has {first.engine.kind!r}; bisect varies settings of one engine"
            )
    return first


def resolved_wiring(settings: dict[str, Any], spec: Spec) -> list[int]:
    """The SGLang ids a configuration feeds the draft: its own, else the draft config's."""
    ids = settings.get(IDS_KEY)
    if ids is not None:
        return list(ids)
    n = int(read_target_config(spec.paths()["target"])["num_hidden_layers"])
    info = read_draft(Path(spec.paths()["draft"]))
    declared, conv = info.declared(engine_kind(spec.engine.kind).id_reader)
    if declared is None:
        raise BadInput(
            f"{info.path / 'config.json'}: no layer ids the {spec.engine.kind} engine reads"
        )
    return layers.canonical_to_ids(
        layers.ids_to_canonical(declared, conv, num_layers=n), "sglang", num_layers=n
    )
