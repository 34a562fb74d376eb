"""Definitions and repair: ``doctor`` compares every routine, trigger and view with this
package's file for it (assetq.routines.differences: the checksums routine_catalogue recorded
and the definitions the server prints), creating nothing and needing no right beyond the
namespace; ``assetq repair`` re-creates what differs (assetq.routines.sync, under the namespace
lock), in place, data untouched, on both engines, and leaves alone what a newer package wrote.

PostgreSQL repairs in one transaction (CREATE OR REPLACE keeps a routine's grants). MariaDB
replaces a routine or trigger in one statement (CREATE OR REPLACE PROCEDURE / TRIGGER): its
grants stay, and an INSERT or CALL meanwhile waits for the new trigger (forced here). MySQL
proper (routines.replaces_atomically is False; forced here on MariaDB: the ``mysql_path``
fixture) drops and creates again, committing each statement: a routine's grants (which DROP
PROCEDURE revokes) are saved in the namespace before and given back after; a trigger is
swapped with its table locked for writing, so a producer's INSERT meanwhile waits and then
fires the new trigger (forced here, not left to timing).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

import assetq
from assetq import cli, migrate, routines, sqlfiles
from assetq.dialects import MYSQL
from assetq.ops import Check
from dbs import Login, TestDatabase, made_logins
from races import in_thread
from schema_snapshot import snapshot

#: A statement-level copy of the fan-out trigger: every name doctor checks still there, and no
#: event is fanned out any more (the issue's example was the reverse change on MySQL).
BROKEN_TRIGGER = (
    "DROP TRIGGER asset_event_fan_out ON {ns}.asset_event;"
    " CREATE TRIGGER asset_event_fan_out AFTER UPDATE ON {ns}.asset_event"
    " FOR EACH STATEMENT EXECUTE FUNCTION {ns}.asset_event_fan_out()"
)

#: MariaDB's state of a session waiting for a table's metadata lock (a DDL statement waiting
#: for the transactions that use the table, or a statement queued behind that DDL).
METADATA_LOCK_WAITS = (
    "SELECT count(*) FROM information_schema.processlist"
    " WHERE state = 'Waiting for table metadata lock'"
)


@pytest.fixture
def my(db: TestDatabase) -> TestDatabase:
    if db.engine_name != "mysql":
        pytest.skip("MySQL only")
    return db


@pytest.fixture
def mariadb(my: TestDatabase) -> TestDatabase:
    """The default path of the suite's servers: MariaDB, which replaces in one statement."""
    with my.engine.connect() as conn:
        if not routines.replaces_atomically(conn):
            pytest.skip("MariaDB only: CREATE OR REPLACE PROCEDURE / TRIGGER")
    return my


@pytest.fixture
def mysql_path(my: TestDatabase, monkeypatch: pytest.MonkeyPatch) -> TestDatabase:
    """MySQL proper's path, forced on the suite's MariaDB: DROP and CREATE, grants saved and
    given back, a trigger swapped under LOCK TABLES."""
    monkeypatch.setattr(routines, "replaces_atomically", lambda conn: False)
    return my


def _definitions(db: TestDatabase, bind: sa.Engine | None = None) -> Check:
    report = assetq.doctor(bind or db.engine, namespace=db.namespace)
    (check,) = [c for c in report.checks if c.name == "definitions"]
    return check


def _fan_out_function(db: TestDatabase) -> str:
    name = db.scalar(
        "SELECT p.proname FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid"
        " WHERE t.tgname = 'asset_event_fan_out'"
    )
    return str(name)


def _packaged(db: TestDatabase, path: str) -> str:
    """MySQL: the CREATE statement of the object file ``path`` (``routines/<name>.sql``),
    for the test's namespace."""
    script = sqlfiles.render(sqlfiles.read("mysql", path), MYSQL.quote_ns(db.namespace))
    (create,) = [s for s in sqlfiles.split_script(script) if s.lstrip().startswith("CREATE")]
    return create


def _replaces_in_place(db: TestDatabase) -> bool:
    with db.engine.connect() as conn:
        return db.engine_name == "mysql" and routines.replaces_atomically(conn)


def _outside(db: TestDatabase) -> list[str]:
    """What lies next to the namespace: the database's schemas (PostgreSQL, temporary ones
    aside) or the server's databases (MySQL: a throw-away server per test database)."""
    if db.engine_name == "postgresql":
        found = db.rows(
            "SELECT nspname FROM pg_namespace WHERE nspname NOT LIKE 'pg\\_temp\\_%'"
            " AND nspname NOT LIKE 'pg\\_toast\\_temp\\_%' ORDER BY 1"
        )
    else:
        found = db.rows("SHOW DATABASES")
    return sorted(str(r[0]) for r in found)


# -- how each engine breaks an object by hand (the SQL differs, the tests do not) ------------


def _break_register_event(db: TestDatabase, by: sa.Engine | None = None) -> None:
    """register_event's body changed (one statement more, same behaviour), name and
    parameters kept, so only the definitions check can tell; by the test's administrator or
    by ``by``. In place where the server can (PostgreSQL, MariaDB: its grants stay); MySQL:
    dropped and created again."""
    if db.engine_name == "postgresql":
        body = str(
            db.scalar(
                "SELECT pg_get_functiondef(p.oid) FROM pg_proc p"
                " JOIN pg_namespace n ON n.oid = p.pronamespace"
                " WHERE n.nspname = :ns AND p.proname = 'register_event'",
                ns=db.namespace,
            )
        )
        changed = body.replace("BEGIN", "BEGIN\n  PERFORM 1;", 1)
    else:
        body = _packaged(db, "routines/register_event.sql")
        end = body.rindex("END")
        changed = body[:end] + "DO 0;\n" + body[end:]
        if _replaces_in_place(db):
            changed = changed.replace("CREATE PROCEDURE", "CREATE OR REPLACE PROCEDURE", 1)
        else:
            with (by or db.engine).begin() as conn:
                conn.execute(sa.text(db.sql("DROP PROCEDURE {ns}.register_event")))
    assert changed != body
    with (by or db.engine).begin() as conn:
        conn.exec_driver_sql(changed.replace("%", "%%"))


def _break_fan_out_trigger(db: TestDatabase) -> None:
    """The fan-out trigger re-created on another event or level: its name is still there and
    no registration is queued for anyone."""
    if db.engine_name == "postgresql":
        function = _fan_out_function(db)
        db.execute(BROKEN_TRIGGER.replace("asset_event_fan_out()", f"{function}()"))
    else:
        db.execute("DROP TRIGGER {ns}.asset_event_fan_out")
        db.execute(
            "CREATE TRIGGER {ns}.asset_event_fan_out AFTER UPDATE ON {ns}.asset_event"
            " FOR EACH ROW SET @assetq_test = NEW.id"
        )


def _some_data(db: TestDatabase) -> None:
    with db.engine.begin() as conn:
        assetq.declare_asset(conn, "orders", namespace=db.namespace)
        assetq.declare_dag(conn, "report", "orders", namespace=db.namespace)
        assetq.register_event(conn, "orders", namespace=db.namespace)
        assetq.register_event(conn, "orders", namespace=db.namespace)
    assetq.schedule(db.engine, namespace=db.namespace)
    with db.engine.begin() as conn:
        assetq.register_event(conn, "orders", namespace=db.namespace)


def _cli_repair(
    db: TestDatabase, capsys: pytest.CaptureFixture[str], url: sa.URL | None = None
) -> tuple[int, str, str]:
    shown = (url or db.url).render_as_string(hide_password=False)
    code = cli.main(["--url", shown, "--namespace", db.namespace, "repair"])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def producer(db: TestDatabase) -> Iterator[Login]:
    """A login that may register events (EXECUTE on register_event and register_events)."""
    with made_logins(db, ("producer",), "aqrep") as made:
        assetq.grant_roles(db.engine, producer=made["producer"].grantee, namespace=db.namespace)
        yield made["producer"]


def _registers(db: TestDatabase, login: Login) -> int:
    """``login`` registers an event through register_event, the routine the tests here
    break and repair (savepoint=False calls it; the default calls register_event_v2)."""
    with login.engine.begin() as conn:
        return assetq.register_event(conn, "orders", savepoint=False, namespace=db.namespace).id


@contextmanager
def _namespace_reader(db: TestDatabase) -> Iterator[Login]:
    """A login whose only rights are on the namespace, as an on-call engineer's: MySQL every
    right on its database (none on mysql.*, none to create another database), PostgreSQL
    USAGE on its schema and SELECT on its tables (no CREATE on the database). It did not
    install the namespace: its objects' definer (MySQL) or owner (PostgreSQL) is another."""
    with made_logins(db, ("doctor",), "aqdoc") as logins:
        login = logins["doctor"]
        if db.engine_name == "mysql":
            user, host = login.grantee if isinstance(login.grantee, tuple) else (login.name, "%")
            db.execute(f"GRANT ALL ON {{ns}}.* TO '{user}'@'{host}'")
        else:
            db.execute(f'GRANT USAGE ON SCHEMA {{ns}} TO "{login.name}"')
            db.execute(f'GRANT SELECT ON ALL TABLES IN SCHEMA {{ns}} TO "{login.name}"')
        yield login
        login.engine.dispose()


#: PostgreSQL: the schema :'ns' and every table, view and function in it given to role
#: :'role' (the tables' sequences and triggers go with them).
_GIVE_NAMESPACE = """
DO $$
DECLARE
    r record;
BEGIN
    EXECUTE format('ALTER SCHEMA %I OWNER TO %I', :'ns', :'role');
    FOR r IN SELECT c.relname, c.relkind FROM pg_class c
               JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = :'ns' AND c.relkind IN ('r', 'p', 'v')
    LOOP
        EXECUTE format('ALTER %s %I.%I OWNER TO %I',
                       CASE r.relkind WHEN 'v' THEN 'VIEW' ELSE 'TABLE' END,
                       :'ns', r.relname, :'role');
    END LOOP;
    FOR r IN SELECT p.oid::regprocedure AS routine FROM pg_proc p
               JOIN pg_namespace n ON n.oid = p.pronamespace
              WHERE n.nspname = :'ns'
    LOOP
        EXECUTE format('ALTER FUNCTION %s OWNER TO %I', r.routine, :'role');
    END LOOP;
END
$$
"""


def _give_namespace(db: TestDatabase, role: str) -> None:
    db.execute(
        _GIVE_NAMESPACE.replace(":'ns'", f"'{db.namespace}'").replace(":'role'", f"'{role}'")
    )


@contextmanager
def _namespace_owner(db: TestDatabase) -> Iterator[tuple[Login, TestDatabase]]:
    """A login whose only rights are on a namespace, all of them, as the account that
    installs and repairs: PostgreSQL the owner of the test's schema and of everything in it
    (no CREATE on the database, no other role); MySQL every right on a database ``aqown``
    (none on mysql.*: it cannot read the routines' grants), into which it installs assetq
    itself, so it is its objects' definer. Yields the login and the test database seen
    through that namespace."""
    with made_logins(db, ("owner",), "aqown") as logins:
        login = logins["owner"]
        if db.engine_name == "mysql":
            owned = replace(db, namespace="aqown")
            user, host = login.grantee if isinstance(login.grantee, tuple) else (login.name, "%")
            owned.execute(f"GRANT ALL ON {{ns}}.* TO '{user}'@'{host}'")
            assetq.install(login.engine, namespace=owned.namespace)
            yield login, owned
        else:
            admin = str(db.scalar("SELECT current_user"))
            _give_namespace(db, login.name)
            try:
                yield login, db
            finally:
                _give_namespace(db, admin)
        login.engine.dispose()


# -- doctor: compared with the files, nothing created, no right beyond the namespace ----------


def test_doctor_finds_a_fresh_install_as_its_files_define_it(db: TestDatabase) -> None:
    outside = _outside(db)
    check = _definitions(db)
    assert check.severity == "ok", check
    assert _outside(db) == outside  # no scratch schema or database, not even for a while


def test_doctor_finds_an_upgraded_install_as_its_files_define_it(
    empty_db: TestDatabase, test_revisions: tuple[str, ...]
) -> None:
    """Installed at the baseline (no routine yet: they are created at the head), then
    upgraded through the test-only revisions: every object as its file defines it."""
    assetq.install(empty_db.engine, revision="0001_baseline")
    assetq.install(empty_db.engine)
    outside = _outside(empty_db)
    assert _definitions(empty_db).severity == "ok"
    assert _outside(empty_db) == outside


def test_doctor_and_repair_need_no_right_beyond_the_namespace(
    db: TestDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    """The old comparison needed a scratch database (or schema): an account with rights on
    the namespace only was told it could not compare. Now the account that owns the
    namespace and nothing else (it installed it, MySQL; it owns it, PostgreSQL) compares,
    finds a body changed by hand, and repairs it with its grants, creating nothing outside
    the namespace. On MariaDB no grant needs saving (CREATE OR REPLACE keeps them), so not
    reading mysql.procs_priv is no reason to refuse. MySQL proper drops and creates, and
    DROP PROCEDURE takes the routine's grants with it: its repair refuses (AQ124, nothing
    changed) until the account may read mysql.procs_priv and mysql.user to give them back,
    the rights beyond the namespace it needs, with GRANT OPTION on the namespace (the MariaDB
    half is forced in
    test_mysql_path_an_account_that_may_not_read_the_grants_is_refused_before_any_change)."""
    with _namespace_owner(db) as (owner, ns), made_logins(db, ("producer",), "aqrep") as made:
        producer = made["producer"]
        outside = _outside(ns)
        assert _definitions(ns, owner.engine).severity == "ok"
        _some_data(ns)
        assetq.grant_roles(ns.engine, producer=producer.grantee, namespace=ns.namespace)
        before = snapshot(ns)
        _break_register_event(ns, by=owner.engine)
        if ns.engine_name == "mysql" and not _replaces_in_place(ns):  # the drop cost the grant
            assetq.grant_roles(ns.engine, producer=producer.grantee, namespace=ns.namespace)
        check = _definitions(ns, owner.engine)
        assert check.severity == "problem", check
        assert "routine register_event was changed by hand" in check.detail, check
        assert f"assetq repair --namespace {ns.namespace}" in check.fix

        if ns.engine_name == "mysql" and not _replaces_in_place(ns):
            code, out, err = _cli_repair(ns, capsys, url=owner.engine.url)
            assert code == cli.EXIT_ERROR and "[AQ124]" in err, err
            assert _definitions(ns, owner.engine).severity == "problem"  # nothing changed
            user, host = owner.grantee if isinstance(owner.grantee, tuple) else (owner.name, "%")
            for table in ("procs_priv", "user"):
                db.execute(f"GRANT SELECT ON mysql.{table} TO '{user}'@'{host}'")
            # And to give them back, the right to grant on the namespace (ALL leaves it out).
            # Not checked before the drop: without it (MySQL 9.7, error 1370) the repair
            # fails after creating the routine again, the grants kept for the next repair.
            ns.execute(f"GRANT EXECUTE ON {{ns}}.* TO '{user}'@'{host}' WITH GRANT OPTION")
        code, out, err = _cli_repair(ns, capsys, url=owner.engine.url)
        assert (code, err) == (cli.EXIT_OK, ""), err
        assert out.endswith(": routine register_event\n"), out
        assert _definitions(ns, owner.engine).severity == "ok"
        assert snapshot(ns) == before
        _registers(ns, producer)  # the grant is still there
        assert _outside(ns) == outside


def test_doctor_by_a_reader_of_the_namespace_compares_the_definitions(db: TestDatabase) -> None:
    """An on-call engineer's account, with rights on the namespace only, that did not install
    it: doctor finds a fresh install as its files define it, and a body changed by hand.

    MySQL/MariaDB show a routine's body only to its definer and to accounts that may read
    mysql.proc: to any other account it is NULL, and cannot be compared. doctor then says so
    (a note, never "changed by hand"), and a repair by that account re-creates nothing
    (before, both took every routine for one changed by hand); given the right to read every
    routine (MariaDB: SELECT on mysql.proc; MySQL 8.0.20+, which has no mysql.proc, the
    SHOW_ROUTINE privilege) it compares."""
    outside = _outside(db)
    with _namespace_reader(db) as login:
        check = _definitions(db, login.engine)
        if db.engine_name == "mysql":
            assert check.severity == "note" and "not compared" in check.detail, check
            assert migrate.repair(login.engine, namespace=db.namespace) == []
            user, host = login.grantee if isinstance(login.grantee, tuple) else (login.name, "%")
            with db.engine.connect() as conn:
                mariadb = bool(getattr(conn.dialect, "is_mariadb", False))
            readable = "SELECT ON mysql.proc" if mariadb else "SHOW_ROUTINE ON *.*"
            db.execute(f"GRANT {readable} TO '{user}'@'{host}'")
            check = _definitions(db, login.engine)
        assert check.severity == "ok", check
        _break_register_event(db)
        check = _definitions(db, login.engine)
    assert check.severity == "problem", check
    assert "routine register_event was changed by hand" in check.detail, check
    assert f"assetq repair --namespace {db.namespace}" in check.fix
    assert _outside(db) == outside


def test_a_body_a_newer_package_wrote_is_left_alone_and_noted(
    db: TestDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    """Forward only: during a rolling deploy an older package's repair (or install) must not
    put its own body back over the newer package's. Simulated: a body changed by hand and
    recorded as written by assetq 99.0."""
    _break_register_event(db)
    db.execute(
        "UPDATE {ns}.routine_catalogue SET package_version = '99.0'"
        " WHERE kind = 'routine' AND name = 'register_event'"
    )
    with db.engine.connect() as conn:
        newer = routines.definitions(conn, db.namespace)[("routine", "register_event")]
    report = assetq.doctor(db.engine, namespace=db.namespace)
    (check,) = [c for c in report.checks if c.name == "definitions"]
    assert check.severity == "note", check
    assert "newer assetq package (routine register_event: 99.0)" in check.detail, check
    assert report.ok

    assert migrate.repair(db.engine, namespace=db.namespace) == []
    code, out, err = _cli_repair(db, capsys)
    assert (code, err) == (cli.EXIT_OK, ""), err
    assert out.endswith(": nothing to repair\n"), out
    with db.engine.connect() as conn:
        assert routines.definitions(conn, db.namespace)[("routine", "register_event")] == newer
    assert (
        db.scalar(
            "SELECT package_version FROM {ns}.routine_catalogue"
            " WHERE kind = 'routine' AND name = 'register_event'"
        )
        == "99.0"
    )


# -- repair, both engines -----------------------------------------------------------------------


def test_repair_of_an_intact_namespace_says_there_is_nothing_to_repair(
    db: TestDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    _some_data(db)
    before, counts = snapshot(db), db.counts()
    assert migrate.repair(db.engine, namespace=db.namespace) == []
    code, out, err = _cli_repair(db, capsys)
    assert (code, err) == (cli.EXIT_OK, ""), err
    assert out.endswith(": nothing to repair\n"), out
    assert snapshot(db) == before and db.counts() == counts


def _repaired_with_its_grants(
    db: TestDatabase, producer: Login, capsys: pytest.CaptureFixture[str]
) -> None:
    """register_event changed by hand: doctor's problem, with the fix; `assetq repair` puts
    the file's body back, data untouched, and the producer's grant is still there."""
    _some_data(db)
    before, counts = snapshot(db), db.counts()
    _break_register_event(db)
    if not _replaces_in_place(db) and db.engine_name == "mysql":  # the drop cost the grant
        assetq.grant_roles(db.engine, producer=producer.grantee, namespace=db.namespace)
    _registers(db, producer)
    counts["asset_event"] += 1
    counts["asset_dag_run_queue"] += 1
    check = _definitions(db)
    assert check.severity == "problem", check
    assert "routine register_event was changed by hand" in check.detail, check
    assert f"assetq repair --namespace {db.namespace}" in check.fix

    code, out, err = _cli_repair(db, capsys)
    assert (code, err) == (cli.EXIT_OK, ""), err
    assert "routine register_event" in out and "nothing to repair" not in out, out
    assert _definitions(db).severity == "ok"
    assert snapshot(db) == before  # as installed, the sql_mode too on MySQL
    assert db.counts() == counts  # data untouched
    _registers(db, producer)  # the grant is still there
    assert db.scalar("SELECT count(*) FROM {ns}.asset_dag_run_queue") == (
        counts["asset_dag_run_queue"] + 1
    )


def test_a_routine_body_changed_by_hand_is_repaired_with_its_grants(
    db: TestDatabase, producer: Login, capsys: pytest.CaptureFixture[str]
) -> None:
    """PostgreSQL and MariaDB: replaced in place (CREATE OR REPLACE), grants kept by it."""
    _repaired_with_its_grants(db, producer, capsys)


def test_mysql_path_a_routine_body_changed_by_hand_is_repaired_with_its_grants(
    mysql_path: TestDatabase, producer: Login, capsys: pytest.CaptureFixture[str]
) -> None:
    """MySQL: dropped and created again, the grants saved before and given back after."""
    _repaired_with_its_grants(mysql_path, producer, capsys)
    assert "_assetq_repair_grants" not in {r[0] for r in snapshot(mysql_path)["relations"]}


def test_a_trigger_recreated_wrong_is_found_and_repaired(db: TestDatabase) -> None:
    _some_data(db)
    before, counts = snapshot(db), db.counts()
    _break_fan_out_trigger(db)
    check = _definitions(db)
    assert check.severity == "problem", check
    assert "trigger asset_event_fan_out was changed by hand" in check.detail
    assert "assetq repair" in check.fix

    assert migrate.repair(db.engine, namespace=db.namespace) == ["trigger asset_event_fan_out"]
    assert _definitions(db).severity == "ok"
    assert snapshot(db) == before
    assert db.counts() == counts
    with db.engine.begin() as conn:  # registrations fan out again
        assetq.register_event(conn, "orders", namespace=db.namespace)
    assert db.scalar("SELECT count(*) FROM {ns}.asset_dag_run_queue") == 2


def test_a_dropped_trigger_is_pointed_at_repair_and_re_created(db: TestDatabase) -> None:
    db.execute(
        "DROP TRIGGER asset_event_fan_out ON {ns}.asset_event"
        if db.engine_name == "postgresql"
        else "DROP TRIGGER {ns}.asset_event_fan_out"
    )
    report = assetq.doctor(db.engine, namespace=db.namespace)
    missing = next(c for c in report.checks if c.name == "trigger asset_event_fan_out")
    assert "assetq repair" in missing.fix
    assert migrate.repair(db.engine, namespace=db.namespace) == ["trigger asset_event_fan_out"]
    assert assetq.doctor(db.engine, namespace=db.namespace).ok


def test_a_dropped_view_is_re_created(db: TestDatabase) -> None:
    _some_data(db)
    before, counts = snapshot(db), db.counts()
    db.execute("DROP VIEW {ns}.dag_queue_status")
    report = assetq.doctor(db.engine, namespace=db.namespace)  # no crash reading the work
    missing = next(c for c in report.checks if c.name == "view dag_queue_status")
    assert missing.severity == "problem" and "assetq repair" in missing.fix, missing
    assert migrate.repair(db.engine, namespace=db.namespace) == ["view dag_queue_status"]
    assert snapshot(db) == before and db.counts() == counts
    with db.engine.begin() as conn:
        assert [s.dag_id for s in assetq.status(conn, namespace=db.namespace)] == ["report"]


def test_a_dropped_routine_is_re_created(db: TestDatabase) -> None:
    _some_data(db)
    before, counts = snapshot(db), db.counts()
    db.execute(
        "DROP FUNCTION {ns}.purge_runs"
        if db.engine_name == "postgresql"
        else "DROP PROCEDURE {ns}.purge_runs"
    )
    report = assetq.doctor(db.engine, namespace=db.namespace)
    missing = next(c for c in report.checks if c.name == "routine purge_runs")
    assert missing.severity == "problem" and "assetq repair" in missing.fix, missing
    assert migrate.repair(db.engine, namespace=db.namespace) == ["routine purge_runs"]
    assert snapshot(db) == before and db.counts() == counts
    assert assetq.doctor(db.engine, namespace=db.namespace).ok


def test_repair_waits_for_an_install_of_the_same_namespace(db: TestDatabase) -> None:
    """The namespace lock of install/upgrade/uninstall, held here by another session: repair
    changes nothing until it is released, then repairs."""
    _break_fan_out_trigger(db)
    with db.engine.connect() as installer, installer.begin():
        rows = db.dialect.execute(
            installer, "lock_namespace", db.namespace, {"namespace": db.namespace}
        )
        assert rows[0][0] == 1
        worker, outcome = in_thread(lambda: migrate.repair(db.engine, namespace=db.namespace))
        worker.join(2)
        assert worker.is_alive() and outcome.value is None and outcome.error is None, outcome
        assert _definitions(db).severity == "problem"  # untouched while it waits
        db.dialect.execute(installer, "unlock_namespace", db.namespace, {"namespace": db.namespace})
    worker.join(120)
    assert outcome.error is None, outcome.error
    assert outcome.value == ["trigger asset_event_fan_out"], outcome


# -- MariaDB: a trigger replaced in one statement ------------------------------------------


def _producer_connection(db: TestDatabase, wait: int) -> Connection:
    conn = db.engine.connect()
    conn.execute(
        sa.text("SET SESSION lock_wait_timeout = :w, innodb_lock_wait_timeout = :w"), {"w": wait}
    )
    conn.commit()
    return conn


def _insert_event(db: TestDatabase, conn: Connection) -> int:
    """A raw producer INSERT (another program's), in ``conn``'s open transaction."""
    asset_id = conn.execute(sa.text(db.sql("SELECT id FROM {ns}.asset WHERE name = 'orders'")))
    conn.execute(
        sa.text(db.sql("INSERT INTO {ns}.asset_event (asset_id) VALUES (:a)")),
        {"a": asset_id.scalar_one()},
    )
    return int(conn.execute(sa.text("SELECT LAST_INSERT_ID()")).scalar_one())


def _metadata_lock_waiters(db: TestDatabase, count: int, timeout: float = 30) -> int:
    """Wait until ``count`` sessions wait for a table's metadata lock; how many do then."""
    deadline = time.monotonic() + timeout
    waiting = int(db.scalar(METADATA_LOCK_WAITS))
    while waiting < count and time.monotonic() < deadline:
        time.sleep(0.02)
        waiting = int(db.scalar(METADATA_LOCK_WAITS))
    return waiting


def _queued_for(db: TestDatabase, event_id: object) -> list[str]:
    rows = db.rows(
        "SELECT target_dag_id FROM {ns}.asset_dag_run_queue WHERE asset_event_id = :e", e=event_id
    )
    return [str(r.target_dag_id) for r in rows]


def test_mariadb_an_insert_and_a_call_while_repair_replaces_the_fan_out_trigger_wait(
    mariadb: TestDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CREATE OR REPLACE TRIGGER waits for the transactions that use the table (here a
    reader's), and the producers that come meanwhile queue behind it: a raw INSERT and a
    register_event CALL then fire the new trigger, each event queued exactly once; a producer
    whose lock timeout is 1 s gives up (1205) instead of inserting without it."""
    db = mariadb
    _some_data(db)
    _break_fan_out_trigger(db)
    queued = db.scalar("SELECT count(*) FROM {ns}.asset_dag_run_queue")
    # The repair waits for the reader as long as the test needs, not its 1 s.
    monkeypatch.setattr(migrate, "DEFAULT_LOCK_TIMEOUT", 60.0)
    reader = db.engine.connect()
    reader.execute(sa.text(db.sql("SELECT count(*) FROM {ns}.asset_event")))  # stays open
    repairing, repaired = in_thread(lambda: migrate.repair(db.engine, namespace=db.namespace))
    inserting, calling = _producer_connection(db, 60), _producer_connection(db, 60)
    try:
        assert _metadata_lock_waiters(db, 1) == 1  # the repair's CREATE OR REPLACE TRIGGER
        with _producer_connection(db, 1) as impatient, pytest.raises(DBAPIError) as refused:
            _insert_event(db, impatient)
        assert db.dialect.error_code(refused.value) == "1205", refused.value
        inserter, inserted = in_thread(lambda: _insert_event(db, inserting))
        caller, called = in_thread(
            lambda: assetq.register_event(calling, "orders", namespace=db.namespace).id
        )
        assert _metadata_lock_waiters(db, 3) == 3  # both producers queue behind it
        assert repairing.is_alive() and inserter.is_alive() and caller.is_alive()
        reader.rollback()
        for thread in (repairing, inserter, caller):
            thread.join(60)
        for outcome in (repaired, inserted, called):
            assert outcome.error is None, outcome.error
        assert repaired.value == ["trigger asset_event_fan_out"]
        inserting.commit()  # committed after the repair
        calling.commit()
    finally:
        for conn in (reader, inserting, calling):
            conn.close()
    assert _queued_for(db, inserted.value) == ["report"]  # fanned out, exactly once
    assert _queued_for(db, called.value) == ["report"]
    assert db.scalar("SELECT count(*) FROM {ns}.asset_dag_run_queue") == queued + 2


# -- MySQL's path: the grants, the trigger swap, a repair stopped half-way ------------------


def test_mysql_path_an_insert_during_the_trigger_swap_waits_and_is_fanned_out_once(
    mysql_path: TestDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Right after repair's DROP TRIGGER a producer whose lock timeout is 1 s gives up (1205)
    instead of committing an event nobody gets; one that waits longer inserts once the new
    trigger is there, commits after the repair, and its event is queued exactly once."""
    db = mysql_path
    _some_data(db)
    _break_fan_out_trigger(db)
    queued = db.scalar("SELECT count(*) FROM {ns}.asset_dag_run_queue")
    swaps: list[Sequence[str]] = []
    patient = _producer_connection(db, 60)
    waiting: list[Any] = []

    def during_the_swap() -> None:
        with _producer_connection(db, 1) as impatient, pytest.raises(DBAPIError) as refused:
            _insert_event(db, impatient)
        assert db.dialect.error_code(refused.value) == "1205", refused.value
        thread, outcome = in_thread(lambda: _insert_event(db, patient))
        waiting.extend((thread, outcome))
        thread.join(2)
        assert thread.is_alive() and outcome.value is None, outcome  # it waits for the swap

    original: Callable[..., None] = type(MYSQL).run_statements

    def interleaved(self: Any, conn: Connection, statements: Sequence[str]) -> None:
        """repair's statements one by one, as run_statements sends them, with the
        producers in between the DROP TRIGGER and the CREATE TRIGGER."""
        if not statements or not statements[0].startswith("LOCK TABLES"):  # not a swap
            original(self, conn, statements)
            return
        swaps.append(statements)
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            for statement in statements:
                cursor.execute(statement)
                if statement.startswith("DROP TRIGGER"):
                    during_the_swap()
        finally:
            cursor.execute("UNLOCK TABLES")
            cursor.close()

    monkeypatch.setattr(type(MYSQL), "run_statements", interleaved)
    assert migrate.repair(db.engine, namespace=db.namespace) == ["trigger asset_event_fan_out"]
    thread, outcome = waiting
    thread.join(60)
    assert outcome.error is None and isinstance(outcome.value, int), outcome
    patient.commit()  # committed after the repair
    patient.close()
    (swap,) = swaps
    assert swap[0].startswith("LOCK TABLES") and swap[0].endswith("asset_event` WRITE"), swap
    assert swap[-1] == "UNLOCK TABLES", swap
    assert _queued_for(db, outcome.value) == ["report"]  # fanned out, exactly once
    assert db.scalar("SELECT count(*) FROM {ns}.asset_dag_run_queue") == queued + 1


def test_mysql_path_a_repair_stopped_before_the_grants_were_given_back_is_finished_by_the_next(
    mysql_path: TestDatabase, producer: Login, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = mysql_path
    _some_data(db)
    _break_register_event(db)
    assetq.grant_roles(db.engine, producer=producer.grantee, namespace=db.namespace)

    def killed(*args: Any) -> None:
        raise assetq.AssetqError("killed before the grants were given back")

    with monkeypatch.context() as patch:
        patch.setattr(routines, "restore_grants", killed)
        with pytest.raises(assetq.AssetqError, match="killed"):
            migrate.repair(db.engine, namespace=db.namespace)
    # Re-created, without its grant, and recorded as unfinished (the sync records an object
    # before it creates it and again once it is done): doctor tells it from a finished one.
    assert _definitions(db).severity == "problem"
    with pytest.raises(assetq.AssetqError) as denied:
        _registers(db, producer)
    assert denied.value.code == "1370", denied.value  # execute command denied
    assert (
        db.scalar(
            "SELECT count(*) FROM information_schema.tables"
            " WHERE table_schema = :ns AND table_name = '_assetq_repair_grants'",
            ns=db.namespace,
        )
        == 1
    )  # the grants kept in the namespace

    # The next repair finishes it: the unfinished object again, and the grants given back.
    assert migrate.repair(db.engine, namespace=db.namespace) == ["routine register_event"]
    assert _definitions(db).severity == "ok"
    _registers(db, producer)
    assert "_assetq_repair_grants" not in {r[0] for r in snapshot(db)["relations"]}


@pytest.mark.parametrize("readable", [(), ("procs_priv",)], ids=["nothing", "procs_priv-only"])
def test_mysql_path_an_account_that_may_not_read_the_grants_is_refused_before_any_change(
    mysql_path: TestDatabase, capsys: pytest.CaptureFixture[str], readable: tuple[str, ...]
) -> None:
    """Dropping a routine revokes its grants: an account that cannot read them (to give them
    back) must not drop it. One line, AQ124, nothing changed. (MariaDB's own path needs
    no grant saved: test_doctor_and_repair_need_no_right_beyond_the_namespace.) Giving them
    back reads mysql.user too (to accounts that still exist): an account that may read
    mysql.procs_priv only is refused the same way, before any change (MySQL 9.7 found it
    dropping and creating the routines, then failing with their grants not given back)."""
    with _namespace_owner(mysql_path) as (owner, db):
        user, host = owner.grantee if isinstance(owner.grantee, tuple) else (owner.name, "%")
        for table in readable:
            db.execute(f"GRANT SELECT ON mysql.{table} TO '{user}'@'{host}'")
        _break_register_event(db, by=owner.engine)
        broken = snapshot(db)
        code, out, err = _cli_repair(db, capsys, url=owner.engine.url)
        assert (code, out) == (cli.EXIT_ERROR, ""), out
        assert err.startswith("assetq repair: error [AQ124]: ") and err.count("\n") == 1, err
        assert "mysql.procs_priv and mysql.user" in err
        assert snapshot(db) == broken
        assert _definitions(db, owner.engine).severity == "problem"


def test_mysql_path_uninstall_after_an_interrupted_repair_leaves_nothing(
    mysql_path: TestDatabase, producer: Login, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = mysql_path
    _break_register_event(db)
    assetq.grant_roles(db.engine, producer=producer.grantee, namespace=db.namespace)
    monkeypatch.setattr(routines, "restore_grants", lambda *args: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        migrate.repair(db.engine, namespace=db.namespace)
    assert (
        db.scalar(
            "SELECT count(*) FROM information_schema.tables"
            " WHERE table_schema = :ns AND table_name = '_assetq_repair_grants'",
            ns=db.namespace,
        )
        == 1
    )  # interrupted where the grants were still kept in the namespace
    assert assetq.uninstall(db.engine, namespace=db.namespace) is not None
    assert db.rows("SHOW DATABASES LIKE :ns", ns=db.namespace) == []
