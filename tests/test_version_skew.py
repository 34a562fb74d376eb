"""Version skew (issue 13 item 3, issue 25 item 5): which package works against which schema.

The window (docs/operations.md, "Upgrading"): every revision not in
migrate.BREAKING_REVISIONS is additive (tables change by expand, then contract; a released
routine signature never changes: tests/test_signatures.py), so a package keeps working
against newer schemas up to the next breaking revision; each schema says so in a marker the
older package can read. Proven here with a real newer schema: this package's tables upgraded
by the test-only steps (tests/revisions) of a "newer package", which this package does not
know, used through this package's whole API; and this package's own check, which raises
SchemaTooOld / SchemaTooNew with the fix outside the window.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
import sqlalchemy as sa

import assetq
from assetq import migrate, ops
from dbs import TestDatabase

TEST_REVISIONS = Path(__file__).parent / "revisions"


def test_this_package_keeps_working_against_a_newer_additive_schema(
    empty_db: TestDatabase,
) -> None:
    """A rolling deploy: a newer package (this one with the test-only steps after its
    baseline) upgrades the schema; processes of this package go on against it, through the
    first API call's check and every kind of call."""
    head = migrate.head_revision()
    migrate.use_revisions(str(TEST_REVISIONS))
    try:
        newer = assetq.install(empty_db.engine)
    finally:
        migrate.use_revisions(None)
        migrate.forget_checks()
    assert newer != head and newer not in migrate.revisions()
    with empty_db.engine.connect() as conn:
        # No revision since the baseline is breaking: every package from it works here.
        assert migrate.read_marker(conn, empty_db.namespace) == migrate.revisions()[0]
    _client(empty_db.url.render_as_string(hide_password=False), empty_db.namespace)
    report = ops.doctor(empty_db.engine, namespace=empty_db.namespace)
    assert report.checks[0].severity == "ok"
    assert "within the compatibility window" in report.checks[0].detail


# -- this package's check -------------------------------------------------------------------


def _stamp(db: TestDatabase, revision: str, marker: str | None) -> None:
    """Pretend a newer package upgraded the namespace to ``revision``, leaving ``marker``."""
    table = f"{db.dialect.quote_ns(db.namespace)}.{migrate.VERSION_TABLE}"
    with db.engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {table} SET version_num = :v"), {"v": revision})
        sql = migrate._upgrade_sql(db.dialect, "write_compat_marker", db.namespace, marker or "")
        conn.execute(sa.text(sql))
    migrate.forget_checks()


def _check(db: TestDatabase) -> None:
    with db.engine.connect() as conn:
        migrate.check_schema(conn, db.namespace)


def _status_line(db: TestDatabase) -> str:
    """The first line `assetq status` prints for the test's namespace."""
    from assetq import cli

    url = db.url.render_as_string(hide_password=False)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cli.main(["--url", url, "--namespace", db.namespace, "status"])
    return out.getvalue().splitlines()[0]


def test_an_older_schema_says_upgrade_it_first(
    empty_db: TestDatabase, test_revisions: tuple[str, ...]
) -> None:
    assetq.install(empty_db.engine, revision="0001_baseline")
    migrate.forget_checks()
    with pytest.raises(assetq.SchemaTooOld, match="assetq upgrade --namespace assetq"):
        _check(empty_db)
    problem = ops.doctor(empty_db.engine, namespace=empty_db.namespace).checks[0]
    assert problem.severity == "problem" and "assetq upgrade" in str(problem.fix)
    assert "upgrade the schema first: `assetq upgrade" in _status_line(empty_db)


def test_a_newer_schema_in_the_window_works_and_outside_it_says_which_package(
    db: TestDatabase,
) -> None:
    head = migrate.head_revision()
    _stamp(db, "9999_future", f"assetq schema 9999_future; works with packages from schema {head}")
    _check(db)  # within the window: no error
    revision = ops.doctor(db.engine, namespace=db.namespace).checks[0]
    assert revision.severity == "ok" and "within the compatibility window" in revision.detail

    _stamp(db, "9999_future", "assetq schema 9999_future; works with packages from schema 9998_x")
    with pytest.raises(assetq.SchemaTooNew, match="pip install -U assetq") as too_new:
        _check(db)
    assert "never `assetq upgrade`" in str(too_new.value)
    problem = ops.doctor(db.engine, namespace=db.namespace).checks[0]
    assert problem.severity == "problem" and "pip install -U assetq" in str(problem.fix)
    shown = _status_line(db)  # the command line gives the same advice, never `assetq upgrade`
    assert "pip install -U assetq" in shown and "never `assetq upgrade`" in shown

    _stamp(db, "9999_future", None)  # a schema without a marker: cannot be known to fit
    with pytest.raises(assetq.SchemaTooNew):
        _check(db)


def test_the_check_runs_once_per_engine_and_namespace(db: TestDatabase) -> None:
    migrate.forget_checks()
    _check(db)
    old = "0015_batch_lookups"  # a development schema, as its install left it
    table = f"{db.dialect.quote_ns(db.namespace)}.{migrate.VERSION_TABLE}"
    db.execute(f"UPDATE {table} SET version_num = '{old}'")
    marker = f"assetq schema {old}; works with packages from schema 0006_work_queue"
    db.execute(migrate._upgrade_sql(db.dialect, "write_compat_marker", db.namespace, marker))
    _check(db)  # found compatible once: not read again
    migrate.forget_checks()
    with pytest.raises(assetq.SchemaTooOld):
        _check(db)


def _client(url: str, namespace: str) -> None:
    """What a process of this package does: declare, register, schedule, claim, complete."""
    migrate.forget_checks()
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            assetq.declare_asset(conn, "orders", namespace=namespace)
            assetq.declare_dag(conn, "orders_report", "orders", namespace=namespace)
            event = assetq.register_event(conn, "orders", namespace=namespace)
        (run,) = assetq.schedule(engine, namespace=namespace)
        assert run.event_ids == (event.id,)
        (claim,) = assetq.claim_runs(engine, "w1", namespace=namespace)
        with engine.begin() as conn:
            assetq.complete_run(conn, claim, "success", namespace=namespace)
            assert assetq.get_run(conn, "orders_report", run.run_id, namespace=namespace).state == (
                "success"
            )
    finally:
        engine.dispose()
