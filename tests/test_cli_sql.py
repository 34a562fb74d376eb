"""`assetq sql` (issue 13, item 2): the SQL of an install or an upgrade for review, rendered
and runnable as printed: piped into psql / the mysql client, it builds the schema that
`assetq install` builds. Upgrades run against the test-only revisions after the baseline
(tests/revisions, the ``test_revisions`` fixture), which stand for a newer package's table
steps: an upgrade that ends at the head prints every routine, trigger and view as well."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_host_alembic import NEWER_REVISIONS, assert_same_schema, assetq_revision, run_with_client

import assetq
from assetq import cli, migrate
from dbs import Backend, TestDatabase
from schema_snapshot import snapshot

PINNED = "0003_run_attempts"
LATER = "t0003_event_note_index"


@pytest.fixture
def second_empty_db(backend: Backend) -> Iterator[TestDatabase]:
    database = backend.database(installed=False)
    yield database
    backend.drop(database)


def printed_sql(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    capsys.readouterr()
    assert cli.main(["sql", *args]) == cli.EXIT_OK, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "{{ns}}" not in out
    return out


def test_the_printed_fresh_install_builds_what_install_builds(
    empty_db: TestDatabase, second_empty_db: TestDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    run_with_client(empty_db, printed_sql(capsys, "--engine", empty_db.dialect.name))
    assetq.install(second_empty_db.engine)
    assert assetq_revision(empty_db) == assetq.head_revision()
    assert_same_schema(empty_db, second_empty_db)


def test_the_printed_fresh_install_of_a_newer_package_builds_what_install_builds(
    empty_db: TestDatabase,
    second_empty_db: TestDatabase,
    capsys: pytest.CaptureFixture[str],
    test_revisions: tuple[str, ...],
) -> None:
    run_with_client(empty_db, printed_sql(capsys, "--engine", empty_db.dialect.name))
    assetq.install(second_empty_db.engine)
    assert assetq_revision(empty_db) == LATER == assetq.head_revision()
    assert_same_schema(empty_db, second_empty_db)


@pytest.mark.parametrize(
    "installed_by", ["older_package", "pinned_step"], ids=["with_routines", "tables_only"]
)
def test_the_printed_upgrade_moves_an_older_install_to_the_target(
    empty_db: TestDatabase,
    second_empty_db: TestDatabase,
    capsys: pytest.CaptureFixture[str],
    test_revisions: tuple[str, ...],
    installed_by: str,
) -> None:
    """The baseline as the package whose head it was installed it (its routines, triggers
    and views there: the printed SQL re-creates each), or as a pinned step of the newer
    package installs it (tables only: the printed SQL creates them)."""
    if installed_by == "older_package":
        migrate.use_revisions(None)
        try:
            assetq.install(empty_db.engine)
        finally:
            migrate.use_revisions(str(NEWER_REVISIONS))
    else:
        assetq.install(empty_db.engine, revision=PINNED)
    assert assetq_revision(empty_db) == PINNED
    url = empty_db.url.render_as_string(hide_password=False)  # the engine comes from the URL
    run_with_client(empty_db, printed_sql(capsys, "--url", url, "--from", PINNED, "--to", LATER))
    assetq.install(second_empty_db.engine, revision=LATER)
    assert assetq_revision(empty_db) == LATER
    assert_same_schema(empty_db, second_empty_db)


def test_the_printed_downgrade_to_base_removes_every_object(
    empty_db: TestDatabase, capsys: pytest.CaptureFixture[str], test_revisions: tuple[str, ...]
) -> None:
    assetq.install(empty_db.engine, revision=LATER)
    args = ("--engine", empty_db.dialect.name, "--from", LATER, "--to", "base")
    run_with_client(empty_db, printed_sql(capsys, *args))
    assert assetq_revision(empty_db) is None
    assert not any(snapshot(empty_db).values())


def test_the_printed_sql_is_rendered_for_the_namespace_given(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = printed_sql(capsys, "--engine", "postgresql", "--namespace", "team_a")
    assert 'CREATE SCHEMA IF NOT EXISTS "team_a"' in out
    assert '"assetq".' not in out


def test_an_unknown_revision_is_a_usage_error_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["sql", "--engine", "mysql", "--from", "0099"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown assetq schema revision '0099'" in err


def test_without_engine_or_url_it_says_which_to_give(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(cli.URL_ENV, raising=False)
    assert cli.main(["sql"]) == cli.EXIT_USAGE
    assert "--engine postgresql|mysql" in capsys.readouterr().err
