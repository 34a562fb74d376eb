"""`assetq grant`, then `assetq upgrade`: the upgrade keeps what was granted, as `assetq grant
--help` and docs/operations.md §6 say. From the revision just before this package's head, the
upgrade the next deployment makes; tests/test_semantics_upgrade.py does it from
0003_operations, with data written before, through the Python API."""

from __future__ import annotations

from importlib import resources

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.script import ScriptDirectory

import assetq
from assetq import cli, migrate
from assetq.dialects import dialect_for
from dbs import Login, TestDatabase, made_logins


def _revision_before_head() -> str:
    script = ScriptDirectory(str(resources.files("assetq.migrations")))
    head = script.get_revision(script.get_current_head())
    assert head is not None and isinstance(head.down_revision, str)
    return head.down_revision


def _role(login: Login) -> str:
    """How `assetq grant` names the login: a role, or a MySQL account user@host."""
    grantee = login.grantee
    return grantee if isinstance(grantee, str) else "@".join(str(part) for part in grantee)


def test_an_upgrade_keeps_every_kind_of_access_that_grant_gave(
    empty_db: TestDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    db = empty_db
    url = db.url.render_as_string(hide_password=False)
    with db.engine.begin() as conn:
        dialect_for(conn).execute(conn, "create_namespace", db.namespace)
        command.upgrade(migrate._config(conn, db.namespace), _revision_before_head())
    with made_logins(db, ("producer", "scheduler", "reader"), "aqg") as logins:
        producer, scheduler, reader = (logins[k] for k in ("producer", "scheduler", "reader"))
        roles = ["--producer", _role(producer), "--scheduler", _role(scheduler)]
        granted = cli.main(["--url", url, "grant", *roles, "--reader", _role(reader)])
        assert granted == cli.EXIT_OK, capsys.readouterr().err
        assert cli.main(["--url", url, "upgrade"]) == cli.EXIT_OK, capsys.readouterr().err
        with db.engine.connect() as conn:
            assert migrate.current_revision(conn) == assetq.head_revision()
            relations = sorted(
                str(r.name)
                for r in db.dialect.execute(
                    conn, "namespace_objects", db.namespace, {"namespace": db.namespace}
                )
                if r.kind in ("table", "view")
            )
        with db.engine.begin() as conn:  # the owner declares; the roles do the rest
            assetq.declare_dag(conn, "report", "orders")

        with producer.engine.begin() as conn:
            event = assetq.register_event(conn, "orders")
        (run,) = assetq.schedule(scheduler.engine, max_attempts=1)
        assert run.event_ids == (event.id,)
        with scheduler.engine.begin() as conn:
            assert assetq.set_run_state(conn, "report", run.run_id, "success").state == "success"
        with reader.engine.connect() as conn:
            for name in relations:  # the tables and views of the new revision included
                conn.execute(sa.text(db.sql(f"SELECT count(*) FROM {{ns}}.{name}"))).scalar_one()
            assert [s.dag_id for s in assetq.status(conn)] == ["report"]
