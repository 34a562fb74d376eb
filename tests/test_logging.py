"""Logging: one child logger of ``assetq`` per module, and the CLI's ``--log-format``."""

from __future__ import annotations

import json
import logging
import re
import sys

import pytest

import assetq
from assetq import api, cli, embedded, logs, migrate, ops, scheduler, worker
from dbs import TestDatabase


def test_every_module_logs_through_a_child_of_assetq() -> None:
    names = {m.log.name for m in (api, embedded, migrate, ops, scheduler, worker)}
    assert names == {
        "assetq.api",
        "assetq.embedded",
        "assetq.migrate",
        "assetq.ops",
        "assetq.scheduler",
        "assetq.worker",
    }
    parent = logging.getLogger("assetq")
    for name in names:
        assert logging.getLogger(name).parent is parent


def test_a_handler_on_assetq_sees_the_scheduler_loop(
    db: TestDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="assetq"):
        assetq.run_scheduler(db.engine, namespace=db.namespace, max_passes=1, listen=False)
    started = [r for r in caplog.records if "started on namespace" in r.getMessage()]
    assert [r.name for r in started] == ["assetq.scheduler"]


def _scheduler_once(db: TestDatabase, log_format: str) -> None:
    url = db.url.render_as_string(hide_password=False)
    argv = ["--url", url, "--namespace", db.namespace, "scheduler", "--max-passes", "1"]
    assert cli.main([*argv, "--no-listen", "--log-format", log_format]) == cli.EXIT_OK


def test_cli_json_logs_one_object_per_line(
    db: TestDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    _scheduler_once(db, "json")
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    entries = [json.loads(line) for line in lines]  # every line is one JSON object
    (started,) = [e for e in entries if "started on namespace" in e["message"]]
    assert started["level"] == "INFO"
    assert started["logger"] == "assetq.scheduler"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}\+00:00", started["time"])
    (stopped,) = [e for e in entries if "stopped after 1 passes" in e["message"]]
    assert stopped["logger"] == "assetq.scheduler"


def test_cli_text_logs_name_the_logger(
    db: TestDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    _scheduler_once(db, "text")
    err = capsys.readouterr().err
    assert re.search(
        r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO assetq\.scheduler assetq scheduler:"
        r" started on namespace ",
        err,
        re.MULTILINE,
    ), err


def test_cli_takes_its_log_handler_away_when_it_returns(db: TestDatabase) -> None:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    _scheduler_once(db, "json")
    assert root.handlers == handlers
    assert root.level == level


def test_json_lines_carry_extra_fields_and_exceptions() -> None:
    record = logging.LogRecord(
        "assetq.worker", logging.WARNING, __file__, 1, "run %s failed", ("r1",), None
    )
    record.dag_id = "orders_report"
    record.attempt = 2
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        record.exc_info = sys.exc_info()
    entry = json.loads(logs.JsonFormatter().format(record))
    assert entry["message"] == "run r1 failed"
    assert entry["logger"] == "assetq.worker"
    assert entry["level"] == "WARNING"
    assert entry["dag_id"] == "orders_report"
    assert entry["attempt"] == 2
    assert "RuntimeError: boom" in entry["exception"]
    assert "\n" not in logs.JsonFormatter().format(record)


def test_an_unknown_log_format_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["status", "--log-format", "xml"])
    assert exit_.value.code == cli.EXIT_USAGE
    assert "--log-format" in capsys.readouterr().err


def test_the_cli_schedulers_created_run_line_carries_the_runs_fields(
    db: TestDatabase, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 26: the line came from assetq.api, with the run only in its message."""
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "report", "orders", namespace=db.namespace)
        assetq.register_event(conn, "orders", namespace=db.namespace)
    _scheduler_once(db, "json")
    entries = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.strip()]
    (created,) = [e for e in entries if "created run" in e["message"]]
    assert created["logger"] == "assetq.scheduler"
    assert created["dag_id"] == "report"
    assert created["run_id"] in created["message"]
    with db.engine.connect() as conn:
        (run,) = assetq.runs(conn, "report", namespace=db.namespace)
    assert created["run_id"] == run.run_id


def test_per_run_lines_come_from_the_loops_with_the_runs_fields(
    db: TestDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    """Every line about one run (created, claimed, completed, failed) comes from the loop
    that acted on it (assetq.scheduler, assetq.worker), with dag_id and run_id as fields
    (and an attempt's attempt and worker), which JSON logs write as fields of their own."""
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "good", "orders", namespace=db.namespace)
        assetq.declare_dag(conn, "bad", "orders", namespace=db.namespace)
        assetq.register_event(conn, "orders", namespace=db.namespace)

    def fail(claim: assetq.Claim, conn: object) -> None:
        raise RuntimeError("the handler failed")

    with caplog.at_level(logging.INFO, logger="assetq"):
        assetq.run_scheduler(db.engine, namespace=db.namespace, max_passes=1, listen=False)
        assetq.run_worker(
            db.engine,
            {"good": lambda claim, conn: None, "bad": fail},
            namespace=db.namespace,
            max_runs=2,
            poll_interval=0.05,
            listen=False,
            liveness_interval=None,
        )
    with db.engine.connect() as conn:
        keys = {(r.dag_id, r.run_id) for r in assetq.runs(conn, namespace=db.namespace)}
    assert len(keys) == 2
    about_runs = [r for r in caplog.records if any(run_id in r.getMessage() for _, run_id in keys)]
    by_logger: dict[str, list[str]] = {}
    for record in about_runs:
        by_logger.setdefault(record.name, []).append(record.getMessage())
        fields = json.loads(logs.JsonFormatter().format(record))
        assert (fields["dag_id"], fields["run_id"]) in keys, record.getMessage()
        assert f"{fields['run_id']} of {fields['dag_id']}" in record.getMessage()
        if record.name == "assetq.worker":
            assert fields["attempt"] == 1
            assert fields["worker"]
    assert set(by_logger) == {"assetq.scheduler", "assetq.worker"}, by_logger
    assert len([m for m in by_logger["assetq.scheduler"] if "created run" in m]) == 2
    worker_lines = by_logger["assetq.worker"]
    assert len([m for m in worker_lines if "claimed run" in m]) == 2
    assert len([m for m in worker_lines if "completed: now success" in m]) == 1
    assert len([m for m in worker_lines if "completed: now failed" in m]) == 1
    assert len([m for m in worker_lines if "the handler failed" in m]) == 1


def test_the_asyncio_loops_per_run_lines_carry_the_runs_fields(
    db: TestDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    """The same for assetq.aio's loops, from their module's logger (assetq.aio)."""
    pytest.importorskip("greenlet")
    import asyncio

    from sqlalchemy.ext.asyncio import create_async_engine
    from sqlalchemy.pool import NullPool

    from assetq import aio

    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "report", "orders", namespace=db.namespace)
        assetq.register_event(conn, "orders", namespace=db.namespace)

    async def handler(claim: assetq.Claim, conn: object) -> None:
        return None

    async def main() -> None:
        engine = create_async_engine(aio.async_url(db.url), poolclass=NullPool)
        await aio.run_scheduler(engine, namespace=db.namespace, max_passes=1, listen=False)
        await aio.run_worker(
            engine,
            {"report": handler},
            namespace=db.namespace,
            max_runs=1,
            poll_interval=0.05,
            listen=False,
            liveness_interval=None,
        )
        await engine.dispose()

    with caplog.at_level(logging.INFO, logger="assetq"):
        asyncio.run(main())
    with db.engine.connect() as conn:
        (run,) = assetq.runs(conn, "report", namespace=db.namespace)
    about = [r for r in caplog.records if run.run_id in r.getMessage()]
    assert {r.name for r in about} == {"assetq.aio"}
    messages = [r.getMessage() for r in about]
    assert len(about) == 3, messages
    for said in ("created run", "claimed run", "completed: now success"):
        assert len([m for m in messages if said in m]) == 1, (said, messages)
    for record in about:
        fields = json.loads(logs.JsonFormatter().format(record))
        assert (fields["dag_id"], fields["run_id"]) == ("report", run.run_id)
