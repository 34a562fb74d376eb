"""MySQL single-database installs (issue 13, item 6): assetq in the application's own
database, next to its tables. assetq's schema creates its tables IF NOT EXISTS and replaces
its routines, triggers and views, so an application object with one of assetq's names was
taken over: a `dag` table failed the install half-way, a `dagrun_asset_event` table was taken
for assetq's (and dropped by uninstall, rows and all), a `dag_queue_status` view or a
`register_event` procedure was replaced without a word. The install now lists such objects
and refuses before it creates anything (InstallRefused, AQ122); the database stays exactly as
it was. docs/operations.md, "MySQL single-database installs"."""

from __future__ import annotations

import re

import pymysql
import pytest
import sqlalchemy as sa

import assetq
from assetq import cli, migrate, routines, sqlfiles
from assetq.dialects import MYSQL, Dialect
from dbs import MYSQL_APP_DATABASE, TestDatabase

pytestmark = pytest.mark.engines("mysql")

NS = MYSQL_APP_DATABASE  # the URL's own database: the application's


def _app(db: TestDatabase, *statements: str) -> None:
    with db.engine.begin() as conn:
        for statement in statements:
            conn.execute(sa.text(statement))


def _state(db: TestDatabase) -> dict[str, object]:
    """Every object of the application's database with its definition, and its tables' rows."""
    with db.engine.connect() as conn:
        tables = conn.execute(
            sa.text(
                "SELECT TABLE_NAME, TABLE_TYPE FROM information_schema.TABLES"
                " WHERE TABLE_SCHEMA = :ns ORDER BY 1"
            ),
            {"ns": NS},
        ).all()
        state: dict[str, object] = {}
        for name, kind in tables:
            shown = conn.execute(sa.text(f"SHOW CREATE TABLE `{name}`")).one()
            state[f"{kind} {name}"] = shown[1]
            if kind == "BASE TABLE":
                rows = conn.execute(sa.text(f"SELECT * FROM `{name}`")).all()
                state[f"rows {name}"] = sorted(tuple(r) for r in rows)
        for name, body in conn.execute(
            sa.text(
                "SELECT ROUTINE_NAME, ROUTINE_DEFINITION FROM information_schema.ROUTINES"
                " WHERE ROUTINE_SCHEMA = :ns"
            ),
            {"ns": NS},
        ):
            state[f"routine {name}"] = body
        for name, body in conn.execute(
            sa.text(
                "SELECT TRIGGER_NAME, ACTION_STATEMENT FROM information_schema.TRIGGERS"
                " WHERE TRIGGER_SCHEMA = :ns"
            ),
            {"ns": NS},
        ):
            state[f"trigger {name}"] = body
    return state


def test_install_next_to_airflows_dag_and_asset_tables_names_them_and_creates_nothing(
    empty_db: TestDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    _app(
        empty_db,
        "CREATE TABLE dag (dag_id varchar(250) PRIMARY KEY, is_paused bool)",
        "CREATE TABLE asset (id int PRIMARY KEY, uri varchar(1500))",
        "INSERT INTO dag VALUES ('etl', false)",
        "CREATE TABLE orders (id int PRIMARY KEY)",
    )
    before = _state(empty_db)
    with pytest.raises(assetq.InstallRefused) as refused:
        assetq.install(empty_db.engine, namespace=NS)
    assert refused.value.code == "AQ122"
    assert refused.value.conflicts == ("table asset", "table dag")
    assert "table asset, table dag" in str(refused.value)
    assert "database of its own" in str(refused.value)
    # It used to fail half-way (1005), after creating assetq's asset... in the user's table.
    assert _state(empty_db) == before
    url = empty_db.url.render_as_string(hide_password=False)
    assert cli.main(["--url", url, "install", "--namespace", NS]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("assetq install: error [AQ122]: "), err
    assert _state(empty_db) == before


def test_a_table_install_would_have_taken_for_its_own_is_refused_and_uninstall_keeps_it(
    empty_db: TestDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: the install succeeded on the application's dagrun_asset_event (CREATE TABLE IF
    NOT EXISTS), and uninstall then dropped it with its rows."""
    _app(
        empty_db,
        "CREATE TABLE dagrun_asset_event (note varchar(20))",
        "INSERT INTO dagrun_asset_event VALUES ('the app''s row')",
    )
    before = _state(empty_db)
    with pytest.raises(assetq.InstallRefused) as refused:
        assetq.install(empty_db.engine, namespace=NS)
    assert refused.value.conflicts == ("table dagrun_asset_event",)
    url = empty_db.url.render_as_string(hide_password=False)
    assert cli.main(["--url", url, "uninstall", "--yes", "--namespace", NS]) == cli.EXIT_OK
    assert "nothing to remove" in capsys.readouterr().out
    assert _state(empty_db) == before


def test_an_applications_view_and_procedure_with_assetq_names_are_refused_not_replaced(
    empty_db: TestDatabase,
) -> None:
    _app(
        empty_db,
        "CREATE VIEW dag_queue_status AS SELECT 'the app''s view' AS mine",
        "CREATE PROCEDURE register_event() SELECT 'the app''s procedure' AS mine",
    )
    before = _state(empty_db)
    with pytest.raises(assetq.InstallRefused) as refused:
        assetq.install(empty_db.engine, namespace=NS)
    assert refused.value.conflicts == ("routine register_event", "view dag_queue_status")
    assert _state(empty_db) == before


def test_an_upgrade_that_would_replace_an_applications_procedure_is_refused(
    empty_db: TestDatabase, test_revisions: tuple[str, ...]
) -> None:
    """assetq's routines come when the schema reaches the package's head: below it (here at
    the first test-only revision, head being the second) the namespace holds assetq's tables
    only. An application that has a claim_runs of its own there keeps it, and assetq stays
    where it was."""
    below_head = test_revisions[-2]
    assetq.install(empty_db.engine, namespace=NS, revision=below_head)
    _app(empty_db, "CREATE PROCEDURE claim_runs() SELECT 'the app''s procedure' AS mine")
    before = _state(empty_db)
    with pytest.raises(assetq.InstallRefused) as refused:
        assetq.install(empty_db.engine, namespace=NS)
    assert refused.value.conflicts == ("routine claim_runs",)
    assert refused.value.revision == test_revisions[-1]
    assert _state(empty_db) == before
    with empty_db.engine.connect() as conn:
        assert assetq.current_revision(conn, namespace=NS) == below_head


def test_a_newer_packages_routine_never_replaces_an_applications_procedure(
    empty_db: TestDatabase,
) -> None:
    """A newer package may bring a routine file with no revision (its body is applied by
    checksum when the schema is at head). If the application has a procedure of that name,
    the install refuses and replaces nothing. Stood for here by retry_run: dropped, forgotten
    by the catalogue, and the application's own put in its place."""
    assetq.install(empty_db.engine, namespace=NS)
    _app(
        empty_db,
        "DROP PROCEDURE retry_run",
        "DELETE FROM routine_catalogue WHERE kind = 'routine' AND name = 'retry_run'",
        "CREATE PROCEDURE retry_run() SELECT 'the app''s procedure' AS mine",
    )
    before = _state(empty_db)
    with pytest.raises(assetq.InstallRefused) as refused:
        assetq.install(empty_db.engine, namespace=NS)
    assert refused.value.code == "AQ122" and refused.value.conflicts == ("routine retry_run",)
    assert _state(empty_db) == before
    # Nor does a repair, which re-creates through the same path.
    with pytest.raises(assetq.InstallRefused) as refused:
        migrate.repair(empty_db.engine, namespace=NS)
    assert refused.value.code == "AQ122" and refused.value.conflicts == ("routine retry_run",)
    assert _state(empty_db) == before


def test_a_retried_upgrade_takes_what_its_failed_attempt_created_for_assetqs(
    empty_db: TestDatabase, monkeypatch: pytest.MonkeyPatch, test_revisions: tuple[str, ...]
) -> None:
    """Each DDL statement commits on MySQL: an upgrade to head that meets a lock timeout after
    creating claim_runs (routines are created when the schema reaches head) leaves it behind,
    and its retry (here the install's own, on 1205) must not refuse it as the application's.
    The step marks the schema "upgrading to <head>" first."""
    assetq.install(empty_db.engine, namespace=NS, revision=test_revisions[-2])
    run_statements = type(MYSQL).run_statements
    failed: list[str] = []

    def times_out_once(self: Dialect, conn: sa.Connection, statements: list[str]) -> None:
        made = [
            i
            for i, s in enumerate(statements)
            if re.match(r"CREATE (OR REPLACE )?PROCEDURE \S+\.claim_runs\(", s)
        ]
        if failed or not made:
            return run_statements(self, conn, statements)
        failed.append("claim_runs")
        run_statements(self, conn, statements[: made[0] + 1])
        raise pymysql.err.OperationalError(1205, "Lock wait timeout exceeded (injected)")

    monkeypatch.setattr(type(MYSQL), "run_statements", times_out_once)
    assert assetq.install(empty_db.engine, namespace=NS) == assetq.head_revision()
    assert failed == ["claim_runs"]
    with empty_db.engine.connect() as conn:
        assert (
            conn.execute(
                sa.text(
                    "SELECT COUNT(*) FROM information_schema.ROUTINES"
                    " WHERE ROUTINE_SCHEMA = :ns AND ROUTINE_NAME = 'claim_runs'"
                ),
                {"ns": NS},
            ).scalar()
            == 1
        )
        assert routines.differences(conn, NS) == []


def test_a_failed_install_removes_what_it_created_and_not_what_the_application_did_meanwhile(
    empty_db: TestDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The clean-up of a failed install dropped everything new in the namespace since it
    started: here the application's own table created while the install ran."""

    def fails_half_way(self: Dialect, conn: sa.Connection, script: str, namespace: str) -> None:
        _app(empty_db, "CREATE TABLE orders_meanwhile (id int PRIMARY KEY)")
        statements = sqlfiles.split_script(sqlfiles.render(script, self.quote_ns(namespace)))
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        for statement in statements[:5]:  # the first of assetq's tables
            cursor.execute(statement)
        raise pymysql.err.OperationalError(1370, "execute command denied (injected)")

    monkeypatch.setattr(type(MYSQL), "run_script", fails_half_way)
    with pytest.raises(assetq.MigrationFailed) as failed:
        assetq.install(empty_db.engine, namespace=NS)
    assert failed.value.code == "1370"
    assert [k for k in _state(empty_db) if not k.startswith("rows ")] == [
        "BASE TABLE orders_meanwhile"
    ]
