"""The worker loop: :func:`run_worker`, behind ``assetq worker``.

Each of ``concurrency`` slots (threads) claims one run at a time (:func:`assetq.claim_runs`)
of the consumers it has handlers for, and calls the consumer's handler inside the
transaction that completes the run (:func:`assetq.complete_run`): a handler that writes to
this database has exactly-once effects, because its writes commit with the run's success
and its output events, or not at all, and a zombie worker's completion is refused (the
claim's attempt fences it). While handlers run, one heartbeat thread renews every held
lease. A handler that raises is a failed attempt: its transaction is rolled back and the
error is recorded in a transaction of its own; the consumer's ``max_attempts`` and retry
delay decide whether the run is tried again.

Idle slots wait with a backoff that grows from 50 ms to ``poll_interval``. On PostgreSQL a
listening connection ends the wait as soon as a scheduler pass creates runs (a notification
with payload ``runs`` on the namespace's channel, sent by the pass's own transaction: producers
pay nothing for it), and as soon as a producer's events are queued while a scheduler waits
(payload ``queued``, the scheduler's own wake-up): then the first slot free claims with a pass
of the worker's own consumers first, in the same statement (``claim_runs(schedule=True)``),
one hop from the producer's commit to the handler instead of two. MySQL has no
notifications: slots poll.

Stopping is graceful: ``stop`` is looked at between runs, so a run in progress finishes and
commits (or fails) whole; a worker that is killed instead leaves its runs held until their
leases expire: then a run with attempts left is claimed again, as a new attempt with the same
events, and one on its last attempt (every run, with the default ``max_attempts=1``) is
failed by the next claim or scheduler pass.

An attempt that reaches its deadline (the consumer's ``timeout`` or the worker's) or whose run
is cancelled (:func:`assetq.cancel_run`, seen by the next heartbeat) is let go: the claim's
``cancelled`` event is set for the handler to see, a timed-out attempt is recorded as failed
("timed out after 30s"), and the slot goes on with a new thread at once; the handler's thread
is left to return whenever it does, and its completion is refused (the attempt is fenced).

One core, two shells: :class:`WorkerLoop` makes every decision (what to claim, when to back
off, heartbeat, let an attempt go, what to log and count) as steps (:mod:`assetq.loops`);
:func:`run_worker` takes them in threads, :func:`assetq.aio.run_worker` awaits them.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from psycopg.pq import TransactionStatus
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from . import api, errors
from .dialects import Dialect, dialect_of
from .handles import engine_of
from .listening import wake_slots, worker_listener
from .liveness import DEFAULT_INTERVAL, Liveness, check_interval
from .logs import attempt_fields, connection_lost, first_line, log_retried
from .loops import (
    NOTHING,
    QUIT,
    STOP,
    STOP_CHECK,
    Call,
    Idle,
    Retried,
    Sleep,
    Step,
    Steps,
    Wakeup,
    backoff,
    drive,
    error_code,
    error_text,
    take_call,
)
from .metrics import AttemptOutcome, Metrics
from .namespace import DEFAULT_NAMESPACE
from .scheduler import run_latencies
from .validation import WORKER_MAX, check_dag_id, check_int, check_name, check_namespace, seconds

log = logging.getLogger("assetq.worker")

#: What a handler is called with and may return: ``handler(claim, conn)`` runs inside the
#: transaction that completes the run and returns the run's output events (or None).
Handler = Callable[[api.Claim, Connection], "Iterable[api.NewEvent | Mapping[str, Any]] | None"]


@dataclass
class WorkerStats:
    """What a :func:`run_worker` call did (all slots together)."""

    #: Runs claimed (attempts started).
    claimed: int = 0
    #: Attempts completed as success, and attempts that failed (the handler raised).
    succeeded: int = 0
    failed: int = 0
    #: Completions refused because another worker held the run by then (LeaseLost).
    lost: int = 0
    #: Database errors of claims and completions (retried after a backoff).
    errors: int = 0
    #: Idle waits ended by a notification that runs were created (PostgreSQL).
    wakeups: int = 0
    #: Attempts let go at their deadline (recorded as failed, and counted in ``failed`` too).
    timed_out: int = 0
    #: Attempts let go because their run was cancelled or lost while the handler ran.
    abandoned: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)

    @property
    def completed(self) -> int:
        return self.succeeded + self.failed + self.lost


def default_worker_name() -> str:
    """``host:pid:random``: unique per process, readable in ``assetq status``."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"[:WORKER_MAX]


class PassGate:
    """Whether a slot's claim runs a pass of its own first (both shells): after a producer's
    notification, unless a claim with a pass failed for good before (the worker's role lacks
    schedule_and_claim, or the schema's routines are older than this package): then the
    worker claims without one, leaving its consumers' runs to the schedulers, and says so
    once."""

    def __init__(self, who: str) -> None:
        self._who = who
        self._refused = threading.Event()

    def open(self, queued: bool) -> bool:
        return queued and not self._refused.is_set()

    def refuse(self, exc: BaseException) -> bool:
        """A claim with a pass failed with ``exc``: True when it is not transient, and no
        claim runs a pass from now on."""
        if isinstance(exc, errors.TransientError) or connection_lost(exc):
            return False
        if not self._refused.is_set():
            self._refused.set()
            log_retried(
                log,
                exc,
                "%s: a claim with a pass of its own failed: %s; it now claims without one,"
                " leaving its consumers' runs to the schedulers (grant this account worker"
                " access again, or upgrade the schema: assetq upgrade)",
                self._who,
                first_line(exc),
            )
        return True


#: The states a run ends in: a capped consumer's next run may be created then.
FINAL_STATES = frozenset({"success", "failed", "cancelled"})


def runs_next_pass(dialect: Dialect, claim: api.Claim, info: api.Run | None) -> bool:
    """Does the worker run a scheduler pass now, after this attempt (both shells ask)? When
    it ended ``claim``'s run, of a consumer that caps its active runs, on an engine with no
    notifications (MySQL): the pass creates that consumer's next run at once. PostgreSQL's
    run_ended notifies a waiting scheduler instead."""
    return (
        not dialect.supports_notify
        and claim.capped
        and info is not None
        and info.state in FINAL_STATES
    )


def attempt_timeout(claim: api.Claim) -> float | None:
    """Seconds ``claim``'s attempt may run (its deadline less its start), None for no limit."""
    if claim.deadline is None or claim.started_at is None:
        return None
    return max(0.0, (claim.deadline - claim.started_at).total_seconds())


def timed_out_error(claim: api.Claim) -> str:
    """What a timed-out attempt records, as claim_runs_v2 words it for a dead holder."""
    return f"timed out after {attempt_timeout(claim) or 0:g}s"


def check_handlers(handlers: object) -> dict[str, Handler]:
    """``handlers`` checked: a non-empty mapping of declared-looking dag ids to callables."""
    if not isinstance(handlers, Mapping) or not handlers:
        raise errors.InvalidArgumentType(
            "handlers must be a non-empty mapping of dag id -> callable(claim, conn)"
        )
    checked: dict[str, Handler] = {}
    for dag_id, handler in handlers.items():
        check_dag_id(dag_id)
        if not callable(handler):
            raise errors.InvalidArgumentType(
                f"the handler of {dag_id!r} must be callable, got {type(handler).__name__}"
            )
        checked[dag_id] = handler
    return checked


def log_claimed(logger: logging.Logger, slot_name: str, claim: api.Claim) -> None:
    """The INFO line of an attempt a slot starts (sync and asyncio workers), with the
    attempt's fields (``dag_id``, ``run_id``, ``attempt``, ``worker``)."""
    logger.info(
        "%s claimed run %s of %s (attempt %d, lease until %s)",
        slot_name,
        claim.run_id,
        claim.dag_id,
        claim.attempt,
        claim.lease_until,
        extra=attempt_fields(claim),
    )


def log_completed(logger: logging.Logger, slot_name: str, claim: api.Claim, run: api.Run) -> None:
    """The INFO line of an attempt whose completion was recorded: its outcome and the run's
    state now (``queued`` again for a retry), with the attempt's fields."""
    logger.info(
        "%s: run %s of %s attempt %d completed: now %s",
        slot_name,
        claim.run_id,
        claim.dag_id,
        claim.attempt,
        run.state,
        extra=attempt_fields(claim),
    )


#: The first idle wait after a claim found nothing, seconds; it doubles up to poll_interval.
IDLE_FIRST = 0.05


class KeptConnection:
    """A connection a slot (or the heartbeat) keeps for its calls that commit by themselves
    (claims, heartbeats, completions of handlers that wrote nothing): in autocommit mode, so
    that each call is a transaction of its own with no pool checkout (on PostgreSQL one
    round trip). Connected on first use; a call that finds it lost drops it and is made
    again on the Engine, which retries lost connections as it always did (a completion is
    not made again: it may have committed; ConnectionLost says so); the next call connects
    anew. Used by one thread (or task) at a time; its calls are made in the shells' Call
    steps (the async shell's in SQLAlchemy's greenlet bridge)."""

    def __init__(self, engine: Engine, usable: bool = True) -> None:
        self.engine = engine
        self._conn: Connection | None = None
        #: An asyncio MySQL driver cannot open the transaction a MySQL call needs on an
        #: autocommit connection (dialects.atomic): its calls stay on the Engine; so do
        #: those of a worker whose pool has no room for kept connections (keeps_connections).
        dialect = engine.dialect
        self._usable = usable and (dialect.name == "postgresql" or not dialect.is_async)

    def connection(self) -> Connection | None:
        """The kept connection, connected now if need be; None when connecting failed (the
        caller uses the Engine, whose path retries and translates the error), and where
        the driver cannot keep one."""
        if not self._usable:
            return None
        conn = self._conn
        if conn is not None and (conn.closed or conn.invalidated):
            self.drop()
            conn = None
        if conn is None:
            try:
                conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            except SQLAlchemyError:
                return None
            self._conn = conn
        return conn

    def call(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``function(conn, *args, **kwargs)`` on the kept connection; on the Engine when
        the connection is lost (claims, heartbeats: the Engine's path retries)."""
        conn = self.connection()
        if conn is None:
            return function(self.engine, *args, **kwargs)
        try:
            return function(conn, *args, **kwargs)
        except errors.ConnectionLost:
            self.drop()
            return function(self.engine, *args, **kwargs)

    def complete(self, claim: api.Claim, produced: Any, namespace: str) -> api.Run:
        """``claim``'s success with ``produced`` events, a transaction of its own on the
        kept connection (not made again when the connection is lost: it may have committed)."""
        conn = self.connection()
        target: Engine | Connection = self.engine if conn is None else conn
        try:
            return api.complete_run(target, claim, "success", events=produced, namespace=namespace)
        except errors.ConnectionLost:
            self.drop()
            raise

    def drop(self) -> None:
        """Forget the connection (closed; a lost one is discarded by the pool)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except SQLAlchemyError:  # already gone: nothing to give back
                log.debug("assetq worker: closing a lost kept connection failed", exc_info=True)

    close = drop


def shares_kept(engine: Engine) -> bool:
    """Does the sync worker run handlers on the slots' kept connections? With psycopg 3:
    switching its autocommit is client-side, and it says whether anything was sent."""
    return engine.dialect.driver == "psycopg" and not engine.dialect.is_async


def keeps_connections(engine: Engine, concurrency: int) -> bool:
    """Whether ``engine``'s pool has room for the connections a worker keeps: one per slot
    and the heartbeat's, and a handler's own transaction besides where it does not run on
    its slot's (:func:`shares_kept`), and one to spare. Without room the worker's calls go
    through the Engine as before, rather than wait for connections."""
    pool: Any = engine.pool
    overflow = getattr(pool, "_max_overflow", None)
    size = getattr(pool, "size", None)
    if overflow is None or size is None or overflow < 0:
        return True  # no limit: NullPool, StaticPool, an unbounded QueuePool
    needed = (concurrency if shares_kept(engine) else 2 * concurrency) + 2
    return bool(size() + overflow >= needed)


def fail_alone(engine: Engine, claim: api.Claim, *, error: str, namespace: str) -> api.Run:
    """Record ``claim``'s attempt as failed with ``error``, in a transaction of its own."""
    with engine.connect() as conn, conn.begin():
        return api.complete_run(conn, claim, "failed", error=error, namespace=namespace)


@dataclass(frozen=True)
class Execute:
    """A slot's step: run ``claim``'s handler and complete the attempt (the shell's own
    way: a thread, a task), then take :meth:`WorkerLoop.ended`; the result: whether the slot
    goes on (False: its attempt was let go, and the slot carries on elsewhere)."""

    slot_name: str
    number: int
    claim: api.Claim
    #: The slot's kept connection (its claims'): the shell may run the handler on it.
    kept: KeptConnection | None = None


#: How an attempt ended, besides its run (success) or an exception (the handler's, or the
#: completion's): at its deadline, or let go when its run was lost or cancelled meanwhile.
TIMED_OUT, LOST = "timed out", "lost"


class _Budget:
    """Attempts left to start (``max_runs``; None: no limit), taken by every slot."""

    def __init__(self, left: int | None) -> None:
        self._left = left
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            if self._left is None:
                return True
            if self._left <= 0:
                return False
            self._left -= 1
            return True

    def give_back(self) -> None:
        with self._lock:
            if self._left is not None:
                self._left += 1


#: What tells one attempt from every other, also of the same run: its run, its attempt and
#: its claim time. A worker can hold two attempts of one run at once: a stopped worker's
#: attempt let go (its handler thread still running) and its later claim of the same run, as
#: the chaos soak found (keyed by run alone, the old attempt's clean-up removed the new one's
#: entry and the worker exited with a KeyError).
AttemptKey = tuple[int, int, datetime | None]


def attempt_key(claim: api.Claim) -> AttemptKey:
    """The key of ``claim``'s attempt among the ones a worker holds."""
    return (claim.id, claim.attempt, claim.started_at)


class Leases:
    """The claims a worker's slots hold, and the heartbeat's decisions about them: renew
    every lease every ``interval`` seconds (:meth:`steps`), and let go of an attempt at its
    deadline or when its lease is lost (cancelled): ``let_go(claim, why)`` is called once
    for it, with TIMED_OUT or LOST, after ``claim.cancelled`` was set. Safe across threads."""

    def __init__(
        self,
        loop: WorkerLoop,
        let_go: Callable[[api.Claim, str], None],
        quitting: Callable[[], bool],
    ) -> None:
        self._loop = loop
        self._let_go = let_go
        self._quitting = quitting
        self._held: dict[AttemptKey, api.Claim] = {}
        #: Local (monotonic) deadline of each held claim that has one.
        self._deadlines: dict[AttemptKey, float] = {}
        self._lock = threading.Lock()
        self._failing = False
        #: The heartbeat's own kept connection (connected at the first beat).
        self._kept: KeptConnection | None = None

    def hold(self, claim: api.Claim) -> None:
        timeout = attempt_timeout(claim)
        with self._lock:
            self._held[attempt_key(claim)] = claim
            if timeout is not None:
                self._deadlines[attempt_key(claim)] = time.monotonic() + timeout

    def drop(self, claim: api.Claim) -> None:
        with self._lock:
            self._held.pop(attempt_key(claim), None)
            self._deadlines.pop(attempt_key(claim), None)

    def holding(self) -> bool:
        with self._lock:
            return bool(self._held)

    def steps(self) -> Steps[None]:
        """The heartbeat: until the worker quits, and then until no run is held (slots
        finish their runs: their leases stay alive until they are done)."""
        interval = self._loop.interval
        next_beat = time.monotonic() + interval
        try:
            yield from self._steps(interval, next_beat)
        finally:
            if self._kept is not None:
                kept, self._kept = self._kept, None
                yield Call(kept.close)

    def _steps(self, interval: float, next_beat: float) -> Steps[None]:
        while not self._quitting():
            yield Sleep(max(0.0, min(next_beat - time.monotonic(), self._until_due())), QUIT)
            self.expire()
            if time.monotonic() >= next_beat and not self._quitting():
                yield from self.beat()
                next_beat = time.monotonic() + interval
        while self.holding():
            yield Sleep(min(interval, STOP_CHECK), NOTHING)
            self.expire()
            yield from self.beat(only_due=True)

    def _until_due(self) -> float:
        """Seconds to the nearest deadline of a held claim (at most STOP_CHECK)."""
        with self._lock:
            nearest = min(self._deadlines.values(), default=None)
        if nearest is None:
            return STOP_CHECK
        return min(STOP_CHECK, max(0.0, nearest - time.monotonic()))

    def expire(self) -> None:
        """Let go of every held claim whose deadline has come."""
        now = time.monotonic()
        with self._lock:
            due = [self._held[i] for i, end in self._deadlines.items() if end <= now]
        for claim in due:
            self._release(claim, TIMED_OUT)

    def _release(self, claim: api.Claim, why: str) -> None:
        """Stop holding ``claim``, tell its handler (claim.cancelled), and let its attempt go."""
        self.drop(claim)
        claim.cancelled.set()
        self._let_go(claim, why)

    def beat(self, *, only_due: bool = False) -> Steps[None]:
        """Renew the held leases (``only_due``: those with less than two thirds left)."""
        loop = self._loop
        with self._lock:
            held = list(self._held.values())
        now = time.time()
        for claim in held:
            if only_due and claim.lease_until is not None:
                left = claim.lease_until.timestamp() - now
                if left > claim.lease.total_seconds() * 2 / 3:
                    continue
            try:
                if self._kept is None:
                    self._kept = KeptConnection(loop.engine, loop.keep)
                renewed = yield Call(
                    self._kept.call, (api.heartbeat, claim), {"namespace": loop.namespace}
                )
            except errors.LeaseLost as exc:
                loop.log.warning(
                    "%s: lost run %s of %s (attempt %d): %s; its completion will be refused,"
                    " its handler is told (claim.cancelled) and let go",
                    loop.who,
                    claim.run_id,
                    claim.dag_id,
                    claim.attempt,
                    exc,
                    extra=attempt_fields(claim),
                )
                self._release(claim, LOST)
                continue
            except (errors.AssetqError, SQLAlchemyError, OSError) as exc:
                if not self._failing:
                    log_retried(
                        loop.log,
                        exc,
                        "%s: heartbeat of run %s of %s failed: %s; trying again in %g s",
                        loop.who,
                        claim.run_id,
                        claim.dag_id,
                        first_line(exc),
                        loop.interval,
                        extra=attempt_fields(claim),
                    )
                    self._failing = True
                continue
            self._failing = False
            with self._lock:
                if attempt_key(claim) in self._held:
                    self._held[attempt_key(claim)] = renewed


class WorkerLoop:
    """The worker loop's decisions, for both shells (:mod:`assetq.loops`): the arguments of
    :func:`run_worker` checked once, a slot's loop (:meth:`slot`), how an attempt's end is
    logged, counted, recorded and reported (:meth:`ended`), and the heartbeat (:class:`Leases`,
    :attr:`leases`)."""

    def __init__(
        self,
        engine: Engine,
        table: dict[str, Any],
        options: Mapping[str, Any],
        who: str,
        logger: logging.Logger,
        stopped: Callable[[], bool],
        quitting: Callable[[], bool],
        let_go: Callable[[api.Claim, str], None],
    ) -> None:
        """``options``: the keyword arguments of either shell's run_worker, by name; ``who``
        and ``logger``: the shell's name and logger; ``stopped``: whether the caller's stop
        is set; ``quitting``: whether the shell quits (the heartbeat's end); ``let_go``: the
        shell's way to let go of an attempt (:class:`Leases`)."""
        worker: str | None = options["worker"]
        concurrency: int = options["concurrency"]
        heartbeat_interval: float | None = options["heartbeat_interval"]
        max_runs: int | None = options["max_runs"]
        timeout: timedelta | float | None = options["timeout"]
        self.name = (
            default_worker_name() if worker is None else check_name(worker, "worker", WORKER_MAX)
        )
        check_int(concurrency, "concurrency", 1, 256)
        self.lease = seconds(options["lease"], "lease")
        self.interval = (
            self.lease / 3
            if heartbeat_interval is None
            else seconds(heartbeat_interval, "heartbeat_interval")
        )
        if self.interval >= self.lease:
            raise errors.InvalidArgument(
                f"heartbeat_interval ({self.interval:g} s) must be shorter than the lease"
                f" ({self.lease:g} s)"
            )
        self.poll = seconds(options["poll_interval"], "poll_interval")
        self.backoff_cap = seconds(options["backoff_max"], "backoff_max")
        if max_runs is not None:
            check_int(max_runs, "max_runs", 1, 2**62)
        self.timeout = None if timeout is None else seconds(timeout, "timeout")
        self.namespace = check_namespace(options["namespace"])
        self.engine = engine
        self.dialect = dialect_of(engine)
        self.table = table
        self.dag_ids = sorted(table)
        self.concurrency = concurrency
        #: The slots and the heartbeat keep connections (KeptConnection): the pool has room.
        self.keep = keeps_connections(engine, concurrency)
        self.who = who
        self.log = logger
        self._stopped = stopped
        #: ``max_runs`` attempts were started: slots claim no more.
        self.finished = False
        self.on_complete: Callable[[api.Claim, api.Run | None, AttemptOutcome], None] | None = (
            options["on_complete"]
        )
        self.metrics: Metrics | None = options["metrics"]
        self.stats = WorkerStats()
        self.wakeup = Wakeup()
        self.passes = PassGate(who)
        self.leases = Leases(self, let_go, quitting)
        self.alive = Liveness(
            engine,
            self.namespace,
            "worker",
            check_interval(options["liveness_interval"]),
            name=self.name,
            handles=self.dag_ids,
            strict=options["strict"],
        )
        self._budget = _Budget(max_runs)
        self._pass_failed = False  # a worker's pass failed once: logged at WARNING once

    def stopping(self) -> bool:
        """Slots claim no more: the caller's stop is set, or ``max_runs`` were started."""
        return self.finished or self._stopped()

    def slot_name(self, number: int) -> str:
        return self.name if self.concurrency == 1 else f"{self.name}#{number}"

    def started(self, listening: bool) -> None:
        self.log.info(
            "%s: %s started on namespace %s (%s, %d slots, lease %g s, consumers %s, %s)",
            self.who,
            self.name,
            self.namespace,
            self.dialect.name,
            self.concurrency,
            self.lease,
            ", ".join(self.dag_ids),
            "woken by NOTIFY" if listening else f"polling up to every {self.poll:g} s",
        )

    def stopped(self, took: float) -> None:
        stats = self.stats
        self.log.info(
            "%s: %s stopped after %d claims: %d succeeded, %d failed, %d lost, %d errors in %.0f s",
            self.who,
            self.name,
            stats.claimed,
            stats.succeeded,
            stats.failed,
            stats.lost,
            stats.errors,
            took,
        )

    def slot(self, number: int) -> Steps[None]:
        """Slot ``number``: claim one run at a time, back off from errors, wait when idle,
        and :class:`Execute` each claim, until stopping."""
        kept = KeptConnection(self.engine, self.keep)
        try:
            yield from self._slot(number, kept)
        finally:
            yield Call(kept.close)

    def _slot(self, number: int, kept: KeptConnection) -> Steps[None]:
        slot_name = self.slot_name(number)
        stats, metrics, wakeup = self.stats, self.metrics, self.wakeup
        idle = IDLE_FIRST
        failing = 0
        while not self.stopping():
            generation = wakeup.generation
            if not self._budget.take():
                self.finished = True
                return
            claim_started = time.monotonic()
            with_pass = self.passes.open(wakeup.take_queued())
            try:
                claims: list[api.Claim] = yield Retried(
                    kept.call,
                    (api.claim_runs, slot_name),
                    {
                        "lease": self.lease,
                        "dag_ids": self.dag_ids,
                        "namespace": self.namespace,
                        "timeout": self.timeout,
                        "schedule": with_pass,
                        "max_attempts": 8,
                    },
                    what="claim",
                )
            except (errors.AssetqError, SQLAlchemyError, OSError) as exc:
                self._budget.give_back()
                stats.add(errors=1)
                if with_pass and self.passes.refuse(exc):
                    continue  # claims at once, without a pass
                if metrics is not None:
                    metrics.worker_claim_failed(time.monotonic() - claim_started, error_code(exc))
                delay = backoff(failing, 0.5, self.backoff_cap)
                if not failing:
                    log_retried(
                        self.log,
                        exc,
                        "%s: %s: claim failed: %s%s; retrying with backoff (first in %.2f s);"
                        " not logged again until a claim succeeds",
                        self.who,
                        slot_name,
                        "lost the connection to the database: " if connection_lost(exc) else "",
                        first_line(exc),
                        delay,
                    )
                else:
                    self.log.debug("%s: %s: claim failed again", self.who, slot_name, exc_info=exc)
                failing += 1
                yield Sleep(delay)
                continue
            if failing:
                self.log.info("%s: %s: claims work again", self.who, slot_name)
                failing = 0
            if metrics is not None:
                metrics.worker_claim(time.monotonic() - claim_started, len(claims))
            if not claims:
                self._budget.give_back()
                if (yield Idle(generation, idle)):
                    stats.add(wakeups=1)
                    idle = IDLE_FIRST
                    if metrics is not None:
                        metrics.worker_wait("woken")
                else:
                    idle = min(self.poll, idle * 2)
                    if metrics is not None and not self.stopping():
                        metrics.worker_wait("polled")
                continue
            idle = IDLE_FIRST
            stats.add(claimed=1)
            log_claimed(self.log, f"{self.who}: {slot_name}", claims[0])
            if not (yield Execute(slot_name, number, claims[0], kept)):
                return  # let go: the slot carries on elsewhere

    def ended(self, slot_name: str, claim: api.Claim, started: float, result: Any) -> Steps[None]:
        """An attempt ended with ``result``: its run (a success committed), TIMED_OUT, LOST,
        or the exception its handler or its completion raised. Logged, counted, a failure
        recorded in a transaction of its own, and reported (:meth:`report`)."""
        outcome: AttemptOutcome = "lost"
        info: api.Run | None = None
        fields = attempt_fields(claim)
        where = f"{self.who}: {slot_name}"
        if isinstance(result, api.Run):
            outcome, info = "success", result
            self.stats.add(succeeded=1)
            log_completed(self.log, where, claim, result)
        elif result == LOST:  # the heartbeat said so
            self.stats.add(lost=1, abandoned=1)
        elif isinstance(result, errors.LeaseLost):
            self.log.warning(
                "%s: completion of run %s of %s (attempt %d) refused, its writes rolled back: %s",
                where,
                claim.run_id,
                claim.dag_id,
                claim.attempt,
                result,
                extra=fields,
            )
            self.stats.add(lost=1)
        else:
            if result == TIMED_OUT:
                error = timed_out_error(claim)
                self.log.warning(
                    "%s: run %s of %s (attempt %d) %s: its handler is let go (claim.cancelled"
                    " set) and the attempt recorded as failed",
                    where,
                    claim.run_id,
                    claim.dag_id,
                    claim.attempt,
                    error,
                    extra=fields,
                )
            else:
                error = error_text(result)
                self.log.warning(
                    "%s: run %s of %s (attempt %d) failed: %s: %s",
                    where,
                    claim.run_id,
                    claim.dag_id,
                    claim.attempt,
                    type(result).__name__,
                    result,
                    extra=fields,
                )
            timed_out = int(result == TIMED_OUT)
            try:
                info = yield Call(
                    fail_alone,
                    (self.engine, claim),
                    {"error": error, "namespace": self.namespace},
                )
                outcome = "failed"
                self.stats.add(failed=1, timed_out=timed_out)
                log_completed(self.log, where, claim, info)
            except errors.LeaseLost:
                self.stats.add(lost=1, abandoned=timed_out)
            except (errors.AssetqError, SQLAlchemyError, OSError) as again:
                self.stats.add(errors=1, timed_out=timed_out)
                log_retried(
                    self.log,
                    again,
                    "%s: could not record the failure of run %s of %s: %s; when its lease"
                    " expires it is claimed again, or failed if that was its last attempt",
                    where,
                    claim.run_id,
                    claim.dag_id,
                    first_line(again),
                    extra=fields,
                )
        yield from self.report(claim, info, outcome, time.monotonic() - started)

    def report(
        self, claim: api.Claim, info: api.Run | None, outcome: AttemptOutcome, took: float
    ) -> Steps[None]:
        """After an attempt: the pass that creates a capped consumer's next run (MySQL:
        :func:`runs_next_pass`), the metrics, ``on_complete``."""
        if runs_next_pass(self.dialect, claim, info):
            try:
                yield Retried(
                    api.schedule,
                    (self.engine,),
                    {"namespace": self.namespace, "max_attempts": 2},
                    what="scheduler pass",
                )
            except (errors.AssetqError, SQLAlchemyError, OSError) as exc:
                if self._pass_failed:
                    self.log.debug("%s: the pass after run %s failed again", self.who, claim.run_id)
                else:
                    self._pass_failed = True
                    log_retried(
                        self.log,
                        exc,
                        "%s: the pass after run %s of %s ended failed: %s; its consumer's"
                        " next run waits for a scheduler (grant this account worker access"
                        " again: it includes schedule_pass on MySQL)",
                        self.who,
                        claim.run_id,
                        claim.dag_id,
                        first_line(exc),
                    )
        metrics = self.metrics
        if metrics is not None:
            if claim.made:  # this slot's own pass made the run (after the handler: off its path)
                (latency,) = yield Call(run_latencies, (self.engine, self.namespace, [claim]))
                metrics.run_created(claim, latency)
            metrics.worker_completed(claim, outcome, info, took)
            if outcome == "failed" and info is not None and info.state == "queued":
                metrics.worker_retry(claim, info)
        if self.on_complete is not None:
            self.on_complete(claim, info, outcome)


@dataclass
class _Attempt:
    """An attempt a sync slot is running: the slot's number and name, when it started
    (monotonic), and its state: "running" while its handler runs, "completing" once the
    handler returned (the slot's thread ends it), or "abandoned" by the heartbeat thread
    (let_go) at its deadline or when its run was lost while the handler ran. Changed under
    run_worker's attempts lock."""

    slot: int
    slot_name: str
    started: float
    state: str = "running"


class _LetGo(Exception):
    """Raised in a slot's thread to roll back the completion of an attempt let go of."""


def run_worker(
    engine: Engine,
    handlers: Mapping[str, Handler],
    *,
    worker: str | None = None,
    concurrency: int = 1,
    lease: timedelta | float = timedelta(seconds=60),
    stop: threading.Event | None = None,
    namespace: str = DEFAULT_NAMESPACE,
    poll_interval: float = 1.0,
    listen: bool = True,
    listen_engine: Engine | None = None,
    heartbeat_interval: float | None = None,
    max_runs: int | None = None,
    on_complete: Callable[[api.Claim, api.Run | None, AttemptOutcome], None] | None = None,
    backoff_max: float = 30.0,
    metrics: Metrics | None = None,
    liveness_interval: float | None = DEFAULT_INTERVAL,
    timeout: timedelta | float | None = None,
    strict: bool = False,
) -> WorkerStats:
    """Claim and execute runs of the consumers in ``handlers`` until ``stop`` is set (or
    ``max_runs`` attempts were completed), and return what was done.

    ``handlers`` maps a dag id to ``handler(claim, conn)``, called in the transaction that
    completes the run: its writes through ``conn`` commit with the run's success and with the
    events it returns (NewEvent or mappings, registered as :func:`assetq.register_events`
    would, with this run as their source), or not at all. An exception it raises fails the
    attempt: the transaction is rolled back and the error recorded. ``concurrency`` slots
    (1 to 256 threads) each hold one run at a time, under a lease of ``lease`` renewed every
    ``heartbeat_interval`` seconds (default: a third of the lease). ``on_complete(claim, run,
    outcome)`` is called after each attempt with ``outcome`` ``"success"``, ``"failed"`` or
    ``"lost"`` (``run`` is None when the completion was refused or could not be recorded).
    Safe to run in any number of threads and processes at once: every attempt is held by one
    worker (docs/workers.md).

    Connections: each slot keeps one of ``engine``'s pool for its claims and completions
    (on PostgreSQL with psycopg its handler's transaction runs on it too; elsewhere that
    takes another), and the heartbeat keeps one: when the pool has room for
    ``concurrency + 2`` (``2 * concurrency + 2`` on MySQL and in assetq.aio); otherwise
    every call goes through the Engine, a pool checkout each, as before. A kept connection
    found lost is replaced; the call that found it is made again on the Engine, as before.

    ``listen_engine``: where the listening connection (PostgreSQL) comes from (default
    ``engine``); when ``engine`` goes through a pooler in transaction mode, give a direct
    connection here. A listening connection that does not hold one server session is
    closed before it LISTENs, and the slots poll, with one warning (docs/deployment.md).

    ``metrics``: an :class:`assetq.Metrics` told of each claim (its duration, 0 or 1 run),
    each failed claim, each attempt's end (outcome, run, duration) and retry, and how each
    idle wait ended (woken or polled), from every slot's thread; see docs/python.md.

    ``liveness_interval``: the worker records itself (with its name) in the liveness table
    (``assetq status`` shows it) at start and then every that many
    seconds, from the thread that called run_worker, each time in a short transaction of its
    own; a clean stop deletes its row; status calls it stale after three intervals. A failed
    heartbeat is one WARNING and never stops the worker. None: no row. The row names the
    consumers in ``handlers`` (status and doctor flag a consumer with runs waiting and no
    live worker for it); a handler for a consumer that is not declared is one WARNING at
    start, or, with ``strict``, raises :class:`~assetq.UnknownDag` before anything is claimed
    (as does a first heartbeat that fails; strict needs a ``liveness_interval``).

    ``timeout`` (a timedelta or seconds): how long an attempt of a consumer that declares no
    ``timeout`` of its own (:func:`assetq.declare_dag`) may run; None: no limit but the
    consumer's. At an attempt's deadline, or when its run is cancelled
    (:func:`assetq.cancel_run`, seen by the next heartbeat), the worker sets
    ``claim.cancelled``, records a timed-out attempt as failed ("timed out after 30s",
    retried by ``max_attempts``), and lets the handler go: its slot carries on in a new
    thread at once, and whatever the old thread does after is fenced (its completion is
    refused; its transaction is rolled back). A handler that can stop early watches
    ``claim.cancelled``.
    """
    options = dict(locals())  # checked by WorkerLoop
    engine = engine_of(engine, "run_worker")
    stop_event = stop if stop is not None else threading.Event()
    quit_ = threading.Event()  # the slots are done (or one failed): the heartbeat ends
    attempts_lock = threading.Lock()  # guards attempts and each _Attempt's state
    attempts: dict[AttemptKey, _Attempt] = {}
    slot_threads: dict[int, threading.Thread] = {}
    failures: list[BaseException] = []

    def let_go(claim: api.Claim, why: str) -> None:
        """The heartbeat thread's: stop waiting for ``claim``'s handler, end the attempt as
        ``why`` (WorkerLoop.ended), and give its slot a new thread."""
        with attempts_lock:
            attempt = attempts.get(attempt_key(claim))
            if attempt is None or attempt.state != "running":
                return  # its handler returned meanwhile: the slot's completion decides
            attempt.state = "abandoned"
        if not loop.stopping():
            spawn(attempt.slot)
        drive(loop.ended(attempt.slot_name, claim, attempt.started, why), take)

    table = check_handlers(handlers)
    loop = WorkerLoop(
        engine, table, options, "assetq worker", log, stop_event.is_set, quit_.is_set, let_go
    )
    if listen_engine is not None and dialect_of(listen_engine) is not loop.dialect:
        raise errors.InvalidArgument("listen_engine must reach the same engine kind as engine")
    listening = listen and loop.dialect.supports_notify
    # Handlers run on the slots' kept connections where switching autocommit is client-side
    # and the driver says whether anything was sent: psycopg 3.
    lean_handlers = shares_kept(engine)

    def completing(claim: api.Claim) -> bool:
        """The handler returned (or raised): from now on this slot ends the attempt itself,
        and a deadline or a lost lease found meanwhile no longer lets it go (the completion
        learns what happened: it commits, or LeaseLost). False when it was let go first."""
        with attempts_lock:
            attempt = attempts[attempt_key(claim)]
            if attempt.state == "abandoned":
                return False
            attempt.state = "completing"
            return True

    def attempt(claim: api.Claim, kept: KeptConnection | None) -> Any:
        """Run ``claim``'s handler in the transaction that completes its run: the run, or
        the exception raised (None when the attempt was let go meanwhile)."""
        conn = None if kept is None or not lean_handlers else kept.connection()
        if conn is not None:
            return attempt_kept(claim, kept, conn)  # type: ignore[arg-type]
        try:
            with engine.connect() as conn, conn.begin():
                produced = loop.table[claim.dag_id](claim, conn)
                if not completing(claim):
                    raise _LetGo
                return api.complete_run(
                    conn, claim, "success", events=produced, namespace=loop.namespace
                )
        except _LetGo:
            return None
        except Exception as exc:  # the handler's error, or the completion's
            completing(claim)  # let go first: it saw claim.cancelled, likely
            return exc

    def attempt_kept(claim: api.Claim, kept: KeptConnection, conn: Connection) -> Any:
        """:func:`attempt` on the slot's kept connection (psycopg: autocommit is a client-side
        switch, no round trip): the handler in a transaction; a handler that sent nothing
        leaves the driver's connection idle, and then the transaction has nothing to commit
        and the success is one statement alone (one round trip), else it commits with the
        handler's writes. Fenced as on the Engine: a stale attempt's completion is refused."""
        driver: Any = conn.connection.dbapi_connection
        produced: Any = None
        try:
            driver.autocommit = False
            try:
                with conn.begin():
                    produced = loop.table[claim.dag_id](claim, conn)
                    if not completing(claim):
                        raise _LetGo
                    # Nothing sent: nothing to commit (the commit sends nothing either).
                    if driver.info.transaction_status != TransactionStatus.IDLE:
                        return api.complete_run(
                            conn, claim, "success", events=produced, namespace=loop.namespace
                        )
            finally:
                if not (conn.closed or conn.invalidated):
                    driver.autocommit = True
            return kept.complete(claim, produced, loop.namespace)
        except _LetGo:
            return None
        except Exception as exc:  # the handler's error, or the completion's
            completing(claim)  # let go first: it saw claim.cancelled, likely
            if conn.closed or conn.invalidated or connection_lost(exc):
                kept.drop()
            return exc

    def execute(step: Execute) -> bool:
        """Run an attempt in this thread; False when it was let go meanwhile (this thread's
        slot has a new thread: this one ends)."""
        claim = step.claim
        started = _Attempt(slot=step.number, slot_name=step.slot_name, started=time.monotonic())
        with attempts_lock:
            attempts[attempt_key(claim)] = started
        loop.leases.hold(claim)
        try:
            result = attempt(claim, step.kept)
        finally:
            loop.leases.drop(claim)
            with attempts_lock:
                attempts.pop(attempt_key(claim), None)
        # Popped under the lock: let_go can no longer change its state.
        if started.state == "abandoned":
            log.info(
                "assetq worker: %s: the handler of run %s of %s (attempt %d), let go, returned"
                " after %.1f s; its thread ends",
                step.slot_name,
                claim.run_id,
                claim.dag_id,
                claim.attempt,
                time.monotonic() - started.started,
                extra=attempt_fields(claim),
            )
            return False
        drive(loop.ended(step.slot_name, claim, started.started, result), take)
        return True

    def take(step: Step) -> Any:
        if isinstance(step, Call):
            return take_call(step)
        if isinstance(step, Idle):
            return loop.wakeup.wait(step.generation, step.seconds, stop_event)
        if isinstance(step, Execute):
            return execute(step)
        if step.until == NOTHING:
            time.sleep(step.seconds)
            return False
        return (stop_event if step.until == STOP else quit_).wait(step.seconds)

    def spawn(number: int) -> None:
        """Start slot ``number``'s thread; a thread let go of is replaced (never joined).
        Published and started under the lock: the main thread, which returns once no slot's
        thread is alive, must never see the new one not started yet (a replaced slot looked
        finished, and a worker whose only slot timed out a handler returned early)."""
        thread = threading.Thread(
            target=slot, args=(number,), name=f"assetq-worker-{number}", daemon=True
        )
        with attempts_lock:
            slot_threads[number] = thread
            thread.start()  # returns once the thread runs; it takes the lock only later

    def slot(number: int) -> None:
        try:
            drive(loop.slot(number), take)
        except BaseException as exc:  # a handler's KeyboardInterrupt, on_complete's error
            failures.append(exc)
            quit_.set()
            stop_event.set()

    heart = threading.Thread(
        target=drive, args=(loop.leases.steps(), take), name="assetq-worker-heartbeat", daemon=True
    )
    listener = (
        threading.Thread(
            target=wake_slots,
            args=(
                worker_listener(
                    listen_engine or engine,
                    loop.dialect,
                    loop.namespace,
                    "assetq worker",
                    loop.poll,
                    log,
                ),
                loop.wakeup,
                quit_,
                loop.poll,
            ),
            name="assetq-worker-listener",
            daemon=True,
        )
        if listening
        else None
    )
    loop.started(listening)
    started = time.monotonic()
    loop.alive.beat()
    heart.start()
    if listener is not None:
        listener.start()
    try:
        for number in range(1, concurrency + 1):
            spawn(number)
        while True:  # the slots' threads claim and run; this one only waits
            with attempts_lock:
                current = [t for t in slot_threads.values() if t.is_alive()]
            if not current:
                break
            current[0].join(STOP_CHECK)
            loop.alive.beat_if_due()
    finally:
        quit_.set()
        heart.join(timeout=5)
        if listener is not None:
            listener.join(timeout=5)
        loop.alive.gone()
        loop.stopped(time.monotonic() - started)
    if failures:
        raise failures[0]
    return loop.stats
