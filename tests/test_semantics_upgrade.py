"""Issue 5, upgrade: 0003_operations to head keeps the producer, scheduler and reader grants
that existing roles (MySQL: accounts) have, and the data written before."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from alembic import command

import assetq
from assetq import migrate
from assetq.dialects import dialect_for
from dbs import TestDatabase, unique_name

#: How each engine creates and drops a login (as in test_grants.py).
ACCOUNTS: dict[str, dict[str, str]] = {
    "postgresql": {
        "create": 'CREATE ROLE "{name}" LOGIN',
        "drop": 'DROP OWNED BY "{name}"; DROP ROLE "{name}"',
    },
    "mysql": {
        "create": "CREATE USER '{name}'@'{host}' IDENTIFIED BY 'aqo-test'",
        "drop": "DROP USER '{name}'@'{host}'",
    },
}


@pytest.fixture
def logins_at_0003(
    empty_db: TestDatabase,
) -> Iterator[dict[str, tuple[assetq.ops.Grantee, sa.Engine]]]:
    """assetq installed at revision 0003_operations, with a producer, a scheduler and a
    reader login granted their access by 0003's own grant routine."""
    db = empty_db
    with db.engine.begin() as conn:
        dialect_for(conn).execute(conn, "create_namespace", db.namespace)
        command.upgrade(migrate._config(conn, db.namespace), "0003_operations")
    with db.engine.connect() as conn:
        assert assetq.current_revision(conn) == "0003_operations"
    sql = ACCOUNTS[db.engine_name]
    host = "localhost" if "unix_socket" in db.url.query else "%"
    names = {kind: unique_name(f"aqu_{kind}") for kind in ("producer", "scheduler", "reader")}
    engines: dict[str, sa.Engine] = {}
    grantees: dict[str, assetq.ops.Grantee] = {}
    try:
        for kind, name in names.items():
            for statement in sql["create"].format(name=name, host=host).split("; "):
                db.execute(statement)
            if db.engine_name == "mysql":
                url = db.url.set(username=name, password="aqo-test")._replace(database=None)
                grantees[kind] = (name, host)
            else:
                url = db.url.set(username=name)
                grantees[kind] = name
            engines[kind] = sa.create_engine(url)
        assetq.grant_roles(
            db.engine,
            producer=grantees["producer"],
            scheduler=grantees["scheduler"],
            reader=grantees["reader"],
        )
        yield {kind: (grantees[kind], engines[kind]) for kind in names}
    finally:
        for engine in engines.values():
            engine.dispose()
        for name in names.values():
            for statement in sql["drop"].format(name=name, host=host).split("; "):
                db.execute(statement)


def test_upgrading_from_0003_keeps_existing_grants_and_data_working(
    empty_db: TestDatabase, logins_at_0003: dict[str, tuple[assetq.ops.Grantee, sa.Engine]]
) -> None:
    db = empty_db
    producer, scheduler, reader = (
        logins_at_0003[kind][1] for kind in ("producer", "scheduler", "reader")
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
    # A reader reads the tables 0004 added, through the read API too.
    with reader.connect() as conn:
        assert [r.run_id for r in assetq.runs(conn, "report")] == [run.run_id]
        consumed = assetq.consumed_events(conn, "report", run.run_id)
        assert [(r.id, r.aliases) for r in consumed] == [
            (old_event, ()),
            (new_event.id, ()),
            (batched.id, ("d",)),
        ]
