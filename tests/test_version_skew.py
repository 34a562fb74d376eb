"""Version skew (issue 13 item 3): which package works against which schema.

The window (docs/operations.md, "Upgrading"): every revision not in
migrate.BREAKING_REVISIONS is additive, so a package keeps working against newer schemas up to
the next breaking revision; each schema says so in a marker the older package can read. Proven
three ways: the catalogs of consecutive revisions (nothing an older package calls disappears
except at a breaking revision), the previous packages themselves (their code from git, run in a
subprocess) against head, and this package's own check, which raises SchemaTooOld /
SchemaTooNew with the fix outside the window.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import sqlalchemy as sa

import assetq
from assetq import migrate, ops
from dbs import TestDatabase

REPO = Path(__file__).resolve().parent.parent

#: Routine signatures (name, arguments, result) and table columns of the namespace: what an
#: older package's calls and reads depend on. On PostgreSQL a function's result columns are
#: listed one by one: a package reads them by name, so a column added to a result (0009's
#: partition_key) keeps every call working, and a column removed or retyped does not.
CATALOG = {
    "postgresql": (
        "SELECT p.proname || '(' || pg_get_function_arguments(p.oid) || ')' FROM pg_proc p"
        " JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = :ns"
        " UNION ALL SELECT p.proname || '(' || pg_get_function_identity_arguments(p.oid)"
        " || ') -> ' || c.name || ' ' || format_type(c.type, NULL)"
        " FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace,"
        " unnest(p.proallargtypes, p.proargmodes, p.proargnames) AS c(type, mode, name)"
        " WHERE n.nspname = :ns AND c.mode IN ('o', 't', 'b')"
        " UNION ALL SELECT p.proname || '(' || pg_get_function_identity_arguments(p.oid)"
        " || ') -> ' || pg_get_function_result(p.oid) FROM pg_proc p"
        " JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = :ns AND p.proallargtypes IS NULL"
        " UNION ALL SELECT table_name || '.' || column_name || ' ' || data_type"
        " FROM information_schema.columns WHERE table_schema = :ns"
    ),
    "mysql": (
        "SELECT CONCAT(r.routine_name, '(', COALESCE((SELECT GROUP_CONCAT(CONCAT(p.parameter_mode,"
        " ' ', p.parameter_name, ' ', p.dtd_identifier) ORDER BY p.ordinal_position)"
        " FROM information_schema.parameters p WHERE p.specific_schema = r.routine_schema"
        " AND p.specific_name = r.routine_name AND p.ordinal_position > 0), ''), ')')"
        " FROM information_schema.routines r WHERE r.routine_schema = :ns"
        " UNION ALL SELECT CONCAT(table_name, '.', column_name, ' ', column_type)"
        " FROM information_schema.columns WHERE table_schema = :ns"
    ),
}


def _catalog(db: TestDatabase) -> set[str]:
    with db.engine.connect() as conn:
        return set(conn.execute(sa.text(CATALOG[db.engine_name]), {"ns": db.namespace}).scalars())


def test_only_the_breaking_revisions_remove_what_an_older_package_calls(
    empty_db: TestDatabase,
) -> None:
    removed: dict[str, list[str]] = {}
    before: set[str] | None = None
    for revision in migrate.revisions():
        assetq.install(empty_db.engine, revision=revision)
        now = _catalog(empty_db)
        if before is not None:
            removed[revision] = sorted(before - now)
        before = now
    additive = {r for r, gone in removed.items() if not gone}
    assert additive == set(removed) - migrate.BREAKING_REVISIONS, removed
    assert migrate.oldest_client(migrate.head_revision()) == "0006_work_queue"


# -- the previous packages themselves -------------------------------------------------------


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, check=False)


def _package_at(revision: str, engine: str, into: Path) -> Path:
    """This repository's package as it was when ``revision`` was its head on ``engine``: the
    commit before the next revision's ``engine`` script was added, laid out as the wheel
    installs it. (The engines' halves of 0006 and 0007 were written in turn: no commit had
    MySQL at 0006 as its head, and that case is skipped.)"""
    later = migrate.revisions()[migrate.revisions().index(revision) + 1]
    found = _git(
        "log", "--diff-filter=A", "--format=%H", "--", f"sql/{engine}/migrations/{later}.up.sql"
    )
    commits = found.stdout.decode().split() if found.returncode == 0 else []
    if not commits:
        pytest.skip("needs the repository's git history (a checkout, not an sdist)")
    commit = f"{commits[-1]}^"
    if _git("cat-file", "-e", f"{commit}:sql/{engine}/migrations/{revision}.up.sql").returncode:
        pytest.skip(f"no commit had {revision} as the head of the {engine} package")
    archive = _git(
        "archive", "--format=tar", commit, "python_bindings/assetq", "sql", "migrations"
    ).stdout
    root = into / revision
    layout = {
        "python_bindings/assetq/": "assetq/",
        "sql/": "assetq/sql/",
        "migrations/": "assetq/migrations/",
    }
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue
            for prefix, target in layout.items():
                if member.name.startswith(prefix):
                    path = root / (target + member.name[len(prefix) :])
                    path.parent.mkdir(parents=True, exist_ok=True)
                    extracted = tar.extractfile(member)
                    assert extracted is not None
                    path.write_bytes(extracted.read())
    return root


def _run_old_client(db: TestDatabase, package: Path) -> subprocess.CompletedProcess[str]:
    url = db.url.render_as_string(hide_password=False)
    return subprocess.run(
        [sys.executable, __file__, url, db.namespace],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONPATH": str(package)},
    )


@pytest.mark.parametrize(
    "revision", ["0006_work_queue", "0007_capped_claim", "0008_claim_plans", "0009_partitions"]
)
def test_a_previous_package_in_the_window_keeps_working_against_head(
    db: TestDatabase, revision: str, tmp_path: Path
) -> None:
    done = _run_old_client(db, _package_at(revision, db.engine_name, tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[:2] == ["ok", revision], done.stdout
    with db.engine.connect() as conn:
        assert migrate.current_revision(conn, namespace=db.namespace) == migrate.head_revision()


def test_a_package_before_the_window_fails_against_head_on_mysql(
    db: TestDatabase, tmp_path: Path
) -> None:
    # 0006_work_queue added declare_dag's retry options. MySQL's CALL takes every argument by
    # position, so the 0005 package's declaration is refused; PostgreSQL's named arguments
    # and defaults take it (the window is the stricter engine's: both engines get it).
    done = _run_old_client(db, _package_at("0005_wakeup_on_demand", db.engine_name, tmp_path))
    if db.engine_name == "mysql":
        assert done.returncode != 0
        assert "Incorrect number of arguments for PROCEDURE assetq.declare_dag" in done.stderr
    else:
        assert done.returncode == 0, done.stderr[-3000:]


# -- this package's check -------------------------------------------------------------------


def _stamp(db: TestDatabase, revision: str, marker: str | None) -> None:
    """Pretend a newer package upgraded the namespace to ``revision``, leaving ``marker``."""
    table = f"{db.dialect.quote_ns(db.namespace)}.{migrate.VERSION_TABLE}"
    with db.engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {table} SET version_num = :v"), {"v": revision})
        sql = migrate._upgrade_sql(db.dialect, "write_compat_marker", db.namespace, marker or "")
        conn.execute(sa.text(sql))
    migrate.forget_checks()


def _check(db: TestDatabase) -> None:
    with db.engine.connect() as conn:
        migrate.check_schema(conn, db.namespace)


def _status_line(db: TestDatabase) -> str:
    """The first line `assetq status` prints for the test's namespace."""
    from assetq import cli

    url = db.url.render_as_string(hide_password=False)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cli.main(["--url", url, "--namespace", db.namespace, "status"])
    return out.getvalue().splitlines()[0]


def test_an_older_schema_says_upgrade_it_first(empty_db: TestDatabase) -> None:
    assetq.install(empty_db.engine, revision="0007_capped_claim")
    migrate.forget_checks()
    with pytest.raises(assetq.SchemaTooOld, match="assetq upgrade --namespace assetq"):
        _check(empty_db)
    problem = ops.doctor(empty_db.engine, namespace=empty_db.namespace).checks[0]
    assert problem.severity == "problem" and "assetq upgrade" in str(problem.fix)
    assert "upgrade the schema first: `assetq upgrade" in _status_line(empty_db)


def test_a_newer_schema_in_the_window_works_and_outside_it_says_which_package(
    db: TestDatabase,
) -> None:
    head = migrate.head_revision()
    _stamp(db, "9999_future", f"assetq schema 9999_future; works with packages from schema {head}")
    _check(db)  # within the window: no error
    revision = ops.doctor(db.engine, namespace=db.namespace).checks[0]
    assert revision.severity == "ok" and "within the compatibility window" in revision.detail

    _stamp(db, "9999_future", "assetq schema 9999_future; works with packages from schema 9998_x")
    with pytest.raises(assetq.SchemaTooNew, match="pip install -U assetq") as too_new:
        _check(db)
    assert "never `assetq upgrade`" in str(too_new.value)
    problem = ops.doctor(db.engine, namespace=db.namespace).checks[0]
    assert problem.severity == "problem" and "pip install -U assetq" in str(problem.fix)
    shown = _status_line(db)  # the command line gives the same advice, never `assetq upgrade`
    assert "pip install -U assetq" in shown and "never `assetq upgrade`" in shown

    _stamp(db, "9999_future", None)  # a schema without a marker: cannot be known to fit
    with pytest.raises(assetq.SchemaTooNew):
        _check(db)


def test_the_check_runs_once_per_engine_and_namespace(db: TestDatabase) -> None:
    migrate.forget_checks()
    _check(db)
    old = "0007_capped_claim"  # the version table and its marker, as an install leaves them
    table = f"{db.dialect.quote_ns(db.namespace)}.{migrate.VERSION_TABLE}"
    db.execute(f"UPDATE {table} SET version_num = '{old}'")
    db.execute(
        migrate._upgrade_sql(
            db.dialect, "write_compat_marker", db.namespace, migrate.compat_marker(old)
        )
    )
    _check(db)  # found compatible once: not read again
    migrate.forget_checks()
    with pytest.raises(assetq.SchemaTooOld):
        _check(db)


def _old_client(url: str, namespace: str) -> None:
    """What a process of an older package does (run with that package on PYTHONPATH)."""
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        assetq.declare_asset(conn, "orders", namespace=namespace)
        assetq.declare_dag(conn, "orders_report", "orders", namespace=namespace)
        assetq.register_event(conn, "orders", namespace=namespace)
    runs = assetq.schedule(engine, namespace=namespace)
    claims = []
    if hasattr(assetq, "claim_runs"):  # workers came with 0006_work_queue
        claims = assetq.claim_runs(engine, "w1", namespace=namespace)
        with engine.begin() as conn:
            assetq.complete_run(conn, claims[0], "success", namespace=namespace)
    print("ok", assetq.head_revision(), len(runs), len(claims))


if __name__ == "__main__":
    _old_client(sys.argv[1], sys.argv[2])
