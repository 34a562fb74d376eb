"""Definitions and repair (issue 13 item 7): ``doctor`` compares routine bodies, trigger timing
and level and view text with a fresh install of the installed revision, not only names
(PostgreSQL: made under a savepoint and rolled back; MySQL/MariaDB, whose DDL commits: made in
a scratch database on the same server and dropped); ``assetq repair`` re-creates what differs,
in place, data untouched (PostgreSQL)."""

from __future__ import annotations

import pytest

import assetq
from assetq import cli, migrate, sqlfiles
from assetq.dialects import MYSQL
from assetq.ops import Check
from dbs import TestDatabase, made_logins
from schema_snapshot import snapshot

#: A statement-level copy of the fan-out trigger: every name doctor checked still there, and no
#: event is fanned out any more (the issue's example was the reverse change on MySQL).
BROKEN_TRIGGER = (
    "DROP TRIGGER asset_event_fan_out ON {ns}.asset_event;"
    " CREATE TRIGGER asset_event_fan_out AFTER UPDATE ON {ns}.asset_event"
    " FOR EACH STATEMENT EXECUTE FUNCTION {ns}.asset_event_fan_out()"
)


@pytest.fixture
def pg(db: TestDatabase) -> TestDatabase:
    if db.engine_name != "postgresql":
        pytest.skip("PostgreSQL: the reference install under a savepoint, and repair")
    return db


def _definitions(db: TestDatabase) -> Check:
    report = assetq.doctor(db.engine, namespace=db.namespace)
    return next(c for c in report.checks if c.name == "definitions")


def _fan_out_function(db: TestDatabase) -> str:
    name = db.scalar(
        "SELECT p.proname FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid"
        " WHERE t.tgname = 'asset_event_fan_out'"
    )
    return str(name)


def test_doctor_finds_a_fresh_install_as_its_revision_defines_it(pg: TestDatabase) -> None:
    check = _definitions(pg)
    assert check.severity == "ok", check
    assert (
        pg.scalar("SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'assetq_reference%'") == 0
    )


def test_doctor_finds_an_upgraded_install_as_its_revision_defines_it(
    empty_db: TestDatabase,
) -> None:
    if empty_db.engine_name != "postgresql":
        pytest.skip("PostgreSQL only")
    assetq.install(empty_db.engine, revision="0003_operations")
    assetq.install(empty_db.engine)
    assert _definitions(empty_db).severity == "ok"


def test_a_trigger_recreated_at_another_level_is_found_and_repaired(pg: TestDatabase) -> None:
    function = _fan_out_function(pg)
    pg.execute(BROKEN_TRIGGER.replace("asset_event_fan_out()", f"{function}()"))
    with pg.engine.begin() as conn:
        assetq.declare_asset(conn, "orders", namespace=pg.namespace)
        assetq.declare_dag(conn, "report", "orders", namespace=pg.namespace)
    check = _definitions(pg)
    assert check.severity == "problem"
    assert "trigger asset_event_fan_out differs" in check.detail
    assert "assetq repair" in check.fix

    before = {k: v for k, v in snapshot(pg).items() if "trigger" not in k}
    assert migrate.repair(pg.engine, pg.namespace) == ["trigger asset_event_fan_out"]
    assert _definitions(pg).severity == "ok"
    assert {k: v for k, v in snapshot(pg).items() if "trigger" not in k} == before
    with pg.engine.begin() as conn:  # registrations fan out again
        assetq.register_event(conn, "orders", namespace=pg.namespace)
    assert pg.scalar("SELECT count(*) FROM {ns}.asset_dag_run_queue") == 1


def test_a_routine_body_changed_by_hand_is_repaired_with_its_grants(pg: TestDatabase) -> None:
    body = pg.scalar(
        "SELECT pg_get_functiondef(p.oid) FROM pg_proc p"
        " JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = :ns AND p.proname = 'declare_asset'",
        ns=pg.namespace,
    )
    pg.execute("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {ns} TO PUBLIC")
    changed = str(body).replace("BEGIN", "BEGIN\n  PERFORM 1;", 1)
    assert changed != body
    with pg.engine.begin() as conn:
        conn.exec_driver_sql(changed.replace("%", "%%"))
    check = _definitions(pg)
    assert check.severity == "problem" and "routine declare_asset(" in check.detail
    code = cli.main(
        [
            "--url",
            pg.url.render_as_string(hide_password=False),
            "--namespace",
            pg.namespace,
            "repair",
        ]
    )
    assert code == cli.EXIT_OK
    assert _definitions(pg).severity == "ok"
    with pg.engine.begin() as conn:
        assetq.declare_asset(conn, "orders", namespace=pg.namespace)


def test_repair_of_an_intact_namespace_changes_nothing(pg: TestDatabase) -> None:
    before = snapshot(pg)
    assert migrate.repair(pg.engine, pg.namespace) == []
    assert snapshot(pg) == before


def test_repair_refuses_mysql(db: TestDatabase) -> None:
    if db.engine_name != "mysql":
        pytest.skip("MySQL only")
    with pytest.raises(assetq.AssetqError, match="PostgreSQL only"):
        migrate.repair(db.engine, db.namespace)


def test_a_dropped_trigger_is_pointed_at_repair_and_re_created(pg: TestDatabase) -> None:
    pg.execute("DROP TRIGGER asset_event_fan_out ON {ns}.asset_event")
    report = assetq.doctor(pg.engine, namespace=pg.namespace)
    missing = next(c for c in report.checks if c.name == "trigger asset_event_fan_out")
    assert "assetq repair" in missing.fix
    assert migrate.repair(pg.engine, pg.namespace) == ["trigger asset_event_fan_out"]
    assert assetq.doctor(pg.engine, namespace=pg.namespace).ok


# -- MySQL/MariaDB: the reference install goes into a scratch database ----------------------


@pytest.fixture
def my(db: TestDatabase) -> TestDatabase:
    if db.engine_name != "mysql":
        pytest.skip("MySQL only")
    return db


def _scratch_databases(db: TestDatabase) -> list[str]:
    return [str(r[0]) for r in db.rows("SHOW DATABASES LIKE 'assetq\\_reference%'")]


def _packaged(db: TestDatabase, kind: str, name: str) -> str:
    """The CREATE statement of ``name`` in the packaged schema, for the test's namespace."""
    schema = sqlfiles.render(sqlfiles.read("mysql", "schema.sql"), MYSQL.quote_ns(db.namespace))
    marker = f"{kind} {MYSQL.quote_ns(db.namespace)}.{name}"
    return next(s for s in sqlfiles.split_script(schema) if marker in s)


def test_mysql_doctor_finds_a_fresh_install_as_its_revision_defines_it(my: TestDatabase) -> None:
    check = _definitions(my)
    assert check.severity == "ok", check
    assert _scratch_databases(my) == []  # the reference database was dropped


def test_mysql_doctor_finds_an_upgraded_install_as_its_revision_defines_it(
    empty_db: TestDatabase,
) -> None:
    if empty_db.engine_name != "mysql":
        pytest.skip("MySQL only")
    assetq.install(empty_db.engine, revision="0005_wakeup_on_demand")
    assetq.install(empty_db.engine)
    assert _definitions(empty_db).severity == "ok"
    assert _scratch_databases(empty_db) == []


def test_mysql_a_trigger_recreated_on_another_event_is_found(my: TestDatabase) -> None:
    """Every name doctor checked before is still there; no event is fanned out any more."""
    my.execute("DROP TRIGGER {ns}.asset_event_fan_out")
    my.execute(
        "CREATE TRIGGER {ns}.asset_event_fan_out AFTER UPDATE ON {ns}.asset_event"
        " FOR EACH ROW SET @assetq_test = NEW.id"
    )
    check = _definitions(my)
    assert check.severity == "problem", check
    assert "trigger asset_event_fan_out differs" in check.detail
    assert "assetq sql --to" in check.fix and "LOCK TABLES" in check.fix
    assert _scratch_databases(my) == []


def test_mysql_a_routine_body_changed_by_hand_is_found(my: TestDatabase) -> None:
    create = _packaged(my, "PROCEDURE", "declare_asset")
    changed = create.replace("SELECT v_id AS asset_id;", "DO 0;\n    SELECT v_id AS asset_id;")
    assert changed != create
    my.execute("DROP PROCEDURE {ns}.declare_asset")
    with my.engine.connect() as conn:
        conn.exec_driver_sql(changed.replace("%", "%%"))
    check = _definitions(my)
    assert check.severity == "problem" and "routine declare_asset differs" in check.detail
    my.execute("DROP PROCEDURE {ns}.declare_asset")  # as the packaged schema has it: ok again
    with my.engine.connect() as conn:
        conn.exec_driver_sql(create.replace("%", "%%"))
    assert _definitions(my).severity == "ok"


def test_mysql_an_account_that_may_not_create_a_database_is_told_so(my: TestDatabase) -> None:
    with made_logins(my, ("operator",), "aqdoc") as logins:
        login = logins["operator"]
        user, host = login.grantee if isinstance(login.grantee, tuple) else (login.name, "%")
        my.execute(f"GRANT ALL ON {{ns}}.* TO '{user}'@'{host}'")
        report = assetq.doctor(login.engine, namespace=my.namespace)
        login.engine.dispose()
    check = next(c for c in report.checks if c.name == "definitions")
    assert check.severity == "note" and "not compared" in check.detail, check
    assert "may create and drop a database" in check.fix
    assert _scratch_databases(my) == []
