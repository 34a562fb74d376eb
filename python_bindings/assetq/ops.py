"""Operating assetq: status, retention, health checks and least-privilege access.

:func:`status` reads the ``dag_queue_status`` view in the caller's transaction. :func:`purge`
deletes history in small batches, each a short transaction of its own. :func:`doctor`
checks an installation and says how to fix what it finds. :func:`grant_roles` and
:func:`revoke_roles` give existing database roles (MySQL: accounts) exactly one kind of
access. All SQL is in ``sql/<engine>/queries.sql`` and the routines of migration 0003.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from importlib import resources
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from . import errors, migrate, routines, sqlfiles
from .api import read_committed_transaction, to_utc, translated
from .dialects import Dialect, dialect_for, dialect_of
from .handles import Handle, connection_of, engine_of, keyword_namespace
from .liveness import STALE_INTERVALS, ProcessKind
from .namespace import DEFAULT_NAMESPACE
from .validation import check_int, check_namespace, split_namespace

log = logging.getLogger("assetq.ops")


# -- status ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class DagStatus:
    """One consumer as the ``dag_queue_status`` view shows it: each field is the view's
    column of the same name, and the key of the same name in ``assetq status --json``.
    Times are UTC."""

    dag_id: str
    #: Paused (:func:`~assetq.pause_dag`): its assets' new events are not queued for it.
    is_paused: bool
    #: Events queued for the consumer and not consumed yet.
    queued_events: int
    #: Timestamp of the oldest queued event, None when nothing is queued.
    oldest_queued_at: datetime | None
    #: How long the oldest queued event has waited, in seconds by the server's clock (None
    #: when nothing is queued).
    oldest_queued_age_seconds: float | None
    #: Runs created in the last hour (runs already purged are not counted).
    runs_last_hour: int
    #: When the newest run still in the history was created.
    last_run_at: datetime | None
    #: Runs ever created for the consumer (its run sequence; purging keeps it).
    runs_total: int
    #: When a scheduler pass last examined the consumer.
    last_scheduled_at: datetime | None
    #: Its runs in state queued or running, and its cap on them (None: no cap).
    active_runs: int = 0
    max_active_runs: int | None = None
    #: Workers (docs/workers.md): its runs a worker holds now, the earliest end of their
    #: leases, how many of those leases have expired (the worker is likely dead: the run is
    #: claimed again as a new attempt, or failed when that was its last), active runs already
    #: on a retry (a failed attempt or an expired lease behind them), failed runs still in the
    #: history, and its max_attempts.
    running_runs: int = 0
    oldest_lease_until: datetime | None = None
    expired_leases: int = 0
    retrying_runs: int = 0
    failed_runs: int = 0
    max_attempts: int = 1

    @property
    def paused(self) -> bool:
        """Deprecated: use ``is_paused``, the view's and the JSON's name."""
        _renamed("DagStatus.paused", "DagStatus.is_paused")
        return self.is_paused

    @property
    def oldest_queued_age(self) -> timedelta | None:
        """Deprecated: use ``oldest_queued_age_seconds`` (a float, the view's and the JSON's
        name); this is it as a timedelta."""
        _renamed(
            "DagStatus.oldest_queued_age",
            "DagStatus.oldest_queued_age_seconds (seconds, a float; this was a timedelta)",
        )
        seconds = self.oldest_queued_age_seconds
        return None if seconds is None else timedelta(seconds=seconds)


def _renamed(old: str, new: str) -> None:
    # stacklevel 3: the caller's line that read the property.
    warnings.warn(f"{old} is deprecated: use {new}", DeprecationWarning, stacklevel=3)


def _optional_utc(value: datetime | None) -> datetime | None:
    return None if value is None else to_utc(value)


@keyword_namespace
def status(conn: Handle, *, namespace: str = DEFAULT_NAMESPACE) -> list[DagStatus]:
    """Every consumer of ``namespace`` with its queue depth, oldest queued event and recent
    runs, ordered by dag id. A read in the caller's transaction; the view it reads,
    ``dag_queue_status``, is documented in docs/operations.md for dashboards."""
    conn = connection_of(conn, "status")
    namespace = check_namespace(namespace)
    dialect = dialect_for(conn)
    # MariaDB: the same read with hashed join buffers (queries.sql says why).
    mariadb = bool(getattr(conn.dialect, "is_mariadb", False))
    query = "dag_queue_status_hashed" if mariadb else "dag_queue_status"
    with translated(dialect):
        rows = dialect.execute(conn, query, namespace)
    return [
        DagStatus(
            dag_id=str(row.dag_id),
            is_paused=bool(row.is_paused),
            queued_events=int(row.queued_events),
            oldest_queued_at=_optional_utc(row.oldest_queued_at),
            oldest_queued_age_seconds=None
            if row.oldest_queued_age_seconds is None
            else float(row.oldest_queued_age_seconds),
            runs_last_hour=int(row.runs_last_hour),
            last_run_at=_optional_utc(row.last_run_at),
            runs_total=int(row.runs_total),
            last_scheduled_at=_optional_utc(row.last_scheduled_at),
            active_runs=int(row.active_runs),
            max_active_runs=None if row.max_active_runs is None else int(row.max_active_runs),
            running_runs=int(row.running_runs),
            oldest_lease_until=_optional_utc(row.oldest_lease_until),
            expired_leases=int(row.expired_leases),
            retrying_runs=int(row.retrying_runs),
            failed_runs=int(row.failed_runs),
            max_attempts=int(row.max_attempts),
        )
        for row in rows
    ]


@dataclass(frozen=True)
class ProcessStatus:
    """One scheduler or worker loop of the liveness table. Times are
    UTC, ages by the database's clock. Field names are the columns' and the JSON keys of
    ``assetq status --json``."""

    process_id: str
    kind: ProcessKind
    #: The worker's name (its runs' ``worker`` starts with it); None for a scheduler.
    name: str | None
    host: str
    pid: int
    #: The assetq package version the process runs.
    version: str
    #: How often it promised to heartbeat, seconds.
    interval_seconds: float
    started_at: datetime
    last_seen_at: datetime
    last_seen_age_seconds: float
    #: Not seen for more than STALE_INTERVALS of its intervals: killed, hung, or its host or
    #: network gone. A clean stop deletes the row instead.
    stale: bool


def processes_supported(revision: str | None) -> bool:
    """Whether schema ``revision`` has the liveness table: every schema since the 0.1.0
    baseline does (tables.sql; it came with development revision 0010_liveness, which no
    release has); None, nothing installed, does not."""
    return revision is not None


@keyword_namespace
def processes(conn: Handle, *, namespace: str = DEFAULT_NAMESPACE) -> list[ProcessStatus]:
    """The scheduler and worker loops that recorded themselves in ``namespace``'s liveness
    table, schedulers first, each with how long ago it was last seen and whether it is
    stale (not seen for more than three of its intervals). A read in the caller's
    transaction. Rows of killed processes stay until ``purge`` removes them."""
    conn = connection_of(conn, "processes")
    namespace = check_namespace(namespace)
    dialect = dialect_for(conn)
    with translated(dialect):
        rows = dialect.execute(conn, "processes", namespace, {"stale_intervals": STALE_INTERVALS})
    return [
        ProcessStatus(
            process_id=str(row.process_id),
            kind="worker" if row.kind == "worker" else "scheduler",
            name=None if row.name is None else str(row.name),
            host=str(row.host),
            pid=int(row.pid),
            version=str(row.version),
            interval_seconds=float(row.interval_seconds),
            started_at=to_utc(row.started_at),
            last_seen_at=to_utc(row.last_seen_at),
            last_seen_age_seconds=max(0.0, float(row.last_seen_age_seconds)),
            stale=bool(row.stale),
        )
        for row in rows
    ]


# -- runs nobody can execute ----------------------------------------------------------------

#: A queued run that has been claimable this long with nobody claiming it is reported by
#: status, doctor and the Prometheus gauges (``--stuck-after`` on the command line).
DEFAULT_STUCK_AFTER = timedelta(minutes=5)


def handles_supported(revision: str | None) -> bool:
    """Whether schema ``revision`` has ``process_dag``, the consumers of each live worker
    (revision 0002_run_operations and later)."""
    return revision is not None and revision != "0001_baseline"


@dataclass(frozen=True)
class WorkerCoverage:
    """One consumer with queued runs or expired leases, and the live workers able to run
    them. Field names are the ``worker_coverage`` query's columns and the keys ``assetq status
    --json`` adds to each consumer."""

    dag_id: str
    #: Its runs in state queued (claimable now, or after a retry's delay).
    queued_runs: int
    #: Its running runs whose lease expired (their worker stopped renewing).
    expired_runs: int
    #: How long its oldest claimable queued run has waited since it became claimable (its
    #: ``not_before``), seconds by the database's clock; None when none is claimable yet.
    oldest_queued_run_age_seconds: float | None
    #: Queued runs claimable for longer than the ``stuck_after`` asked for.
    stuck_runs: int
    #: Workers not stale in the liveness table that have a handler for it.
    live_workers: int

    @property
    def no_worker(self) -> bool:
        """Runs wait (queued, or an expired lease) and no live worker has a handler for it."""
        return bool(self.queued_runs or self.expired_runs) and self.live_workers == 0


def _check_stuck_after(stuck_after: object, name: str = "stuck_after") -> float:
    """A positive timedelta's seconds (InvalidArgumentType, InvalidArgument otherwise)."""
    if not isinstance(stuck_after, timedelta):
        raise errors.InvalidArgumentType(
            f"{name} must be a datetime.timedelta, got {type(stuck_after).__name__}"
        )
    if stuck_after <= timedelta(0):
        raise errors.InvalidArgument(f"{name} must be positive, got {stuck_after}")
    return stuck_after.total_seconds()


def can_operate(conn: Handle, *, namespace: str = DEFAULT_NAMESPACE) -> bool | None:
    """Whether the connected role may retry and cancel runs and pause consumers (EXECUTE on
    cancel_run, retry_run and set_dag_paused): what the console's actions call. None where
    the engine does not say (MySQL). A read in the caller's transaction."""
    conn = connection_of(conn, "can_operate")
    namespace = check_namespace(namespace)
    dialect = dialect_for(conn)
    with translated(dialect):
        (row,) = dialect.execute(conn, "can_operate", namespace)
    return None if row.can_operate is None else bool(row.can_operate)


@keyword_namespace
def worker_coverage(
    conn: Handle,
    *,
    stuck_after: timedelta = DEFAULT_STUCK_AFTER,
    namespace: str = DEFAULT_NAMESPACE,
) -> list[WorkerCoverage]:
    """The consumers with queued runs or expired leases, by dag id, each with the live
    workers that have a handler for it (``no_worker``: none) and its queued runs claimable
    for longer than ``stuck_after``. A read in the caller's transaction of the active runs
    and the liveness tables, never the history; needs only a reader's rights. Empty on a
    schema from before workers recorded their consumers."""
    conn = connection_of(conn, "worker_coverage")
    stuck_seconds = _check_stuck_after(stuck_after)
    namespace = check_namespace(namespace)
    dialect = dialect_for(conn)
    if not handles_supported(migrate.current_revision(conn, namespace=namespace)):
        return []
    params = {"stuck_seconds": stuck_seconds, "stale_intervals": STALE_INTERVALS}
    with translated(dialect):
        rows = dialect.execute(conn, "worker_coverage", namespace, params)
    return [
        WorkerCoverage(
            dag_id=str(row.dag_id),
            queued_runs=int(row.queued_runs or 0),
            expired_runs=int(row.expired_runs or 0),
            oldest_queued_run_age_seconds=None
            if row.oldest_queued_run_age_seconds is None
            else max(0.0, float(row.oldest_queued_run_age_seconds)),
            stuck_runs=int(row.stuck_runs or 0),
            live_workers=int(row.live_workers),
        )
        for row in rows
    ]


# -- purge ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PurgeResult:
    """What :func:`purge` deleted."""

    #: Runs and events from before this moment (UTC, the server's clock) were candidates.
    cutoff: datetime
    runs_deleted: int
    events_deleted: int
    #: Old events looked at; those still queued or linked to a kept run were kept.
    events_examined: int
    #: Transactions committed deleting runs and events.
    batches: int
    #: Liveness rows of stale processes (killed loops) last seen before the cutoff, deleted;
    #: a live process's row is never deleted, whatever the cutoff.
    processes_deleted: int = 0


#: Codes of a foreign-key refusal to delete a referenced row, retried: the retry's test sees
#: what made the key refuse and keeps the row. Until 0013_queue_checks the queue's key to
#: asset_event refused a batch that met an event queued after its test (only a raw INSERT
#: into the queue can do that); since then no key refuses a purge's deletes (the ones left
#: cascade), and this stays only as a guard should a later revision add one.
_FK_REFUSED = frozenset({"23503", "1451"})


def _batch(
    engine: Engine, query: str, namespace: str, params: dict[str, Any], max_attempts: int
) -> Any:
    """Run one purge batch in a READ COMMITTED transaction of its own (so every read is fresh
    and a plain read locks nothing); retry what a retry cures. Returns the batch's row."""
    rows = read_committed_transaction(
        engine, query, namespace, params, "purge batch", max_attempts, _FK_REFUSED
    )
    return rows[0]


def purge(
    engine: Engine,
    *,
    older_than: timedelta,
    batch_size: int = 1000,
    namespace: str = DEFAULT_NAMESPACE,
    max_attempts: int = 8,
) -> PurgeResult:
    """Delete history older than ``older_than``: finished runs (success or failed) created
    before the cutoff with their links, then events from before the cutoff that nobody waits
    for any more (no queue row) and no kept run consumed (no link). A queued event, and a
    queued or running run, is never deleted, however old: a long run's worker always finds it.

    Works in batches of at most ``batch_size`` rows, each a short transaction of its own,
    so it never holds locks for long; rows another transaction holds are skipped (SKIP
    LOCKED) rather than waited for. Safe to run while producers and schedulers work, and
    from several processes (they skip each other's batches). Deleting an event frees its
    idempotency key: keep ``older_than`` longer than any producer's retry horizon.
    """
    engine = engine_of(engine, "purge")
    _check_older_than(older_than)
    check_int(batch_size, "batch_size", 1, 100_000)
    check_int(max_attempts, "max_attempts", 1, 100)
    namespace = check_namespace(namespace)

    # One short transaction, retried like the batches (a failover raises at connect time).
    cutoff = read_committed_transaction(
        engine,
        "purge_cutoff",
        namespace,
        {"seconds": older_than.total_seconds()},
        "purge cutoff",
        max_attempts,
    )[0].cutoff

    batches = runs_deleted = 0
    while True:
        row = _batch(
            engine,
            "purge_runs",
            namespace,
            {"older_than": cutoff, "batch_size": batch_size},
            max_attempts,
        )
        batches += 1
        runs_deleted += int(row.deleted)
        if int(row.deleted) == 0:  # none left, or only runs someone else holds
            break

    events_deleted = events_examined = 0
    after_timestamp: Any = None
    after_id: int | None = None
    while True:
        row = _batch(
            engine,
            "purge_events",
            namespace,
            {
                "older_than": cutoff,
                "batch_size": batch_size,
                "after_timestamp": after_timestamp,
                "after_id": after_id,
            },
            max_attempts,
        )
        batches += 1
        events_deleted += int(row.deleted)
        events_examined += int(row.examined)
        if int(row.examined) < batch_size:
            break
        after_timestamp, after_id = row.last_timestamp, int(row.last_id)

    # Not counted in batches: those are the runs' and events'.
    processes_deleted = _purge_processes(engine, namespace, cutoff)
    _purge_process_dags(engine, namespace)

    result = PurgeResult(
        cutoff=to_utc(cutoff),
        runs_deleted=runs_deleted,
        events_deleted=events_deleted,
        events_examined=events_examined,
        batches=batches,
        processes_deleted=processes_deleted or 0,
    )
    log.info(
        "assetq: purged %d runs and %d of %d events older than %s in %d batches",
        runs_deleted,
        events_deleted,
        events_examined,
        result.cutoff.isoformat(),
        batches,
    )
    return result


def _check_older_than(older_than: object) -> None:
    if not isinstance(older_than, timedelta):
        raise errors.InvalidArgumentType(
            f"older_than must be a datetime.timedelta, got {type(older_than).__name__}"
        )
    if older_than < timedelta(0):
        raise errors.InvalidArgument(f"older_than must not be negative, got {older_than}")


def _cutoff(dialect: Dialect, conn: Connection, namespace: str, older_than: timedelta) -> Any:
    rows = dialect.execute(conn, "purge_cutoff", namespace, {"seconds": older_than.total_seconds()})
    # Passed back as the driver returned it: aware on PostgreSQL, naive UTC on MySQL.
    return rows[0].cutoff


# -- dry runs -------------------------------------------------------------------------------
# What purge and uninstall would delete, counted and not deleted. These reads are built with
# SQLAlchemy Core (the same statement on both engines, identifiers quoted by SQLAlchemy);
# they belong in queries.sql as purge_preview and namespace_row_count.


def _table(namespace: str, name: str, *columns: str) -> sa.TableClause:
    # A MySQL namespace with a table prefix (appdb.assetq_): the prefixed table in its database.
    database, prefix = split_namespace(namespace)
    return sa.table(prefix + name, *(sa.column(c) for c in columns), schema=database)


def _purge_processes(engine: Engine, namespace: str, cutoff: Any) -> int | None:
    """Delete the liveness rows last seen before ``cutoff`` that are stale (not seen for
    STALE_INTERVALS of their interval: killed processes; a live one's row stays whatever the
    cutoff), in one short transaction; None on a schema without the liveness table."""
    dialect = dialect_of(engine)
    with translated(dialect), engine.begin() as conn:
        if not processes_supported(migrate.current_revision(conn, namespace=namespace)):
            return None
        result = conn.execute(
            dialect.statement("purge_processes", namespace),
            {"older_than": cutoff, "stale_intervals": STALE_INTERVALS},
        )
        return int(result.rowcount or 0)


def _purge_process_dags(engine: Engine, namespace: str) -> None:
    """Delete the consumers (process_dag) of processes whose liveness row is gone, in one
    short transaction: a liveness row and its consumers go together. Nothing on a schema
    without process_dag."""
    dialect = dialect_of(engine)
    with translated(dialect), engine.begin() as conn:
        if handles_supported(migrate.current_revision(conn, namespace=namespace)):
            conn.execute(dialect.statement("purge_process_dags", namespace))


@dataclass(frozen=True)
class PurgePreview:
    """What :func:`purge` would delete now; nothing was deleted."""

    #: Now minus older_than, by the database's clock (UTC).
    cutoff: datetime
    #: Finished runs (success, failed) created before the cutoff, purged with their links.
    runs: int
    #: Events from before the cutoff that nobody has queued and no kept run consumed.
    events: int
    #: Liveness rows of stale processes last seen before the cutoff.
    processes: int = 0


def purge_preview(
    engine: Engine, *, older_than: timedelta, namespace: str = DEFAULT_NAMESPACE
) -> PurgePreview:
    """Count what :func:`purge` with this ``older_than`` would delete, deleting nothing: one
    read, locking nothing. A purge run afterwards may delete a little more or less (events
    consumed meanwhile, rows another transaction holds, which purge skips). It repeats the
    tests of the purge_runs and purge_events routines: change them together
    (tests/test_cli_namespaces.py compares the two)."""
    engine = engine_of(engine, "purge_preview")
    _check_older_than(older_than)
    namespace = check_namespace(namespace)
    run = _table(namespace, "dag_run", "id", "created_at", "state")
    event = _table(namespace, "asset_event", "id", "timestamp")
    queue = _table(namespace, "asset_dag_run_queue", "asset_event_id")
    link = _table(namespace, "dagrun_asset_event", "dag_run_id", "asset_event_id")
    with engine.connect() as conn:
        dialect = dialect_for(conn)
        with translated(dialect):
            cutoff = _cutoff(dialect, conn, namespace, older_than)
            # The runs purge_runs deletes: the same test as its WHERE clause (finished runs
            # only: a worker may still hold an active one).
            purged = sa.and_(run.c.created_at < cutoff, run.c.state.in_(("success", "failed")))
            runs = conn.execute(
                sa.select(sa.func.count()).select_from(run).where(purged)
            ).scalar_one()
            queued = sa.select(queue.c.asset_event_id).where(queue.c.asset_event_id == event.c.id)
            kept = (
                sa.select(link.c.asset_event_id)
                .join(run, run.c.id == link.c.dag_run_id)
                .where(link.c.asset_event_id == event.c.id, ~purged)
            )
            events = conn.execute(
                sa.select(sa.func.count())
                .select_from(event)
                .where(event.c.timestamp < cutoff, ~sa.exists(queued), ~sa.exists(kept))
            ).scalar_one()
            old_processes = 0
            if processes_supported(migrate.current_revision(conn, namespace=namespace)):
                old_processes = int(
                    dialect.execute(
                        conn,
                        "old_processes",
                        namespace,
                        {"older_than": cutoff, "stale_intervals": STALE_INTERVALS},
                    )[0][0]
                )
    return PurgePreview(
        cutoff=to_utc(cutoff), runs=int(runs), events=int(events), processes=old_processes
    )


@dataclass(frozen=True)
class UninstallPreview:
    """What :func:`assetq.uninstall` would remove from a namespace now; nothing was removed."""

    namespace: str
    revision: str | None
    #: assetq's objects by kind (table, view, routine, trigger), its version table included.
    objects: dict[str, int]
    #: Rows of each of assetq's tables.
    rows: dict[str, int]
    #: Objects in the namespace that are not assetq's: they stay, and so does the namespace.
    others: list[str]

    @property
    def total_rows(self) -> int:
        return sum(self.rows.values())


@keyword_namespace
def uninstall_preview(engine: Engine, *, namespace: str = DEFAULT_NAMESPACE) -> UninstallPreview:
    """Count what :func:`assetq.uninstall` would remove from ``namespace``, removing nothing:
    assetq's tables, views, routines and triggers (those of this package's schema), and the
    rows of its tables. Reads only."""
    engine = engine_of(engine, "uninstall_preview")
    namespace = check_namespace(namespace)
    with engine.connect() as conn:
        dialect = dialect_for(conn)
        with translated(dialect):
            revision = migrate.current_revision(conn, namespace=namespace)
            present = {
                (str(r.kind), str(r.name))
                for r in dialect.execute(
                    conn, "namespace_objects", namespace, {"namespace": namespace}
                )
            }
            ours = present & (expected_objects(dialect.name) | {("table", migrate.VERSION_TABLE)})
            objects: dict[str, int] = {}
            for kind, _ in ours:
                objects[kind] = objects.get(kind, 0) + 1
            rows = {
                name: int(
                    conn.execute(
                        sa.select(sa.func.count()).select_from(_table(namespace, name))
                    ).scalar_one()
                )
                for kind, name in sorted(ours)
                if kind == "table" and name != migrate.VERSION_TABLE
            }
    others = sorted(f"{kind} {name}" for kind, name in present - ours)
    return UninstallPreview(
        namespace=namespace, revision=revision, objects=objects, rows=rows, others=others
    )


# -- grant ----------------------------------------------------------------------------------

#: A role (PostgreSQL) or account (MySQL): a name, or (user, host) for a MySQL account.
#: A bare name on MySQL means the account ``name@'%'``.
Grantee = str | tuple[str, "str | None"]

ACCESS_KINDS = ("producer", "scheduler", "worker", "reader")


def _grantee(value: object) -> tuple[str, str | None]:
    if isinstance(value, str):
        name, host = value, None
    elif (
        isinstance(value, tuple)
        and len(value) == 2
        and isinstance(value[0], str)
        and (value[1] is None or isinstance(value[1], str))
    ):
        name, host = value
    else:
        raise errors.InvalidArgumentType(
            f"a grantee is a role name or a (user, host) pair, got {value!r}"
        )
    if not name or "\x00" in name or len(name) > 128:
        raise errors.InvalidArgument(f"invalid role name {name!r}")
    if host is not None and (not host or "\x00" in host or len(host) > 255):
        raise errors.InvalidArgument(f"invalid host {host!r}")
    return name, host


def _grantees(value: Grantee | Iterable[Grantee] | None) -> list[tuple[str, str | None]]:
    if value is None:
        return []
    if isinstance(value, (str, tuple)):
        return [_grantee(value)]
    return [_grantee(v) for v in value]


def grant_roles(
    engine: Engine,
    *,
    producer: Grantee | Iterable[Grantee] | None = None,
    scheduler: Grantee | Iterable[Grantee] | None = None,
    reader: Grantee | Iterable[Grantee] | None = None,
    worker: Grantee | Iterable[Grantee] | None = None,
    namespace: str = DEFAULT_NAMESPACE,
) -> None:
    """Give existing roles (MySQL: accounts) one kind of access each to ``namespace``.

    - producer: may register events (``register_event``, ``register_events``) and nothing
      else: no right on any table.
    - scheduler: may run scheduler passes (``schedule`` / ``run_scheduler``), move run states
      (``set_run_state``) and retry failed runs (``retry_run``), and nothing else.
    - worker: may claim runs, renew their leases and complete them with their output events
      (``claim_runs``, ``heartbeat``, ``complete_run``, ``run_worker``), and nothing else. A
      handler's own writes need the rights you give the role on your tables.
    - reader: may read every table and the ``dag_queue_status`` view, never write.

    The routines run with their owner's (MySQL: definer's) rights, so producers and
    schedulers need no table rights. Call it as the account that installed assetq. One
    transaction on PostgreSQL; idempotent. Grant again after an upgrade that adds tables (a
    reader's SELECT covers the tables that exist when it is granted).
    """
    engine = engine_of(engine, "grant_roles")
    namespace = check_namespace(namespace)
    plan = [
        (access, grantee)
        for access, value in (
            ("producer", producer),
            ("scheduler", scheduler),
            ("worker", worker),
            ("reader", reader),
        )
        for grantee in _grantees(value)
    ]
    with engine.begin() as conn:
        dialect = dialect_for(conn)
        with translated(dialect):
            for access, (name, host) in plan:
                dialect.execute(
                    conn,
                    "grant_access",
                    namespace,
                    {"access": access, "grantee": name, "host": host},
                )
                log.info("assetq: granted %s access to %s", access, name)


def revoke_roles(
    engine: Engine, grantees: Grantee | Iterable[Grantee], *, namespace: str = DEFAULT_NAMESPACE
) -> None:
    """Take away every kind of access :func:`grant_roles` gave these roles. Idempotent."""
    engine = engine_of(engine, "revoke_roles")
    namespace = check_namespace(namespace)
    plan = _grantees(grantees)
    with engine.begin() as conn:
        dialect = dialect_for(conn)
        with translated(dialect):
            for name, host in plan:
                dialect.execute(conn, "revoke_access", namespace, {"grantee": name, "host": host})
                log.info("assetq: revoked access of %s", name)


# -- doctor ---------------------------------------------------------------------------------

Severity = Literal["ok", "note", "problem"]


@dataclass(frozen=True)
class Check:
    """One finding of :func:`doctor`."""

    name: str
    severity: Severity
    detail: str
    #: What to do about a problem (empty otherwise).
    fix: str = ""


@dataclass(frozen=True)
class DoctorReport:
    namespace: str
    server: str
    revision: str | None
    head: str
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No check found a problem (notes are information only)."""
        return not any(c.severity == "problem" for c in self.checks)


#: Triggers an operator may disable on purpose: the wake-ups (schedulers and workers then only
#: poll), with what disabling one does.
OPTIONAL_TRIGGERS = {
    "asset_dag_run_queue_notify": "schedulers are not woken, they poll (a choice: it spares"
    " durable producers the commit-time cost of NOTIFY)",
    "dag_run_notify": "workers are not woken when runs are created, they poll",
}

#: Routines granted to producer, scheduler and worker roles: they must run with their owner's
#: rights.
DEFINER_ROUTINES = (
    "register_event",
    "register_event_v2",
    "register_events",
    "register_events_v2",
    "schedule_pass",
    "schedule_pass_v2",
    "set_run_state",
    "retry_run",
    "cancel_run",
    "claim_runs",
    "claim_runs_v2",
    "schedule_and_claim",
    "heartbeat_run",
    "heartbeat_run_v2",
    "complete_run_v2",
    "complete_run",
    "process_heartbeat",
    "process_gone",
    "process_handles",
)

_CREATE = re.compile(
    r"\bCREATE\s+(?:OR\s+REPLACE\s+)?(?:SQL\s+SECURITY\s+\w+\s+)?"
    r"(TABLE|VIEW|FUNCTION|PROCEDURE|TRIGGER)\s+(?:IF\s+NOT\s+EXISTS\s+)?"
    r"(?:\{\{ns\}\}\.)?(\w+)"
)
_KIND = {
    "TABLE": "table",
    "VIEW": "view",
    "FUNCTION": "routine",
    "PROCEDURE": "routine",
    "TRIGGER": "trigger",
}


def expected_objects(engine_name: str) -> set[tuple[str, str]]:
    """(kind, name) of every table, view, routine and trigger a fresh install creates, read
    from the packaged files (helpers named ``_assetq_*`` live only during a script)."""
    found: set[tuple[str, str]] = set()
    for text in sqlfiles.schema_texts(engine_name):
        code = sqlfiles.without_comments(text)
        found.update(
            (_KIND[kind], name)
            for kind, name in _CREATE.findall(code)
            if not name.startswith("_assetq") and name != "assetq_alembic_version"
        )
    return found


def _schema_file(engine_name: str) -> str:
    """Where the installed package keeps its SQL files (for fix-it messages)."""
    return str(resources.files("assetq.sql").joinpath(engine_name))


def _settings(dialect: Dialect, conn: Connection, namespace: str) -> dict[str, str]:
    rows = dialect.execute(conn, "server_settings", namespace)
    # SHOW on MySQL names its columns Variable_name and Value: read them by position.
    pairs = [tuple(row) for row in rows]
    return {str(pair[0]): str(pair[1]) for pair in pairs}


def _revision_check(
    revision: str | None, head: str, namespace: str, clients_from: str | None = None
) -> Check:
    """The schema against this package: the same advice as the first API call's
    (migrate.schema_advice), with the compatibility window."""
    advice = migrate.schema_advice(revision, clients_from, namespace)
    if advice is not None:
        return Check("revision", "problem", advice.problem, advice.fix)
    if revision == head:
        return Check("revision", "ok", f"schema {revision}, this package's head")
    return Check(
        "revision",
        "ok",
        f"schema {revision} is newer than this package (head {head}) and works with packages"
        f" from schema {clients_from}: within the compatibility window",
        "restart this process with the newer package when convenient (rolling deploy)",
    )


def _definition_checks(
    dialect: Dialect, conn: Connection, namespace: str, revision: str
) -> list[Check]:
    """Routine bodies, trigger definitions, view text: compared with this package's files
    directly (assetq.routines.differences: the catalogue's checksums and the definitions the
    server prints), in two reads, nothing created. Only at this package's head: another
    revision's routines are its own package's."""
    if revision != migrate.head_revision():
        return []
    found = routines.differences(conn, namespace)
    # Missing objects are the objects check's finding, and whether a trigger is enabled too
    # (a disabled wake-up trigger is a choice): this one compares what is there.
    stale = [d for d in found if d.reason in ("changed", "altered")]
    newer = [d for d in found if d.reason == "newer"]
    unreadable = [d for d in found if d.reason == "unreadable"]
    checks: list[Check] = []
    if stale:
        what = "; ".join(
            f"{d.label} {'was changed by hand' if d.reason == 'altered' else 'is not its file'}"
            for d in stale
        )
        checks.append(
            Check(
                "definitions",
                "problem",
                f"not as this package's files define them: {what}",
                f"run `assetq repair --namespace {namespace}` as the owner (re-creates them"
                " in place from the files; data untouched)",
            )
        )
    if newer:
        checks.append(
            Check(
                "definitions",
                "note",
                "written by a newer assetq package ("
                + ", ".join(f"{d.label}: {d.recorded_by}" for d in newer)
                + "), left as they are",
                "restart this process with the newer package when convenient (rolling deploy)",
            )
        )
    if unreadable:
        checks.append(
            Check(
                "definitions",
                "note",
                f"{len(unreadable)} bodies not compared: this account may not read them"
                " (MySQL shows a routine's body to its definer and to accounts that may read"
                " mysql.proc)",
                "run doctor as the owner to compare them, or GRANT SELECT ON mysql.proc"
                " (MySQL 8: GRANT SHOW_ROUTINE ON *.*) to this account",
            )
        )
    if not checks:
        checks.append(Check("definitions", "ok", "routines, triggers and views are their files'"))
    return checks


def _object_checks(
    dialect: Dialect, conn: Connection, namespace: str, revision: str | None
) -> list[Check]:
    rows = dialect.execute(conn, "namespace_objects", namespace, {"namespace": namespace})
    present = {(str(r.kind), str(r.name)) for r in rows}
    disabled = sorted(str(r.name) for r in rows if r.kind == "trigger" and r.detail == "disabled")
    expected = expected_objects(dialect.name)
    checks: list[Check] = []
    missing = sorted(expected - present)
    where = _schema_file(dialect.name)
    # Where each object is created: its own file; a table in tables.sql or in the step
    # that added it after the baseline.
    files = {(f.kind, f.name): f.path for f in sqlfiles.object_files(dialect.name)}
    for path in ("tables.sql", *(f"steps/{s}" for s in sqlfiles.step_names(dialect.name))):
        for kind, name in _CREATE.findall(sqlfiles.read(dialect.name, path)):
            files.setdefault((_KIND[kind], name), path)
    for kind, name in missing:
        file = f"{where}/{files.get((kind, name), 'tables.sql')}"
        why = {
            "asset_event_fan_out": ": events are not queued for any consumer (I1)",
            "asset_dag_run_queue_notify": ": schedulers are not woken, they only poll",
            "dag_run_notify": ": workers are not woken when runs are created, they only poll",
        }.get(name, "")
        checks.append(
            Check(
                f"{kind} {name}",
                "problem",
                f"{kind} {name} is missing from namespace {namespace!r}"
                f" (expected at revision {revision}){why}",
                f"run `assetq repair --namespace {namespace}` as the owner: it re-creates it"
                f" from its file, {file}, data untouched"
                if kind != "table"
                else f"recreate it with its CREATE statement in {file}, as the owner; or"
                " reinstall into a new namespace",
            )
        )
    for name in disabled:
        if name in OPTIONAL_TRIGGERS:
            checks.append(
                Check(
                    f"trigger {name}",
                    "note",
                    f"trigger {name} is disabled: {OPTIONAL_TRIGGERS[name]}",
                )
            )
            continue
        checks.append(
            Check(
                f"trigger {name}",
                "problem",
                f"trigger {name} is disabled",
                f"ALTER TABLE ... ENABLE TRIGGER {name} (the table is in {namespace!r})",
            )
        )
    if not missing and not set(disabled) - set(OPTIONAL_TRIGGERS):
        checks.append(
            Check(
                "objects",
                "ok",
                f"all {len(expected)} tables, views, routines and triggers present"
                + (", triggers enabled" if dialect.supports_notify else ""),
            )
        )
    extra = sorted(
        f"{k} {n}"
        for k, n in present - expected
        if not n.startswith("_assetq") and n != "assetq_alembic_version"
    )
    if extra:
        checks.append(Check("other objects", "note", "not assetq's: " + ", ".join(extra)))
    return checks


def _security_checks(dialect: Dialect, conn: Connection, namespace: str) -> list[Check]:
    rows = {
        str(r.name): r
        for r in dialect.execute(conn, "routine_security", namespace, {"namespace": namespace})
    }
    checks: list[Check] = []
    wrong = []
    for name in DEFINER_ROUTINES:
        row = rows.get(name)
        if row is None:
            continue  # reported as missing already
        # config is NULL where the engine pins no settings (MySQL).
        pinned = row.config is None or "search_path=pg_catalog, pg_temp" in str(row.config)
        if row.security != "DEFINER" or not pinned:
            wrong.append(name)
    if wrong:
        checks.append(
            Check(
                "routine security",
                "problem",
                f"{', '.join(wrong)} must run with the owner's rights"
                " (SECURITY DEFINER, search_path pinned to pg_catalog, pg_temp on PostgreSQL):"
                " roles given access have no table rights",
                f"someone altered them: run `assetq repair --namespace {namespace}` as the"
                " owner (re-creates them from their files, grants kept)",
            )
        )
    else:
        checks.append(
            Check(
                "routine security",
                "ok",
                f"{', '.join(DEFINER_ROUTINES)} run with their owner's rights",
            )
        )
    owners = sorted({str(r.owner) for r in rows.values()})
    superuser = any(bool(r.owner_is_superuser) for r in rows.values())
    detail = f"routines owned by {', '.join(owners)}" if owners else "no routines"
    if superuser:
        checks.append(
            Check(
                "routine owner",
                "note",
                detail + " (a superuser): the SECURITY DEFINER routines run as a superuser;"
                " a dedicated owner role that owns only the namespace is safer",
            )
        )
    elif owners:
        checks.append(Check("routine owner", "ok", detail))
    for owner in owners:
        try:
            with conn.begin_nested():
                found = dialect.execute(conn, "account_exists", namespace, {"account": owner})
        except DBAPIError:
            checks.append(
                Check(
                    "routine owner",
                    "note",
                    f"cannot tell whether the definer {owner} exists (no right to read the"
                    " account list); if it was dropped, every call fails",
                )
            )
            continue
        if not int(found[0][0]):
            checks.append(
                Check(
                    "routine owner",
                    "problem",
                    f"the routines' definer {owner} does not exist: every call fails",
                    f"create the account {owner} again (with rights on the namespace), or"
                    " reinstall as an existing account",
                )
            )
    return checks


def _privilege_check(dialect: Dialect, conn: Connection, namespace: str) -> Check:
    row = dialect.execute(conn, "current_privileges", namespace)[0]
    if row.can_register is None:
        return Check(
            "privileges",
            "note",
            f"connected as {row.account}; routine privileges are not visible to every"
            " account on this engine (see SHOW GRANTS)",
        )
    can = [
        what
        for what, yes in (
            ("register events", row.can_register),
            ("run scheduler passes", row.can_schedule),
            ("read status", row.can_read_status),
        )
        if yes
    ]
    return Check(
        "privileges",
        "ok" if can else "note",
        f"connected as {row.account}, who may "
        + (", ".join(can) if can else "do nothing with assetq here"),
    )


def _server_checks(settings: dict[str, str]) -> list[Check]:
    checks: list[Check] = []
    isolation = settings.get("transaction_isolation") or settings.get("tx_isolation")
    if isolation is not None:  # MySQL / MariaDB
        rc = isolation.upper().replace("-", " ") == "READ COMMITTED"
        checks.append(
            Check(
                "isolation",
                "ok" if rc else "note",
                f"server default isolation {isolation}"
                + (
                    ""
                    if rc
                    else "; not a problem: assetq runs every scheduler pass and purge batch at"
                    " READ COMMITTED itself (a raw CALL schedule_pass at REPEATABLE READ is"
                    " refused with AQ900)"
                ),
            )
        )
        zone = settings.get("time_zone", "?")
        system = settings.get("system_time_zone", "")
        checks.append(
            Check(
                "time zone",
                "ok",
                f"server time_zone {zone}"
                + (f" (system {system})" if zone == "SYSTEM" and system else "")
                + "; not a problem: assetq writes UTC_TIMESTAMP(6), whatever the zone",
            )
        )
    else:
        default = settings.get("default_transaction_isolation", "?")
        checks.append(
            Check(
                "isolation",
                "ok",
                f"default isolation {default}; assetq runs its passes at READ COMMITTED",
            )
        )
    return checks


def _deployment_checks(dialect: Dialect, conn: Connection, namespace: str) -> list[Check]:
    """A standby or read-only server, binary logging that refuses assetq's writes
    (docs/deployment.md). Nothing when the deployment is fine."""
    rows = dialect.execute(conn, "deployment_settings", namespace)
    pairs = [tuple(row) for row in rows]  # SHOW names its columns otherwise: by position
    found = {str(pair[0]).lower(): str(pair[1]).upper() for pair in pairs}
    checks: list[Check] = []
    if found.get("in_recovery") in ("TRUE", "ON"):
        checks.append(
            Check(
                "read-only",
                "problem",
                "this server is a standby (in recovery): it refuses every write, so producers,"
                " passes and workers fail here with SQLSTATE 25006",
                "point the URL at the primary; with several nodes use a libpq multi-host URL"
                " with target_session_attrs=read-write (postgresql://u@node1,node2/db?"
                "target_session_attrs=read-write), which always reaches the writable one",
            )
        )
    elif found.get("default_transaction_read_only") == "ON" or found.get("read_only") == "ON":
        checks.append(
            Check(
                "read-only",
                "problem",
                "the server's sessions are read-only by default"
                + (
                    " (read_only=ON: accounts without READ ONLY ADMIN or SUPER cannot write)"
                    if "read_only" in found
                    else " (default_transaction_read_only=on)"
                ),
                "switch it off for assetq's accounts (ALTER ROLE/DATABASE ... SET"
                " default_transaction_read_only = off; MySQL: SET GLOBAL read_only = OFF), or"
                " point the URL at the primary",
            )
        )
    if found.get("log_bin") == "ON" and found.get("binlog_format") == "STATEMENT":
        checks.append(
            Check(
                "binary log",
                "problem",
                "binlog_format=STATEMENT with binary logging on: InnoDB refuses writes at READ"
                " COMMITTED (error 1665), the level every scheduler pass runs at, so every pass"
                " fails",
                "set binlog_format=ROW (or MIXED) in the server's configuration and"
                " SET GLOBAL binlog_format = 'ROW' (sessions opened after it take it)",
            )
        )
    elif "log_bin" in found:
        checks.append(
            Check(
                "binary log",
                "ok",
                f"binary logging {found['log_bin']}"
                + (f", format {found.get('binlog_format')}" if found["log_bin"] == "ON" else ""),
            )
        )
    return checks


def _work_checks(conn: Connection, namespace: str) -> list[Check]:
    """Runs a dead worker holds (expired leases) and consumers blocked at their cap."""
    checks: list[Check] = []
    rows = status(conn, namespace=namespace)
    for row in rows:
        if row.expired_leases:
            checks.append(
                Check(
                    "leases",
                    "problem",
                    f"{row.dag_id}: {row.expired_leases} running runs have expired leases"
                    f" (the oldest ended at {row.oldest_lease_until:%Y-%m-%d %H:%M:%S} UTC):"
                    " their workers stopped renewing them",
                    f"make sure a worker runs for {row.dag_id} (`assetq worker`): the next claim"
                    " takes each run again as a new attempt, or fails it when that was its"
                    " last attempt",
                )
            )
        at_cap = row.max_active_runs is not None and row.active_runs >= row.max_active_runs
        if at_cap and row.queued_events:
            waiting = row.active_runs - row.running_runs
            checks.append(
                Check(
                    "cap",
                    "problem" if row.expired_leases or waiting else "note",
                    f"{row.dag_id} is at its cap ({row.active_runs}/{row.max_active_runs} active"
                    f" runs: {row.running_runs} running, {waiting} queued) with"
                    f" {row.queued_events} events waiting",
                    "queued runs need a worker (`assetq worker`) or `assetq.set_run_state`;"
                    " the next run is created when an active one finishes"
                    if waiting or row.expired_leases
                    else "",
                )
            )
    if not checks:
        checks.append(
            Check("work", "ok", f"{len(rows)} consumers: no expired lease, none blocked at its cap")
        )
    return checks


def _coverage_checks(conn: Connection, namespace: str, stuck_after: timedelta) -> list[Check]:
    """Consumers whose runs wait with no live worker able to run them, and queued runs
    claimable for longer than ``stuck_after``. No worker is a problem once a run has waited
    that long (or a lease expired), a note before: a run created a moment ago while workers
    restart, or one a runner without claims moves with set_run_state, is not yet one."""
    checks: list[Check] = []
    for c in worker_coverage(conn, stuck_after=stuck_after, namespace=namespace):
        waiting = f"{c.queued_runs} queued runs and {c.expired_runs} expired leases"
        if c.no_worker:
            checks.append(
                Check(
                    "workers",
                    "problem" if c.stuck_runs or c.expired_runs else "note",
                    f"{c.dag_id}: {waiting}, and no live worker has a handler for it",
                    f"start a worker with a handler for {c.dag_id} (`assetq worker --handlers"
                    f" MODULE:NAME`, NAME mapping {c.dag_id!r} to its handler); workers of a"
                    " package without process_handles record no consumers and are not counted",
                )
            )
        elif c.stuck_runs:
            age = c.oldest_queued_run_age_seconds or 0.0
            checks.append(
                Check(
                    "queued",
                    "problem",
                    f"{c.dag_id}: {c.stuck_runs} queued runs claimable for longer than"
                    f" {stuck_after.total_seconds():g} s (the oldest for {age:.0f} s) although"
                    f" {c.live_workers} live workers have a handler for it",
                    "its workers are busy or stuck: add workers or --concurrency, or look"
                    " at what their handlers wait for (`assetq status`, `assetq runs --dag"
                    f" {c.dag_id} --state running`)",
                )
            )
    if not checks:
        checks.append(
            Check(
                "workers",
                "ok",
                "every consumer with runs waiting has a live worker, none queued longer than"
                f" {stuck_after.total_seconds():g} s",
            )
        )
    return checks


def _liveness_checks(conn: Connection, namespace: str) -> list[Check]:
    """Stale rows of the liveness table: notes, not problems. A stale row is a scheduler or
    worker that stopped heartbeating without a clean stop (killed, hung, its host gone);
    whether another one took its place, doctor cannot know."""
    rows = processes(conn, namespace=namespace)
    stale = [p for p in rows if p.stale]
    live = len(rows) - len(stale)
    if not stale:
        return [
            Check(
                "liveness",
                "ok",
                f"{live} live processes"
                + (
                    " (schedulers and workers record themselves in the liveness table)"
                    if not rows
                    else ""
                ),
            )
        ]
    return [
        Check(
            "liveness",
            "note",
            f"{p.kind} {p.host}:{p.pid} (version {p.version}) is stale: last seen"
            f" {p.last_seen_at:%Y-%m-%d %H:%M:%S} UTC, {p.last_seen_age_seconds:.0f} s ago, more"
            f" than {STALE_INTERVALS} of its {p.interval_seconds:g} s intervals; it stopped"
            " without a clean stop (killed, hung, or its host is gone)",
            f"if it was not replaced, start a {p.kind} again; `assetq purge` removes rows of"
            " stale processes last seen before its cutoff",
        )
        for p in stale
    ]


def doctor(
    engine: Engine,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    stuck_after: timedelta = DEFAULT_STUCK_AFTER,
) -> DoctorReport:
    """Check the installation in ``namespace``: schema at this package's revision, every
    routine, trigger, view and table present (triggers enabled), the granted routines
    running with their owner's rights, the owner suitable, the server's settings, and what
    the connected account may do, and the work: expired leases, consumers blocked at their
    cap, consumers with runs waiting and no live worker for them, runs queued (claimable)
    longer than ``stuck_after``. Read-only. ``report.ok`` is False when a check found a
    problem; each problem says how to fix it."""
    engine = engine_of(engine, "doctor")
    namespace = check_namespace(namespace)
    _check_stuck_after(stuck_after)
    head = migrate.head_revision()
    dialect = dialect_of(engine)
    with translated(dialect), engine.connect() as conn:  # connect errors translated too
        settings = _settings(dialect, conn, namespace)
        server = settings.get("version") or f"PostgreSQL {settings.get('server_version')}"
        revision = migrate.current_revision(conn, namespace=namespace)
        clients_from = migrate.read_marker(conn, namespace) if revision is not None else None
        checks = [_revision_check(revision, head, namespace, clients_from)]
        if revision is not None:
            objects = _object_checks(dialect, conn, namespace, revision)
            checks += objects
            checks += _definition_checks(dialect, conn, namespace, revision)
            checks += _security_checks(dialect, conn, namespace)
            if not any(c.severity == "problem" for c in checks):
                checks.append(_privilege_check(dialect, conn, namespace))
            # The work is read through dag_queue_status and the liveness table: with a table
            # or view missing (the objects check's problem, fixed by repair) it cannot be.
            readable = not any(
                c.severity == "problem" and c.name.startswith(("table ", "view ")) for c in objects
            )
            if revision == head and readable:
                checks += _work_checks(conn, namespace)
                checks += _coverage_checks(conn, namespace, stuck_after)
                checks += _liveness_checks(conn, namespace)
        checks += _server_checks(settings)
        checks += _deployment_checks(dialect, conn, namespace)
    return DoctorReport(
        namespace=namespace, server=server, revision=revision, head=head, checks=checks
    )


# -- operating runs: the reads of the command line ------------------------------------------


@dataclass(frozen=True)
class DagInfo:
    """One consumer as ``assetq dags`` lists it: its declaration, its queue and its active
    runs. Field names are the ``dags_page`` query's columns and the keys of ``assetq dags
    --json``. Times are UTC."""

    dag_id: str
    #: The condition as declared, in its stored JSON form ({"asset": ...}, {"all_of": [...]}).
    condition: Any
    is_paused: bool
    max_active_runs: int | None
    max_events_per_run: int | None
    max_attempts: int
    retry_delay_seconds: float
    max_retry_delay_seconds: float | None
    #: The consumer's timeout (None: the worker's default, if any).
    timeout_seconds: float | None
    partitioned: bool
    queued_events: int
    oldest_queued_at: datetime | None
    oldest_queued_age_seconds: float | None
    queued_runs: int
    running_runs: int


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _json_value(value: Any) -> Any:
    import json

    return json.loads(value) if isinstance(value, str | bytes) else value


@keyword_namespace
def dags(
    conn: Handle,
    *,
    dag_id: str | None = None,
    after: str | None = None,
    limit: int = 100,
    namespace: str = DEFAULT_NAMESPACE,
) -> list[DagInfo]:
    """One page of the consumers, by dag id after ``after`` (None: from the first), at most
    ``limit`` (1 to 10,000); or only ``dag_id`` (an empty list when it is not a consumer).
    A read in the caller's transaction (a reader's rights are enough), by key: each
    consumer's pending queue and active runs are counted by index, never its history."""
    from .api import PAGE_MAX

    conn = connection_of(conn, "dags")
    check_int(limit, "limit", 1, PAGE_MAX)
    namespace = check_namespace(namespace)
    dialect = dialect_for(conn)
    params = {"dag_id": dag_id, "after_dag_id": after, "limit": limit}
    with translated(dialect):
        rows = dialect.execute(conn, "dags_page", namespace, params)
    return [
        DagInfo(
            dag_id=str(row.dag_id),
            condition=_json_value(row.condition),
            is_paused=bool(row.is_paused),
            max_active_runs=None if row.max_active_runs is None else int(row.max_active_runs),
            max_events_per_run=None
            if row.max_events_per_run is None
            else int(row.max_events_per_run),
            max_attempts=int(row.max_attempts),
            retry_delay_seconds=float(row.retry_delay_seconds),
            max_retry_delay_seconds=_optional_float(row.max_retry_delay_seconds),
            timeout_seconds=_optional_float(row.timeout_seconds),
            partitioned=bool(row.partitioned),
            queued_events=int(row.queued_events or 0),
            oldest_queued_at=_optional_utc(row.oldest_queued_at),
            oldest_queued_age_seconds=None
            if row.oldest_queued_age_seconds is None
            else max(0.0, float(row.oldest_queued_age_seconds)),
            queued_runs=int(row.queued_runs),
            running_runs=int(row.running_runs),
        )
        for row in rows
    ]


def require_dag(conn: Handle, dag_id: str, *, namespace: str = DEFAULT_NAMESPACE) -> DagInfo:
    """Consumer ``dag_id`` as :func:`dags` lists it; UnknownDag, with the fix, when there is
    none."""
    found = dags(conn, dag_id=dag_id, limit=1, namespace=namespace)
    if not found:
        raise errors.UnknownDag(
            f"unknown dag {dag_id!r}: `assetq dags` lists the consumers", code="AQ003"
        )
    return found[0]


#: How long after a run's end its output events may carry a later timestamp: they are
#: registered in the completion's transaction, a moment before or after its ended_at.
_OUTPUT_SLACK = timedelta(minutes=1)


@keyword_namespace
def run_outputs(
    conn: Handle,
    run: Any,
    *,
    limit: int = 100,
    namespace: str = DEFAULT_NAMESPACE,
) -> list[Any]:
    """The events whose source is ``run`` (a :class:`~assetq.Run`) registered while its
    last attempt ran, by id, at most ``limit``: a successful run's output events (and any its
    handler registered itself naming the run as their source). Empty for a run that never
    started or has not ended. Reads the events registered during that attempt only (by
    timestamp), never the history. A read in the caller's transaction."""
    from .api import PAGE_MAX, db_time, event_record

    conn = connection_of(conn, "run_outputs")
    check_int(limit, "limit", 1, PAGE_MAX)
    namespace = check_namespace(namespace)
    if run.started_at is None or run.ended_at is None:
        return []
    dialect = dialect_for(conn)
    params = {
        "dag_id": run.dag_id,
        "run_id": run.run_id,
        "from_timestamp": db_time(dialect, run.started_at - _OUTPUT_SLACK),
        "to_timestamp": db_time(dialect, run.ended_at + _OUTPUT_SLACK),
        "after_id": None,
        "limit": limit,
    }
    with translated(dialect):
        rows = dialect.execute(conn, "run_outputs_page", namespace, params)
    return [event_record(row) for row in rows]


#: What an attempt came to: the outcomes dag_run_attempt records, and ``running`` for the
#: attempt under way.
AttemptOutcome = Literal["success", "failed", "cancelled", "expired", "running"]


@dataclass(frozen=True)
class Attempt:
    """One attempt of a run, as ``assetq run show`` and the console's run page give it. Field
    names are the ``run_attempts_page`` query's columns and the keys of ``assetq run show
    --json``'s ``attempts``. Times are UTC."""

    attempt: int
    #: The worker that claimed it.
    worker: str | None
    #: When it was claimed.
    started_at: datetime | None
    #: When it ended (for an expired attempt: when its lease ran out); None while running.
    ended_at: datetime | None
    #: success, failed (the run was retried or failed: its next attempt says), cancelled,
    #: expired (its lease ran out and another claim took the run), or running.
    outcome: str
    #: The handler's error with its traceback, "timed out after 30s", "cancelled: reason".
    error: str | None


@keyword_namespace
def run_attempts(
    conn: Handle,
    run: Any,
    *,
    limit: int = 100,
    namespace: str = DEFAULT_NAMESPACE,
) -> list[Attempt]:
    """The attempts of ``run`` (a :class:`~assetq.Run`), newest first, at most ``limit``:
    the one under way when it is running, then the ended ones the schema recorded
    (dag_run_attempt, by its primary key). A run whose last attempt ended before revision
    0003_run_attempts has no record of it: that attempt is given from the run's own row,
    and earlier ones are not known. A read in the caller's transaction."""
    conn = connection_of(conn, "run_attempts")
    check_int(limit, "limit", 1, 10_000)
    namespace = check_namespace(namespace)
    dialect = dialect_for(conn)
    params = {"dag_run_id": run.id, "before_attempt": None, "limit": limit}
    with translated(dialect):
        rows = dialect.execute(conn, "run_attempts_page", namespace, params)
    ended = [
        Attempt(
            attempt=int(row.attempt),
            worker=row.worker,
            started_at=_optional_utc(row.started_at),
            ended_at=_optional_utc(row.ended_at),
            outcome=str(row.outcome),
            error=row.error,
        )
        for row in rows
    ]
    if run.attempt == 0 or (ended and ended[0].attempt >= run.attempt):
        return ended
    # The last attempt is not among the ended ones: under way, or ended before the history.
    if run.state == "running":
        outcome, ended_at, error = "running", None, None
    elif run.state == "queued":  # failed and retried, before the history was kept
        outcome, ended_at, error = "failed", run.ended_at, run.error
    else:
        outcome, ended_at = run.state, run.ended_at
        error = None if run.state == "success" else run.error
    last = Attempt(run.attempt, run.worker, run.started_at, ended_at, outcome, error)
    return [last, *ended][:limit]


@dataclass(frozen=True)
class PendingPartition:
    """One key of a partitioned consumer's partition queue: the events waiting for that
    partition's run. Field names are the ``pending_partitions_page`` query's columns."""

    partition_key: str
    #: Its queued events.
    events: int
    #: The assets they are events of, by name.
    asset_names: list[str]
    oldest_queued_at: datetime | None


@keyword_namespace
def pending_partitions(
    conn: Handle,
    dag_id: str,
    *,
    after: str | None = None,
    limit: int = 100,
    namespace: str = DEFAULT_NAMESPACE,
) -> list[PendingPartition]:
    """One page of partitioned consumer ``dag_id``'s pending partitions, by key after
    ``after`` (None: from the first), at most ``limit``: each key with its queued events, the
    assets they are of and when the oldest arrived. Empty for a consumer that is not
    partitioned or has nothing pending. A read in the caller's transaction, key by key
    through the partition queue's index: never the history."""
    from .api import PAGE_MAX

    conn = connection_of(conn, "pending_partitions")
    check_int(limit, "limit", 1, PAGE_MAX)
    namespace = check_namespace(namespace)
    dialect = dialect_for(conn)
    params = {"dag_id": dag_id, "after_key": after, "limit": limit}
    with translated(dialect):
        rows = dialect.execute(conn, "pending_partitions_page", namespace, params)
    return [
        PendingPartition(
            partition_key=str(row.partition_key),
            events=int(row.events),
            asset_names=list(_json_value(row.asset_names) or []),
            oldest_queued_at=_optional_utc(row.oldest_queued_at),
        )
        for row in rows
    ]


@keyword_namespace
def asset_events(
    conn: Handle,
    asset: str,
    *,
    since: timedelta = timedelta(days=1),
    limit: int = 100,
    namespace: str = DEFAULT_NAMESPACE,
) -> list[Any]:
    """Asset ``asset``'s events (by name, else uri) registered in the last ``since`` (by
    the database's clock), newest first, at most ``limit``. UnknownAsset when there is no
    such asset. The window bounds the read: no index orders one asset's events, so a
    longer ``since`` reads more. A read in the caller's transaction."""
    from .api import PAGE_MAX, event_record

    conn = connection_of(conn, "asset_events")
    check_int(limit, "limit", 1, PAGE_MAX)
    since_seconds = _check_stuck_after(since, "since")
    namespace = check_namespace(namespace)
    dialect = dialect_for(conn)
    with translated(dialect):
        found = dialect.execute(conn, "find_asset", namespace, {"asset": asset})
        if not found:
            raise errors.UnknownAsset(
                f"unknown asset {asset!r}: no asset has that name or uri", code="AQ001"
            )
        params = {
            "asset_id": int(found[0].asset_id),
            "since_seconds": since_seconds,
            "before_timestamp": None,
            "before_id": None,
            "limit": limit,
        }
        rows = dialect.execute(conn, "asset_events_page", namespace, params)
    return [event_record(row) for row in rows]
