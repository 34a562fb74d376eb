"""assetq as revisions of your application's own alembic history.

In a revision file of your project::

    import assetq.alembic

    def upgrade() -> None:
        assetq.alembic.upgrade(op, "0001_baseline")

    def downgrade() -> None:
        assetq.alembic.downgrade(op, "base")

Each call runs on the migration's own connection, inside its transaction (on PostgreSQL the
assetq step commits or rolls back with the rest of the revision), pins the assetq tables at the
revision named (replaying your history next year installs the same tables at that point;
routine bodies come from the package installed, see :func:`upgrade`), leaves alembic's ``op``
and ``context`` as they were for the rest of your revision, and in offline mode (``alembic
upgrade --sql``) writes the rendered SQL into alembic's output. :func:`include_object` (and
:func:`include_name`) keep ``alembic revision --autogenerate`` away from assetq's tables.
docs/alembic.md has the complete example.

(This module is ``assetq.alembic``; ``import alembic`` anywhere still means alembic itself:
imports are absolute.)
"""

from __future__ import annotations

import weakref
from typing import Any, Protocol

from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection

from assetq import migrate
from assetq.errors import AssetqError, SchemaTooNew, SchemaTooOld
from assetq.validation import check_namespace, split_namespace

__all__ = ["downgrade", "include_name", "include_object", "upgrade"]


class Operations(Protocol):
    """What assetq needs of alembic's ``op`` (the module proxy or an Operations object)."""

    def get_context(self) -> MigrationContext: ...

    def get_bind(self) -> Connection: ...


#: Offline mode has no database to ask which assetq revision is installed: what the earlier
#: assetq steps of the same ``alembic upgrade --sql`` run wrote, per namespace.
_offline_revisions: weakref.WeakKeyDictionary[MigrationContext, dict[str, str | None]] = (
    weakref.WeakKeyDictionary()
)


def upgrade(
    op: Operations,
    revision: str,
    *,
    namespace: str = migrate.DEFAULT_NAMESPACE,
    from_revision: str | None = None,
) -> None:
    """Install assetq into ``namespace``, or upgrade it, to schema ``revision`` (a full id
    such as ``"0001_baseline"``; pin one rather than ``"head"``, which moves with the
    package), from a revision of your own alembic history.

    Online: on ``op``'s connection and transaction; does nothing when ``revision`` is
    installed; raises SchemaTooNew when a newer one is (it never downgrades) and
    MigrationFailed, with the database's code, when a step fails. Offline (``--sql``): writes
    the SQL. ``from_revision``: the assetq revision installed before this step, needed
    offline only (online the database's version table says it) and only where nothing else
    says it: a step to the first revision (``"0001_baseline"``) starts from nothing
    installed, a later step from what an earlier assetq step of the same ``--sql`` run
    wrote; a later step of a run that starts after the install needs it.

    Routine, trigger and view bodies are not pinned: once the schema reaches this package's
    head, each is created from this package's file (:mod:`assetq.routines`); a newer
    package brings its bodies through ``assetq upgrade`` or ``assetq.install(engine)``,
    never through an edit of this step.
    """
    _move(op, revision, namespace, from_revision, "up")


def downgrade(
    op: Operations,
    revision: str,
    *,
    namespace: str = migrate.DEFAULT_NAMESPACE,
    from_revision: str | None = None,
) -> None:
    """Downgrade assetq in ``namespace`` to schema ``revision``; ``"base"`` removes assetq
    (every event, queue row and run in the namespace, then the namespace if nothing else is
    in it). The counterpart of :func:`upgrade` for your revision's ``downgrade()``; the same
    rules. ``from_revision`` is needed offline (``alembic downgrade --sql``), where nothing
    says which assetq revision the database holds.
    """
    _move(op, revision, namespace, from_revision, "down")


def _move(
    op: Operations,
    revision: str,
    namespace: str,
    from_revision: str | None,
    direction: migrate.Direction,
) -> None:
    namespace = check_namespace(namespace)
    target = migrate.resolve_revision(revision)
    ctx = op.get_context()
    if not ctx.as_sql:
        migrate.migrate_connection(op.get_bind(), namespace, target, direction=direction)
        return
    written = _offline_revisions.setdefault(ctx, {})
    if from_revision is not None:
        start = migrate.resolve_revision(from_revision)
    elif namespace in written:
        start = written[namespace]
    elif direction == "up" and (target == migrate.revisions()[0] or _starts_at_base(ctx)):
        # A step that upgrades to the first revision (the baseline) is the step that
        # installs assetq: before it, nothing of assetq's is installed, whichever host
        # revision the run starts from. A run from the host's base has had no assetq step
        # before this one either.
        start = None
    else:
        verb = "upgrade" if direction == "up" else "downgrade"
        raise AssetqError(
            f"assetq.alembic.{direction}grade({revision!r}) in offline mode (alembic {verb}"
            " --sql) cannot ask the database which assetq revision namespace"
            f" {namespace!r} holds, and no earlier assetq step of this run says it: pass"
            " from_revision=<the assetq revision installed before this step>"
        )
    if direction == "up" and migrate.revision_position(start) > migrate.revision_position(target):
        raise SchemaTooNew(
            f"assetq.alembic.upgrade to {target} from {start}: an upgrade never downgrades"
        )
    if direction == "down" and migrate.revision_position(start) < migrate.revision_position(target):
        raise SchemaTooOld(
            f"assetq.alembic.downgrade to {target} from {start}: a downgrade never upgrades"
        )
    migrate.write_sql(
        ctx.impl.output_buffer,  # type: ignore[arg-type]  # set in offline mode
        ctx.dialect.name,
        namespace,
        start,
        target,
        transaction=False,
    )
    written[namespace] = target


def _starts_at_base(ctx: MigrationContext) -> bool:
    """True when the host's offline run starts at its base (``alembic upgrade head --sql``),
    so that nothing of assetq's can be installed before the first assetq step."""
    environment = ctx.environment_context
    if environment is None:
        return False
    return environment.get_starting_revision_argument() in (None, (), "base")


def include_object(
    object: Any,  # alembic's own parameter names
    name: str | None,
    type_: str,
    reflected: bool,
    compare_to: Any,
    *,
    namespace: str = migrate.DEFAULT_NAMESPACE,
) -> bool:
    """alembic's ``include_object`` hook: False for assetq's tables, so ``alembic revision
    --autogenerate`` never proposes to drop them.

    Pass it to ``context.configure(include_object=assetq.alembic.include_object)`` in your
    env.py; for another namespace, ``functools.partial(assetq.alembic.include_object,
    namespace="ns")``; with a filter of your own, ``lambda *a: assetq.alembic.include_object(*a)
    and mine(*a)``. A table found in the database and absent from your metadata is assetq's
    when it lives in the namespace (PostgreSQL with ``include_schemas=True``, MySQL with a
    separate database) or, in the default schema, has one of assetq's table names (a MySQL
    single-database install). With a table prefix (``namespace="appdb.assetq_"``) assetq's
    tables are those named with it, and only those. Tables of your metadata are always
    compared.
    """
    if type_ != "table" or not reflected or compare_to is not None:
        return True
    schema = getattr(object, "schema", None)
    database, prefix = split_namespace(check_namespace(namespace))
    if prefix:
        # MySQL, a namespace with a table prefix (appdb.assetq_): assetq's tables are the
        # prefixed ones, in that database or the default one; an unprefixed `dag` is yours.
        return not (
            schema in (None, database)
            and name is not None
            and name.startswith(prefix)
            and name[len(prefix) :] in migrate.table_names()
        )
    if schema == namespace:
        return False
    return not (schema is None and name in migrate.table_names())


def include_name(
    name: str | None,
    type_: str,
    parent_names: Any,
    *,
    namespace: str = migrate.DEFAULT_NAMESPACE,
) -> bool:
    """alembic's ``include_name`` hook: with ``include_schemas=True``, leave assetq's
    namespace out of reflection altogether (cheaper than :func:`include_object`, which is
    still needed for a MySQL single-database install)."""
    return not (type_ == "schema" and name == namespace and "." not in namespace)
