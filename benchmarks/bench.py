"""assetq benchmarks, both engines, one command: writes docs/benchmarks.md, its PNG plots and
the raw figures (docs/benchmarks.json).

    python benchmarks/bench.py            # the full run, about 40 minutes on 2 cores (a
                                          # dozen of them the worker burn-down, 13-15 the
                                          # peers)
    python benchmarks/bench.py --quick    # a smoke run of every figure, well under a minute

What is measured (each figure a median of repetitions with min-max; within a repetition the
alternatives take turns in slices of a quarter second, so load from elsewhere on the machine
falls on all of them alike, and ratios are taken per repetition):

registration
    events/s of 1, 8 and 16 threads, each thread its own connection, each event its own
    committed transaction (commits that do not wait for the disk; the same at one thread with
    durable commits as well), 4 consumers per asset: ``assetq.register_event`` on an autocommit
    connection (one round trip: the call is its own transaction), the same call inside
    BEGIN ... COMMIT, the same rows written by plain client statements (two INSERTs in a
    transaction: benchmarks/register.py's plain path, with the fan-out trigger switched off in
    its namespace), and an Airflow-style path (SQLAlchemy Core: select the asset, insert the
    event, select its consumers, upsert one queue row per consumer, in a transaction; the
    trigger is off there too).
batch
    events/s of ``assetq.register_events`` with 1,000 events per call (one transaction per
    call) against single ``register_event`` calls, each in its own transaction, and 1,000
    single calls in one transaction.
pass
    time of one scheduler pass over 500 queued rows (50 events, each queued for the 10
    consumers of its asset, out of 1,000 consumers on 100 assets) with 10k, 100k and 1M
    consumed events of history (tests/history.py: set-based, events linked to runs 4 by 4),
    against the timestamp-window baseline of tests/stress.py (``WindowAlgorithm``) with the
    same history in its own tables. Every level is loaded first, in a namespace (and, for the
    baseline, a schema) of its own; each repetition then runs both passes at every level.
large run
    time and Python memory (tracemalloc peak) of one pass that consumes 1k, 10k and 50k
    events queued for one consumer.
burndown
    runs/s of a no-op burn-down of 10,000 queued runs by 8 worker threads (claim_runs with
    limit 1, complete_run as success), with no other runs and with 100,000 finished runs in
    the tables, against procrastinate's fetch + finish of 10,000 jobs on the same PostgreSQL
    server (no peer on MariaDB), in 3 interleaved rounds; and the counters of one claim with
    and without the history (benchmarks/burndown.py, which also runs alone). procrastinate
    is installed into the running environment first when it is missing.

peers
    assetq side by side with PgQ, pgmq and procrastinate in the same database, interleaved
    (benchmarks/peers.py, which says how each peer is installed and driven): producer at 1
    and 8 clients with 1 and 4 consumers, batches of 1,000 events, drains of a 100,000-event
    backlog at a whole / 1,000 / 1 events per run, and where the producer's time goes (assetq
    against copies of its schema without one part each); on MariaDB, where none of them
    runs, assetq's producer against plain statements. The peers are installed when missing
    (apt-get for PgQ, pip for pgmq and procrastinate).

``--merge`` keeps the other figures of docs/benchmarks.json and replaces those measured
(``--figures peers --merge`` refreshes that section alone; the page says which run measured
what).

Servers: PostgreSQL at ``--postgres`` (default: the local server, postgres@127.0.0.1:5432), in
a database ``aqp_bench_<pid>`` created for the run and dropped after; MariaDB/MySQL on a
throw-away server started from this machine's mariadbd/mysqld (tests/dbs.py), or at
``--mysql URL`` in databases ``aqp_*`` dropped after. Needs the test and bench extras
(``pip install -e '.[test,bench]'``).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import platform
import signal
import statistics
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection, Engine
from sqlalchemy.dialects import mysql as mysql_dialect
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.engine import make_url

import assetq
from assetq import sqlfiles
from assetq.dialects import Dialect, dialect_for

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _path in (HERE, ROOT / "tests"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import burndown  # noqa: E402  (benchmarks/burndown.py: the worker burn-down)
import peers  # noqa: E402  (benchmarks/peers.py: PgQ, pgmq, procrastinate side by side)
import register  # noqa: E402  (benchmarks/register.py: the plain-statements path)


def _tests_module(name: str) -> ModuleType:
    """A helper module of the test suite (tests/): dbs, history, stress."""
    return importlib.import_module(name)


ENGINES = ("postgresql", "mysql")
LOCAL_POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


@dataclass(frozen=True)
class Config:
    threads: tuple[int, ...] = (1, 8, 16)
    seconds: float = 2.0  # one registration round
    repetitions: int = 3
    reg_consumers: int = 4  # consumers per asset in the registration figures
    reg_assets: int = 4
    batch_size: int = 1_000
    batch_seconds: float = 2.0
    consumers: int = 1_000  # pass figure
    assets: int = 100
    pending_events: int = 50  # each queued for consumers / assets consumers: 500 rows
    history: tuple[int, ...] = (10_000, 100_000, 1_000_000)
    pass_repetitions: int = 5
    run_sizes: tuple[int, ...] = (1_000, 10_000, 50_000)
    run_repetitions: int = 3
    burndown_runs: int = 10_000  # worker burn-down figure (benchmarks/burndown.py)
    burndown_threads: int = 8
    burndown_rounds: int = 3
    burndown_history: int = 100_000
    burndown_probes: int = 20
    #: "install" (procrastinate pip-installed when missing), "if-installed" or "off".
    burndown_peer: str = "install"
    peers_clients: tuple[int, ...] = (1, 8)  # the peers figure (benchmarks/peers.py)
    peers_consumers: tuple[int, ...] = (1, 4)
    peers_seconds: float = 2.0
    peers_repetitions: int = 5
    peers_batch: int = 1_000
    peers_backlog: int = 100_000
    peers_whole_repetitions: int = 7
    peers_profile: int = 99  # variants of the producer profile measured (0: none)
    peers_floors: bool = True  # the floors of the missed targets (peers.measure_floors)
    #: "install" (PgQ, pgmq, procrastinate installed when missing), "if-installed" or "off".
    peers_install: str = "install"


FULL = Config()
QUICK = Config(
    threads=(1, 2),
    seconds=0.3,
    repetitions=1,
    batch_size=100,
    batch_seconds=0.3,
    consumers=20,
    assets=10,
    pending_events=5,
    history=(1_000, 2_000),
    pass_repetitions=1,
    run_sizes=(100, 1_000),
    run_repetitions=1,
    burndown_runs=1_000,
    burndown_threads=4,
    burndown_rounds=1,
    burndown_history=10_000,
    burndown_probes=5,
    peers_clients=(1, 2),
    peers_seconds=0.25,
    peers_repetitions=1,
    peers_batch=50,
    peers_backlog=2_000,
    peers_whole_repetitions=1,
)


@dataclass(frozen=True)
class Target:
    """Where the figures run. ``engine``'s commits do not wait for the disk (PostgreSQL:
    synchronous_commit off for its sessions; the throw-away MariaDB flushes its log once a
    second), so the figures compare the work of the client and the server, not the disk's
    flush latency. ``durable``, where the benchmark may switch it, gives an engine on the
    same database whose every commit waits for the disk."""

    engine: Engine
    durable: Callable[[], AbstractContextManager[Engine]] | None = None


# -- SQL -----------------------------------------------------------------------------------


@functools.cache
def _queries(engine_name: str) -> dict[str, str]:
    return sqlfiles.parse_queries((HERE / "sql" / f"{engine_name}.sql").read_text("utf-8"))


def _sql(dialect: Dialect, name: str, namespace: str = "") -> sa.TextClause:
    quoted = dialect.quote_ns(namespace) if namespace else ""
    return sa.text(sqlfiles.render(_queries(dialect.name)[name], quoted))


def _run_sql(conn: Connection, name: str, **params: Any) -> list[sa.Row[Any]]:
    result = conn.execute(_sql(dialect_for(conn), name), params)
    return list(result.all()) if result.returns_rows else []


# -- small helpers --------------------------------------------------------------------------


def _fresh_namespace(engine: Engine, namespace: str) -> None:
    assetq.uninstall(engine, namespace=namespace)
    assetq.install(engine, namespace=namespace)


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def _rotated(items: Sequence[Any], rep: int) -> list[Any]:
    """The alternatives in a different order each repetition: none always goes first."""
    k = rep % len(items)
    return list(items[k:]) + list(items[:k])


#: Length of one slice of a round: the alternatives take turns slice by slice, so a burst of
#: load from elsewhere on the machine (a shared 2-core box) falls on all of them alike.
SLICE_SECONDS = 0.25


def _slices(seconds: float) -> int:
    return max(1, round(seconds / SLICE_SECONDS))


def _progress(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


# -- registration ----------------------------------------------------------------------------

PROC_NS = "aqp_reg_proc"
PLAIN_NS = "aqp_reg_plain"
AIRFLOW_NS = "aqp_reg_airflow"


class AirflowStylePath:
    """What Airflow 3's AssetManager.register_asset_change does for one event, reduced to its
    round trips, with SQLAlchemy Core on assetq's tables: select the asset, insert the event
    (the id comes back with it), select the unpaused consumers of the asset, and upsert one
    queue row per consumer, one statement each (Airflow's executemany under psycopg2, and its
    session.merge per consumer on MySQL, cost a round trip per row too), inside the caller's
    transaction. The timestamp is taken in Python, as Airflow's model default does. Leaner than
    Airflow's ORM path: no model objects, no relationship loading, no flushes."""

    def __init__(self, dialect_name: str, namespace: str) -> None:
        self.postgres = dialect_name == "postgresql"
        md = sa.MetaData(schema=namespace)
        timestamp = sa.DateTime(timezone=True).with_variant(
            mysql_dialect.DATETIME(fsp=6), "mysql", "mariadb"
        )
        extra = sa.JSON().with_variant(pg_dialect.JSONB(), "postgresql")
        asset = sa.Table(
            "asset",
            md,
            sa.Column("id", sa.BigInteger, primary_key=True),
            sa.Column("name", sa.String),
        )
        event = sa.Table(
            "asset_event",
            md,
            sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
            sa.Column("asset_id", sa.BigInteger),
            sa.Column("extra", extra),
            sa.Column("timestamp", timestamp),
        )
        dag = sa.Table(
            "dag",
            md,
            sa.Column("dag_id", sa.String, primary_key=True),
            sa.Column("is_paused", sa.Boolean),
        )
        ref = sa.Table(
            "dag_schedule_asset_reference",
            md,
            sa.Column("asset_id", sa.BigInteger, primary_key=True),
            sa.Column("dag_id", sa.String, primary_key=True),
        )
        queue = sa.Table(
            "asset_dag_run_queue",
            md,
            sa.Column("target_dag_id", sa.String, primary_key=True),
            sa.Column("asset_event_id", sa.BigInteger, primary_key=True),
            sa.Column("asset_id", sa.BigInteger),
            sa.Column("created_at", timestamp),
        )
        self.select_asset = sa.select(asset.c.id).where(asset.c.name == sa.bindparam("name"))
        self.insert_event = sa.insert(event)
        self.select_consumers = (
            sa.select(ref.c.dag_id)
            .join(dag, dag.c.dag_id == ref.c.dag_id)
            .where(ref.c.asset_id == sa.bindparam("asset_id"), dag.c.is_paused.is_(False))
        )
        self.upsert_queue: Any
        if self.postgres:
            self.upsert_queue = pg_dialect.insert(queue).on_conflict_do_nothing()
        else:
            stmt = mysql_dialect.insert(queue)
            self.upsert_queue = stmt.on_duplicate_key_update(asset_id=stmt.inserted.asset_id)

    def register(self, conn: Connection, asset: str) -> None:
        now = datetime.now(timezone.utc)
        stamp = now if self.postgres else now.replace(tzinfo=None)
        asset_id = conn.execute(self.select_asset, {"name": asset}).scalar_one()
        result = conn.execute(
            self.insert_event, {"asset_id": asset_id, "extra": {}, "timestamp": stamp}
        )
        key = result.inserted_primary_key
        assert key is not None
        event_id = key[0]
        consumers = conn.execute(self.select_consumers, {"asset_id": asset_id}).scalars().all()
        for dag_id in consumers:
            conn.execute(
                self.upsert_queue,
                {
                    "target_dag_id": dag_id,
                    "asset_event_id": event_id,
                    "asset_id": asset_id,
                    "created_at": stamp,
                },
            )


@dataclass(frozen=True)
class Variant:
    label: str
    register: Callable[[Connection, str], None]
    #: The call is its own transaction (autocommit connection), not wrapped in BEGIN/COMMIT.
    autocommit: bool = False


def _registration_variants(dialect: Dialect) -> list[Variant]:
    plain = register.PLAIN_PATHS[dialect.name]
    airflow = AirflowStylePath(dialect.name, AIRFLOW_NS)

    def via_assetq(conn: Connection, asset: str) -> None:
        assetq.register_event(conn, asset, namespace=PROC_NS)

    def via_plain(conn: Connection, asset: str) -> None:
        plain.register(conn, dialect, PLAIN_NS, asset)

    return [
        Variant("assetq (own transaction)", via_assetq, autocommit=True),
        Variant("assetq in BEGIN/COMMIT", via_assetq),
        Variant("plain statements", via_plain),
        Variant("Airflow-style path", airflow.register),
    ]


def _setup_registration(engine: Engine, cfg: Config) -> Dialect:
    names = [f"asset_{i}" for i in range(cfg.reg_assets)]
    for namespace in (PROC_NS, PLAIN_NS, AIRFLOW_NS):
        _fresh_namespace(engine, namespace)
        with engine.begin() as conn:
            for c in range(cfg.reg_consumers):
                assetq.declare_dag(
                    conn, f"consumer_{c}", assetq.any_of(*names), namespace=namespace
                )
    with engine.begin() as conn:
        dialect = dialect_for(conn)
        plain = register.PLAIN_PATHS[dialect.name]
        for namespace in (PLAIN_NS, AIRFLOW_NS):
            plain.disable_fan_out(conn, dialect, namespace)
    return dialect


def _registration_round(
    engine: Engine, variant: Variant, threads: int, seconds: float, assets: int
) -> tuple[int, float]:
    """Events registered by ``threads`` threads in about ``seconds``, and the time taken."""
    started: list[float] = []
    barrier = threading.Barrier(threads, action=lambda: started.append(time.perf_counter()))
    counts = [0] * threads
    finished = [0.0] * threads
    failures: list[BaseException] = []

    def once(conn: Connection, asset: str) -> None:
        if variant.autocommit:
            variant.register(conn, asset)
        else:
            with conn.begin():
                variant.register(conn, asset)

    def work(index: int) -> None:
        asset = f"asset_{index % assets}"
        try:
            with engine.connect() as raw:
                conn = (
                    raw.execution_options(isolation_level="AUTOCOMMIT")
                    if variant.autocommit
                    else raw
                )
                once(conn, asset)  # warm up: connection, prepared statements, caches
                barrier.wait()
                deadline = started[0] + seconds
                n = 0
                while time.perf_counter() < deadline:
                    once(conn, asset)
                    n += 1
                counts[index] = n
                finished[index] = time.perf_counter()
        except BaseException as exc:  # re-raised below
            failures.append(exc)
            barrier.abort()

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if failures:
        raise failures[0]
    return sum(counts), max(finished) - started[0]


def _check_registration_rows(engine: Engine, dialect: Dialect, cfg: Config) -> dict[str, int]:
    """Every variant must have written the same shape of rows: one queue row per consumer
    per event, carrying the event's timestamp."""
    events: dict[str, int] = {}
    with engine.connect() as conn:
        for namespace in (PROC_NS, PLAIN_NS, AIRFLOW_NS):
            (row,) = conn.execute(_sql(dialect, "registration_rows", namespace)).all()
            n_events, queued, stamped = (int(v) for v in row)
            if queued != n_events * cfg.reg_consumers or stamped != queued:
                raise SystemExit(
                    f"{namespace}: {n_events} events, {queued} queue rows ({stamped} with the"
                    f" event's timestamp): the registration variants did not write the same rows"
                )
            events[namespace] = n_events
    return events


def _registration_rates(
    engine: Engine, variants: Sequence[Variant], threads_list: Sequence[int], cfg: Config, what: str
) -> dict[str, dict[str, list[float]]]:
    rates: dict[str, dict[str, list[float]]] = {v.label: {} for v in variants}
    slices = _slices(cfg.seconds)
    for rep in range(cfg.repetitions):
        for threads in threads_list:
            done: dict[str, list[float]] = {v.label: [0, 0.0] for v in variants}
            for k in range(slices):
                for variant in _rotated(variants, rep + k):
                    events, elapsed = _registration_round(
                        engine, variant, threads, cfg.seconds / slices, cfg.reg_assets
                    )
                    done[variant.label][0] += events
                    done[variant.label][1] += elapsed
            got = {label: n / t for label, (n, t) in done.items()}
            for label, rate in got.items():
                rates[label].setdefault(str(threads), []).append(rate)
            _progress(
                f"{what} {rep + 1}/{cfg.repetitions}, {threads} threads: "
                + ", ".join(f"{k} {v:,.0f}/s" for k, v in got.items())
            )
    return rates


def measure_registration(target: Target, cfg: Config) -> dict[str, Any]:
    engine = target.engine
    dialect = _setup_registration(engine, cfg)
    variants = _registration_variants(dialect)
    result: dict[str, Any] = {
        "threads": list(cfg.threads),
        "rates": _registration_rates(engine, variants, cfg.threads, cfg, "registration"),
        "consumers_per_asset": cfg.reg_consumers,
    }
    if target.durable is not None:
        # The same at one thread with every commit waiting for the disk: the flush costs
        # the same for every variant and dwarfs the round trips that differ.
        with target.durable() as durable:
            result["durable_rates"] = _registration_rates(
                durable, variants, (1,), cfg, "registration, durable commits"
            )
    result["events_written"] = _check_registration_rows(engine, dialect, cfg)
    for namespace in (PROC_NS, PLAIN_NS, AIRFLOW_NS):
        assetq.uninstall(engine, namespace=namespace)
    return result


# -- batch registration ----------------------------------------------------------------------

BATCH_NS = "aqp_batch"


def measure_batch(target: Target, cfg: Config) -> dict[str, Any]:
    engine = target.engine
    _fresh_namespace(engine, BATCH_NS)
    names = [f"asset_{i}" for i in range(cfg.reg_assets)]
    with engine.begin() as conn:
        for c in range(cfg.reg_consumers):
            assetq.declare_dag(conn, f"consumer_{c}", assetq.any_of(*names), namespace=BATCH_NS)
    batch = [assetq.NewEvent(names[i % len(names)]) for i in range(cfg.batch_size)]

    def batches(conn: Connection) -> int:
        with conn.begin():
            assetq.register_events(conn, batch, namespace=BATCH_NS)
        return len(batch)

    def singles_own_transaction(conn: Connection) -> int:  # on an autocommit connection
        for name in names:
            assetq.register_event(conn, name, namespace=BATCH_NS)
        return len(names)

    def singles_one_transaction(conn: Connection) -> int:
        with conn.begin():
            for item in batch:
                assetq.register_event(conn, item.asset, namespace=BATCH_NS)
        return len(batch)

    # (label, one step, whether the connection is in autocommit mode)
    variants: list[tuple[str, Callable[[Connection], int], bool]] = [
        (f"register_events, {cfg.batch_size:,} per call", batches, False),
        ("register_event, each its own transaction", singles_own_transaction, True),
        (f"register_event x {cfg.batch_size:,} in one transaction", singles_one_transaction, False),
    ]
    rates: dict[str, list[float]] = {label: [] for label, _, _ in variants}
    slices = _slices(cfg.batch_seconds)
    for rep in range(cfg.repetitions):
        done: dict[str, list[float]] = {label: [0, 0.0] for label, _, _ in variants}
        for k in range(slices):
            for label, step, autocommit in _rotated(variants, rep + k):
                with engine.connect() as raw:
                    conn = (
                        raw.execution_options(isolation_level="AUTOCOMMIT") if autocommit else raw
                    )
                    step(conn)  # warm up
                    n, started = 0, time.perf_counter()
                    while time.perf_counter() - started < cfg.batch_seconds / slices:
                        n += step(conn)
                    done[label][0] += n
                    done[label][1] += time.perf_counter() - started
        for label, (events, seconds) in done.items():
            rates[label].append(events / seconds)
        _progress(
            f"batch {rep + 1}/{cfg.repetitions}: "
            + ", ".join(f"{k} {v[-1]:,.0f}/s" for k, v in rates.items())
        )
    assetq.uninstall(engine, namespace=BATCH_NS)
    return {"batch_size": cfg.batch_size, "rates": rates}


# -- scheduler pass against history ---------------------------------------------------------

PASS_NS = "aqp_pass"
#: Rows per statement of the window baseline's history on MySQL (benchmarks/sql/mysql.sql).
_WINDOW_CHUNK = {"postgresql": 1_000_000, "mysql": 10_000}


@contextmanager
def _window_topology(stress: ModuleType, topology: dict[str, str]) -> Iterator[None]:
    """WindowAlgorithm reads its consumers from tests/stress.py's module-level TOPOLOGY and
    SUBSCRIBED: pointed at ours for the figure, restored after."""
    saved = getattr(stress, "TOPOLOGY"), getattr(stress, "SUBSCRIBED")  # noqa: B009
    setattr(stress, "TOPOLOGY", dict(topology))  # noqa: B010
    setattr(stress, "SUBSCRIBED", {dag: {asset} for dag, asset in topology.items()})  # noqa: B010
    try:
        yield
    finally:
        setattr(stress, "TOPOLOGY", saved[0])  # noqa: B010
        setattr(stress, "SUBSCRIBED", saved[1])  # noqa: B010


def _add_window_history(engine: Engine, first: int, events: int, cfg: Config) -> None:
    with engine.connect() as conn:
        dialect_name = dialect_for(conn).name
    chunk = _WINDOW_CHUNK[dialect_name]  # a multiple of the 4 events per run
    done = 0
    while done < events:
        n = min(chunk, events - done)
        with engine.begin() as conn:
            params = {"first": first + done, "n": n}
            _run_sql(conn, "window_history_events", assets=cfg.assets, **params)
            _run_sql(conn, "window_history_runs", n=-(-n // 4), consumers=cfg.consumers)
            _run_sql(conn, "window_history_links", per_run=4, **params)
        done += n
    with engine.begin() as conn:
        _run_sql(conn, "window_history_done")
    with engine.connect() as conn:
        _run_sql(conn, "window_analyze")
        conn.commit()


@contextmanager
def _engine_in(base: Engine, schema: str) -> Iterator[Engine]:
    """An engine like ``base`` whose default schema (PostgreSQL) or database (MySQL) is
    ``schema``, created for it and dropped after: the window baseline names its tables
    without a schema, so each history level gets a schema of its own."""
    with base.begin() as conn:
        dialect = dialect_for(conn)
        conn.execute(_sql(dialect, "create_schema", schema))
    if dialect.name == "postgresql":
        options = f"-c search_path={schema} -c synchronous_commit=off"
        engine = sa.create_engine(base.url, connect_args={"options": options})
    else:
        engine = sa.create_engine(base.url.set(database=schema))
    try:
        yield engine
    finally:
        engine.dispose()
        with base.begin() as conn:
            conn.execute(_sql(dialect, "drop_schema", schema))


def measure_pass(target: Target, cfg: Config) -> dict[str, Any]:
    """The pass at every history level, side by side: each level has its own namespace (and
    the baseline its own schema), all loaded first, and every repetition runs a pass at every
    level, so the ratio between levels is not a ratio between two moments of the machine."""
    engine = target.engine
    history = _tests_module("history")
    stress = _tests_module("stress")
    topology = {f"consumer_{i:04d}": f"a{i % cfg.assets}" for i in range(cfg.consumers)}
    pending = [f"a{i}" for i in range(cfg.pending_events)]
    expected_runs = sum(1 for asset in topology.values() if asset in set(pending))
    levels = sorted(cfg.history)
    result: dict[str, Any] = {
        "consumers": cfg.consumers,
        "queued_rows": expected_runs,
        "history": levels,
        "assetq": {},
        "window": {},
        "load_s": {},
    }

    def assetq_pass(namespace: str) -> float:
        with engine.begin() as conn:
            assetq.register_events(conn, [{"asset": a} for a in pending], namespace=namespace)
        t0 = time.perf_counter()
        runs = assetq.schedule(engine, limit=cfg.consumers, namespace=namespace)
        elapsed = time.perf_counter() - t0
        if len(runs) != expected_runs:
            raise SystemExit(f"assetq pass created {len(runs)} runs, not {expected_runs}")
        return elapsed

    def window_pass(window: Any) -> float:
        with window.engine.begin() as conn:
            for asset in pending:
                window.register(conn, asset)
        t0 = time.perf_counter()
        runs = window.schedule()
        elapsed = time.perf_counter() - t0
        if len(runs) != expected_runs:
            raise SystemExit(f"window pass created {len(runs)} runs, not {expected_runs}")
        return elapsed

    with _window_topology(stress, topology), ExitStack() as stack:
        windows: dict[int, Any] = {}
        for level in levels:
            started = time.perf_counter()
            namespace = f"aqp_pass_{level}"
            _fresh_namespace(engine, namespace)
            stack.callback(assetq.uninstall, engine, namespace=namespace)
            with engine.begin() as conn:
                for dag_id, asset in topology.items():
                    assetq.declare_dag(conn, dag_id, asset, namespace=namespace)
            history.add_history(engine, level, namespace=namespace)
            window_engine = stack.enter_context(_engine_in(engine, f"aqp_window_{level}"))
            windows[level] = stress.WindowAlgorithm(window_engine)
            windows[level].setup()
            _add_window_history(window_engine, 0, level, cfg)
            result["load_s"][str(level)] = round(time.perf_counter() - started, 1)
            _progress(
                f"pass: {level:,} events of history loaded in {result['load_s'][str(level)]} s"
            )
        for rep in range(cfg.pass_repetitions):
            for i, level in enumerate(_rotated(levels, rep)):
                passes: list[tuple[str, Callable[[], float]]] = [
                    ("assetq", functools.partial(assetq_pass, f"aqp_pass_{level}")),
                    ("window", functools.partial(window_pass, windows[level])),
                ]
                for label, measure in _rotated(passes, rep + i):
                    result[label].setdefault(str(level), []).append(measure())
            _progress(
                f"pass {rep + 1}/{cfg.pass_repetitions}: "
                + ", ".join(
                    f"{level:,}: assetq {result['assetq'][str(level)][-1] * 1000:.0f} ms,"
                    f" window {result['window'][str(level)][-1] * 1000:.0f} ms"
                    for level in levels
                )
            )
    return result


# -- one large run ---------------------------------------------------------------------------

RUN_NS = "aqp_run"


def measure_large_run(target: Target, cfg: Config) -> dict[str, Any]:
    engine = target.engine
    _fresh_namespace(engine, RUN_NS)
    with engine.begin() as conn:
        assetq.declare_dag(conn, "consumer", "orders", namespace=RUN_NS)

    def one_run(events: int) -> tuple[float, int]:
        with engine.begin() as conn:
            for start in range(0, events, assetq.BATCH_MAX_EVENTS):
                size = min(assetq.BATCH_MAX_EVENTS, events - start)
                assetq.register_events(conn, [{"asset": "orders"}] * size, namespace=RUN_NS)
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            base = tracemalloc.get_traced_memory()[0]
            t0 = time.perf_counter()
            runs = assetq.schedule(engine, namespace=RUN_NS)
            elapsed = time.perf_counter() - t0
            peak = tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()
        if len(runs) != 1 or len(runs[0].event_ids) != events:
            raise SystemExit(f"the run did not consume the {events} queued events")
        return elapsed, peak

    one_run(10)  # warm up
    seconds: dict[str, list[float]] = {}
    peaks: dict[str, list[int]] = {}
    for rep in range(cfg.run_repetitions):
        for size in _rotated(list(cfg.run_sizes), rep):
            elapsed, peak = one_run(size)
            seconds.setdefault(str(size), []).append(elapsed)
            peaks.setdefault(str(size), []).append(peak)
        _progress(
            f"large run {rep + 1}/{cfg.run_repetitions}: "
            + ", ".join(f"{k} events {v[-1] * 1000:.0f} ms" for k, v in seconds.items())
        )
    assetq.uninstall(engine, namespace=RUN_NS)
    return {"sizes": list(cfg.run_sizes), "seconds": seconds, "peak_bytes": peaks}


# -- worker burn-down ------------------------------------------------------------------------


def measure_burndown(target: Target, cfg: Config) -> dict[str, Any]:
    """benchmarks/burndown.py: N queued runs claimed and completed by T worker threads,
    against procrastinate's fetch + finish on PostgreSQL (installed first when missing)."""
    settings = burndown.Settings(
        runs=cfg.burndown_runs,
        threads=cfg.burndown_threads,
        rounds=cfg.burndown_rounds,
        history=cfg.burndown_history,
        probes=cfg.burndown_probes,
        peer=cfg.burndown_peer,
    )
    return burndown.measure(target.engine, settings)


# -- the peers -------------------------------------------------------------------------------


def measure_peers(target: Target, cfg: Config) -> dict[str, Any]:
    """benchmarks/peers.py: producer, batch, drain, the producer's profile and the floors of
    the missed targets against PgQ, pgmq and procrastinate on PostgreSQL (installed first
    when missing); assetq against plain statements on MySQL/MariaDB, where none of them
    runs."""
    settings = peers.Settings(
        clients=cfg.peers_clients,
        consumers=cfg.peers_consumers,
        seconds=cfg.peers_seconds,
        repetitions=cfg.peers_repetitions,
        batch_size=cfg.peers_batch,
        backlog=cfg.peers_backlog,
        whole_repetitions=cfg.peers_whole_repetitions,
        profile=cfg.peers_profile,
        floors=cfg.peers_floors,
        install=cfg.peers_install,
    )
    return peers.measure(target.engine, settings)


# -- servers ---------------------------------------------------------------------------------


@dataclass
class Server:
    engine_name: str
    target: Target
    description: str
    close: Callable[[], None]
    settings: dict[str, str] = field(default_factory=dict)


def _postgres_server(admin_url: str, name: str | None = None) -> Server:
    url = make_url(admin_url)
    name = name or f"aqp_bench_{os.getpid()}"
    dialect = assetq.dialects.POSTGRESQL
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(_sql(dialect, "create_database", name))
    database = url.set(database=name)
    # A session setting of the benchmark's connections, not a change to the server.
    fast = sa.create_engine(
        database,
        pool_size=20,
        max_overflow=4,
        connect_args={"options": "-c synchronous_commit=off"},
    )

    @contextmanager
    def durable() -> Iterator[Engine]:
        engine = sa.create_engine(database, pool_size=4, max_overflow=0)
        try:
            yield engine
        finally:
            engine.dispose()

    def close() -> None:
        fast.dispose()
        with admin.connect() as conn:
            conn.execute(_sql(dialect, "drop_database", name))
        admin.dispose()

    return Server(
        "postgresql",
        Target(fast, durable),
        f"PostgreSQL at {url.host}:{url.port or 5432}",
        close,
    )


def _mysql_server(choice: str, name: str | None = None) -> Server:
    dialect = assetq.dialects.MYSQL
    if choice == "private":
        dbs = _tests_module("dbs")
        backend = dbs.MySQLBackend(private=True)
        database = backend.database(installed=False)
        engine = backend.create_engine(database.url, pool_size=20, max_overflow=4)
        with engine.begin() as conn:  # our own throw-away server
            conn.execute(_sql(dialect, "grow_buffer_pool"))

        @contextmanager
        def durable() -> Iterator[Engine]:
            with engine.begin() as conn:
                conn.execute(_sql(dialect, "flush_log_at_commit"), {"mode": 1})
            try:
                yield engine
            finally:
                with engine.begin() as conn:
                    conn.execute(_sql(dialect, "flush_log_at_commit"), {"mode": 2})

        def close() -> None:
            engine.dispose()
            backend.drop(database)
            backend.close()

        return Server("mysql", Target(engine, durable), str(backend.description), close)
    url = make_url(choice)
    if url.drivername in ("mysql", "mariadb"):
        url = url.set(drivername="mysql+pymysql")
    name = name or "aqp_bench_app"
    admin = sa.create_engine(url.set(database=None))
    with admin.begin() as conn:
        conn.execute(_sql(dialect, "drop_database", name))
        conn.execute(_sql(dialect, "create_database", name))
    engine = sa.create_engine(url.set(database=name), pool_size=20, max_overflow=4)

    def close_url() -> None:
        engine.dispose()
        with admin.begin() as conn:
            conn.execute(_sql(dialect, "drop_database", name))
        admin.dispose()

    # Not our server: its durability settings are left as they are.
    return Server("mysql", Target(engine), f"MySQL at {url.host}:{url.port or 3306}", close_url)


def _settings(engine: Engine) -> dict[str, str]:
    with engine.connect() as conn:
        rows = _run_sql(conn, "settings")
    return {str(name): str(value) for name, value in (tuple(r)[:2] for r in rows)}


# -- the run ---------------------------------------------------------------------------------

FIGURES: dict[str, Callable[[Target, Config], dict[str, Any]]] = {
    "registration": measure_registration,
    "batch": measure_batch,
    "pass": measure_pass,
    "large_run": measure_large_run,
    "burndown": measure_burndown,
    "peers": measure_peers,
}


def run_engine(target: Target, cfg: Config, figures: Sequence[str]) -> dict[str, Any]:
    """Every figure on one engine (the database behind ``target``)."""
    results: dict[str, Any] = {}
    for name in figures:
        started = time.perf_counter()
        _progress(f"{target.engine.dialect.name}: {name}")
        results[name] = FIGURES[name](target, cfg)
        results[name]["elapsed_s"] = round(time.perf_counter() - started, 1)
    return results


def _machine() -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = ""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                memory = f"{int(line.split()[1]) / 1024 / 1024:.0f} GiB"
    except OSError:
        pass
    from importlib.metadata import version

    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "memory": memory,
        "os": platform.platform(),
        "python": platform.python_version(),
        "sqlalchemy": version("sqlalchemy"),
        "psycopg": version("psycopg"),
        "pymysql": version("pymysql"),
        "assetq": assetq.__version__ + f" (schema {assetq.head_revision()})",
    }


def new_report(command: str, cfg: Config) -> dict[str, Any]:
    return {
        "command": command,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "config": asdict(cfg),
        "machine": _machine(),
        "load_before": round(os.getloadavg()[0], 2),
        "engines": {},
    }


def add_engine(
    report: dict[str, Any],
    engine_name: str,
    server: str,
    settings: dict[str, str],
    results: dict[str, Any],
) -> None:
    report["engines"][engine_name] = {"server": server, "settings": settings, **results}


def finish_report(report: dict[str, Any], elapsed_s: float) -> None:
    report["load_after"] = round(os.getloadavg()[0], 2)
    report["elapsed_s"] = round(elapsed_s, 1)


def merged(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``old`` with the figures of ``new`` in place of its own, and a note of the run that
    measured them (``updates``: command, date, figures, minutes, load average)."""
    figures = sorted({f for data in new["engines"].values() for f in data if f in FIGURES})
    result = dict(old)
    result["engines"] = {e: dict(d) for e, d in old["engines"].items()}
    for engine, data in new["engines"].items():
        target = result["engines"].setdefault(engine, {})
        target.update({k: v for k, v in data.items() if k in FIGURES})
        target.setdefault("server", data["server"])
        target.setdefault("settings", data["settings"])
    update = {
        "command": new["command"],
        "date": new["date"],
        "figures": figures,
        "elapsed_s": new["elapsed_s"],
        "load_before": new["load_before"],
        "load_after": new["load_after"],
        "machine": new["machine"],
        "config": new["config"],
    }
    kept = [u for u in old.get("updates", []) if set(u["figures"]) - set(figures)]
    result["updates"] = [*kept, update]
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run of every figure")
    parser.add_argument(
        "--engines", default=",".join(ENGINES), help="comma-separated: postgresql,mysql"
    )
    parser.add_argument(
        "--figures", default=",".join(FIGURES), help=f"comma-separated: {','.join(FIGURES)}"
    )
    parser.add_argument("--postgres", default=LOCAL_POSTGRES, help="PostgreSQL server URL")
    parser.add_argument(
        "--database",
        default=None,
        help="name of the database created for the run and dropped after (default"
        " aqp_bench_<pid> on PostgreSQL, aqp_bench_app on a --mysql URL)",
    )
    parser.add_argument(
        "--mysql", default="private", help="'private' (throw-away mariadbd) or a server URL"
    )
    parser.add_argument(
        "--out", default=str(ROOT / "docs"), help="where benchmarks.md and its plots go (docs/)"
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the other figures of OUT/benchmarks.json and replace only those measured now"
        " (the page says which figures came from which run)",
    )
    args = parser.parse_args(argv)
    # A plain kill (SIGTERM) unwinds like Ctrl-C: the databases and the throw-away server
    # are dropped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    cfg = QUICK if args.quick else FULL
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    figures = [f.strip() for f in args.figures.split(",") if f.strip()]
    unknown = (set(engines) - set(ENGINES)) | (set(figures) - set(FIGURES))
    if unknown:
        parser.error(f"unknown engines or figures: {sorted(unknown)}")
    command = "python benchmarks/bench.py" + (" --quick" if args.quick else "")
    if args.engines != ",".join(ENGINES):
        command += f" --engines {args.engines}"
    if args.figures != ",".join(FIGURES):
        command += f" --figures {args.figures}"
    if args.merge:
        command += " --merge"

    started = time.perf_counter()
    report = new_report(command, cfg)
    for engine_name in engines:
        server = (
            _postgres_server(args.postgres, args.database)
            if engine_name == "postgresql"
            else _mysql_server(args.mysql, args.database)
        )
        try:
            server.settings = _settings(server.target.engine)
            results = run_engine(server.target, cfg, figures)
        finally:
            server.close()
        add_engine(report, engine_name, server.description, server.settings, results)
    finish_report(report, time.perf_counter() - started)
    elapsed = report["elapsed_s"]
    out = Path(args.out)
    if args.merge:
        report = merged(json.loads((out / "benchmarks.json").read_text("utf-8")), report)

    import report as report_module  # benchmarks/report.py: tables, targets and plots

    report_module.write(report, out)
    print(f"wrote {out / 'benchmarks.md'} in {elapsed:.0f} s")
    print(json.dumps(report_module.targets_summary(report), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
