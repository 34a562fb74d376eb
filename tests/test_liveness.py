"""Liveness (issue 15 item 5, since development revision 0010_liveness): every scheduler and
worker loop keeps a row in process_liveness, refreshed at most every liveness_interval seconds
in a transaction of its own; a clean stop deletes it; a killed process leaves it, and status
shows it as stale once it is three intervals old; doctor notes it and purge removes it.
Schedulers and workers may heartbeat through their grants; producers may not.

Intervals here are tens of milliseconds, so waits are short polls, not sleeps of seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, TypeVar

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine
from sqlalchemy.pool import NullPool

import assetq
from assetq import aio, cli, liveness, ops
from dbs import TestDatabase, made_logins

_T = TypeVar("_T")

#: Intervals of the loops under test, seconds.
_BEAT = 0.05


def _until(what: str, probe: Callable[[], _T | None], timeout: float = 20.0) -> _T:
    """Poll ``probe`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _rows(db: TestDatabase) -> list[ops.ProcessStatus]:
    with db.engine.connect() as conn:
        return assetq.processes(conn, namespace=db.namespace)


def _cli(db: TestDatabase, *args: str) -> str:
    url = db.url.render_as_string(hide_password=False)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["--url", url, "--namespace", db.namespace, *args])
    assert code == 0, out.getvalue()
    return out.getvalue()


@contextlib.contextmanager
def _running(target: Callable[[], Any]) -> Iterator[threading.Thread]:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        thread.join(timeout=30)
        assert not thread.is_alive()


# -- the loops write, refresh and remove their rows -------------------------------------------


def test_the_scheduler_loop_records_itself_refreshes_the_row_and_removes_it_at_a_clean_stop(
    db: TestDatabase,
) -> None:
    stop = threading.Event()

    def run() -> None:
        assetq.run_scheduler(
            db.engine,
            namespace=db.namespace,
            poll_interval=_BEAT,
            liveness_interval=_BEAT,
            stop_event=stop,
        )

    with _running(run):
        first = _until("the scheduler's row", lambda: _rows(db))[0]
        assert (first.kind, first.host, first.pid) == (
            "scheduler",
            os.uname().nodename,
            os.getpid(),
        )
        assert first.version == assetq.__version__
        assert first.name is None and not first.stale
        assert first.interval_seconds == pytest.approx(_BEAT)
        later = _until(
            "a refreshed row",
            lambda: [r for r in _rows(db) if r.last_seen_at > first.last_seen_at],
        )[0]
        assert (later.process_id, later.started_at) == (first.process_id, first.started_at)
        stop.set()
    assert _rows(db) == []


def test_the_worker_loop_records_itself_with_its_name_and_removes_the_row_at_a_clean_stop(
    db: TestDatabase,
) -> None:
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "report", "orders", namespace=db.namespace)
    stop = threading.Event()

    def run() -> None:
        assetq.run_worker(
            db.engine,
            {"report": lambda claim, conn: None},
            worker="liveness-test",
            namespace=db.namespace,
            poll_interval=_BEAT,
            liveness_interval=_BEAT,
            stop=stop,
        )

    with _running(run):
        first = _until("the worker's row", lambda: _rows(db))[0]
        assert (first.kind, first.name, first.pid) == ("worker", "liveness-test", os.getpid())
        _until(
            "a refreshed row",
            lambda: [r for r in _rows(db) if r.last_seen_at > first.last_seen_at],
        )
        stop.set()
    assert _rows(db) == []


def test_the_asyncio_loops_record_themselves_and_remove_their_rows(db: TestDatabase) -> None:
    seen: list[list[ops.ProcessStatus]] = []

    async def main() -> None:
        engine = create_async_engine(aio.async_url(db.url), poolclass=NullPool)
        stop = asyncio.Event()

        async def handler(claim: assetq.Claim, conn: AsyncConnection) -> None:
            return None

        async with engine.begin() as conn:
            await aio.declare_dag(conn, "report", "orders", namespace=db.namespace)
        loops = asyncio.gather(
            aio.run_scheduler(
                engine,
                namespace=db.namespace,
                poll_interval=_BEAT,
                liveness_interval=_BEAT,
                stop_event=stop,
            ),
            aio.run_worker(
                engine,
                {"report": handler},
                namespace=db.namespace,
                poll_interval=_BEAT,
                liveness_interval=_BEAT,
                stop=stop,
            ),
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            async with engine.connect() as conn:
                rows = await aio.processes(conn, namespace=db.namespace)
            if len(rows) == 2 and all(r.last_seen_at > r.started_at for r in rows):
                seen.append(rows)
                break
            await asyncio.sleep(0.02)
        stop.set()
        await asyncio.wait_for(loops, 30)
        await engine.dispose()

    asyncio.run(main())
    assert seen, "both rows, each refreshed at least once"
    assert sorted(r.kind for r in seen[0]) == ["scheduler", "worker"]
    assert _rows(db) == []


def test_no_liveness_interval_means_no_row(db: TestDatabase) -> None:
    assetq.run_scheduler(
        db.engine, namespace=db.namespace, max_passes=2, poll_interval=_BEAT, liveness_interval=None
    )
    with db.engine.connect() as conn:
        count = conn.execute(sa.text(db.sql("SELECT COUNT(*) FROM {ns}.process_liveness"))).scalar()
    assert count == 0


def test_a_failing_heartbeat_is_one_warning_and_the_loop_goes_on(
    db: TestDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    routine = (
        "{ns}.process_heartbeat(text, text, text, text, bigint, text, double precision)"
        if db.engine_name == "postgresql"
        else "{ns}.process_heartbeat"
    )
    db.execute(f"DROP {'FUNCTION' if db.engine_name == 'postgresql' else 'PROCEDURE'} {routine}")
    caplog.set_level(logging.WARNING, logger="assetq")
    stats = assetq.run_scheduler(
        db.engine,
        namespace=db.namespace,
        max_passes=6,
        poll_interval=_BEAT,
        liveness_interval=0.01,
    )
    assert (stats.passes, stats.errors) == (6, 0)
    warnings = [r for r in caplog.records if r.name == "assetq.liveness"]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "could not record its liveness" in warnings[0].getMessage()


def test_a_liveness_interval_must_be_positive(db: TestDatabase) -> None:
    with pytest.raises(assetq.InvalidArgument, match="liveness_interval"):
        assetq.run_scheduler(db.engine, namespace=db.namespace, liveness_interval=0)


# -- a killed process: stale in status and doctor, removed by purge ----------------------------


def test_a_killed_scheduler_leaves_a_row_status_shows_as_stale_doctor_notes_and_purge_removes(
    db: TestDatabase,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASSETQ_")}
    env.pop("PYTHONPATH", None)
    scheduler = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "assetq",
            "--url",
            db.url.render_as_string(hide_password=False),
            "--namespace",
            db.namespace,
            "scheduler",
            "--poll-interval",
            "0.1",
            "--liveness-interval",
            "0.1",
        ],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        row = _until("the subprocess's row", lambda: _rows(db), timeout=60)[0]
        assert (row.pid, row.interval_seconds, row.stale) == (scheduler.pid, 0.1, False)
        live = _cli(db, "status")
        assert "1 processes (0 stale" in live and " live" in live
    finally:
        scheduler.send_signal(signal.SIGKILL)
        scheduler.wait(timeout=30)
    assert scheduler.returncode == -signal.SIGKILL
    # Three intervals (0.3 s) after its last heartbeat.
    stale = _until("the row to turn stale", lambda: [r for r in _rows(db) if r.stale])[0]
    assert stale.process_id == row.process_id and stale.last_seen_age_seconds > 0.3

    text = _cli(db, "status")
    assert "1 processes (1 stale: not seen for 3 of their heartbeat intervals)" in text
    header = next(line for line in text.splitlines() if line.startswith("kind"))
    assert header.split() == [
        "kind", "host", "pid", "version", "started", "(UTC)", "last", "seen", "state", "name"
    ]  # fmt: skip
    line = next(line for line in text.splitlines() if line.startswith("scheduler"))
    assert str(scheduler.pid) in line.split() and line.split()[-2] == "stale"
    data = json.loads(_cli(db, "status", "--json"))
    (shown,) = data["processes"]
    assert (shown["process_id"], shown["kind"], shown["stale"]) == (
        row.process_id,
        "scheduler",
        True,
    )
    assert shown["pid"] == scheduler.pid and shown["last_seen_age_seconds"] > 0.3

    notes = [
        c for c in ops.doctor(db.engine, namespace=db.namespace).checks if c.name == "liveness"
    ]
    assert [c.severity for c in notes] == ["note"]
    assert f":{scheduler.pid} (version {assetq.__version__}) is stale" in notes[0].detail

    preview = ops.purge_preview(db.engine, older_than=timedelta(0), namespace=db.namespace)
    assert preview.processes == 1
    # A cutoff a day back keeps it: it was seen less than a day ago.
    assert (
        ops.purge(db.engine, older_than=timedelta(days=1), namespace=db.namespace).processes_deleted
        == 0
    )
    result = ops.purge(db.engine, older_than=timedelta(0), namespace=db.namespace)
    assert result.processes_deleted == 1
    assert _rows(db) == []
    assert [
        c.severity
        for c in ops.doctor(db.engine, namespace=db.namespace).checks
        if c.name == "liveness"
    ] == ["ok"]


# -- grants -----------------------------------------------------------------------------------


def _heartbeat(engine: sa.Engine, db: TestDatabase, kind: liveness.ProcessKind) -> bool:
    alive = liveness.Liveness(engine, db.namespace, kind, 30.0)
    ok = alive.beat()
    alive.gone()
    return ok


def test_scheduler_and_worker_roles_may_heartbeat_producers_may_not(
    db: TestDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    with made_logins(db, ("scheduler", "worker", "producer"), "aqh10") as made:
        assetq.grant_roles(
            db.engine,
            scheduler=made["scheduler"].grantee,
            worker=made["worker"].grantee,
            producer=made["producer"].grantee,
            namespace=db.namespace,
        )
        assert _heartbeat(made["scheduler"].engine, db, "scheduler")
        assert _heartbeat(made["worker"].engine, db, "worker")
        assert _rows(db) == []  # each removed its own row
        caplog.set_level(logging.WARNING, logger="assetq.liveness")
        assert not _heartbeat(made["producer"].engine, db, "scheduler")
        assert "could not record its liveness" in caplog.text
        assetq.revoke_roles(db.engine, made["scheduler"].grantee, namespace=db.namespace)
        assert not _heartbeat(made["scheduler"].engine, db, "scheduler")
