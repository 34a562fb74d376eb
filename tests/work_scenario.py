"""Small steps the worker-protocol specs share (test_work_queue.py, test_worker_loop.py,
test_work_history.py): runs to claim, the database's clock, waits with deadlines, a user
table a handler writes to, and a worker process to kill.

Every wait here has a deadline and fails the test when it passes: a deadlock or a lost
wake-up is a failure, never a hung CI job. Waits look at the database (its clock, a run's
row), never at a sleep: leases are on the database's clock.

Run as a script, this module is the worker *process* the kill -9 specs start
(``python work_scenario.py URL WORKER MODE ...``, see :func:`child_main`). That side imports
only assetq and SQLAlchemy.
"""

from __future__ import annotations

import contextlib
import json
import math
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa

import assetq

if TYPE_CHECKING:
    from dbs import TestDatabase

T = TypeVar("T")

#: The statements of these specs that differ between the engines, by name (as dbs.ENGINE_SQL).
WORK_SQL: dict[str, dict[str, str]] = {
    "postgresql": {
        # the database's current time: leases and retry delays are on this clock
        "now": "SELECT clock_timestamp()",
        # end a lease a second ago, as if its holder had stopped renewing it long enough
        "expire_lease": "UPDATE {ns}.dag_run SET lease_until = clock_timestamp() - interval '1'"
        " second, not_before = clock_timestamp() - interval '1' second WHERE id = :id",
    },
    "mysql": {
        "now": "SELECT UTC_TIMESTAMP(6)",
        "expire_lease": "UPDATE {ns}.dag_run SET lease_until = UTC_TIMESTAMP(6) - INTERVAL 1"
        " SECOND, not_before = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE id = :id",
    },
}

#: The user table a handler writes to: the "effect" of a run, committed with its success.
EFFECT_TABLE = "work_effect"
_CREATE_EFFECT = (
    f"CREATE TABLE {EFFECT_TABLE} (dag_id varchar(250) NOT NULL, run_id varchar(250) NOT NULL,"
    " attempt integer NOT NULL, worker varchar(250) NOT NULL)"
)
_INSERT_EFFECT = sa.text(
    f"INSERT INTO {EFFECT_TABLE} (dag_id, run_id, attempt, worker)"
    " VALUES (:dag_id, :run_id, :attempt, :worker)"
)

#: The default deadline of a wait, seconds: far above what any wait here takes when it works.
DEADLINE = 30.0


def utc(value: datetime) -> datetime:
    """A timestamp as the engines return it, as an aware UTC datetime (MySQL's are naive)."""
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value


def db_now(db: TestDatabase) -> datetime:
    """The database's clock, now."""
    return utc(db.scalar(WORK_SQL[db.engine_name]["now"]))


def expire_lease(db: TestDatabase, run_pk: int) -> None:
    """End the lease of run ``run_pk`` (its id) a second ago, by writing the row: for a
    holder that keeps renewing it (run_worker's heartbeat) while the test needs it lost."""
    db.execute(WORK_SQL[db.engine_name]["expire_lease"], id=run_pk)


def wait_for(
    what: str, probe: Callable[[], T | None], *, deadline: float = DEADLINE, every: float = 0.05
) -> T:
    """Call ``probe`` until it returns something other than None or False, and return that;
    fail the test when ``deadline`` seconds pass first."""
    end = time.monotonic() + deadline
    while True:
        found = probe()
        if found is not None and found is not False:
            return found
        if time.monotonic() > end:
            raise AssertionError(f"gave up after {deadline:g} s waiting for {what}")
        time.sleep(every)


def wait_past(db: TestDatabase, moment: datetime, *, deadline: float = DEADLINE) -> datetime:
    """Wait until the database's clock is past ``moment`` (a lease's end); return its time."""
    return wait_for(
        f"the database clock to pass {moment.isoformat()}",
        lambda: now if (now := db_now(db)) > moment else None,
        deadline=deadline,
    )


def tuples(db: TestDatabase, statement: str, **params: Any) -> list[tuple[Any, ...]]:
    """``db.rows`` as plain tuples."""
    return [tuple(row) for row in db.rows(statement, **params)]


def declare(db: TestDatabase, dag_id: str, condition: Any, **options: Any) -> None:
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, dag_id, condition, **options)


def register(db: TestDatabase, *assets: str) -> list[assetq.Event]:
    with db.engine.begin() as conn:
        return [assetq.register_event(conn, a) for a in assets]


def make_runs(
    db: TestDatabase, count: int, *, prefix: str = "job", asset: str = "orders", **options: Any
) -> list[assetq.Run]:
    """``count`` queued runs, one of each of consumers ``<prefix>_000`` ... scheduled on
    ``asset``, made by one event and one pass; returned oldest (lowest id) first."""
    with db.engine.begin() as conn:
        for n in range(count):
            assetq.declare_dag(conn, f"{prefix}_{n:03d}", asset, **options)
    register(db, asset)
    runs = assetq.schedule(db.engine, limit=max(count, 1))
    assert len(runs) == count
    return sorted(runs, key=lambda r: r.id)


def one_run(
    db: TestDatabase, dag_id: str = "report", asset: str = "orders", **options: Any
) -> assetq.Run:
    """Consumer ``dag_id`` on ``asset`` and one queued run of it."""
    declare(db, dag_id, asset, **options)
    register(db, asset)
    (run,) = assetq.schedule(db.engine)
    return run


def next_run(db: TestDatabase, dag_id: str, asset: str = "orders") -> assetq.Run | None:
    """Register one more event for ``asset`` and pass: the run it makes for ``dag_id``."""
    register(db, asset)
    return next((r for r in assetq.schedule(db.engine) if r.dag_id == dag_id), None)


def run_row(db: TestDatabase, dag_id: str, run_id: str) -> dict[str, Any]:
    """The run's row as stored, timestamps as aware UTC datetimes."""
    (row,) = db.rows(
        "SELECT state, attempt, worker, lease_until, not_before, error, started_at, ended_at,"
        " updated_at FROM {ns}.dag_run WHERE dag_id = :d AND run_id = :r",
        d=dag_id,
        r=run_id,
    )
    found = dict(row._mapping)
    for key, value in found.items():
        if isinstance(value, datetime):
            found[key] = utc(value)
    return found


def run_events(db: TestDatabase, dag_id: str, run_id: str) -> tuple[int, ...]:
    """The event ids linked to the run, from the link table itself."""
    return tuple(
        int(r[0])
        for r in db.rows(
            "SELECT l.asset_event_id FROM {ns}.dagrun_asset_event l"
            " JOIN {ns}.dag_run r ON r.id = l.dag_run_id"
            " WHERE r.dag_id = :d AND r.run_id = :r ORDER BY 1",
            d=dag_id,
            r=run_id,
        )
    )


def create_effect_table(db: TestDatabase) -> None:
    """The user's own table, in the application's schema (not assetq's namespace)."""
    db.execute(_CREATE_EFFECT)


def write_effect(conn: sa.Connection, claim: assetq.Claim) -> None:
    """What a handler does: one row of the user's table, in the caller's transaction."""
    conn.execute(
        _INSERT_EFFECT,
        {
            "dag_id": claim.dag_id,
            "run_id": claim.run_id,
            "attempt": claim.attempt,
            "worker": claim.worker,
        },
    )


def effects(db: TestDatabase) -> list[tuple[str, str, int, str]]:
    """Every committed effect row: (dag_id, run_id, attempt, worker), sorted."""
    return sorted(
        (str(r[0]), str(r[1]), int(r[2]), str(r[3]))
        for r in tuples(db, f"SELECT dag_id, run_id, attempt, worker FROM {EFFECT_TABLE}")
    )


def events_from(db: TestDatabase, dag_id: str, run_id: str) -> list[int]:
    """Ids of the events whose source is the run (its output events)."""
    return [
        int(r[0])
        for r in db.rows(
            "SELECT id FROM {ns}.asset_event WHERE source_dag_id = :d AND source_run_id = :r"
            " ORDER BY id",
            d=dag_id,
            r=run_id,
        )
    ]


def claim_until(
    db: TestDatabase,
    worker: str,
    *,
    engine: sa.Engine | None = None,
    deadline: float = DEADLINE,
    **options: Any,
) -> list[assetq.Claim]:
    """Claim (``claim_runs(..., **options)``) until something is claimed; fail after
    ``deadline`` seconds. For runs that become claimable later: an expired lease, a retry
    delay, a killed holder's lock."""
    target = db.engine if engine is None else engine
    return wait_for(
        f"a claim by {worker}",
        lambda: assetq.claim_runs(target, worker, **options) or None,
        deadline=deadline,
        every=0.1,
    )


class Statements:
    """Counts the statements an engine sends while it is active: the proof that a refused
    call sent nothing."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self.sent: list[str] = []

    def _count(self, *args: Any) -> None:
        self.sent.append(str(args[2]))

    @contextlib.contextmanager
    def watching(self) -> Iterator[list[str]]:
        sa.event.listen(self.engine, "before_cursor_execute", self._count)
        try:
            yield self.sent
        finally:
            sa.event.remove(self.engine, "before_cursor_execute", self._count)


def join_all(threads: Sequence[threading.Thread], deadline: float = 120.0) -> None:
    """Join every thread; fail if any is still alive after ``deadline`` seconds in all."""
    end = time.monotonic() + deadline
    for thread in threads:
        thread.join(max(0.0, end - time.monotonic()))
    alive = [t.name for t in threads if t.is_alive()]
    assert not alive, f"threads still running after {deadline:g} s (a deadlock?): {alive}"


# -- the worker process ---------------------------------------------------------------------

#: Modes of the worker process.
#:   hold            claim, write the effect rows in an open transaction, say HOLDING, block
#:   hold_completed  the same, and complete the runs as success (with an output event) in
#:                   that transaction, uncommitted, before saying HOLDING: killed mid-commit
#:   zombie          claim, write, say HOLDING, then on a line "go" on stdin complete the runs
#:                   as success (output event ``OUTPUT_ASSET``) and commit, or roll back on
#:                   LeaseLost; say DONE with what happened
CHILD_MODES = ("hold", "hold_completed", "zombie")
#: The asset of the output event a worker process's completion produces.
OUTPUT_ASSET = "child_output"


def child_main(argv: Sequence[str]) -> int:
    url, worker, mode, limit, lease, dag_ids = argv
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    claims = assetq.claim_runs(
        engine, worker, limit=int(limit), lease=float(lease), dag_ids=json.loads(dag_ids)
    )
    conn = engine.connect()
    conn.begin()
    for claim in claims:
        write_effect(conn, claim)
        if mode == "hold_completed":
            assetq.complete_run(conn, claim, "success", events=[assetq.NewEvent(OUTPUT_ASSET)])
    held = [
        {
            "dag_id": c.dag_id,
            "run_id": c.run_id,
            "attempt": c.attempt,
            "event_ids": list(c.event_ids),
            "lease_until": c.lease_until.isoformat() if c.lease_until else None,
        }
        for c in claims
    ]
    print("HOLDING " + json.dumps(held), flush=True)
    line = sys.stdin.readline()  # blocks: the parent kills us, or says "go" to a zombie
    if mode != "zombie" or line.strip() != "go":
        conn.rollback()
        return 0
    outcome = "committed"
    try:
        for claim in claims:
            assetq.complete_run(conn, claim, "success", events=[assetq.NewEvent(OUTPUT_ASSET)])
        conn.commit()
    except assetq.LeaseLost as exc:
        conn.rollback()  # PostgreSQL aborted the transaction; on MySQL our row is in it
        outcome = f"lease_lost {exc.code}"
    print(f"DONE {outcome}", flush=True)
    conn.close()
    engine.dispose()
    return 0


@dataclass
class Held:
    """A run as the worker process said it holds it."""

    dag_id: str
    run_id: str
    attempt: int
    event_ids: tuple[int, ...]
    lease_until: datetime


class WorkerProcess:
    """A real worker process (``sys.executable`` running this module) that claims runs
    through assetq and holds them; killed with SIGKILL or told to complete late."""

    def __init__(
        self,
        db: TestDatabase,
        worker: str,
        mode: str,
        *,
        limit: int = 1,
        lease: float = 1.0,
        dag_ids: Sequence[str] | None = None,
    ) -> None:
        assert mode in CHILD_MODES
        url = db.url.render_as_string(hide_password=False)
        args = [url, worker, mode, str(limit), str(lease), json.dumps(dag_ids)]
        self.worker = worker
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        self._stderr.extend(self.process.stderr)

    def expect(self, prefix: str, deadline: float = DEADLINE) -> str:
        """The rest of the next line, which must start with ``prefix``; fail on a deadline,
        an exit, or any other line."""
        try:
            line = self._lines.get(timeout=deadline)
        except queue.Empty:
            raise AssertionError(
                f"worker {self.worker} said nothing for {deadline:g} s; stderr: {self.stderr}"
            ) from None
        if line is None or not line.startswith(prefix + " "):
            self.process.wait(timeout=DEADLINE)
            raise AssertionError(
                f"worker {self.worker} said {line!r}, not {prefix}; stderr: {self.stderr}"
            )
        return line[len(prefix) + 1 :]

    @property
    def stderr(self) -> str:
        return "".join(self._stderr)[-3000:]

    def holding(self, deadline: float = DEADLINE) -> list[Held]:
        """Wait for the HOLDING line: the claims the process holds."""
        return [
            Held(
                dag_id=h["dag_id"],
                run_id=h["run_id"],
                attempt=int(h["attempt"]),
                event_ids=tuple(h["event_ids"]),
                lease_until=datetime.fromisoformat(h["lease_until"]),
            )
            for h in json.loads(self.expect("HOLDING", deadline))
        ]

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def kill9(self) -> None:
        """SIGKILL: no cleanup, no rollback from the client, no goodbye to the server."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=DEADLINE)
        assert self.process.returncode == -signal.SIGKILL

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=DEADLINE)
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


def seconds_between(later: datetime, earlier: datetime) -> float:
    return (later - earlier) / timedelta(seconds=1)


def close_to(value: float, expected: float, tolerance: float) -> bool:
    return math.isfinite(value) and abs(value - expected) <= tolerance


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
