"""assetq.doctor and `assetq doctor`: a healthy install passes; each kind of damage is found,
exits 1 and says how to fix it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import resources

import pytest

import assetq
from assetq import sqlfiles
from assetq.ops import expected_objects
from dbs import TestDatabase

#: How each engine spells the damage done below.
DROP = {
    "postgresql": {
        "trigger": "DROP TRIGGER asset_event_fan_out ON {ns}.asset_event",
        "routine": "DROP FUNCTION {ns}.purge_runs",
    },
    "mysql": {
        "trigger": "DROP TRIGGER {ns}.asset_event_fan_out",
        "routine": "DROP PROCEDURE {ns}.purge_runs",
    },
}


def _doctor(
    db: TestDatabase, *args: str, namespace: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASSETQ_")}
    env["ASSETQ_DATABASE_URL"] = db.url.render_as_string(hide_password=False)
    extra = ["--namespace", namespace] if namespace else []
    return subprocess.run(
        [sys.executable, "-m", "assetq", "doctor", *extra, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def _packaged_file(db: TestDatabase, *parts: str) -> str:
    """Where the installed package keeps ``sql/<engine>/<parts>``: a file that exists."""
    path = resources.files("assetq.sql").joinpath(db.dialect.name)
    for part in parts:
        path = path.joinpath(part)
    assert path.is_file(), path
    return str(path)


def _problems(db: TestDatabase) -> dict[str, assetq.Check]:
    report = assetq.doctor(db.engine)
    return {c.name: c for c in report.checks if c.severity == "problem"}


def test_a_fresh_install_has_no_problems(db: TestDatabase) -> None:
    report = assetq.doctor(db.engine)
    assert report.ok, report.checks
    assert report.revision == report.head == assetq.head_revision()
    names = {c.name for c in report.checks}
    assert {"revision", "objects", "routine security", "isolation"} <= names
    done = _doctor(db)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no problems found" in done.stdout


def test_the_expected_objects_come_from_the_packaged_files(db: TestDatabase) -> None:
    """Every routine, trigger and view has its file (sql/<engine>/routines/, triggers/,
    views/); everything else doctor expects is a table of tables.sql or of a later step."""
    expected = expected_objects(db.dialect.name)
    assert ("trigger", "asset_event_fan_out") in expected
    assert ("view", "dag_queue_status") in expected
    assert {("routine", n) for n in ("register_event", "schedule_pass", "purge_events")} <= expected
    assert {("table", n) for n in ("asset_event", "routine_catalogue")} <= expected
    files = {(f.kind, f.name) for f in sqlfiles.object_files(db.dialect.name)}
    assert files <= expected
    assert {kind for kind, _ in expected - files} == {"table"}
    tables = "\n".join(sqlfiles.schema_texts(db.dialect.name))
    assert all(f"{{{{ns}}}}.{name} (" in tables for kind, name in expected - files)


def test_a_dropped_fan_out_trigger_is_a_problem_with_a_fix_and_exit_code_1(
    db: TestDatabase,
) -> None:
    db.execute(DROP[db.engine_name]["trigger"])
    problems = _problems(db)
    check = problems["trigger asset_event_fan_out"]
    assert "events are not queued" in check.detail
    assert check.fix.startswith("run `assetq repair --namespace assetq` as the owner"), check
    file = _packaged_file(db, "triggers", "asset_event_fan_out.sql")
    assert f"from its file, {file}, data untouched" in check.fix, check
    done = _doctor(db)
    assert done.returncode == 1
    assert "asset_event_fan_out is missing" in done.stdout
    assert "fix:" in done.stdout and "1 problem(s) found" in done.stdout


def test_a_dropped_routine_is_a_problem_repair_re_creates_from_its_file(db: TestDatabase) -> None:
    db.execute(DROP[db.engine_name]["routine"])
    check = _problems(db)["routine purge_runs"]
    assert "routine purge_runs is missing" in check.detail
    file = _packaged_file(db, "routines", "purge_runs.sql")
    assert (
        f"assetq repair --namespace assetq` as the owner: it re-creates it from its file, {file},"
        in check.fix
    )


def test_a_dropped_table_is_a_problem_whose_fix_names_tables_sql(db: TestDatabase) -> None:
    db.execute("DROP TABLE {ns}.process_liveness")
    check = _problems(db)["table process_liveness"]
    assert "table process_liveness is missing" in check.detail
    file = _packaged_file(db, "tables.sql")
    assert check.fix.startswith(f"recreate it with its CREATE statement in {file}, as the owner")


def test_doctor_json_lists_every_check(db: TestDatabase) -> None:
    done = _doctor(db, "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["ok"] is True and data["revision"] == assetq.head_revision()
    assert all(set(c) == {"name", "severity", "detail", "fix"} for c in data["checks"])


def test_a_namespace_without_assetq_is_a_problem(db: TestDatabase) -> None:
    done = _doctor(db, namespace="aq_missing")
    assert done.returncode == 1  # the answer of every command: tests/test_cli_namespaces.py
    assert "does not exist" in done.stderr
    assert "assetq install --namespace aq_missing" in done.stderr


@pytest.mark.engines("postgresql")
def test_a_disabled_trigger_is_a_problem(db: TestDatabase) -> None:
    db.execute("ALTER TABLE {ns}.asset_event DISABLE TRIGGER asset_event_fan_out")
    check = _problems(db)["trigger asset_event_fan_out"]
    assert "disabled" in check.detail and "ENABLE TRIGGER" in check.fix


@pytest.mark.engines("postgresql")
def test_a_disabled_wake_up_trigger_is_a_choice_not_a_problem(db: TestDatabase) -> None:
    db.execute("ALTER TABLE {ns}.asset_dag_run_queue DISABLE TRIGGER asset_dag_run_queue_notify")
    report = assetq.doctor(db.engine)
    assert report.ok
    (check,) = [c for c in report.checks if c.name == "trigger asset_dag_run_queue_notify"]
    assert check.severity == "note" and "poll" in check.detail


@pytest.mark.engines("postgresql")
def test_a_granted_routine_that_lost_security_definer_is_a_problem(db: TestDatabase) -> None:
    db.execute("ALTER FUNCTION {ns}.schedule_pass(integer) SECURITY INVOKER")
    check = _problems(db)["routine security"]
    assert "schedule_pass" in check.detail


@pytest.mark.engines("postgresql")
def test_a_granted_routine_with_an_unpinned_search_path_is_a_problem(db: TestDatabase) -> None:
    db.execute("ALTER FUNCTION {ns}.register_events(jsonb) RESET search_path")
    assert "register_events" in _problems(db)["routine security"].detail


@pytest.mark.engines("mysql")
def test_mysql_isolation_and_time_zone_are_reported_not_fatal(db: TestDatabase) -> None:
    report = assetq.doctor(db.engine)
    checks = {c.name: c for c in report.checks}
    assert report.ok
    assert "isolation" in checks["isolation"].detail
    assert "READ COMMITTED itself" in checks["isolation"].detail  # the server default is RR
    assert "time_zone" in checks["time zone"].detail
    assert checks["routine owner"].severity == "ok"  # the definer exists


@pytest.mark.engines("mysql")
def test_a_definer_that_no_longer_exists_is_a_problem(db: TestDatabase) -> None:
    """MySQL runs each routine as its definer: when that account is dropped, every call
    fails (error 1449). Routines defined by an account that never existed stand in for it."""
    db.execute("CREATE USER 'aqo_gone'@'localhost'")
    try:
        db.execute("GRANT ALL ON {ns}.* TO 'aqo_gone'@'localhost'")
        db.execute("CREATE DEFINER = 'aqo_gone'@'localhost' PROCEDURE {ns}.aqo_probe() SELECT 1")
    finally:
        db.execute("DROP USER 'aqo_gone'@'localhost'")
    problems = _problems(db)
    assert any("aqo_gone@localhost does not exist" in c.detail for c in problems.values())
