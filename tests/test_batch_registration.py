"""Batch registration: register_events has register_event's guarantees for every item (I1, I2,
I7), in one round trip, and a batch is all or nothing."""

from __future__ import annotations

import json
import threading
from datetime import timezone
from typing import Any

import pytest
import sqlalchemy as sa

import assetq
import pass_reads
from dbs import TestDatabase


def _declare(db: TestDatabase, dag_id: str, condition: assetq.Condition, **kw: Any) -> None:
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, dag_id, condition, **kw)


class StatementCounter:
    def __init__(self, engine: sa.Engine) -> None:
        self.statements: list[str] = []
        sa.event.listen(engine, "before_cursor_execute", self._seen)

    def _seen(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        self.statements.append(statement)


def test_a_batch_returns_one_event_per_item_in_input_order(db: TestDatabase) -> None:
    _declare(db, "consumer", ["orders", "customers"])
    with db.engine.begin() as conn:
        events = assetq.register_events(
            conn,
            [
                assetq.NewEvent("orders", extra={"rows": 1}),
                {"asset": "customers"},
                assetq.NewEvent("orders", extra={"rows": 2}),
            ],
        )
    assert [e.asset for e in events] == ["orders", "customers", "orders"]
    assert all(e.created for e in events)
    assert len({e.id for e in events}) == 3
    assert all(e.timestamp.tzinfo is timezone.utc for e in events)
    for event, extra in zip(events, ({"rows": 1}, {}, {"rows": 2}), strict=True):
        (stored,) = db.rows(
            "SELECT asset_id, extra FROM {ns}.asset_event WHERE id = :id", id=event.id
        )
        assert stored.asset_id == event.asset_id
        stored_extra = stored.extra
        if isinstance(stored_extra, str):  # MySQL returns JSON as text
            stored_extra = json.loads(stored_extra)
        assert stored_extra == extra


def test_a_batch_stores_every_field_of_every_item(db: TestDatabase) -> None:
    _declare(db, "consumer", "orders")
    source = assetq.Source(dag_id="producer", task_id="t", run_id="r", map_index=3)
    with db.engine.begin() as conn:
        first, second = assetq.register_events(
            conn,
            [
                assetq.NewEvent("orders", source=source, idempotency_key="k1"),
                {"asset": "orders", "source": {"dag_id": "other"}},
            ],
        )
    rows = {
        r.id: r
        for r in db.rows(
            "SELECT id, source_dag_id, source_task_id, source_run_id, source_map_index,"
            " idempotency_key FROM {ns}.asset_event"
        )
    }
    assert tuple(rows[first.id][1:]) == ("producer", "t", "r", 3, "k1")
    assert tuple(rows[second.id][1:]) == ("other", None, None, -1, None)


def test_a_batch_queues_one_row_per_unpaused_consumer_of_each_event(db: TestDatabase) -> None:
    _declare(db, "a_consumer", "orders")
    _declare(db, "b_consumer", ["orders", "customers"])
    _declare(db, "paused_consumer", "orders", paused=True)
    _declare(db, "c_consumer", "customers")
    with db.engine.begin() as conn:
        orders, customers = assetq.register_events(
            conn, [{"asset": "orders"}, {"asset": "customers"}]
        )
    queued = sorted(
        (r.asset_event_id, r.target_dag_id)
        for r in db.rows("SELECT asset_event_id, target_dag_id FROM {ns}.asset_dag_run_queue")
    )
    assert queued == sorted(
        [
            (orders.id, "a_consumer"),
            (orders.id, "b_consumer"),
            (customers.id, "b_consumer"),
            (customers.id, "c_consumer"),
        ]
    )


def test_the_events_of_a_batch_share_one_timestamp_copied_to_their_queue_rows(
    db: TestDatabase,
) -> None:
    for n in range(3):
        _declare(db, f"consumer_{n}", "orders")
    with db.engine.begin() as conn:
        events = assetq.register_events(conn, [{"asset": "orders"}] * 5)
    assert len({e.timestamp for e in events}) == 1
    rows = db.rows(
        "SELECT q.created_at, e.timestamp AS ts FROM {ns}.asset_dag_run_queue q"
        " JOIN {ns}.asset_event e ON e.id = q.asset_event_id"
    )
    assert len(rows) == 15
    assert all(r.created_at == r.ts for r in rows)


def test_a_batch_is_sent_in_one_round_trip(db: TestDatabase) -> None:
    _declare(db, "consumer", "orders")
    counter = StatementCounter(db.engine)
    with db.engine.begin() as conn:
        # Without the call's savepoint (SAVEPOINT and RELEASE, two more statements: the
        # default, see tests/test_savepoints.py).
        assetq.register_events(conn, [{"asset": "orders"}] * 100, savepoint=False)
    assert [s for s in counter.statements if "register_events" in s] == counter.statements
    assert len(counter.statements) == 1


def test_an_empty_batch_sends_nothing(db: TestDatabase) -> None:
    counter = StatementCounter(db.engine)
    with db.engine.begin() as conn:
        assert assetq.register_events(conn, []) == []
    assert counter.statements == []


def test_a_rolled_back_batch_leaves_no_event_and_no_queue_row(db: TestDatabase) -> None:
    _declare(db, "consumer", "orders")
    before = db.counts()
    with db.engine.connect() as conn, conn.begin() as tx:
        assetq.register_events(
            conn, [{"asset": "orders"}, {"asset": "orders", "idempotency_key": "k"}]
        )
        tx.rollback()
    assert db.counts() == before


def test_an_unknown_asset_fails_the_whole_batch_and_writes_nothing(db: TestDatabase) -> None:
    _declare(db, "consumer", ["orders", "customers"])
    before = db.counts()
    batch = [{"asset": "orders"}, {"asset": "customers"}, {"asset": "nope"}, {"asset": "gone"}]
    with pytest.raises(assetq.UnknownAsset) as info, db.engine.begin() as conn:
        assetq.register_events(conn, batch)
    assert info.value.code == "AQ001"
    assert "'nope'" in str(info.value) and "event 3 of the batch" in str(info.value)
    assert db.counts() == before


def test_a_batch_finds_assets_by_uri(db: TestDatabase) -> None:
    with db.engine.begin() as conn:
        assetq.declare_asset(conn, "orders", uri="s3://bucket/orders")
        assetq.declare_dag(conn, "consumer", "orders")
        by_uri, by_name = assetq.register_events(
            conn, [{"asset": "s3://bucket/orders"}, {"asset": "orders"}]
        )
    assert by_uri.asset_id == by_name.asset_id
    assert db.scalar("SELECT count(*) FROM {ns}.asset_dag_run_queue") == 2


def test_retrying_a_batch_returns_the_original_events_and_queues_nothing(db: TestDatabase) -> None:
    _declare(db, "consumer", "orders")
    batch = [
        assetq.NewEvent("orders", extra={"part": n}, idempotency_key=f"run-7-{n}") for n in range(3)
    ]
    with db.engine.begin() as conn:
        first = assetq.register_events(conn, batch)
    before = db.counts()
    with db.engine.begin() as conn:
        retry = assetq.register_events(conn, batch)
    assert [(e.id, e.timestamp) for e in retry] == [(e.id, e.timestamp) for e in first]
    assert [e.created for e in first] == [True] * 3
    assert [e.created for e in retry] == [False] * 3
    assert db.counts() == before


def test_a_batch_finds_a_key_registered_singly_and_the_reverse(db: TestDatabase) -> None:
    _declare(db, "consumer", "orders")
    with db.engine.begin() as conn:
        single = assetq.register_event(conn, "orders", idempotency_key="a")
    with db.engine.begin() as conn:
        found, new = assetq.register_events(
            conn,
            [
                {"asset": "orders", "idempotency_key": "a"},
                {"asset": "orders", "idempotency_key": "b"},
            ],
        )
    with db.engine.begin() as conn:
        again = assetq.register_event(conn, "orders", idempotency_key="b")
    assert (found.id, found.created) == (single.id, False)
    assert (again.id, again.created, new.created) == (new.id, False, True)
    assert db.scalar("SELECT count(*) FROM {ns}.asset_dag_run_queue") == 2


def test_items_sharing_a_key_are_one_event(db: TestDatabase) -> None:
    _declare(db, "consumer", "orders")
    with db.engine.begin() as conn:
        events = assetq.register_events(
            conn,
            [
                {"asset": "orders", "idempotency_key": "k"},
                {"asset": "orders"},
                {"asset": "orders", "idempotency_key": "k"},
            ],
        )
    assert events[0].id == events[2].id != events[1].id
    assert [e.created for e in events] == [True, True, False]
    assert events[2].timestamp == events[0].timestamp
    assert db.scalar("SELECT count(*) FROM {ns}.asset_event") == 2
    assert db.scalar("SELECT count(*) FROM {ns}.asset_dag_run_queue") == 2


def test_a_key_reused_with_another_extra_fails_the_whole_batch(db: TestDatabase) -> None:
    _declare(db, "consumer", "orders")
    with db.engine.begin() as conn:
        assetq.register_event(conn, "orders", extra={"a": 1}, idempotency_key="k")
    before = db.counts()
    batch = [
        {"asset": "orders"},
        {"asset": "orders", "extra": {"a": 2}, "idempotency_key": "k"},
        {"asset": "orders"},
    ]
    with pytest.raises(assetq.IdempotencyConflict) as info, db.engine.begin() as conn:
        assetq.register_events(conn, batch)
    assert info.value.code == "AQ005"
    assert "event 2 of the batch" in str(info.value)
    assert db.counts() == before


def test_items_sharing_a_key_with_different_extras_fail_the_batch(db: TestDatabase) -> None:
    _declare(db, "consumer", "orders")
    before = db.counts()
    batch = [
        {"asset": "orders", "extra": {"a": 1}, "idempotency_key": "k"},
        {"asset": "orders", "extra": {"a": 2}, "idempotency_key": "k"},
    ]
    with pytest.raises(assetq.IdempotencyConflict), db.engine.begin() as conn:
        assetq.register_events(conn, batch)
    assert db.counts() == before


@pytest.mark.parametrize("outcome", ["committed", "failed"])
def test_a_batch_on_an_autocommit_connection_is_its_own_transaction(
    db: TestDatabase, outcome: str
) -> None:
    """On MySQL every statement of a procedure commits on its own under autocommit; the
    row-by-row path (taken here because of the duplicate key) must still be all or nothing."""
    _declare(db, "consumer", "orders")
    with db.engine.begin() as conn:
        assetq.register_event(conn, "orders", extra={"a": 1}, idempotency_key="k")
    before = db.counts()
    extra = {"a": 1} if outcome == "committed" else {"a": 2}
    batch = [{"asset": "orders"}, {"asset": "orders", "extra": extra, "idempotency_key": "k"}]
    with db.engine.connect() as raw:
        conn = raw.execution_options(isolation_level="AUTOCOMMIT")
        if outcome == "committed":
            new, old = assetq.register_events(conn, batch)
            assert (new.created, old.created) == (True, False)
        else:
            with pytest.raises(assetq.IdempotencyConflict):
                assetq.register_events(conn, batch)
    after = db.counts()
    if outcome == "committed":
        assert after["asset_event"] == before["asset_event"] + 1
        assert after["asset_dag_run_queue"] == before["asset_dag_run_queue"] + 1
    else:
        assert after == before


def test_a_batch_waits_for_an_uncommitted_registration_of_the_same_key(db: TestDatabase) -> None:
    """Like register_event: the batch's duplicate check waits for the other transaction and
    then returns its event, instead of creating a second one."""
    _declare(db, "consumer", "orders")
    result: list[assetq.Event] = []
    failures: list[BaseException] = []

    def batch() -> None:
        try:
            with db.engine.begin() as conn:
                result.extend(
                    assetq.register_events(
                        conn, [{"asset": "orders"}, {"asset": "orders", "idempotency_key": "k"}]
                    )
                )
        except BaseException as exc:  # reported below
            failures.append(exc)

    with db.engine.connect() as producer:
        first = assetq.register_event(producer, "orders", idempotency_key="k")
        thread = threading.Thread(target=batch)
        thread.start()
        thread.join(timeout=1.0)
        assert thread.is_alive(), "the batch did not wait for the uncommitted key"
        producer.commit()
        thread.join(timeout=30)
    assert failures == []
    assert (result[1].id, result[1].created) == (first.id, False)
    assert result[0].created
    assert db.scalar("SELECT count(*) FROM {ns}.asset_event") == 2


def test_the_scheduler_consumes_a_batch_like_single_events(db: TestDatabase) -> None:
    _declare(db, "consumer", assetq.all_of("orders", "customers"))
    with db.engine.begin() as conn:
        events = assetq.register_events(
            conn, [{"asset": "orders"}] * 3 + [{"asset": "customers"}] * 2
        )
    (run,) = assetq.schedule(db.engine)
    assert run.event_ids == tuple(sorted(e.id for e in events))
    assert db.scalar("SELECT count(*) FROM {ns}.asset_dag_run_queue") == 0


def test_a_batch_of_the_largest_size_is_registered(db: TestDatabase) -> None:
    _declare(db, "consumer", "orders")
    with db.engine.begin() as conn:
        events = assetq.register_events(conn, [{"asset": "orders"}] * assetq.BATCH_MAX_EVENTS)
    assert len({e.id for e in events}) == assetq.BATCH_MAX_EVENTS
    assert db.scalar("SELECT count(*) FROM {ns}.asset_dag_run_queue") == assetq.BATCH_MAX_EVENTS


def _batch_reads(db: TestDatabase, batch: list[dict[str, Any]]) -> tuple[list[Any], dict[str, int]]:
    """The events of ``batch`` registered in a transaction of its own, and what the call read:
    on PostgreSQL asset_event's rows and index entries (its table statistics), on MySQL every
    Handler_read_* of the session."""

    def register(conn: sa.Connection) -> list[Any]:
        return assetq.register_events(conn, batch)

    if db.dialect.name == "postgresql":
        return pass_reads.pg_queue_reads_of(db, register, table="asset_event")
    with db.engine.connect() as conn:
        return pass_reads.mysql_reads_of(conn, register)


def test_what_a_batch_reads_does_not_grow_with_the_event_history(db: TestDatabase) -> None:
    """A batch of 1,000 (a fifth with idempotency keys) reads the same with 11,000 more events
    stored: each item's row is found by index, or needs no lookup (0015_batch_lookups; until
    then PostgreSQL joined the batch with the whole event history, a hash join reading every
    event, 39 ms of a 1,000-event batch at 50,000 events). Counted, not timed."""
    _declare(db, "consumer", "orders")

    def batch(round_no: int) -> list[dict[str, Any]]:
        return [
            {"asset": "orders", "idempotency_key": f"r{round_no}-{i}"}
            if i % 5 == 0
            else {"asset": "orders"}
            for i in range(1_000)
        ]

    def analyzed() -> None:  # the planner knows how many events there are
        if db.dialect.name == "postgresql":
            with db.engine.connect() as conn:
                conn = conn.execution_options(isolation_level="AUTOCOMMIT")
                conn.execute(sa.text(db.sql("ANALYZE {ns}.asset_event")))
        else:
            db.execute("ANALYZE TABLE {ns}.asset_event")

    pass_reads.backlog(db, 100)
    analyzed()
    events, small = _batch_reads(db, batch(1))
    assert len(events) == 1_000 and all(e.created for e in events)
    pass_reads.backlog(db, 11_000)
    analyzed()
    events, large = _batch_reads(db, batch(2))
    assert len(events) == 1_000 and all(e.created for e in events)
    # A retry of the second batch: the keyed items are found by their keys, nothing is created.
    retried, _ = _batch_reads(db, batch(2))
    assert [e.id for e in retried if not e.created] == [e.id for e in events][::5]
    if db.dialect.name == "postgresql":
        assert large["seq_tup_read"] == small["seq_tup_read"] == 0, (small, large)
        assert large["idx_tup_fetch"] == small["idx_tup_fetch"], (small, large)
    else:  # the history is 11,000 rows: a scan of it would show; Handler_read_key varies by 2
        for counter, value in large.items():
            assert value <= small[counter] + 20, (counter, small, large)
