"""`assetq scheduler` and `assetq worker` against a schema that is not this package's head give
the advice status, doctor and the API give (migrate.schema_advice): a newer schema inside the
compatibility window is fine (a rolling deploy upgrades the schema first, then restarts the
processes), an older one is to be upgraded, and a package older than the schema is never told
to run `assetq upgrade`. A schema at a development revision from before 0.1.0's baseline is to
be re-installed: install, upgrade and status say so in one line. On each engine, in-process
(``cli.main``)."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
import sqlalchemy as sa

import assetq
from assetq import cli, migrate
from dbs import TestDatabase

HANDLERS_MODULE = """
def report(claim, conn):
    return None

HANDLERS = {"report": report}
"""


def _stamp(db: TestDatabase, revision: str, marker: str | None) -> None:
    """Pretend a newer package upgraded the namespace to ``revision``, leaving ``marker``."""
    table = f"{db.dialect.quote_ns(db.namespace)}.{migrate.VERSION_TABLE}"
    with db.engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {table} SET version_num = :v"), {"v": revision})
        sql = migrate._upgrade_sql(db.dialect, "write_compat_marker", db.namespace, marker or "")
        conn.execute(sa.text(sql))
    migrate.forget_checks()


def _within_window(db: TestDatabase) -> None:
    head = migrate.head_revision()
    _stamp(db, "9999_future", f"assetq schema 9999_future; works with packages from schema {head}")


def _outside_window(db: TestDatabase) -> None:
    _stamp(db, "9999_future", "assetq schema 9999_future; works with packages from schema 9998_x")


def _one_run(db: TestDatabase) -> None:
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "report", "orders")
        assetq.register_event(conn, "orders")
    assert len(assetq.schedule(db.engine)) == 1


def _worker(db: TestDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """`assetq worker --max-runs 1` with a handler for "report"; its exit code."""
    (tmp_path / "aq_advice_jobs.py").write_text(HANDLERS_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    url = db.url.render_as_string(hide_password=False)
    argv = ["--url", url, "worker", "--handlers", "aq_advice_jobs:HANDLERS", "--max-runs", "1"]
    return cli.main([*argv, "--no-listen", "--poll-interval", "0.1"])


def test_the_worker_runs_against_a_newer_schema_inside_the_window(
    db: TestDatabase,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _one_run(db)
    _within_window(db)
    code = _worker(db, tmp_path, monkeypatch)
    assert code == cli.EXIT_OK, capsys.readouterr().err
    with db.engine.connect() as conn:
        (run,) = assetq.runs(conn, dag_id="report")
    assert run.state == "success"


def test_the_worker_against_an_older_schema_says_upgrade_it_first(
    empty_db: TestDatabase,
    test_revisions: tuple[str, ...],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Older than head: the baseline, head being the last test-only revision."""
    assetq.install(empty_db.engine, revision="0001_baseline")
    code = _worker(empty_db, tmp_path, monkeypatch)
    err = capsys.readouterr().err
    assert code == cli.EXIT_ERROR
    assert "older than this package's" in err and "upgrade the schema first" in err


def test_the_worker_of_an_older_package_is_told_to_run_the_newer_one(
    db: TestDatabase,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _outside_window(db)
    code = _worker(db, tmp_path, monkeypatch)
    err = capsys.readouterr().err
    assert code == cli.EXIT_ERROR
    assert "pip install -U assetq" in err and "never `assetq upgrade`" in err


def _scheduler_warnings(db: TestDatabase, caplog: pytest.LogCaptureFixture) -> str:
    """One pass of `assetq scheduler`; what it logged at WARNING and above."""
    url = db.url.render_as_string(hide_password=False)
    with caplog.at_level(logging.WARNING, logger="assetq"):
        code = cli.main(["--url", url, "scheduler", "--max-passes", "1", "--no-listen"])
    assert code == cli.EXIT_OK
    return "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)


def test_the_scheduler_of_an_older_package_is_told_to_run_the_newer_one(
    db: TestDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    _outside_window(db)
    logged = _scheduler_warnings(db, caplog)
    assert "pip install -U assetq" in logged and "never `assetq upgrade`" in logged
    assert "run `assetq upgrade`" not in logged


def test_the_scheduler_says_nothing_of_a_newer_schema_inside_the_window(
    db: TestDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    _within_window(db)
    assert _scheduler_warnings(db, caplog) == ""


def _development(db: TestDatabase) -> None:
    """The namespace as a package of assetq's development (before 0.1.0) left it."""
    assert "0015_batch_lookups" in migrate.DEVELOPMENT_REVISIONS
    marker = "assetq schema 0015_batch_lookups; works with packages from schema 0001_initial"
    _stamp(db, "0015_batch_lookups", marker)


def _cli(db: TestDatabase, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    url = db.url.render_as_string(hide_password=False)
    code = cli.main(["--url", url, *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def _says_reinstall(text: str) -> None:
    assert "development schema 0015_batch_lookups" in text, text
    assert "`assetq uninstall --yes`" in text and "`assetq install`" in text, text
    # Never a plain upgrade, which no package can do: at 0015 the adoption, which keeps the
    # data (tests/test_migrations.py), or the re-install.
    assert re.search(r"`assetq upgrade(?! --adopt-development)", text) is None, text
    assert "`assetq upgrade --adopt-development --namespace assetq`" in text, text
    assert "Traceback" not in text, text


def test_install_on_a_development_schema_says_reinstall_it_and_changes_nothing(
    db: TestDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    _development(db)
    for command in ("install", "upgrade"):
        code, out, err = _cli(db, capsys, command)
        assert code == cli.EXIT_ERROR, out
        assert err.count("\n") == 1 and err.startswith(f"assetq {command}: error"), err
        _says_reinstall(err)
    with db.engine.connect() as conn:
        assert assetq.current_revision(conn) == "0015_batch_lookups"


def test_status_of_a_development_schema_says_reinstall_it(
    db: TestDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    _development(db)
    """As for any schema older than this package's: the advice, in one line, and exit 1."""
    code, out, err = _cli(db, capsys, "status")
    assert code == cli.EXIT_ERROR and err == "", err
    assert out.count("\n") == 1 and "schema 0015_batch_lookups (" in out, out
    _says_reinstall(out)


def test_status_json_of_a_development_schema_is_json_with_the_advice(
    db: TestDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    """A script reading ``status --json`` gets JSON whatever the schema: below this package's
    head, the revision, the head and the advice (and exit 1), nothing else."""
    _development(db)
    code, out, err = _cli(db, capsys, "status", "--json")
    assert code == cli.EXIT_ERROR and err == "", err
    data = json.loads(out)
    assert data["revision"] == "0015_batch_lookups" and data["head"] == assetq.head_revision()
    assert "development schema 0015_batch_lookups" in data["problem"]
    _says_reinstall(f"development schema 0015_batch_lookups {data['fix']}")
