"""Install, upgrade and uninstall through alembic, in a namespace of our own."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

import assetq
from assetq import migrate, routines
from dbs import Backend, TestDatabase
from schema_snapshot import snapshot

TEST_REVISIONS = Path(__file__).parent / "revisions"


@pytest.fixture
def second_empty_db(backend: Backend):  # type: ignore[no-untyped-def]
    database = backend.database(installed=False)
    yield database
    backend.drop(database)


def test_a_fresh_install_equals_the_baseline_plus_every_step_replayed(
    empty_db: TestDatabase, second_empty_db: TestDatabase, test_revisions: tuple[str, ...]
) -> None:
    """One install to head (the baseline and every step in one transaction, then the
    routines) and one revision at a time, each an install of its own (the routines only
    once the last reaches head) build the same schema."""
    assert test_revisions, "no test-only step after the baseline"
    assetq.install(empty_db.engine)
    for revision in migrate.revisions():
        assert assetq.install(second_empty_db.engine, revision=revision) == revision
    fresh, replayed = snapshot(empty_db), snapshot(second_empty_db)
    assert fresh["relations"], "nothing was installed"
    assert fresh == replayed


def test_an_upgrade_from_the_package_head_equals_a_fresh_install(
    empty_db: TestDatabase, second_empty_db: TestDatabase
) -> None:
    """The way a real upgrade goes: a namespace at the package's head, routines and all; then
    a newer package with table steps after it (here the test-only ones) upgrades it. It ends
    where a fresh install by the newer package ends."""
    assetq.install(second_empty_db.engine)
    migrate.use_revisions(str(TEST_REVISIONS))
    try:
        migrate.forget_checks()
        assetq.install(empty_db.engine)
        assert assetq.install(second_empty_db.engine) == migrate.head_revision()
        assert snapshot(empty_db) == snapshot(second_empty_db)
        with second_empty_db.engine.connect() as conn:
            assert routines.differences(conn, second_empty_db.namespace) == []
    finally:
        migrate.use_revisions(None)
        migrate.forget_checks()


def test_the_routines_come_with_the_schema_reaching_head(
    empty_db: TestDatabase, test_revisions: tuple[str, ...]
) -> None:
    """A namespace below the package's head has the tables of its revision and no routines:
    this package refuses to run against it anyway (SchemaTooOld), and its routine files are
    written for head's tables."""
    assetq.install(empty_db.engine, revision="0001_baseline")
    below = snapshot(empty_db)
    assert below["relations"] and not below["routines"] and not below["triggers"]
    assetq.install(empty_db.engine)
    assert snapshot(empty_db)["triggers"]


def test_install_reports_the_head_revision(empty_db: TestDatabase) -> None:
    assert assetq.install(empty_db.engine) == assetq.head_revision()
    with empty_db.engine.connect() as conn:
        assert assetq.current_revision(conn) == assetq.head_revision()
        migrate.require_installed(conn, "assetq")


def test_the_installed_revision_is_read_without_alembic_and_two_rows_are_an_error(
    db: TestDatabase,
) -> None:
    """current_revision reads the version table itself (a command that only reads the
    revision does not import alembic), and as alembic did refuses a table with two rows."""
    with db.engine.connect() as conn:
        assert assetq.current_revision(conn, namespace=db.namespace) == assetq.head_revision()
    with db.engine.begin() as conn:
        conn.execute(
            sa.text(db.sql("INSERT INTO {ns}.assetq_alembic_version (version_num) VALUES ('x')"))
        )
    try:
        with db.engine.connect() as conn, pytest.raises(assetq.AssetqError, match="several"):
            assetq.current_revision(conn, namespace=db.namespace)
    finally:
        with db.engine.begin() as conn:
            conn.execute(
                sa.text(db.sql("DELETE FROM {ns}.assetq_alembic_version WHERE version_num = 'x'"))
            )


def test_a_command_that_reads_the_revision_does_not_import_alembic() -> None:
    """`import assetq` and a revision read leave alembic unimported (about 0.3 s of CPU of
    every command's start)."""
    code = (
        "import sys, assetq, assetq.cli; assert 'alembic' not in sys.modules, sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_install_is_idempotent_and_keeps_data(db: TestDatabase) -> None:
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "consumer", "orders")
        assetq.register_event(conn, "orders")
    before = snapshot(db), db.counts()
    assetq.install(db.engine)
    assert (snapshot(db), db.counts()) == before


def test_uninstall_leaves_nothing_of_ours(db: TestDatabase) -> None:
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "consumer", "orders")
        assetq.register_event(conn, "orders")
    assetq.uninstall(db.engine)
    assert not any(snapshot(db).values())
    with db.engine.connect() as conn:
        assert assetq.current_revision(conn) is None
        with pytest.raises(assetq.NotInstalled):
            migrate.require_installed(conn, "assetq")


def test_uninstall_is_idempotent(db: TestDatabase) -> None:
    assetq.uninstall(db.engine)
    assetq.uninstall(db.engine)
    assetq.uninstall(db.engine, namespace="never_installed")


def test_reinstall_after_uninstall_gives_the_same_schema(db: TestDatabase) -> None:
    original = snapshot(db)
    assetq.uninstall(db.engine)
    assetq.install(db.engine)
    assert snapshot(db) == original


def test_uninstall_keeps_objects_that_are_not_ours(db: TestDatabase) -> None:
    db.execute("CREATE TABLE {ns}.user_notes (id integer PRIMARY KEY)")
    assetq.uninstall(db.engine)
    tables = [r[0] for r in snapshot(db)["relations"] if r[1] in ("r", "BASE TABLE")]
    assert tables == ["user_notes"]


def test_version_table_lives_in_the_namespace_not_the_application_schema(
    empty_db: TestDatabase,
) -> None:
    # The application has its own alembic history in its default schema/database.
    empty_db.execute("CREATE TABLE alembic_version (version_num varchar(32) NOT NULL)")
    empty_db.execute("INSERT INTO alembic_version VALUES ('app_rev_1')")
    assetq.install(empty_db.engine)
    rows = empty_db.rows("SELECT version_num FROM alembic_version")
    assert [r[0] for r in rows] == ["app_rev_1"]
    ours = empty_db.rows("SELECT version_num FROM {ns}.assetq_alembic_version")
    assert [r[0] for r in ours] == [assetq.head_revision()]


def test_namespaces_are_independent(empty_db: TestDatabase) -> None:
    assetq.install(empty_db.engine, namespace="team_a")
    assetq.install(empty_db.engine, namespace="team_b")
    with empty_db.engine.begin() as conn:
        assetq.declare_dag(conn, "consumer", "orders", namespace="team_a")
        assetq.register_event(conn, "orders", namespace="team_a")
    (run,) = assetq.schedule(empty_db.engine, namespace="team_a")
    assert assetq.schedule(empty_db.engine, namespace="team_b") == []
    assetq.uninstall(empty_db.engine, namespace="team_a")
    assert not snapshot(empty_db, "team_a")["relations"]
    assert snapshot(empty_db, "team_b")["relations"]
    assert run.dag_id == "consumer"


def test_concurrent_installs_both_succeed_with_one_schema(empty_db: TestDatabase) -> None:
    engines = [empty_db.new_engine() for _ in range(3)]
    barrier = threading.Barrier(len(engines))
    failures: list[BaseException] = []

    def install(engine: sa.Engine) -> None:
        barrier.wait(timeout=30)
        try:
            assetq.install(engine)
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=install, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert failures == []
    with empty_db.engine.connect() as conn:
        assert assetq.current_revision(conn) == assetq.head_revision()
        count = conn.execute(
            sa.text(empty_db.sql("SELECT count(*) FROM {ns}.assetq_alembic_version"))
        ).scalar_one()
    assert count == 1


def test_an_install_at_head_rewrites_a_marker_that_names_another_revision(
    db: TestDatabase,
) -> None:
    """A namespace stamped by hand (a development install adopted as the baseline: CHANGELOG,
    0.1.0) keeps the marker its last install wrote, which names a development revision; the
    next install at head writes the right one, or every call would be refused."""
    old = "assetq schema 0015_batch_lookups; works with packages from schema 0006_work_queue"
    db.execute(migrate._upgrade_sql(db.dialect, "write_compat_marker", db.namespace, old))
    migrate.forget_checks()
    if db.engine_name == "postgresql":  # its first-call check reads the revision there
        with db.engine.connect() as conn, pytest.raises(assetq.SchemaTooOld):
            migrate.check_schema(conn, db.namespace)
    assetq.install(db.engine)
    with db.engine.connect() as conn:
        oldest = migrate.oldest_client(migrate.head_revision())
        assert migrate.read_marker(conn, db.namespace) == oldest
        migrate.check_schema(conn, db.namespace)


def _as_development_install(db: TestDatabase, revision: str) -> None:
    """``db``'s namespace as a development package left it at ``revision``: the baseline's
    tables (those of 0015_batch_lookups, which the baseline is), no routine catalogue, its
    version table and marker naming the development revision."""
    table = f"{db.dialect.quote_ns(db.namespace)}.{migrate.VERSION_TABLE}"
    with db.engine.begin() as conn:  # the data the test wrote goes down with the schema
        if migrate.current_revision(conn, namespace=db.namespace) != "0001_baseline":
            migrate.migrate_connection(conn, db.namespace, "0001_baseline", direction="down")
    db.execute("DROP TABLE {ns}.routine_catalogue")
    db.execute(f"UPDATE {table} SET version_num = '{revision}'")
    marker = f"assetq schema {revision}; works with packages from schema 0006_work_queue"
    db.execute(migrate._upgrade_sql(db.dialect, "write_compat_marker", db.namespace, marker))
    migrate.forget_checks()


def _unordered(schema: dict) -> dict:
    """``schema`` without its columns' positions: stepped down to the baseline and up again,
    a PostgreSQL table keeps the positions of the columns dropped on the way down."""
    return {**schema, "columns": sorted(c[:2] + c[3:] for c in schema["columns"])}


def test_a_development_install_at_0015_is_adopted_with_its_data(db: TestDatabase) -> None:
    """``assetq upgrade`` refuses it and says how to keep the data; ``--adopt-development``
    makes it the baseline: the data stays, every routine, trigger and view is re-created from
    the files, and the schema is what a fresh install gives."""
    from assetq import cli

    fresh = snapshot(db)
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "report", "orders")
        event = assetq.register_event(conn, "orders")
    _as_development_install(db, "0015_batch_lookups")
    url = db.url.render_as_string(hide_password=False)
    with pytest.raises(assetq.SchemaTooOld, match="--adopt-development"):
        assetq.install(db.engine)
    assert cli.main(["--url", url, "--namespace", db.namespace, "upgrade"]) == cli.EXIT_ERROR
    done = cli.main(["--url", url, "--namespace", db.namespace, "upgrade", "--adopt-development"])
    assert done == cli.EXIT_OK
    assert _unordered(snapshot(db)) == _unordered(fresh)
    with db.engine.connect() as conn:
        assert routines.differences(conn, db.namespace) == []
        assert assetq.current_revision(conn) == migrate.head_revision()
    (run,) = assetq.schedule(db.engine)
    assert run.event_ids == (event.id,)
    assert assetq.doctor(db.engine).ok


def test_an_older_development_install_is_not_adopted(db: TestDatabase) -> None:
    _as_development_install(db, "0010_liveness")
    with pytest.raises(assetq.SchemaTooOld, match="Re-install"):
        migrate.adopt_development(db.engine, db.namespace)
    with db.engine.connect() as conn:
        assert assetq.current_revision(conn) == "0010_liveness"
    with pytest.raises(assetq.InstallRefused, match="nothing to adopt"):
        migrate.adopt_development(db.engine, "never_installed")
