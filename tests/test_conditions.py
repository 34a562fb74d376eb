"""Condition compilation to conjunctive normal form (pure Python, no database)."""

from __future__ import annotations

import itertools

import pytest

import assetq
from assetq.conditions import compile_cnf, normalize, to_json


def cnf(condition: assetq.Condition) -> list[list[str]]:
    return compile_cnf(normalize(condition))


def holds(clauses: list[list[str]], queued: set[str]) -> bool:
    return all(queued & set(clause) for clause in clauses)


def test_single_asset_is_one_clause() -> None:
    assert cnf("a") == [["a"]]


def test_list_is_all_of() -> None:
    assert cnf(["b", "a"]) == cnf(assetq.all_of("a", "b")) == [["a"], ["b"]]


def test_any_of_is_one_clause() -> None:
    assert cnf(assetq.any_of("b", "a")) == [["a", "b"]]


def test_or_of_ands_distributes() -> None:
    condition = assetq.any_of(assetq.all_of("a", "b"), assetq.all_of("c", "d"))
    assert cnf(condition) == [["a", "c"], ["a", "d"], ["b", "c"], ["b", "d"]]


def test_absorption_drops_redundant_clauses() -> None:
    assert cnf(assetq.all_of("a", assetq.any_of("a", "b"))) == [["a"]]


def test_duplicates_collapse() -> None:
    assert cnf(["a", "a", assetq.any_of("a", "a")]) == [["a"]]


def _evaluate(condition: object, queued: set[str]) -> bool:
    if isinstance(condition, str):
        return condition in queued
    if isinstance(condition, assetq.AnyOf):
        return any(_evaluate(c, queued) for c in condition.items)
    items = condition.items if isinstance(condition, assetq.AllOf) else condition
    return all(_evaluate(c, queued) for c in items)  # type: ignore[union-attr]


CONDITIONS = [
    assetq.any_of(assetq.all_of("a", "b"), "c"),
    assetq.all_of(assetq.any_of("a", "b"), assetq.any_of("c", assetq.all_of("a", "d"))),
    assetq.any_of(assetq.all_of("a", assetq.any_of("b", "c")), assetq.all_of("d", "a")),
    ["a", assetq.any_of(["b", "c"], ["c", "d"])],
]


@pytest.mark.parametrize("condition", CONDITIONS)
def test_cnf_agrees_with_the_tree_on_every_set_of_queued_assets(condition: object) -> None:
    clauses = cnf(condition)  # type: ignore[arg-type]
    universe = "abcd"
    for size in range(len(universe) + 1):
        for queued in itertools.combinations(universe, size):
            assert holds(clauses, set(queued)) == _evaluate(condition, set(queued)), queued


def test_declared_form_is_kept_as_json() -> None:
    condition = assetq.any_of(["a", "b"], "c")
    assert to_json(normalize(condition)) == {
        "any_of": [{"all_of": [{"asset": "a"}, {"asset": "b"}]}, {"asset": "c"}]
    }


def test_compilation_is_deterministic() -> None:
    condition = assetq.any_of(assetq.all_of("x", "y"), assetq.all_of("z", "w"))
    assert cnf(condition) == cnf(condition)


def test_large_but_tractable_condition_compiles() -> None:
    condition = assetq.any_of(*(assetq.all_of(f"a{i}", f"b{i}") for i in range(9)))
    assert len(cnf(condition)) == 2**9
