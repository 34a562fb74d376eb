"""Install, upgrade and uninstall the assetq schema through alembic.

The revisions in ``assetq/migrations/versions`` only execute packaged SQL
(``sql/<engine>/migrations/<revision>.<up|down>.sql``). alembic's version table lives inside
the namespace. A fresh install executes the schema snapshot (``sql/<engine>/schema.sql``) and
stamps the head revision, as alembic recommends for new databases; an existing install is
upgraded revision by revision. ``tests/test_migrations.py`` proves both end in the same schema.
"""

from __future__ import annotations

import logging
from importlib import resources

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine

from . import sqlfiles
from .dialects import Dialect, dialect_for
from .errors import AssetqError, NotInstalled
from .validation import check_namespace

log = logging.getLogger("assetq")

DEFAULT_NAMESPACE = "assetq"
#: alembic's version table, inside the namespace. Not "alembic_version": a MySQL user with a
#: single database installs assetq into the application's database, next to its own.
VERSION_TABLE = "assetq_alembic_version"


def _config(conn: Connection, namespace: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(resources.files("assetq.migrations")))
    cfg.attributes["connection"] = conn
    cfg.attributes["namespace"] = namespace
    return cfg


def head_revision() -> str:
    """The newest revision this package knows."""
    script = ScriptDirectory(str(resources.files("assetq.migrations")))
    head = script.get_current_head()
    assert head is not None
    return head


def run_revision_script(revision: str, direction: str) -> None:
    """Execute ``<revision>.<direction>.sql`` for the engine of the running migration.

    Called from the revision files; reads the connection and namespace alembic carries.
    """
    from alembic import op

    ctx = op.get_context()
    assert ctx.config is not None
    conn: Connection = ctx.config.attributes["connection"]
    namespace: str = ctx.config.attributes["namespace"]
    dialect = dialect_for(conn)
    script = sqlfiles.read(dialect.name, f"migrations/{revision}.{direction}.sql")
    log.info("assetq: %s %s in namespace %s", direction, revision, namespace)
    dialect.run_script(conn, script, namespace)


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


def install(engine: Engine, namespace: str = DEFAULT_NAMESPACE, *, replay: bool = False) -> str:
    """Install assetq into ``namespace``, or upgrade it to this package's head revision.

    Idempotent: on an up-to-date namespace it changes nothing. Safe to call from several
    processes at once (a per-namespace lock serializes them). On PostgreSQL the whole install
    is one transaction. ``replay=True`` builds a fresh namespace by replaying every migration
    instead of executing the schema snapshot (tests use it to prove the two agree).
    Returns the installed revision.
    """
    namespace = check_namespace(namespace)
    with engine.begin() as conn:
        dialect = dialect_for(conn)
        _lock(conn, dialect, namespace)
        try:
            dialect.execute(conn, "create_namespace", namespace)
            cfg = _config(conn, namespace)
            fresh = not _scalar(dialect, conn, "version_table_exists", namespace)
            if fresh and not replay:
                log.info(
                    "assetq: installing schema %s into namespace %s", head_revision(), namespace
                )
                dialect.run_script(conn, sqlfiles.read(dialect.name, "schema.sql"), namespace)
                command.stamp(cfg, "head")
            else:
                command.upgrade(cfg, "head")
            revision = current_revision(conn, namespace)
        finally:
            _release(conn, dialect, namespace)
    assert revision is not None
    return revision


def uninstall(engine: Engine, namespace: str = DEFAULT_NAMESPACE) -> None:
    """Remove every assetq object from ``namespace`` (alembic downgrade to base), then the
    version table, then the namespace itself if nothing else is left in it.

    Idempotent: uninstalling an absent namespace does nothing. All events, queues and runs
    in the namespace are deleted.
    """
    namespace = check_namespace(namespace)
    with engine.begin() as conn:
        dialect = dialect_for(conn)
        if not _scalar(dialect, conn, "namespace_exists", namespace):
            return
        _lock(conn, dialect, namespace)
        try:
            if _scalar(dialect, conn, "version_table_exists", namespace):
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
        finally:
            _release(conn, dialect, namespace)


def require_installed(conn: Connection, namespace: str) -> None:
    """Raise NotInstalled unless ``namespace`` holds this package's head revision."""
    revision = current_revision(conn, namespace)
    if revision is None:
        raise NotInstalled(
            f"assetq is not installed in namespace {namespace!r}: run assetq.install(engine)"
            " or `assetq install`"
        )
    head = head_revision()
    if revision != head:
        raise NotInstalled(
            f"namespace {namespace!r} holds assetq schema {revision}, this package needs {head}:"
            " run assetq.install(engine) to upgrade"
        )
