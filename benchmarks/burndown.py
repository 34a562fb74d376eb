"""Worker burn-down: N queued runs claimed and completed by T worker threads, against
procrastinate's fetch + finish of N jobs on the same PostgreSQL server.

    python benchmarks/burndown.py                        # 10,000 runs, 8 threads, both engines
    python benchmarks/burndown.py --runs 2000 --rounds 1 --engines postgresql

assetq: each thread keeps a connection of its own in autocommit mode
(``engine.connect().execution_options(isolation_level="AUTOCOMMIT")``, as procrastinate's
side keeps one) and loops ``assetq.claim_runs(conn, worker, limit=1)`` (its own READ
COMMITTED transaction) and ``assetq.complete_run(conn, claim, "success")`` (a no-op handler
writes nothing, so the completion is a transaction of its own: on PostgreSQL each is the
call alone, one round trip), until a claim comes back empty. Two more alternatives: the
same calls on the Engine (``claim_runs(engine, ...)``, ``complete_run(engine, ...)``: a
pool checkout for each call), and the completion in the caller's transaction, ``with
engine.begin() as conn: assetq.complete_run(conn, claim, "success")``, as a handler that
writes to the database must (BEGIN, the call, COMMIT: three round trips, and SQLAlchemy's
Connection and transaction on the client).
procrastinate: each thread registers itself as a worker (``register_worker``), then loops
the ``fetch_job`` query (procrastinate_fetch_job_v2) and the ``finish_job`` query
(procrastinate_finish_job_v1, status succeeded, the job kept, as its worker's default
delete_jobs="never" does), each in a transaction of its own, as its
psycopg connector runs them (a pool connection in a transaction: BEGIN, the query, COMMIT; the
pool's liveness check before each query, one more round trip, is left out, in
procrastinate's favour). The queries and the schema are read from the installed procrastinate
package (``procrastinate.sql.queries``, ``SchemaManager.get_schema()``); its schema lives in a
PostgreSQL schema of its own. Same driver on both sides (psycopg 3), one connection per
thread (assetq: an engine of pool size 1 per thread; procrastinate: one psycopg connection per
thread), and both sessions with synchronous_commit off, as the rest of docs/benchmarks.md.

Setup, not timed: the queued runs are inserted directly, shaped exactly like the scheduler
pass's rows: N events (one INSERT ... SELECT; the fan-out trigger queues each for its
consumer), then one statement that consumes those queue rows into N runs of one event each
(run_id, seq, run_after, triggering_event_id, event_count, not_before as the pass writes them)
with their links (MySQL: an INSERT ... SELECT each for runs and links, and the queue's DELETE,
in one transaction), and the consumers' run sequences; tests/test_burndown_benchmark.py checks
the shape
against a run made by ``assetq.schedule``. procrastinate's N jobs are one INSERT ... SELECT
into procrastinate_jobs (its triggers run). Every side's tables are vacuumed and analyzed
before its timed burn-down (autovacuum may be off on the server, and is here).

Alternatives, in rounds, each burning down N fresh runs, all of them at once in turns of a
quarter second (burn_sliced: one alternative's threads step while the others' wait, round
robin, the order rotating each round), so that load from elsewhere falls on all of them
alike; an alternative's time is the sum of its turns. They are: assetq with no other runs;
assetq with ``--history`` finished runs (success, attempt 1, the way complete_run leaves
them; tests/history.py's set-based history, one event per run) in the same tables; assetq
through the Engine; assetq completing in the caller's transaction (each of these two in a
namespace of its own); procrastinate (PostgreSQL only: it has no MySQL/MariaDB support, so
MariaDB reports assetq alone). Ratios are taken per round, medians reported.

Counters (not timings) prove that a claim's cost does not grow with finished runs: before
the timed rounds, ``--probes`` claims are made in each assetq namespace on one connection,
each in a transaction that is rolled back: PostgreSQL reports the buffers the claim touched
(pg_stat_get_xact_blocks_fetched over the namespace's tables and indexes, and of the claim's
index alone) and the index entries it read; MySQL/MariaDB the session's Handler_read_*
counters around the call, less those of the counter query itself. The index entries, the
claim index's buffers and the handler reads must not grow; the total of buffers grows by one
page per B-tree level that dag_run's other indexes gain (the claim's UPDATE descends each to
insert the row's new version), the logarithm of the table's rows.

Servers: PostgreSQL at ``--postgres`` (default: the local server, postgres@127.0.0.1:5432) in
a database ``aqbd_<pid>`` created for the run and dropped after; MariaDB/MySQL on a
throw-away server started from this machine's mariadbd/mysqld (tests/dbs.py), or at
``--mysql URL``; assetq's namespaces are named ``aqbd_*`` (databases on MySQL) and dropped
after. procrastinate is not a dependency of the test suite: it is in the ``bench`` extra,
and when it is missing this benchmark installs it into the running environment first
(``--peer if-installed`` skips the procrastinate side instead).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy import Connection, Engine
from sqlalchemy.engine import URL

import assetq
from assetq import sqlfiles
from assetq.dialects import dialect_for

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _path in (HERE, ROOT / "tests"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

#: Consumers the runs are spread over (round robin), each scheduled on an asset of its own.
CONSUMERS = 10
#: procrastinate's schema, in the database of the assetq namespaces.
PEER_SCHEMA = "aqbd_procrastinate"
#: What the bench extra asks for (pyproject.toml); the benchmark installs it when missing.
PEER_REQUIREMENT = "procrastinate>=3.10"
PEER_NAME = "procrastinate"
#: Claims a probe connection makes before the counted ones (see probe_claims).
PROBE_WARMUP = 10
#: Lease of the claims: far longer than a burn-down, so no run is claimed twice.
LEASE_SECONDS = 600.0
#: The turns of a sliced burn-down (burn_sliced), as the other figures' slices.
SLICE_SECONDS = 0.25

ASSETQ = "assetq"
HISTORY = "assetq with history"
ON_ENGINE = "assetq, calls on the Engine"
IN_TRANSACTION = "assetq, completion in the caller's transaction"
PEER = "procrastinate"


@dataclass(frozen=True)
class Settings:
    runs: int = 10_000
    threads: int = 8
    rounds: int = 3
    #: Finished runs in the second assetq namespace (0: that alternative is not measured).
    history: int = 100_000
    probes: int = 20
    #: "install": pip-install procrastinate when missing; "if-installed": skip its side then;
    #: "off": never measure it.
    peer: str = "install"


# -- SQL ---------------------------------------------------------------------------------------
# Named queries as in sql/<engine>/queries.sql ({{ns}}: the quoted namespace).

POSTGRESQL_SQL = """
-- reset --
-- Empty the namespace's events, queue, runs and links; the consumers stay.
TRUNCATE {{ns}}.dagrun_asset_event, {{ns}}.dag_run, {{ns}}.asset_dag_run_queue,
         {{ns}}.asset_event CASCADE

-- reset_seq --
-- The consumers' run sequences back to 0.
UPDATE {{ns}}.dag SET last_run_seq = 0

-- finish_history --
-- History runs as complete_run leaves them: success, one attempt, by a worker, not claimable.
UPDATE {{ns}}.dag_run
   SET attempt = 1, worker = 'history', started_at = run_after, ended_at = run_after,
       updated_at = run_after, not_before = NULL
 WHERE state = 'success' AND attempt = 0

-- fill_events --
-- :n events, round robin over the assets orders_0 .. orders_{:consumers - 1}; the fan-out
-- trigger queues each for the consumer scheduled on its asset.
INSERT INTO {{ns}}.asset_event (asset_id)
SELECT a.id
  FROM generate_series(0, CAST(:n AS integer) - 1) AS g
  JOIN {{ns}}.asset a ON a.name = 'orders_' || (g % CAST(:consumers AS integer))
 ORDER BY g

-- fill_runs --
-- Every queued row consumed into a run of its own, as schedule_pass writes runs: the run_id
-- from the event's timestamp and the consumer's next seq, run_after the event's timestamp,
-- the event as triggering event, claimable (not_before) from its creation on, linked to its
-- event; the queue rows deleted. Runs in event order, so claims take them oldest first.
WITH consumed AS (
    DELETE FROM {{ns}}.asset_dag_run_queue q
    RETURNING q.target_dag_id, q.asset_event_id, q.created_at
), numbered AS (
    SELECT c.target_dag_id, c.asset_event_id, c.created_at, clock_timestamp() AS now,
           d.last_run_seq + row_number() OVER (PARTITION BY c.target_dag_id
                                               ORDER BY c.asset_event_id) AS seq
      FROM consumed c
      JOIN {{ns}}.dag d ON d.dag_id = c.target_dag_id
), runs AS (
    INSERT INTO {{ns}}.dag_run (dag_id, run_id, seq, run_after, created_at,
                                triggering_event_id, event_count, not_before)
    SELECT n.target_dag_id,
           'asset_triggered__'
               || to_char(n.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US')
               || '+00:00__' || n.seq,
           n.seq, n.created_at, n.now, n.asset_event_id, 1, n.now
      FROM numbered n
     ORDER BY n.asset_event_id
    RETURNING id, dag_id, triggering_event_id
)
INSERT INTO {{ns}}.dagrun_asset_event (dag_run_id, asset_event_id, dag_id)
SELECT r.id, r.triggering_event_id, r.dag_id FROM runs r

-- fill_last_run_seq --
-- Each consumer's run sequence at its newest run, as the pass leaves it.
UPDATE {{ns}}.dag d
   SET last_run_seq = r.seq
  FROM (SELECT dag_id, max(seq) AS seq FROM {{ns}}.dag_run GROUP BY dag_id) r
 WHERE r.dag_id = d.dag_id AND r.seq > d.last_run_seq

-- vacuum --
-- Dead rows of the setup gone and statistics fresh, as autovacuum would leave them.
VACUUM (ANALYZE) {{ns}}.asset_event, {{ns}}.asset_dag_run_queue, {{ns}}.dag_run,
       {{ns}}.dagrun_asset_event, {{ns}}.dag

-- outcome --
-- The burned-down runs by state and attempt (history runs excluded).
SELECT state, attempt, count(*) AS runs
  FROM {{ns}}.dag_run
 WHERE worker IS DISTINCT FROM 'history'
 GROUP BY state, attempt
 ORDER BY state, attempt

-- probe_counters --
-- This transaction's buffer and index-entry counts over the namespace's tables and indexes.
SELECT coalesce(sum(pg_stat_get_xact_blocks_fetched(c.oid)), 0) AS buffers,
       coalesce(sum(pg_stat_get_xact_blocks_fetched(c.oid))
                    FILTER (WHERE c.relname = 'dag_run_claim_idx'), 0) AS claim_index_buffers,
       coalesce(sum(pg_stat_get_xact_tuples_returned(c.oid)) FILTER (WHERE c.relkind = 'i'),
                0) AS index_entries
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = :ns AND c.relkind IN ('r', 'i')
"""

PEER_SQL = """
-- create_schema --
-- procrastinate's own schema.
CREATE SCHEMA {{ns}}

-- drop_schema --
-- Gone, with everything in it.
DROP SCHEMA IF EXISTS {{ns}} CASCADE

-- reset --
-- No jobs, events or workers.
TRUNCATE procrastinate_jobs, procrastinate_events, procrastinate_periodic_defers,
         procrastinate_workers RESTART IDENTITY CASCADE

-- fill --
-- :n jobs to do, in one queue, of one task (procrastinate's insert triggers run).
INSERT INTO procrastinate_jobs (queue_name, task_name, args)
SELECT 'default', %(task)s, '{}'::jsonb FROM generate_series(1, CAST(%(n)s AS integer))

-- span --
-- The first job's start and the last one's success (its events' timestamps).
SELECT min(at) FILTER (WHERE type = 'started'), max(at) FILTER (WHERE type = 'succeeded')
  FROM procrastinate_events

-- vacuum --
-- As for assetq's tables.
VACUUM (ANALYZE) procrastinate_jobs, procrastinate_events, procrastinate_workers

-- outcome --
-- The jobs by status.
SELECT CAST(status AS text) AS status, count(*) AS jobs
  FROM procrastinate_jobs GROUP BY status ORDER BY 1
"""

MYSQL_SQL = """
-- create_database --
-- A namespace's database (assetq.install creates it too).
CREATE DATABASE IF NOT EXISTS {{ns}}

-- reset --
-- Empty the namespace's events, queue, runs and links; the consumers stay.
DELETE FROM {{ns}}.dagrun_asset_event

-- reset_runs --
DELETE FROM {{ns}}.dag_run

-- reset_queue --
DELETE FROM {{ns}}.asset_dag_run_queue

-- reset_events --
DELETE FROM {{ns}}.asset_event

-- reset_seq --
-- The consumers' run sequences back to 0.
UPDATE {{ns}}.dag_lock SET last_run_seq = 0

-- finish_history --
-- History runs as complete_run leaves them: success, one attempt, by a worker, not claimable.
UPDATE {{ns}}.dag_run
   SET attempt = 1, worker = 'history', started_at = run_after, ended_at = run_after,
       updated_at = run_after, not_before = NULL
 WHERE state = 'success' AND attempt = 0

-- fill_events --
-- Events :first + 1 .. :first + :n (:n <= 10,000), round robin over the assets orders_0 ..
-- orders_{:consumers - 1}; the fan-out trigger queues each for its consumer.
INSERT INTO {{ns}}.asset_event (asset_id, `timestamp`)
WITH d AS (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3
           UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7
           UNION ALL SELECT 8 UNION ALL SELECT 9),
     n AS (SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d AS g FROM d a, d b, d c, d e)
SELECT a.id, UTC_TIMESTAMP(6)
  FROM n
  JOIN {{ns}}.asset a ON a.name = CONCAT('orders_', MOD(:first + n.g, :consumers))
 WHERE n.g < :n
 ORDER BY n.g

-- fill_runs --
-- Every queued row consumed into a run of its own, as schedule_pass writes runs (run_id from
-- the event's timestamp and the consumer's next seq, run_after the event's timestamp, the
-- event as triggering event, claimable from its creation on), in event order.
INSERT INTO {{ns}}.dag_run (dag_id, run_id, seq, run_after, created_at, triggering_event_id,
                            event_count, not_before)
SELECT q.target_dag_id,
       CONCAT('asset_triggered__', DATE_FORMAT(q.created_at, '%Y-%m-%dT%H:%i:%s.%f'),
              '+00:00__', l.last_run_seq + q.k),
       l.last_run_seq + q.k, q.created_at, UTC_TIMESTAMP(6), q.asset_event_id, 1,
       UTC_TIMESTAMP(6)
  FROM (SELECT target_dag_id, asset_event_id, created_at,
               ROW_NUMBER() OVER (PARTITION BY target_dag_id ORDER BY asset_event_id) AS k
          FROM {{ns}}.asset_dag_run_queue) q
  JOIN {{ns}}.dag_lock l ON l.dag_id = q.target_dag_id
 ORDER BY q.asset_event_id

-- fill_links --
-- Each new run linked to its event.
INSERT INTO {{ns}}.dagrun_asset_event (dag_run_id, asset_event_id, dag_id)
SELECT r.id, r.triggering_event_id, r.dag_id
  FROM {{ns}}.dag_run r
 WHERE r.state = 'queued' AND r.attempt = 0 AND r.worker IS NULL

-- fill_consume --
-- The queue rows consumed.
DELETE FROM {{ns}}.asset_dag_run_queue

-- fill_last_run_seq --
-- Each consumer's run sequence at its newest run, as the pass leaves it.
UPDATE {{ns}}.dag_lock l
  JOIN (SELECT dag_id, MAX(seq) AS seq FROM {{ns}}.dag_run GROUP BY dag_id) r
    ON r.dag_id = l.dag_id
   SET l.last_run_seq = r.seq
 WHERE r.seq > l.last_run_seq

-- vacuum --
-- Fresh statistics.
ANALYZE TABLE {{ns}}.asset_event, {{ns}}.asset_dag_run_queue, {{ns}}.dag_run,
              {{ns}}.dagrun_asset_event

-- outcome --
-- The burned-down runs by state and attempt (history runs excluded).
SELECT state, attempt, COUNT(*) AS runs
  FROM {{ns}}.dag_run
 WHERE worker IS NULL OR worker <> 'history'
 GROUP BY state, attempt
 ORDER BY state, attempt

-- probe_counters --
-- The session's handler reads so far.
SHOW SESSION STATUS LIKE 'Handler_read%'
"""

_SQL = {"postgresql": POSTGRESQL_SQL, "mysql": MYSQL_SQL, "peer": PEER_SQL}


@functools.cache
def _queries(which: str) -> dict[str, str]:
    return sqlfiles.parse_queries(_SQL[which])


def _sql(which: str, name: str, quoted_ns: str = "") -> str:
    return sqlfiles.render(_queries(which)[name], quoted_ns)


def _run(conn: Connection, name: str, namespace: str, **params: Any) -> list[Any]:
    dialect = dialect_for(conn)
    text = _sql(dialect.name, name, dialect.quote_ns(namespace))
    result = conn.execute(sa.text(text), params)
    return list(result.all()) if result.returns_rows else []


def _progress(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def _rotated(items: Sequence[Any], k: int) -> list[Any]:
    k %= len(items)
    return list(items[k:]) + list(items[:k])


# -- the peer: procrastinate -------------------------------------------------------------------


def peer_module(mode: str) -> Any | None:
    """The procrastinate package, installed first into this environment when missing and
    ``mode`` is "install"; None (said in one line) when it is missing and may not be."""
    if mode == "off":
        return None
    if importlib.util.find_spec(PEER_NAME) is None:
        if mode != "install":
            print(
                f"burndown: {PEER_NAME} is not installed: its side of the burn-down is skipped"
                f" (pip install '{PEER_REQUIREMENT}', or the bench extra, to measure it)",
                file=sys.stderr,
                flush=True,
            )
            return None
        print(
            f"burndown: {PEER_NAME} is not installed; installing '{PEER_REQUIREMENT}' into"
            f" {sys.prefix} (the bench extra's peer, needed for the burn-down comparison)",
            file=sys.stderr,
            flush=True,
        )
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", PEER_REQUIREMENT], check=True
        )
        importlib.invalidate_caches()
    return importlib.import_module(PEER_NAME)


@dataclass(frozen=True)
class Peer:
    """procrastinate on the server: its schema, and the queries its worker sends."""

    conninfo: dict[str, Any]
    fetch: str
    finish: str
    register: str
    version: str

    def connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(**self.conninfo)


def postgres_host(url: URL) -> str:
    """The host psycopg connects to for ``url``: its host, else the unix socket directory of
    its ``?host=`` (the embedded server listens there only), else 127.0.0.1."""
    socket_dir = url.query.get("host")
    return url.host or (socket_dir if isinstance(socket_dir, str) else None) or "127.0.0.1"


def _peer_conninfo(url: URL) -> dict[str, Any]:
    return {
        "host": postgres_host(url),
        "port": url.port or 5432,
        "user": url.username or "postgres",
        "password": url.password if isinstance(url.password, str) else None,
        "dbname": url.database,
        "options": f"-c synchronous_commit=off -c search_path={PEER_SCHEMA}",
    }


def _peer_sql(name: str) -> str:
    return _sql("peer", name, f'"{PEER_SCHEMA}"')


def install_peer(url: URL, module: Any) -> Peer:
    """procrastinate's packaged schema, in schema PEER_SCHEMA of ``url``'s database."""
    from importlib.metadata import version

    schema = importlib.import_module(f"{PEER_NAME}.schema").SchemaManager.get_schema()
    queries = importlib.import_module(f"{PEER_NAME}.sql").queries
    peer = Peer(
        _peer_conninfo(url),
        fetch=queries["fetch_job"],
        finish=queries["finish_job"],
        register=queries["register_worker"],
        version=f"{PEER_NAME} {version(PEER_NAME)}",
    )
    with psycopg.connect(**{**peer.conninfo, "autocommit": True}) as conn:
        conn.execute(_peer_sql("drop_schema"))
        conn.execute(_peer_sql("create_schema"))
        conn.execute(schema)
    return peer


def drop_peer(peer: Peer) -> None:
    with psycopg.connect(**{**peer.conninfo, "autocommit": True}) as conn:
        conn.execute(_peer_sql("drop_schema"))


def fill_peer(peer: Peer, runs: int, task: str = "noop") -> None:
    with psycopg.connect(**{**peer.conninfo, "autocommit": True}) as conn:
        conn.execute(_peer_sql("reset"))
        conn.execute(_peer_sql("fill"), {"n": runs, "task": task})
        conn.execute(_peer_sql("vacuum"))


def peer_span(peer: Peer) -> tuple[Any, Any]:
    """The first job's start and the last job's success, the database's timestamps."""
    with psycopg.connect(**peer.conninfo) as conn:
        row = conn.execute(_peer_sql("span")).fetchone()
    assert row is not None
    return row[0], row[1]


def peer_outcome(peer: Peer) -> dict[str, int]:
    with psycopg.connect(**peer.conninfo) as conn:
        rows = conn.execute(_peer_sql("outcome")).fetchall()
    return {str(status): int(n) for status, n in rows}


def _peer_worker(peer: Peer) -> Callable[[], Callable[[], bool]]:
    """A thread's connection and loop step for procrastinate: fetch one job, finish it."""

    def connect() -> Callable[[], bool]:
        conn = peer.connect()
        with conn.transaction():
            (worker_id,) = conn.execute(peer.register).fetchone() or (None,)
        fetch_params = {"queues": None, "worker_id": worker_id}

        def step() -> bool:
            with conn.transaction():
                row = conn.execute(peer.fetch, fetch_params).fetchone()
            if row is None or row[0] is None:
                conn.close()
                return False
            with conn.transaction():
                conn.execute(
                    peer.finish,
                    {"job_id": row[0], "status": "succeeded", "delete_job": False},
                )
            return True

        return step

    return connect


# -- assetq ------------------------------------------------------------------------------------


def namespace_name(history: int, variant: str = "") -> str:
    """The namespace of an alternative (a MySQL database: the pid keeps two runs on one
    server apart); ``variant`` tells apart alternatives that burn down at the same level."""
    return f"aqbd_{os.getpid()}_h{history}{variant}"


def _create_engine(url: URL, dialect_name: str, **kwargs: Any) -> Engine:
    if dialect_name == "postgresql":
        kwargs.setdefault("connect_args", {"options": "-c synchronous_commit=off"})
    return sa.create_engine(url, **kwargs)


def install_namespace(engine: Engine, namespace: str) -> None:
    """A fresh assetq namespace with CONSUMERS consumers, consumer_c on asset orders_c."""
    assetq.uninstall(engine, namespace=namespace)
    assetq.install(engine, namespace=namespace)
    with engine.begin() as conn:
        for c in range(CONSUMERS):
            assetq.declare_dag(conn, f"consumer_{c}", f"orders_{c}", namespace=namespace)


def fill_namespace(engine: Engine, namespace: str, runs: int, history: int) -> None:
    """``history`` finished runs (tests/history.py, one event each) and ``runs`` queued runs
    shaped as the pass writes them, in a namespace emptied first."""
    with engine.begin() as conn:
        dialect = dialect_for(conn)
        names = ["reset", "reset_seq"]
        if dialect.name == "mysql":
            names = ["reset", "reset_runs", "reset_queue", "reset_events", "reset_seq"]
        for name in names:
            _run(conn, name, namespace)
    if history:
        _tests_module("history").add_history(engine, history, namespace=namespace, events_per_run=1)
        with engine.begin() as conn:
            _run(conn, "finish_history", namespace)
    with engine.begin() as conn:
        if dialect.name == "postgresql":
            _run(conn, "fill_events", namespace, n=runs, consumers=CONSUMERS)
            _run(conn, "fill_runs", namespace)
        else:
            for first in range(0, runs, 10_000):
                n = min(10_000, runs - first)
                _run(conn, "fill_events", namespace, first=first, n=n, consumers=CONSUMERS)
            _run(conn, "fill_runs", namespace)
            _run(conn, "fill_links", namespace)
            _run(conn, "fill_consume", namespace)
        _run(conn, "fill_last_run_seq", namespace)
    with engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        _run(conn, "vacuum", namespace)


def outcome(engine: Engine, namespace: str) -> dict[str, int]:
    with engine.connect() as conn:
        rows = _run(conn, "outcome", namespace)
    return {f"{row[0]}/{row[1]}": int(row[2]) for row in rows}


def _assetq_worker(
    url: URL, dialect_name: str, namespace: str, *, how: str = "own connection"
) -> Callable[[], Callable[[], bool]]:
    """A thread's engine (one connection) and loop step for assetq: claim one run, complete
    it as success. ``how``: "own connection", both calls on an autocommit connection the
    thread keeps; "engine", both on the engine (a pool checkout each); "transaction", the
    claim on the engine and the completion inside ``engine.begin()``."""

    def connect() -> Callable[[], bool]:
        engine = _create_engine(url, dialect_name, pool_size=1, max_overflow=0)
        with engine.connect() as conn:  # connect, and the dialect's first-connect queries
            conn.execute(sa.text("SELECT 1"))
        worker = f"bd-{threading.get_ident()}"
        own = (
            engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            if how == "own connection"
            else None
        )
        handle: Engine | Connection = engine if own is None else own

        def step() -> bool:
            claims = assetq.claim_runs(
                handle, worker, limit=1, lease=LEASE_SECONDS, namespace=namespace
            )
            if not claims:
                if own is not None:
                    own.close()
                engine.dispose()
                return False
            if how == "transaction":
                with engine.begin() as conn:
                    assetq.complete_run(conn, claims[0], "success", namespace=namespace)
            else:
                assetq.complete_run(handle, claims[0], "success", namespace=namespace)
            return True

        return step

    return connect


def _tests_module(name: str) -> Any:
    """A helper module of the test suite (tests/): dbs, history."""
    return importlib.import_module(name)


# -- one burn-down -------------------------------------------------------------------------------


class _Sliced:
    """One alternative's ``threads`` threads in a sliced burn-down: connected first, then
    stepping only while the alternative's turn is on (see burn_sliced)."""

    def __init__(self, label: str, connect: Callable[[], Callable[[], bool]], threads: int):
        self.label = label
        self.turn = threading.Condition()
        self.on = False
        self.inflight = 0
        self.alive = threads
        self.ready = 0
        self.steps = 0
        self.seconds = 0.0
        self.failures: list[BaseException] = []
        self.workers = [
            threading.Thread(target=self._work, args=(connect,), daemon=True)
            for _ in range(threads)
        ]
        for w in self.workers:
            w.start()

    def _work(self, connect: Callable[[], Callable[[], bool]]) -> None:
        try:
            step = connect()
        except BaseException as exc:  # re-raised by the controller
            with self.turn:
                self.failures.append(exc)
                self.alive -= 1
                self.turn.notify_all()
            return
        with self.turn:
            self.ready += 1
            self.turn.notify_all()
        while True:
            with self.turn:
                while not self.on:
                    self.turn.wait()
                self.inflight += 1
            try:
                more = step()
            except BaseException as exc:  # re-raised by the controller
                more = False
                with self.turn:
                    self.failures.append(exc)
            with self.turn:
                self.inflight -= 1
                self.steps += bool(more)
                if not more:
                    self.alive -= 1
                self.turn.notify_all()
            if not more:
                return

    def wait_ready(self) -> None:
        with self.turn:
            while self.ready + len(self.failures) < len(self.workers) and self.alive > 0:
                self.turn.wait()

    def slice(self, seconds: float) -> None:
        """One turn: the threads step for ``seconds``, then the turn ends once every step
        under way has returned; the turn's time is counted."""
        started = time.perf_counter()
        with self.turn:
            self.on = True
            self.turn.notify_all()
        time.sleep(seconds)
        with self.turn:
            self.on = False
            while self.inflight:
                self.turn.wait()
        self.seconds += time.perf_counter() - started

    @property
    def done(self) -> bool:
        return self.alive == 0


def burn_sliced(
    alternatives: Sequence[tuple[str, Callable[[], Callable[[], bool]]]],
    threads: int,
    slice_seconds: float = SLICE_SECONDS,
) -> dict[str, tuple[int, float]]:
    """The burn-downs of several alternatives at once, taking turns: each has ``threads``
    threads, connected before anything is timed, and the alternatives step in turns of
    ``slice_seconds`` (one after the other, round robin) until each found nothing left.
    Load from elsewhere on the machine then falls on all of them alike, where one whole
    burn-down after the other gave each the load of its own ten seconds. Returns, per
    alternative, the steps done and the seconds of its turns."""
    runs = [_Sliced(label, connect, threads) for label, connect in alternatives]
    for r in runs:
        r.wait_ready()
    while True:
        left = [r for r in runs if not r.done]
        if not left:
            break
        for r in left:
            r.slice(slice_seconds)
            if r.failures:
                for other in runs:  # release every waiting thread before re-raising
                    with other.turn:
                        other.on = True
                        other.turn.notify_all()
                raise r.failures[0]
    for r in runs:
        for w in r.workers:
            w.join()
    return {r.label: (r.steps, r.seconds) for r in runs}


# -- counters per claim ------------------------------------------------------------------------


def probe_claims(engine: Engine, namespace: str, probes: int) -> dict[str, list[int]]:
    """Counters of ``probes`` claims (assetq's own claim_runs statement, limit 1), each in a
    READ COMMITTED transaction rolled back after, on one connection: PostgreSQL buffers and
    index entries read in the namespace, MySQL the Handler_read_* sum."""
    params = {
        "worker": "probe",
        "limit": 1,
        "lease_seconds": LEASE_SECONDS,
        "dag_ids": None,
        "timeout_seconds": None,
    }
    out: dict[str, list[int]] = {}
    with engine.connect() as conn:
        dialect = dialect_for(conn)

        def counters() -> dict[str, int]:
            rows = _run(conn, "probe_counters", namespace, ns=namespace)
            if dialect.name == "postgresql":
                buffers, claim_index, entries = (int(v) for v in rows[0])
                return {
                    "buffers": buffers,
                    "claim_index_buffers": claim_index,
                    "index_entries": entries,
                }
            return {"handler_reads": sum(int(row[1]) for row in rows)}  # Handler_read_*

        # The first PROBE_WARMUP claims are dropped: they warm the connection up, and PL/pgSQL
        # plans a statement for its parameters for its first five executions, then may keep
        # a generic plan, which is what a worker's long-lived connection runs.
        for _ in range(PROBE_WARMUP + probes):
            with conn.begin() as tx:
                dialect.execute(conn, "scheduler_transaction", namespace)
                before = counters()
                baseline = counters()  # what the counter query itself adds (MySQL's SHOW)
                claimed = dialect.execute(conn, "claim_runs", namespace, params)
                after = counters()
                tx.rollback()
            if len(claimed) != 1:
                raise SystemExit(f"{namespace}: a probe claim took {len(claimed)} runs, not 1")
            for key, value in after.items():
                own = baseline[key] - before[key]
                out.setdefault(key, []).append(value - baseline[key] - own)
        for values in out.values():
            del values[:PROBE_WARMUP]
    return out


# -- the figure --------------------------------------------------------------------------------


@dataclass
class Side:
    label: str
    fill: Callable[[], None]
    connect: Callable[[], Callable[[], bool]]
    check: Callable[[], None]


def measure(engine: Engine, settings: Settings) -> dict[str, Any]:
    """The burn-down figure on ``engine``'s server, in namespaces (and, for procrastinate, a
    PostgreSQL schema) created for it in ``engine``'s database and dropped after."""
    dialect_name = engine.dialect.name
    dialect_name = "mysql" if dialect_name in ("mysql", "mariadb") else dialect_name
    url = engine.url
    runs, threads = settings.runs, settings.threads
    levels = [0] + ([settings.history] if settings.history else [])
    result: dict[str, Any] = {
        "runs": runs,
        "threads": threads,
        "rounds": settings.rounds,
        "history": settings.history,
        "consumers": CONSUMERS,
        "setup": "runs inserted directly (one INSERT ... SELECT shaped like the pass's rows,"
        " with their links)",
        "rates": {},
        "probes": {},
        "fill_s": {},
        "peer": None,
        "peer_note": "",
    }
    module = None
    if dialect_name == "postgresql":
        module = peer_module(settings.peer)
        if module is None:
            result["peer_note"] = f"{PEER_NAME} not measured" + (
                ": not installed" if settings.peer != "off" else ""
            )
    else:
        result["peer_note"] = f"no peer: {PEER_NAME} runs on PostgreSQL only"

    sides: list[Side] = []
    cleanup: list[Callable[[], object]] = []
    try:
        # The levels' alternatives first, in the order of ``levels`` (the probes below
        # take them by position); then the other ways of calling, in namespaces of their own.
        alternatives = [
            (ASSETQ if level == 0 else HISTORY, level, "own connection", "") for level in levels
        ]
        alternatives += [
            (ON_ENGINE, 0, "engine", "_engine"),
            (IN_TRANSACTION, 0, "transaction", "_transaction"),
        ]
        for label, level, how, variant in alternatives:
            namespace = namespace_name(level, variant)
            install_namespace(engine, namespace)
            cleanup.append(functools.partial(assetq.uninstall, engine, namespace=namespace))

            def check(namespace: str = namespace) -> None:
                got = outcome(engine, namespace)
                if got != {"success/1": runs}:
                    raise SystemExit(f"{namespace}: runs after the burn-down {got}, not {runs}")

            sides.append(
                Side(
                    label,
                    functools.partial(fill_namespace, engine, namespace, runs, level),
                    _assetq_worker(url, dialect_name, namespace, how=how),
                    check,
                )
            )
        if module is not None:
            peer = install_peer(url, module)
            cleanup.append(functools.partial(drop_peer, peer))
            result["peer"] = peer.version

            def check_peer() -> None:
                got = peer_outcome(peer)
                if got != {"succeeded": runs}:
                    raise SystemExit(f"{PEER_NAME}: jobs after the burn-down {got}, not {runs}")

            sides.append(
                Side(PEER, functools.partial(fill_peer, peer, runs), _peer_worker(peer), check_peer)
            )

        # Counters first: one claim at the head of N queued runs, with and without history.
        for level, side in zip(levels, sides, strict=False):
            side.fill()
            result["probes"][str(level)] = probe_claims(
                engine, namespace_name(level), settings.probes
            )
        _progress(
            f"burndown {dialect_name}: counters per claim "
            + ", ".join(
                f"{int(level):,} finished runs: "
                + ", ".join(f"{k} {_median(v):g}" for k, v in counts.items())
                for level, counts in result["probes"].items()
            )
        )
        for rnd in range(settings.rounds):
            got: dict[str, float] = {}
            order = _rotated(sides, rnd)
            for side in order:
                started = time.perf_counter()
                side.fill()
                result["fill_s"].setdefault(side.label, []).append(
                    round(time.perf_counter() - started, 2)
                )
            burned = burn_sliced([(side.label, side.connect) for side in order], threads)
            for side in sides:
                done, seconds = burned[side.label]
                if done != runs:
                    raise SystemExit(f"{side.label}: {done} steps for {runs} runs")
                side.check()
                got[side.label] = runs / seconds
                result["rates"].setdefault(side.label, []).append(got[side.label])
            _progress(
                f"burndown {dialect_name} {rnd + 1}/{settings.rounds}: "
                + ", ".join(f"{k} {v:,.0f} runs/s" for k, v in got.items())
            )
    finally:
        for undo in reversed(cleanup):
            undo()
    return result


# -- standalone ----------------------------------------------------------------------------------


def table(results: dict[str, dict[str, Any]]) -> list[str]:
    """The runs/s and ratio lines of a run, per engine (what docs/benchmarks.md shows)."""
    lines = []
    for engine_name, data in results.items():
        rates = data["rates"]
        parts = [f"{k} {_median(v):,.0f} runs/s" for k, v in rates.items()]
        if PEER in rates:
            ratios = [a / b for a, b in zip(rates[ASSETQ], rates[PEER], strict=True)]
            parts.append(f"assetq/procrastinate {_median(ratios):.2f}x")
            for label, short in (
                (ON_ENGINE, "on the Engine"),
                (IN_TRANSACTION, "in engine.begin()"),
            ):
                if label in rates:
                    ratios = [a / b for a, b in zip(rates[label], rates[PEER], strict=True)]
                    parts.append(f"{short}/procrastinate {_median(ratios):.2f}x")
        if HISTORY in rates:
            ratios = [a / b for a, b in zip(rates[HISTORY], rates[ASSETQ], strict=True)]
            parts.append(f"with/without history {_median(ratios):.2f}x")
        if data["peer_note"]:
            parts.append(data["peer_note"])
        lines.append(f"{engine_name}: " + "; ".join(parts))
    return lines


@contextmanager
def _server(engine_name: str, args: argparse.Namespace) -> Iterator[Engine]:
    """The engine of a server for ``engine_name`` (``--postgres`` / ``--mysql``), in a
    database of its own named aqbd_<pid>, dropped after."""
    bench = importlib.import_module("bench")
    name = f"aqbd_{os.getpid()}"
    if engine_name == "postgresql":
        server = bench._postgres_server(args.postgres, name=name)
    else:
        server = bench._mysql_server(args.mysql, name=name)
    try:
        yield server.target.engine
    finally:
        server.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    defaults = Settings()
    parser.add_argument("--runs", type=int, default=defaults.runs)
    parser.add_argument("--threads", type=int, default=defaults.threads)
    parser.add_argument("--rounds", type=int, default=defaults.rounds)
    parser.add_argument("--history", type=int, default=defaults.history)
    parser.add_argument("--probes", type=int, default=defaults.probes)
    parser.add_argument("--peer", choices=("install", "if-installed", "off"), default=defaults.peer)
    parser.add_argument("--engines", default="postgresql,mysql")
    parser.add_argument(
        "--postgres", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
    )
    parser.add_argument("--mysql", default="private", help="'private' or a server URL")
    args = parser.parse_args(argv)
    settings = Settings(
        runs=args.runs,
        threads=args.threads,
        rounds=args.rounds,
        history=args.history,
        probes=args.probes,
        peer=args.peer,
    )
    results: dict[str, dict[str, Any]] = {}
    for engine_name in [e.strip() for e in args.engines.split(",") if e.strip()]:
        if engine_name not in ("postgresql", "mysql"):
            parser.error(f"unknown engine {engine_name!r}")
        with _server(engine_name, args) as engine:
            results[engine_name] = measure(engine, settings)
    print("\n".join(table(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
