"""The first API call checks the schema (issue 13 item 3, docs/operations.md "Upgrading").

Outside the compatibility window every public function raises SchemaTooOld / SchemaTooNew /
NotInstalled with the fix, before its own statement could fail with a raw database error
(42883, 1305, ...). The check costs one statement, once per process for each engine and
namespace; later calls send none (counted with SQLAlchemy's statement events).
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

import assetq
from assetq import aio, migrate
from dbs import TestDatabase

#: Something to call, with a connection (caller's transaction) or the engine.
Call = Callable[[sa.Engine, str], object]


def _claim() -> assetq.Claim:
    now = datetime.now(timezone.utc)
    return assetq.Claim(
        id=1, dag_id="report", run_id="r1", seq=1, run_after=now, created_at=now,
        event_ids=(1,), attempt=1, worker="w", lease_until=now + timedelta(seconds=60),
    )  # fmt: skip


def _in_transaction(function: Callable[[sa.Connection, str], object]) -> Call:
    def call(engine: sa.Engine, namespace: str) -> object:
        with engine.begin() as conn:
            return function(conn, namespace)

    return call


#: Public functions of both kinds: in the caller's transaction, and with their own.
CALLS: dict[str, Call] = {
    "register_event": _in_transaction(
        lambda conn, ns: assetq.register_event(conn, "orders", namespace=ns)
    ),
    "register_events": _in_transaction(
        lambda conn, ns: assetq.register_events(conn, [assetq.NewEvent("orders")], namespace=ns)
    ),
    "declare_dag": _in_transaction(
        lambda conn, ns: assetq.declare_dag(conn, "report", "orders", namespace=ns)
    ),
    "runs": _in_transaction(lambda conn, ns: assetq.runs(conn, "report", namespace=ns)),
    "complete_run": _in_transaction(
        lambda conn, ns: assetq.complete_run(conn, _claim(), "success", namespace=ns)
    ),
    "schedule": lambda engine, ns: assetq.schedule(engine, namespace=ns, max_attempts=1),
    "claim_runs": lambda engine, ns: assetq.claim_runs(engine, "w", namespace=ns, max_attempts=1),
    "purge": lambda engine, ns: assetq.purge(
        engine, older_than=timedelta(days=1), namespace=ns, max_attempts=1
    ),
}


@pytest.mark.parametrize("revision", ["0001_baseline", "t0002_event_note"])
def test_the_first_call_against_an_older_schema_says_upgrade_it_first(
    empty_db: TestDatabase, revision: str, test_revisions: tuple[str, ...]
) -> None:
    """Older than head: the baseline and the first test-only revision, head the second."""
    assetq.install(empty_db.engine, revision=revision)
    for name, call in CALLS.items():
        fix = "assetq upgrade --namespace assetq"
        with pytest.raises(assetq.SchemaTooOld, match=fix) as raised:
            call(empty_db.engine, empty_db.namespace)
        assert f"holds assetq schema {revision}, older than" in str(raised.value), name
    # The upgrade in this process is seen at once: the next call works.
    assetq.install(empty_db.engine)
    for name in ("declare_dag", "register_event", "schedule"):
        CALLS[name](empty_db.engine, empty_db.namespace)


def test_the_failed_check_leaves_the_callers_transaction_usable(empty_db: TestDatabase) -> None:
    """Nothing installed: NotInstalled with the install command, and on PostgreSQL the
    caller's transaction is not aborted by the check (its read never fails)."""
    with empty_db.engine.begin() as conn:
        with pytest.raises(assetq.NotInstalled, match="assetq install") as raised:
            assetq.register_event(conn, "orders")
        assert type(raised.value) is assetq.NotInstalled
        assert conn.execute(sa.text("SELECT 1")).scalar_one() == 1
    with pytest.raises(assetq.NotInstalled, match="assetq install"):
        assetq.schedule(empty_db.engine, max_attempts=1)


def test_the_first_call_against_a_development_schema_says_reinstall_it(
    db: TestDatabase,
) -> None:
    """A namespace at one of the development revisions 0.1.0's baseline replaced: no
    upgrade reaches it, so the fix is a re-install."""
    _stamp(db, "0015_batch_lookups", "0001_initial")  # as a development package left it
    assert "0015_batch_lookups" in migrate.DEVELOPMENT_REVISIONS
    for name, call in CALLS.items():
        with pytest.raises(assetq.SchemaTooOld, match="assetq uninstall --yes") as raised:
            call(db.engine, db.namespace)
        message = str(raised.value)
        assert "development schema 0015_batch_lookups" in message, name
        assert "assetq install" in message, name
        # Never a plain upgrade, which no package can do (the adoption keeps the data).
        assert re.search(r"assetq upgrade(?! --adopt-development)", message) is None, name


def _stamp(db: TestDatabase, revision: str, clients_from: str) -> None:
    """Pretend a newer package upgraded the namespace to ``revision`` (as
    tests/test_version_skew.py does)."""
    table = f"{db.dialect.quote_ns(db.namespace)}.{migrate.VERSION_TABLE}"
    marker = f"assetq schema {revision}; works with packages from schema {clients_from}"
    with db.engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {table} SET version_num = :v"), {"v": revision})
        conn.execute(
            sa.text(migrate._upgrade_sql(db.dialect, "write_compat_marker", db.namespace, marker))
        )


def test_a_newer_schema_outside_the_window_says_run_the_newer_package(db: TestDatabase) -> None:
    _stamp(db, "9999_future", "9998_breaking")
    for name in ("register_event", "declare_dag", "schedule", "claim_runs"):
        with pytest.raises(assetq.SchemaTooNew, match="pip install -U assetq") as raised:
            CALLS[name](db.engine, db.namespace)
        assert "never `assetq upgrade`" in str(raised.value), name


def test_a_newer_schema_inside_the_window_works(db: TestDatabase) -> None:
    _stamp(db, "9999_future", migrate.head_revision())
    for name in ("declare_dag", "register_event", "schedule", "claim_runs", "runs"):
        CALLS[name](db.engine, db.namespace)


@contextmanager
def _statements(engine: sa.Engine) -> Iterator[list[str]]:
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    sa.event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        sa.event.remove(engine, "before_cursor_execute", record)


def _is_check(statement: str) -> bool:
    return "assetq_alembic_version" in statement


def test_the_check_is_one_statement_on_the_first_call_and_none_after(db: TestDatabase) -> None:
    """The hot paths (register_event, schedule, claim_runs, complete_run) send no extra
    statement once an engine has checked the namespace."""
    engine = sa.create_engine(db.url, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            assetq.declare_dag(conn, "report", "orders", namespace=db.namespace)
        with engine.begin() as conn, _statements(engine) as later:
            assetq.register_event(conn, "orders", namespace=db.namespace)
        assert not [s for s in later if _is_check(s)]

        fresh = sa.create_engine(db.url, poolclass=NullPool)
        try:
            counts: list[int] = []
            for _ in range(3):
                with fresh.begin() as conn, _statements(fresh) as seen:
                    assetq.register_event(conn, "orders", namespace=db.namespace)
                counts.append(len(seen))
                checks = [s for s in seen if _is_check(s)]
                assert len(checks) == (1 if len(counts) == 1 else 0), seen
            assert counts[0] == counts[1] + 1 and counts[1] == counts[2]

            with _statements(fresh) as seen:
                (run,) = assetq.schedule(fresh, namespace=db.namespace)
                (claim,) = assetq.claim_runs(fresh, "w", namespace=db.namespace)
                with fresh.begin() as conn:
                    assetq.complete_run(conn, claim, "success", namespace=db.namespace)
            assert run.run_id == claim.run_id
            assert seen and not [s for s in seen if _is_check(s)]
        finally:
            fresh.dispose()
    finally:
        engine.dispose()


def test_threads_whose_first_calls_overlap_all_pass_and_the_check_is_cached(
    db: TestDatabase,
) -> None:
    engine = sa.create_engine(db.url, pool_size=8)
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def produce() -> None:
        try:
            start.wait(10)
            with engine.begin() as conn:
                assetq.register_event(conn, "orders", namespace=db.namespace)
        except BaseException as exc:  # reported below
            errors.append(exc)

    with db.engine.begin() as conn:  # through another engine: this one is unchecked
        assetq.declare_dag(conn, "report", "orders")
    try:
        threads = [threading.Thread(target=produce) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors
        with engine.begin() as conn, _statements(engine) as seen:
            assetq.register_event(conn, "orders", namespace=db.namespace)
        assert seen and not [s for s in seen if _is_check(s)]
    finally:
        engine.dispose()


def test_the_asyncio_api_checks_too(
    empty_db: TestDatabase, test_revisions: tuple[str, ...]
) -> None:
    assetq.install(empty_db.engine, revision="0001_baseline")  # older than the test head

    async def calls() -> None:
        engine = create_async_engine(aio.async_url(empty_db.url), poolclass=NullPool)
        try:
            async with engine.begin() as conn:
                with pytest.raises(assetq.SchemaTooOld, match="assetq upgrade"):
                    await aio.register_event(conn, "orders")
            with pytest.raises(assetq.SchemaTooOld, match="assetq upgrade"):
                await aio.schedule(engine)
            with pytest.raises(assetq.SchemaTooOld, match="assetq upgrade"):
                await aio.claim_runs(engine, "w")
        finally:
            await engine.dispose()

    asyncio.run(calls())
