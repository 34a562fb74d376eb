"""The Prometheus endpoint (the prometheus extra): assetq.prometheus.PrometheusMetrics keeps
the metrics hook's numbers, scraped over HTTP from running loops and from `assetq scheduler
--metrics-port` / `assetq worker --metrics-port` on each engine."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Connection

import assetq
from assetq import cli
from assetq.prometheus import PrometheusMetrics
from dbs import TestDatabase

#: The options every command test starts with: a free port, on the loopback interface.
ENDPOINT = ("--metrics-port", "0", "--metrics-host", "127.0.0.1", "--poll-interval", "0.1")

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    """Every sample the endpoint serves, by (name, sorted labels)."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _until(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_the_loops_numbers_are_scraped_over_http(db: TestDatabase) -> None:
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "report", "orders", max_attempts=2, retry_delay=timedelta(0))
        assetq.register_event(conn, "orders")
        assetq.register_event(conn, "orders")
    metrics = PrometheusMetrics(CollectorRegistry())
    server = metrics.serve(0, "127.0.0.1")
    outcomes: list[str] = []

    def handler(claim: assetq.Claim, conn: Connection) -> None:
        if claim.attempt == 1:
            raise RuntimeError("the first attempt fails")

    stop = threading.Event()
    loops = [
        threading.Thread(
            target=assetq.run_scheduler,
            args=(db.engine,),
            kwargs={"stop_event": stop, "poll_interval": 0.1, "metrics": metrics},
        ),
        threading.Thread(
            target=assetq.run_worker,
            args=(db.engine, {"report": handler}),
            kwargs={
                "stop": stop,
                "poll_interval": 0.1,
                "metrics": metrics,
                "on_complete": lambda claim, run, outcome: outcomes.append(outcome),
            },
        ),
    ]
    try:
        for loop in loops:
            loop.start()
        _until(lambda: outcomes == ["failed", "success"], "the retried run")

        def waited(loop: str) -> float:
            return sum(
                value
                for (name, _), value in scrape(server.url).items()
                if name == f"assetq_{loop}_waits_total"
            )

        _until(lambda: waited("scheduler") >= 1 and waited("worker") >= 1, "idle waits")
        samples = scrape(server.url)  # while both loops run
    finally:
        stop.set()
        for loop in loops:
            loop.join(timeout=30)
        server.close()
    assert samples[("assetq_scheduler_runs_created_total", ())] == 1
    assert samples[("assetq_scheduler_events_consumed_total", ())] == 2
    assert samples[("assetq_scheduler_pass_duration_seconds_count", ())] >= 1
    assert samples[("assetq_event_to_run_latency_seconds_count", ())] == 1
    assert samples[("assetq_event_to_run_latency_seconds_sum", ())] >= 0
    assert samples[("assetq_worker_runs_claimed_total", ())] == 2
    assert samples[("assetq_worker_claim_duration_seconds_count", ())] >= 2
    for outcome, count in (("success", 1), ("failed", 1), ("lost", 0)):
        key = ("assetq_worker_attempt_duration_seconds_count", (("outcome", outcome),))
        assert samples[key] == count
    assert samples[("assetq_worker_retries_total", ())] == 1
    for loop in ("scheduler", "worker"):  # every outcome shows, 0 or more
        for outcome in ("woken", "polled"):
            assert (f"assetq_{loop}_waits_total", (("outcome", outcome),)) in samples
    assert ("assetq_scheduler_pass_failures_total", (("code", "none"),)) not in samples


# -- the commands ----------------------------------------------------------------------------


def _pump(stream: object, lines: queue.Queue[str]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        lines.put(line)


@pytest.fixture
def command(db: TestDatabase, tmp_path: Path) -> Iterator[Callable[..., tuple[str, Samples]]]:
    """Starts `python -m assetq COMMAND --metrics-port 0`; returns the endpoint's URL (from
    its log line) and a first scrape. SIGTERM at teardown: it must exit 0."""
    (tmp_path / "jobs.py").write_text("HANDLERS = {'report': lambda claim, conn: None}\n")
    started: list[subprocess.Popen[str]] = []

    def start(*args: str) -> tuple[str, Samples]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ASSETQ_")}
        env["ASSETQ_DATABASE_URL"] = db.url.render_as_string(hide_password=False)
        process = subprocess.Popen(
            [sys.executable, "-m", "assetq", *args, *ENDPOINT],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        started.append(process)
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=_pump, args=(process.stderr, lines), daemon=True).start()
        deadline = time.monotonic() + 60
        while True:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            found = re.search(r"serving Prometheus metrics at (\S+)", line)
            if found:
                return found.group(1), scrape(found.group(1))

    yield start
    for process in started:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0


def test_the_scheduler_command_serves_its_metrics(
    db: TestDatabase, command: Callable[..., tuple[str, Samples]]
) -> None:
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "report", "orders")
    url, first = command("scheduler")
    assert ("process_cpu_seconds_total", ()) in first  # the process's own, for operators
    with db.engine.begin() as conn:
        assetq.register_event(conn, "orders")
    _until(
        lambda: scrape(url).get(("assetq_scheduler_runs_created_total", ())) == 1,
        "the run in the scrape",
    )


def test_the_worker_command_serves_its_metrics(
    db: TestDatabase, command: Callable[..., tuple[str, Samples]]
) -> None:
    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "report", "orders")
        assetq.register_event(conn, "orders")
    assert len(assetq.schedule(db.engine)) == 1
    url, _ = command("worker", "--handlers", "jobs:HANDLERS")
    key = ("assetq_worker_attempt_duration_seconds_count", (("outcome", "success"),))
    _until(lambda: scrape(url).get(key) == 1, "the completed attempt in the scrape")


def test_without_the_extra_the_metrics_port_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails, as uninstalled
    monkeypatch.delitem(sys.modules, "assetq.prometheus")
    argv = ["--url", "postgresql://nobody@127.0.0.1:1/none", "scheduler", "--metrics-port", "0"]
    assert cli.main(argv) == cli.EXIT_USAGE
    assert "pip install 'assetq[prometheus]'" in capsys.readouterr().err
