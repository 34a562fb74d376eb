"""Failed installs (issue 13, item 5): the first error the database reported, as
MigrationFailed with its code and the revision; one line from the command line; nothing of
assetq's left behind, on both engines (PostgreSQL: one transaction; MySQL, where each DDL
statement commits: the install removes what it created)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

import assetq
from assetq import cli, migrate
from dbs import TestDatabase, made_logins
from schema_snapshot import snapshot

#: A table of the user's, in the namespace, named like one of assetq's, and the code of the
#: error the install then meets: PostgreSQL's duplicate_table; on MySQL, whose schema creates
#: tables IF NOT EXISTS, the install's own refusal before it creates anything (AQ122,
#: tests/test_single_database.py; it used to fail half-way with 1005 on the first foreign
#: key to dag.dag_id, after asset was created).
CONFLICT = {
    "postgresql": ("CREATE TABLE {ns}.dag (note text)", "42P07"),
    "mysql": ("CREATE TABLE {ns}.dag (note text)", "AQ122"),
}

#: Rights on the namespace without the right to create routines (MySQL: the tables are
#: created, then the first routine statement is refused: MySQL's DROP PROCEDURE IF EXISTS
#: with 1370; MariaDB's CREATE OR REPLACE PROCEDURE, which assetq sends there instead, with
#: 1044: MARIADB_NO_ROUTINES), and the code of the refusal. PostgreSQL: no right to create
#: the schema at all.
NO_ROUTINES = {
    "postgresql": ("", "42501"),
    "mysql": (
        "GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, DROP, INDEX, ALTER, REFERENCES,"
        " TRIGGER, CREATE VIEW, LOCK TABLES ON {ns}.* TO '{name}'@'{host}'",
        "1370",
    ),
}
MARIADB_NO_ROUTINES = "1044"


def _create_conflict(db: TestDatabase) -> str:
    statement, code = CONFLICT[db.engine_name]
    with db.engine.begin() as conn:
        db.dialect.execute(conn, "create_namespace", db.namespace)
        conn.execute(sa.text(db.sql(statement)))
    return code


def _user_objects(db: TestDatabase) -> list[str]:
    with db.engine.connect() as conn:
        rows = db.dialect.execute(
            conn, "namespace_objects", db.namespace, {"namespace": db.namespace}
        )
    return sorted(f"{r.kind} {r.name}" for r in rows)


def test_a_conflicting_table_fails_with_the_database_code_and_leaves_only_the_users(
    empty_db: TestDatabase,
) -> None:
    code = _create_conflict(empty_db)
    with pytest.raises(assetq.MigrationFailed) as failed:
        assetq.install(empty_db.engine)
    assert failed.value.code == code
    assert failed.value.revision == "0001_baseline"  # the step that creates the tables
    # PostgreSQL reported "current transaction is aborted" (25P02) instead: the release of
    # the namespace lock ran in the failed transaction.
    assert "current transaction is aborted" not in str(failed.value)
    assert _user_objects(empty_db) == ["table dag"]
    with empty_db.engine.connect() as conn:
        assert assetq.current_revision(conn) is None


def test_a_failed_install_of_several_revisions_names_the_revision_that_failed(
    empty_db: TestDatabase, test_revisions: tuple[str, ...]
) -> None:
    """Head is a test-only revision here: the install runs the baseline, then each test
    revision, and the conflict fails the baseline, which the error names (not the target)."""
    code = _create_conflict(empty_db)
    with pytest.raises(assetq.MigrationFailed) as failed:
        assetq.install(empty_db.engine)
    assert failed.value.code == code
    assert assetq.head_revision() == test_revisions[-1]
    assert failed.value.revision == "0001_baseline"
    assert _user_objects(empty_db) == ["table dag"]


def test_the_command_line_prints_a_failed_install_in_one_line(
    empty_db: TestDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    code = _create_conflict(empty_db)
    url = empty_db.url.render_as_string(hide_password=False)
    assert cli.main(["--url", url, "install"]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"assetq install: error [{code}]: ")
    assert "Traceback" not in err


def test_a_missing_privilege_fails_with_its_code_and_leaves_nothing(
    empty_db: TestDatabase,
) -> None:
    db = empty_db
    grant, code = NO_ROUTINES[db.engine_name]
    with made_logins(db, ("installer",), "aqie") as logins:
        login = logins["installer"]
        if grant:
            host = login.grantee[1] if isinstance(login.grantee, tuple) else ""
            db.execute(db.sql(grant).replace("{name}", login.name).replace("{host}", host))
        with pytest.raises(assetq.MigrationFailed) as failed:
            assetq.install(login.engine)
        login.engine.dispose()
    if getattr(db.engine.dialect, "is_mariadb", False):  # known once connected
        code = MARIADB_NO_ROUTINES
    assert failed.value.code == code
    assert not any(snapshot(db).values())
    with db.engine.connect() as conn:
        assert not db.dialect.execute(
            conn, "namespace_exists", db.namespace, {"namespace": db.namespace}
        )[0][0]


def test_uninstall_of_a_namespace_without_assetq_says_there_was_nothing(
    empty_db: TestDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    assert assetq.uninstall(empty_db.engine) is None
    url = empty_db.url.render_as_string(hide_password=False)
    assert cli.main(["--url", url, "uninstall", "--yes"]) == cli.EXIT_OK
    assert "nothing to remove" in capsys.readouterr().out


def test_uninstall_returns_the_revision_it_removed(db: TestDatabase) -> None:
    assert assetq.uninstall(db.engine) == assetq.head_revision()


def test_install_refuses_a_schema_newer_than_the_package(
    db: TestDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    db.execute("UPDATE {ns}.assetq_alembic_version SET version_num = '0099_from_the_future'")
    with pytest.raises(assetq.SchemaTooNew, match="newer assetq installed it"):
        assetq.install(db.engine)
    url = db.url.render_as_string(hide_password=False)
    assert cli.main(["--url", url, "upgrade"]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install -U assetq" in err, err
    assert "Can't locate revision" not in err


def test_install_never_downgrades(empty_db: TestDatabase, test_revisions: tuple[str, ...]) -> None:
    assert assetq.install(empty_db.engine) == test_revisions[-1]
    with pytest.raises(assetq.SchemaTooNew, match="never downgrades"):
        assetq.install(empty_db.engine, revision="0001_baseline")
    with empty_db.engine.connect() as conn:
        assert assetq.current_revision(conn) == test_revisions[-1]


@pytest.mark.engines("postgresql")
def test_install_on_a_connection_is_part_of_the_callers_transaction(
    empty_db: TestDatabase,
) -> None:
    """PostgreSQL: rolled back with the caller's transaction (MySQL commits DDL)."""
    with empty_db.engine.connect() as conn:
        conn.begin()
        assert assetq.install(conn) == assetq.head_revision()
        assert assetq.current_revision(conn) == assetq.head_revision()
        conn.rollback()
    with empty_db.engine.connect() as conn:
        assert assetq.current_revision(conn) is None


@pytest.mark.engines("mysql")
def test_an_install_lock_a_killed_galera_installer_left_is_named_with_the_fix(
    empty_db: TestDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On Galera an install's lock is a table (migrate._take_cluster_lock; the race itself is
    in tests/test_deploy_galera.py). A table left by an installer killed inside it is not
    released with its session, as GET_LOCK is: the next install waits, then gives up naming
    the holder and what to drop (AQ123), with nothing done. Here a plain server plays the
    cluster (the lock only needs wsrep_on to be taken) and the wait is 0.3 s, not 600."""
    db = empty_db
    with db.engine.connect() as conn:
        if not getattr(conn.dialect, "is_mariadb", False):
            pytest.skip("Galera is MariaDB's: MySQL has no wsrep variables to name the holder")
    monkeypatch.setattr(migrate, "_on_galera", lambda conn: True)
    monkeypatch.setattr(migrate, "CLUSTER_LOCK_WAIT", 0.3)
    with db.engine.begin() as conn:
        db.dialect.execute(conn, "create_namespace", db.namespace)
        conn.execute(
            sa.text(
                db.sql(
                    "CREATE TABLE {ns}.assetq_install_lock (holder INT PRIMARY KEY)"
                    " COMMENT = 'node node2 connection 41 at 2026-12-01 09:00:00'"
                )
            )
        )
    with pytest.raises(assetq.InstallRefused) as refused:
        assetq.install(db.engine)
    assert refused.value.code == "AQ123"
    message = str(refused.value)
    assert "held by node node2 connection 41 at 2026-12-01 09:00:00" in message
    assert f"DROP TABLE {db.dialect.quote_ns(db.namespace)}.assetq_install_lock" in message
    assert _user_objects(db) == ["table assetq_install_lock"]
    db.execute("DROP TABLE {ns}.assetq_install_lock")  # what the message says
    assert assetq.install(db.engine) == assetq.head_revision()
    assert "table assetq_install_lock" not in _user_objects(db)  # released
