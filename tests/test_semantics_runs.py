"""Issue 5, runs: the concurrency cap (max_active_runs) and run states, events per run
(max_events_per_run), and run metadata (triggering event, event count, seq, run_after)."""

from __future__ import annotations

import random
from itertools import pairwise
from typing import Any

import pytest
import sqlalchemy as sa

import assetq
import scenario
from assetq.dialects import dialect_for
from dbs import TestDatabase


def _drain(db: TestDatabase) -> list[assetq.Run]:
    """Schedule until a pass creates nothing; every run created, in seq order per consumer."""
    runs: list[assetq.Run] = []
    for _ in range(1000):
        created = assetq.schedule(db.engine)
        if not created:
            return sorted(runs, key=lambda r: (r.dag_id, r.seq))
        runs += created
    raise AssertionError("the scheduler never ran out of runs to create")


def _set_state(db: TestDatabase, run: assetq.Run, state: str) -> assetq.Run:
    with db.engine.begin() as conn:
        return assetq.set_run_state(conn, run.dag_id, run.run_id, state)


def _get_run(db: TestDatabase, dag_id: str, run_id: str) -> assetq.Run:
    with db.engine.connect() as conn:
        return assetq.get_run(conn, dag_id, run_id)


# -- 4. Concurrency cap and run states ------------------------------------------------------


def test_a_consumer_at_its_cap_gets_no_run_and_keeps_its_queue_whole(db: TestDatabase) -> None:
    scenario.declare(db, "consumer", "orders", max_active_runs=1)
    scenario.register(db, "orders")
    (first,) = assetq.schedule(db.engine)
    assert first.state == "queued"
    backlog = scenario.ids(scenario.register(db, "orders", "orders"))

    def queued_via_api() -> tuple[int, ...]:
        with db.engine.connect() as conn:
            return tuple(r.id for r in assetq.queued_events(conn, "consumer"))

    assert assetq.schedule(db.engine) == []  # the first run is queued: at the cap
    assert queued_via_api() == backlog
    status = db.rows(
        "SELECT max_active_runs, active_runs FROM {ns}.dag_queue_status WHERE dag_id = :d",
        d="consumer",
    )
    assert [tuple(r) for r in status] == [(1, 1)]
    _set_state(db, first, "running")
    assert assetq.schedule(db.engine) == []  # running: still at the cap
    assert queued_via_api() == backlog
    _set_state(db, first, "success")
    (second,) = assetq.schedule(db.engine)  # the whole backlog, in one run
    assert (second.seq, second.event_ids) == (2, backlog)
    assert queued_via_api() == ()


def test_a_failed_run_frees_its_slot_too(db: TestDatabase) -> None:
    scenario.declare(db, "consumer", "orders", max_active_runs=1)
    scenario.register(db, "orders")
    (first,) = assetq.schedule(db.engine)
    (event,) = scenario.register(db, "orders")
    assert assetq.schedule(db.engine) == []
    _set_state(db, first, "failed")
    (second,) = assetq.schedule(db.engine)
    assert second.event_ids == (event.id,)


def test_redeclaring_without_a_cap_lifts_it(db: TestDatabase) -> None:
    scenario.declare(db, "consumer", "orders", max_active_runs=1, max_events_per_run=1)
    scenario.register(db, "orders")
    assert len(assetq.schedule(db.engine)) == 1
    backlog = scenario.ids(scenario.register(db, "orders", "orders"))
    assert assetq.schedule(db.engine) == []  # at the cap
    scenario.declare(db, "consumer", "orders")  # every option is replaced: no caps now
    (run,) = assetq.schedule(db.engine)
    assert run.event_ids == backlog


def test_the_cap_counts_queued_and_running_runs(db: TestDatabase) -> None:
    scenario.declare(db, "consumer", "orders", max_active_runs=2)
    scenario.declare(db, "uncapped", "orders")
    scenario.register(db, "orders")
    first = _by_dag(assetq.schedule(db.engine))["consumer"]
    _set_state(db, first, "running")
    scenario.register(db, "orders")
    second = _by_dag(assetq.schedule(db.engine))["consumer"]
    (third_event,) = scenario.register(db, "orders")
    assert list(_by_dag(assetq.schedule(db.engine))) == ["uncapped"]  # consumer at 2
    _set_state(db, second, "success")
    third = _by_dag(assetq.schedule(db.engine))["consumer"]
    assert third.event_ids == (third_event.id,)


def _by_dag(runs: list[assetq.Run]) -> dict[str, assetq.Run]:
    return {r.dag_id: r for r in runs}


def _new_run(db: TestDatabase) -> assetq.Run:
    scenario.register(db, "orders")
    (run,) = assetq.schedule(db.engine)
    return run


def test_allowed_run_state_transitions_set_their_timestamps(db: TestDatabase) -> None:
    scenario.declare(db, "consumer", "orders")
    for path in (("running", "success"), ("running", "failed"), ("success",), ("failed",)):
        run = _new_run(db)
        info = _get_run(db, "consumer", run.run_id)
        assert (info.state, info.started_at, info.ended_at) == ("queued", None, None)
        for state in path:
            previous = info
            info = _set_state(db, run, state)
            assert info.state == state, path
            assert info == _get_run(db, "consumer", run.run_id), path
            if state == "running":
                assert info.started_at is not None and info.ended_at is None, path
            else:
                assert info.ended_at is not None, path
                # started_at is kept (None if the run never ran)
                assert info.started_at == previous.started_at, path
                if info.started_at is not None:
                    assert info.ended_at >= info.started_at, path
            assert (info.id, info.seq, info.run_after, info.created_at) == (
                run.id,
                run.seq,
                run.run_after,
                run.created_at,
            ), path


def test_setting_the_state_a_run_already_has_changes_nothing(db: TestDatabase) -> None:
    """An idempotent retry of a state change."""
    scenario.declare(db, "consumer", "orders")
    run = _new_run(db)
    assert _set_state(db, run, "queued") == _get_run(db, "consumer", run.run_id)
    running = _set_state(db, run, "running")
    assert _set_state(db, run, "running") == running
    done = _set_state(db, run, "success")
    assert _set_state(db, run, "success") == done
    assert _get_run(db, "consumer", run.run_id) == done


#: Transitions set_run_state refuses: (states the run is moved through first, refused state).
FORBIDDEN = [
    (("running",), "queued"),
    (("success",), "queued"),
    (("success",), "running"),
    (("success",), "failed"),
    (("failed",), "success"),
    (("running", "failed"), "running"),
    ((), "done"),  # not a state
    ((), "SUCCESS"),  # nor is this
]


def test_forbidden_run_state_transitions_are_refused(db: TestDatabase) -> None:
    scenario.declare(db, "consumer", "orders")
    for path, refused in FORBIDDEN:
        case = f"{'->'.join(('queued', *path))} -> {refused}"
        run = _new_run(db)
        for state in path:
            _set_state(db, run, state)
        before = _get_run(db, "consumer", run.run_id)
        with pytest.raises(assetq.InvalidRunState) as info:
            _set_state(db, run, refused)
        assert isinstance(info.value, assetq.InvalidArgument), case
        assert info.value.code == "AQ008", case
        assert _get_run(db, "consumer", run.run_id) == before, case


def test_an_unknown_run_is_reported(db: TestDatabase) -> None:
    scenario.declare(db, "consumer", "orders")
    scenario.declare(db, "other", "customers")
    run = _new_run(db)
    for dag_id, run_id in (("consumer", "no_such_run"), ("other", run.run_id)):
        with pytest.raises(assetq.UnknownRun) as info, db.engine.begin() as conn:
            assetq.set_run_state(conn, dag_id, run_id, "running")
        assert info.value.code == "AQ006"
        assert isinstance(info.value, LookupError)
        with pytest.raises(assetq.UnknownRun):
            _get_run(db, dag_id, run_id)
    assert _get_run(db, "consumer", run.run_id).state == "queued"


def test_run_state_constants() -> None:
    assert set(assetq.RUN_STATES) == {"queued", "running", "success", "failed", "cancelled"}
    assert set(assetq.ACTIVE_RUN_STATES) == {"queued", "running"}


# -- 5. Events per run ----------------------------------------------------------------------


def test_one_event_per_run_consumes_the_queue_oldest_first(db: TestDatabase) -> None:
    scenario.declare(db, "consumer", "orders", max_events_per_run=1)
    events = scenario.register(db, "orders", "orders", "orders")
    runs = _drain(db)
    assert [(r.event_ids, r.triggering_event_id) for r in runs] == [((e.id,), e.id) for e in events]
    assert [r.seq for r in runs] == [1, 2, 3]


def test_a_backlog_is_split_into_runs_of_n_oldest_first(db: TestDatabase) -> None:
    scenario.declare(db, "consumer", "orders", max_events_per_run=3)
    ids = scenario.ids(scenario.register(db, *["orders"] * 10))
    runs = _drain(db)
    assert [r.event_ids for r in runs] == [ids[0:3], ids[3:6], ids[6:9], ids[9:]]
    assert db.links() == sorted(("consumer", i) for i in ids)  # nothing lost or duplicated


def test_a_capped_all_of_is_never_starved_by_old_events_of_one_asset(db: TestDatabase) -> None:
    scenario.declare(db, "consumer", assetq.all_of("a", "b"), max_events_per_run=2)
    a1, a2, a3, b1 = scenario.register(db, "a", "a", "a", "b")
    (run,) = assetq.schedule(db.engine)
    assert run.event_ids == (a1.id, b1.id)
    assert run.triggering_event_id == b1.id
    assert scenario.queued(db, "consumer") == [a2.id, a3.id]
    assert assetq.schedule(db.engine) == []  # a alone does not satisfy the condition


def test_a_capped_run_fills_up_with_the_oldest_events_after_the_witnesses(
    db: TestDatabase,
) -> None:
    scenario.declare(db, "consumer", assetq.all_of("a", "b"), max_events_per_run=3)
    a1, a2, a3, b1 = scenario.register(db, "a", "a", "a", "b")
    (run,) = assetq.schedule(db.engine)
    assert run.event_ids == (a1.id, a2.id, b1.id)
    assert scenario.queued(db, "consumer") == [a3.id]


def test_capped_runs_always_satisfy_the_condition_and_lose_nothing(db: TestDatabase) -> None:
    """A seeded mix of registrations and passes: every run holds at most N events that
    satisfy all_of(a, any_of(b, c)); every event is consumed once or still queued."""
    scenario.declare(
        db, "consumer", assetq.all_of("a", assetq.any_of("b", "c")), max_events_per_run=2
    )
    rng = random.Random(5)
    asset_of: dict[int, str] = {}
    runs: list[assetq.Run] = []
    for _ in range(30):
        (event,) = scenario.register(db, rng.choice("aabc"))
        asset_of[event.id] = event.asset
        runs += assetq.schedule(db.engine)
    runs += _drain(db)
    consumed = [i for r in runs for i in r.event_ids]
    assert len(consumed) == len(set(consumed))
    for run in runs:
        assets = {asset_of[i] for i in run.event_ids}
        assert 1 <= len(run.event_ids) <= 2
        assert "a" in assets and assets & {"b", "c"}, run
    queued = scenario.queued(db, "consumer")
    assert set(consumed) | set(queued) == set(asset_of)
    assert not set(consumed) & set(queued)
    left = {asset_of[i] for i in queued}
    assert not ("a" in left and left & {"b", "c"})  # the rest does not satisfy it


def test_declare_refuses_caps_below_one_or_below_the_condition_size(db: TestDatabase) -> None:
    refused: list[tuple[Any, dict[str, Any]]] = [
        (assetq.all_of("a", "b", "c"), {"max_events_per_run": 2}),
        (assetq.any_of(assetq.all_of("a", "b"), "c"), {"max_events_per_run": 1}),
        ("a", {"max_events_per_run": 0}),
        ("a", {"max_active_runs": 0}),
    ]
    before = db.counts()
    for condition, caps in refused:
        with pytest.raises(assetq.InvalidArgument), db.engine.begin() as conn:
            assetq.declare_dag(conn, "consumer", condition, **caps)
        assert db.counts() == before, (condition, caps)


def test_declare_accepts_an_events_per_run_cap_equal_to_the_condition_size(
    db: TestDatabase,
) -> None:
    scenario.declare(
        db, "consumer", assetq.any_of(assetq.all_of("a", "b"), "c"), max_events_per_run=2
    )
    a1, b1 = scenario.register(db, "a", "b")
    (run,) = assetq.schedule(db.engine)
    assert run.event_ids == (a1.id, b1.id)


def test_the_declare_routine_itself_refuses_caps_below_one(db: TestDatabase) -> None:
    """A caller that bypasses the Python checks gets AQ002 from the database."""
    before = db.counts()
    for column in ("max_active_runs", "max_events_per_run"):
        params: dict[str, Any] = {
            "dag_id": "consumer",
            "condition": '{"asset":"a"}',
            "clauses": '[["a"]]',
            "paused": None,
            "max_active_runs": None,
            "max_events_per_run": None,
            "queue_while_paused": None,
            # The retry options of 0006_work_queue: NULL keeps their defaults.
            "max_attempts": None,
            "retry_delay_seconds": None,
            "max_retry_delay_seconds": None,
            column: 0,
        }
        with pytest.raises(sa.exc.DBAPIError) as info, db.engine.begin() as conn:
            dialect_for(conn).execute(conn, "declare_dag", db.namespace, params)
        assert db.dialect.translate(info.value).code == "AQ002", column
        assert db.counts() == before, column


# -- 6. Run metadata ------------------------------------------------------------------------


def test_a_run_records_its_newest_event_as_the_trigger_and_counts_its_events(
    db: TestDatabase,
) -> None:
    scenario.declare(db, "consumer", "orders")
    events = []
    for _ in range(3):  # three transactions: three timestamps
        events += scenario.register(db, "orders")
    (run,) = assetq.schedule(db.engine)
    assert (run.triggering_event_id, run.state) == (events[-1].id, "queued")
    info = _get_run(db, "consumer", run.run_id)
    assert (info.triggering_event_id, info.event_count) == (events[-1].id, 3)
    assert (info.id, info.dag_id, info.seq, info.run_after, info.created_at) == (
        run.id,
        run.dag_id,
        run.seq,
        run.run_after,
        run.created_at,
    )
    assert info.run_after == max(e.timestamp for e in events)


def test_events_of_one_batch_share_a_timestamp_and_the_newest_id_triggers(
    db: TestDatabase,
) -> None:
    scenario.declare(db, "consumer", "orders")
    with db.engine.begin() as conn:
        events = assetq.register_events(conn, [assetq.NewEvent("orders")] * 3)
    assert len({e.timestamp for e in events}) == 1
    (run,) = assetq.schedule(db.engine)
    assert run.triggering_event_id == max(e.id for e in events)


def test_run_after_goes_backwards_under_a_late_commit_while_seq_and_claim_time_do_not(
    db: TestDatabase,
) -> None:
    """Documented, expected: run_after is the newest consumed event timestamp (Airflow's
    choice), and a late commit makes a later run's run_after older. seq and created_at (the
    claim time) are what order runs."""
    scenario.declare(db, "consumer", "orders")
    with db.engine.connect() as late, db.engine.connect() as early:
        late.begin()
        event_a = assetq.register_event(late, "orders")  # timestamp taken, not committed
        early.begin()
        event_b = assetq.register_event(early, "orders")
        early.commit()
        (first,) = assetq.schedule(db.engine)
        late.commit()
    (second,) = assetq.schedule(db.engine)
    assert (first.event_ids, first.triggering_event_id) == ((event_b.id,), event_b.id)
    assert (second.event_ids, second.triggering_event_id) == ((event_a.id,), event_a.id)
    assert second.run_after == event_a.timestamp < event_b.timestamp == first.run_after
    assert second.seq == first.seq + 1
    assert second.created_at >= first.created_at
    with db.engine.connect() as conn:
        listed = assetq.runs(conn, "consumer")
    assert [r.run_id for r in listed] == [second.run_id, first.run_id]


def test_run_ids_never_collide_even_when_run_after_is_equal(db: TestDatabase) -> None:
    scenario.declare(db, "consumer", "orders", max_events_per_run=1)
    scenario.declare(db, "other", "orders", max_events_per_run=1)
    with db.engine.begin() as conn:  # one batch: one timestamp for all three
        assetq.register_events(conn, [assetq.NewEvent("orders")] * 3)
    runs = _drain(db)
    assert len(runs) == 6
    assert len({r.run_after for r in runs}) == 1
    assert len({r.id for r in runs}) == 6
    for dag_id in ("consumer", "other"):
        mine = [r for r in runs if r.dag_id == dag_id]
        assert len({r.run_id for r in mine}) == 3
        assert [r.seq for r in mine] == [1, 2, 3]
        assert all(a.created_at <= b.created_at for a, b in pairwise(mine))
