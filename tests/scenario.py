"""Small steps the behaviour tests share: declare a consumer, register events, read a queue.

Each step is its own committed transaction, through the public API (the queue is read from
the table itself, so a test of the read API does not check it against itself).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import assetq
from dbs import TestDatabase


def declare(db: TestDatabase, dag_id: str, condition: Any, **options: Any) -> None:
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, dag_id, condition, **options)


def register(db: TestDatabase, *assets: str, aliases: Sequence[str] = ()) -> list[assetq.Event]:
    """One event per asset, one statement each, in one transaction."""
    with db.engine.begin() as conn:
        return [assetq.register_event(conn, a, aliases=aliases) for a in assets]


def ids(events: Sequence[assetq.Event]) -> tuple[int, ...]:
    return tuple(e.id for e in events)


def queued(db: TestDatabase, dag_id: str) -> list[int]:
    """The consumer's queued event ids, oldest first, read from the table itself."""
    return [
        int(r[0])
        for r in db.rows(
            "SELECT asset_event_id FROM {ns}.asset_dag_run_queue WHERE target_dag_id = :d"
            " ORDER BY created_at, asset_event_id",
            d=dag_id,
        )
    ]
