"""The web console's pages at real volumes (issue 27, item 5).

    python benchmarks/web_pages.py                   # both engines, the issue's volumes
    python benchmarks/web_pages.py --scale 0.01      # a hundredth of them, under a minute

A throw-away database gets ``--scale`` x (1,000,000 events, 100,000 runs, 1,000 consumers):
the assets (100 x scale, at least 1) and the consumers (1,000 x scale, at least 10; consumer
d has the one asset d mod assets as its condition) are declared with the API, so the schema's
own tables are what they would be; the history is bulk SQL, each table filled by a few
INSERT ... SELECT statements over generated numbers (generate_series on PostgreSQL, a cross
join of digits on MySQL), in a fixed shape:

- events: spread evenly over the last 30 days, round robin over the assets, inserted before
  any consumer exists (the fan-out trigger queues nothing);
- runs: the same number per consumer, seq 1..k, each consuming the 5 newest events of its
  asset before it (links in dagrun_asset_event, exactly once per consumer), created a second
  after its newest event; the newest run of every fourth consumer is queued, of the next
  running (its worker's lease an hour ahead), every 13th run failed, the rest succeeded;
  every consumer's last_run_seq is its newest seq;
- the queue: the 3 x scale (at least 1) newest events of each asset still queued for each
  of its consumers, as the fan-out would have queued them (3,000 rows at scale 1);
- the processes: a live scheduler and 4 live workers, each with handlers for every consumer;
- attempts: each finished run's one ended attempt in dag_run_attempt;
- a partitioned consumer of the first asset (bench_partitioned) with 1,000 keys pending,
  3 events each, in its queue and partition queue.

Then ANALYZE, and each page of the console is requested in this process, through Starlette's
TestClient (``assetq.web.app(engine)``, read-only, no password): ``--warmup`` requests, then
``--requests`` timed ones, one after another; p50 (nearest rank) and max of the wall time of
a request, and the SQL statements the page sends (a ``before_cursor_execute`` listener on
the engine). The pages: the overview, a consumer (the first), the partitioned consumer, the first
consumer's newest finished run, the assets, an asset (the first), the workers, and each one's
/api JSON twin. The machine is shared: read
the p50, not one max.

Servers: PostgreSQL at ``--postgres`` (default postgres@127.0.0.1:5432), in a database
made for the run (aqbench_web_<pid>) and dropped after; MariaDB/MySQL at ``--mysql`` (default
root@127.0.0.1:3306), in a namespace (database) aqbench_web_<pid> made for the run and
dropped after.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote

import sqlalchemy as sa
from benchmark_db import Server, make_server, pct

import assetq
import assetq.web

#: The issue's volumes, at --scale 1.
EVENTS, RUNS, CONSUMERS, ASSETS, QUEUED_PER_ASSET = 1_000_000, 100_000, 1_000, 100, 3
#: Events each run consumed, the history's span, workers.
LINKS_PER_RUN, SPAN_DAYS, WORKERS = 5, 30, 4
#: The issue's bound per page.
BUDGET_MS = 200.0


#: The partitioned consumer (of the first asset) and its keys pending, 3 events each.
PARTITIONED = "bench_partitioned"
PARTITION_KEYS = 1_000


def asset_name(i: int) -> str:
    return f"bench.asset_{i:03d}"


def dag_name(d: int) -> str:
    return f"bench_dag_{d:05d}"


# -- the volumes ---------------------------------------------------------------------------


@dataclass
class Volumes:
    assets: int
    consumers: int
    runs_per_consumer: int
    events_per_asset: int
    queued_per_asset: int
    links: int  # events per run
    stride: int  # events of an asset between two runs of one of its consumers

    @property
    def events(self) -> int:
        return self.assets * self.events_per_asset

    @property
    def runs(self) -> int:
        return self.consumers * self.runs_per_consumer

    @property
    def queued(self) -> int:
        return self.queued_per_asset * self.consumers


def volumes(scale: float) -> Volumes:
    consumers = max(10, round(CONSUMERS * scale))
    assets = max(1, min(consumers, round(ASSETS * scale)))
    runs_per_consumer = max(1, round(RUNS * scale / consumers))
    events_per_asset = max(1, round(EVENTS * scale / assets))
    queued = max(1, round(QUEUED_PER_ASSET * scale))
    stride = (events_per_asset - queued) // runs_per_consumer
    if stride < 1:
        raise SystemExit(f"--scale {scale:g}: too few events for the runs")
    return Volumes(
        assets,
        consumers,
        runs_per_consumer,
        events_per_asset,
        queued,
        min(LINKS_PER_RUN, stride),
        stride,
    )


def numbers(server: Server, n: int) -> str:
    """A derived table ``nums(n)`` of 1..n."""
    if server.name == "postgresql":
        return f"generate_series(CAST(1 AS bigint), {n}) AS nums(n)"
    digits = max(1, math.ceil(math.log10(n + 1)))
    ten = "(SELECT 0 AS d UNION ALL " + " UNION ALL ".join(f"SELECT {i}" for i in range(1, 10))
    ten += ")"
    parts = " CROSS JOIN ".join(f"{ten} AS t{i}" for i in range(digits))
    value = " + ".join(f"t{i}.d * {10**i}" for i in range(digits))
    return f"(SELECT {value} + 1 AS n FROM {parts} HAVING n <= {n}) AS nums"


def declare_assets(server: Server, vol: Volumes) -> None:
    with server.engine.begin() as conn:
        for i in range(vol.assets):
            assetq.declare_asset(conn, asset_name(i), namespace=server.namespace)


def declare_consumers(server: Server, vol: Volumes) -> None:
    with server.engine.begin() as conn:
        for d in range(vol.consumers):
            assetq.declare_dag(
                conn, dag_name(d), asset_name(d % vol.assets), namespace=server.namespace
            )


def load(server: Server, vol: Volumes, now: datetime) -> dict[str, float]:
    """Fill the namespace (its assets declared); returns seconds per step."""
    pg = server.name == "postgresql"
    span_us = SPAN_DAYS * 86_400 * 1_000_000
    step_us = span_us // vol.events  # between two events
    naive_now = now.replace(tzinfo=None)
    params: dict[str, Any] = {"now": now if pg else naive_now}
    times: dict[str, float] = {}

    def ago(us: str) -> str:
        """The timestamp ``us`` microseconds (an SQL expression) before :now."""
        if pg:
            return f"(CAST(:now AS timestamptz) - make_interval(secs => ({us}) / 1e6))"
        return f"TIMESTAMPADD(MICROSECOND, -({us}), CAST(:now AS DATETIME(6)))"

    def later(ts: str, seconds: int) -> str:
        if pg:
            return f"({ts} + interval '{seconds} seconds')"
        return f"TIMESTAMPADD(SECOND, {seconds}, {ts})"

    def dag_id(d: str) -> str:
        if pg:
            return f"('bench_dag_' || lpad(({d})::text, 5, '0'))"
        return f"CONCAT('bench_dag_', LPAD({d}, 5, '0'))"

    rank = f"(SELECT id, row_number() OVER (ORDER BY id) - 1 AS rk FROM {server.q('asset')}) AS a"
    ts = '"timestamp"' if pg else "`timestamp`"

    # Events: id e = 1..E, asset rank (e - 1) mod A, oldest first, 30 days to now.
    chunk = 100_000 if pg else 50_000
    started = time.monotonic()
    for low in range(0, vol.events, chunk):
        high = min(vol.events, low + chunk)
        with server.engine.begin() as conn:
            conn.execute(
                sa.text(
                    f"INSERT INTO {server.q('asset_event')} (id, asset_id, extra, {ts})"
                    f" SELECT nums.n + {low}, a.id, {'CAST(:extra AS jsonb)' if pg else ':extra'},"
                    f" {ago(f'({vol.events} - (nums.n + {low})) * {step_us}')}"
                    f" FROM {numbers(server, high - low)}"
                    f" JOIN {rank} ON a.rk = (nums.n + {low} - 1) % {vol.assets}"
                ),
                {**params, "extra": '{"rows": 1000}'},
            )
    times["events"] = time.monotonic() - started

    # The consumers, after their events: the fan-out queued none of them.
    started = time.monotonic()
    declare_consumers(server, vol)
    times["consumers"] = time.monotonic() - started

    # Runs: id r = 1..R, consumer d = (r - 1) mod C, k = (r - 1) div C (seq k + 1); its
    # newest event the asset's (k + 1) * stride - 1st, so its 5 newest end there.
    started = time.monotonic()
    trigger = f"(d % {vol.assets}) + {vol.assets} * ((k + 1) * {vol.stride} - 1) + 1"  # event id
    run_after = ago(f"({vol.events} - ({trigger})) * {step_us}")
    last = vol.runs_per_consumer - 1
    state = (
        f"CASE WHEN k = {last} AND d % 4 = 0 THEN 'queued'"
        f" WHEN k = {last} AND d % 4 = 1 THEN 'running'"
        " WHEN r % 13 = 0 THEN 'failed' ELSE 'success' END"
    )
    div = "/" if pg else "DIV"
    iso = (
        "to_char(run_after AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US')"
        if pg
        else "DATE_FORMAT(run_after, '%Y-%m-%dT%H:%i:%s.%f')"
    )
    concat = (
        f"'asset_triggered__' || {iso} || '+00:00__' || (k + 1)"
        if pg
        else f"CONCAT('asset_triggered__', {iso}, '+00:00__', k + 1)"
    )
    worker = (
        f"'bench-worker-' || (d % {WORKERS})" if pg else f"CONCAT('bench-worker-', d % {WORKERS})"
    )
    lease = later(ago("0"), 3600)
    with server.engine.begin() as conn:
        conn.execute(
            sa.text(
                f"INSERT INTO {server.q('dag_run')} (id, dag_id, run_id, seq, run_type, run_after,"
                " state, created_at, triggering_event_id, event_count, started_at, ended_at,"
                " updated_at, attempt, worker, lease_until, not_before, error)"
                f" SELECT r, {dag_id('d')}, {concat}, k + 1, 'asset_triggered', run_after, state,"
                f" {later('run_after', 1)}, {trigger}, {vol.links},"
                f" CASE WHEN state = 'queued' THEN NULL ELSE {later('run_after', 2)} END,"
                f" CASE WHEN state IN ('success', 'failed') THEN {later('run_after', 4)} END,"
                f" CASE WHEN state = 'queued' THEN NULL ELSE {later('run_after', 4)} END,"
                " CASE WHEN state = 'queued' THEN 0 ELSE 1 END,"
                f" CASE WHEN state = 'queued' THEN NULL ELSE {worker} END,"
                f" CASE WHEN state = 'running' THEN {lease} END,"
                f" CASE WHEN state = 'queued' THEN {later('run_after', 1)}"
                f" WHEN state = 'running' THEN {lease} END,"
                " CASE WHEN state = 'failed' THEN 'RuntimeError: bench' END"
                f" FROM (SELECT r, d, k, {run_after} AS run_after, {state} AS state"
                f" FROM (SELECT nums.n AS r, (nums.n - 1) % {vol.consumers} AS d,"
                f" (nums.n - 1) {div} {vol.consumers} AS k"
                f" FROM {numbers(server, vol.runs)}) AS rk) AS x"
            ),
            params,
        )
    times["runs"] = time.monotonic() - started

    # Links: each run's newest event and the links - 1 before it of the same asset.
    started = time.monotonic()
    with server.engine.begin() as conn:
        conn.execute(
            sa.text(
                f"INSERT INTO {server.q('dagrun_asset_event')} (dag_run_id, asset_event_id,"
                f" dag_id) SELECT r.id, r.triggering_event_id - {vol.assets} * (nums.n - 1),"
                f" r.dag_id FROM {server.q('dag_run')} r"
                f" CROSS JOIN {numbers(server, vol.links)}"
            )
        )
        if pg:
            conn.execute(
                sa.text(
                    f"UPDATE {server.q('dag')} d SET last_run_seq = x.seq,"
                    " last_scheduled_at = CAST(:now AS timestamptz)"
                    f" FROM (SELECT dag_id, max(seq) AS seq FROM {server.q('dag_run')}"
                    " GROUP BY dag_id) x WHERE x.dag_id = d.dag_id"
                ),
                params,
            )
        else:
            conn.execute(
                sa.text(
                    f"UPDATE {server.q('dag_lock')} l JOIN (SELECT dag_id, MAX(seq) AS seq"
                    f" FROM {server.q('dag_run')} GROUP BY dag_id) x ON x.dag_id = l.dag_id"
                    " SET l.last_run_seq = x.seq, l.last_scheduled_at = :now"
                ),
                params,
            )
        # The queue: the newest events of each asset, for each consumer of it.
        conn.execute(
            sa.text(
                f"INSERT INTO {server.q('asset_dag_run_queue')} (target_dag_id, asset_event_id,"
                f" asset_id, created_at) SELECT ref.dag_id, e.id, e.asset_id, e.{ts}"
                f" FROM {server.q('asset_event')} e"
                f" JOIN {server.q('dag_schedule_asset_reference')} ref"
                " ON ref.asset_id = e.asset_id"
                f" WHERE e.id > {vol.events - vol.queued_per_asset * vol.assets}"
            )
        )
        # The processes: a scheduler and the workers, alive, each worker for every consumer.
        procs = [("bench-scheduler", "scheduler", None)] + [
            (f"bench-worker-{w}", "worker", f"bench-worker-{w}") for w in range(WORKERS)
        ]
        for pid, (process_id, kind, name) in enumerate(procs, start=1):
            conn.execute(
                sa.text(
                    f"INSERT INTO {server.q('process_liveness')} (process_id, kind, name, host,"
                    " pid, version, interval_seconds, started_at, last_seen_at) VALUES"
                    " (:process_id, :kind, :name, 'bench-host', :pid, :version, 3600, :now, :now)"
                ),
                {
                    **params,
                    "process_id": process_id,
                    "kind": kind,
                    "name": name,
                    "pid": pid,
                    "version": assetq.__version__,
                },
            )
            if kind == "worker":
                conn.execute(
                    sa.text(
                        f"INSERT INTO {server.q('process_dag')} (process_id, dag_id)"
                        f" SELECT :process_id, dag_id FROM {server.q('dag')}"
                    ),
                    {"process_id": process_id},
                )
        if pg:  # the identities past the explicit ids
            for table in ("asset_event", "dag_run"):
                conn.execute(
                    sa.text(
                        f"SELECT setval(pg_get_serial_sequence('{server.q(table)}', 'id'),"
                        f" (SELECT max(id) FROM {server.q(table)}))"
                    )
                )
    times["links, queue"] = time.monotonic() - started

    # Attempts: each finished run's one attempt, as dag_run_attempt_end records it; and a
    # partitioned consumer of the first asset with PARTITION_KEYS keys pending, 3 events each.
    started = time.monotonic()
    key = f"CONCAT('key-', e.id % {PARTITION_KEYS})"
    with server.engine.begin() as conn:
        conn.execute(
            sa.text(
                f"INSERT INTO {server.q('dag_run_attempt')} (dag_run_id, attempt, worker,"
                " started_at, ended_at, outcome, error) SELECT id, 1, worker, started_at,"
                f" ended_at, state, error FROM {server.q('dag_run')}"
                " WHERE state IN ('success', 'failed')"
            )
        )
        assetq.declare_dag(
            conn,
            PARTITIONED,
            asset_name(0),
            partitioned=True,
            allow_unkeyed=True,
            namespace=server.namespace,
        )
        asset0 = f"(SELECT id FROM {server.q('asset')} WHERE name = '{asset_name(0)}')"
        pending = (
            f" FROM {server.q('asset_event')} e WHERE e.asset_id = {asset0}"
            f" ORDER BY e.id DESC LIMIT {3 * PARTITION_KEYS}"
        )
        conn.execute(
            sa.text(
                f"INSERT INTO {server.q('asset_dag_run_queue')} (target_dag_id, asset_event_id,"
                f" asset_id, created_at) SELECT '{PARTITIONED}', e.id, e.asset_id, e.{ts}" + pending
            )
        )
        conn.execute(
            sa.text(
                f"INSERT INTO {server.q('asset_partition_queue')} (target_dag_id,"
                " asset_event_id, partition_key, asset_id, source_key, created_at)"
                f" SELECT '{PARTITIONED}', e.id, {key}, e.asset_id, {key}, e.{ts}" + pending
            )
        )
    times["attempts, partitions"] = time.monotonic() - started

    started = time.monotonic()
    analyze(server)
    times["analyze"] = time.monotonic() - started
    return times


def analyze(server: Server) -> None:
    with server.engine.connect() as conn:
        if server.name == "postgresql":
            conn.execution_options(isolation_level="AUTOCOMMIT").execute(sa.text("ANALYZE"))
            return
        tables = conn.execute(
            sa.text(
                "SELECT table_name FROM information_schema.tables"
                " WHERE table_schema = :ns AND table_type = 'BASE TABLE'"
            ),
            {"ns": server.namespace},
        ).scalars()
        names = ", ".join(server.q(str(t)) for t in tables)
        conn.execute(sa.text(f"ANALYZE TABLE {names}")).fetchall()


# -- the pages -----------------------------------------------------------------------------


@dataclass
class PageResult:
    engine: str
    path: str
    label: str
    shown: str  # the path with <placeholders>
    ms: list[float] = field(default_factory=list)
    statements: int = 0
    bytes: int = 0


@contextmanager
def counting(engine: sa.Engine) -> Iterator[list[str]]:
    sent: list[str] = []

    def listener(*args: Any) -> None:
        sent.append(str(args[2]))

    sa.event.listen(engine, "before_cursor_execute", listener)
    try:
        yield sent
    finally:
        sa.event.remove(engine, "before_cursor_execute", listener)


def pages(server: Server) -> list[tuple[str, str, str]]:
    """(label, path, path shown) of every page and its twin."""
    dag = dag_name(0)
    with server.engine.connect() as conn:
        run_id = conn.execute(
            sa.text(
                f"SELECT run_id FROM {server.q('dag_run')} WHERE dag_id = :dag"
                " AND state IN ('success', 'failed') ORDER BY seq DESC LIMIT 1"
            ),
            {"dag": dag},
        ).scalar_one()
    asset = asset_name(0)
    found = [
        ("overview", "/", "/"),
        ("consumer", f"/dags/{dag}", "/dags/<dag>"),
        ("partitioned consumer", f"/dags/{PARTITIONED}", "/dags/<partitioned>"),
        ("run", f"/dags/{dag}/runs/{quote(run_id, safe='')}", "/dags/<dag>/runs/<run>"),
        ("assets", "/assets", "/assets"),
        ("asset", f"/assets/{quote(asset)}", "/assets/<name>"),
        ("workers", "/workers", "/workers"),
    ]
    return [
        (label, prefix + html.rstrip("/") or "/", prefix + shown.rstrip("/") or "/")
        for label, html, shown in found
        for prefix in ("", "/api")
    ]


def measure(server: Server, warmup: int, requests: int) -> list[PageResult]:
    from starlette.testclient import TestClient

    console = assetq.web.app(server.engine, namespace=server.namespace)
    results = []
    with TestClient(console) as client:
        for label, path, shown in pages(server):
            result = PageResult(server.version, path, label, shown)
            for i in range(warmup + requests):
                with counting(server.engine) as sent:
                    started = time.perf_counter()
                    response = client.get(path)
                    elapsed = (time.perf_counter() - started) * 1000
                if response.status_code != 200:
                    raise RuntimeError(f"{path}: {response.status_code} {response.text[:500]}")
                if i >= warmup:
                    result.ms.append(elapsed)
                result.statements = len(sent)
                result.bytes = len(response.content)
            results.append(result)
    return results


# -- the run -------------------------------------------------------------------------------


@dataclass
class EngineResult:
    engine: str
    version: str
    vol: Volumes
    load_times: dict[str, float]
    pages: list[PageResult]


def measure_engine(name: str, url: str, args: argparse.Namespace) -> EngineResult:
    vol = volumes(args.scale)
    server = make_server(name, url, f"aqbench_web_{os.getpid()}")
    try:
        started = time.monotonic()
        declare_assets(server, vol)
        times = {"assets": time.monotonic() - started}
        times.update(load(server, vol, datetime.now(timezone.utc)))
        print(
            f"{server.version}: loaded " + ", ".join(f"{k} {v:.1f} s" for k, v in times.items()),
            file=sys.stderr,
        )
        found = measure(server, args.warmup, args.requests)
    finally:
        server.drop()
    return EngineResult(name, server.version, vol, times, found)


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def table(results: Sequence[EngineResult]) -> list[str]:
    header = ["engine", "page", "path", "requests", "p50 ms", "max ms", "statements", "bytes"]
    lines = [_row(header), "|" + "|".join("---" for _ in header) + "|"]
    for result in results:
        for p in result.pages:
            lines.append(
                _row(
                    [
                        result.version,
                        p.label,
                        f"`{p.shown}`",
                        f"{len(p.ms)}",
                        f"{pct(p.ms, 0.5):,.1f}",
                        f"{max(p.ms):,.1f}",
                        f"{p.statements}",
                        f"{p.bytes:,}",
                    ]
                )
            )
    return lines


def render(results: Sequence[EngineResult], args: argparse.Namespace) -> list[str]:
    lines = []
    for r in results:
        v = r.vol
        lines.append(
            f"- {r.version}: {v.events:,} events over {v.assets:,} assets, {v.runs:,} runs"
            f" ({v.runs * v.links:,} links, {v.links} per run), {v.consumers:,} consumers,"
            f" {v.queued:,} queue rows, 1 scheduler and {WORKERS} workers alive; <dag> is"
            f" {dag_name(0)} ({v.runs_per_consumer:,} runs), <run> its newest finished one,"
            f" <partitioned> {PARTITIONED} ({PARTITION_KEYS:,} keys pending), <name>"
            f" {asset_name(0)} ({v.events_per_asset:,} events); loaded in "
            + ", ".join(f"{k} {s:,.1f} s" for k, s in r.load_times.items())
            + "."
        )
    over = [
        f"{r.version} {p.shown}" for r in results for p in r.pages if pct(p.ms, 0.5) > BUDGET_MS
    ]
    return [
        f"Every page of `assetq.web.app(engine)` requested in-process (Starlette's TestClient),"
        f" {args.warmup} warm-up requests then {args.requests} timed ones per page, one after"
        " another; p50 (nearest rank) and max of a request's wall time; statements: the SQL"
        " statements the page sends (a before_cursor_execute listener); bytes: the response's"
        f" body. Volumes (--scale {args.scale:g}):",
        "",
        *lines,
        "",
        *table(results),
        "",
        (
            f"p50 over {BUDGET_MS:.0f} ms: " + ", ".join(over) + "."
            if over
            else f"Every page's p50 is under {BUDGET_MS:.0f} ms."
        ),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", default="postgresql,mysql")
    parser.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="x (1,000,000 events, 100,000 runs, 1,000 consumers); default 1, the issue's volumes",
    )
    parser.add_argument("--requests", type=int, default=20, help="timed requests per page")
    parser.add_argument("--warmup", type=int, default=3, help="untimed requests per page first")
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--mysql", default="mysql://root@127.0.0.1:3306")
    parser.add_argument(
        "--output",
        type=Path,
        help="also write the table, with the command and the machine's load, to this Markdown"
        " file (docs/benchmarks/web_pages.md)",
    )
    args = parser.parse_args(argv)
    if args.requests < 1 or args.scale <= 0:
        parser.error("--requests must be at least 1 and --scale positive")
    command = " ".join(["python benchmarks/web_pages.py", *argv])
    # SIGTERM as Ctrl-C: the databases are dropped.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    load_before = os.getloadavg()
    started = time.monotonic()
    results = []
    for name in args.engines.split(","):
        if name not in ("postgresql", "mysql"):
            parser.error(f"unknown engine {name!r}")
        url = args.postgres if name == "postgresql" else args.mysql
        results.append(measure_engine(name, url, args))
    load_after = os.getloadavg()
    lines = render(results, args)
    print("\n".join(lines))
    if args.output is not None:
        preface = [
            f"Measured with `{command}` on {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC"
            f" ({time.monotonic() - started:.0f} s), assetq {assetq.__version__} at schema"
            f" {assetq.head_revision()}; load average (1 min) {load_before[0]:.1f} before,"
            f" {load_after[0]:.1f} after ({os.cpu_count()} cores, shared).",
            "",
        ]
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text("\n".join(preface + lines) + "\n", "utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
