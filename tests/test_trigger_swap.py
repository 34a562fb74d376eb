"""MySQL/MariaDB upgrades replace the fan-out trigger without a gap (I1, I12).

MySQL has no CREATE OR REPLACE TRIGGER: a migration that changes the fan-out drops the trigger
and creates it again. An event inserted between the two statements would commit without its
queue rows, lost to every consumer. 0009_partitions swaps it with the event table locked for
writing. Here its upgrade script runs one statement at a time, and right after the DROP
TRIGGER producers on other connections try to insert events: one that waits a second gives
up (error 1205) instead of committing an event nobody gets; one that waits longer, on a
connection that had registered events before the upgrade began (its routines cached), goes
on once the script is done and is fanned out by the new trigger. The forced interleaving,
not traffic and luck: tests/test_online_upgrade.py's upgrades under traffic found the same
gap in 0004_semantics only in some runs (2 events of a few hundred).

0004_semantics swaps it under the same lock, through a bridge trigger (see its script): with
the lock alone, a CALL that waited for it fired 0004's trigger with only the tables 0003's
trigger read opened for it, and failed with 1146 ("Table 'assetq.aa' doesn't exist", MariaDB
10.11). tests/test_online_upgrade.py forces that interleaving at each of its swaps.
"""

from __future__ import annotations

import json
import threading

import pytest
import sqlalchemy as sa
from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

import assetq
from assetq import sqlfiles
from assetq.dialects import MYSQL
from dbs import TestDatabase

REVISION, BEFORE = "0009_partitions", "0008_claim_plans"
DECLARE_0008 = "CALL {ns}.declare_dag('consumer', :c, :k, NULL, NULL, NULL, NULL, NULL, NULL, NULL)"


def _statements(db: TestDatabase) -> list[str]:
    script = sqlfiles.read("mysql", f"migrations/{REVISION}.up.sql")
    return sqlfiles.split_script(sqlfiles.render(script, MYSQL.quote_ns(db.namespace)))


def _producer(db: TestDatabase, wait: int) -> Connection:
    conn = db.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    conn.execute(
        sa.text("SET SESSION lock_wait_timeout = :w, innodb_lock_wait_timeout = :w"), {"w": wait}
    )
    return conn


def _register(db: TestDatabase, conn: Connection) -> int:
    """One event of asset 'a' through the 0008 routine (its call is the same at head)."""
    row = conn.execute(
        sa.text(db.sql("CALL {ns}.register_events(:e)")), {"e": json.dumps([{"asset": "a"}])}
    ).one()
    return int(row.event_id)


def test_no_event_is_inserted_while_the_fan_out_trigger_is_replaced(
    empty_db: TestDatabase,
) -> None:
    if empty_db.engine_name != "mysql":
        pytest.skip("MySQL only: PostgreSQL replaces a trigger function in place")
    db = empty_db
    assetq.install(db.engine, revision=BEFORE)
    with db.engine.begin() as conn:
        conn.execute(sa.text(db.sql("CALL {ns}.declare_asset('a', NULL, NULL)")))
        conn.execute(
            sa.text(db.sql(DECLARE_0008)), {"c": json.dumps("a"), "k": json.dumps([["a"]])}
        )
    patient = _producer(db, 60)
    before = _register(db, patient)  # its routines are cached before the upgrade starts
    statements = _statements(db)
    drop = next(
        i for i, s in enumerate(statements) if s.lstrip().startswith("DROP TRIGGER IF EXISTS")
    )
    outcome: list[object] = []

    def register_during_the_swap() -> None:
        try:
            outcome.append(_register(db, patient))
        except Exception as exc:  # reported by the assertion below
            outcome.append(exc)

    waiting = threading.Thread(target=register_during_the_swap, daemon=True)
    with db.engine.connect() as migrator:
        cursor = migrator.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            for statement in statements[: drop + 1]:
                cursor.execute(statement)
                while cursor.nextset():
                    pass
            # The trigger is gone now: a producer must not get an event in.
            with _producer(db, 1) as impatient, pytest.raises(DBAPIError) as refused:
                _register(db, impatient)
            assert refused.value.orig.args[0] == 1205, refused.value  # lock wait timeout
            waiting.start()
            waiting.join(2)
            assert waiting.is_alive() and outcome == [], outcome  # it waits for the swap
            for statement in statements[drop + 1 :]:
                cursor.execute(statement)
                while cursor.nextset():
                    pass
        finally:
            cursor.close()
    waiting.join(60)
    patient.close()
    assert len(outcome) == 1 and isinstance(outcome[0], int), outcome
    events = [before, outcome[0]]
    assert db.scalar("SELECT count(*) FROM {ns}.asset_event") == 2
    queued = db.rows("SELECT asset_event_id FROM {ns}.asset_dag_run_queue ORDER BY 1")
    assert [r.asset_event_id for r in queued] == events  # each fanned out, none lost
