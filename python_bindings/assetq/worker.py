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
"""

from __future__ import annotations

import logging
import os
import random
import secrets
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from . import api, errors
from .dialects import Dialect, dialect_of
from .handles import engine_of
from .liveness import DEFAULT_INTERVAL, Liveness, check_interval
from .logs import attempt_fields, close_detached, connection_lost, first_line, log_retried
from .metrics import AttemptOutcome, Metrics
from .namespace import DEFAULT_NAMESPACE
from .scheduler import _error_code, pooled_session, pooled_warning, run_latencies
from .validation import WORKER_MAX, check_dag_id, check_int, check_name, check_namespace, seconds

log = logging.getLogger("assetq.worker")

#: What a handler is called with and may return: ``handler(claim, conn)`` runs inside the
#: transaction that completes the run and returns the run's output events (or None).
Handler = Callable[[api.Claim, Connection], "Iterable[api.NewEvent | Mapping[str, Any]] | None"]

#: The first idle wait after a claim found nothing, seconds; it doubles up to poll_interval.
_IDLE_FIRST = 0.05
#: Longest stretch a wait goes without looking at the stop event, seconds.
_STOP_CHECK = 0.25


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


class _Wakeup:
    """Idle slots wait here; the listener (PostgreSQL) wakes them all when runs are created,
    and when a producer's events were queued (then the first slot to claim runs a pass of
    its own first: :meth:`take_queued`)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._generation = 0
        self._queued = False

    @property
    def generation(self) -> int:
        with self._cond:
            return self._generation

    def wake(self, queued: bool = False) -> None:
        with self._cond:
            self._generation += 1
            self._queued = self._queued or queued
            self._cond.notify_all()

    def take_queued(self) -> bool:
        """True once after each ``wake(queued=True)``: the slot that takes it claims with a
        pass of its own first (claim_runs' ``schedule``), one hop from the producer's commit."""
        with self._cond:
            queued, self._queued = self._queued, False
            return queued

    def wait(self, generation: int, timeout: float, stop: threading.Event) -> bool:
        """Wait up to ``timeout`` seconds for a wake-up after ``generation``; True if one came."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._generation == generation and not stop.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(min(remaining, _STOP_CHECK))
            return self._generation != generation


class _Listener(threading.Thread):
    """A connection of its own (detached from the pool, autocommit) that LISTENs on the
    namespace's channel and wakes idle slots on each ``runs`` notification (a pass made
    runs) and ``queued`` one (a producer's events: the first slot claims with a pass of its
    own, :meth:`_Wakeup.take_queued`). Reconnects after
    ``retry`` seconds when the connection breaks; slots poll meanwhile."""

    def __init__(
        self, engine: Engine, namespace: str, wakeup: _Wakeup, stop: threading.Event, retry: float
    ) -> None:
        super().__init__(name="assetq-worker-listener", daemon=True)
        self._engine = engine
        self._namespace = namespace
        self._wakeup = wakeup
        self._stop_event = stop
        self._retry = retry
        self.woken = 0
        #: Why the engine cannot listen (a transaction pooler); then slots poll for good.
        self.pooled: str | None = None

    def run(self) -> None:
        dialect = dialect_of(self._engine)
        failed = False
        while not self._stop_event.is_set():
            raw = None
            try:
                raw = self._engine.raw_connection()
                driver: Any = raw.driver_connection
                raw.detach()
                driver.autocommit = True
                # Before LISTEN: through a transaction pooler it would stay on a server
                # connection other clients get (I11), and notifications would be lost.
                pooled = pooled_session(self._engine, dialect, self._namespace, driver)
                if pooled is not None:
                    pooled_warning("assetq worker", pooled, self._retry)
                    self.pooled = pooled
                    return  # slots poll (the finally closes the connection)
                # Schedulers woken by producers give listening workers a head start. Before
                # LISTEN, the session's last statement while it waits.
                driver.execute(dialect.query("workers_listen_mark", self._namespace))
                driver.execute(dialect.query("listen", self._namespace))
                if failed:
                    log.info("assetq worker: listening for new runs again")
                    failed = False
                while not self._stop_event.is_set():
                    for note in driver.notifies(timeout=_STOP_CHECK):
                        if note.payload in ("runs", "queued"):
                            self.woken += 1
                            self._wakeup.wake(queued=note.payload == "queued")
            except Exception as exc:  # psycopg's own errors come from here
                if not failed:
                    log_retried(
                        log,
                        exc,
                        "assetq worker: %s the wake-up connection (%s); slots poll meanwhile,"
                        " reconnecting every %g s",
                        "lost" if connection_lost(exc) else "error on",
                        str(exc).strip().splitlines()[0] if str(exc).strip() else exc,
                        self._retry,
                    )
                    failed = True
                else:
                    log.debug("assetq worker: the wake-up connection failed again", exc_info=exc)
                self._stop_event.wait(self._retry)
            finally:
                if raw is not None:
                    close_detached(raw)


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


class _Heartbeat(threading.Thread):
    """Renews the lease of every claim the slots hold, every ``interval`` seconds, and lets
    go of an attempt at its deadline or when its lease is lost (cancelled): ``let_go(claim,
    why)`` is called once for it ("timed out" or "lost"), from this thread."""

    def __init__(
        self,
        engine: Engine,
        namespace: str,
        interval: float,
        stop: threading.Event,
        let_go: Callable[[api.Claim, str], None] | None = None,
    ) -> None:
        super().__init__(name="assetq-worker-heartbeat", daemon=True)
        self._engine = engine
        self._namespace = namespace
        self._interval = interval
        self._stop_event = stop
        self._let_go = let_go
        self._held: dict[int, api.Claim] = {}
        #: Local (monotonic) deadline of each held claim that has one.
        self._deadlines: dict[int, float] = {}
        self._lock = threading.Lock()
        self._failing = False

    def hold(self, claim: api.Claim) -> None:
        timeout = attempt_timeout(claim)
        with self._lock:
            self._held[claim.id] = claim
            if timeout is not None:
                self._deadlines[claim.id] = time.monotonic() + timeout

    def drop(self, claim: api.Claim) -> None:
        with self._lock:
            self._held.pop(claim.id, None)
            self._deadlines.pop(claim.id, None)

    def run(self) -> None:
        next_beat = time.monotonic() + self._interval
        while not self._stop_event.is_set():
            self._stop_event.wait(max(0.0, min(next_beat - time.monotonic(), self._until_due())))
            self.expire()
            if time.monotonic() >= next_beat and not self._stop_event.is_set():
                self.beat()
                next_beat = time.monotonic() + self._interval
        # Stopping: slots finish their runs; keep their leases alive until they are done.
        while True:
            with self._lock:
                if not self._held:
                    return
            time.sleep(min(self._interval, _STOP_CHECK))
            self.expire()
            self.beat(only_due=True)

    def _until_due(self) -> float:
        """Seconds to the nearest deadline of a held claim (at most _STOP_CHECK)."""
        with self._lock:
            nearest = min(self._deadlines.values(), default=None)
        if nearest is None:
            return _STOP_CHECK
        return min(_STOP_CHECK, max(0.0, nearest - time.monotonic()))

    def expire(self) -> None:
        """Let go of every held claim whose deadline has come."""
        now = time.monotonic()
        with self._lock:
            due = [self._held[i] for i, end in self._deadlines.items() if end <= now]
        for claim in due:
            self._release(claim, "timed out")

    def _release(self, claim: api.Claim, why: str) -> None:
        """Stop holding ``claim``, tell its handler (claim.cancelled), and let its attempt go."""
        self.drop(claim)
        claim.cancelled.set()
        if self._let_go is not None:
            self._let_go(claim, why)

    def beat(self, *, only_due: bool = False) -> None:
        with self._lock:
            held = list(self._held.values())
        now = time.time()
        for claim in held:
            if only_due and claim.lease_until is not None:
                left = claim.lease_until.timestamp() - now
                if left > claim.lease.total_seconds() * 2 / 3:
                    continue
            try:
                renewed = api.heartbeat(self._engine, claim, namespace=self._namespace)
            except errors.LeaseLost as exc:
                log.warning(
                    "assetq worker: lost run %s of %s (attempt %d): %s; its completion will"
                    " be refused, its handler is told (claim.cancelled) and let go",
                    claim.run_id,
                    claim.dag_id,
                    claim.attempt,
                    exc,
                    extra=attempt_fields(claim),
                )
                self._release(claim, "lost")
                continue
            except (errors.AssetqError, SQLAlchemyError, OSError) as exc:
                if not self._failing:
                    log_retried(
                        log,
                        exc,
                        "assetq worker: heartbeat of run %s of %s failed: %s; trying again in %g s",
                        claim.run_id,
                        claim.dag_id,
                        first_line(exc),
                        self._interval,
                        extra=attempt_fields(claim),
                    )
                    self._failing = True
                continue
            self._failing = False
            with self._lock:
                if claim.id in self._held:
                    self._held[claim.id] = renewed


@dataclass
class _Attempt:
    """An attempt a slot is running: the slot's number, when it started (monotonic), and its
    state: "running" while its handler runs, "completing" once the handler returned (the
    slot's thread ends it), or "abandoned" by the heartbeat thread (let_go) at its deadline
    or when its run was lost while the handler ran. Changed under run_worker's attempts
    lock."""

    slot: int
    started: float
    state: str = "running"


class _LetGo(Exception):
    """Raised in a slot's thread to roll back the completion of an attempt let go of."""


def _handlers(handlers: object) -> dict[str, Handler]:
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


def log_completed(
    logger: logging.Logger, slot_name: str, claim: api.Claim, run: api.Run
) -> None:
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


def _error_text(exc: BaseException) -> str:
    """What a failed attempt records: the exception and the last frames of its traceback."""
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-8)
    return "".join(lines).strip()


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
    engine = engine_of(engine, "run_worker")
    table = _handlers(handlers)
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
    stop_event = stop if stop is not None else threading.Event()
    dialect = dialect_of(engine)
    if listen_engine is not None and dialect_of(listen_engine) is not dialect:
        raise errors.InvalidArgument("listen_engine must reach the same engine kind as engine")
    dag_ids = sorted(table)
    stats = WorkerStats()
    finished = threading.Event()  # max_runs reached
    budget = threading.Semaphore(max_runs) if max_runs is not None else None
    quit_ = threading.Event()  # stop or max_runs: no new claims

    def stopping() -> bool:
        return stop_event.is_set() or finished.is_set()

    wakeup = _Wakeup()
    attempts_lock = threading.Lock()  # guards attempts and each _Attempt's state
    attempts: dict[int, _Attempt] = {}
    slot_threads: dict[int, threading.Thread] = {}

    pass_failed = threading.Event()  # a worker's pass failed once: logged at WARNING once
    passes = PassGate("assetq worker")

    def next_run_of(claim: api.Claim, info: api.Run | None) -> None:
        """MySQL: the run of a capped consumer ended; run the pass that creates its next run
        now, instead of leaving it to a scheduler's poll (PostgreSQL's run_ended notifies)."""
        if not runs_next_pass(dialect, claim, info):
            return
        try:
            api.schedule(engine, namespace=namespace, max_attempts=2)
        except (errors.AssetqError, SQLAlchemyError, OSError) as exc:
            if pass_failed.is_set():
                log.debug("assetq worker: the pass after run %s failed again", claim.run_id)
                return
            pass_failed.set()
            log_retried(
                log,
                exc,
                "assetq worker: the pass after run %s of %s ended failed: %s; its consumer's"
                " next run waits for a scheduler (grant this account worker access again:"
                " it includes schedule_pass on MySQL)",
                claim.run_id,
                claim.dag_id,
                first_line(exc),
            )

    def report(
        claim: api.Claim, info: api.Run | None, outcome: AttemptOutcome, took: float
    ) -> None:
        next_run_of(claim, info)
        if metrics is not None:
            if claim.made:  # this slot's own pass made the run (after the handler: off its path)
                (latency,) = run_latencies(engine, namespace, [claim])
                metrics.run_created(claim, latency)
            metrics.worker_completed(claim, outcome, info, took)
            if outcome == "failed" and info is not None and info.state == "queued":
                metrics.worker_retry(claim, info)
        if on_complete is not None:
            on_complete(claim, info, outcome)

    def let_go(claim: api.Claim, why: str) -> None:
        """The heartbeat thread's: stop waiting for ``claim``'s handler (timed out, or its run
        lost or cancelled), record a timeout as the attempt's failure, and give its slot a
        new thread."""
        with attempts_lock:
            attempt = attempts.get(claim.id)
            if attempt is None or attempt.state != "running":
                return  # its handler returned meanwhile: the slot's completion decides
            attempt.state = "abandoned"
        outcome: AttemptOutcome = "lost"
        info: api.Run | None = None
        fields = attempt_fields(claim)
        if why == "timed out":
            error = timed_out_error(claim)
            log.warning(
                "assetq worker: run %s of %s (attempt %d) %s: its handler is let go"
                " (claim.cancelled set) and the attempt recorded as failed",
                claim.run_id,
                claim.dag_id,
                claim.attempt,
                error,
                extra=fields,
            )
            try:
                with engine.connect() as conn, conn.begin():
                    info = api.complete_run(conn, claim, "failed", error=error, namespace=namespace)
                outcome = "failed"
                stats.add(failed=1, timed_out=1)
            except errors.LeaseLost:
                stats.add(lost=1, abandoned=1)
            except (errors.AssetqError, SQLAlchemyError, OSError) as exc:
                stats.add(errors=1, timed_out=1)
                log_retried(
                    log,
                    exc,
                    "assetq worker: could not record the timeout of run %s of %s: %s; the next"
                    " claim ends the attempt",
                    claim.run_id,
                    claim.dag_id,
                    first_line(exc),
                    extra=fields,
                )
        else:
            stats.add(lost=1, abandoned=1)
        if not stopping():
            spawn(attempt.slot)
        report(claim, info, outcome, time.monotonic() - attempt.started)

    heart = _Heartbeat(engine, namespace, interval, quit_, let_go)
    listener = (
        _Listener(listen_engine or engine, namespace, wakeup, quit_, poll)
        if listen and dialect.supports_notify
        else None
    )

    def completing(claim: api.Claim) -> bool:
        """The handler returned (or raised): from now on this slot ends the attempt itself,
        and a deadline or a lost lease found meanwhile no longer lets it go (the completion
        learns what happened: it commits, or LeaseLost). False when it was let go first."""
        with attempts_lock:
            attempt = attempts[claim.id]
            if attempt.state == "abandoned":
                return False
            attempt.state = "completing"
            return True

    def execute(slot_name: str, number: int, claim: api.Claim) -> bool:
        """Run ``claim``'s handler and complete the attempt; False when the attempt was let go
        meanwhile (this thread's slot has a new thread: this one ends)."""
        handler = table[claim.dag_id]
        log_claimed(log, f"assetq worker: {slot_name}", claim)
        attempt = _Attempt(slot=number, started=time.monotonic())
        with attempts_lock:
            attempts[claim.id] = attempt
        heart.hold(claim)
        outcome: AttemptOutcome = "lost"
        info: api.Run | None = None
        fields = attempt_fields(claim)
        try:
            try:
                with engine.connect() as conn, conn.begin():
                    produced = handler(claim, conn)
                    if not completing(claim):
                        raise _LetGo
                    info = api.complete_run(
                        conn, claim, "success", events=produced, namespace=namespace
                    )
                outcome = "success"
                stats.add(succeeded=1)
                log_completed(log, f"assetq worker: {slot_name}", claim, info)
            except _LetGo:
                pass
            except errors.LeaseLost as exc:
                log.warning(
                    "assetq worker: %s: completion of run %s of %s (attempt %d) refused, its"
                    " writes rolled back: %s",
                    slot_name,
                    claim.run_id,
                    claim.dag_id,
                    claim.attempt,
                    exc,
                    extra=fields,
                )
                stats.add(lost=1)
            except Exception as exc:  # the handler's error, or the completion's
                if not completing(claim):  # it saw claim.cancelled, likely: already recorded
                    pass
                else:
                    log.warning(
                        "assetq worker: %s: run %s of %s (attempt %d) failed: %s: %s",
                        slot_name,
                        claim.run_id,
                        claim.dag_id,
                        claim.attempt,
                        type(exc).__name__,
                        exc,
                        extra=fields,
                    )
                    try:
                        with engine.connect() as conn, conn.begin():
                            info = api.complete_run(
                                conn, claim, "failed", error=_error_text(exc), namespace=namespace
                            )
                        outcome = "failed"
                        stats.add(failed=1)
                        log_completed(log, f"assetq worker: {slot_name}", claim, info)
                    except errors.LeaseLost:
                        stats.add(lost=1)
                    except (errors.AssetqError, SQLAlchemyError, OSError) as again:
                        stats.add(errors=1)
                        log_retried(
                            log,
                            again,
                            "assetq worker: %s: could not record the failure of run %s of %s:"
                            " %s; when its lease expires it is claimed again, or failed if that"
                            " was its last attempt",
                            slot_name,
                            claim.run_id,
                            claim.dag_id,
                            first_line(again),
                            extra=fields,
                        )
        finally:
            heart.drop(claim)
            with attempts_lock:
                attempts.pop(claim.id, None)
        # Popped under the lock: let_go can no longer change its state.
        if attempt.state == "abandoned":
            log.info(
                "assetq worker: %s: the handler of run %s of %s (attempt %d), let go, returned"
                " after %.1f s; its thread ends",
                slot_name,
                claim.run_id,
                claim.dag_id,
                claim.attempt,
                time.monotonic() - attempt.started,
                extra=fields,
            )
            return False
        report(claim, info, outcome, time.monotonic() - attempt.started)
        return True

    failures: list[BaseException] = []

    def spawn(number: int) -> None:
        """Start slot ``number``'s thread; a thread let go of is replaced (never joined)."""
        thread = threading.Thread(
            target=slot, args=(number,), name=f"assetq-worker-{number}", daemon=True
        )
        with attempts_lock:
            slot_threads[number] = thread
        thread.start()

    def slot(number: int) -> None:
        slot_name = name if concurrency == 1 else f"{name}#{number}"
        idle = _IDLE_FIRST
        failing = 0
        try:
            while not stopping():
                generation = wakeup.generation
                if budget is not None and not budget.acquire(blocking=False):
                    finished.set()
                    break
                claim_started = time.monotonic()
                with_pass = passes.open(wakeup.take_queued())
                try:
                    claims = api.claim_runs(
                        engine,
                        slot_name,
                        lease=lease_seconds,
                        dag_ids=dag_ids,
                        namespace=namespace,
                        timeout=timeout_seconds,
                        schedule=with_pass,
                    )
                except (errors.AssetqError, SQLAlchemyError, OSError) as exc:
                    if budget is not None:
                        budget.release()
                    stats.add(errors=1)
                    if with_pass and passes.refuse(exc):
                        continue  # claims at once, without a pass
                    if metrics is not None:
                        metrics.worker_claim_failed(
                            time.monotonic() - claim_started, _error_code(exc)
                        )
                    delay = min(backoff_cap, 0.5 * 2 ** min(failing, 30)) * random.uniform(0.5, 1)
                    if not failing:
                        log_retried(
                            log,
                            exc,
                            "assetq worker: %s: claim failed: %s%s; retrying with backoff"
                            " (first in %.2f s); not logged again until a claim succeeds",
                            slot_name,
                            "lost the connection to the database: " if connection_lost(exc) else "",
                            first_line(exc),
                            delay,
                        )
                    else:
                        log.debug("assetq worker: %s: claim failed again", slot_name, exc_info=exc)
                    failing += 1
                    stop_event.wait(delay)
                    continue
                if failing:
                    log.info("assetq worker: %s: claims work again", slot_name)
                    failing = 0
                if metrics is not None:
                    metrics.worker_claim(time.monotonic() - claim_started, len(claims))
                if not claims:
                    if budget is not None:
                        budget.release()
                    if wakeup.wait(generation, idle, stop_event):
                        stats.add(wakeups=1)
                        idle = _IDLE_FIRST
                        if metrics is not None:
                            metrics.worker_wait("woken")
                    else:
                        idle = min(poll, idle * 2)
                        if metrics is not None and not stopping():
                            metrics.worker_wait("polled")
                    continue
                idle = _IDLE_FIRST
                stats.add(claimed=1)
                if not execute(slot_name, number, claims[0]):
                    return  # let go: the slot's new thread carries on
        except BaseException as exc:  # a handler's KeyboardInterrupt, on_complete's error
            failures.append(exc)
            quit_.set()
            stop_event.set()

    log.info(
        "assetq worker: %s started on namespace %s (%s, %d slots, lease %g s, consumers %s, %s)",
        name,
        namespace,
        dialect.name,
        concurrency,
        lease_seconds,
        ", ".join(dag_ids),
        "woken by NOTIFY" if listener is not None else f"polling up to every {poll:g} s",
    )
    started = time.monotonic()
    alive = Liveness(
        engine, namespace, "worker", liveness_interval, name=name, handles=dag_ids, strict=strict
    )
    alive.beat()
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
            current[0].join(_STOP_CHECK)
            alive.beat_if_due()
    finally:
        quit_.set()
        heart.join(timeout=5)
        if listener is not None:
            listener.join(timeout=5)
        alive.gone()
        log.info(
            "assetq worker: %s stopped after %d claims: %d succeeded, %d failed, %d lost,"
            " %d errors in %.0f s",
            name,
            stats.claimed,
            stats.succeeded,
            stats.failed,
            stats.lost,
            stats.errors,
            time.monotonic() - started,
        )
    if failures:
        raise failures[0]
    return stats
