"""The core both shells of the loops drive (assetq.loops), without a database: a generator of
steps behaves the same whether the sync or the async shell takes its steps, and the slots'
wake-up reaches a waiting thread and a waiting task alike, from another thread."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from assetq import loops

#: A hang guard only.
_GUARD = 30


def _steps(log: list[str]) -> loops.Steps[str]:
    """Two calls, the second failing: its exception is the generator's to handle."""
    first = yield loops.Call(str.upper, ("claim",))
    log.append(first)
    try:
        yield loops.Call(int, ("not a number",))
    except ValueError as exc:
        log.append(f"handled {type(exc).__name__}")
    stopped = yield loops.Sleep(0)
    log.append(f"stopped {stopped}")
    return "done"


def _sync_take(step: Any) -> Any:
    if isinstance(step, loops.Call):
        return loops.take_call(step)
    return False


async def _async_take(step: Any) -> Any:
    await asyncio.sleep(0)
    return _sync_take(step)


def test_both_shells_take_the_same_steps_and_throw_a_steps_error_into_the_generator() -> None:
    sync_log: list[str] = []
    async_log: list[str] = []
    assert loops.drive(_steps(sync_log), _sync_take) == "done"
    assert asyncio.run(loops.drive_async(_steps(async_log), _async_take)) == "done"
    assert sync_log == async_log == ["CLAIM", "handled ValueError", "stopped False"]


def test_an_error_the_generator_does_not_handle_ends_the_drive_after_its_finally() -> None:
    cleaned: list[str] = []

    def steps() -> loops.Steps[None]:
        try:
            yield loops.Call(int, ("x",))
        finally:
            cleaned.append((yield loops.Call(str, ("closed",))))

    with pytest.raises(ValueError):
        loops.drive(steps(), _sync_take)
    with pytest.raises(ValueError):
        asyncio.run(loops.drive_async(steps(), _async_take))
    assert cleaned == ["closed", "closed"]


def test_a_wake_up_from_another_thread_ends_a_threads_wait_and_a_tasks_wait() -> None:
    """Forced order: each waiter is waiting (its generation taken, parked) before the other
    thread wakes; the waits' own timeouts are a hang guard only."""
    wakeup = loops.Wakeup()
    never = threading.Event()
    generation = wakeup.generation
    waiting = threading.Event()
    result: list[bool] = []

    def waiter() -> None:
        waiting.set()
        result.append(wakeup.wait(generation, _GUARD, never))

    thread = threading.Thread(target=waiter)
    thread.start()
    assert waiting.wait(_GUARD)
    threading.Thread(target=wakeup.wake, kwargs={"queued": True}).start()
    thread.join(_GUARD)
    assert result == [True]
    assert wakeup.take_queued() and not wakeup.take_queued()

    async def task_waits() -> bool:
        generation = wakeup.generation
        waking = threading.Timer(0, wakeup.wake)
        loop_stop = asyncio.Event()

        async def wake_once_waiting() -> None:
            while not wakeup._tasks:  # parked: the wake comes from the thread after
                await asyncio.sleep(0)
            waking.start()

        helper = asyncio.ensure_future(wake_once_waiting())
        woken = await wakeup.wait_async(generation, _GUARD, loop_stop)
        await helper
        waking.join()
        return woken

    assert asyncio.run(task_waits())
