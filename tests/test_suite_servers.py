"""The suite's own servers (tests/dbs.py, tests/conftest.py): which PostgreSQL ``auto``
chooses, what a machine without MySQL is told, and the cleanup of databases that interrupted
runs left on a shared PostgreSQL server, which must never touch a run still going."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import conftest
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL

import dbs
from dbs import (
    PostgresAddress,
    PostgresBackend,
    RunToken,
    database_name,
    drop_leftover_databases,
    host_tag,
)

TESTS = Path(__file__).resolve().parent


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A TCP port on 127.0.0.1 where nothing answers: bound by us, never listening."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


def test_auto_chooses_embedded_when_the_local_server_does_not_answer(closed_port: int) -> None:
    nobody = PostgresAddress("127.0.0.1", closed_port, "postgres")
    choice, why = dbs.resolve_postgres("auto", nobody)
    assert choice == "embedded"
    assert f"nothing answers at 127.0.0.1:{closed_port}" in why


@pytest.mark.engines("postgresql")
def test_auto_chooses_the_local_server_when_it_answers(backend: PostgresBackend) -> None:
    if backend.password:
        pytest.skip("the probe logs in without a password")
    here = PostgresAddress(backend.host, backend.port, backend.user)
    assert dbs.resolve_postgres("auto", here) == ("local", f"a server answers at {here}")


def test_the_report_header_says_that_auto_chose_embedded(
    pytestconfig: pytest.Config, monkeypatch: pytest.MonkeyPatch, closed_port: int
) -> None:
    monkeypatch.setattr(dbs, "LOCAL_POSTGRES", PostgresAddress("127.0.0.1", closed_port, "x"))
    monkeypatch.setattr(conftest, "_choices", {})  # probe again, as a fresh run would
    monkeypatch.setattr(pytestconfig.option, "postgres", "auto")
    monkeypatch.setattr(pytestconfig.option, "engines", "postgresql")
    (header,) = conftest.pytest_report_header(pytestconfig)
    assert f"postgres: auto -> embedded (nothing answers at 127.0.0.1:{closed_port}" in header


def test_without_a_mysql_server_binary_the_one_line_names_the_package(tmp_path: Path) -> None:
    with pytest.raises(dbs.BackendUnavailable) as refused:
        dbs._mysql_binaries(search=str(tmp_path))
    assert "apt-get install mariadb-server" in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_database_prefix_must_start_a_plain_identifier() -> None:
    assert dbs.check_db_prefix("ci_7_") == "ci_7_"
    for bad in ("", "Aq_", "aq-", "1aq_", "aq_" * 7):
        with pytest.raises(ValueError):
            dbs.check_db_prefix(bad)


# -- cleanup of leftovers -------------------------------------------------------------------


def _dead_pid() -> int:
    """A pid no process can have: above the kernel's largest."""
    pid_max = Path("/proc/sys/kernel/pid_max")
    return (int(pid_max.read_text()) if pid_max.exists() else 99_999) + 1


@pytest.fixture
def server(backend: PostgresBackend) -> Iterator[tuple[URL, str]]:
    """(admin URL, a prefix of this test alone), so the cleanup under test never sees the
    databases of the run itself or of other runs; whatever is left with it is dropped."""
    prefix = f"aq{os.getpid()}c_"
    admin = backend.admin_url()
    yield admin, prefix
    engine = sa.create_engine(admin, poolclass=sa.NullPool, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        for name in _databases(conn, prefix):
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    engine.dispose()


def _databases(conn: sa.Connection, prefix: str) -> list[str]:
    return list(
        conn.execute(
            sa.text("SELECT datname FROM pg_database WHERE starts_with(datname, :p) ORDER BY 1"),
            {"p": prefix},
        ).scalars()
    )


def _admin(url: URL) -> sa.Engine:
    return sa.create_engine(url, poolclass=sa.NullPool, isolation_level="AUTOCOMMIT")


def _create(url: URL, *names: str) -> None:
    engine = _admin(url)
    with engine.connect() as conn:
        for name in names:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    engine.dispose()


def _left(url: URL, prefix: str) -> list[str]:
    engine = _admin(url)
    with engine.connect() as conn:
        names = _databases(conn, prefix)
    engine.dispose()
    return names


@pytest.mark.engines("postgresql")
def test_the_leftovers_of_a_process_that_is_gone_are_dropped(server: tuple[URL, str]) -> None:
    url, prefix = server
    gone = RunToken(_dead_pid(), host_tag())
    leftovers = [database_name(prefix, "template", gone, 1), database_name(prefix, "test", gone, 2)]
    _create(url, *leftovers)
    assert drop_leftover_databases(url, prefix) == sorted(leftovers)
    assert _left(url, prefix) == []


@pytest.mark.engines("postgresql")
def test_a_database_whose_run_still_holds_its_lock_is_kept(server: tuple[URL, str]) -> None:
    url, prefix = server
    elsewhere = RunToken(_dead_pid(), "abcdef")  # another host: only the lock can tell
    name = database_name(prefix, "test", elsewhere, 1)
    _create(url, name)
    mark = dbs.RunMark(url, elsewhere)  # what that run holds while it runs
    try:
        assert drop_leftover_databases(url, prefix) == []
        assert _left(url, prefix) == [name]
    finally:
        mark.close()
    assert drop_leftover_databases(url, prefix) == [name]


@pytest.mark.engines("postgresql")
def test_a_database_of_a_process_still_running_here_is_kept(server: tuple[URL, str]) -> None:
    url, prefix = server
    parent = RunToken(os.getppid(), host_tag())  # alive, holding no lock
    name = database_name(prefix, "test", parent, 1)
    _create(url, name)
    assert drop_leftover_databases(url, prefix) == []
    assert _left(url, prefix) == [name]


@pytest.mark.engines("postgresql")
def test_a_leftover_that_a_session_still_uses_is_kept(server: tuple[URL, str]) -> None:
    url, prefix = server
    name = database_name(prefix, "test", RunToken(_dead_pid(), host_tag()), 1)
    _create(url, name)
    user = sa.create_engine(url.set(database=name), poolclass=sa.NullPool)
    with user.connect():
        assert drop_leftover_databases(url, prefix) == []
        assert _left(url, prefix) == [name]
    user.dispose()


@pytest.mark.engines("postgresql")
def test_databases_not_named_by_a_run_with_the_prefix_are_never_touched(
    server: tuple[URL, str],
) -> None:
    url, prefix = server
    gone = RunToken(_dead_pid(), host_tag())
    others = [
        f"{prefix}test_{gone.pid}_7",  # the naming before run tokens: no host
        f"{prefix}mine",
        f"{prefix}test_{gone}_1_copy",
    ]
    _create(url, *others)
    assert drop_leftover_databases(url, prefix) == []
    assert _left(url, prefix) == sorted(others)


_CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
import dbs
address = json.loads(sys.argv[2])
backend = dbs.PostgresBackend(description="child run", prefix=address.pop("prefix"), **address)
print(backend.database(installed=False).name, flush=True)
sys.stdin.read()  # runs until killed
"""


def _wait_until_its_session_ended(url: URL, token: RunToken) -> None:
    """The server ends a killed client's session when it reads the closed socket, a moment
    after the kill: wait for that by taking the run's lock (at most 30 s), then give it back."""
    engine = _admin(url)
    with engine.connect() as conn:
        conn.execute(sa.text("SET lock_timeout = '30s'"))
        params = {"cls": dbs.RUN_LOCK_CLASS, "key": token.lock_key}
        conn.execute(sa.text("SELECT pg_advisory_lock(:cls, :key)"), params)
        conn.execute(sa.text("SELECT pg_advisory_unlock(:cls, :key)"), params)
    engine.dispose()


@pytest.mark.engines("postgresql")
def test_a_killed_run_leaves_databases_that_the_next_run_drops(
    server: tuple[URL, str], backend: PostgresBackend
) -> None:
    url, prefix = server
    address = {"host": backend.host, "port": backend.port, "user": backend.user}
    address |= {"password": backend.password, "prefix": prefix}
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(TESTS), json.dumps(address)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        name = child.stdout.readline().strip()
        assert name.startswith(f"{prefix}test_{child.pid}_")
        assert drop_leftover_databases(url, prefix) == []  # it runs: kept
    finally:
        child.send_signal(signal.SIGKILL)  # no teardown, as after kill -9 or a lost machine
        child.wait(timeout=60)
    _wait_until_its_session_ended(url, RunToken(child.pid, host_tag()))
    assert drop_leftover_databases(url, prefix) == [name]
    assert _left(url, prefix) == []


_TWO_BACKENDS = """
import json, sys
sys.path.insert(0, sys.argv[1])
import dbs
address = json.loads(sys.argv[2])
prefix = address.pop("prefix")
first = dbs.PostgresBackend(description="first", prefix=prefix, shared=False, **address)
made = first.database(installed=False)
second = dbs.PostgresBackend(description="second", prefix=prefix, **address)
second.close()
print(json.dumps({"made": made.name, "dropped": second.dropped_leftovers}))
first.drop(made)
first.close()
"""


@pytest.mark.engines("postgresql")
def test_a_second_backend_of_a_run_never_drops_the_databases_of_the_first(
    server: tuple[URL, str], backend: PostgresBackend
) -> None:
    """Also when the first is a throw-away server's backend (shared=False, as the embedded
    server's is): the latency benchmark's test makes a second backend on the run's server,
    whose sweep once dropped the run's template (the same pid in the names, and no lock held
    for it). In a process of its own: this run's mark on the server would hide the bug."""
    url, prefix = server
    address = {"host": backend.host, "port": backend.port, "user": backend.user}
    address |= {"password": backend.password, "prefix": prefix}
    done = subprocess.run(
        [sys.executable, "-c", _TWO_BACKENDS, str(TESTS), json.dumps(address)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["made"] not in seen["dropped"]
    assert _left(url, prefix) == []
