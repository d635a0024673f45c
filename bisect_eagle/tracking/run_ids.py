"""Which run a user means: a whole MLflow run id, or any unique prefix of at least
:data:`MIN_RUN_ID_PREFIX` hex digits (the 8 every table and the UI show), looked up across every
experiment of the store."""

from __future__ import annotations

from typing import Any

from bisect_eagle.errors import BadInput
from bisect_eagle.tracking.redact import redact_url

MIN_RUN_ID_PREFIX = 6  # the shortest run-id prefix a command accepts
RUN_ID_LENGTH = 32  # MLflow run ids: 32 lowercase hex digits
HEX = frozenset("0123456789abcdef")


def resolve_run_id(client: Any, text: str, *, uri: str) -> str:
    """The whole id of the one run whose id starts with ``text`` (case-insensitive), in any
    experiment of the store.

    Args:
        client: an ``mlflow.MlflowClient`` of the store.
        text: a whole run id, or a prefix of at least :data:`MIN_RUN_ID_PREFIX` hex digits.
        uri: the store's URI, for the messages (its password hidden).

    Raises:
        BadInput: one line when ``text`` is shorter than the minimum or not hex digits, matches no
            run, or is the prefix of several (naming them, 8 characters each).
    """
    from mlflow.entities import ViewType

    prefix = text.strip().lower()
    where = f"the tracking store {redact_url(uri)}"
    if len(prefix) < MIN_RUN_ID_PREFIX or len(prefix) > RUN_ID_LENGTH or not set(prefix) <= HEX:
        raise BadInput(
            f"run {text!r}: not a run id (give at least {MIN_RUN_ID_PREFIX} of its hex digits, "
            "e.g. the 8 every table shows)"
        )
    if len(prefix) == RUN_ID_LENGTH:
        return prefix
    experiments, token = [], None
    while True:
        page = client.search_experiments(view_type=ViewType.ALL, max_results=1000, page_token=token)
        experiments += [e.experiment_id for e in page]
        token = page.token
        if not token:
            break
    # hex digits only, so the prefix holds no LIKE wildcard; a few matches are enough to say it is
    # ambiguous
    runs = (
        client.search_runs(
            experiments,
            filter_string=f"attributes.run_id LIKE '{prefix}%'",
            run_view_type=ViewType.ALL,
            max_results=10,
        )
        if experiments
        else []
    )
    ids = sorted({r.info.run_id for r in runs})
    if not ids:
        raise BadInput(
            f"run {text!r} not found in {where} (give --tracking-uri or set MLFLOW_TRACKING_URI)"
        )
    if len(ids) > 1:
        shown = ", ".join(f"{i[: max(8, len(prefix) + 2)]}" for i in ids)
        raise BadInput(
            f"run {text!r} is ambiguous in {where}: {len(ids)}{'+' if len(ids) == 10 else ''} runs "
            f"start with it ({shown}); give more characters"
        )
    return ids[0]
