"""The public API: declare consumers, register events, schedule runs.

Functions that take a ``Connection`` run in the caller's transaction: they compose with the
caller's own writes, and the caller's rollback undoes them. :func:`schedule` takes an
``Engine`` because it owns its transactions. Every function checks its arguments before it
sends anything; a bad argument raises :class:`~assetq.errors.InvalidArgument` (or a subclass)
and nothing is written.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import random
import threading
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Literal, TypeGuard, cast, get_args

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from . import conditions, errors, logs, partitions
from .dialects import Dialect, dialect_for, dialect_of
from .handles import WRONG_HANDLE_CODE, Handle, connection_of, engine_of
from .namespace import DEFAULT_NAMESPACE, check_schema, schema_checked
from .validation import (
    ASSET_NAME_MAX,
    BATCH_MAX_BYTES,
    BATCH_MAX_EVENTS,
    DAG_ID_MAX,
    ERROR_MAX,
    IDEMPOTENCY_KEY_MAX,
    RUN_ID_MAX,
    TASK_ID_MAX,
    WORKER_MAX,
    check_bool,
    check_dag_id,
    check_int,
    check_name,
    check_namespace,
    check_optional_name,
    extra_json,
    seconds,
)

log = logging.getLogger("assetq.api")


@dataclass(frozen=True)
class Source:
    """Where an event came from (Airflow's producing task instance). All optional."""

    dag_id: str | None = None
    task_id: str | None = None
    run_id: str | None = None
    map_index: int = -1


@dataclass(frozen=True, kw_only=True)
class Event:
    """An asset event: what :func:`queued_events`, :func:`consumed_events` and
    :func:`assetq.ops.asset_events` read, and what :func:`register_event` and
    :func:`register_events` return for the events they registered.

    One type wherever an event is returned. Its field names are the event's columns
    (``asset_event``: ``id``, ``asset_id``, ``timestamp``, ``extra``, ``partition_key``; the
    asset's ``name`` as ``asset`` and its ``uri``; ``source_*`` as ``source``) and the keys of
    ``assetq events --json`` and the console's API. A registration returns what it knows
    without reading the event back (its one round trip): ``asset`` as the call named the
    asset (its name, or its uri when the call gave that), and ``uri``, ``extra`` and
    ``source`` empty; read the event (:func:`queued_events`, ...) for the stored ones."""

    id: int
    #: The asset's name (a registration's result: as the call named it, a name or a uri).
    asset: str
    asset_id: int
    #: The asset's uri (None when it has none, and in a registration's result).
    uri: str | None = None
    #: When the event was inserted, UTC, microsecond precision. Not commit order.
    timestamp: datetime
    #: The event's extra (empty in a registration's result).
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: The producing task instance (empty in a registration's result).
    source: Source = Source()
    #: The aliases the event was registered through, sorted. In a registration's result
    #: those the call gave; none for a retry (``created`` False): the original's stand.
    aliases: tuple[str, ...] = ()
    #: The event's partition (None: unpartitioned), see docs/semantics.md "Partitions".
    partition_key: str | None = None
    #: False when a registration's idempotency key matched an earlier event, which it
    #: returned instead of registering one; True otherwise.
    created: bool = True


@dataclass(frozen=True)
class NewEvent:
    """One event to register with :func:`register_events`: the arguments of
    :func:`register_event`, as an item of a batch."""

    asset: str
    extra: Mapping[str, Any] | None = None
    source: Source | Mapping[str, Any] | None = None
    idempotency_key: str | None = None
    aliases: Sequence[str] = ()
    #: The event's partition, e.g. ``"2026-12-01"`` (1 to 250 characters; None: none).
    partition_key: str | None = None


#: A run's state: ``queued`` (created, waiting for a worker), ``running`` (claimed, or moved
#: there by :func:`set_run_state`), ``success`` or ``failed`` (finished).
RunState = Literal["queued", "running", "success", "failed", "cancelled"]

#: The states of a run, and those that count against ``max_active_runs``.
RUN_STATES: tuple[RunState, ...] = get_args(RunState)
ACTIVE_RUN_STATES: tuple[RunState, ...] = ("queued", "running")


def is_run_state(value: object) -> TypeGuard[RunState]:
    """Whether ``value`` is one of :data:`RUN_STATES`; narrows a ``str`` (read from a form, a
    command line) to :data:`RunState` for a type checker."""
    return isinstance(value, str) and value in RUN_STATES


@dataclass(frozen=True, kw_only=True)
class Run:
    """A consumer run: what :func:`schedule` creates, :func:`runs` and :func:`get_run`
    read, and :func:`set_run_state`, :func:`complete_run`, :func:`retry_run` and
    :func:`cancel_run` return (a worker's :class:`Claim` is one too).

    One type wherever a run is returned. Its field names are the ``dag_run`` table's columns
    (``id``, ``seq``, ``state``, ``attempt``, ...) and the keys of ``assetq runs --json``,
    ``assetq run show --json``, ``assetq scheduler --json`` and the console's API. Two fields
    are filled only by the calls that read them: ``event_ids`` (:func:`schedule` and
    :func:`claim_runs`, which consume the events; elsewhere empty: ``event_count`` counts
    them, :func:`consumed_events` lists them) and ``output_event_ids``
    (:func:`complete_run`)."""

    id: int
    dag_id: str
    run_id: str
    #: Per-consumer sequence number, 1, 2, 3, ... in creation order.
    seq: int
    #: ``queued`` when the scheduler creates it; see :data:`RunState`.
    state: RunState = "queued"
    #: Newest timestamp among the consumed events (UTC). Not monotonic under late commits.
    run_after: datetime
    #: When the scheduler claimed its events (UTC). Monotonic per consumer, like ``seq``.
    created_at: datetime
    #: When it entered ``running`` (its current attempt's claim) / a final state (None until
    #: then).
    started_at: datetime | None = None
    ended_at: datetime | None = None
    #: The newest consumed event (latest timestamp, then highest id): what triggered the run.
    #: The event itself may since have been purged.
    triggering_event_id: int | None = None
    #: How many events it consumed (purge and delete_asset never change it); given
    #: ``event_ids`` alone, their number.
    event_count: int = 0
    #: Claims so far (0: never claimed by a worker), see :func:`claim_runs`.
    attempt: int = 0
    #: The worker that holds it, or last held it.
    worker: str | None = None
    #: End of the current lease while a worker holds it (UTC, database clock).
    lease_until: datetime | None = None
    #: When a worker may claim it next (a retry's delay, an expired lease); None when no
    #: worker will (it is finished, or was moved by hand with :func:`set_run_state`).
    not_before: datetime | None = None
    #: The error of its last failed attempt.
    error: str | None = None
    #: The events its successful completion registered (:func:`complete_run` only).
    output_event_ids: tuple[int, ...] = ()
    #: The partition key a partitioned consumer's run is for (None: unpartitioned).
    partition_key: str | None = None
    #: When its running attempt times out (UTC, database clock): its claim's time plus the
    #: consumer's ``timeout`` (:func:`declare_dag`) or the worker's default; None when it has
    #: none, and for a run that is not running. A success after it is refused (LeaseLost).
    deadline: datetime | None = None
    #: Ids of exactly the events this run consumed, ascending (:func:`schedule`,
    #: :func:`claim_runs`; empty where not read: a run always consumed at least one).
    event_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.event_count and self.event_ids:
            object.__setattr__(self, "event_count", len(self.event_ids))


@dataclass(frozen=True, kw_only=True)
class Claim(Run):
    """A run a worker holds (:func:`claim_runs`, :func:`heartbeat`): a :class:`Run`, running,
    with its claim's ``attempt``, ``worker``, ``lease_until``, ``started_at`` and
    ``deadline``, plus what only its holder has: the ``lease`` it was taken with, the
    ``cancelled`` event, ``capped`` and ``made``. What a claim does not read is left empty
    (``ended_at``, ``not_before``; ``error``, a previous attempt's). Every later call about the run
    (:func:`heartbeat`, :func:`complete_run`) names this attempt; once another worker holds
    the run, or it is finished, those calls raise :class:`~assetq.LeaseLost` and write
    nothing.

    A subclass rather than a Run with those fields set, because a claim is a capability:
    heartbeat and complete_run are fenced by the claim's attempt and start time, and a Run
    read with :func:`get_run` or :func:`runs` carries the run's current attempt and start
    time, so accepting one would let any reader renew or finish an attempt it does not
    hold. The type (mypy) and the functions' check (InvalidArgumentType) take only what
    claim_runs or heartbeat returned."""

    #: Who holds it (the ``worker`` given to :func:`claim_runs`): never None in a claim.
    worker: str = ""
    #: The lease this claim was taken with; :func:`heartbeat` renews by as much by default.
    lease: timedelta = timedelta(seconds=60)
    #: Set when the attempt is to stop: its timeout passed, or the run was cancelled
    #: (:func:`cancel_run`) or lost. :func:`assetq.run_worker` sets it; a long sync handler
    #: looks at it (``claim.cancelled.is_set()``, or ``claim.cancelled.wait(seconds)``) and
    #: returns or raises. Shared by the claim's renewed copies (:func:`heartbeat`).
    cancelled: threading.Event = field(default_factory=threading.Event, compare=False, repr=False)
    #: Whether the consumer caps its active runs (``max_active_runs``): this run's end lets
    #: its next run be created (a scheduler is woken; on MySQL the worker runs that pass).
    capped: bool = False
    #: Whether the claim's own pass made the run (``claim_runs(schedule=True)``), rather
    #: than a scheduler's pass before it: the worker reports it as created (metrics).
    made: bool = False


#: Names of earlier versions, kept for one minor version (module ``__getattr__`` below):
#: the old name, the new one (CHANGELOG.md, 0.2).
DEPRECATED_NAMES: dict[str, str] = {"RunInfo": "Run", "EventRecord": "Event"}

if TYPE_CHECKING:  # the old names type-check as the new ones for the deprecation window
    RunInfo = Run
    EventRecord = Event
else:

    def __getattr__(name: str) -> object:
        new = DEPRECATED_NAMES.get(name)
        if new is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        warnings.warn(
            f"assetq.{name} is deprecated: use assetq.{new}, the one type for a"
            f" {'run' if new == 'Run' else 'event'} (CHANGELOG.md)",
            DeprecationWarning,
            stacklevel=2,
        )
        return globals()[new]


def _utc_or_none(value: datetime | None) -> datetime | None:
    return None if value is None else to_utc(value)


#: Zones seen on timestamps the driver returned that are UTC itself (psycopg's zone for a
#: session in UTC, ZoneInfo("Etc/UTC")), and the offset-zero zones that are not (a zone
#: with daylight saving time): a value in one of the first is re-labelled, not converted
#: (a worker turns some ten timestamps per run into UTC; converting costs three times as
#: much).
_UTC_ZONES: dict[Any, bool] = {timezone.utc: True}


def to_utc(value: datetime) -> datetime:
    zone = value.tzinfo
    if zone is None:  # MySQL DATETIME(6) holds UTC without a zone
        return value.replace(tzinfo=timezone.utc)
    utc = _UTC_ZONES.get(zone)
    if utc is None:
        key = getattr(zone, "key", None)  # zoneinfo's name
        utc = key in ("UTC", "Etc/UTC", "Etc/UCT", "Etc/Zulu", "UCT", "Zulu")
        if len(_UTC_ZONES) < 64:  # a few zone objects per process; never grows unbounded
            _UTC_ZONES[zone] = utc
    if utc:
        return value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


def _checked(conn: Connection, namespace: str) -> Dialect:
    """``conn``'s dialect, once this package is known to work against the schema in
    ``namespace`` (NotInstalled, SchemaTooOld or SchemaTooNew with the fix otherwise, before
    the call's own statement could fail on it): one statement on the first call of a
    process for each engine and namespace, none after (namespace.check_schema)."""
    check_schema(conn, namespace)
    return dialect_for(conn)


@contextmanager
def translated(dialect: Dialect) -> Iterator[None]:
    try:
        yield
    except DBAPIError as exc:
        raise dialect.translate(exc) from exc


def _autocommit(conn: Connection) -> bool:
    """True when ``conn`` is in autocommit mode, where each call is its own transaction.
    Read from the driver's connection, client-side: no round trip."""
    dbapi_connection = conn.connection.dbapi_connection
    try:
        return bool(conn.dialect.detect_autocommit_setting(dbapi_connection))  # type: ignore[arg-type]
    except (AttributeError, NotImplementedError):  # SQLAlchemy < 2.1, other drivers
        get_autocommit = getattr(dbapi_connection, "get_autocommit", None)
        if get_autocommit is not None:
            return bool(get_autocommit())
        return bool(getattr(dbapi_connection, "autocommit", False))


@contextmanager
def _savepoint(conn: Connection, wanted: bool) -> Iterator[None]:
    """Run a routine call under a savepoint of its own in the caller's transaction, so
    that a database-side error leaves that transaction exactly as it was before the call.

    Without it the engines differ: on PostgreSQL any error aborts the caller's whole
    transaction (an ORM ``session.commit()`` after catching it silently rolls the caller's
    own writes back); on MySQL/MariaDB the failed statement is undone but a procedure's
    earlier statements stay (a batch whose tenth item reuses a key keeps nine). Skipped on an
    autocommit connection, where the call is its own transaction and there is nothing of
    the caller's to keep. Costs two round trips (SAVEPOINT, RELEASE): ``savepoint=False``
    saves them when the caller rolls back on every error anyway (docs/python.md)."""
    if not wanted or _autocommit(conn):
        yield
        return
    nested = conn.begin_nested()
    try:
        yield
    except BaseException:
        if nested.is_active:
            try:
                nested.rollback()
            except SQLAlchemyError:
                # The error took the transaction, and the savepoint, with it (a deadlock on
                # MySQL, a lost connection): the caller gets that error, not this one.
                log.debug("assetq: rolling back to the call's savepoint failed", exc_info=True)
        raise
    nested.commit()


def _source(source: object) -> Source:
    if source is None:
        return Source()
    if isinstance(source, Mapping):
        unknown = set(source) - {"dag_id", "task_id", "run_id", "map_index"}
        if unknown:
            raise errors.InvalidArgument(
                f"source has unknown keys {sorted(unknown)}; use dag_id, task_id, run_id, map_index"
            )
        source = Source(**source)
    if not isinstance(source, Source):
        raise errors.InvalidArgumentType(
            f"source must be an assetq.Source or a mapping, got {type(source).__name__}"
        )
    check_optional_name(source.dag_id, "source dag_id", DAG_ID_MAX)
    check_optional_name(source.task_id, "source task_id", TASK_ID_MAX)
    check_optional_name(source.run_id, "source run_id", RUN_ID_MAX)
    check_int(source.map_index, "source map_index")
    return source


def declare_asset(
    conn: Handle,
    name: str,
    *,
    uri: str | None = None,
    extra: Mapping[str, Any] | None = None,
    savepoint: bool = True,
    namespace: str = DEFAULT_NAMESPACE,
) -> int:
    """Create the asset ``name`` (or update its uri/extra) and return its id.

    Idempotent; runs in the caller's transaction. ``savepoint``: see :func:`register_event`.
    """
    conn = connection_of(conn, "declare_asset")
    name = check_name(name, "asset name", ASSET_NAME_MAX)
    uri = check_optional_name(uri, "asset uri", ASSET_NAME_MAX)
    extra_text = None if extra is None else extra_json(extra)
    namespace = check_namespace(namespace)
    dialect = _checked(conn, namespace)
    with translated(dialect), _savepoint(conn, savepoint):
        rows = dialect.execute(
            conn, "declare_asset", namespace, {"name": name, "uri": uri, "extra": extra_text}
        )
    return int(rows[0].asset_id)


def declare_dag(
    conn: Handle,
    dag_id: str,
    condition: conditions.Condition,
    *,
    paused: bool | None = None,
    max_active_runs: int | None = None,
    max_events_per_run: int | None = None,
    queue_while_paused: bool = False,
    max_attempts: int = 1,
    retry_delay: timedelta | float = timedelta(0),
    max_retry_delay: timedelta | float | None = None,
    partitioned: partitions.Partitioned = False,
    savepoint: bool = True,
    namespace: str = DEFAULT_NAMESPACE,
    timeout: timedelta | float | None = None,
    allow_unkeyed: bool = False,
) -> None:
    """Declare consumer ``dag_id`` scheduled on ``condition``, or replace its declaration.

    ``condition`` is an asset reference (a name or uri, :func:`~assetq.asset_name`,
    :func:`~assetq.asset_uri`, :func:`~assetq.alias`), a list (all of), or nested
    :func:`all_of`/:func:`any_of`. Assets and aliases it names that do not exist yet are
    created. ``paused`` sets the pause state; None keeps it (a new consumer starts unpaused).
    ``max_active_runs``: while the consumer has that many runs queued or running, no run is
    created and its queue is kept whole. ``max_events_per_run``: most events one run consumes,
    oldest first; it must be at least the condition's size (one per reference of an all_of,
    the largest item of an any_of). ``queue_while_paused``: events that commit while it is
    paused are queued for it (consumed after unpausing) instead of skipped. None means no
    cap. Workers (docs/workers.md): a run gets ``max_attempts`` claims (1 to 1,000); after
    a failed attempt with attempts left it is queued again, claimable after ``retry_delay``,
    doubled for each further failed attempt up to ``max_retry_delay`` when that is given
    (a timedelta or seconds). ``timeout`` (a timedelta or seconds, up to 7 days; None: the
    worker's default, if any): an attempt running longer ends as failed ("timed out after
    30s"), retried by ``max_attempts`` like any failure, its worker fenced (:func:`claim_runs`).
    Every option is replaced by a re-declaration. Atomic in the
    caller's transaction: a
    concurrent scheduler pass sees the old declaration or the new one. Queued events of
    assets the new condition does not depend on are dropped; the others stay queued and are
    consumed by its next run. ``savepoint``: see :func:`register_event`.

    ``partitioned`` (docs/semantics.md, "Partitions"): True evaluates the condition per
    partition key, each asset's events mapped to the consumer's keys by identity; a mapping
    from assets of the condition (names or uris) to :class:`~assetq.Rollup`,
    :class:`~assetq.StaticPartitions` or ``"identity"`` sets other mappings. A run is then
    created for key k once the condition holds on the queued events that map to k, and
    consumes exactly those; its ``partition_key`` is k. Events of the condition's assets must
    carry partition keys their mapping accepts (else :class:`~assetq.UnmappablePartition` at
    registration). ``max_active_runs`` counts the runs of every key; ``max_events_per_run``
    caps each run, a key's oldest events first. Changing the partitioning maps the queued
    events again, and holds the consumer's producers back until the caller commits.

    Making a consumer partitioned (declaring it so, or re-declaring an unpartitioned one) is
    refused (:class:`~assetq.InvalidArgument`, nothing written with ``savepoint``) when
    producers of its assets register events without a partition key: from then on their
    events would be refused (UnmappablePartition). The check counts the unkeyed events of
    those assets among the namespace's 10,000 most recent events, and the message names them.
    ``allow_unkeyed=True`` declares it anyway (those producers must give partition keys).
    """
    conn = connection_of(conn, "declare_dag")
    dag_id = check_dag_id(dag_id)
    node = conditions.normalize(condition)
    if paused is not None:
        check_bool(paused, "paused")
    if max_active_runs is not None:
        check_int(max_active_runs, "max_active_runs", 1, 1_000_000)
    partitions_json = partitions.to_json(partitioned)
    if max_events_per_run is not None:
        check_int(max_events_per_run, "max_events_per_run", 1, 1_000_000)
        # A partition roll-up with require="all" needs all its sub-partitions in one run.
        bound = conditions.size_bound(node, partitions.needs(partitioned))
        if max_events_per_run < bound:
            raise errors.InvalidArgument(
                f"max_events_per_run={max_events_per_run} is below the condition's size {bound}:"
                " a run may need that many events to satisfy it"
            )
    check_bool(queue_while_paused, "queue_while_paused")
    check_bool(allow_unkeyed, "allow_unkeyed")
    check_int(max_attempts, "max_attempts", 1, 1000)
    delay = seconds(retry_delay, "retry_delay", allow_zero=True)
    max_delay = None if max_retry_delay is None else seconds(max_retry_delay, "max_retry_delay")
    if max_delay is not None and max_delay < delay:
        raise errors.InvalidArgument(
            f"max_retry_delay ({max_delay:g} s) must be at least retry_delay ({delay:g} s)"
        )
    timeout_seconds = None if timeout is None else seconds(timeout, "timeout")
    if timeout_seconds is not None and timeout_seconds > 604800:
        raise errors.InvalidArgument(f"timeout must be at most 7 days, got {timeout_seconds:g} s")
    namespace = check_namespace(namespace)
    params = {
        "dag_id": dag_id,
        "condition": json.dumps(conditions.to_json(node), separators=(",", ":")),
        "clauses": json.dumps(conditions.compile_cnf(node), separators=(",", ":")),
        "paused": paused,
        "max_active_runs": max_active_runs,
        "max_events_per_run": max_events_per_run,
        "queue_while_paused": queue_while_paused,
        "max_attempts": max_attempts,
        "retry_delay_seconds": delay,
        "max_retry_delay_seconds": max_delay,
    }
    dialect = _checked(conn, namespace)
    with translated(dialect), _savepoint(conn, savepoint), dialect.several(conn):
        check_unkeyed = partitions_json is not None and not allow_unkeyed
        if check_unkeyed:
            before = dialect.execute(conn, "dag_partitioned", namespace, {"dag_id": dag_id})
            check_unkeyed = not (before and before[0].partitioned)
        dialect.execute(conn, "declare_dag", namespace, params)
        if check_unkeyed:  # its assets are known now; their queued events are not mapped yet
            _refuse_unkeyed_producers(conn, dialect, dag_id, namespace)
        dialect.execute(
            conn,
            "set_dag_partitions",
            namespace,
            {"dag_id": dag_id, "partitions": partitions_json},
        )
        dialect.execute(
            conn,
            "set_dag_timeout",
            namespace,
            {"dag_id": dag_id, "timeout_seconds": timeout_seconds},
        )


#: How many of the namespace's most recent events a partitioned declaration looks at.
UNKEYED_WINDOW = 10_000


def _refuse_unkeyed_producers(
    conn: Connection, dialect: Dialect, dag_id: str, namespace: str
) -> None:
    """InvalidArgument when recent events of ``dag_id``'s assets carry no partition key:
    declaring it partitioned would make their producers' next events fail."""
    rows = dialect.execute(
        conn, "unkeyed_recent_events", namespace, {"dag_id": dag_id, "window": UNKEYED_WINDOW}
    )
    if not rows:
        return
    found = ", ".join(f"{int(r.unkeyed)} of asset {r.asset_name!r}" for r in rows)
    raise errors.InvalidArgument(
        f"declaring {dag_id!r} partitioned would break producers that register events without"
        f" a partition key: of the namespace's last {UNKEYED_WINDOW:,} events, {found} carry"
        " none, and such events would be refused from now on (UnmappablePartition). Give"
        " those producers partition keys first, or declare with allow_unkeyed=True to accept"
        " that"
    )


def _set_paused(
    conn: Connection, dag_id: str, paused: bool, namespace: str, savepoint: bool
) -> None:
    dag_id = check_dag_id(dag_id)
    namespace = check_namespace(namespace)
    dialect = _checked(conn, namespace)
    with translated(dialect), _savepoint(conn, savepoint):
        dialect.execute(conn, "set_dag_paused", namespace, {"dag_id": dag_id, "paused": paused})


def pause_dag(
    conn: Handle, dag_id: str, *, savepoint: bool = True, namespace: str = DEFAULT_NAMESPACE
) -> None:
    """Pause a consumer: events that commit while it is paused are not queued for it, and
    the scheduler creates no run for it. Raises UnknownDag for an unknown id."""
    conn = connection_of(conn, "pause_dag")
    _set_paused(conn, dag_id, True, namespace, savepoint)


def unpause_dag(
    conn: Handle, dag_id: str, *, savepoint: bool = True, namespace: str = DEFAULT_NAMESPACE
) -> None:
    """Unpause a consumer. Events that committed while it was paused are not replayed."""
    conn = connection_of(conn, "unpause_dag")
    _set_paused(conn, dag_id, False, namespace, savepoint)


def register_event(
    conn: Handle,
    asset: str,
    *,
    extra: Mapping[str, Any] | None = None,
    source: Source | Mapping[str, Any] | None = None,
    idempotency_key: str | None = None,
    aliases: Sequence[str] = (),
    partition_key: str | None = None,
    savepoint: bool = True,
    namespace: str = DEFAULT_NAMESPACE,
) -> Event:
    """Register one event for ``asset`` (a name or uri) in the caller's transaction.

    One round trip. The event and one queue row per unpaused consumer of the asset become
    visible together when the caller commits, and vanish together if it rolls back. With an
    ``idempotency_key`` (unique per asset), a retry returns the original event with
    ``created=False`` and queues nothing; reusing the key with a different ``extra`` raises
    IdempotencyConflict. Raises UnknownAsset when no asset has that name or uri.

    ``savepoint`` (default True): an error (UnknownAsset, IdempotencyConflict,
    UnmappablePartition, any database error that leaves the session alive) leaves the
    caller's transaction exactly as it was before the call, on both engines: catch it, and
    commit the rest of your work. It costs no round trip: the routine takes the savepoint
    itself, inside the call's one round trip, and reports the error instead of raising it
    (PostgreSQL; on MySQL/MariaDB the failed statement alone is undone). ``savepoint=False``
    calls the routine without it (no subtransaction on PostgreSQL): after a database-side
    error the caller's transaction must then be rolled back (PostgreSQL aborts it;
    docs/python.md). On an autocommit connection the call is its own transaction, atomic
    and committed in its one round trip.

    ``aliases``: register the event through these asset aliases (created if new). Each alias
    resolves to ``asset`` from then on, and the event is queued for the alias's consumers too.

    ``partition_key``: the event's partition, e.g. ``"2026-12-01"`` (1 to 250 characters),
    for partitioned consumers (docs/semantics.md, "Partitions"); unpartitioned consumers
    consume it like any other event. A retry with the same idempotency key must repeat it.
    Raises UnmappablePartition when a partitioned consumer of the asset cannot map it (or it
    is missing), and nothing is written.
    """
    conn = connection_of(conn, "register_event")
    if aliases or partition_key is not None:
        return register_events(
            conn,
            [NewEvent(asset, extra, source, idempotency_key, aliases, partition_key)],
            savepoint=savepoint,
            namespace=namespace,
        )[0]
    asset = check_name(asset, "asset", ASSET_NAME_MAX)
    extra_text = extra_json(extra)
    src = _source(source)
    key = check_optional_name(idempotency_key, "idempotency_key", IDEMPOTENCY_KEY_MAX)
    namespace = check_namespace(namespace)
    dialect = _checked(conn, namespace)
    params = {
        "asset": asset,
        "extra": extra_text,
        "source_dag_id": src.dag_id,
        "source_task_id": src.task_id,
        "source_run_id": src.run_id,
        "source_map_index": src.map_index,
        "idempotency_key": key,
    }
    name = "register_event_v2" if savepoint else "register_event"
    with translated(dialect):
        row = dialect.execute(conn, name, namespace, params)[0]
    if savepoint and row.error_code is not None:
        raise dialect.reported(str(row.error_code), str(row.error_message))
    return Event(
        id=int(row.event_id),
        asset=asset,
        asset_id=int(row.asset_id),
        timestamp=to_utc(row.event_timestamp),
        created=bool(row.created),
    )


_NEW_EVENT_KEYS = frozenset(
    {"asset", "extra", "source", "idempotency_key", "aliases", "partition_key"}
)

#: Most aliases one event may be registered through.
ALIASES_MAX = 100


def _aliases(value: object) -> tuple[str, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise errors.InvalidArgumentType(
            f"aliases must be a sequence of alias names, got {type(value).__name__}"
        )
    names = tuple(check_name(name, "alias name", ASSET_NAME_MAX) for name in value)
    if len(names) > ALIASES_MAX:
        raise errors.InvalidArgument(f"an event has at most {ALIASES_MAX} aliases")
    return tuple(dict.fromkeys(names))


def _new_event(item: object) -> NewEvent:
    if isinstance(item, NewEvent):
        return item
    if isinstance(item, Mapping):
        unknown = set(item) - _NEW_EVENT_KEYS
        if unknown:
            raise errors.InvalidArgument(
                f"unknown keys {sorted(unknown)}; use asset, extra, source, idempotency_key,"
                " aliases, partition_key"
            )
        if "asset" not in item:
            raise errors.InvalidArgument("the asset is missing")
        return NewEvent(**item)
    raise errors.InvalidArgumentType(
        f"must be an assetq.NewEvent or a mapping, got {type(item).__name__}"
    )


def _batch_item(item: object) -> tuple[str, tuple[str, ...], str | None, str]:
    """Check one item of a batch; return its asset, its aliases, its partition key and its
    JSON object for the routine."""
    new = _new_event(item)
    asset = check_name(new.asset, "asset", ASSET_NAME_MAX)
    aliases = _aliases(new.aliases)
    extra_text = extra_json(new.extra)
    src = _source(new.source)
    key = check_optional_name(new.idempotency_key, "idempotency_key", IDEMPOTENCY_KEY_MAX)
    part = (
        None
        if new.partition_key is None
        else partitions.check_key(new.partition_key, "partition_key")
    )
    # Built from already serialized parts: extra is not serialized twice, and keys left at
    # their default are not sent at all.
    parts = [f'"asset":{_json_text(asset)}']
    if extra_text != "{}":
        parts.append(f'"extra":{extra_text}')
    for name, value in (
        ("source_dag_id", src.dag_id),
        ("source_task_id", src.task_id),
        ("source_run_id", src.run_id),
        ("idempotency_key", key),
        ("partition_key", part),
    ):
        if value is not None:
            parts.append(f'"{name}":{_json_text(value)}')
    if src.map_index != -1:
        parts.append(f'"source_map_index":{src.map_index}')
    if aliases:
        parts.append('"aliases":[' + ",".join(_json_text(a) for a in aliases) + "]")
    return asset, aliases, part, "{" + ",".join(parts) + "}"


def _json_text(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


def register_events(
    conn: Handle,
    events: Iterable[NewEvent | Mapping[str, Any]],
    *,
    savepoint: bool = True,
    namespace: str = DEFAULT_NAMESPACE,
) -> list[Event]:
    """Register a batch of events in the caller's transaction, in one round trip.

    ``events`` holds :class:`NewEvent` items (or mappings with the same keys), at most
    10,000 and 8 MiB of JSON per call; several calls in one transaction are atomic together.
    Returns one :class:`Event` per item, in input order. Each item has the guarantees of
    :func:`register_event`: it and its queue rows become visible when the caller commits, and
    its idempotency key makes a retry return the original event (``created=False``). Items
    with the same asset and key are one event, as retries would be.

    All or nothing: every item is checked before anything is sent (an error names the item),
    and if any item fails in the database (an unknown asset, a key reused with another extra)
    the call raises and none of the batch remains: with ``savepoint`` (the default, see
    :func:`register_event`: the routine's own, no round trip) the caller's transaction is
    left as it was before the call; with ``savepoint=False``, once the caller rolls back
    (MySQL/MariaDB leave it as it was then too). On an
    autocommit connection the call is its own transaction. The events of one batch share one
    timestamp. On PostgreSQL the whole batch is fanned out by one statement; on MySQL/MariaDB
    per event, by the row-level trigger.
    """
    conn = connection_of(conn, "register_events")
    if isinstance(events, str | bytes | Mapping) or not isinstance(events, Iterable):
        raise errors.InvalidArgumentType(
            f"events must be a sequence of assetq.NewEvent items, got {type(events).__name__}"
        )
    items = list(itertools.islice(events, BATCH_MAX_EVENTS + 1))
    if len(items) > BATCH_MAX_EVENTS:
        raise errors.InvalidArgument(
            f"a batch holds at most {BATCH_MAX_EVENTS} events; split it into several calls"
            " (in one transaction they are still atomic together)"
        )
    namespace = check_namespace(namespace)
    assets: list[str] = []
    item_aliases: list[tuple[str, ...]] = []
    item_parts: list[str | None] = []
    texts: list[str] = []
    for number, item in enumerate(items, start=1):
        try:
            asset, aliases, part, item_text = _batch_item(item)
        except errors.InvalidArgument as exc:
            raise type(exc)(f"event {number} of the batch: {exc}", code=exc.code) from None
        assets.append(asset)
        item_aliases.append(aliases)
        item_parts.append(part)
        texts.append(item_text)
    if not items:
        return []
    payload = "[" + ",".join(texts) + "]"
    size = len(payload.encode("utf-8"))
    if size > BATCH_MAX_BYTES:
        raise errors.InvalidArgument(
            f"the batch is {size} bytes of JSON; the limit is {BATCH_MAX_BYTES}: split it into"
            " several calls (in one transaction they are still atomic together)"
        )
    dialect = _checked(conn, namespace)
    name = "register_events_v2" if savepoint else "register_events"
    with translated(dialect), dialect.atomic(conn):
        rows = dialect.execute(conn, name, namespace, {"events": payload})
    if savepoint and rows and rows[0].error_code is not None:
        raise dialect.reported(str(rows[0].error_code), str(rows[0].error_message))
    if [int(row.item_no) for row in rows] != list(range(1, len(items) + 1)):
        raise errors.DatabaseError(
            f"register_events returned {len(rows)} rows for {len(items)} events, or out of order"
        )
    return [
        Event(
            id=int(row.event_id),
            asset=asset,
            asset_id=int(row.asset_id),
            timestamp=to_utc(row.event_timestamp),
            created=bool(row.created),
            aliases=tuple(sorted(aliases)) if row.created else (),
            partition_key=part,
        )
        for asset, aliases, part, row in zip(assets, item_aliases, item_parts, rows, strict=True)
    ]


def _event_ids(value: Any) -> tuple[int, ...]:
    if isinstance(value, str):  # MySQL returns the claimed ids as JSON text
        value = json.loads(value)
    return tuple(sorted(int(v) for v in value))


def _ids_in_order(value: Any) -> tuple[int, ...]:
    if isinstance(value, str):  # MySQL returns them as JSON text
        value = json.loads(value)
    return tuple(int(v) for v in value or ())


#: At most this many attempts of one call end with a lost connection (read_committed_transaction).
CONNECTION_ATTEMPTS = 8


def _engine_or_autocommit(handle: object, function: str) -> Engine | Connection:
    """The handle of a call that commits by itself: an Engine (a pooled connection for each
    call), or a Connection in autocommit mode that the caller keeps (a worker's own
    connection: no pool checkout per call)."""
    if isinstance(handle, Connection):
        if _autocommit(handle):
            return handle
        raise errors.InvalidArgumentType(
            f"{function} commits by itself: pass an Engine (conn.engine is the one this"
            " Connection came from), or a Connection in autocommit mode"
            ' (conn.execution_options(isolation_level="AUTOCOMMIT")), on which each call is'
            " a transaction of its own",
            code=WRONG_HANDLE_CODE,
        )
    return engine_of(handle, function)


def worth_retrying(exc: errors.AssetqError, retry_codes: frozenset[str] = frozenset()) -> bool:
    """Whether another attempt of a call may cure ``exc``: a transient error, or one whose
    code is in ``retry_codes``; never a read-only server, which stays read-only for longer
    than a call's backoff (the caller's loop backs off from it, and the error says where to
    point the URL). Both shells' calls ask (and assetq.aio's)."""
    retry = isinstance(exc, errors.TransientError) or exc.code in retry_codes
    return retry and not isinstance(exc, errors.ReadOnlyServer)


def retry_delay(engine: Engine, what: str, attempt: int, exc: errors.AssetqError) -> float:
    """Say that attempt ``attempt`` of ``what`` failed with ``exc``, and return the jittered
    exponential backoff before the next: 10 ms doubling up to 1 s, times 0.5 to 1.5. The
    sync calls sleep it (read_committed_transaction), assetq.aio awaits it."""
    delay = float(min(1.0, 0.01 * 2**attempt) * (0.5 + random.random()))
    log.log(
        logs.retry_level(engine, exc),  # DEBUG while the connection stays lost
        "assetq: %s attempt %d failed ([%s] %s); retrying in %.0f ms",
        what,
        attempt,
        exc.code or "no code",
        logs.first_line(exc),
        delay * 1000,
    )
    return delay


def _on_own_connection(
    conn: Connection,
    query: str,
    namespace: str,
    params: Mapping[str, Any],
    what: str,
    max_attempts: int,
    retry_codes: frozenset[str],
    one_statement: bool,
) -> Sequence[Any]:
    """read_committed_transaction on a Connection in autocommit mode that the caller keeps:
    the call alone where a routine call is atomic by itself (PostgreSQL), else READ
    COMMITTED for the next transaction and the call in a transaction of the driver's
    (dialect.atomic). Deadlocks and the like are retried on the same connection; a lost
    connection is not (it is the caller's: ConnectionLost, and the caller connects again)."""
    dialect = dialect_for(conn)
    began = conn.in_transaction()
    for attempt in range(1, max_attempts + 1):
        try:
            with translated(dialect):
                check_schema(conn, namespace)
                if one_statement and dialect.atomic_routines:
                    rows = dialect.execute(conn, query, namespace, params)
                else:
                    dialect.execute(conn, "scheduler_transaction", namespace)
                    with dialect.atomic(conn):
                        rows = dialect.execute(conn, query, namespace, params)
                if not began and conn.in_transaction():
                    # SQLAlchemy's autobegin marked a transaction the autocommit connection
                    # does not have; the caller's next conn.begin() must not find it.
                    conn.commit()
            logs.connection_back(conn.engine)
            return rows
        except errors.AssetqError as exc:
            if not began and conn.in_transaction():
                with contextlib.suppress(DBAPIError):
                    conn.rollback()
            retry = worth_retrying(exc, retry_codes) and not isinstance(exc, errors.ConnectionLost)
            if not retry or attempt == max_attempts:
                raise
            time.sleep(retry_delay(conn.engine, what, attempt, exc))
    raise AssertionError("unreachable")


def read_committed_transaction(
    engine: Engine | Connection,
    query: str,
    namespace: str,
    params: Mapping[str, Any],
    what: str,
    max_attempts: int,
    retry_codes: frozenset[str] = frozenset(),
    one_statement: bool = False,
    connection_attempts: int | None = None,
) -> Sequence[Any]:
    """Run named query ``query`` in a short READ COMMITTED transaction of its own and return
    its rows; roll back and retry, with jittered exponential backoff, what a retry cures
    (TransientError, or an error whose code is in ``retry_codes``).

    ``one_statement``: the query is a single routine call that needs no more than the
    statement's own atomicity. Where a routine call is atomic by itself (PostgreSQL) it is
    sent alone on an autocommit connection: one round trip instead of four (BEGIN, SET
    TRANSACTION, the call, COMMIT). Its isolation is then the server's default: READ
    COMMITTED unless a DBA changed it, and at a stricter level a conflict is a serialization
    failure, retried like any other.

    ``connection_attempts``: at most this many attempts end with a lost connection (default
    CONNECTION_ATTEMPTS; 1: a call whose outcome a lost connection leaves unknown is not sent
    again).

    ``engine`` may be a Connection in autocommit mode the caller keeps (_on_own_connection)."""
    if isinstance(engine, Connection):
        return _on_own_connection(
            engine, query, namespace, params, what, max_attempts, retry_codes, one_statement
        )
    dialect = dialect_of(engine)
    alone = one_statement and dialect.atomic_routines
    if connection_attempts is None:
        connection_attempts = CONNECTION_ATTEMPTS
    lost = 0
    for attempt in range(1, max_attempts + 1):
        try:
            if alone and schema_checked(engine, namespace):
                # A worker's claim and heartbeat: straight from the pool to the driver.
                with translated(dialect):
                    lean = dialect.execute_alone(engine, query, namespace, params)
                if lean is not None:
                    logs.connection_back(engine)
                    return lean
            # Connecting is inside translated too: a server that is down, restarting or
            # failing over raises at connect time, and that is a ConnectionLost to retry.
            with translated(dialect), engine.connect() as conn:
                if alone:
                    # psycopg's autocommit is a client-side switch: no round trip, here or
                    # when the pool resets the connection.
                    auto = conn.execution_options(isolation_level="AUTOCOMMIT")
                    check_schema(auto, namespace)
                    rows = dialect.execute(auto, query, namespace, params)
                else:
                    with conn.begin():
                        # READ COMMITTED for this transaction only, as its first statement.
                        # Not execution_options(isolation_level=...): that sets the session
                        # level and resets it when the connection goes back to the pool, an
                        # extra round trip that, on a connection the server cut, raised a raw
                        # driver error.
                        dialect.execute(conn, "scheduler_transaction", namespace)
                        check_schema(conn, namespace)
                        rows = dialect.execute(conn, query, namespace, params)
            logs.connection_back(engine)
            return rows
        except errors.AssetqError as exc:
            retry = worth_retrying(exc, retry_codes)
            # A server that is gone stays gone for longer than a large conflict budget
            # (max_attempts=50 on Galera, for certification conflicts) would keep the caller
            # inside one call: lost connections get at most CONNECTION_ATTEMPTS of them, and
            # the caller's loop (which can stop) backs off from the rest.
            if isinstance(exc, errors.ConnectionLost):
                lost += 1
                retry = retry and lost < connection_attempts
            if not retry or attempt == max_attempts:
                raise
            time.sleep(retry_delay(engine, what, attempt, exc))
    raise AssertionError("unreachable")


def schedule(
    engine: Engine,
    *,
    limit: int = 100,
    namespace: str = DEFAULT_NAMESPACE,
    max_attempts: int = 8,
) -> list[Run]:
    """Run one scheduler pass over at most ``limit`` consumers and return the runs created.

    The pass is a short READ COMMITTED transaction of its own. Each consumer with queued
    events is locked (skipped if another scheduler holds it), its committed queue rows are
    claimed, and if its condition holds on them one run consumes exactly those events.
    A consumer with ``max_events_per_run`` gets runs one after another while its queue fills
    them, each claimed from what the one before left, up to its share of the pass: ``limit``
    divided by the number of consumers the pass takes, at least one, and never past its
    ``max_active_runs`` (docs/semantics.md, §5). So a pass creates at most ``limit`` runs of
    unpartitioned consumers, and a capped backlog drains up to ``limit`` runs per pass.
    Consumers are taken least recently examined first, so repeated calls reach every consumer.
    Safe to call from any number of threads and processes at once: each (consumer, event)
    is linked at most once, enforced by a unique constraint. Transient failures (deadlock,
    serialization failure, lock timeout, claim-guard abort) are rolled back and retried with
    jittered exponential backoff, up to ``max_attempts`` attempts.
    """
    engine = engine_of(engine, "schedule")
    check_int(limit, "limit", 1, 1_000_000)
    check_int(max_attempts, "max_attempts", 1, 100)
    namespace = check_namespace(namespace)
    rows = read_committed_transaction(
        engine, "schedule_pass", namespace, {"limit": limit}, "scheduler pass", max_attempts
    )
    runs = []
    for row in rows:
        created_at = to_utc(row.created_at)
        event_ids = _event_ids(row.event_ids)
        runs.append(
            Run(
                id=int(row.dag_run_id),
                dag_id=str(row.dag_id),
                run_id=str(row.run_id),
                seq=int(row.seq),
                run_after=to_utc(row.run_after),
                created_at=created_at,
                event_ids=event_ids,
                event_count=len(event_ids),
                # Every pass creates a run claimable from its creation (not_before).
                not_before=created_at,
                triggering_event_id=None
                if row.triggering_event_id is None
                else int(row.triggering_event_id),
                state=_run_state(row.state),
                partition_key=row.partition_key,
            )
        )
    return runs


#: Most rows one page of :func:`runs`, :func:`queued_events` or :func:`consumed_events` holds.
PAGE_MAX = 10_000


def run_info(row: Any) -> Run:
    return Run(
        id=int(row.dag_run_id),
        dag_id=str(row.dag_id),
        run_id=str(row.run_id),
        seq=int(row.seq),
        state=_run_state(row.state),
        run_after=to_utc(row.run_after),
        created_at=to_utc(row.created_at),
        started_at=_utc_or_none(row.started_at),
        ended_at=_utc_or_none(row.ended_at),
        triggering_event_id=None
        if row.triggering_event_id is None
        else int(row.triggering_event_id),
        event_count=int(row.event_count),
        attempt=int(row.attempt),
        worker=row.worker,
        lease_until=_utc_or_none(row.lease_until),
        not_before=_utc_or_none(row.not_before),
        error=row.error,
        # Only complete_run and retry_run return it, in the order the events were given.
        output_event_ids=_ids_in_order(row.output_event_ids)
        if "output_event_ids" in row._fields
        else (),
        partition_key=row.partition_key,
        deadline=_utc_or_none(getattr(row, "deadline", None)),
    )


def event_record(row: Any) -> Event:
    extra = row.extra
    if isinstance(extra, str | bytes):  # MySQL returns JSON as text
        extra = json.loads(extra)
    aliases = row.aliases
    if isinstance(aliases, str | bytes):
        aliases = json.loads(aliases)
    return Event(
        id=int(row.event_id),
        asset=str(row.asset_name),
        asset_id=int(row.asset_id),
        uri=None if row.asset_uri is None else str(row.asset_uri),
        timestamp=to_utc(row.event_timestamp),
        extra=extra,
        source=Source(
            dag_id=row.source_dag_id,
            task_id=row.source_task_id,
            run_id=row.source_run_id,
            map_index=int(row.source_map_index),
        ),
        aliases=tuple(sorted(str(a) for a in aliases or ())),
        partition_key=row.partition_key,
    )


def _check_state(state: object) -> None:
    # Still checked at run time: a type checker does not see every caller (a str from a form).
    if not is_run_state(state):
        raise errors.InvalidRunState(
            f"unknown run state {state!r}: use one of {', '.join(RUN_STATES)}", code="AQ008"
        )


def _run_state(value: object) -> RunState:
    """A state the database returned, as the Literal type: its check constraint holds it to
    RUN_STATES. Not refused otherwise: a newer schema inside the compatibility window must
    not make this package's reads fail."""
    return cast(RunState, str(value))


def _run_key(dag_id: object, run_id: object) -> tuple[str, str]:
    return check_dag_id(dag_id), check_name(run_id, "run_id", RUN_ID_MAX)


def set_run_state(
    conn: Handle,
    dag_id: str,
    run_id: str,
    state: RunState,
    *,
    savepoint: bool = True,
    namespace: str = DEFAULT_NAMESPACE,
) -> Run:
    """Move run ``run_id`` of consumer ``dag_id`` to ``state`` and return it.

    Allowed: queued -> running, success or failed; running -> success or failed. Moving a run
    to the state it is already in changes nothing, so a retry is harmless. Anything else
    raises InvalidRunState; an unknown run UnknownRun. A run in success or failed no longer
    counts against the consumer's ``max_active_runs``: the next scheduler pass may create
    the next run. Runs in the caller's transaction; ``savepoint``: see :func:`register_event`.
    """
    conn = connection_of(conn, "set_run_state")
    dag_id, run_id = _run_key(dag_id, run_id)
    _check_state(state)
    namespace = check_namespace(namespace)
    dialect = _checked(conn, namespace)
    params = {"dag_id": dag_id, "run_id": run_id, "state": state}
    with translated(dialect), _savepoint(conn, savepoint), dialect.atomic(conn):
        rows = dialect.execute(conn, "set_run_state", namespace, params)
    info = run_info(rows[0])
    log.info(
        "assetq: run %s of %s is %s",
        run_id,
        dag_id,
        info.state,
        extra=logs.run_fields(info),
    )
    return info


def get_run(conn: Handle, dag_id: str, run_id: str, *, namespace: str = DEFAULT_NAMESPACE) -> Run:
    """Run ``run_id`` of consumer ``dag_id``; UnknownRun if there is none."""
    conn = connection_of(conn, "get_run")
    dag_id, run_id = _run_key(dag_id, run_id)
    namespace = check_namespace(namespace)
    dialect = _checked(conn, namespace)
    with translated(dialect):
        rows = dialect.execute(conn, "get_run", namespace, {"dag_id": dag_id, "run_id": run_id})
    if not rows:
        raise errors.UnknownRun(f"unknown run {run_id!r} of dag {dag_id!r}", code="AQ006")
    return run_info(rows[0])


def delete_dag(
    conn: Handle, dag_id: str, *, savepoint: bool = True, namespace: str = DEFAULT_NAMESPACE
) -> None:
    """Remove consumer ``dag_id`` with its queued events, condition, runs and their links.

    Waits for a scheduler pass that holds the consumer, and for producers registering for it
    (their events are simply not queued for it once it is gone). Raises UnknownDag for an
    unknown id. Runs in the caller's transaction; ``savepoint``: see :func:`register_event`.
    On PostgreSQL the transaction must be READ COMMITTED (the default): above it
    InvalidArgument (AQ002), nothing deleted, since its delete of the consumer's queue rows
    would miss those of producers that committed while it waited (docs/guarantees.md).
    """
    conn = connection_of(conn, "delete_dag")
    dag_id = check_dag_id(dag_id)
    namespace = check_namespace(namespace)
    dialect = _checked(conn, namespace)
    with translated(dialect), _savepoint(conn, savepoint), dialect.atomic(conn):
        dialect.execute(conn, "delete_dag", namespace, {"dag_id": dag_id})
    log.info("assetq: deleted dag %s", dag_id)


def delete_asset(
    conn: Handle, asset: str, *, savepoint: bool = True, namespace: str = DEFAULT_NAMESPACE
) -> int:
    """Remove ``asset`` (a name or uri) with its events; return how many events went.

    Refused with AssetInUse while a consumer condition names it (re-declare those consumers
    first). Its events' queue rows go too (consumers that depended on it through an alias
    lose the pending ones), as do its alias resolutions; runs that consumed its events keep
    their other events and their ``event_count``. Producers registering for it meanwhile
    either finish first (their events are deleted too) or get UnknownAsset. Runs in the
    caller's transaction; ``savepoint``: see :func:`register_event`.
    """
    conn = connection_of(conn, "delete_asset")
    asset = check_name(asset, "asset", ASSET_NAME_MAX)
    namespace = check_namespace(namespace)
    dialect = _checked(conn, namespace)
    with translated(dialect), _savepoint(conn, savepoint), dialect.atomic(conn):
        rows = dialect.execute(conn, "delete_asset", namespace, {"asset": asset})
    deleted = int(rows[0].deleted_events)
    log.info("assetq: deleted asset %s with %d events", asset, deleted)
    return deleted


def runs(
    conn: Handle,
    dag_id: str | None = None,
    *,
    state: RunState | None = None,
    limit: int = 100,
    before: Run | None = None,
    namespace: str = DEFAULT_NAMESPACE,
) -> list[Run]:
    """One page of consumer ``dag_id``'s runs, newest (highest ``seq``) first; with
    ``dag_id`` None, of every consumer's runs, newest (highest ``id``) first.

    ``state`` keeps only runs in that state (``runs(conn, state="failed")``: what failed,
    anywhere). For the next page pass the last run of this one as ``before``; an empty page
    is the end. At most ``limit`` (1 to 10,000) runs per page, read with one indexed range
    query however many runs there are.
    """
    conn = connection_of(conn, "runs")
    if dag_id is None:
        return _all_runs(conn, state, limit, before, namespace)
    dag_id = check_dag_id(dag_id)
    if state is not None:
        _check_state(state)
    check_int(limit, "limit", 1, PAGE_MAX)
    _check_before(before)
    namespace = check_namespace(namespace)
    dialect = _checked(conn, namespace)
    params = {
        "dag_id": dag_id,
        "state": state,
        "before_seq": None if before is None else before.seq,
        "limit": limit,
    }
    with translated(dialect):
        rows = dialect.execute(conn, "runs_page", namespace, params)
    return [run_info(row) for row in rows]


def _check_before(before: object) -> None:
    if before is not None and not isinstance(before, Run):
        raise errors.InvalidArgumentType(
            f"before must be an assetq.Run from the previous page, got {type(before).__name__}"
        )


def _all_runs(
    conn: Connection, state: RunState | None, limit: int, before: Run | None, namespace: str
) -> list[Run]:
    if state is not None:
        _check_state(state)
    check_int(limit, "limit", 1, PAGE_MAX)
    _check_before(before)
    namespace = check_namespace(namespace)
    dialect = _checked(conn, namespace)
    params = {
        "state": state,
        "before_id": None if before is None else before.id,
        "limit": limit,
    }
    with translated(dialect):
        rows = dialect.execute(conn, "runs_page_all", namespace, params)
    return [run_info(row) for row in rows]


def queued_events(
    conn: Handle,
    dag_id: str,
    *,
    limit: int = 100,
    after: Event | None = None,
    namespace: str = DEFAULT_NAMESPACE,
) -> list[Event]:
    """One page of the events queued for consumer ``dag_id`` (not consumed yet), oldest first:
    the order ``max_events_per_run`` consumes them in. For the next page pass the last event
    of this one as ``after``; an empty page is the end. At most ``limit`` (1 to 10,000)."""
    conn = connection_of(conn, "queued_events")
    dag_id = check_dag_id(dag_id)
    check_int(limit, "limit", 1, PAGE_MAX)
    _check_after(after)
    namespace = check_namespace(namespace)
    dialect = _checked(conn, namespace)
    params = {
        "dag_id": dag_id,
        "after_timestamp": None if after is None else db_time(dialect, after.timestamp),
        "after_id": None if after is None else after.id,
        "limit": limit,
    }
    with translated(dialect):
        rows = dialect.execute(conn, "queued_events_page", namespace, params)
    return [event_record(row) for row in rows]


def consumed_events(
    conn: Handle,
    dag_id: str,
    run_id: str,
    *,
    limit: int = 100,
    after: Event | None = None,
    namespace: str = DEFAULT_NAMESPACE,
) -> list[Event]:
    """One page of the events run ``run_id`` of consumer ``dag_id`` consumed, by event id.
    For the next page pass the last event of this one as ``after``; an empty page is the end.
    Events purged since are not listed (the run's ``event_count`` still counts them). Raises
    UnknownRun when the run does not exist."""
    conn = connection_of(conn, "consumed_events")
    dag_id, run_id = _run_key(dag_id, run_id)
    check_int(limit, "limit", 1, PAGE_MAX)
    _check_after(after)
    namespace = check_namespace(namespace)
    dialect = _checked(conn, namespace)
    params = {
        "dag_id": dag_id,
        "run_id": run_id,
        "after_id": None if after is None else after.id,
        "limit": limit,
    }
    with translated(dialect):
        rows = dialect.execute(conn, "consumed_events_page", namespace, params)
    if not rows:
        get_run(conn, dag_id, run_id, namespace=namespace)  # UnknownRun, or the end
    return [event_record(row) for row in rows]


def _check_after(after: object) -> None:
    if after is not None and not isinstance(after, Event):
        raise errors.InvalidArgumentType(
            f"after must be an assetq.Event from the previous page, got {type(after).__name__}"
        )


def db_time(dialect: Dialect, value: datetime) -> datetime:
    """A timestamp as the engine compares it: MySQL's DATETIME(6) holds naive UTC."""
    if dialect.name == "mysql":
        return value.astimezone(timezone.utc).replace(tzinfo=None)
    return value


def _dialect_of_either(handle: Engine | Connection | None) -> Dialect:
    assert handle is not None
    return dialect_of(handle) if isinstance(handle, Engine) else dialect_for(handle)


def _claim_time(dialect: Dialect, claim: Claim) -> datetime | None:
    """The claim's fencing token: when it started its attempt, as the database recorded it
    (heartbeat_run_v2 and complete_run_v2 refuse a call whose claim is not the run's current
    one, a run made again with the same id and attempt included). None: the attempt alone."""
    return None if claim.started_at is None else db_time(dialect, claim.started_at)


# -- runs as work (docs/workers.md) -------------------------------------------------------

#: The states :func:`complete_run` finishes an attempt with (a subset of :data:`RunState`).
CompletionState = Literal["success", "failed"]


def _claim(row: Any, lease: timedelta) -> Claim:
    return Claim(
        id=int(row.dag_run_id),
        dag_id=str(row.dag_id),
        run_id=str(row.run_id),
        seq=int(row.seq),
        run_after=to_utc(row.run_after),
        created_at=to_utc(row.created_at),
        event_ids=_event_ids(row.event_ids),
        triggering_event_id=None
        if row.triggering_event_id is None
        else int(row.triggering_event_id),
        state=_run_state(row.state),
        attempt=int(row.attempt),
        worker=str(row.worker),
        lease_until=to_utc(row.lease_until),
        lease=lease,
        started_at=_utc_or_none(row.started_at),
        partition_key=row.partition_key,
        deadline=_utc_or_none(getattr(row, "deadline", None)),
        capped=bool(getattr(row, "capped", False)),
        made=bool(getattr(row, "made", False)),
    )


def _check_claim(claim: object) -> Claim:
    if not isinstance(claim, Claim):
        raise errors.InvalidArgumentType(
            f"claim must be an assetq.Claim from claim_runs, got {type(claim).__name__}"
        )
    return claim


#: How long a worker's pass (claim_runs with schedule=True) waits for a consumer another
#: pass holds: a pass takes milliseconds; a lock held longer (a declaration in a long
#: transaction) is skipped after this, as a scheduler's pass skips it.
SCHEDULE_WAIT_SECONDS = 0.25


def claim_runs(
    engine: Engine | Connection,
    worker: str,
    *,
    limit: int = 1,
    lease: timedelta | float = timedelta(seconds=60),
    dag_ids: Sequence[str] | None = None,
    namespace: str = DEFAULT_NAMESPACE,
    max_attempts: int = 8,
    timeout: timedelta | float | None = None,
    schedule: bool = False,
) -> list[Claim]:
    """Claim up to ``limit`` (1 to 1,000) runs for ``worker`` and return them, running.

    Queued runs whose retry delay has passed, and running runs whose lease expired, oldest
    first (of the consumers ``dag_ids``, or of all). Each claim is a new attempt, held under
    a lease of ``lease`` (a timedelta or seconds) on the database's clock; renew it with
    :func:`heartbeat` and finish with :func:`complete_run`. A run whose lease expired on its
    last attempt (the consumer's ``max_attempts``) is failed instead of claimed. One short
    READ COMMITTED transaction of its own (deadlocks and lost connections are retried up to
    ``max_attempts`` times). Safe to call from any number of workers at once: each attempt is
    claimed by exactly one of them (row locks, SKIP LOCKED: claimers never wait for each
    other).

    ``engine`` may also be a Connection in autocommit mode that the worker keeps
    (``engine.connect().execution_options(isolation_level="AUTOCOMMIT")``): each call is
    then a transaction of its own on it, with no pool checkout; a lost connection is not
    retried there (:class:`~assetq.ConnectionLost`: connect again).

    Each claim's attempt times out at its ``deadline``: the claim's time plus the consumer's
    ``timeout`` (:func:`declare_dag`), or ``timeout`` (a timedelta or seconds) for consumers
    that declare none. Its lease never runs past the deadline; after it, the attempt's
    success and heartbeats are refused (LeaseLost), and the next claim that finds it ends it
    as failed (``timed out after 30s``), retried by ``max_attempts`` like any failure.

    ``schedule=True``: first a scheduler pass over the consumers ``dag_ids`` (or all), in the
    same statement, so the runs it makes are claimed at once: what a worker woken by a
    producer's notification does (PostgreSQL), one hop from the producer's commit to the
    claim instead of two (a scheduler's pass, its notification, then the claim). A consumer
    another pass holds is waited for, up to 0.25 s, and then the run that pass made is
    claimed.
    """
    engine = _engine_or_autocommit(engine, "claim_runs")
    worker = check_name(worker, "worker", WORKER_MAX)
    check_int(limit, "limit", 1, 1000)
    lease_seconds = seconds(lease, "lease")
    dag_ids_json = None
    if dag_ids is not None:
        if isinstance(dag_ids, str) or not isinstance(dag_ids, Iterable):
            raise errors.InvalidArgumentType(
                f"dag_ids must be a sequence of dag ids, got {type(dag_ids).__name__}"
            )
        dag_ids_json = json.dumps(sorted({check_dag_id(d) for d in dag_ids}))
    check_int(max_attempts, "max_attempts", 1, 100)
    namespace = check_namespace(namespace)
    params = {
        "worker": worker,
        "limit": limit,
        "lease_seconds": lease_seconds,
        "dag_ids": dag_ids_json,
        "timeout_seconds": None if timeout is None else seconds(timeout, "timeout"),
    }
    if not isinstance(schedule, bool):
        raise errors.InvalidArgumentType(f"schedule must be a bool, got {type(schedule).__name__}")
    query = "claim_runs"
    if schedule:
        query = "schedule_and_claim"
        params["wait_seconds"] = SCHEDULE_WAIT_SECONDS
    rows = read_committed_transaction(
        engine, query, namespace, params, "claim", max_attempts, one_statement=True
    )
    held = timedelta(seconds=lease_seconds)
    claims = [_claim(row, held) for row in rows]
    if len(claims) > 1:
        claims.sort(key=lambda c: c.id)
    return claims


def heartbeat(
    engine: Engine | Connection,
    claim: Claim,
    *,
    lease: timedelta | float | None = None,
    namespace: str = DEFAULT_NAMESPACE,
) -> Claim:
    """Renew ``claim``'s lease to ``lease`` from now (default: the lease it was claimed
    with), on the database's clock, and return the claim with its new ``lease_until``.

    Raises :class:`~assetq.LeaseLost` (nothing written) when the run is no longer held at
    the claim's attempt: another worker claimed it after the lease expired, or it was
    finished. A lease that expired while nobody claimed the run is simply renewed. One short
    transaction of its own; a deadlock or lost connection is retried. ``engine`` may be a
    Connection in autocommit mode, as for :func:`claim_runs`.
    """
    engine = _engine_or_autocommit(engine, "heartbeat")
    claim = _check_claim(claim)
    lease_seconds = claim.lease.total_seconds() if lease is None else seconds(lease, "lease")
    namespace = check_namespace(namespace)
    params = {
        "dag_id": claim.dag_id,
        "run_id": claim.run_id,
        "attempt": claim.attempt,
        "lease_seconds": lease_seconds,
        "started_at": _claim_time(_dialect_of_either(engine), claim),
    }
    rows = read_committed_transaction(
        engine, "heartbeat_run", namespace, params, "heartbeat", 3, one_statement=True
    )
    return replace(
        claim, lease_until=to_utc(rows[0].lease_until), lease=timedelta(seconds=lease_seconds)
    )


def _output_events(claim: Claim, events: object) -> str | None:
    """The JSON array complete_run registers: register_events' items, with the run as their
    source and the run's partition key unless an item names its own."""
    if events is None:
        return None
    if isinstance(events, str | bytes | Mapping) or not isinstance(events, Iterable):
        raise errors.InvalidArgumentType(
            f"events must be a sequence of assetq.NewEvent or mappings, got {type(events).__name__}"
        )
    items = list(events)
    if len(items) > BATCH_MAX_EVENTS:
        raise errors.InvalidArgument(f"a run produces at most {BATCH_MAX_EVENTS} events")
    texts = []
    for number, item in enumerate(items, start=1):
        try:
            new = _new_event(item)
            if new.source is None:
                new = replace(new, source=Source(dag_id=claim.dag_id, run_id=claim.run_id))
            if new.partition_key is None and claim.partition_key is not None:
                # A partitioned run's outputs are of its partition unless they say otherwise.
                new = replace(new, partition_key=claim.partition_key)
            texts.append(_batch_item(new)[3])
        except errors.InvalidArgument as exc:
            raise type(exc)(f"output event {number}: {exc}", code=exc.code) from None
    if not texts:
        return None
    payload = "[" + ",".join(texts) + "]"
    if len(payload.encode("utf-8")) > BATCH_MAX_BYTES:
        raise errors.InvalidArgument(
            f"the run's output events are more than {BATCH_MAX_BYTES} bytes of JSON"
        )
    return payload


def complete_run(
    conn: Handle | Engine,
    claim: Claim,
    state: CompletionState,
    *,
    events: Iterable[NewEvent | Mapping[str, Any]] | None = None,
    error: str | None = None,
    namespace: str = DEFAULT_NAMESPACE,
) -> Run:
    """Finish ``claim``'s attempt as ``"success"`` or ``"failed"``, in the caller's
    transaction, and return the run.

    Success: the run succeeds and ``events`` (as :func:`register_events` takes them; their
    source defaults to this run) are registered and queued for their consumers, so your own
    writes in this transaction, the success and the output events commit together or not at
    all. Failed: ``error`` is recorded (its first 4,000 characters); with attempts left (the
    consumer's ``max_attempts``) the run is queued again after its retry delay, else it fails
    for good. Success and a final failure free a place under ``max_active_runs``.

    Raises :class:`~assetq.LeaseLost` when the run is no longer held at the claim's attempt
    (nothing written: roll back). A worker whose lease expired may still complete while
    nobody claimed the run again.

    ``conn`` may also be an Engine, for work that wrote nothing to this database (a call to
    another service, a file): the completion is then a short transaction of its own, with
    its output events (on PostgreSQL one statement on an autocommit connection, a single
    round trip). A deadlock is retried there; a lost connection is not, because the
    completion may have committed before it was lost: :class:`~assetq.ConnectionLost` is
    raised and :func:`get_run` tells.
    """
    engine = conn if isinstance(conn, Engine) else None
    connection = None if engine is not None else connection_of(conn, "complete_run", or_engine=True)
    claim = _check_claim(claim)
    if state not in ("success", "failed"):
        raise errors.InvalidRunState(
            f"a run is completed as 'success' or 'failed', got {state!r}", code="AQ008"
        )
    payload = _output_events(claim, events)
    if state == "failed" and payload is not None:
        raise errors.InvalidArgument("a failed run produces no events")
    if error is not None:
        if not isinstance(error, str):
            raise errors.InvalidArgumentType(f"error must be a str, got {type(error).__name__}")
        error = error.replace("\x00", "")[:ERROR_MAX]
    namespace = check_namespace(namespace)
    params = {
        "dag_id": claim.dag_id,
        "run_id": claim.run_id,
        "attempt": claim.attempt,
        "state": state,
        "error": error,
        "events": payload,
        "started_at": _claim_time(_dialect_of_either(engine or connection), claim),
    }
    if engine is not None:
        rows = read_committed_transaction(
            engine,
            "complete_run",
            namespace,
            params,
            "complete_run",
            3,
            one_statement=True,
            connection_attempts=1,
        )
    else:
        assert connection is not None
        began = connection.in_transaction()
        dialect = _checked(connection, namespace)
        with translated(dialect), dialect.atomic(connection):
            rows = dialect.execute(connection, "complete_run", namespace, params)
        if not began and connection.in_transaction() and _autocommit(connection):
            # On a connection in autocommit mode the call was a transaction of its own;
            # SQLAlchemy's autobegin marked one it does not have (MySQL's path executes
            # through SQLAlchemy), which the caller's next conn.begin() must not find.
            connection.commit()
    return run_info(rows[0])


def retry_run(conn: Handle, dag_id: str, run_id: str, *, namespace: str = DEFAULT_NAMESPACE) -> Run:
    """Put failed run ``run_id`` of consumer ``dag_id`` back in the queue, claimable now,
    with the same events and run id, and return it. Its next claim is the next attempt (the
    count goes on: attempt 4 after three), and it gets that one attempt whatever the
    consumer's ``max_attempts`` says. InvalidRunState unless the run is failed or cancelled;
    UnknownRun.
    May put the consumer one run over ``max_active_runs``. Runs in the caller's transaction.
    """
    conn = connection_of(conn, "retry_run")
    dag_id, run_id = _run_key(dag_id, run_id)
    namespace = check_namespace(namespace)
    dialect = _checked(conn, namespace)
    with translated(dialect), dialect.atomic(conn):
        rows = dialect.execute(conn, "retry_run", namespace, {"dag_id": dag_id, "run_id": run_id})
    info = run_info(rows[0])
    log.info(
        "assetq: run %s of %s queued again for attempt %d",
        run_id,
        dag_id,
        info.attempt + 1,
        extra=logs.run_fields(info),
    )
    return info


def cancel_run(
    conn: Handle,
    dag_id: str,
    run_id: str,
    reason: str | None = None,
    *,
    namespace: str = DEFAULT_NAMESPACE,
) -> Run:
    """Cancel run ``run_id`` of consumer ``dag_id`` and return it, ``cancelled``: a final
    state, never claimed, not counted in ``max_active_runs``. A queued run is cancelled
    before any worker takes it; a running one at once, whoever holds it: its worker is fenced
    (its next heartbeat or completion raises :class:`~assetq.LeaseLost`, and nothing it
    writes in its completion's transaction commits), and :func:`assetq.run_worker` stops
    waiting for its handler (``claim.cancelled`` is set; an async handler is cancelled). The
    run's events stay consumed by it: :func:`retry_run` queues it again with them. ``reason``
    is recorded in its ``error`` ("cancelled: <reason>"). InvalidRunState for a run already
    final (success, failed, cancelled), UnknownRun. Runs in the caller's transaction.
    """
    conn = connection_of(conn, "cancel_run")
    dag_id, run_id = _run_key(dag_id, run_id)
    if reason is not None and not isinstance(reason, str):
        raise errors.InvalidArgumentType(
            f"reason must be a str or None, got {type(reason).__name__}"
        )
    namespace = check_namespace(namespace)
    dialect = _checked(conn, namespace)
    with translated(dialect), dialect.atomic(conn):
        rows = dialect.execute(
            conn, "cancel_run", namespace, {"dag_id": dag_id, "run_id": run_id, "reason": reason}
        )
    info = run_info(rows[0])
    log.info(
        "assetq: run %s of %s cancelled%s",
        run_id,
        dag_id,
        f" ({reason})" if reason else "",
        extra=logs.run_fields(info),
    )
    return info
