"""Routines, triggers and views: each written once, re-applied by checksum, forward only.

Every routine, trigger and view lives in one file per engine (``sql/<engine>/routines/``,
``triggers/``, ``views/``: :func:`assetq.sqlfiles.object_files`). Alembic revisions never
create them. Instead, after every install, upgrade and repair that reaches this package's
head revision, :func:`sync` compares each file with what the namespace holds and re-creates
only what differs:

* the namespace's ``routine_catalogue`` table records, for each object, the SHA-256 of the
  file it was created from, the package version that created it, and the SHA-256 of the
  definition the server printed right after (``definition_checksum``);
* an object is re-created when it is missing, when its file's checksum is not the one
  recorded (a new package changed it), or when the server's definition no longer has the
  recorded checksum (someone changed it by hand: doctor reports it, repair puts it back);
* an object recorded by a newer package than this one is never touched (forward only): an
  older package that runs ``assetq install`` during a rolling deploy leaves the newer body.

PostgreSQL re-creates in place (CREATE OR REPLACE), in the caller's transaction: grants,
ownership and settings (the ALTER FUNCTION after each CREATE in its file) stay. MariaDB
replaces routines and triggers with CREATE OR REPLACE too (:func:`replaces_atomically`).
MySQL has neither: a routine is dropped and created again with its grants saved in the
namespace first and given back after (a call in between gets 1305, RoutineUnavailable, which
the API retries); a trigger is dropped and created again with its table locked for writing,
so no row is inserted without it (an INSERT meanwhile waits, then fires the new trigger).
Every MySQL/MariaDB object is created under a strict sql_mode. Giving a routine that was
missing to the roles of its kind (:func:`regrant`) is the caller's: assetq.migrate does it
once per install, upgrade or repair.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError

from . import sqlfiles
from .dialects import MYSQL, POSTGRESQL, Dialect, dialect_for
from .errors import InstallRefused
from .sqlfiles import ObjectFile

log = logging.getLogger("assetq.routines")


def package_version() -> str:
    from . import __version__

    return __version__


_VERSION = re.compile(r"^(\d+(?:\.\d+)*)(?:(a|b|rc)(\d+))?(?:\.post(\d+))?(?:\.dev(\d+))?")


def version_key(version: str) -> tuple[tuple[int, ...], int, int, int, int]:
    """An order on PEP 440 versions of the forms assetq uses (``1.2.3``, ``1.2.3rc1``,
    ``1.2.3.post1``, ``1.2.3.dev4``): pre-releases and development releases before the
    release, post-releases after. Anything unparsable sorts first (never "newer")."""
    match = _VERSION.match(version.strip())
    if match is None:
        return ((), -1, 0, 0, 0)
    release = tuple(int(p) for p in match.group(1).split("."))
    while len(release) > 1 and release[-1] == 0:
        release = release[:-1]
    pre = {"a": 0, "b": 1, "rc": 2}.get(match.group(2) or "", 3)
    pre_number = int(match.group(3) or 0)
    post = int(match.group(4)) if match.group(4) is not None else -1
    dev = int(match.group(5)) if match.group(5) is not None else 1 << 30
    if match.group(5) is not None and match.group(2) is None and match.group(4) is None:
        pre = -1  # 1.0.dev1 comes before 1.0a1
    return (release, pre, pre_number, post, dev)


def is_newer(version: str, than: str) -> bool:
    """Whether package ``version`` is newer than ``than``."""
    return version_key(version) > version_key(than)


@dataclass(frozen=True)
class Recorded:
    """A row of routine_catalogue."""

    checksum: str
    package_version: str
    definition_checksum: str | None


@dataclass(frozen=True)
class Difference:
    """An object :func:`sync` would re-create, or leave because a newer package wrote it.

    ``reason``: ``missing`` (not in the namespace), ``changed`` (its file is not the one it
    was created from: this package has another body), ``altered`` (its definition is not the
    one recorded: changed by hand), ``newer`` (recorded by a newer package: left alone),
    ``unreadable`` (MySQL: the account may not read its body, so whether it was changed by
    hand cannot be told; left alone, doctor says so)."""

    file: ObjectFile
    reason: str
    recorded_by: str | None = None

    @property
    def label(self) -> str:
        return f"{self.file.kind} {self.file.name}"


@dataclass(frozen=True)
class Definition:
    """One routine, trigger or view as the server prints it."""

    kind: str
    name: str
    definition: str
    table: str | None
    #: Whether the account could read the whole definition (MySQL hides a routine's body
    #: from accounts other than its definer that may not read mysql.proc).
    visible: bool = True

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.definition.encode("utf-8")).hexdigest()


def _sql(dialect: Dialect, name: str, namespace: str) -> str:
    sql = sqlfiles.named(dialect.name, "upgrades.sql")[name]
    return sqlfiles.render(sql, dialect.quote_ns(namespace))


def definitions(conn: Connection, namespace: str) -> dict[tuple[str, str], Definition]:
    """Every routine, trigger and view of ``namespace`` with its definition as the server
    keeps it, by (kind, name): PostgreSQL's overloads of one name (none of assetq's has
    any) are joined into one definition."""
    dialect = dialect_for(conn)
    rows = conn.execute(
        text(_sql(dialect, "definitions", namespace)), {"namespace": namespace}
    ).all()
    found: dict[tuple[str, str], list[tuple[str, str, str | None, bool]]] = {}
    for r in rows:
        full = str(r.name)
        name = full.split("(", 1)[0]
        found.setdefault((str(r.kind), name), []).append(
            (full, str(r.definition), r.owner_table, bool(r.visible))
        )
    result: dict[tuple[str, str], Definition] = {}
    for (kind, name), items in found.items():
        items.sort()
        table = items[0][2]
        result[(kind, name)] = Definition(
            kind,
            name,
            "\n".join(item[1] for item in items),
            None if table is None else str(table),
            all(item[3] for item in items),
        )
    return result


def catalogue(conn: Connection, namespace: str) -> dict[tuple[str, str], Recorded]:
    """The rows of the namespace's routine_catalogue, by (kind, name)."""
    dialect = dialect_for(conn)
    rows = conn.execute(text(_sql(dialect, "catalogue_rows", namespace))).all()
    return {
        (str(r.kind), str(r.name)): Recorded(
            str(r.checksum),
            str(r.package_version),
            None if r.definition_checksum is None else str(r.definition_checksum),
        )
        for r in rows
    }


def differences(
    conn: Connection, namespace: str, *, present: dict[tuple[str, str], Definition] | None = None
) -> list[Difference]:
    """What :func:`sync` would do in ``namespace``: each object whose file this package has
    and that is missing, changed or altered there, and each it leaves because a newer
    package recorded it. Reads only (two statements)."""
    dialect = dialect_for(conn)
    recorded = catalogue(conn, namespace)
    if present is None:
        present = definitions(conn, namespace)
    mine = package_version()
    found: list[Difference] = []
    for f in sqlfiles.object_files(dialect.name):
        key = (f.kind, f.name)
        row = recorded.get(key)
        if row is not None and is_newer(row.package_version, mine):
            found.append(Difference(f, "newer", row.package_version))
            continue
        current = present.get(key)
        if current is None:
            found.append(Difference(f, "missing"))
        elif row is None or row.checksum != f.checksum:
            found.append(Difference(f, "changed", None if row is None else row.package_version))
        elif row.definition_checksum is None:
            continue  # created offline (assetq sql): nothing printed it yet
        elif not current.visible:
            found.append(Difference(f, "unreadable", row.package_version))
        elif row.definition_checksum != current.checksum:
            found.append(Difference(f, "altered", row.package_version))
    return found


def sync(
    conn: Connection, namespace: str, *, present: dict[tuple[str, str], Definition] | None = None
) -> list[Difference]:
    """Re-create every routine, trigger and view of ``namespace`` that differs from its file
    (see the module's doc) and record it in routine_catalogue. Returns what was re-created.
    On ``conn``'s transaction (PostgreSQL: all of it commits or none; MySQL: DDL commits
    statement by statement, and a sync that stopped half-way is finished by the next).
    ``present``: the namespace's definitions when the caller has just read them."""
    dialect = dialect_for(conn)
    if present is None:
        present = definitions(conn, namespace)
    record = text(_sql(dialect, "catalogue_record", namespace))
    _complete_records(conn, namespace, present)
    todo = []
    for d in differences(conn, namespace, present=present):
        if d.reason == "unreadable":
            continue
        if d.reason == "newer":
            log.info(
                "assetq: %s in namespace %s was written by assetq %s, newer than this package"
                " (%s): left as it is",
                d.label,
                namespace,
                d.recorded_by,
                package_version(),
            )
        else:
            todo.append(d)
    if not todo:
        return []
    for d in todo:
        # Recorded before it is created, with a checksum no file has: on MySQL each DDL
        # statement commits, and an object created by a sync that stopped before recording
        # it must still count as assetq's (not an application's: migrate refuses those) and
        # be created again by the next sync.
        conn.execute(record, _row(d.file, "pending", None))
    if dialect is POSTGRESQL:
        _create_postgresql(conn, dialect, namespace, [d.file for d in todo])
    else:
        _create_mysql(conn, dialect, namespace, [d.file for d in todo], present)
    after = definitions(conn, namespace)
    for d in todo:
        made = after.get((d.file.kind, d.file.name))
        if made is not None and not made.visible:
            made = None  # never compared, rather than always "altered"
        conn.execute(record, _row(d.file, d.file.checksum, None if made is None else made))
        log.info("assetq: %s %s in namespace %s (%s)", "created", d.label, namespace, d.reason)
    return todo


def _row(f: ObjectFile, checksum: str, made: Definition | None) -> dict[str, object]:
    return {
        "kind": f.kind,
        "name": f.name,
        "checksum": checksum,
        "package_version": package_version(),
        "definition_checksum": None if made is None else made.checksum,
    }


def _complete_records(
    conn: Connection, namespace: str, present: dict[tuple[str, str], Definition]
) -> None:
    """Record the definition of each object created from this package's file without one
    (by ``assetq sql``'s offline statements, which cannot know it): from now on a change by
    hand is told from it. Nothing is re-created."""
    dialect = dialect_for(conn)
    mine = {(f.kind, f.name): f for f in sqlfiles.object_files(dialect.name)}
    complete = text(_sql(dialect, "catalogue_complete", namespace))
    for key, row in catalogue(conn, namespace).items():
        f, made = mine.get(key), present.get(key)
        if (
            f is not None
            and made is not None
            and made.visible
            and row.definition_checksum is None
            and row.checksum == f.checksum
        ):
            params = {"kind": f.kind, "name": f.name, "definition_checksum": made.checksum}
            conn.execute(complete, params)


def file_keys(engine: str) -> set[tuple[str, str]]:
    """(kind, name) of every object file of ``engine``."""
    return {(f.kind, f.name) for f in sqlfiles.object_files(engine)}


def record_foreign(conn: Connection, namespace: str, keys: Iterable[tuple[str, str]]) -> None:
    """Record objects assetq did not create from its files (a development package's) as
    assetq's, with a checksum no file has: the next sync re-creates each from its file.
    For migrate.adopt_development only."""
    dialect = dialect_for(conn)
    record = text(_sql(dialect, "catalogue_record", namespace))
    for kind, name in keys:
        conn.execute(
            record,
            {
                "kind": kind,
                "name": name,
                "checksum": "development",
                "package_version": "0.0.dev0",
                "definition_checksum": None,
            },
        )


def regrant(conn: Connection, namespace: str) -> int:
    """Give every role (MySQL: account) that holds a kind of access (grant_access) that kind
    again: after a routine that was missing is created (a newer package's, or one dropped
    by hand and repaired) or a table step ran, so that the roles of its kind reach it as
    they reach the rest (no grant to run again after an upgrade). Returns how many grants
    were given again; idempotent."""
    dialect = dialect_for(conn)
    rows = conn.execute(
        text(_sql(dialect, "granted_access", namespace)), {"namespace": namespace}
    ).all()
    for r in rows:
        params = {"access": str(r.access), "grantee": str(r.grantee), "host": r.host}
        dialect.execute(conn, "grant_access", namespace, params)
    if rows:
        log.info("assetq: gave %d kinds of access again in namespace %s", len(rows), namespace)
    return len(rows)


def _create_postgresql(
    conn: Connection, dialect: Dialect, namespace: str, files: Sequence[ObjectFile]
) -> None:
    before = conn.execute(text(_sql(dialect, "read_function_bodies", namespace))).scalar_one()
    setting = text(_sql(dialect, "set_function_bodies", namespace))
    conn.execute(setting, {"value": "off"})
    for f in files:
        dialect.run_script(conn, f.text, namespace)
    if any(f.kind == "routine" for f in files):
        conn.execute(text(_sql(dialect, "revoke_public", namespace)))
    conn.execute(setting, {"value": str(before)})


def replaces_atomically(conn: Connection) -> bool:
    """MariaDB: CREATE OR REPLACE PROCEDURE and TRIGGER replace an object in one statement.
    It waits for the transactions that use the object (its metadata lock), new callers queue
    behind it, and then every one of them runs the new body: no caller ever finds it missing,
    and its grants stay (tests/test_routines.py). MySQL 8 / 9 has neither statement."""
    return bool(getattr(conn.dialect, "is_mariadb", False))


_CREATE_OBJECT = re.compile(r"^(\s*)CREATE\s+(PROCEDURE|TRIGGER)\b", re.IGNORECASE)


def _create_mysql(
    conn: Connection,
    dialect: Dialect,
    namespace: str,
    files: Sequence[ObjectFile],
    present: dict[tuple[str, str], Definition],
) -> None:
    """Routines first (a trigger may call one), then triggers, then views (files' order).

    MariaDB: each replaced in one statement (:func:`replaces_atomically`). MySQL: a routine
    is dropped and created again, its grants kept in the namespace meanwhile (a call in
    between gets 1305, RoutineUnavailable: transient, retried by the API's own
    transactions); a trigger is dropped and created again with its table locked for writing,
    so no row is inserted without it. A routine the fan-out trigger calls (partition_fan_out,
    partition_map) cannot be swapped under that lock (MySQL refuses DROP PROCEDURE under
    LOCK TABLES, error 1192): a producer between its DROP and CREATE fails with 1305 and is
    retried like any caller."""
    atomic = replaces_atomically(conn)
    replaced = [f for f in files if f.kind == "routine" and (f.kind, f.name) in present]
    if not atomic and (replaced or grants_kept(conn, dialect, namespace)):
        _save_grants(conn, dialect, namespace, replaced)
    mode = conn.execute(text(_sql(dialect, "read_sql_mode", namespace))).scalar()
    set_mode = text(_sql(dialect, "set_sql_mode", namespace))
    try:
        conn.execute(text(_sql(dialect, "strict_sql_mode", namespace)))
        for f in files:
            statements = sqlfiles.split_script(sqlfiles.render(f.text, dialect.quote_ns(namespace)))
            if atomic:
                statements = [
                    _CREATE_OBJECT.sub(r"\1CREATE OR REPLACE \2", s, count=1)
                    for s in statements
                    if not re.match(r"\s*DROP\s", s, re.IGNORECASE)
                ]
            elif f.kind == "trigger" and (f.kind, f.name) in present and f.table is not None:
                statements = [
                    _named(dialect, "repair_lock_table", namespace, table=_quoted(f.table)),
                    *statements,
                    _sql(dialect, "unlock_tables", namespace),
                ]
            dialect.run_statements(conn, statements)
    finally:
        try:
            conn.execute(set_mode, {"sql_mode": mode})
        except Exception as exc:  # a lost connection: the first error is the one to report
            log.debug("assetq: putting the sql_mode back: %s", exc)
    restore_grants(conn, dialect, namespace)


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _named(dialect: Dialect, query: str, namespace: str, **parts: str) -> str:
    """Query ``query`` of upgrades.sql with ``{{part}}`` placeholders filled in (names quoted
    here), rendered after: ``{{ns}}.`name``` then carries a table prefix (MySQL)."""
    sql = sqlfiles.named(dialect.name, "upgrades.sql")[query]
    for key, value in parts.items():
        sql = sql.replace("{{" + key + "}}", value)
    return sqlfiles.render(sql, dialect.quote_ns(namespace))


def _save_grants(
    conn: Connection, dialect: Dialect, namespace: str, routines: Iterable[ObjectFile]
) -> None:
    """MySQL: keep the grants of ``routines`` in the namespace before they are dropped
    (DROP PROCEDURE revokes them); an account that may not read mysql.procs_priv and
    mysql.user (which tells the accounts that still exist) is refused (AQ124) before anything
    changes."""
    names = [f.name for f in routines]
    kept = grants_kept(conn, dialect, namespace)  # by an interrupted sync: stay
    conn.execute(text(_sql(dialect, "repair_grants_table", namespace)))
    save = text(_sql(dialect, "repair_save_grants", namespace))
    for name in names:
        try:
            conn.execute(save, {"namespace": namespace, "routine": name})
        except DBAPIError as exc:
            if dialect.error_code(exc) != "1142":
                raise
            if not kept:
                conn.execute(text(_sql(dialect, "repair_drop_grants_table", namespace)))
            raise InstallRefused(
                f"re-creating routines in namespace {namespace!r} refused, nothing was"
                " changed: the account may not read mysql.procs_priv and mysql.user, so the"
                f" grants of the routines it would drop and create again ({', '.join(names)})"
                " would be lost. Run it with an account that may (GRANT SELECT ON"
                " mysql.procs_priv, and on mysql.user), as the owner",
                code="AQ124",
            ) from exc


def grants_kept(conn: Connection, dialect: Dialect, namespace: str) -> bool:
    """MySQL: whether the namespace holds grants a sync saved and has not given back yet."""
    if dialect is not MYSQL:
        return False
    exists = text(_sql(dialect, "repair_grants_table_exists", namespace))
    return bool(conn.execute(exists, {"namespace": namespace}).scalar())


def restore_grants(conn: Connection, dialect: Dialect, namespace: str) -> None:
    """MySQL: give back the grants a sync saved (this one's, or an interrupted one's)."""
    if not grants_kept(conn, dialect, namespace):
        return
    rows = conn.execute(
        text(_sql(dialect, "repair_grant_statements", namespace)), {"namespace": namespace}
    ).all()
    dialect.run_statements(conn, [str(r.statement) for r in rows])
    conn.execute(text(_sql(dialect, "repair_drop_grants_table", namespace)))
    if rows:
        log.info("assetq: gave back %d routine grants in namespace %s", len(rows), namespace)


def offline_statements(engine: str, namespace: str) -> list[str]:
    """The SQL text :func:`sync` would send to create every object of ``engine`` in a
    namespace that has none of them, for ``assetq sql`` and ``alembic upgrade --sql``: each
    file rendered, the PostgreSQL REVOKE, and a routine_catalogue row per object (its
    definition checksum left NULL: nothing printed it yet; the next sync online records it
    without re-creating anything)."""
    dialect = POSTGRESQL if engine == "postgresql" else MYSQL
    quoted = dialect.quote_ns(namespace)
    out: list[str] = []
    if dialect is MYSQL:
        out.append("SET @assetq_saved_sql_mode = @@SESSION.sql_mode;")
        out.append(_sql(dialect, "strict_sql_mode", namespace) + ";")
    else:
        out.append("SET LOCAL check_function_bodies = off;")
    for f in sqlfiles.object_files(engine):
        body = sqlfiles.render(f.text, quoted).strip()
        if dialect is MYSQL and f.kind == "trigger" and f.table is not None:
            # As online: no row is inserted between the DROP and the CREATE of an upgrade.
            lock = _named(dialect, "repair_lock_table", namespace, table=_quoted(f.table))
            body = f"{lock};\n{body}\n{_sql(dialect, 'unlock_tables', namespace)};"
        out.append(body)
    if dialect is POSTGRESQL:
        out.append(_sql(dialect, "revoke_public", namespace) + ";")
    else:
        out.append("SET SESSION sql_mode = @assetq_saved_sql_mode;")
    record = _sql(dialect, "catalogue_record", namespace)
    for f in sqlfiles.object_files(engine):
        values = {
            ":kind": f"'{f.kind}'",
            ":name": f"'{f.name}'",
            ":checksum": f"'{f.checksum}'",
            ":package_version": f"'{package_version()}'",
            ":definition_checksum": "NULL",
        }
        sql = record
        for key in sorted(values, key=len, reverse=True):
            sql = sql.replace(key, values[key])
        out.append(sql + ";")
    return out
