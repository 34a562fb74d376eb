"""A comparable description of everything in a namespace, per engine.

Used to prove that a fresh install and a replay of every revision, one at a time, build the
same schema, and that an uninstall leaves nothing behind.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from dbs import TestDatabase

_POSTGRES = {
    "columns": """
        SELECT table_name, column_name, ordinal_position, data_type, character_maximum_length,
               is_nullable, column_default, is_identity, identity_generation
          FROM information_schema.columns WHERE table_schema = :ns
         ORDER BY table_name, ordinal_position""",
    "constraints": """
        SELECT t.relname, c.conname, pg_get_constraintdef(c.oid)
          FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid
          JOIN pg_namespace n ON n.oid = t.relnamespace
         WHERE n.nspname = :ns ORDER BY 1, 2""",
    "indexes": """
        SELECT tablename, indexname, indexdef FROM pg_indexes
         WHERE schemaname = :ns ORDER BY 1, 2""",
    "routines": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_functiondef(p.oid)
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname = :ns ORDER BY 1, 2""",
    "triggers": """
        SELECT c.relname, t.tgname, pg_get_triggerdef(t.oid)
          FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
          JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = :ns AND NOT t.tgisinternal ORDER BY 1, 2""",
    "relations": """
        SELECT c.relname, c.relkind FROM pg_class c
          JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = :ns ORDER BY 1""",
}

_MYSQL = {
    "columns": """
        SELECT table_name, column_name, ordinal_position, column_type, is_nullable,
               column_default, extra, collation_name
          FROM information_schema.columns WHERE table_schema = :ns
         ORDER BY table_name, ordinal_position""",
    "constraints": """
        SELECT c.table_name, c.constraint_name, c.constraint_type,
               k.column_name, k.ordinal_position, k.referenced_table_name,
               k.referenced_column_name
          FROM information_schema.table_constraints c
          LEFT JOIN information_schema.key_column_usage k
            ON k.constraint_schema = c.constraint_schema
           AND k.constraint_name = c.constraint_name AND k.table_name = c.table_name
         WHERE c.constraint_schema = :ns ORDER BY 1, 2, 5""",
    "check_constraints": """
        SELECT constraint_name, check_clause FROM information_schema.check_constraints
         WHERE constraint_schema = :ns ORDER BY 1""",
    "indexes": """
        SELECT table_name, index_name, seq_in_index, column_name, non_unique
          FROM information_schema.statistics WHERE table_schema = :ns ORDER BY 1, 2, 3""",
    "foreign_keys": """
        SELECT constraint_name, table_name, referenced_table_name, update_rule, delete_rule
          FROM information_schema.referential_constraints
         WHERE constraint_schema = :ns ORDER BY 1""",
    # Routines and triggers run with the sql_mode and collations stored at their creation.
    "routines": """
        SELECT routine_name, routine_type, routine_definition, sql_data_access, security_type,
               sql_mode, character_set_client, collation_connection, database_collation
          FROM information_schema.routines WHERE routine_schema = :ns ORDER BY 1""",
    "parameters": """
        SELECT specific_name, ordinal_position, parameter_mode, parameter_name, dtd_identifier,
               collation_name
          FROM information_schema.parameters
         WHERE specific_schema = :ns ORDER BY 1, 2""",
    "triggers": """
        SELECT trigger_name, event_manipulation, event_object_table, action_timing,
               action_statement, action_order, sql_mode
          FROM information_schema.triggers WHERE trigger_schema = :ns ORDER BY 1""",
    "relations": """
        SELECT table_name, table_type FROM information_schema.tables
         WHERE table_schema = :ns ORDER BY 1""",
    "table_options": """
        SELECT table_name, engine, table_collation, create_options
          FROM information_schema.tables WHERE table_schema = :ns ORDER BY 1""",
}


def snapshot(db: TestDatabase, namespace: str | None = None) -> dict[str, list[tuple[Any, ...]]]:
    """Every object of ``namespace`` (default: the test database's), as sorted tuples."""
    queries = _POSTGRES if db.dialect.name == "postgresql" else _MYSQL
    ns = namespace or db.namespace
    quoted = db.dialect.quote_ns(ns)

    def neutral(value: Any) -> Any:
        # Routine bodies name their namespace; two namespaces are equal up to that name.
        if isinstance(value, str):
            return value.replace(quoted, "{ns}")
        return value

    with db.engine.connect() as conn:
        return {
            kind: [tuple(neutral(v) for v in row) for row in conn.execute(sa.text(sql), {"ns": ns})]
            for kind, sql in queries.items()
        }
