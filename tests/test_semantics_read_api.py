"""Issue 5, read API: queued_events, consumed_events and runs, for callers and operators,
paginated by key so a large backlog never loads at once."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import sqlalchemy as sa

import assetq
import scenario
from dbs import TestDatabase


def test_queued_events_pages_a_large_backlog_in_order_without_gaps_or_duplicates(
    db: TestDatabase,
) -> None:
    scenario.declare(db, "consumer", "orders")
    events: list[assetq.Event] = []
    for size in (1000, 1000, 500):  # three transactions, three timestamps
        with db.engine.begin() as conn:
            events += assetq.register_events(conn, [assetq.NewEvent("orders")] * size)
    expected = [e.id for e in sorted(events, key=lambda e: (e.timestamp, e.id))]
    pages: list[list[int]] = []
    after = None
    with db.engine.connect() as conn:
        while True:
            page = assetq.queued_events(conn, "consumer", limit=1000, after=after)
            if not page:
                break
            pages.append([r.id for r in page])
            after = page[-1]
    assert [len(p) for p in pages] == [1000, 1000, 500]
    assert [i for p in pages for i in p] == expected


def test_queued_event_records_describe_the_event(db: TestDatabase) -> None:
    scenario.declare(db, "consumer", "orders")
    with db.engine.begin() as conn:
        assetq.declare_asset(conn, "orders", uri="s3://b/orders")
    source = assetq.Source(dag_id="producer", task_id="load", run_id="r1", map_index=2)
    with db.engine.begin() as conn:
        event = assetq.register_event(
            conn, "orders", extra={"rows": 3}, source=source, aliases=("daily",)
        )
    with db.engine.connect() as conn:
        (record,) = assetq.queued_events(conn, "consumer")
    assert record == assetq.Event(
        id=event.id,
        asset="orders",
        asset_id=event.asset_id,
        uri="s3://b/orders",
        timestamp=event.timestamp,
        extra={"rows": 3},
        source=source,
        aliases=("daily",),
    )


def test_runs_are_listed_newest_first_and_paged_with_before(db: TestDatabase) -> None:
    scenario.declare(db, "consumer", "orders")
    scenario.declare(db, "other", "orders")
    created = []
    for _ in range(5):
        scenario.register(db, "orders")
        created += [r for r in assetq.schedule(db.engine) if r.dag_id == "consumer"]
    with db.engine.begin() as conn:
        assetq.set_run_state(conn, "consumer", created[1].run_id, "running")
        assetq.set_run_state(conn, "consumer", created[3].run_id, "success")
    pages: list[list[int]] = []
    before = None
    with db.engine.connect() as conn:
        while page := assetq.runs(conn, "consumer", limit=2, before=before):
            pages.append([r.seq for r in page])
            before = page[-1]
        assert pages == [[5, 4], [3, 2], [1]]
        listed = assetq.runs(conn, "consumer")
        assert listed == [assetq.get_run(conn, "consumer", r.run_id) for r in reversed(created)]
        assert [r.seq for r in assetq.runs(conn, "consumer", state="running")] == [2]
        assert [r.seq for r in assetq.runs(conn, "consumer", state="queued")] == [5, 3, 1]
        assert {r.dag_id for r in listed} == {"consumer"}


def test_consumed_events_are_paged_in_event_order(db: TestDatabase) -> None:
    scenario.declare(db, "consumer", "orders")
    events = scenario.register(db, "orders", "orders", "orders", "orders", "orders")
    (run,) = assetq.schedule(db.engine)
    pages: list[list[int]] = []
    after = None
    with db.engine.connect() as conn:
        while page := assetq.consumed_events(conn, "consumer", run.run_id, limit=2, after=after):
            pages.append([r.id for r in page])
            after = page[-1]
    assert pages == [[e.id for e in events[0:2]], [e.id for e in events[2:4]], [events[4].id]]


def test_read_api_limits_out_of_range_are_refused(db: TestDatabase) -> None:
    scenario.declare(db, "consumer", "orders")
    scenario.register(db, "orders")
    (run,) = assetq.schedule(db.engine)
    reads: list[Callable[[sa.Connection, int], object]] = [
        lambda conn, limit: assetq.runs(conn, "consumer", limit=limit),
        lambda conn, limit: assetq.queued_events(conn, "consumer", limit=limit),
        lambda conn, limit: assetq.consumed_events(conn, "consumer", run.run_id, limit=limit),
    ]
    for limit in (0, -1, 10_001):
        for number, read in enumerate(reads):
            with pytest.raises(assetq.InvalidArgument), db.engine.connect() as conn:
                read(conn, limit)
                pytest.fail(f"read {number} accepted limit={limit}")
    with db.engine.connect() as conn:  # the bounds are inclusive
        assert len(assetq.runs(conn, "consumer", limit=10_000)) == 1
        assert len(assetq.consumed_events(conn, "consumer", run.run_id, limit=1)) == 1
