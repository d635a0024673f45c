"""Everything MLflow: the store, one experiment per spec, one parent run per study, one child run
per trial.

Default store: SQLite in ``./mlruns/mlflow.db`` with artifacts under ``./mlruns/artifacts`` (MLflow
>= 3.13 refuses a plain ``./mlruns`` file store); ``--tracking-uri`` or ``MLFLOW_TRACKING_URI``
override it. Child runs carry the tag ``mlflow.parentRunId``; ``stage`` (standalone | baseline |
live | confirm | reproduce), ``fingerprint``, ``outcome`` (ok | failed | pruned | interrupted |
error) and ``owner`` (host:pid:start) tag them for caching and resuming. Every run carries MLflow's
own source tags (``mlflow.user``, ``mlflow.source.git.commit``, ``mlflow.source.name``); a
per-position quantity is one metric with ``step`` = position (:meth:`Tracking.log_curve`); files a
run reads are its dataset inputs (:meth:`Tracking.log_datasets`). One client per process; every log
call is one ``log_batch``. A run of a stage that measures an engine (:data:`MEASURED_STAGES`)
carries system metrics until :meth:`Tracking.finish` when they are asked for
(:mod:`bisect_eagle.tracking.sysmetrics`). :meth:`Tracking.run_guard` is the one place that ends a
run KILLED or FAILED when the code inside it raises. A run id given by a user may be any unique
prefix of it (:mod:`bisect_eagle.tracking.run_ids`); :meth:`Tracking.of_run` is the one place that
resolves it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bisect_eagle.errors import BadInput
from bisect_eagle.tracking.owner import owner_alive, owner_id
from bisect_eagle.tracking.provenance import path_digest, source_tags
from bisect_eagle.tracking.redact import Scrubber, mask_text, redact_url
from bisect_eagle.tracking.run_ids import resolve_run_id
from bisect_eagle.tracking.stores import (
    StoreReadOnly,
    check_stores,
    read_only_url,
    store_unwritable,
)
from bisect_eagle.tracking.sysmetrics import SystemMetrics
from bisect_eagle.tracking.uris import artifact_root, sqlite_path, use_wal

log = logging.getLogger(__name__)

PARENT_TAG = "mlflow.parentRunId"
NOTE = "mlflow.note.content"  # the markdown description of a run or an experiment in the UI
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
LIVE_STAGES = ("baseline", "live")
# runs of an engine: they carry system metrics
MEASURED_STAGES = ("baseline", "live", "confirm", "reproduce")
CACHEABLE_OUTCOMES = ("ok", "failed", "pruned")
TAG_LIMIT = 7900  # characters of a tag value MLflow stores (8000, with room to spare)


def tag_values(tags: Mapping[str, object]) -> dict[str, str]:
    """Tag values as MLflow stores them: text masked by the secret policy (URL credentials,
    tokens), cut to :data:`TAG_LIMIT` (the one place tags are truncated)."""
    return {k: mask_text(str(v))[:TAG_LIMIT] for k, v in tags.items()}


def flat_params(values: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested settings as MLflow params: ``env.NCCL_ALGO``, lists as JSON, None as 'None'.

    Args:
        values: settings, dicts nested to any depth.
        prefix: put before every name (used by the recursion: ``"env."``).

    Returns:
        Dotted name → text value.
    """
    out: dict[str, str] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat_params(value, f"{name}."))
        elif isinstance(value, (list, tuple)):
            out[name] = json.dumps(list(value))
        else:
            out[name] = str(value)
    return out


@dataclass(frozen=True, kw_only=True)
class RunEnd:
    """What a run's end writes (:meth:`Tracking.end_run`'s arguments but the run id)."""

    status: str  # "FINISHED", "FAILED" or "KILLED"
    texts: dict[str, str] = field(default_factory=dict)  # artifact name -> text (masked)
    metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    curves: dict[str, list[float]] = field(default_factory=dict)  # metric -> its values by step
    name_suffix: str = ""  # added to the run's name (" [failed: oom]")


@dataclass(kw_only=True)
class TrialRun:
    """A trial's run inside :meth:`Tracking.trial_run`'s block: the finished run found for reuse
    (``reused``: nothing was started), or the started run, whose ``end`` the block sets."""

    reused: Any = None  # an mlflow Run
    run_id: str = ""
    end: RunEnd | None = None


@dataclass
class Tracking:
    """An MLflow store and the experiment of one spec."""

    uri: str
    experiment_id: str
    client: Any  # mlflow.MlflowClient
    run_tags: dict[str, str] = field(default_factory=source_tags)  # on every run this object starts
    # of its runs in MEASURED_STAGES
    system_metrics: SystemMetrics = field(default_factory=SystemMetrics)
    # opened read-only: a SQLite store this process cannot write (a reading command)
    read_only: bool = False

    @classmethod
    def open(
        cls, uri: str, experiment: str, *, description: str | None = None, reading: bool = False
    ) -> Tracking:
        """Connect (creating a SQLite store and the experiment when absent).

        Args:
            uri: the tracking URI (:func:`resolve_tracking_uri`).
            experiment: the experiment's name.
            description: the experiment's markdown description (``mlflow.note.content``), set when
                given.
            reading: the caller only reads: a SQLite store this process cannot write is opened
                read-only (:attr:`read_only`) and an absent experiment is :class:`BadInput`,
                nothing created. Otherwise such a store is
                :class:`~bisect_eagle.tracking.stores.StoreReadOnly` before anything is created.

        Returns:
            The store, on the experiment.

        Raises:
            BadInput: MLflow cannot open or create the experiment (one line, the URI redacted).
        """
        # keeps --json output one object
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        from mlflow import MlflowClient
        from mlflow.exceptions import MlflowException

        db = sqlite_path(uri)
        unwritable = store_unwritable(uri)
        if unwritable and not reading:
            raise StoreReadOnly(
                f"the tracking store {db.parent} is read-only ({unwritable}): make it writable, or "
                "give --tracking-uri of a store you can write"
            )
        if db is not None and not unwritable:
            db.parent.mkdir(parents=True, exist_ok=True)
        client = MlflowClient(tracking_uri=read_only_url(uri) if unwritable else uri)
        try:
            exp = client.get_experiment_by_name(experiment)
            if exp is None and reading:
                raise BadInput(
                    f"tracking URI {redact_url(uri)} has no experiment {experiment!r}: no study of "
                    "this spec ran there (run `bisect-eagle run` first)"
                )
            if exp is None:
                exp_id = client.create_experiment(
                    experiment, artifact_location=artifact_root(uri), tags=dict([EXPERIMENT_KIND])
                )
            else:
                exp_id = exp.experiment_id
                if exp.tags.get(EXPERIMENT_KIND[0]) != EXPERIMENT_KIND[1] and not unwritable:
                    client.set_experiment_tag(exp_id, *EXPERIMENT_KIND)
        except MlflowException as e:
            raise BadInput(
                f"tracking URI {redact_url(uri)}: cannot open experiment {experiment!r} "
                f"({str(e).splitlines()[0]})"
            ) from None
        if db is not None and not unwritable:
            use_wal(db)
        if description:
            client.set_experiment_tag(exp_id, NOTE, mask_text(description))
        return cls(uri, exp_id, client, read_only=bool(unwritable))

    @classmethod
    def of_run(cls, uri: str, run_id: str) -> tuple[Tracking, Any]:
        """The store and experiment holding ``run_id``, and the run (a store this process cannot
        write is opened read-only: :attr:`read_only`).

        Args:
            uri: the tracking URI; a SQLite store is never created by this call.
            run_id: a whole MLflow run id or any unique prefix of it
                (:func:`~bisect_eagle.tracking.run_ids.resolve_run_id`).

        Returns:
            ``(tracking, run)``: the store on the run's experiment, and the MLflow run (its whole id
            is ``run.info.run_id``).

        Raises:
            BadInput: one line when the store does not exist or cannot be reached, or the prefix is
                too short, ambiguous or matches no run.
        """
        from mlflow import MlflowClient
        from mlflow.exceptions import MlflowException

        db = sqlite_path(uri)
        # never create a store just to say the run is not in it
        if db is not None and not db.is_file():
            raise BadInput(
                f"run {run_id!r}: the tracking store {db} does not exist (give --tracking-uri or "
                "set MLFLOW_TRACKING_URI)"
            )
        # unreachable: one line within seconds, not MLflow's retries
        check_stores(storage=None, tracking_uri=uri)
        unwritable = store_unwritable(uri)
        client = MlflowClient(tracking_uri=read_only_url(uri) if unwritable else uri)
        full_id = resolve_run_id(client, run_id, uri=uri)
        try:
            run = client.get_run(full_id)
        except MlflowException:
            raise BadInput(
                f"run {run_id!r} not found in the tracking store {redact_url(uri)} (give "
                "--tracking-uri or set MLFLOW_TRACKING_URI)"
            ) from None
        return cls(uri, run.info.experiment_id, client, read_only=bool(unwritable)), run

    def start_run(
        self,
        name: str,
        *,
        tags: dict[str, str],
        params: dict[str, str] | None = None,
        parent_run_id: str | None = None,
        metrics: dict[str, float] | None = None,
    ) -> str:
        """Create a RUNNING run (a child when ``parent_run_id`` is given) with its params; system
        metrics are sampled into it until :meth:`finish` when its ``stage`` tag is one of
        :data:`MEASURED_STAGES`. The run is tagged ``owner`` (:func:`owner_id`, unless ``tags``
        names another): a run its process left RUNNING when killed outright is ended by the next
        command's :meth:`end_orphans`.

        Args:
            name: the run name.
            tags: the run's tags, on top of :attr:`run_tags` and ``owner`` (values cut to
                :data:`TAG_LIMIT`).
            params: the run's params.
            parent_run_id: the parent run, tagged ``mlflow.parentRunId``; None: a top-level run.
            metrics: metrics logged at once, in the params' batch (:meth:`log`; a study's forecast
                of a trial).

        Returns:
            The new run's id.
        """
        all_tags = {
            **self.run_tags,
            "owner": owner_id(),
            **tags,
            **({PARENT_TAG: parent_run_id} if parent_run_id else {}),
        }
        run = self.client.create_run(
            self.experiment_id, run_name=mask_text(name), tags=tag_values(all_tags)
        )
        if params or metrics:
            self.log(run.info.run_id, params=params, metrics=metrics)
        if tags.get("stage") in MEASURED_STAGES:
            self.system_metrics.start(run.info.run_id, tracking_uri=self.uri)
        return run.info.run_id

    def log(
        self,
        run_id: str,
        *,
        metrics: dict[str, float] | None = None,
        params: dict[str, str] | None = None,
        tags: dict[str, str] | None = None,
    ) -> None:
        """One batch of metrics (non-finite values left out), params and tags.

        Args:
            run_id: the run.
            metrics: name → value at step 0; None and non-finite values are left out.
            params: name → value (text).
            tags: name → value (cut to :data:`TAG_LIMIT`).
        """
        from mlflow.entities import Metric, Param, RunTag

        now = int(time.time() * 1000)
        ms = [
            Metric(k, float(v), now, 0)
            for k, v in (metrics or {}).items()
            if v is not None and math.isfinite(float(v))
        ]
        ps = [Param(k, mask_text(str(v))) for k, v in (params or {}).items()]
        ts = [RunTag(k, v) for k, v in tag_values(tags or {}).items()]
        if ms or ps or ts:
            self.client.log_batch(run_id, metrics=ms, params=ps, tags=ts)

    def log_curve(self, run_id: str, name: str, *, values: list[float]) -> None:
        """One metric as a curve: ``values[k]`` at step ``k`` (non-finite values left out).

        Args:
            run_id: the run.
            name: the metric's name.
            values: the curve, step 0 first; None and non-finite points are left out.
        """
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        ms = [
            Metric(name, float(v), now, k)
            for k, v in enumerate(values)
            if v is not None and math.isfinite(v)
        ]
        if ms:
            self.client.log_batch(run_id, metrics=ms)

    def log_datasets(self, run_id: str, paths: Mapping[str, Path]) -> None:
        """Files or folders as the run's MLflow dataset inputs (name and context = the key, source =
        the path).

        Args:
            run_id: the run.
            paths: dataset name (``target``, ``draft``, ...) → file or folder; the digest is of
                names, sizes and modification times (:func:`path_digest`).
        """
        from mlflow.entities import Dataset, DatasetInput, InputTag

        def source(path: Path) -> str:
            """The dataset source of ``path``: its absolute path, masked.

            Args:
                path: the file or folder.

            Returns:
                ``{"uri": ...}`` as JSON.
            """
            return json.dumps({"uri": mask_text(str(Path(path).resolve()))})

        inputs = [
            DatasetInput(
                Dataset(
                    name=key,
                    digest=path_digest(Path(path)),
                    source_type="local",
                    source=source(path),
                ),
                tags=[InputTag("mlflow.data.context", key)],
            )
            for key, path in paths.items()
        ]
        if inputs:
            self.client.log_inputs(run_id, datasets=inputs)

    def rename(self, run_id: str, name: str) -> None:
        """Give a run a new name.

        Args:
            run_id: the run.
            name: its new run name.
        """
        self.client.update_run(run_id, name=mask_text(name))

    def log_texts(
        self, run_id: str, files: dict[str, str], *, artifact_path: str | None = None
    ) -> None:
        """Text artifacts (name -> content, masked by the secret policy) in one upload.

        Args:
            run_id: the run.
            files: artifact name (may hold ``/``) → text; empty: nothing is uploaded.
            artifact_path: the folder of the run's artifacts they go under; None: the root.
        """
        if not files:
            return
        with tempfile.TemporaryDirectory(prefix="bisect-eagle-") as tmp:
            for name, text in files.items():
                path = Path(tmp) / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(mask_text(text))
            self.client.log_artifacts(run_id, tmp, artifact_path)

    def log_files(self, run_id: str, directory: Path, *, artifact_path: str | None = None) -> None:
        """Every file under ``directory`` as the run's artifacts.

        Args:
            run_id: the run.
            directory: the folder whose contents are uploaded (its own name is not kept).
            artifact_path: the folder of the run's artifacts they go under; None: the root.
        """
        self.client.log_artifacts(run_id, str(directory), artifact_path)

    def finish(self, run_id: str, status: str) -> None:
        """FINISHED, FAILED or KILLED (its system metrics stopped first, their last sample logged).

        Args:
            run_id: the run.
            status: ``"FINISHED"``, ``"FAILED"`` or ``"KILLED"``.
        """
        self.system_metrics.stop(run_id)
        self.client.set_terminated(run_id, status)

    def end_run(self, run_id: str, end: RunEnd) -> None:
        """Write a run's result and end it, in this order: its text artifacts (:meth:`log_texts`),
        one batch of metrics and tags (:meth:`log`), each curve (:meth:`log_curve`), its new name,
        its status (:meth:`finish`).

        Args:
            run_id: the run.
            end: what it ends with (texts masked; non-finite metrics left out; tags cut to
                :data:`TAG_LIMIT`; an empty ``name_suffix`` leaves the name).
        """
        self.log_texts(run_id, end.texts)
        self.log(run_id, metrics=end.metrics, tags=end.tags)
        for name, values in end.curves.items():
            self.log_curve(run_id, name, values=values)
        if end.name_suffix:
            self.rename(run_id, f"{self.get_run(run_id).info.run_name}{end.name_suffix}")
        self.finish(run_id, end.status)

    @contextlib.contextmanager
    def trial_run(
        self,
        name: str,
        *,
        tags: dict[str, str],
        settings: dict[str, Any],
        requested: dict[str, Any],
        parent_run_id: str,
        metrics: Mapping[str, float] | None = None,
        reuse: str | None = None,
        failure_classes: Mapping[type[BaseException], str] | None = None,
        scrub: Callable[[str], str] | None = None,
    ) -> Iterator[TrialRun]:
        """A trial's whole run as one block: the reusable run of ``reuse`` when there is one, else a
        child run started, guarded (:meth:`run_guard`) and, when the block sets its ``end``, ended
        with it (:meth:`end_run`).

        Args:
            name: the run name.
            tags: the run's tags (:meth:`start_run`).
            settings: the effective settings: the run's params, flattened (:func:`flat_params`).
            requested: the requested settings: a ``requested.<name>`` param beside each that
                differs from its effective one.
            parent_run_id: the parent run.
            metrics: logged as the run starts (a study's forecast of the trial).
            reuse: a fingerprint: first look for its finished run under ``parent_run_id``
                (:meth:`find_fingerprint`); found, nothing starts and the block gets it as
                ``reused``. None: always start a run.
            failure_classes: exception type -> ``failure_class`` tag (:meth:`run_guard`).
            scrub: removes secret values from an exception's detail (:meth:`run_guard`).

        Returns:
            A context manager giving the :class:`TrialRun`. The block raising ends the run KILLED
            (Ctrl-C, SIGTERM) or FAILED, and so does writing its ``end`` failing; a block that sets
            no ``end`` leaves the run RUNNING for its caller.
        """
        if reuse is not None:
            found = self.find_fingerprint(reuse, parent_run_id=parent_run_id)
            if found is not None:
                yield TrialRun(reused=found)
                return
        params = flat_params(settings)
        params.update(
            {f"requested.{k}": v for k, v in flat_params(requested).items() if params.get(k) != v}
        )
        run_id = self.start_run(
            name,
            tags=tags,
            params=params,
            parent_run_id=parent_run_id,
            metrics=dict(metrics) if metrics else None,
        )
        run = TrialRun(run_id=run_id)
        with self.run_guard(run_id, failure_classes=failure_classes, scrub=scrub):
            yield run
            if run.end is not None:
                self.end_run(run_id, run.end)

    @contextlib.contextmanager
    def run_guard(
        self,
        run_id: str,
        *,
        detail_tag: str = "failure_detail",
        failure_classes: Mapping[type[BaseException], str] | None = None,
        scrub: Callable[[str], str] | None = None,
    ) -> Iterator[None]:
        """If the block raises, end ``run_id`` and re-raise: KILLED on Ctrl-C or SIGTERM, FAILED on
        an error.

        The run is tagged ``outcome`` (``interrupted`` or ``error``) and ``detail_tag`` (``Type:
        message``). An exception of a type in ``failure_classes`` (e.g. ``{BadInput:
        "bad_arguments"}``) also gets the tag ``failure_class`` and its bare message as the detail.
        The detail is scrubbed of secret values by ``scrub`` (default: the secrets of this process's
        environment, :class:`bisect_eagle.tracking.redact.Scrubber`). SIGTERM counts as an interrupt
        once the CLI turned it into ``SystemExit`` (``sigterm_as_exit``).

        Args:
            run_id: the run ended when the block raises.
            detail_tag: the tag the exception's detail goes to.
            failure_classes: exception type → ``failure_class`` tag value.
            scrub: removes secret values from the detail.

        Returns:
            A context manager; the block's exception always propagates (a store error while ending
            the run is logged, not raised).
        """
        try:
            yield
        except BaseException as e:
            try:
                self._end_on_exception(
                    run_id, e, detail_tag, failure_classes or {}, scrub or Scrubber()
                )
            # the store failed too: the original exception matters more
            except Exception as store_error:
                log.warning(
                    "could not end run %s after %s: %s",
                    run_id,
                    type(e).__name__,
                    store_error,
                    exc_info=store_error,
                )
            raise

    def _end_on_exception(
        self,
        run_id: str,
        e: BaseException,
        detail_tag: str,
        failure_classes: Mapping[type[BaseException], str],
        scrub: Callable[[str], str],
    ) -> None:
        interrupted = isinstance(e, (KeyboardInterrupt, SystemExit))
        tags = {"outcome": "interrupted" if interrupted else "error"}
        failure_class = next(
            (name for cls, name in failure_classes.items() if isinstance(e, cls)), None
        )
        if failure_class is not None:
            tags["failure_class"] = failure_class
            detail = str(e)
        else:
            detail = f"{type(e).__name__}: {e}"
        tags[detail_tag] = scrub(detail)
        self.log(run_id, tags=tags)
        self.finish(run_id, "KILLED" if interrupted else "FAILED")

    def end_killed(self, run_id: str, *, detail: str, **tags: str) -> bool:
        """End a RUNNING run KILLED, tagged ``outcome=interrupted`` and ``failure_detail``; False if
        not RUNNING.

        Args:
            run_id: the run.
            detail: the ``failure_detail`` tag: why it was ended.
            **tags: more tags to set with them.

        Returns:
            True when the run was RUNNING and is now KILLED; False (nothing written) otherwise.
        """
        if self.get_run(run_id).info.status != "RUNNING":
            return False
        self.log(run_id, tags={"outcome": "interrupted", "failure_detail": detail, **tags})
        self.finish(run_id, "KILLED")
        return True

    def end_orphans(self, *, detail: str) -> list[str]:
        """End KILLED every RUNNING run of this experiment whose ``owner`` (:func:`owner_id`) is a
        process of this host that no longer runs (a controller killed by SIGKILL, which no handler
        sees); their ids. A run of another host, or without an owner, is left to its own process.

        Args:
            detail: the ``failure_detail`` tag of each run ended.

        Returns:
            The ids of the runs ended, oldest first.
        """
        running = self._search("attributes.status = 'RUNNING'", ["attributes.start_time ASC"])
        return [
            r.info.run_id
            for r in running
            if owner_alive(r.data.tags.get("owner", "")) is False
            and self.end_killed(r.info.run_id, detail=detail)
        ]

    def reopen(self, run_id: str) -> None:
        """Set an ended run RUNNING again (a resumed study's parent run).

        Args:
            run_id: the run.
        """
        self.client.update_run(run_id, status="RUNNING")

    def get_run(self, run_id: str):
        """The MLflow run of ``run_id``.

        Args:
            run_id: a whole run id.

        Returns:
            The ``mlflow.entities.Run`` (MLflow raises for an unknown id).
        """
        return self.client.get_run(run_id)

    def child_runs(self, parent_run_id: str, stage: str | None = None) -> list:
        """Child runs of a parent, oldest first (optionally of one stage).

        Args:
            parent_run_id: the parent run.
            stage: only runs of this ``stage`` tag; None: every stage.

        Returns:
            The MLflow runs, every page of the search.
        """
        flt = f"tags.`{PARENT_TAG}` = '{parent_run_id}'"
        if stage:
            flt += f" and tags.stage = '{stage}'"
        return self._search(flt, ["attributes.start_time ASC"])

    def _search(self, flt: str, order_by: list[str]) -> list:
        out, token = [], None
        while True:
            page = self.client.search_runs(
                [self.experiment_id],
                filter_string=flt,
                max_results=1000,
                order_by=order_by,
                page_token=token,
            )
            out.extend(page)
            token = page.token
            if not token:
                return out

    def find_fingerprint(
        self,
        fingerprint: str,
        *,
        stages: tuple[str, ...] = LIVE_STAGES,
        parent_run_id: str | None = None,
    ):
        """The newest finished run of ``fingerprint`` whose outcome can be reused, else None.

        Args:
            fingerprint: the plan's fingerprint (the ``fingerprint`` tag).
            stages: the stage tags a run may have (default: ``baseline`` and ``live``).
            parent_run_id: only children of this run; None: any run of the experiment.

        Returns:
            The newest such run whose ``outcome`` is ``ok``, ``failed`` or ``pruned``; None when
            there is none.
        """
        flt = f"tags.fingerprint = '{fingerprint}'"
        if parent_run_id:
            flt += f" and tags.`{PARENT_TAG}` = '{parent_run_id}'"
        for run in self._search(flt, ["attributes.start_time DESC"]):
            if (
                run.data.tags.get("stage") in stages
                and run.data.tags.get("outcome") in CACHEABLE_OUTCOMES
            ):
                return run
        return None

    def read_text(self, run_id: str, artifact: str) -> str:
        """The content of a text artifact.

        Args:
            run_id: the run.
            artifact: the artifact's path in the run (``trial.json``).

        Returns:
            The file's text (MLflow raises, by store, for a missing artifact).
        """
        with tempfile.TemporaryDirectory(prefix="bisect-eagle-") as tmp:
            return Path(self.client.download_artifacts(run_id, artifact, tmp)).read_text()

    def experiment_name(self) -> str:
        """The name of this object's experiment.

        Returns:
            The MLflow experiment's name.
        """
        return self.client.get_experiment(self.experiment_id).name
