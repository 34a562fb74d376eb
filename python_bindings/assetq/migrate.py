"""Install, upgrade, downgrade and uninstall the assetq schema through alembic.

The revisions in ``assetq/migrations/versions`` only execute packaged SQL: the baseline
(``0001_baseline``, assetq 0.1.0) ``sql/<engine>/tables.sql``, every later revision a table or
data step (``sql/<engine>/steps/<revision>.<up|down>.sql``). No revision creates a routine,
trigger or view: once the schema reaches this package's head, :func:`assetq.routines.sync`
creates or re-creates each from its one file, by checksum, forward only. alembic's version
table lives inside the namespace. A fresh install and an upgrade take the same path, revision
by revision, so they end in the same schema (``tests/test_migrations.py``).

Everything here runs on the caller's connection and, when it has one, in the caller's
transaction: a host application's own alembic revision can install or upgrade assetq as one
of its steps (:mod:`assetq.alembic`). The same steps render as SQL text without a database
(:func:`write_sql`: ``assetq sql``, ``alembic upgrade --sql``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import random
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError

from . import routines, sqlfiles
from .catalogue import ADOPTABLE_REVISION as ADOPTABLE_REVISION
from .catalogue import BREAKING_REVISIONS as BREAKING_REVISIONS
from .catalogue import DEVELOPMENT_REVISIONS as DEVELOPMENT_REVISIONS
from .catalogue import Direction as Direction
from .catalogue import development_advice, position, require_known, version_locations
from .catalogue import head_revision as head_revision
from .catalogue import oldest_client as oldest_client
from .catalogue import resolve_revision as resolve_revision
from .catalogue import revisions as revisions
from .catalogue import use_revisions as use_revisions
from .dialects import MYSQL, POSTGRESQL, Dialect, dialect_for
from .errors import (
    AssetqError,
    InstallRefused,
    MigrationFailed,
    NotInstalled,
    SchemaTooNew,
    SchemaTooOld,
    TransientError,
    UnknownRevision,
)
from .handles import bind_of, connection_of, keyword_namespace
from .namespace import DEFAULT_NAMESPACE as DEFAULT_NAMESPACE
from .namespace import SchemaAdvice as SchemaAdvice
from .namespace import check_schema as check_schema
from .namespace import compat_marker as compat_marker
from .namespace import forget_checks as forget_checks
from .namespace import marked_revision, marker_text
from .namespace import read_marker as read_marker
from .namespace import schema_advice as schema_advice
from .namespace import schema_checked as schema_checked
from .namespace import upgrade_sql as _upgrade_sql
from .validation import check_namespace, split_namespace

log = logging.getLogger("assetq.migrate")

# alembic is imported where a migration runs, not with the package: a worker, a scheduler or
# any other command reads the installed revision only (current_revision), and importing
# alembic took about 0.3 s of the 0.55 s of CPU that `import assetq` took.
if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.runtime.migration import MigrationContext


@functools.cache
def _alembic_before_1_16() -> bool:
    import alembic

    return tuple(int(p) for p in re.findall(r"\d+", alembic.__version__)[:2]) < (1, 16)


#: alembic's version table, inside the namespace. Not "alembic_version": a MySQL user with a
#: single database installs assetq into the application's database, next to its own.
VERSION_TABLE = "assetq_alembic_version"


def version_table(namespace: str) -> tuple[str, str]:
    """(schema, table) of alembic's version table in ``namespace``: the table carries the
    namespace's table prefix (MySQL ``appdb.assetq_``: ``assetq_assetq_alembic_version`` in
    database ``appdb``)."""
    database, prefix = split_namespace(namespace)
    return database, prefix + VERSION_TABLE


#: alembic's ``op`` and ``context`` are process-wide proxies that each alembic command
#: installs and, when it ends, removes. Our commands run one at a time, and give back the
#: proxies they found (a host application's own migration is usually running them).
_ALEMBIC_LOCK = threading.RLock()

#: Seconds a migration statement waits for a lock before it gives up and the step is retried
#: (PostgreSQL lock_timeout; MySQL lock_wait_timeout and innodb_lock_wait_timeout, which take
#: whole seconds, so at least 1 there). While a DDL statement waits for its lock, every new
#: producer statement on that table waits behind it: this bounds how long (docs/operations.md,
#: "Upgrading").
DEFAULT_LOCK_TIMEOUT = 1.0
#: Attempts of one migration step that fails on a lock timeout or a deadlock.
DEFAULT_MAX_ATTEMPTS = 30
#: A lock timeout or a deadlock (PostgreSQL, MySQL/MariaDB): the step is retried.
LOCK_CODES = frozenset({"55P03", "40P01", "1205", "1213"})
#: MySQL 8+: an information_schema read skipped a table whose definition a concurrent DDL
#: statement (another installer's) is changing. The unlocked read that plans an install
#: met it on MySQL 9.7 (tests/test_migrations.py): it is read again.
_CONCURRENT_DDL_CODES = frozenset({"1684"})


def table_names() -> frozenset[str]:
    """The tables assetq creates, on either engine, and its version table."""
    names = {VERSION_TABLE, INSTALL_LOCK_TABLE}
    for engine in (POSTGRESQL.name, MYSQL.name):
        for script in sqlfiles.schema_texts(engine):
            names.update(re.findall(r"CREATE TABLE (?:IF NOT EXISTS )?\{\{ns\}\}\.(\w+)", script))
    return frozenset(names)


# -- alembic plumbing -----------------------------------------------------------------------


def _config(
    conn: Connection | None,
    namespace: str,
    *,
    dialect_name: str | None = None,
    output: TextIO | None = None,
) -> Config:
    from alembic.config import Config

    cfg = Config(output_buffer=output)
    cfg.set_main_option("script_location", str(resources.files("assetq.migrations")))
    # Separated by os.pathsep: "path_separator" since alembic 1.16, which deprecates the
    # older "version_path_separator" that alembic before it reads.
    cfg.set_main_option("path_separator", "os")
    if _alembic_before_1_16():
        cfg.set_main_option("version_path_separator", "os")
    cfg.set_main_option("version_locations", os.pathsep.join(version_locations()))
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


def run_revision_script(revision: str, direction: str, folder: str | None = None) -> None:
    """Execute the table step ``steps/<revision>.<direction>.sql`` for the engine of the
    running migration, or, in offline mode, write it, rendered, to the migration's output.
    ``folder``: where a test-only revision keeps its own scripts
    (``<folder>/<engine>/<revision>.<direction>.sql``) instead of the package's ``steps/``.

    Called from the revision files; reads the connection and namespace alembic carries.
    """
    from alembic import op

    ctx = op.get_context()
    assert ctx.config is not None
    dialect = _dialect_named(ctx.dialect.name)
    name = f"{revision}.{direction}.sql"
    if folder is None:
        script = sqlfiles.read(dialect.name, f"steps/{name}")
    else:
        script = (Path(folder) / dialect.name / name).read_text("utf-8")
    _run_or_emit(ctx, dialect, revision, direction, script)


def run_baseline(direction: str) -> None:
    """The baseline revision (0001_baseline): up, every table of ``tables.sql``; down, every
    routine, trigger and view of this package's files, then every table (``uninstall.sql``).
    """
    from alembic import op

    ctx = op.get_context()
    dialect = _dialect_named(ctx.dialect.name)
    if direction == "up":
        script = sqlfiles.read(dialect.name, "tables.sql")
    else:
        drops = []
        for f in reversed(sqlfiles.object_files(dialect.name)):
            parts = {"name": _quoted(dialect, f.name), "table": _quoted(dialect, f.table or "")}
            sql = sqlfiles.named(dialect.name, "upgrades.sql")[f"drop_{f.kind}"]
            for key, value in parts.items():
                sql = sql.replace("{{" + key + "}}", value)
            drops.append(sql + ";")
        script = "\n".join(drops) + "\n" + sqlfiles.read(dialect.name, "uninstall.sql")
    _run_or_emit(ctx, dialect, "0001_baseline", direction, script)


def _run_or_emit(
    ctx: MigrationContext, dialect: Dialect, revision: str, direction: str, script: str
) -> None:
    assert ctx.config is not None
    namespace: str = ctx.config.attributes["namespace"]
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


@dataclass
class _Held:
    """What :func:`_locked` took: on a Galera cluster also the install lock table, and
    whether taking it created the namespace (a failed install then removes it again)."""

    cluster: bool = False
    created_namespace: bool = False


@contextlib.contextmanager
def _locked(conn: Connection, dialect: Dialect, namespace: str) -> Iterator[_Held]:
    _lock(conn, dialect, namespace)
    held = _Held()
    try:
        if dialect is MYSQL and _on_galera(conn):
            held.created_namespace = _take_cluster_lock(conn, dialect, namespace)
            held.cluster = True
        yield held
    except BaseException:
        # After an error on PostgreSQL the transaction is aborted, and the release (a no-op
        # there) would fail with "current transaction is aborted", replacing the real error.
        # On MySQL the connection is still usable and the named lock must go.
        try:
            if held.cluster:
                _lifecycle(conn, dialect, "release_install_lock", namespace)
            _release(conn, dialect, namespace)
        except Exception as exc:  # the first error is the one to report
            log.debug("assetq: releasing the namespace lock after an error: %s", exc)
        raise
    else:
        if held.cluster:
            _lifecycle(conn, dialect, "release_install_lock", namespace)
        _release(conn, dialect, namespace)


#: The table whose creation is the install lock of a namespace on a Galera cluster.
INSTALL_LOCK_TABLE = "assetq_install_lock"
#: Seconds an install waits for another Galera node's install, upgrade or uninstall of the
#: same namespace (as long as GET_LOCK waits for one on the same node: lock_namespace).
CLUSTER_LOCK_WAIT = 600.0
#: Seconds between two attempts at the lock while another node holds it.
CLUSTER_LOCK_POLL = 0.2


def _on_galera(conn: Connection) -> bool:
    rows = conn.execute(text(_lifecycle_queries(MYSQL.name)["galera_on"])).all()
    return bool(rows) and str(rows[0][1]).upper() == "ON"


def _take_cluster_lock(conn: Connection, dialect: Dialect, namespace: str) -> bool:
    """Take the install lock of ``namespace`` on a Galera cluster; True when the namespace
    had to be created for it.

    GET_LOCK is per node: two installs started on two nodes both got it and ran at once
    (tests/test_deploy_galera.py). DDL is what Galera replicates in one total order (TOI),
    so the lock is the creation of a table: of any number of installers on any nodes
    exactly one creates it, the others get 1050 and try again until the holder drops it.
    Unlike GET_LOCK the table outlives an installer that was killed while it held it: the
    waiting message and the final error name the holder and say to drop the table."""
    existed = bool(_scalar(dialect, conn, "namespace_exists", namespace))
    dialect.execute(conn, "create_namespace", namespace)
    me = conn.execute(text(_lifecycle_sql(dialect, "install_lock_me", namespace))).one()
    holder = re.sub(r"[^\w .:-]", "_", f"node {me.node} connection {me.id} at {me.now}")
    take = _lifecycle_sql(dialect, "take_install_lock", namespace).replace(
        "{{holder}}", f"'{holder}'"
    )
    deadline = time.monotonic() + CLUSTER_LOCK_WAIT
    waited = False
    while True:
        try:
            conn.exec_driver_sql(take)
            if waited:
                log.info("assetq: got the install lock of namespace %s", namespace)
            return not existed
        except DBAPIError as exc:
            if dialect.error_code(exc) != "1050":
                raise
        found = conn.execute(
            text(_lifecycle_sql(dialect, "install_lock_holder", namespace)),
            {"namespace": namespace},
        ).first()
        other = str(found.holder) if found is not None else "an installer that just finished"
        drop = sqlfiles.render(
            f"DROP TABLE {sqlfiles.NS_TOKEN}.{INSTALL_LOCK_TABLE}", dialect.quote_ns(namespace)
        )
        if not waited:
            waited = True
            log.warning(
                "assetq: waiting for the install lock of namespace %s, held by %s: another"
                " install, upgrade or uninstall on a node of this Galera cluster (if none is"
                " running, %s)",
                namespace,
                other,
                drop,
            )
        if time.monotonic() > deadline:
            raise InstallRefused(
                f"timed out after {CLUSTER_LOCK_WAIT:g} s waiting for the install lock of"
                f" namespace {namespace!r} on this Galera cluster, held by {other}; nothing"
                " was done. If no install, upgrade or uninstall is running on any node (an"
                f" installer killed while it ran leaves the lock behind), run {drop} and try"
                " again",
                code="AQ123",
            )
        time.sleep(CLUSTER_LOCK_POLL)


@contextlib.contextmanager
def _lock_timeout(
    conn: Connection, dialect: Dialect, namespace: str, seconds: float | None
) -> Iterator[None]:
    """Every statement of the block waits at most ``seconds`` for a lock; the setting the
    connection had is put back afterwards (a caller's transaction goes on; a MySQL session
    goes back to a pool). Set after the namespace lock, which may wait longer: it queues
    installers, not producers."""
    if seconds is None:
        yield
        return
    read = text(_upgrade_sql(dialect, "read_lock_timeout", namespace))
    before = conn.execute(read).one()
    set_timeout = text(_upgrade_sql(dialect, "set_lock_timeout", namespace))
    if dialect is POSTGRESQL:
        wanted: dict[str, object] = {"value": f"{max(1, round(seconds * 1000))}ms"}
        saved: dict[str, object] = {"value": before.lock_timeout}
    else:
        whole = max(1, round(seconds))
        wanted = {"lock_wait_timeout": whole, "innodb_lock_wait_timeout": whole}
        saved = {
            "lock_wait_timeout": int(before.lock_wait_timeout),
            "innodb_lock_wait_timeout": int(before.innodb_lock_wait_timeout),
        }
    conn.execute(set_timeout, wanted)
    try:
        yield
    finally:
        try:
            conn.execute(set_timeout, saved)
        except Exception as exc:  # an aborted transaction: its rollback resets it anyway
            log.debug("assetq: putting the lock timeout back: %s", exc)


#: The order a producer's transaction takes assetq's tables (register_event, then the fan-out
#: trigger); every other table follows, by name.
_PRODUCER_ORDER = (
    "asset",
    "asset_alias",
    "asset_event",
    "asset_event_alias",
    "asset_alias_asset",
    "dag_schedule_asset_reference",
    "dag_condition_alias",
    "dag",
    "asset_dag_run_queue",
    "dag_partition_static_key",
    "asset_partition_queue",
)


def _lock_step_tables(conn: Connection, dialect: Dialect, namespace: str) -> None:
    """PostgreSQL: take every table of the namespace before an upgrade step's first DDL
    statement (see lock_step_tables in sql/postgresql/upgrades.sql). MySQL needs none: each
    DDL statement commits on its own and holds its metadata lock only while it runs."""
    if dialect is not POSTGRESQL:
        return
    rows = conn.execute(
        text(_upgrade_sql(dialect, "step_tables", namespace)), {"namespace": namespace}
    ).all()
    names = sorted(
        (str(r.name) for r in rows if re.fullmatch(r"\w+", str(r.name))),
        key=lambda n: (
            _PRODUCER_ORDER.index(n) if n in _PRODUCER_ORDER else len(_PRODUCER_ORDER),
            n,
        ),
    )
    if not names:
        return
    quoted = dialect.quote_ns(namespace)
    tables = ", ".join(f"{quoted}.{dialect.quote}{n}{dialect.quote}" for n in names)
    sql = _upgrade_sql(dialect, "lock_step_tables", namespace).replace("{{tables}}", tables)
    conn.execute(text(sql))


@keyword_namespace
def current_revision(conn: Connection, *, namespace: str = DEFAULT_NAMESPACE) -> str | None:
    """The revision installed in ``namespace``, or None when assetq is not installed there.
    ``conn``: a Connection or an ORM Session."""
    conn = connection_of(conn, "current_revision")
    namespace = check_namespace(namespace)
    dialect = dialect_for(conn)
    if not _scalar(dialect, conn, "version_table_exists", namespace):
        return None
    # What alembic's MigrationContext.get_current_revision() reads, without importing alembic.
    read = text(_upgrade_sql(dialect, "schema_revision", namespace))
    revisions = list(conn.execute(read).scalars())
    if len(revisions) > 1:
        raise AssetqError(
            f"assetq's version table in namespace {namespace!r} holds several revisions"
            f" ({', '.join(map(str, revisions))}); an install holds exactly one"
        )
    return str(revisions[0]) if revisions else None


# -- before anything is created (MySQL/MariaDB) ---------------------------------------------
# MySQL commits every DDL statement: an install that fails half-way has already changed the
# database. What can be known to fail, or to touch what is not assetq's, is checked first.

#: A top-level statement of a packaged script that creates or drops a named object (never a
#: temporary table: those are made inside routine bodies).
_CREATES = re.compile(
    r"CREATE\s+(?:OR\s+REPLACE\s+)?(?:ALGORITHM\s*=\s*\w+\s+)?(?:DEFINER\s*=\s*\S+\s+)?"
    r"(?:SQL\s+SECURITY\s+\w+\s+)?(TABLE|VIEW|PROCEDURE|FUNCTION|TRIGGER)\s+"
    r"(?:IF\s+NOT\s+EXISTS\s+)?\{\{ns\}\}\.`?(\w+)",
    re.IGNORECASE,
)
_DROPS = re.compile(
    r"DROP\s+(TABLE|VIEW|PROCEDURE|FUNCTION|TRIGGER)\s+(?:IF\s+EXISTS\s+)?"
    r"((?:\{\{ns\}\}\.`?\w+`?\s*,?\s*)+)",
    re.IGNORECASE,
)
#: Kinds that share one set of names in a MySQL database: tables and views; procedures and
#: functions (assetq's clean-up drops both by name); triggers.
_KIND_GROUP = {
    "table": "table",
    "view": "table",
    "procedure": "routine",
    "function": "routine",
    "routine": "routine",
    "trigger": "trigger",
}

_Object = tuple[str, str]  # (kind group, name)


@functools.cache
def _script_changes(engine: str, relpath: str) -> tuple[tuple[bool, _Object], ...]:
    """(created?, object) for every named object a packaged script creates or drops, in
    order. A script that does not exist (a revision with nothing for this engine) has none."""
    try:
        script = sqlfiles.read(engine, relpath)
    except FileNotFoundError:
        return ()
    changes: list[tuple[bool, _Object]] = []
    for statement in sqlfiles.split_script(script):
        body = sqlfiles.without_comments(statement).lstrip()
        created = _CREATES.match(body)
        if created:
            changes.append((True, (_KIND_GROUP[created.group(1).lower()], created.group(2))))
            continue
        dropped = _DROPS.match(body)
        if dropped:
            group = _KIND_GROUP[dropped.group(1).lower()]
            for name in re.findall(r"\{\{ns\}\}\.`?(\w+)", dropped.group(2)):
                changes.append((False, (group, name)))
    return tuple(changes)


def _revision_scripts(engine: str, revision: str) -> list[str]:
    """The packaged scripts of ``revision`` that create objects: the baseline's tables, a
    later revision's table step. (The object files come with the schema reaching head.)"""
    if revision == revisions()[0]:
        return ["tables.sql"]
    return [f"steps/{revision}.up.sql"]


def _catalog(engine: str, revision: str | None) -> frozenset[_Object]:
    """The named objects assetq has at ``revision`` (nothing at base): its scripts replayed
    in order."""
    have: set[_Object] = set()
    for rev in revisions()[: position(revision) + 1]:
        for script in _revision_scripts(engine, rev):
            for created, obj in _script_changes(engine, script):
                (have.add if created else have.discard)(obj)
    if revision is not None:
        have.add(("table", VERSION_TABLE))
    return frozenset(have)


def _creations(engine: str, current: str | None, target: str) -> dict[_Object, str]:
    """Every named object moving from ``current`` to ``target`` creates, with the revision
    that creates it first."""
    made: dict[_Object, str] = {}
    for rev in revisions()[position(current) + 1 : position(target) + 1]:
        for script in _revision_scripts(engine, rev):
            for created, obj in _script_changes(engine, script):
                if created:
                    made.setdefault(obj, rev)
    if target == head_revision():
        for f in sqlfiles.object_files(engine):
            for created, obj in _script_changes(engine, f.path):
                if created:
                    made.setdefault(obj, target)
    if current is None:
        made.setdefault(("table", VERSION_TABLE), target)
    return made


def _recorded(conn: Connection, namespace: str) -> set[_Object]:
    """The routines, triggers and views routine_catalogue says assetq created (or was
    creating: a sync records an object before it creates it)."""
    return {(_KIND_GROUP[kind], name) for kind, name in routines.catalogue(conn, namespace)}


def _check_binary_log(conn: Connection, dialect: Dialect, namespace: str, target: str) -> None:
    """Refuse (InstallRefused, nothing created) an install or upgrade that binary logging
    would make fail half-way (1419: no SUPER, log_bin_trust_function_creators OFF) or that
    would leave a schema no scheduler pass can use (binlog_format=STATEMENT: 1665)."""
    found = {
        str(r[0]).lower(): str(r[1]).upper()
        for r in conn.execute(text(_lifecycle_sql(dialect, "install_settings", namespace)))
    }
    if found.get("log_bin") != "ON":
        return
    problems: list[tuple[str, str]] = []
    if found.get("binlog_format") == "STATEMENT":
        problems.append(
            (
                "AQ121",
                "binary logging is on with binlog_format=STATEMENT: InnoDB refuses writes at"
                " READ COMMITTED in that format (error 1665) and every scheduler pass runs at"
                " READ COMMITTED, so nothing would ever be scheduled. Set binlog_format=ROW"
                " (or MIXED): binlog_format = ROW under [mysqld] in the server's option file"
                " and SET GLOBAL binlog_format = 'ROW' (a managed server: its parameter"
                " group), then run the install again",
            )
        )
    trusted = found.get("log_bin_trust_function_creators") == "ON"
    super_sql = text(_lifecycle_sql(dialect, "account_has_super", namespace))
    if not trusted and not conn.execute(super_sql).scalar_one():
        account = conn.execute(text(_lifecycle_sql(dialect, "current_account", namespace)))
        problems.append(
            (
                "AQ120",
                f"binary logging is on and account {account.scalar_one()} has no SUPER"
                " privilege, so the server refuses to create assetq's triggers (error"
                " 1419, after its tables). Set log_bin_trust_function_creators: SET GLOBAL"
                " log_bin_trust_function_creators = 1 and log_bin_trust_function_creators ="
                " 1 under [mysqld] in the server's option file (a managed server: its"
                " parameter group; safe with binlog_format ROW or MIXED), or install with an"
                " account that has SUPER, then run the install again",
            )
        )
    if problems:
        raise InstallRefused(
            f"install of assetq schema {target} in namespace {namespace!r} refused, nothing"
            " was created: " + "; and ".join(message for _, message in problems),
            code=problems[0][0],
            revision=target,
        )


def _check_conflicts(
    conn: Connection,
    dialect: Dialect,
    namespace: str,
    current: str | None,
    target: str,
) -> dict[_Object, str]:
    """Refuse (InstallRefused AQ122, nothing created) to move ``namespace`` from ``current``
    to ``target`` when an object it would create already exists and is not assetq's (not in
    ``current``'s schema): the schema creates its tables IF NOT EXISTS and replaces its
    routines, triggers and views, so an application's `dag_queue_status` view or
    `register_event` procedure was replaced without a word, its `dagrun_asset_event` table
    taken for assetq's (and dropped by uninstall), and its `dag` table failed the install
    half-way. Returns what the move creates.

    An upgrade that failed part-way (a lock timeout: each DDL statement commits) left some of
    its objects behind; its retry, in this process or another, must not take them for the
    application's. So an upgrade marks the schema "upgrading to <target>" before its first
    statement (:func:`_mark_upgrading`), and what the revisions up to that target create
    counts as assetq's."""
    creates = _creations(dialect.name, current, target)
    ours = set(_catalog(dialect.name, current))
    if current is not None:
        ours |= _recorded(conn, namespace)
    unfinished = _upgrading_to(conn, dialect, namespace) if current is not None else None
    if unfinished in revisions() and position(unfinished) > position(current):
        ours |= set(_creations(dialect.name, current, unfinished))
    present = {(_KIND_GROUP[kind], name): kind for kind, name in _objects(conn, dialect, namespace)}
    prefix = split_namespace(namespace)[1]  # named as the database names them
    clashes = sorted(
        (creates[obj], f"{present[obj]} {prefix}{obj[1]}")
        for obj in creates
        if obj in present and obj not in ours and obj[1] != INSTALL_LOCK_TABLE
    )
    if clashes:
        names = tuple(name for _, name in clashes)
        raise InstallRefused(
            f"install of assetq schema {target} in namespace {namespace!r} refused, nothing"
            f" was created: the namespace already holds {len(names)} objects that are not"
            f" assetq's with names assetq would create: {', '.join(names)}. Install assetq"
            " into a database of its own (the default namespace 'assetq', or --namespace"
            " NAME), or next to the application's tables with a table prefix (--namespace"
            " DATABASE.assetq_; docs/operations.md, MySQL single-database installs); objects"
            " an earlier failed assetq install left there can be dropped by hand",
            code="AQ122",
            revision=clashes[0][0],
            conflicts=names,
        )
    return creates


_UPGRADING = re.compile(r"; upgrading to (\w+)")


def _upgrading_to(conn: Connection, dialect: Dialect, namespace: str) -> str | None:
    """The target of an upgrade that started and has not finished (see _check_conflicts)."""
    found = _UPGRADING.search(marker_text(conn, namespace))
    return found.group(1) if found else None


def _mark_upgrading(
    conn: Connection, dialect: Dialect, namespace: str, current: str, target: str
) -> None:
    """Before an upgrade's first statement on MySQL: the schema's marker says it is on its way
    to ``target`` (old packages read the marker's first part only, which is unchanged; the
    marker written at the end of the upgrade drops this part)."""
    marker = f"{compat_marker(current)}; upgrading to {target}"
    assert re.fullmatch(r"[\w ;]+", marker)  # revision ids only: safe inside the literal
    conn.execute(text(_upgrade_sql(dialect, "write_compat_marker", namespace, marker)))


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


@keyword_namespace
def install(
    bind: Engine | Connection,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    revision: str = "head",
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
) -> str:
    """Install assetq into ``namespace``, or upgrade it, to ``revision`` (default: this
    package's head). Returns the installed revision.

    ``bind`` is an Engine or a Connection. Given an Engine (or a Connection without a
    transaction), an upgrade runs one transaction per revision, each statement waiting at
    most ``lock_timeout`` seconds for a lock; a revision that meets a lock timeout or a
    deadlock is rolled back and retried (logged, with backoff, up to ``max_attempts``
    times): producers never wait behind the upgrade longer than the lock timeout
    (docs/operations.md, "Upgrading"). Inside a Connection's open transaction (a host
    application's alembic revision: :mod:`assetq.alembic`) everything runs in that
    transaction, which the caller commits or rolls back, with the same lock timeout and no
    retry (MigrationFailed.transient says to run it again). Idempotent: on an up-to-date
    namespace it changes nothing. Safe to call from several processes at once (a
    per-namespace lock serializes them). On MySQL a failed fresh install removes what it
    created. Never downgrades: a newer schema raises SchemaTooNew. Once the namespace is at
    this package's head, every routine, trigger and view that differs from its file is
    re-created (:mod:`assetq.routines`), also when no revision was missing: installing a
    newer package and running ``install`` again brings its routine bodies. Failures raise
    MigrationFailed with the database's code and the revision.
    """
    bind = bind_of(bind, "install")
    namespace = check_namespace(namespace)
    target = resolve_revision(revision)
    if target is None:
        raise UnknownRevision("install to 'base' installs nothing: use uninstall")
    if isinstance(bind, Connection) and bind.in_transaction():
        installed = migrate_connection(
            bind, namespace, target, direction="up", lock_timeout=lock_timeout
        )
    else:
        installed = _install_stepwise(
            bind,
            namespace,
            target,
            lock_timeout=lock_timeout,
            max_attempts=max_attempts,
        )
    assert installed is not None
    return installed


def _install_stepwise(
    bind: Engine | Connection,
    namespace: str,
    target: str,
    *,
    lock_timeout: float,
    max_attempts: int,
) -> str | None:
    """An install or upgrade in transactions of its own: a fresh install is one step, an
    upgrade one step per revision, each retried on a lock timeout or a deadlock. One
    transaction per revision keeps each step's locks short: a step holds what it locked only
    until its own commit, not until the last revision's."""
    for attempt in range(1, max_attempts + 1):
        try:
            with _transaction(bind) as conn:
                existed = bool(_scalar(dialect_for(conn), conn, "namespace_exists", namespace))
                current = current_revision(conn, namespace=namespace) if existed else None
            break
        except DBAPIError as exc:
            if MYSQL.error_code(exc) not in _CONCURRENT_DDL_CODES or attempt == max_attempts:
                raise
            time.sleep(0.05 * attempt)
    if current is None or current not in revisions() or position(current) >= position(target):
        steps = [target]  # a fresh install, a no-op, or the refusal migrate_connection gives
    else:
        steps = list(revisions()[position(current) + 1 : position(target) + 1])
    installed: str | None = current
    for step in steps:
        for attempt in range(1, max_attempts + 1):
            try:
                with _transaction(bind) as conn:
                    installed = migrate_connection(
                        conn,
                        namespace,
                        step,
                        direction="up",
                        lock_timeout=lock_timeout,
                        past_is_done=len(steps) > 1,
                    )
                break
            except MigrationFailed as exc:
                if exc.code not in LOCK_CODES or attempt == max_attempts:
                    raise
                delay = min(2.0, 0.05 * 2**attempt) * (0.5 + random.random())
                log.warning(
                    "assetq: upgrade to %s in namespace %s, attempt %d of %d: %s %s;"
                    " retrying in %.0f ms",
                    step,
                    namespace,
                    attempt,
                    max_attempts,
                    "lock timeout" if exc.code in ("55P03", "1205") else "deadlock",
                    exc.code,
                    delay * 1000,
                )
                time.sleep(delay)
    return installed


@keyword_namespace
def uninstall(bind: Engine | Connection, *, namespace: str = DEFAULT_NAMESPACE) -> str | None:
    """Remove every assetq object from ``namespace`` (alembic downgrade to base), then the
    version table, then the namespace itself if nothing else is left in it.

    Returns the revision that was removed; None when the namespace held no assetq schema
    (nothing is done then). All events, queues and runs in the namespace are deleted.
    ``bind`` as for :func:`install`.
    """
    bind = bind_of(bind, "uninstall")
    namespace = check_namespace(namespace)
    with _transaction(bind) as conn:
        dialect = dialect_for(conn)
        if not _scalar(dialect, conn, "namespace_exists", namespace):
            log.info("assetq: nothing to remove: namespace %s does not exist", namespace)
            return None
        before = current_revision(conn, namespace=namespace)
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
    lock_timeout: float | None = DEFAULT_LOCK_TIMEOUT,
    past_is_done: bool = False,
) -> str | None:
    """Move ``namespace`` to revision ``target`` (None: base, nothing of assetq) on ``conn``,
    in its current transaction. ``direction`` "up" never downgrades and "down" never
    upgrades (either raises instead; with ``past_is_done`` an upgrade to a revision already
    passed, by a concurrent installer, does nothing). Every statement waits at most
    ``lock_timeout`` seconds for a lock (None: the server's setting). Returns the revision
    installed at the end."""
    from alembic import command

    dialect = dialect_for(conn)
    if dialect is MYSQL and direction == "up" and target is not None:
        with _reported(conn, dialect, namespace, target, "install of"):
            # Before the lock: on Galera taking it creates the namespace and a table. The
            # installed revision is read from the version table's comment (the marker), not
            # from the table: a read of the table holds its metadata lock to the end of this
            # transaction, while this installer waits for the namespace lock, and the
            # installer holding that lock deadlocked (1213) on it when it wrote the marker.
            if marked_revision(marker_text(conn, namespace)) != target:
                _check_binary_log(conn, dialect, namespace, target)
                # What was read so far must not be the snapshot read under the lock.
                _lifecycle(conn, dialect, "end_snapshot", namespace)
    with (
        _reported(conn, dialect, namespace, target, "install of"),
        _locked(conn, dialect, namespace) as held,
        _lock_timeout(conn, dialect, namespace, lock_timeout),
    ):
        existed = bool(_scalar(dialect, conn, "namespace_exists", namespace))
        current = current_revision(conn, namespace=namespace) if existed else None
        existed = existed and not held.created_namespace
        require_known(current, namespace)
        if past_is_done and direction == "up" and position(current) >= position(target):
            return current
        if position(current) > position(target) and direction == "up":
            raise SchemaTooNew(
                f"namespace {namespace!r} holds assetq schema {current}, newer than"
                f" {target}: an upgrade never downgrades (assetq.alembic.downgrade does)"
            )
        if position(current) < position(target) and direction == "down":
            raise SchemaTooOld(
                f"namespace {namespace!r} holds assetq schema {current or 'nothing'}, older"
                f" than {target}: a downgrade never upgrades"
            )
        if current == target:
            if target is not None and target == head_revision() and direction == "up":
                _sync_routines(conn, dialect, namespace, target)
                if marked_revision(marker_text(conn, namespace)) != target:  # a stamped schema
                    _write_marker(conn, dialect, namespace, target)
            return current
        creates = (
            _check_conflicts(conn, dialect, namespace, current, target)
            if dialect is MYSQL and target is not None and direction == "up"
            else {}
        )
        if target is None:
            _remove(conn, dialect, namespace)
        elif current is None:
            _fresh_install(conn, dialect, namespace, target, existed=existed, creates=creates)
        else:
            if creates and position(current) < position(target):
                _mark_upgrading(conn, dialect, namespace, current, target)
            with _alembic_command():
                cfg = _config(conn, namespace)
                if position(current) < position(target):
                    _lock_step_tables(conn, dialect, namespace)
                    command.upgrade(cfg, target)
                else:
                    command.downgrade(cfg, target)
            if target == head_revision():
                _sync_routines(conn, dialect, namespace, target, steps_ran=True)
        installed = current_revision(conn, namespace=namespace)
        if installed is not None and current is not None:  # a fresh install wrote it
            _write_marker(conn, dialect, namespace, installed)
        forget_checks(conn.engine, namespace)  # this process's next call checks again
        return installed


def _fresh_install(
    conn: Connection,
    dialect: Dialect,
    namespace: str,
    target: str,
    *,
    existed: bool,
    creates: dict[_Object, str],
) -> None:
    from alembic import command

    # MySQL commits every DDL statement: what a failed install created stays unless it is
    # removed here. What was in the namespace before is never touched, nor anything the
    # install would not create (an application's table created meanwhile).
    before = None if dialect is POSTGRESQL else _objects(conn, dialect, namespace)
    try:
        dialect.execute(conn, "create_namespace", namespace)
        log.info("assetq: installing schema %s into namespace %s", target, namespace)
        with _alembic_command():
            command.upgrade(_config(conn, namespace), target)
        if target == head_revision():
            routines.sync(conn, namespace)
        _write_marker(conn, dialect, namespace, target)
    except BaseException:
        if before is not None:
            _remove_created(conn, dialect, namespace, before, set(creates), existed=existed)
        raise


def _sync_routines(
    conn: Connection, dialect: Dialect, namespace: str, target: str, *, steps_ran: bool = False
) -> list[routines.Difference]:
    """Re-create what differs from the routine files (a namespace at this package's head);
    returns what was re-created. The roles holding a kind of access are given it again
    (routines.regrant) when a routine was missing (a newer package's new one, one dropped by
    hand), grant_access was re-created (what a kind gives may have changed) or table steps
    ran (``steps_ran``: a reader's SELECT on their new tables), once.

    MySQL: an object of the namespace with a file's name that routine_catalogue does not
    record is not assetq's (an application's procedure next to assetq's tables in its own
    database): refused (AQ122), never replaced. A trigger is dropped before it is created
    again, so binary logging that would refuse the CREATE (1419) is refused first, before
    anything is dropped."""
    if dialect is not MYSQL:
        return _synced(conn, namespace, steps_ran=steps_ran)
    present = routines.definitions(conn, namespace)
    found = routines.differences(conn, namespace, present=present)
    foreign = sorted(d.label for d in found if d.reason == "changed" and d.recorded_by is None)
    if foreign:
        prefix = split_namespace(namespace)[1]
        names = tuple(f"{label.split()[0]} {prefix}{label.split()[1]}" for label in foreign)
        raise InstallRefused(
            f"re-creating assetq's routines in namespace {namespace!r} refused, nothing was"
            f" changed: the namespace holds {len(names)} objects that are not assetq's with"
            f" names assetq would create: {', '.join(names)}. Rename or drop them, or install"
            " assetq next to the application's objects with a table prefix (--namespace"
            " DATABASE.assetq_; docs/operations.md, MySQL single-database installs)",
            code="AQ122",
            revision=target,
            conflicts=names,
        )
    if any(d.file.kind == "trigger" and d.reason not in ("newer", "unreadable") for d in found):
        _check_binary_log(conn, dialect, namespace, target)
    return _synced(conn, namespace, steps_ran=steps_ran, present=present)


def _synced(
    conn: Connection,
    namespace: str,
    *,
    steps_ran: bool,
    present: dict[tuple[str, str], routines.Definition] | None = None,
) -> list[routines.Difference]:
    done = routines.sync(conn, namespace, present=present)
    # grant_access re-created: what a kind of access gives may have changed (a routine more).
    if steps_ran or any(d.reason == "missing" or d.file.name == "grant_access" for d in done):
        routines.regrant(conn, namespace)
    return done


def _objects(conn: Connection, dialect: Dialect, namespace: str) -> set[tuple[str, str]]:
    rows = dialect.execute(conn, "namespace_objects", namespace, {"namespace": namespace})
    return {(str(r.kind), str(r.name)) for r in rows}


def _lifecycle_queries(engine: str) -> dict[str, str]:
    return sqlfiles.named(engine, "lifecycle.sql")


def _lifecycle_sql(dialect: Dialect, name: str, namespace: str) -> str:
    return sqlfiles.render(_lifecycle_queries(dialect.name)[name], dialect.quote_ns(namespace))


def _lifecycle(conn: Connection, dialect: Dialect, name: str, namespace: str) -> None:
    conn.execute(text(_lifecycle_sql(dialect, name, namespace)))


def _remove_created(
    conn: Connection,
    dialect: Dialect,
    namespace: str,
    before: set[tuple[str, str]],
    creates: set[_Object],
    *,
    existed: bool,
) -> None:
    """Drop what a failed install created on MySQL (the objects it creates that were not in
    the namespace before it started), and the namespace when the install created it."""
    queries = _lifecycle_queries(dialect.name)

    def run(name: str, object_name: str = "") -> None:
        # The name first: rendering then gives it the namespace's table prefix, as the
        # install did (_objects lists names without it).
        quoted = dialect.quote + object_name.replace(dialect.quote, dialect.quote * 2)
        sql = queries[name].replace("{{name}}", quoted + dialect.quote)
        conn.execute(text(sqlfiles.render(sql, dialect.quote_ns(namespace))))

    try:
        created = {
            (kind, name)
            for kind, name in _objects(conn, dialect, namespace) - before
            if (_KIND_GROUP.get(kind, kind), name) in creates
        }
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
    from alembic import command

    if _scalar(dialect, conn, "version_table_exists", namespace):
        with _alembic_command():
            command.downgrade(_config(conn, namespace), "base")
        dialect.execute(conn, "drop_version_table", namespace)
    if dialect is MYSQL:  # grants an interrupted repair kept, of routines now gone
        conn.execute(text(_upgrade_sql(dialect, "repair_drop_grants_table", namespace)))
    # On MySQL the count includes the connection's own database, which is never
    # dropped: a user with a single database installs assetq into it. A namespace with a
    # table prefix is the application's database: never dropped either.
    if split_namespace(namespace)[1]:
        log.info("assetq: database of namespace %s left in place (a table prefix)", namespace)
        return
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


# -- version skew: the marker an install or upgrade writes --------------------------------


def _write_marker(conn: Connection, dialect: Dialect, namespace: str, revision: str) -> None:
    marker = compat_marker(revision)
    assert re.fullmatch(r"[\w ;]+", marker)  # revision ids only: safe inside the literal
    conn.execute(text(_upgrade_sql(dialect, "write_compat_marker", namespace, marker)))


def require_installed(conn: Connection, namespace: str) -> None:
    """Raise NotInstalled unless this package works against the schema in ``namespace``
    (SchemaTooOld / SchemaTooNew, with the fix, when it holds one outside the window)."""
    revision = current_revision(conn, namespace=namespace)
    marker = read_marker(conn, namespace) if revision is not None else None
    advice = schema_advice(revision, marker, namespace)
    if advice is not None:
        raise advice.exception()


# -- offline: the same steps as SQL text ----------------------------------------------------

_OFFLINE_ROUTINES = (
    "-- Every routine, trigger and view of this package, each from its file"
    " (assetq.routines), recorded in routine_catalogue."
)


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

    The revisions' scripts, then, when ``target`` is this package's head, every routine,
    trigger and view from its file (offline there is no catalogue to compare with: all of
    them, re-runnable, recorded in routine_catalogue). A downgrade to base leaves the
    (empty) namespace in place: without a database to ask, it cannot know whether something
    else lives there.
    """
    from alembic import command

    namespace = check_namespace(namespace)
    dialect = _dialect_named(engine)
    cfg = _config(None, namespace, dialect_name=engine, output=output)

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
        if position(target) > position(start):
            if start is None:
                put(dialect.query("create_namespace", namespace) + ";")
            command.upgrade(cfg, f"{start}:{target}" if start else str(target), sql=True)
            if target == head_revision():
                put(_OFFLINE_ROUTINES)
                for statement in routines.offline_statements(dialect.name, namespace):
                    put(statement)
        elif position(target) < position(start):
            command.downgrade(cfg, f"{start}:{target or 'base'}", sql=True)
            if target is None:
                put(dialect.query("drop_version_table", namespace) + ";")
                put(f"-- namespace {namespace} is left in place; drop it when it is empty")
        else:
            put("-- nothing to do: start and target are the same revision")
    if target is not None and target != start:
        put(_upgrade_sql(dialect, "write_compat_marker", namespace, compat_marker(target)) + ";")
    if postgres_transaction:
        put("COMMIT;")


# -- repair: routines, triggers and views as their files define them -------------------------


def _quoted(dialect: Dialect, name: str) -> str:
    return dialect.quote + name.replace(dialect.quote, dialect.quote * 2) + dialect.quote


def adopt_development(bind: Engine | Connection, namespace: str = DEFAULT_NAMESPACE) -> str:
    """Make a namespace installed by a development package at ``0015_batch_lookups``, whose
    tables are the 0.1.0 baseline's, a baseline namespace, keeping its data: the routine
    catalogue is created with a row for each of its routines, triggers and views (so they
    count as assetq's), the version table says ``0001_baseline``, and every routine, trigger
    and view is re-created from this package's files (as an upgrade re-creates changed ones).
    Under the namespace lock, in one transaction on PostgreSQL. A namespace at an older
    development revision is refused (SchemaTooOld): re-install it. Returns the revision."""
    from alembic import command

    namespace = check_namespace(namespace)
    head = head_revision()
    with _transaction(bind) as conn:
        dialect = dialect_for(conn)
        with (
            _reported(conn, dialect, namespace, head, "adoption of"),
            _locked(conn, dialect, namespace),
            _lock_timeout(conn, dialect, namespace, DEFAULT_LOCK_TIMEOUT),
        ):
            current = current_revision(conn, namespace=namespace)
            if current != ADOPTABLE_REVISION:
                if current in DEVELOPMENT_REVISIONS:
                    raise SchemaTooOld(development_advice(str(current), namespace))
                raise InstallRefused(
                    f"namespace {namespace!r} holds assetq schema {current or 'nothing'}, not"
                    f" development schema {ADOPTABLE_REVISION}: there is nothing to adopt"
                    " (`assetq install` installs or upgrades)",
                    code="AQ125",
                    revision=current,
                )
            tables = sqlfiles.read(dialect.name, "tables.sql")
            found = re.search(
                r"CREATE TABLE (?:IF NOT EXISTS )?\{\{ns\}\}\.routine_catalogue \(.*?\)[^;]*;",
                tables,
                re.DOTALL,
            )
            assert found is not None  # tables.sql creates it
            dialect.run_script(conn, found.group(0), namespace)
            present = routines.definitions(conn, namespace)
            routines.record_foreign(
                conn, namespace, [k for k in present if k in routines.file_keys(dialect.name)]
            )
            conn.execute(text(_upgrade_sql(dialect, "adopt_version", namespace)))
            log.info(
                "assetq: development schema %s in namespace %s adopted as %s",
                ADOPTABLE_REVISION,
                namespace,
                revisions()[0],
            )
            if revisions()[0] != head:
                with _alembic_command():
                    command.upgrade(_config(conn, namespace), head)
            _sync_routines(conn, dialect, namespace, head)
            _write_marker(conn, dialect, namespace, head)
        forget_checks(conn.engine, namespace)
    return head


@keyword_namespace
def repair(bind: Engine | Connection, *, namespace: str = DEFAULT_NAMESPACE) -> list[str]:
    """Re-create, in place, every routine, trigger and view of ``namespace`` that is missing,
    differs from this package's file for it, or was changed by hand since a package created
    it (:func:`assetq.routines.sync`, which install and upgrade run too; an object a newer
    package wrote is left alone). Tables and their rows are untouched. Under the namespace
    lock (on Galera also the install lock table) and the lock timeout. Returns what was
    re-created ("routine name", "trigger name", ...).

    PostgreSQL: one transaction; re-created routines keep their grants and settings (CREATE
    OR REPLACE). MySQL/MariaDB, where DDL commits statement by statement: a routine is
    dropped and created again, its grants saved in the namespace before and given back after
    (an account that may not read mysql.procs_priv is refused, AQ124, before anything
    changes); a trigger is dropped and created again with its table locked for writing (an
    INSERT meanwhile waits, then fires the new trigger); a view is replaced. The repairing
    account becomes their definer, as with a fresh install by it. On MySQL an object with
    a file's name that routine_catalogue does not record is the application's: refused
    (AQ122), as by install, never replaced. A repair that stopped half-way is finished by
    running it again. A schema below this package's head is
    upgraded instead (``assetq upgrade``), which re-creates them too. ``bind`` as for
    :func:`install`."""
    bind = bind_of(bind, "repair")
    namespace = check_namespace(namespace)
    with _transaction(bind) as conn:
        dialect = dialect_for(conn)
        revision = current_revision(conn, namespace=namespace)
        require_known(revision, namespace)
        advice = schema_advice(
            revision, read_marker(conn, namespace) if revision else None, namespace
        )
        if revision is None or advice is not None:
            raise (advice.exception() if advice else NotInstalled(namespace))
        if revision != head_revision():
            raise SchemaTooNew(
                f"namespace {namespace!r} holds assetq schema {revision}, newer than this"
                f" package's {head_revision()}: repair it with the package that installed it"
            )
        with (
            _reported(conn, dialect, namespace, revision, "repair of"),
            _locked(conn, dialect, namespace),
            _lock_timeout(conn, dialect, namespace, DEFAULT_LOCK_TIMEOUT),
        ):
            done = [d.label for d in _sync_routines(conn, dialect, namespace, revision)]
            if dialect is MYSQL:  # grants an interrupted sync kept, even with nothing to do
                routines.restore_grants(conn, dialect, namespace)
    return done
