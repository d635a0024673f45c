"""The claims table: one row per fingerprint measured (or being measured) in a study, inserted
atomically.

Before a live trial runs, its plan fingerprint is inserted under a unique constraint ``(study,
fingerprint)``, so two workers never measure the same effective config: the loser of the race waits
for the winner's result (:meth:`Claims.wait_done`) and reuses it. A claim is ``running`` until its
trial ends ``ok``, ``failed`` or ``pruned``; a claim whose trial did not finish (interrupted, or its
process died) is released, so the config is measured again. A running claim whose owner process died
on this host is taken over by the next claimant; one whose owner was on another node is released
when its Optuna trial stops heart-beating (:class:`bisect_eagle.search.study.resume.Liveness`, on
whichever node looks next). The table lives in the study's own Optuna database
(:func:`bisect_eagle.search.study.storage.engine_kwargs`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from bisect_eagle.poll import wait_until
from bisect_eagle.search.study.storage import engine_kwargs
from bisect_eagle.tracking.owner import owner_alive

ClaimState = Literal["running", "ok", "failed", "pruned"]
TABLE = "bisect_eagle_claims"
REAPS = "bisect_eagle_reaps"  # one row per Optuna trial failed for silence: who handled it


@dataclass(kw_only=True)
class Claim:
    """One fingerprint of a study, the Optuna trial that claimed it, its owner process and its
    result."""

    id: int
    fingerprint: str
    trial: int
    owner: str  # tracking.owner_id() of the claimant
    state: ClaimState
    value: float | None  # the criterion metric once finished (None when failed)
    run_id: str | None  # the MLflow run of the measurement


@dataclass(kw_only=True)
class Claiming:
    """A claim inside :meth:`Claims.claimed`'s block: whether this trial owns it (``won``), the
    claim that another holds (``other``), and the result the block sets when it measured it
    (``finished``: state, value, run id)."""

    won: bool
    other: Claim | None  # won False: another's claim; None: beyond the live-trial budget
    finished: tuple[ClaimState, float | None, str | None] | None = None


class Claims:
    """The claims of one study (``study``) in the database at ``url``."""

    def __init__(self, url: str, study: str):
        import sqlalchemy as sa

        self.sa = sa
        self.study = study
        self.engine = sa.create_engine(url, **engine_kwargs(url))
        meta = sa.MetaData()
        self.table = sa.Table(
            TABLE,
            meta,
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("study", sa.String(512), nullable=False),
            sa.Column("fingerprint", sa.String(64), nullable=False),
            sa.Column("trial", sa.Integer, nullable=False),
            sa.Column("owner", sa.String(256), nullable=False),
            sa.Column("state", sa.String(16), nullable=False),
            sa.Column("value", sa.Float, nullable=True),
            sa.Column("run_id", sa.String(64), nullable=True),
            sa.UniqueConstraint("study", "fingerprint", name="uq_bisect_eagle_claim"),
        )
        self.reaps = sa.Table(
            REAPS,
            meta,
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("study", sa.String(512), nullable=False),
            sa.Column("trial", sa.Integer, nullable=False),
            sa.Column("reaper", sa.String(256), nullable=False),
            sa.UniqueConstraint("study", "trial", name="uq_bisect_eagle_reap"),
        )
        # another process created it first: SQLite says OperationalError, PostgreSQL
        # IntegrityError/ProgrammingError
        with contextlib.suppress(
            sa.exc.OperationalError, sa.exc.IntegrityError, sa.exc.ProgrammingError
        ):
            meta.create_all(self.engine, checkfirst=True)

    @staticmethod
    def _row(r) -> Claim:
        return Claim(
            id=r.id,
            fingerprint=r.fingerprint,
            trial=r.trial,
            owner=r.owner,
            state=r.state,
            value=r.value,
            run_id=r.run_id,
        )

    def _mine(self):
        return self.table.c.study == self.study

    def get(self, fingerprint: str) -> Claim | None:
        """The claim of ``fingerprint``, or None.

        Args:
            fingerprint: the config's fingerprint.

        Returns:
            The claim, or None when the study has no claim of it.
        """
        t = self.table
        with self.engine.connect() as c:
            r = c.execute(
                self.sa.select(t).where(self._mine(), t.c.fingerprint == fingerprint)
            ).first()
        return self._row(r) if r else None

    def claim(self, fingerprint: str, *, trial: int, owner: str) -> tuple[bool, Claim | None]:
        """(True, None) when ``owner`` now owns the fingerprint, else (False, the existing claim).

        A running claim whose owner died on this host is taken over.
        """
        t = self.table
        try:
            with self.engine.begin() as c:
                c.execute(
                    t.insert().values(
                        study=self.study,
                        fingerprint=fingerprint,
                        trial=trial,
                        owner=owner,
                        state="running",
                    )
                )
            return True, None
        except self.sa.exc.IntegrityError:
            pass
        other = self.get(fingerprint)
        if other is None:  # released between our insert and read
            return self.claim(fingerprint, trial=trial, owner=owner)
        if other.state == "running" and owner_alive(other.owner) is False:
            with self.engine.begin() as c:
                res = c.execute(
                    t.update()
                    .where(t.c.id == other.id, t.c.owner == other.owner, t.c.state == "running")
                    .values(owner=owner, trial=trial)
                )
            if res.rowcount == 1:
                return True, None
        return False, other

    def claim_within(
        self, fingerprint: str, *, trial: int, owner: str, limit: int
    ) -> tuple[bool, Claim | None]:
        """:meth:`claim`, and the claim given back at once when it falls beyond the study's first
        ``limit`` claims (:meth:`position`: other workers used up the live-trial budget).

        Args:
            fingerprint: the plan's fingerprint.
            trial: the claiming Optuna trial's number.
            owner: the claimant (:func:`~bisect_eagle.tracking.owner.owner_id`).
            limit: the study's live-trial budget.

        Returns:
            (True, None): ``owner`` owns it now; (False, the existing claim): another holds it;
            (False, None): it was beyond ``limit`` and is released.
        """
        won, other = self.claim(fingerprint, trial=trial, owner=owner)
        if won and self.position(fingerprint) > limit:
            self.release(fingerprint)
            return False, None
        return won, other

    @contextlib.contextmanager
    def claimed(
        self, fingerprint: str, *, trial: int, owner: str, limit: int
    ) -> Iterator[Claiming]:
        """A claim's life as one block: taken as it starts (:meth:`claim_within`), its result
        recorded as it ends (:meth:`finish`, when the block set ``finished``), released when the
        block raises (:meth:`release`: the config may be measured again).

        Args:
            fingerprint: the plan's fingerprint.
            trial: the claiming Optuna trial's number.
            owner: the claimant (:func:`~bisect_eagle.tracking.owner.owner_id`).
            limit: the study's live-trial budget.

        Returns:
            A context manager giving the :class:`Claiming`; the block's exception propagates.
        """
        won, other = self.claim_within(fingerprint, trial=trial, owner=owner, limit=limit)
        claiming = Claiming(won=won, other=other)
        try:
            yield claiming
        except BaseException:
            if won:
                self.release(fingerprint)
            raise
        if won and claiming.finished is not None:
            state, value, run_id = claiming.finished
            self.finish(fingerprint, state=state, value=value, run_id=run_id)

    def position(self, fingerprint: str) -> int:
        """1-based order of this fingerprint's claim among the study's claims (the live-trial
        budget).

        Args:
            fingerprint: the config's fingerprint.

        Returns:
            Its 1-based position.

        Raises:
            KeyError: the study has no claim of ``fingerprint``.
        """
        t = self.table
        mine = self.get(fingerprint)
        if mine is None:
            raise KeyError(f"no claim of {fingerprint} in study {self.study!r}")
        with self.engine.connect() as c:
            return int(
                c.execute(
                    self.sa.select(self.sa.func.count())
                    .select_from(t)
                    .where(self._mine(), t.c.id <= mine.id)
                ).scalar_one()
            )

    def finish(
        self, fingerprint: str, *, state: ClaimState, value: float | None, run_id: str | None
    ) -> None:
        """Record the measured result of a claim (it stays: the config is never measured again).

        Args:
            fingerprint: the config's fingerprint.
            state: the claim's final state.
            value: the measured value, or None when there is none.
            run_id: the trial's run, or None when there is none.
        """
        t = self.table
        with self.engine.begin() as c:
            c.execute(
                t.update()
                .where(self._mine(), t.c.fingerprint == fingerprint)
                .values(state=state, value=value, run_id=run_id)
            )

    def release(self, fingerprint: str, *, trial: int | None = None) -> bool:
        """Forget a running claim whose trial did not finish (it may be measured again); with
        ``trial``, only while that Optuna trial still holds it (not once another took it over). True
        when a claim was dropped."""
        t = self.table
        cond = [self._mine(), t.c.fingerprint == fingerprint, t.c.state == "running"]
        if trial is not None:
            cond.append(t.c.trial == trial)
        with self.engine.begin() as c:
            return c.execute(t.delete().where(*cond)).rowcount > 0

    def take_reap(self, trial: int, *, reaper: str) -> bool:
        """True for exactly one caller per trial of the study: the process that cleans up after a
        silent trial.

        Optuna's ``fail_stale_trials`` relies on ``SELECT … FOR UPDATE``, which SQLite ignores, so
        two processes can both fail the same trial there; the unique insert here decides which one
        releases and reports it.
        """
        try:
            with self.engine.begin() as c:
                c.execute(self.reaps.insert().values(study=self.study, trial=trial, reaper=reaper))
        except self.sa.exc.IntegrityError:
            return False
        return True

    def all(self) -> list[Claim]:
        """Every claim of the study, in claim order.

        Returns:
            The claims, oldest first.
        """
        t = self.table
        with self.engine.connect() as c:
            return [
                self._row(r)
                for r in c.execute(self.sa.select(t).where(self._mine()).order_by(t.c.id))
            ]

    def wait_done(self, fingerprint: str, *, timeout_s: float, poll_s: float = 1.0) -> Claim | None:
        """Wait until another worker's claim is finished; None if it was released, its owner died or
        time ran out.

        Checks at most ``poll_s`` apart (sooner at first: a short trial's result is picked up
        quickly).
        """

        def settled() -> tuple[Claim | None] | None:
            c = self.get(fingerprint)
            if c is None or c.state != "running":
                return (c,)
            if owner_alive(c.owner) is False:
                return (None,)
            return None

        found = wait_until(
            settled,
            timeout_s=timeout_s,
            max_interval_s=poll_s,
            what=f"the claim of {fingerprint[:12]} in study {self.study!r}",
        )
        return found[0] if found else None
