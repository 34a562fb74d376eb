"""Definitions and repair (issue 13 item 7): ``doctor`` compares routine bodies, trigger timing
and level and view text with a fresh install of the installed revision, not only names
(PostgreSQL: made under a savepoint and rolled back; MySQL/MariaDB, whose DDL commits: made in
a scratch database on the same server and dropped); ``assetq repair`` re-creates what differs,
in place, data untouched, on both engines.

PostgreSQL repairs in one transaction (CREATE OR REPLACE keeps a routine's grants). MySQL has
no CREATE OR REPLACE PROCEDURE or TRIGGER and commits each DDL statement: a routine is dropped
and created again, its grants (which DROP PROCEDURE revokes) saved in the namespace before and
given back after; a trigger is swapped with its table locked for writing, so a producer's
INSERT meanwhile waits and then fires the new trigger (forced here, not left to timing).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

import assetq
from assetq import cli, migrate, sqlfiles
from assetq.dialects import MYSQL
from assetq.ops import Check
from dbs import Login, TestDatabase, made_logins
from schema_snapshot import snapshot

#: A statement-level copy of the fan-out trigger: every name doctor checked still there, and no
#: event is fanned out any more (the issue's example was the reverse change on MySQL).
BROKEN_TRIGGER = (
    "DROP TRIGGER asset_event_fan_out ON {ns}.asset_event;"
    " CREATE TRIGGER asset_event_fan_out AFTER UPDATE ON {ns}.asset_event"
    " FOR EACH STATEMENT EXECUTE FUNCTION {ns}.asset_event_fan_out()"
)


@pytest.fixture
def my(db: TestDatabase) -> TestDatabase:
    if db.engine_name != "mysql":
        pytest.skip("MySQL only")
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


def _packaged(db: TestDatabase, kind: str, name: str) -> str:
    """MySQL: the CREATE statement of ``name`` in the packaged schema, for the namespace."""
    schema = sqlfiles.render(sqlfiles.read("mysql", "schema.sql"), MYSQL.quote_ns(db.namespace))
    marker = f"{kind} {MYSQL.quote_ns(db.namespace)}.{name}"
    return next(s for s in sqlfiles.split_script(schema) if marker in s)


# -- how each engine breaks an object by hand (the SQL differs, the tests do not) ------------


def _break_register_event(db: TestDatabase) -> None:
    """register_event's body changed (one statement more, same behaviour), name and
    parameters kept, so only the definitions check can tell."""
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
        body = _packaged(db, "PROCEDURE", "register_event(")
        end = body.rindex("END")
        changed = body[:end] + "DO 0;\n" + body[end:]
        db.execute("DROP PROCEDURE {ns}.register_event")
    assert changed != body
    with db.engine.begin() as conn:
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


def _cli_repair(db: TestDatabase, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    url = db.url.render_as_string(hide_password=False)
    code = cli.main(["--url", url, "--namespace", db.namespace, "repair"])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def producer(db: TestDatabase) -> Iterator[Login]:
    """A login that may register events (EXECUTE on register_event and register_events)."""
    with made_logins(db, ("producer",), "aqrep") as made:
        assetq.grant_roles(db.engine, producer=made["producer"].grantee, namespace=db.namespace)
        yield made["producer"]


def _registers(db: TestDatabase, login: Login) -> int:
    with login.engine.begin() as conn:
        return assetq.register_event(conn, "orders", namespace=db.namespace).id


def _in_a_thread(action: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """A thread (not started) that runs ``action``, and the list its result or error lands in
    (for the test's assertions)."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(action())
        except Exception as exc:
            outcome.append(exc)

    return threading.Thread(target=run, daemon=True), outcome


# -- doctor -----------------------------------------------------------------------------------


def _scratch_namespaces(db: TestDatabase) -> list[str]:
    if db.engine_name == "postgresql":
        found = db.rows("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'assetq_reference%'")
    else:
        found = db.rows("SHOW DATABASES LIKE 'assetq\\_reference%'")
    return [str(r[0]) for r in found]


def test_doctor_finds_a_fresh_install_as_its_revision_defines_it(db: TestDatabase) -> None:
    check = _definitions(db)
    assert check.severity == "ok", check
    assert _scratch_namespaces(db) == []  # rolled back / dropped


def test_doctor_finds_an_upgraded_install_as_its_revision_defines_it(
    empty_db: TestDatabase,
) -> None:
    assetq.install(empty_db.engine, revision="0005_wakeup_on_demand")
    assetq.install(empty_db.engine)
    assert _definitions(empty_db).severity == "ok"
    assert _scratch_namespaces(empty_db) == []


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
    assert _scratch_namespaces(my) == []


# -- repair, both engines -----------------------------------------------------------------------


def test_repair_of_an_intact_namespace_says_there_is_nothing_to_repair(
    db: TestDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    _some_data(db)
    before, counts = snapshot(db), db.counts()
    assert migrate.repair(db.engine, db.namespace) == []
    code, out, err = _cli_repair(db, capsys)
    assert (code, err) == (cli.EXIT_OK, ""), err
    assert out.endswith(": nothing to repair\n"), out
    assert snapshot(db) == before and db.counts() == counts


def test_a_routine_body_changed_by_hand_is_repaired_with_its_grants(
    db: TestDatabase, producer: Login, capsys: pytest.CaptureFixture[str]
) -> None:
    _some_data(db)
    before, counts = snapshot(db), db.counts()
    _break_register_event(db)
    if db.engine_name == "mysql":  # what the drop cost: the producer's grant went with it
        assetq.grant_roles(db.engine, producer=producer.grantee, namespace=db.namespace)
    _registers(db, producer)
    counts["asset_event"] += 1
    counts["asset_dag_run_queue"] += 1
    check = _definitions(db)
    assert check.severity == "problem" and "routine register_event" in check.detail, check
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


def test_a_trigger_recreated_wrong_is_found_and_repaired(db: TestDatabase) -> None:
    _some_data(db)
    before, counts = snapshot(db), db.counts()
    _break_fan_out_trigger(db)
    check = _definitions(db)
    assert check.severity == "problem", check
    assert "trigger asset_event_fan_out differs" in check.detail
    assert "assetq repair" in check.fix

    assert migrate.repair(db.engine, db.namespace) == ["trigger asset_event_fan_out"]
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
    assert migrate.repair(db.engine, db.namespace) == ["trigger asset_event_fan_out"]
    assert assetq.doctor(db.engine, namespace=db.namespace).ok


def test_a_dropped_view_is_re_created(db: TestDatabase) -> None:
    _some_data(db)
    before, counts = snapshot(db), db.counts()
    db.execute("DROP VIEW {ns}.dag_queue_status")
    report = assetq.doctor(db.engine, namespace=db.namespace)  # no crash reading the work
    missing = next(c for c in report.checks if c.name == "view dag_queue_status")
    assert missing.severity == "problem" and "assetq repair" in missing.fix, missing
    assert migrate.repair(db.engine, db.namespace) == ["view dag_queue_status"]
    assert snapshot(db) == before and db.counts() == counts
    with db.engine.begin() as conn:
        assert [s.dag_id for s in assetq.status(conn, namespace=db.namespace)] == ["report"]


def test_repair_waits_for_an_install_of_the_same_namespace(db: TestDatabase) -> None:
    """The namespace lock of install/upgrade/uninstall, held here by another session: repair
    changes nothing until it is released, then repairs."""
    _break_fan_out_trigger(db)
    worker, outcome = _in_a_thread(lambda: migrate.repair(db.engine, db.namespace))
    with db.engine.connect() as installer, installer.begin():
        rows = db.dialect.execute(
            installer, "lock_namespace", db.namespace, {"namespace": db.namespace}
        )
        assert rows[0][0] == 1
        worker.start()
        worker.join(2)
        assert worker.is_alive() and outcome == [], outcome
        assert _definitions(db).severity == "problem"  # untouched while it waits
        db.dialect.execute(installer, "unlock_namespace", db.namespace, {"namespace": db.namespace})
    worker.join(120)
    assert outcome == [["trigger asset_event_fan_out"]], outcome


# -- MySQL: the grants, the trigger swap, a repair stopped half-way --------------------------


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


def test_mysql_an_insert_during_the_trigger_swap_waits_and_is_fanned_out_once(
    my: TestDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Right after repair's DROP TRIGGER a producer whose lock timeout is 1 s gives up (1205)
    instead of committing an event nobody gets; one that waits longer inserts once the new
    trigger is there, commits after the repair, and its event is queued exactly once."""
    db = my
    _some_data(db)
    _break_fan_out_trigger(db)
    queued = db.scalar("SELECT count(*) FROM {ns}.asset_dag_run_queue")
    swaps: list[Sequence[str]] = []
    patient = _producer_connection(db, 60)
    waiting, outcome = _in_a_thread(lambda: _insert_event(db, patient))

    def during_the_swap() -> None:
        with _producer_connection(db, 1) as impatient, pytest.raises(DBAPIError) as refused:
            _insert_event(db, impatient)
        assert db.dialect.error_code(refused.value) == "1205", refused.value
        waiting.start()
        waiting.join(2)
        assert waiting.is_alive() and outcome == [], outcome  # it waits for the swap

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
    assert migrate.repair(db.engine, db.namespace) == ["trigger asset_event_fan_out"]
    waiting.join(60)
    assert len(outcome) == 1 and isinstance(outcome[0], int), outcome
    patient.commit()  # committed after the repair
    patient.close()
    (swap,) = swaps
    assert swap[0].startswith("LOCK TABLES") and swap[0].endswith("asset_event` WRITE"), swap
    assert swap[-1] == "UNLOCK TABLES", swap
    rows = db.rows(
        "SELECT target_dag_id FROM {ns}.asset_dag_run_queue WHERE asset_event_id = :e", e=outcome[0]
    )
    assert [r.target_dag_id for r in rows] == ["report"]  # fanned out, exactly once
    assert db.scalar("SELECT count(*) FROM {ns}.asset_dag_run_queue") == queued + 1


def test_mysql_a_repair_stopped_before_the_grants_were_given_back_is_finished_by_the_next(
    my: TestDatabase, producer: Login, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = my
    _some_data(db)
    _break_register_event(db)
    assetq.grant_roles(db.engine, producer=producer.grantee, namespace=db.namespace)

    def killed(*args: Any) -> None:
        raise assetq.AssetqError("killed before the grants were given back")

    with monkeypatch.context() as patch:
        patch.setattr(migrate, "_restore_grants", killed)
        with pytest.raises(assetq.AssetqError, match="killed"):
            migrate.repair(db.engine, db.namespace)
    assert _definitions(db).severity == "ok"  # re-created, without its grant
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

    assert migrate.repair(db.engine, db.namespace) == []  # nothing differs; grants given back
    _registers(db, producer)
    assert "_assetq_repair_grants" not in {r[1] for r in snapshot(db)["relations"]}


def test_mysql_an_account_that_may_not_read_the_grants_is_refused_before_any_change(
    my: TestDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    """Dropping a routine revokes its grants: an account that cannot read them (to give them
    back) must not drop it. One line, AQ124, nothing changed."""
    db = my
    _break_register_event(db)
    broken = snapshot(db)
    with made_logins(db, ("operator",), "aqrep") as logins:
        login = logins["operator"]
        user, host = login.grantee if isinstance(login.grantee, tuple) else (login.name, "%")
        db.execute(f"GRANT ALL ON {{ns}}.* TO '{user}'@'{host}'")
        db.execute(f"GRANT ALL ON `assetq\\_reference\\_%`.* TO '{user}'@'{host}'")
        url = login.engine.url.render_as_string(hide_password=False)
        code = cli.main(["--url", url, "--namespace", db.namespace, "repair"])
        out, err = capsys.readouterr()
    assert (code, out) == (cli.EXIT_ERROR, ""), out
    assert err.startswith("assetq repair: error [AQ124]: ") and err.count("\n") == 1, err
    assert "mysql.procs_priv" in err
    assert snapshot(db) == broken
    assert _definitions(db).severity == "problem"


def test_mysql_uninstall_after_an_interrupted_repair_leaves_nothing(
    my: TestDatabase, producer: Login, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = my
    _break_register_event(db)
    assetq.grant_roles(db.engine, producer=producer.grantee, namespace=db.namespace)
    monkeypatch.setattr(migrate, "_restore_grants", lambda *args: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        migrate.repair(db.engine, db.namespace)
    assert assetq.uninstall(db.engine, namespace=db.namespace) is not None
    assert db.rows("SHOW DATABASES LIKE :ns", ns=db.namespace) == []
