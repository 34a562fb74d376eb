"""`assetq grant`, then `assetq upgrade`: the upgrade keeps what was granted, as `assetq grant
--help` and docs/operations.md §6 say. The upgrade the next deployment makes: a namespace this
package installed, whose routines a newer package re-creates (their files changed) while its
revisions change tables (the test-only revisions after the baseline stand for them)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

import assetq
from assetq import cli, migrate, routines
from dbs import Login, TestDatabase, made_logins


def _role(login: Login) -> str:
    """How `assetq grant` names the login: a role, or a MySQL account user@host."""
    grantee = login.grantee
    return grantee if isinstance(grantee, str) else "@".join(str(part) for part in grantee)


def test_an_upgrade_keeps_every_kind_of_access_that_grant_gave(
    empty_db: TestDatabase, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    db = empty_db
    url = db.url.render_as_string(hide_password=False)
    assetq.install(db.engine)
    with made_logins(db, ("producer", "scheduler", "reader"), "aqg") as logins:
        producer, scheduler, reader = (logins[k] for k in ("producer", "scheduler", "reader"))
        roles = ["--producer", _role(producer), "--scheduler", _role(scheduler)]
        granted = cli.main(["--url", url, "grant", *roles, "--reader", _role(reader)])
        assert granted == cli.EXIT_OK, capsys.readouterr().err
        # What an older package recorded: every routine, trigger and view from a file other
        # than this package's, so that the upgrade re-creates each of them.
        db.execute("UPDATE {ns}.routine_catalogue SET checksum = 'an older package''s file'")
        request.getfixturevalue("test_revisions")  # the newer package's table steps
        with db.engine.connect() as conn:
            changed = {d.file.name for d in routines.differences(conn, db.namespace)}
        assert {"register_event", "schedule_pass", "set_run_state"} <= changed
        assert cli.main(["--url", url, "upgrade"]) == cli.EXIT_OK, capsys.readouterr().err
        with db.engine.connect() as conn:
            assert migrate.current_revision(conn) == assetq.head_revision()
            assert routines.differences(conn, db.namespace) == []  # re-created
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
            for name in relations:  # every table and view after the upgrade
                conn.execute(sa.text(db.sql(f"SELECT count(*) FROM {{ns}}.{name}"))).scalar_one()
            assert [s.dag_id for s in assetq.status(conn)] == ["report"]
