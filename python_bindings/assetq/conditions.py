"""Consumer conditions and their compilation to conjunctive normal form.

A condition is an asset name (``"orders"``), a list or tuple of conditions (all of them),
or a nested :func:`all_of` / :func:`any_of`. The database never evaluates the tree: it gets
the condition's conjunctive normal form, a list of clauses, each a set of assets, and the
condition holds when every clause has at least one asset among the queued events. That is a
plain set query on both engines, with no recursion in SQL.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .errors import InvalidArgumentType, InvalidCondition
from .validation import check_name

#: Most clauses a compiled condition may have. CNF can grow exponentially (an any_of of n
#: all_of pairs gives 2**n clauses); past this the declaration is refused, not truncated.
MAX_CLAUSES = 1000

#: Deepest nesting of all_of / any_of accepted.
MAX_DEPTH = 32


@dataclass(frozen=True)
class AllOf:
    """Holds when every one of ``items`` holds."""

    items: tuple[Condition, ...]


@dataclass(frozen=True)
class AnyOf:
    """Holds when at least one of ``items`` holds."""

    items: tuple[Condition, ...]


Condition = str | AllOf | AnyOf | Sequence["Condition"]


def all_of(*items: Condition) -> AllOf:
    """A condition that holds when all of ``items`` hold."""
    return AllOf(tuple(items))


def any_of(*items: Condition) -> AnyOf:
    """A condition that holds when any of ``items`` holds."""
    return AnyOf(tuple(items))


Clause = frozenset[str]


def _normalize(condition: object, depth: int) -> AllOf | AnyOf | str:
    if depth > MAX_DEPTH:
        raise InvalidCondition(f"condition is nested deeper than {MAX_DEPTH} levels")
    if isinstance(condition, str):
        return check_name(condition, "asset name in condition", 512)
    if isinstance(condition, AllOf | AnyOf):
        items = condition.items
        kind: type[AllOf] | type[AnyOf] = type(condition)
    elif isinstance(condition, list | tuple):
        items = tuple(condition)
        kind = AllOf
    else:
        raise InvalidArgumentType(
            "a condition is an asset name, a list of conditions, all_of(...) or any_of(...);"
            f" got {type(condition).__name__}"
        )
    if not items:
        name = "any_of" if kind is AnyOf else "all_of"
        raise InvalidCondition(f"{name}() needs at least one asset or condition")
    return kind(tuple(_normalize(item, depth + 1) for item in items))


def normalize(condition: object) -> AllOf | AnyOf | str:
    """Validate ``condition`` and return it with lists turned into :class:`AllOf`."""
    return _normalize(condition, 0)


def to_json(condition: AllOf | AnyOf | str) -> Any:
    """The condition as declared, in a JSON form that is stored with the consumer."""
    if isinstance(condition, str):
        return {"asset": condition}
    key = "all_of" if isinstance(condition, AllOf) else "any_of"
    return {key: [to_json(item) for item in condition.items]}  # type: ignore[arg-type]


def _absorb(clauses: set[Clause]) -> set[Clause]:
    """Drop every clause that is a superset of another: (a) AND (a OR b) is just (a)."""
    ordered = sorted(clauses, key=len)
    kept: list[Clause] = []
    for clause in ordered:
        if not any(k <= clause for k in kept):
            kept.append(clause)
    return set(kept)


def _cnf(condition: AllOf | AnyOf | str) -> set[Clause]:
    if isinstance(condition, str):
        return {frozenset([condition])}
    if isinstance(condition, AllOf):
        result: set[Clause] = set()
        for item in condition.items:
            result |= _cnf(item)  # type: ignore[arg-type]
            if len(result) > MAX_CLAUSES:
                raise _too_complex()
        return _absorb(result)
    # any_of: distribute OR over the children's clause sets.
    product: set[Clause] = {frozenset()}
    for item in condition.items:
        child = _cnf(item)  # type: ignore[arg-type]
        if len(product) * len(child) > MAX_CLAUSES * 8:
            raise _too_complex()
        product = _absorb({left | right for left in product for right in child})
        if len(product) > MAX_CLAUSES:
            raise _too_complex()
    return product


def _too_complex() -> InvalidCondition:
    return InvalidCondition(
        f"condition is too complex: its conjunctive normal form has more than {MAX_CLAUSES}"
        " clauses; split the consumer or simplify nested any_of(all_of(...)) groups"
    )


def compile_cnf(condition: AllOf | AnyOf | str) -> list[list[str]]:
    """Compile a normalized condition to CNF: a sorted list of sorted clauses of names.

    Deterministic, so declaring the same condition twice stores the same clauses.
    """
    clauses = _cnf(condition)
    return sorted(sorted(clause) for clause in clauses)
