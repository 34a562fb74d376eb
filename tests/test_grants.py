"""Least privilege (assetq.grant_roles, `assetq grant`): each role logs in and does what its
access allows, and nothing else: no table rights, no other role's routines.

PostgreSQL roles are cluster-wide: the ones made here are named aqo_<kind>_<pid>_<n> and
dropped at teardown. MySQL accounts live on the test's own server and are dropped too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

import assetq
from dbs import Login, TestDatabase, made_logins

KINDS = ("producer", "scheduler", "reader", "nobody")

#: Permission denied: PostgreSQL's SQLSTATE; MySQL's table, routine and database errors.
DENIED = {"42501", "1142", "1143", "1370", "1044"}


@pytest.fixture
def logins(db: TestDatabase) -> Iterator[dict[str, Login]]:
    """One login per kind; every kind but "nobody" has been granted its access."""
    with made_logins(db, KINDS, "aqo") as made:
        assetq.grant_roles(
            db.engine,
            producer=made["producer"].grantee,
            scheduler=made["scheduler"].grantee,
            reader=made["reader"].grantee,
        )
        yield made


def _code(exc: BaseException, db: TestDatabase) -> str | None:
    if isinstance(exc, assetq.AssetqError):
        return exc.code
    assert isinstance(exc, sa.exc.DBAPIError)
    return db.dialect.error_code(exc)


def _denied(db: TestDatabase, action: Callable[[], Any]) -> None:
    with pytest.raises((assetq.AssetqError, sa.exc.DBAPIError)) as caught:
        action()
    assert _code(caught.value, db) in DENIED, caught.value


def _sql(db: TestDatabase, login: Login, statement: str) -> Callable[[], Any]:
    def run() -> Any:
        with login.engine.begin() as conn:
            return conn.execute(sa.text(db.sql(statement))).all()

    return run


def _register(login: Login) -> Callable[[], Any]:
    def run() -> Any:
        with login.engine.begin() as conn:
            return assetq.register_event(conn, "orders")

    return run


def _register_batch(login: Login) -> Callable[[], Any]:
    def run() -> Any:
        with login.engine.begin() as conn:
            return assetq.register_events(conn, [assetq.NewEvent("orders")])

    return run


def _schedule(login: Login) -> Callable[[], Any]:
    return lambda: assetq.schedule(login.engine, max_attempts=1)


def _move_run(login: Login, run_id: str, state: str) -> Callable[[], Any]:
    def run() -> Any:
        with login.engine.begin() as conn:
            return assetq.set_run_state(conn, "report", run_id, state)

    return run


def _status(login: Login) -> Callable[[], Any]:
    def run() -> Any:
        with login.engine.connect() as conn:
            return assetq.status(conn)

    return run


def _declare(login: Login) -> Callable[[], Any]:
    def run() -> Any:
        with login.engine.begin() as conn:
            assetq.declare_dag(conn, "intruder", "orders")

    return run


@pytest.fixture
def consumer(db: TestDatabase) -> None:
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "report", "orders")


def test_a_producer_registers_events_and_can_do_nothing_else(
    db: TestDatabase, logins: dict[str, Login], consumer: None
) -> None:
    producer = logins["producer"]
    event = _register(producer)()
    (item,) = _register_batch(producer)()
    assert db.scalar("SELECT count(*) FROM {ns}.asset_dag_run_queue") == 2
    assert event.created and item.created
    (run,) = assetq.schedule(db.engine)
    _denied(db, _move_run(producer, run.run_id, "running"))
    _denied(db, _schedule(producer))
    _denied(db, _status(producer))
    _denied(db, _declare(producer))
    _denied(db, _sql(db, producer, "SELECT count(*) FROM {ns}.asset_event"))
    _denied(db, _sql(db, producer, "INSERT INTO {ns}.asset_event (asset_id) VALUES (1)"))
    _denied(db, _sql(db, producer, "DELETE FROM {ns}.asset_dag_run_queue"))


def test_a_scheduler_runs_passes_and_can_do_nothing_else(
    db: TestDatabase, logins: dict[str, Login], consumer: None
) -> None:
    with db.engine.begin() as conn:
        event = assetq.register_event(conn, "orders")
    scheduler = logins["scheduler"]
    (run,) = _schedule(scheduler)()
    assert run.event_ids == (event.id,)
    # LISTEN and the wake-up lock need no right: an empty pass, the lock, one more pass.
    stats = assetq.run_scheduler(scheduler.engine, max_passes=2)
    assert stats.errors == 0
    assert stats.arms == (1 if db.dialect.supports_notify else 0)
    assert _move_run(scheduler, run.run_id, "running")().state == "running"
    assert _move_run(scheduler, run.run_id, "success")().state == "success"
    assert db.scalar("SELECT state FROM {ns}.dag_run WHERE id = :id", id=run.id) == "success"
    _denied(db, _register(scheduler))
    _denied(db, _register_batch(scheduler))
    _denied(db, _status(scheduler))
    _denied(db, _sql(db, scheduler, "SELECT count(*) FROM {ns}.dag_run"))
    _denied(db, _sql(db, scheduler, "DELETE FROM {ns}.asset_dag_run_queue"))
    _denied(db, _sql(db, scheduler, "UPDATE {ns}.dag_run SET state = 'running'"))


def test_a_reader_reads_everything_and_writes_nothing(
    db: TestDatabase, logins: dict[str, Login], consumer: None
) -> None:
    with db.engine.begin() as conn:
        assetq.register_event(conn, "orders")
    reader = logins["reader"]
    (shown,) = _status(reader)()
    assert (shown.dag_id, shown.queued_events) == ("report", 1)
    assert _sql(db, reader, "SELECT count(*) FROM {ns}.asset_event")() == [(1,)]
    _denied(db, _register(reader))
    _denied(db, _schedule(reader))
    assert _sql(db, reader, "SELECT count(*) FROM {ns}.asset_alias")() == [(0,)]
    _denied(db, _sql(db, reader, "DELETE FROM {ns}.asset_dag_run_queue"))
    _denied(db, _sql(db, reader, "UPDATE {ns}.dag SET is_paused = TRUE"))
    assert db.scalar("SELECT count(*) FROM {ns}.asset_dag_run_queue") == 1


def test_a_role_given_nothing_can_do_nothing(
    db: TestDatabase, logins: dict[str, Login], consumer: None
) -> None:
    """PostgreSQL lets PUBLIC execute new functions: assetq revokes that."""
    nobody = logins["nobody"]
    with db.engine.begin() as conn:
        assetq.register_event(conn, "orders")
    (run,) = assetq.schedule(db.engine)
    for action in (
        _register(nobody),
        _schedule(nobody),
        _status(nobody),
        _declare(nobody),
        _move_run(nobody, run.run_id, "failed"),
    ):
        _denied(db, action)
    assert db.scalar("SELECT state FROM {ns}.dag_run WHERE id = :id", id=run.id) == "queued"


def test_revoking_takes_the_access_away(
    db: TestDatabase, logins: dict[str, Login], consumer: None
) -> None:
    producer = logins["producer"]
    _register(producer)()
    assetq.revoke_roles(db.engine, producer.grantee)
    assetq.revoke_roles(db.engine, producer.grantee)  # idempotent
    _denied(db, _register(producer))


def test_granting_to_an_account_that_does_not_exist_is_refused(db: TestDatabase) -> None:
    with pytest.raises(assetq.InvalidArgument, match="does not exist"):
        assetq.grant_roles(db.engine, producer="aqo_no_such_role")


def test_grant_command(db: TestDatabase, logins: dict[str, Login]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASSETQ_")}
    env["ASSETQ_DATABASE_URL"] = db.url.render_as_string(hide_password=False)
    grantee = logins["nobody"].grantee
    role = grantee if isinstance(grantee, str) else "@".join(str(p) for p in grantee)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "assetq", "grant", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )

    done = run("--reader", role)
    assert done.returncode == 0, done.stderr
    assert "may now act as reader" in done.stdout
    assert _status(logins["nobody"])() == []
    revoked = run("--revoke", role)
    assert revoked.returncode == 0, revoked.stderr
    _denied(db, _status(logins["nobody"]))
    assert run().returncode == 2


def test_an_upgrade_that_changes_grant_access_gives_each_kind_what_it_gives_now(
    db: TestDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scheduler granted by an older grant_access, which did not give cancel_run (issue 26):
    the package whose grant_access gives it re-creates that routine at install, and gives
    every granted kind its access again, so the scheduler can cancel runs with no grant to
    run by hand."""
    import changed_files

    with made_logins(db, ("scheduler",), "aqu") as made:
        login = made["scheduler"]
        assetq.grant_roles(db.engine, scheduler=login.grantee)
        if db.engine_name == "postgresql":
            db.execute(
                "REVOKE EXECUTE ON FUNCTION {ns}.cancel_run(text, text, text)"
                f' FROM "{login.name}"'
            )
        else:
            name, host = login.grantee  # type: ignore[misc]
            db.execute(f"REVOKE EXECUTE ON PROCEDURE {{ns}}.cancel_run FROM '{name}'@'{host}'")
        with db.engine.begin() as conn:
            assetq.declare_dag(conn, "report", "orders")
            assetq.register_event(conn, "orders")
        (run,) = assetq.schedule(db.engine)

        def cancel() -> Any:
            with login.engine.begin() as conn:
                return assetq.cancel_run(conn, "report", run.run_id)

        _denied(db, cancel)
        with changed_files.shipped(monkeypatch, {db.dialect.name: ["grant_access"]}):
            assetq.install(db.engine)
        assert cancel().state == "cancelled"
