"""What a schema revision changed for producers and for a pass: an older revision and head,
side by side on the same server, interleaved.

Two namespaces of the same server: one installed at ``--base`` (default: the revision before
head), one at head, each with ``--consumers`` consumers (default 4) of assets a0..a3. Each
alternative registers through the package's own named queries (sql/<engine>/queries.sql, the
statements assetq.register_event and register_events send), on an autocommit connection per
client thread, so each call is its own transaction with the server's default commit (durable
unless the server says otherwise). The package's check that a namespace holds its own head is
not made for the older one: only the routines are called, whose names and parameters every
revision keeps. Three producer figures, each events/s, median (min-max) of ``--repetitions``
rounds in which the two take turns of a quarter second (the order rotating) and a ratio per
round: one event per transaction at 1 and 8 clients, and a batch of 1,000 events at 1 client.

A fourth, the whole-backlog pass, in two more namespaces (``--backlog-repetitions`` rounds,
default 3), each with one uncapped consumer of one asset: every round each side in turn (the
side going first alternating) is emptied and gets ``--backlog`` events of that asset, untimed
(100,000; on PostgreSQL one INSERT ... SELECT, as benchmarks/peers.py's drain fills, then
VACUUM ANALYZE; on MySQL register_events in batches of 10,000), then one scheduler pass of it
is timed (its transaction, through the package's named queries, commit included); events/s
of that pass (the backlog over its time) and a ratio per round. Each pass must make one run
linking the whole backlog.

    python benchmarks/revisions.py                     # both engines, head against the one before
    python benchmarks/revisions.py --base 0011_runs_per_pass --engines postgresql

Servers as in benchmarks/burndown.py: ``--postgres`` (default the local server, a database of
its own, dropped after) and ``--mysql`` ('private': a throw-away mariadbd, as tests/dbs.py
starts it; or a server URL).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Engine

import assetq
from assetq import migrate, sqlfiles
from assetq.dialects import Dialect, dialect_for

HERE = Path(__file__).resolve().parent
for _path in (HERE, HERE.parent / "tests"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import burndown  # noqa: E402  (benchmarks/burndown.py: the throw-away servers)
import peers  # noqa: E402  (benchmarks/peers.py: the interleaving)

ASSETS = ("a0", "a1", "a2", "a3")
BATCH = 1_000
#: The whole-backlog pass: its consumer's one asset, the backlog, MySQL's fill batches.
BACKLOG_ASSET = "b0"
BACKLOG = 100_000
FILL_BATCH = 10_000


def _previous(revision: str) -> str:
    revisions = list(migrate.revisions())
    return revisions[revisions.index(revision) - 1]


@dataclass
class _Side:
    engine: Engine
    dialect: Dialect
    namespace: str
    batch: bool
    conn: sa.Connection = field(init=False)

    def __post_init__(self) -> None:
        self.conn = self.engine.execution_options(isolation_level="AUTOCOMMIT").connect()
        events = [{"asset": ASSETS[i % len(ASSETS)]} for i in range(BATCH)]
        self.params: dict[str, Any] = (
            {"events": json.dumps(events)}
            if self.batch
            else {
                "asset": "a0",
                "extra": "{}",
                "source_dag_id": None,
                "source_task_id": None,
                "source_run_id": None,
                "source_map_index": -1,
                "idempotency_key": None,
            }
        )

    def step(self) -> int:
        name = "register_events" if self.batch else "register_event"
        rows = self.dialect.execute(self.conn, name, self.namespace, self.params)
        expected = BATCH if self.batch else 1
        if len(rows) != expected:
            raise SystemExit(f"{name} in {self.namespace} returned {len(rows)} rows")
        return expected

    def close(self) -> None:
        self.conn.close()


def prepare(
    engine: Engine,
    base: str,
    consumers: int,
    prefix: str = "aqrv",
    assets: Sequence[str] = ASSETS,
) -> dict[str, str]:
    """{revision: namespace} of the two sides (``prefix``_base and _head), installed and
    declared: ``consumers`` consumers of any of ``assets``."""
    head = assetq.head_revision()
    names = {base: f"{prefix}_base", head: f"{prefix}_head"}
    for revision, ns in names.items():
        # Both at head, the consumers declared by the package, then the base one taken down
        # to its revision by its own down scripts (their data kept, as a downgrade keeps it).
        assetq.uninstall(engine, namespace=ns)
        assetq.install(engine, namespace=ns)
        with engine.begin() as conn:
            for c in range(consumers):
                assetq.declare_dag(conn, f"consumer_{c}", assetq.any_of(*assets), namespace=ns)
        if revision != head:
            with engine.begin() as conn:
                migrate.migrate_connection(conn, ns, base, direction="down")
    return names


def _empty(engine: Engine, dialect: Dialect, ns: str) -> None:
    """The backlog namespace without events, queue rows, runs or links (its consumer kept)."""
    with engine.begin() as conn:
        for table in ("dagrun_asset_event", "dag_run", "asset_dag_run_queue", "asset_event"):
            conn.execute(
                sa.text(sqlfiles.render(f"DELETE FROM {{{{ns}}}}.{table}", dialect.quote_ns(ns)))
            )


def _fill(engine: Engine, dialect: Dialect, ns: str, backlog: int) -> None:
    """``backlog`` events of BACKLOG_ASSET, queued for the consumer by the fan-out; untimed."""
    if dialect.name == "postgresql":
        raw = engine.raw_connection()
        try:
            pg: Any = raw.driver_connection  # psycopg 3: peers.py's statements, %(name)s
            pg.autocommit = True
            pg.execute(peers.q("aq_fill", ns), {"n": backlog, "asset": BACKLOG_ASSET})
            pg.execute(peers.q("aq_vacuum", ns))
            pg.autocommit = False
        finally:
            raw.close()
        return
    with engine.connect() as conn:
        for start in range(0, backlog, FILL_BATCH):
            n = min(FILL_BATCH, backlog - start)
            events = json.dumps([{"asset": BACKLOG_ASSET}] * n)
            with conn.begin():
                dialect.execute(conn, "register_events", ns, {"events": events})


def _timed_pass(engine: Engine, dialect: Dialect, ns: str, backlog: int) -> float:
    """Seconds of one scheduler pass's transaction (as assetq.schedule sends it), which must
    make one run linking the whole backlog."""
    with engine.connect() as conn:
        started = time.perf_counter()
        with conn.begin():
            dialect.execute(conn, "scheduler_transaction", ns)
            runs = dialect.execute(conn, "schedule_pass", ns, {"limit": 100})
        secs = time.perf_counter() - started
    count = sqlfiles.render("SELECT count(*) FROM {{ns}}.dagrun_asset_event", dialect.quote_ns(ns))
    with engine.connect() as conn:
        links = conn.execute(sa.text(count)).scalar_one()
    if len(runs) != 1 or links != backlog:
        raise SystemExit(
            f"{ns}: the pass made {len(runs)} runs and {links} links, not 1 and {backlog}"
        )
    return secs


def backlog_pass(
    engine: Engine,
    dialect: Dialect,
    base: str,
    backlog: int,
    repetitions: int,
    prefix: str = "aqrv",
) -> str:
    """The whole-backlog pass at ``base`` and at head, as a table line."""
    head = assetq.head_revision()
    names = prepare(engine, base, 1, f"{prefix}_bl", assets=(BACKLOG_ASSET,))
    rates: dict[str, list[float]] = {revision: [] for revision in names}
    try:
        for rep in range(repetitions):
            order = list(names.items())
            # Each side emptied, filled and timed in turn, so each pass follows its own fill:
            # with both filled first, the second side's pass was the slower one on MariaDB
            # whichever it was (by up to 30%: the first pass's deletes still being purged).
            for revision, ns in order if rep % 2 == 0 else order[::-1]:
                _empty(engine, dialect, ns)
                _fill(engine, dialect, ns, backlog)
                rates[revision].append(backlog / _timed_pass(engine, dialect, ns, backlog))
            peers._progress(
                f"{dialect.name} whole backlog of {backlog:,} {rep + 1}/{repetitions}: "
                + ", ".join(f"{k} {v[-1]:,.0f}/s" for k, v in rates.items())
            )
    finally:
        for ns in names.values():
            assetq.uninstall(engine, namespace=ns)
    return _line(dialect, f"whole backlog, {backlog:,}", 1, rates[base], rates[head])


def _line(dialect: Dialect, what: str, clients: int, base: list[float], head: list[float]) -> str:
    """One table line: medians of each side and of the per-round ratio head / base."""
    ratios = [h / b for b, h in zip(base, head, strict=True)]
    return (
        f"{dialect.name:10s} | {what:23s} | {clients:7d} | "
        f"{statistics.median(base):>9,.0f} | {statistics.median(head):>9,.0f}"
        f" | {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
    )


def measure(
    engine: Engine,
    base: str,
    consumers: int,
    repetitions: int,
    seconds: float = 2.0,
    prefix: str = "aqrv",
    backlog: int = BACKLOG,
    backlog_repetitions: int = 3,
) -> list[str]:
    """The four figures on ``engine``'s database, as table lines; ``seconds``: each side's
    time per round of a producer figure."""
    names = prepare(engine, base, consumers, prefix)
    head = assetq.head_revision()
    with engine.connect() as conn:
        dialect = dialect_for(conn)
    lines = []
    try:
        for batch, clients in ((False, 1), (False, 8), (True, 1)):
            alts = [
                peers.Alternative(revision, functools.partial(_Side, engine, dialect, ns, batch))
                for revision, ns in names.items()
            ]
            what = f"batch of {BATCH:,}" if batch else "1 event per transaction"
            rates = peers.interleaved(
                alts, clients, seconds, repetitions, f"{dialect.name} {what}, {clients} clients"
            )
            lines.append(_line(dialect, what, clients, rates[base], rates[head]))
        for ns in names.values():  # every event queued once for every consumer, both sides
            check = sqlfiles.render(
                "SELECT (SELECT count(*) FROM {{ns}}.asset_event),"
                " (SELECT count(*) FROM {{ns}}.asset_dag_run_queue)",
                dialect.quote_ns(ns),
            )
            with engine.connect() as conn:
                events, queued = conn.execute(sa.text(check)).one()
            if not events or queued != events * consumers:
                raise SystemExit(f"{ns}: {events} events but {queued} queue rows")
    finally:
        for ns in names.values():
            assetq.uninstall(engine, namespace=ns)
    lines.append(backlog_pass(engine, dialect, base, backlog, backlog_repetitions, prefix))
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    head = assetq.head_revision()
    parser.add_argument("--base", default=_previous(head), help="the older revision")
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--backlog", type=int, default=BACKLOG)
    parser.add_argument("--backlog-repetitions", type=int, default=3)
    parser.add_argument("--engines", default="postgresql,mysql")
    parser.add_argument(
        "--postgres", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
    )
    parser.add_argument("--mysql", default="private", help="'private' or a server URL")
    args = parser.parse_args(argv)
    if args.base not in migrate.revisions() or args.base == head:
        parser.error(f"--base must be a revision before {head}, got {args.base!r}")
    lines = [
        f"{args.base} (base) against {head} (head), {args.consumers} consumers; events/s,"
        f" median of {args.repetitions} rounds ({args.backlog_repetitions} for the whole-backlog"
        " pass, its events/s the backlog over the pass's time)",
        "",
        "engine     | work                    | clients |      base |      head | head / base",
        "-----------|-------------------------|---------|-----------|-----------|------------",
    ]
    for engine_name in [e.strip() for e in args.engines.split(",") if e.strip()]:
        if engine_name not in ("postgresql", "mysql"):
            parser.error(f"unknown engine {engine_name!r}")
        with burndown._server(engine_name, args, prefix="aqrv") as engine:
            lines += measure(
                engine,
                args.base,
                args.consumers,
                args.repetitions,
                backlog=args.backlog,
                backlog_repetitions=args.backlog_repetitions,
            )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
