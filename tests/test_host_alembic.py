"""assetq as revisions of a host application's own alembic history (issue 13, item 1).

tests/hostapp is an application's alembic project: its own tables, a revision that installs
assetq pinned at this package's head (0003_run_attempts), a revision of its own, a revision that
upgrades assetq to a later table step and then indexes its own table. That later step is a
test-only revision (tests/revisions), standing for a newer assetq package: the tests run
"the newer package" by giving the host's env.py that folder (HOSTAPP_ASSETQ_REVISIONS) and,
in this process, the ``test_revisions`` fixture; "the package that installed the pinned revision"
without either (its head is the pinned revision). The tests drive the project with the ``alembic``
command as the application's developers would (a subprocess: alembic's exit status is part
of what is proven), online and offline (``--sql``, the output run with psql / the mysql
client), on both engines.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

import assetq
import changed_files
from dbs import Backend, TestDatabase
from schema_snapshot import snapshot

HOSTAPP = Path(__file__).parent / "hostapp"
#: The test-only revisions after the baseline (the conftest's ``test_revisions`` fixture
#: gives this process the same folder).
NEWER_REVISIONS = Path(__file__).parent / "revisions"
PINNED = "0003_run_attempts"
UPGRADED = "t0003_event_note_index"
HOST_HEAD = "h0004_assetq_event_note"
#: The last host revision the package that installed the pinned revision can run (the next one
#: names a revision only the newer package knows).
OLD_PACKAGE_HOST_HEAD = "h0003_orders"
NAMESPACE = "assetq"


@pytest.fixture
def second_empty_db(backend: Backend) -> Iterator[TestDatabase]:
    database = backend.database(installed=False)
    yield database
    backend.drop(database)


def alembic(
    db: TestDatabase,
    *args: str,
    namespace: str = NAMESPACE,
    project: Path = HOSTAPP,
    check: bool = True,
    newer_package: bool = True,
    **env: str,
) -> subprocess.CompletedProcess[str]:
    """``alembic -c <project>/alembic.ini ARGS`` against ``db``, as a developer runs it;
    with the newer package (whose head is after the pinned revision: tests/revisions added) unless
    ``newer_package`` is False."""
    environment = {
        **os.environ,
        "HOSTAPP_DATABASE_URL": db.url.render_as_string(hide_password=False),
        "HOSTAPP_ASSETQ_NAMESPACE": namespace,
        **env,
    }
    environment.pop("HOSTAPP_ASSETQ_REVISIONS", None)
    if newer_package:
        environment["HOSTAPP_ASSETQ_REVISIONS"] = str(NEWER_REVISIONS)
    done = subprocess.run(
        [sys.executable, "-m", "alembic", "-c", str(project / "alembic.ini"), *args],
        capture_output=True,
        text=True,
        env=environment,
        timeout=240,
    )
    if check:
        assert done.returncode == 0, done.stderr[-3000:]
    return done


def run_with_client(db: TestDatabase, sql: str) -> None:
    """Run ``sql`` with the engine's own command-line client, as a DBA would."""
    url = db.url
    if db.engine_name == "postgresql":
        tool = shutil.which("psql")
        # A unix-socket URL (the embedded PostgreSQL of .ci/run) has its directory (and
        # port) in the query: postgresql+psycopg://user@/db?host=/tmp/...
        host = url.host or url.query.get("host")
        port = url.port or url.query.get("port") or 5432
        command = [
            "psql", "-X", "-q", "-v", "ON_ERROR_STOP=1",
            "-h", str(host), "-p", str(port),
            "-U", str(url.username), "-d", str(url.database),
        ]  # fmt: skip
        env = {**os.environ, "PGPASSWORD": url.password or ""}
    else:
        tool = shutil.which("mariadb") or shutil.which("mysql")
        # --comments: keep the comments inside routine bodies, as assetq's own loader does
        # (the client strips them by default, and the stored routines would differ).
        command = [str(tool), "--comments", "--batch", "-u", str(url.username)]
        socket = url.query.get("unix_socket")
        if socket:
            command.append(f"--socket={socket}")
        else:
            command += ["-h", str(url.host), "-P", str(url.port or 3306), "--protocol=tcp"]
        if url.password:
            command.append(f"-p{url.password}")
        command.append(str(url.database))
        env = dict(os.environ)
    if tool is None:
        pytest.skip(f"no {command[0]} client on this machine")
    done = subprocess.run(command, input=sql, capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]


def assert_same_schema(left: TestDatabase, right: TestDatabase) -> None:
    """The two namespaces hold the same schema; on failure, the first row that differs."""
    ours, theirs = snapshot(left), snapshot(right)
    for kind in sorted(set(ours) | set(theirs)):
        a, b = ours.get(kind, []), theirs.get(kind, [])
        assert len(a) == len(b), (kind, a, b)
        for x, y in zip(a, b, strict=True):
            fields = [(i, u, v) for i, (u, v) in enumerate(zip(x, y, strict=True)) if u != v]
            assert not fields, f"{kind} {x[0]}: fields that differ {fields}"


def assetq_revision(db: TestDatabase, namespace: str = NAMESPACE) -> str | None:
    with db.engine.connect() as conn:
        return assetq.current_revision(conn, namespace=namespace)


def host_revision(db: TestDatabase) -> str | None:
    with db.engine.connect() as conn:
        return conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()


def host_tables(db: TestDatabase) -> set[str]:
    return set(sa.inspect(db.engine).get_table_names()) - {"alembic_version"}


def test_a_host_history_installs_assetq_pinned_then_upgrades_it_between_its_own_steps(
    empty_db: TestDatabase, second_empty_db: TestDatabase, test_revisions: tuple[str, ...]
) -> None:
    db = empty_db
    alembic(db, "upgrade", "h0003_orders")
    assert assetq_revision(db) == PINNED
    # The host's op.* after assetq's step in the same run worked (it failed before: assetq's
    # nested alembic command removed the host's proxies).
    assert {c["name"] for c in sa.inspect(db.engine).get_columns("account")} >= {"email"}
    alembic(db, "upgrade", "head")
    assert assetq_revision(db) == UPGRADED == assetq.head_revision()
    assert host_revision(db) == HOST_HEAD
    indexes = {i["name"] for i in sa.inspect(db.engine).get_indexes("orders")}
    assert "orders_amount_idx" in indexes
    assetq.install(second_empty_db.engine)
    assert_same_schema(db, second_empty_db)


def test_the_package_that_installed_the_baseline_builds_its_own_fresh_install(
    empty_db: TestDatabase, second_empty_db: TestDatabase
) -> None:
    """The pinned step at that package's head: the pinned revision's tables and that package's
    routines, triggers and views, as `assetq install` builds them."""
    alembic(empty_db, "upgrade", OLD_PACKAGE_HOST_HEAD, newer_package=False)
    assert assetq_revision(empty_db) == PINNED == assetq.head_revision()
    assetq.install(second_empty_db.engine)
    assert_same_schema(empty_db, second_empty_db)


def test_replaying_the_history_with_a_newer_package_ends_where_its_fresh_install_does(
    empty_db: TestDatabase, second_empty_db: TestDatabase, test_revisions: tuple[str, ...]
) -> None:
    """The host history run up to h0003 by the package that installed the pinned revision, then the
    rest by the newer package: the pinned steps, never edited, end at the newer package's
    fresh install."""
    db = empty_db
    alembic(db, "upgrade", OLD_PACKAGE_HOST_HEAD, newer_package=False)
    assert assetq_revision(db) == PINNED
    alembic(db, "upgrade", "head")
    assert assetq_revision(db) == UPGRADED
    assetq.install(second_empty_db.engine)
    assert_same_schema(db, second_empty_db)


def test_the_pinned_revision_is_installed_whatever_this_package_head_is(
    empty_db: TestDatabase, second_empty_db: TestDatabase, test_revisions: tuple[str, ...]
) -> None:
    """The newer package runs the pinned step: the pinned revision's tables, not its head's. No
    routine, trigger or view yet: they are made from the package's files when the schema
    reaches the package's head, as for an install pinned there."""
    alembic(empty_db, "upgrade", "h0002_assetq")
    assert assetq_revision(empty_db) == PINNED != assetq.head_revision()
    assetq.install(second_empty_db.engine, revision=PINNED)
    assert_same_schema(empty_db, second_empty_db)
    assert not snapshot(empty_db)["routines"]


def test_the_install_at_deploy_reaches_the_package_head_and_the_later_host_step_does_nothing(
    empty_db: TestDatabase, second_empty_db: TestDatabase, test_revisions: tuple[str, ...]
) -> None:
    """A history whose assetq steps stop below the package's head (h0003 with the newer
    package): `assetq.install(engine)` at deploy upgrades to the head and creates the
    routines; the host's later step to that revision then only does its own part."""
    db = empty_db
    alembic(db, "upgrade", "h0003_orders")
    assetq.install(db.engine)
    assert assetq_revision(db) == UPGRADED
    alembic(db, "upgrade", "head")
    assert host_revision(db) == HOST_HEAD
    assert "orders_amount_idx" in {i["name"] for i in sa.inspect(db.engine).get_indexes("orders")}
    assetq.install(second_empty_db.engine)
    assert_same_schema(db, second_empty_db)


def test_a_newer_package_brings_its_routine_bodies_at_deploy_without_a_host_revision(
    empty_db: TestDatabase, second_empty_db: TestDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A package with another body of a routine and no new revision (this process, with
    set_dag_paused's file changed): the host history stays as it is, its assetq step
    unedited, and `assetq.install(engine)` at deploy re-creates the routine whose file
    differs from the one it was made from (routine_catalogue's checksum)."""
    db = empty_db
    alembic(db, "upgrade", OLD_PACKAGE_HOST_HEAD, newer_package=False)
    before = snapshot(db)
    with changed_files.shipped(monkeypatch, {db.dialect.name: ["set_dag_paused"]}):
        assetq.install(db.engine)
        assetq.install(second_empty_db.engine)
    assert host_revision(db) == OLD_PACKAGE_HOST_HEAD
    assert assetq_revision(db) == PINNED
    changed = [row for row in snapshot(db)["routines"] if row not in before["routines"]]
    assert [row[0] for row in changed] == ["set_dag_paused"]
    assert changed_files.MARK in str(changed[0])
    assert_same_schema(db, second_empty_db)


def test_alembic_downgrade_steps_assetq_back_with_the_host_history(
    empty_db: TestDatabase,
) -> None:
    """Up to h0003 by the package that installed the pinned revision, to head by the newer one,
    then back. Routines are never downgraded: the downgrade keeps the newer package's bodies,
    here the same as the older one's (the test-only steps change tables only)."""
    db = empty_db
    alembic(db, "upgrade", OLD_PACKAGE_HOST_HEAD, newer_package=False)
    at_pinned = snapshot(db)
    alembic(db, "upgrade", "head")
    alembic(db, "downgrade", OLD_PACKAGE_HOST_HEAD)
    assert assetq_revision(db) == PINNED
    assert snapshot(db) == at_pinned
    alembic(db, "downgrade", "base")
    assert assetq_revision(db) is None
    assert not any(snapshot(db).values())
    assert host_tables(db) == set()


@pytest.mark.parametrize("newer_package", [True, False], ids=["newer", "pinned_package"])
@pytest.mark.parametrize("start", ["base", "h0001_accounts"])
def test_alembic_upgrade_sql_emits_what_a_dba_runs_to_get_the_same_schema(
    empty_db: TestDatabase, second_empty_db: TestDatabase, start: str, newer_package: bool
) -> None:
    """From the host's base, and from the revision before the install step, which needs no
    from_revision: an upgrade to the pinned revision starts from nothing installed, and the later
    assetq step takes what it wrote."""
    end = "head" if newer_package else OLD_PACKAGE_HOST_HEAD
    if start != "base":
        alembic(empty_db, "upgrade", start, newer_package=newer_package)
    moves = end if start == "base" else f"{start}:{end}"
    offline = alembic(empty_db, "upgrade", moves, "--sql", newer_package=newer_package).stdout
    assert "{{ns}}" not in offline
    run_with_client(empty_db, offline)
    assert assetq_revision(empty_db) == (UPGRADED if newer_package else PINNED)
    assert host_revision(empty_db) == (HOST_HEAD if newer_package else OLD_PACKAGE_HOST_HEAD)
    assert host_tables(empty_db) >= {"account", "orders"}
    alembic(second_empty_db, "upgrade", end, newer_package=newer_package)  # the same, online
    assert_same_schema(empty_db, second_empty_db)


def test_alembic_downgrade_sql_steps_assetq_back_as_online(empty_db: TestDatabase) -> None:
    db = empty_db
    alembic(db, "upgrade", OLD_PACKAGE_HOST_HEAD, newer_package=False)
    at_pinned = snapshot(db)
    alembic(db, "upgrade", "head")
    steps_back = f"{HOST_HEAD}:{OLD_PACKAGE_HOST_HEAD}"
    run_with_client(db, alembic(db, "downgrade", steps_back, "--sql").stdout)
    assert assetq_revision(db) == PINNED
    assert snapshot(db) == at_pinned


@pytest.mark.parametrize("start", ["h0002_assetq", "h0003_orders"])
def test_offline_upgrade_starting_after_the_install_asks_for_from_revision(
    empty_db: TestDatabase, start: str
) -> None:
    done = alembic(empty_db, "upgrade", f"{start}:head", "--sql", check=False)
    assert done.returncode != 0
    assert f"upgrade({UPGRADED!r})" in done.stderr
    assert "pass from_revision=" in done.stderr


def test_offline_upgrade_starting_after_the_install_runs_with_from_revision(
    empty_db: TestDatabase, second_empty_db: TestDatabase, tmp_path: Path
) -> None:
    """The later step with from_revision= written in it: a `--sql` run may start anywhere."""
    project = tmp_path / "hostapp"
    shutil.copytree(HOSTAPP, project, ignore=shutil.ignore_patterns("__pycache__"))
    step = project / "migrations" / "versions" / f"{HOST_HEAD}.py"
    call = f'assetq.alembic.upgrade(op, "{UPGRADED}", namespace=NAMESPACE)'
    code = step.read_text()
    assert call in code
    step.write_text(code.replace(call, f'{call[:-1]}, from_revision="{PINNED}")'))
    alembic(empty_db, "upgrade", "h0003_orders", project=project)
    offline = alembic(empty_db, "upgrade", "h0003_orders:head", "--sql", project=project)
    run_with_client(empty_db, offline.stdout)
    assert assetq_revision(empty_db) == UPGRADED
    assert host_revision(empty_db) == HOST_HEAD
    alembic(second_empty_db, "upgrade", "head")
    assert_same_schema(empty_db, second_empty_db)


def test_autogenerate_proposes_nothing_for_assetq_objects(empty_db: TestDatabase) -> None:
    namespace = _namespace_autogenerate_sees(empty_db)
    alembic(empty_db, "upgrade", "head", namespace=namespace)
    alembic(empty_db, "check", namespace=namespace)  # exits 1 on any proposed operation


def test_autogenerate_without_the_filter_would_drop_assetq_tables(
    empty_db: TestDatabase,
) -> None:
    # The same check as above with the filter left out: proves the filter is what keeps
    # assetq's tables out of the proposals.
    namespace = _namespace_autogenerate_sees(empty_db)
    alembic(empty_db, "upgrade", "head", namespace=namespace)
    done = alembic(
        empty_db, "check", namespace=namespace, check=False, HOSTAPP_NO_ASSETQ_FILTER="1"
    )
    assert done.returncode != 0
    assert "remove_table" in done.stdout + done.stderr
    assert "dag_run" in done.stdout + done.stderr


def _namespace_autogenerate_sees(db: TestDatabase) -> str:
    """Where autogenerate sees assetq's tables: PostgreSQL's own schema (the host's env.py
    compares every schema there), MySQL's single-database install (assetq in the
    application's own database; a separate database is never reflected)."""
    return NAMESPACE if db.engine_name == "postgresql" else str(db.url.database)


@pytest.mark.engines("postgresql")
def test_a_failure_later_in_the_host_revision_rolls_assetq_back_too(
    empty_db: TestDatabase, tmp_path: Path
) -> None:
    """PostgreSQL: the host revision is one transaction, assetq's step included. (MySQL
    commits every DDL statement, so no engine can offer this there; docs/alembic.md.)"""
    project = tmp_path / "failing"
    shutil.copytree(HOSTAPP, project, ignore=shutil.ignore_patterns("h000[2-4]*", "__pycache__"))
    (project / "migrations" / "versions" / "h0002_fails.py").write_text(
        '"""Installs assetq, then fails."""\n'
        "import sqlalchemy as sa\n"
        "from alembic import op\n\n"
        "import assetq.alembic\n\n"
        'revision = "h0002_fails"\n'
        'down_revision = "h0001_accounts"\n\n\n'
        "def upgrade() -> None:\n"
        f'    assetq.alembic.upgrade(op, "{PINNED}")\n'
        '    op.create_table("notes", sa.Column("id", sa.Integer, primary_key=True))\n'
        '    op.execute("SELECT * FROM no_such_table")\n'
    )
    alembic(empty_db, "upgrade", "h0001_accounts", project=project)
    done = alembic(empty_db, "upgrade", "head", project=project, check=False)
    assert done.returncode != 0
    assert "no_such_table" in done.stderr
    assert assetq_revision(empty_db) is None
    assert not any(snapshot(empty_db).values())
    assert host_tables(empty_db) == {"account"}
    assert host_revision(empty_db) == "h0001_accounts"
