"""The core behaviour, through both shells: every test here runs once through the sync API
and once through :mod:`assetq.aio` (SQLAlchemy's asyncio extension), on each engine.

A test is written once against a :class:`Shell`: ``shell.register_event(handle, ...)`` is
``assetq.register_event`` or ``await assetq.aio.register_event``, ``shell.transaction()``
yields the caller's transaction as a Connection / Session or an AsyncConnection /
AsyncSession. The async shell drives its coroutines on an event loop of its own, so a test
can hold one transaction open while another call runs (the forced interleavings below).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncSession,
    create_async_engine,
)
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

import assetq
from assetq import aio
from dbs import TestDatabase


class Shell:
    """The sync API."""

    kind = "sync"

    def __init__(self, db: TestDatabase) -> None:
        self.db = db
        self.engine: Any = db.engine

    def __getattr__(self, name: str) -> Callable[..., Any]:
        return getattr(assetq, name)  # type: ignore[no-any-return]

    @contextmanager
    def transaction(self, orm: bool = False) -> Iterator[Any]:
        """The caller's transaction, committed at the end (rolled back on an error)."""
        if orm:
            with Session(self.db.engine) as session:
                yield session
                session.commit()
        else:
            with self.db.engine.connect() as conn:
                conn.begin()
                yield conn
                conn.commit()

    def rollback(self, handle: Any) -> None:
        handle.rollback()

    def execute(self, handle: Any, statement: str, **params: Any) -> None:
        handle.execute(sa.text(self.db.sql(statement)), params)

    def handler(
        self, *, row: bool = False, fail: bool = False, events: list[Any] | None = None
    ) -> Callable[..., Any]:
        """A worker handler: writes an application row (the run's id), fails, or returns
        output events."""
        sql = self.db.sql("INSERT INTO {ns}.app_orders (id) VALUES (:id)")

        def handle(claim: assetq.Claim, conn: sa.Connection) -> Any:
            if row:
                conn.execute(sa.text(sql), {"id": claim.id})
            if fail:
                raise RuntimeError("the handler failed")
            return events

        return handle

    def close(self) -> None:
        pass


class AsyncShell(Shell):
    """assetq.aio, on an AsyncEngine, its coroutines driven on a loop of its own."""

    kind = "async"

    def __init__(self, db: TestDatabase) -> None:
        super().__init__(db)
        self.loop = asyncio.new_event_loop()
        # NullPool: no connection outlives the loop it was made on.
        self.engine = create_async_engine(aio.async_url(db.url), poolclass=NullPool)

    def run(self, awaitable: Any) -> Any:
        return self.loop.run_until_complete(awaitable)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        function = getattr(aio, name)
        return lambda *args, **kwargs: self.run(function(*args, **kwargs))

    @contextmanager
    def transaction(self, orm: bool = False) -> Iterator[Any]:
        if orm:
            session = AsyncSession(self.engine)
            try:
                yield session
                self.run(session.commit())
            finally:
                self.run(session.close())
        else:
            conn = self.run(AsyncConnection(self.engine).start())
            try:
                self.run(conn.begin())
                yield conn
                self.run(conn.commit())
            finally:
                self.run(conn.close())

    def rollback(self, handle: Any) -> None:
        self.run(handle.rollback())

    def execute(self, handle: Any, statement: str, **params: Any) -> None:
        self.run(handle.execute(sa.text(self.db.sql(statement)), params))

    def handler(
        self, *, row: bool = False, fail: bool = False, events: list[Any] | None = None
    ) -> Callable[..., Any]:
        sql = self.db.sql("INSERT INTO {ns}.app_orders (id) VALUES (:id)")

        async def handle(claim: assetq.Claim, conn: AsyncConnection) -> Any:
            if row:
                await conn.execute(sa.text(sql), {"id": claim.id})
            if fail:
                raise RuntimeError("the handler failed")
            return events

        return handle

    def close(self) -> None:
        self.run(self.engine.dispose())
        self.loop.close()


@pytest.fixture(params=["sync", "async"])
def shell(request: pytest.FixtureRequest, db: TestDatabase) -> Iterator[Shell]:
    db.execute("CREATE TABLE {ns}.app_orders (id INTEGER PRIMARY KEY)")
    made = Shell(db) if request.param == "sync" else AsyncShell(db)
    try:
        yield made
    finally:
        made.close()


def _orders(db: TestDatabase) -> list[int]:
    return [int(r[0]) for r in db.rows("SELECT id FROM {ns}.app_orders ORDER BY id")]


# -- registration ---------------------------------------------------------------------------


@pytest.mark.parametrize("orm", [False, True], ids=["connection", "session"])
def test_an_event_and_its_queue_rows_commit_or_roll_back_with_the_caller(
    shell: Shell, orm: bool
) -> None:
    with shell.transaction(orm) as handle:
        shell.declare_dag(handle, "a_consumer", "orders")
        shell.declare_dag(handle, "b_consumer", ["orders", "customers"])
    with shell.transaction(orm) as handle:
        shell.register_event(handle, "orders")
        shell.rollback(handle)  # I1: a rolled-back producer leaves nothing
    assert shell.db.counts()["asset_event"] == 0
    with shell.transaction(orm) as handle:
        event = shell.register_event(handle, "orders", extra={"rows": 3})
        assert shell.db.counts()["asset_event"] == 0  # not before the caller commits
    assert event.created
    queued = shell.db.rows(
        "SELECT target_dag_id FROM {ns}.asset_dag_run_queue WHERE asset_event_id = :id"
        " ORDER BY target_dag_id",
        id=event.id,
    )
    assert [r.target_dag_id for r in queued] == ["a_consumer", "b_consumer"]


@pytest.mark.parametrize("orm", [False, True], ids=["connection", "session"])
def test_idempotency_retry_and_conflict_and_the_transaction_stays_usable(
    shell: Shell, orm: bool
) -> None:
    with shell.transaction(orm) as handle:
        shell.declare_dag(handle, "report", "orders")
        first = shell.register_event(handle, "orders", idempotency_key="k", extra={"n": 1})
    with shell.transaction(orm) as handle:
        shell.execute(handle, "INSERT INTO {ns}.app_orders (id) VALUES (1)")
        again = shell.register_event(handle, "orders", idempotency_key="k", extra={"n": 1})
        with pytest.raises(assetq.IdempotencyConflict) as conflict:
            shell.register_event(handle, "orders", idempotency_key="k", extra={"n": 2})
        with pytest.raises(assetq.UnknownAsset):
            shell.register_event(handle, "no_such_asset")
        shell.execute(handle, "INSERT INTO {ns}.app_orders (id) VALUES (2)")
    assert (again.id, again.created) == (first.id, False)
    assert conflict.value.code == "AQ005"
    assert _orders(shell.db) == [1, 2]  # the caller's rows survived both errors
    assert shell.db.counts()["asset_event"] == 1


def test_a_batch_is_all_or_nothing_and_in_input_order(shell: Shell) -> None:
    with shell.transaction() as handle:
        shell.declare_dag(handle, "report", assetq.any_of("orders", "customers"))
    with shell.transaction() as handle:
        events = shell.register_events(
            handle, [assetq.NewEvent("customers"), {"asset": "orders", "extra": {"n": 1}}]
        )
        with pytest.raises(assetq.UnknownAsset) as unknown:
            shell.register_events(handle, [{"asset": "orders"}, {"asset": "missing"}])
    assert [e.asset for e in events] == ["customers", "orders"]
    assert unknown.value.code == "AQ001"
    assert shell.db.counts()["asset_event"] == 2


def test_python_side_errors_carry_codes_and_send_nothing(shell: Shell) -> None:
    with shell.transaction() as handle:
        with pytest.raises(assetq.NameTooLong) as long_name:
            shell.register_event(handle, "x" * 600)
        with pytest.raises(assetq.InvalidArgumentType) as wrong_type:
            shell.register_event(handle, 42)
        with pytest.raises(assetq.InvalidExtra) as bad_extra:
            shell.register_event(handle, "orders", extra={"f": float("nan")})
    assert (long_name.value.code, wrong_type.value.code, bad_extra.value.code) == (
        "AQ102",
        "AQ100",
        "AQ103",
    )


def test_a_handle_of_the_other_shell_is_refused_with_the_recipe(shell: Shell) -> None:
    other: Any
    if shell.kind == "sync":
        other = create_async_engine(aio.async_url(shell.db.url)).connect()  # not started
        expected = r"assetq\.aio\.register_event"
    else:
        other = shell.db.engine.connect()
        expected = r"use assetq\.register_event"
    try:
        with pytest.raises(assetq.InvalidArgumentType, match=expected) as raised:
            shell.register_event(other, "orders")
        assert raised.value.code == "AQ101"
    finally:
        if shell.kind == "async":
            other.close()


# -- scheduling -----------------------------------------------------------------------------


def test_a_late_commit_is_consumed_by_the_next_run(shell: Shell) -> None:
    """I3, forced: a producer holds its transaction open while another commits and a pass
    runs; the pass consumes only what committed, the late event goes to the next run."""
    with shell.transaction() as handle:
        shell.declare_dag(handle, "report", "orders")
    with shell.transaction() as late:
        late_event = shell.register_event(late, "orders")
        with shell.transaction() as early:
            early_event = shell.register_event(early, "orders")
        (first,) = shell.schedule(shell.engine)
    (second,) = shell.schedule(shell.engine)
    assert first.event_ids == (early_event.id,)
    assert second.event_ids == (late_event.id,)
    assert shell.schedule(shell.engine) == []
    assert shell.db.links() == sorted([("report", early_event.id), ("report", late_event.id)])


def test_reads_page_runs_and_events(shell: Shell) -> None:
    with shell.transaction() as handle:
        shell.declare_dag(handle, "report", "orders")
        shell.register_events(handle, [{"asset": "orders"}] * 3)
    (run,) = shell.schedule(shell.engine)
    with shell.transaction(orm=True) as handle:
        shell.register_event(handle, "orders")
    with shell.transaction() as handle:
        (listed,) = shell.runs(handle, "report")
        got = shell.get_run(handle, "report", run.run_id)
        consumed = shell.consumed_events(handle, "report", run.run_id, limit=2)
        rest = shell.consumed_events(handle, "report", run.run_id, after=consumed[-1])
        (queued,) = shell.queued_events(handle, "report")
        (status,) = shell.status(handle)
        with pytest.raises(assetq.UnknownRun):
            shell.get_run(handle, "report", "nope")
    assert listed.run_id == got.run_id == run.run_id
    assert [e.id for e in consumed + rest] == list(run.event_ids)
    assert queued.id not in run.event_ids
    assert (status.queued_events, status.runs_total) == (1, 1)


def test_the_scheduler_loop_creates_the_runs(shell: Shell) -> None:
    with shell.transaction() as handle:
        for n in range(3):
            shell.declare_dag(handle, f"consumer_{n}", "orders")
        shell.register_event(handle, "orders")
    created: list[assetq.Run] = []
    stats = shell.run_scheduler(
        shell.engine, max_passes=2, poll_interval=0.05, on_run=created.append
    )
    assert stats.runs == 3
    assert sorted(r.dag_id for r in created) == ["consumer_0", "consumer_1", "consumer_2"]


# -- operations -----------------------------------------------------------------------------


def test_the_previews_and_repair_are_public_in_both_shells(shell: Shell) -> None:
    """Issue 26: docs/operations.md names purge_preview, uninstall_preview and repair as API
    functions; they were reachable through assetq.ops and assetq.migrate only."""
    namespace = shell.db.namespace
    with shell.transaction() as handle:
        shell.declare_dag(handle, "report", "orders")
        shell.register_event(handle, "orders")
    preview = shell.purge_preview(shell.engine, older_than=timedelta(0), namespace=namespace)
    assert isinstance(preview, assetq.PurgePreview)
    assert (preview.runs, preview.events) == (0, 0)  # the event is queued: never purged
    removal = shell.uninstall_preview(shell.engine, namespace=namespace)
    assert isinstance(removal, assetq.UninstallPreview)
    assert removal.revision == assetq.head_revision() and removal.total_rows > 0
    assert shell.repair(shell.engine, namespace=namespace) == []


# -- runs as work ---------------------------------------------------------------------------


def test_a_claim_is_completed_once_with_its_output_events(shell: Shell) -> None:
    with shell.transaction() as handle:
        shell.declare_dag(handle, "report", "orders")
        shell.declare_dag(handle, "downstream", "report_out")
        shell.register_event(handle, "orders")
    shell.schedule(shell.engine)
    (claim,) = shell.claim_runs(shell.engine, "w1", lease=30)
    assert shell.claim_runs(shell.engine, "w2") == []  # I8: one holder
    claim = shell.heartbeat(shell.engine, claim)
    with shell.transaction() as handle:
        done = shell.complete_run(handle, claim, "success", events=[{"asset": "report_out"}])
    with shell.transaction() as handle, pytest.raises(assetq.LeaseLost) as lost:
        shell.complete_run(handle, claim, "success")  # finished: a second completion is refused
    assert done.state == "success" and len(done.output_event_ids) == 1
    assert lost.value.code == "AQ010"
    (downstream,) = shell.schedule(shell.engine)
    assert downstream.event_ids == done.output_event_ids


def test_the_worker_commits_the_handlers_writes_with_success_or_not_at_all(shell: Shell) -> None:
    """I9: the handler's row commits with the run's success; a failing handler's row is
    rolled back and the failure recorded."""
    with shell.transaction() as handle:
        shell.declare_dag(handle, "good", "orders")
        shell.declare_dag(handle, "bad", "orders")
        shell.register_event(handle, "orders")
    shell.schedule(shell.engine)
    outcomes: dict[str, str] = {}
    stats = shell.run_worker(
        shell.engine,
        {"good": shell.handler(row=True), "bad": shell.handler(row=True, fail=True)},
        max_runs=2,
        poll_interval=0.05,
        on_complete=lambda claim, run, outcome: outcomes.__setitem__(claim.dag_id, outcome),
    )
    assert outcomes == {"good": "success", "bad": "failed"}
    assert (stats.succeeded, stats.failed) == (1, 1)
    with shell.transaction() as handle:
        (good,) = shell.runs(handle, "good")
        (bad,) = shell.runs(handle, "bad")
    assert _orders(shell.db) == [good.id]
    assert bad.state == "failed" and "the handler failed" in (bad.error or "")
