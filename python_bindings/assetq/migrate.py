"""Install, upgrade, downgrade and uninstall the assetq schema through alembic.

The revisions in ``assetq/migrations/versions`` only execute packaged SQL
(``sql/<engine>/migrations/<revision>.<up|down>.sql``). alembic's version table lives inside
the namespace. A fresh install to the head revision executes the schema snapshot
(``sql/<engine>/schema.sql``) and stamps head, as alembic recommends for new databases; a fresh
install pinned at an older revision, and an existing install, go revision by revision.
``tests/test_migrations.py`` proves both end in the same schema.

Everything here runs on the caller's connection and, when it has one, in the caller's
transaction: a host application's own alembic revision can install or upgrade assetq as one
of its steps (:mod:`assetq.alembic`). The same steps render as SQL text without a database
(:func:`write_sql`: ``assetq sql``, ``alembic upgrade --sql``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import threading
from collections.abc import Iterator
from importlib import resources
from typing import Literal, TextIO

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError

from . import sqlfiles
from .dialects import MYSQL, POSTGRESQL, Dialect, dialect_for
from .errors import (
    AssetqError,
    MigrationFailed,
    NotInstalled,
    SchemaTooNew,
    SchemaTooOld,
    TransientError,
    UnknownRevision,
)
from .validation import check_namespace

log = logging.getLogger("assetq")

DEFAULT_NAMESPACE = "assetq"
#: alembic's version table, inside the namespace. Not "alembic_version": a MySQL user with a
#: single database installs assetq into the application's database, next to its own.
VERSION_TABLE = "assetq_alembic_version"

#: alembic's ``op`` and ``context`` are process-wide proxies that each alembic command
#: installs and, when it ends, removes. Our commands run one at a time, and give back the
#: proxies they found (a host application's own migration is usually running them).
_ALEMBIC_LOCK = threading.RLock()

Direction = Literal["up", "down"]


# -- revisions ------------------------------------------------------------------------------


@functools.cache
def _script() -> ScriptDirectory:
    return ScriptDirectory(str(resources.files("assetq.migrations")))


@functools.cache
def revisions() -> tuple[str, ...]:
    """Every revision this package knows, oldest first."""
    return tuple(reversed([s.revision for s in _script().walk_revisions()]))


def head_revision() -> str:
    """The newest revision this package knows."""
    head = _script().get_current_head()
    assert head is not None
    return head


def resolve_revision(revision: str | None) -> str | None:
    """The full id of ``revision``: ``"head"``, a full id, or an unambiguous start of one
    (``"0005"``); None for ``"base"`` (nothing installed). UnknownRevision otherwise."""
    if revision is None or revision == "base":
        return None
    if revision == "head":
        return head_revision()
    known = revisions()
    if revision in known:
        return revision
    matches = [r for r in known if r.startswith(revision)]
    if len(matches) == 1:
        return matches[0]
    raise UnknownRevision(
        f"unknown assetq schema revision {revision!r}: this package knows"
        f" {', '.join(known)} (or 'head', 'base')"
    )


def _position(revision: str | None) -> int:
    """-1 for base, else the revision's place in the history."""
    return -1 if revision is None else revisions().index(revision)


def _require_known(revision: str | None, namespace: str) -> None:
    if revision is not None and revision not in revisions():
        raise SchemaTooNew(
            f"namespace {namespace!r} holds assetq schema {revision}, which this package"
            f" (newest schema {head_revision()}) does not know: a newer assetq installed it."
            " Run that newer assetq (pip install -U assetq); this package never changes a"
            " newer schema"
        )


def table_names() -> frozenset[str]:
    """The tables assetq creates, on either engine, and its version table."""
    names = {VERSION_TABLE}
    for engine in (POSTGRESQL.name, MYSQL.name):
        found = re.findall(
            r"CREATE TABLE (?:IF NOT EXISTS )?\{\{ns\}\}\.(\w+)",
            sqlfiles.read(engine, "schema.sql"),
        )
        names.update(found)
    return frozenset(names)


# -- alembic plumbing -----------------------------------------------------------------------


def _config(
    conn: Connection | None,
    namespace: str,
    *,
    dialect_name: str | None = None,
    output: TextIO | None = None,
) -> Config:
    cfg = Config(output_buffer=output)
    cfg.set_main_option("script_location", str(resources.files("assetq.migrations")))
    cfg.attributes["connection"] = conn
    cfg.attributes["namespace"] = namespace
    cfg.attributes["dialect_name"] = dialect_name or (conn.dialect.name if conn else None)
    return cfg


@contextlib.contextmanager
def _alembic_command() -> Iterator[None]:
    """Run one of our alembic commands without disturbing the caller's.

    An alembic command installs ``alembic.op`` and ``alembic.context`` for its env.py and
    revision files and removes them when it ends, whether or not a host application's own
    command had them installed: every ``op.*`` of a host revision after an assetq step then
    failed (``'NoneType' object has no attribute 'add_column'``, ``KeyError: 'config'``).
    The two modules' names are put back as they were.
    """
    from alembic import context as context_module
    from alembic import op as op_module

    modules = (op_module, context_module)
    with _ALEMBIC_LOCK:
        saved = [dict(vars(module)) for module in modules]
        try:
            yield
        finally:
            for module, names in zip(modules, saved, strict=True):
                space = vars(module)
                for name in set(space) - set(names):
                    del space[name]
                space.update(names)


def _dialect_named(name: str) -> Dialect:
    if name == "postgresql":
        return POSTGRESQL
    if name in ("mysql", "mariadb"):
        return MYSQL
    raise AssetqError(f"assetq supports PostgreSQL and MySQL/MariaDB; this one is {name!r}")


def run_revision_script(revision: str, direction: str) -> None:
    """Execute ``<revision>.<direction>.sql`` for the engine of the running migration, or,
    in offline mode, write it, rendered, to the migration's output.

    Called from the revision files; reads the connection and namespace alembic carries.
    """
    from alembic import op

    ctx = op.get_context()
    assert ctx.config is not None
    namespace: str = ctx.config.attributes["namespace"]
    dialect = _dialect_named(ctx.dialect.name)
    script = sqlfiles.read(dialect.name, f"migrations/{revision}.{direction}.sql")
    if ctx.as_sql:
        _emit(ctx, sqlfiles.render(script, dialect.quote_ns(namespace)))
        return
    conn: Connection = ctx.config.attributes["connection"]
    log.info("assetq: %s %s in namespace %s", direction, revision, namespace)
    with _reported(conn, dialect, namespace, revision, f"{direction}grade to"):
        dialect.run_script(conn, script, namespace)


def _emit(ctx: MigrationContext, sql: str) -> None:
    ctx.impl.static_output(sql.strip())


# -- errors ---------------------------------------------------------------------------------


@contextlib.contextmanager
def _reported(
    conn: Connection, dialect: Dialect, namespace: str, revision: str | None, what: str
) -> Iterator[None]:
    """Raise the first database error of the block as MigrationFailed, with ``revision``.

    Scripts go straight to the driver (dialects.run_script), so their errors arrive as the
    driver's own exceptions; statements sent through SQLAlchemy as DBAPIError. An error
    already reported by an inner block is the first one and passes unchanged.
    """
    dbapi_error: type[Exception] = conn.dialect.loaded_dbapi.Error
    try:
        yield
    except MigrationFailed:
        raise
    except DBAPIError as exc:
        raise _failed(dialect, exc, namespace, revision, what) from exc
    except dbapi_error as exc:
        wrapped = DBAPIError.instance(None, None, exc, dbapi_error, dialect=conn.dialect)
        assert isinstance(wrapped, DBAPIError)  # a driver error always wraps as one
        raise _failed(dialect, wrapped, namespace, revision, what) from exc


def _failed(
    dialect: Dialect, exc: DBAPIError, namespace: str, revision: str | None, what: str
) -> MigrationFailed:
    translated = dialect.translate(exc)
    message = " ".join(str(translated).split())  # one line: the CLI prints it as one
    transient = isinstance(translated, TransientError)
    advice = " (transient: run the same install or upgrade again)" if transient else ""
    return MigrationFailed(
        f"{what} assetq schema {revision or 'base'} in namespace {namespace!r} failed:"
        f" {message}{advice}",
        code=translated.code,
        revision=revision,
        transient=transient,
    )


# -- locks and small queries ----------------------------------------------------------------


def _scalar(dialect: Dialect, conn: Connection, name: str, namespace: str) -> int:
    rows = dialect.execute(conn, name, namespace, {"namespace": namespace})
    return int(rows[0][0])


def _lock(conn: Connection, dialect: Dialect, namespace: str) -> None:
    # Lock before creating the namespace: two installers racing on CREATE SCHEMA IF NOT
    # EXISTS can both pass the "not exists" check and one then fails on the catalog's index.
    rows = dialect.execute(conn, "lock_namespace", namespace, {"namespace": namespace})
    if not rows or rows[0][0] != 1:
        raise AssetqError(
            f"timed out waiting for another install or uninstall of namespace {namespace!r};"
            " try again when it has finished"
        )


def _release(conn: Connection, dialect: Dialect, namespace: str) -> None:
    # PostgreSQL's lock ends with the transaction. MySQL's is a named lock that outlives it
    # (every DDL statement commits on its own, so only a session lock can cover an install)
    # and must be released, or the pooled connection would keep it.
    dialect.execute(conn, "unlock_namespace", namespace, {"namespace": namespace})


@contextlib.contextmanager
def _locked(conn: Connection, dialect: Dialect, namespace: str) -> Iterator[None]:
    _lock(conn, dialect, namespace)
    try:
        yield
    except BaseException:
        # After an error on PostgreSQL the transaction is aborted, and the release (a no-op
        # there) would fail with "current transaction is aborted", replacing the real error.
        # On MySQL the connection is still usable and the named lock must go.
        try:
            _release(conn, dialect, namespace)
        except Exception as exc:  # the first error is the one to report
            log.debug("assetq: releasing the namespace lock after an error: %s", exc)
        raise
    else:
        _release(conn, dialect, namespace)


def current_revision(conn: Connection, namespace: str = DEFAULT_NAMESPACE) -> str | None:
    """The revision installed in ``namespace``, or None when assetq is not installed there."""
    namespace = check_namespace(namespace)
    dialect = dialect_for(conn)
    if not _scalar(dialect, conn, "version_table_exists", namespace):
        return None
    ctx = MigrationContext.configure(
        conn, opts={"version_table": VERSION_TABLE, "version_table_schema": namespace}
    )
    return ctx.get_current_revision()


# -- online: install, upgrade, downgrade, uninstall -----------------------------------------


@contextlib.contextmanager
def _transaction(bind: Engine | Connection) -> Iterator[Connection]:
    """``bind``'s transaction: a new one of an Engine's connection, committed at the end; a
    Connection's own when it has one begun (the caller commits or rolls back), else a new
    one on it."""
    if isinstance(bind, Engine):
        with bind.begin() as conn:
            yield conn
    elif bind.in_transaction():
        yield bind
    else:
        with bind.begin():
            yield bind


def install(
    bind: Engine | Connection,
    namespace: str = DEFAULT_NAMESPACE,
    *,
    revision: str = "head",
    replay: bool = False,
) -> str:
    """Install assetq into ``namespace``, or upgrade it, to ``revision`` (default: this
    package's head). Returns the installed revision.

    ``bind`` is an Engine (its own transaction, committed) or a Connection: inside its
    transaction when one is open (a host application's alembic revision:
    :mod:`assetq.alembic`), which the caller commits or rolls back. Idempotent: on an
    up-to-date namespace it changes nothing. Safe to call from several processes at once (a
    per-namespace lock serializes them). On PostgreSQL it is one transaction; on MySQL a
    failed fresh install removes what it created. Never downgrades: a newer schema raises
    SchemaTooNew. ``replay=True`` builds a fresh namespace by replaying every migration
    instead of executing the schema snapshot (tests use it to prove the two agree).
    Failures raise MigrationFailed with the database's code and the revision.
    """
    namespace = check_namespace(namespace)
    target = resolve_revision(revision)
    if target is None:
        raise UnknownRevision("install to 'base' installs nothing: use uninstall")
    with _transaction(bind) as conn:
        installed = migrate_connection(conn, namespace, target, direction="up", replay=replay)
    assert installed is not None
    return installed


def uninstall(bind: Engine | Connection, namespace: str = DEFAULT_NAMESPACE) -> str | None:
    """Remove every assetq object from ``namespace`` (alembic downgrade to base), then the
    version table, then the namespace itself if nothing else is left in it.

    Returns the revision that was removed; None when the namespace held no assetq schema
    (nothing is done then). All events, queues and runs in the namespace are deleted.
    ``bind`` as for :func:`install`.
    """
    namespace = check_namespace(namespace)
    with _transaction(bind) as conn:
        dialect = dialect_for(conn)
        if not _scalar(dialect, conn, "namespace_exists", namespace):
            log.info("assetq: nothing to remove: namespace %s does not exist", namespace)
            return None
        before = current_revision(conn, namespace)
        migrate_connection(conn, namespace, None, direction="down")
    if before is None:
        log.info("assetq: nothing to remove: namespace %s holds no assetq schema", namespace)
    return before


def migrate_connection(
    conn: Connection,
    namespace: str,
    target: str | None,
    *,
    direction: Direction,
    replay: bool = False,
) -> str | None:
    """Move ``namespace`` to revision ``target`` (None: base, nothing of assetq) on ``conn``,
    in its current transaction. ``direction`` "up" never downgrades and "down" never
    upgrades (either raises instead). Returns the revision installed at the end."""
    dialect = dialect_for(conn)
    with _reported(conn, dialect, namespace, target, "install of"), _locked(
        conn, dialect, namespace
    ):
        existed = bool(_scalar(dialect, conn, "namespace_exists", namespace))
        current = current_revision(conn, namespace) if existed else None
        _require_known(current, namespace)
        if _position(current) > _position(target) and direction == "up":
            raise SchemaTooNew(
                f"namespace {namespace!r} holds assetq schema {current}, newer than"
                f" {target}: an upgrade never downgrades (assetq.alembic.downgrade does)"
            )
        if _position(current) < _position(target) and direction == "down":
            raise SchemaTooOld(
                f"namespace {namespace!r} holds assetq schema {current or 'nothing'}, older"
                f" than {target}: a downgrade never upgrades"
            )
        if current == target:
            return current
        if target is None:
            _remove(conn, dialect, namespace)
        elif current is None:
            _fresh_install(conn, dialect, namespace, target, existed=existed, replay=replay)
        else:
            with _alembic_command():
                cfg = _config(conn, namespace)
                if _position(current) < _position(target):
                    command.upgrade(cfg, target)
                else:
                    command.downgrade(cfg, target)
        return current_revision(conn, namespace)


def _fresh_install(
    conn: Connection,
    dialect: Dialect,
    namespace: str,
    target: str,
    *,
    existed: bool,
    replay: bool,
) -> None:
    # MySQL commits every DDL statement: what a failed install created stays unless it is
    # removed here. What was in the namespace before is never touched.
    before = None if dialect is POSTGRESQL else _objects(conn, dialect, namespace)
    try:
        dialect.execute(conn, "create_namespace", namespace)
        with _alembic_command():
            cfg = _config(conn, namespace)
            if target == head_revision() and not replay:
                log.info("assetq: installing schema %s into namespace %s", target, namespace)
                with _reported(conn, dialect, namespace, target, "install of"):
                    dialect.run_script(conn, sqlfiles.read(dialect.name, "schema.sql"), namespace)
                command.stamp(cfg, target)
            else:
                command.upgrade(cfg, target)
    except BaseException:
        if before is not None:
            _remove_created(conn, dialect, namespace, before, existed=existed)
        raise


def _objects(conn: Connection, dialect: Dialect, namespace: str) -> set[tuple[str, str]]:
    rows = dialect.execute(conn, "namespace_objects", namespace, {"namespace": namespace})
    return {(str(r.kind), str(r.name)) for r in rows}


@functools.cache
def _lifecycle_queries(engine: str) -> dict[str, str]:
    return sqlfiles.parse_queries(sqlfiles.read(engine, "lifecycle.sql"))


def _remove_created(
    conn: Connection,
    dialect: Dialect,
    namespace: str,
    before: set[tuple[str, str]],
    *,
    existed: bool,
) -> None:
    """Drop what a failed install created on MySQL (everything in the namespace that was not
    there before it started), and the namespace when the install created it."""
    queries = _lifecycle_queries(dialect.name)

    def run(name: str, object_name: str = "") -> None:
        sql = sqlfiles.render(queries[name], dialect.quote_ns(namespace))
        quoted = dialect.quote + object_name.replace(dialect.quote, dialect.quote * 2)
        conn.execute(text(sql.replace("{{name}}", quoted + dialect.quote)))

    try:
        created = _objects(conn, dialect, namespace) - before
        order = {"trigger": 0, "view": 1, "routine": 2, "table": 3}
        run("foreign_key_checks_off")
        try:
            for kind, name in sorted(created, key=lambda o: (order.get(o[0], 9), o[1])):
                if kind == "routine":
                    run("drop_procedure", name)
                    run("drop_function", name)
                else:
                    run(f"drop_{kind}", name)
        finally:
            run("foreign_key_checks_on")
        if not existed and not _scalar(dialect, conn, "namespace_object_count", namespace):
            dialect.execute(conn, "drop_namespace", namespace)
        log.info(
            "assetq: the failed install's %d objects were removed from namespace %s",
            len(created),
            namespace,
        )
    except Exception as exc:  # the install's own error is the one to report
        log.warning(
            "assetq: could not remove what the failed install created in namespace %s (%s):"
            " run `assetq uninstall` once the cause is fixed",
            namespace,
            exc,
        )


def _remove(conn: Connection, dialect: Dialect, namespace: str) -> None:
    if _scalar(dialect, conn, "version_table_exists", namespace):
        with _alembic_command():
            command.downgrade(_config(conn, namespace), "base")
        dialect.execute(conn, "drop_version_table", namespace)
    # On MySQL the count includes the connection's own database, which is never
    # dropped: a user with a single database installs assetq into it.
    left = _scalar(dialect, conn, "namespace_object_count", namespace)
    if left:
        log.warning(
            "assetq: namespace %s was left in place: it still holds %d objects that are"
            " not assetq's, or it is the connection's own database",
            namespace,
            left,
        )
    else:
        dialect.execute(conn, "drop_namespace", namespace)


def require_installed(conn: Connection, namespace: str) -> None:
    """Raise NotInstalled unless ``namespace`` holds this package's head revision
    (SchemaTooOld / SchemaTooNew when it holds another one)."""
    revision = current_revision(conn, namespace)
    if revision is None:
        raise NotInstalled(
            f"assetq is not installed in namespace {namespace!r}: run assetq.install(engine)"
            " or `assetq install`"
        )
    _require_known(revision, namespace)
    head = head_revision()
    if revision != head:
        raise SchemaTooOld(
            f"namespace {namespace!r} holds assetq schema {revision}, this package needs {head}:"
            f" run `assetq upgrade --namespace {namespace}` (or assetq.install(engine))"
        )


# -- offline: the same steps as SQL text ----------------------------------------------------


def write_sql(
    output: TextIO,
    engine: str,
    namespace: str,
    start: str | None,
    target: str | None,
    *,
    transaction: bool = True,
) -> None:
    """Write the SQL that moves ``namespace`` from revision ``start`` to ``target`` (None:
    base) to ``output``, rendered for ``engine`` ("postgresql" or "mysql"), runnable as
    written with ``psql`` or the ``mysql`` client. ``transaction``: wrap it in BEGIN/COMMIT
    on PostgreSQL (off inside a host's ``alembic upgrade --sql``, which has its own).

    A fresh install to head is the schema snapshot; anything else the revisions' scripts.
    A downgrade to base leaves the (empty) namespace in place: without a database to ask,
    it cannot know whether something else lives there.
    """
    namespace = check_namespace(namespace)
    dialect = _dialect_named(engine)
    cfg = _config(None, namespace, dialect_name=engine, output=output)
    quoted = dialect.quote_ns(namespace)

    def put(sql: str) -> None:
        output.write(sql.strip() + "\n\n")

    put(
        f"-- assetq schema {start or 'base'} -> {target or 'base'} in namespace {namespace}"
        f" ({dialect.name})"
    )
    if dialect is MYSQL:
        put(_lifecycle_queries(dialect.name)["script_charset"] + ";")
    postgres_transaction = transaction and dialect is POSTGRESQL
    if postgres_transaction:
        put("BEGIN;")
    with _alembic_command():
        if _position(target) > _position(start):
            if start is None:
                put(dialect.query("create_namespace", namespace) + ";")
            if start is None and target == head_revision():
                put(sqlfiles.render(sqlfiles.read(dialect.name, "schema.sql"), quoted))
                command.stamp(cfg, target, sql=True)
            else:
                command.upgrade(cfg, f"{start}:{target}" if start else str(target), sql=True)
        elif _position(target) < _position(start):
            command.downgrade(cfg, f"{start}:{target or 'base'}", sql=True)
            if target is None:
                put(dialect.query("drop_version_table", namespace) + ";")
                put(f"-- namespace {namespace} is left in place; drop it when it is empty")
        else:
            put("-- nothing to do: start and target are the same revision")
    if postgres_transaction:
        put("COMMIT;")
