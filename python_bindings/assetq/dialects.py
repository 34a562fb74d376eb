"""What differs between the engines, in one place.

The public API is written once against :class:`Dialect`; each engine's SQL lives in its own
folder with the same query names and parameters. What cannot be said in SQL (how a script is
sent, how a driver reports an error code, which codes are transient) is here.
"""

from __future__ import annotations

import collections
import functools
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import URL, Connection, Engine, TextClause, text
from sqlalchemy.engine import Dialect as SADialect
from sqlalchemy.engine import Row
from sqlalchemy.engine.result import result_tuple
from sqlalchemy.exc import DBAPIError, OperationalError, StatementError

from . import errors, sqlfiles
from .validation import PREFIX_MAX, split_namespace

_AQ_CODE = re.compile(r"\[(AQ\d{3})\]")

#: assetq's own error codes, raised by its routines on both engines.
_AQ_ERRORS: dict[str, type[errors.AssetqError]] = {
    "AQ001": errors.UnknownAsset,
    "AQ002": errors.InvalidArgument,
    "AQ003": errors.UnknownDag,
    "AQ004": errors.InvalidCondition,
    "AQ005": errors.IdempotencyConflict,
    "AQ006": errors.UnknownRun,
    "AQ007": errors.AssetInUse,
    "AQ008": errors.InvalidRunState,
    "AQ010": errors.LeaseLost,
    "AQ011": errors.UnmappablePartition,
    "AQ900": errors.ClaimGuardAbort,
}


#: "PROCEDURE `ns`.`name` does not exist" (MySQL 1305, MariaDB quotes nothing).
_MISSING_ROUTINE = re.compile(r"(?:PROCEDURE|FUNCTION) `?\w+`?\.`?(\w+)`? does not exist")


@functools.cache
def _routine_names(engine: str) -> frozenset[str]:
    """The routines of this package's schema for ``engine`` (one file each)."""
    return frozenset(f.name for f in sqlfiles.object_files(engine) if f.kind == "routine")


def _is_ours(name: str, routines: frozenset[str]) -> bool:
    """``name`` is one of ``routines``, or one with a namespace's table prefix (MySQL)."""
    return name in routines or any(
        name.endswith(r) and _TABLE_PREFIX.fullmatch(name[: -len(r)]) for r in routines
    )


_TABLE_PREFIX = re.compile(rf"[a-z_][a-z0-9_]{{0,{PREFIX_MAX - 1}}}")

#: Foreign-key violation on insert: PostgreSQL SQLSTATE, MySQL error number.
_FOREIGN_KEY_CODES = frozenset({"23503", "1452"})
#: Foreign keys to the asset table that a registration writes: violated when the asset was
#: deleted after the registration looked it up.
_ASSET_FOREIGN_KEYS = ("asset_event_asset_id_fkey", "asset_alias_asset_asset_id_fkey")


@dataclass(frozen=True)
class Dialect:
    """An engine assetq supports, with named capability flags for the real differences."""

    #: Folder under ``sql/`` and the name tests use for the engine.
    name: str
    #: Identifier quote character.
    quote: str
    #: INSERT/DELETE ... RETURNING is available on every supported server version.
    supports_returning: bool
    #: LISTEN/NOTIFY wake-ups are available.
    supports_notify: bool
    #: Error codes (as strings) that a retry of the whole transaction can cure.
    transient_codes: frozenset[str]
    #: A routine call is one statement, atomic on its own: on an autocommit connection it is a
    #: transaction of one round trip (PostgreSQL functions; a MySQL procedure's statements
    #: each commit on their own under autocommit).
    atomic_routines: bool = False
    #: Error codes that mean the input was bad (too long, wrong type, constraint).
    invalid_input_codes: frozenset[str] = field(default_factory=frozenset)
    #: Error codes (and code class prefixes) of a connection that was lost or never made.
    connection_codes: frozenset[str] = field(default_factory=frozenset)
    connection_code_classes: tuple[str, ...] = ()
    #: Error codes of a server that refuses writes (a standby, read_only).
    read_only_codes: frozenset[str] = field(default_factory=frozenset)
    #: Error codes of a prepared-statement collision behind a transaction-pooling pooler.
    prepared_statement_codes: frozenset[str] = field(default_factory=frozenset)
    #: Error codes of a call to a routine that does not exist: transient when it is one of
    #: assetq's (an upgrade re-creating it), errors.RoutineUnavailable.
    missing_routine_codes: frozenset[str] = field(default_factory=frozenset)
    #: Error codes of a server setting assetq cannot work with, and what to set instead.
    unsupported_setting_codes: Mapping[str, str] = field(default_factory=dict)
    #: A namespace may be ``database.prefix`` (MySQL: a database shared with an application).
    supports_table_prefix: bool = False

    def quote_ns(self, namespace: str) -> str:
        """The quoted namespace sqlfiles.render fills in; ``db.prefix`` (MySQL only) is
        `` `db`.`prefix` ``, which render applies to every object name."""
        database, prefix = split_namespace(namespace)
        if not prefix:
            return f"{self.quote}{namespace}{self.quote}"
        if not self.supports_table_prefix:
            raise errors.InvalidArgument(
                f"namespace {namespace!r} has a table prefix, which only MySQL/MariaDB"
                f" installs take (there a namespace is a database that an application's"
                f" tables may share); on {self.name} a namespace is a schema of its own and"
                f" never collides with an application's tables: use namespace {database!r}"
                f" or another schema name"
            )
        return f"{self.quote}{database}{self.quote}.{self.quote}{prefix}{self.quote}"

    def quote_database(self, namespace: str) -> str:
        """The quoted database (schema) of ``namespace``, without its table prefix."""
        return f"{self.quote}{split_namespace(namespace)[0]}{self.quote}"

    def query(self, name: str, namespace: str) -> str:
        return _rendered_query(self.name, name, self.quote_ns(namespace))

    def statement(self, name: str, namespace: str) -> TextClause:
        """Named query ``name`` as a statement, built once per namespace: text() parses the
        bind parameters of its SQL each time it is called, a cost on every registration."""
        key = (self.name, name, namespace)
        statement = _statement_cache.get(key)
        if statement is None:
            statement = _statement_cache[key] = text(self.query(name, namespace))
        return statement

    @contextmanager
    def atomic(self, conn: Connection) -> Iterator[None]:
        """Make a routine call with several writing statements atomic on an autocommit
        connection too. PostgreSQL: a function is one statement, so it already is."""
        yield

    @contextmanager
    def several(self, conn: Connection) -> Iterator[None]:
        """Make several routine calls atomic together on an autocommit connection too (in
        the caller's transaction otherwise, which already makes them atomic)."""
        with self.atomic(conn):
            yield

    def execute(
        self,
        conn: Connection,
        name: str,
        namespace: str,
        params: Mapping[str, Any] | None = None,
    ) -> Sequence[Row[Any]]:
        """Run named query ``name`` and return all its rows (empty when it returns none)."""
        result = conn.execute(self.statement(name, namespace), dict(params or {}))
        rows: Sequence[Row[Any]] = result.all() if result.returns_rows else []
        self._drain(conn)
        return rows

    def execute_alone(
        self,
        engine: Engine,
        name: str,
        namespace: str,
        params: Mapping[str, Any] | None = None,
    ) -> Sequence[Any] | None:
        """Run named query ``name`` alone on a connection of ``engine``'s pool, with no
        SQLAlchemy Connection around it, where the engine can (PostgreSQL); None here."""
        return None

    def _drain(self, conn: Connection) -> None:
        """Consume result sets a CALL leaves behind (MySQL); nothing on PostgreSQL."""

    def _drain_cursor(self, cursor: Any, name: str) -> None:
        """Read the results a call leaves on a DB-API cursor after its rows (MySQL)."""

    def _driver_rows(
        self,
        sa_dialect: SADialect,
        dbapi_connection: Any,
        name: str,
        namespace: str,
        params: Mapping[str, Any] | None,
        owner: Any,
    ) -> list[Any]:
        """Named query ``name`` through the driver's cursor; ``owner`` (the Connection or the
        pool's connection) is invalidated when the call finds the connection lost."""
        key = (name, self.quote_ns(namespace))
        # Compiled for the SQLAlchemy dialect: its paramstyle is in the SQL.
        compiled_key = (*key, str(sa_dialect.paramstyle))
        sql = _driver_sql_cache.get(compiled_key)
        if sql is None:
            compiled = self.statement(name, namespace).compile(dialect=sa_dialect)
            sql = _driver_sql_cache[compiled_key] = compiled.string
        bound = dict(params or {})
        dbapi_error: type[Exception] = sa_dialect.loaded_dbapi.Error
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(sql, bound)
            raw = cursor.fetchall()
            keys = _driver_keys_cache.get(key)
            if keys is None:
                keys = _driver_keys_cache[key] = tuple(str(c[0]) for c in cursor.description)
            self._drain_cursor(cursor, name)
        except dbapi_error as exc:
            raise _driver_failure(
                sa_dialect, dbapi_connection, exc, sql, bound, cursor, owner
            ) from exc
        finally:
            cursor.close()
        return _rows(keys, raw)

    def run_script(self, conn: Connection, script: str, namespace: str) -> None:
        """Execute a packaged script (schema or migration) on ``conn``."""
        raise NotImplementedError

    def run_statements(self, conn: Connection, statements: Sequence[str]) -> None:
        """Execute rendered statements one by one on ``conn`` (MySQL: see there)."""
        raise NotImplementedError

    def error_code(self, exc: DBAPIError) -> str | None:
        raise NotImplementedError

    def translate(self, exc: DBAPIError) -> errors.AssetqError:
        """Turn a driver error into assetq's exception for it, keeping the code."""
        return self._classified(self.error_code(exc), _message(exc), exc)

    def reported(self, code: str, message: str) -> errors.AssetqError:
        """assetq's exception for an error a routine caught and reported in its result
        (``error_code``, ``error_message``: register_event_v2) instead of raising it: the
        same class and code as :meth:`translate` gives the error raised."""
        return self._classified(code, message, None)

    def _classified(
        self, code: str | None, message: str, exc: DBAPIError | None
    ) -> errors.AssetqError:
        found = _AQ_CODE.search(message)
        if found:
            code = found.group(1)
        if code in _AQ_ERRORS:
            return _AQ_ERRORS[code](message, code=code)
        if code in _FOREIGN_KEY_CODES and any(fk in message for fk in _ASSET_FOREIGN_KEYS):
            # The asset was deleted (delete_asset) after the event's asset was looked up.
            return errors.UnknownAsset(
                f"unknown asset: it was deleted while the event was being registered ({message})",
                code="AQ001",
            )
        deployment = self._deployment_error(exc, code, message)
        if deployment is not None:
            return deployment
        if code in self.missing_routine_codes:
            missing = _MISSING_ROUTINE.search(message)
            if missing and _is_ours(missing.group(1), _routine_names(self.name)):
                return errors.RoutineUnavailable(
                    f"{message} -- assetq's routine {missing.group(1)} is being re-created (an"
                    " upgrade or a repair drops it and creates it again): transient, retry the"
                    " transaction; if it stays missing, run assetq doctor",
                    code=code,
                )
        if code in self.transient_codes:
            return errors.TransientError(message, code=code)
        if code in self.invalid_input_codes:
            return errors.InvalidArgument(message, code=code)
        return errors.DatabaseError(message, code=code)

    def _deployment_error(
        self, exc: DBAPIError | None, code: str | None, message: str
    ) -> errors.AssetqError | None:
        """Errors that say something about the deployment rather than the call: a pooler
        that mixes up prepared statements, a lost or unreachable server, a read-only one, a
        server setting assetq cannot work with. Each message says what to do. ``exc`` None:
        an error a routine reported, never a lost connection (the session survived it)."""
        if code in self.prepared_statement_codes and any(
            sign in message for sign in _PREPARED_STATEMENT_SIGNS
        ):
            return errors.PreparedStatementConflict(
                f"{message} -- psycopg's server-side prepared statements collided on a pooled"
                " server connection: this connection goes through a transaction-pooling"
                " pooler (PgBouncer). Create the engine with"
                ' connect_args={"prepare_threshold": None}; assetq\'s command line: add'
                " ?prepare_threshold=none to the URL (docs/deployment.md)",
                code=code,
            )
        if code in self.read_only_codes and re.search(r"read[- _]only", message, re.IGNORECASE):
            return errors.ReadOnlyServer(
                f"{message} -- the server is read-only (a standby?): point the URL at the"
                " primary; on PostgreSQL list every node in a libpq multi-host URL with"
                " target_session_attrs=read-write (docs/deployment.md). Transient: loops retry",
                code=code,
            )
        advice = self.unsupported_setting_codes.get(code or "")
        if advice is not None:
            return errors.UnsupportedServerSetting(f"{message} -- {advice}", code=code)
        # Raised at connect time (outside any transaction) as well as mid-transaction: the
        # transaction, if any, went with the connection, so retrying it whole is safe (and
        # exactly-once, with an idempotency key for producers).
        if exc is None:
            return None
        lost = exc.connection_invalidated or code in self.connection_codes
        if not lost and code is None:
            # No code from the server: the driver's own "connection refused", "server closed
            # the connection unexpectedly", "the connection is closed".
            lost = isinstance(exc, OperationalError)
        if not lost and code is not None:
            lost = any(code.startswith(prefix) for prefix in self.connection_code_classes)
        if lost:
            return errors.ConnectionLost(message, code=code)
        return None


#: Words of psycopg's errors when a pooled server connection has another client's prepared
#: statements, or lacks this client's.
_PREPARED_STATEMENT_SIGNS = ("prepared statement", "bind message supplies")


def _message(exc: DBAPIError) -> str:
    orig = exc.orig
    if orig is None:
        return str(exc)
    diag = getattr(orig, "diag", None)
    primary = getattr(diag, "message_primary", None) if diag is not None else None
    if primary:
        hint = getattr(diag, "message_hint", None)
        detail = getattr(diag, "message_detail", None)
        parts = [primary]
        if detail:
            parts.append(f"Detail: {detail}")
        if hint:
            parts.append(f"Hint: {hint}")
        return " ".join(parts)
    args: tuple[object, ...] = tuple(getattr(orig, "args", ()))
    if len(args) >= 2 and isinstance(args[1], str):
        return args[1]
    return str(orig)


#: The calls a worker makes for every run, and a producer's for every event: sent straight
#: through the driver's cursor when nothing listens to the connection's statements (see
#: _PostgreSQL.execute).
_DRIVER_QUERIES = frozenset(
    {
        "claim_runs",
        "schedule_and_claim",
        "heartbeat_run",
        "complete_run",
        "register_event",
        "register_event_v2",
        "register_events",
        "register_events_v2",
    }
)
#: The calls a producer makes for every event, sent through the driver's cursor on MySQL when
#: nothing listens (see _MySQL.execute). The worker's calls are not (yet): their time on
#: MySQL was not measured this way.
_MYSQL_DRIVER_QUERIES = frozenset(
    {"register_event", "register_event_v2", "register_events", "register_events_v2"}
)
#: Named queries as the driver takes them (SQLAlchemy's compilation of the same text), and
#: their result columns once seen, by (query, quoted namespace[, SQLAlchemy paramstyle]).
_driver_sql_cache: dict[tuple[str, str, str], str] = {}
_driver_keys_cache: dict[tuple[str, str], tuple[str, ...]] = {}


def _driver_failure(
    sa_dialect: SADialect,
    dbapi_connection: Any,
    exc: Exception,
    statement: str,
    bound: Mapping[str, Any] | None,
    cursor: Any,
    owner: Any,
) -> StatementError:
    """A DB-API error raised where assetq talks to the driver itself (a cursor it reads, a
    BEGIN or COMMIT it sends), as the DBAPIError SQLAlchemy would have raised. When it means
    the connection is lost, ``owner`` (the Connection or the pool's connection) is
    invalidated, as SQLAlchemy does for its own statements: the pool neither rolls the dead
    session back (an ERROR with a traceback) nor hands it out again."""
    lost = sa_dialect.is_disconnect(
        exc,  # type: ignore[arg-type]  # a DB-API Error, typed loosely by the callers
        dbapi_connection,
        cursor,
    )
    if lost:
        owner.invalidate(exc)
    dbapi_error: type[Exception] = sa_dialect.loaded_dbapi.Error
    return DBAPIError.instance(
        statement, bound, exc, dbapi_error, connection_invalidated=lost, dialect=sa_dialect
    )


#: Row constructors by result columns, for rows read straight from the DB-API cursor.
_row_makers: dict[tuple[str, ...], Callable[[Sequence[Any]], Any]] = {}


def _row_maker(keys: tuple[str, ...]) -> Callable[[Sequence[Any]], Any]:
    """Rows of ``keys`` as named tuples: attributes by column name and items by position,
    as SQLAlchemy's Row has them, at a tenth of the cost of reading a Row's attribute (a
    worker reads some twenty of them per run). Columns that cannot be a tuple's field names
    get SQLAlchemy's Row."""
    try:
        row_type: Any = collections.namedtuple("Row", keys)  # type: ignore[misc]
    except ValueError:  # a keyword, a leading underscore, a duplicate name
        return result_tuple(keys)
    make: Callable[[Sequence[Any]], Any] = row_type._make
    return make


def _rows(keys: tuple[str, ...], raw: Sequence[Sequence[Any]]) -> list[Any]:
    """Rows read straight from a DB-API cursor, readable as SQLAlchemy's Row objects are
    (by column name, or by position)."""
    make_row = _row_makers.get(keys)
    if make_row is None:
        make_row = _row_makers[keys] = _row_maker(keys)
    return [make_row(values) for values in raw]


def _listened(conn: Connection) -> bool:
    """Whether statement events are listened to on ``conn`` or its engine (instrumentation,
    tests counting statements). Unknown means yes: the fast path is only an optimization."""
    return bool(getattr(conn, "_has_events", True) or getattr(conn.engine, "_has_events", True))


class _PostgreSQL(Dialect):
    @contextmanager
    def several(self, conn: Connection) -> Iterator[None]:
        """On an autocommit connection, a transaction block of the driver's (psycopg's
        ``transaction()``) around the calls; nothing otherwise."""
        dbapi_connection = conn.connection.dbapi_connection
        if not getattr(dbapi_connection, "autocommit", False):
            yield
            return
        with dbapi_connection.transaction():  # type: ignore[union-attr]
            yield

    def execute(
        self,
        conn: Connection,
        name: str,
        namespace: str,
        params: Mapping[str, Any] | None = None,
    ) -> Sequence[Row[Any]]:
        """Run named query ``name``. A worker's per-run calls (claim, heartbeat, complete) go
        straight through the driver's cursor: the same SQL as SQLAlchemy compiles it, the
        same transaction, but none of SQLAlchemy's per-statement result machinery, which
        cost more client time than the call itself (docs/benchmarks.md, "Worker
        burn-down"). Whenever something listens to the connection's statement events the
        call goes through SQLAlchemy as every other one does, so listeners see it."""
        if name not in _DRIVER_QUERIES or _listened(conn):
            return super().execute(conn, name, namespace, params)
        dbapi_connection = conn.connection.dbapi_connection
        assert dbapi_connection is not None  # a Connection in use always has one
        if not conn.in_transaction() and not getattr(dbapi_connection, "autocommit", False):
            # What conn.execute() does first (autobegin): the caller's transaction is then
            # SQLAlchemy's to commit. Without it the driver began one SQLAlchemy did not
            # know of, conn.commit() committed nothing and the pool rolled the call back.
            # (In autocommit the call is its own transaction: nothing to begin.)
            conn.begin()
        return self._driver_rows(conn.dialect, dbapi_connection, name, namespace, params, conn)

    def execute_alone(
        self,
        engine: Engine,
        name: str,
        namespace: str,
        params: Mapping[str, Any] | None = None,
    ) -> Sequence[Any] | None:
        """Run named query ``name``, one routine call that is atomic by itself, alone on an
        autocommit connection of ``engine``'s pool: the driver's connection straight from the
        pool, no SQLAlchemy Connection around it (its construction, the isolation level set
        and reset, cost a worker's claim more client time than the call itself). None when
        this lean path does not apply: a query not sent through the driver, something
        listening to the engine's statements (they must see it), or a failed connect (the
        caller's usual path then connects again, and raises what SQLAlchemy raises)."""
        if name not in _DRIVER_QUERIES or getattr(engine, "_has_events", True):
            return None
        sa_dialect = engine.dialect
        try:
            fairy = engine.raw_connection()
        except sa_dialect.loaded_dbapi.Error:
            return None
        try:
            dbapi_connection: Any = fairy.dbapi_connection
            autocommit = getattr(dbapi_connection, "autocommit", None)
            if autocommit is None:  # a driver without psycopg's switch
                return None
            if not autocommit:
                # psycopg's switch is client-side: no round trip, here or below.
                dbapi_connection.autocommit = True
            try:
                return self._driver_rows(
                    sa_dialect, dbapi_connection, name, namespace, params, fairy
                )
            finally:
                if not autocommit and not getattr(dbapi_connection, "closed", False):
                    dbapi_connection.autocommit = False
        finally:
            fairy.close()

    def run_script(self, conn: Connection, script: str, namespace: str) -> None:
        sql = sqlfiles.render(script, self.quote_ns(namespace))
        # Straight to the driver: no bind-parameter parsing, so ':' and '%' in PL/pgSQL
        # bodies are left alone, and psycopg sends a parameterless string as one simple
        # query, which may hold many statements.
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            cursor.execute(sql)
        finally:
            cursor.close()

    def error_code(self, exc: DBAPIError) -> str | None:
        code = getattr(exc.orig, "sqlstate", None)
        return code if isinstance(code, str) else None


class _MySQL(Dialect):
    """MySQL 8.0+ and MariaDB 10.6+, through PyMySQL (or any DB-API driver SQLAlchemy has).

    Nothing here sets the session's time_zone: assetq's routines write UTC_TIMESTAMP(6) into
    DATETIME(6) columns, and a DATETIME is never converted by the session zone, so every
    timestamp assetq stores or returns is UTC whatever the connection's time_zone is. A user's
    engine needs no connect hook.
    """

    def execute(
        self,
        conn: Connection,
        name: str,
        namespace: str,
        params: Mapping[str, Any] | None = None,
    ) -> Sequence[Row[Any]]:
        """Run named query ``name``; return its rows after reading every result the server sent.

        A CALL that returns a result set is followed by one more result (the CALL's status),
        or by an error raised after the rows were sent. SQLAlchemy closes the cursor once the
        rows are read and the driver then drains the rest, but an error found there is only
        logged ("Error closing cursor") and the call would seem to succeed. So the rows are
        read from the DB-API cursor and every further result is read here, where an error
        still raises, as a DBAPIError like any other.

        A producer's calls go straight through the driver's cursor when nothing listens to
        the connection's statements, as on PostgreSQL: SQLAlchemy's per-statement work cost
        a third of a registration's time on MariaDB (docs/benchmarks.md, "The producer's
        default path").
        """
        # Named parameters only (PyMySQL's pyformat): aiomysql's SQLAlchemy dialect takes
        # them by position, which the compiled statement alone does not give.
        if (
            name in _MYSQL_DRIVER_QUERIES
            and conn.dialect.paramstyle == "pyformat"
            and not _listened(conn)
        ):
            dbapi_connection = conn.connection.dbapi_connection
            assert dbapi_connection is not None  # a Connection in use always has one
            if not conn.in_transaction():
                # What conn.execute() does first (autobegin), so the caller's transaction
                # is SQLAlchemy's to commit (PyMySQL begins it implicitly, or autocommits).
                conn.begin()
            return self._driver_rows(conn.dialect, dbapi_connection, name, namespace, params, conn)
        statement = self.query(name, namespace)
        bound = dict(params or {})
        result = conn.execute(self.statement(name, namespace), bound)
        if not result.returns_rows:
            # No result set: the server's single reply (status or error) was already read.
            return []
        keys = tuple(result.keys())
        cursor = result.cursor
        dbapi_error: type[Exception] = conn.dialect.loaded_dbapi.Error
        try:
            raw = list(cursor.fetchall())
            while cursor.nextset():
                if cursor.description is not None:
                    raise errors.DatabaseError(
                        f"{name} returned more than one result set; assetq's routines return one"
                    )
        except dbapi_error as exc:
            dbapi_connection = conn.connection.dbapi_connection
            raise _driver_failure(
                conn.dialect, dbapi_connection, exc, statement, bound, cursor, conn
            ) from exc
        finally:
            result.close()
        return _rows(keys, raw)

    def _drain_cursor(self, cursor: Any, name: str) -> None:
        # The CALL's status, or an error raised after its rows (see execute).
        while cursor.nextset():
            if cursor.description is not None:
                raise errors.DatabaseError(
                    f"{name} returned more than one result set; assetq's routines return one"
                )

    @contextmanager
    def atomic(self, conn: Connection) -> Iterator[None]:
        """Under autocommit every statement inside a procedure commits on its own, so a
        procedure that writes row by row would not be atomic: on an autocommit connection the
        call gets a transaction of its own (through the driver: PyMySQL's begin())."""
        dbapi_connection = conn.connection.dbapi_connection
        assert dbapi_connection is not None  # a Connection in use always has one
        try:
            autocommit = bool(conn.dialect.detect_autocommit_setting(dbapi_connection))
        except (AttributeError, NotImplementedError):  # SQLAlchemy < 2.1, other drivers
            get_autocommit = getattr(dbapi_connection, "get_autocommit", None)
            autocommit = bool(get_autocommit()) if get_autocommit is not None else False
        if not autocommit:
            yield
            return
        begin = getattr(dbapi_connection, "begin", None)
        if begin is None:
            raise errors.AssetqError(
                "this MySQL driver cannot open a transaction on an autocommit connection:"
                " call assetq inside a transaction (engine.begin())"
            )
        dbapi_error: type[Exception] = conn.dialect.loaded_dbapi.Error

        def driver(call: Callable[[], object], what: str) -> None:
            try:
                call()
            except dbapi_error as exc:  # as a DBAPIError, like every other driver error
                raise _driver_failure(
                    conn.dialect, dbapi_connection, exc, what, None, None, conn
                ) from exc

        driver(begin, "BEGIN")
        try:
            yield
        except BaseException:
            driver(dbapi_connection.rollback, "ROLLBACK")
            raise
        driver(dbapi_connection.commit, "COMMIT")

    def run_script(self, conn: Connection, script: str, namespace: str) -> None:
        # The server takes one statement per call (PyMySQL has multi-statements off) and
        # DELIMITER is a command of the mysql client: split_script splits as the client does
        # and sends each routine whole. Straight to the driver, without parameters, so '%' and
        # ':' in routine bodies are never taken for placeholders.
        sql = sqlfiles.render(script, self.quote_ns(namespace))
        self.run_statements(conn, sqlfiles.split_script(sql))

    def run_statements(self, conn: Connection, statements: Sequence[str]) -> None:
        """Execute rendered statements one by one, straight to the driver (no parameters),
        as :meth:`run_script` does; a LOCK TABLES the statements took is released however
        they end (migrate.repair swaps triggers with it)."""
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        locked = False
        try:
            for statement in statements:
                cursor.execute(statement)
                while cursor.nextset():
                    pass
                # A script may swap a trigger under LOCK TABLES (routines.sync on MySQL): the lock
                # is the session's, and must not outlive a failure on a pooled connection.
                head = statement.lstrip().upper()
                if head.startswith("LOCK TABLES"):
                    locked = True
                elif head.startswith("UNLOCK TABLES"):
                    locked = False
        finally:
            try:
                if locked:
                    cursor.execute("UNLOCK TABLES")
            finally:
                cursor.close()

    def error_code(self, exc: DBAPIError) -> str | None:
        orig = exc.orig
        errno = getattr(orig, "errno", None)  # MariaDB Connector/Python
        if isinstance(errno, int):
            return str(errno)
        args: tuple[object, ...] = tuple(getattr(orig, "args", ()))
        if args and isinstance(args[0], int):  # PyMySQL and mysqlclient: (errno, message)
            return str(args[0])
        return None


POSTGRESQL = _PostgreSQL(
    name="postgresql",
    quote='"',
    supports_returning=True,
    supports_notify=True,
    atomic_routines=True,
    # serialization failure, deadlock, lock not available, query canceled by lock_timeout
    transient_codes=frozenset({"40001", "40P01", "55P03"}),
    # string too long, invalid text, NUL/encoding, numeric range, check/not-null/fk violations
    invalid_input_codes=frozenset(
        {"22001", "22P02", "22P05", "22021", "22003", "22023", "23502", "23503", "23514"}
    ),
    # class 08 (connection exception); admin_shutdown, crash_shutdown, cannot_connect_now
    # (starting up, shutting down, in recovery), too_many_connections.
    connection_codes=frozenset({"57P01", "57P02", "57P03", "53300"}),
    connection_code_classes=("08",),
    # read_only_sql_transaction: a hot standby, or default_transaction_read_only.
    read_only_codes=frozenset({"25006"}),
    # invalid_sql_statement_name ("prepared statement _pg3_N does not exist"),
    # duplicate_prepared_statement ("already exists"), protocol_violation ("bind message
    # supplies 7 parameters, but prepared statement ... requires 0"); checked before class 08.
    prepared_statement_codes=frozenset({"26000", "42P05", "08P01"}),
)

MYSQL = _MySQL(
    name="mysql",
    quote="`",
    supports_table_prefix=True,
    # MariaDB has RETURNING, MySQL 8 does not: the MySQL path uses the common subset.
    supports_returning=False,
    supports_notify=False,
    # 1213 deadlock (the transaction was rolled back), 1205 lock wait timeout (only the
    # statement was: the caller rolls back the rest), 1020 "record has changed since last read"
    # (MariaDB >= 11.8 with innodb_snapshot_isolation, at REPEATABLE READ). assetq's own
    # transient condition, the claim guard, comes as AQ900. 2006/2013: the server went away
    # or the connection was lost mid-query (a restart); the transaction went with it.
    # 1467: MariaDB reports some deadlocks on the AUTO-INC lock as "failed to read
    # auto-increment value" (MDEV-33593), the transaction rolled back like 1213.
    transient_codes=frozenset({"1213", "1205", "1020", "1467", "2006", "2013"}),
    # data too long, incorrect value, out of range, check constraint, not null, fk; 1265
    # "data truncated": MySQL's word for a too-long value a batch's JSON_TABLE column passes
    # on to the INSERT (MariaDB says 1406), tests/test_direct_sql.py.
    invalid_input_codes=frozenset(
        {"1406", "1366", "1264", "3819", "4025", "1048", "1452", "3140", "1265"}
    ),
    # can't connect (socket, TCP), gone away, lost during query, lost at handshake, server
    # shutdown in progress, connection killed (MariaDB), disconnected for inactivity (MySQL
    # 8.0.24+), too many connections.
    connection_codes=frozenset(
        {"2002", "2003", "2006", "2013", "2055", "1053", "1927", "4031", "1040"}
    ),
    # running with --read-only / --super-read-only; a READ ONLY transaction.
    read_only_codes=frozenset({"1290", "1792"}),
    # PROCEDURE/FUNCTION does not exist: an upgrade drops and re-creates routines.
    missing_routine_codes=frozenset({"1305"}),
    unsupported_setting_codes={
        "1665": "with binlog_format=STATEMENT InnoDB refuses writes at READ COMMITTED, the"
        " level every scheduler pass runs at, so every pass fails: set binlog_format=ROW (or"
        " MIXED) in the server's configuration and SET GLOBAL binlog_format='ROW' (new"
        " connections take it; docs/deployment.md)",
    },
)


#: psycopg's server-side prepares in the engines assetq builds (the command line, the demo):
#: off. Through a transaction-pooling pooler they collide (DESIGN.md section 6: 13.7% of
#: producer transactions failed), and off costs nothing measurable on a direct connection
#: (registrations/s with 5 vs None, docs/deployment.md).
DEFAULT_PREPARE_THRESHOLD: int | None = None

_NO_PREPARES = frozenset({"none", "null", "off", "false", "0", ""})


def engine_arguments(url: URL) -> tuple[URL, dict[str, Any]]:
    """``url`` without the connection options assetq reads itself, and the ``connect_args``
    of ``create_engine`` they make, for the engines assetq builds.

    ``prepare_threshold`` (PostgreSQL with psycopg 3): ``none`` (also ``0``, ``off``, as
    PgBouncer's guides and JDBC's ``prepareThreshold=0`` mean it) disables server-side
    prepared statements, a number N prepares a statement after N executions (psycopg's own
    default is 5); absent, assetq disables them. SQLAlchemy would pass the URL's text to
    psycopg, which fails on it (TypeError). Other engines and drivers: ``url`` unchanged.
    """
    if url.get_backend_name() != "postgresql" or url.get_driver_name() != "psycopg":
        return url, {}
    threshold: int | None = DEFAULT_PREPARE_THRESHOLD
    value = url.query.get("prepare_threshold")
    if value is not None:
        text_value = (value[-1] if isinstance(value, tuple) else value).strip().lower()
        if text_value in _NO_PREPARES:
            threshold = None
        elif text_value.isdigit():
            threshold = int(text_value)
        else:
            raise errors.InvalidArgument(
                f"prepare_threshold={text_value!r} in the URL: write none (no server-side"
                " prepared statements, needed behind a transaction pooler) or a number of"
                " executions"
            )
        url = url.difference_update_query(["prepare_threshold"])
    return url, {"prepare_threshold": threshold}


def dialect_of(engine: Engine) -> Dialect:
    """The dialect of ``engine``, known without connecting."""
    name = engine.dialect.name
    if name == "postgresql":
        return POSTGRESQL
    if name in ("mysql", "mariadb"):
        return MYSQL
    raise errors.AssetqError(
        f"assetq supports PostgreSQL and MySQL/MariaDB; this engine is {name!r}"
    )


def dialect_for(conn: Connection) -> Dialect:
    name = conn.dialect.name
    if name == "postgresql":
        return POSTGRESQL
    if name in ("mysql", "mariadb"):
        return MYSQL
    raise errors.AssetqError(
        f"assetq supports PostgreSQL and MySQL/MariaDB; this connection is {name!r}"
    )


_rendered_cache: dict[tuple[str, str, str], str] = {}
_statement_cache: dict[tuple[str, str, str], TextClause] = {}


def _rendered_query(engine: str, name: str, quoted_ns: str) -> str:
    key = (engine, name, quoted_ns)
    sql = _rendered_cache.get(key)
    if sql is None:
        try:
            template = sqlfiles.queries(engine)[name]
        except KeyError:
            raise errors.AssetqError(f"no query named {name!r} for {engine}") from None
        sql = _rendered_cache[key] = sqlfiles.render(template, quoted_ns)
    return sql
