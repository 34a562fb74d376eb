"""assetq for SQLAlchemy's asyncio extension: the public API with the same names, errors and
guarantees, awaited.

Functions that run in the caller's transaction take an ``AsyncConnection`` or an
``AsyncSession`` (``await session.connection()``: the Session's transaction). They run the
sync function of the same name on the connection's sync facade with
``AsyncConnection.run_sync``: one core, two shells, so validation, SQL, row mapping and the
savepoint (``savepoint=True``) are exactly the sync API's, and so are the errors. The
database calls are awaited on the event loop through SQLAlchemy's greenlet bridge, never in
a thread.

Functions that own their transactions take an ``AsyncEngine``. :func:`schedule` and
:func:`claim_runs` retry transient errors here, sleeping with ``asyncio.sleep`` between
attempts; :func:`heartbeat`, :func:`purge`, :func:`doctor` and the rest run the sync
function whole in the bridge, so their short retry backoffs (tens of milliseconds for a
heartbeat) would hold the loop: they are rare and short.

:func:`run_scheduler` and :func:`run_worker` are the loops, as tasks of the running event
loop: they never block it (waits are ``asyncio`` waits, handlers are coroutines). The
worker is woken on PostgreSQL by the scheduler pass's notification (LISTEN on a psycopg
async connection of its own, only when it is directly connected: behind a pooler it polls);
the async scheduler is woken on PostgreSQL by the sync scheduler's own wake-up protocol
(:mod:`assetq.scheduler`), whose connection waits in a thread.

Drivers: psycopg 3 (``postgresql+psycopg://``, the same URL as the sync engine) and aiomysql
(``mysql+aiomysql://``); :func:`async_url` turns a sync URL into its async twin. Install
with ``pip install 'assetq[async]'``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import random
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any, Concatenate, ParamSpec, TypeAlias, TypeVar

import sqlalchemy as sa
from sqlalchemy import URL, Connection, Engine, make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import (
    AsyncConnection,
    AsyncEngine,
    AsyncSession,
    async_scoped_session,
)
from sqlalchemy.util import greenlet_spawn

from . import api, errors, migrate, ops
from .api import Claim, NewEvent, Run
from .dialects import dialect_of
from .handles import WRONG_HANDLE_CODE
from .liveness import DEFAULT_INTERVAL, Liveness, check_interval
from .logs import (
    attempt_fields,
    close_detached,
    connection_lost,
    first_line,
    log_retried,
    retry_level,
)
from .metrics import AttemptOutcome, Metrics
from .namespace import DEFAULT_NAMESPACE
from .scheduler import (
    ARMED,
    PASS,
    POLL,
    WOKEN,
    WORKER_HEAD_START,
    SchedulerStats,
    _error_code,
    _ErrorLog,
    _Listener,
    _Round,
    check_head_start,
    log_created,
    pooled_warning,
    run_latencies,
)
from .validation import WORKER_MAX, check_int, check_name, check_namespace, seconds
from .worker import (
    PassGate,
    WorkerStats,
    _error_text,
    _handlers,
    attempt_timeout,
    default_worker_name,
    log_claimed,
    log_completed,
    runs_next_pass,
    timed_out_error,
)

__all__ = [
    "AsyncHandle",
    "AsyncHandler",
    "async_url",
    "cancel_run",
    "claim_runs",
    "complete_run",
    "consumed_events",
    "current_revision",
    "declare_asset",
    "declare_dag",
    "delete_asset",
    "delete_dag",
    "doctor",
    "get_run",
    "grant_roles",
    "heartbeat",
    "install",
    "pause_dag",
    "processes",
    "purge",
    "purge_preview",
    "queued_events",
    "register_event",
    "register_events",
    "repair",
    "retry_run",
    "revoke_roles",
    "run_scheduler",
    "run_worker",
    "runs",
    "schedule",
    "set_run_state",
    "status",
    "uninstall",
    "uninstall_preview",
    "unpause_dag",
]

log = logging.getLogger("assetq.aio")

_P = ParamSpec("_P")
_T = TypeVar("_T")

#: What an async function that runs in the caller's transaction accepts.
AsyncHandle: TypeAlias = AsyncConnection | AsyncSession | async_scoped_session[Any]

#: An async worker's handler: ``await handler(claim, conn)`` runs inside the transaction that
#: completes the run and returns the run's output events (or None), as for
#: :data:`assetq.Handler`.
AsyncHandler = Callable[
    [Claim, AsyncConnection], Awaitable["Iterable[NewEvent | Mapping[str, Any]] | None"]
]

#: Async drivers by engine, for :func:`async_url`.
_ASYNC_DRIVERS = {"postgresql": "postgresql+psycopg", "mysql": "mysql+aiomysql"}


def async_url(url: str | URL) -> URL:
    """``url`` with the async driver assetq is tested with: psycopg 3 for PostgreSQL (whose
    URL serves both), aiomysql for MySQL/MariaDB (``mysql+pymysql://`` becomes
    ``mysql+aiomysql://``, its options kept)."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    backend = "mysql" if backend == "mariadb" else backend
    if backend not in _ASYNC_DRIVERS:
        raise errors.InvalidArgument(f"assetq supports PostgreSQL and MySQL/MariaDB, not {backend}")
    if parsed.get_driver_name() in ("psycopg", "aiomysql", "asyncmy", "psycopg_async"):
        return parsed
    return parsed.set(drivername=_ASYNC_DRIVERS[backend])


def _wrong(message: str) -> errors.InvalidArgumentType:
    return errors.InvalidArgumentType(message, code=WRONG_HANDLE_CODE)


async def _connection(handle: object, function: str) -> AsyncConnection:
    if isinstance(handle, AsyncConnection):
        return handle
    if isinstance(handle, async_scoped_session):
        handle = handle()
    if isinstance(handle, AsyncSession):
        return await handle.connection()
    name = type(handle).__name__
    if isinstance(handle, AsyncEngine):
        raise _wrong(
            f"assetq.aio.{function} runs in the caller's transaction: pass an AsyncConnection"
            " or an AsyncSession, not an AsyncEngine (async with engine.begin() as conn: ...)"
        )
    raise _wrong(
        f"assetq.aio.{function} takes an AsyncConnection or an AsyncSession, got {name}"
        + (f": for a sync {name} use assetq.{function}" if _is_sync(handle) else "")
    )


def _engine(handle: object, function: str) -> Engine:
    """The sync facade of the AsyncEngine ``handle``, to run sync functions on in the
    greenlet bridge."""
    if isinstance(handle, AsyncEngine):
        return handle.sync_engine
    name = type(handle).__name__
    if isinstance(handle, AsyncConnection | AsyncSession):
        raise _wrong(
            f"assetq.aio.{function} opens and commits transactions of its own: pass an"
            f" AsyncEngine, not an {name} (conn.engine / session.bind is the engine)"
        )
    raise _wrong(
        f"assetq.aio.{function} takes an AsyncEngine, got {name}"
        + (f": for a sync {name} use assetq.{function}" if _is_sync(handle) else "")
    )


def _is_sync(handle: object) -> bool:
    return type(handle).__module__.startswith(("sqlalchemy.engine", "sqlalchemy.orm"))


def _in_transaction(
    function: Callable[Concatenate[Connection, _P], _T],
) -> Callable[Concatenate[AsyncHandle, _P], Awaitable[_T]]:
    """The async shell of a sync function that runs in the caller's transaction."""
    name = function.__name__

    @functools.wraps(function)
    async def shell(handle: AsyncHandle, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        conn = await _connection(handle, name)
        return await conn.run_sync(lambda sync: function(sync, *args, **kwargs))

    shell.__doc__ = (
        f"Async version of :func:`assetq.{name}`, on an AsyncConnection or AsyncSession (the"
        f" caller's transaction).\n\n{function.__doc__ or ''}"
    )
    return shell


def _own_transactions(
    function: Callable[Concatenate[Engine, _P], _T],
) -> Callable[Concatenate[AsyncEngine, _P], Awaitable[_T]]:
    """The async shell of a sync function that owns its transactions."""
    name = function.__name__

    @functools.wraps(function)
    async def shell(engine: AsyncEngine, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        sync = _engine(engine, name)
        return await greenlet_spawn(lambda: function(sync, *args, **kwargs))

    shell.__doc__ = (
        f"Async version of :func:`assetq.{name}`, on an AsyncEngine.\n\n{function.__doc__ or ''}"
    )
    return shell


# -- the caller's transaction -----------------------------------------------------------------

declare_asset = _in_transaction(api.declare_asset)
declare_dag = _in_transaction(api.declare_dag)
pause_dag = _in_transaction(api.pause_dag)
unpause_dag = _in_transaction(api.unpause_dag)
register_event = _in_transaction(api.register_event)
register_events = _in_transaction(api.register_events)
runs = _in_transaction(api.runs)
queued_events = _in_transaction(api.queued_events)
consumed_events = _in_transaction(api.consumed_events)
set_run_state = _in_transaction(api.set_run_state)
get_run = _in_transaction(api.get_run)
delete_dag = _in_transaction(api.delete_dag)
delete_asset = _in_transaction(api.delete_asset)
complete_run = _in_transaction(api.complete_run)
retry_run = _in_transaction(api.retry_run)
cancel_run = _in_transaction(api.cancel_run)
status = _in_transaction(ops.status)
processes = _in_transaction(ops.processes)
current_revision = _in_transaction(migrate.current_revision)

# -- transactions of their own -----------------------------------------------------------------

heartbeat = _own_transactions(api.heartbeat)
purge = _own_transactions(ops.purge)
purge_preview = _own_transactions(ops.purge_preview)
doctor = _own_transactions(ops.doctor)
grant_roles = _own_transactions(ops.grant_roles)
revoke_roles = _own_transactions(ops.revoke_roles)
install = _own_transactions(migrate.install)
uninstall = _own_transactions(migrate.uninstall)
uninstall_preview = _own_transactions(ops.uninstall_preview)
repair = _own_transactions(migrate.repair)


def _retryable(exc: errors.AssetqError) -> bool:
    """What assetq.api.read_committed_transaction retries: a transient error, except a
    read-only server (the loops back off from it)."""
    return isinstance(exc, errors.TransientError) and not isinstance(exc, errors.ReadOnlyServer)


async def _retrying(
    what: str, max_attempts: int, attempt_once: Callable[[], _T], engine: Engine
) -> _T:
    """Run ``attempt_once`` (a sync call made with max_attempts=1) in the greenlet bridge up
    to ``max_attempts`` times, with the sync API's jittered exponential backoff, awaited.
    ``engine``: the sync engine it runs on (a lost connection is a WARNING once per outage)."""
    check_int(max_attempts, "max_attempts", 1, 100)
    lost = 0
    for attempt in range(1, max_attempts + 1):
        try:
            return await greenlet_spawn(attempt_once)
        except errors.AssetqError as exc:
            retry = _retryable(exc)
            # As the sync calls: a server that is gone gets at most CONNECTION_ATTEMPTS
            # attempts, whatever the conflict budget; the caller's loop backs off from it.
            if isinstance(exc, errors.ConnectionLost):
                lost += 1
                retry = retry and lost < api.CONNECTION_ATTEMPTS
            if not retry or attempt == max_attempts:
                raise
            delay = min(1.0, 0.01 * 2**attempt) * (0.5 + random.random())
            log.log(
                retry_level(engine, exc),  # DEBUG while the connection stays lost
                "assetq: %s attempt %d failed ([%s] %s); retrying in %.0f ms",
                what,
                attempt,
                exc.code or "no code",
                first_line(exc),
                delay * 1000,
            )
            await asyncio.sleep(delay)
    raise AssertionError("unreachable")


async def schedule(
    engine: AsyncEngine,
    *,
    limit: int = 100,
    namespace: str = DEFAULT_NAMESPACE,
    max_attempts: int = 8,
) -> list[api.Run]:
    """Async version of :func:`assetq.schedule`: one scheduler pass, a short READ COMMITTED
    transaction of its own, transient errors retried up to ``max_attempts`` times (the
    backoff awaited). The same guarantees: any number of passes may run at once."""
    sync = _engine(engine, "schedule")
    return await _retrying(
        "scheduler pass",
        max_attempts,
        lambda: api.schedule(sync, limit=limit, namespace=namespace, max_attempts=1),
        sync,
    )


async def claim_runs(
    engine: AsyncEngine,
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
    """Async version of :func:`assetq.claim_runs`: each attempt of the run is claimed by
    exactly one worker; transient errors retried up to ``max_attempts`` times (the backoff
    awaited). ``schedule=True``: a pass over ``dag_ids`` first, in the same statement."""
    sync = _engine(engine, "claim_runs")
    return await _retrying(
        "claim",
        max_attempts,
        lambda: api.claim_runs(
            sync,
            worker,
            limit=limit,
            lease=lease,
            dag_ids=dag_ids,
            namespace=namespace,
            max_attempts=1,
            timeout=timeout,
            schedule=schedule,
        ),
        sync,
    )


# -- the loops ---------------------------------------------------------------------------------


async def _wait(event: asyncio.Event, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for ``event``; True if it was set."""
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except asyncio.TimeoutError:
        return event.is_set()
    return True


async def run_scheduler(
    engine: AsyncEngine,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    limit: int = 100,
    poll_interval: float = 5.0,
    stop_event: asyncio.Event | None = None,
    on_run: Callable[[api.Run], None] | None = None,
    on_pass: Callable[[list[api.Run]], None] | None = None,
    max_passes: int | None = None,
    listen: bool = True,
    listen_engine: Engine | None = None,
    backoff_initial: float = 0.5,
    backoff_max: float = 30.0,
    max_attempts: int = 8,
    liveness_interval: float | None = DEFAULT_INTERVAL,
    metrics: Metrics | None = None,
    worker_head_start: float = WORKER_HEAD_START,
) -> SchedulerStats:
    """Async version of :func:`assetq.run_scheduler`: scheduler passes until ``stop_event``
    is set (or ``max_passes`` passes were made), as a task of the running loop.

    After a pass that created runs the next starts at once, and while a ready consumer may
    wait outside the pass's window (the sync loop's rounds); otherwise it waits
    ``poll_interval`` seconds, or until ``stop_event`` is set, or, on PostgreSQL
    (``listen=True``), until a producer's notification wakes it: the sync loop's wake-up
    protocol itself (:mod:`assetq.scheduler`), on a sync psycopg connection of its own from
    ``listen_engine`` (default: a sync engine on the AsyncEngine's URL, which psycopg serves
    both ways), whose blocking waits run in a thread (``asyncio.to_thread``), never on the
    event loop. Errors are logged once with their code and
    retried after a backoff (``backoff_initial`` doubling up to ``backoff_max``); an
    exception ``on_run`` or ``on_pass`` raises ends the loop. A pass in progress always
    finishes. Safe to run with any number of other schedulers, sync or async.
    ``liveness_interval``: its row in the liveness table, as the sync loop's. ``metrics``:
    an :class:`assetq.Metrics`, told what the sync loop tells it (passes, failed passes, runs
    with their event->run latency, idle waits woken or polled). ``worker_head_start``: as the
    sync loop's.
    """
    sync = _engine(engine, "run_scheduler")
    check_int(limit, "limit", 1, 1_000_000)
    check_int(max_attempts, "max_attempts", 1, 100)
    if max_passes is not None:
        check_int(max_passes, "max_passes", 0, 2**62)
    poll = seconds(poll_interval, "poll_interval")
    head_start = check_head_start(worker_head_start)
    initial = seconds(backoff_initial, "backoff_initial")
    cap = seconds(backoff_max, "backoff_max")
    namespace = check_namespace(namespace)
    liveness_interval = check_interval(liveness_interval)
    stop = stop_event if stop_event is not None else asyncio.Event()
    rounds = _Round(sync, dialect_of(sync), namespace)
    alive = Liveness(sync, namespace, "scheduler", liveness_interval, shown_interval=poll)
    dialect = dialect_of(sync)
    own_listen_engine: Engine | None = None
    listener: _Listener | None = None
    if listen and dialect.supports_notify:
        if listen_engine is None:
            # NullPool: the listener detaches its connection from the pool anyway.
            sync_url = engine.url.set(drivername="postgresql+psycopg")
            listen_engine = own_listen_engine = sa.create_engine(sync_url, poolclass=sa.NullPool)
        elif not isinstance(listen_engine, Engine):
            raise _wrong(
                "listen_engine must be a sync Engine (the listening connection waits in a"
                f" thread), got {type(listen_engine).__name__}"
            )
        listener = _Listener(listen_engine, dialect, namespace)
    # The listener's waits look at a threading.Event; set it when stop_event is set.
    thread_stop = threading.Event()

    async def bridge() -> None:
        await stop.wait()
        thread_stop.set()

    bridging = asyncio.ensure_future(bridge())
    stats = SchedulerStats()
    error_log = _ErrorLog()
    started = time.monotonic()
    log.info(
        "assetq scheduler (asyncio): started on namespace %s (%s)",
        namespace,
        f"woken by NOTIFY, polling every {poll:g} s"
        if listener is not None
        else f"polling every {poll:g} s",
    )
    try:
        await greenlet_spawn(alive.beat_if_due)
        while not stop.is_set() and (max_passes is None or stats.passes < max_passes):
            await greenlet_spawn(alive.beat_if_due)  # between passes, as sync
            if listener is not None and not listener.connected:
                try:
                    await asyncio.to_thread(listener.connect)  # before the pass, as sync
                except Exception as exc:
                    listener.lost(exc)
                if listener.pooled is not None:
                    pooled_warning("assetq scheduler (asyncio)", listener.pooled, poll)
                    listener = None
            stats.passes += 1
            await greenlet_spawn(rounds.start)
            pass_started = time.monotonic()
            try:
                created = await schedule(
                    engine, limit=limit, namespace=namespace, max_attempts=max_attempts
                )
            except (errors.AssetqError, SQLAlchemyError, OSError) as exc:
                stats.errors += 1
                if metrics is not None:
                    metrics.scheduler_pass_failed(time.monotonic() - pass_started, _error_code(exc))
                if listener is not None and listener.connected:
                    try:
                        await asyncio.to_thread(listener.release)  # others take over
                    except Exception as lost:
                        listener.lost(lost)
                delay = min(cap, initial * 2 ** min(error_log.failures, 30))
                delay *= random.uniform(0.5, 1.0)
                error_log.failed(exc, delay)
                await _wait(stop, delay)
                continue
            error_log.succeeded()
            if metrics is not None:
                metrics.scheduler_pass(
                    time.monotonic() - pass_started,
                    len(created),
                    sum(len(run.event_ids) for run in created),
                )
                latencies = await greenlet_spawn(run_latencies, sync, namespace, created)
                for run, latency in zip(created, latencies, strict=True):
                    metrics.run_created(run, latency)
            for run in created:
                log_created(log, "assetq scheduler (asyncio)", run)
                stats.runs += 1
                stats.events += len(run.event_ids)
                if on_run is not None:
                    on_run(run)
            if on_pass is not None:
                on_pass(created)
            if stop.is_set() or (max_passes is not None and stats.passes >= max_passes):
                continue
            if created:
                rounds.reset()
                await asyncio.sleep(0)  # let the loop's other tasks in between passes
            elif await greenlet_spawn(rounds.again):
                continue  # a ready consumer may be waiting outside this pass's window
            if listener is not None and listener.connected:
                try:
                    outcome = await asyncio.to_thread(
                        listener.settle, bool(created), poll, thread_stop
                    )
                except Exception as exc:  # the connection broke, and its locks with it
                    listener.lost(exc)
                    outcome = PASS
                    if not created:
                        await _wait(stop, poll)
                if outcome == WOKEN:
                    stats.wakeups += 1
                    try:
                        if await asyncio.to_thread(listener.head_start, head_start, thread_stop):
                            stats.head_starts += 1
                    except Exception as exc:  # the connection broke: poll until it is back
                        listener.lost(exc)
                elif outcome == ARMED:
                    stats.arms += 1
                if metrics is not None and not stop.is_set() and outcome in (WOKEN, POLL):
                    metrics.scheduler_wait("woken" if outcome == WOKEN else "polled")
            elif not created and not await _wait(stop, poll) and metrics is not None:
                metrics.scheduler_wait("polled")
    finally:
        bridging.cancel()
        thread_stop.set()
        if listener is not None:
            await asyncio.to_thread(listener.close)
        if own_listen_engine is not None:
            own_listen_engine.dispose()
        await greenlet_spawn(alive.gone)
        log.info(
            "assetq scheduler (asyncio): stopped after %d passes, %d runs, %d events,"
            " %d errors in %.0f s",
            stats.passes,
            stats.runs,
            stats.events,
            stats.errors,
            time.monotonic() - started,
        )
    return stats


#: The first idle wait of a worker slot after a claim found nothing, seconds (doubling).
_IDLE_FIRST = 0.05


class _Wakeup:
    """Idle slots wait here; the listener (PostgreSQL) wakes them all when runs are created,
    and when a producer's events were queued (then the first slot to claim runs a pass of
    its own first: :meth:`take_queued`)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.generation = 0
        self._queued = False

    def wake(self, queued: bool = False) -> None:
        self.generation += 1
        self._queued = self._queued or queued
        self._event.set()
        self._event = asyncio.Event()

    def take_queued(self) -> bool:
        """True once after each ``wake(queued=True)`` (see the sync worker's)."""
        queued, self._queued = self._queued, False
        return queued

    async def wait(self, generation: int, timeout: float, stop: asyncio.Event) -> bool:
        """Wait up to ``timeout`` for a wake-up after ``generation`` (or ``stop``)."""
        if self.generation != generation:
            return True
        woken = asyncio.ensure_future(self._event.wait())
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({woken, stopped}, timeout=timeout, return_when="FIRST_COMPLETED")
        finally:
            woken.cancel()
            stopped.cancel()
        return self.generation != generation


async def _listen(
    engine: AsyncEngine, namespace: str, wakeup: _Wakeup, quit_: asyncio.Event, retry: float
) -> None:
    """LISTEN on the namespace's channel (PostgreSQL, psycopg async) and wake idle slots on
    each ``runs`` and ``queued`` notification. Only on a connection that is its server session (its
    handshake's process id is the one that answers): through a pooler LISTEN would stay on
    a server connection other clients get (I11), so the slots poll."""
    dialect = dialect_of(engine.sync_engine)
    failed = False
    while not quit_.is_set():
        raw: Any = None
        try:
            raw = await engine.raw_connection()
            driver: Any = raw.driver_connection  # a psycopg AsyncConnection
            raw.detach()
            await driver.set_autocommit(True)
            cursor = await driver.execute(dialect.query("backend_pid", namespace))
            row = await cursor.fetchone()
            if row is None or row[0] != driver.info.backend_pid:
                log.warning(
                    "assetq worker (asyncio): the listening connection is not one server"
                    " session (a pooler?): not listening, polling every %g s",
                    retry,
                )
                return
            # Schedulers woken by producers give listening workers a head start. Before
            # LISTEN, the session's last statement while it waits.
            await driver.execute(dialect.query("workers_listen_mark", namespace))
            await driver.execute(dialect.query("listen", namespace))
            if failed:
                log.info("assetq worker (asyncio): listening for new runs again")
                failed = False
            while not quit_.is_set():
                async for note in driver.notifies(timeout=0.25):
                    if note.payload in ("runs", "queued"):
                        wakeup.wake(queued=note.payload == "queued")
        except Exception as exc:  # psycopg's own errors come from here
            if not failed:
                log_retried(
                    log,
                    exc,
                    "assetq worker (asyncio): %s the wake-up connection (%s); slots poll"
                    " meanwhile, reconnecting every %g s",
                    "lost" if connection_lost(exc) else "error on",
                    str(exc).strip().splitlines()[0] if str(exc).strip() else exc,
                    retry,
                )
                failed = True
            else:
                log.debug(
                    "assetq worker (asyncio): the wake-up connection failed again", exc_info=exc
                )
            await _wait(quit_, retry)
        finally:
            if raw is not None:
                await greenlet_spawn(close_detached, raw)


class _TimedOut(Exception):
    """An attempt's handler ran to its deadline (its message: what the attempt records)."""


def _is_coroutine_function(handler: object) -> bool:
    """``async def``, also behind functools.partial or as an object's ``__call__``."""
    call = type(handler).__call__ if callable(handler) else None
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)


async def run_worker(
    engine: AsyncEngine,
    handlers: Mapping[str, AsyncHandler],
    *,
    worker: str | None = None,
    concurrency: int = 1,
    lease: timedelta | float = timedelta(seconds=60),
    stop: asyncio.Event | None = None,
    namespace: str = DEFAULT_NAMESPACE,
    poll_interval: float = 1.0,
    listen: bool = True,
    heartbeat_interval: float | None = None,
    max_runs: int | None = None,
    on_complete: Callable[[Claim, Run | None, AttemptOutcome], None] | None = None,
    backoff_max: float = 30.0,
    liveness_interval: float | None = DEFAULT_INTERVAL,
    metrics: Metrics | None = None,
    timeout: timedelta | float | None = None,
    strict: bool = False,
) -> WorkerStats:
    """Async version of :func:`assetq.run_worker`: claim and execute runs of the consumers in
    ``handlers`` until ``stop`` is set (or ``max_runs`` attempts were completed).

    ``handlers`` maps a dag id to a coroutine function ``handler(claim, conn)`` awaited in the
    transaction that completes the run (``conn`` is an AsyncConnection): its writes commit
    with the run's success and the events it returns, or not at all; an exception it raises
    fails the attempt (rolled back, the error recorded). A handler that is not a coroutine
    function (``async def``, also behind functools.partial or as an ``async def __call__``)
    is refused at start (InvalidArgumentType, a TypeError, naming its consumer).
    ``concurrency`` slots (tasks) each hold one run at a time; one heartbeat task renews
    every held lease every ``heartbeat_interval`` seconds (default: a third of the lease).
    On PostgreSQL
    (``listen=True``) idle slots are woken by the notification of the pass that created
    runs. The same guarantees as the sync worker: every attempt is held by one worker, a
    stale holder's completion is refused (``on_complete`` gets ``"lost"``).
    ``liveness_interval``: its row in the liveness table, as the sync worker's (a task
    records it, with the consumers in ``handlers``; ``strict`` as there). ``metrics``: an
    :class:`assetq.Metrics`, told what the sync worker tells it (claims, failed claims,
    completions by outcome, retries, idle waits woken or polled). ``timeout``: as the sync
    worker's; at an attempt's deadline, or when its run is cancelled (seen by the next
    heartbeat), ``claim.cancelled`` is set and the handler's task is cancelled
    (CancelledError at its next await; its transaction rolls back), and a timeout is
    recorded as the attempt's failure.
    """
    sync = _engine(engine, "run_worker")
    table = _handlers(handlers)
    for dag_id, handler in table.items():
        # Awaiting a sync handler's result fails every attempt, after the handler already ran
        # (and wrote) outside the loop: refuse it before anything is claimed.
        if not _is_coroutine_function(handler):
            raise errors.InvalidArgumentType(
                f"the handler of {dag_id!r} must be a coroutine function (async def"
                f" handler(claim, conn)), got {getattr(handler, '__qualname__', handler)!r};"
                " a sync handler runs under assetq.run_worker"
            )
    name = default_worker_name() if worker is None else check_name(worker, "worker", WORKER_MAX)
    check_int(concurrency, "concurrency", 1, 256)
    lease_seconds = seconds(lease, "lease")
    interval = (
        lease_seconds / 3
        if heartbeat_interval is None
        else seconds(heartbeat_interval, "heartbeat_interval")
    )
    if interval >= lease_seconds:
        raise errors.InvalidArgument(
            f"heartbeat_interval ({interval:g} s) must be shorter than the lease"
            f" ({lease_seconds:g} s)"
        )
    poll = seconds(poll_interval, "poll_interval")
    backoff_cap = seconds(backoff_max, "backoff_max")
    if max_runs is not None:
        check_int(max_runs, "max_runs", 1, 2**62)
    timeout_seconds = None if timeout is None else seconds(timeout, "timeout")
    namespace = check_namespace(namespace)
    liveness_interval = check_interval(liveness_interval)
    stop_event = stop if stop is not None else asyncio.Event()
    dialect = dialect_of(sync)
    dag_ids = sorted(table)
    stats = WorkerStats()
    quit_ = asyncio.Event()  # stop or max_runs: no new claims
    budget = [max_runs]  # attempts left to start (None: no limit)
    held: dict[int, Claim] = {}
    #: The task of each held attempt: the heartbeat cancels it when the run is lost.
    attempts: dict[int, asyncio.Task[Run]] = {}
    wakeup = _Wakeup()
    passes = PassGate("assetq worker (asyncio)")

    async def execute(slot_name: str, claim: Claim) -> None:
        handler: Any = table[claim.dag_id]
        loop_slot = f"assetq worker (asyncio): {slot_name}"
        log_claimed(log, loop_slot, claim)
        held[claim.id] = claim
        outcome: AttemptOutcome = "lost"
        info: Run | None = None
        attempt_started = time.monotonic()
        fields = attempt_fields(claim)

        async def attempt() -> Run:
            async with engine.connect() as conn, conn.begin():
                produced = await handler(claim, conn)
                return await complete_run(
                    conn, claim, "success", events=produced, namespace=namespace
                )

        task = asyncio.ensure_future(attempt())
        attempts[claim.id] = task
        limit = attempt_timeout(claim)
        try:
            try:
                done, _ = await asyncio.wait({task}, timeout=limit)
                if not done:  # its deadline: let it go, and record the timeout
                    claim.cancelled.set()
                    task.cancel()
                    await asyncio.wait({task}, timeout=5)
                    error = timed_out_error(claim)
                    log.warning(
                        "assetq worker (asyncio): %s: run %s of %s (attempt %d) %s: its handler"
                        " was cancelled and the attempt recorded as failed",
                        slot_name,
                        claim.run_id,
                        claim.dag_id,
                        claim.attempt,
                        error,
                        extra=fields,
                    )
                    raise _TimedOut(error)
                info = task.result()
                outcome = "success"
                stats.add(succeeded=1)
                log_completed(log, loop_slot, claim, info)
            except asyncio.CancelledError:
                if not task.cancelled():  # this slot is being cancelled, not the attempt
                    task.cancel()
                    raise
                log.warning(
                    "assetq worker (asyncio): %s: run %s of %s (attempt %d) was cancelled or"
                    " lost while its handler ran: the handler was cancelled",
                    slot_name,
                    claim.run_id,
                    claim.dag_id,
                    claim.attempt,
                    extra=fields,
                )
                stats.add(lost=1, abandoned=1)
            except errors.LeaseLost as exc:
                log.warning(
                    "assetq worker (asyncio): %s: completion of run %s of %s (attempt %d)"
                    " refused, its writes rolled back: %s",
                    slot_name,
                    claim.run_id,
                    claim.dag_id,
                    claim.attempt,
                    exc,
                    extra=attempt_fields(claim),
                )
                stats.add(lost=1)
            except Exception as exc:  # the handler's error, the completion's, a timeout
                if not isinstance(exc, _TimedOut):
                    log.warning(
                        "assetq worker (asyncio): %s: run %s of %s (attempt %d) failed: %s: %s",
                        slot_name,
                        claim.run_id,
                        claim.dag_id,
                        claim.attempt,
                        type(exc).__name__,
                        exc,
                        extra=fields,
                    )
                error = str(exc) if isinstance(exc, _TimedOut) else _error_text(exc)
                try:
                    async with engine.connect() as conn, conn.begin():
                        info = await complete_run(
                            conn, claim, "failed", error=error, namespace=namespace
                        )
                    outcome = "failed"
                    stats.add(failed=1, timed_out=int(isinstance(exc, _TimedOut)))
                    log_completed(log, loop_slot, claim, info)
                except errors.LeaseLost:
                    stats.add(lost=1)
                except (errors.AssetqError, SQLAlchemyError, OSError) as again:
                    stats.add(errors=1)
                    log_retried(
                        log,
                        again,
                        "assetq worker (asyncio): %s: could not record the failure of run %s"
                        " of %s: %s; when its lease expires it is claimed again, or failed if"
                        " that was its last attempt",
                        slot_name,
                        claim.run_id,
                        claim.dag_id,
                        first_line(again),
                        extra=attempt_fields(claim),
                    )
        finally:
            held.pop(claim.id, None)
            attempts.pop(claim.id, None)
        if runs_next_pass(dialect, claim, info):
            # MySQL: the pass that creates the capped consumer's next run (PostgreSQL's
            # run_ended notifies a scheduler instead).
            try:
                await schedule(engine, namespace=namespace, max_attempts=2)
            except (errors.AssetqError, SQLAlchemyError, OSError) as exc:
                log.debug(
                    "assetq worker (asyncio): the pass after run %s failed: %s", claim.run_id, exc
                )
        if metrics is not None:
            if claim.made:  # this slot's own pass made the run (after the handler: off its path)
                (latency,) = await greenlet_spawn(run_latencies, sync, namespace, [claim])
                metrics.run_created(claim, latency)
            metrics.worker_completed(claim, outcome, info, time.monotonic() - attempt_started)
            if outcome == "failed" and info is not None and info.state == "queued":
                metrics.worker_retry(claim, info)
        if on_complete is not None:
            on_complete(claim, info, outcome)

    async def slot(number: int) -> None:
        slot_name = name if concurrency == 1 else f"{name}#{number}"
        idle = _IDLE_FIRST
        failing = 0
        while not (stop_event.is_set() or quit_.is_set()):
            generation = wakeup.generation
            if budget[0] is not None:
                if budget[0] <= 0:
                    quit_.set()
                    break
                budget[0] -= 1
            claim_started = time.monotonic()
            with_pass = passes.open(wakeup.take_queued())
            try:
                claims = await claim_runs(
                    engine,
                    slot_name,
                    lease=lease_seconds,
                    dag_ids=dag_ids,
                    namespace=namespace,
                    timeout=timeout_seconds,
                    schedule=with_pass,
                )
            except (errors.AssetqError, SQLAlchemyError, OSError) as exc:
                if budget[0] is not None:
                    budget[0] += 1
                stats.add(errors=1)
                if with_pass and passes.refuse(exc):
                    continue  # claims at once, without a pass
                if metrics is not None:
                    metrics.worker_claim_failed(time.monotonic() - claim_started, _error_code(exc))
                delay = min(backoff_cap, 0.5 * 2 ** min(failing, 30)) * random.uniform(0.5, 1)
                if not failing:
                    log_retried(
                        log,
                        exc,
                        "assetq worker (asyncio): %s: claim failed: %s%s; retrying with backoff"
                        " (first in %.2f s); not logged again until a claim succeeds",
                        slot_name,
                        "lost the connection to the database: " if connection_lost(exc) else "",
                        first_line(exc),
                        delay,
                    )
                else:
                    log.debug(
                        "assetq worker (asyncio): %s: claim failed again", slot_name, exc_info=exc
                    )
                failing += 1
                await _wait(stop_event, delay)
                continue
            if failing:
                log.info("assetq worker (asyncio): %s: claims work again", slot_name)
                failing = 0
            if metrics is not None:
                metrics.worker_claim(time.monotonic() - claim_started, len(claims))
            if not claims:
                if budget[0] is not None:
                    budget[0] += 1
                if await wakeup.wait(generation, idle, stop_event):
                    stats.add(wakeups=1)
                    idle = _IDLE_FIRST
                    if metrics is not None:
                        metrics.worker_wait("woken")
                else:
                    idle = min(poll, idle * 2)
                    if metrics is not None and not (stop_event.is_set() or quit_.is_set()):
                        metrics.worker_wait("polled")
                continue
            idle = _IDLE_FIRST
            stats.add(claimed=1)
            await execute(slot_name, claims[0])

    async def beat() -> None:
        """Renew the held leases every ``interval``; once stopping, until no run is held."""
        failing = False
        while True:
            if quit_.is_set() and not held:
                return
            await _wait(quit_, interval) if not quit_.is_set() else await asyncio.sleep(0.25)
            for claim in list(held.values()):
                if quit_.is_set() and claim.lease_until is not None:
                    left = claim.lease_until.timestamp() - time.time()
                    if left > claim.lease.total_seconds() * 2 / 3:
                        continue  # stopping: renew only what is due
                try:
                    renewed = await heartbeat(engine, claim, namespace=namespace)
                except errors.LeaseLost as exc:
                    log.warning(
                        "assetq worker (asyncio): lost run %s of %s (attempt %d): %s; its"
                        " handler is cancelled",
                        claim.run_id,
                        claim.dag_id,
                        claim.attempt,
                        exc,
                        extra=attempt_fields(claim),
                    )
                    held.pop(claim.id, None)
                    claim.cancelled.set()
                    task = attempts.get(claim.id)
                    if task is not None:
                        task.cancel()
                    continue
                except (errors.AssetqError, SQLAlchemyError, OSError) as exc:
                    if not failing:
                        log_retried(
                            log,
                            exc,
                            "assetq worker (asyncio): heartbeat of run %s of %s failed: %s;"
                            " trying again in %g s",
                            claim.run_id,
                            claim.dag_id,
                            first_line(exc),
                            interval,
                            extra=attempt_fields(claim),
                        )
                        failing = True
                    continue
                failing = False
                if claim.id in held:
                    held[claim.id] = renewed

    log.info(
        "assetq worker (asyncio): %s started on namespace %s (%s, %d slots, lease %g s,"
        " consumers %s)",
        name,
        namespace,
        dialect.name,
        concurrency,
        lease_seconds,
        ", ".join(dag_ids),
    )
    alive = Liveness(
        sync, namespace, "worker", liveness_interval, name=name, handles=dag_ids, strict=strict
    )
    if strict:  # an unknown consumer refuses the worker before any slot claims
        await greenlet_spawn(alive.beat)

    async def live() -> None:
        """The worker's liveness row, every ``liveness_interval`` until it stops."""
        if liveness_interval is None:
            return
        while not quit_.is_set():
            await greenlet_spawn(alive.beat)
            await _wait(quit_, liveness_interval)

    started = time.monotonic()
    helpers = [asyncio.ensure_future(beat()), asyncio.ensure_future(live())]
    if listen and dialect.supports_notify:
        helpers.append(asyncio.ensure_future(_listen(engine, namespace, wakeup, quit_, poll)))
    try:
        await asyncio.gather(*(slot(n) for n in range(1, concurrency + 1)))
    finally:
        quit_.set()
        for task in helpers[2:]:
            task.cancel()
        await asyncio.gather(*helpers, return_exceptions=True)
        await greenlet_spawn(alive.gone)
        log.info(
            "assetq worker (asyncio): %s stopped after %d claims: %d succeeded, %d failed,"
            " %d lost, %d errors in %.0f s",
            name,
            stats.claimed,
            stats.succeeded,
            stats.failed,
            stats.lost,
            stats.errors,
            time.monotonic() - started,
        )
    return stats
