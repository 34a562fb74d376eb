"""One vocabulary (issue 15 item 4): a field has one name and one meaning in every result
type, in the dag_queue_status view and in the CLI's JSON; renamed names still work, with a
DeprecationWarning, and give the same value."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import warnings
from datetime import timedelta
from typing import Any, get_args, get_type_hints

import pytest
import sqlalchemy as sa

import assetq
import scenario
from assetq.cli import _run_json
from dbs import TestDatabase


def _names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _status_json(db: TestDatabase) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASSETQ_")}
    env["ASSETQ_DATABASE_URL"] = db.url.render_as_string(hide_password=False)
    done = subprocess.run(
        [sys.executable, "-m", "assetq", "status", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    return data


# -- DagStatus: the view's columns, the JSON's keys ----------------------------------------


def test_status_fields_are_the_view_columns(db: TestDatabase) -> None:
    scenario.declare(db, "consumer", "orders")
    with db.engine.connect() as conn:
        columns = conn.execute(sa.text(db.sql("SELECT * FROM {ns}.dag_queue_status"))).keys()
    assert set(columns) == _names(assetq.DagStatus)


def test_status_json_keys_are_the_field_names(db: TestDatabase) -> None:
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "consumer", "orders", paused=True)
        assetq.register_event(conn, "orders")
        assetq.declare_dag(conn, "other", "orders")
        assetq.register_event(conn, "orders")
    consumers = {c["dag_id"]: c for c in _status_json(db)["consumers"]}
    with db.engine.connect() as conn:
        shown = {s.dag_id: s for s in assetq.status(conn)}
    for dag_id, consumer in consumers.items():
        # Every field under its own name, and the deprecated "paused" beside is_paused; the
        # worker coverage (issue 26) under WorkerCoverage's names (expired_runs is DagStatus's
        # expired_leases there), with its no_worker property.
        coverage = _names(assetq.WorkerCoverage) - {"dag_id", "expired_runs"} | {"no_worker"}
        assert set(consumer) == _names(assetq.DagStatus) | {"paused"} | coverage
        assert consumer["paused"] == consumer["is_paused"] == shown[dag_id].is_paused
    assert consumers["consumer"]["is_paused"] is True
    assert consumers["other"]["oldest_queued_age_seconds"] >= 0


def test_deprecated_status_names_warn_and_give_the_same_value(db: TestDatabase) -> None:
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "consumer", "orders", paused=True)
        assetq.declare_dag(conn, "other", "orders")
        assetq.register_event(conn, "orders")
    with db.engine.connect() as conn:
        consumer, other = assetq.status(conn)
    for status in (consumer, other):
        with pytest.warns(DeprecationWarning, match=r"use DagStatus\.is_paused") as caught:
            assert status.paused is status.is_paused
        assert caught[0].filename == __file__  # the warning names the caller's line
        with pytest.warns(DeprecationWarning, match=r"use DagStatus\.oldest_queued_age_seconds"):
            age = status.oldest_queued_age
        seconds = status.oldest_queued_age_seconds
        assert age == (None if seconds is None else timedelta(seconds=seconds))
    assert (consumer.is_paused, other.is_paused) == (True, False)
    assert consumer.oldest_queued_age_seconds is None  # paused: nothing was queued for it
    assert other.oldest_queued_age_seconds is not None and other.oldest_queued_age_seconds >= 0


def test_the_new_status_names_do_not_warn(db: TestDatabase) -> None:
    scenario.declare(db, "consumer", "orders")
    with db.engine.connect() as conn, warnings.catch_warnings():
        warnings.simplefilter("error")
        (status,) = assetq.status(conn)
        assert dataclasses.asdict(status)["is_paused"] is False
        assert status.oldest_queued_age_seconds is None


# -- Run, Claim and RunInfo ----------------------------------------------------------------


def test_run_fields_are_run_info_fields_with_the_same_types() -> None:
    run, info = get_type_hints(assetq.Run), get_type_hints(assetq.RunInfo)
    shared = _names(assetq.Run) - {"event_ids"}
    assert shared <= _names(assetq.RunInfo)
    for name in shared:
        assert run[name] == info[name], name
    assert run["state"] == info["state"] == assetq.RunState


def test_claim_fields_are_run_info_fields_or_the_lease() -> None:
    claim, info = get_type_hints(assetq.Claim), get_type_hints(assetq.RunInfo)
    own = _names(assetq.Claim) - _names(assetq.Run)
    # The claim's own: its lease, the event that tells its handler to stop, whether its
    # consumer is capped (the worker's cue to make the next run on MySQL), and whether the
    # claim's own pass made the run (claim_runs(schedule=True)).
    claim_only = {"lease", "cancelled", "capped", "made"}
    assert own - _names(assetq.RunInfo) == claim_only
    for name in own - claim_only:
        # The same type, or narrower where a claim always has a value (its worker).
        assert claim[name] == info[name] or claim[name] in get_args(info[name]), name


def test_a_new_run_and_its_claim_read_as_the_stored_run(db: TestDatabase) -> None:
    scenario.declare(db, "consumer", "orders")
    with db.engine.begin() as conn:
        assetq.register_events(conn, [assetq.NewEvent("orders"), assetq.NewEvent("orders")])
    (run,) = assetq.schedule(db.engine)
    with db.engine.connect() as conn:
        stored = assetq.get_run(conn, "consumer", run.run_id)
    for name in _names(assetq.Run) - {"event_ids"}:
        assert getattr(run, name) == getattr(stored, name), name
    assert run.event_count == stored.event_count == len(run.event_ids) == 2
    (claim,) = assetq.claim_runs(db.engine, "w1")
    with db.engine.connect() as conn:
        held = assetq.get_run(conn, "consumer", run.run_id)
    for name in (_names(assetq.Claim) & _names(assetq.RunInfo)) - {"event_ids"}:
        assert getattr(claim, name) == getattr(held, name), name
    assert (claim.state, claim.attempt, claim.worker) == ("running", 1, "w1")


def test_scheduler_json_keys_are_the_run_fields(db: TestDatabase) -> None:
    scenario.declare(db, "consumer", "orders")
    with db.engine.begin() as conn:
        event = assetq.register_event(conn, "orders")
    (run,) = assetq.schedule(db.engine)
    line = json.loads(_run_json(run))
    assert set(line) == _names(assetq.Run)
    assert (line["state"], line["triggering_event_id"], line["event_ids"]) == (
        "queued",
        event.id,
        [event.id],
    )


# -- Event and EventRecord -----------------------------------------------------------------


def test_event_fields_are_event_record_fields_but_created() -> None:
    event, record = get_type_hints(assetq.Event), get_type_hints(assetq.EventRecord)
    shared = _names(assetq.Event) - {"created"}
    assert shared <= _names(assetq.EventRecord)
    for name in shared:
        assert event[name] == record[name], name


def test_a_registered_event_reads_as_the_stored_event(db: TestDatabase) -> None:
    scenario.declare(db, "consumer", "orders")
    with db.engine.begin() as conn:
        event = assetq.register_event(
            conn, "orders", aliases=["a_orders", "b_orders"], partition_key="2026-12-01"
        )
    with db.engine.connect() as conn:
        (stored,) = assetq.queued_events(conn, "consumer")
    for name in _names(assetq.Event) - {"created"}:
        assert getattr(event, name) == getattr(stored, name), name


# -- run states at run time ----------------------------------------------------------------


def test_a_misspelt_run_state_is_refused_at_run_time_too(db: TestDatabase) -> None:
    scenario.declare(db, "consumer", "orders")
    with db.engine.begin() as conn:
        assetq.register_event(conn, "orders")
    (run,) = assetq.schedule(db.engine)
    bad: Any = "sucess"  # what mypy refuses; an untyped caller can still send it
    with pytest.raises(assetq.InvalidRunState) as raised, db.engine.begin() as conn:
        assetq.set_run_state(conn, "consumer", run.run_id, bad)
    assert raised.value.code == "AQ008"
    with pytest.raises(assetq.InvalidRunState), db.engine.connect() as conn:
        assetq.runs(conn, "consumer", state=bad)
    with db.engine.connect() as conn:
        assert assetq.get_run(conn, "consumer", run.run_id).state == "queued"
    assert assetq.is_run_state("success") and not assetq.is_run_state(bad)
    assert get_args(assetq.RunState) == assetq.RUN_STATES
