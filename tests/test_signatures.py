"""Released signatures never change (I14; issue 25 item 5).

sql/<engine>/signatures.txt lists, one per line, every routine's name and parameters (names,
modes, types, defaults) and, on PostgreSQL, its result; and every column of the view. The
packages of the compatibility window call and read exactly these, so a fresh install must
have every one of them, unchanged. A new routine, parameter or view column is a new line
(append it: the test says which); a renamed or retyped parameter is a new name
(``claim_runs_v2``), the old one kept until a contract step removes it after the window
(docs/operations.md, "Compatibility rules"). A line is removed only by such a step.

To see what a fresh install has: ``ASSETQ_PRINT_SIGNATURES=1 pytest tests/test_signatures.py
-n 0 -s`` prints it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import sqlalchemy as sa

from dbs import TestDatabase

SQL = Path(__file__).resolve().parent.parent / "sql"

SIGNATURES = {
    "postgresql": """
        SELECT 'routine ' || p.proname || '(' || pg_get_function_arguments(p.oid) || ') -> '
               || pg_get_function_result(p.oid)
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = :ns
        UNION ALL
        SELECT 'view ' || c.table_name || '.' || c.column_name || ' ' || c.data_type
          FROM information_schema.columns c JOIN information_schema.views v
            ON v.table_schema = c.table_schema AND v.table_name = c.table_name
         WHERE c.table_schema = :ns""",
    "mysql": """
        SELECT CONCAT('routine ', r.routine_name, '(', COALESCE((
                   SELECT GROUP_CONCAT(CONCAT(p.parameter_mode, ' ', p.parameter_name, ' ',
                                              p.dtd_identifier)
                                       ORDER BY p.ordinal_position SEPARATOR ', ')
                     FROM information_schema.parameters p
                    WHERE p.specific_schema = r.routine_schema
                      AND p.specific_name = r.routine_name AND p.ordinal_position > 0), ''),
               ')')
          FROM information_schema.routines r
         WHERE r.routine_schema = :ns
        UNION ALL
        SELECT CONCAT('view ', c.table_name, '.', c.column_name, ' ', c.column_type)
          FROM information_schema.columns c JOIN information_schema.views v
            ON v.table_schema = c.table_schema AND v.table_name = c.table_name
         WHERE c.table_schema = :ns""",
}


def installed(db: TestDatabase) -> set[str]:
    with db.engine.connect() as conn:
        rows = conn.execute(sa.text(SIGNATURES[db.engine_name]), {"ns": db.namespace}).all()
    return {_spelled(str(r[0])) for r in rows}


def _spelled(signature: str) -> str:
    """One spelling of a signature whatever the server: MariaDB prints integer display
    widths (int(11)) that MySQL 8.0.19+ leaves out, a JSON parameter as longtext (its
    JSON is LONGTEXT with a check), and a comment after some view columns' temporal types
    (``datetime(6) /* mariadb-5.3 */``: its on-disk format) that MySQL does not have; the
    same declaration either way."""
    signature = re.sub(r"\s*/\* mariadb-[0-9.]+ \*/", "", signature)
    signature = " ".join(signature.split())
    signature = re.sub(r"\b(tinyint|smallint|int|bigint)\(\d+\)", r"\1", signature)
    return re.sub(r"\bjson\b", "longtext", signature)


def manifest(engine: str) -> set[str]:
    lines = (SQL / engine / "signatures.txt").read_text("utf-8").splitlines()
    return {_spelled(line) for line in lines if line.strip() and not line.startswith("#")}


def test_every_released_signature_is_installed_unchanged(db: TestDatabase) -> None:
    have = installed(db)
    if os.environ.get("ASSETQ_PRINT_SIGNATURES"):
        print("\n".join(sorted(have)))
    released = manifest(db.engine_name)
    gone = sorted(released - have)
    assert not gone, (
        f"released signatures missing or changed in sql/{db.engine_name}: {gone}. A released"
        " routine keeps its name and parameters; a new signature is a new name"
        " (docs/operations.md, 'Compatibility rules')"
    )
    new = sorted(have - released)
    assert not new, (
        f"signatures not in sql/{db.engine_name}/signatures.txt: {new}. Append them (a new"
        " routine, parameter or view column), or, if one replaces a line that is gone, give it"
        " a new name instead"
    )


def test_a_renamed_parameter_fails_the_comparison(db: TestDatabase) -> None:
    """The check itself can fail: the same install with one parameter renamed by hand."""
    if db.engine_name == "postgresql":
        db.execute("DROP FUNCTION {ns}.process_gone(text)")
        db.execute(
            "CREATE FUNCTION {ns}.process_gone(p_process text) RETURNS void"
            " LANGUAGE sql AS 'SELECT 1'"
        )
    else:
        db.execute("DROP PROCEDURE {ns}.process_gone")
        db.execute("CREATE PROCEDURE {ns}.process_gone(IN p_process VARCHAR(64)) BEGIN END")
    with pytest.raises(AssertionError, match="missing or changed"):
        test_every_released_signature_is_installed_unchanged(db)
