"""Prometheus metrics of the scheduler and worker loops (``pip install 'assetq[prometheus]'``).

:class:`PrometheusMetrics` is an :class:`assetq.Metrics` that keeps what the loops tell it in
``prometheus_client`` counters and histograms; :meth:`PrometheusMetrics.serve` exposes them
over HTTP for Prometheus to scrape (``assetq scheduler --metrics-port``/``assetq worker
--metrics-port`` do both)::

    metrics = PrometheusMetrics()  # the process's default registry
    server = metrics.serve(9464)  # http://0.0.0.0:9464/metrics, in a daemon thread
    assetq.run_scheduler(engine, metrics=metrics)

One instance per registry: the scheduler and the worker of one process share it. Every
metric is named ``assetq_...``; labels have few values (an outcome, an error code), never a
dag id or run id. Durations are seconds.

:meth:`PrometheusMetrics.watch_work` adds gauges read from the database at each scrape: the
runs nobody can execute (consumers with queued runs or expired leases and no live worker
with a handler for them) and the runs queued too long, as ``assetq status`` and ``assetq
doctor`` show them. Give it an engine whose account may read the namespace (``assetq grant
--reader``); one process of a deployment is enough.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

try:
    import prometheus_client
    from prometheus_client import CollectorRegistry, Counter, Histogram
    from prometheus_client.core import GaugeMetricFamily
except ImportError as exc:  # the extra is not installed
    raise ImportError(
        "assetq.prometheus needs prometheus_client: pip install 'assetq[prometheus]'"
    ) from exc

from sqlalchemy import Engine

from .api import Claim, Run
from .metrics import AttemptOutcome, Metrics, WaitOutcome
from .namespace import DEFAULT_NAMESPACE
from .ops import DEFAULT_STUCK_AFTER, worker_coverage

log = logging.getLogger("assetq.prometheus")

#: Buckets of the pass, claim and attempt durations: a pass takes milliseconds, a handler
#: may take minutes.
DURATION_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300,
)  # fmt: skip
#: Buckets of the event->run latency: woken schedulers take milliseconds, polling ones up
#: to their poll interval, a paused or capped consumer's events wait much longer.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600,
)  # fmt: skip


@dataclass
class MetricsServer:
    """The HTTP endpoint of :meth:`PrometheusMetrics.serve`, serving until :meth:`close`."""

    host: str
    #: The port it listens on (the one picked when 0 was asked for).
    port: int
    _server: Any
    _thread: threading.Thread

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


class PrometheusMetrics(Metrics):
    """The loops' metrics as Prometheus counters and histograms in ``registry`` (default:
    prometheus_client's process-wide ``REGISTRY``). Thread-safe (prometheus_client's
    metrics are), so one instance serves every slot of a worker and a scheduler at once."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        duration_buckets: Sequence[float] = DURATION_BUCKETS,
        latency_buckets: Sequence[float] = LATENCY_BUCKETS,
    ) -> None:
        self.registry = prometheus_client.REGISTRY if registry is None else registry
        reg = self.registry
        self.pass_duration = Histogram(
            "assetq_scheduler_pass_duration_seconds",
            "Duration of the scheduler passes that committed (their own retries included)",
            registry=reg,
            buckets=duration_buckets,
        )
        self.pass_failures = Counter(
            "assetq_scheduler_pass_failures",
            "Scheduler passes that failed after their own retries, by error code",
            ["code"],
            registry=reg,
        )
        self.runs_created = Counter(
            "assetq_scheduler_runs_created", "Runs created by scheduler passes", registry=reg
        )
        self.events_consumed = Counter(
            "assetq_scheduler_events_consumed",
            "Events consumed by the runs scheduler passes created",
            registry=reg,
        )
        self.latency = Histogram(
            "assetq_event_to_run_latency_seconds",
            "Per run created: its created_at minus its oldest consumed event's timestamp",
            registry=reg,
            buckets=latency_buckets,
        )
        self.scheduler_waits = Counter(
            "assetq_scheduler_waits",
            "Idle scheduler waits, by how they ended (woken by a notification, or polled)",
            ["outcome"],
            registry=reg,
        )
        self.claim_duration = Histogram(
            "assetq_worker_claim_duration_seconds",
            "Duration of the worker slots' claims, whether they got a run or not",
            registry=reg,
            buckets=duration_buckets,
        )
        self.runs_claimed = Counter(
            "assetq_worker_runs_claimed",
            "Runs claimed by worker slots (attempts started)",
            registry=reg,
        )
        self.claim_failures = Counter(
            "assetq_worker_claim_failures",
            "Worker claims that failed with a database error, by error code",
            ["code"],
            registry=reg,
        )
        self.attempt_duration = Histogram(
            "assetq_worker_attempt_duration_seconds",
            "Attempts from claim to completion (handler included), by outcome",
            ["outcome"],
            registry=reg,
            buckets=duration_buckets,
        )
        self.retries = Counter(
            "assetq_worker_retries",
            "Failed attempts that left their run queued for another attempt",
            registry=reg,
        )
        self.worker_waits = Counter(
            "assetq_worker_waits",
            "Idle worker slot waits, by how they ended (woken by a notification, or polled)",
            ["outcome"],
            registry=reg,
        )
        # Every label value shows from the start (0), so rate() and alerts see the series
        # before the first event of their kind.
        for outcome in ("woken", "polled"):
            self.scheduler_waits.labels(outcome)
            self.worker_waits.labels(outcome)
        for attempt in ("success", "failed", "lost"):
            self.attempt_duration.labels(attempt)

    # -- the hook ------------------------------------------------------------------------

    def scheduler_pass(self, seconds: float, runs: int, events: int) -> None:
        self.pass_duration.observe(seconds)
        self.runs_created.inc(runs)
        self.events_consumed.inc(events)

    def scheduler_pass_failed(self, seconds: float, code: str | None) -> None:
        self.pass_failures.labels(code or "none").inc()

    def run_created(self, run: Run, latency: float | None) -> None:
        if latency is not None:
            self.latency.observe(max(0.0, latency))

    def scheduler_wait(self, outcome: WaitOutcome) -> None:
        self.scheduler_waits.labels(outcome).inc()

    def worker_claim(self, seconds: float, claimed: int) -> None:
        self.claim_duration.observe(seconds)
        self.runs_claimed.inc(claimed)

    def worker_claim_failed(self, seconds: float, code: str | None) -> None:
        self.claim_failures.labels(code or "none").inc()

    def worker_completed(
        self, claim: Claim, outcome: AttemptOutcome, run: Run | None, seconds: float
    ) -> None:
        self.attempt_duration.labels(outcome).observe(seconds)

    def worker_retry(self, claim: Claim, run: Run) -> None:
        self.retries.inc()

    def worker_wait(self, outcome: WaitOutcome) -> None:
        self.worker_waits.labels(outcome).inc()

    # -- the work, read from the database -------------------------------------------------

    def watch_work(
        self,
        engine: Engine,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        stuck_after: timedelta = DEFAULT_STUCK_AFTER,
    ) -> WorkCollector:
        """Add the gauges of :class:`WorkCollector` to this registry: each scrape reads
        ``namespace`` through ``engine`` (one short read of the active runs and the liveness
        tables, never the history)."""
        collector = WorkCollector(engine, namespace=namespace, stuck_after=stuck_after)
        self.registry.register(collector)
        return collector

    # -- the endpoint --------------------------------------------------------------------

    def serve(self, port: int, host: str = "0.0.0.0") -> MetricsServer:
        """Serve this registry at ``http://host:port/metrics`` (port 0: a free one, see
        :attr:`MetricsServer.port`) from a daemon thread, until :meth:`MetricsServer.close`."""
        server, thread = prometheus_client.start_http_server(port, host, registry=self.registry)
        served = MetricsServer(host, int(server.server_port), server, thread)
        log.info("assetq: serving Prometheus metrics at %s", served.url)
        return served


class WorkCollector:
    """Gauges of the runs nobody executes, read at each scrape
    (:func:`assetq.worker_coverage`):

    - ``assetq_consumers_without_worker``: consumers with queued runs or expired leases and
      no live worker that has a handler for them (``no_worker`` of ``assetq status --json``);
    - ``assetq_runs_without_worker``: their queued runs and expired leases;
    - ``assetq_runs_queued_too_long``: queued runs claimable for longer than ``stuck_after``;
    - ``assetq_oldest_queued_run_age_seconds``: the longest any queued run has been claimable
      (0 when none is);
    - ``assetq_work_read_ok``: 1 when the read worked, 0 when it failed (the others are then
      absent; the failure is logged once, until a read works again)."""

    def __init__(
        self,
        engine: Engine,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        stuck_after: timedelta = DEFAULT_STUCK_AFTER,
    ) -> None:
        self._engine = engine
        self._namespace = namespace
        self._stuck_after = stuck_after
        self._failing = False

    def describe(self) -> list[Any]:
        return []  # read at scrape time only: registering reads nothing

    def collect(self) -> Iterator[Any]:
        try:
            with self._engine.connect() as conn:
                found = worker_coverage(
                    conn, stuck_after=self._stuck_after, namespace=self._namespace
                )
        except Exception as exc:  # a scrape must answer: the failure is a gauge
            if not self._failing:
                log.warning("assetq: the work gauges could not be read: %s", exc)
                self._failing = True
            yield GaugeMetricFamily(
                "assetq_work_read_ok", "Whether the work gauges could be read (1) or not (0)", 0
            )
            return
        self._failing = False
        orphaned = [c for c in found if c.no_worker]
        yield GaugeMetricFamily(
            "assetq_work_read_ok", "Whether the work gauges could be read (1) or not (0)", 1
        )
        yield GaugeMetricFamily(
            "assetq_consumers_without_worker",
            "Consumers with queued runs or expired leases and no live worker with a handler",
            len(orphaned),
        )
        yield GaugeMetricFamily(
            "assetq_runs_without_worker",
            "Queued runs and expired leases of consumers no live worker has a handler for",
            sum(c.queued_runs + c.expired_runs for c in orphaned),
        )
        yield GaugeMetricFamily(
            "assetq_runs_queued_too_long",
            "Queued runs claimable for longer than the stuck_after threshold",
            sum(c.stuck_runs for c in found),
        )
        yield GaugeMetricFamily(
            "assetq_oldest_queued_run_age_seconds",
            "How long the oldest claimable queued run has waited (0: none)",
            max((c.oldest_queued_run_age_seconds or 0.0 for c in found), default=0.0),
        )


def process_registry() -> CollectorRegistry:
    """A registry of its own with the process, platform and garbage-collector collectors
    that prometheus_client's default registry has (what the CLI serves)."""
    registry = CollectorRegistry()
    prometheus_client.ProcessCollector(registry=registry)
    prometheus_client.PlatformCollector(registry=registry)
    prometheus_client.GCCollector(registry=registry)
    return registry
