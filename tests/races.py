"""What the forced-interleaving tests share: how to see that another transaction waits for
a lock, and how to run the other side of a race on a thread of its own
(tests/test_semantics_lifecycle.py, test_link_integrity.py, test_queue_integrity.py,
test_work_outputs.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dbs import TestDatabase

#: Sessions of this database waiting for a lock: how a forced interleaving knows its second
#: transaction has reached the first one's lock. Only ever waited on with a timeout.
LOCK_WAITS = {
    "postgresql": "SELECT count(*) FROM pg_stat_activity"
    " WHERE datname = current_database() AND wait_event_type = 'Lock'",
    "mysql": "SELECT count(*) FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT'",
}

#: Seconds between two looks. InnoDB refreshes what INNODB_TRX shows only when it was not
#: read for 0.1 s: polled faster, it never shows the wait.
LOCK_WAIT_POLL = {"postgresql": 0.005, "mysql": 0.15}


@dataclass
class Outcome:
    """What a thread's action returned or raised (raised: handed to the test thread)."""

    value: Any = None
    error: BaseException | None = None


def in_thread(action: Callable[[], Any]) -> tuple[threading.Thread, Outcome]:
    """``action`` started on a daemon thread; its Outcome is filled when it ends."""
    outcome = Outcome()

    def run() -> None:
        try:
            outcome.value = action()
        except BaseException as exc:  # handed to the test thread
            outcome.error = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def blocked_or_done(db: TestDatabase, thread: threading.Thread, timeout: float = 10) -> str:
    """Wait until the other transaction, run by ``thread``, either waits for a lock (on the
    transaction the test holds open) or has finished without waiting: the interleaving is
    then fixed. Returns which ("blocked", "done"; "timeout" past ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not thread.is_alive():
            return "done"
        if db.scalar(LOCK_WAITS[db.engine_name]):
            return "blocked"
        time.sleep(LOCK_WAIT_POLL[db.engine_name])
    return "timeout"
