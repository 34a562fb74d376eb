"""Routines written once, re-applied by checksum, forward only (issue 25 items 2 and 3).

Each routine, trigger and view lives in one file per engine; assetq.routines.sync re-creates,
after every install, upgrade and repair, exactly the objects whose file differs from what the
namespace's routine_catalogue records, or that are missing, or were changed by hand; never
one a newer package recorded. These tests change real files the way a newer package would
(tests/changed_files.py) and read what the server then holds.
"""

from __future__ import annotations

import logging

import pytest
import sqlalchemy as sa

import assetq
from assetq import migrate, routines, sqlfiles
from changed_files import MARK, shipped
from dbs import TestDatabase, made_logins


def _catalogue(db: TestDatabase) -> dict[tuple[str, str], routines.Recorded]:
    with db.engine.connect() as conn:
        return routines.catalogue(conn, db.namespace)


def _definitions(db: TestDatabase) -> dict[tuple[str, str], routines.Definition]:
    with db.engine.connect() as conn:
        return routines.definitions(conn, db.namespace)


def before_keys(applied: dict[str, object]) -> list[tuple[str, str]]:
    return [(label.split()[0], label.split()[1]) for label in applied]


def _applied_at(db: TestDatabase) -> dict[str, object]:
    rows = db.rows("SELECT kind, name, applied_at FROM {ns}.routine_catalogue")
    return {f"{r.kind} {r.name}": r.applied_at for r in rows}


def test_a_fresh_install_records_every_object_with_its_files_checksum(db: TestDatabase) -> None:
    recorded = _catalogue(db)
    files = sqlfiles.object_files(db.engine_name)
    assert set(recorded) == {(f.kind, f.name) for f in files}
    present = _definitions(db)
    for f in files:
        row = recorded[(f.kind, f.name)]
        assert row.checksum == f.checksum and row.package_version == assetq.__version__
        assert row.definition_checksum == present[(f.kind, f.name)].checksum, f.name


def test_an_install_at_head_with_the_same_files_re_creates_nothing(db: TestDatabase) -> None:
    before, definitions = _applied_at(db), _definitions(db)
    assert assetq.install(db.engine) == migrate.head_revision()
    assert _applied_at(db) == before and _definitions(db) == definitions


def test_a_changed_body_is_re_created_alone_and_recorded(
    db: TestDatabase, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    before, definitions = _applied_at(db), _definitions(db)
    caplog.set_level(logging.INFO, logger="assetq.routines")
    with shipped(monkeypatch, {db.engine_name: ["schedule_pass_v2"]}) as files:
        assetq.install(db.engine)
    after, now = _applied_at(db), _definitions(db)
    changed = [k for k in after if after[k] != before[k]]
    assert changed == ["routine schedule_pass_v2"]
    assert MARK in now[("routine", "schedule_pass_v2")].definition
    assert {k: d for k, d in now.items() if k != ("routine", "schedule_pass_v2")} == {
        k: d for k, d in definitions.items() if k != ("routine", "schedule_pass_v2")
    }
    (new,) = [f for f in files[db.engine_name] if f.name == "schedule_pass_v2"]
    assert _catalogue(db)[("routine", "schedule_pass_v2")].checksum == new.checksum
    assert "routine schedule_pass_v2" in caplog.text and "(changed)" in caplog.text
    # And it works: a pass through the new body.
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "report", "orders")
        assetq.register_event(conn, "orders")
    assert len(assetq.schedule(db.engine)) == 1


def test_a_body_written_by_a_newer_package_is_never_put_back(
    db: TestDatabase, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Forward only: during a rolling deploy an older package's install (here: this one, the
    catalogue saying a newer version wrote the body) leaves the newer body in place."""
    with shipped(monkeypatch, {db.engine_name: ["register_events"]}, mark="-- from 99.0"):
        assetq.install(db.engine)
    db.execute(
        "UPDATE {ns}.routine_catalogue SET package_version = '99.0'"
        " WHERE kind = 'routine' AND name = 'register_events'"
    )
    newer = _definitions(db)[("routine", "register_events")].definition
    caplog.set_level(logging.INFO, logger="assetq.routines")
    assetq.install(db.engine)  # this package's own file differs: still left alone
    assert migrate.repair(db.engine, namespace=db.namespace) == []
    assert _definitions(db)[("routine", "register_events")].definition == newer
    assert "newer than this package" in caplog.text
    report = assetq.doctor(db.engine, namespace=db.namespace)
    notes = [c for c in report.checks if c.name == "definitions" and c.severity == "note"]
    assert notes and "99.0" in notes[0].detail


def test_a_body_changed_by_hand_is_reported_and_repaired(db: TestDatabase) -> None:
    routine = "process_gone"
    if db.engine_name == "postgresql":
        db.execute(
            "CREATE OR REPLACE FUNCTION {ns}.process_gone(p_process_id text) RETURNS void"
            " LANGUAGE plpgsql AS $$ BEGIN NULL; END $$"
        )
    else:
        db.execute("DROP PROCEDURE {ns}.process_gone")
        db.execute("CREATE PROCEDURE {ns}.process_gone(IN p_process_id VARCHAR(64)) BEGIN END")
    with db.engine.connect() as conn:
        found = routines.differences(conn, db.namespace)
    assert [(d.label, d.reason) for d in found] == [(f"routine {routine}", "altered")]
    report = assetq.doctor(db.engine, namespace=db.namespace)
    (problem,) = [c for c in report.checks if c.name == "definitions"]
    assert problem.severity == "problem" and "changed by hand" in problem.detail
    assert migrate.repair(db.engine, namespace=db.namespace) == [f"routine {routine}"]
    with db.engine.connect() as conn:
        assert routines.differences(conn, db.namespace) == []


def test_offline_sql_records_the_routines_so_that_the_next_sync_changes_nothing(
    empty_db: TestDatabase,
) -> None:
    """``assetq sql`` output run by hand, then ``assetq install`` by the same package: the
    catalogue rows it wrote (no definition checksum, nothing printed one) say the files are
    there, so nothing is re-created."""
    import io

    out = io.StringIO()
    migrate.write_sql(out, empty_db.dialect.name, empty_db.namespace, None, migrate.head_revision())
    script = out.getvalue()
    for f in sqlfiles.object_files(empty_db.engine_name):
        assert (
            sqlfiles.render(f.text, empty_db.dialect.quote_ns(empty_db.namespace)).strip()
            in (script)
            or f.kind == "trigger"
        ), f.name
    with empty_db.engine.connect() as conn:
        empty_db.dialect.run_script(conn, script, empty_db.namespace)
        conn.commit()
    before = _applied_at(empty_db)
    assert len(before) == len(sqlfiles.object_files(empty_db.engine_name))
    assert all(r.definition_checksum is None for r in _catalogue(empty_db).values())
    assetq.install(empty_db.engine)
    assert _applied_at(empty_db) == before
    # The install recorded what the server prints for each, so doctor can tell a change by
    # hand from now on.
    present = _definitions(empty_db)
    assert {k: r.definition_checksum for k, r in _catalogue(empty_db).items()} == {
        k: present[k].checksum for k in before_keys(before)
    }


def test_the_catalogue_and_the_version_marker_survive_a_concurrent_sync(
    db: TestDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two installs of the same newer package at once: the namespace lock serializes them,
    the second finds nothing left to do."""
    import threading

    errors: list[BaseException] = []
    with shipped(monkeypatch, {db.engine_name: ["delete_dag"]}):
        engines = [db.new_engine() for _ in range(2)]
        barrier = threading.Barrier(2)

        def install(engine: sa.Engine) -> None:
            barrier.wait(10)
            try:
                assetq.install(engine)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=install, args=(e,)) for e in engines]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        with db.engine.connect() as conn:
            assert routines.differences(conn, db.namespace) == []
    assert errors == []


@pytest.mark.parametrize(
    ("older", "newer"),
    [
        ("0.1.0", "0.1.1"),
        ("0.1.0", "0.2.0"),
        ("0.9.0", "0.10.0"),
        ("0.2.0.dev1", "0.2.0a1"),
        ("0.2.0a1", "0.2.0rc1"),
        ("0.2.0rc1", "0.2.0"),
        ("0.2.0", "0.2.0.post1"),
        ("0.2.0.dev1", "0.2.0.dev2"),
    ],
)
def test_package_versions_are_ordered_as_pep_440_orders_them(older: str, newer: str) -> None:
    assert routines.is_newer(newer, older) and not routines.is_newer(older, newer)
    assert not routines.is_newer(older, older)
    assert routines.version_key("0.1") == routines.version_key("0.1.0")


def test_a_routine_created_again_reaches_the_roles_of_its_kind(db: TestDatabase) -> None:
    """A routine that was missing (dropped by hand here; a newer package's new routine the
    same way) is given to every role holding its kind when it is created: nobody has to run
    ``assetq grant`` again after a repair or an upgrade."""
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "report", "orders")
    with made_logins(db, ("producer", "scheduler"), "aqsync") as made:
        assetq.grant_roles(
            db.engine,
            producer=made["producer"].grantee,
            scheduler=made["scheduler"].grantee,
            namespace=db.namespace,
        )
        if db.engine_name == "postgresql":
            db.execute(
                "DROP FUNCTION {ns}.register_event(text, jsonb, text, text, text, integer, text)"
            )
            db.execute("DROP FUNCTION {ns}.retry_run(text, text)")
        else:
            db.execute("DROP PROCEDURE {ns}.register_event")
            db.execute("DROP PROCEDURE {ns}.retry_run")
        assert sorted(migrate.repair(db.engine, namespace=db.namespace)) == [
            "routine register_event",
            "routine retry_run",
        ]
        with made["producer"].engine.begin() as conn:
            event = assetq.register_event(conn, "orders", namespace=db.namespace)
        (run,) = assetq.schedule(made["scheduler"].engine, namespace=db.namespace)
        assert run.event_ids == (event.id,)
        # retry_run is the scheduler kind's again: a run it may not retry is refused by the
        # routine (a state error), not by the server (a privilege error).
        with made["scheduler"].engine.begin() as conn, pytest.raises(assetq.InvalidRunState):
            assetq.retry_run(conn, "report", run.run_id, namespace=db.namespace)
        # And only to them: the producer may still not retry runs.
        call = "CALL {ns}.retry_run('report', 'x')"
        if db.engine_name == "postgresql":
            call = "SELECT {ns}.retry_run('report', 'x')"
        with made["producer"].engine.begin() as conn, pytest.raises(sa.exc.DBAPIError):
            conn.execute(sa.text(db.sql(call)))
