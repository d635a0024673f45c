"""A study is bound to the spec that made it: the spec's canonical form is stored with the study,
and a worker or a ``--resume`` with a spec that differs is refused, naming the first key that
differs.

The canonical form is the spec as loaded (defaults filled in, paths absolute), without what may
differ harmlessly between invocations (``description``, the spec file's own path), with secret
values as digests (:func:`~bisect_eagle.tracking.redact.digest_mapping`): two specs that differ only
in a token are two specs, and no token is stored.
"""

from __future__ import annotations

import json
from typing import Any

import optuna

from bisect_eagle.engines.plan import canonical_hash
from bisect_eagle.errors import BadInput
from bisect_eagle.spec.schema import Spec
from bisect_eagle.tracking.redact import digest_mapping

SPEC_ATTR = "spec"  # the study's user attribute: the flat canonical spec
HASH_ATTR = "spec_hash"
IGNORED = ("description", "source")


def canonical_spec(spec: Spec) -> dict[str, Any]:
    """The spec as flat ``dotted.key -> value`` pairs (JSON values), secrets as digests."""
    d = digest_mapping(spec.model_dump(mode="json", exclude=set(IGNORED)))
    return dict(_flat(d, ""))


def _flat(value: Any, prefix: str):
    if isinstance(value, dict) and value:
        for k in sorted(value):
            yield from _flat(value[k], f"{prefix}.{k}" if prefix else str(k))
    else:
        yield prefix, value


def bind(study: optuna.Study, spec: Spec) -> None:
    """Record ``spec`` on a new ``study`` (its name, canonical form and hash).

    Args:
        study: the new Optuna study.
        spec: the spec it runs.
    """
    flat = canonical_spec(spec)
    study.set_user_attr("spec_name", spec.name)
    study.set_user_attr(HASH_ATTR, canonical_hash(flat))
    study.set_user_attr(SPEC_ATTR, flat)


def check_bound(study: optuna.Study, spec: Spec, *, what: str) -> None:
    """Refuse ``spec`` for ``study`` unless it is the spec the study was made from.

    Args:
        study: the study to join or resume.
        spec: the spec given now.
        what: the command, for the message (``worker``, ``--resume``).

    Raises:
        BadInput: the study belongs to another spec, or the spec changed; the message names the
            first differing key with both values.
    """
    attrs = study.user_attrs
    stored = attrs.get(SPEC_ATTR)
    if stored is None:
        raise BadInput(
            f"{what}: study {study.study_name!r} records no spec (made by another version of "
            "bisect-eagle?); start a new study"
        )
    flat = canonical_spec(spec)
    if canonical_hash(flat) == attrs.get(HASH_ATTR):
        return
    for key in sorted(set(stored) | set(flat)):
        if stored.get(key, "<absent>") != flat.get(key, "<absent>"):
            raise BadInput(
                f"{what}: study {study.study_name!r} was made from another spec: key {key!r} is "
                f"{_show(stored.get(key, '<absent>'))} there and "
                f"{_show(flat.get(key, '<absent>'))} in {spec.source}; give that study's spec, or "
                "another --study-name"
            )
    raise BadInput(
        f"{what}: study {study.study_name!r} was made from another spec; give that study's spec"
    )


def _show(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."
