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


def test_upgrading_a_0002_install_keeps_its_data_and_adds_the_operations(
    empty_db: TestDatabase,
) -> None:
    from alembic import command

    from assetq import migrate
    from assetq.api import _utc
    from assetq.dialects import dialect_for

    with empty_db.engine.begin() as conn:
        dialect_for(conn).execute(conn, "create_namespace", "assetq")
        command.upgrade(migrate._config(conn, "assetq"), "0002_batch_registration")
    with empty_db.engine.begin() as conn:
        # The routine as 0002 had it: today's declare_dag sends the options 0004 added.
        conn.execute(
            empty_db.engine_sql("declare_dag_before_0004"),
            {"dag_id": "report", "condition": '{"asset":"orders"}', "clauses": '[["orders"]]'},
        )
        # The call as 0002 had it (today's package refuses a 0002 schema: SchemaTooOld).
        first = dialect_for(conn).execute(
            conn,
            "register_event",
            "assetq",
            {
                "asset": "orders",
                "extra": "{}",
                "source_dag_id": None,
                "source_task_id": None,
                "source_run_id": None,
                "source_map_index": -1,
                "idempotency_key": None,
            },
        )[0]
    url = empty_db.url.render_as_string(hide_password=False)
    done = _assetq("upgrade", url=url)
    assert done.returncode == 0, done.stderr
    assert f"0002_batch_registration -> {assetq.head_revision()}" in done.stdout
    with empty_db.engine.connect() as conn:
        (report,) = assetq.status(conn)
    assert (report.queued_events, report.oldest_queued_at) == (1, _utc(first.event_timestamp))
    (run,) = assetq.schedule(empty_db.engine)
    assert run.event_ids == (first.event_id,)
    assert assetq.doctor(empty_db.engine).ok
