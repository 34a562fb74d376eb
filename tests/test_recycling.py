"""The suite's own database recycling (tests/dbs.py): a database its test left as a fresh
install has it is emptied and handed to a later test, one whose schema changed is not. Every
server the suite runs on must recycle: on MySQL 9.7 the schema's fingerprint used MD5(),
which MySQL 9 no longer has, and every test there installed assetq afresh without a word
(about 0.9 s of setup per test, the second pass's time doubled)."""

from __future__ import annotations

import sqlalchemy as sa

import assetq
from dbs import Backend, fingerprint


def test_a_database_left_as_installed_is_recycled_emptied(backend: Backend) -> None:
    db = backend.database(installed=True)
    with db.engine.connect() as conn:
        fresh = fingerprint(conn, db.engine_name)
    assert fresh is not None  # the statement runs on this server
    with db.engine.begin() as conn:
        assetq.declare_asset(conn, "recycled", namespace=db.namespace)
        assetq.register_event(conn, "recycled", namespace=db.namespace)
        assetq.register_event(conn, "recycled", namespace=db.namespace)
        # Emptied by hand, its identity moved on: recycling must restart it all the same.
        conn.execute(sa.text(db.sql("DELETE FROM {ns}.asset_event")))
    before = backend.recycled
    backend.drop(db)
    assert backend.recycled == before + 1
    again = backend.database(installed=True)
    try:
        with again.engine.connect() as conn:
            assert fingerprint(conn, again.engine_name) == fresh
            for table in ("asset", "asset_event"):
                rows = conn.execute(sa.text(again.sql(f"SELECT count(*) FROM {{ns}}.{table}")))
                assert rows.scalar() == 0, table
        with again.engine.begin() as conn:  # identities start at 1 again, as after an install
            assetq.declare_asset(conn, "recycled", namespace=again.namespace)
            assert assetq.register_event(conn, "recycled", namespace=again.namespace).id == 1
    finally:
        backend.drop(again)


def test_a_database_whose_schema_changed_is_not_recycled(backend: Backend) -> None:
    mine = backend.database(installed=True)
    with mine.engine.begin() as conn:
        conn.execute(sa.text(mine.sql("CREATE TABLE {ns}.left_behind (id INTEGER)")))
    before = backend.recycled
    backend.drop(mine)
    assert backend.recycled == before
