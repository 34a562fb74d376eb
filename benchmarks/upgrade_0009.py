"""What migration 0009 (partitions) costs consumers that are not partitioned: registration
and a draining pass at revision 0008_claim_plans against the same at head, side by side on
one server (PostgreSQL or MySQL/MariaDB).

0009 adds to the fan-out a look for partitioned consumers of the event's asset (an empty
partial index on PostgreSQL; the asset's reference rows again on MySQL), and a cascade from
every consumed queue row to asset_partition_queue (one primary-key probe of an empty table
per deleted row). Neither namespace has a partitioned consumer here: this is the price every
other user pays.

registration
    ``register_event`` with autocommit (one round trip), ``--consumers`` consumers on the
    asset, one thread; rounds of ``--events`` events alternate between the two namespaces (and
    which goes first). Reported: the ratio head / 0008 of events per second, per pair of
    rounds, median (min-max).
drain
    one pass over one consumer with ``--queued`` queued rows, consumed in one run; the ratio
    0008 / head of its time (above 1: head is faster), per pair, median (min-max).

Without ``--url`` a fresh database ``aqd_up9_<pid>`` is created on the local PostgreSQL
(postgres@127.0.0.1:5432) and dropped at the end. With a MySQL/MariaDB ``--url``
(``mysql+pymysql://root@127.0.0.1:3306/``) the two namespaces are two databases on that
server, created and dropped by the run. The calls are the routines' own SQL (the two
revisions share them), not assetq's Python API, which needs head.

    python benchmarks/upgrade_0009.py [--url URL] [--events 500] [--queued 20000] [--pairs 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import sqlalchemy as sa
from sqlalchemy import Engine

import assetq

OLD, NEW = "aqup9_0008", "aqup9_head"

SQL = {
    "postgresql": {
        "declare_asset": "SELECT {ns}.declare_asset(:a)",
        "declare": "SELECT {ns}.declare_dag(:d, CAST(:c AS jsonb), CAST(:k AS jsonb))",
        "register": "SELECT event_id FROM {ns}.register_event(:a)",
        "batch": "SELECT count(*) FROM {ns}.register_events(CAST(:e AS jsonb))",
        "pass": "SELECT count(*) FROM {ns}.schedule_pass(1000)",
        "drop": "DROP SCHEMA IF EXISTS {ns} CASCADE",
    },
    "mysql": {
        "declare_asset": "CALL {ns}.declare_asset(:a, NULL, NULL)",
        "declare": "CALL {ns}.declare_dag(:d, :c, :k, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
        "register": "CALL {ns}.register_event(:a, '{{}}', NULL, NULL, NULL, -1, NULL)",
        "batch": "CALL {ns}.register_events(:e)",
        "pass": "CALL {ns}.schedule_pass(1000)",
        "drop": "DROP DATABASE IF EXISTS {ns}",
    },
}


def _sql(engine: Engine, name: str, ns: str) -> sa.TextClause:
    return sa.text(SQL[engine.dialect.name][name].format(ns=ns))


def _setup(engine: Engine, ns: str, revision: str, consumers: int) -> None:
    assetq.install(engine, namespace=ns, revision=revision)
    with engine.begin() as conn:
        for asset in ("a", "b"):
            conn.execute(_sql(engine, "declare_asset", ns), {"a": asset})
        for i in range(consumers):
            params = {"d": f"c{i}", "c": json.dumps("a"), "k": json.dumps([["a"]])}
            conn.execute(_sql(engine, "declare", ns), params)
        conn.execute(
            _sql(engine, "declare", ns),
            {"d": "drain", "c": json.dumps("b"), "k": json.dumps([["b"]])},
        )


def _register_round(engine: Engine, ns: str, events: int) -> float:
    auto = engine.execution_options(isolation_level="AUTOCOMMIT")
    statement = _sql(engine, "register", ns)
    with auto.connect() as conn:
        started = time.perf_counter()
        for _ in range(events):
            conn.execute(statement, {"a": "a"}).all()
        return events / (time.perf_counter() - started)


def _drain_round(engine: Engine, ns: str, queued: int) -> float:
    batch = json.dumps([{"asset": "b"}] * min(queued, 10_000))
    with engine.begin() as conn:
        for _ in range(max(1, queued // 10_000)):
            conn.execute(_sql(engine, "batch", ns), {"e": batch}).all()
    with engine.begin() as conn:
        # The pass runs at READ COMMITTED (its first statement, as assetq.schedule does).
        conn.execute(sa.text("SET TRANSACTION ISOLATION LEVEL READ COMMITTED"))
        started = time.perf_counter()
        conn.execute(_sql(engine, "pass", ns)).all()
        return time.perf_counter() - started


def _summary(ratios: list[float]) -> str:
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="server URL (default: a fresh database on local PostgreSQL)")
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--events", type=int, default=500, help="events per registration round")
    parser.add_argument("--queued", type=int, default=20_000, help="rows drained per pass")
    parser.add_argument("--pairs", type=int, default=8, help="pairs of rounds per measure")
    args = parser.parse_args()

    created = None
    if args.url is None:
        created = f"aqd_up9_{os.getpid()}"
        admin = sa.create_engine(
            "postgresql+psycopg://postgres@127.0.0.1:5432/postgres", isolation_level="AUTOCOMMIT"
        )
        with admin.connect() as conn:
            conn.execute(sa.text(f"CREATE DATABASE {created}"))
        url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{created}"
    else:
        url = args.url
    engine = sa.create_engine(url)
    try:
        _setup(engine, OLD, "0008_claim_plans", args.consumers)
        _setup(engine, NEW, assetq.head_revision(), args.consumers)
        load = os.getloadavg()[0]
        registration, drain = [], []
        for pair in range(args.pairs):
            order = (OLD, NEW) if pair % 2 == 0 else (NEW, OLD)
            rate = {ns: _register_round(engine, ns, args.events) for ns in order}
            registration.append(rate[NEW] / rate[OLD])
        for pair in range(args.pairs):
            order = (OLD, NEW) if pair % 2 == 0 else (NEW, OLD)
            took = {ns: _drain_round(engine, ns, args.queued) for ns in order}
            drain.append(took[OLD] / took[NEW])
        print(
            f"{engine.dialect.name}, {args.consumers} consumers, load average {load:.1f} at start"
        )
        print(f"registration, head / 0008 events per second: {_summary(registration)}")
        print(f"drain of {args.queued} rows in one run, 0008 / head time: {_summary(drain)}")
    finally:
        with engine.begin() as conn:
            for ns in (OLD, NEW):
                conn.execute(_sql(engine, "drop", ns))
        engine.dispose()
        if created is not None:
            with admin.connect() as conn:
                conn.execute(sa.text(f"DROP DATABASE {created}"))


if __name__ == "__main__":
    main()
