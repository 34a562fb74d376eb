"""Consumed history, built in seconds with set-based SQL (tests/history.<engine>.sql).

A long-running installation holds millions of events that were consumed long ago: each linked
to a run of some consumer, none queued any more. The history-independence specs and
benchmarks/bench.py add such history directly (no routine, no fan-out: history events belong
to an asset no consumer is scheduled on) and then measure a scheduler pass over a few pending
rows, which must not care how much history there is.
"""

from __future__ import annotations

import functools
from pathlib import Path

import sqlalchemy as sa

import assetq
from assetq import sqlfiles
from assetq.dialects import Dialect, dialect_for
from assetq.validation import split_namespace

#: The asset history events belong to; no consumer is scheduled on it.
HISTORY_ASSET = "history"

#: Rows per statement: the MySQL queries number rows with four digit tables (1 .. 10,000).
_CHUNK = {"postgresql": 1_000_000, "mysql": 10_000}


@functools.cache
def _queries(engine: str) -> dict[str, str]:
    path = Path(__file__).with_name(f"history.{engine}.sql")
    return sqlfiles.parse_queries(path.read_text("utf-8"))


def _run(
    conn: sa.Connection, dialect: Dialect, namespace: str, name: str, **params: object
) -> list[sa.Row[object]]:
    sql = sqlfiles.render(_queries(dialect.name)[name], dialect.quote_ns(namespace))
    result = conn.execute(sa.text(sql), params)
    return list(result.all()) if result.returns_rows else []


def add_history(
    engine: sa.Engine,
    events: int,
    *,
    namespace: str = "assetq",
    events_per_run: int = 4,
) -> None:
    """Add ``events`` consumed events, ``events_per_run`` to a run, the runs spread over every
    declared consumer in turn. Declare the consumers first; queued rows are left alone."""
    if events < 1:
        return
    with engine.begin() as conn:
        dialect = dialect_for(conn)
        asset_id = assetq.declare_asset(conn, HISTORY_ASSET, namespace=namespace)
        (bounds,) = _run(conn, dialect, namespace, "history_bounds")
        first_event, first_run, consumers = (int(v) for v in bounds)
        if consumers < 1:
            raise ValueError("declare at least one consumer before adding history")
    chunk = _CHUNK[dialect.name]
    # Whole runs per chunk, so that a run's events never straddle two chunks.
    chunk -= chunk % events_per_run
    definition = _pause_fan_out(engine, dialect, namespace)
    try:
        done = 0
        while done < events:
            n = min(chunk, events - done)
            runs = -(-n // events_per_run)
            with engine.begin() as conn:
                q = functools.partial(_run, conn, dialect, namespace)
                _skip_checks(conn, dialect, namespace)
                try:
                    q("history_events", first=first_event, n=n, asset_id=asset_id)
                    q("history_runs", first=first_run, n=runs, consumers=consumers)
                    q(
                        "history_links",
                        first_event=first_event,
                        first_run=first_run,
                        n=n,
                        per_run=events_per_run,
                    )
                finally:
                    # A session setting on MySQL: never left off on a pooled connection.
                    if "restore_checks" in _queries(dialect.name):
                        q("restore_checks")
            first_event += n
            first_run += runs
            done += n
    finally:
        _resume_fan_out(engine, dialect, namespace, definition)
    with engine.begin() as conn:
        _run(conn, dialect, namespace, "history_last_run_seq")
        _run(conn, dialect, namespace, "history_sequences")
    with engine.connect() as conn:
        _run(conn, dialect, namespace, "analyze")
        conn.commit()


def add_backlog(engine: sa.Engine, events: int, asset: str, *, namespace: str = "assetq") -> None:
    """Add ``events`` queued events of ``asset`` (declared) on MySQL: set-based inserts of
    10,000, fanned out by the trigger as any event (tests/history.mysql.sql, backlog_events)."""
    with engine.begin() as conn:
        dialect = dialect_for(conn)
        insert = sa.text(
            sqlfiles.render(_queries(dialect.name)["backlog_events"], dialect.quote_ns(namespace))
        )
        for start in range(0, events, _CHUNK["mysql"]):
            n = min(_CHUNK["mysql"], events - start)
            inserted = conn.execute(insert, {"n": n, "asset": asset}).rowcount
            assert inserted == n, f"asset {asset!r} is not declared: {inserted} of {n} events"


def _skip_checks(conn: sa.Connection, dialect: Dialect, namespace: str) -> None:
    """Skip foreign-key checks for the rows of this load: the history is consistent by
    construction, and checking each of a million links costs most of the load. PostgreSQL
    needs a superuser for that (session_replication_role); without one the checks run."""
    try:
        with conn.begin_nested():
            _run(conn, dialect, namespace, "skip_checks")
    except sa.exc.DBAPIError:
        pass  # rolled back to the savepoint: the load goes on, checked


def _pause_fan_out(engine: sa.Engine, dialect: Dialect, namespace: str) -> tuple[str, str] | None:
    """Switch the fan-out trigger off for the load. MySQL cannot disable a trigger: it is
    dropped, and its definition (statement, sql_mode) returned to create it again."""
    with engine.begin() as conn:
        definition = None
        if "fan_out_definition" in _queries(dialect.name):
            (row,) = _run(conn, dialect, namespace, "fan_out_definition")
            definition = (str(row[2]), str(row[1]))  # SQL Original Statement, sql_mode
        _run(conn, dialect, namespace, "pause_fan_out")
    return definition


def _resume_fan_out(
    engine: sa.Engine, dialect: Dialect, namespace: str, definition: tuple[str, str] | None
) -> None:
    with engine.begin() as conn:
        if definition is None:
            _run(conn, dialect, namespace, "resume_fan_out")
            return
        statement, sql_mode = definition
        # The trigger keeps the sql_mode it is created under: the one it had.
        (saved,) = _run(conn, dialect, namespace, "session_sql_mode")
        ((current,),) = _run(conn, dialect, namespace, "current_database")
        _run(conn, dialect, namespace, "set_session_sql_mode", sql_mode=sql_mode)
        dbapi = conn.connection.dbapi_connection
        assert dbapi is not None
        try:
            # MySQL's SHOW CREATE TRIGGER names the trigger and its table without their
            # database (MariaDB's keeps them as written): the statement runs from the
            # namespace's database, as the default database of the connection for a moment.
            dbapi.select_db(split_namespace(namespace)[0])  # type: ignore[attr-defined]
            # Straight to the driver, without parameters: nothing in it is a placeholder.
            cursor = dbapi.cursor()
            try:
                cursor.execute(statement)
            finally:
                cursor.close()
        finally:
            if current is not None:
                dbapi.select_db(current)  # type: ignore[attr-defined]
            _run(conn, dialect, namespace, "set_session_sql_mode", sql_mode=saved[0])
