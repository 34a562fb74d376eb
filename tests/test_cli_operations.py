"""The operator's commands of `assetq` as a whole: help everywhere, usage errors, upgrade."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import assetq
from assetq import cli
from dbs import TestDatabase

OPERATIONS = ("upgrade", "scheduler", "status", "doctor", "purge", "grant")


def _assetq(*args: str, url: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASSETQ_")}
    if url is not None:
        env["ASSETQ_DATABASE_URL"] = url
    return subprocess.run(
        [sys.executable, "-m", "assetq", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def test_every_command_is_listed_and_has_help() -> None:
    listed = _assetq("--help")
    assert listed.returncode == 0
    for command in OPERATIONS:
        assert command in listed.stdout
    parser = cli.build_parser()
    for command in cli.COMMANDS:  # in-process: one interpreter start for all of them
        with pytest.raises(SystemExit) as exited:
            parser.parse_args([command.name, "--help"])
        assert exited.value.code == 0


@pytest.mark.parametrize("command", OPERATIONS)
def test_every_operation_needs_a_database_url(command: str) -> None:
    args = [command, "--older-than", "1d"] if command == "purge" else [command]
    done = _assetq(*args)
    assert done.returncode == 2
    assert "ASSETQ_DATABASE_URL" in done.stderr


def test_the_exit_codes_are_documented() -> None:
    doc = cli.__doc__ or ""
    for code in ("- 0:", "- 1:", "- 2:", "- 130:"):
        assert code in doc


def test_upgrade_refuses_a_namespace_without_assetq_and_upgrades_an_installed_one(
    db: TestDatabase,
) -> None:
    url = db.url.render_as_string(hide_password=False)
    missing = _assetq("upgrade", "--namespace", "aq_missing", url=url)
    assert missing.returncode == 1 and "assetq install" in missing.stderr
    done = _assetq("upgrade", url=url)
    assert done.returncode == 0, done.stderr
    assert f"schema {assetq.head_revision()} already installed" in done.stdout


def test_upgrading_an_install_of_an_older_package_keeps_its_data_and_prints_from_and_to(
    empty_db: TestDatabase, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    """Installed and used by this package (head 0001_baseline), then upgraded by a newer one:
    the test-only revisions added stand for it (head t0003_event_note_index, a column and an
    index on asset_event). The event queued before the upgrade is still queued, then
    consumed, and the command says from which revision to which. In-process: the revisions
    are added to this interpreter's package."""
    assetq.install(empty_db.engine)
    with empty_db.engine.begin() as conn:
        assetq.declare_dag(conn, "report", "orders")
        first = assetq.register_event(conn, "orders")
    before = assetq.head_revision()
    newer: tuple[str, ...] = request.getfixturevalue("test_revisions")
    url = empty_db.url.render_as_string(hide_password=False)
    assert cli.main(["--url", url, "upgrade"]) == cli.EXIT_OK, capsys.readouterr().err
    assert f"{before} -> {newer[-1]}" in capsys.readouterr().out
    with empty_db.engine.connect() as conn:
        assert assetq.current_revision(conn) == newer[-1]
        (report,) = assetq.status(conn)
    assert (report.queued_events, report.oldest_queued_at) == (1, first.timestamp)
    assert empty_db.scalar("SELECT count(*) FROM {ns}.asset_event WHERE note IS NULL") == 1
    (run,) = assetq.schedule(empty_db.engine)
    assert run.event_ids == (first.id,)
    assert assetq.doctor(empty_db.engine).ok
