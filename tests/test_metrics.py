"""The metrics hook: what run_scheduler and run_worker tell an assetq.Metrics, counted exactly
for forced scenarios on each engine."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

import assetq
from dbs import TestDatabase
from scenario import declare, register


class Recorder(assetq.Metrics):
    """Every call, in order, as (method, arguments)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self._lock = threading.Lock()

    def _add(self, name: str, *args: Any) -> None:
        with self._lock:
            self.calls.append((name, args))

    def of(self, name: str) -> list[tuple[Any, ...]]:
        return [args for called, args in self.calls if called == name]

    def scheduler_pass(self, seconds: float, runs: int, events: int) -> None:
        self._add("scheduler_pass", seconds, runs, events)

    def scheduler_pass_failed(self, seconds: float, code: str | None) -> None:
        self._add("scheduler_pass_failed", seconds, code)

    def run_created(self, run: assetq.Run, latency: float | None) -> None:
        self._add("run_created", run, latency)

    def scheduler_wait(self, outcome: str) -> None:
        self._add("scheduler_wait", outcome)

    def worker_claim(self, seconds: float, claimed: int) -> None:
        self._add("worker_claim", seconds, claimed)

    def worker_claim_failed(self, seconds: float, code: str | None) -> None:
        self._add("worker_claim_failed", seconds, code)

    def worker_completed(
        self, claim: assetq.Claim, outcome: str, run: assetq.Run | None, seconds: float
    ) -> None:
        self._add("worker_completed", claim, outcome, run, seconds)

    def worker_retry(self, claim: assetq.Claim, run: assetq.Run) -> None:
        self._add("worker_retry", claim, run)

    def worker_wait(self, outcome: str) -> None:
        self._add("worker_wait", outcome)


def test_a_pass_reports_its_runs_events_and_each_runs_event_latency(db: TestDatabase) -> None:
    declare(db, "orders_report", "orders")
    declare(db, "daily_sales", ["orders", "payments"])
    declare(db, "refunds_report", "refunds")  # nothing queued: no run
    events = [*register(db, "orders"), *register(db, "orders"), *register(db, "payments")]
    metrics = Recorder()

    stats = assetq.run_scheduler(
        db.engine, namespace=db.namespace, max_passes=1, listen=False, metrics=metrics
    )

    assert stats.runs == 2
    ((seconds, runs, consumed),) = metrics.of("scheduler_pass")
    assert (runs, consumed) == (2, 5)  # orders_report 2 events, daily_sales 3
    assert seconds >= 0
    created = {run.dag_id: (run, latency) for run, latency in metrics.of("run_created")}
    assert set(created) == {"orders_report", "daily_sales"}
    for dag_id, assets in (("orders_report", {"orders"}), ("daily_sales", {"orders", "payments"})):
        run, latency = created[dag_id]
        oldest = min(e.timestamp for e in events if e.asset in assets)
        assert latency == (run.created_at - oldest).total_seconds()
        assert latency >= 0
    assert metrics.of("scheduler_pass_failed") == []
    assert metrics.of("scheduler_wait") == []  # max_passes reached before any wait
    # Metrics are told before on_run, and of runs already committed.
    assert [name for name, _ in metrics.calls] == ["scheduler_pass", "run_created", "run_created"]


def test_an_idle_pass_reports_no_runs_and_its_poll(db: TestDatabase) -> None:
    declare(db, "orders_report", "orders")
    metrics = Recorder()

    assetq.run_scheduler(
        db.engine,
        namespace=db.namespace,
        max_passes=2,
        listen=False,
        poll_interval=0.01,
        metrics=metrics,
    )

    assert [args[1:] for args in metrics.of("scheduler_pass")] == [(0, 0), (0, 0)]
    assert metrics.of("run_created") == []
    assert metrics.of("scheduler_wait") == [("polled",)]  # between the two passes only


def test_a_failed_pass_is_reported_with_its_code(db: TestDatabase) -> None:
    metrics = Recorder()

    stats = assetq.run_scheduler(
        db.engine,
        namespace="not_installed_here",
        max_passes=1,
        listen=False,
        backoff_initial=0.01,
        metrics=metrics,
    )

    assert stats.errors == 1
    ((seconds, code),) = metrics.of("scheduler_pass_failed")
    # The code the loop's log line gives: the first call's schema check found no assetq there.
    assert code == "AQ104"
    assert seconds >= 0
    assert metrics.of("scheduler_pass") == []


def test_a_worker_reports_claims_a_retry_and_completions_by_state(db: TestDatabase) -> None:
    declare(db, "report", "orders", max_attempts=2, retry_delay=timedelta(0))
    register(db, "orders")
    (run,) = assetq.schedule(db.engine, namespace=db.namespace)
    attempts: list[int] = []

    def handler(claim: assetq.Claim, conn: sa.Connection) -> None:
        attempts.append(claim.attempt)
        if claim.attempt == 1:
            raise RuntimeError("first attempt fails")

    metrics = Recorder()
    stats = assetq.run_worker(
        db.engine,
        {"report": handler},
        namespace=db.namespace,
        max_runs=2,
        listen=False,
        poll_interval=0.01,
        metrics=metrics,
    )

    assert attempts == [1, 2]
    assert (stats.claimed, stats.failed, stats.succeeded) == (2, 1, 1)
    completed = metrics.of("worker_completed")
    assert [(c.run_id, c.attempt, outcome) for c, outcome, _, _ in completed] == [
        (run.run_id, 1, "failed"),
        (run.run_id, 2, "success"),
    ]
    assert [info.state for _, _, info, _ in completed] == ["queued", "success"]
    assert all(seconds >= 0 for *_, seconds in completed)
    ((retried, info),) = metrics.of("worker_retry")
    assert (retried.attempt, info.state) == (1, "queued")
    claims = [claimed for _, claimed in metrics.of("worker_claim")]
    assert claims.count(1) == 2
    # Every claim that found nothing was followed by an idle wait, which the poll ended.
    assert metrics.of("worker_wait") == [("polled",)] * claims.count(0)
    assert metrics.of("worker_claim_failed") == []


def test_metrics_is_optional_and_does_nothing_by_default(db: TestDatabase) -> None:
    declare(db, "orders_report", "orders")
    register(db, "orders")
    stats = assetq.run_scheduler(
        db.engine, namespace=db.namespace, max_passes=1, listen=False, metrics=assetq.Metrics()
    )
    assert stats.runs == 1


def test_the_async_scheduler_reports_what_the_sync_one_does(db: TestDatabase) -> None:
    """assetq.aio.run_scheduler takes the same hook and tells it the same things: a pass with
    its runs and events and each run's latency, an idle pass and its poll."""
    pytest.importorskip("greenlet")
    from sqlalchemy.ext.asyncio import create_async_engine

    from assetq import aio

    declare(db, "orders_report", "orders")
    (event,) = register(db, "orders")
    metrics = Recorder()

    async def main() -> assetq.SchedulerStats:
        engine = create_async_engine(aio.async_url(db.engine.url))
        try:
            return await aio.run_scheduler(
                engine,
                namespace=db.namespace,
                max_passes=2,
                listen=False,
                poll_interval=0.01,
                metrics=metrics,
            )
        finally:
            await engine.dispose()

    stats = asyncio.run(main())

    assert stats.runs == 1
    assert [args[1:] for args in metrics.of("scheduler_pass")] == [(1, 1), (0, 0)]
    ((run, latency),) = metrics.of("run_created")
    assert run.dag_id == "orders_report"
    assert latency == (run.created_at - event.timestamp).total_seconds()
    assert metrics.of("scheduler_wait") == []  # a pass that created runs goes on at once
    assert metrics.of("scheduler_pass_failed") == []


def test_the_async_worker_reports_what_the_sync_one_does(db: TestDatabase) -> None:
    """assetq.aio.run_worker takes the same hook: a failed first attempt that is retried, then
    a success, each completion with its outcome and run state, and every claim."""
    pytest.importorskip("greenlet")
    from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

    from assetq import aio

    declare(db, "report", "orders", max_attempts=2, retry_delay=timedelta(0))
    register(db, "orders")
    (run,) = assetq.schedule(db.engine, namespace=db.namespace)
    attempts: list[int] = []

    async def handler(claim: assetq.Claim, conn: AsyncConnection) -> None:
        attempts.append(claim.attempt)
        if claim.attempt == 1:
            raise RuntimeError("first attempt fails")

    metrics = Recorder()

    async def main() -> assetq.WorkerStats:
        engine = create_async_engine(aio.async_url(db.engine.url))
        try:
            return await aio.run_worker(
                engine,
                {"report": handler},
                namespace=db.namespace,
                max_runs=2,
                listen=False,
                poll_interval=0.01,
                metrics=metrics,
            )
        finally:
            await engine.dispose()

    stats = asyncio.run(main())

    assert attempts == [1, 2]
    assert (stats.claimed, stats.failed, stats.succeeded) == (2, 1, 1)
    completed = metrics.of("worker_completed")
    assert [(c.run_id, c.attempt, outcome) for c, outcome, _, _ in completed] == [
        (run.run_id, 1, "failed"),
        (run.run_id, 2, "success"),
    ]
    assert [info.state for _, _, info, _ in completed] == ["queued", "success"]
    ((retried, info),) = metrics.of("worker_retry")
    assert (retried.attempt, info.state) == (1, "queued")
    claims = [claimed for _, claimed in metrics.of("worker_claim")]
    assert claims.count(1) == 2
    assert metrics.of("worker_wait") == [("polled",)] * claims.count(0)
    assert metrics.of("worker_claim_failed") == []
