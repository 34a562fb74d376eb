"""MySQL/MariaDB with binary logging (a private mariadbd started with --log-bin, by
tests/servers.py through pytest-mysql's executor).

With binlog_format=STATEMENT InnoDB refuses writes at READ COMMITTED (error 1665), the level
every scheduler pass runs at: every pass fails. assetq says so with what to set (the pass's
error, the scheduler's one log line, doctor); with ROW (what the message says to set) the same
server schedules normally. Creating routines with binary logging needs SUPER or
log_bin_trust_function_creators (1419): the root account here has SUPER.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy import Engine

import assetq
from servers import BinlogMariaDB, start_binlog_mariadb


@pytest.fixture(scope="module")
def statement_binlog(pytestconfig: pytest.Config) -> Iterator[BinlogMariaDB]:
    if "mysql" not in str(pytestconfig.getoption("--engines")):
        pytest.skip("MySQL is not among the engines of this run (--engines)")
    server = start_binlog_mariadb("STATEMENT")
    try:
        engine = sa.create_engine(server.url())
        assetq.install(engine)
        with engine.begin() as conn:
            assetq.declare_dag(conn, "report", "orders")
        engine.dispose()
        yield server
    finally:
        server.stop()


@pytest.fixture
def engine(statement_binlog: BinlogMariaDB) -> Iterator[Engine]:
    engine = sa.create_engine(statement_binlog.url())
    try:
        with engine.begin() as conn:  # producers still work: they run at REPEATABLE READ
            assetq.register_event(conn, "orders")
        yield engine
    finally:
        engine.dispose()


def test_a_pass_with_statement_binlog_says_what_to_set(engine: Engine) -> None:
    with pytest.raises(assetq.UnsupportedServerSetting) as caught:
        assetq.schedule(engine)
    assert caught.value.code == "1665"
    assert "binlog_format=ROW" in str(caught.value)


def test_the_scheduler_logs_the_binlog_problem_once(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="assetq"):
        stats = assetq.run_scheduler(engine, max_passes=3, backoff_initial=0.01, backoff_max=0.02)
    assert stats.errors == 3
    (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "UnsupportedServerSetting" in record.getMessage() and "1665" in record.getMessage()
    assert "binlog_format=ROW" in record.getMessage()


def test_doctor_finds_statement_binlog(engine: Engine) -> None:
    report = assetq.doctor(engine)
    assert not report.ok
    (check,) = [c for c in report.checks if c.name == "binary log"]
    assert check.severity == "problem" and "1665" in check.detail
    assert "binlog_format = 'ROW'" in check.fix


def test_with_row_binlog_the_same_server_schedules(
    statement_binlog: BinlogMariaDB, engine: Engine
) -> None:
    """Last in this module: it switches the server to ROW, as doctor's fix says."""
    with engine.connect() as conn:
        conn.execute(sa.text("SET GLOBAL binlog_format = 'ROW'"))
    engine.dispose()  # sessions opened from now on take it
    row = sa.create_engine(statement_binlog.url())
    try:
        runs = assetq.schedule(row)
        report = assetq.doctor(row)
    finally:
        row.dispose()
    assert len(runs) == 1
    (check,) = [c for c in report.checks if c.name == "binary log"]
    assert check.severity == "ok" and "ROW" in check.detail
