"""What one scheduler pass reads, counted, not timed: the queue's table and index statistics on
PostgreSQL, the session's Handler_read_* counters on MariaDB/MySQL (tests/test_capped_claim.py,
tests/test_runs_per_pass.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

import assetq
import history
from dbs import TestDatabase


def backlog(db: TestDatabase, count: int, asset: str = "orders") -> None:
    """``count`` more events of ``asset``: register_events in batches of 10,000 (the batch
    limit) on PostgreSQL; on MySQL set-based inserts of as many (history.add_backlog), as
    register_events' fast path, which MySQL 9.7 does not take by default. On PostgreSQL
    the queue is then vacuumed and analyzed: both measurements run with the plans
    a real backlog gets, and neither reads the dead index entries of the rows the previous
    pass deleted (those are MVCC's, bounded by what was consumed, not by the backlog)."""
    if db.dialect.name == "mysql":
        history.add_backlog(db.engine, count, asset, namespace=db.namespace)
        return
    with db.engine.begin() as conn:
        for start in range(0, count, 10_000):
            batch = [{"asset": asset}] * min(10_000, count - start)
            assetq.register_events(conn, batch)
    if db.dialect.name == "postgresql":
        with db.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            conn.execute(sa.text(db.sql("VACUUM ANALYZE {ns}.asset_dag_run_queue")))


def schedule_pass(db: TestDatabase, conn: sa.Connection, limit: int) -> list[Any]:
    """schedule_pass(limit) as assetq.schedule sends it, in ``conn``'s transaction."""
    return list(db.dialect.execute(conn, "schedule_pass", db.namespace, {"limit": limit}))


_PG_TABLE_STATS = (
    "SELECT coalesce(t.seq_scan, 0), coalesce(t.seq_tup_read, 0),"
    "       coalesce(t.idx_tup_fetch, 0),"
    "       (SELECT coalesce(sum(i.idx_tup_read), 0) FROM pg_stat_user_indexes i"
    "         WHERE i.relid = t.relid)"
    "  FROM pg_stat_user_tables t"
    " WHERE t.schemaname = :ns AND t.relname = :table"
)


def pg_queue_reads_of(
    db: TestDatabase, action: Callable[[sa.Connection], Any], table: str = "asset_dag_run_queue"
) -> tuple[Any, dict[str, int]]:
    """What ``action`` returned, run in a transaction of its own connection, and the rows and
    index entries it read of the queue (or of ``table``), on that connection's statistics."""
    with db.engine.connect() as conn:

        def reads() -> tuple[int, ...]:
            conn.execute(sa.text("SELECT pg_stat_force_next_flush()"))
            conn.commit()
            conn.execute(sa.text("SELECT pg_stat_clear_snapshot()"))
            row = conn.execute(sa.text(_PG_TABLE_STATS), {"ns": db.namespace, "table": table}).one()
            conn.commit()
            return tuple(int(v) for v in row)

        before = reads()
        with conn.begin():
            result = action(conn)
        after = reads()
    keys = ("seq_scan", "seq_tup_read", "idx_tup_fetch", "idx_tup_read")
    return result, {k: a - b for k, a, b in zip(keys, after, before, strict=True)}


def pg_queue_reads(db: TestDatabase, limit: int) -> tuple[int, dict[str, int]]:
    """Runs made by one pass of ``limit`` and the queue's rows and index entries it read, on
    its own connection's statistics."""
    runs, reads = pg_queue_reads_of(db, lambda conn: schedule_pass(db, conn, limit))
    return len(runs), reads


def _handler_reads(conn: sa.Connection) -> dict[str, int]:
    rows = conn.execute(sa.text("SHOW SESSION STATUS LIKE 'Handler_read%'")).all()
    return {str(r[0]): int(r[1]) for r in rows}


#: Why the pass's Handler_read_* differ with the backlog on MySQL 9.7 (issue 28, not yet
#: pinned): the same rows are read, but with ten times the backlog one index is entered at
#: its first entry instead of by a key (Handler_read_first +1, Handler_read_key -1; per run
#: in tests/test_runs_per_pass.py), a plan choice of its optimizer's. ANALYZE TABLE of the
#: queue, dag, dag_run and asset_event before both counts changes nothing.
MYSQL97_PLAN_FLIP = (
    "MySQL 9.7 enters one index by its first entry instead of a key with a larger backlog"
    " (pass_reads.MYSQL97_PLAN_FLIP)"
)


def expect_mysql97_plan_flip(db: TestDatabase, request: pytest.FixtureRequest) -> None:
    """On MySQL proper (not MariaDB), mark the calling test as failing for
    :data:`MYSQL97_PLAN_FLIP`, strictly: it fails the run once it passes there."""
    if db.dialect.name != "mysql":
        return
    with db.engine.connect() as conn:
        if not getattr(conn.dialect, "is_mariadb", False):
            request.applymarker(pytest.mark.xfail(strict=True, reason=MYSQL97_PLAN_FLIP))


def warm_up(conn: sa.Connection, action: Callable[[sa.Connection], Any]) -> None:
    """Run ``action`` once on ``conn`` and roll it back. A connection's first call of a
    routine (or first use of a table and its triggers) also reads their definitions, which
    MySQL 8+ keeps in InnoDB tables, its data dictionary, and counts in the same Handler_read_*
    counters: MySQL 9.7 read 16 more rows in a first claim than in the next, whatever the
    history. Measured warm, as the long-lived connections of schedulers and workers run."""
    with conn.begin() as transaction:
        action(conn)
        transaction.rollback()


def mysql_reads_of(
    conn: sa.Connection, action: Callable[[sa.Connection], Any]
) -> tuple[Any, dict[str, int]]:
    """What ``action`` returned, run in a transaction on ``conn``, and its Handler_read_*
    (rows the server read through its storage engines, temporary tables included), as
    tests/test_history.py counts them. Counted warm (:func:`warm_up`)."""
    warm_up(conn, action)
    with conn.begin():
        # SHOW STATUS reads rows itself: its own cost is measured and taken off.
        first, second = _handler_reads(conn), _handler_reads(conn)
    with conn.begin():
        result = action(conn)
    with conn.begin():
        third = _handler_reads(conn)
    return result, {k: (third[k] - second[k]) - (second[k] - first[k]) for k in first}


def mysql_pass_reads(
    db: TestDatabase, conn: sa.Connection, limit: int
) -> tuple[int, dict[str, int]]:
    """Runs made by one pass of ``limit`` on ``conn`` and its Handler_read_*."""
    runs, reads = mysql_reads_of(conn, lambda c: schedule_pass(db, c, limit))
    return len(runs), reads
