"""`assetq` on a namespace that does not exist: the same answer, with its fix, from every
command (exit 1); `uninstall` says there was nothing to remove (exit 0). And the dry runs of
`purge` and `uninstall`: the counts of what they would delete, nothing deleted. On each
engine, in-process (``cli.main``)."""

from __future__ import annotations

import json

import pytest

import assetq
from assetq import cli, migrate
from assetq.ops import expected_objects
from dbs import TestDatabase

MISSING = "aq_nowhere"

#: Every command that works on an installed namespace, with the options it needs.
COMMAND_LINES = {
    "upgrade": ["upgrade"],
    "repair": ["repair"],
    "scheduler": ["scheduler", "--max-passes", "1"],
    "worker": ["worker", "--handlers", "os:environ"],
    "status": ["status"],
    "status --json": ["status", "--json"],
    "doctor": ["doctor"],
    "doctor --json": ["doctor", "--json"],
    "purge": ["purge", "--older-than", "30d"],
    "purge --dry-run": ["purge", "--older-than", "30d", "--dry-run"],
    "grant": ["grant", "--reader", "grafana"],
    "grant --revoke": ["grant", "--revoke", "grafana"],
    "runs": ["runs", "--state", "failed"],
    "run show": ["run", "show", "report", "r1"],
    "run retry": ["run", "retry", "report", "r1"],
    "run cancel": ["run", "cancel", "report", "r1"],
    "dags": ["dags"],
    "dag pause": ["dag", "pause", "report"],
    "events": ["events", "--asset", "orders"],
    "web": ["web"],
}


def test_the_commands_above_are_every_command_that_needs_an_installed_namespace() -> None:
    names = {command.name for command in cli.COMMANDS} - {"install", "demo", "uninstall", "sql"}
    assert {line.split()[0] for line in COMMAND_LINES} == names


def _url(db: TestDatabase) -> str:
    return db.url.render_as_string(hide_password=False)


def _run(db: TestDatabase, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["--url", _url(db), *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("command", sorted(COMMAND_LINES))
def test_every_command_gives_one_answer_for_a_namespace_that_does_not_exist(
    empty_db: TestDatabase, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    code, out, err = _run(empty_db, capsys, "--namespace", MISSING, *COMMAND_LINES[command])
    shown = empty_db.url.render_as_string(hide_password=True)
    assert code == cli.EXIT_ERROR
    assert out == ""
    assert err == (
        f"assetq {command.split()[0]}: error [AQ104]: namespace {MISSING!r} does not exist"
        f" (or holds no assetq schema) on {shown}: run 'assetq install --namespace {MISSING}'"
        " first\n"
    )


def test_uninstall_says_when_there_was_nothing_to_remove(
    empty_db: TestDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(empty_db, capsys, "--namespace", MISSING, "uninstall", "--yes")
    assert code == cli.EXIT_OK
    assert out.startswith(f"assetq: nothing to remove: namespace {MISSING!r} does not exist")


def test_uninstall_still_says_uninstalled_when_it_removed_something(
    db: TestDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(db, capsys, "uninstall", "--yes")
    assert code == cli.EXIT_OK and out.startswith("assetq: uninstalled from namespace 'assetq'")
    with db.engine.connect() as conn:
        assert migrate.current_revision(conn) is None


def _history(db: TestDatabase, *, active_run: bool = False) -> None:
    """A finished run that consumed 3 events, an event nobody consumes, an event still
    queued; with ``active_run``, also a run still queued that consumed 2 more."""
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "report", "orders")
        assetq.declare_asset(conn, "audit")
        for _ in range(3):
            assetq.register_event(conn, "orders")
        assetq.register_event(conn, "audit")
    (finished,) = assetq.schedule(db.engine)
    with db.engine.begin() as conn:
        assetq.set_run_state(conn, "report", finished.run_id, "success")
    if active_run:
        with db.engine.begin() as conn:
            for _ in range(2):
                assetq.register_event(conn, "orders")
        (active,) = assetq.schedule(db.engine)
        assert active.state == "queued"
    with db.engine.begin() as conn:
        assetq.register_event(conn, "orders")


def test_purge_dry_run_counts_what_purge_then_deletes_and_deletes_nothing(
    db: TestDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    _history(db, active_run=True)
    before = db.counts()
    code, out, _ = _run(db, capsys, "purge", "--older-than", "0s", "--dry-run", "--json")
    assert code == cli.EXIT_OK
    preview = json.loads(out)
    assert preview["dry_run"] is True and preview["runs"] >= 1 and preview["events"] >= 4
    assert db.counts() == before
    _, out, _ = _run(db, capsys, "purge", "--older-than", "0s", "--json")
    done = json.loads(out)
    assert (done["runs_deleted"], done["events_deleted"]) == (preview["runs"], preview["events"])


def test_purge_dry_run_says_in_words_that_nothing_was_deleted(
    db: TestDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    _history(db)
    code, out, _ = _run(db, capsys, "purge", "--older-than", "0s", "--dry-run")
    assert code == cli.EXIT_OK
    assert out.startswith("assetq: dry run: purge would delete 1 run and 4 events from before")
    assert out.rstrip().endswith("nothing was deleted")


def test_purge_says_what_it_deleted_in_words(
    db: TestDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    _history(db)
    code, out, _ = _run(db, capsys, "purge", "--older-than", "0s", "--batch-size", "1000")
    assert code == cli.EXIT_OK
    assert out.startswith("assetq: purged 1 run and 4 events from before")
    assert "1 runs" not in out and "1 batches" not in out


def test_purge_dry_run_counts_nothing_newer_than_the_cutoff(
    db: TestDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    _history(db)
    _, out, _ = _run(db, capsys, "purge", "--older-than", "1h", "--dry-run", "--json")
    assert (json.loads(out)["runs"], json.loads(out)["events"]) == (0, 0)


def test_uninstall_dry_run_counts_objects_and_rows_and_removes_nothing(
    db: TestDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    _history(db)
    before = db.counts()
    code, out, _ = _run(db, capsys, "uninstall", "--dry-run")  # no --yes needed
    assert code == cli.EXIT_OK
    kinds = [kind for kind, _ in expected_objects(db.engine_name)]
    tables, views = kinds.count("table") + 1, kinds.count("view")  # + the version table
    routines, triggers = kinds.count("routine"), kinds.count("trigger")
    assert f"would remove schema {assetq.head_revision()} from namespace 'assetq'" in out
    assert f"{tables} tables, {views} view" in out
    assert f"{routines} routines and {triggers} triggers" in out
    assert "(5 events, 1 queue row, 1 run, 1 consumer, 2 assets)" in out
    assert out.rstrip().endswith("nothing was removed")
    assert db.counts() == before
    with db.engine.connect() as conn:
        assert migrate.current_revision(conn) == assetq.head_revision()
