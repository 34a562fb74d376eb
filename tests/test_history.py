"""The scheduler pass does work in proportion to the rows it consumes, never to the history
of consumed events, runs and links (MariaDB/MySQL half; the PostgreSQL half is
test_scheduler_statements_never_scan_event_or_run_history in test_postgres_facts.py).

Proved without timing: the pass's ``Handler_read_*`` counters (rows the server read through
its storage engines, temporary tables included) are the same with a small and with a large
history, and bounded by the pending rows.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

import assetq
import history
import pass_reads
from dbs import TestDatabase

pytestmark = pytest.mark.engines("mysql")

PENDING = 50


def _handler_reads(conn: sa.Connection) -> dict[str, int]:
    rows = conn.execute(sa.text("SHOW SESSION STATUS LIKE 'Handler_read%'")).all()
    return {str(r[0]): int(r[1]) for r in rows}


def _reads_of_a_pass(db: TestDatabase) -> dict[str, int]:
    """Handler reads of one pass over PENDING events queued for two consumers."""
    with db.engine.begin() as conn:
        assetq.register_events(conn, [{"asset": "orders"}] * PENDING)
    with db.engine.connect() as raw:
        conn = raw.execution_options(isolation_level="READ COMMITTED")
        pass_reads.warm_up(
            conn, lambda c: db.dialect.execute(c, "schedule_pass", db.namespace, {"limit": 100})
        )
        with conn.begin():
            # SHOW STATUS reads rows itself: its own cost is measured and taken off.
            first, second = _handler_reads(conn), _handler_reads(conn)
            runs = db.dialect.execute(conn, "schedule_pass", db.namespace, {"limit": 100})
            third = _handler_reads(conn)
    assert len(runs) == 2
    return {k: (third[k] - second[k]) - (second[k] - first[k]) for k in first}


@pytest.mark.parametrize(
    "large", [200_000, pytest.param(1_000_000, marks=pytest.mark.slow, id="1M")]
)
def test_a_pass_reads_the_same_rows_with_a_small_and_a_large_history(
    db: TestDatabase, large: int
) -> None:
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "consumer", "orders")
        assetq.declare_dag(conn, "other", "orders")
    history.add_history(db.engine, 10_000)
    small = _reads_of_a_pass(db)
    history.add_history(db.engine, large - 10_000)
    assert db.scalar("SELECT count(*) FROM {ns}.dagrun_asset_event") == large + 2 * PENDING
    big = _reads_of_a_pass(db)
    assert big == small
    # Bounded by the pending rows: a few reads per claimed row (the claim, the condition, the
    # deletion, the run's ids), plus a constant per consumer.
    claimed = 2 * PENDING
    assert sum(small.values()) <= 10 * claimed + 100, small
