"""Bad input gets a specific exception with a clear message, and nothing is written.

Python-side checks must also send nothing at all: a statement counter on the engine proves
the database never saw the call.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

import assetq
from assetq import ops
from dbs import TestDatabase


@pytest.fixture
def seeded(db: TestDatabase) -> Iterator[TestDatabase]:
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "consumer", ["orders", "customers"])
        assetq.register_event(conn, "orders")
    yield db


class StatementCounter:
    def __init__(self, engine: sa.Engine) -> None:
        self.count = 0
        sa.event.listen(engine, "before_cursor_execute", self._seen)

    def _seen(self, *args: Any) -> None:
        self.count += 1


def _deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels):
        value = {"x": value}
    return value


def _nested(levels: int) -> Any:
    value: Any = "a"
    for _ in range(levels):
        value = [value]
    return value


def _register(**kw: Any) -> Callable[[sa.Connection], object]:
    asset = kw.pop("asset", "orders")
    return lambda conn: assetq.register_event(conn, asset, **kw)


def _batch(events: Any) -> Callable[[sa.Connection], object]:
    return lambda conn: assetq.register_events(conn, events)


def _declare(dag_id: Any, condition: Any, **kw: Any) -> Callable[[sa.Connection], object]:
    return lambda conn: assetq.declare_dag(conn, dag_id, condition, **kw)


# (id, call, expected exception, words the message must contain)
PYTHON_SIDE: list[tuple[str, Callable[[sa.Connection], object], type[Exception], str]] = [
    ("asset-not-str", _register(asset=123), assetq.InvalidArgumentType, "must be a str"),
    ("asset-none", _register(asset=None), assetq.InvalidArgumentType, "must be a str"),
    ("asset-empty", _register(asset=""), assetq.InvalidArgument, "must not be empty"),
    ("asset-513-chars", _register(asset="a" * 513), assetq.NameTooLong, "limit is 512"),
    ("asset-nul", _register(asset="ord\x00ers"), assetq.InvalidArgument, "NUL"),
    ("asset-surrogate", _register(asset="ord\ud800"), assetq.InvalidArgument, "surrogate"),
    ("extra-list", _register(extra=[1, 2]), assetq.InvalidArgumentType, "mapping"),
    ("extra-str", _register(extra='{"a": 1}'), assetq.InvalidArgumentType, "mapping"),
    ("extra-int-key", _register(extra={1: "a"}), assetq.InvalidExtra, "key of type int"),
    ("extra-nan", _register(extra={"v": float("nan")}), assetq.InvalidExtra, "JSON cannot"),
    ("extra-inf", _register(extra={"v": float("inf")}), assetq.InvalidExtra, "JSON cannot"),
    ("extra-set", _register(extra={"v": {1, 2}}), assetq.InvalidExtra, "not JSON"),
    ("extra-bytes", _register(extra={"v": b"x"}), assetq.InvalidExtra, "not JSON"),
    ("extra-nul", _register(extra={"v": "a\x00b"}), assetq.InvalidExtra, "NUL"),
    ("extra-nul-key", _register(extra={"a\x00": 1}), assetq.InvalidExtra, "NUL"),
    ("extra-too-big", _register(extra={"v": "x" * 70_000}), assetq.InvalidExtra, "limit"),
    ("extra-too-deep", _register(extra=_deep(5000)), assetq.InvalidExtra, "deep"),
    # 32 objects nested: one more than MariaDB's JSON takes (EXTRA_MAX_DEPTH).
    ("extra-32-levels", _register(extra=_deep(31)), assetq.InvalidExtra, "limit is 31 levels"),
    ("key-empty", _register(idempotency_key=""), assetq.InvalidArgument, "empty"),
    ("key-201", _register(idempotency_key="k" * 201), assetq.NameTooLong, "limit is 200"),
    ("key-int", _register(idempotency_key=7), assetq.InvalidArgumentType, "must be a str"),
    ("source-str", _register(source="producer"), assetq.InvalidArgumentType, "Source"),
    ("source-unknown-key", _register(source={"dag": "x"}), assetq.InvalidArgument, "unknown"),
    (
        "source-map-index-bool",
        _register(source={"map_index": True}),
        assetq.InvalidArgumentType,
        "must be an int",
    ),
    (
        "source-map-index-huge",
        _register(source={"map_index": 2**40}),
        assetq.InvalidArgument,
        "between",
    ),
    (
        "source-dag-id-long",
        _register(source={"dag_id": "d" * 251}),
        assetq.NameTooLong,
        "limit is 250",
    ),
    ("batch-str", _batch("orders"), assetq.InvalidArgumentType, "sequence of assetq.NewEvent"),
    ("batch-mapping", _batch({"asset": "orders"}), assetq.InvalidArgumentType, "sequence"),
    ("batch-none", _batch(None), assetq.InvalidArgumentType, "sequence"),
    ("batch-item-str", _batch(["orders"]), assetq.InvalidArgumentType, "event 1 of the batch"),
    (
        "batch-item-unknown-key",
        _batch([{"asset": "orders"}, {"asset": "orders", "key": "k"}]),
        assetq.InvalidArgument,
        "event 2 of the batch: unknown keys ['key']",
    ),
    ("batch-item-no-asset", _batch([{"extra": {}}]), assetq.InvalidArgument, "asset is missing"),
    (
        "batch-item-asset-empty",
        _batch([assetq.NewEvent("orders"), assetq.NewEvent("")]),
        assetq.InvalidArgument,
        "event 2 of the batch: asset must not be empty",
    ),
    (
        "batch-item-extra-nan",
        _batch([{"asset": "orders", "extra": {"v": float("nan")}}]),
        assetq.InvalidExtra,
        "event 1 of the batch",
    ),
    (
        "batch-item-key-long",
        _batch([{"asset": "orders", "idempotency_key": "k" * 201}]),
        assetq.NameTooLong,
        "limit is 200",
    ),
    (
        "batch-item-source-bad",
        _batch([{"asset": "orders", "source": {"map_index": "1"}}]),
        assetq.InvalidArgumentType,
        "must be an int",
    ),
    (
        "batch-too-many",
        _batch([{"asset": "orders"}] * (assetq.BATCH_MAX_EVENTS + 1)),
        assetq.InvalidArgument,
        "at most 10000 events",
    ),
    (
        "batch-too-big",
        _batch([{"asset": "orders", "extra": {"v": "x" * 60_000}}] * 200),
        assetq.InvalidArgument,
        "bytes of JSON",
    ),
    ("dag-id-space", _declare("my dag", "orders"), assetq.InvalidArgument, "may only contain"),
    ("dag-id-slash", _declare("a/b", "orders"), assetq.InvalidArgument, "may only contain"),
    ("dag-id-quote", _declare("x'; DROP", "orders"), assetq.InvalidArgument, "may only"),
    ("dag-id-251", _declare("d" * 251, "orders"), assetq.NameTooLong, "limit is 250"),
    ("dag-id-none", _declare(None, "orders"), assetq.InvalidArgumentType, "must be a str"),
    ("condition-empty-list", _declare("c", []), assetq.InvalidCondition, "at least one"),
    ("condition-empty-any", _declare("c", assetq.any_of()), assetq.InvalidCondition, "any_of"),
    ("condition-int", _declare("c", 5), assetq.InvalidArgumentType, "condition is"),
    ("condition-dict", _declare("c", {"all_of": ["a"]}), assetq.InvalidArgumentType, "dict"),
    ("condition-name-long", _declare("c", ["a" * 513]), assetq.NameTooLong, "limit is 512"),
    ("condition-name-empty", _declare("c", ["a", ""]), assetq.InvalidArgument, "empty"),
    (
        "condition-too-deep",
        _declare("c", _nested(40)),
        assetq.InvalidCondition,
        "deeper",
    ),
    (
        "condition-too-complex",
        _declare(
            "c",
            assetq.any_of(*(assetq.all_of(f"a{i}", f"b{i}") for i in range(11))),
        ),
        assetq.InvalidCondition,
        "too complex",
    ),
    ("paused-str", _declare("c", "orders", paused="yes"), assetq.InvalidArgumentType, "bool"),
    (
        "namespace-upper",
        lambda conn: assetq.register_event(conn, "orders", namespace="Bad"),
        assetq.InvalidArgument,
        "namespace",
    ),
    (
        "namespace-injection",
        lambda conn: assetq.register_event(conn, "orders", namespace='x"; drop schema x'),
        assetq.InvalidArgument,
        "namespace",
    ),
    (
        "pause-bad-id",
        lambda conn: assetq.pause_dag(conn, "no such"),
        assetq.InvalidArgument,
        "may only",
    ),
]


@pytest.mark.parametrize(
    ("call", "expected", "words"),
    [pytest.param(c, e, w, id=i) for i, c, e, w in PYTHON_SIDE],
)
def test_bad_argument_is_refused_before_anything_is_sent(
    seeded: TestDatabase,
    call: Callable[[sa.Connection], object],
    expected: type[Exception],
    words: str,
) -> None:
    before = seeded.counts()
    counter = StatementCounter(seeded.engine)
    with seeded.engine.connect() as conn:
        with pytest.raises(expected) as info:
            call(conn)
        conn.commit()
    assert words in str(info.value)
    assert counter.count == 0, "a statement reached the database"
    assert seeded.counts() == before


# Errors only the database can detect: the transaction is rolled back, nothing remains.
DATABASE_SIDE: list[tuple[str, Callable[[sa.Connection], object], type[Exception], str]] = [
    ("unknown-asset", _register(asset="nope"), assetq.UnknownAsset, "AQ001"),
    (
        "unknown-asset-in-a-batch",
        _batch([{"asset": "orders"}, {"asset": "nope"}]),
        assetq.UnknownAsset,
        "AQ001",
    ),
    (
        "unknown-dag-pause",
        lambda conn: assetq.pause_dag(conn, "nobody"),
        assetq.UnknownDag,
        "AQ003",
    ),
    (
        "unknown-dag-unpause",
        lambda conn: assetq.unpause_dag(conn, "nobody"),
        assetq.UnknownDag,
        "AQ003",
    ),
]


@pytest.mark.parametrize(
    ("call", "expected", "code"),
    [pytest.param(c, e, w, id=i) for i, c, e, w in DATABASE_SIDE],
)
def test_database_side_error_is_typed_and_writes_nothing(
    seeded: TestDatabase,
    call: Callable[[sa.Connection], object],
    expected: type[assetq.AssetqError],
    code: str,
) -> None:
    before = seeded.counts()
    with pytest.raises(expected) as info, seeded.engine.begin() as conn:
        # an earlier write in the same transaction must go too
        assetq.register_event(conn, "customers")
        call(conn)
    assert info.value.code == code
    assert seeded.counts() == before


def test_an_extra_nested_31_levels_is_stored_on_every_engine(seeded: TestDatabase) -> None:
    """The deepest extra assetq takes (31 objects, EXTRA_MAX_DEPTH) is one every engine's
    JSON takes too, and reads back as it was."""
    extra = _deep(30)
    with seeded.engine.begin() as conn:
        event = assetq.register_event(conn, "orders", extra=extra)
    with seeded.engine.connect() as conn:
        events = ops.asset_events(conn, "orders", namespace=seeded.namespace)
        (stored,) = [e for e in events if e.id == event.id]
    assert stored.extra == extra


def test_a_deep_extra_is_refused_whatever_the_recursion_limit(seeded: TestDatabase) -> None:
    """The depth is counted, not left to Python's recursion limit: with the limit raised (as
    mypy, run in the same process, raises it), a 5,000-level extra reached the server and
    came back as MariaDB's 'invalid JSON' (a full run caught it)."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)
    try:
        counter = StatementCounter(seeded.engine)
        with seeded.engine.connect() as conn, pytest.raises(assetq.InvalidExtra, match="deep"):
            assetq.register_event(conn, "orders", extra=_deep(5000))
        assert counter.count == 0
    finally:
        sys.setrecursionlimit(limit)


def test_unknown_asset_message_says_what_to_do(seeded: TestDatabase) -> None:
    with pytest.raises(assetq.UnknownAsset) as info, seeded.engine.begin() as conn:
        assetq.register_event(conn, "missing_asset")
    assert "missing_asset" in str(info.value)
    assert "declare" in str(info.value).lower()


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"limit": 0}, assetq.InvalidArgument),
        ({"limit": "10"}, assetq.InvalidArgumentType),
        ({"limit": 10.0}, assetq.InvalidArgumentType),
        ({"max_attempts": 0}, assetq.InvalidArgument),
        ({"namespace": ""}, assetq.InvalidArgument),
    ],
)
def test_schedule_rejects_bad_arguments(
    seeded: TestDatabase, kwargs: dict[str, Any], expected: type[Exception]
) -> None:
    before = seeded.counts()
    with pytest.raises(expected):
        assetq.schedule(seeded.engine, **kwargs)
    assert seeded.counts() == before


def test_calling_an_uninstalled_namespace_fails_cleanly(seeded: TestDatabase) -> None:
    with pytest.raises(assetq.NotInstalled, match="assetq install"), seeded.engine.begin() as conn:
        assetq.register_event(conn, "orders", namespace="not_installed")
