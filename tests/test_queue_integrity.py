"""The queue without foreign keys (since development revision 0013_queue_checks): what its two
keys guaranteed still holds, proven instead of checked per row.

asset_dag_run_queue had a foreign key to dag (ON DELETE CASCADE) and one to asset_event (no
cascade: a queued event could not be deleted); their checks were a large share of a producer's
cost. Now the routines keep what the keys kept: queue rows are written only by the fan-out
trigger, in the statement that inserts their event, after locking the consumer's dag row and
the rows it queues through (so a consumer being deleted is waited for, then skipped);
delete_dag deletes its consumer's queue rows itself, after the lock that waits for producers in
flight; delete_asset deletes its events' queue rows before the events; purge_events deletes
only events without a queue row; a plain DELETE of events takes their queue rows and their
partition rows with it (the asset_event_unqueue trigger). Proven on both engines: after
delete_dag (of a direct, an alias and two partitioned consumers, one through an alias),
delete_asset (its events queued for several consumers, each getting them through an alias:
one that named the asset is re-declared to, since delete_asset refuses an asset a condition
names; partitioned ones included), a plain DELETE of several events, and purge over a partly
consumed backlog, no queue row lacks its consumer or its event, no partition row
lacks its queue row, and each routine removed exactly the rows it should, every other consumer
and asset keeping all of theirs; and with forced interleavings (a producer and delete_dag, each
holding its transaction open while the other runs on another connection and is seen waiting for
a lock, for a consumer of the asset and one of an alias it resolved to; a producer holding its
transaction open while delete_asset waits for it), no queue row is orphaned and the remaining
consumer has the event queued exactly once."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection

import assetq
import pass_reads
import races
import scenario
from dbs import TestDatabase

#: Queue rows whose consumer or event is gone: what the two foreign keys forbade; and
#: partition rows whose queue row is gone, which every routine deletes with it.
ORPHANS = {
    "queue row without its dag": "SELECT count(*) FROM {ns}.asset_dag_run_queue q"
    " WHERE NOT EXISTS (SELECT 1 FROM {ns}.dag d WHERE d.dag_id = q.target_dag_id)",
    "queue row without its event": "SELECT count(*) FROM {ns}.asset_dag_run_queue q"
    " WHERE NOT EXISTS (SELECT 1 FROM {ns}.asset_event e WHERE e.id = q.asset_event_id)",
    "partition row without its queue row": "SELECT count(*) FROM {ns}.asset_partition_queue p"
    " WHERE NOT EXISTS (SELECT 1 FROM {ns}.asset_dag_run_queue q"
    " WHERE q.target_dag_id = p.target_dag_id AND q.asset_event_id = p.asset_event_id)",
}

NOW = timedelta(0)


def _orphans(db: TestDatabase) -> dict[str, int]:
    found = {what: int(db.scalar(sql)) for what, sql in ORPHANS.items()}
    return {what: n for what, n in found.items() if n}


def _rows_by(db: TestDatabase, table: str) -> dict[tuple[str, int], int]:
    """Row count of ``table`` (the queue or its partition rows) per (consumer, asset id)."""
    rows = db.rows(
        f"SELECT target_dag_id, asset_id, count(*) AS n FROM {{ns}}.{table}"
        " GROUP BY target_dag_id, asset_id"
    )
    return {(str(r.target_dag_id), int(r.asset_id)): int(r.n) for r in rows}


def _queue(db: TestDatabase) -> dict[tuple[str, int], int]:
    return _rows_by(db, "asset_dag_run_queue")


def _partition_rows(db: TestDatabase) -> dict[tuple[str, int], int]:
    return _rows_by(db, "asset_partition_queue")


def _queued_for(db: TestDatabase, event_id: int, conn: Connection | None = None) -> list[str]:
    """The consumers ``event_id`` is queued for, one entry per queue row, sorted; read on
    ``conn`` (in its transaction) when given."""
    statement = "SELECT target_dag_id FROM {ns}.asset_dag_run_queue WHERE asset_event_id = :e"
    if conn is None:
        rows = db.rows(statement, e=event_id)
    else:
        rows = list(conn.execute(sa.text(db.sql(statement)), {"e": event_id}).all())
    return sorted(str(r.target_dag_id) for r in rows)


def _asset_id(db: TestDatabase, name: str) -> int:
    return int(db.scalar("SELECT id FROM {ns}.asset WHERE name = :n", n=name))


def _assets(db: TestDatabase, *names: str) -> None:
    """Assets only alias consumers get events of (no condition names them)."""
    with db.engine.begin() as conn:
        for name in names:
            assetq.declare_asset(conn, name)


def _backlog(db: TestDatabase) -> dict[tuple[str, int], int]:
    """Consumers with unconsumed backlogs, of every kind the fan-out writes for: direct
    (report, keeper), through an alias (on_alias) and partitioned, directly (parted) and
    through an alias (parted_alias). Returns the queue by (consumer, asset id)."""
    _assets(db, "other")
    scenario.declare(db, "report", "orders")
    scenario.declare(db, "keeper", assetq.any_of("orders", "hourly"))
    scenario.declare(db, "on_alias", assetq.alias("daily"))
    scenario.declare(db, "parted", "hourly", partitioned=True)
    scenario.declare(db, "parted_alias", assetq.alias("hours"), partitioned=True)
    with db.engine.begin() as conn:
        assetq.register_events(
            conn,
            [assetq.NewEvent("orders", aliases=("daily",))] * 4
            + [assetq.NewEvent("other", aliases=("daily",))] * 2
            + [assetq.NewEvent("hourly", aliases=("hours",), partition_key=k) for k in "aab"],
        )
    orders, other, hourly = (_asset_id(db, a) for a in ("orders", "other", "hourly"))
    queue = _queue(db)
    assert queue == {
        ("report", orders): 4,
        ("keeper", orders): 4,
        ("keeper", hourly): 3,
        ("on_alias", orders): 4,
        ("on_alias", other): 2,
        ("parted", hourly): 3,
        ("parted_alias", hourly): 3,
    }
    assert _partition_rows(db) == {("parted", hourly): 3, ("parted_alias", hourly): 3}
    assert _orphans(db) == {}
    return queue


# -- alone: no orphan, and exactly the queue rows each routine should remove -----------------


@pytest.mark.parametrize("gone", ["report", "on_alias", "parted", "parted_alias"])
def test_delete_dag_deletes_exactly_its_queue_rows(db: TestDatabase, gone: str) -> None:
    queue = _backlog(db)
    partition_rows = _partition_rows(db)
    with db.engine.begin() as conn:
        assetq.delete_dag(conn, gone)
    assert _orphans(db) == {}
    # Every other consumer keeps every row, those of the same assets included.
    assert _queue(db) == {k: n for k, n in queue.items() if k[0] != gone}
    assert _partition_rows(db) == {k: n for k, n in partition_rows.items() if k[0] != gone}


#: For each asset deleted, the re-declarations that take it out of every condition, and the
#: consumers that still get its events afterwards, through an alias.
_REDECLARED = {
    "orders": (
        {"report": "payments", "keeper": assetq.any_of("hourly", assetq.alias("daily"))},
        {"keeper", "on_alias"},
    ),
    "hourly": (
        {"keeper": assetq.any_of("orders", assetq.alias("hours")), "parted": "payments"},
        {"keeper", "parted_alias"},
    ),
}


@pytest.mark.parametrize("asset", sorted(_REDECLARED))
def test_delete_asset_deletes_exactly_the_queue_rows_of_its_events(
    db: TestDatabase, asset: str
) -> None:
    _backlog(db)
    redeclared, holders = _REDECLARED[asset]
    for dag_id, condition in redeclared.items():
        scenario.declare(db, dag_id, condition, partitioned=dag_id.startswith("parted"))
    gone = _asset_id(db, asset)
    queue, partition_rows = _queue(db), _partition_rows(db)
    # The consumers re-declared to depend on it through an alias kept its rows.
    assert {k[0] for k in queue if k[1] == gone} == holders
    with db.engine.begin() as conn:
        assert assetq.delete_asset(conn, asset) == {"orders": 4, "hourly": 3}[asset]
    assert _orphans(db) == {}
    assert _queue(db) == {k: n for k, n in queue.items() if k[1] != gone}
    assert _partition_rows(db) == {k: n for k, n in partition_rows.items() if k[1] != gone}
    assert db.scalar("SELECT count(*) FROM {ns}.asset_event WHERE asset_id = :a", a=gone) == 0


def test_delete_asset_reads_its_own_queue_rows_not_the_whole_queue(db: TestDatabase) -> None:
    """delete_asset finds its events' queue rows through its events, not by scanning every
    consumer's queue (which PostgreSQL's delete by asset_id did until 0013_queue_checks: no
    queue index leads with asset_id). Counted, not timed: with 3,000 rows of another asset
    queued, deleting an asset with 3 queued events reads a few queue rows (PostgreSQL: no
    sequential scan of the queue, a handful of index entries; MySQL: a handful of rows by
    index and no scan), and deletes exactly its own."""
    scenario.declare(db, "big", "orders")
    scenario.declare(db, "small", assetq.alias("daily"))
    _assets(db, "gone")
    pass_reads.backlog(db, 3_000)
    with db.engine.begin() as conn:
        for _ in range(3):
            assetq.register_event(conn, "gone", aliases=("daily",))
    if db.dialect.name == "postgresql":
        with db.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            conn.execute(sa.text(db.sql("VACUUM ANALYZE {ns}.asset_dag_run_queue")))
    assert len(_queue_rows(db)) == 3_003

    def delete(conn: Connection) -> int:
        return assetq.delete_asset(conn, "gone")

    if db.dialect.name == "postgresql":
        deleted, reads = pass_reads.pg_queue_reads_of(db, delete)
        assert reads["seq_scan"] == 0, reads
        assert reads["idx_tup_read"] <= 20, reads
    else:
        with db.engine.connect() as conn:
            deleted, reads = pass_reads.mysql_reads_of(conn, delete)
        assert reads["Handler_read_rnd_next"] <= 50, reads
        assert reads["Handler_read_next"] + reads["Handler_read_key"] <= 100, reads
    assert deleted == 3
    assert len(_queue_rows(db)) == 3_000
    assert _orphans(db) == {}


def _queue_rows(db: TestDatabase) -> list[Any]:
    return db.rows("SELECT target_dag_id, asset_event_id FROM {ns}.asset_dag_run_queue")


def _event_ids(db: TestDatabase) -> set[int]:
    return {int(r[0]) for r in db.rows("SELECT id FROM {ns}.asset_event")}


def test_purge_events_deletes_exactly_the_consumed_and_unlinked_events(
    db: TestDatabase,
) -> None:
    """A partly consumed backlog: events consumed by a finished run (unlinked once purge_runs
    deletes it) and events nobody consumes go; events still queued (for a consumer that
    consumed their predecessors, for one whose condition never holds) and events linked to
    an unfinished run stay."""
    _assets(db, "noise")
    scenario.declare(db, "report", "orders")
    scenario.declare(db, "waiting", assetq.all_of("payments", "refunds"))
    scenario.declare(db, "pending", "shipments")
    consumed = scenario.register(db, "orders", "orders", "orders", "shipments", "shipments")
    scenario.register(db, "payments", "payments")
    runs = []
    for _ in range(10):
        made = assetq.schedule(db.engine)
        if not made:
            break
        runs += made
    assert sorted(r.dag_id for r in runs) == ["pending", "report"]
    with db.engine.begin() as conn:
        for run in runs:
            if run.dag_id == "report":
                assetq.set_run_state(conn, run.dag_id, run.run_id, "success")
    scenario.register(db, "orders", "orders")  # queued behind the consumed ones
    noise = scenario.register(db, "noise", "noise")  # no consumer: never queued
    queued = {int(r[0]) for r in db.rows("SELECT asset_event_id FROM {ns}.asset_dag_run_queue")}
    assert len(queued) == 4
    expected = {e.id for e in consumed if e.asset == "orders"} | {e.id for e in noise}
    before = _event_ids(db)
    result = assetq.purge(db.engine, older_than=NOW)  # every event is before the cutoff
    assert _orphans(db) == {}
    assert (result.runs_deleted, result.events_deleted) == (1, len(expected)) == (1, 5)
    assert _event_ids(db) == before - expected
    assert queued <= _event_ids(db)  # every queued event remains


# -- a producer racing delete_dag or delete_asset, each side holding its transaction open ---


def test_a_plain_delete_of_events_takes_their_queue_and_partition_rows(
    db: TestDatabase,
) -> None:
    """Issue 26: since the queue lost its foreign key to asset_event, a plain DELETE of a
    queued event (an operator cleaning up by hand) was accepted, its queue rows stayed, and the
    next pass created a run that linked the deleted event. A delete trigger takes them with
    it: every queue row of the deleted events, for direct, alias and partitioned consumers,
    with their partition rows, in one DELETE of several events; the others stay."""
    queue = _backlog(db)
    partition_rows = _partition_rows(db)
    orders, hourly = _asset_id(db, "orders"), _asset_id(db, "hourly")
    events = db.rows("SELECT id, asset_id FROM {ns}.asset_event ORDER BY id")
    gone = [int(e.id) for e in events if e.asset_id == orders][:2]
    gone += [int(e.id) for e in events if e.asset_id == hourly][:1]  # key 'a'
    db.execute(
        "DELETE FROM {ns}.asset_event WHERE id = :a OR id = :b OR id = :c",
        a=gone[0],
        b=gone[1],
        c=gone[2],
    )
    assert _orphans(db) == {}
    less = {
        ("report", orders): 2,
        ("keeper", orders): 2,
        ("on_alias", orders): 2,
        ("keeper", hourly): 1,
        ("parted", hourly): 1,
        ("parted_alias", hourly): 1,
    }
    assert _queue(db) == {k: n - less.get(k, 0) for k, n in queue.items()}
    assert _partition_rows(db) == {k: n - 1 for k, n in partition_rows.items()}
    assert sorted(assetq.schedule(db.engine), key=lambda r: r.dag_id)  # the others run
    linked = {event for _, event in db.links()}
    assert linked and not linked & set(gone)
    assert linked <= _event_ids(db)


def test_deleting_unqueued_events_reads_no_queue_beyond_an_index_probe_each(
    db: TestDatabase,
) -> None:
    """What purge_events and delete_asset delete are events without queue rows: for them the
    delete trigger probes the queue's index by event and finds nothing, with 3,000 rows of
    another consumer queued (PostgreSQL: no scan of the queue or of the partition rows, no
    index entry read; MySQL: no row read by a scan, a few index reads per event)."""
    scenario.declare(db, "big", "orders")
    _assets(db, "noise")
    pass_reads.backlog(db, 3_000)
    with db.engine.begin() as conn:
        assetq.register_events(conn, [{"asset": "noise"}] * 50)  # nobody consumes them
    noise = _asset_id(db, "noise")
    delete = sa.text(db.sql("DELETE FROM {ns}.asset_event WHERE asset_id = :a"))

    def purge_like(conn: Connection) -> int:
        return int(conn.execute(delete, {"a": noise}).rowcount)

    if db.dialect.name == "postgresql":
        with db.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            conn.execute(sa.text(db.sql("VACUUM ANALYZE {ns}.asset_partition_queue")))
        deleted, reads = pass_reads.pg_queue_reads_of(db, purge_like)
        assert (reads["seq_scan"], reads["idx_tup_read"]) == (0, 0), reads
    else:
        with db.engine.connect() as conn:
            conn.execute(sa.text("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"))
            conn.commit()
            deleted, reads = pass_reads.mysql_reads_of(conn, purge_like)
        # Measured: 0 rows by a scan, 108 keys and 50 next entries for the 50 events
        # (MariaDB 10.11); 151 keys and 50 next (MySQL 9.7): a few per event, and a constant.
        assert reads["Handler_read_rnd_next"] <= 10, reads
        assert reads["Handler_read_next"] + reads["Handler_read_key"] <= 4 * 50 + 10, reads
    assert deleted == 50
    assert len(_queue_rows(db)) == 3_000
    assert _orphans(db) == {}


def _held_then(
    db: TestDatabase,
    first: Callable[[Connection], Any],
    second: Callable[[Connection], Any],
    isolation: str | None = None,
) -> tuple[Any, Any, bool]:
    """``first`` runs in a transaction held open while ``second`` runs in its own on another
    connection; once ``second`` waits for a lock (or finished, or 10 s passed), ``first``
    commits and ``second`` finishes. Both at ``isolation`` (None: the engine's default).
    Returns both results and whether ``second`` waited (the callers assert it after the
    orphans, whose count says more when both fail)."""
    options = {} if isolation is None else {"isolation_level": isolation}
    with db.engine.connect() as conn:
        conn = conn.execution_options(**options)
        conn.begin()
        held = first(conn)

        def other() -> Any:
            with db.engine.connect() as other_conn:
                other_conn = other_conn.execution_options(**options)
                with other_conn.begin():
                    return second(other_conn)

        thread, outcome = races.in_thread(other)
        blocked = races.blocked_or_done(db, thread) == "blocked"
        conn.commit()
    thread.join(30)
    assert not thread.is_alive()
    if outcome.error is not None:
        raise outcome.error
    return held, outcome.value, blocked


def _two_consumers(db: TestDatabase, through: str) -> str:
    """keeper depends on orders directly; the consumer to delete, directly or through an
    alias orders resolves to, has a backlog of two events. Returns its id."""
    scenario.declare(db, "keeper", "orders")
    if through == "alias":
        scenario.declare(db, "doomed", assetq.alias("daily"))
        scenario.register(db, "orders", "orders", aliases=["daily"])
    else:
        scenario.declare(db, "doomed", "orders")
        scenario.register(db, "orders", "orders")
    assert _queue(db) == {(k, _asset_id(db, "orders")): 2 for k in ("doomed", "keeper")}
    return "doomed"


#: How the racing producer registers its event, and at which isolation: one event at the
#: engine's default, or a batch at READ COMMITTED, where MySQL's INSERT ... SELECT of a batch
#: would read the fan-out's rows without locks but for the trigger's explicit clauses.
PRODUCERS = {"one": None, "batch_rc": "READ COMMITTED"}


def _register(producer: str) -> Callable[[Connection], assetq.Event]:
    def register(conn: Connection) -> assetq.Event:
        # Without the alias: orders has resolved to it, so the fan-out goes through it anyway
        # (on MySQL the branch that reads alias-clause rows).
        if producer == "one":
            return assetq.register_event(conn, "orders")
        (event,) = assetq.register_events(conn, [{"asset": "orders"}])
        return event

    return register


def _after_the_race(db: TestDatabase, event: assetq.Event) -> None:
    assert _orphans(db) == {}
    assert _queued_for(db, event.id) == ["keeper"]
    assert _queue(db) == {("keeper", event.asset_id): 3}


@pytest.mark.parametrize("producer", sorted(PRODUCERS))
@pytest.mark.parametrize("through", ["direct", "alias"])
def test_delete_dag_waits_for_an_open_producer_and_leaves_no_orphan(
    db: TestDatabase, through: str, producer: str
) -> None:
    doomed = _two_consumers(db, through)

    def produce(conn: Connection) -> assetq.Event:
        event = _register(producer)(conn)
        assert _queued_for(db, event.id, conn) == ["doomed", "keeper"]  # not committed yet
        return event

    def delete(conn: Connection) -> None:
        assetq.delete_dag(conn, doomed)

    event, _, blocked = _held_then(db, produce, delete, PRODUCERS[producer])
    _after_the_race(db, event)
    assert blocked, "delete_dag did not wait for the open producer"


@pytest.mark.parametrize("producer", sorted(PRODUCERS))
@pytest.mark.parametrize("through", ["direct", "alias"])
def test_a_producer_waits_for_an_open_delete_dag_and_queues_for_the_rest_only(
    db: TestDatabase, through: str, producer: str
) -> None:
    doomed = _two_consumers(db, through)

    def delete(conn: Connection) -> None:
        assetq.delete_dag(conn, doomed)

    _, event, blocked = _held_then(db, delete, _register(producer), PRODUCERS[producer])
    assert event.created
    _after_the_race(db, event)
    assert blocked, "the producer did not wait for the open delete_dag"


def test_delete_asset_waits_for_an_open_producer_and_deletes_its_queue_rows(
    db: TestDatabase,
) -> None:
    """feed is named by no condition (delete_asset refuses otherwise): its consumers get
    its events through the alias it resolved to; other resolved to it too."""
    _assets(db, "feed", "other")
    scenario.declare(db, "on_alias", assetq.alias("daily"))
    scenario.declare(db, "also_alias", assetq.any_of("orders", assetq.alias("daily")))
    scenario.register(db, "feed", "feed", "other", aliases=["daily"])
    feed, other = _asset_id(db, "feed"), _asset_id(db, "other")

    def produce(conn: Connection) -> assetq.Event:
        event = assetq.register_event(conn, "feed")
        assert _queued_for(db, event.id, conn) == ["also_alias", "on_alias"]  # not committed
        return event

    def delete(conn: Connection) -> int:
        return assetq.delete_asset(conn, "feed")

    event, deleted, blocked = _held_then(db, produce, delete)
    assert _orphans(db) == {}
    assert deleted == 3  # the held event too
    assert db.scalar("SELECT count(*) FROM {ns}.asset_event WHERE asset_id = :a", a=feed) == 0
    assert _queued_for(db, event.id) == []
    assert _queue(db) == {("on_alias", other): 1, ("also_alias", other): 1}
    assert blocked, "delete_asset did not wait for the open producer"
