"""The link table without foreign keys (since development revision 0012_link_checks): what its
two keys guaranteed still holds, proven instead of checked per row.

dagrun_asset_event had a foreign key to asset_event and one to dag_run, both ON DELETE
CASCADE; their checks were most of the cost of a pass over a large backlog. Now the pass
writes links only with their run, for the events of queue rows it deletes, and every routine
that deletes runs or events deletes their links itself. Proven on both engines: after every
kind of pass (whole, capped, partitioned) and every deleting routine (purge_runs,
purge_events, delete_dag, delete_asset) and a re-declaration, no link lacks its run or its
event, and each routine removed exactly the links it should; and with a forced interleaving
(a pass that has consumed the events holds its transaction open while the deleting routine
runs on another connection, then commits), no link is orphaned and no event is consumed
twice, whichever way the race goes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

import assetq
import races
import scenario
from dbs import TestDatabase

#: Links whose run or event is gone: what the two foreign keys forbade.
ORPHANS = {
    "link without its run": "SELECT count(*) FROM {ns}.dagrun_asset_event l"
    " WHERE NOT EXISTS (SELECT 1 FROM {ns}.dag_run r"
    " WHERE r.id = l.dag_run_id AND r.dag_id = l.dag_id)",
    "link without its event": "SELECT count(*) FROM {ns}.dagrun_asset_event l"
    " WHERE NOT EXISTS (SELECT 1 FROM {ns}.asset_event e WHERE e.id = l.asset_event_id)",
}

NOW = timedelta(0)


def _orphans(db: TestDatabase) -> dict[str, int]:
    found = {what: int(db.scalar(sql)) for what, sql in ORPHANS.items()}
    return {what: n for what, n in found.items() if n}


def _links(db: TestDatabase, where: str = "1 = 1", **params: Any) -> int:
    statement = f"SELECT count(*) FROM {{ns}}.dagrun_asset_event l WHERE {where}"
    return int(db.scalar(statement, **params))


def _links_of_asset(db: TestDatabase, asset: str) -> int:
    return int(
        db.scalar(
            "SELECT count(*) FROM {ns}.dagrun_asset_event l"
            " JOIN {ns}.asset_event e ON e.id = l.asset_event_id"
            " JOIN {ns}.asset a ON a.id = e.asset_id WHERE a.name = :a",
            a=asset,
        )
    )


def _at_most_once(db: TestDatabase) -> None:
    """Every (consumer, event) linked at most once, and never both linked and still queued."""
    twice = db.scalar(
        "SELECT count(*) FROM (SELECT l.dag_id, l.asset_event_id FROM {ns}.dagrun_asset_event l"
        " GROUP BY l.dag_id, l.asset_event_id HAVING count(*) > 1) x"
    )
    both = db.scalar(
        "SELECT count(*) FROM {ns}.dagrun_asset_event l JOIN {ns}.asset_dag_run_queue q"
        " ON q.target_dag_id = l.dag_id AND q.asset_event_id = l.asset_event_id"
    )
    assert (twice, both) == (0, 0)


def _drain(db: TestDatabase) -> list[assetq.Run]:
    runs: list[assetq.Run] = []
    for _ in range(100):
        made = assetq.schedule(db.engine)
        if not made:
            return runs
        runs += made
    raise AssertionError("the scheduler never ran out of runs to create")


def _finish(db: TestDatabase, runs: list[assetq.Run]) -> None:
    with db.engine.begin() as conn:
        for run in runs:
            assetq.set_run_state(conn, run.dag_id, run.run_id, "success")


def _assets(db: TestDatabase, *names: str) -> None:
    """Assets only alias consumers get events of (no condition names them)."""
    with db.engine.begin() as conn:
        for name in names:
            assetq.declare_asset(conn, name)


def _history(db: TestDatabase) -> list[assetq.Run]:
    """Runs of every kind of pass, with their links: a whole-queue consumer, a capped one
    (several runs per pass), a partitioned one and an alias consumer fed by two assets."""
    _assets(db, "feed", "other")
    scenario.declare(db, "whole", "orders")
    scenario.declare(db, "capped", "orders", max_events_per_run=2)
    scenario.declare(db, "parted", "hourly", partitioned=True)
    scenario.declare(db, "on_alias", assetq.alias("daily"))
    with db.engine.begin() as conn:
        assetq.register_events(conn, [{"asset": "orders"}] * 5)
        assetq.register_events(
            conn, [assetq.NewEvent("hourly", partition_key=k) for k in ("a", "a", "b")]
        )
        assetq.register_events(
            conn,
            [assetq.NewEvent("feed", aliases=("daily",))] * 3
            + [assetq.NewEvent("other", aliases=("daily",))] * 2,
        )
    runs = _drain(db)
    by_dag = sorted((r.dag_id, len(r.event_ids)) for r in runs)
    assert by_dag == [
        ("capped", 1),
        ("capped", 2),
        ("capped", 2),
        ("on_alias", 5),
        ("parted", 1),
        ("parted", 2),
        ("whole", 5),
    ]
    return runs


# -- alone: no orphan, and exactly the links each routine should remove ----------------------


def test_whole_capped_and_partitioned_passes_link_only_existing_runs_and_events(
    db: TestDatabase,
) -> None:
    runs = _history(db)
    assert _links(db) == sum(len(r.event_ids) for r in runs) == 18
    for run in runs:
        assert _links(db, "l.dag_run_id = :r AND l.dag_id = :d", r=run.id, d=run.dag_id) == len(
            run.event_ids
        )
    assert _orphans(db) == {}
    _at_most_once(db)


def test_purge_runs_deletes_exactly_the_links_of_the_runs_it_deletes(db: TestDatabase) -> None:
    runs = _history(db)
    kept = [r for r in runs if r.dag_id == "capped"]  # still queued: never purged
    _finish(db, [r for r in runs if r.dag_id != "capped"])
    kept_links = sum(len(r.event_ids) for r in kept)
    result = assetq.purge(db.engine, older_than=NOW)
    assert result.runs_deleted == len(runs) - len(kept)
    assert _links(db) == kept_links == 5
    for run in kept:
        assert _links(db, "l.dag_run_id = :r", r=run.id) == len(run.event_ids)
    # purge_events kept exactly the events a kept run consumed.
    assert db.scalar("SELECT count(*) FROM {ns}.asset_event") == kept_links
    assert _orphans(db) == {}


def test_delete_dag_deletes_exactly_its_links(db: TestDatabase) -> None:
    _history(db)
    others = _links(db, "l.dag_id <> 'capped'")
    assert _links(db, "l.dag_id = 'capped'") == 5
    with db.engine.begin() as conn:
        assetq.delete_dag(conn, "capped")
    assert _links(db, "l.dag_id = 'capped'") == 0
    assert _links(db) == others
    assert db.scalar("SELECT count(*) FROM {ns}.dag_run WHERE dag_id = 'capped'") == 0
    assert _orphans(db) == {}


def test_delete_asset_deletes_exactly_the_links_of_its_events(db: TestDatabase) -> None:
    _history(db)
    total = _links(db)
    assert (_links_of_asset(db, "feed"), _links_of_asset(db, "other")) == (3, 2)
    with db.engine.begin() as conn:
        assert assetq.delete_asset(conn, "feed") == 3
    assert _links(db) == total - 3
    assert _links_of_asset(db, "other") == 2
    # The run that consumed them keeps its other events (and its event_count).
    assert db.scalar("SELECT event_count FROM {ns}.dag_run WHERE dag_id = 'on_alias'") == 5
    assert _orphans(db) == {}


def test_purge_events_deletes_no_linked_event(db: TestDatabase) -> None:
    """Runs kept, events purged: purge_events finds every event linked and deletes none."""
    _history(db)
    total = _links(db)
    result = assetq.purge(db.engine, older_than=NOW)  # no run is finished: none goes
    assert (result.runs_deleted, result.events_deleted) == (0, 0)
    assert _links(db) == total
    assert _orphans(db) == {}


def test_a_redeclaration_keeps_every_link(db: TestDatabase) -> None:
    _history(db)
    total = _links(db)
    scenario.declare(db, "whole", "payments")  # drops the reference to orders
    scenario.declare(db, "parted", "hourly")  # no longer partitioned
    assert _links(db) == total
    assert _orphans(db) == {}


# -- a deleting routine racing an open pass that consumed the same events ---------------------


def _raced(db: TestDatabase, deleting: Callable[[], Any]) -> tuple[list[Any], str, Any]:
    """A pass consumes everything queued and holds its transaction open; ``deleting`` runs on
    another connection meanwhile; then the pass commits. Returns the pass's rows, whether the
    deleting routine waited for the pass, and its result."""
    with db.engine.connect() as conn:
        conn = conn.execution_options(isolation_level="READ COMMITTED")
        conn.begin()
        made = list(db.dialect.execute(conn, "schedule_pass", db.namespace, {"limit": 100}))
        assert made
        thread, outcome = races.in_thread(deleting)
        how = races.blocked_or_done(db, thread)
        conn.commit()
    thread.join(30)
    assert not thread.is_alive()
    if outcome.error is not None:
        raise outcome.error
    return made, how, outcome.value


def test_delete_dag_racing_an_open_pass_leaves_no_orphan(db: TestDatabase) -> None:
    scenario.declare(db, "report", "orders")
    scenario.declare(db, "keeper", "orders")
    scenario.register(db, "orders", "orders", "orders")

    def delete() -> None:
        with db.engine.begin() as conn:
            assetq.delete_dag(conn, "report")

    made, how, _ = _raced(db, delete)
    assert sorted(str(r.dag_id) for r in made) == ["keeper", "report"]
    assert how == "blocked"  # it waited for the pass holding the consumer
    assert _links(db, "l.dag_id = 'report'") == 0
    assert _links(db, "l.dag_id = 'keeper'") == 3
    assert _orphans(db) == {}
    _at_most_once(db)


def test_delete_asset_racing_an_open_pass_leaves_no_orphan(db: TestDatabase) -> None:
    scenario.declare(db, "on_alias", assetq.alias("daily"))
    _assets(db, "feed", "other")
    scenario.register(db, "feed", "feed", aliases=("daily",))
    scenario.register(db, "other", aliases=("daily",))

    def delete() -> int:
        with db.engine.begin() as conn:
            return assetq.delete_asset(conn, "feed")

    made, how, deleted = _raced(db, delete)
    assert len(made) == 1 and len(_event_ids(made[0])) == 3
    assert how == "blocked"  # it waited for the pass holding the asset's queue rows
    assert deleted == 2
    assert _links_of_asset(db, "other") == 1
    assert _links(db) == 1
    assert _orphans(db) == {}
    _at_most_once(db)


def test_a_pass_racing_an_open_delete_asset_links_nothing_of_it(db: TestDatabase) -> None:
    """The other order: delete_asset holds its transaction open; a pass that claims the
    asset's queue rows waits for it, deletes fewer than it claimed and is rolled back by the
    claim guard; its retry finds only what is left."""
    scenario.declare(db, "on_alias", assetq.alias("daily"))
    _assets(db, "feed", "other")
    scenario.register(db, "feed", "feed", aliases=("daily",))
    with db.engine.connect() as conn:
        conn.begin()
        assert assetq.delete_asset(conn, "feed") == 2
        thread, outcome = races.in_thread(lambda: assetq.schedule(db.engine))
        races.blocked_or_done(db, thread)
        conn.commit()
    thread.join(30)
    assert not thread.is_alive()
    if outcome.error is not None:
        raise outcome.error
    assert outcome.value == []
    assert _links(db) == 0
    assert _orphans(db) == {}


def test_purge_racing_an_open_pass_leaves_no_orphan_and_keeps_what_it_consumes(
    db: TestDatabase,
) -> None:
    """The open pass consumes old events (purge_events must keep them: their queue rows are
    still there for it) and purge_runs deletes the consumer's older finished runs."""
    scenario.declare(db, "report", "orders")
    scenario.register(db, "orders", "orders")
    _finish(db, _drain(db))
    scenario.register(db, "orders", "orders", "orders")
    ts = f"{db.dialect.quote}timestamp{db.dialect.quote}"  # a keyword
    db.execute(f"UPDATE {{ns}}.asset_event SET {ts} = {ts} - INTERVAL '48' HOUR")
    db.execute("UPDATE {ns}.dag_run SET created_at = created_at - INTERVAL '48' HOUR")

    def purge() -> assetq.PurgeResult:
        return assetq.purge(db.engine, older_than=timedelta(hours=1))

    made, how, result = _raced(db, purge)
    assert len(made) == 1 and len(_event_ids(made[0])) == 3
    assert how == "done"  # purge never waits for a scheduler
    assert (result.runs_deleted, result.events_deleted) == (1, 2)
    assert _links(db) == 3
    assert db.scalar("SELECT count(*) FROM {ns}.asset_event") == 3
    assert _orphans(db) == {}
    _at_most_once(db)


def _event_ids(row: Any) -> list[int]:
    value = row.event_ids
    if isinstance(value, str):  # MySQL: a JSON array
        return [int(v) for v in json.loads(value)]
    return [int(v) for v in value]


def test_the_link_table_has_no_foreign_key_and_keeps_its_unique_key(db: TestDatabase) -> None:
    """What 0012_link_checks changed, and what it kept (I4's unique key), in the shape
    0014_link_keys gave it: event first, serving lookups by event, with no event index."""
    inspector = sa.inspect(db.engine)
    table, schema = "dagrun_asset_event", db.namespace
    assert inspector.get_foreign_keys(table, schema=schema) == []
    uniques = {
        u["name"]: list(u["column_names"])
        for u in inspector.get_unique_constraints(table, schema=schema)
    }
    indexes = {i["name"]: i for i in inspector.get_indexes(table, schema=schema)}
    assert uniques["dagrun_asset_event_once"] == ["asset_event_id", "dag_id"]
    assert "dagrun_asset_event_event_idx" not in indexes
    # No other index by event alone: the unique key serves those lookups.
    assert [n for n, i in indexes.items() if list(i["column_names"]) == ["asset_event_id"]] == []


def test_the_turned_unique_key_refuses_a_second_link_of_an_event_to_a_consumer(
    db: TestDatabase,
) -> None:
    """I4 stays enforced by the database with the key event first (0014_link_keys): a raw
    duplicate (dag_id, asset_event_id) under another run is refused, naming the key, while
    the same event linked to another consumer is accepted."""
    db.execute(
        "INSERT INTO {ns}.dagrun_asset_event (dag_run_id, asset_event_id, dag_id)"
        " VALUES (1, 7, 'consumer'), (2, 7, 'other')"
    )
    with pytest.raises(sa.exc.IntegrityError, match="dagrun_asset_event_once"):
        db.execute(
            "INSERT INTO {ns}.dagrun_asset_event (dag_run_id, asset_event_id, dag_id)"
            " VALUES (3, 7, 'consumer')"
        )
    assert db.scalar("SELECT count(*) FROM {ns}.dagrun_asset_event") == 2
