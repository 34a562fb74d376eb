"""Issue 5, upgrade: 0003_operations to head keeps the producer, scheduler and reader grants
that existing roles (MySQL: accounts) have, and the data written before."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from alembic import command

import assetq
from assetq import migrate
from assetq.dialects import dialect_for
from dbs import Login, TestDatabase, made_logins


@pytest.fixture
def logins_at_0003(
    empty_db: TestDatabase,
) -> Iterator[dict[str, Login]]:
    """assetq installed at revision 0003_operations, with a producer, a scheduler and a
    reader login granted their access by 0003's own grant routine."""
    db = empty_db
    with db.engine.begin() as conn:
        dialect_for(conn).execute(conn, "create_namespace", db.namespace)
        command.upgrade(migrate._config(conn, db.namespace), "0003_operations")
    with db.engine.connect() as conn:
        assert assetq.current_revision(conn) == "0003_operations"
    with made_logins(db, ("producer", "scheduler", "reader"), "aqu") as made:
        assetq.grant_roles(
            db.engine,
            producer=made["producer"].grantee,
            scheduler=made["scheduler"].grantee,
            reader=made["reader"].grantee,
        )
        yield made


def test_upgrading_from_0003_keeps_existing_grants_and_data_working(
    empty_db: TestDatabase, logins_at_0003: dict[str, Login]
) -> None:
    db = empty_db
    producer, scheduler, reader = (
        logins_at_0003[kind].engine for kind in ("producer", "scheduler", "reader")
    )
    # A consumer and an event written at 0003, through 0003's own routine and trigger.
    with db.engine.begin() as conn:
        conn.execute(
            db.engine_sql("declare_dag_before_0004"),
            {"dag_id": "report", "condition": '{"asset":"orders"}', "clauses": '[["orders"]]'},
        )
    asset_id = db.scalar("SELECT id FROM {ns}.asset WHERE name = 'orders'")
    db.execute("INSERT INTO {ns}.asset_event (asset_id) VALUES (:a)", a=asset_id)
    old_event = db.scalar("SELECT id FROM {ns}.asset_event")

    assert assetq.install(db.engine) == assetq.head_revision()

    with producer.begin() as conn:
        new_event = assetq.register_event(conn, "orders")
    with producer.begin() as conn:
        (batched,) = assetq.register_events(conn, [assetq.NewEvent("orders", aliases=["d"])])
    (run,) = assetq.schedule(scheduler, max_attempts=1)
    assert run.event_ids == (old_event, new_event.id, batched.id)
    assert run.triggering_event_id == batched.id
    # set_run_state is new in 0004: a role that could run passes may move run states too.
    with scheduler.begin() as conn:
        info = assetq.set_run_state(conn, "report", run.run_id, "running")
    assert info.state == "running"
    # retry_run is new in 0006 and part of the scheduler's access: the upgrade gives it too.
    with scheduler.begin() as conn:
        assert assetq.set_run_state(conn, "report", run.run_id, "failed").state == "failed"
    with scheduler.begin() as conn:
        again = assetq.retry_run(conn, "report", run.run_id)
    assert (again.state, again.not_before is not None) == ("queued", True)
    # A reader reads the tables 0004 added, through the read API too.
    with reader.connect() as conn:
        assert [r.run_id for r in assetq.runs(conn, "report")] == [run.run_id]
        consumed = assetq.consumed_events(conn, "report", run.run_id)
        assert [(r.id, r.aliases) for r in consumed] == [
            (old_event, ()),
            (new_event.id, ()),
            (batched.id, ("d",)),
        ]
