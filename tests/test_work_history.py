"""A claim does work in proportion to the runs it claims, never to the history of finished
runs (issue 12: "claim cost must not grow with the number of finished runs"), on both
engines.

Proved with counters, not timing, the way test_history.py and test_postgres_facts.py prove
it for the scheduler pass: the rows a claim reads, as the engine counts them, are the same
with a small and with a large history of finished runs, and bounded by the runs it claims.
PostgreSQL: pg_stat_xact_user_tables of the history tables (sequential scans, index scans,
rows fetched through indexes) read in the claims' own transaction, before and after them.
MySQL/MariaDB: the session's ``Handler_read_*`` counters around the calls (rows read from
the storage engine, temporary tables included), the cost of SHOW STATUS itself taken off.
The claims are the routine as assetq.claim_runs sends it, in one transaction so that the
counters are the claims' own.

The history is finished runs with their links, inserted set-based by tests/history.py (runs
in success, as complete_run leaves them: nothing to claim), plus the runs the first
measurement claimed and completed through assetq. The small history is 1,000 finished runs,
not 10: on tables that small PostgreSQL rightly prefers sequential scans, so the plans (and
the counters) differ for a reason that has nothing to do with growth. Buffer counts are not
compared: every B-tree descent (the claim's UPDATE inserts index entries) costs one page per
level, and levels grow with the logarithm of a table, whatever touches it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

import assetq
import history
import pass_reads
from dbs import TestDatabase
from work_scenario import register

CONSUMERS = 10
#: Tables whose size is the history.
HISTORY_TABLES = ("dag_run", "dagrun_asset_event", "asset_event")
#: Events per history run (tests/history.py): the runs are what matters here.
EVENTS_PER_RUN = 1


def _pg_counters(conn: sa.Connection) -> dict[str, int]:
    """Reads of the history tables by this transaction so far (pg_stat_xact_user_tables: this
    backend's own, unflushed counters, so no other session's late flush can land in them)."""
    query = sa.text(
        "SELECT relname, seq_scan, seq_tup_read, idx_scan, idx_tup_fetch"
        " FROM pg_stat_xact_user_tables WHERE schemaname = 'assetq' AND relname IN :tables"
    ).bindparams(sa.bindparam("tables", expanding=True))
    counters: dict[str, int] = {}
    for row in conn.execute(query, {"tables": list(HISTORY_TABLES)}).all():
        names = ("seq_scan", "seq_tup_read", "idx_scan", "idx_tup_fetch")
        for name, value in zip(names, tuple(row)[1:], strict=True):
            counters[f"{row[0]}.{name}"] = int(value or 0)
    return counters


def _mysql_counters(conn: sa.Connection) -> dict[str, int]:
    """This session's Handler_read_* counters: rows read through the storage engines."""
    rows = conn.execute(sa.text("SHOW SESSION STATUS LIKE 'Handler_read%'")).all()
    return {str(r[0]): int(r[1]) for r in rows}


#: How each engine counts the rows a statement reads (the one real difference here).
COUNTERS: dict[str, Callable[[sa.Connection], dict[str, int]]] = {
    "postgresql": _pg_counters,
    "mysql": _mysql_counters,
}


def _claim(db: TestDatabase, conn: sa.Connection, worker: str, **params: object) -> list[Any]:
    """The claim routine, sent as assetq.claim_runs sends it."""
    return list(
        db.dialect.execute(
            conn,
            "claim_runs",
            db.namespace,
            {
                "worker": worker,
                "lease_seconds": 600,
                "dag_ids": None,
                "timeout_seconds": None,
                **params,
            },
        )
    )


def _reads_of_two_claims(db: TestDatabase) -> dict[str, int]:
    """A queued run of each consumer, then two claims of half of them each, one of any
    consumer and one naming the consumers (as run_worker claims), in a READ COMMITTED
    transaction as assetq.claim_runs makes: what they read. The runs are then completed
    (assetq.complete_run), history for the next measurement."""
    dag_ids = json.dumps([f"job_{n:02d}" for n in range(CONSUMERS)])
    register(db, "orders")
    assert len(assetq.schedule(db.engine, limit=100)) == CONSUMERS
    counters = COUNTERS[db.engine_name]
    with db.engine.connect() as conn:

        def claims(conn: sa.Connection) -> list[Any]:
            rows = _claim(db, conn, "w1", limit=CONSUMERS // 2)
            return rows + _claim(db, conn, "w2", limit=CONSUMERS // 2, dag_ids=dag_ids)

        if db.engine_name == "mysql":
            pass_reads.warm_up(conn, claims)
        with conn.begin():
            db.dialect.execute(conn, "scheduler_transaction", db.namespace)
            first = counters(conn)
            second = counters(conn)  # SHOW STATUS reads rows itself (MySQL): taken off
            rows = claims(conn)
            third = counters(conn)
        assert len({int(r.dag_run_id) for r in rows}) == CONSUMERS
        with conn.begin():
            for row in rows:
                claim = assetq.Claim(
                    id=int(row.dag_run_id),
                    dag_id=str(row.dag_id),
                    run_id=str(row.run_id),
                    seq=int(row.seq),
                    run_after=row.run_after,
                    created_at=row.created_at,
                    event_ids=(),
                    attempt=int(row.attempt),
                    worker=str(row.worker),
                )
                assetq.complete_run(conn, claim, "success")
    return {k: (third[k] - second[k]) - (second[k] - first[k]) for k in first}


def _finished_runs(db: TestDatabase) -> int:
    return int(db.scalar("SELECT count(*) FROM {ns}.dag_run WHERE state = 'success'"))


@pytest.mark.parametrize(
    ("small", "large"),
    [(1_000, 10_000), pytest.param(10_000, 1_000_000, marks=pytest.mark.slow, id="1M")],
)
def test_a_claim_reads_the_same_rows_with_a_small_and_a_large_history_of_finished_runs(
    db: TestDatabase, small: int, large: int
) -> None:
    with db.engine.begin() as conn:
        for n in range(CONSUMERS):
            assetq.declare_dag(conn, f"job_{n:02d}", "orders")
    history.add_history(db.engine, small * EVENTS_PER_RUN, events_per_run=EVENTS_PER_RUN)
    # Warm: the first claims a server runs also open what dag_run's triggers write
    # (dag_run_attempt, with its foreign key), counted once in the same counters (MariaDB).
    _reads_of_two_claims(db)
    before = _reads_of_two_claims(db)
    history.add_history(db.engine, (large - small) * EVENTS_PER_RUN, events_per_run=EVENTS_PER_RUN)
    assert _finished_runs(db) == large + 2 * CONSUMERS
    after = _reads_of_two_claims(db)
    assert after == before
    # The counters count: the claims read the runs they took (a broken reading would make
    # the two measurements equal for nothing).
    assert sum(before.values()) >= CONSUMERS, before
    # Bounded by what was claimed: a few rows read per claimed run (its row, its links,
    # the update, its consumer's options: max_attempts and timeout), a constant per call; no
    # scan of a history table. (MariaDB 10.11: 276 reads for the 10 claims here, 25 of them
    # the consumers' options, read since claims set deadlines. MySQL 9.7: 382, 173 of them
    # Handler_read_rnd_next: its scans of the claim's own temporary tables, which MariaDB
    # reads by key; the history is 1,000 runs and more.)
    with db.engine.connect() as conn:
        per_run = 24 if getattr(conn.dialect, "is_mariadb", True) else 40
    assert sum(before.values()) <= per_run * CONSUMERS + 50, before
    assert all(v == 0 for k, v in before.items() if k.endswith(("seq_scan", "seq_tup_read"))), (
        before
    )
