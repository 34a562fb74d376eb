"""The long-running scheduler: :func:`run_scheduler`, behind ``assetq scheduler``.

A loop of :func:`assetq.schedule` passes. After a pass that created runs it passes again at
once (more may be waiting); otherwise it waits for a wake-up or for ``poll_interval``. On
PostgreSQL the wake-up is a notification on the namespace's channel, which the loop LISTENs
to on a connection of its own. Producers pay for a notification (PostgreSQL serializes the
commits of notifying transactions), so they send one only while a scheduler asked for it.
Two session locks of the listening connection say who
needs what:

* the wake-up lock, exclusive: a loop whose pass found nothing takes it, which waits for the
  producers in flight that did not notify (they hold it shared), passes once more (that pass
  sees their events) and then waits for a notification, holding it: every producer that
  commits meanwhile notifies. The first pass that creates runs gives it back;
* the busy lock, shared: held while the loop's passes create runs. A loop with nothing to do
  while another one is busy does not take the wake-up lock (the busy one passes again and
  sees what producers commit): it looks again every second. A loop woken for nothing while
  another one is busy gives the wake-up lock back and does the same.

A loop that finds the wake-up lock held by another waits for notifications too (they wake
both), without queueing for the lock. So while any scheduler is busy, producers commit
without notifying; only when all of them are idle does one of them ask to be woken. Errors:
both locks are given back before a backoff, and the listening session has TCP keepalives, so
the server releases them within about two minutes of a scheduler's death.

It still polls: a notification sent while the listening connection was down is simply
missed, and the poll catches up. MySQL has no notifications: the loop polls.

Errors never end the loop: it backs off (exponentially, capped, with jitter) and tries again,
logging each error once (with its code) until a pass succeeds again. Stopping is graceful: the
``stop_event`` is looked at between passes, never during one, so a pass always commits or
rolls back whole.

One core, two shells: :class:`SchedulerLoop` makes every decision as steps
(:mod:`assetq.loops`); :func:`run_scheduler` takes them in the calling thread,
:func:`assetq.aio.run_scheduler` awaits them. The listening connection is
:class:`assetq.listening.Listener`'s, with the lock protocol above (:class:`WakeupListener`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from . import api, errors
from .dialects import Dialect, dialect_of
from .handles import engine_of
from .listening import Listener, pooled_warning
from .liveness import DEFAULT_INTERVAL, Liveness, check_interval
from .logs import connection_lost, log_retried, run_fields
from .loops import (
    STOP_CHECK,
    Blocking,
    Call,
    Retried,
    Sleep,
    Step,
    Steps,
    backoff,
    drive,
    error_code,
    take_call,
)
from .metrics import Metrics
from .namespace import DEFAULT_NAMESPACE
from .validation import check_int, check_namespace, seconds

log = logging.getLogger("assetq.scheduler")

#: How often an idle loop that waits for another scheduler looks again, seconds.
_RECHECK = 1.0


@dataclass
class SchedulerStats:
    """What a :func:`run_scheduler` call did."""

    #: Passes attempted (failed ones included).
    passes: int = 0
    #: Runs created, and the events they consumed.
    runs: int = 0
    events: int = 0
    #: Passes that failed (after :func:`assetq.schedule`'s own retries).
    errors: int = 0
    #: Waits ended by a notification rather than the poll interval (PostgreSQL).
    wakeups: int = 0
    #: Times the loop took the wake-up lock, asking producers to notify (PostgreSQL).
    arms: int = 0
    #: Wake-ups by producers after which the loop gave listening workers a head start
    #: (``worker_head_start``, PostgreSQL).
    head_starts: int = 0


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


#: SQLSTATE of a lock wait ended by lock_timeout (PostgreSQL's lock_not_available).
_LOCK_TIMEOUT = "55P03"

#: Payload of the notifications sent when runs are created: for workers, not schedulers.
_RUNS = "runs"

#: How long a scheduler woken by producers waits for listening workers (run_scheduler's
#: worker_head_start), seconds: a worker's own pass and claim take a few milliseconds.
WORKER_HEAD_START = 0.02

#: What WakeupListener.settle says to do next.
PASS, ARMED, WOKEN, POLL = "pass", "armed", "woken", "poll"


class WakeupListener(Listener):
    """The scheduler's listening connection (PostgreSQL), which holds the namespace's
    wake-up lock while the loop waits, and its busy lock while its passes create runs (the
    module's docstring tells the protocol). Both are session locks of this connection: when
    the connection goes, so do the locks.
    """

    def __init__(self, engine: Engine, dialect: Dialect, namespace: str, who: str) -> None:
        super().__init__(
            engine,
            dialect,
            namespace,
            ("listen", "listener_settings"),
            who,
            "polling meanwhile, it reconnects before the next pass",
            log,
        )
        #: The wake-up lock is held: producers notify.
        self.armed = False
        #: The busy lock is held (shared): other schedulers need not be woken.
        self.busy = False
        #: The session's lock_timeout is the long one (None: not set yet).
        self._long_timeout: bool | None = None
        #: The payloads of the notifications the last settle() was woken by ('queued' from
        #: producers, 'ended' from a capped consumer's run that ended).
        self.woken_by: set[str] = set()

    def _arm_waiting(self, long: bool) -> bool:
        """Wait for the wake-up lock, up to the session's lock_timeout (the short one first,
        the long one while producers keep it): True when taken."""
        if long != self._long_timeout:
            self.run("wakeup_lock_timeout_long" if long else "wakeup_lock_timeout_short")
            self._long_timeout = long
        try:
            self.run("wakeup_arm")
        except Exception as exc:
            if getattr(exc, "sqlstate", None) != _LOCK_TIMEOUT:
                raise
            return False
        return True

    def _disarm(self) -> None:
        if self.armed:
            self.run("wakeup_disarm")
            self.armed = False

    def _unmark(self) -> None:
        if self.busy:
            self.run("busy_unmark")
            self.busy = False

    def release(self) -> None:
        """Give both locks back (before a backoff: others take over meanwhile)."""
        self._disarm()
        self._unmark()

    def settle(self, productive: bool, timeout: float, stop: threading.Event) -> str:
        """What to do after a pass (``productive``: it created runs). Returns PASS (pass at
        once), ARMED (the wake-up lock was taken: pass once more, then producers notify),
        WOKEN (a notification came) or POLL (``timeout`` seconds went by, or ``stop`` was
        set).

        Busy (the pass created runs): hold the busy lock shared, so that other schedulers
        know somebody passes again, and give the wake-up lock back, so that producers stop
        notifying. Idle: give the busy lock back; keep waiting under the wake-up lock unless
        another scheduler became busy; otherwise see :meth:`_idle`.
        """
        self.woken_by = set()
        if productive:
            if not self.busy:  # tried again after every busy pass until it is held
                self.busy = self.ask("busy_mark")
            self._disarm()
            return PASS
        self._unmark()
        deadline = time.monotonic() + timeout
        if self.armed:
            # (A query each time also proves the connection is alive: a wait alone would
            # not notice a half-open one.)
            if not self.ask("busy_others"):
                return WOKEN if self.wait(timeout, stop) else POLL
            self._disarm()  # another scheduler is busy: it takes what comes
        return self._idle(deadline, stop)

    def _idle(self, deadline: float, stop: threading.Event) -> str:
        """Wait, with nothing to do, until ``deadline``; ARMED, WOKEN or POLL as for
        :meth:`settle`.

        Another scheduler is busy: it passes again and sees what producers commit, so wait
        (looking again every second). Another scheduler holds the wake-up lock: it is woken
        by notifications, and so is this one (its pass may find what the other's skipped),
        so wait. Nobody holds it: take it. Producers in flight hold it shared: wait for them
        with a queued request, which makes the next producers notify; that wait times out
        now and then (an ERROR line in the server's log each time: after 250 ms, then every
        2 s while a producer's transaction stays open), and a producer that starts its
        fan-out between two of those waits does not notify: its events wait for the next
        notification, the lock or the poll. No request is left queued otherwise, so the
        other schedulers' checks stay true.
        """
        long = False
        while not stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if self.ask("busy_others"):
                log.debug("assetq scheduler: another scheduler is busy; waiting for it")
                if self.wait(min(_RECHECK, remaining), stop):
                    return WOKEN
                continue
            taken = self.ask("wakeup_try")
            held = not taken and self.ask("wakeup_held_by_scheduler")
            if taken or (not held and self._arm_waiting(long)):
                self.armed = True
                if self.ask("busy_others"):  # became busy meanwhile: it takes what comes
                    self._disarm()
                    continue
                self._drain()  # from commits the pass that follows sees anyway
                return ARMED
            if held:
                log.debug("assetq scheduler: another scheduler waits for wake-ups")
                if self.wait(min(_RECHECK, remaining), stop):
                    return WOKEN
                continue
            long = True  # producers kept it
            if self._drain():
                return WOKEN
        return POLL

    def _drain(self) -> bool:
        """Read the notifications that arrived; True when there was one for schedulers."""
        woken = False
        for note in self.notifications(0):
            if note.payload != _RUNS:
                woken = True
                self.woken_by.add(note.payload)
        return woken

    def wait(self, timeout: float, stop: threading.Event) -> bool:
        """Wait up to ``timeout`` seconds for a notification; True when one came. Returns
        early (False) when ``stop`` is set."""
        deadline = time.monotonic() + timeout
        while not stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            woken = False
            for note in self.notifications(min(remaining, STOP_CHECK), stop_after=1):
                woken = note.payload != _RUNS
                if woken:
                    self.woken_by.add(note.payload)
            if woken:
                self._drain()  # others that arrived meanwhile are for the same pass
                return True
        return False

    def head_start(self, seconds: float, stop: threading.Event) -> bool:
        """After a wake-up by producers alone ('queued'), while a worker listens: wait
        ``seconds`` before the pass (or less: ``stop``), so that listening workers make and
        claim their consumers' runs themselves, one hop from the producers' commit, without
        this pass taking their consumers first; what arrives meanwhile is for that pass. A
        run that ended ('ended') is passed at once. True when it waited."""
        if not seconds or self.woken_by != {"queued"} or not self.ask("workers_listening"):
            return False
        log.debug(
            "assetq scheduler: woken by producers, a worker listens: a head start of %g s", seconds
        )
        stop.wait(seconds)
        self._drain()
        return True

    def close(self) -> None:
        self.armed = self.busy = False  # session locks: they go with the connection
        self._long_timeout = None
        super().close()


class _Round:
    """Makes the loop reach every ready consumer (I10) without waiting for the poll.

    A pass examines at most ``limit`` consumers, least recently examined first. Consumers at
    their cap or whose condition is not met yet may fill that window, and the pass creates
    nothing while a ready consumer waits further on. So a round starts, on the database's
    clock, before the first pass after a productive one; after a pass that created nothing,
    the loop passes again at once while some unpaused consumer with queued events has not been
    examined since the round started, as long as each pass leaves fewer of them unexamined
    (consumers that another session keeps locked are not waited for).
    """

    def __init__(self, engine: Engine, dialect: Dialect, namespace: str) -> None:
        self._engine = engine
        self._dialect = dialect
        self._namespace = namespace
        self._since: Any = None
        self._behind: int | None = None

    def _scalar(self, query: str, params: dict[str, Any]) -> Any:
        with self._engine.connect() as conn:
            return self._dialect.execute(conn, query, self._namespace, params)[0][0]

    def start(self) -> None:
        if self._since is None:
            try:
                self._since = self._scalar("server_clock", {})
            except (SQLAlchemyError, OSError):
                self._since = None  # the pass reports the error

    def again(self) -> bool:
        """After a pass that created nothing: True to pass again at once."""
        if self._since is None:
            return False
        try:
            behind = int(self._scalar("unexamined_consumers", {"since": self._since}))
        except (SQLAlchemyError, OSError):
            behind = 0
        if behind and (self._behind is None or behind < self._behind):
            self._behind = behind
            return True
        self.reset()
        return False

    def reset(self) -> None:
        self._since = None
        self._behind = None


class _ErrorLog:
    """Logs each error once with its code, not once per retry, and the recovery."""

    def __init__(self, who: str, logger: logging.Logger) -> None:
        self.failures = 0
        self._last: tuple[str, str | None, str] | None = None
        self._who = who
        self._log = logger

    def failed(self, exc: BaseException, delay: float) -> None:
        self.failures += 1
        code = error_code(exc)
        key = (type(exc).__name__, code, _first_line(exc))
        if key != self._last:
            self._last = key
            log_retried(
                self._log,
                exc,
                "%s: pass failed: %s%s [%s] %s; retrying with backoff (first in"
                " %.2f s); the same error is not logged again until a pass succeeds",
                self._who,
                "lost the connection to the database: " if connection_lost(exc) else "",
                key[0],
                code or "no code",
                key[2],
                delay,
            )
        else:
            self._log.debug(
                "%s: pass failed again (%d in a row), next in %.1f s",
                self._who,
                self.failures,
                delay,
                exc_info=exc,
            )

    def succeeded(self) -> None:
        if self.failures:
            self._log.info("%s: recovered after %d failed passes", self._who, self.failures)
        self.failures = 0
        self._last = None


def run_latencies(engine: Engine, namespace: str, runs: list[api.Run]) -> list[float | None]:
    """Per run, its created_at minus the timestamp of the oldest event it consumed, in
    seconds; None when that cannot be read (events purged meanwhile, a lost connection:
    metrics never fail a pass that committed)."""
    found: list[float | None] = []
    if not runs:
        return found
    try:
        with engine.connect() as conn:
            for run in runs:
                oldest = None
                after = None
                while True:  # by event id: the oldest timestamp may be on any page
                    page = api.consumed_events(
                        conn,
                        run.dag_id,
                        run.run_id,
                        limit=api.PAGE_MAX,
                        after=after,
                        namespace=namespace,
                    )
                    if page:
                        first = min(event.timestamp for event in page)
                        oldest = first if oldest is None else min(oldest, first)
                    if len(page) < api.PAGE_MAX:
                        break
                    after = page[-1]
                found.append(None if oldest is None else (run.created_at - oldest).total_seconds())
    except (errors.AssetqError, SQLAlchemyError, OSError):
        log.debug("assetq scheduler: could not read the runs' event timestamps", exc_info=True)
    return found + [None] * (len(runs) - len(found))


def log_created(logger: logging.Logger, loop: str, run: api.Run) -> None:
    """The INFO line of a run a pass of ``loop`` created, with its ``dag_id`` and ``run_id``
    as fields (sync and asyncio loops)."""
    logger.info(
        "%s: created run %s of %s consuming %d events%s",
        loop,
        run.run_id,
        run.dag_id,
        len(run.event_ids),
        "" if run.partition_key is None else f" (partition {run.partition_key!r})",
        extra=run_fields(run),
    )


def check_head_start(value: object) -> float:
    """``worker_head_start`` of both loops: 0 to 10 seconds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 10:
        raise errors.InvalidArgument(f"worker_head_start must be 0 to 10 seconds, got {value!r}")
    return float(value)


class SchedulerLoop:
    """The scheduler loop's decisions, for both shells (:mod:`assetq.loops`): the arguments
    of :func:`run_scheduler` checked once, and :meth:`steps`, the loop itself. ``stopped``
    says whether the caller's stop event is set; ``thread_stop`` is the threading.Event the
    listener's waits look at (the stop event itself in the sync shell)."""

    def __init__(
        self,
        engine: Engine,
        options: Mapping[str, Any],
        who: str,
        logger: logging.Logger,
        stopped: Callable[[], bool],
        thread_stop: threading.Event,
    ) -> None:
        """``options``: the keyword arguments of either shell's run_scheduler, by name (the
        asyncio one has no ``summary_interval``: it logs no summary); ``who`` and ``logger``:
        the shell's name and logger; ``stopped``: whether the caller's stop is set."""
        listen_engine: Engine | None = options["listen_engine"]
        summary_interval: float | None = options.get("summary_interval")
        limit: int = options["limit"]
        max_attempts: int = options["max_attempts"]
        max_passes: int | None = options["max_passes"]
        check_int(limit, "limit", 1, 1_000_000)
        check_int(max_attempts, "max_attempts", 1, 100)
        if max_passes is not None:
            check_int(max_passes, "max_passes", 0, 2**62)
        self.poll = seconds(options["poll_interval"], "poll_interval")
        self.summary = (
            None if summary_interval is None else seconds(summary_interval, "summary_interval")
        )
        self.backoff_initial = seconds(options["backoff_initial"], "backoff_initial")
        self.backoff_max = seconds(options["backoff_max"], "backoff_max")
        self.head_start = check_head_start(options["worker_head_start"])
        self.namespace = check_namespace(options["namespace"])
        # From the engine, without connecting: a database that is down at start is an error
        # the loop backs off from, like any other.
        self.dialect = dialect_of(engine)
        if listen_engine is not None and dialect_of(listen_engine) is not self.dialect:
            raise errors.InvalidArgument("listen_engine must reach the same engine kind as engine")
        self.engine = engine
        self.who = who
        self.log = logger
        self.stopped = stopped
        self.thread_stop = thread_stop
        self.limit = limit
        self.max_passes = max_passes
        self.max_attempts = max_attempts
        self.on_run: Callable[[api.Run], None] | None = options["on_run"]
        self.on_pass: Callable[[list[api.Run]], None] | None = options["on_pass"]
        self.metrics: Metrics | None = options["metrics"]
        self.listener = (
            WakeupListener(listen_engine or engine, self.dialect, self.namespace, who)
            if options["listen"] and self.dialect.supports_notify
            else None
        )
        self.alive = Liveness(
            engine,
            self.namespace,
            "scheduler",
            check_interval(options["liveness_interval"]),
            shown_interval=self.poll,
        )
        self.stats = SchedulerStats()

    def _done(self) -> bool:
        return self.stopped() or (
            self.max_passes is not None and self.stats.passes >= self.max_passes
        )

    def steps(self) -> Steps[SchedulerStats]:
        """The loop: passes until stopped, as steps for a shell to take."""
        stats, listener, poll = self.stats, self.listener, self.poll
        window = SchedulerStats()
        rounds = _Round(self.engine, self.dialect, self.namespace)
        error_log = _ErrorLog(self.who, self.log)
        started = last_summary = time.monotonic()
        self.log.info(
            "%s: started on namespace %s (%s, limit %d, %s)",
            self.who,
            self.namespace,
            self.dialect.name,
            self.limit,
            f"woken by NOTIFY, polling every {poll:g} s"
            if listener is not None
            else f"polling every {poll:g} s",
        )
        try:
            yield Call(self.alive.beat_if_due)
            while not self._done():
                yield Call(self.alive.beat_if_due)  # between passes, in a transaction of its own
                if listener is not None and not listener.connected:
                    try:
                        # Before the pass: nothing committed after it is missed.
                        yield Blocking(listener.connect)
                    except Exception as exc:  # psycopg's own errors, not SQLAlchemy's
                        listener.lost(exc)
                    if listener.pooled is not None:
                        pooled_warning(self.who, listener.pooled, poll)
                        listener = None

                stats.passes += 1
                window.passes += 1
                yield Call(rounds.start)
                pass_started = time.monotonic()
                try:
                    runs: list[api.Run] = yield Retried(
                        api.schedule,
                        (self.engine,),
                        {
                            "limit": self.limit,
                            "namespace": self.namespace,
                            "max_attempts": self.max_attempts,
                        },
                        what="scheduler pass",
                    )
                except (errors.AssetqError, SQLAlchemyError, OSError) as exc:
                    stats.errors += 1
                    window.errors += 1
                    if self.metrics is not None:
                        self.metrics.scheduler_pass_failed(
                            time.monotonic() - pass_started, error_code(exc)
                        )
                    if listener is not None and listener.connected:
                        try:
                            yield Blocking(listener.release)  # others take over meanwhile
                        except Exception as lost:
                            listener.lost(lost)
                    delay = backoff(error_log.failures, self.backoff_initial, self.backoff_max)
                    error_log.failed(exc, delay)
                    yield Sleep(delay)
                    continue
                error_log.succeeded()
                yield from self._created(runs, time.monotonic() - pass_started, window)

                now = time.monotonic()
                if self.summary is not None and now - last_summary >= self.summary:
                    self.log.info(
                        "%s: %d passes, %d runs, %d events consumed, %d errors,"
                        " %d wake-ups in the last %.0f s",
                        self.who,
                        window.passes,
                        window.runs,
                        window.events,
                        window.errors,
                        window.wakeups,
                        now - last_summary,
                    )
                    window = SchedulerStats()
                    last_summary = now

                if self._done():
                    continue
                if runs:
                    rounds.reset()
                elif (yield Call(rounds.again)):
                    continue  # a ready consumer may be waiting outside this pass's window
                if listener is not None and listener.connected:
                    outcome = yield from self._settle(listener, bool(runs), window)
                    if self.metrics is not None and not self.stopped() and outcome in (WOKEN, POLL):
                        self.metrics.scheduler_wait("woken" if outcome == WOKEN else "polled")
                elif not runs and not (yield Sleep(poll)) and self.metrics is not None:
                    self.metrics.scheduler_wait("polled")
                else:
                    yield Sleep(0)  # a turn for whatever else runs beside the loop
        finally:
            if listener is not None:
                yield Blocking(listener.close)
            yield Call(self.alive.gone)
            self.log.info(
                "%s: stopped after %d passes, %d runs, %d events, %d errors in %.0f s",
                self.who,
                stats.passes,
                stats.runs,
                stats.events,
                stats.errors,
                time.monotonic() - started,
            )
        return stats

    def _created(self, runs: list[api.Run], took: float, window: SchedulerStats) -> Steps[None]:
        """Tell the metrics, the log and the callbacks of a pass's ``runs``."""
        if self.metrics is not None:
            self.metrics.scheduler_pass(took, len(runs), sum(len(run.event_ids) for run in runs))
            latencies = yield Call(run_latencies, (self.engine, self.namespace, runs))
            for run, latency in zip(runs, latencies, strict=True):
                self.metrics.run_created(run, latency)
        for run in runs:
            log_created(self.log, self.who, run)
            for counts in (self.stats, window):
                counts.runs += 1
                counts.events += len(run.event_ids)
            if self.on_run is not None:
                self.on_run(run)
        if self.on_pass is not None:
            self.on_pass(runs)

    def _settle(
        self, listener: WakeupListener, productive: bool, window: SchedulerStats
    ) -> Steps[str]:
        """After a pass, on the listening connection: what comes next (PASS, ARMED, WOKEN or
        POLL), waiting for it (WakeupListener.settle), and the head start after a wake-up."""
        try:
            outcome: str = yield Blocking(
                listener.settle, (productive, self.poll, self.thread_stop)
            )
        except Exception as exc:  # the connection broke, and its locks with it
            listener.lost(exc)
            outcome = PASS
            if not productive and not (yield Sleep(self.poll)):  # poll; reconnect after that
                outcome = POLL
        if outcome == WOKEN:
            self.stats.wakeups += 1
            window.wakeups += 1
            try:
                if (yield Blocking(listener.head_start, (self.head_start, self.thread_stop))):
                    self.stats.head_starts += 1
                    window.head_starts += 1
            except Exception as exc:  # the connection broke: poll until it is back
                listener.lost(exc)
        elif outcome == ARMED:  # one more pass, now that producers notify
            self.stats.arms += 1
            window.arms += 1
        return outcome


def run_scheduler(
    engine: Engine,
    *,
    namespace: str = DEFAULT_NAMESPACE,
    limit: int = 100,
    poll_interval: float = 5.0,
    stop_event: threading.Event | None = None,
    on_run: Callable[[api.Run], None] | None = None,
    on_pass: Callable[[list[api.Run]], None] | None = None,
    max_passes: int | None = None,
    listen: bool = True,
    listen_engine: Engine | None = None,
    summary_interval: float = 60.0,
    backoff_initial: float = 0.5,
    backoff_max: float = 30.0,
    max_attempts: int = 8,
    metrics: Metrics | None = None,
    liveness_interval: float | None = DEFAULT_INTERVAL,
    worker_head_start: float = WORKER_HEAD_START,
) -> SchedulerStats:
    """Run scheduler passes until ``stop_event`` is set (or ``max_passes`` passes were made)
    and return what was done.

    Each pass is :func:`assetq.schedule` over at most ``limit`` consumers. After a pass that
    created runs the next one starts at once; otherwise the loop waits ``poll_interval``
    seconds, or less when woken: on PostgreSQL (``listen=True``) a producer that queues
    events while the schedulers have nothing to do notifies at commit, which starts the next
    pass at once (the module's docstring tells how). Safe to run in any number of threads
    and processes at once, like :func:`assetq.schedule`.

    ``listen_engine``: where the listening connection comes from (default ``engine``). Its
    LISTEN and wake-up locks are session state: when ``engine`` goes through a pooler in
    transaction mode (PgBouncer), give a direct connection to the server here. A listening
    connection that turns out not to hold one server session is closed before anything is
    set on it, and the loop polls, with one warning (docs/deployment.md).

    ``worker_head_start`` (PostgreSQL): woken by producers while a worker listens on the
    namespace, the loop waits that many seconds (default 0.02) before its pass: a listening
    worker makes and claims its own consumers' runs in one step
    (:func:`assetq.claim_runs` with ``schedule=True``), and the pass, which would otherwise
    take those consumers at the same moment, then makes only the runs no worker took
    (consumers no worker runs get theirs that much later). 0: no head start. A wake-up by a
    capped consumer's run that ended is passed at once.

    ``max_attempts``: each pass's own retries of a transient error (deadlock, lost
    connection), as :func:`assetq.schedule` takes them; schedulers on several Galera nodes,
    whose certification conflicts come as deadlocks, want more (docs/deployment.md).

    ``on_run`` is called with each run created, after its pass committed; ``on_pass`` with
    the list of runs of each successful pass. An exception they raise ends the loop and
    propagates (the runs are committed already). Any other error is logged once with its
    code and retried after a backoff that doubles from ``backoff_initial`` up to
    ``backoff_max`` seconds. The stop event is looked at between passes: a pass in progress
    always finishes. A summary (passes, runs, events, errors) is logged every
    ``summary_interval`` seconds at INFO level, each run created at INFO level too.

    ``metrics``: an :class:`assetq.Metrics` told of each pass (its duration, runs, events),
    each failed pass, each run created with its event->run latency, and how each idle wait
    ended (woken or polled); see docs/python.md.

    ``liveness_interval``: the loop records itself in the liveness table
    (``assetq status`` shows it) at start and then at most every that many
    seconds, between passes, each time in a short transaction of its own; a clean stop
    deletes its row. The row's interval is the longer of this and ``poll_interval`` (the
    longest the loop may go between two looks), and status calls it stale after three of
    them. A failed heartbeat is one WARNING and never stops the loop. None: no row.
    """
    options = dict(locals())  # checked by SchedulerLoop
    engine = engine_of(engine, "run_scheduler")
    if listen_engine is not None:
        options["listen_engine"] = engine_of(listen_engine, "run_scheduler")
    stop = stop_event if stop_event is not None else threading.Event()
    loop = SchedulerLoop(engine, options, "assetq scheduler", log, stop.is_set, stop)

    def take(step: Step) -> Any:
        if isinstance(step, Call):
            return take_call(step)
        return stop.wait(step.seconds) if step.seconds else stop.is_set()

    return drive(loop.steps(), take)
