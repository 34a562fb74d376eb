"""The routines defend themselves: a program calling them directly with SQL (no Python
checks in front) gets a clear, typed error and the database is left unchanged."""

from __future__ import annotations

import json
from typing import Any

import pytest
import sqlalchemy as sa

import assetq
from dbs import TestDatabase

# Parameter types of each routine, for PostgreSQL's casts. MySQL procedures take the same
# parameters in the same order, and all of them (no defaults): call() passes NULL for those a
# case leaves out, as PostgreSQL's defaults would.
SIGNATURES = {
    "register_event": ("text", "jsonb", "text", "text", "text", "integer", "text"),
    "register_events": ("jsonb",),
    "declare_asset": ("text", "text", "jsonb"),
    "declare_dag": (
        "text",
        "jsonb",
        "jsonb",
        "boolean",
        "integer",
        "integer",
        "boolean",
        # The retry options of 0006_work_queue.
        "integer",
        "double precision",
        "double precision",
    ),
    "set_dag_paused": ("text", "boolean"),
    "schedule_pass": ("integer",),
}


def call(db: TestDatabase, routine: str, *args: Any) -> list[sa.Row[Any]]:
    types = SIGNATURES[routine]
    args = args + (None,) * (len(types) - len(args))
    params = {f"p{i}": value for i, value in enumerate(args)}
    if db.dialect.name == "postgresql":
        placeholders = ", ".join(f"CAST(:p{i} AS {types[i]})" for i in range(len(args)))
        sql = f"SELECT * FROM {{ns}}.{routine}({placeholders})"
    else:
        placeholders = ", ".join(f":p{i}" for i in range(len(args)))
        sql = f"CALL {{ns}}.{routine}({placeholders})"
    with db.engine.begin() as conn:
        result = conn.execute(sa.text(db.sql(sql)), params)
        return list(result.all()) if result.returns_rows else []


def _event(asset: Any = "orders", extra: Any = "{}", key: Any = None, **src: Any) -> tuple:
    return (
        "register_event",
        asset,
        extra,
        src.get("dag_id"),
        src.get("task_id"),
        src.get("run_id"),
        src.get("map_index", -1),
        key,
    )


def _batch(*items: Any) -> tuple[str, str]:
    return ("register_events", json.dumps(list(items)))


CASES: list[tuple[str, tuple[Any, ...], type[assetq.AssetqError]]] = [
    ("unknown-asset", _event(asset="nope"), assetq.UnknownAsset),
    ("null-asset", _event(asset=None), assetq.UnknownAsset),
    ("extra-array", _event(extra="[1, 2]"), assetq.InvalidArgument),
    ("extra-string", _event(extra='"text"'), assetq.InvalidArgument),
    ("extra-number", _event(extra="42"), assetq.InvalidArgument),
    ("extra-invalid-json", _event(extra="{not json"), assetq.InvalidArgument),
    ("source-dag-id-too-long", _event(dag_id="d" * 251), assetq.InvalidArgument),
    ("source-task-id-too-long", _event(task_id="t" * 251), assetq.InvalidArgument),
    ("key-too-long", _event(key="k" * 201), assetq.InvalidArgument),
    ("key-empty", _event(key=""), assetq.InvalidArgument),
    ("batch-null", ("register_events", None), assetq.InvalidArgument),
    ("batch-not-array", ("register_events", '{"asset": "orders"}'), assetq.InvalidArgument),
    ("batch-invalid-json", ("register_events", "[{"), assetq.InvalidArgument),
    ("batch-too-many", _batch(*[{"asset": "orders"}] * 10_001), assetq.InvalidArgument),
    ("batch-item-not-object", _batch({"asset": "orders"}, "orders"), assetq.InvalidArgument),
    ("batch-extra-array", _batch({"asset": "orders", "extra": [1]}), assetq.InvalidArgument),
    ("batch-unknown-asset", _batch({"asset": "orders"}, {"asset": "nope"}), assetq.UnknownAsset),
    ("batch-no-asset", _batch({"asset": "orders"}, {"extra": {}}), assetq.UnknownAsset),
    (
        "batch-key-too-long",
        _batch({"asset": "orders", "idempotency_key": "k" * 201}),
        assetq.InvalidArgument,
    ),
    ("batch-key-empty", _batch({"asset": "orders", "idempotency_key": ""}), assetq.InvalidArgument),
    (
        "batch-source-too-long",
        _batch({"asset": "orders"}, {"asset": "orders", "source_dag_id": "d" * 251}),
        assetq.InvalidArgument,
    ),
    (
        "batch-key-with-two-extras",
        _batch(
            {"asset": "orders", "idempotency_key": "k", "extra": {"a": 1}},
            {"asset": "orders", "idempotency_key": "k", "extra": {"a": 2}},
        ),
        assetq.IdempotencyConflict,
    ),
    ("asset-extra-array", ("declare_asset", "x", None, "[1]"), assetq.InvalidArgument),
    ("asset-name-empty", ("declare_asset", "", None, None), assetq.InvalidArgument),
    ("asset-name-too-long", ("declare_asset", "n" * 513, None, None), assetq.InvalidArgument),
    ("asset-uri-empty", ("declare_asset", "y", "", None), assetq.InvalidArgument),
    (
        "dag-id-bad-chars",
        ("declare_dag", "a b", '{"asset":"a"}', '[["a"]]', None),
        assetq.InvalidArgument,
    ),
    ("dag-id-empty", ("declare_dag", "", '{"asset":"a"}', '[["a"]]', None), assetq.InvalidArgument),
    (
        "dag-id-non-ascii",
        ("declare_dag", "caf\u00e9", '{"asset":"a"}', '[["a"]]', None),
        assetq.InvalidArgument,
    ),
    (
        "dag-id-too-long",
        ("declare_dag", "d" * 251, '{"asset":"a"}', '[["a"]]', None),
        assetq.InvalidArgument,
    ),
    ("clauses-empty", ("declare_dag", "c", '{"asset":"a"}', "[]", None), assetq.InvalidCondition),
    (
        "clauses-not-array",
        ("declare_dag", "c", '{"asset":"a"}', '{"a":1}', None),
        assetq.InvalidCondition,
    ),
    (
        "clause-empty",
        ("declare_dag", "c", '{"asset":"a"}', '[["a"], []]', None),
        assetq.InvalidCondition,
    ),
    (
        "clause-number",
        ("declare_dag", "c", '{"asset":"a"}', "[[1]]", None),
        assetq.InvalidCondition,
    ),
    (
        "clause-empty-name",
        ("declare_dag", "c", '{"asset":"a"}', '[[""]]', None),
        assetq.InvalidCondition,
    ),
    (
        "clause-long-name",
        ("declare_dag", "c", '{"asset":"a"}', f'[["{"n" * 513}"]]', None),
        assetq.InvalidCondition,
    ),
    ("condition-null", ("declare_dag", "c", None, '[["a"]]', None), assetq.InvalidCondition),
    # A member's name, uri or alias is a JSON string: a number or an object is not taken for
    # its text (PostgreSQL took {"name": 5} for the asset "5", MySQL refused it).
    (
        "clause-name-number",
        ("declare_dag", "c", '{"asset":"a"}', '[[{"name": 5}]]', None),
        assetq.InvalidCondition,
    ),
    (
        "clause-uri-object",
        ("declare_dag", "c", '{"asset":"a"}', '[[{"uri": {"x": "y"}}]]', None),
        assetq.InvalidCondition,
    ),
    (
        "clause-alias-null",
        ("declare_dag", "c", '{"asset":"a"}', '[[{"alias": null}]]', None),
        assetq.InvalidCondition,
    ),
    ("pause-unknown", ("set_dag_paused", "nobody", True), assetq.UnknownDag),
    ("pass-limit-zero", ("schedule_pass", 0), assetq.InvalidArgument),
    ("pass-limit-null", ("schedule_pass", None), assetq.InvalidArgument),
]


@pytest.mark.parametrize(("args", "expected"), [pytest.param(a, e, id=i) for i, a, e in CASES])
def test_direct_call_with_bad_input_is_refused_and_writes_nothing(
    db: TestDatabase, args: tuple[Any, ...], expected: type[assetq.AssetqError]
) -> None:
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "consumer", "orders")
    before = db.counts()
    with pytest.raises(sa.exc.DBAPIError) as info:
        call(db, *args)
    error = db.dialect.translate(info.value)
    assert isinstance(error, expected), f"{type(error).__name__}: {error}"
    assert error.code
    assert db.counts() == before
