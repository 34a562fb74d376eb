"""Partitioned assets (issue 17, since development revision 0009_partitions): a partitioned
consumer's condition is evaluated per partition key, a run per key consumes exactly the queued
events that map to that key, and at most one run exists per (consumer, key, generation).

What is proven here, on every engine: identity, roll-up (hour -> day, day -> week, day ->
month, with require "all" and "any") and static mappings; several keys in one pass, an
unsatisfied key blocking none; late commits and racing schedulers per key (forced with
explicit connections, never with sleeps); re-delivered keys (generation 2); mixed
partitioned and unpartitioned consumers of one asset; ``max_active_runs`` across keys and
``max_events_per_run`` within a key; keys a mapping cannot map (AQ011, nothing written);
re-declaring; outputs, aliases, paused consumers and purge; and, counted rather than timed,
that a pass after one arrival reads the same rows whether 1,000 or 5,000 (100,000 with
``-m slow``) keys are pending.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import date, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

import assetq
import scenario
from dbs import TestDatabase

DAY = "2026-12-01"
HOURS = [f"{DAY}T{h:02d}" for h in range(24)]


# -- helpers --------------------------------------------------------------------------------------


def reg(db: TestDatabase, *items: tuple[str, str | None]) -> list[assetq.Event]:
    """One event per (asset, partition key), one batch, one committed transaction."""
    with db.engine.begin() as conn:
        return assetq.register_events(
            conn, [assetq.NewEvent(asset, partition_key=key) for asset, key in items]
        )


def backlog(db: TestDatabase, items: Sequence[dict[str, Any]]) -> None:
    """Many events, in batches of 10,000 (the batch limit), in one transaction."""
    with db.engine.begin() as conn:
        for start in range(0, len(items), 10_000):
            assetq.register_events(conn, list(items[start : start + 10_000]))


def by_key(runs: Iterable[assetq.Run], dag_id: str | None = None) -> dict[str | None, assetq.Run]:
    """The runs of ``dag_id`` (of all consumers: None) by partition key; one run per key."""
    chosen = [r for r in runs if dag_id is None or r.dag_id == dag_id]
    keys = [r.partition_key for r in chosen]
    assert len(keys) == len(set(keys)), f"two runs of one key in one pass: {keys}"
    return {r.partition_key: r for r in chosen}


def ids(events: Iterable[assetq.Event]) -> tuple[int, ...]:
    return tuple(sorted(e.id for e in events))


def generations(db: TestDatabase, dag_id: str) -> list[tuple[str | None, int | None]]:
    """(partition_key, partition_generation) of the consumer's runs, in creation order."""
    return [
        (r[0], None if r[1] is None else int(r[1]))
        for r in db.rows(
            "SELECT partition_key, partition_generation FROM {ns}.dag_run"
            " WHERE dag_id = :d ORDER BY id",
            d=dag_id,
        )
    ]


def queued_keys(db: TestDatabase, dag_id: str) -> list[tuple[int, str | None]]:
    """(event id, the event's own partition key) of what is queued for ``dag_id``."""
    return [
        (int(r[0]), r[1])
        for r in db.rows(
            "SELECT q.asset_event_id, e.partition_key FROM {ns}.asset_dag_run_queue q"
            " JOIN {ns}.asset_event e ON e.id = q.asset_event_id"
            " WHERE q.target_dag_id = :d ORDER BY q.asset_event_id",
            d=dag_id,
        )
    ]


def partition_rows(db: TestDatabase, dag_id: str | None = None) -> list[tuple[Any, ...]]:
    """The consumer's rows of asset_partition_queue (all consumers' with None), sorted."""
    where = "" if dag_id is None else " WHERE target_dag_id = :d"
    return sorted(
        (str(r[0]), int(r[1]), str(r[2]), str(r[3]), bool(r[4]))
        for r in db.rows(
            "SELECT target_dag_id, asset_event_id, partition_key, source_key, examined"
            " FROM {ns}.asset_partition_queue" + where,
            d=dag_id,
        )
    )


def everything(db: TestDatabase) -> dict[str, int]:
    """Row counts of every assetq table, the partition tables included."""
    counts = db.counts()
    for table in ("asset_partition_queue", "dag_partition_static_key"):
        counts[table] = int(db.scalar(f"SELECT count(*) FROM {{ns}}.{table}"))
    return counts


def drain(db: TestDatabase, passes: int = 50) -> list[list[assetq.Run]]:
    """Passes until one creates nothing; the runs of each pass."""
    made: list[list[assetq.Run]] = []
    for _ in range(passes):
        runs = assetq.schedule(db.engine)
        if not runs:
            return made
        made.append(runs)
    raise AssertionError(f"still creating runs after {passes} passes")


def finish(db: TestDatabase, runs: Iterable[assetq.Run]) -> None:
    with db.engine.begin() as conn:
        for run in runs:
            assetq.set_run_state(conn, run.dag_id, run.run_id, "success")


# -- 1. Identity mapping --------------------------------------------------------------------------


def test_identity_and_runs_once_both_assets_have_the_same_day(db: TestDatabase) -> None:
    scenario.declare(db, "report", assetq.all_of("orders", "payments"), partitioned=True)
    orders_1, orders_2, payments_1 = reg(
        db, ("orders", "2026-12-01"), ("orders", "2026-12-02"), ("payments", "2026-12-01")
    )
    assert (orders_1.partition_key, payments_1.partition_key) == ("2026-12-01", "2026-12-01")
    (run,) = assetq.schedule(db.engine)
    assert (run.dag_id, run.partition_key) == ("report", "2026-12-01")
    assert run.event_ids == ids([orders_1, payments_1])
    # The other day stays queued: orders of 12-02 alone do not satisfy it.
    assert queued_keys(db, "report") == [(orders_2.id, "2026-12-02")]
    assert assetq.schedule(db.engine) == []
    (payments_2,) = reg(db, ("payments", "2026-12-02"))
    (second,) = assetq.schedule(db.engine)
    assert second.partition_key == "2026-12-02"
    assert second.event_ids == ids([orders_2, payments_2])
    assert generations(db, "report") == [("2026-12-01", 1), ("2026-12-02", 1)]
    assert queued_keys(db, "report") == []


def test_several_keys_run_in_one_pass_and_an_unsatisfied_key_blocks_none(
    db: TestDatabase,
) -> None:
    scenario.declare(db, "report", assetq.all_of("orders", "payments"), partitioned=True)
    # The oldest key (d0) never gets its payments: it must not hold back d1..d5.
    (waiting,) = reg(db, ("orders", "d0"))
    events = reg(db, *[(asset, f"d{n}") for n in range(1, 6) for asset in ("orders", "payments")])
    runs = by_key(assetq.schedule(db.engine))
    assert sorted(runs) == [f"d{n}" for n in range(1, 6)]
    for key, run in runs.items():
        assert run.event_ids == ids(e for e in events if e.partition_key == key)
    assert queued_keys(db, "report") == [(waiting.id, "d0")]
    assert db.scalar("SELECT count(*) FROM {ns}.dag_run WHERE dag_id = 'report'") == 5


def test_a_run_consumes_every_queued_event_of_its_key_and_none_of_other_keys(
    db: TestDatabase,
) -> None:
    scenario.declare(db, "report", assetq.all_of("orders", "payments"), partitioned=True)
    mine = reg(db, ("orders", "k"), ("orders", "k"), ("orders", "k"))
    others = reg(db, ("orders", "other"), ("payments", "other2"))
    mine += reg(db, ("payments", "k"))
    (run,) = assetq.schedule(db.engine)
    assert run.partition_key == "k"
    assert run.event_ids == ids(mine)
    assert [e for e, _ in queued_keys(db, "report")] == sorted(e.id for e in others)


def test_an_any_of_fires_per_key_on_either_asset(db: TestDatabase) -> None:
    scenario.declare(
        db,
        "either",
        assetq.any_of(assetq.all_of("a", "b"), "c"),
        partitioned=True,
    )
    a1, c2, a3 = reg(db, ("a", "k1"), ("c", "k2"), ("a", "k3"))
    runs = by_key(assetq.schedule(db.engine))
    assert {k: r.event_ids for k, r in runs.items()} == {"k2": (c2.id,)}
    (b1,) = reg(db, ("b", "k1"))
    runs = by_key(assetq.schedule(db.engine))
    assert {k: r.event_ids for k, r in runs.items()} == {"k1": ids([a1, b1])}
    assert queued_keys(db, "either") == [(a3.id, "k3")]


def test_the_partition_key_is_stored_and_returned_by_the_read_api(db: TestDatabase) -> None:
    scenario.declare(db, "report", "orders", partitioned=True)
    with db.engine.begin() as conn:
        single = assetq.register_event(conn, "orders", partition_key="2026-12-01")
        (batch,) = assetq.register_events(
            conn, [{"asset": "orders", "partition_key": "2026-12-02"}]
        )
    assert (single.partition_key, batch.partition_key) == ("2026-12-01", "2026-12-02")
    stored = dict(db.rows("SELECT id, partition_key FROM {ns}.asset_event"))
    assert stored == {single.id: "2026-12-01", batch.id: "2026-12-02"}
    with db.engine.connect() as conn:
        queued = assetq.queued_events(conn, "report")
    assert [(e.id, e.partition_key) for e in queued] == [
        (single.id, "2026-12-01"),
        (batch.id, "2026-12-02"),
    ]
    runs = by_key(assetq.schedule(db.engine))
    assert sorted(runs) == ["2026-12-01", "2026-12-02"]
    run = runs["2026-12-02"]
    with db.engine.connect() as conn:
        assert assetq.get_run(conn, "report", run.run_id).partition_key == "2026-12-02"
        assert sorted(r.partition_key for r in assetq.runs(conn, "report")) == sorted(runs)
        assert sorted(r.partition_key for r in assetq.runs(conn)) == sorted(runs)
        consumed = assetq.consumed_events(conn, "report", run.run_id)
    assert [(e.id, e.partition_key) for e in consumed] == [(batch.id, "2026-12-02")]
    with db.engine.begin() as conn:
        info = assetq.set_run_state(conn, "report", run.run_id, "failed")
    assert info.partition_key == "2026-12-02"
    with db.engine.begin() as conn:
        assert assetq.retry_run(conn, "report", run.run_id).partition_key == "2026-12-02"


# -- 2. Roll-ups ----------------------------------------------------------------------------------


def test_hour_to_day_all_waits_for_the_24th_hour_then_runs_once_with_24_events(
    db: TestDatabase,
) -> None:
    scenario.declare(db, "daily", "clicks", partitioned={"clicks": assetq.Rollup("hour", "day")})
    first = reg(db, *[("clicks", h) for h in HOURS[:23]])
    assert assetq.schedule(db.engine) == []
    assert len(queued_keys(db, "daily")) == 23
    last = reg(db, ("clicks", HOURS[23]))
    (run,) = assetq.schedule(db.engine)
    assert (run.partition_key, len(run.event_ids)) == (DAY, 24)
    assert run.event_ids == ids(first + last)


def test_hour_keys_in_every_accepted_spelling_are_hours_of_utc(db: TestDatabase) -> None:
    scenario.declare(db, "daily", "clicks", partitioned={"clicks": assetq.Rollup("hour", "day")})
    spellings = ("", ":00", ":00:00", "Z", "+00:00", ":00Z", ":00:00+00:00")
    keys = [f"{DAY}T{h:02d}{spellings[h % len(spellings)]}" for h in range(24)]
    events = reg(db, *[("clicks", k) for k in keys[:23]])
    # The same hour 22 written another way is still hour 22: no run yet.
    events += reg(db, ("clicks", f"{DAY}T22:00:00Z"))
    assert assetq.schedule(db.engine) == []
    events += reg(db, ("clicks", keys[23]))
    (run,) = assetq.schedule(db.engine)
    assert run.partition_key == DAY
    assert run.event_ids == ids(events)
    # The events keep their own keys as written.
    with db.engine.connect() as conn:
        consumed = assetq.consumed_events(conn, "daily", run.run_id, limit=100)
    assert sorted(e.partition_key or "" for e in consumed) == sorted([*keys, f"{DAY}T22:00:00Z"])


def test_hour_to_day_any_runs_on_the_first_hour(db: TestDatabase) -> None:
    scenario.declare(
        db, "daily", "clicks", partitioned={"clicks": assetq.Rollup("hour", "day", require="any")}
    )
    events = reg(db, ("clicks", f"{DAY}T07"), ("clicks", f"{DAY}T09"), ("clicks", "2026-12-02T00"))
    runs = by_key(assetq.schedule(db.engine))
    assert {k: r.event_ids for k, r in runs.items()} == {
        DAY: ids(events[:2]),
        "2026-12-02": (events[2].id,),
    }


def _iso_week(day: date) -> str:
    year, week, _ = day.isocalendar()
    return f"{year}-W{week:02d}"


def test_day_to_week_all_needs_the_seven_days_of_the_iso_week(db: TestDatabase) -> None:
    scenario.declare(db, "weekly", "sales", partitioned={"sales": assetq.Rollup("day", "week")})
    # ISO week 53 of 2026: Monday 2026-12-28 to Sunday 2027-01-03, across the year.
    monday = date.fromisocalendar(2026, 53, 1)
    days = [(monday + timedelta(days=n)).isoformat() for n in range(7)]
    assert {_iso_week(date.fromisoformat(d)) for d in days} == {"2026-W53"}
    first = reg(db, *[("sales", d) for d in days[:6]])
    first += reg(db, ("sales", "2026-12-27"))  # Sunday of week 52: another key
    assert assetq.schedule(db.engine) == []
    last = reg(db, ("sales", days[6]))
    (run,) = assetq.schedule(db.engine)
    assert run.partition_key == "2026-W53"
    assert run.event_ids == ids(first[:6] + last)
    assert [k for _, k in queued_keys(db, "weekly")] == ["2026-12-27"]


def test_day_to_week_any_maps_a_day_to_its_iso_week(db: TestDatabase) -> None:
    scenario.declare(
        db, "weekly", "sales", partitioned={"sales": assetq.Rollup("day", "week", require="any")}
    )
    days = ["2026-12-01", "2027-01-01", "2024-12-30", "2026-01-01", "2028-02-29"]
    events = reg(db, *[("sales", d) for d in days])
    runs = by_key(assetq.schedule(db.engine))
    expected = {
        _iso_week(date.fromisoformat(d)): (e.id,) for d, e in zip(days, events, strict=True)
    }
    assert expected == {
        "2026-W49": (events[0].id,),
        "2026-W53": (events[1].id,),
        "2025-W01": (events[2].id,),
        "2026-W01": (events[3].id,),
        "2028-W09": (events[4].id,),  # a leap day is a day
    }
    assert {k: r.event_ids for k, r in runs.items()} == expected


def test_day_to_month_all_needs_every_day_of_the_month(db: TestDatabase) -> None:
    scenario.declare(db, "monthly", "sales", partitioned={"sales": assetq.Rollup("day", "month")})
    december = [f"2026-12-{d:02d}" for d in range(1, 32)]
    february = [f"2028-02-{d:02d}" for d in range(1, 30)]  # a leap year: 29 days
    dec = reg(db, *[("sales", d) for d in december[:30]])
    feb = reg(db, *[("sales", d) for d in february[:28]])
    short = reg(db, *[("sales", f"2027-02-{d:02d}") for d in range(1, 29)])  # 28 days
    runs = by_key(assetq.schedule(db.engine))
    assert {k: r.event_ids for k, r in runs.items()} == {"2027-02": ids(short)}
    dec += reg(db, ("sales", december[30]))
    feb += reg(db, ("sales", february[28]))
    runs = by_key(assetq.schedule(db.engine))
    assert {k: r.event_ids for k, r in runs.items()} == {"2026-12": ids(dec), "2028-02": ids(feb)}


def test_day_to_month_any_runs_on_the_first_day(db: TestDatabase) -> None:
    scenario.declare(
        db, "monthly", "sales", partitioned={"sales": assetq.Rollup("day", "month", require="any")}
    )
    events = reg(db, ("sales", "2026-12-31"), ("sales", "2027-01-01"))
    runs = by_key(assetq.schedule(db.engine))
    assert {k: r.event_ids for k, r in runs.items()} == {
        "2026-12": (events[0].id,),
        "2027-01": (events[1].id,),
    }


# -- 3. Static mappings ---------------------------------------------------------------------------

REGIONS = {"eu-west-1": "eu", "eu-central-1": "eu", "us-east-1": "us"}


def test_static_all_needs_every_upstream_key_of_the_target_key(db: TestDatabase) -> None:
    scenario.declare(
        db, "regional", "regions", partitioned={"regions": assetq.StaticPartitions(REGIONS)}
    )
    (west,) = reg(db, ("regions", "eu-west-1"))
    assert assetq.schedule(db.engine) == []
    (west_again,) = reg(db, ("regions", "eu-west-1"))  # the same upstream key twice: still one
    assert assetq.schedule(db.engine) == []
    (us,) = reg(db, ("regions", "us-east-1"))
    runs = by_key(assetq.schedule(db.engine))
    assert {k: r.event_ids for k, r in runs.items()} == {"us": (us.id,)}
    (central,) = reg(db, ("regions", "eu-central-1"))
    (run,) = assetq.schedule(db.engine)
    assert (run.partition_key, run.event_ids) == ("eu", ids([west, west_again, central]))


def test_static_any_runs_on_one_upstream_key(db: TestDatabase) -> None:
    scenario.declare(
        db,
        "regional",
        "regions",
        partitioned={"regions": assetq.StaticPartitions(REGIONS, require="any")},
    )
    west, us = reg(db, ("regions", "eu-west-1"), ("regions", "us-east-1"))
    runs = by_key(assetq.schedule(db.engine))
    assert {k: r.event_ids for k, r in runs.items()} == {"eu": (west.id,), "us": (us.id,)}


def test_one_consumer_mixes_a_roll_up_a_static_table_and_identity(db: TestDatabase) -> None:
    scenario.declare(
        db,
        "report",
        assetq.all_of("clicks", "orders", "regions"),
        partitioned={
            "clicks": assetq.Rollup("hour", "day", require="any"),
            "regions": assetq.StaticPartitions({"eu-2026-12-01": DAY, "us-2026-12-01": DAY}),
            "orders": "identity",
        },
    )
    events = reg(db, ("clicks", f"{DAY}T03"), ("orders", DAY), ("regions", "eu-2026-12-01"))
    assert assetq.schedule(db.engine) == []  # regions needs both of its upstream keys
    events += reg(db, ("regions", "us-2026-12-01"))
    (run,) = assetq.schedule(db.engine)
    assert (run.partition_key, run.event_ids) == (DAY, ids(events))


# -- 4. Late commits, racing schedulers, re-delivered keys ----------------------------------------


def test_a_late_commit_completes_its_key_in_a_later_pass(db: TestDatabase) -> None:
    """The event that completes key k is registered before a pass and committed after it: the
    pass does not see it, finds k unsatisfied, and the next pass runs k with it."""
    scenario.declare(db, "report", assetq.all_of("orders", "payments"), partitioned=True)
    with db.engine.connect() as late:
        late.begin()
        payments = assetq.register_event(late, "payments", partition_key="k")  # not committed
        (orders,) = reg(db, ("orders", "k"))
        assert payments.timestamp < orders.timestamp
        assert assetq.schedule(db.engine) == []
        late.commit()
    (run,) = assetq.schedule(db.engine)
    assert (run.partition_key, run.event_ids) == ("k", ids([orders, payments]))
    assert queued_keys(db, "report") == []


def test_a_late_commit_of_a_key_already_run_is_consumed_by_its_next_run(
    db: TestDatabase,
) -> None:
    scenario.declare(db, "daily", "orders", partitioned=True)
    with db.engine.connect() as late:
        late.begin()
        event_a = assetq.register_event(late, "orders", partition_key="k")
        (event_b,) = reg(db, ("orders", "k"))
        assert event_a.timestamp < event_b.timestamp
        first = by_key(assetq.schedule(db.engine))
        assert {k: r.event_ids for k, r in first.items()} == {"k": (event_b.id,)}
        late.commit()  # older timestamp, committed after the run of its key
    (second,) = assetq.schedule(db.engine)
    assert (second.partition_key, second.event_ids) == ("k", (event_a.id,))
    assert generations(db, "daily") == [("k", 1), ("k", 2)]
    assert db.links() == sorted([("daily", event_a.id), ("daily", event_b.id)])


def test_an_event_committed_during_a_pass_stays_for_the_next_pass(db: TestDatabase) -> None:
    """A pass holds the consumer (uncommitted) while a producer commits events of a key the
    pass has just found unsatisfied and of a key it is running."""
    scenario.declare(db, "report", assetq.all_of("orders", "payments"), partitioned=True)
    (o1,) = reg(db, ("orders", "k1"))
    run_now = reg(db, ("orders", "k2"), ("payments", "k2"))
    pass_sql = db.engine_sql("schedule_pass").bindparams(limit=10)
    with db.engine.connect() as scheduler, db.engine.connect() as producer:
        scheduler = scheduler.execution_options(isolation_level="READ COMMITTED")
        scheduler.begin()
        made = scheduler.execute(pass_sql).all()
        assert [r.partition_key for r in made] == ["k2"]
        producer.execute(db.engine_sql("lock_timeout_2s"))
        # Must not wait for the pass (a lock timeout fails the test), must not be lost.
        p1 = assetq.register_event(producer, "payments", partition_key="k1")
        o2 = assetq.register_event(producer, "orders", partition_key="k2")
        producer.commit()
        scheduler.commit()
    assert sorted(db.links()) == sorted(("report", e.id) for e in run_now)
    runs = by_key(assetq.schedule(db.engine))
    assert {k: r.event_ids for k, r in runs.items()} == {"k1": ids([o1, p1])}
    assert queued_keys(db, "report") == [(o2.id, "k2")]


def test_a_second_scheduler_skips_a_partitioned_consumer_held_by_the_first(
    db: TestDatabase,
) -> None:
    scenario.declare(db, "daily", "orders", partitioned=True)
    events = reg(db, *[("orders", f"k{n}") for n in range(5)])
    pass_sql = db.engine_sql("schedule_pass").bindparams(limit=10)
    with db.engine.connect() as first, db.engine.connect() as second:
        first = first.execution_options(isolation_level="READ COMMITTED")
        second = second.execution_options(isolation_level="READ COMMITTED")
        first.begin()
        made = first.execute(pass_sql).all()
        assert sorted(r.partition_key for r in made) == [f"k{n}" for n in range(5)]
        second.execute(db.engine_sql("lock_timeout_2s"))
        second.commit()
        second.begin()
        assert second.execute(pass_sql).all() == []  # skipped, not waited for
        second.commit()
        first.commit()
        second.begin()
        assert second.execute(pass_sql).all() == []  # nothing left: no second run of a key
        second.commit()
    assert db.links() == sorted(("daily", e.id) for e in events)
    assert sorted(generations(db, "daily")) == [(f"k{n}", 1) for n in range(5)]


def test_two_racing_schedulers_consume_every_event_once_with_one_run_per_key_and_generation(
    db: TestDatabase,
) -> None:
    """Two schedulers loop over the same keys while a producer keeps adding events to them
    (re-deliveries: later generations). No sleeps: each side runs flat out."""
    scenario.declare(db, "report", assetq.all_of("a", "b"), partitioned=True)
    scenario.declare(db, "plain", "a")  # an unpartitioned neighbour, racing too
    keys = [f"k{n}" for n in range(8)]
    engine = db.new_engine(pool_size=6)
    committed: list[assetq.Event] = []
    errors: list[BaseException] = []
    made: list[assetq.Run] = []
    lock = threading.Lock()
    done = threading.Event()
    barrier = threading.Barrier(3)

    def produce() -> None:
        try:
            barrier.wait(timeout=30)
            for _ in range(6):
                for key in keys:
                    with engine.begin() as conn:
                        batch = assetq.register_events(
                            conn,
                            [assetq.NewEvent(asset, partition_key=key) for asset in ("a", "b")],
                        )
                    with lock:
                        committed.extend(batch)
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    def schedule() -> None:
        try:
            barrier.wait(timeout=30)
            while not done.is_set():
                runs = assetq.schedule(engine, limit=5)
                with lock:
                    made.extend(runs)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=produce)]
    threads += [threading.Thread(target=schedule) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    while runs := assetq.schedule(engine):
        made.extend(runs)

    links = db.links()
    assert [pair for pair, n in Counter(links).items() if n > 1] == []
    consumed = Counter((run.dag_id, event_id) for run in made for event_id in run.event_ids)
    assert set(consumed.values()) == {1}
    # Every pair consumed: each round gives every key both assets.
    assert set(links) == {("report", e.id) for e in committed} | {
        ("plain", e.id) for e in committed if e.asset == "a"
    }
    assert scenario.queued(db, "report") == [] and scenario.queued(db, "plain") == []
    # Each run of report: one key, both assets of that key, generations 1, 2, ... per key.
    key_of = {e.id: e.partition_key for e in committed}
    asset_of = {e.id: e.asset for e in committed}
    for run in made:
        if run.dag_id == "report":
            assert {key_of[e] for e in run.event_ids} == {run.partition_key}
            assert {asset_of[e] for e in run.event_ids} == {"a", "b"}
    gens = generations(db, "report")
    assert len(gens) == len(set(gens))
    for key in keys:
        mine = [g for k, g in gens if k == key]
        assert mine == list(range(1, len(mine) + 1)), (key, mine)


def test_the_schema_refuses_a_second_run_of_a_key_and_generation(db: TestDatabase) -> None:
    scenario.declare(db, "daily", "orders", partitioned=True)
    reg(db, ("orders", "k"))
    (run,) = assetq.schedule(db.engine)
    with pytest.raises(sa.exc.IntegrityError):
        db.execute(
            "INSERT INTO {ns}.dag_run (dag_id, run_id, seq, run_after, created_at,"
            " triggering_event_id, event_count, not_before, partition_key,"
            " partition_generation)"
            " SELECT dag_id, 'copy', seq + 100, run_after, created_at, triggering_event_id,"
            " event_count, not_before, partition_key, partition_generation"
            " FROM {ns}.dag_run WHERE id = :i",
            i=run.id,
        )


def test_a_redelivered_key_runs_again_as_generation_2(db: TestDatabase) -> None:
    scenario.declare(db, "report", assetq.all_of("orders", "payments"), partitioned=True)
    reg(db, ("orders", "k"), ("payments", "k"), ("orders", "other"), ("payments", "other"))
    assert sorted(by_key(assetq.schedule(db.engine))) == ["k", "other"]
    # Re-delivery of k: the AND needs both assets again, from the new events of k.
    (orders,) = reg(db, ("orders", "k"))
    assert assetq.schedule(db.engine) == []
    (payments,) = reg(db, ("payments", "k"))
    (run,) = assetq.schedule(db.engine)
    assert (run.partition_key, run.event_ids) == ("k", ids([orders, payments]))
    assert sorted(generations(db, "report")) == [("k", 1), ("k", 2), ("other", 1)]
    reg(db, ("orders", "new"))
    reg(db, ("payments", "new"))
    (run,) = assetq.schedule(db.engine)
    assert run.partition_key == "new"
    assert generations(db, "report")[-1] == ("new", 1)


# -- 5. Mixed consumers, caps ---------------------------------------------------------------------


def test_partitioned_and_unpartitioned_consumers_of_one_asset(db: TestDatabase) -> None:
    scenario.declare(db, "daily", "orders", partitioned=True)
    scenario.declare(db, "everything", "orders")
    events = reg(db, ("orders", "d1"), ("orders", "d2"), ("orders", "d1"))
    runs = assetq.schedule(db.engine)
    daily = by_key(runs, "daily")
    assert {k: r.event_ids for k, r in daily.items()} == {
        "d1": ids([events[0], events[2]]),
        "d2": (events[1].id,),
    }
    (plain,) = [r for r in runs if r.dag_id == "everything"]
    assert (plain.partition_key, plain.event_ids) == (None, ids(events))
    assert generations(db, "everything") == [(None, None)]
    # An asset with only unpartitioned consumers takes events without keys, as before.
    scenario.declare(db, "other_plain", "customers")
    (keyless,) = reg(db, ("customers", None))
    (run,) = assetq.schedule(db.engine)
    assert (run.dag_id, run.event_ids, run.partition_key) == ("other_plain", (keyless.id,), None)


def test_max_active_runs_counts_the_runs_of_every_key(db: TestDatabase) -> None:
    scenario.declare(db, "daily", "orders", partitioned=True, max_active_runs=2)
    events = reg(db, *[("orders", f"k{n}") for n in range(5)])
    first = assetq.schedule(db.engine)
    assert sorted(r.partition_key or "" for r in first) == ["k0", "k1"]  # oldest keys first
    assert assetq.schedule(db.engine) == []  # at the cap
    finish(db, first[:1])
    second = assetq.schedule(db.engine)
    assert [r.partition_key for r in second] == ["k2"]
    assert assetq.schedule(db.engine) == []
    finish(db, [*first[1:], *second])
    third = assetq.schedule(db.engine)
    assert sorted(r.partition_key or "" for r in third) == ["k3", "k4"]
    assert db.links() == sorted(("daily", e.id) for e in events)


def test_max_active_runs_holds_back_a_key_until_a_run_finishes_even_with_no_arrival(
    db: TestDatabase,
) -> None:
    scenario.declare(db, "report", assetq.all_of("a", "b"), partitioned=True, max_active_runs=1)
    reg(db, ("a", "k1"), ("b", "k1"), ("a", "k2"), ("b", "k2"), ("a", "k3"))
    (first,) = assetq.schedule(db.engine)
    assert first.partition_key == "k1"
    assert assetq.schedule(db.engine) == []
    finish(db, [first])
    (second,) = assetq.schedule(db.engine)  # nothing arrived since: k2 was left pending
    assert second.partition_key == "k2"
    finish(db, [second])
    assert assetq.schedule(db.engine) == []  # k3 waits for b


def test_max_events_per_run_takes_a_keys_oldest_events_and_leaves_the_rest(
    db: TestDatabase,
) -> None:
    scenario.declare(db, "daily", "orders", partitioned=True, max_events_per_run=2)
    k1 = reg(db, *[("orders", "k1")] * 5)
    (k2,) = reg(db, ("orders", "k2"))
    made = [r for runs in drain(db) for r in runs]
    assert [(r.partition_key, r.event_ids) for r in made if r.partition_key == "k1"] == [
        ("k1", ids(k1[0:2])),
        ("k1", ids(k1[2:4])),
        ("k1", ids(k1[4:5])),
    ]
    assert [(r.partition_key, r.event_ids) for r in made if r.partition_key == "k2"] == [
        ("k2", (k2.id,))
    ]
    assert [g for k, g in generations(db, "daily") if k == "k1"] == [1, 2, 3]
    assert queued_keys(db, "daily") == []


def test_max_events_per_run_never_starves_a_key_whose_queue_satisfies_the_condition(
    db: TestDatabase,
) -> None:
    """docs/semantics.md §5 for one key: events a1, a2, a3, b1 of key k, cap 2, all_of(a, b):
    the oldest two do not satisfy the condition but the key's queue does, so the run takes
    a1 and b1 (the oldest event of each needed asset), and a2, a3 stay."""
    scenario.declare(db, "pairs", assetq.all_of("a", "b"), partitioned=True, max_events_per_run=2)
    a1, a2, a3 = reg(db, ("a", "k"), ("a", "k"), ("a", "k"))
    (b1,) = reg(db, ("b", "k"))
    runs = [r for made in drain(db) for r in made]
    assert [(r.partition_key, r.event_ids) for r in runs] == [("k", ids([a1, b1]))]
    assert [e for e, _ in queued_keys(db, "pairs")] == [a2.id, a3.id]


#: (condition, partitioned, the fewest events one key may need).
CAP_CASES = [
    ("clicks", {"clicks": assetq.Rollup("hour", "day")}, 24),
    ("sales", {"sales": assetq.Rollup("day", "week")}, 7),
    ("sales", {"sales": assetq.Rollup("day", "month")}, 31),
    ("regions", {"regions": assetq.StaticPartitions(REGIONS)}, 2),
    (
        assetq.all_of("clicks", "orders"),
        {"clicks": assetq.Rollup("hour", "day"), "orders": "identity"},
        25,
    ),
    ("clicks", {"clicks": assetq.Rollup("hour", "day", require="any")}, 1),
]


def test_a_cap_below_what_one_key_needs_is_refused_when_declared(db: TestDatabase) -> None:
    """docs/semantics.md §5 and "Partitions": declare_dag refuses a cap below what one key
    may need (a day of an all-hours roll-up needs 24 events), since that key could never run."""
    for n, (condition, partitioned, needs) in enumerate(CAP_CASES):
        if needs > 1:
            with pytest.raises(assetq.InvalidArgument):
                scenario.declare(
                    db, f"c{n}", condition, partitioned=partitioned, max_events_per_run=needs - 1
                )
        scenario.declare(db, f"c{n}", condition, partitioned=partitioned, max_events_per_run=needs)


def test_removing_the_cap_leaves_no_key_whose_queue_satisfies_the_condition_without_a_run(
    db: TestDatabase,
) -> None:
    """Whatever a capped pass did with key k (events a1, a2, a3, b1, cap 2, all_of(a, b)),
    once the cap is removed the passes must not leave k with a queue that satisfies the
    condition and no run: a new cap is a new declaration, its keys evaluated again."""
    scenario.declare(db, "pairs", assetq.all_of("a", "b"), partitioned=True, max_events_per_run=2)
    reg(db, ("a", "k"), ("a", "k"), ("a", "k"))
    reg(db, ("b", "k"))
    drain(db)
    scenario.declare(db, "pairs", assetq.all_of("a", "b"), partitioned=True)
    drain(db)
    assets = {
        str(r[0])
        for r in db.rows(
            "SELECT a.name FROM {ns}.asset_dag_run_queue q"
            " JOIN {ns}.asset a ON a.id = q.asset_id WHERE q.target_dag_id = 'pairs'"
        )
    }
    assert not {"a", "b"} <= assets, "key k satisfies all_of(a, b) and has no run"


# -- 6. Keys a mapping cannot map -----------------------------------------------------------------


def _accepted(db: TestDatabase, items: Sequence[tuple[str, str | None]]) -> bool:
    """Register ``items`` (one batch) in a transaction that is committed whatever happens:
    True if they were accepted (then the transaction is rolled back instead). Refused, they
    must raise UnmappablePartition (AQ011) and leave nothing behind, not even in the caller's
    transaction, which commits after the error."""
    before = everything(db)
    with db.engine.connect() as conn:
        conn.begin()
        try:
            assetq.register_events(
                conn, [assetq.NewEvent(asset, partition_key=key) for asset, key in items]
            )
        except assetq.UnmappablePartition as exc:
            assert exc.code == "AQ011", items
            conn.commit()
        except assetq.InvalidArgument as exc:
            # A key ending with a space is refused for every event, before anything is sent
            # (MySQL would compare it equal to the key without the space; docs/semantics.md §9).
            assert exc.code == "AQ002", items
            assert any(key is not None and key.endswith(" ") for _, key in items), items
            conn.commit()
        else:
            conn.rollback()
            return True
    assert everything(db) == before, items
    return False


def _refused(db: TestDatabase, items: Sequence[tuple[str, str | None]]) -> None:
    """Registering ``items`` (one batch) raises UnmappablePartition (AQ011), writing nothing."""
    assert not _accepted(db, items), f"accepted: {items}"


def test_an_event_without_a_key_for_a_partitioned_consumer_is_refused(db: TestDatabase) -> None:
    scenario.declare(db, "daily", "orders", partitioned=True)
    scenario.declare(db, "plain", "orders")
    reg(db, ("orders", "k"))
    plain_before = scenario.queued(db, "plain")
    with pytest.raises(assetq.UnmappablePartition), db.engine.begin() as conn:
        assetq.register_event(conn, "orders")
    _refused(db, [("orders", None)])
    _refused(db, [("orders", "k2"), ("orders", None)])  # one bad item refuses the batch
    assert scenario.queued(db, "plain") == plain_before  # no consumer got anything
    assert [k for _, k in queued_keys(db, "daily")] == ["k"]


#: Keys each mapping refuses (AQ011).
BAD_KEYS = [
    (
        assetq.Rollup("hour", "day"),
        [
            "2026-12-01",
            "2026-12-01T24",
            "2026-12-01T5",
            "2026-12-01T05:30",
            "2026-12-01T05:00:01",
            "2026-12-01T05+01:00",
            "2026-12-01T05-05:00",
            "2026-13-01T05",
            "2026-02-29T05",
            "2026-12-32T00",
            "2026-12-01 05",
            "2026-12-01t05",
            "2026-12-01T05z",
            "2026-12-01T05\n",
            "2026-12-01T05 ",
            "yesterday",
        ],
    ),
    (
        assetq.Rollup("day", "week", require="any"),
        ["2026-12-01T05", "2026-W49", "2026-02-29", "2026-1-01", "20261201", "2026-00-10"],
    ),
    (
        assetq.Rollup("day", "month"),
        ["2026-12", "2026-04-31", "2026-12-01T00", " 2026-12-01", "2026-12-01Z", "2026-12-01\n"],
    ),
    (assetq.StaticPartitions(REGIONS), ["eu-west-2", "EU-WEST-1", "eu", "eu-west-1 "]),
]


def test_a_key_its_mapping_cannot_map_is_refused_and_nothing_is_written(
    db: TestDatabase,
) -> None:
    accepted: list[tuple[int, str]] = []
    for n, (mapping, bad_keys) in enumerate(BAD_KEYS):
        scenario.declare(db, f"mapped_{n}", f"src_{n}", partitioned={f"src_{n}": mapping})
        scenario.declare(db, f"plain_{n}", f"src_{n}")
        accepted += [(n, key) for key in bad_keys if _accepted(db, [(f"src_{n}", key)])]
        assert scenario.queued(db, f"plain_{n}") == []
    assert accepted == [], accepted
    assert db.scalar("SELECT count(*) FROM {ns}.asset_event") == 0


def test_a_plain_insert_into_the_event_table_is_mapped_or_refused_the_same_way(
    db: TestDatabase,
) -> None:
    """I1: the fan-out is the table's trigger, whoever inserts. A raw INSERT with a key the
    mapping takes is queued under its key; one without a key, or with a bad one, fails and
    leaves nothing."""
    scenario.declare(db, "daily", "clicks", partitioned={"clicks": assetq.Rollup("hour", "day")})
    scenario.declare(db, "plain", "clicks")
    asset_id = db.scalar("SELECT id FROM {ns}.asset WHERE name = 'clicks'")
    insert = "INSERT INTO {ns}.asset_event (asset_id, partition_key) VALUES (:a, :k)"
    for bad in (None, "2026-12-01"):
        before = everything(db)
        with pytest.raises(sa.exc.DBAPIError) as info:
            db.execute(insert, a=asset_id, k=bad)
        assert db.dialect.translate(info.value).code == "AQ011", bad
        assert everything(db) == before
    for hour in HOURS:
        db.execute(insert, a=asset_id, k=hour)
    runs = assetq.schedule(db.engine)
    assert sorted((r.dag_id, r.partition_key, len(r.event_ids)) for r in runs) == [
        ("daily", DAY, 24),
        ("plain", None, 24),
    ]


def test_keys_that_differ_only_in_case_are_different_keys_and_a_trailing_space_is_refused(
    db: TestDatabase,
) -> None:
    """A key is a string compared exactly, on every engine: case-insensitive collations must
    not merge keys, nor their generations. MySQL's binary collation is PAD SPACE ("k " equals
    "k"), so a key ending with a space is refused everywhere (AQ002 before anything is sent;
    AQ011 from the fan-out for a raw INSERT) rather than meaning one key on MySQL and two on
    PostgreSQL."""
    scenario.declare(db, "daily", "orders", partitioned=True)
    keys = ["k", "K"]
    events = reg(db, *[("orders", k) for k in keys])
    runs = by_key(assetq.schedule(db.engine))
    assert {k: r.event_ids for k, r in runs.items()} == {
        k: (e.id,) for k, e in zip(keys, events, strict=True)
    }
    assert sorted(generations(db, "daily")) == [("K", 1), ("k", 1)]
    before = everything(db)
    with pytest.raises(assetq.InvalidArgument) as refused:
        reg(db, ("orders", "k "))
    assert refused.value.code == "AQ002"
    asset_id = db.scalar("SELECT id FROM {ns}.asset WHERE name = 'orders'")
    with pytest.raises(sa.exc.DBAPIError) as raw:
        db.execute(
            "INSERT INTO {ns}.asset_event (asset_id, partition_key) VALUES (:a, 'k ')", a=asset_id
        )
    assert db.dialect.translate(raw.value).code == "AQ011"
    assert everything(db) == before


def test_a_partition_key_must_be_1_to_250_characters(db: TestDatabase) -> None:
    scenario.declare(db, "daily", "orders", partitioned=True)
    before = everything(db)
    for bad in ("", "x" * 251):
        with pytest.raises(assetq.InvalidArgument):
            reg(db, ("orders", bad))
    assert everything(db) == before
    (ok,) = reg(db, ("orders", "x" * 250))
    (run,) = assetq.schedule(db.engine)
    assert run.partition_key == "x" * 250 and run.event_ids == (ok.id,)


def test_an_idempotent_retry_must_repeat_its_partition_key(db: TestDatabase) -> None:
    scenario.declare(db, "daily", "orders", partitioned=True)
    with db.engine.begin() as conn:
        first = assetq.register_event(conn, "orders", partition_key="k", idempotency_key="i")
    with db.engine.begin() as conn:
        again = assetq.register_event(conn, "orders", partition_key="k", idempotency_key="i")
    assert (again.id, again.created) == (first.id, False)
    before = everything(db)
    with pytest.raises(assetq.AssetqError), db.engine.begin() as conn:
        assetq.register_event(conn, "orders", partition_key="other", idempotency_key="i")
    assert everything(db) == before
    (run,) = assetq.schedule(db.engine)
    assert (run.partition_key, run.event_ids) == ("k", (first.id,))


# -- 7. Re-declaring ------------------------------------------------------------------------------


def test_redeclaring_with_another_partitioning_maps_the_queued_events_again(
    db: TestDatabase,
) -> None:
    scenario.declare(db, "report", assetq.all_of("clicks", "orders"), partitioned=True)
    clicks = reg(db, *[("clicks", h) for h in HOURS])
    (orders,) = reg(db, ("orders", DAY))
    assert assetq.schedule(db.engine) == []  # identity: hour keys never meet the day key
    scenario.declare(
        db,
        "report",
        assetq.all_of("clicks", "orders"),
        partitioned={"clicks": assetq.Rollup("hour", "day")},
    )
    (run,) = assetq.schedule(db.engine)
    assert (run.partition_key, run.event_ids) == (DAY, ids([*clicks, orders]))


def test_redeclaring_unpartitioned_consumes_the_queue_as_one_run(db: TestDatabase) -> None:
    scenario.declare(db, "report", assetq.all_of("a", "b"), partitioned=True)
    events = reg(db, ("a", "k1"), ("b", "k2"))
    assert assetq.schedule(db.engine) == []
    scenario.declare(db, "report", assetq.all_of("a", "b"))
    assert partition_rows(db, "report") == []
    (run,) = assetq.schedule(db.engine)
    assert (run.partition_key, run.event_ids) == (None, ids(events))


def test_redeclaring_partitioned_maps_what_an_unpartitioned_consumer_had_queued(
    db: TestDatabase,
) -> None:
    scenario.declare(db, "report", assetq.all_of("a", "b"))
    events = reg(db, ("a", "k1"), ("a", "k2"))
    scenario.declare(db, "report", assetq.all_of("a", "b"), partitioned=True)
    assert [(k, s) for _, _, k, s, _ in partition_rows(db, "report")] == [
        ("k1", "k1"),
        ("k2", "k2"),
    ]
    (b2,) = reg(db, ("b", "k2"))
    (run,) = assetq.schedule(db.engine)
    assert (run.partition_key, run.event_ids) == ("k2", ids([events[1], b2]))


def test_redeclaring_with_a_mapping_a_queued_event_does_not_fit_fails_and_changes_nothing(
    db: TestDatabase,
) -> None:
    scenario.declare(db, "report", assetq.all_of("clicks", "orders"), partitioned=True)
    reg(db, ("clicks", "not-an-hour"), ("clicks", HOURS[0]))
    assert assetq.schedule(db.engine) == []
    before = (everything(db), partition_rows(db))
    before_dag = db.rows("SELECT partitioning FROM {ns}.dag WHERE dag_id = 'report'")
    with pytest.raises(assetq.UnmappablePartition) as info:
        scenario.declare(
            db,
            "report",
            assetq.all_of("clicks", "orders"),
            partitioned={"clicks": assetq.Rollup("hour", "day")},
        )
    assert info.value.code == "AQ011"
    assert (everything(db), partition_rows(db)) == before
    assert db.rows("SELECT partitioning FROM {ns}.dag WHERE dag_id = 'report'") == before_dag
    # Still identity: a key no hour mapping accepts is still taken, and runs by identity.
    reg(db, ("orders", "not-an-hour"))
    (run,) = assetq.schedule(db.engine)
    assert run.partition_key == "not-an-hour"
    # An unpartitioned consumer's queued event without a key fails a partitioned re-declare:
    # first as its producer's unkeyed event (the blast radius, issue 26), and when that is
    # allowed, as a queued event no mapping takes.
    scenario.declare(db, "plain2", "payments")
    reg(db, ("payments", None))
    with pytest.raises(assetq.InvalidArgument, match="1 of asset 'payments' carry none"):
        scenario.declare(db, "plain2", "payments", partitioned=True)
    with pytest.raises(assetq.UnmappablePartition):
        scenario.declare(db, "plain2", "payments", partitioned=True, allow_unkeyed=True)
    assert scenario.queued(db, "plain2") != []
    (plain_run,) = [r for r in assetq.schedule(db.engine) if r.dag_id == "plain2"]
    assert plain_run.partition_key is None


#: How a test sees that another session is held up by a transaction in flight (polled with a
#: deadline, no sleep). PostgreSQL reports the lock wait. MariaDB does not always list the
#: waiting transaction in innodb_trx (seen here: a re-declaration blocked for 30 s in its
#: UPDATE of the dag row, absent from innodb_trx and innodb_lock_waits), so there it is
#: "another session is running a statement" while the producer sits idle in its transaction.
HELD_UP = {
    "postgresql": "SELECT count(*) FROM pg_stat_activity"
    " WHERE datname = current_database() AND wait_event_type = 'Lock'",
    "mysql": "SELECT count(*) FROM information_schema.processlist"
    " WHERE id NOT IN (CONNECTION_ID(), :producer) AND command = 'Query'",
}


def _wait_until_held_up(
    db: TestDatabase, thread: threading.Thread, producer: sa.Connection, deadline: float
) -> None:
    """Until another session is held up by ``producer``'s open transaction; fails if
    ``thread`` ends first or nothing is held up within ``deadline`` seconds."""
    pid = producer.execute(db.engine_sql("backend_id")).scalar_one()
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if db.scalar(HELD_UP[db.engine_name], producer=pid):
            return
        assert thread.is_alive(), "it finished without waiting for the transaction in flight"
    raise AssertionError(f"nothing waited for the producer within {deadline} s")


@pytest.mark.parametrize("isolation", [None, "REPEATABLE READ"], ids=["default", "repeatable"])
def test_redeclaring_while_a_producer_is_in_flight_maps_its_event_too(
    db: TestDatabase, isolation: str | None
) -> None:
    """A producer registers an event for the consumer and holds its transaction open; a
    re-declaration with another mapping (in a transaction that has read something, as any
    caller's may; at the engine's default isolation and at REPEATABLE READ) waits for it,
    then the producer commits. The event the re-declaration
    waited for must be mapped under the new mapping like every other queued event, never
    left in the queue without its key (it would then never be consumed)."""
    scenario.declare(db, "daily", "clicks", partitioned=True)
    (early,) = reg(db, ("clicks", HOURS[1]))
    errors: list[BaseException] = []
    new_mapping = {"clicks": assetq.Rollup("hour", "day", require="any")}

    began = threading.Event()

    def redeclare() -> None:
        try:
            engine = db.engine
            if isolation is not None:
                engine = engine.execution_options(isolation_level=isolation)
            with engine.begin() as conn:
                # The caller's transaction read something first (as declare_dag's own first
                # reads do; this makes the interleaving certain rather than likely).
                conn.execute(sa.text(db.sql("SELECT count(*) FROM {ns}.asset_event"))).all()
                began.set()
                assetq.declare_dag(conn, "daily", "clicks", partitioned=new_mapping)
        except BaseException as exc:
            errors.append(exc)
        finally:
            began.set()

    with db.engine.connect() as producer:
        producer.begin()
        late = assetq.register_event(producer, "clicks", partition_key=HOURS[2])
        thread = threading.Thread(target=redeclare)
        thread.start()
        assert began.wait(timeout=30)
        _wait_until_held_up(db, thread, producer, 30)
        producer.commit()
    thread.join(timeout=60)
    assert not thread.is_alive()
    if isolation is not None and db.engine_name == "postgresql":
        # Above READ COMMITTED PostgreSQL's snapshot predates the producer the lock waited
        # for: the change is refused, nothing changed (MySQL's locking reads see the row).
        (error,) = errors
        assert isinstance(error, assetq.InvalidArgument) and "READ COMMITTED" in str(error)
        runs = by_key(assetq.schedule(db.engine))  # still mapped by identity
        assert {k: r.event_ids for k, r in runs.items()} == {
            HOURS[1]: (early.id,),
            HOURS[2]: (late.id,),
        }
        return
    assert errors == []
    unmapped = db.scalar(
        "SELECT count(*) FROM {ns}.asset_dag_run_queue q WHERE q.target_dag_id = 'daily'"
        " AND NOT EXISTS (SELECT 1 FROM {ns}.asset_partition_queue p"
        " WHERE p.target_dag_id = q.target_dag_id AND p.asset_event_id = q.asset_event_id)"
    )
    assert unmapped == 0, "a queued event of a partitioned consumer has no partition row"
    (run,) = assetq.schedule(db.engine)
    assert (run.partition_key, run.event_ids) == (DAY, ids([early, late]))


def test_redeclaring_with_the_same_partitioning_changes_nothing(db: TestDatabase) -> None:
    partitioned = {
        "clicks": assetq.Rollup("hour", "day"),
        "regions": assetq.StaticPartitions({"r1": DAY, "r2": DAY}),
    }
    condition = assetq.all_of("clicks", "regions")
    scenario.declare(db, "report", condition, partitioned=partitioned)
    reg(db, ("clicks", HOURS[0]), ("regions", "r1"))
    assert assetq.schedule(db.engine) == []  # the rows are now examined
    before = (everything(db), partition_rows(db))
    assert all(examined for *_, examined in before[1])
    scenario.declare(db, "report", condition, partitioned=dict(partitioned))
    assert (everything(db), partition_rows(db)) == before


# -- 8. Outputs, aliases, paused consumers, purge -------------------------------------------------


def test_output_events_inherit_the_runs_partition_key_unless_they_set_one(
    db: TestDatabase,
) -> None:
    scenario.declare(db, "up", "raw", partitioned=True)
    scenario.declare(db, "down", "clean", partitioned=True)
    reg(db, ("raw", DAY))
    assert len(assetq.schedule(db.engine)) == 1
    (claim,) = assetq.claim_runs(db.engine, "w1", dag_ids=["up"])
    assert claim.partition_key == DAY
    with db.engine.begin() as conn:
        info = assetq.complete_run(
            conn,
            claim,
            "success",
            events=[assetq.NewEvent("clean"), assetq.NewEvent("clean", partition_key="other")],
        )
    assert info.partition_key == DAY
    stored = sorted(
        (int(r[0]), r[1])
        for r in db.rows(
            "SELECT id, partition_key FROM {ns}.asset_event WHERE id IN (:a, :b)",
            a=info.output_event_ids[0],
            b=info.output_event_ids[1],
        )
    )
    assert [k for _, k in stored] == [DAY, "other"]
    runs = by_key(assetq.schedule(db.engine))
    assert sorted(runs) == [DAY, "other"]
    assert all(r.dag_id == "down" for r in runs.values())


def test_the_worker_hands_the_key_to_its_handler_and_outputs_keep_it(db: TestDatabase) -> None:
    scenario.declare(db, "up", "raw", partitioned=True)
    scenario.declare(db, "down", "clean", partitioned=True)
    reg(db, ("raw", DAY))
    assert len(assetq.schedule(db.engine)) == 1
    seen: list[str | None] = []

    def handler(claim: assetq.Claim, conn: sa.Connection) -> list[assetq.NewEvent]:
        seen.append(claim.partition_key)
        return [assetq.NewEvent("clean")]

    assetq.run_worker(db.engine, {"up": handler}, worker="w1", max_runs=1, poll_interval=0.2)
    assert seen == [DAY]
    (run,) = assetq.schedule(db.engine)
    assert (run.dag_id, run.partition_key) == ("down", DAY)


def test_the_async_shell_carries_partition_keys_too(db: TestDatabase) -> None:
    from sqlalchemy.ext.asyncio import create_async_engine
    from sqlalchemy.pool import NullPool

    from assetq import aio

    async def scenario_() -> tuple[list[assetq.Run], list[assetq.Claim]]:
        engine = create_async_engine(aio.async_url(db.url), poolclass=NullPool)
        try:
            async with engine.begin() as conn:
                await aio.declare_dag(conn, "daily", "orders", partitioned=True)
                await aio.register_event(conn, "orders", partition_key=DAY)
                await aio.register_events(conn, [assetq.NewEvent("orders", partition_key="d2")])
            runs = await aio.schedule(engine)
            claims = await aio.claim_runs(engine, "w1", limit=10)
            return runs, claims
        finally:
            await engine.dispose()

    runs, claims = asyncio.run(scenario_())
    assert sorted(r.partition_key or "" for r in runs) == [DAY, "d2"]
    assert sorted(c.partition_key or "" for c in claims) == [DAY, "d2"]


def test_a_partitioned_consumer_on_an_alias_maps_its_events_by_identity(
    db: TestDatabase,
) -> None:
    scenario.declare(db, "daily", assetq.all_of("orders", assetq.alias("feed")), partitioned=True)
    with db.engine.begin() as conn:
        assetq.declare_asset(conn, "payments")
        assetq.declare_asset(conn, "shipments")
    with db.engine.begin() as conn:
        via = assetq.register_event(conn, "payments", aliases=["feed"], partition_key="k")
    assert assetq.schedule(db.engine) == []
    (orders,) = reg(db, ("orders", "k"))
    (run,) = assetq.schedule(db.engine)
    assert (run.partition_key, run.event_ids) == ("k", ids([via, orders]))
    # Later events of the resolved asset need keys too; without one, nothing is written
    # (not even a new alias resolution).
    before = everything(db)
    with pytest.raises(assetq.UnmappablePartition), db.engine.begin() as conn:
        assetq.register_event(conn, "payments")
    with pytest.raises(assetq.UnmappablePartition), db.engine.begin() as conn:
        assetq.register_event(conn, "shipments", aliases=["feed"])
    assert everything(db) == before


def test_a_paused_partitioned_consumer_is_queued_nothing_and_takes_keyless_events(
    db: TestDatabase,
) -> None:
    scenario.declare(db, "daily", "orders", partitioned=True, paused=True)
    reg(db, ("orders", None), ("orders", "k"))  # nothing queued for it: no key needed
    assert scenario.queued(db, "daily") == []
    with db.engine.begin() as conn:
        assetq.unpause_dag(conn, "daily")
    assert assetq.schedule(db.engine) == []
    (later,) = reg(db, ("orders", "k"))
    (run,) = assetq.schedule(db.engine)
    assert (run.partition_key, run.event_ids) == ("k", (later.id,))


def test_queue_while_paused_keeps_the_keys_for_the_first_pass_after_unpausing(
    db: TestDatabase,
) -> None:
    scenario.declare(db, "daily", "orders", partitioned=True, paused=True, queue_while_paused=True)
    events = reg(db, ("orders", "k1"), ("orders", "k2"))
    _refused(db, [("orders", None)])  # queued while paused: the key is needed
    assert assetq.schedule(db.engine) == []
    with db.engine.begin() as conn:
        assetq.unpause_dag(conn, "daily")
    runs = by_key(assetq.schedule(db.engine))
    assert {k: r.event_ids for k, r in runs.items()} == {
        "k1": (events[0].id,),
        "k2": (events[1].id,),
    }


def test_purge_keeps_the_events_an_incomplete_key_still_needs(db: TestDatabase) -> None:
    scenario.declare(db, "report", assetq.all_of("a", "b"), partitioned=True)
    reg(db, ("a", "k1"), ("b", "k1"))
    (waiting,) = reg(db, ("a", "k2"))
    finish(db, assetq.schedule(db.engine))
    result = assetq.purge(db.engine, older_than=timedelta(0))
    assert (result.runs_deleted, result.events_deleted) == (1, 2)
    kept = [int(r[0]) for r in db.rows("SELECT id FROM {ns}.asset_event")]
    assert kept == [waiting.id]
    assert [(e, k) for _, e, k, _, _ in partition_rows(db, "report")] == [(waiting.id, "k2")]
    (b2,) = reg(db, ("b", "k2"))
    (run,) = assetq.schedule(db.engine)
    assert (run.partition_key, run.event_ids) == ("k2", ids([waiting, b2]))


def test_a_keys_generation_counts_its_stored_runs_and_restarts_after_a_purge(
    db: TestDatabase,
) -> None:
    """The generation of a key's run is one more than the highest of the key's runs still
    stored (docs/semantics.md §9): the unique (consumer, key, generation) holds among the
    stored runs, and a purge of the key's finished runs restarts it at 1. Keeping it across
    purges would need a row per key ever seen, never pruned, the growth Airflow's partition
    rows have. (This test first asserted generation 2 after the purge; that was not the
    documented design.) The run sequence, which does survive purges, tells the runs apart."""
    scenario.declare(db, "daily", "orders", partitioned=True)
    reg(db, ("orders", "k"))
    (first,) = assetq.schedule(db.engine)
    finish(db, [first])
    reg(db, ("orders", "k"))
    (second,) = assetq.schedule(db.engine)
    assert generations(db, "daily") == [("k", 1), ("k", 2)]
    finish(db, [second])
    assetq.purge(db.engine, older_than=timedelta(0))
    assert generations(db, "daily") == []
    reg(db, ("orders", "k"))
    (third,) = assetq.schedule(db.engine)
    assert generations(db, "daily") == [("k", 1)]
    assert third.seq > second.seq > first.seq


# -- 9. Scale: a pass costs what arrived, never the pending keys ----------------------------------

#: The second backlog of the cost specs; the first has 1,000 pending keys.
PENDING = pytest.mark.parametrize("large", [5_000, pytest.param(100_000, marks=pytest.mark.slow)])


#: The most arrivals one pass of a partitioned consumer evaluates (schedule_partitions).
ARRIVALS_PER_PASS = 1_000


def _pending_keys(db: TestDatabase, start: int, count: int, *, by_passes: bool) -> None:
    """``count`` more keys with an "a" event each and no "b": unsatisfied, pending, and
    examined. ``by_passes``: by scheduler passes until none is left unexamined (a pass
    examines up to ARRIVALS_PER_PASS arrivals), as production gets there; otherwise by setting the
    rows' ``examined`` flag, the state those passes leave (a pass over 5,000 fresh keys
    takes seconds on MariaDB; test_pending_keys_wait_... proves passes get there)."""
    backlog(db, [{"asset": "a", "partition_key": f"k{n:07d}"} for n in range(start, start + count)])
    unexamined = "SELECT count(*) FROM {ns}.asset_partition_queue WHERE examined = false"
    if by_passes:
        for _ in range(count // ARRIVALS_PER_PASS + 3):
            assert assetq.schedule(db.engine) == []
            if not db.scalar(unexamined):
                break
    else:
        db.execute("UPDATE {ns}.asset_partition_queue SET examined = true WHERE examined = false")
    assert db.scalar(unexamined) == 0


def _vacuum(db: TestDatabase) -> None:
    """On PostgreSQL, as test_capped_claim.py does: the measured pass then does not read the
    dead index entries the marking passes left (MVCC's, bounded by what those passes wrote,
    not by the keys pending), and runs with the plans a real backlog gets."""
    if db.dialect.name == "postgresql":
        with db.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            for table in ("asset_partition_queue", "asset_dag_run_queue", "dag_run"):
                conn.execute(sa.text(db.sql(f"VACUUM ANALYZE {{ns}}.{table}")))


_PG_STATS = (
    "SELECT t.relname, coalesce(t.seq_scan, 0), coalesce(t.seq_tup_read, 0),"
    "       coalesce(t.idx_tup_fetch, 0),"
    "       (SELECT coalesce(sum(i.idx_tup_read), 0) FROM pg_stat_user_indexes i"
    "         WHERE i.relid = t.relid)"
    "  FROM pg_stat_user_tables t WHERE t.schemaname = :ns"
)


def _pg_pass_reads(db: TestDatabase, runs: int) -> dict[str, dict[str, int]]:
    """Per assetq table, what one pass read: seq_scan, seq_tup_read, idx_tup_fetch,
    idx_tup_read, from its own connection's statistics (flushed before and after)."""
    with db.engine.connect() as conn:

        def reads() -> dict[str, tuple[int, ...]]:
            conn.execute(sa.text("SELECT pg_stat_force_next_flush()"))
            conn.commit()
            conn.execute(sa.text("SELECT pg_stat_clear_snapshot()"))
            rows = conn.execute(sa.text(_PG_STATS), {"ns": db.namespace}).all()
            conn.commit()
            return {str(r[0]): tuple(int(v) for v in r[1:]) for r in rows}

        before = reads()
        made = conn.execute(sa.text(db.sql("SELECT * FROM {ns}.schedule_pass(100)"))).all()
        conn.commit()
        after = reads()
    assert len(made) == runs, made
    names = ("seq_scan", "seq_tup_read", "idx_tup_fetch", "idx_tup_read")
    return {
        table: {n: a - b for n, a, b in zip(names, after[table], before[table], strict=True)}
        for table in after
    }


def _history(db: TestDatabase, runs: int = 400) -> None:
    """``runs`` runs of consumer "report" already made (keys h0, h1, ...): history, so that
    the planner reads dag_run by index as it does in production, not by a scan of a table
    of a few rows (with 400 runs it does; the pass must never scan history either)."""
    backlog(db, [{"asset": x, "partition_key": f"h{n}"} for n in range(runs) for x in "ab"])
    made = assetq.schedule(db.engine)
    assert len(made) == runs


def _satisfy(db: TestDatabase, n: int) -> None:
    """One arrival: the "b" event that completes pending key n."""
    reg(db, ("b", f"k{n:07d}"))


def _arrive(db: TestDatabase, arrival: str, n: int) -> None:
    """One arrival: "completes" pending key n (a run), or "opens" a new key (no run)."""
    if arrival == "completes":
        _satisfy(db, n)
    else:
        reg(db, ("a", f"new{n}"))


#: What the one arrival before a measured pass does, and the runs that pass then makes.
ARRIVALS = (("opens", 0), ("completes", 1))


@pytest.mark.engines("postgresql")
@PENDING
def test_a_pass_after_one_arrival_reads_the_same_rows_whatever_the_pending_keys(
    db: TestDatabase, large: int
) -> None:
    scenario.declare(db, "report", assetq.all_of("a", "b"), partitioned=True)
    _history(db)
    measured: list[dict[str, dict[str, dict[str, int]]]] = []
    for start, count in ((0, 1_000), (1_000, large - 1_000)):
        _pending_keys(db, start, count, by_passes=False)
        _vacuum(db)
        reads = {}
        for arrival, made in ARRIVALS:
            _arrive(db, arrival, len(measured) + 1)
            reads[arrival] = _pg_pass_reads(db, made)
        measured.append(reads)
    assert db.scalar("SELECT count(*) FROM {ns}.asset_partition_queue") == large
    small, big = measured
    for arrival, _ in ARRIVALS:
        s_reads, b_reads = small[arrival], big[arrival]
        for table in sorted(set(s_reads) | set(b_reads)):
            s, b = s_reads.get(table, {}), b_reads.get(table, {})
            for name in ("seq_tup_read", "idx_tup_read", "idx_tup_fetch"):
                # Equal up to a few entries (index-only scans fetch heap rows from pages the
                # visibility map does not cover yet, which varies with vacuum's timing).
                assert abs(b.get(name, 0) - s.get(name, 0)) <= 3, (arrival, table, name, small, big)
        for reads in (s_reads, b_reads):
            for table in ("asset_partition_queue", "asset_dag_run_queue", "asset_event", "dag_run"):
                got = reads.get(table, {})
                # Read by key only: no scan of the queue, of the pending keys or of history.
                assert got.get("seq_tup_read", 0) == 0, (arrival, table, reads)
                assert got.get("idx_tup_read", 0) <= 20, (arrival, table, reads)


def _handler_reads(conn: sa.Connection) -> dict[str, int]:
    rows = conn.execute(sa.text("SHOW SESSION STATUS LIKE 'Handler_read%'")).all()
    return {str(r[0]): int(r[1]) for r in rows}


def _mysql_pass(db: TestDatabase, conn: sa.Connection) -> list[Any]:
    with conn.begin():
        return list(db.dialect.execute(conn, "schedule_pass", db.namespace, {"limit": 100}))


def _mysql_pass_reads(db: TestDatabase, conn: sa.Connection, runs: int) -> dict[str, int]:
    """Handler_read_* of one pass on ``conn``, SHOW STATUS's own reads taken off (as
    tests/test_capped_claim.py counts them)."""
    with conn.begin():
        first, second = _handler_reads(conn), _handler_reads(conn)
    made = _mysql_pass(db, conn)
    with conn.begin():
        third = _handler_reads(conn)
    assert len(made) == runs, made
    return {k: (third[k] - second[k]) - (second[k] - first[k]) for k in first}


@pytest.mark.engines("mysql")
@PENDING
def test_a_pass_after_one_arrival_reads_the_same_handler_rows_whatever_the_pending_keys(
    db: TestDatabase, large: int
) -> None:
    scenario.declare(db, "report", assetq.all_of("a", "b"), partitioned=True)
    _history(db)
    _pending_keys(db, 0, 1_000, by_passes=False)
    measured: list[dict[str, dict[str, int]]] = []
    with db.engine.connect() as raw:
        conn = raw.execution_options(isolation_level="READ COMMITTED")
        # First passes doing the same work warm the connection's routine cache and the
        # tables' statistics (as in test_capped_claim.py), then the measured ones.
        for arrival, made in ARRIVALS:
            _arrive(db, arrival, 0)
            assert len(_mysql_pass(db, conn)) == made
        for n in (1, 2):
            if n == 2:
                _pending_keys(db, 1_000, large - 1_000, by_passes=False)
            reads = {}
            for arrival, made in ARRIVALS:
                _arrive(db, arrival, n)
                reads[arrival] = _mysql_pass_reads(db, conn, made)
            measured.append(reads)
    assert db.scalar("SELECT count(*) FROM {ns}.asset_partition_queue") == large
    small, big = measured
    for arrival, _ in ARRIVALS:
        for name in small[arrival]:
            assert abs(big[arrival][name] - small[arrival][name]) <= 2, (arrival, name, small, big)
        assert sum(small[arrival].values()) <= 300, small


@pytest.mark.parametrize("pending", [1_000, pytest.param(100_000, marks=pytest.mark.slow)])
def test_pending_keys_wait_without_runs_until_an_arrival_completes_one(
    db: TestDatabase, pending: int
) -> None:
    """Passes examine every arrival (1,000 per pass at most) and leave unsatisfied keys
    pending and examined; a later arrival runs exactly its key."""
    scenario.declare(db, "report", assetq.all_of("a", "b"), partitioned=True)
    _pending_keys(db, 0, pending, by_passes=True)
    assert assetq.schedule(db.engine) == []
    _satisfy(db, 7)
    (run,) = assetq.schedule(db.engine)
    assert run.partition_key == "k0000007" and len(run.event_ids) == 2
    assert db.scalar("SELECT count(*) FROM {ns}.asset_partition_queue") == pending - 1
