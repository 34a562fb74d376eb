"""Scheduling semantics Airflow users rely on (issue 5), on every engine: asset aliases,
references to assets by name or uri, and paused consumers. The rest of issue 5:
test_semantics_runs.py (concurrency cap, events per run, run metadata),
test_semantics_lifecycle.py (deleting and re-declaring under load), test_semantics_read_api.py
and test_semantics_upgrade.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
import sqlalchemy as sa

import assetq
import scenario
from assetq.dialects import dialect_for
from dbs import TestDatabase


def _declare_asset(db: TestDatabase, *names: str) -> None:
    with db.engine.begin() as conn:
        for name in names:
            assetq.declare_asset(conn, name)


# -- 1. Aliases -----------------------------------------------------------------------------


def test_an_event_registered_through_an_alias_reaches_a_consumer_of_the_alias(
    db: TestDatabase,
) -> None:
    scenario.declare(db, "on_alias", assetq.alias("daily"))
    _declare_asset(db, "orders")
    events = scenario.register(db, "orders", aliases=["daily"])
    (run,) = assetq.schedule(db.engine)
    assert (run.dag_id, run.event_ids) == ("on_alias", scenario.ids(events))


def test_an_alias_matches_no_asset_it_has_not_resolved_to(db: TestDatabase) -> None:
    scenario.declare(db, "on_alias", assetq.alias("daily"))
    _declare_asset(db, "orders")
    scenario.register(db, "orders")  # directly: nothing came through "daily" yet
    scenario.register(db, "orders", aliases=["hourly"])  # through another alias
    assert scenario.queued(db, "on_alias") == []
    assert assetq.schedule(db.engine) == []


def test_an_alias_resolves_to_every_asset_registered_through_it_from_then_on(
    db: TestDatabase,
) -> None:
    scenario.declare(db, "on_alias", assetq.alias("daily"))
    _declare_asset(db, "orders", "customers")
    first = scenario.register(db, "orders", "customers", aliases=["daily"])
    (run,) = assetq.schedule(db.engine)
    assert run.event_ids == scenario.ids(first)
    later = scenario.register(db, "orders", "customers")  # directly, without the alias
    (run,) = assetq.schedule(db.engine)
    assert run.event_ids == scenario.ids(later)


def test_an_event_through_an_alias_before_its_consumer_existed_is_not_queued_for_it(
    db: TestDatabase,
) -> None:
    _declare_asset(db, "orders")
    scenario.register(db, "orders", aliases=["daily"])  # resolves daily -> orders; no consumer yet
    scenario.declare(db, "on_alias", assetq.alias("daily"))
    assert scenario.queued(db, "on_alias") == []
    (direct,) = scenario.register(db, "orders")  # the resolution holds for later events
    (run,) = assetq.schedule(db.engine)
    assert (run.dag_id, run.event_ids) == ("on_alias", (direct.id,))


def test_an_alias_inside_all_of_waits_for_the_other_asset(db: TestDatabase) -> None:
    scenario.declare(db, "consumer", assetq.all_of("customers", assetq.alias("daily")))
    _declare_asset(db, "orders")
    (through_alias,) = scenario.register(db, "orders", aliases=["daily"])
    assert assetq.schedule(db.engine) == []
    (customers,) = scenario.register(db, "customers")
    (run,) = assetq.schedule(db.engine)
    assert run.event_ids == (through_alias.id, customers.id)


def test_an_alias_inside_any_of_fires_alone(db: TestDatabase) -> None:
    scenario.declare(db, "consumer", assetq.any_of("customers", assetq.alias("daily")))
    _declare_asset(db, "orders")
    (event,) = scenario.register(db, "orders", aliases=["daily"])
    (run,) = assetq.schedule(db.engine)
    assert run.event_ids == (event.id,)


def test_an_alias_clause_with_no_resolution_is_not_satisfied(db: TestDatabase) -> None:
    """all_of(a, alias x) with only a queued: the empty alias clause must not vanish."""
    scenario.declare(db, "consumer", assetq.all_of("orders", assetq.alias("daily")))
    (event,) = scenario.register(db, "orders")
    assert assetq.schedule(db.engine) == []
    assert scenario.queued(db, "consumer") == [event.id]


def test_an_alias_clause_resolved_to_an_asset_with_nothing_queued_is_not_satisfied(
    db: TestDatabase,
) -> None:
    _declare_asset(db, "customers")
    scenario.register(db, "customers", aliases=["daily"])  # daily -> customers, before the consumer
    scenario.declare(db, "consumer", assetq.all_of("orders", assetq.alias("daily")))
    (event,) = scenario.register(db, "orders")
    assert assetq.schedule(db.engine) == []
    assert scenario.queued(db, "consumer") == [event.id]


def test_an_asset_referenced_directly_and_through_an_alias_is_queued_once(
    db: TestDatabase,
) -> None:
    scenario.declare(db, "consumer", assetq.all_of("orders", assetq.alias("daily")))
    (event,) = scenario.register(db, "orders", aliases=["daily"])
    assert scenario.queued(db, "consumer") == [event.id]
    (run,) = assetq.schedule(db.engine)  # one event hits both clauses
    assert run.event_ids == (event.id,)
    (again,) = scenario.register(db, "orders")  # directly, now that daily resolves to orders
    assert scenario.queued(db, "consumer") == [again.id]


def test_an_event_records_the_aliases_it_came_through(db: TestDatabase) -> None:
    scenario.declare(db, "consumer", "orders")
    (through,) = scenario.register(db, "orders", aliases=["daily", "hourly"])
    (direct,) = scenario.register(db, "orders")
    with db.engine.connect() as conn:
        queued = assetq.queued_events(conn, "consumer")
    assert [(r.id, sorted(r.aliases)) for r in queued] == [
        (through.id, ["daily", "hourly"]),
        (direct.id, []),
    ]
    (run,) = assetq.schedule(db.engine)
    with db.engine.connect() as conn:
        consumed = assetq.consumed_events(conn, "consumer", run.run_id)
    assert [(r.id, sorted(r.aliases)) for r in consumed] == [
        (through.id, ["daily", "hourly"]),
        (direct.id, []),
    ]
    assert all(isinstance(r.aliases, tuple) for r in consumed)


def test_a_batch_registers_each_item_through_its_own_aliases(db: TestDatabase) -> None:
    scenario.declare(db, "on_x", assetq.alias("x"))
    scenario.declare(db, "on_y", assetq.alias("y"))
    _declare_asset(db, "orders", "customers")
    with db.engine.begin() as conn:
        orders, customers = assetq.register_events(
            conn,
            [
                assetq.NewEvent("orders", aliases=("x",)),
                assetq.NewEvent("customers", aliases=["y"]),
            ],
        )
    runs = {r.dag_id: r.event_ids for r in assetq.schedule(db.engine)}
    assert runs == {"on_x": (orders.id,), "on_y": (customers.id,)}


def test_an_idempotent_retry_through_an_alias_records_no_second_alias_row(
    db: TestDatabase,
) -> None:
    scenario.declare(db, "consumer", assetq.alias("daily"))
    _declare_asset(db, "orders")
    with db.engine.begin() as conn:
        first = assetq.register_event(conn, "orders", idempotency_key="k", aliases=["daily"])
    with db.engine.begin() as conn:
        retry = assetq.register_event(conn, "orders", idempotency_key="k", aliases=["daily"])
    assert (retry.id, retry.created) == (first.id, False)
    assert db.scalar("SELECT count(*) FROM {ns}.asset_event_alias") == 1
    assert scenario.queued(db, "consumer") == [first.id]


#: Alias lists register_events refuses (AQ002), by what is wrong with them. Python refuses
#: the first three before sending anything; the database refuses all of them.
BAD_ALIASES: dict[str, object] = {
    "empty name": [""],
    "name too long": ["x" * 513],
    "too many": [f"a{n}" for n in range(101)],
    "empty list": [],
    "not a list": "daily",
    "not a string": [1],
}


def test_bad_aliases_are_refused_and_nothing_is_written(db: TestDatabase) -> None:
    scenario.declare(db, "consumer", "orders")
    before = db.counts()
    for case in ("empty name", "name too long", "too many"):
        aliases: Any = BAD_ALIASES[case]
        with pytest.raises(assetq.InvalidArgument), db.engine.begin() as conn:
            assetq.register_event(conn, "orders", aliases=aliases)
        assert db.counts() == before, case


def test_the_routine_itself_refuses_bad_aliases(db: TestDatabase) -> None:
    """A caller that bypasses the Python checks gets AQ002 from the database."""
    scenario.declare(db, "consumer", "orders")
    before = db.counts()
    for case, aliases in BAD_ALIASES.items():
        payload = json.dumps([{"asset": "orders", "aliases": aliases}])
        with pytest.raises(sa.exc.DBAPIError) as info, db.engine.begin() as conn:
            dialect_for(conn).execute(conn, "register_events", db.namespace, {"events": payload})
        assert db.dialect.translate(info.value).code == "AQ002", case
        assert db.counts() == before, case


# -- 2. References by name or uri -----------------------------------------------------------


def test_a_consumer_on_a_uri_gets_the_events_of_the_asset_declared_later_with_it(
    db: TestDatabase,
) -> None:
    scenario.declare(db, "consumer", assetq.asset_uri("s3://b/k"))
    with db.engine.begin() as conn:
        asset_id = assetq.declare_asset(conn, "k", uri="s3://b/k")
    (event,) = scenario.register(db, "k")
    (run,) = assetq.schedule(db.engine)
    assert (run.dag_id, run.event_ids) == ("consumer", (event.id,))
    # The placeholder the reference created was adopted, not duplicated.
    (row,) = db.rows("SELECT id, name, uri, declared FROM {ns}.asset")
    assert (row.id, row.name, row.uri, bool(row.declared)) == (asset_id, "k", "s3://b/k", True)


def test_a_consumer_on_a_uri_gets_the_first_event_registered_by_that_uri(
    db: TestDatabase,
) -> None:
    scenario.declare(db, "consumer", assetq.asset_uri("s3://b/k"))
    (event,) = scenario.register(db, "s3://b/k")  # no producer declared anything
    (run,) = assetq.schedule(db.engine)
    assert run.event_ids == (event.id,)
    assert not db.scalar("SELECT declared FROM {ns}.asset")


def test_a_consumer_on_a_plain_uri_string_follows_the_asset_declared_with_it(
    db: TestDatabase,
) -> None:
    scenario.declare(db, "consumer", "s3://b/k")  # creates an undeclared asset named by the uri
    with db.engine.begin() as conn:
        assetq.declare_asset(conn, "k", uri="s3://b/k")
    (event,) = scenario.register(db, "k")
    (run,) = assetq.schedule(db.engine)
    assert run.event_ids == (event.id,)
    assert db.scalar("SELECT count(*) FROM {ns}.asset") == 1


def test_a_consumer_on_a_name_gets_the_first_event_of_that_asset(db: TestDatabase) -> None:
    scenario.declare(db, "consumer", assetq.asset_name("orders"))
    with db.engine.begin() as conn:
        assetq.declare_asset(conn, "orders", uri="s3://b/orders")
    (event,) = scenario.register(db, "s3://b/orders")  # the producer registers by uri
    (run,) = assetq.schedule(db.engine)
    assert run.event_ids == (event.id,)


def test_a_name_reference_never_matches_an_asset_by_its_uri(db: TestDatabase) -> None:
    with db.engine.begin() as conn:
        assetq.declare_asset(conn, "k", uri="s3://b/k")
    scenario.declare(db, "plain", "s3://b/k")  # a plain string: name, else uri -> asset k
    scenario.declare(db, "by_name", assetq.asset_name("s3://b/k"))  # only an asset named so
    (event,) = scenario.register(db, "k")
    runs = assetq.schedule(db.engine)
    assert [(r.dag_id, r.event_ids) for r in runs] == [("plain", (event.id,))]
    assert scenario.queued(db, "by_name") == []


def test_declaring_an_asset_with_a_uri_of_another_asset_is_refused(db: TestDatabase) -> None:
    with db.engine.begin() as conn:
        assetq.declare_asset(conn, "k", uri="s3://b/k")
        assetq.declare_asset(conn, "other")
    before = db.counts(), db.rows("SELECT id, name, uri FROM {ns}.asset ORDER BY id")
    with pytest.raises(assetq.InvalidArgument) as info, db.engine.begin() as conn:
        assetq.declare_asset(conn, "other", uri="s3://b/k")
    assert info.value.code == "AQ002"
    assert "already belongs" in str(info.value)
    assert (db.counts(), db.rows("SELECT id, name, uri FROM {ns}.asset ORDER BY id")) == before


def test_declaring_a_new_asset_with_the_uri_of_a_declared_asset_is_refused(
    db: TestDatabase,
) -> None:
    with db.engine.begin() as conn:
        assetq.declare_asset(conn, "k", uri="s3://b/k")
    before = db.counts()
    with pytest.raises(assetq.InvalidArgument), db.engine.begin() as conn:
        assetq.declare_asset(conn, "fresh", uri="s3://b/k")
    assert db.counts() == before


# -- 3. Paused consumers --------------------------------------------------------------------


def test_a_paused_consumer_gets_nothing_queued_and_unpausing_replays_nothing(
    db: TestDatabase,
) -> None:
    scenario.declare(db, "consumer", "orders", paused=True)
    scenario.register(db, "orders", "orders")
    assert scenario.queued(db, "consumer") == []
    with db.engine.begin() as conn:
        assetq.unpause_dag(conn, "consumer")
    assert assetq.schedule(db.engine) == []
    (later,) = scenario.register(db, "orders")
    (run,) = assetq.schedule(db.engine)
    assert run.event_ids == (later.id,)


def test_queue_while_paused_keeps_the_events_for_the_first_pass_after_unpausing(
    db: TestDatabase,
) -> None:
    scenario.declare(db, "consumer", "orders", paused=True, queue_while_paused=True)
    events = scenario.register(db, "orders", "orders", "orders")
    assert scenario.queued(db, "consumer") == list(scenario.ids(events))
    assert assetq.schedule(db.engine) == []  # no run while paused
    assert scenario.queued(db, "consumer") == list(scenario.ids(events))
    with db.engine.begin() as conn:
        assetq.unpause_dag(conn, "consumer")
    (run,) = assetq.schedule(db.engine)
    assert run.event_ids == scenario.ids(events)


def test_redeclaring_drops_queued_events_of_assets_no_longer_depended_on(
    db: TestDatabase,
) -> None:
    scenario.declare(db, "consumer", assetq.all_of("a", "b", "c"))
    scenario.declare(db, "other", "b")
    a1, b1 = scenario.register(db, "a", "b")
    with db.engine.connect() as conn:  # a re-declare that rolls back drops nothing
        assetq.declare_dag(conn, "consumer", assetq.all_of("a", "c"))
        conn.rollback()
    assert scenario.queued(db, "consumer") == [a1.id, b1.id]
    scenario.declare(db, "consumer", assetq.all_of("a", "c"))
    assert scenario.queued(db, "consumer") == [a1.id]
    assert scenario.queued(db, "other") == [b1.id]  # another consumer of b keeps its row
    (c1,) = scenario.register(db, "c")
    runs = {r.dag_id: r.event_ids for r in assetq.schedule(db.engine)}
    assert runs == {"consumer": (a1.id, c1.id), "other": (b1.id,)}


def test_redeclaring_keeps_queued_events_of_an_asset_still_reached_through_an_alias(
    db: TestDatabase,
) -> None:
    scenario.declare(db, "consumer", assetq.all_of("a", "b", "c"))
    (b1,) = scenario.register(db, "b", aliases=["x"])  # x resolves to b
    scenario.declare(db, "consumer", assetq.all_of("a", assetq.alias("x"), "c"))
    assert scenario.queued(db, "consumer") == [b1.id]
    a1, c1 = scenario.register(db, "a", "c")
    (run,) = assetq.schedule(db.engine)
    assert run.event_ids == (b1.id, a1.id, c1.id)
