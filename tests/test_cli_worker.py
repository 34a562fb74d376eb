"""`assetq worker`: handlers from MODULE:NAME, one JSON line per attempt, graceful SIGTERM."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import assetq
from dbs import TestDatabase
from scenario import declare, register

HANDLERS = """
import pathlib
import time

import sqlalchemy as sa

import assetq

HERE = pathlib.Path(__file__).parent


def report(claim, conn):
    conn.execute(
        sa.text('INSERT INTO {ns}report_rows (run_id, events) VALUES (:r, :n)'),
        {{"r": claim.run_id, "n": len(claim.event_ids)}},
    )
    if (HERE / "block").exists():
        # Written whole, then renamed: the test polls for the file and reads it at once.
        (HERE / "started.tmp").write_text(claim.run_id)
        (HERE / "started.tmp").rename(HERE / "started")
        deadline = time.monotonic() + 60
        while not (HERE / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    return [assetq.NewEvent("report_done", extra={{"events": len(claim.event_ids)}})]


HANDLERS = {{"report": report}}
"""


def _env(db: TestDatabase) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASSETQ_")}
    env["ASSETQ_DATABASE_URL"] = db.url.render_as_string(hide_password=False)
    env.pop("PYTHONPATH", None)
    return env


def _project(db: TestDatabase, tmp_path: Path) -> Path:
    """A directory holding the handlers' module, and the table its handler writes."""
    (tmp_path / "jobs.py").write_text(textwrap.dedent(HANDLERS.format(ns=db.sql("{ns}."))))
    db.execute("CREATE TABLE {ns}.report_rows (run_id varchar(250) PRIMARY KEY, events integer)")
    declare(db, "report", "orders")
    declare(db, "publish", "report_done")
    return tmp_path


def _worker(db: TestDatabase, cwd: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "assetq", "worker", "--handlers", "jobs:HANDLERS", *args],
        cwd=cwd,
        env=_env(db),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )


def test_the_worker_command_runs_the_handler_and_prints_each_attempt_as_json(
    db: TestDatabase, tmp_path: Path
) -> None:
    cwd = _project(db, tmp_path)
    register(db, "orders", "orders")
    (run,) = assetq.schedule(db.engine)
    worker = _worker(db, cwd, "--max-runs", "1", "--json", "--poll-interval", "0.2")
    out, err = worker.communicate(timeout=120)
    assert worker.returncode == 0, err
    (line,) = out.splitlines()
    data = json.loads(line)
    assert (data["dag_id"], data["run_id"], data["attempt"]) == ("report", run.run_id, 1)
    assert (data["outcome"], data["state"]) == ("success", "success")
    assert len(data["output_event_ids"]) == 1
    # One vocabulary: every key but the attempt's outcome is a field of the Claim (a Run).
    fields = {f.name for f in dataclasses.fields(assetq.Claim)}
    assert set(data) - fields == {"outcome"}
    assert db.rows("SELECT run_id, events FROM {ns}.report_rows") == [(run.run_id, 2)]
    (published,) = assetq.schedule(db.engine)
    assert published.event_ids == tuple(data["output_event_ids"])


def test_timeout_lets_a_handler_go_at_the_deadline_and_records_the_failure(
    db: TestDatabase, tmp_path: Path
) -> None:
    """--timeout: the handler blocks (until a release that never comes); the worker records
    the attempt as timed out, prints it, and exits after --max-runs without waiting for it."""
    cwd = _project(db, tmp_path)
    (cwd / "block").write_text("")
    register(db, "orders")
    (run,) = assetq.schedule(db.engine)
    worker = _worker(
        db, cwd, "--max-runs", "1", "--json", "--poll-interval", "0.2", "--timeout", "0.5s"
    )
    out, err = worker.communicate(timeout=120)
    assert worker.returncode == 0, err
    (line,) = out.splitlines()
    data = json.loads(line)
    assert (data["run_id"], data["outcome"], data["state"]) == (run.run_id, "failed", "failed")
    assert data["error"] == "timed out after 0.5s"
    assert "timed out after 0.5s" in err
    assert db.rows("SELECT run_id FROM {ns}.report_rows") == []


def test_sigterm_lets_the_run_in_progress_finish_and_claims_no_more(
    db: TestDatabase, tmp_path: Path
) -> None:
    cwd = _project(db, tmp_path)
    (cwd / "block").write_text("")
    register(db, "orders")
    (first,) = assetq.schedule(db.engine)
    register(db, "orders")
    (second,) = assetq.schedule(db.engine)
    worker = _worker(db, cwd, "--json", "--poll-interval", "0.2")
    stderr: list[str] = []
    assert worker.stderr is not None
    reader = threading.Thread(target=lambda: stderr.extend(worker.stderr), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while not (cwd / "started").exists():
            assert worker.poll() is None, "".join(stderr)
            assert time.monotonic() < deadline, "the handler never started"
            time.sleep(0.02)
        assert (cwd / "started").read_text() == first.run_id
        worker.send_signal(signal.SIGTERM)
        # The signal is taken before the handler may finish: the run in progress still
        # completes, the queued one is left for another worker.
        deadline = time.monotonic() + 30
        while not any("SIGTERM received" in line for line in stderr):
            assert time.monotonic() < deadline, "the worker never said it was stopping"
            time.sleep(0.02)
        (cwd / "release").write_text("")
        worker.wait(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    reader.join(timeout=10)
    assert worker.stdout is not None
    out = worker.stdout.read()
    assert worker.returncode == 0, "".join(stderr)
    assert [json.loads(line)["run_id"] for line in out.splitlines()] == [first.run_id]
    with db.engine.connect() as conn:
        assert assetq.get_run(conn, "report", first.run_id).state == "success"
        assert assetq.get_run(conn, "report", second.run_id).state == "queued"


@pytest.mark.parametrize(
    "handlers",
    ["jobs", "jobs:", ":HANDLERS", "jobs:not-a-name"],
    ids=["no-name", "empty", "no-module", "bad"],
)
def test_a_malformed_handlers_option_is_a_usage_error(
    db: TestDatabase, tmp_path: Path, handlers: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "assetq", "worker", "--handlers", handlers],
        cwd=tmp_path,
        env=_env(db),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2, done.stderr
    assert "MODULE:NAME" in done.stderr


def test_a_handlers_module_that_cannot_be_imported_is_an_error_with_its_name(
    db: TestDatabase, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "assetq", "worker", "--handlers", "no_such_jobs:HANDLERS"],
        cwd=tmp_path,
        env=_env(db),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 1
    assert "no_such_jobs" in done.stderr


PAIRS = """
import sys
import threading
import time


class SlowStdout:
    \"\"\"Each write waits a little first, as a pipe that a slow reader drains: two threads
    that print at once interleave their writes unless each line is written whole.\"\"\"

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        time.sleep(0.02)
        return self._stream.write(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)


sys.stdout = SlowStdout(sys.stdout)
together = threading.Barrier(2, timeout=10)


def pair(claim, conn):
    # Both slots finish their runs at the same moment, and so print at the same moment.
    try:
        together.wait()
    except threading.BrokenBarrierError:
        together.reset()


HANDLERS = {"pair": pair}
"""


def test_concurrent_slots_print_each_json_line_whole(db: TestDatabase, tmp_path: Path) -> None:
    """Issue 26: at --concurrency 2 the slots' threads printed without a lock, and a line
    now and then held two JSON objects (print writes the text and the newline apart)."""
    (tmp_path / "pairs.py").write_text(PAIRS)
    declare(db, "pair", "ticks")
    runs = 20
    for _ in range(runs):
        register(db, "ticks")
        assert len(assetq.schedule(db.engine)) == 1
    worker = subprocess.run(
        [
            *(sys.executable, "-m", "assetq", "worker", "--handlers", "pairs:HANDLERS"),
            *("--concurrency", "2", "--max-runs", str(runs), "--json", "--poll-interval", "0.2"),
        ],
        cwd=tmp_path,
        env=_env(db),
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    assert worker.returncode == 0, worker.stderr
    lines = worker.stdout.splitlines()
    decoded = []
    for line in lines:
        try:
            decoded.append(json.loads(line))
        except json.JSONDecodeError:
            pytest.fail(f"not one JSON object: {line!r}\n{worker.stdout}")
    assert len(lines) == runs
    assert sorted(entry["outcome"] for entry in decoded) == ["success"] * runs


FLAKY = """
def flaky(claim, conn):
    if claim.attempt == 1:
        raise RuntimeError("the first attempt fails")


HANDLERS = {"flaky": flaky}
"""


def test_a_successful_retry_prints_no_error(db: TestDatabase, tmp_path: Path) -> None:
    """Issue 26: the run keeps the failed attempt's error (Run.error), and the success
    line of the next attempt printed it, as if the success had failed."""
    (tmp_path / "flaky.py").write_text(FLAKY)
    declare(db, "flaky", "orders", max_attempts=2)
    register(db, "orders")
    (run,) = assetq.schedule(db.engine)
    worker = subprocess.run(
        [
            *(sys.executable, "-m", "assetq", "worker", "--handlers", "flaky:HANDLERS"),
            *("--max-runs", "2", "--json", "--poll-interval", "0.2"),
        ],
        cwd=tmp_path,
        env=_env(db),
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert worker.returncode == 0, worker.stderr
    failed, succeeded = (json.loads(line) for line in worker.stdout.splitlines())
    assert (failed["attempt"], failed["outcome"], failed["state"]) == (1, "failed", "queued")
    assert "the first attempt fails" in failed["error"]
    assert (succeeded["attempt"], succeeded["outcome"]) == (2, "success")
    assert succeeded["state"] == "success"
    assert succeeded["error"] is None
    with db.engine.connect() as conn:  # the run itself still tells what went wrong before
        assert "the first attempt fails" in (assetq.get_run(conn, "flaky", run.run_id).error or "")
