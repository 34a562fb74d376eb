"""The asyncio loops (assetq.aio.run_scheduler, run_worker) share the event loop with the
application: they never block it, and they leave nothing behind when they stop."""

from __future__ import annotations

import asyncio
import functools
import threading
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

import assetq
from assetq import aio
from assetq import scheduler as scheduler_module
from dbs import TestDatabase

#: A hang guard only: a loop that blocked the event loop would never let the test go on.
_GUARD = 120


def _engine(db: TestDatabase) -> AsyncEngine:
    return create_async_engine(aio.async_url(db.url), poolclass=NullPool)


def test_scheduler_worker_and_producer_run_as_tasks_of_one_loop(db: TestDatabase) -> None:
    """The producer is a task of the same loop as both loops: it only gets to register (and
    the runs only get created and completed) because neither loop holds the event loop
    while it waits."""
    consumers = [f"consumer_{n}" for n in range(4)]
    done: list[str] = []

    async def main() -> tuple[assetq.SchedulerStats, assetq.WorkerStats]:
        engine = _engine(db)
        stop = asyncio.Event()

        async def handler(claim: assetq.Claim, conn: AsyncConnection) -> None:
            await conn.execute(sa.text("SELECT 1"))

        def completed(claim: assetq.Claim, run: Any, outcome: str) -> None:
            done.append(f"{claim.dag_id}:{outcome}")
            if len(done) == len(consumers):
                stop.set()

        async with engine.begin() as conn:
            for dag_id in consumers:
                await aio.declare_dag(conn, dag_id, "orders")
        scheduler = asyncio.ensure_future(
            aio.run_scheduler(engine, poll_interval=0.05, stop_event=stop)
        )
        worker = asyncio.ensure_future(
            aio.run_worker(
                engine,
                dict.fromkeys(consumers, handler),
                concurrency=2,
                poll_interval=0.05,
                stop=stop,
                on_complete=completed,
            )
        )
        await asyncio.sleep(0)  # both loops started and waiting
        async with engine.begin() as conn:
            await aio.register_event(conn, "orders")
        results = await asyncio.wait_for(asyncio.gather(scheduler, worker), _GUARD)
        await engine.dispose()
        return results

    scheduler_stats, worker_stats = asyncio.run(main())
    assert sorted(done) == [f"{c}:success" for c in consumers]
    assert scheduler_stats.runs == len(consumers)
    assert worker_stats.succeeded == len(consumers)


def test_a_handler_error_fails_the_attempt_and_the_loop_goes_on(db: TestDatabase) -> None:
    outcomes: list[str] = []

    async def main() -> assetq.WorkerStats:
        engine = _engine(db)
        async with engine.begin() as conn:
            await aio.declare_dag(conn, "flaky", "orders", max_attempts=2)
            await aio.register_event(conn, "orders")
        await aio.schedule(engine)

        async def handler(claim: assetq.Claim, conn: AsyncConnection) -> None:
            if claim.attempt == 1:
                raise RuntimeError("first attempt fails")

        stats = await asyncio.wait_for(
            aio.run_worker(
                engine,
                {"flaky": handler},
                max_runs=2,
                poll_interval=0.05,
                on_complete=lambda claim, run, outcome: outcomes.append(outcome),
            ),
            _GUARD,
        )
        await engine.dispose()
        return stats

    stats = asyncio.run(main())
    assert outcomes == ["failed", "success"]
    assert (stats.failed, stats.succeeded) == (1, 1)


def test_a_sync_handler_is_refused_at_start_naming_its_consumer(db: TestDatabase) -> None:
    """Issue 26: a sync handler was accepted, then every attempt failed on awaiting what it
    returned (after it had run, outside the loop's transaction). Refused before any claim;
    an async handler behind functools.partial or as an object's __call__ is a coroutine
    function and is taken."""
    ran: list[int] = []

    def sync_handler(claim: assetq.Claim, conn: Any) -> None:
        ran.append(claim.id)

    class Callable_:
        async def __call__(self, claim: assetq.Claim, conn: AsyncConnection) -> None:
            ran.append(claim.id)

    async def handler(claim: assetq.Claim, conn: AsyncConnection, tag: str) -> None:
        ran.append(claim.id)

    async def main() -> int:
        engine = _engine(db)
        async with engine.begin() as conn:
            await aio.declare_dag(conn, "report", "orders")
            await aio.register_event(conn, "orders")
        await aio.schedule(engine)
        with pytest.raises(TypeError, match=r"handler of 'report' must be a coroutine function"):
            await aio.run_worker(engine, {"report": sync_handler}, max_runs=1, poll_interval=0.05)
        async with engine.connect() as conn:
            (run,) = await aio.runs(conn, "report")
        assert (run.state, run.attempt) == ("queued", 0)  # nothing was claimed
        stats = await asyncio.wait_for(
            aio.run_worker(
                engine,
                {"report": functools.partial(handler, tag="x"), "other": Callable_()},
                max_runs=1,
                poll_interval=0.05,
            ),
            _GUARD,
        )
        await engine.dispose()
        return stats.succeeded

    assert asyncio.run(main()) == 1
    assert len(ran) == 1


@pytest.mark.engines("postgresql")
def test_the_workers_listening_connection_is_gone_when_it_stops(db: TestDatabase) -> None:
    """PostgreSQL: the worker LISTENs on a connection of its own while it runs, and closes
    it when it stops (I11: no LISTEN left on a connection anyone else gets)."""
    listening = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND query LIKE 'LISTEN%'"
    )

    async def main() -> int:
        engine = _engine(db)
        stop = asyncio.Event()

        async def handler(claim: assetq.Claim, conn: AsyncConnection) -> None:
            return None

        worker = asyncio.ensure_future(
            aio.run_worker(engine, {"report": handler}, poll_interval=0.05, stop=stop)
        )
        seen = 0
        for _ in range(_GUARD * 20):  # until the listener has sent its LISTEN
            seen = int(db.scalar(listening))
            if seen:
                break
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(worker, _GUARD)
        await engine.dispose()
        return seen

    assert asyncio.run(main()) == 1
    assert int(db.scalar(listening)) == 0


@pytest.mark.engines("postgresql")
def test_the_async_scheduler_is_woken_by_a_producers_commit(
    db: TestDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL, forced: the first pass finds nothing and the loop takes the wake-up lock
    (arms), passes once more and waits for a notification; only then does a producer commit.
    With a poll interval of ten minutes, only the producer's notification can start the next
    pass. "Then" is the listener's wait itself: after the pass the loop still asks whether a
    consumer is waiting outside the pass's window, and a commit landing before that question
    started the pass without a wake-up (seen under load in CI's PostgreSQL 18 pass)."""
    created: list[assetq.Run] = []
    listening = threading.Event()
    wait = scheduler_module.WakeupListener.wait

    def wait_for_notification(self: Any, timeout: float, stop: threading.Event) -> bool:
        listening.set()
        return wait(self, timeout, stop)

    monkeypatch.setattr(scheduler_module.WakeupListener, "wait", wait_for_notification)

    async def main() -> assetq.SchedulerStats:
        engine = _engine(db)
        stop = asyncio.Event()
        waiting = asyncio.Event()
        passes = [0]

        def on_pass(runs: list[assetq.Run]) -> None:
            passes[0] += 1
            if passes[0] == 2:  # the pass after arming: the loop waits for wake-ups next
                listening.clear()
                waiting.set()

        def on_run(run: assetq.Run) -> None:
            created.append(run)
            stop.set()

        async with engine.begin() as conn:
            await aio.declare_dag(conn, "report", "orders")
        scheduler_task = asyncio.ensure_future(
            aio.run_scheduler(
                engine, poll_interval=600, stop_event=stop, on_pass=on_pass, on_run=on_run
            )
        )
        await asyncio.wait_for(waiting.wait(), _GUARD)
        assert await asyncio.to_thread(listening.wait, _GUARD)
        async with engine.begin() as conn:
            await aio.register_event(conn, "orders")
        stats = await asyncio.wait_for(scheduler_task, _GUARD)
        await engine.dispose()
        return stats

    stats = asyncio.run(main())
    assert [r.dag_id for r in created] == ["report"]
    assert (stats.arms, stats.wakeups, stats.passes) == (1, 1, 3)


@pytest.mark.engines("postgresql")
def test_an_idle_async_worker_is_woken_by_the_notification_when_a_pass_creates_runs(
    db: TestDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sync worker's test, through the async shell: the listening connection waits in a
    thread and wakes a slot that waits as a task. Its first idle wait is made as long as the
    poll (30 s), so only the notification can end it within the 20 s deadline; the run is
    created after that first, empty claim."""
    monkeypatch.setattr(assetq.worker, "IDLE_FIRST", 30.0)
    listening = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND query LIKE 'LISTEN %'"
    )
    done: list[int] = []
    created: list[assetq.Run] = []
    sent = [0]

    async def main() -> assetq.WorkerStats:
        engine = _engine(db)

        def count(*args: Any) -> None:
            if "claim_runs" in str(args[2]):
                sent[0] += 1

        sa.event.listen(engine.sync_engine, "after_cursor_execute", count)
        async with engine.begin() as conn:
            await aio.declare_dag(conn, "report", "orders")

        async def handler(claim: assetq.Claim, conn: AsyncConnection) -> None:
            done.append(claim.id)

        worker = asyncio.ensure_future(
            aio.run_worker(engine, {"report": handler}, worker="idle", poll_interval=30, max_runs=1)
        )
        for _ in range(_GUARD * 20):  # the first, empty claim made and the LISTEN sent
            if sent[0] >= 1 and int(db.scalar(listening)):
                break
            await asyncio.sleep(0.05)
        async with engine.begin() as conn:
            await aio.register_event(conn, "orders")
        created.extend(await aio.schedule(engine))
        stats = await asyncio.wait_for(worker, 20)
        await engine.dispose()
        return stats

    stats = asyncio.run(main())
    assert done == [run.id for run in created] and len(done) == 1
    assert stats.wakeups >= 1
    assert sent[0] == 2  # the empty claim, and the one the wake-up started


@pytest.mark.engines("postgresql")
def test_the_kept_connection_forms_claim_renew_and_complete_on_one_autocommit_connection(
    db: TestDatabase,
) -> None:
    """aio.claim_runs, aio.heartbeat and aio.complete_run on an AsyncConnection in autocommit
    mode that the caller keeps: each call a transaction of its own on that one connection
    (its server session is the one the run's claim and completion were made in); one in a
    transaction is refused by the calls that commit by themselves."""

    async def main() -> tuple[Any, ...]:
        engine = _engine(db)
        try:
            async with engine.begin() as conn:
                await aio.declare_dag(conn, "report", "orders")
                await aio.register_event(conn, "orders")
            await aio.schedule(engine)
            async with engine.connect() as conn:
                kept = await conn.execution_options(isolation_level="AUTOCOMMIT")
                pid = (await kept.execute(sa.text("SELECT pg_backend_pid()"))).scalar_one()
                (claim,) = await aio.claim_runs(kept, "w1", lease=60)
                renewed = await aio.heartbeat(kept, claim, lease=120)
                run = await aio.complete_run(kept, renewed, "success")
                # Committed: another connection sees it.
                async with engine.connect() as other:
                    state = (
                        await other.execute(
                            sa.text(db.sql("SELECT state FROM {ns}.dag_run WHERE id = :id")),
                            {"id": claim.id},
                        )
                    ).scalar_one()
                same = (await kept.execute(sa.text("SELECT pg_backend_pid()"))).scalar_one()
            async with engine.connect() as conn:
                await conn.begin()
                with pytest.raises(assetq.InvalidArgumentType):
                    await aio.claim_runs(conn, "w1")
            return claim, renewed, run, state, pid, same
        finally:
            await engine.dispose()

    claim, renewed, run, state, pid, same = asyncio.run(asyncio.wait_for(main(), _GUARD))
    assert renewed.lease_until > claim.lease_until
    assert (run.state, state) == ("success", "success")
    assert pid == same
