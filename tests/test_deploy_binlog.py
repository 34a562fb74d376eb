"""MySQL/MariaDB with binary logging (a private mariadbd started with --log-bin, by
tests/servers.py through pytest-mysql's executor).

With binlog_format=STATEMENT InnoDB refuses writes at READ COMMITTED (error 1665), the level
every scheduler pass runs at: every pass fails. assetq says so with what to set (the pass's
error, the scheduler's one log line, doctor); with ROW (what the message says to set) the same
server schedules normally. Creating routines with binary logging needs SUPER or
log_bin_trust_function_creators (1419): the root account here has SUPER.

An install checks both before it creates anything (issue 13, item 6) and refuses with
InstallRefused, saying what to set: AQ121 for STATEMENT (so the module's schema is installed
while the server is at ROW, then the server is switched to STATEMENT, as an operator might),
AQ120 for an account without SUPER while log_bin_trust_function_creators is OFF (it used to
fail half-way with 1419, after creating the tables). The binary log's position proves that
a refused install wrote nothing.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy import Engine

import assetq
from assetq import cli
from servers import BinlogMariaDB, start_binlog_mariadb


@pytest.fixture(scope="module")
def statement_binlog(pytestconfig: pytest.Config) -> Iterator[BinlogMariaDB]:
    if "mysql" not in str(pytestconfig.getoption("--engines")):
        pytest.skip("MySQL is not among the engines of this run (--engines)")
    server = start_binlog_mariadb("STATEMENT")
    try:
        with _global(server, binlog_format="ROW"):  # install refuses STATEMENT (AQ121)
            engine = sa.create_engine(server.url(), poolclass=sa.NullPool)
            assetq.install(engine)
            with engine.begin() as conn:
                assetq.declare_dag(conn, "report", "orders")
            engine.dispose()
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def _global(server: BinlogMariaDB, **settings: object) -> Iterator[None]:
    """SET GLOBAL each setting (sessions opened meanwhile take it), put back afterwards."""
    admin = sa.create_engine(server.url(), poolclass=sa.NullPool)
    saved: dict[str, object] = {}
    try:
        with admin.connect() as conn:
            for name, value in settings.items():
                saved[name] = conn.execute(sa.text(f"SELECT @@GLOBAL.{name}")).scalar_one()
                conn.execute(sa.text(f"SET GLOBAL {name} = :value"), {"value": value})
        yield
    finally:
        with admin.connect() as conn:
            for name, value in saved.items():
                conn.execute(sa.text(f"SET GLOBAL {name} = :value"), {"value": value})
        admin.dispose()


def _read(server: BinlogMariaDB, statement: str, **params: object) -> sa.Row[object]:
    admin = sa.create_engine(server.url(), poolclass=sa.NullPool)
    try:
        with admin.connect() as conn:
            return conn.execute(sa.text(statement), params).one()
    finally:
        admin.dispose()


def _binlog_position(server: BinlogMariaDB) -> tuple[str, int]:
    row = _read(server, "SHOW MASTER STATUS")
    return str(row[0]), int(row[1])


def _namespace_exists(server: BinlogMariaDB, namespace: str) -> bool:
    sql = "SELECT count(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = :ns"
    return bool(_read(server, sql, ns=namespace)[0])


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


def test_install_with_statement_binlog_is_refused_before_anything_is_written(
    statement_binlog: BinlogMariaDB, capsys: pytest.CaptureFixture[str]
) -> None:
    server = statement_binlog
    position = _binlog_position(server)
    engine = sa.create_engine(server.url(), poolclass=sa.NullPool)
    try:
        with pytest.raises(assetq.InstallRefused) as refused:
            assetq.install(engine, namespace="fresh")
    finally:
        engine.dispose()
    assert refused.value.code == "AQ121"
    assert "SET GLOBAL binlog_format = 'ROW'" in str(refused.value)
    url = server.url().render_as_string(hide_password=False)
    assert cli.main(["--url", url, "install", "--namespace", "fresh"]) == cli.EXIT_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("assetq install: error [AQ121]: "), err
    assert _binlog_position(server) == position  # not even CREATE DATABASE
    assert not _namespace_exists(server, "fresh")


def test_an_account_without_super_is_refused_until_function_creators_are_trusted(
    statement_binlog: BinlogMariaDB, capsys: pytest.CaptureFixture[str]
) -> None:
    server = statement_binlog
    admin = sa.create_engine(server.url(), poolclass=sa.NullPool)
    with admin.connect() as conn:
        conn.execute(sa.text("CREATE USER 'installer'@'%'"))
        conn.execute(sa.text("GRANT ALL PRIVILEGES ON `trusted`.* TO 'installer'@'%'"))
    url = server.url().set(username="installer")
    installer = sa.create_engine(url, poolclass=sa.NullPool)
    cli_args = ["--url", url.render_as_string(hide_password=False), "install", "--namespace"]
    try:
        with _global(server, binlog_format="ROW"):
            position = _binlog_position(server)
            with pytest.raises(assetq.InstallRefused) as refused:
                assetq.install(installer, namespace="trusted")
            assert refused.value.code == "AQ120"
            assert "installer@%" in str(refused.value)
            assert "SET GLOBAL log_bin_trust_function_creators = 1" in str(refused.value)
            assert cli.main([*cli_args, "trusted"]) == cli.EXIT_ERROR
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and err.startswith("assetq install: error [AQ120]: ")
            assert _binlog_position(server) == position
            assert not _namespace_exists(server, "trusted")
            with _global(server, log_bin_trust_function_creators=1):
                assert cli.main([*cli_args, "trusted"]) == cli.EXIT_OK
                assert assetq.install(installer, namespace="trusted") == assetq.head_revision()
    finally:
        installer.dispose()
        with admin.connect() as conn:
            conn.execute(sa.text("DROP USER IF EXISTS 'installer'@'%'"))
            conn.execute(sa.text("DROP DATABASE IF EXISTS `trusted`"))
        admin.dispose()


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
