"""Partition mappings of partitioned consumers (issue 17).

A consumer declared with ``partitioned=...`` (:func:`assetq.declare_dag`) has its condition
evaluated per partition key: a run is created for key k when the condition holds on the
queued events that map to k, and consumes exactly those. Each asset of the condition maps
its events' partition keys to the consumer's keys by one of these mappings; an asset not
named maps by identity. docs/semantics.md ("Partitions") has the rules and examples.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from . import errors
from .validation import check_name

#: Longest partition key, as for run ids (both engines index it).
PARTITION_KEY_MAX = 250

#: Whether a consumer key needs every upstream key that maps to it, or any one of them.
Require = Literal["all", "any"]

_ROLLUPS = {
    ("hour", "day"): "hour_to_day",
    ("day", "week"): "day_to_week",
    ("day", "month"): "day_to_month",
}


def check_key(value: object, what: str) -> str:
    """A partition key: 1 to 250 characters, not ending with a space (MySQL compares "k " and
    "k" as equal, PostgreSQL does not: refused on both, so that a key means the same)."""
    key = check_name(value, what, PARTITION_KEY_MAX)
    if key.endswith(" "):
        raise errors.InvalidArgument(f"{what} {key!r} must not end with a space")
    return key


def _require(value: object) -> Require:
    if value == "all":
        return "all"
    if value == "any":
        return "any"
    raise errors.InvalidArgument(f"require must be 'all' or 'any', got {value!r}")


@dataclass(frozen=True)
class Rollup:
    """A time roll-up of ISO-8601 keys of UTC: ``Rollup("hour", "day")`` maps
    ``2026-12-01T05`` (also written ``2026-12-01T05:00``, ``...:00:00``, with ``Z`` or
    ``+00:00``) to ``2026-12-01``; ``Rollup("day", "week")`` maps ``2026-12-01`` to its ISO
    week ``2026-W49``; ``Rollup("day", "month")`` maps it to ``2026-12``. With ``require="all"``
    (the default) the consumer's key needs an event for each of its sub-partitions (24 hours,
    7 days, the days of the month); with ``"any"``, one. An event whose key does not parse is
    refused when it is registered (:class:`~assetq.UnmappablePartition`)."""

    source: Literal["hour", "day"]
    target: Literal["day", "week", "month"]
    require: Require = "all"

    def __post_init__(self) -> None:
        if (self.source, self.target) not in _ROLLUPS:
            raise errors.InvalidArgument(
                f"no roll-up from {self.source!r} to {self.target!r}: use hour -> day,"
                " day -> week or day -> month"
            )
        _require(self.require)

    @property
    def kind(self) -> str:
        return _ROLLUPS[(self.source, self.target)]


@dataclass(frozen=True)
class StaticPartitions:
    """A fixed table from the upstream asset's keys to the consumer's keys, e.g.
    ``StaticPartitions({"eu-west-1": "eu", "eu-central-1": "eu", "us-east-1": "us"})``. With
    ``require="all"`` (the default) the consumer's key ``eu`` needs an event for both upstream
    keys that map to it; with ``"any"``, one. An event whose key is not in the table is
    refused when it is registered (:class:`~assetq.UnmappablePartition`)."""

    keys: Mapping[str, str] = field(default_factory=dict)
    require: Require = "all"

    def __post_init__(self) -> None:
        if not isinstance(self.keys, Mapping) or not self.keys:
            raise errors.InvalidArgument("a static partition mapping needs at least one key")
        for upstream, target in self.keys.items():
            check_key(upstream, "upstream partition key")
            check_key(target, "partition key")
        _require(self.require)

    @property
    def kind(self) -> str:
        return "static"


#: The identity mapping, the default for every asset of a partitioned consumer.
IDENTITY = "identity"

PartitionMapping = Rollup | StaticPartitions | Literal["identity"]

#: ``partitioned=`` of :func:`assetq.declare_dag`: False (unpartitioned), True (identity for
#: every asset), or a mapping from asset names or uris of the condition to their mappings.
Partitioned = bool | Mapping[str, PartitionMapping]


_ROLLUP_NEED = {"hour_to_day": 24, "day_to_week": 7, "day_to_month": 31}


def needs(partitioned: object) -> dict[str, int]:
    """The most events of one key each asset named in ``partitioned`` may need (its
    sub-partitions under ``require="all"``), for max_events_per_run's lower bound."""
    if not isinstance(partitioned, Mapping):
        return {}
    out: dict[str, int] = {}
    for asset, mapping in partitioned.items():
        if isinstance(mapping, Rollup) and mapping.require == "all":
            out[str(asset)] = _ROLLUP_NEED[mapping.kind]
        elif isinstance(mapping, StaticPartitions) and mapping.require == "all":
            groups: dict[str, int] = {}
            for target in mapping.keys.values():
                groups[target] = groups.get(target, 0) + 1
            out[str(asset)] = max(groups.values())
    return out


def to_json(partitioned: object) -> str | None:
    """The routine's argument for ``partitioned`` (None: unpartitioned), checked."""
    if partitioned is False or partitioned is None:
        return None
    if partitioned is True:
        return json.dumps({"assets": []})
    if not isinstance(partitioned, Mapping):
        raise errors.InvalidArgumentType(
            "partitioned must be True, False or a mapping from asset names to assetq.Rollup /"
            f" assetq.StaticPartitions / 'identity', got {type(partitioned).__name__}"
        )
    items: list[dict[str, Any]] = []
    for asset, mapping in partitioned.items():
        name = check_name(asset, "asset of partitioned", 512)
        if mapping == IDENTITY:
            items.append({"asset": name, "mapping": "identity"})
        elif isinstance(mapping, Rollup):
            items.append({"asset": name, "mapping": mapping.kind, "require": mapping.require})
        elif isinstance(mapping, StaticPartitions):
            items.append(
                {
                    "asset": name,
                    "mapping": "static",
                    "require": mapping.require,
                    "keys": [[up, target] for up, target in mapping.keys.items()],
                }
            )
        else:
            raise errors.InvalidArgumentType(
                f"the partition mapping of {name!r} must be assetq.Rollup,"
                f" assetq.StaticPartitions or 'identity', got {mapping!r}"
            )
    return json.dumps({"assets": items}, separators=(",", ":"), ensure_ascii=False)
