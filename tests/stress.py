"""Stress harness: concurrent producers with late commits and concurrent schedulers, then a
verification over the database. Drives assetq or, as a control that must fail, a faithful
re-implementation of the timestamp-window algorithm of Airflow 3.0-3.3 (test code only).

Run the long version with one command (a fresh database on the local server unless --server):

    python tests/stress.py --engine postgresql --events 100000 --producers 16 --schedulers 3
    python tests/stress.py --engine mysql --events 100000 --producers 16 --schedulers 3

Add ``--algorithm window`` to drive the baseline, or ``--algorithm both`` for both side by
side. The short version runs in the default test suite (tests/test_stress.py).
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for `python tests/stress.py`

import assetq

# Consumers of the topology: name -> (condition, assets it is subscribed to).
TOPOLOGY: dict[str, assetq.Condition] = {
    "single_a": "a",
    "single_b": "b",
    "and_ab": assetq.all_of("a", "b"),
    "and_bcd": assetq.all_of("b", "c", "d"),
    "or_cd": assetq.any_of("c", "d"),
    "or_ace": assetq.any_of("a", "c", "e"),
    "nested": assetq.any_of(assetq.all_of("a", "e"), assetq.all_of("c", "d")),
}
ASSETS = "abcde"


def holds(condition: Any, assets: set[str]) -> bool:
    """Evaluate a condition tree on a set of assets (the reference semantics)."""
    if isinstance(condition, str):
        return condition in assets
    if isinstance(condition, assetq.AnyOf):
        return any(holds(c, assets) for c in condition.items)
    items = condition.items if isinstance(condition, assetq.AllOf) else condition
    return all(holds(c, assets) for c in items)


def leaves(condition: Any) -> set[str]:
    if isinstance(condition, str):
        return {condition}
    items = condition.items if isinstance(condition, assetq.AllOf | assetq.AnyOf) else condition
    return set().union(*(leaves(c) for c in items))


SUBSCRIBED = {dag: leaves(cond) for dag, cond in TOPOLOGY.items()}


@dataclass
class Report:
    algorithm: str
    engine: str
    events: int = 0
    rolled_back: int = 0
    pairs: int = 0
    lost: int = 0
    duplicated: int = 0
    still_queued: int = 0
    empty_runs: int = 0
    conditions_violated: int = 0
    rolled_back_linked: int = 0
    runs: int = 0
    retries: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (
            self.lost
            or self.duplicated
            or self.empty_runs
            or self.conditions_violated
            or self.rolled_back_linked
        )

    def percentile(self, q: float) -> float | None:
        if not self.latencies:
            return None
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def row(self) -> dict[str, Any]:
        p50, p99 = self.percentile(0.5), self.percentile(0.99)
        return {
            "algorithm": self.algorithm,
            "engine": self.engine,
            "events": self.events,
            "rolled back": self.rolled_back,
            "pairs": self.pairs,
            "lost": self.lost,
            "duplicated": self.duplicated,
            "empty runs": self.empty_runs,
            "conditions violated": self.conditions_violated,
            "retries": self.retries,
            "p50 ms": "-" if p50 is None else f"{p50 * 1000:.0f}",
            "p99 ms": "-" if p99 is None else f"{p99 * 1000:.0f}",
            "seconds": f"{self.seconds:.1f}",
        }


def format_table(reports: list[Report]) -> str:
    rows = [r.row() for r in reports]
    headers = list(rows[0])
    widths = [max(len(h), *(len(str(r[h])) for r in rows)) for h in headers]
    lines = [" | ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))]
    lines.append("-|-".join("-" * w for w in widths))
    for r in rows:
        lines.append(" | ".join(str(r[h]).rjust(w) for h, w in zip(headers, widths, strict=True)))
    return "\n".join(lines)


class _RetryCounter(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "retrying" in record.getMessage():
            self.count += 1


# --------------------------------------------------------------------------------------------
# The algorithms. Each offers setup / register (in the caller's transaction) / one pass /
# the final links, so the load and the verification are identical for both.


class AssetqAlgorithm:
    name = "assetq"
    retries = 0  # assetq.schedule retries by itself; counted through its log

    def __init__(self, engine: sa.Engine, namespace: str = "assetq") -> None:
        self.engine = engine
        self.namespace = namespace

    def setup(self) -> None:
        with self.engine.begin() as conn:
            for dag_id, condition in TOPOLOGY.items():
                assetq.declare_dag(conn, dag_id, condition, namespace=self.namespace)

    def register(self, conn: sa.Connection, asset: str) -> int:
        return assetq.register_event(conn, asset, namespace=self.namespace).id

    def schedule(self) -> list[tuple[str, tuple[int, ...]]]:
        runs = assetq.schedule(self.engine, limit=50, namespace=self.namespace)
        return [(r.dag_id, r.event_ids) for r in runs]

    def _q(self, sql: str) -> str:
        with self.engine.connect() as conn:
            quoted = assetq.dialects.dialect_for(conn).quote_ns(self.namespace)
        return sql.replace("{ns}", quoted)

    def links(self) -> list[tuple[int, str, int]]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    self._q(
                        "SELECT dag_run_id, dag_id, asset_event_id FROM {ns}.dagrun_asset_event"
                    )
                )
            ).all()
        return [(int(r[0]), str(r[1]), int(r[2])) for r in rows]

    def run_ids(self) -> list[int]:
        with self.engine.connect() as conn:
            return [
                int(r[0]) for r in conn.execute(sa.text(self._q("SELECT id FROM {ns}.dag_run")))
            ]

    def queued(self) -> set[tuple[str, int]]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    self._q("SELECT target_dag_id, asset_event_id FROM {ns}.asset_dag_run_queue")
                )
            ).all()
        return {(str(r[0]), int(r[1])) for r in rows}


class WindowAlgorithm:
    """Airflow 3.0-3.3's asset-triggered scheduling, reduced to its algorithm.

    One queue row per (asset, consumer), inserted if absent, created_at taken by the producer
    before commit. A pass locks each consumer (SKIP LOCKED), reads its queue rows, evaluates
    the condition on the queued assets, and if it holds creates a run whose events are chosen
    by timestamp window: (previous run's run_after, max queued created_at]. Then it deletes all
    of the consumer's queue rows. Late commits fall behind the window: that is the bug.
    """

    name = "window"
    TABLES = ("bl_link", "bl_run", "bl_queue", "bl_event", "bl_dag")

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self.retries = 0
        self.postgres = engine.dialect.name == "postgresql"

    def setup(self) -> None:
        ts = "timestamp(6)" if self.postgres else "DATETIME(6)"
        serial = "bigserial" if self.postgres else "bigint AUTO_INCREMENT"
        with self.engine.begin() as conn:
            for table in self.TABLES:
                conn.execute(sa.text(f"DROP TABLE IF EXISTS {table}"))
            for ddl in (
                f"CREATE TABLE bl_dag (dag_id varchar(250) PRIMARY KEY, last_run_after {ts} NULL)",
                f"CREATE TABLE bl_event (id {serial} PRIMARY KEY, asset varchar(10) NOT NULL,"
                f" ts {ts} NOT NULL)",
                "CREATE TABLE bl_queue (asset varchar(10) NOT NULL, dag_id varchar(250) NOT NULL,"
                f" created_at {ts} NOT NULL, PRIMARY KEY (asset, dag_id))",
                f"CREATE TABLE bl_run (id {serial} PRIMARY KEY, dag_id varchar(250) NOT NULL,"
                f" run_after {ts} NOT NULL)",
                "CREATE TABLE bl_link (run_id bigint NOT NULL, dag_id varchar(250) NOT NULL,"
                " event_id bigint NOT NULL)",
                "CREATE INDEX bl_event_asset_ts ON bl_event (asset, ts)",
            ):
                conn.execute(sa.text(ddl))
            for dag_id in TOPOLOGY:
                conn.execute(sa.text("INSERT INTO bl_dag (dag_id) VALUES (:d)"), {"d": dag_id})

    def register(self, conn: sa.Connection, asset: str) -> int:
        now = datetime.now(timezone.utc).replace(tzinfo=None)  # taken before commit
        if self.postgres:
            event_id = conn.execute(
                sa.text("INSERT INTO bl_event (asset, ts) VALUES (:a, :t) RETURNING id"),
                {"a": asset, "t": now},
            ).scalar_one()
            upsert = (
                "INSERT INTO bl_queue (asset, dag_id, created_at) VALUES (:a, :d, :t)"
                " ON CONFLICT DO NOTHING"
            )
        else:
            event_id = conn.execute(
                sa.text("INSERT INTO bl_event (asset, ts) VALUES (:a, :t)"),
                {"a": asset, "t": now},
            ).lastrowid
            upsert = (
                "INSERT INTO bl_queue (asset, dag_id, created_at) VALUES (:a, :d, :t)"
                " ON DUPLICATE KEY UPDATE created_at = created_at"
            )
        for dag_id, assets in SUBSCRIBED.items():
            if asset in assets:
                conn.execute(sa.text(upsert), {"a": asset, "d": dag_id, "t": now})
        return int(event_id)

    def schedule(self) -> list[tuple[str, tuple[int, ...]]]:
        try:
            return self._pass()
        except sa.exc.DBAPIError as exc:
            if not is_transient(self.engine, exc):
                raise
            self.retries += 1  # the pass was rolled back; the next one retries it
            return []

    def _pass(self) -> list[tuple[str, tuple[int, ...]]]:
        created: list[tuple[str, tuple[int, ...]]] = []
        with self.engine.connect() as raw:
            conn = raw.execution_options(isolation_level="READ COMMITTED")
            with conn.begin():
                dags = conn.execute(
                    sa.text(
                        "SELECT dag_id, last_run_after FROM bl_dag"
                        " WHERE dag_id IN (SELECT dag_id FROM bl_queue)"
                        " ORDER BY dag_id FOR UPDATE SKIP LOCKED"
                    )
                ).all()
                for dag_id, last_run_after in dags:
                    rows = conn.execute(
                        sa.text("SELECT asset, created_at FROM bl_queue WHERE dag_id = :d"),
                        {"d": dag_id},
                    ).all()
                    if not rows or not holds(TOPOLOGY[dag_id], {r[0] for r in rows}):
                        continue
                    run_after = max(r[1] for r in rows)
                    low = last_run_after or datetime(1970, 1, 1)
                    assets = sorted(SUBSCRIBED[dag_id])
                    events = conn.execute(
                        sa.text(
                            "SELECT id FROM bl_event WHERE asset IN :assets"
                            " AND ts > :low AND ts <= :high"
                        ).bindparams(sa.bindparam("assets", expanding=True)),
                        {"assets": assets, "low": low, "high": run_after},
                    ).all()
                    event_ids = tuple(sorted(int(e[0]) for e in events))
                    params = {"d": dag_id, "r": run_after}
                    if self.postgres:
                        run_id = conn.execute(
                            sa.text(
                                "INSERT INTO bl_run (dag_id, run_after)"
                                " VALUES (:d, :r) RETURNING id"
                            ),
                            params,
                        ).scalar_one()
                    else:
                        run_id = conn.execute(
                            sa.text("INSERT INTO bl_run (dag_id, run_after) VALUES (:d, :r)"),
                            params,
                        ).lastrowid
                    for event_id in event_ids:
                        conn.execute(
                            sa.text(
                                "INSERT INTO bl_link (run_id, dag_id, event_id) VALUES (:r, :d, :e)"
                            ),
                            {"r": run_id, "d": dag_id, "e": event_id},
                        )
                    conn.execute(
                        sa.text("UPDATE bl_dag SET last_run_after = :r WHERE dag_id = :d"), params
                    )
                    conn.execute(sa.text("DELETE FROM bl_queue WHERE dag_id = :d"), {"d": dag_id})
                    created.append((dag_id, event_ids))
        return created

    def links(self) -> list[tuple[int, str, int]]:
        with self.engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT run_id, dag_id, event_id FROM bl_link")).all()
        return [(int(r[0]), str(r[1]), int(r[2])) for r in rows]

    def run_ids(self) -> list[int]:
        with self.engine.connect() as conn:
            return [int(r[0]) for r in conn.execute(sa.text("SELECT id FROM bl_run"))]

    def queued(self) -> set[tuple[str, int]]:
        return set()  # the baseline queues assets, not events: nothing to account here


Algorithm = AssetqAlgorithm | WindowAlgorithm


def is_transient(engine: sa.Engine, exc: BaseException) -> bool:
    """A deadlock, lock timeout or lost connection: the transaction is gone, retry it."""
    if isinstance(exc, assetq.TransientError):
        return True
    if not isinstance(exc, sa.exc.DBAPIError):
        return False
    dialect = (
        assetq.dialects.POSTGRESQL
        if engine.dialect.name == "postgresql"
        else (assetq.dialects.MYSQL)
    )
    return isinstance(dialect.translate(exc), assetq.TransientError)


def run_load(
    algorithm: Algorithm,
    *,
    engine_name: str,
    events: int,
    producers: int,
    schedulers: int,
    max_hold_ms: float = 20.0,
    rollback_ratio: float = 0.05,
    seed: int = 1,
    deadline_s: float = 3600.0,
) -> Report:
    """Drive the load, drain, and verify. Bounded in count (``events``) and time."""
    algorithm.setup()
    report = Report(algorithm=algorithm.name, engine=engine_name)
    committed: dict[int, tuple[str, float]] = {}
    rolled_back: list[int] = []
    seen_at: dict[tuple[str, int], float] = {}
    failures: list[BaseException] = []
    lock = threading.Lock()
    producing = threading.Event()
    producing.set()
    retry_counter = _RetryCounter()
    logging.getLogger("assetq").addHandler(retry_counter)
    started = time.monotonic()
    stop_at = started + deadline_s
    per_producer = [
        events // producers + (1 if n < events % producers else 0) for n in range(producers)
    ]

    producer_retries = [0] * producers

    def produce(n: int) -> None:
        rng = random.Random(seed * 1000 + n)
        try:
            for _ in range(per_producer[n]):
                asset = rng.choice(ASSETS)
                while time.monotonic() < stop_at:
                    try:
                        with algorithm.engine.connect() as conn:
                            event_id = algorithm.register(conn, asset)
                            time.sleep(rng.uniform(0, max_hold_ms) / 1000)  # the late commit
                            if rng.random() < rollback_ratio:
                                conn.rollback()
                                with lock:
                                    rolled_back.append(event_id)
                            else:
                                conn.commit()
                                with lock:
                                    committed[event_id] = (asset, time.monotonic())
                        break
                    except Exception as exc:
                        # A deadlock rolled the registration back: retry it, as a producing
                        # task would be retried. Anything else is a failure of the run.
                        if not is_transient(algorithm.engine, exc):
                            raise
                        producer_retries[n] += 1
        except BaseException as exc:
            failures.append(exc)

    def note(runs: list[tuple[str, tuple[int, ...]]]) -> None:
        now = time.monotonic()
        with lock:
            for dag_id, event_ids in runs:
                for event_id in event_ids:
                    seen_at.setdefault((dag_id, event_id), now)

    def schedule() -> None:
        try:
            while producing.is_set() and time.monotonic() < stop_at:
                note(algorithm.schedule())
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=produce, args=(n,), daemon=True) for n in range(producers)]
    threads += [threading.Thread(target=schedule, daemon=True) for _ in range(schedulers)]
    try:
        for t in threads:
            t.start()
        for t in threads[:producers]:
            t.join()
        producing.clear()
        for t in threads[producers:]:
            t.join()
        if failures:
            raise RuntimeError(f"load failed: {failures[0]!r}") from failures[0]
        while runs := algorithm.schedule():  # drain
            note(runs)
    finally:
        logging.getLogger("assetq").removeHandler(retry_counter)
    report.seconds = time.monotonic() - started
    report.retries = retry_counter.count + sum(producer_retries) + algorithm.retries
    _verify(algorithm, report, committed, rolled_back, seen_at)
    return report


def _verify(
    algorithm: Algorithm,
    report: Report,
    committed: dict[int, tuple[str, float]],
    rolled_back: list[int],
    seen_at: dict[tuple[str, int], float],
) -> None:
    links = algorithm.links()
    pairs = Counter((dag_id, event_id) for _, dag_id, event_id in links)
    queued = algorithm.queued()
    expected = {
        (dag_id, event_id)
        for event_id, (asset, _) in committed.items()
        for dag_id, assets in SUBSCRIBED.items()
        if asset in assets
    }
    report.events = len(committed)
    report.rolled_back = len(rolled_back)
    report.pairs = len(expected)
    # A pair still queued at the end is not lost if its consumer's condition cannot hold on
    # its queue (an AND waiting for an asset that produced nothing since): it is pending.
    pending = {p for p in expected - set(pairs) if p in queued}
    report.still_queued = len(pending)
    report.lost = len(expected - set(pairs) - pending)
    report.duplicated = sum(n - 1 for n in pairs.values() if n > 1)
    dead = set(rolled_back)
    report.rolled_back_linked = sum(1 for _, _, e in links if e in dead)
    runs: dict[int, tuple[str, set[str]]] = {}
    asset_of = {e: a for e, (a, _) in committed.items()}
    for run_id, dag_id, event_id in links:
        runs.setdefault(run_id, (dag_id, set()))[1].add(asset_of.get(event_id, "?"))
    all_runs = algorithm.run_ids()
    report.runs = len(all_runs)
    report.empty_runs = sum(1 for r in all_runs if r not in runs)
    report.conditions_violated = sum(
        1 for dag_id, assets in runs.values() if not holds(TOPOLOGY[dag_id], assets)
    )
    for pair in expected & set(seen_at):
        report.latencies.append(max(0.0, seen_at[pair] - committed[pair[1]][1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engine", choices=["postgresql", "mysql"], default="postgresql")
    parser.add_argument(
        "--server", default="local", help="'local', 'embedded' (PostgreSQL) or a server URL"
    )
    parser.add_argument("--algorithm", choices=["assetq", "window", "both"], default="both")
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--producers", type=int, default=16)
    parser.add_argument("--schedulers", type=int, default=3)
    parser.add_argument("--max-hold-ms", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--deadline", type=float, default=3600.0, help="stop producing after this many seconds"
    )
    args = parser.parse_args(argv)

    import dbs

    backend = dbs.backend_for(args.engine, args.server)
    reports = []
    try:
        names = ["assetq", "window"] if args.algorithm == "both" else [args.algorithm]
        for name in names:
            db = backend.database(installed=True)
            try:
                engine = db.new_engine(
                    pool_size=args.producers + args.schedulers + 2, max_overflow=4
                )
                algorithm: Algorithm = (
                    AssetqAlgorithm(engine, db.namespace)
                    if name == "assetq"
                    else WindowAlgorithm(engine)
                )
                reports.append(
                    run_load(
                        algorithm,
                        engine_name=args.engine,
                        events=args.events,
                        producers=args.producers,
                        schedulers=args.schedulers,
                        max_hold_ms=args.max_hold_ms,
                        seed=args.seed,
                        deadline_s=args.deadline,
                    )
                )
                print(format_table(reports[-1:]), flush=True)
            finally:
                backend.drop(db)
    finally:
        backend.close()
    print()
    print(format_table(reports))
    return 0 if all(r.ok for r in reports if r.algorithm == "assetq") else 1


if __name__ == "__main__":
    raise SystemExit(main())
