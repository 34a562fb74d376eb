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
