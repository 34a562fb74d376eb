"""The ceiling of one primary: a paced sweep of the offered event rate, both engines.

    python benchmarks/ceiling.py                       # about 4 minutes on 2 cores
    python benchmarks/ceiling.py --rates 100,400,1600 --seconds 5

For each offered rate (events/s, all producers together), one round of ``--seconds``:
``--producers`` producer processes (separate processes, so the GIL of one Python is not the
ceiling) each register events at their share of the rate, one event per transaction, on
``CONSUMERS`` assets (each the condition of a consumer of its own); one scheduler
(``assetq.run_scheduler``, woken by LISTEN/NOTIFY on PostgreSQL, polling every
``--poll-interval`` on MySQL/MariaDB) makes runs; ``--workers`` worker processes
(``assetq.run_worker``, ``--concurrency`` slots each, a handler that only reads which events
its run consumed) execute them. Measured:

* events/s committed (achieved) against the offered rate;
* event -> handler latency, from the moment a producer's COMMIT returned to the first line
  of the handler of the run that consumed the event (the run made by the scheduler's pass or
  by the worker's own, whichever came first; one monotonic clock: Linux's CLOCK_MONOTONIC is
  the same in every process), p50 and p99;
* runs/s made (by the scheduler and the worker's passes) and runs/s the worker completed.

A rate **holds** when the producers achieve at least 95 % of it and the p99 latency stays
under ``--p99-limit`` ms (default 500, a tenth of assetq's default poll interval); the
ceiling is the highest rate that holds before the first that does not. The machine is what
it is: this is a ceiling of this machine and its load, printed with the load average, and
measured with the engines one after the other, not side by side.

Servers as in benchmarks/latency.py: PostgreSQL at ``--postgres`` (a database made for the
run, dropped after), MariaDB/MySQL on a throw-away server (tests/dbs.py) or ``--mysql URL``.
"""

from __future__ import annotations

import argparse
import importlib
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import assetq

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

#: tests/dbs.py: disposable databases and throw-away MariaDB servers (not a typed package).
dbs: Any = importlib.import_module("dbs")
from benchmark_db import pct  # noqa: E402

CONSUMERS = 8
#: Seconds the workers may go on after the producers, to run what they left.
DRAIN = 30.0
_RUNS = "SELECT count(*) FROM assetq.dag_run"
_LEFT = (
    "SELECT (SELECT count(*) FROM assetq.dag_run WHERE state IN ('queued', 'running'))"
    " + (SELECT count(*) FROM assetq.asset_dag_run_queue)"
)


def declare_consumers(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        for i in range(CONSUMERS):
            assetq.declare_dag(conn, f"consumer_{i}", f"asset_{i}")


def _produce(url: str, rate: float, seconds: float, seed: int, out: Any) -> None:
    """One producer process: ``rate`` events/s for ``seconds``; sends (event id, commit
    instant) pairs back."""
    engine = sa.create_engine(url, pool_size=1)
    done: list[tuple[int, float]] = []
    began = time.monotonic()
    n = 0
    try:
        while True:
            due = began + n / rate
            now = time.monotonic()
            if due - began >= seconds:
                break
            if due > now:
                time.sleep(due - now)
            with engine.connect() as conn:
                event = assetq.register_event(conn, f"asset_{(seed + n) % CONSUMERS}")
                conn.commit()
                done.append((event.id, time.monotonic()))
            n += 1
    finally:
        engine.dispose()
        out.put(done)


def _work(url: str, concurrency: int, told: Any, out: Any) -> None:
    """The worker process: executes runs until ``told`` is set, then sends its count and when
    each event's handler started."""
    engine = sa.create_engine(url, pool_size=concurrency + 2)
    stop = threading.Event()

    def wait() -> None:
        told.wait()
        stop.set()

    threading.Thread(target=wait, daemon=True).start()
    started: list[tuple[int, float]] = []

    def note(claim: assetq.Claim, conn: sa.Connection) -> None:
        now = time.monotonic()  # its first line; then which events it has
        page: list[assetq.Event] = []
        while True:
            page = assetq.consumed_events(
                conn, claim.dag_id, claim.run_id, limit=1000, after=page[-1] if page else None
            )
            if not page:
                break
            started.extend((event.id, now) for event in page)

    stats = assetq.run_worker(
        engine,
        {f"consumer_{i}": note for i in range(CONSUMERS)},
        concurrency=concurrency,
        stop=stop,
        poll_interval=0.2,
        lease=timedelta(seconds=30),
    )
    engine.dispose()
    out.put((stats.succeeded, started))


@dataclass(frozen=True)
class Round:
    engine: str
    offered: float
    achieved: float
    p50_ms: float
    p99_ms: float
    runs_made: float
    runs_done: float
    unconsumed: int

    def holds(self, p99_limit: float) -> bool:
        return (
            self.achieved >= 0.95 * self.offered
            and self.p99_ms <= p99_limit
            and self.unconsumed == 0
        )

    def row(self, p99_limit: float) -> str:
        return (
            f"| {self.engine} | {self.offered:,.0f} | {self.achieved:,.0f} | {self.p50_ms:,.1f} |"
            f" {self.p99_ms:,.1f} | {self.runs_made:,.0f} | {self.runs_done:,.0f} |"
            f" {self.unconsumed:,} | {'yes' if self.holds(p99_limit) else 'no'} |"
        )


HEADER = (
    "| engine | offered events/s | achieved events/s | p50 ms | p99 ms | runs made/s |"
    " runs done/s | not run | holds |\n|---|---|---|---|---|---|---|---|---|"
)


def one_round(
    engine: sa.Engine,
    url: str,
    engine_name: str,
    rate: float,
    *,
    seconds: float,
    producers: int,
    workers: int,
    concurrency: int,
    poll_interval: float,
) -> Round:
    committed: dict[int, float] = {}
    consumed: dict[int, float] = {}
    stop = threading.Event()
    failures: list[BaseException] = []

    def schedule() -> None:
        try:
            assetq.run_scheduler(
                engine, stop_event=stop, poll_interval=poll_interval, summary_interval=3600
            )
        except BaseException as exc:
            failures.append(exc)

    with engine.connect() as conn:
        runs_before = conn.execute(sa.text(_RUNS)).scalar_one()

    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    scheduler = threading.Thread(target=schedule)
    scheduler.start()
    told = context.Event()
    worker_procs = [
        context.Process(target=_work, args=(url, concurrency, told, results))
        for _ in range(workers)
    ]
    for worker in worker_procs:
        worker.start()
    time.sleep(1.5)  # the scheduler and the worker are up
    procs = [
        context.Process(target=_produce, args=(url, rate / producers, seconds, n, results))
        for n in range(producers)
    ]
    for proc in procs:
        proc.start()
    done_runs = 0
    for _ in range(producers):
        for event_id, at in results.get(timeout=seconds + 120):
            committed[event_id] = at
    # Then until nothing is left to do (or DRAIN seconds): the workers stop once every run is
    # final and nothing is queued.
    deadline = time.monotonic() + DRAIN
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            if not conn.execute(sa.text(_LEFT)).scalar_one():
                break
        time.sleep(0.1)
    told.set()
    for _ in range(workers):
        done, starts = results.get(timeout=120)
        done_runs += done
        consumed.update(starts)
    for proc in [*procs, *worker_procs]:
        proc.join(30)
    stop.set()
    scheduler.join()
    if failures:
        raise failures[0]
    with engine.connect() as conn:
        runs_made = conn.execute(sa.text(_RUNS)).scalar_one() - runs_before
    latencies = [(consumed[e] - at) * 1000 for e, at in committed.items() if e in consumed]
    return Round(
        engine_name,
        rate,
        len(committed) / seconds,
        pct(latencies, 0.5) if latencies else float("nan"),
        pct(latencies, 0.99) if latencies else float("nan"),
        runs_made / seconds,
        done_runs / seconds,
        len(set(committed) - set(consumed)),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rates", default="100,200,400,800,1600,3200")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument("--concurrency", type=int, default=4, help="slots per worker")
    parser.add_argument("--poll-interval", type=float, default=0.2)
    parser.add_argument("--p99-limit", type=float, default=500.0, metavar="MS")
    parser.add_argument("--engines", default="postgresql,mysql")
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--mysql", default="private", help="'private' or a server URL")
    parser.add_argument("--output", type=Path, help="also write the table to this Markdown file")
    args = parser.parse_args(argv)
    command = " ".join(["python benchmarks/ceiling.py", *(sys.argv[1:] if argv is None else argv)])
    rates = [float(r) for r in args.rates.split(",")]
    load_before = os.getloadavg()
    began = datetime.now(timezone.utc)
    rounds: list[Round] = []
    servers: dict[str, str] = {}
    for name in [e.strip() for e in args.engines.split(",") if e.strip()]:
        if name == "postgresql":
            backend = dbs.postgres_backend(args.postgres)
        elif name == "mysql":
            backend = dbs.mysql_backend(args.mysql)
        else:
            parser.error(f"unknown engine {name!r}")
        database = backend.database(installed=True)
        engine = backend.create_engine(database.url, pool_size=4)
        url = database.url.render_as_string(hide_password=False)
        try:
            declare_consumers(engine)
            version = engine.dialect.server_version_info or ()
            servers[name] = ".".join(str(part) for part in version) + (
                " (MariaDB)" if getattr(engine.dialect, "is_mariadb", False) else ""
            )
            for rate in rates:
                result = one_round(
                    engine,
                    url,
                    name,
                    rate,
                    seconds=args.seconds,
                    producers=args.producers,
                    workers=args.workers,
                    concurrency=args.concurrency,
                    poll_interval=args.poll_interval,
                )
                print(result.row(args.p99_limit), file=sys.stderr, flush=True)
                rounds.append(result)
                if not result.holds(args.p99_limit) and result.achieved < 0.95 * rate:
                    break  # the producers cannot go faster: higher rates say nothing more
        finally:
            engine.dispose()
            backend.drop(database)
            backend.close()
    load_after = os.getloadavg()
    lines = [
        f"`{command}`, {began:%Y-%m-%d %H:%M} UTC, load average {load_before[0]:.1f} before and"
        f" {load_after[0]:.1f} after; servers: "
        + ", ".join(f"{k} {v}" for k, v in servers.items())
        + f"; {args.producers} producer processes, {CONSUMERS} consumers, 1 scheduler,"
        f" {args.workers} worker processes of {args.concurrency} slots; rounds of"
        f" {args.seconds:g} s.",
        "",
        HEADER,
        *(r.row(args.p99_limit) for r in rounds),
        "",
    ]
    for name in servers:
        mine = [r for r in rounds if r.engine == name]
        held = []
        for r in mine:
            if not r.holds(args.p99_limit):
                break
            held.append(r)
        ceiling = f"{held[-1].offered:,.0f} events/s" if held else "below the lowest rate"
        lines.append(
            f"- {name}: holds up to {ceiling} (achieved >= 95 % of offered, p99 <="
            f" {args.p99_limit:g} ms, every event consumed)."
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.output:
        args.output.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
