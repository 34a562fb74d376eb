"""Each routine, trigger and view is written once (I14; issue 25 items 2 and 4).

Read from the repository's files, no database: every CREATE of a function, procedure,
trigger or view is in the one file named after the object it creates, under
sql/<engine>/routines/, triggers/ or views/, and nowhere else (not in tables.sql, a table
step, an alembic revision, a named query, a test-only revision or Python); each such file
creates exactly its own object; both engines' packages name their public routines alike.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from assetq import sqlfiles

ROOT = Path(__file__).resolve().parent.parent
ENGINES = ("postgresql", "mysql")
OBJECT_FOLDERS = {"routines": "routine", "triggers": "trigger", "views": "view"}

#: A statement that creates a routine, trigger or view (names qualified or not).
CREATES = re.compile(
    r"\bCREATE\s+(?:OR\s+REPLACE\s+)?(?:DEFINER\s*=\s*\S+\s+)?(?:SQL\s+SECURITY\s+\w+\s+)?"
    r"(FUNCTION|PROCEDURE|TRIGGER|VIEW)\s+(?:IF\s+NOT\s+EXISTS\s+)?"
    r"(?:\{\{ns\}\}\.|`?\w+`?\.)?`?(\w+)",
    re.IGNORECASE,
)
#: In Python, where prose mentions statements too: only SQL, which names the namespace.
CREATES_IN_PYTHON = re.compile(
    r"\bCREATE\s+(?:OR\s+REPLACE\s+)?(?:FUNCTION|PROCEDURE|TRIGGER|VIEW)\s+\{\{ns\}\}\.",
    re.IGNORECASE,
)
KINDS = {"FUNCTION": "routine", "PROCEDURE": "routine", "TRIGGER": "trigger", "VIEW": "view"}


def _code(text: str) -> str:
    """``text`` without SQL line comments (which explain, and may quote a CREATE)."""
    return "\n".join(re.sub(r"--.*$", "", line) for line in text.splitlines())


def _sources() -> list[Path]:
    """Every file of the repository that could carry SQL the package or its migrations run."""
    found = [p for p in (ROOT / "sql").rglob("*.sql")]
    found += [p for p in (ROOT / "migrations").rglob("*.py")]
    found += [p for p in (ROOT / "python_bindings").rglob("*.py")]
    found += [p for p in (ROOT / "tests" / "revisions").rglob("*") if p.is_file()]
    return sorted(found)


def _in_object_folder(path: Path) -> tuple[str, str] | None:
    """(engine, kind) when ``path`` is sql/<engine>/<routines|triggers|views>/<name>.sql."""
    relative = path.relative_to(ROOT).parts
    if len(relative) == 4 and relative[0] == "sql" and relative[2] in OBJECT_FOLDERS:
        return relative[1], OBJECT_FOLDERS[relative[2]]
    return None


def test_no_routine_trigger_or_view_is_created_outside_its_own_file() -> None:
    """Table steps, alembic revisions, named queries and Python hold no routine DDL: a body
    exists once, in its file (a comment may name one; code may not create one)."""
    outside = []
    for path in _sources():
        if _in_object_folder(path) is not None:
            continue
        text = path.read_text("utf-8")
        pattern = CREATES if path.suffix == ".sql" else CREATES_IN_PYTHON
        for match in pattern.finditer(_code(text) if path.suffix == ".sql" else text):
            outside.append(f"{path.relative_to(ROOT)}: {match.group(0)}")
    assert outside == [], outside


@pytest.mark.parametrize("engine", ENGINES)
def test_each_object_file_creates_exactly_the_object_it_is_named_after(engine: str) -> None:
    wrong = []
    for path in sorted((ROOT / "sql" / engine).rglob("*.sql")):
        place = _in_object_folder(path)
        if place is None:
            continue
        made = [
            (KINDS[m.group(1).upper()], m.group(2))
            for m in CREATES.finditer(_code(path.read_text("utf-8")))
        ]
        if made != [(place[1], path.stem)]:
            wrong.append(f"{path.relative_to(ROOT)} creates {made}")
    assert wrong == [], wrong


@pytest.mark.parametrize("engine", ENGINES)
def test_every_object_is_defined_once(engine: str) -> None:
    """``git grep -c 'CREATE ... name'`` in one file per engine: the same, counted here."""
    seen: dict[tuple[str, str], list[str]] = {}
    for path in sorted((ROOT / "sql" / engine).rglob("*.sql")):
        for m in CREATES.finditer(_code(path.read_text("utf-8"))):
            key = (KINDS[m.group(1).upper()], m.group(2))
            seen.setdefault(key, []).append(str(path.relative_to(ROOT)))
    twice = {f"{k[0]} {k[1]}": v for k, v in seen.items() if len(v) != 1}
    assert twice == {}
    assert {(f.kind, f.name) for f in sqlfiles.object_files(engine)} == set(seen)


def test_the_public_routines_have_the_same_names_on_both_engines() -> None:
    """Every routine a named query calls exists on both engines under the same name (the
    engines' private helpers differ: PostgreSQL's LANGUAGE sql helpers, MySQL's procedures
    that stand in for functions)."""
    called = {}
    for engine in ENGINES:
        text = _code(sqlfiles.read(engine, "queries.sql"))
        called[engine] = set(re.findall(r"\{\{ns\}\}\.(\w+)\(", text)) | set(
            re.findall(r"CALL\s+\{\{ns\}\}\.(\w+)", text)
        )
        names = {f.name for f in sqlfiles.object_files(engine) if f.kind == "routine"}
        assert called[engine] <= names, called[engine] - names
    assert called["postgresql"] == called["mysql"]
