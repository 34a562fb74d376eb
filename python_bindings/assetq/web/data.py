"""What each page of the console shows, as JSON-ready dicts: the HTML page renders the same
dict its ``/api/...`` twin returns, so the two always have the same fields.

Each function is one read in the caller's connection, through the public reads (assetq.ops,
assetq.api) and the named queries of ``sql/<engine>/queries.sql``; every list is one page read
by key, so the statements a page sends do not grow with the history (tests/test_web.py counts
them).
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from .. import api, ops
from ..dialects import dialect_for
from ..errors import InvalidArgument, UnknownAsset
from ..validation import check_namespace

#: Rows per page of every list the console shows.
PAGE = 50

#: How far back an asset's page reads its events: no index orders one asset's events, so the
#: window bounds the read (as `assetq events --since`).
ASSET_EVENTS_WINDOW_SECONDS = 7 * 86400.0


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


def run_dict(run: api.Run) -> dict[str, Any]:
    """A run with the keys of `assetq run show --json`."""
    return {k: _jsonable(v) for k, v in asdict(run).items()}


def event_dict(event: api.Event) -> dict[str, Any]:
    """An event with the keys of `assetq events --json`."""
    return {
        "id": event.id,
        "asset": event.asset,
        "uri": event.uri,
        "timestamp": event.timestamp.isoformat(),
        "partition_key": event.partition_key,
        "extra": dict(event.extra),
        "source": asdict(event.source),
        "aliases": list(event.aliases),
    }


def condition_text(condition: Any) -> str:
    from .. import cli

    return cli.condition_text(condition)


def _cursor(value: str | None) -> tuple[datetime, int] | None:
    """A page cursor of events, ``<iso timestamp>~<id>`` (the last row of the page before)."""
    if not value:
        return None
    try:
        when, _, ident = value.rpartition("~")
        return datetime.fromisoformat(when), int(ident)
    except ValueError:
        raise InvalidArgument(f"not a page cursor: {value!r}") from None


def _event_cursor(event: api.Event) -> str:
    return f"{event.timestamp.isoformat()}~{event.id}"


#: The activity chart's span: the last hour, a bar a minute.
ACTIVITY_MINUTES = 60


def activity(conn: sa.Connection, namespace: str) -> dict[str, Any]:
    """Events registered and runs created per minute over the last hour, oldest minute first
    (index 59: the last 60 seconds), by the database's clock: one statement, two index
    ranges bounded by the hour (``web_activity_per_minute``)."""
    rows = dialect_for(conn).execute(conn, "web_activity_per_minute", namespace)
    series: dict[str, list[int]] = {
        "events": [0] * ACTIVITY_MINUTES,
        "runs": [0] * ACTIVITY_MINUTES,
    }
    for r in rows:
        ago = min(max(int(r.minutes_ago), 0), ACTIVITY_MINUTES - 1)
        series[str(r.series)][ACTIVITY_MINUTES - 1 - ago] += int(r.n)
    return {
        "minutes": ACTIVITY_MINUTES,
        "events_per_minute": series["events"],
        "runs_per_minute": series["runs"],
        "events_last_hour": sum(series["events"]),
        "runs_last_hour": sum(series["runs"]),
    }


def overview(
    conn: sa.Connection, namespace: str, *, after: str | None = None, limit: int = PAGE
) -> dict[str, Any]:
    """``/``: a page of consumers by dag id (after ``after``), each with its condition,
    paused, caps, queue, runs, last run and whether any live worker can run it; totals over
    every consumer (the dag_queue_status view, as `assetq status`); the live processes; the
    events and runs per minute of the last hour (:func:`activity`)."""
    page = ops.dags(conn, after=after, limit=limit, namespace=namespace)
    status = {s.dag_id: s for s in ops.status(conn, namespace=namespace)}
    coverage = {c.dag_id: c for c in ops.worker_coverage(conn, namespace=namespace)}
    processes = ops.processes(conn, namespace=namespace)
    per_minute = activity(conn, namespace)
    consumers = []
    for d in page:
        s = status.get(d.dag_id)
        c = coverage.get(d.dag_id)
        consumers.append(
            {
                "dag_id": d.dag_id,
                "condition": d.condition,
                "condition_text": condition_text(d.condition),
                "is_paused": d.is_paused,
                "max_active_runs": d.max_active_runs,
                "max_events_per_run": d.max_events_per_run,
                "max_attempts": d.max_attempts,
                "queued_events": d.queued_events,
                "oldest_queued_at": _iso(d.oldest_queued_at),
                "oldest_queued_age_seconds": d.oldest_queued_age_seconds,
                "active_runs": None if s is None else s.active_runs,
                "queued_runs": d.queued_runs,
                "running_runs": d.running_runs,
                "failed_runs": None if s is None else s.failed_runs,
                "last_run_at": None if s is None else _iso(s.last_run_at),
                "no_worker": False if c is None else c.no_worker,
                "stuck_runs": 0 if c is None else c.stuck_runs,
            }
        )
    alive = [p for p in processes if not p.stale]
    return {
        "namespace": namespace,
        "consumers": consumers,
        "next_after": page[-1].dag_id if len(page) == limit else None,
        "totals": {
            "consumers": len(status),
            "paused": sum(1 for s in status.values() if s.is_paused),
            "queued_events": sum(s.queued_events for s in status.values()),
            "active_runs": sum(s.active_runs for s in status.values()),
            "running_runs": sum(s.running_runs for s in status.values()),
            "failed_runs": sum(s.failed_runs for s in status.values()),
            "no_worker": sum(1 for c in coverage.values() if c.no_worker),
        },
        "schedulers_alive": sum(1 for p in alive if p.kind == "scheduler"),
        "workers_alive": sum(1 for p in alive if p.kind == "worker"),
        "stale_processes": len(processes) - len(alive),
        "activity": per_minute,
    }


def dag(
    conn: sa.Connection,
    namespace: str,
    dag_id: str,
    *,
    state: str | None = None,
    before: int | None = None,
    events_after: str | None = None,
    partitions_after: str | None = None,
    limit: int = PAGE,
) -> dict[str, Any]:
    """``/dags/<dag_id>``: the consumer's declaration and counts, one page of its runs
    (newest first, before seq ``before``, in ``state``), one page of its queued events
    (oldest first, after the cursor ``events_after``) and, for a partitioned consumer, one
    page of its pending partitions (by key, after ``partitions_after``)."""
    info = ops.require_dag(conn, dag_id, namespace=namespace)
    if state is not None and not api.is_run_state(state):
        raise InvalidArgument(f"not a run state: {state!r} (one of {', '.join(api.RUN_STATES)})")
    dialect = dialect_for(conn)
    rows = dialect.execute(
        conn,
        "runs_page",
        namespace,
        {"dag_id": dag_id, "state": state, "before_seq": before, "limit": limit},
    )
    runs = [api.run_info(row) for row in rows]
    after = _cursor(events_after)
    queued = dialect.execute(
        conn,
        "queued_events_page",
        namespace,
        {
            "dag_id": dag_id,
            "after_timestamp": None if after is None else api.db_time(dialect, after[0]),
            "after_id": None if after is None else after[1],
            "limit": limit,
        },
    )
    events = [api.event_record(row) for row in queued]
    partitions = (
        ops.pending_partitions(
            conn, dag_id, after=partitions_after, limit=limit, namespace=namespace
        )
        if info.partitioned
        else []
    )
    return {
        "partitions": [
            {**asdict(p), "oldest_queued_at": _jsonable(p.oldest_queued_at)} for p in partitions
        ],
        "partitions_next_after": partitions[-1].partition_key if len(partitions) == limit else None,
        "dag": {
            **{k: _jsonable(v) for k, v in asdict(info).items()},
            "condition_text": condition_text(info.condition),
        },
        "state": state,
        "runs": [run_dict(r) for r in runs],
        "runs_next_before": runs[-1].seq if len(runs) == limit else None,
        "queued_events": [event_dict(e) for e in events],
        "events_next_after": _event_cursor(events[-1]) if len(events) == limit else None,
    }


def run(
    conn: sa.Connection, namespace: str, dag_id: str, run_id: str, *, limit: int = PAGE
) -> dict[str, Any]:
    """``/dags/<dag_id>/runs/<run_id>``: the run as `assetq run show --json` has it: its
    last attempt (worker, times, error), the consumer's max_attempts, the first ``limit``
    consumed events and outputs."""
    info = ops.require_dag(conn, dag_id, namespace=namespace)
    found = api.get_run(conn, dag_id, run_id, namespace=namespace)
    attempts = ops.run_attempts(conn, found, limit=limit, namespace=namespace)
    consumed = api.consumed_events(conn, dag_id, run_id, limit=limit, namespace=namespace)
    outputs = ops.run_outputs(conn, found, limit=limit, namespace=namespace)
    return {
        "run": run_dict(found),
        "max_attempts": info.max_attempts,
        "is_paused": info.is_paused,
        "attempts": [attempt_dict(a) for a in attempts],
        "timeline": timeline(found, attempts),
        "consumed_events": [event_dict(e) for e in consumed],
        "outputs": [event_dict(e) for e in outputs],
    }


def attempt_dict(attempt: ops.Attempt) -> dict[str, Any]:
    """An attempt with the keys of `assetq run show --json`'s ``attempts``."""
    return {k: _jsonable(v) for k, v in asdict(attempt).items()}


_TRACEBACK = "Traceback (most recent call last):"


def error_summary(error: str | None, width: int = 200) -> str:
    """One line of an error for a table or the timeline: a Python traceback's last line
    (the exception, as workers record it), otherwise the first line; at most ``width``
    characters."""
    lines = [line for line in (error or "").strip().splitlines() if line.strip()]
    if not lines:
        return ""
    line = lines[-1] if lines[0].startswith(_TRACEBACK) else lines[0]
    return line.strip()[:width]


def timeline(run: api.Run, attempts: list[ops.Attempt]) -> list[dict[str, Any]]:
    """What happened to ``run``, oldest first: its creation, each attempt's claim and end
    (newest ``attempts`` first, as :func:`assetq.ops.run_attempts` gives them), a cancel
    before any claim, and when a queued run may next be claimed. Each entry is ``at`` (ISO
    time, UTC) and ``what`` (one line; an error's first line)."""
    entries: list[tuple[datetime, int, str]] = [
        (run.created_at, 0, f"created with {run.event_count} event(s)")
    ]
    for a in attempts:
        if a.started_at is not None:
            entries.append((a.started_at, 1, f"attempt {a.attempt} claimed by {a.worker or '-'}"))
        if a.ended_at is not None:
            summary = error_summary(a.error)
            line = f"attempt {a.attempt} {a.outcome}" + (f": {summary}" if summary else "")
            entries.append((a.ended_at, 2, line))
    cancelled_in_attempt = any(a.outcome == "cancelled" for a in attempts)
    if run.state == "cancelled" and run.ended_at is not None and not cancelled_in_attempt:
        entries.append((run.ended_at, 2, "cancelled before a claim"))
    if run.state == "queued" and run.not_before is not None and run.attempt > 0:
        entries.append((run.not_before, 3, f"attempt {run.attempt + 1} claimable"))
    entries.sort(key=lambda e: (e[0], e[1]))
    return [{"at": at.isoformat(), "what": what} for at, _, what in entries]


def assets(
    conn: sa.Connection, namespace: str, *, after: str | None = None, limit: int = PAGE
) -> dict[str, Any]:
    """``/assets``: a page of assets by name (after ``after``), each with its consumers'
    count."""
    rows = dialect_for(conn).execute(
        conn, "web_assets_page", namespace, {"after_name": after, "limit": limit}
    )
    found = [
        {
            "id": int(r.asset_id),
            "name": str(r.asset_name),
            "uri": r.asset_uri,
            "consumers": int(r.consumers),
        }
        for r in rows
    ]
    return {"assets": found, "next_after": found[-1]["name"] if len(found) == limit else None}


def asset(
    conn: sa.Connection,
    namespace: str,
    name: str,
    *,
    before: str | None = None,
    key: str | None = None,
    limit: int = PAGE,
) -> dict[str, Any]:
    """``/assets/<name>``: the asset (by name, else uri), a page of its events of the last
    seven days (newest first, before the cursor ``before``) or, with ``key``, the one event
    registered with that idempotency key (any age: the unique index finds it); its consumers
    (first ``limit`` by dag id) and the aliases it was registered through (first ``limit``
    by name)."""
    dialect = dialect_for(conn)
    found = dialect.execute(conn, "find_asset", namespace, {"asset": name})
    if not found:
        raise UnknownAsset(f"unknown asset {name!r}: no asset has that name or uri", code="AQ001")
    asset_id = int(found[0].asset_id)
    if key is not None:
        rows = dialect.execute(
            conn,
            "web_asset_event_by_key",
            namespace,
            {"asset_id": asset_id, "idempotency_key": key},
        )
    else:
        cursor = _cursor(before)
        rows = dialect.execute(
            conn,
            "asset_events_page",
            namespace,
            {
                "asset_id": asset_id,
                "since_seconds": ASSET_EVENTS_WINDOW_SECONDS,
                "before_timestamp": None if cursor is None else api.db_time(dialect, cursor[0]),
                "before_id": None if cursor is None else cursor[1],
                "limit": limit,
            },
        )
    events = [api.event_record(row) for row in rows]
    aliases = dialect.execute(
        conn, "web_asset_aliases", namespace, {"asset_id": asset_id, "limit": limit}
    )
    consumers = dialect.execute(
        conn,
        "web_asset_consumers",
        namespace,
        {"asset_id": asset_id, "after_dag_id": None, "limit": limit},
    )
    return {
        "asset": {
            "id": asset_id,
            "name": str(found[0].asset_name),
            "uri": found[0].asset_uri,
        },
        "key": key,
        "events": [event_dict(e) for e in events],
        "events_window_seconds": None if key is not None else ASSET_EVENTS_WINDOW_SECONDS,
        "events_next_before": (
            _event_cursor(events[-1]) if key is None and len(events) == limit else None
        ),
        "aliases": [str(r.alias_name) for r in aliases],
        "consumers": [{"dag_id": str(r.dag_id), "is_paused": bool(r.is_paused)} for r in consumers],
    }


#: At most this many (worker, consumer) pairs on /workers.
PROCESS_DAGS_MAX = 10_000


def workers(conn: sa.Connection, namespace: str) -> dict[str, Any]:
    """``/workers``: the schedulers and workers of the liveness table, each with the
    consumers it has handlers for (a worker's), schedulers first."""
    processes = ops.processes(conn, namespace=namespace)
    rows = dialect_for(conn).execute(
        conn, "web_process_dags", namespace, {"limit": PROCESS_DAGS_MAX}
    )
    handles: dict[str, list[str]] = {}
    for r in rows:
        handles.setdefault(str(r.process_id), []).append(str(r.dag_id))
    return {
        "processes": [
            {
                **{k: _jsonable(v) for k, v in asdict(p).items()},
                "dag_ids": handles.get(p.process_id, []),
            }
            for p in processes
        ]
    }


def checked_namespace(namespace: str) -> str:
    return check_namespace(namespace)
