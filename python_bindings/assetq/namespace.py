"""Whether this package works against the schema in a namespace, and the namespace default.

The one thing the runtime API needs from the schema's lifecycle: every API function calls
:func:`check_schema` before its first statement (once per engine and namespace). It reads the
schema's state with the lifecycle queries of ``sql/<engine>/upgrades.sql`` and compares it
with the revision catalogue (:mod:`assetq.catalogue`); it never imports the migration runner
(:mod:`assetq.migrate`), which imports it (docs/python.md, "Layers").
"""

from __future__ import annotations

import re
import threading
import weakref
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError

from . import sqlfiles
from .catalogue import (
    DEVELOPMENT_REVISIONS,
    development_fix,
    head_revision,
    oldest_client,
    revisions,
)
from .dialects import Dialect, dialect_for
from .errors import NotInstalled, SchemaTooNew, SchemaTooOld

#: The namespace assetq lives in unless told otherwise (a PostgreSQL schema, a MySQL database).
DEFAULT_NAMESPACE = "assetq"

_MARKER = re.compile(r"works with packages from schema (\w+)")
#: The revision a marker names (compat_marker: "assetq schema <revision>; ...").
_MARKED_REVISION = re.compile(r"assetq schema (\w+)")


def upgrade_sql(dialect: Dialect, name: str, namespace: str, marker: str = "") -> str:
    """Statement ``name`` of ``sql/<engine>/upgrades.sql`` (the schema's lifecycle queries),
    for ``namespace``, with ``marker`` as its ``{{marker}}`` literal."""
    sql = sqlfiles.render(
        sqlfiles.named(dialect.name, "upgrades.sql")[name], dialect.quote_ns(namespace)
    )
    return sql.replace("{{marker}}", f"'{marker}'")


def compat_marker(revision: str) -> str:
    """The text a schema at ``revision`` carries (a comment on its version table) so that
    packages too old to know ``revision`` can tell whether they work against it."""
    return f"assetq schema {revision}; works with packages from schema {oldest_client(revision)}"


def marker_text(conn: Connection, namespace: str) -> str:
    """The version table's marker (:func:`compat_marker`), read from the catalog only;
    empty when there is no version table or no marker."""
    row = conn.execute(
        text(upgrade_sql(dialect_for(conn), "read_compat_marker", namespace)),
        {"namespace": namespace},
    ).first()
    return str(row.marker or "") if row is not None else ""


def marked_revision(marker: str) -> str | None:
    """The revision a marker names (None: no marker)."""
    found = _MARKED_REVISION.match(marker)
    return found.group(1) if found else None


def marked_clients_from(marker: str) -> str | None:
    """The oldest package revision a marker says works against its schema (None: none)."""
    found = _MARKER.search(marker)
    return found.group(1) if found else None


def read_marker(conn: Connection, namespace: str) -> str | None:
    """The oldest package revision the schema in ``namespace`` says works against it (None
    when the schema carries no marker: written before assetq wrote them)."""
    return marked_clients_from(marker_text(conn, namespace))


@dataclass(frozen=True)
class SchemaAdvice:
    """Why this package cannot run against a namespace's schema, and what to do."""

    error: type[NotInstalled]
    problem: str
    fix: str

    def exception(self) -> NotInstalled:
        return self.error(f"{self.problem}: {self.fix}")


def schema_advice(
    revision: str | None, clients_from: str | None, namespace: str
) -> SchemaAdvice | None:
    """None when this package works against schema ``revision`` (whose marker says it works
    with packages from ``clients_from``), else what is wrong and the fix.

    The window (docs/operations.md, "Upgrading"): a package works against its own head and
    against newer schemas whose marker names a revision this package is at or past (every
    revision since is additive). Against an older schema it never works: the schema goes
    first in a deploy."""
    head = head_revision()
    if revision in DEVELOPMENT_REVISIONS:
        return SchemaAdvice(
            SchemaTooOld,
            f"namespace {namespace!r} holds assetq development schema {revision}, from"
            " before 0.1.0",
            development_fix(revision, namespace) + " (CHANGELOG, 0.1.0)",
        )
    if revision is None:
        return SchemaAdvice(
            NotInstalled,
            f"assetq is not installed in namespace {namespace!r}",
            "run `assetq install` (or assetq.install(engine)) with the owner's account",
        )
    if revision == head:
        return None
    if revision in revisions():
        return SchemaAdvice(
            SchemaTooOld,
            f"namespace {namespace!r} holds assetq schema {revision}, older than this"
            f" package's {head}",
            f"upgrade the schema first: `assetq upgrade --namespace {namespace}` (or"
            " assetq.install(engine)), then restart the processes one by one",
        )
    if clients_from is not None and clients_from in revisions():
        return None  # a newer schema, additive since this package's head
    since = f" (it works with packages from schema {clients_from})" if clients_from else ""
    return SchemaAdvice(
        SchemaTooNew,
        f"namespace {namespace!r} holds assetq schema {revision}, newer than this package"
        f" (head {head}) and outside its compatibility window{since}",
        "run the newer assetq package that installed it (pip install -U assetq); never"
        " `assetq upgrade` with this one, which does not know that revision",
    )


#: The namespaces each engine's schema was found compatible in, by ``id(engine)``: the
#: engine (a weak reference: an id is reused once its engine is gone) and the namespaces.
#: Read without a lock (one dict lookup on every API call); written under the lock.
_compatible: dict[int, tuple[weakref.ref[Engine], frozenset[str]]] = {}
_compatible_lock = threading.Lock()

#: MySQL codes of a schema_state read in a namespace without assetq: no such table, no such
#: database.
_NOT_THERE = frozenset({"1146", "1049"})


def schema_checked(engine: Engine, namespace: str) -> bool:
    """Whether :func:`check_schema` already found ``namespace`` compatible on ``engine`` (a
    dict lookup): a call that skips the check must ask this first."""
    found = _compatible.get(id(engine))
    return found is not None and namespace in found[1] and found[0]() is engine


def check_schema(conn: Connection, namespace: str) -> None:
    """Raise NotInstalled, SchemaTooOld or SchemaTooNew (with the fix) unless this package
    works against the schema in ``namespace``; once per process for each engine and
    namespace. Every API function calls it before its first statement: the first call on an
    engine and namespace sends one statement more (schema_state, in the caller's transaction,
    never failing it on PostgreSQL), later ones none (a dict lookup). A schema found
    compatible stays so for the engine's life in this process (a rolling deploy upgrades only
    additively under running processes; this process's own install, upgrade or uninstall
    forgets it); one found incompatible is read again on the next call, so an upgrade that
    fixes it is seen. Thread-safe: threads whose first calls overlap each check once."""
    engine = conn.engine
    found = _compatible.get(id(engine))
    if found is not None and namespace in found[1] and found[0]() is engine:
        return
    dialect = dialect_for(conn)
    sql = text(upgrade_sql(dialect, "schema_state", namespace))
    try:
        row = conn.execute(sql, {"namespace": namespace}).first()
    except DBAPIError as exc:
        if dialect.error_code(exc) not in _NOT_THERE:
            raise dialect.translate(exc) from exc
        row = None
    revision: str | None = None
    marker = str(row.marker or "") if row is not None else ""
    if row is not None and row.installed:
        revision = row.revision or marked_revision(marker)
        if revision is None:  # no marker (an older package installed it): read the table
            read = text(upgrade_sql(dialect, "schema_revision", namespace))
            revision = conn.execute(read).scalar()
    advice = schema_advice(revision, marked_clients_from(marker), namespace)
    if advice is not None:
        raise advice.exception()
    with _compatible_lock:
        found = _compatible.get(id(engine))
        namespaces = found[1] if found is not None and found[0]() is engine else frozenset()
        _compatible[id(engine)] = (weakref.ref(engine), namespaces | {namespace})


def forget_checks(engine: Engine | None = None, namespace: str | None = None) -> None:
    """Forget what :func:`check_schema` found compatible: everything (tests), or
    ``namespace`` of ``engine`` (after this process installed, upgraded or removed it)."""
    with _compatible_lock:
        if engine is None:
            _compatible.clear()
            return
        found = _compatible.pop(id(engine), None)
        if found is not None and found[0]() is engine and namespace is not None:
            left = found[1] - {namespace}
            if left:
                _compatible[id(engine)] = (found[0], left)
