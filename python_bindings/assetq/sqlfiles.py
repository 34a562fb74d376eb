"""Loads the packaged SQL: named queries, the schema snapshot and migration scripts.

All SQL assetq sends lives in ``sql/<engine>/*.sql`` (shipped inside the wheel as
``assetq/sql``). ``queries.sql`` holds every statement the Python layer sends, each under a
``-- name --`` header followed by a one-line description; this module turns it into a name ->
SQL map. ``{{ns}}`` in any file is replaced by the engine's quoted namespace.

PostgreSQL scripts are sent whole (psycopg runs a parameterless multi-statement string).
MySQL scripts are split here, because the server accepts one statement per call and
``DELIMITER`` is a command of the mysql client, not SQL: a ``DELIMITER x`` line changes the
terminator exactly as the client would, and is never sent. The files therefore also run
unchanged through the mysql client.
"""

from __future__ import annotations

import functools
import re
from importlib import resources

_HEADER = re.compile(r"^-- ([a-z_][a-z0-9_]*) --\s*$")
_DELIMITER = re.compile(r"^DELIMITER\s+(\S+)\s*$", re.IGNORECASE)
NS_TOKEN = "{{ns}}"


@functools.cache
def read(engine: str, relpath: str) -> str:
    """The text of ``sql/<engine>/<relpath>`` from the installed package."""
    path = resources.files("assetq.sql").joinpath(engine)
    for part in relpath.split("/"):
        path = path.joinpath(part)
    return path.read_text("utf-8")


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
def queries(engine: str) -> dict[str, str]:
    """The named queries of an engine, with ``{{ns}}`` still in them."""
    return parse_queries(read(engine, "queries.sql"))


def render(sql: str, quoted_namespace: str) -> str:
    return sql.replace(NS_TOKEN, quoted_namespace)


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
