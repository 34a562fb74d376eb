"""The scheduler pass: consume by reference (I3), exactly once (I4), conditions (I6)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

import assetq
from dbs import TestDatabase


def _declare(db: TestDatabase, dag_id: str, condition: assetq.Condition, **kw: object) -> None:
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, dag_id, condition, **kw)  # type: ignore[arg-type]


def _register(db: TestDatabase, *assets: str) -> list[assetq.Event]:
    with db.engine.begin() as conn:
        return [assetq.register_event(conn, a) for a in assets]


def _runs_of(runs: list[assetq.Run], dag_id: str) -> list[assetq.Run]:
    return [r for r in runs if r.dag_id == dag_id]


def test_a_run_consumes_exactly_the_queued_events_and_clears_the_queue(db: TestDatabase) -> None:
    _declare(db, "consumer", "orders")
    events = _register(db, "orders", "orders", "orders")
    (run,) = assetq.schedule(db.engine)
    assert run.dag_id == "consumer"
    assert run.event_ids == tuple(e.id for e in events)
    assert run.run_after == max(e.timestamp for e in events)
    assert run.seq == 1
    assert db.links() == [("consumer", e.id) for e in events]
    assert db.scalar("SELECT count(*) FROM {ns}.asset_dag_run_queue") == 0
    state, run_type = db.rows("SELECT state, run_type FROM {ns}.dag_run WHERE id = :i", i=run.id)[0]
    assert (state, run_type) == ("queued", "asset_triggered")


def test_nothing_queued_creates_no_run(db: TestDatabase) -> None:
    _declare(db, "consumer", "orders")
    assert assetq.schedule(db.engine) == []
    assert db.scalar("SELECT count(*) FROM {ns}.dag_run") == 0


def test_every_consumer_of_an_asset_gets_its_own_run(db: TestDatabase) -> None:
    _declare(db, "first", "orders")
    _declare(db, "second", "orders")
    (event,) = _register(db, "orders")
    runs = assetq.schedule(db.engine)
    assert sorted((r.dag_id, r.event_ids) for r in runs) == [
        ("first", (event.id,)),
        ("second", (event.id,)),
    ]


def test_late_commit_is_consumed_by_the_next_run(db: TestDatabase) -> None:
    """The Airflow bug, forced: event A gets its timestamp first but commits after event B
    has committed and after a scheduler pass consumed B. A must not be lost."""
    _declare(db, "consumer", "orders")
    with db.engine.connect() as late, db.engine.connect() as early:
        late.begin()
        event_a = assetq.register_event(late, "orders")  # timestamp taken, not committed
        early.begin()
        event_b = assetq.register_event(early, "orders")
        early.commit()
        assert event_a.timestamp < event_b.timestamp

        (first,) = assetq.schedule(db.engine)
        assert first.event_ids == (event_b.id,)  # A is invisible: uncommitted

        late.commit()  # A commits late, with the older timestamp

    (second,) = assetq.schedule(db.engine)
    assert second.event_ids == (event_a.id,)
    # run_after is the newest consumed timestamp: not monotonic under late commits.
    assert second.run_after < first.run_after
    assert second.seq == first.seq + 1
    assert db.links() == sorted([("consumer", event_a.id), ("consumer", event_b.id)])


def test_event_committed_during_a_pass_stays_for_the_next_pass(db: TestDatabase) -> None:
    """A pass holds a consumer (claimed, not yet committed) while a producer commits."""
    _declare(db, "consumer", "orders")
    (first_event,) = _register(db, "orders")
    pass_sql = db.engine_sql("schedule_pass").bindparams(limit=10)
    with db.engine.connect() as scheduler:
        scheduler = scheduler.execution_options(isolation_level="READ COMMITTED")
        scheduler.begin()
        claimed = scheduler.execute(pass_sql).all()
        assert len(claimed) == 1
        (late_event,) = _register(db, "orders")  # commits while the pass is open
        scheduler.commit()
    assert db.links() == [("consumer", first_event.id)]
    (run,) = assetq.schedule(db.engine)
    assert run.event_ids == (late_event.id,)


def test_second_scheduler_skips_a_consumer_held_by_the_first(db: TestDatabase) -> None:
    _declare(db, "held", "orders")
    _declare(db, "free", "customers")
    _register(db, "orders", "customers")
    with db.engine.connect() as first:
        first = first.execution_options(isolation_level="READ COMMITTED")
        first.begin()
        # Hold only "held": lock its consumer as the pass does, without consuming.
        first.execute(db.engine_sql("lock_consumer"), {"dag_id": "held"}).all()
        runs = assetq.schedule(db.engine)  # must not wait for `first`
        assert [r.dag_id for r in runs] == ["free"]
        first.rollback()
    (run,) = assetq.schedule(db.engine)
    assert run.dag_id == "held"


def test_a_scheduler_holding_a_consumer_does_not_block_its_producers(db: TestDatabase) -> None:
    _declare(db, "consumer", "orders")
    _register(db, "orders")
    pass_sql = db.engine_sql("schedule_pass").bindparams(limit=10)
    with db.engine.connect() as scheduler, db.engine.connect() as producer:
        scheduler = scheduler.execution_options(isolation_level="READ COMMITTED")
        scheduler.begin()
        assert len(scheduler.execute(pass_sql).all()) == 1
        producer.execute(db.engine_sql("lock_timeout_2s"))
        # Raises a lock timeout if the pass's locks block the producer.
        event = assetq.register_event(producer, "orders")
        producer.commit()
        scheduler.commit()
    (run,) = assetq.schedule(db.engine)
    assert run.event_ids == (event.id,)


def test_and_condition_never_fires_early(db: TestDatabase) -> None:
    _declare(db, "consumer", assetq.all_of("orders", "customers", "products"))
    _register(db, "orders", "orders")
    assert assetq.schedule(db.engine) == []
    _register(db, "customers")
    assert assetq.schedule(db.engine) == []
    events = _register(db, "products")
    (run,) = assetq.schedule(db.engine)
    assert len(run.event_ids) == 4
    assert events[0].id in run.event_ids


def test_list_condition_means_all_of(db: TestDatabase) -> None:
    _declare(db, "consumer", ["orders", "customers"])
    _register(db, "orders")
    assert assetq.schedule(db.engine) == []
    _register(db, "customers")
    assert len(assetq.schedule(db.engine)) == 1


def test_or_condition_fires_on_either_asset(db: TestDatabase) -> None:
    _declare(db, "consumer", assetq.any_of("orders", "customers"))
    (a,) = _register(db, "orders")
    (run1,) = assetq.schedule(db.engine)
    (b,) = _register(db, "customers")
    (run2,) = assetq.schedule(db.engine)
    assert (run1.event_ids, run2.event_ids) == ((a.id,), (b.id,))


def test_nested_condition_is_evaluated_on_the_claimed_rows(db: TestDatabase) -> None:
    condition = assetq.any_of(
        assetq.all_of("orders", "customers"), assetq.all_of("products", "prices")
    )
    _declare(db, "consumer", condition)
    _register(db, "orders", "prices")  # one asset of each branch: not satisfied
    assert assetq.schedule(db.engine) == []
    _register(db, "products")  # completes the second branch
    (run,) = assetq.schedule(db.engine)
    assert len(run.event_ids) == 3


def test_redeclaring_replaces_the_condition(db: TestDatabase) -> None:
    _declare(db, "consumer", ["orders", "customers"])
    _register(db, "orders")
    assert assetq.schedule(db.engine) == []
    _declare(db, "consumer", "orders")  # now a single asset suffices
    (run,) = assetq.schedule(db.engine)
    assert len(run.event_ids) == 1
    refs = db.rows(
        "SELECT a.name FROM {ns}.dag_schedule_asset_reference r"
        " JOIN {ns}.asset a ON a.id = r.asset_id WHERE r.dag_id = 'consumer'"
    )
    assert [r.name for r in refs] == ["orders"]


def test_paused_consumer_keeps_its_queue_until_unpaused(db: TestDatabase) -> None:
    _declare(db, "consumer", "orders")
    (event,) = _register(db, "orders")
    with db.engine.begin() as conn:
        assetq.pause_dag(conn, "consumer")
    assert assetq.schedule(db.engine) == []
    with db.engine.begin() as conn:
        assetq.unpause_dag(conn, "consumer")
    (run,) = assetq.schedule(db.engine)
    assert run.event_ids == (event.id,)


def test_limit_bounds_the_consumers_per_pass_and_round_robin_reaches_all(
    db: TestDatabase,
) -> None:
    for n in range(5):
        _declare(db, f"consumer_{n}", f"asset_{n}")
    _register(db, *(f"asset_{n}" for n in range(5)))
    seen: list[str] = []
    for _ in range(5):
        runs = assetq.schedule(db.engine, limit=1)
        assert len(runs) == 1
        seen.append(runs[0].dag_id)
    assert sorted(seen) == [f"consumer_{n}" for n in range(5)]


def test_an_unsatisfiable_consumer_does_not_starve_others(db: TestDatabase) -> None:
    # "aaa_waiting" sorts first and never becomes satisfied; with limit=1 the satisfiable
    # consumer must still get its run within two passes.
    _declare(db, "aaa_waiting", ["orders", "never_produced"])
    _declare(db, "zzz_ready", "customers")
    _register(db, "orders", "customers")
    runs = assetq.schedule(db.engine, limit=1) + assetq.schedule(db.engine, limit=1)
    assert [r.dag_id for r in runs] == ["zzz_ready"]
    # and it keeps rotating: the waiting consumer is examined again afterwards
    _register(db, "customers")
    runs = assetq.schedule(db.engine, limit=1) + assetq.schedule(db.engine, limit=1)
    assert [r.dag_id for r in runs] == ["zzz_ready"]


def test_run_ids_and_sequence_numbers_are_unique_per_consumer(db: TestDatabase) -> None:
    _declare(db, "consumer", "orders")
    runs = []
    for _ in range(3):
        _register(db, "orders")
        runs += assetq.schedule(db.engine)
    assert [r.seq for r in runs] == [1, 2, 3]
    assert len({r.run_id for r in runs}) == 3
    assert all(r.run_id.startswith("asset_triggered__") for r in runs)


def test_link_table_refuses_a_second_link_of_the_same_event_to_a_consumer(
    db: TestDatabase,
) -> None:
    """I4 is enforced by a unique constraint, not only by the pass's locking."""
    _declare(db, "consumer", "orders")
    (event,) = _register(db, "orders")
    (run,) = assetq.schedule(db.engine)
    # a second run of the same consumer, then try to link the same event to it
    _register(db, "orders")
    (run2,) = assetq.schedule(db.engine)
    with pytest.raises(sa.exc.IntegrityError):
        db.execute(
            "INSERT INTO {ns}.dagrun_asset_event (dag_run_id, asset_event_id, dag_id)"
            " VALUES (:r, :e, 'consumer')",
            r=run2.id,
            e=event.id,
        )
    assert run.event_ids == (event.id,)


def test_claim_guard_rolls_back_a_pass_whose_delete_misses_a_claimed_row(
    db: TestDatabase,
) -> None:
    """Sabotage: a trigger on dag_run steals the consumer's queue rows between the claim and
    the delete, as a rogue writer ignoring the consumer lock would. The guard must abort."""
    _declare(db, "consumer", "orders")
    _register(db, "orders")
    before = db.counts()
    if db.dialect.name == "postgresql":
        sabotage = [
            "CREATE FUNCTION {ns}.steal_rows() RETURNS trigger LANGUAGE plpgsql AS $$"
            " BEGIN DELETE FROM {ns}.asset_dag_run_queue WHERE target_dag_id = NEW.dag_id;"
            " RETURN NULL; END $$",
            "CREATE TRIGGER steal_rows AFTER INSERT ON {ns}.dag_run"
            " FOR EACH ROW EXECUTE FUNCTION {ns}.steal_rows()",
        ]
    else:
        sabotage = [
            "CREATE TRIGGER {ns}.steal_rows AFTER INSERT ON {ns}.dag_run FOR EACH ROW"
            " DELETE FROM {ns}.asset_dag_run_queue WHERE target_dag_id = NEW.dag_id"
        ]
    for statement in sabotage:
        db.execute(statement)
    with pytest.raises(assetq.ClaimGuardAbort) as info:
        assetq.schedule(db.engine, max_attempts=2)
    assert info.value.code == "AQ900"
    assert db.counts() == before  # no run, no link, queue intact


def test_a_pass_never_sees_a_half_replaced_condition(db: TestDatabase) -> None:
    """A re-declare holds the consumer until it commits; a pass meanwhile skips the
    consumer instead of evaluating a mix of old and new clauses."""
    _declare(db, "consumer", "orders")
    _register(db, "orders")
    with db.engine.connect() as declaring:
        assetq.declare_dag(declaring, "consumer", ["orders", "customers"])  # not committed
        assert assetq.schedule(db.engine) == []  # old condition holds, but the row is held
        declaring.commit()
    assert assetq.schedule(db.engine) == []  # the new AND is not satisfied
    _register(db, "customers")
    (run,) = assetq.schedule(db.engine)
    assert len(run.event_ids) == 2


def test_a_scheduler_connection_killed_mid_pass_loses_and_duplicates_nothing(
    db: TestDatabase,
) -> None:
    """The pass's transaction dies with its connection; the next pass consumes the rows."""
    _declare(db, "consumer", "orders")
    events = _register(db, "orders", "orders")
    pass_sql = db.engine_sql("schedule_pass").bindparams(limit=10)
    with db.engine.connect() as victim:
        victim = victim.execution_options(isolation_level="READ COMMITTED")
        assert len(victim.execute(pass_sql).all()) == 1  # claimed, not committed
        db.kill(victim)
        with pytest.raises(sa.exc.DBAPIError):
            victim.commit()
    assert db.links() == []
    (run,) = assetq.schedule(db.engine)
    assert run.event_ids == tuple(e.id for e in events)
