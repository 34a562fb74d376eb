"""Runs nobody can execute (issue 26 item 3): workers record the consumers they have handlers
for (process_handles, in process_dag, with their liveness row); status, doctor and the
Prometheus gauges flag a consumer with queued runs or expired leases and no live worker with
a handler for it, and runs queued (claimable) longer than a threshold; a worker with a
handler for a consumer that is not declared warns at start, or refuses with strict.

The flag is shown to appear and clear by the liveness rows themselves (a worker's row and
its consumers are waited for, never slept on).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
import sqlalchemy as sa
from prometheus_client import CollectorRegistry
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine
from sqlalchemy.pool import NullPool

import assetq
from assetq import aio, cli, ops
from assetq.liveness import Liveness
from assetq.prometheus import PrometheusMetrics
from dbs import TestDatabase, made_logins
from scenario import declare, register

_T = TypeVar("_T")
_BEAT = 0.05
#: The workers' liveness interval: the first row is written at once, and a worker is stale
#: only after three of these (the sync worker's main thread beats between its joins).
_LIVENESS = 2.0


def _until(what: str, probe: Callable[[], _T | None], timeout: float = 20.0) -> _T:
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _queued_runs(db: TestDatabase, dag_id: str, n: int) -> list[assetq.Run]:
    """``n`` queued runs of ``dag_id`` (one event and one pass each)."""
    made: list[assetq.Run] = []
    for _ in range(n):
        register(db, "orders")
        made += [
            r for r in assetq.schedule(db.engine, namespace=db.namespace) if r.dag_id == dag_id
        ]
    assert len(made) == n
    return made


def _coverage(db: TestDatabase, **kwargs: Any) -> dict[str, ops.WorkerCoverage]:
    with db.engine.connect() as conn:
        found = assetq.worker_coverage(conn, namespace=db.namespace, **kwargs)
    return {c.dag_id: c for c in found}


def _handled(db: TestDatabase, dag_id: str) -> list[str]:
    """Names of the live workers whose liveness row names ``dag_id`` among their consumers."""
    rows = db.rows(
        "SELECT l.name FROM {ns}.process_dag p"
        " JOIN {ns}.process_liveness l ON l.process_id = p.process_id"
        " WHERE p.dag_id = :dag_id",
        dag_id=dag_id,
    )
    return [str(r.name) for r in rows]


def _cli(db: TestDatabase, *args: str) -> tuple[int, str]:
    url = db.url.render_as_string(hide_password=False)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["--url", url, "--namespace", db.namespace, *args])
    return code, out.getvalue()


def _status_json(db: TestDatabase) -> dict[str, dict[str, Any]]:
    code, out = _cli(db, "status", "--json")
    assert code == 0, out
    return {c["dag_id"]: c for c in json.loads(out)["consumers"]}


def _doctor_checks(db: TestDatabase, *args: str) -> list[dict[str, Any]]:
    _, out = _cli(db, "doctor", "--json", *args)
    return list(json.loads(out)["checks"])


@contextlib.contextmanager
def _worker(
    db: TestDatabase, handlers: dict[str, Any], name: str, **kwargs: Any
) -> Iterator[threading.Event]:
    stop = threading.Event()
    thread = threading.Thread(
        target=assetq.run_worker,
        args=(db.engine, handlers),
        kwargs={
            "worker": name,
            "namespace": db.namespace,
            "poll_interval": _BEAT,
            "liveness_interval": _LIVENESS,
            "stop": stop,
            **kwargs,
        },
        daemon=True,
    )
    thread.start()
    try:
        yield stop
    finally:
        stop.set()
        thread.join(timeout=30)
        assert not thread.is_alive()


def test_a_queued_run_with_no_worker_is_flagged_and_clears_as_a_worker_with_its_handler_starts(
    db: TestDatabase,
) -> None:
    declare(db, "report", "orders")
    declare(db, "other", "misc")
    _queued_runs(db, "report", 2)

    found = _coverage(db)["report"]
    assert (found.queued_runs, found.live_workers, found.no_worker) == (2, 0, True)
    assert _status_json(db)["report"]["no_worker"] is True
    assert _status_json(db)["other"]["no_worker"] is False  # nothing waits for it
    code, text = _cli(db, "status")
    assert code == 0 and "no worker: report has 2 queued runs" in text
    # Runs created a moment ago: a note (workers may be restarting); waiting longer than
    # --stuck-after, a problem.
    flagged = [c for c in _doctor_checks(db) if c["name"] == "workers"]
    assert [(c["severity"], c["detail"].split(":")[0]) for c in flagged] == [("note", "report")]
    code, _ = _cli(db, "doctor")
    assert code == 0
    db.execute("UPDATE {ns}.dag_run SET not_before = not_before - INTERVAL '10' MINUTE")
    flagged = [c for c in _doctor_checks(db) if c["name"] == "workers"]
    assert [(c["severity"], c["detail"].split(":")[0]) for c in flagged] == [("problem", "report")]
    code, _ = _cli(db, "doctor")
    assert code == 1

    release = threading.Event()
    started = threading.Event()

    def report(claim: assetq.Claim, conn: sa.Connection) -> None:
        started.set()
        release.wait(30)

    # A live worker with handlers for another consumer only: report still has none.
    with _worker(db, {"other": lambda claim, conn: None}, "cov-other"):
        _until("the other worker's consumers", lambda: _handled(db, "other"))
        assert _handled(db, "report") == []
        assert _coverage(db)["report"].no_worker
        assert _status_json(db)["report"]["no_worker"] is True

        # A worker with a handler for report (one slot: one run held, one still queued).
        with _worker(db, {"report": report}, "cov-report"):
            assert _until("report's worker", lambda: _handled(db, "report")) == ["cov-report"]
            assert started.wait(20)
            found = _coverage(db)["report"]
            assert (found.queued_runs, found.live_workers, found.no_worker) == (1, 1, False)
            assert _status_json(db)["report"]["no_worker"] is False
            code, text = _cli(db, "status")
            assert "no worker" not in text
            # A live worker with its handler: not "workers" (it is "queued": the run left
            # queued has waited 10 minutes, and the one slot is busy).
            checks = [c for c in _doctor_checks(db) if c["detail"].startswith("report:")]
            assert [(c["name"], c["severity"]) for c in checks] == [("queued", "problem")]
            release.set()
    # A clean stop deletes the liveness rows and the consumers with them.
    assert db.scalar("SELECT COUNT(*) FROM {ns}.process_dag") == 0


def test_an_expired_lease_with_no_worker_is_flagged(db: TestDatabase) -> None:
    declare(db, "report", "orders", max_attempts=2)
    _queued_runs(db, "report", 1)
    assert assetq.claim_runs(db.engine, "gone", namespace=db.namespace)
    db.execute(
        "UPDATE {ns}.dag_run SET lease_until = lease_until - INTERVAL '1' HOUR,"
        " not_before = not_before - INTERVAL '1' HOUR"
    )
    found = _coverage(db)["report"]
    assert (found.queued_runs, found.expired_runs, found.no_worker) == (0, 1, True)
    assert _status_json(db)["report"]["no_worker"] is True


def test_a_run_queued_longer_than_the_threshold_is_reported_even_with_a_live_worker(
    db: TestDatabase,
) -> None:
    declare(db, "report", "orders")
    _queued_runs(db, "report", 1)
    db.execute("UPDATE {ns}.dag_run SET not_before = not_before - INTERVAL '10' MINUTE")
    alive = Liveness(db.engine, db.namespace, "worker", 60.0, name="w", handles=["report"])
    assert alive.beat()
    try:
        found = _coverage(db, stuck_after=timedelta(minutes=5))["report"]
        assert (found.no_worker, found.stuck_runs) == (False, 1)
        assert found.oldest_queued_run_age_seconds is not None
        assert found.oldest_queued_run_age_seconds >= 600
        assert _coverage(db, stuck_after=timedelta(minutes=20))["report"].stuck_runs == 0
        code, text = _cli(db, "status")
        assert code == 0
        assert "queued too long: report has 1 runs claimable for more than 300s" in text
        _, text = _cli(db, "status", "--stuck-after", "20m")
        assert "queued too long" not in text
        checks = _doctor_checks(db)
        assert [c["name"] for c in checks if c["severity"] == "problem"] == ["queued"]
        assert not [
            c for c in _doctor_checks(db, "--stuck-after", "1h") if c["severity"] == "problem"
        ]
    finally:
        alive.gone()
    assert db.scalar("SELECT COUNT(*) FROM {ns}.process_dag") == 0


def test_prometheus_gauges_count_the_runs_nobody_can_execute(db: TestDatabase) -> None:
    declare(db, "report", "orders")
    _queued_runs(db, "report", 2)
    registry = CollectorRegistry()
    PrometheusMetrics(registry).watch_work(db.engine, namespace=db.namespace)
    assert registry.get_sample_value("assetq_work_read_ok") == 1
    assert registry.get_sample_value("assetq_consumers_without_worker") == 1
    assert registry.get_sample_value("assetq_runs_without_worker") == 2
    assert registry.get_sample_value("assetq_runs_queued_too_long") == 0
    alive = Liveness(db.engine, db.namespace, "worker", 60.0, name="w", handles=["report"])
    assert alive.beat()
    try:
        assert registry.get_sample_value("assetq_consumers_without_worker") == 0
        assert registry.get_sample_value("assetq_runs_without_worker") == 0
        db.execute("UPDATE {ns}.dag_run SET not_before = not_before - INTERVAL '10' MINUTE")
        assert registry.get_sample_value("assetq_runs_queued_too_long") == 2
        age = registry.get_sample_value("assetq_oldest_queued_run_age_seconds")
        assert age is not None and age >= 600
    finally:
        alive.gone()
    assert registry.get_sample_value("assetq_consumers_without_worker") == 1


def test_a_stale_worker_does_not_count_and_purge_takes_its_consumers(db: TestDatabase) -> None:
    declare(db, "report", "orders")
    _queued_runs(db, "report", 1)
    alive = Liveness(db.engine, db.namespace, "worker", 60.0, name="w", handles=["report"])
    assert alive.beat()
    assert not _coverage(db)["report"].no_worker
    # Last seen two hours ago: stale (three intervals of 60 s), and older than purge's cutoff.
    db.execute("UPDATE {ns}.process_liveness SET last_seen_at = last_seen_at - INTERVAL '2' HOUR")
    assert _coverage(db)["report"].no_worker
    assert db.scalar("SELECT COUNT(*) FROM {ns}.process_dag") == 1
    result = assetq.purge(db.engine, older_than=timedelta(hours=1), namespace=db.namespace)
    assert result.processes_deleted == 1
    assert db.scalar("SELECT COUNT(*) FROM {ns}.process_dag") == 0


def test_process_handles_replaces_the_consumers_and_returns_the_unknown_ones(
    db: TestDatabase,
) -> None:
    declare(db, "report", "orders")
    dialect = db.dialect

    def handles(*dag_ids: str) -> list[str]:
        with db.engine.begin() as conn:
            rows = dialect.execute(
                conn,
                "process_handles",
                db.namespace,
                {"process_id": "p1", "dag_ids": json.dumps(list(dag_ids))},
            )
        return [str(r.unknown_dag_id) for r in rows]

    def recorded() -> list[str]:
        rows = db.rows(
            "SELECT dag_id FROM {ns}.process_dag WHERE process_id = 'p1' ORDER BY dag_id"
        )
        return [str(r.dag_id) for r in rows]

    assert handles("report", "nope", "nope") == ["nope"]
    assert recorded() == ["nope", "report"]
    assert handles("report") == []
    assert recorded() == ["report"]
    with (
        pytest.raises(assetq.InvalidArgument, match="dag_ids must be a JSON array"),
        db.engine.begin() as conn,
    ):
        try:
            dialect.execute(
                conn, "process_handles", db.namespace, {"process_id": "p1", "dag_ids": "{}"}
            )
        except sa.exc.DBAPIError as exc:
            raise dialect.translate(exc) from exc
    assert recorded() == ["report"]
    with db.engine.begin() as conn:
        dialect.execute(conn, "process_gone", db.namespace, {"process_id": "p1"})
    assert recorded() == []


def test_a_worker_role_may_record_its_consumers(db: TestDatabase) -> None:
    declare(db, "report", "orders")
    with made_logins(db, ["worker"], "aqcov") as logins:
        login = logins["worker"]
        assetq.grant_roles(db.engine, worker=[login.grantee], namespace=db.namespace)
        alive = Liveness(
            login.engine, db.namespace, "worker", 60.0, name="w", handles=["report"], strict=True
        )
        assert alive.beat()
        assert _handled(db, "report") == ["w"]
        alive.gone()
        assert _handled(db, "report") == []
        assetq.revoke_roles(db.engine, [login.grantee], namespace=db.namespace)


# -- handlers for consumers that are not declared ---------------------------------------------


def test_a_worker_with_a_handler_for_an_unknown_consumer_warns_at_start_and_runs_the_others(
    db: TestDatabase, caplog: pytest.LogCaptureFixture
) -> None:
    declare(db, "report", "orders")
    caplog.set_level(logging.WARNING, logger="assetq")
    handler = lambda claim, conn: None  # noqa: E731
    with _worker(db, {"report": handler, "reprot": handler}, "cov-typo"):
        _until("the worker's consumers", lambda: _handled(db, "reprot"))
        warned = _until(
            "the warning",
            lambda: [r for r in caplog.records if "not declared" in r.getMessage()],
        )
        _queued_runs(db, "report", 1)
        _until(
            "the run done",
            lambda: db.scalar("SELECT COUNT(*) FROM {ns}.dag_run WHERE state = 'success'"),
        )
    assert len(warned) == 1
    assert "reprot" in warned[0].getMessage() and "report," not in warned[0].getMessage()


def test_strict_refuses_a_handler_for_an_unknown_consumer_before_claiming(
    db: TestDatabase,
) -> None:
    declare(db, "report", "orders")
    _queued_runs(db, "report", 1)
    handler = lambda claim, conn: None  # noqa: E731
    with pytest.raises(assetq.UnknownDag, match="reprot") as refused:
        assetq.run_worker(
            db.engine,
            {"report": handler, "reprot": handler},
            namespace=db.namespace,
            liveness_interval=_BEAT,
            strict=True,
        )
    assert refused.value.code == "AQ003"
    assert db.scalar("SELECT COUNT(*) FROM {ns}.dag_run WHERE state = 'queued'") == 1
    assert db.scalar("SELECT COUNT(*) FROM {ns}.process_liveness") == 0
    assert db.scalar("SELECT COUNT(*) FROM {ns}.process_dag") == 0
    with pytest.raises(assetq.InvalidArgument, match="strict needs a liveness row"):
        assetq.run_worker(
            db.engine,
            {"report": handler},
            namespace=db.namespace,
            liveness_interval=None,
            strict=True,
        )


def test_strict_refuses_an_unknown_consumer_in_the_asyncio_worker(db: TestDatabase) -> None:
    declare(db, "report", "orders")
    _queued_runs(db, "report", 1)

    async def handler(claim: assetq.Claim, conn: AsyncConnection) -> None:
        return None

    async def main() -> None:
        engine = create_async_engine(aio.async_url(db.url), poolclass=NullPool)
        try:
            await aio.run_worker(
                engine,
                {"report": handler, "reprot": handler},
                namespace=db.namespace,
                liveness_interval=_BEAT,
                strict=True,
            )
        finally:
            await engine.dispose()

    with pytest.raises(assetq.UnknownDag, match="reprot"):
        asyncio.run(main())
    assert db.scalar("SELECT COUNT(*) FROM {ns}.dag_run WHERE state = 'queued'") == 1


def test_the_worker_command_with_strict_exits_1_naming_the_unknown_consumer(
    db: TestDatabase, tmp_path: Path
) -> None:
    declare(db, "report", "orders")
    (tmp_path / "typo_jobs.py").write_text(
        "def h(claim, conn):\n    return None\n\nHANDLERS = {'report': h, 'reprot': h}\n"
    )
    env = {"PATH": "/usr/bin:/bin", "ASSETQ_DATABASE_URL": db.url.render_as_string(False)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "assetq",
            "--namespace",
            db.namespace,
            "worker",
            "--handlers",
            "typo_jobs:HANDLERS",
            "--strict",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 1, done.stderr
    assert "[AQ003]" in done.stderr and "reprot" in done.stderr
