"""What the long-running loops of both shells share: one core, two shells.

The worker and scheduler loops (:mod:`assetq.worker`, :mod:`assetq.scheduler`) decide
everything in generators: what to claim, when to back off, when to heartbeat, when an
attempt is let go, what to log and count. A generator never does I/O itself: it yields a
step (:class:`Call`, :class:`Retried`, :class:`Blocking`, :class:`Sleep`, :class:`Idle`, or
a loop's own) and is sent back the step's result, or has the step's exception thrown into
it. The sync shell (:func:`drive`) takes the steps in the calling thread; the asyncio shell
(:mod:`assetq.aio`, :func:`drive_async`) awaits them: database calls in SQLAlchemy's
greenlet bridge, blocking waits in a thread, sleeps as ``asyncio`` waits. So the loops are
written once, and each shell only executes and waits.

Also here, shared by both shells: the worker slots' wake-up (:class:`Wakeup`), the loops'
backoff (:func:`backoff`), and how an error is named in a log line or a metric.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
import traceback
from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeAlias, TypeVar

from sqlalchemy.exc import DBAPIError

from . import errors

_T = TypeVar("_T")

#: Longest stretch a loop's wait goes without looking at its stop event, seconds.
STOP_CHECK = 0.25


def backoff(failures: int, initial: float, cap: float) -> float:
    """Seconds a loop waits after ``failures`` failures in a row (0 for the first): from
    ``initial`` doubling up to ``cap``, times a jitter of 0.5 to 1, so that loops that failed
    together spread out."""
    return float(min(cap, initial * 2 ** min(failures, 30)) * random.uniform(0.5, 1.0))


def error_code(exc: BaseException) -> str | None:
    """The database's code of ``exc`` (assetq's, the SQLSTATE, MySQL's number), for metrics
    and log lines."""
    if isinstance(exc, errors.AssetqError):
        return exc.code
    if isinstance(exc, DBAPIError):
        orig = exc.orig
        sqlstate = getattr(orig, "sqlstate", None)
        if isinstance(sqlstate, str):
            return sqlstate
        args = getattr(orig, "args", ())
        if args and isinstance(args[0], int):
            return str(args[0])
    return None


def error_text(exc: BaseException) -> str:
    """What a failed attempt records: the exception and the last frames of its traceback."""
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-8)
    return "".join(lines).strip()


# -- steps -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """A short database call, ``function(*args, **kwargs)`` on sync engines and connections:
    the async shell makes it in SQLAlchemy's greenlet bridge (its I/O awaited on the loop)."""

    function: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Retried(Call):
    """A call that retries transient errors itself, ``max_attempts`` among its keyword
    arguments (:func:`assetq.schedule`, :func:`assetq.claim_runs`): the async shell makes
    each attempt alone in the bridge and awaits the backoff between them
    (:func:`assetq.aio.schedule`), so that the loop is never held by a sleep. ``what``
    names it in the retry's log line."""

    what: str = "call"


@dataclass(frozen=True)
class Blocking(Call):
    """A call that waits (the listening connection's): the async shell makes it in a thread."""


#: What a :class:`Sleep` ends early on: the caller's stop, the loop's own quit (set once
#: nothing new is claimed), or nothing.
STOP, QUIT, NOTHING = "stop", "quit", "nothing"


@dataclass(frozen=True)
class Sleep:
    """Wait ``seconds``, or less when ``until`` (STOP, QUIT) is set; the result: whether it
    was."""

    seconds: float
    until: str = STOP


@dataclass(frozen=True)
class Idle:
    """An idle worker slot's wait (:meth:`Wakeup.wait`): up to ``seconds`` for a wake-up
    after ``generation``, or the stop; the result: whether a wake-up came."""

    generation: int
    seconds: float


Step: TypeAlias = Any
Steps: TypeAlias = Generator[Step, Any, _T]


class _Driven(Generic[_T]):
    """A generator of steps, and what the last step gave it (a result, or an exception to
    throw into it)."""

    def __init__(self, steps: Steps[_T]) -> None:
        self._steps = steps
        self._result: Any = None
        self._error: BaseException | None = None
        self.value: Any = None

    def next(self) -> Step | None:
        """The next step, or None when the generator returned (its value: ``value``)."""
        try:
            if self._error is not None:
                error, self._error = self._error, None
                return self._steps.throw(error)
            return self._steps.send(self._result)
        except StopIteration as done:
            self.value = done.value
            return None

    def gave(self, result: Any = None, error: BaseException | None = None) -> None:
        self._result, self._error = result, error


def drive(steps: Steps[_T], take: Callable[[Step], Any]) -> _T:
    """The sync shell: take each step of ``steps`` in this thread; any exception a step
    raises is thrown into the generator, which decides."""
    driven = _Driven(steps)
    while (step := driven.next()) is not None:
        try:
            driven.gave(take(step))
        except BaseException as exc:
            driven.gave(error=exc)
    return driven.value  # type: ignore[no-any-return]


async def drive_async(steps: Steps[_T], take: Callable[[Step], Awaitable[Any]]) -> _T:
    """The async shell: await each step of ``steps``, as :func:`drive` takes them."""
    driven = _Driven(steps)
    while (step := driven.next()) is not None:
        try:
            driven.gave(await take(step))
        except BaseException as exc:  # CancelledError too: the generator's finally runs
            driven.gave(error=exc)
    return driven.value  # type: ignore[no-any-return]


def take_call(step: Call) -> Any:
    """The sync shell's :class:`Call`, :class:`Retried` and :class:`Blocking`: made here."""
    return step.function(*step.args, **step.kwargs)


# -- the worker slots' wake-up ------------------------------------------------------------------


class Wakeup:
    """Idle slots wait here; the listener (PostgreSQL) wakes them all when runs are created,
    and when a producer's events were queued (then the first slot to claim runs a pass of
    its own first: :meth:`take_queued`). Safe across threads: the listener wakes from its
    own thread, and slots wait as threads (:meth:`wait`) or as tasks (:meth:`wait_async`)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._generation = 0
        self._queued = False
        #: The callbacks of the tasks waiting (wait_async): each wakes its task's loop.
        self._tasks: set[Callable[[], None]] = set()

    @property
    def generation(self) -> int:
        with self._cond:
            return self._generation

    def wake(self, queued: bool = False) -> None:
        with self._cond:
            self._generation += 1
            self._queued = self._queued or queued
            self._cond.notify_all()
            tasks = list(self._tasks)
        for wake_task in tasks:
            wake_task()

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
                self._cond.wait(min(remaining, STOP_CHECK))
            return self._generation != generation

    async def wait_async(self, generation: int, timeout: float, stop: asyncio.Event) -> bool:
        """:meth:`wait` for a task: the event loop is never held."""
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()

        def wake_task() -> None:
            loop.call_soon_threadsafe(woken.set)

        with self._cond:
            if self._generation != generation:
                return True
            self._tasks.add(wake_task)
        waits = {asyncio.ensure_future(woken.wait()), asyncio.ensure_future(stop.wait())}
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
            with self._cond:
                self._tasks.discard(wake_task)
        return self.generation != generation


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for ``event``; True if it was set."""
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except asyncio.TimeoutError:
        return event.is_set()
    return True
