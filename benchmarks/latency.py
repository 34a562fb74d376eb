"""Event -> run latency of the long-running scheduler (assetq.run_scheduler), both engines.

    python benchmarks/latency.py                 # about 6 minutes on 2 cores
    python benchmarks/latency.py --seconds 3     # shorter rounds

Latency of an event: from the moment its producer's COMMIT returned to the moment the
scheduler's pass that consumed it had committed and handed the run to ``on_run``. Both
instants are read from one monotonic clock: producers and the scheduler are threads of this
process, each with its own connection. (Under load a latency can come out a little below
zero: the scheduler's thread may hand out the run before the producer's thread, back from its
COMMIT, gets to read the clock.) Every consumer is scheduled on one asset of its own,
so every event makes a run of its own consumer.

Scenarios, each a round of ``--seconds`` seconds, for each engine:

idle   one producer registers an event every 50-150 ms (random), so the scheduler waits
       between events: the latency is the wake-up's.
load   ``--producers`` threads register events back to back, each its own transaction;
       the scheduler passes back to back.

Wake-ups: PostgreSQL with LISTEN/NOTIFY (and ``--poll-interval`` as the safety net), and
PostgreSQL polling only, for comparison; MySQL/MariaDB polls every ``--poll-interval``
seconds. Polling latency is about half the poll interval at idle, by construction.

Producer cost of the wake-up (PostgreSQL): registration throughput with the notification
trigger enabled and disabled, at 1 and ``--producers`` threads, rounds interleaved, in three
states of the schedulers (a transaction notifies only while a scheduler holds the wake-up
lock: sql/postgresql/routines/asset_dag_run_queue_notify.sql):

none       no scheduler runs: no transaction notifies;
running    one run_scheduler loop consumes the events as they come (what production looks
           like): it holds the lock only when a pass found nothing;
2 running  two loops: one may hold the lock while the other is busy;
waiting    a session holds the wake-up lock throughout, as a scheduler that has nothing to
           do: every transaction notifies (the worst case, and what every transaction paid before
           development schema 0005_wakeup_on_demand made it depend on the lock).

With the trigger off, the running loops only poll, every 5 ms (listen=False: no listening
connection, no locks); with it on they poll every second and are woken by notifications. So
both sides consume events about as promptly: a loop that slept a whole poll interval would
consume them in fewer, larger runs, fewer commits that compete with the producers' for the
disk, and the ratio would measure that rather than the notification.

Servers: PostgreSQL at ``--postgres`` (default: the local server, postgres@127.0.0.1:5432) in
a database created for the run and dropped after; MariaDB/MySQL on a throw-away server
started from this machine's mariadbd/mysqld (tests/dbs.py), or at ``--mysql URL`` (a
dedicated test server: see tests/dbs.py). Needs the test extra (``pip install -e '.[test]'``).
"""

from __future__ import annotations

import argparse
import importlib
import os
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import assetq
from assetq import sqlfiles
from assetq.dialects import POSTGRESQL

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

#: tests/dbs.py: disposable databases and throw-away MariaDB servers (not a typed package).
dbs: Any = importlib.import_module("dbs")

CONSUMERS = 4


@dataclass(frozen=True)
class Result:
    engine: str
    wakeup: str
    scenario: str
    events: int
    seconds: float
    latencies_ms: list[float]

    def row(self) -> str:
        lat = sorted(self.latencies_ms)
        if not lat:
            return f"{self.engine:<10} | {self.wakeup:<7} | {self.scenario:<5} | no events"
        p50 = statistics.median(lat)
        p99 = lat[min(len(lat) - 1, round(0.99 * (len(lat) - 1)))]
        return (
            f"{self.engine:<10} | {self.wakeup:<7} | {self.scenario:<5} | {self.events:>7,} |"
            f" {self.events / self.seconds:>8,.0f} | {p50:>8.1f} | {p99:>8.1f} | {lat[-1]:>8.1f}"
        )


HEADER = (
    "engine     | wake-up | load  |  events | events/s |  p50 ms |  p99 ms |  max ms\n"
    "-----------|---------|-------|---------|----------|---------|---------|---------"
)


def _setup(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        for i in range(CONSUMERS):
            assetq.declare_dag(conn, f"consumer_{i}", f"asset_{i}")


def measure(
    engine: sa.Engine,
    *,
    engine_name: str,
    listen: bool,
    scenario: str,
    seconds: float,
    producers: int,
    poll_interval: float,
) -> Result:
    """One round: producers for ``seconds``, one scheduler; then the backlog is drained."""
    committed: dict[int, float] = {}
    consumed: dict[int, float] = {}
    lock = threading.Lock()
    stop_producing = threading.Event()
    stop_scheduler = threading.Event()
    failures: list[BaseException] = []

    def on_run(run: assetq.Run) -> None:
        now = time.monotonic()
        with lock:
            for event_id in run.event_ids:
                consumed[event_id] = now

    def schedule() -> None:
        try:
            assetq.run_scheduler(
                engine,
                stop_event=stop_scheduler,
                on_run=on_run,
                poll_interval=poll_interval,
                listen=listen,
                summary_interval=3600,
            )
        except BaseException as exc:
            failures.append(exc)

    def produce(seed: int) -> None:
        rng = random.Random(seed)
        try:
            while not stop_producing.is_set():
                with engine.connect() as conn:
                    event = assetq.register_event(conn, f"asset_{rng.randrange(CONSUMERS)}")
                    conn.commit()
                    now = time.monotonic()
                with lock:
                    committed[event.id] = now
                if scenario == "idle":
                    stop_producing.wait(rng.uniform(0.05, 0.15))
        except BaseException as exc:
            failures.append(exc)

    scheduler = threading.Thread(target=schedule)
    scheduler.start()
    time.sleep(0.5)  # the scheduler is up and waiting
    threads = [
        threading.Thread(target=produce, args=(seed,))
        for seed in range(1 if scenario == "idle" else producers)
    ]
    started = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop_producing.set()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    deadline = time.monotonic() + poll_interval * 3 + 30
    while time.monotonic() < deadline and not failures:
        with lock:
            if set(committed) <= set(consumed):
                break
        time.sleep(0.01)
    stop_scheduler.set()
    scheduler.join()
    if failures:
        raise failures[0]
    missing = set(committed) - set(consumed)
    if missing:
        raise RuntimeError(f"{len(missing)} events were not consumed")
    latencies = [(consumed[e] - committed[e]) * 1000 for e in committed]
    return Result(
        engine_name,
        "notify" if listen else "poll",
        scenario,
        len(committed),
        elapsed,
        latencies,
    )


SCHEDULER_STATES = ("none", "running", "2 running", "waiting")


def producer_cost(
    engine: sa.Engine, seconds: float, producers: int, repetitions: int
) -> list[tuple[str, str, int, list[float], list[float]]]:
    """Registration events/s with the PostgreSQL notification trigger on and off, in
    interleaved rounds, with durable commits and with synchronous_commit off, for each of
    SCHEDULER_STATES. Returns (schedulers, commit mode, threads, on, off) per row."""
    queries = sqlfiles.parse_queries((HERE / "sql" / "latency.postgresql.sql").read_text("utf-8"))

    def sql(name: str) -> sa.TextClause:
        return sa.text(sqlfiles.render(queries[name], POSTGRESQL.quote_ns(dbs.NAMESPACE)))

    def set_trigger(enabled: bool) -> None:
        with engine.begin() as conn:
            conn.execute(sql("enable_notify" if enabled else "disable_notify"))

    def throughput(threads: int, durable: bool) -> float:
        count = [0] * threads
        stop = threading.Event()

        def work(i: int) -> None:
            with engine.connect() as conn:
                if not durable:
                    conn.execute(sql("async_commit"))
                    conn.commit()
                while not stop.is_set():
                    assetq.register_event(conn, f"asset_{i % CONSUMERS}")
                    conn.commit()
                    count[i] += 1
                if not durable:  # back to the server's default before the pool reuses it
                    conn.invalidate()

        workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        for w in workers:
            w.start()
        time.sleep(seconds)
        stop.set()
        for w in workers:
            w.join()
        return sum(count) / seconds

    def round_(state: str, threads: int, durable: bool, trigger: bool) -> float:
        if state == "none":
            return throughput(threads, durable)
        if state == "waiting":
            with engine.connect() as conn:  # holds the wake-up lock for the round
                conn.execute(sa.text(POSTGRESQL.query("wakeup_arm", dbs.NAMESPACE)))
                conn.commit()
                try:
                    return throughput(threads, durable)
                finally:
                    conn.invalidate()  # a session lock: it goes with the connection
        stop = threading.Event()
        schedulers = [
            threading.Thread(
                target=assetq.run_scheduler,
                args=(engine,),
                kwargs={
                    "stop_event": stop,
                    "poll_interval": 1.0 if trigger else 0.005,
                    "listen": trigger,
                    "summary_interval": 3600,
                },
            )
            for _ in range(2 if state == "2 running" else 1)
        ]
        for scheduler in schedulers:
            scheduler.start()
        try:
            return throughput(threads, durable)
        finally:
            stop.set()
            for scheduler in schedulers:
                scheduler.join()

    results = []
    for state in SCHEDULER_STATES:
        for durable in (True, False):
            for threads in (1, producers):
                on: list[float] = []
                off: list[float] = []
                for _ in range(repetitions):
                    for enabled, into in ((True, on), (False, off)):
                        set_trigger(enabled)
                        into.append(round_(state, threads, durable, enabled))
                set_trigger(True)
                results.append((state, "durable" if durable else "async", threads, on, off))
    return results


def _postgres(url_text: str) -> tuple[Any, Any]:
    # The suite's own reading of a server URL: a unix socket directory in ?host= (as the
    # embedded server's URLs have it) is honoured.
    backend = dbs.postgres_backend(url_text)
    return backend, backend.database(installed=True)


def _mysql(choice: str) -> tuple[Any, Any]:
    backend = dbs.mysql_backend(choice)
    return backend, backend.database(installed=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="length of a round")
    parser.add_argument("--producers", type=int, default=4, help="producer threads under load")
    parser.add_argument(
        "--poll-interval", type=float, default=1.0, help="scheduler poll interval, seconds"
    )
    parser.add_argument("--repetitions", type=int, default=3, help="rounds of the producer cost")
    parser.add_argument("--engines", default="postgresql,mysql")
    parser.add_argument(
        "--figures",
        default="latency,cost",
        help="which figures: latency, cost (the wake-up's producer cost), or both",
    )
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--mysql", default="private", help="'private' or a server URL")
    parser.add_argument(
        "--output",
        type=Path,
        help="also write the tables, with the command and the machine's load, to this"
        " Markdown file (docs/benchmarks.md includes docs/benchmarks/latency.md)",
    )
    args = parser.parse_args(argv)
    command = " ".join(["python benchmarks/latency.py", *(sys.argv[1:] if argv is None else argv)])
    load_before = os.getloadavg()
    servers: dict[str, str] = {}

    rounds: list[tuple[str, bool, Callable[[], tuple[Any, Any]]]] = []
    figures = set(args.figures.split(","))
    if not figures <= {"latency", "cost"}:
        parser.error(f"unknown figures {sorted(figures - {'latency', 'cost'})}")
    for name in args.engines.split(","):
        if name == "postgresql":
            rounds.append(("postgresql", True, lambda: _postgres(args.postgres)))
            if "latency" in figures:
                rounds.append(("postgresql", False, lambda: _postgres(args.postgres)))
        elif name == "mysql" and "latency" in figures:
            rounds.append(("mysql", False, lambda: _mysql(args.mysql)))
        elif name != "mysql":
            parser.error(f"unknown engine {name!r}")

    results: list[Result] = []
    cost: list[tuple[str, str, int, list[float], list[float]]] = []
    for engine_name, listen, make in rounds:
        backend, database = make()
        engine = backend.create_engine(database.url, pool_size=args.producers + 4)
        try:
            _setup(engine)
            version = engine.dialect.server_version_info or ()
            servers[engine_name] = ".".join(str(part) for part in version) + (
                " (MariaDB)" if getattr(engine.dialect, "is_mariadb", False) else ""
            )
            for scenario in ("idle", "load") if "latency" in figures else ():
                result = measure(
                    engine,
                    engine_name=engine_name,
                    listen=listen,
                    scenario=scenario,
                    seconds=args.seconds,
                    producers=args.producers,
                    poll_interval=args.poll_interval,
                )
                print(result.row(), file=sys.stderr, flush=True)
                results.append(result)
            if engine_name == "postgresql" and listen and "cost" in figures:
                cost = producer_cost(
                    engine, min(args.seconds, 2.0), args.producers, args.repetitions
                )
        finally:
            engine.dispose()
            backend.drop(database)
            backend.close()

    lines: list[str] = []
    if results:
        lines += [
            f"Event -> run latency; {args.seconds:g} s rounds, poll interval"
            f" {args.poll_interval:g} s, idle: 1 producer, an event every 50-150 ms; load:"
            f" {args.producers} producers back to back; 1 scheduler; {CONSUMERS} consumers.",
            "",
            HEADER,
            *(result.row() for result in results),
        ]
    if cost:
        lines += [
            "",
            "Producer cost of the wake-up trigger (PostgreSQL), registration events/s,"
            f" median (min-max) of {args.repetitions} interleaved rounds of"
            f" {min(args.seconds, 2.0):g} s; durable: synchronous_commit on (the server's"
            " default here), async: off for the producers' sessions. Schedulers: none; one"
            " or two run_scheduler loops (when the trigger is off, polling every 5 ms without"
            " listening, so that they consume as promptly as when woken); a session holding"
            " the wake-up lock throughout (every transaction notifies, as before development"
            " schema 0005_wakeup_on_demand):",
            "",
            "schedulers | commits | threads | trigger on          | trigger off         |"
            " ratio on/off",
            "-----------|---------|---------|---------------------|---------------------|"
            "-----------------",
        ]
        for state, mode, threads, on, off in cost:
            ratios = [a / b for a, b in zip(on, off, strict=True)]

            def fmt(values: list[float]) -> str:
                return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"

            lines.append(
                f"{state:<10} | {mode:<7} | {threads:>7} | {fmt(on):<19} | {fmt(off):<19} |"
                f" {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
            )
    print("\n".join(lines))
    if args.output is not None:
        load_after = os.getloadavg()
        versions = ", ".join(f"{name} {version}" for name, version in servers.items())
        preface = [
            f"Measured with `{command}` on"
            f" {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, schema"
            f" {assetq.head_revision()}; servers: {versions}; load average"
            f" {load_before[0]:.1f} before, {load_after[0]:.1f} after ({os.cpu_count()} cores).",
            "",
        ]
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text("\n".join(preface + lines) + "\n", "utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
