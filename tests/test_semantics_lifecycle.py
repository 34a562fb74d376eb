"""Issue 5, lifecycle: deleting consumers and assets, and re-declaring consumers, alone,
racing a producer with a forced interleaving, and under concurrent load. Nothing is lost,
stranded or left dangling; producers never fail except as documented."""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

import assetq
import races
import scenario
from dbs import TestDatabase

#: Tables with a dag id, and its column: what delete_dag must leave empty for the consumer.
DAG_TABLES = {
    "dag": "dag_id",
    "dag_schedule_asset_reference": "dag_id",
    "dag_condition_clause": "dag_id",
    "dag_condition_alias": "dag_id",
    "asset_dag_run_queue": "target_dag_id",
    "dag_run": "dag_id",
    "dagrun_asset_event": "dag_id",
}

#: Rows that point at something missing. Foreign keys forbid most of these; the lifecycle
#: tests prove none appears, whatever guards it.
DANGLING = {
    "queue row without its consumer": "SELECT count(*) FROM {ns}.asset_dag_run_queue q"
    " WHERE NOT EXISTS (SELECT 1 FROM {ns}.dag d WHERE d.dag_id = q.target_dag_id)",
    "queue row without its event": "SELECT count(*) FROM {ns}.asset_dag_run_queue q"
    " WHERE NOT EXISTS (SELECT 1 FROM {ns}.asset_event e WHERE e.id = q.asset_event_id)",
    "run without its consumer": "SELECT count(*) FROM {ns}.dag_run r"
    " WHERE NOT EXISTS (SELECT 1 FROM {ns}.dag d WHERE d.dag_id = r.dag_id)",
    "link without its run": "SELECT count(*) FROM {ns}.dagrun_asset_event l"
    " WHERE NOT EXISTS (SELECT 1 FROM {ns}.dag_run r WHERE r.id = l.dag_run_id)",
    "link without its event": "SELECT count(*) FROM {ns}.dagrun_asset_event l"
    " WHERE NOT EXISTS (SELECT 1 FROM {ns}.asset_event e WHERE e.id = l.asset_event_id)",
    "reference without its consumer": "SELECT count(*) FROM {ns}.dag_schedule_asset_reference x"
    " WHERE NOT EXISTS (SELECT 1 FROM {ns}.dag d WHERE d.dag_id = x.dag_id)",
    "clause without its consumer": "SELECT count(*) FROM {ns}.dag_condition_clause x"
    " WHERE NOT EXISTS (SELECT 1 FROM {ns}.dag d WHERE d.dag_id = x.dag_id)",
    "alias clause without its consumer": "SELECT count(*) FROM {ns}.dag_condition_alias x"
    " WHERE NOT EXISTS (SELECT 1 FROM {ns}.dag d WHERE d.dag_id = x.dag_id)",
    "event alias without its event": "SELECT count(*) FROM {ns}.asset_event_alias x"
    " WHERE NOT EXISTS (SELECT 1 FROM {ns}.asset_event e WHERE e.id = x.asset_event_id)",
    "event without its asset": "SELECT count(*) FROM {ns}.asset_event e"
    " WHERE NOT EXISTS (SELECT 1 FROM {ns}.asset a WHERE a.id = e.asset_id)",
}


def _dangling(db: TestDatabase) -> dict[str, int]:
    found = {what: int(db.scalar(sql)) for what, sql in DANGLING.items()}
    return {what: n for what, n in found.items() if n}


def _rows_of_dag(db: TestDatabase, dag_id: str) -> dict[str, int]:
    return {
        table: int(db.scalar(f"SELECT count(*) FROM {{ns}}.{table} WHERE {column} = :d", d=dag_id))
        for table, column in DAG_TABLES.items()
    }


def _declare_asset(db: TestDatabase, name: str, uri: str | None = None) -> None:
    with db.engine.begin() as conn:
        assetq.declare_asset(conn, name, uri=uri)


def _drain(engine: sa.Engine) -> list[assetq.Run]:
    runs: list[assetq.Run] = []
    for _ in range(1000):
        created = assetq.schedule(engine)
        if not created:
            return runs
        runs += created
    raise AssertionError("the scheduler never ran out of runs to create")


def _join(thread: threading.Thread) -> None:
    thread.join(timeout=120)
    assert not thread.is_alive(), "the concurrent call never finished"


# -- 7. Lifecycle ---------------------------------------------------------------------------


def test_delete_dag_removes_the_consumer_and_everything_that_belongs_to_it(
    db: TestDatabase,
) -> None:
    scenario.declare(db, "doomed", assetq.all_of("orders", assetq.alias("daily")))
    scenario.declare(db, "kept", "orders")
    scenario.register(db, "orders", "orders", aliases=("daily",))
    runs = assetq.schedule(db.engine)
    assert sorted(r.dag_id for r in runs) == ["doomed", "kept"]
    scenario.register(db, "orders", aliases=("daily",))  # queued for both
    kept_before = _rows_of_dag(db, "kept")
    events_before = db.scalar("SELECT count(*) FROM {ns}.asset_event")
    aliases_before = [
        db.scalar(f"SELECT count(*) FROM {{ns}}.{t}")
        for t in ("asset_alias", "asset_alias_asset", "asset_event_alias")
    ]
    with db.engine.begin() as conn:
        assetq.delete_dag(conn, "doomed")
    assert _rows_of_dag(db, "doomed") == dict.fromkeys(DAG_TABLES, 0)
    assert _rows_of_dag(db, "kept") == kept_before
    assert db.scalar("SELECT count(*) FROM {ns}.asset_event") == events_before
    assert [
        db.scalar(f"SELECT count(*) FROM {{ns}}.{t}")
        for t in ("asset_alias", "asset_alias_asset", "asset_event_alias")
    ] == aliases_before
    assert _dangling(db) == {}
    with pytest.raises(assetq.UnknownDag) as info, db.engine.begin() as conn:
        assetq.delete_dag(conn, "doomed")
    assert info.value.code == "AQ003"


@pytest.mark.engines("mysql")
def test_delete_dag_removes_its_lock_row_on_mysql(db: TestDatabase) -> None:
    """MySQL schedulers lock a per-consumer row in dag_lock (see DESIGN.md); it goes too."""
    scenario.declare(db, "doomed", "orders")
    with db.engine.begin() as conn:
        assetq.delete_dag(conn, "doomed")
    assert db.scalar("SELECT count(*) FROM {ns}.dag_lock WHERE dag_id = 'doomed'") == 0


@pytest.mark.parametrize("isolation", ["REPEATABLE READ", "SERIALIZABLE"])
def test_delete_dag_above_read_committed(db: TestDatabase, isolation: str) -> None:
    """Since 0013_queue_checks delete_dag deletes the consumer's queue rows itself, after
    waiting for the producers that hold it. PostgreSQL above READ COMMITTED would read them
    from the transaction's older snapshot and miss those producers' rows: refused (AQ002),
    nothing deleted. MySQL's deletes are locking reads (the latest committed rows at any
    level): it deletes, leaving nothing of the consumer."""
    scenario.declare(db, "doomed", "orders")
    scenario.declare(db, "kept", "orders")
    scenario.register(db, "orders")
    before = db.counts()
    with db.engine.connect() as conn:
        conn = conn.execution_options(isolation_level=isolation)
        with conn.begin():
            if db.engine_name == "postgresql":
                with pytest.raises(assetq.InvalidArgument, match="READ COMMITTED") as info:
                    assetq.delete_dag(conn, "doomed")
                assert info.value.code == "AQ002"
            else:
                assetq.delete_dag(conn, "doomed")
    if db.engine_name == "postgresql":
        assert db.counts() == before
    else:
        assert _rows_of_dag(db, "doomed") == dict.fromkeys(DAG_TABLES, 0)
        assert scenario.queued(db, "kept") != []
    assert _dangling(db) == {}


def test_a_redeclared_consumer_starts_afresh_after_delete_dag(db: TestDatabase) -> None:
    scenario.declare(db, "consumer", "orders")
    scenario.register(db, "orders")
    (old,) = assetq.schedule(db.engine)
    with db.engine.begin() as conn:
        assetq.delete_dag(conn, "consumer")
    scenario.declare(db, "consumer", "orders")
    (event,) = scenario.register(db, "orders")
    (new,) = assetq.schedule(db.engine)
    assert new.event_ids == (event.id,)
    assert new.id != old.id
    with db.engine.connect() as conn:
        assert [r.id for r in assetq.runs(conn, "consumer")] == [new.id]


def test_delete_dag_waits_for_a_pass_holding_the_consumer(db: TestDatabase) -> None:
    scenario.declare(db, "doomed", "orders")
    scenario.declare(db, "kept", "orders")
    scenario.register(db, "orders")
    pass_sql = db.engine_sql("schedule_pass").bindparams(limit=10)
    with db.engine.connect() as scheduler:
        scheduler = scheduler.execution_options(isolation_level="READ COMMITTED")
        scheduler.begin()
        assert len(scheduler.execute(pass_sql).all()) == 2  # runs created, not committed

        def delete() -> None:
            with db.engine.begin() as conn:
                assetq.delete_dag(conn, "doomed")

        thread, outcome = races.in_thread(delete)
        races.blocked_or_done(db, thread)
        scheduler.commit()
    _join(thread)
    assert outcome.error is None, outcome.error
    assert _rows_of_dag(db, "doomed") == dict.fromkeys(DAG_TABLES, 0)
    assert [link[0] for link in db.links()] == ["kept"]
    assert _dangling(db) == {}


def test_delete_dag_racing_an_open_producer_completes_and_the_producer_commits(
    db: TestDatabase,
) -> None:
    """The producer's event is queued (not committed) for the consumer being deleted."""
    scenario.declare(db, "doomed", "orders")
    scenario.declare(db, "kept", "orders")
    with db.engine.connect() as producer:
        producer.begin()
        event = assetq.register_event(producer, "orders")

        def delete() -> None:
            with db.engine.begin() as conn:
                assetq.delete_dag(conn, "doomed")

        thread, outcome = races.in_thread(delete)  # MySQL: may wait for the producer
        races.blocked_or_done(db, thread)
        producer.commit()
    _join(thread)
    assert outcome.error is None, outcome.error
    assert scenario.queued(db, "kept") == [event.id]
    assert _rows_of_dag(db, "doomed") == dict.fromkeys(DAG_TABLES, 0)
    assert _dangling(db) == {}


def test_a_producer_racing_an_open_delete_dag_succeeds(db: TestDatabase) -> None:
    scenario.declare(db, "doomed", "orders")
    scenario.declare(db, "kept", "orders")
    with db.engine.connect() as deleter:
        deleter.begin()
        assetq.delete_dag(deleter, "doomed")  # not committed

        def produce() -> assetq.Event:
            with db.engine.begin() as conn:
                return assetq.register_event(conn, "orders")

        thread, outcome = races.in_thread(produce)
        races.blocked_or_done(db, thread)
        deleter.commit()
    _join(thread)
    assert outcome.error is None, outcome.error
    assert scenario.queued(db, "kept") == [outcome.value.id]
    assert _rows_of_dag(db, "doomed") == dict.fromkeys(DAG_TABLES, 0)
    assert _dangling(db) == {}


def test_redeclaring_while_a_producer_is_open_loses_no_event(db: TestDatabase) -> None:
    scenario.declare(db, "consumer", "a")
    with db.engine.connect() as producer:
        producer.begin()
        event = assetq.register_event(producer, "a")

        def redeclare() -> None:
            with db.engine.begin() as conn:
                assetq.declare_dag(conn, "consumer", assetq.any_of("a", "b"))

        thread, outcome = races.in_thread(redeclare)  # MariaDB: waits for the producer
        races.blocked_or_done(db, thread)
        producer.commit()
    _join(thread)
    assert outcome.error is None, outcome.error
    (run,) = assetq.schedule(db.engine)
    assert run.event_ids == (event.id,)


def test_a_row_committed_during_a_redeclare_that_drops_its_asset_is_not_stranded(
    db: TestDatabase,
) -> None:
    """The producer's event of b is queued (not committed) when the consumer is re-declared
    without b. Once both commit, no row of b may be left in its queue: it would ride along
    in the consumer's next run, which no longer depends on b."""
    scenario.declare(db, "consumer", assetq.any_of("a", "b"))
    with db.engine.connect() as producer:
        producer.begin()
        assetq.register_event(producer, "b")

        def redeclare() -> None:
            with db.engine.begin() as conn:
                assetq.declare_dag(conn, "consumer", "a")

        thread, outcome = races.in_thread(redeclare)
        races.blocked_or_done(db, thread)
        producer.commit()
    _join(thread)
    assert outcome.error is None, outcome.error
    assert scenario.queued(db, "consumer") == []
    (a1,) = scenario.register(db, "a")
    (run,) = assetq.schedule(db.engine)
    assert run.event_ids == (a1.id,)


def test_delete_asset_is_refused_while_a_condition_names_it(db: TestDatabase) -> None:
    scenario.declare(db, "consumer", "orders")
    scenario.register(db, "orders", "orders")
    (run,) = assetq.schedule(db.engine)
    scenario.register(db, "orders")  # queued
    before = db.counts()
    with pytest.raises(assetq.AssetInUse) as info, db.engine.begin() as conn:
        assetq.delete_asset(conn, "orders")
    assert info.value.code == "AQ007"
    assert "consumer" in str(info.value)
    assert db.counts() == before

    scenario.declare(db, "consumer", "customers")  # no longer names orders
    with db.engine.begin() as conn:
        assert assetq.delete_asset(conn, "orders") == 3
    assert db.scalar("SELECT count(*) FROM {ns}.asset WHERE name = 'orders'") == 0
    assert db.scalar("SELECT count(*) FROM {ns}.asset_event") == 0
    assert db.links() == []
    with db.engine.connect() as conn:  # the run stays, with what it consumed counted
        info_after = assetq.get_run(conn, "consumer", run.run_id)
        assert assetq.consumed_events(conn, "consumer", run.run_id) == []
    assert (info_after.event_count, info_after.triggering_event_id) == (
        2,
        run.triggering_event_id,
    )
    assert _dangling(db) == {}
    with pytest.raises(assetq.UnknownAsset) as unknown, db.engine.begin() as conn:
        assetq.delete_asset(conn, "orders")
    assert unknown.value.code == "AQ001"


def test_asset_in_use_names_at_most_five_consumers(db: TestDatabase) -> None:
    dag_ids = [f"consumer_{n}" for n in range(7)]
    for dag_id in dag_ids:
        scenario.declare(db, dag_id, assetq.any_of("orders", "customers"))
    with pytest.raises(assetq.AssetInUse) as info, db.engine.begin() as conn:
        assetq.delete_asset(conn, "orders")
    named = [d for d in dag_ids if d in str(info.value)]
    assert 1 <= len(named) <= 5


def test_delete_asset_by_uri_removes_its_events_queue_rows_and_alias_resolutions(
    db: TestDatabase,
) -> None:
    """An alias clause does not name the asset: deleting it is allowed."""
    scenario.declare(db, "on_alias", assetq.alias("daily"))
    _declare_asset(db, "orders", uri="s3://b/orders")
    _declare_asset(db, "customers")
    scenario.register(db, "orders", aliases=("daily",))
    (kept,) = scenario.register(db, "customers", aliases=("daily",))
    assert len(scenario.queued(db, "on_alias")) == 2
    with db.engine.begin() as conn:
        assert assetq.delete_asset(conn, "s3://b/orders") == 1
    assert scenario.queued(db, "on_alias") == [kept.id]
    names = db.rows(
        "SELECT a.name FROM {ns}.asset_alias_asset r JOIN {ns}.asset a ON a.id = r.asset_id"
    )
    assert [r[0] for r in names] == ["customers"]
    assert db.scalar("SELECT count(*) FROM {ns}.asset_event_alias") == 1
    assert db.scalar("SELECT count(*) FROM {ns}.asset_alias") == 1  # the alias itself stays
    assert _dangling(db) == {}


@pytest.mark.parametrize(
    ("how", "aliases"),
    [("name", ()), ("name", ("daily",)), ("uri", ()), ("batch", ())],
    ids=["direct", "through-an-alias", "by-uri", "in-a-batch"],
)
def test_a_producer_racing_delete_asset_gets_unknown_asset_and_writes_nothing(
    db: TestDatabase, how: str, aliases: tuple[str, ...]
) -> None:
    """The producer's INSERT waits for the deleter; once it commits the asset is unknown,
    whichever way the producer named it. MySQL 9.7 checks foreign keys in its SQL layer: an
    event whose asset was read without a lock went in after the delete (by uri and in a
    batch, until they read it with a shared lock as the name path does)."""
    scenario.declare(db, "on_alias", assetq.alias("daily"))
    _declare_asset(db, "orders", uri="s3://bucket/orders")
    with db.engine.connect() as deleter:
        deleter.begin()
        assert assetq.delete_asset(deleter, "orders") == 0  # not committed

        def produce() -> assetq.Event:
            with db.engine.begin() as conn:
                if how == "batch":
                    batch = [assetq.NewEvent("orders", extra={"n": n}) for n in range(3)]
                    return assetq.register_events(conn, batch)[0]
                name = "s3://bucket/orders" if how == "uri" else "orders"
                return assetq.register_event(conn, name, aliases=aliases)

        thread, outcome = races.in_thread(produce)
        races.blocked_or_done(db, thread)
        deleter.commit()
    _join(thread)
    assert isinstance(outcome.error, assetq.UnknownAsset), outcome.error
    assert outcome.error.code == "AQ001"
    assert db.scalar("SELECT count(*) FROM {ns}.asset_event") == 0
    assert db.scalar("SELECT count(*) FROM {ns}.asset_dag_run_queue") == 0
    assert db.scalar("SELECT count(*) FROM {ns}.asset_event_alias") == 0
    assert _dangling(db) == {}


def test_delete_asset_racing_an_open_producer_leaves_no_event_of_the_asset(
    db: TestDatabase,
) -> None:
    """The producer registered first and commits while delete_asset runs. delete_asset then
    deletes the late event too, or fails retry-safely (an assetq error, nothing deleted) and
    a retry deletes everything. Never a raw driver error, never an orphaned event."""
    scenario.declare(db, "other", "customers")
    _declare_asset(db, "orders")
    with db.engine.connect() as producer:
        producer.begin()
        assetq.register_event(producer, "orders")

        def delete() -> int:
            with db.engine.begin() as conn:
                return assetq.delete_asset(conn, "orders")

        thread, outcome = races.in_thread(delete)
        races.blocked_or_done(db, thread)
        producer.commit()
    _join(thread)
    if outcome.error is not None:
        assert isinstance(outcome.error, assetq.AssetqError), outcome.error
        assert db.scalar("SELECT count(*) FROM {ns}.asset_event") == 1
        outcome.value = delete()
    assert outcome.value == 1
    assert db.scalar("SELECT count(*) FROM {ns}.asset WHERE name = 'orders'") == 0
    assert db.scalar("SELECT count(*) FROM {ns}.asset_event") == 0
    assert _dangling(db) == {}


def test_lifecycle_changes_under_concurrent_load_lose_corrupt_and_strand_nothing(
    db: TestDatabase,
) -> None:
    """Producers and a scheduler run while one thread deletes and re-creates a consumer and
    re-declares another. Consumers whose dependence on an asset never changed get every
    committed event of it exactly once; nothing dangles; producers never fail."""
    scenario.declare(db, "stable", assetq.any_of("a", "b", "c"))
    scenario.declare(db, "changing", "a")
    scenario.declare(db, "doomed", assetq.any_of("a", "b", "c"))
    producers, per_producer = 3, 30
    engine = db.new_engine(pool_size=producers + 4)
    committed: list[tuple[int, str]] = []
    producer_errors: list[BaseException] = []
    other_errors: list[BaseException] = []
    retried: list[str] = []
    lock = threading.Lock()
    done = threading.Event()
    start = threading.Barrier(producers + 1, timeout=30)

    def produce(seed: int) -> None:
        rng = random.Random(seed)
        start.wait()
        try:
            for _ in range(per_producer):
                asset = rng.choice("abc")
                with engine.connect() as conn:
                    event = assetq.register_event(conn, asset)
                    if rng.random() < 0.15:
                        conn.rollback()
                        continue
                    conn.commit()
                with lock:
                    committed.append((event.id, asset))
        except BaseException as exc:
            producer_errors.append(exc)

    def with_retry(what: str, action: Callable[[sa.Connection], None]) -> None:
        for _ in range(20):
            try:
                with engine.begin() as conn:
                    action(conn)
                return
            except assetq.TransientError:  # a deadlock: the caller retries (retry-safe)
                retried.append(what)
        raise AssertionError(f"{what} kept failing")

    def change_lifecycle() -> None:
        start.wait()
        try:
            cycle = 0
            while not done.is_set() or cycle < 4:
                with_retry("delete_dag", lambda c: assetq.delete_dag(c, "doomed"))
                with_retry(
                    "declare doomed",
                    lambda c: assetq.declare_dag(c, "doomed", assetq.any_of("a", "b", "c")),
                )
                changed: Any = assetq.any_of("a", "b") if cycle % 2 == 0 else "a"

                def redeclare(conn: sa.Connection, condition: Any = changed) -> None:
                    assetq.declare_dag(conn, "changing", condition)

                with_retry("redeclare", redeclare)
                cycle += 1
        except BaseException as exc:
            other_errors.append(exc)

    def schedule() -> None:
        try:
            while not done.is_set():
                assetq.schedule(engine, limit=5)
        except BaseException as exc:
            other_errors.append(exc)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(producers)]
    threads += [threading.Thread(target=change_lifecycle), threading.Thread(target=schedule)]
    for t in threads:
        t.start()
    for t in threads[:producers]:
        t.join(timeout=120)
    done.set()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert producer_errors == []
    assert other_errors == []
    _drain(engine)

    assert _dangling(db) == {}
    links = db.links()
    assert [pair for pair, n in Counter(links).items() if n > 1] == []
    by_dag: dict[str, list[int]] = {}
    for dag_id, event_id in links:
        by_dag.setdefault(dag_id, []).append(event_id)
    assert sorted(by_dag["stable"]) == sorted(e for e, _ in committed)
    a_events = {e for e, asset in committed if asset == "a"}
    assert a_events <= set(by_dag["changing"])
    asset_of = dict(committed)
    assert {asset_of[e] for e in by_dag["changing"]} <= {"a", "b"}
    assert set(by_dag.get("doomed", [])) <= set(asset_of)
    assert (
        scenario.queued(db, "stable")
        == scenario.queued(db, "changing")
        == scenario.queued(db, "doomed")
        == []
    )
    stored = {int(r[0]) for r in db.rows("SELECT id FROM {ns}.asset_event")}
    assert stored == set(asset_of)  # rolled-back events left nothing
