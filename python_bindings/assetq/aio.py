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
loop: they never block it (waits are ``asyncio`` waits, handlers are coroutines). They are
the sync loops themselves (:class:`assetq.scheduler.SchedulerLoop`,
:class:`assetq.worker.WorkerLoop`: every decision, log line and count), whose steps this
module awaits (:mod:`assetq.loops`). On PostgreSQL both listen as the sync loops do
(:mod:`assetq.listening`: the scheduler's wake-up lock protocol, the worker's wake-up of
idle slots), on a sync psycopg connection of their own from a sync engine on the
AsyncEngine's URL (psycopg serves both), whose blocking waits run in a thread
(``asyncio.to_thread``); behind a transaction pooler they poll, as the sync loops do.

Drivers: psycopg 3 (``postgresql+psycopg://``, the same URL as the sync engine) and aiomysql
(``mysql+aiomysql://``); :func:`async_url` turns a sync URL into its async twin. Install
with ``pip install 'assetq[async]'``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any, Concatenate, ParamSpec, TypeAlias, TypeVar

import sqlalchemy as sa
from sqlalchemy import URL, Connection, Engine, make_url
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
from .listening import wake_slots, worker_listener
from .liveness import DEFAULT_INTERVAL
from .loops import (
    QUIT,
    STOP,
    STOP_CHECK,
    Blocking,
    Call,
    Idle,
    Retried,
    Step,
    drive_async,
    take_call,
    wait_event,
)
from .metrics import AttemptOutcome, Metrics
from .namespace import DEFAULT_NAMESPACE
from .scheduler import WORKER_HEAD_START, SchedulerLoop, SchedulerStats
from .validation import check_int
from .worker import LOST, AttemptKey, Execute, WorkerLoop, WorkerStats, attempt_key, check_handlers

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


def _engine_or_kept(handle: object, function: str) -> Engine | Connection:
    """:func:`_engine`, or the sync facade of an AsyncConnection in autocommit mode that the
    caller keeps (a worker's own connection: each call a transaction of its own on it, no
    pool checkout; the sync call checks the mode)."""
    if isinstance(handle, AsyncConnection):
        if handle.sync_connection is None:
            raise _wrong(f"assetq.aio.{function}: the AsyncConnection is not connected")
        return handle.sync_connection
    return _engine(handle, function)


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

purge = _own_transactions(ops.purge)
purge_preview = _own_transactions(ops.purge_preview)
doctor = _own_transactions(ops.doctor)
grant_roles = _own_transactions(ops.grant_roles)
revoke_roles = _own_transactions(ops.revoke_roles)
install = _own_transactions(migrate.install)
uninstall = _own_transactions(migrate.uninstall)
uninstall_preview = _own_transactions(ops.uninstall_preview)
repair = _own_transactions(migrate.repair)


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
            retry = api.worth_retrying(exc)
            # As the sync calls: a server that is gone gets at most CONNECTION_ATTEMPTS
            # attempts, whatever the conflict budget; the caller's loop backs off from it.
            if isinstance(exc, errors.ConnectionLost):
                lost += 1
                retry = retry and lost < api.CONNECTION_ATTEMPTS
            if not retry or attempt == max_attempts:
                raise
            delay = api.retry_delay(engine, what, attempt, exc)
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


async def heartbeat(
    engine: AsyncEngine | AsyncConnection,
    claim: Claim,
    *,
    lease: timedelta | float | None = None,
    namespace: str = DEFAULT_NAMESPACE,
) -> Claim:
    """Async version of :func:`assetq.heartbeat`: renew ``claim``'s lease, a short
    transaction of its own; on an AsyncEngine, or an AsyncConnection in autocommit mode that
    the worker keeps (``await conn.execution_options(isolation_level="AUTOCOMMIT")``)."""
    sync = _engine_or_kept(engine, "heartbeat")
    return await greenlet_spawn(
        lambda: api.heartbeat(sync, claim, lease=lease, namespace=namespace)
    )


async def claim_runs(
    engine: AsyncEngine | AsyncConnection,
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
    awaited). ``schedule=True``: a pass over ``dag_ids`` first, in the same statement.
    ``engine`` may also be an AsyncConnection in autocommit mode that the worker keeps
    (``await conn.execution_options(isolation_level="AUTOCOMMIT")``): each call a
    transaction of its own on it, no pool checkout; a lost connection is not retried there
    (ConnectionLost: connect again)."""
    sync = _engine_or_kept(engine, "claim_runs")
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
        sync if isinstance(sync, Engine) else sync.engine,
    )


# -- the loops ---------------------------------------------------------------------------------


async def _take(step: Step, sync: Engine, events: Mapping[str, asyncio.Event]) -> Any:
    """The async shell's step (assetq.loops): a database call in the greenlet bridge (one
    attempt at a time for a call that retries, the backoff awaited), a blocking wait in a
    thread, a sleep that ``events`` (by Sleep.until) end early."""
    if isinstance(step, Blocking):
        return await asyncio.to_thread(take_call, step)
    if isinstance(step, Retried):
        once = {**step.kwargs, "max_attempts": 1}
        return await _retrying(
            step.what,
            step.kwargs["max_attempts"],
            lambda: step.function(*step.args, **once),
            sync,
        )
    if isinstance(step, Call):
        return await greenlet_spawn(take_call, step)
    event = events.get(step.until)
    if event is None or not step.seconds:
        await asyncio.sleep(step.seconds)
        return event is not None and event.is_set()
    return await wait_event(event, step.seconds)


#: How long a worker waits for a handler's task it let go (cancelled) to end, seconds.
_GRACE = 5.0


def _listen_engine(engine: AsyncEngine) -> Engine:
    """A sync engine on ``engine``'s URL (psycopg serves both) for the listening connection,
    which waits in a thread. NullPool: the listener detaches its connection anyway."""
    return sa.create_engine(engine.url.set(drivername="postgresql+psycopg"), poolclass=sa.NullPool)


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
    options = dict(locals())  # checked by SchedulerLoop
    sync = _engine(engine, "run_scheduler")
    stop = stop_event if stop_event is not None else asyncio.Event()
    own_listen_engine: Engine | None = None
    if listen and dialect_of(sync).supports_notify:
        if listen_engine is None:
            options["listen_engine"] = own_listen_engine = _listen_engine(engine)
        elif not isinstance(listen_engine, Engine):
            raise _wrong(
                "listen_engine must be a sync Engine (the listening connection waits in a"
                f" thread), got {type(listen_engine).__name__}"
            )
    # The listener's waits look at a threading.Event; set it when stop is set.
    thread_stop = threading.Event()
    try:
        who = "assetq scheduler (asyncio)"
        loop = SchedulerLoop(sync, options, who, log, stop.is_set, thread_stop)

        async def bridge() -> None:
            await stop.wait()
            thread_stop.set()

        bridging = asyncio.ensure_future(bridge())
        try:
            return await drive_async(loop.steps(), lambda step: _take(step, sync, {STOP: stop}))
        finally:
            bridging.cancel()
            thread_stop.set()
    finally:
        if own_listen_engine is not None:
            own_listen_engine.dispose()


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
    options = dict(locals())  # checked by WorkerLoop
    sync = _engine(engine, "run_worker")
    table = check_handlers(handlers)
    for dag_id, handler in table.items():
        # Awaiting a sync handler's result fails every attempt, after the handler already ran
        # (and wrote) outside the loop: refuse it before anything is claimed.
        if not _is_coroutine_function(handler):
            raise errors.InvalidArgumentType(
                f"the handler of {dag_id!r} must be a coroutine function (async def"
                f" handler(claim, conn)), got {getattr(handler, '__qualname__', handler)!r};"
                " a sync handler runs under assetq.run_worker"
            )
    stop_event = stop if stop is not None else asyncio.Event()
    quit_ = asyncio.Event()  # the slots are done: the heartbeat ends
    thread_quit = threading.Event()  # the listener's thread looks at this one
    #: The task of each held attempt; why the heartbeat let it go, and the event it set.
    tasks: dict[AttemptKey, asyncio.Task[Run]] = {}
    why: dict[AttemptKey, str] = {}
    gone: dict[AttemptKey, asyncio.Event] = {}

    def let_go(claim: Claim, reason: str) -> None:
        key = attempt_key(claim)
        task = tasks.get(key)
        if task is not None and not task.done():
            why[key] = reason
            task.cancel()  # CancelledError at the handler's next await: it rolls back
            gone[key].set()

    who = "assetq worker (asyncio)"
    loop = WorkerLoop(sync, table, options, who, log, stop_event.is_set, quit_.is_set, let_go)

    async def execute(step: Execute) -> bool:
        claim = step.claim
        handler: Any = loop.table[claim.dag_id]

        async def attempt() -> Run:
            async with engine.connect() as conn, conn.begin():
                produced = await handler(claim, conn)
                return await complete_run(
                    conn, claim, "success", events=produced, namespace=loop.namespace
                )

        started = time.monotonic()
        task = asyncio.ensure_future(attempt())
        key = attempt_key(claim)
        tasks[key] = task
        gone[key] = asyncio.Event()
        waiter = asyncio.ensure_future(gone[key].wait())
        loop.leases.hold(claim)
        try:
            try:
                await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
                if not task.done():  # let go: a grace to roll back, then the slot goes on
                    await asyncio.wait({task}, timeout=_GRACE)
            except asyncio.CancelledError:  # this slot is being cancelled, not the attempt
                task.cancel()
                raise
            result: Any
            if key in why:
                result = why[key]
            elif task.cancelled():
                result = LOST
            else:
                result = task.exception() or task.result()
        finally:
            waiter.cancel()
            loop.leases.drop(claim)
            for held in (tasks, why, gone):
                held.pop(key, None)
        await drive_async(loop.ended(step.slot_name, claim, started, result), take)
        return True

    async def take(step: Step) -> Any:
        if isinstance(step, Idle):
            return await loop.wakeup.wait_async(step.generation, step.seconds, stop_event)
        if isinstance(step, Execute):
            return await execute(step)
        return await _take(step, sync, {STOP: stop_event, QUIT: quit_})

    async def live() -> None:
        """The worker's liveness row, every ``liveness_interval`` until it stops."""
        while loop.alive.enabled and not quit_.is_set():
            await greenlet_spawn(loop.alive.beat_if_due)
            await wait_event(quit_, loop.alive.seconds_until_due() or STOP_CHECK)

    if strict:  # an unknown consumer refuses the worker before any slot claims
        await greenlet_spawn(loop.alive.beat)
    listening = listen and loop.dialect.supports_notify
    loop.started(listening)
    started = time.monotonic()
    helpers = [asyncio.ensure_future(drive_async(loop.leases.steps(), take))]
    helpers.append(asyncio.ensure_future(live()))
    listen_engine = _listen_engine(engine) if listening else None
    if listen_engine is not None:
        listener = worker_listener(
            listen_engine, loop.dialect, loop.namespace, "assetq worker (asyncio)", loop.poll, log
        )
        helpers.append(
            asyncio.ensure_future(
                asyncio.to_thread(wake_slots, listener, loop.wakeup, thread_quit, loop.poll)
            )
        )
    try:
        await asyncio.gather(*(drive_async(loop.slot(n), take) for n in range(1, concurrency + 1)))
    finally:
        quit_.set()
        thread_quit.set()
        await asyncio.gather(*helpers, return_exceptions=True)
        if listen_engine is not None:
            listen_engine.dispose()
        await greenlet_spawn(loop.alive.gone)
        loop.stopped(time.monotonic() - started)
    return loop.stats
