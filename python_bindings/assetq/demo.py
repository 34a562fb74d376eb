"""The demonstration behind ``assetq demo``: concurrent producers, concurrent schedulers, and a
check, read back from the database, that every committed event reached every consumer once.

Producers are threads with a connection each. Every event is its own transaction; some
producers hold the transaction open a few milliseconds after inserting the event, so the
event commits after newer events that a scheduler has already consumed: the late commit that
made Airflow 3.0-3.3's timestamp window skip events. Some transactions roll back, some
registrations are retried with their idempotency key. Meanwhile scheduler threads call
:func:`assetq.schedule` in a loop. At the end one closing event per asset lets every AND
condition complete, the schedulers drain the queue, and the database is asked what was linked.

Only the public API and plain SELECTs that read the same on PostgreSQL and MySQL are used.
"""

from __future__ import annotations

import random
import secrets
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection, Engine
from sqlalchemy.engine import URL

from . import api, migrate, sqlfiles
from .conditions import AllOf, AnyOf, Condition, Ref, all_of, any_of
from .dialects import dialect_for, engine_arguments
from .errors import AssetqError

#: The demo's namespace unless told otherwise: its own, so it never meets real consumers.
DEMO_NAMESPACE = "assetq_demo"

ASSETS: tuple[str, ...] = ("orders", "payments", "customers", "refunds")

#: One consumer of each shape: a single asset, all_of, any_of, and a nested condition.
CONSUMERS: tuple[tuple[str, Condition], ...] = (
    ("orders_report", "orders"),
    ("daily_sales", all_of("orders", "payments")),
    ("customer_sync", any_of("customers", "refunds")),
    ("reconciliation", all_of("orders", any_of("payments", "refunds"))),
)


class DemoError(AssetqError):
    """The demo could not run (for example, the namespace holds consumers of someone else)."""


@dataclass(frozen=True)
class DemoConfig:
    """Sizes and probabilities of a demo run. The defaults take a few seconds."""

    producers: int = 6
    events_per_producer: int = 120
    schedulers: int = 2
    #: Share of transactions held open after the insert, and for how long (ms, uniform).
    late_fraction: float = 0.3
    late_ms: tuple[float, float] = (2.0, 25.0)
    #: Share of producer transactions rolled back instead of committed.
    rollback_fraction: float = 0.05
    #: Share of committed events registered a second time with the same idempotency key.
    retry_fraction: float = 0.05
    #: Pause between two events of one producer (ms, uniform), so passes interleave.
    pause_ms: tuple[float, float] = (0.0, 4.0)
    #: Seed of the producers' random choices (timing is never reproducible).
    seed: int | None = None
    #: Longest wait for the schedulers to empty the queue at the end, seconds.
    drain_timeout: float = 30.0


@dataclass(frozen=True)
class ConsumerSummary:
    dag_id: str
    condition: str
    #: Runs created by this demo's scheduler calls, and the events they consumed.
    runs: int
    events: int
    #: Consumed events that committed after a run of this consumer had consumed a newer one.
    late: int


@dataclass(frozen=True)
class Verification:
    """What the database holds after the drain, restricted to this run's events."""

    #: Committed (consumer, event) pairs: every committed event times every consumer whose
    #: condition names its asset.
    expected_pairs: int
    #: Expected pairs linked to exactly one run.
    linked_once: int
    #: Expected pairs with no link.
    lost: int
    #: Extra links beyond the first for a pair (the unique constraint makes this 0).
    duplicated: int
    #: Links of this run's events to a consumer that does not use the asset, or of a
    #: rolled-back event.
    unexpected: int
    #: Queue rows of the demo's consumers left after the drain.
    still_queued: int
    #: Committed events missing from the event table.
    missing_events: int
    #: Rolled-back events, and how many of them are found in the event table.
    rolled_back: int
    rolled_back_visible: int
    #: Events in this run's id range that no producer committed (a retry that created a
    #: second event would show here).
    extra_events: int
    #: Pairs on which the runs returned by schedule() and the database's links disagree.
    reported_mismatch: int

    @property
    def ok(self) -> bool:
        return (
            self.expected_pairs > 0
            and self.linked_once == self.expected_pairs
            and not (
                self.lost
                or self.duplicated
                or self.unexpected
                or self.still_queued
                or self.missing_events
                or self.rolled_back_visible
                or self.extra_events
                or self.reported_mismatch
            )
        )

    def line(self) -> str:
        status = "OK" if self.ok else "FAILED"
        text = (
            f"verification ({status}, read from the database): {self.expected_pairs:,}"
            f" committed (consumer, event) pairs, {self.linked_once:,} linked exactly once:"
            f" {self.lost} lost, {self.duplicated} duplicated, {self.still_queued} still queued"
        )
        extras = [
            (self.unexpected, "linked to a consumer that does not use the asset"),
            (self.missing_events, "committed events missing"),
            (self.rolled_back_visible, "rolled-back events visible"),
            (self.extra_events, "events nobody committed"),
            (self.reported_mismatch, "pairs where schedule()'s runs and the database disagree"),
        ]
        text += "".join(f", {n} {what}" for n, what in extras if n)
        if not self.rolled_back_visible:
            text += f"; {self.rolled_back:,} rolled-back events left no row"
        return text


@dataclass(frozen=True)
class DemoResult:
    server: str
    namespace: str
    config: DemoConfig
    consumers: tuple[ConsumerSummary, ...]
    committed: int
    closing: int
    held_open: int
    rolled_back: int
    retried: int
    passes: int
    runs: int
    seconds: float
    verification: Verification


def describe(condition: Condition) -> str:
    """A condition as one would write it with all_of / any_of."""
    if isinstance(condition, str):
        return condition
    if isinstance(condition, Ref):
        return f"{condition.kind}({condition.value!r})"
    if isinstance(condition, AnyOf):
        return "any_of(" + ", ".join(describe(c) for c in condition.items) + ")"
    items = condition.items if isinstance(condition, AllOf) else tuple(condition)
    return "all_of(" + ", ".join(describe(c) for c in items) + ")"


@dataclass
class _ProducerLog:
    #: Unique per demo run, in every idempotency key: a rerun in a kept namespace must not
    #: get the previous run's events back.
    run_token: str
    committed: dict[int, str] = field(default_factory=dict)
    rolled_back: list[int] = field(default_factory=list)
    held_open: int = 0
    retried: int = 0


def _produce(
    engine: Engine,
    namespace: str,
    index: int,
    cfg: DemoConfig,
    log: _ProducerLog,
    abort: threading.Event,
) -> None:
    rng = random.Random(None if cfg.seed is None else cfg.seed * 1000 + index)
    with engine.connect() as conn:
        for n in range(cfg.events_per_producer):
            if abort.is_set():  # another thread failed, or the user pressed Ctrl-C
                return
            asset = rng.choice(ASSETS)
            key = f"demo-{log.run_token}-producer-{index}-event-{n}"
            extra = {"producer": index, "n": n}
            late = rng.random() < cfg.late_fraction
            rollback = rng.random() < cfg.rollback_fraction
            tx = conn.begin()
            try:
                event = api.register_event(
                    conn,
                    asset,
                    extra=extra,
                    source=api.Source(dag_id=f"producer_{index}", task_id="publish"),
                    idempotency_key=key,
                    namespace=namespace,
                )
                if late:
                    # The late commit: the event has its timestamp, other producers commit
                    # newer events, schedulers consume them, and only then does this commit.
                    time.sleep(rng.uniform(*cfg.late_ms) / 1000)
                if rollback:
                    tx.rollback()
                    log.rolled_back.append(event.id)
                else:
                    tx.commit()
                    log.committed[event.id] = asset
                    log.held_open += late
            except BaseException:
                if tx.is_active:
                    tx.rollback()
                raise
            if not rollback and rng.random() < cfg.retry_fraction:
                # A producer that lost the acknowledgement retries with the same key: the
                # original event comes back and nothing new is queued.
                with conn.begin():
                    again = api.register_event(
                        conn, asset, extra=extra, idempotency_key=key, namespace=namespace
                    )
                if again.id != event.id or again.created:
                    raise DemoError(
                        f"retry of {key} created event {again.id}; expected event {event.id}"
                    )
                log.retried += 1
            time.sleep(rng.uniform(*cfg.pause_ms) / 1000)


def _schedule_loop(
    engine: Engine, namespace: str, stop: threading.Event, runs: list[api.Run], passes: list[int]
) -> None:
    while not stop.is_set():
        created = api.schedule(engine, namespace=namespace)
        runs.extend(created)
        passes.append(1)
        if not created:
            stop.wait(0.002)


class _Threads:
    """Threads that record their exception instead of printing it, and set ``abort`` so the
    other threads stop early."""

    def __init__(self, abort: threading.Event) -> None:
        self.threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []
        self.abort = abort

    def start(self, name: str, target: Callable[..., None], *args: Any) -> None:
        def run() -> None:
            try:
                target(*args)
            except BaseException as exc:
                self.errors.append(exc)
                self.abort.set()

        thread = threading.Thread(target=run, name=name, daemon=True)
        thread.start()
        self.threads.append(thread)

    def join(self) -> None:
        for thread in self.threads:
            thread.join()

    def raise_first(self) -> None:
        if self.errors:
            raise self.errors[0]


def _ns_sql(conn: Connection, namespace: str, statement: str) -> sa.TextClause:
    sql = statement.replace("{ns}", sqlfiles.NS_TOKEN)  # rendered with the table prefix, if any
    return sa.text(sqlfiles.render(sql, dialect_for(conn).quote_ns(namespace)))


def _in(name: str, values: Iterable[Any]) -> dict[str, Any]:
    return {name: list(values)}


def _server(engine: Engine) -> str:
    dialect = engine.dialect
    with engine.connect():  # server_version_info is filled on first connect
        pass
    version = ".".join(str(v) for v in (dialect.server_version_info or ())[:2])
    if dialect.name == "postgresql":
        return f"PostgreSQL {version}"
    return f"{'MariaDB' if getattr(dialect, 'is_mariadb', False) else 'MySQL'} {version}"


def _prepare(engine: Engine, namespace: str) -> bool:
    """Install assetq if needed and declare the consumers. True when this call installed it."""
    with engine.connect() as conn:
        fresh = migrate.current_revision(conn, namespace=namespace) is None
    migrate.install(engine, namespace=namespace)
    demo_ids = {dag_id for dag_id, _ in CONSUMERS}
    with engine.begin() as conn:
        others = sorted(
            str(row[0])
            for row in conn.execute(_ns_sql(conn, namespace, "SELECT dag_id FROM {ns}.dag"))
            if row[0] not in demo_ids
        )
        if others:
            shown = ", ".join(others[:5]) + (", ..." if len(others) > 5 else "")
            raise DemoError(
                f"namespace {namespace!r} already has consumers that are not the demo's"
                f" ({shown}); the demo's schedulers would create runs for them. Run the demo"
                f" in a namespace of its own (--namespace, default {DEMO_NAMESPACE!r})"
            )
        for dag_id, condition in CONSUMERS:
            api.declare_dag(conn, dag_id, condition, paused=False, namespace=namespace)
    return fresh


def _queued(engine: Engine, namespace: str) -> int:
    with engine.connect() as conn:
        stmt = _ns_sql(
            conn,
            namespace,
            "SELECT count(*) FROM {ns}.asset_dag_run_queue WHERE target_dag_id IN :dags",
        ).bindparams(sa.bindparam("dags", expanding=True))
        return int(conn.execute(stmt, _in("dags", (d for d, _ in CONSUMERS))).scalar_one())


def _verify(
    engine: Engine,
    namespace: str,
    committed: dict[int, str],
    rolled_back: Sequence[int],
    runs: Sequence[api.Run],
) -> tuple[Verification, Counter[str]]:
    dags = [d for d, _ in CONSUMERS]
    ours = set(committed) | set(rolled_back)
    low, high = min(ours), max(ours)
    with engine.connect() as conn:

        def select(statement: str, **params: Any) -> list[tuple[Any, ...]]:
            stmt = _ns_sql(conn, namespace, statement)
            if "dags" in params:
                stmt = stmt.bindparams(sa.bindparam("dags", expanding=True))
            return [tuple(row) for row in conn.execute(stmt, params)]

        uses: dict[str, set[str]] = defaultdict(set)
        for row in select(
            "SELECT r.dag_id, a.name FROM {ns}.dag_schedule_asset_reference r"
            " JOIN {ns}.asset a ON a.id = r.asset_id WHERE r.dag_id IN :dags",
            dags=dags,
        ):
            uses[str(row[1])].add(str(row[0]))
        links: Counter[tuple[str, int]] = Counter()
        for row in select(
            "SELECT dag_id, asset_event_id, count(*) FROM {ns}.dagrun_asset_event"
            " WHERE dag_id IN :dags AND asset_event_id BETWEEN :low AND :high"
            " GROUP BY dag_id, asset_event_id",
            dags=dags,
            low=low,
            high=high,
        ):
            if int(row[1]) in ours:
                links[(str(row[0]), int(row[1]))] = int(row[2])
        present = {
            int(row[0])
            for row in select(
                "SELECT id FROM {ns}.asset_event WHERE id BETWEEN :low AND :high",
                low=low,
                high=high,
            )
        }
        # A pair is late when an earlier run of the same consumer had already consumed an
        # event stamped at or after this one: a timestamp window starting at that run's
        # run_after would never have looked at it again.
        late: Counter[str] = Counter()
        for row in select(
            "SELECT l.dag_id, l.asset_event_id FROM {ns}.dagrun_asset_event l"
            " JOIN {ns}.dag_run r ON r.id = l.dag_run_id"
            " JOIN {ns}.asset_event e ON e.id = l.asset_event_id"
            " WHERE l.dag_id IN :dags AND l.asset_event_id BETWEEN :low AND :high"
            " AND EXISTS (SELECT 1 FROM {ns}.dag_run p WHERE p.dag_id = r.dag_id"
            " AND p.seq < r.seq AND p.run_after >= e.timestamp)",
            dags=dags,
            low=low,
            high=high,
        ):
            if int(row[1]) in committed:
                late[str(row[0])] += 1
    still_queued = _queued(engine, namespace)

    expected = {(dag, eid) for eid, asset in committed.items() for dag in uses[asset]}
    linked = set(links)
    reported = {(run.dag_id, eid) for run in runs for eid in run.event_ids if eid in ours}
    verification = Verification(
        expected_pairs=len(expected),
        linked_once=sum(1 for pair in expected if links.get(pair) == 1),
        lost=len(expected - linked),
        duplicated=sum(n - 1 for n in links.values() if n > 1),
        unexpected=len(linked - expected),
        still_queued=still_queued,
        missing_events=len(set(committed) - present),
        rolled_back=len(rolled_back),
        rolled_back_visible=len(set(rolled_back) & present),
        extra_events=len(present - ours),
        reported_mismatch=len(reported ^ linked),
    )
    return verification, late


def run_demo(
    url: str | URL,
    *,
    namespace: str = DEMO_NAMESPACE,
    config: DemoConfig | None = None,
    keep: bool = False,
) -> DemoResult:
    """Run the demonstration against ``url`` and return what the database says about it.

    Installs assetq into ``namespace`` if it is not there (and uninstalls it at the end
    unless ``keep``; a namespace that existed before is left in place), declares the demo's
    consumers (refusing a namespace that holds other consumers), then runs the producers and
    schedulers and verifies the outcome. Raises :class:`DemoError` when a thread fails.
    """
    cfg = config or DemoConfig()
    if cfg.producers < 1 or cfg.schedulers < 1 or cfg.events_per_producer < 1:
        raise DemoError("the demo needs at least one producer, one scheduler and one event")
    # As the command line builds it: psycopg's server-side prepares off unless the URL's
    # prepare_threshold says otherwise (they break behind a transaction pooler).
    parsed, connect_args = engine_arguments(sa.make_url(url))
    engine = sa.create_engine(
        parsed,
        connect_args=connect_args,
        pool_size=cfg.producers + cfg.schedulers + 2,
        max_overflow=cfg.schedulers,
    )
    try:
        server = _server(engine)
        installed_here = _prepare(engine, namespace)
        try:
            return _run(engine, server, namespace, cfg)
        finally:
            if installed_here and not keep:
                migrate.uninstall(engine, namespace=namespace)
    finally:
        engine.dispose()


def _run(engine: Engine, server: str, namespace: str, cfg: DemoConfig) -> DemoResult:
    token = secrets.token_hex(4)
    logs = [_ProducerLog(run_token=token) for _ in range(cfg.producers)]
    runs: list[api.Run] = []
    passes: list[int] = []
    stop = threading.Event()
    abort = threading.Event()
    schedulers = _Threads(abort)
    producers = _Threads(abort)
    started = time.monotonic()
    try:
        for s in range(cfg.schedulers):
            schedulers.start(
                f"scheduler-{s}", _schedule_loop, engine, namespace, stop, runs, passes
            )
        for p in range(cfg.producers):
            producers.start(f"producer-{p}", _produce, engine, namespace, p, cfg, logs[p], abort)
        producers.join()
        producers.raise_first()

        # One closing transaction with an event for every asset. It commits all of them at
        # once, so the next pass finds every asset of every condition queued: each AND
        # completes and the queue drains to empty. (Committed one by one, a run could take
        # the first few and leave the last waiting for a partner that never comes.)
        closing: dict[int, str] = {}
        with engine.begin() as conn:
            for asset in ASSETS:
                event = api.register_event(
                    conn, asset, extra={"closing": True}, namespace=namespace
                )
                closing[event.id] = asset
        deadline = time.monotonic() + cfg.drain_timeout
        while _queued(engine, namespace) and time.monotonic() < deadline and not schedulers.errors:
            time.sleep(0.02)
    finally:
        # Every thread ends before the caller may uninstall the namespace or stop the server.
        abort.set()
        producers.join()
        stop.set()
        schedulers.join()
    schedulers.raise_first()
    seconds = time.monotonic() - started

    committed: dict[int, str] = {}
    rolled_back: list[int] = []
    for log in logs:
        committed.update(log.committed)
        rolled_back.extend(log.rolled_back)
    committed.update(closing)
    verification, late = _verify(engine, namespace, committed, rolled_back, runs)

    per_dag_runs = Counter(run.dag_id for run in runs)
    per_dag_events: Counter[str] = Counter()
    for run in runs:
        per_dag_events[run.dag_id] += len(run.event_ids)
    consumers = tuple(
        ConsumerSummary(
            dag_id=dag_id,
            condition=describe(condition),
            runs=per_dag_runs[dag_id],
            events=per_dag_events[dag_id],
            late=late[dag_id],
        )
        for dag_id, condition in CONSUMERS
    )
    return DemoResult(
        server=server,
        namespace=namespace,
        config=cfg,
        consumers=consumers,
        committed=len(committed) - len(closing),
        closing=len(closing),
        held_open=sum(log.held_open for log in logs),
        rolled_back=len(rolled_back),
        retried=sum(log.retried for log in logs),
        passes=len(passes),
        runs=len(runs),
        seconds=seconds,
        verification=verification,
    )


def format_report(result: DemoResult) -> str:
    """The demo's outcome as a few lines of text."""
    cfg = result.config
    lo, hi = cfg.late_ms
    width = max(len(c.condition) for c in result.consumers)
    dag_width = max(len(c.dag_id) for c in result.consumers)
    late = sum(c.late for c in result.consumers)
    lines = [
        f"producers   {cfg.producers} threads, {result.committed + result.rolled_back:,} events,"
        " each in its own transaction:",
        f"            {result.held_open} committed late (held open {lo:g}-{hi:g} ms after the"
        f" insert), {result.rolled_back} rolled back,",
        f"            {result.retried} retried with their idempotency key (no second event);",
        f"            then one closing transaction with an event for each of the"
        f" {result.closing} assets",
        f"schedulers  {cfg.schedulers} threads calling assetq.schedule concurrently:"
        f" {result.passes:,} passes, {result.runs:,} runs",
        f"time        {result.seconds:.1f} s",
        "",
        f"{'consumer':<{dag_width}}  {'condition':<{width}}  {'runs':>5}  {'events':>6}"
        f"  {'late':>4}",
    ]
    for c in result.consumers:
        lines.append(
            f"{c.dag_id:<{dag_width}}  {c.condition:<{width}}  {c.runs:>5}  {c.events:>6}"
            f"  {c.late:>4}"
        )
    lines += [
        "",
        f"late: {late} of these (consumer, event) pairs committed after a run of that consumer"
        " had already",
        "consumed a newer event. A timestamp window (Airflow 3.0-3.3) never looks back at"
        " them; assetq",
        "consumed each one in a later run.",
        "",
        result.verification.line(),
    ]
    return "\n".join(lines)
