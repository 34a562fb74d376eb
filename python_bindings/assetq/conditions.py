"""Consumer conditions and their compilation to conjunctive normal form.

A condition is an asset reference, a list or tuple of conditions (all of them), or a nested
:func:`all_of` / :func:`any_of`. A reference is a plain string (``"orders"``: the asset with
that name, else the one with that uri), :func:`asset_name`, :func:`asset_uri` or
:func:`alias` (an asset alias: satisfied by events of every asset the alias has resolved
to). The database never evaluates the tree: it gets the condition's conjunctive normal form,
a list of clauses, each a set of references, and the condition holds when every clause has
at least one member among the queued events. That is a plain set query on both engines,
with no recursion in SQL.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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


@dataclass(frozen=True)
class Ref:
    """A reference to an asset by name or by uri, or to an asset alias."""

    #: "name", "uri" or "alias".
    kind: str
    value: str

    def to_json(self) -> Any:
        return {self.kind: self.value}


def asset_name(name: str) -> Ref:
    """The asset called ``name`` (created, undeclared, if no asset has that name yet)."""
    return Ref("name", check_name(name, "asset name in condition", 512))


def asset_uri(uri: str) -> Ref:
    """The asset with uri ``uri``. If none exists yet, one is created with the uri as its
    name too; the first :func:`~assetq.declare_asset` with that uri gives it its real name."""
    return Ref("uri", check_name(uri, "asset uri in condition", 512))


def alias(name: str) -> Ref:
    """Asset alias ``name``: satisfied by a queued event of any asset the alias has resolved
    to (an event registered through the alias resolves it to the event's asset)."""
    return Ref("alias", check_name(name, "alias name in condition", 512))


Condition = str | Ref | AllOf | AnyOf | Sequence["Condition"]


def all_of(*items: Condition) -> AllOf:
    """A condition that holds when all of ``items`` hold."""
    return AllOf(tuple(items))


def any_of(*items: Condition) -> AnyOf:
    """A condition that holds when any of ``items`` holds."""
    return AnyOf(tuple(items))


Member = str | Ref
Clause = frozenset[Member]


Node = AllOf | AnyOf | str | Ref


def _normalize(condition: object, depth: int) -> Node:
    if depth > MAX_DEPTH:
        raise InvalidCondition(f"condition is nested deeper than {MAX_DEPTH} levels")
    if isinstance(condition, str):
        return check_name(condition, "asset name in condition", 512)
    if isinstance(condition, Ref):
        return condition
    if isinstance(condition, AllOf | AnyOf):
        items = condition.items
        kind: type[AllOf] | type[AnyOf] = type(condition)
    elif isinstance(condition, list | tuple):
        items = tuple(condition)
        kind = AllOf
    else:
        raise InvalidArgumentType(
            "a condition is an asset name, asset_name(...), asset_uri(...), alias(...), a list"
            " of conditions, all_of(...) or any_of(...);"
            f" got {type(condition).__name__}"
        )
    if not items:
        name = "any_of" if kind is AnyOf else "all_of"
        raise InvalidCondition(f"{name}() needs at least one asset or condition")
    return kind(tuple(_normalize(item, depth + 1) for item in items))


def normalize(condition: object) -> Node:
    """Validate ``condition`` and return it with lists turned into :class:`AllOf`."""
    return _normalize(condition, 0)


def to_json(condition: Node) -> Any:
    """The condition as declared, in a JSON form that is stored with the consumer."""
    if isinstance(condition, str):
        return {"asset": condition}
    if isinstance(condition, Ref):
        return condition.to_json()
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


def _cnf(condition: Node) -> set[Clause]:
    if isinstance(condition, str | Ref):
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


def _member_key(member: Member) -> tuple[str, str]:
    return ("", member) if isinstance(member, str) else (member.kind, member.value)


def _member_json(member: Member) -> Any:
    return member if isinstance(member, str) else member.to_json()


def compile_cnf(condition: Node) -> list[list[Any]]:
    """Compile a normalized condition to CNF: a sorted list of sorted clauses, each member a
    name-or-uri string or a ``{"name"|"uri"|"alias": value}`` object.

    Deterministic, so declaring the same condition twice stores the same clauses.
    """
    clauses = _cnf(condition)
    ordered = sorted(
        (sorted(clause, key=_member_key) for clause in clauses),
        key=lambda clause: [_member_key(m) for m in clause],
    )
    return [[_member_json(m) for m in clause] for clause in ordered]


def size_bound(condition: Node, weights: Mapping[str, int] | None = None) -> int:
    """How many events one run may need to satisfy ``condition``: one per reference of an
    all_of (or ``weights[name]`` for a reference to an asset by that name or uri: a partition
    roll-up's sub-partitions), the largest of an any_of's items. A max_events_per_run at
    least this large always leaves room for a run whenever the whole queue satisfies the
    condition."""
    if isinstance(condition, str | Ref):
        if weights:
            key = condition if isinstance(condition, str) else condition.value
            if not isinstance(condition, Ref) or condition.kind != "alias":
                return weights.get(key, 1)
        return 1
    sizes = [size_bound(item, weights) for item in condition.items]  # type: ignore[arg-type]
    return sum(sizes) if isinstance(condition, AllOf) else max(sizes)
