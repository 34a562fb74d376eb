"""One vocabulary (issue 15 item 4, issue 29 item 1): one type per concept (a run, an
event), a field has one name and one meaning in every result type, in the dag_queue_status
view and in the CLI's JSON; renamed names still work, with a DeprecationWarning, and give the
same value."""

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


def _cli_json(db: TestDatabase, *args: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASSETQ_")}
    env["ASSETQ_DATABASE_URL"] = db.url.render_as_string(hide_password=False)
    done = subprocess.run(
        [sys.executable, "-m", "assetq", *args, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    return data


def _status_json(db: TestDatabase) -> dict[str, Any]:
    return _cli_json(db, "status")


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


# -- one Run (a Claim is one plus the claim), one Event ------------------------------------


def test_a_claim_is_a_run_plus_the_claim() -> None:
    assert issubclass(assetq.Claim, assetq.Run)
    claim, run = get_type_hints(assetq.Claim), get_type_hints(assetq.Run)
    # The claim's own: its lease, the event that tells its handler to stop, whether its
    # consumer is capped (the worker's cue to make the next run on MySQL), and whether the
    # claim's own pass made the run (claim_runs(schedule=True)).
    assert _names(assetq.Claim) - _names(assetq.Run) == {"lease", "cancelled", "capped", "made"}
    for name in _names(assetq.Run):
        # The same type, or narrower where a claim always has a value (its worker).
        assert claim[name] == run[name] or claim[name] in get_args(run[name]), name
    assert claim["worker"] is str


def test_a_new_run_and_its_claim_read_as_the_stored_run(db: TestDatabase) -> None:
    scenario.declare(db, "consumer", "orders")
    with db.engine.begin() as conn:
        assetq.register_events(conn, [assetq.NewEvent("orders"), assetq.NewEvent("orders")])
    (run,) = assetq.schedule(db.engine)
    with db.engine.connect() as conn:
        stored = assetq.get_run(conn, "consumer", run.run_id)
    # The one field schedule reads and get_run does not: the consumed events' ids.
    assert stored.event_ids == ()
    assert dataclasses.replace(stored, event_ids=run.event_ids) == run
    assert run.event_count == stored.event_count == len(run.event_ids) == 2
    (claim,) = assetq.claim_runs(db.engine, "w1")
    with db.engine.connect() as conn:
        held = assetq.get_run(conn, "consumer", run.run_id)
    differ = {n for n in _names(assetq.Run) if getattr(claim, n) != getattr(held, n)}
    # What a claim does not read (a retried run's claim would leave out its earlier error).
    assert differ <= {"event_ids", "ended_at", "not_before", "error", "output_event_ids"}
    assert claim.event_ids == run.event_ids
    assert (claim.state, claim.attempt, claim.worker) == ("running", 1, "w1")


def test_runs_json_keys_and_scheduler_json_keys_are_the_run_fields(db: TestDatabase) -> None:
    scenario.declare(db, "consumer", "orders")
    with db.engine.begin() as conn:
        event = assetq.register_event(conn, "orders")
    (run,) = assetq.schedule(db.engine)
    line = json.loads(_run_json(run))  # one line of `assetq scheduler --json`
    assert set(line) == _names(assetq.Run)
    assert (line["state"], line["triggering_event_id"], line["event_ids"]) == (
        "queued",
        event.id,
        [event.id],
    )
    (listed,) = _cli_json(db, "runs", "--dag", "consumer")["runs"]
    assert set(listed) == _names(assetq.Run)
    assert {k: v for k, v in listed.items() if k != "event_ids"} == {
        k: v for k, v in line.items() if k != "event_ids"
    }
    assert listed["event_ids"] == []  # runs reads the count, not the ids
    shown = _cli_json(db, "run", "show", "consumer", run.run_id)["run"]
    assert shown == listed


def test_a_registered_event_reads_as_the_stored_event(db: TestDatabase) -> None:
    scenario.declare(db, "consumer", "orders")
    source = assetq.Source(dag_id="producer", run_id="r1")
    with db.engine.begin() as conn:
        assetq.declare_asset(conn, "orders", uri="s3://b/orders")
        event = assetq.register_event(
            conn,
            "orders",
            extra={"rows": 3},
            source=source,
            aliases=["b_orders", "a_orders"],
            partition_key="2026-12-01",
        )
    with db.engine.connect() as conn:
        (stored,) = assetq.queued_events(conn, "consumer")
    # What a registration does not read back (one round trip): the uri, extra and source.
    assert (event.uri, event.extra, event.source) == (None, {}, assetq.Source())
    assert dataclasses.replace(event, uri=stored.uri, extra=stored.extra, source=stored.source) == (
        stored
    )
    assert (stored.uri, stored.extra, stored.source) == ("s3://b/orders", {"rows": 3}, source)
    assert event.aliases == stored.aliases == ("a_orders", "b_orders")  # sorted, both
    assert event.created and stored.created


def test_events_json_keys_are_event_fields(db: TestDatabase) -> None:
    scenario.declare(db, "consumer", "orders")
    with db.engine.begin() as conn:
        event = assetq.register_event(conn, "orders", extra={"rows": 3}, aliases=["a_orders"])
    (shown,) = _cli_json(db, "events", "--asset", "orders")["events"]
    # Every key is the field of that name; the JSON leaves out the asset's id and created.
    assert set(shown) == _names(assetq.Event) - {"asset_id", "created"}
    with db.engine.connect() as conn:
        (stored,) = assetq.queued_events(conn, "consumer")
    assert shown["id"] == stored.id == event.id
    assert (shown["asset"], shown["extra"], shown["aliases"]) == (
        stored.asset,
        dict(stored.extra),
        list(stored.aliases),
    )


# -- the names of 0.1 ----------------------------------------------------------------------


@pytest.mark.parametrize(("old", "new"), [("RunInfo", "Run"), ("EventRecord", "Event")])
def test_a_deprecated_type_name_warns_and_is_the_new_type(old: str, new: str) -> None:
    for module in (assetq, assetq.api):
        with pytest.warns(DeprecationWarning, match=rf"assetq\.{old} is deprecated: use") as caught:
            found = getattr(module, old)
        assert found is getattr(assetq, new)
        assert f"assetq.{new}" in str(caught[0].message)
        assert caught[0].filename == __file__  # the warning names the caller's line
    names: dict[str, Any] = {}
    with pytest.warns(DeprecationWarning, match=rf"assetq\.{old} is deprecated"):
        exec(f"from assetq import {old}", names)  # what a caller's import does
    assert names[old] is getattr(assetq, new)


def test_the_deprecated_type_names_still_work(db: TestDatabase) -> None:
    scenario.declare(db, "consumer", "orders")
    for _ in range(3):
        scenario.register(db, "orders")
        assetq.schedule(db.engine)
    with pytest.warns(DeprecationWarning):
        run_info, event_record = assetq.RunInfo, assetq.EventRecord
    with db.engine.connect() as conn:
        first = assetq.runs(conn, "consumer", limit=2)
        assert all(isinstance(r, run_info) for r in first)
        assert isinstance(first[0], assetq.Run)  # and what the paging takes
        assert [r.seq for r in assetq.runs(conn, "consumer", before=first[-1])] == [1]
        events = assetq.consumed_events(conn, "consumer", first[0].run_id)
    assert all(isinstance(e, event_record) for e in events)


def test_the_new_type_names_do_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        names: dict[str, Any] = {}
        exec("from assetq import *", names)  # __all__ holds no deprecated name
        assert {"Run", "Claim", "Event", "NewEvent"} <= set(names)
        assert not {"RunInfo", "EventRecord"} & set(names)
        assert assetq.api.Run is names["Run"] and assetq.api.Event is names["Event"]
    with pytest.raises(AttributeError, match="has no attribute 'RunInfos'"):
        assetq.RunInfos  # noqa: B018


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
