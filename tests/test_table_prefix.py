"""MySQL single-database installs with a table prefix (issue 13, item 6): a database that
already has the application's own `dag`, `asset` and `dag_run` tables holds assetq too.

The namespace ``aqm_app.assetq_`` is database ``aqm_app`` (the application's, the URL's own)
with every assetq object named ``assetq_<name>``: tables, views, routines, triggers and the
foreign-key and CHECK constraints (per database in MySQL); sqlfiles.render applies the prefix
and nothing else in the package names objects. The application's tables, rows and DDL are
never touched; uninstall removes exactly assetq's objects. PostgreSQL refuses a prefix (a
schema never collides). docs/operations.md, "MySQL single-database installs"."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

import assetq
import assetq.alembic
from assetq import cli, dialects, migrate, ops, sqlfiles, validation
from assetq.dialects import MYSQL
from dbs import MYSQL_APP_DATABASE, Backend, TestDatabase, made_logins
from schema_snapshot import snapshot

PREFIX = "assetq_"
NS = f"{MYSQL_APP_DATABASE}.{PREFIX}"

#: The application's own tables: Airflow's names, assetq's unprefixed names.
APP_TABLES = (
    "CREATE TABLE dag (dag_id varchar(250) PRIMARY KEY, is_paused bool)",
    "CREATE TABLE asset (id int PRIMARY KEY, uri varchar(1500))",
    "CREATE TABLE dag_run (id int PRIMARY KEY, dag_id varchar(250) NOT NULL,"
    " CONSTRAINT dag_run_dag_id_fkey FOREIGN KEY (dag_id) REFERENCES dag (dag_id),"
    " CONSTRAINT dag_run_id_check CHECK (id > 0))",
    "INSERT INTO dag VALUES ('etl', false), ('report', true)",
    "INSERT INTO asset VALUES (1, 's3://bucket/orders')",
    "INSERT INTO dag_run VALUES (1, 'etl'), (2, 'report')",
)


def _app(db: TestDatabase, *statements: str) -> None:
    with db.engine.begin() as conn:
        for statement in statements:
            conn.execute(sa.text(statement))


def _objects(db: TestDatabase) -> list[tuple[str, str]]:
    """(kind, name) of everything in the application's database; constraints (foreign keys
    and checks: MariaDB names a JSON column's check after the column) as table.name."""
    with db.engine.connect() as conn:
        return sorted(
            (str(kind), str(name))
            for kind, name in conn.execute(
                sa.text(
                    "SELECT 'table', TABLE_NAME FROM information_schema.TABLES"
                    " WHERE TABLE_SCHEMA = :db"
                    " UNION ALL SELECT 'routine', ROUTINE_NAME FROM information_schema.ROUTINES"
                    " WHERE ROUTINE_SCHEMA = :db"
                    " UNION ALL SELECT 'trigger', TRIGGER_NAME FROM information_schema.TRIGGERS"
                    " WHERE TRIGGER_SCHEMA = :db"
                    " UNION ALL SELECT 'constraint', CONCAT(TABLE_NAME, '.', CONSTRAINT_NAME)"
                    " FROM information_schema.TABLE_CONSTRAINTS WHERE CONSTRAINT_SCHEMA = :db"
                    " AND CONSTRAINT_TYPE IN ('FOREIGN KEY', 'CHECK')"
                ),
                {"db": MYSQL_APP_DATABASE},
            )
        )


def _app_state(db: TestDatabase) -> dict[str, object]:
    """The application's tables (those without assetq's prefix): DDL and rows."""
    state: dict[str, object] = {}
    with db.engine.connect() as conn:
        for kind, name in _objects(db):
            if name.startswith(PREFIX):
                continue
            state[f"{kind} {name}"] = True
            if kind == "table":
                state[f"ddl {name}"] = conn.execute(sa.text(f"SHOW CREATE TABLE `{name}`")).one()[1]
                rows = conn.execute(sa.text(f"SELECT * FROM `{name}`")).all()
                state[f"rows {name}"] = sorted(tuple(r) for r in rows)
    return state


@pytest.fixture
def app_db(empty_db: TestDatabase) -> Iterator[TestDatabase]:
    """The application's database with its dag, asset and dag_run tables (rows in them), as
    a TestDatabase whose namespace is the prefixed one (nothing installed yet)."""
    _app(empty_db, *APP_TABLES)
    yield dataclasses.replace(empty_db, namespace=NS)


def _cli(db: TestDatabase, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    url = db.url.render_as_string(hide_password=False)
    code = cli.main(["--url", url, *args])
    out = capsys.readouterr()
    assert code == cli.EXIT_OK, out.err
    return out.out


@pytest.mark.engines("mysql")
def test_a_database_with_the_applications_dag_asset_and_dag_run_tables_holds_assetq(
    app_db: TestDatabase,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = _app_state(app_db)
    assert assetq.install(app_db.engine, namespace=NS) == assetq.head_revision()
    names = [name for _, name in _objects(app_db)]
    for ours in (
        "assetq_dag",
        "assetq_asset",
        "assetq_dag_run",
        "assetq_assetq_alembic_version",
        "assetq_register_event",
        "assetq_schedule_pass",
        "assetq_asset_event_fan_out",
    ):
        assert ours in names, ours
    # Foreign keys and checks are named per database: assetq's carry the prefix too.
    assert "assetq_asset_event.assetq_asset_event_asset_id_fkey" in names
    assert "assetq_dag.assetq_dag_max_attempts_check" in names
    # The application's, as they were.
    assert "dag_run.dag_run_dag_id_fkey" in names and "dag_run.dag_run_id_check" in names

    # The public API...
    with app_db.engine.begin() as conn:
        assetq.declare_dag(conn, "consumer", "orders", namespace=NS)
        assetq.register_event(conn, "orders", extra={"n": 1}, namespace=NS)
    (run,) = assetq.schedule(app_db.engine, namespace=NS)
    (claim,) = assetq.claim_runs(app_db.engine, "w1", namespace=NS)
    assert claim.run_id == run.run_id
    with app_db.engine.begin() as conn:
        done = assetq.complete_run(conn, claim, "success", namespace=NS)
    assert done.state == "success"
    assert app_db.links() == [("consumer", run.event_ids[0])]
    assert app_db.scalar("SELECT count(*) FROM {ns}.dag") == 1  # assetq's dag, not the app's

    # ... and the CLI with --namespace: a scheduler pass, a worker that runs one attempt.
    with app_db.engine.begin() as conn:
        assetq.register_event(conn, "orders", namespace=NS)
    scheduled = _cli(app_db, capsys, "scheduler", "--namespace", NS, "--max-passes", "1", "--json")
    assert json.loads(scheduled.splitlines()[0])["dag_id"] == "consumer"
    (tmp_path / "prefix_jobs.py").write_text("HANDLERS = {'consumer': lambda claim, conn: None}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    worked = _cli(
        app_db, capsys, "worker", "--namespace", NS, "--handlers", "prefix_jobs:HANDLERS",
        "--max-runs", "1", "--poll-interval", "0.2", "--json",
    )  # fmt: skip
    assert json.loads(worked.splitlines()[0])["state"] == "success"
    assert app_db.scalar("SELECT count(*) FROM {ns}.dag_run WHERE state = 'success'") == 2
    status = json.loads(_cli(app_db, capsys, "status", "--json", "--namespace", NS))
    assert "consumer" in json.dumps(status)
    doctor = _cli(app_db, capsys, "doctor", "--namespace", NS)
    assert "definitions" in doctor
    report = assetq.doctor(app_db.engine, namespace=NS)
    assert [c for c in report.checks if c.severity not in ("ok", "note")] == []
    with app_db.engine.connect() as conn:
        assert [s.dag_id for s in assetq.status(conn, namespace=NS)] == ["consumer"]
    preview = ops.uninstall_preview(app_db.engine, namespace=NS)
    assert preview.others == [] and preview.rows["dag"] == 1 and preview.rows["dag_run"] == 2

    assert _app_state(app_db) == before
    _cli(app_db, capsys, "uninstall", "--yes", "--namespace", NS)
    assert _app_state(app_db) == before
    assert [o for o in _objects(app_db) if o[1].startswith(PREFIX)] == []
    with app_db.engine.connect() as conn:
        assert assetq.current_revision(conn, namespace=NS) is None


@pytest.mark.engines("mysql")
def test_the_default_namespace_of_the_same_database_is_still_refused(app_db: TestDatabase) -> None:
    """Without the prefix nothing changed: the application's dag and asset are conflicts."""
    before = _app_state(app_db)
    with pytest.raises(assetq.InstallRefused) as refused:
        assetq.install(app_db.engine, namespace=MYSQL_APP_DATABASE)
    assert refused.value.conflicts == ("table asset", "table dag", "table dag_run")
    assert f"--namespace DATABASE.{PREFIX}" in str(refused.value)
    assert _app_state(app_db) == before


@pytest.mark.engines("mysql")
def test_prefixed_names_that_collide_are_refused_before_anything_is_created(
    app_db: TestDatabase,
) -> None:
    _app(
        app_db,
        "CREATE TABLE assetq_dag (mine int)",
        "CREATE PROCEDURE assetq_claim_runs() SELECT 'the app''s procedure' AS mine",
    )
    before = _objects(app_db), _app_state(app_db)
    with pytest.raises(assetq.InstallRefused) as refused:
        assetq.install(app_db.engine, namespace=NS)
    assert refused.value.code == "AQ122"
    # In the order the revisions would create them: the tables first, routines at the head.
    assert refused.value.conflicts == ("table assetq_dag", "routine assetq_claim_runs")
    assert (_objects(app_db), _app_state(app_db)) == before


@pytest.mark.engines("mysql")
def test_two_prefixes_make_two_independent_installs_in_one_database(
    app_db: TestDatabase,
) -> None:
    other = f"{MYSQL_APP_DATABASE}.team_b_"
    assetq.install(app_db.engine, namespace=NS)
    assetq.install(app_db.engine, namespace=other)
    with app_db.engine.begin() as conn:
        assetq.declare_dag(conn, "consumer", "orders", namespace=NS)
        assetq.register_event(conn, "orders", namespace=NS)
    assert len(assetq.schedule(app_db.engine, namespace=NS)) == 1
    assert assetq.schedule(app_db.engine, namespace=other) == []
    assetq.uninstall(app_db.engine, namespace=other)
    assert not [o for o in _objects(app_db) if o[1].startswith("team_b_")]
    assert app_db.scalar("SELECT count(*) FROM {ns}.dag_run") == 1


@pytest.fixture
def second_app_db(backend: Backend) -> Iterator[TestDatabase]:
    database = backend.database(installed=False)
    _app(database, *APP_TABLES)
    yield dataclasses.replace(database, namespace=NS)
    backend.drop(database)


@pytest.mark.engines("mysql")
def test_a_prefixed_fresh_install_equals_a_prefixed_upgrade_from_the_baseline(
    app_db: TestDatabase, second_app_db: TestDatabase, test_revisions: tuple[str, ...]
) -> None:
    """With the test-only revisions after the baseline: a fresh install to head and an
    install at the baseline upgraded revision by revision give the same prefixed schema."""
    assetq.install(app_db.engine, namespace=NS)
    assetq.install(second_app_db.engine, namespace=NS, revision="0001_baseline")
    assert assetq.install(second_app_db.engine, namespace=NS) == test_revisions[-1]
    fresh = snapshot(app_db, MYSQL_APP_DATABASE)
    assert any(r[0] == "assetq_dag" for r in fresh["relations"])
    assert fresh == snapshot(second_app_db, MYSQL_APP_DATABASE)


@pytest.mark.engines("mysql")
@pytest.mark.parametrize("start", ["0001_baseline", "t0002_event_note"])
def test_a_prefixed_install_at_an_old_revision_upgrades_to_head_and_downgrades_to_base(
    app_db: TestDatabase, start: str, test_revisions: tuple[str, ...]
) -> None:
    """Head is the last test-only revision; the start is one below it."""
    before = _app_state(app_db)
    assetq.install(app_db.engine, namespace=NS, revision=start)
    with app_db.engine.connect() as conn:
        assert assetq.current_revision(conn, namespace=NS) == start
    assert assetq.install(app_db.engine, namespace=NS) == test_revisions[-1]
    with app_db.engine.begin() as conn:  # this package works against head only
        assetq.declare_dag(conn, "consumer", "orders", namespace=NS)
        assetq.register_event(conn, "orders", namespace=NS)
    assert app_db.scalar("SELECT count(*) FROM {ns}.asset_event WHERE note IS NULL") == 1
    assert len(assetq.schedule(app_db.engine, namespace=NS)) == 1
    report = assetq.doctor(app_db.engine, namespace=NS)
    assert {c.name: c.severity for c in report.checks}["definitions"] == "ok"
    assert assetq.uninstall(app_db.engine, namespace=NS) == test_revisions[-1]
    assert [o for o in _objects(app_db) if o[1].startswith(PREFIX)] == []
    assert _app_state(app_db) == before


@pytest.mark.engines("mysql")
def test_a_reader_of_a_prefixed_install_reads_assetqs_tables_and_not_the_applications(
    app_db: TestDatabase,
) -> None:
    """grant_access gives a reader SELECT on the namespace's database (`db`.*) without a
    prefix; with one the database is the application's, so it grants table by table."""
    assetq.install(app_db.engine, namespace=NS)
    _app(app_db, "CREATE USER IF NOT EXISTS 'aq_prefix_reader'@'%' IDENTIFIED BY 'pw'")
    try:
        assetq.grant_roles(app_db.engine, reader="aq_prefix_reader", namespace=NS)
        with app_db.engine.connect() as conn:
            grants = "\n".join(
                conn.execute(sa.text("SHOW GRANTS FOR 'aq_prefix_reader'@'%'")).scalars()
            )
        assert f"`{MYSQL_APP_DATABASE}`.`assetq_dag`" in grants
        assert f"`{MYSQL_APP_DATABASE}`.*" not in grants
        assert f"`{MYSQL_APP_DATABASE}`.`dag`" not in grants
        assetq.revoke_roles(app_db.engine, "aq_prefix_reader", namespace=NS)
        with app_db.engine.connect() as conn:
            grants = "\n".join(
                conn.execute(sa.text("SHOW GRANTS FOR 'aq_prefix_reader'@'%'")).scalars()
            )
        assert "assetq_" not in grants
    finally:
        _app(app_db, "DROP USER IF EXISTS 'aq_prefix_reader'@'%'")


@pytest.mark.engines("mysql")
def test_an_upgrade_gives_prefixed_accounts_what_their_kind_reaches_now(
    app_db: TestDatabase, request: pytest.FixtureRequest
) -> None:
    """Issue 26: a prefixed reader's SELECT is granted table by table, so a table a newer
    package's step adds is not covered until grant_access runs again, and a routine it adds
    is no producer's until then. An upgrade runs grant_access again for every account that
    holds a kind of access (routines.regrant), as `assetq grant --help` promises, but found
    no account of a prefixed namespace: its lookup (granted_access) asked for
    `assetq_assetq_dag`, the prefix twice, and the reader lost status. Here a revoked grant
    stands for the table and the routine the newer package adds: the reader's SELECT on
    process_liveness (status reads it) and the producer's EXECUTE on register_event_v2
    (the routine register_event calls)."""
    assetq.install(app_db.engine, namespace=NS)  # this package's head: the baseline
    with made_logins(app_db, ("reader", "producer"), "aqpr") as logins:
        reader, producer = logins["reader"], logins["producer"]
        assetq.grant_roles(
            app_db.engine, reader=reader.grantee, producer=producer.grantee, namespace=NS
        )
        with reader.engine.connect() as conn:
            assert assetq.status(conn, namespace=NS) == []
            assert assetq.processes(conn, namespace=NS) == []
        user, host = producer.grantee, reader.grantee
        for statement in (
            f"REVOKE SELECT ON `{MYSQL_APP_DATABASE}`.`assetq_process_liveness`"
            f" FROM '{host[0]}'@'{host[1]}'",
            f"REVOKE EXECUTE ON PROCEDURE `{MYSQL_APP_DATABASE}`.`assetq_register_event_v2`"
            f" FROM '{user[0]}'@'{user[1]}'",
        ):
            _app(app_db, statement)
        with reader.engine.connect() as conn, pytest.raises(assetq.DatabaseError, match="denied"):
            assetq.processes(conn, namespace=NS)
        with producer.engine.begin() as conn, pytest.raises(assetq.AssetqError, match="denied"):
            assetq.register_event(conn, "orders", namespace=NS)

        newer: tuple[str, ...] = request.getfixturevalue("test_revisions")  # its table steps
        assert assetq.install(app_db.engine, namespace=NS) == newer[-1]
        with app_db.engine.begin() as conn:
            assetq.declare_dag(conn, "report", "orders", namespace=NS)
        with producer.engine.begin() as conn:
            assetq.register_event(conn, "orders", namespace=NS)
        with reader.engine.connect() as conn:
            assert [s.dag_id for s in assetq.status(conn, namespace=NS)] == ["report"]
            assert assetq.processes(conn, namespace=NS) == []
        shown = app_db.rows(f"SHOW GRANTS FOR '{host[0]}'@'{host[1]}'")
        grants = "\n".join(str(r[0]) for r in shown)
        assert f"`{MYSQL_APP_DATABASE}`.`dag`" not in grants  # still none of the application's


@pytest.mark.engines("mysql")
def test_autogenerate_leaves_the_prefixed_tables_alone_and_still_sees_the_applications(
    app_db: TestDatabase,
) -> None:
    assetq.install(app_db.engine, namespace=NS)
    metadata = sa.MetaData()
    sa.Table("dag", metadata, sa.Column("dag_id", sa.String(250), primary_key=True),
             sa.Column("is_paused", sa.Boolean))  # fmt: skip
    sa.Table("asset", metadata, sa.Column("id", sa.Integer, primary_key=True,
             autoincrement=False), sa.Column("uri", sa.String(1500)))  # fmt: skip

    def diff(include: Any) -> list[Any]:
        with app_db.engine.connect() as conn:
            context = MigrationContext.configure(
                conn, opts={"include_object": include, "compare_type": False}
            )
            return compare_metadata(context, metadata)

    def ours(obj: Any, name: Any, type_: Any, reflected: Any, compare_to: Any) -> bool:
        return assetq.alembic.include_object(obj, name, type_, reflected, compare_to, namespace=NS)

    removed = sorted(d[1].name for d in diff(ours) if d[0] == "remove_table")
    # The application's dag_run is not in its metadata: autogenerate proposes dropping it.
    # None of assetq's prefixed tables is proposed.
    assert removed == ["dag_run"]
    unfiltered = sorted(d[1].name for d in diff(None) if d[0] == "remove_table")
    assert "assetq_dag" in unfiltered and "assetq_asset_event" in unfiltered


def test_include_object_with_a_prefix_matches_the_prefixed_names_only() -> None:
    def included(name: str, schema: str | None = None) -> bool:
        table = SimpleNamespace(schema=schema)
        return assetq.alembic.include_object(table, name, "table", True, None, namespace=NS)

    assert not included("assetq_dag")
    assert not included("assetq_assetq_alembic_version", MYSQL_APP_DATABASE)
    assert included("dag") and included("asset") and included("assetq_orders")
    assert included("assetq_dag", "elsewhere")
    # Without a prefix the rule is unchanged: assetq's names in the default schema are its.
    assert not assetq.alembic.include_object(
        SimpleNamespace(schema=None), "dag", "table", True, None
    )


@pytest.mark.engines("postgresql")
def test_postgresql_refuses_a_table_prefix_and_writes_nothing(empty_db: TestDatabase) -> None:
    with pytest.raises(assetq.InvalidArgument) as refused:
        assetq.install(empty_db.engine, namespace="app.assetq_")
    assert "only MySQL/MariaDB" in str(refused.value)
    with empty_db.engine.connect() as conn:
        schemas = conn.execute(
            sa.text("SELECT nspname FROM pg_namespace WHERE nspname IN ('app', 'assetq_')")
        ).all()
    assert schemas == []


@pytest.mark.parametrize(
    ("namespace", "error"),
    [
        ("app.assetq_.x", assetq.InvalidArgument),
        ("App.assetq_", assetq.InvalidArgument),
        ("app.", assetq.InvalidArgument),
        ("app." + "p" * (validation.PREFIX_MAX + 1), assetq.NameTooLong),
        ("a" * 64 + ".assetq_", assetq.NameTooLong),
    ],
)
def test_a_namespace_is_a_name_or_a_database_and_a_prefix(namespace: str, error: type) -> None:
    with pytest.raises(error):
        validation.check_namespace(namespace)
    assert validation.check_namespace(NS) == NS
    assert migrate.version_table(NS) == (MYSQL_APP_DATABASE, "assetq_assetq_alembic_version")
    assert migrate.version_table("assetq") == ("assetq", "assetq_alembic_version")


@pytest.mark.engines("mysql")
def test_a_host_alembic_history_installs_assetq_with_a_prefix_next_to_its_dag_table(
    app_db: TestDatabase,
) -> None:
    """tests/hostapp's history (assetq pinned at 0001_baseline, upgraded later to
    t0003_event_note_index, a test-only revision standing for a newer package) in a database
    that also has dag, asset and dag_run tables that its metadata does not map: `alembic
    check` proposes dropping those three and nothing of assetq's prefixed tables;
    `alembic downgrade base` removes assetq and leaves them."""
    from test_host_alembic import alembic as host_alembic

    before = _app_state(app_db)
    host_alembic(app_db, "upgrade", "head", namespace=NS)
    with app_db.engine.connect() as conn:
        assert assetq.current_revision(conn, namespace=NS) == "t0003_event_note_index"
    checked = host_alembic(app_db, "check", namespace=NS, check=False)
    proposed = checked.stdout + checked.stderr
    assert checked.returncode != 0 and "remove_table" in proposed
    for table in ("dag", "asset", "dag_run"):
        assert f"Table('{table}'" in proposed, proposed
    assert "assetq_" not in proposed, proposed
    unfiltered = host_alembic(
        app_db, "check", namespace=NS, check=False, HOSTAPP_NO_ASSETQ_FILTER="1"
    )
    assert "Table('assetq_dag_run'" in unfiltered.stdout + unfiltered.stderr
    host_alembic(app_db, "downgrade", "base", namespace=NS)
    assert [o for o in _objects(app_db) if o[1].startswith(PREFIX)] == []
    after = {k: v for k, v in _app_state(app_db).items() if "alembic_version" not in k}
    assert after == before


def _mysql_scripts() -> list[str]:
    """Every packaged MySQL file: the tables, the queries, each routine, trigger and view,
    and the table steps after the baseline."""
    folder = resources.files("assetq.sql").joinpath("mysql")
    names = [e.name for e in folder.iterdir() if e.name.endswith(".sql")]
    names += [f.path for f in sqlfiles.object_files("mysql")]
    names += [f"steps/{e.name}" for e in folder.joinpath("steps").iterdir()]
    assert "tables.sql" in names and "routines/claim_runs.sql" in names
    return sorted(n for n in names if n.endswith(".sql"))


def test_without_a_prefix_every_mysql_script_renders_as_it_always_did() -> None:
    """Routines an earlier package installed keep the definitions doctor compares with."""
    for relpath in _mysql_scripts():
        text = sqlfiles.read("mysql", relpath)
        if "{{prefix}}" in text or "{{database}}" in text:  # the catalog queries only
            assert relpath in ("queries.sql", "lifecycle.sql", "upgrades.sql"), relpath
            continue
        assert sqlfiles.render(text, "`app_db`") == text.replace("{{ns}}", "`app_db`"), relpath


def test_with_a_prefix_every_name_of_every_mysql_script_carries_it() -> None:
    quoted = MYSQL.quote_ns("app_db.assetq_")
    for relpath in _mysql_scripts():
        rendered = sqlfiles.render(sqlfiles.read("mysql", relpath), quoted)
        assert "{{ns}}" not in rendered and "{{prefix}}" not in rendered, relpath
        unprefixed = re.findall(r"`app_db`\.`(?!assetq_)\w+`", rendered)
        assert unprefixed == [], (relpath, unprefixed)
        # Names routines build at run time (grant_access, the migration helpers' arguments).
        assert not re.search(r"v_ns, '\.(?!assetq_|\*|`)", rendered), relpath
        assert "'.* TO '" not in rendered and "'.* FROM '" not in rendered, relpath
        for name in ("register_event", "dag_run", "dag_max_attempts_check"):
            assert f"'{name}'" not in rendered, (relpath, name)


def test_no_mysql_script_gives_a_name_the_prefix_twice() -> None:
    """A literal that names an object gets the prefix from the rendering: one that spelled
    the prefix out as well named `assetq_assetq_dag` (granted_access, issue 26)."""
    quoted = MYSQL.quote_ns("app_db.assetq_")
    for relpath in _mysql_scripts():
        code = sqlfiles.without_comments(sqlfiles.read("mysql", relpath))
        rendered = sqlfiles.render(code, quoted)
        # assetq's own assetq_alembic_version and assetq_install_lock take it once, too.
        twice = re.findall(r"assetq_(?:', ')?assetq_(?!alembic_version|install_lock)\w*", rendered)
        assert twice == [], (relpath, twice)


def test_a_prefixed_routine_that_is_being_recreated_is_transient() -> None:
    routines = frozenset({"claim_runs", "register_event"})
    assert dialects._is_ours("assetq_claim_runs", routines)
    assert dialects._is_ours("claim_runs", routines)
    assert not dialects._is_ours("app_procedure", routines)


@pytest.mark.engines("mysql")
def test_repair_recreates_a_prefixed_installs_routine_trigger_and_view(
    app_db: TestDatabase,
) -> None:
    assetq.install(app_db.engine, namespace=NS)
    _app(app_db, "CREATE USER IF NOT EXISTS 'aq_prefix_worker'@'%' IDENTIFIED BY 'pw'")
    try:
        _app(
            app_db,
            "DROP TRIGGER assetq_asset_event_fan_out",
            "DROP VIEW assetq_dag_queue_status",
            "DROP PROCEDURE assetq_claim_runs",
            "CREATE PROCEDURE assetq_claim_runs() SELECT 'changed by hand' AS body",
        )
        # After the drop (which revoked the routine's grants): repair must give these back.
        assetq.grant_roles(app_db.engine, worker="aq_prefix_worker", namespace=NS)
        before = _app_state(app_db)
        repaired = migrate.repair(app_db.engine, namespace=NS)
        assert len(repaired) == 3, repaired
        assert {c.name: c.severity for c in assetq.doctor(app_db.engine, namespace=NS).checks}[
            "definitions"
        ] == "ok"
        with app_db.engine.connect() as conn:
            grants = "\n".join(
                conn.execute(sa.text("SHOW GRANTS FOR 'aq_prefix_worker'@'%'")).scalars()
            )
        assert f"`{MYSQL_APP_DATABASE}`.`assetq_claim_runs`" in grants  # given back
        with app_db.engine.begin() as conn:
            assetq.declare_dag(conn, "consumer", "orders", namespace=NS)
            assetq.register_event(conn, "orders", namespace=NS)  # fans out again
        assert len(assetq.schedule(app_db.engine, namespace=NS)) == 1
        assert len(assetq.claim_runs(app_db.engine, "w", namespace=NS)) == 1
        assert _app_state(app_db) == before
        assert not [o for o in _objects(app_db) if "repair_grants" in o[1]]
    finally:
        _app(app_db, "DROP USER IF EXISTS 'aq_prefix_worker'@'%'")
