"""What migration 0004 costs: registration and scheduler passes at revision 0003_operations
against the same at head, side by side on one server (PostgreSQL or MySQL/MariaDB).

0004 made the fan-out trigger lock each consumer row it queues for (FOR KEY SHARE, so a
consumer deleted meanwhile is skipped instead of failing the producer) and look for alias
consumers, and made the pass check max_active_runs / max_events_per_run and record the
triggering event. This measures the price on the paths every user pays, with no aliases and
no caps set:

registration
    ``register_event`` with autocommit (one round trip), ``--consumers`` consumers on the
    asset, for 1 and 8 threads; rounds of the two namespaces alternate (and alternate which
    goes first). Reported: events/s median (min-max) and the ratio head / 0003 per repetition.
pass
    a pass over ``--consumers`` consumers, each with ``--queued`` queued rows, called
    directly (``SELECT * FROM ns.schedule_pass(1000)``, ``CALL ns.schedule_pass(1000)``: the
    0003 pass returns fewer columns, so not through ``assetq.schedule``); the time of one
    pass, alternating the namespaces.

Without ``--url`` a fresh database ``aqd_up4_<pid>`` is created on the local PostgreSQL
(postgres@127.0.0.1:5432) and dropped at the end. With a MySQL/MariaDB ``--url``
(``mysql+pymysql://root@127.0.0.1:3306/``) the two namespaces are two databases on that
server, created and dropped by the run.

    python benchmarks/upgrade_0004.py [--url URL] [--seconds 2] [--repetitions 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from collections.abc import Callable

import sqlalchemy as sa
from alembic import command
from sqlalchemy import Connection, Engine

import assetq
from assetq import migrate
from assetq.dialects import dialect_for

OLD, NEW = "aqup_0003", "aqup_head"

#: Statements that differ between engines: {ns} is the quoted namespace.
SQL = {
    "postgresql": {
        "declare": "SELECT {ns}.declare_dag(:d, CAST(:c AS jsonb), CAST(:k AS jsonb))",
        "pass": "SELECT * FROM {ns}.schedule_pass(1000)",
        "drop": "DROP SCHEMA IF EXISTS {ns} CASCADE",
    },
    "mysql": {
        "declare": "CALL {ns}.declare_dag(:d, :c, :k, NULL)",
        "pass": "CALL {ns}.schedule_pass(1000)",
        "drop": "DROP DATABASE IF EXISTS {ns}",
    },
}


def _sql(engine: Engine, name: str, ns: str) -> sa.TextClause:
    dialect = "mysql" if engine.dialect.name in ("mysql", "mariadb") else "postgresql"
    quote = "`" if dialect == "mysql" else '"'
    return sa.text(SQL[dialect][name].replace("{ns}", f"{quote}{ns}{quote}"))


def _setup(engine: Engine, consumers: int) -> None:
    for ns in (OLD, NEW):
        with engine.begin() as conn:
            conn.execute(_sql(engine, "drop", ns))
        with engine.begin() as conn:
            dialect_for(conn).execute(conn, "create_namespace", ns)
        if ns == OLD:
            with engine.begin() as conn:
                command.upgrade(migrate._config(conn, ns), "0003_operations")
        else:
            assetq.install(engine, namespace=ns)
        with engine.begin() as conn:
            for n in range(consumers):
                if ns == NEW:
                    assetq.declare_dag(conn, f"c{n}", "a", namespace=ns)
                    continue
                # The 0003 routine has no option parameters: call it by its own signature.
                conn.execute(
                    _sql(engine, "declare", ns),
                    {"d": f"c{n}", "c": '{"asset":"a"}', "k": '[["a"]]'},
                )


def _round(engine: Engine, ns: str, threads: int, seconds: float) -> float:
    counts = [0] * threads
    stop = threading.Event()
    barrier = threading.Barrier(threads + 1)

    def work(i: int) -> None:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            barrier.wait()
            while not stop.is_set():
                assetq.register_event(conn, "a", namespace=ns)
                counts[i] += 1

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in pool:
        t.join()
    return sum(counts) / (time.perf_counter() - started)


def _drain(conn: Connection, ns: str) -> float:
    """One pass on ``conn``: a scheduler's own long-lived connection, so a routine the server
    compiles per connection (MariaDB's procedure cache) is compiled once, as in production."""
    conn.begin()
    dialect_for(conn).execute(conn, "scheduler_transaction", ns)
    started = time.perf_counter()
    conn.execute(_sql(conn.engine, "pass", ns)).all()
    conn.commit()
    return time.perf_counter() - started


def _wait_for_purge(engine: Engine, limit: float = 180.0) -> None:
    """InnoDB: wait until the queue rows the first passes deleted are purged. Until then a
    consumer's queue read steps over them, and whichever namespace was drained last pays
    (measured: 2.2 ms instead of 0.1 ms per consumer): the order, not the revision. The
    "History list length" of SHOW ENGINE INNODB STATUS reaches 0 long before; a scan of each
    (empty) queue that has become fast again is what tells."""
    if engine.dialect.name != "mysql":
        return
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        slowest = 0.0
        with engine.connect() as conn:
            for ns in (OLD, NEW):
                started = time.perf_counter()
                conn.execute(sa.text(f"SELECT COUNT(*) FROM `{ns}`.asset_dag_run_queue")).one()
                slowest = max(slowest, time.perf_counter() - started)
        if slowest < 0.002:
            return
        time.sleep(1.0)


def _fill(engine: Engine, ns: str, queued: int) -> None:
    with engine.begin() as conn:
        assetq.register_events(conn, [assetq.NewEvent("a")] * queued, namespace=ns)


def _summary(values: list[float]) -> str:
    return f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})"


def _ratios(new: list[float], old: list[float], invert: bool = False) -> str:
    r = [(o / n if invert else n / o) for n, o in zip(new, old, strict=True)]
    return f"{statistics.median(r):.2f} ({min(r):.2f}-{max(r):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--consumers", type=int, default=10)
    parser.add_argument("--queued", type=int, default=20)
    args = parser.parse_args()
    admin = None
    url = args.url
    if url is None:
        name = f"aqd_up4_{os.getpid()}"
        admin = sa.create_engine(
            "postgresql+psycopg://postgres@127.0.0.1/postgres", isolation_level="AUTOCOMMIT"
        )
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        url = f"postgresql+psycopg://postgres@127.0.0.1/{name}"
    engine = sa.create_engine(url, pool_size=10)
    try:
        _setup(engine, args.consumers)
        print(f"{args.consumers} consumers on one asset; {args.repetitions} repetitions")
        print("| measure | 0003_operations | head | head / 0003 |")
        print("|---|---|---|---|")
        for threads in (1, 8):
            results: dict[str, list[float]] = {OLD: [], NEW: []}
            for rep in range(args.repetitions):
                order = (OLD, NEW) if rep % 2 == 0 else (NEW, OLD)
                for ns in order:
                    results[ns].append(_round(engine, ns, threads, args.seconds))
            print(
                f"| register_event, events/s, {threads} thread(s) | {_summary(results[OLD])}"
                f" | {_summary(results[NEW])} | {_ratios(results[NEW], results[OLD])} |"
            )
        schedulers = {ns: engine.connect() for ns in (OLD, NEW)}
        for ns in (OLD, NEW):
            _drain(schedulers[ns], ns)
        _wait_for_purge(engine)
        times: dict[str, list[float]] = {OLD: [], NEW: []}
        for rep in range(args.repetitions):
            order = (OLD, NEW) if rep % 2 == 0 else (NEW, OLD)
            for ns in order:
                _fill(engine, ns, args.queued)
                times[ns].append(_drain(schedulers[ns], ns) * 1000)
        for conn in schedulers.values():
            conn.close()
        fmt: Callable[[list[float]], str] = lambda v: (  # noqa: E731
            f"{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})"
        )
        print(
            f"| pass over {args.consumers} consumers x {args.queued} rows, ms | {fmt(times[OLD])}"
            f" | {fmt(times[NEW])} | {_ratios(times[NEW], times[OLD])} |"
        )
    finally:
        if engine.dialect.name in ("mysql", "mariadb"):
            with engine.begin() as conn:
                for ns in (OLD, NEW):
                    conn.execute(_sql(engine, "drop", ns))
        engine.dispose()
        if admin is not None:
            with admin.connect() as conn:
                conn.execute(sa.text(f'DROP DATABASE "{name}" WITH (FORCE)'))
            admin.dispose()


if __name__ == "__main__":
    main()
