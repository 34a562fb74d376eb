"""Loads the packaged SQL: named queries, the tables, and one file per routine.

All SQL assetq sends lives in ``sql/<engine>/`` (shipped inside the wheel as ``assetq/sql``):
``tables.sql`` (every table and index of the 0.1.0 baseline), ``routines/<name>.sql``,
``triggers/<name>.sql`` and ``views/<name>.sql`` (each object defined once, in a file named
after it: :func:`object_files`), ``steps/<revision>.<up|down>.sql`` (table changes after the
baseline, one alembic revision each), and ``queries.sql`` with every statement the Python
layer sends, each under a ``-- name --`` header followed by a one-line description; this
module turns it into a name -> SQL map. ``{{ns}}`` in any file is replaced by the engine's
quoted namespace.

A MySQL namespace may carry a table prefix (``appdb.assetq_``: database ``appdb``, every
object named ``assetq_<name>``), so that a database that already has tables named ``dag`` or
``asset`` can hold assetq too. :func:`render` is the one place the prefix is applied: it turns
``{{ns}}.name`` into `` `appdb`.`assetq_name` ``, a bare ``{{ns}}`` into `` `appdb` ``, the name
of every foreign-key and CHECK constraint (per database in MySQL, not per table) into
``assetq_<name>`` and ``{{prefix}}`` into the prefix itself (for names that routines build at
run time and catalog queries match). Routines that build names at run time get them too:
a string literal that is the name of one of assetq's objects (the helpers' table and
constraint arguments, the routine lists of saved grants), a name after ``v_ns, '.`` in
grant_access/revoke_access, whose reader access becomes SELECT on each prefixed table instead
of the whole database. ``{{database}}`` is the database (schema) as a string literal, for
catalog queries. Without a prefix (the default) a file renders exactly as it always did:
``{{prefix}}`` is empty and none of these rules applies, so routines installed by earlier
packages keep the definitions doctor compares with.

PostgreSQL scripts are sent whole (psycopg runs a parameterless multi-statement string).
MySQL scripts are split here, because the server accepts one statement per call and
``DELIMITER`` is a command of the mysql client, not SQL: a ``DELIMITER x`` line changes the
terminator exactly as the client would, and is never sent. The files therefore also run
unchanged through the mysql client.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from importlib import resources

_HEADER = re.compile(r"^-- ([a-z_][a-z0-9_]*) --\s*$")
_DELIMITER = re.compile(r"^DELIMITER\s+(\S+)\s*$", re.IGNORECASE)
NS_TOKEN = "{{ns}}"
PREFIX_TOKEN = "{{prefix}}"
DATABASE_TOKEN = "{{database}}"
#: A quoted namespace with a table prefix, as Dialect.quote_ns spells it: `db`.`prefix`.
_PREFIXED = re.compile(r"^`(\w+)`\.`(\w+)`$")
#: ``{{ns}}`` with the name of one object after it, quoted or not.
_NS_NAME = re.compile(r"\{\{ns\}\}(?:\.`?(\w+)`?)?")
#: A named foreign-key or CHECK constraint (CREATE/ALTER TABLE), or one dropped by name.
_CONSTRAINT = re.compile(
    r"\b(CONSTRAINT\s+)`?(\w+)`?(?=\s+(?:FOREIGN|CHECK)\b)|\b(DROP\s+CONSTRAINT\s+)`?(\w+)`?",
    re.IGNORECASE,
)


@functools.cache
def read(engine: str, relpath: str) -> str:
    """The text of ``sql/<engine>/<relpath>`` from the installed package."""
    path = resources.files("assetq.sql").joinpath(engine)
    for part in relpath.split("/"):
        path = path.joinpath(part)
    return path.read_text("utf-8")


#: The kinds of object that live one per file, and their folders, in the order a fresh
#: install creates them (a trigger needs its function, a view its tables only).
OBJECT_FOLDERS = {"routine": "routines", "trigger": "triggers", "view": "views"}
_TRIGGER_TABLE = re.compile(r"\bON\s+\{\{ns\}\}\.`?(\w+)", re.IGNORECASE)


@dataclass(frozen=True)
class ObjectFile:
    """One routine, trigger or view: its file's text and the SHA-256 of that text."""

    kind: str
    name: str
    text: str
    checksum: str
    #: A trigger's table (the one after ``ON {{ns}}.``); None for the others.
    table: str | None = None

    @property
    def path(self) -> str:
        """Where it lives, relative to ``sql/<engine>/``."""
        return f"{OBJECT_FOLDERS[self.kind]}/{self.name}.sql"


@functools.cache
def object_files(engine: str) -> tuple[ObjectFile, ...]:
    """Every routine, trigger and view of ``engine``, one file each, in creation order
    (routines, then triggers, then views; by name within a kind)."""
    found: list[ObjectFile] = []
    base = resources.files("assetq.sql").joinpath(engine)
    for kind, folder in OBJECT_FOLDERS.items():
        entries = sorted(
            (e for e in base.joinpath(folder).iterdir() if e.name.endswith(".sql")),
            key=lambda e: e.name,
        )
        for entry in entries:
            text = entry.read_text("utf-8")
            table = None
            if kind == "trigger":
                match = _TRIGGER_TABLE.search(without_comments(text))
                table = match.group(1) if match else None
            found.append(
                ObjectFile(
                    kind=kind,
                    name=entry.name[: -len(".sql")],
                    text=text,
                    checksum=hashlib.sha256(text.encode("utf-8")).hexdigest(),
                    table=table,
                )
            )
    return tuple(found)


def without_comments(text: str) -> str:
    """``text`` without its comment lines (those starting with ``--``)."""
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--"))


@functools.cache
def step_names(engine: str) -> tuple[str, ...]:
    """The file names in ``sql/<engine>/steps/`` (table changes after the baseline)."""
    folder = resources.files("assetq.sql").joinpath(engine).joinpath("steps")
    if not folder.is_dir():
        return ()
    return tuple(sorted(e.name for e in folder.iterdir() if e.name.endswith(".sql")))


def schema_texts(engine: str) -> list[str]:
    """The text of every file that creates a table, routine, trigger or view of ``engine``:
    ``tables.sql``, each object file, each table step."""
    texts = [read(engine, "tables.sql")]
    texts += [f.text for f in object_files(engine)]
    texts += [read(engine, f"steps/{name}") for name in step_names(engine)]
    return texts


def parse_queries(text: str) -> dict[str, str]:
    """Parse a queries file into ``{name: sql}``.

    A query starts at a ``-- name --`` line; the comment lines right after it describe it and
    are kept out of the SQL. Duplicate names are an error, so a query cannot be shadowed.
    """
    queries: dict[str, list[str]] = {}
    current: list[str] | None = None
    in_description = False
    for line in text.splitlines():
        match = _HEADER.match(line)
        if match:
            name = match.group(1)
            if name in queries:
                raise ValueError(f"query {name!r} is defined twice")
            current = queries[name] = []
            in_description = True
            continue
        if current is None:
            continue
        if in_description and line.startswith("--"):
            continue
        in_description = False
        current.append(line)
    result = {name: "\n".join(lines).strip() for name, lines in queries.items()}
    empty = [name for name, sql in result.items() if not sql]
    if empty:
        raise ValueError(f"queries without SQL: {', '.join(empty)}")
    return result


@functools.cache
def named(engine: str, relpath: str) -> dict[str, str]:
    """The named queries of ``sql/<engine>/<relpath>`` (queries.sql, upgrades.sql,
    lifecycle.sql), parsed once, with ``{{ns}}`` still in them."""
    return parse_queries(read(engine, relpath))


def queries(engine: str) -> dict[str, str]:
    """The named queries of an engine, with ``{{ns}}`` still in them."""
    return named(engine, "queries.sql")


def split_quoted(quoted_namespace: str) -> tuple[str, str]:
    """(quoted database or schema, table prefix) of a quoted namespace; the prefix is empty
    for a namespace without one."""
    prefixed = _PREFIXED.match(quoted_namespace)
    if prefixed is None:
        return quoted_namespace, ""
    return f"`{prefixed.group(1)}`", prefixed.group(2)


#: The name of an object in dynamic SQL that a routine builds (grant_access: ``CONCAT('GRANT
#: EXECUTE ON PROCEDURE ', v_ns, '.register_event TO ', ...)``).
_DYNAMIC_NAME = re.compile(r"(\bv_ns, '\.)(\w+)")
#: A string literal, which names one of assetq's objects when its text is one of their names
#: (the tables and constraints the migration helpers alter, the routines whose grants an
#: upgrade saves and gives back).
_LITERAL = re.compile(r"'(\w+)'")
#: grant_access/revoke_access give a reader SELECT on the whole namespace (`db`.*). With a
#: table prefix the database is the application's too: every assetq table and view instead.
_READER_GRANT = re.compile(
    r"SET @assetq_grant = CONCAT\('(GRANT|REVOKE) SELECT ON ', v_ns, '\.\* (TO|FROM) ',"
    r" v_account\);\n\s*PREPARE assetq_grant FROM @assetq_grant;\n\s*EXECUTE assetq_grant;"
)
_READER_TABLES = """BEGIN
            DECLARE v_table_done BOOLEAN DEFAULT FALSE;
            DECLARE v_table VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
            DECLARE c_tables CURSOR FOR
                SELECT t.TABLE_NAME FROM information_schema.TABLES t
                 WHERE t.TABLE_SCHEMA = DATABASE()
                   AND LEFT(t.TABLE_NAME, CHAR_LENGTH('{prefix}')) = '{prefix}';
            DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_table_done = TRUE;
            OPEN c_tables;
            table_loop: LOOP
                FETCH c_tables INTO v_table;
                IF v_table_done THEN
                    LEAVE table_loop;
                END IF;
                SET @assetq_grant = CONCAT('{verb} SELECT ON ', v_ns, '.`', v_table, '` {to} ',
                                           v_account);
                PREPARE assetq_grant FROM @assetq_grant;
                EXECUTE assetq_grant;
            END LOOP;
            CLOSE c_tables;
        END;"""


@functools.cache
def _object_names() -> frozenset[str]:
    """Every name a MySQL script of this package gives an object (tables, views, routines,
    triggers, temporary tables, foreign-key and CHECK constraints)."""
    names: set[str] = set()
    for text in schema_texts("mysql"):
        names.update(m.group(1) for m in _NS_NAME.finditer(text) if m.group(1))
        names.update(m.group(2) for m in _CONSTRAINT.finditer(text) if m.group(2))
    return frozenset(names)


def render(sql: str, quoted_namespace: str) -> str:
    """``sql`` with the namespace (and its table prefix, if any) filled in."""
    database, prefix = split_quoted(quoted_namespace)
    # A validated name (lower-case letters, digits, '_'): safe inside the literal.
    sql = sql.replace(DATABASE_TOKEN, f"'{database[1:-1]}'")
    if not prefix:
        return sql.replace(NS_TOKEN, quoted_namespace).replace(PREFIX_TOKEN, "")
    names = _object_names()

    def name(match: re.Match[str]) -> str:
        return database if match.group(1) is None else f"{database}.`{prefix}{match.group(1)}`"

    def constraint(match: re.Match[str]) -> str:
        if match.group(1) is not None:
            return f"{match.group(1)}{prefix}{match.group(2)}"
        return f"{match.group(3)}{prefix}{match.group(4)}"

    def literal(match: re.Match[str]) -> str:
        return f"'{prefix}{match.group(1)}'" if match.group(1) in names else match.group(0)

    def reader(match: re.Match[str]) -> str:
        return _READER_TABLES.format(prefix=prefix, verb=match.group(1), to=match.group(2))

    sql = _READER_GRANT.sub(reader, sql)
    sql = _CONSTRAINT.sub(constraint, sql)
    sql = _DYNAMIC_NAME.sub(lambda m: f"{m.group(1)}{prefix}{m.group(2)}", sql)
    sql = _LITERAL.sub(literal, sql)
    return _NS_NAME.sub(name, sql).replace(PREFIX_TOKEN, prefix)


def split_script(text: str) -> list[str]:
    """Split a script into statements the way the mysql client does.

    The terminator is ``;`` until a ``DELIMITER x`` line changes it; a statement ends on a
    line whose last non-blank characters are the terminator. Comment-only lines outside a
    statement are dropped.
    """
    delimiter = ";"
    statements: list[str] = []
    current: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        match = _DELIMITER.match(stripped)
        if match and not current:
            delimiter = match.group(1)
            continue
        if not current and (not stripped or stripped.startswith("--")):
            continue
        if stripped.endswith(delimiter):
            current.append(line.rstrip()[: -len(delimiter)])
            statement = "\n".join(current).strip()
            if statement:
                statements.append(statement)
            current = []
        else:
            current.append(line)
    if "\n".join(current).strip():
        raise ValueError(f"script ends inside a statement (missing {delimiter!r})")
    return statements
