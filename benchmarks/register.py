"""Registration throughput: ``assetq.register_event`` against the same rows written by plain
client statements.

Four variants, measured side by side, each event in the caller's transaction on an
Engine's connection (``with conn.begin():``, as an application writes it):

``assetq.register_event``
    the default path: one round trip; the registration routine inserts the event and the
    ``AFTER INSERT`` trigger writes one queue row per consumer, and an assetq error leaves
    the caller's transaction usable (the routine's own savepoint on PostgreSQL).
``savepoint=False``
    the same call without that guarantee (after an error the caller must roll back): what
    the guarantee costs is the ratio of the two.
``SAVEPOINT, call, RELEASE``
    the guarantee as the client gave it before the routines took it over (0.1.0's default
    on PostgreSQL): ``savepoint=False`` inside ``conn.begin_nested()``, two round trips more.
``plain INSERTs``
    what a client without assetq's routines would send for the same rows: ``INSERT INTO
    asset_event ... RETURNING id, asset_id, "timestamp"``, then ``INSERT INTO
    asset_dag_run_queue SELECT ... FROM dag_schedule_asset_reference JOIN dag ...`` with the
    returned id and timestamp; two round trips.

Fairness. The plain variant must write the same rows and do the same checks, without the
trigger writing them a second time. It runs in a namespace of its own, a twin of the
routine's (same schema, same consumers, same assets), where the fan-out trigger alone is
switched off with ``ALTER TABLE ... DISABLE TRIGGER asset_event_fan_out``. Foreign-key checks,
unique indexes and the idempotency constraint stay on in both. We did not use
``session_replication_role = replica`` on the plain connections instead: it would silently
skip the foreign-key triggers too, so the plain variant would check less than the routine.
Both namespaces live in the same database, so they share the server, WAL and cache; rounds
of the variants alternate (and alternate which goes first), so both tables grow alike.
After the run the rows are checked: in both namespaces every event has exactly one queue
row per consumer, carrying the event's timestamp.

Each thread has its own connection; each event is its own committed transaction. On
PostgreSQL the benchmark's sessions run with ``synchronous_commit = off`` unless
``--durable``, as bench.py's do: the figure compares client and server work, not the disk.
A round runs for ``--seconds``; each (threads, variant) cell is repeated ``--repetitions``
times, each variant going first in turn, and the table shows the median with min-max, and
each assetq variant's ratio to the plain one per repetition (median, min-max).
``--output FILE`` writes the table as markdown too (docs/benchmarks/register.md, which
benchmarks/report.py includes in docs/benchmarks.md).

Without ``--url`` a fresh database ``aqd_bench_<pid>`` is created on the local PostgreSQL
(postgres@127.0.0.1:5432) and dropped at the end. With ``--url`` the namespaces
``aqbench_<pid>_proc`` and ``aqbench_<pid>_plain`` are created in that database and removed
at the end. On MySQL/MariaDB a namespace is a database: the two namespaces are two databases
on the server of ``--url`` (``mysql://user:password@host:port``), whose own database is not
used; the plain namespace's fan-out trigger is dropped (MySQL cannot disable a trigger).
``--mysql-private`` starts a throw-away MariaDB server instead (tests/dbs.py's, as bench.py).

Another engine: subclass :class:`PlainPath` with its way of switching the trigger off in the
plain namespace and its two statements, and register it in ``PLAIN_PATHS`` under the dialect
name (``assetq.dialects.dialect_for(conn).name``); the rest is engine-neutral.

    python benchmarks/register.py [--url URL | --mysql-private] [--seconds 2]
        [--threads 1,8] [--repetitions 5] [--consumers 4] [--output FILE [--append]]
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy import Connection, Engine
from sqlalchemy.engine import URL, make_url

import assetq
from assetq.dialects import Dialect, dialect_for

LOCAL_POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
#: Namespaces of this run (a MySQL namespace is a database: two runs on one server never meet).
PROC_NS = f"aqbench_{os.getpid()}_proc"
PLAIN_NS = f"aqbench_{os.getpid()}_plain"


class PlainPath:
    """How one engine writes an event and its queue rows with plain client statements."""

    def disable_fan_out(self, conn: Connection, dialect: Dialect, namespace: str) -> None:
        """Stop the fan-out trigger in ``namespace`` and nothing else."""
        raise NotImplementedError

    def register(self, conn: Connection, dialect: Dialect, namespace: str, asset: str) -> None:
        """Write one event of ``asset`` and its queue rows in the caller's transaction."""
        raise NotImplementedError


class PostgresPlainPath(PlainPath):
    # The same rows the registration routine and trigger write (sql/postgresql/routines/:
    # register_event.sql, asset_event_fan_out.sql): the event with the default extra and
    # source, then one queue row per unpaused consumer of the asset, carrying the event's own
    # timestamp.
    INSERT_EVENT = """
        INSERT INTO {ns}.asset_event (asset_id, extra)
        SELECT a.id, CAST(:extra AS jsonb) FROM {ns}.asset a WHERE a.name = :asset
        RETURNING id, asset_id, "timestamp"
    """
    INSERT_QUEUE = """
        INSERT INTO {ns}.asset_dag_run_queue (target_dag_id, asset_event_id, asset_id, created_at)
        SELECT r.dag_id, :event_id, r.asset_id, :created_at
          FROM {ns}.dag_schedule_asset_reference r
          JOIN {ns}.dag d ON d.dag_id = r.dag_id
         WHERE r.asset_id = :asset_id AND NOT d.is_paused
    """

    def __init__(self) -> None:
        self._statements: dict[str, tuple[sa.TextClause, sa.TextClause]] = {}

    def _sql(self, dialect: Dialect, namespace: str) -> tuple[sa.TextClause, sa.TextClause]:
        if namespace not in self._statements:
            ns = dialect.quote_ns(namespace)
            self._statements[namespace] = (
                sa.text(self.INSERT_EVENT.replace("{ns}", ns)),
                sa.text(self.INSERT_QUEUE.replace("{ns}", ns)),
            )
        return self._statements[namespace]

    def disable_fan_out(self, conn: Connection, dialect: Dialect, namespace: str) -> None:
        ns = dialect.quote_ns(namespace)
        conn.execute(sa.text(f"ALTER TABLE {ns}.asset_event DISABLE TRIGGER asset_event_fan_out"))

    def register(self, conn: Connection, dialect: Dialect, namespace: str, asset: str) -> None:
        insert_event, insert_queue = self._sql(dialect, namespace)
        event = conn.execute(insert_event, {"asset": asset, "extra": "{}"}).one()
        conn.execute(
            insert_queue,
            {"event_id": event.id, "asset_id": event.asset_id, "created_at": event.timestamp},
        )


class MySQLPlainPath(PlainPath):
    # The same rows on MySQL/MariaDB. No RETURNING on MySQL 8 (the common subset): the queue
    # insert finds the event by LAST_INSERT_ID() on the server, so it stays two round trips and
    # copies the event's own timestamp, as the trigger does.
    INSERT_EVENT = """
        INSERT INTO {ns}.asset_event (asset_id, extra)
        SELECT a.id, :extra FROM {ns}.asset a WHERE a.name = :asset
    """
    INSERT_QUEUE = """
        INSERT INTO {ns}.asset_dag_run_queue (target_dag_id, asset_event_id, asset_id, created_at)
        SELECT r.dag_id, e.id, e.asset_id, e.`timestamp`
          FROM {ns}.asset_event e
          JOIN {ns}.dag_schedule_asset_reference r ON r.asset_id = e.asset_id
          JOIN {ns}.dag d ON d.dag_id = r.dag_id
         WHERE e.id = LAST_INSERT_ID() AND NOT d.is_paused
    """

    def __init__(self) -> None:
        self._statements: dict[str, tuple[sa.TextClause, sa.TextClause]] = {}

    def _sql(self, dialect: Dialect, namespace: str) -> tuple[sa.TextClause, sa.TextClause]:
        if namespace not in self._statements:
            ns = dialect.quote_ns(namespace)
            self._statements[namespace] = (
                sa.text(self.INSERT_EVENT.replace("{ns}", ns)),
                sa.text(self.INSERT_QUEUE.replace("{ns}", ns)),
            )
        return self._statements[namespace]

    def disable_fan_out(self, conn: Connection, dialect: Dialect, namespace: str) -> None:
        # MySQL cannot disable a trigger: drop it, in the plain namespace only.
        ns = dialect.quote_ns(namespace)
        conn.execute(sa.text(f"DROP TRIGGER {ns}.asset_event_fan_out"))

    def register(self, conn: Connection, dialect: Dialect, namespace: str, asset: str) -> None:
        insert_event, insert_queue = self._sql(dialect, namespace)
        conn.execute(insert_event, {"asset": asset, "extra": "{}"})
        conn.execute(insert_queue)


#: Plain variants by dialect name.
PLAIN_PATHS: dict[str, PlainPath] = {
    "postgresql": PostgresPlainPath(),
    "mysql": MySQLPlainPath(),
}


@dataclass(frozen=True)
class Variant:
    label: str
    namespace: str
    register: Callable[[Connection, str], None]


def _variants(dialect: Dialect) -> tuple[Variant, ...]:
    """assetq's variants first, the plain one last (the ratios' denominator)."""
    plain = PLAIN_PATHS.get(dialect.name)
    if plain is None:
        raise SystemExit(
            f"no plain variant for {dialect.name} yet: add a PlainPath to PLAIN_PATHS in"
            " benchmarks/register.py"
        )

    def via_assetq(conn: Connection, asset: str) -> None:
        assetq.register_event(conn, asset, namespace=PROC_NS)

    def via_assetq_bare(conn: Connection, asset: str) -> None:
        assetq.register_event(conn, asset, namespace=PROC_NS, savepoint=False)

    def via_client_savepoint(conn: Connection, asset: str) -> None:
        with conn.begin_nested():
            assetq.register_event(conn, asset, namespace=PROC_NS, savepoint=False)

    def via_plain(conn: Connection, asset: str) -> None:
        plain.register(conn, dialect, PLAIN_NS, asset)

    return (
        Variant("assetq.register_event", PROC_NS, via_assetq),
        Variant("savepoint=False", PROC_NS, via_assetq_bare),
        Variant("SAVEPOINT, call, RELEASE", PROC_NS, via_client_savepoint),
        Variant("plain INSERTs", PLAIN_NS, via_plain),
    )


def _setup(engine: Engine, consumers: int, assets: int) -> Dialect:
    names = [f"asset_{i}" for i in range(assets)]
    for namespace in (PROC_NS, PLAIN_NS):
        assetq.uninstall(engine, namespace=namespace)
        assetq.install(engine, namespace=namespace)
        with engine.begin() as conn:
            for c in range(consumers):
                assetq.declare_dag(
                    conn, f"consumer_{c}", assetq.any_of(*names), namespace=namespace
                )
    with engine.begin() as conn:
        dialect = dialect_for(conn)
        plain = PLAIN_PATHS.get(dialect.name)
        if plain is not None:
            plain.disable_fan_out(conn, dialect, PLAIN_NS)
    return dialect


def _round(engine: Engine, variant: Variant, threads: int, seconds: float, assets: int) -> float:
    """Events per second of ``threads`` threads registering for ``seconds``."""
    started: list[float] = []
    barrier = threading.Barrier(threads, action=lambda: started.append(time.perf_counter()))
    counts = [0] * threads
    finished = [0.0] * threads
    errors: list[BaseException] = []

    def work(index: int) -> None:
        asset = f"asset_{index % assets}"
        try:
            with engine.connect() as conn:
                with conn.begin():  # warm up: connection, prepared statements, caches
                    variant.register(conn, asset)
                barrier.wait()
                deadline = started[0] + seconds
                n = 0
                while time.perf_counter() < deadline:
                    with conn.begin():
                        variant.register(conn, asset)
                    n += 1
                counts[index] = n
                finished[index] = time.perf_counter()
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]
    return sum(counts) / (max(finished) - started[0])


def _check_rows(engine: Engine, dialect: Dialect, consumers: int) -> str:
    """Both namespaces must hold the same shape of rows: consumers queue rows per event,
    each with its event's timestamp."""
    lines = []
    for namespace in (PROC_NS, PLAIN_NS):
        ns = dialect.quote_ns(namespace)
        with engine.connect() as conn:
            events = conn.execute(sa.text(f"SELECT count(*) FROM {ns}.asset_event")).scalar_one()
            queued = conn.execute(
                sa.text(f"SELECT count(*) FROM {ns}.asset_dag_run_queue")
            ).scalar_one()
            stamped = conn.execute(
                sa.text(
                    f"SELECT count(*) FROM {ns}.asset_dag_run_queue q"
                    f" JOIN {ns}.asset_event e ON e.id = q.asset_event_id"
                    " WHERE q.created_at = e.timestamp"
                )
            ).scalar_one()
        if queued != events * consumers or stamped != queued:
            raise SystemExit(
                f"{namespace}: {events} events, {queued} queue rows ({stamped} with the event's"
                f" timestamp); expected {consumers} per event: the variants did not write the"
                " same rows"
            )
        lines.append(f"{namespace}: {events:,} events, {queued:,} queue rows")
    return "; ".join(lines)


def _summary(values: Sequence[float], digits: int = 0) -> str:
    fmt = f"{{:,.{digits}f}}"
    return (
        f"{fmt.format(statistics.median(values))}"
        f" ({fmt.format(min(values))}-{fmt.format(max(values))})"
    )


def _server(engine: Engine) -> tuple[str, str]:
    """The server's name and version, and the setting that decides whether a commit waits
    for the disk, as the benchmark's sessions have it."""
    with engine.connect() as conn:
        version = ".".join(str(v) for v in (conn.dialect.server_version_info or ())[:2])
        if conn.dialect.name == "postgresql":
            setting = conn.execute(sa.text("SHOW synchronous_commit")).scalar_one()
            return f"PostgreSQL {version}", f"synchronous_commit = {setting}"
        flush = conn.execute(sa.text("SELECT @@innodb_flush_log_at_trx_commit")).scalar_one()
    name = "MariaDB" if getattr(engine.dialect, "is_mariadb", False) else "MySQL"
    return f"{name} {version}", f"innodb_flush_log_at_trx_commit = {flush}"


def run(url: URL, args: argparse.Namespace) -> None:
    thread_counts = sorted({int(t) for t in args.threads.split(",")})
    load_before = os.getloadavg()[0]
    began = time.monotonic()
    # Commits that do not wait for the disk, as bench.py's figures (a session setting of the
    # benchmark's connections, not a change to the server): the figure compares the work of
    # client and server, not the disk's flush. --durable keeps the server's setting. MySQL
    # has no session switch for it: the server's innodb_flush_log_at_trx_commit stands.
    fast = url.get_backend_name() == "postgresql" and not args.durable
    engine = sa.create_engine(
        url,
        pool_size=max(thread_counts) + 2,
        max_overflow=0,
        connect_args={"options": "-c synchronous_commit=off"} if fast else {},
    )
    try:
        dialect = _setup(engine, args.consumers, args.assets)
        variants = _variants(dialect)
        rates: dict[tuple[int, str], list[float]] = {}
        plain = variants[-1]
        ratios: dict[tuple[int, str], list[float]] = {}
        for rep in range(args.repetitions):
            for threads in thread_counts:
                # Each variant goes first in turn: load from elsewhere falls on all alike.
                shift = rep % len(variants)
                order = variants[shift:] + variants[:shift]
                got: dict[str, float] = {}
                for variant in order:
                    got[variant.label] = _round(engine, variant, threads, args.seconds, args.assets)
                    rates.setdefault((threads, variant.label), []).append(got[variant.label])
                for variant in variants[:-1]:
                    ratios.setdefault((threads, variant.label), []).append(
                        got[variant.label] / got[plain.label]
                    )
                print(
                    f"  repetition {rep + 1}/{args.repetitions}, {threads} threads: "
                    + ", ".join(f"{label} {rate:,.0f}/s" for label, rate in got.items()),
                    file=sys.stderr,
                    flush=True,
                )
        rows_note = _check_rows(engine, dialect, args.consumers)
        server, commits = _server(engine)
    finally:
        engine.dispose()

    headers = ["threads", *(f"{v.label}, events/s" for v in variants)]
    headers += [f"{v.label} / {plain.label}" for v in variants[:-1]]
    table = [
        [
            str(threads),
            *(_summary(rates[(threads, v.label)]) for v in variants),
            *(_summary(ratios[(threads, v.label)], 2) + "x" for v in variants[:-1]),
        ]
        for threads in thread_counts
    ]
    took = time.monotonic() - began
    load_after = os.getloadavg()[0]
    title = (
        f"Registration throughput on {server} ({os.cpu_count()} CPUs): each thread its own"
        f" connection, each event its own committed transaction (`with conn.begin():`),"
        f" {args.consumers} consumer(s) per asset, {commits}; median (min-max) of"
        f" {args.repetitions} interleaved rounds of {args.seconds:g} s."
    )
    load = (
        f"load average (1 min) before {load_before:.2f}, after {load_after:.2f}:"
        " other work on the machine shows up as spread"
    )
    widths = [max(len(row[i]) for row in [headers, *table]) for i in range(len(headers))]
    print(title)
    print(" | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    print("-|-".join("-" * w for w in widths))
    for row in table:
        print(" | ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
    print(f"rows written, same shape in both: {rows_note}")
    print(load)
    if args.output:
        command = "python benchmarks/register.py " + " ".join(args.argv)
        lines = [
            f"Measured with `{command.strip()}` on"
            f" {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} ({took:.0f} s), assetq"
            f" {assetq.__version__}; {load} (shared machine).",
            "",
            title,
            "",
            "| " + " | ".join(headers) + " |",
            "|" + "|".join("---" for _ in headers) + "|",
            *("| " + " | ".join(row) + " |" for row in table),
            "",
            f"Rows written, the same shape in both namespaces: {rows_note}.",
        ]
        with open(args.output, "a" if args.append else "w", encoding="utf-8") as out:
            if args.append:
                out.write("\n")
            out.write("\n".join(lines) + "\n")


@dataclass
class _Database:
    url: URL
    drop: Callable[[], None]


def _fresh_local_database() -> _Database:
    name = f"aqd_bench_{os.getpid()}"
    admin = sa.create_engine(LOCAL_POSTGRES, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return _Database(make_url(LOCAL_POSTGRES).set(database=name), drop)


def _private_mysql() -> _Database:
    """A throw-away MariaDB/MySQL server started from this machine's mariadbd (the test
    suite's, tests/dbs.py), which flushes its log once a second as bench.py's does: the
    figure compares client and server work, not the disk."""
    tests = str(Path(__file__).resolve().parent.parent / "tests")
    if tests not in sys.path:
        sys.path.append(tests)
    dbs = importlib.import_module("dbs")
    backend = dbs.MySQLBackend(private=True)
    database = backend.database(installed=False)

    def drop() -> None:
        backend.drop(database)
        backend.close()

    url: URL = database.url
    return _Database(url, drop)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="See the module docstring for what is compared and why it is fair.",
    )
    parser.add_argument(
        "--url",
        help="database URL (default: a fresh database on the local PostgreSQL, dropped after)",
    )
    parser.add_argument(
        "--mysql-private",
        action="store_true",
        help="a throw-away MariaDB server of this machine's mariadbd instead of --url",
    )
    parser.add_argument("--seconds", type=float, default=2.0, help="length of a round (2)")
    parser.add_argument("--threads", default="1,8", help="comma-separated thread counts (1,8)")
    parser.add_argument("--repetitions", type=int, default=5, help="rounds per cell (5)")
    parser.add_argument("--consumers", type=int, default=4, help="consumers per asset (4)")
    parser.add_argument("--assets", type=int, default=4, help="assets, spread over threads (4)")
    parser.add_argument(
        "--durable", action="store_true", help="PostgreSQL: keep synchronous_commit as set"
    )
    parser.add_argument("--output", help="also write the table as markdown to this file")
    parser.add_argument(
        "--append", action="store_true", help="append to --output (another engine's table)"
    )
    args = parser.parse_args(argv)
    # The command as the page shows it: a URL (a password, this machine's port) as URL.
    args.argv = ["URL" if "://" in a else a for a in (sys.argv[1:] if argv is None else argv)]
    if args.repetitions < 1 or args.seconds <= 0 or args.consumers < 1 or args.assets < 1:
        parser.error("--repetitions, --seconds, --consumers and --assets must be positive")

    from assetq.cli import database_url  # bare postgresql:// and mysql:// get our drivers

    if args.url:
        url = database_url(args.url)
        engine = sa.create_engine(url)
        try:
            run(url, args)
        finally:
            for namespace in (PROC_NS, PLAIN_NS):
                assetq.uninstall(engine, namespace=namespace)
            engine.dispose()
    else:
        database = _private_mysql() if args.mysql_private else _fresh_local_database()
        try:
            run(database.url, args)
        finally:
            database.drop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
