"""assetq side by side with the queues its users would otherwise pick, on the same PostgreSQL
server and in the same database, interleaved in the same runs (benchmarks/bench.py's
``peers`` figure; docs/benchmarks.md's "Against the peers").

The peers:

PgQ
    Debian's ``postgresql-NN-pgq3`` (``CREATE EXTENSION pgq`` in the benchmark's database; it
    needs no preloaded library, so no restart). One queue, the consumers registered on it;
    PgQ writes one row per event whatever the number of consumers, and a consumer reads a
    batch: the events between two ticks. No pgqd daemon runs: the benchmark ticks by hand
    (``pgq.ticker``, after every event with ticker_max_count 1), untimed, when it fills a
    backlog.
pgmq
    the pure-SQL install bundled in PyPI's ``pgmq`` wheel (``pgmq/sql/pgmq.sql``; only that
    file is used, so the wheel is installed without its client's dependencies). N consumers
    are N queues bound to one topic: ``send_topic`` writes one row per queue in one call.
procrastinate
    its packaged schema, in a schema of its own (benchmarks/burndown.py installs it); N
    consumers are N jobs, deferred in one call of ``procrastinate_defer_jobs_v1``.

Every side is sent through the same client: bare psycopg 3, one connection per client thread,
each call one statement on an autocommit connection (a function call is atomic by itself),
synchronous_commit off; assetq's side calls its own routines (register_event,
register_events, schedule_pass) exactly as the Python API sends them. The producer and the
one-event drain also show ``assetq`` through its Python API (SQLAlchemy Core), to show what
the client layer adds.

Figures (each alternative takes turns with the others in slices of a quarter second; ratios
per repetition):

producer
    events/s at 1 and 8 clients with 1 and 4 consumers, each event its own transaction.
batch
    events/s of batches of 1,000 events with 4 consumers (assetq ``register_events``; PgQ
    ``insert_event`` x 1,000 in one statement; pgmq ``send_batch_topic``; procrastinate 4,000
    jobs in one defer call).
drain
    events/s consumed from a backlog (``--backlog``, 100,000; topped up before each slice,
    untimed, so every slice starts from the same backlog): the whole backlog in one run
    (assetq one pass of an uncapped consumer; PgQ one batch; one timed operation per side per
    repetition); 1,000 per run (assetq ``max_events_per_run=1000``; PgQ 1,000-event batches;
    pgmq read 1,000 + delete); 1 per run (assetq ``max_events_per_run=1``; pgmq read 1 +
    delete; procrastinate fetch + finish). A PgQ consumer does next_batch, get_batch_events
    and finish_batch in one transaction; a batch per event would need a tick per event, so
    PgQ has no one-event figure.
profile
    where assetq's producer time goes at 1 event per transaction, 4 consumers, 1 client:
    assetq against copies of its schema, each without one part (the wake-up trigger, the
    event's foreign key, the capped claim's two queue indexes, all secondary queue indexes,
    WAL), or with the fan-out written by one client CTE instead of the routine and its
    statement trigger, and PgQ in the same run. The variants are made by
    benchmarks/sql/peers_postgresql.sql in namespaces of their own; the real schema is never
    changed.

MySQL/MariaDB: no peer runs there; the producer figure compares assetq with the same rows
written by plain client statements (benchmarks/register.py's plain path).

Peers are installed by the setup when missing (``install="install"``): ``apt-get install``
of the Debian package (through ``sudo -n`` when not root), ``pip install`` of the wheels
(the ``bench`` extra). With ``install="if-installed"`` a missing peer is skipped with one
line saying so, as the smoke test does.

    python benchmarks/bench.py --figures peers            # this figure alone, both engines
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import psycopg
import sqlalchemy as sa
from psycopg.types.json import Jsonb
from sqlalchemy import Engine
from sqlalchemy.engine import URL

import assetq
from assetq import sqlfiles

HERE = Path(__file__).resolve().parent
for _path in (HERE, HERE.parent / "tests"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import burndown  # noqa: E402  (benchmarks/burndown.py: procrastinate's schema and queries)
import register  # noqa: E402  (benchmarks/register.py: the plain-statements path)

#: Length of one slice: the alternatives take turns slice by slice (as in bench.py).
SLICE_SECONDS = 0.25

PGMQ_REQUIREMENT = "pgmq>=1.1"
ASSETQ = "assetq"
ASSETQ_API = "assetq (Python API)"
ASSETQ_ONE = "assetq, limit 1"
PGQ, PGMQ, PROCRASTINATE, PLAIN = "PgQ", "pgmq", "procrastinate", "plain statements"
#: Every consumer is scheduled on any of these; producers write a0.
ASSETS = ("a0", "a1", "a2", "a3")


@dataclass(frozen=True)
class Settings:
    clients: tuple[int, ...] = (1, 8)
    consumers: tuple[int, ...] = (1, 4)
    seconds: float = 2.0  # one alternative's time per repetition, in slices
    repetitions: int = 5
    batch_size: int = 1_000
    batch_consumers: int = 4
    backlog: int = 100_000
    drain_caps: tuple[int, ...] = (1_000, 1)
    whole_repetitions: int = 7
    #: How many of PROFILE_VARIANTS the profile measures (0: no profile).
    profile: int = 99
    #: Whether the floors of the missed targets are measured (measure_floors).
    floors: bool = True
    #: "install" (peers installed when missing), "if-installed" or "off".
    install: str = "install"


# -- SQL ---------------------------------------------------------------------------------------


@functools.cache
def _queries() -> dict[str, str]:
    return sqlfiles.parse_queries((HERE / "sql" / "peers_postgresql.sql").read_text("utf-8"))


def q(name: str, namespace: str = "") -> str:
    """The named statement of benchmarks/sql/peers_postgresql.sql, for ``namespace``."""
    return sqlfiles.render(_queries()[name], f'"{namespace}"' if namespace else "")


def _progress(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


def _note(message: str) -> None:
    print(f"peers: {message}", file=sys.stderr, flush=True)


def _rotated(items: Sequence[Any], k: int) -> list[Any]:
    k %= len(items)
    return list(items[k:]) + list(items[:k])


def _slices(seconds: float) -> int:
    return max(1, round(seconds / SLICE_SECONDS))


# -- connections -------------------------------------------------------------------------------


def conninfo(url: URL, search_path: str | None = None) -> dict[str, Any]:
    options = "-c synchronous_commit=off" + (
        f" -c search_path={search_path}" if search_path else ""
    )
    return {
        "host": burndown.postgres_host(url),
        "port": url.port or 5432,
        "user": url.username or "postgres",
        "password": url.password if isinstance(url.password, str) else None,
        "dbname": url.database,
        "options": options,
        "autocommit": True,
    }


def connect(info: dict[str, Any]) -> psycopg.Connection[Any]:
    return psycopg.connect(**info)


# -- installing the peers ----------------------------------------------------------------------


def _apt_install(package: str) -> bool:
    if shutil.which("apt-get") is None:
        return False
    prefix: list[str] = []
    if os.geteuid() != 0:
        if shutil.which("sudo") is None:
            return False
        prefix = ["sudo", "-n"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    _note(f"installing the Debian package {package} (PgQ's extension files)")
    done = subprocess.run(
        [*prefix, "apt-get", "install", "-y", "-q", package],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:  # perhaps an old package list: once more after an update
        subprocess.run(
            [*prefix, "apt-get", "update", "-q"], env=env, capture_output=True, check=False
        )
        done = subprocess.run(
            [*prefix, "apt-get", "install", "-y", "-q", package],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
    return done.returncode == 0


def pgq_available(info: dict[str, Any], mode: str) -> str:
    """ "" when PgQ can be created in the database, else why not (said in one line)."""
    if mode == "off":
        return "not measured"
    with connect(info) as conn:
        available = conn.execute(q("pgq_available")).fetchone()
        major = conn.execute(q("pgq_server_major")).fetchone()
    if available and available[0]:
        return ""
    package = f"postgresql-{major[0] if major else 15}-pgq3"
    if mode == "install" and _apt_install(package):
        return ""
    why = f"PgQ is not installed on the server (Debian package {package}): its side is skipped"
    _note(why)
    return why


def pgmq_script(mode: str) -> tuple[str | None, str]:
    """pgmq's SQL-only install script from its wheel, and its version; None with why not."""
    if mode == "off":
        return None, "not measured"
    if importlib.util.find_spec("pgmq") is None and mode == "install":
        _note(f"installing '{PGMQ_REQUIREMENT}' (its SQL install script; the bench extra)")
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", PGMQ_REQUIREMENT],
            check=False,
        )
        importlib.invalidate_caches()
    spec = importlib.util.find_spec("pgmq")
    if spec is None or not spec.submodule_search_locations:
        why = f"pgmq is not installed (pip install '{PGMQ_REQUIREMENT}'): its side is skipped"
        _note(why)
        return None, why
    folder = Path(next(iter(spec.submodule_search_locations))) / "sql"
    script = folder / "pgmq.sql"
    if not script.exists():
        why = f"the pgmq package has no {script.name}: its side is skipped"
        _note(why)
        return None, why
    version = (folder / "VERSION").read_text().strip() if (folder / "VERSION").exists() else "?"
    return script.read_text("utf-8"), version


# -- the sides ---------------------------------------------------------------------------------


class Client(Protocol):
    def step(self) -> int: ...

    def close(self) -> None: ...


@dataclass
class Simple:
    """A client whose step is one call on its own connection, returning the events done."""

    conn: psycopg.Connection[Any]
    call: Callable[[psycopg.Connection[Any]], int]

    def step(self) -> int:
        return self.call(self.conn)

    def close(self) -> None:
        self.conn.close()


def _simple(
    info: dict[str, Any], call: Callable[[psycopg.Connection[Any]], int]
) -> Callable[[], Client]:
    """A factory of clients each calling ``call`` on a connection of its own."""

    def make() -> Client:
        return Simple(connect(info), call)

    return make


@dataclass
class Alternative:
    label: str
    client: Callable[[], Client]
    #: Untimed, before each slice (a drain's top-up).
    prepare: Callable[[], None] = lambda: None
    #: Untimed, once a repetition (a drain's vacuum).
    settle: Callable[[], None] = lambda: None
    after: Callable[[int], None] = lambda n: None


def timed(alt: Alternative, clients: int, seconds: float) -> tuple[int, float]:
    """Events done by ``clients`` threads of ``alt`` in about ``seconds`` (a step returning
    0 ends its thread early: the backlog is empty), and the time from the common start to
    the last thread's end."""
    started: list[float] = []
    barrier = threading.Barrier(clients, action=lambda: started.append(time.perf_counter()))
    counts = [0] * clients
    finished = [0.0] * clients
    failures: list[BaseException] = []

    def work(index: int) -> None:
        try:
            client = alt.client()
            try:
                barrier.wait()
                deadline = started[0] + seconds
                n = 0
                while time.perf_counter() < deadline:
                    k = client.step()
                    if k == 0:
                        break
                    n += k
                counts[index] = n
                finished[index] = time.perf_counter()
            finally:
                client.close()
        except BaseException as exc:  # re-raised below
            failures.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise failures[0]
    return sum(counts), max(finished) - started[0]


def interleaved(
    alts: Sequence[Alternative], clients: int, seconds: float, repetitions: int, what: str
) -> dict[str, list[float]]:
    """Events/s of each alternative per repetition, the alternatives taking turns slice by
    slice (the order rotating), so load from elsewhere falls on all of them alike."""
    rates: dict[str, list[float]] = {a.label: [] for a in alts}
    slices = _slices(seconds)
    for rep in range(repetitions):
        for alt in alts:  # filled first, then vacuumed and analyzed: plans see the backlog
            alt.prepare()
            alt.settle()
        events = dict.fromkeys(rates, 0)
        elapsed = dict.fromkeys(rates, 0.0)
        for k in range(slices):
            for alt in _rotated(alts, rep + k):
                alt.prepare()
                n, secs = timed(alt, clients, seconds / slices)
                alt.after(n)
                events[alt.label] += n
                elapsed[alt.label] += secs
        for label in rates:
            secs = elapsed[label]
            rates[label].append(events[label] / secs if secs else 0.0)
        _progress(
            f"{what} {rep + 1}/{repetitions}: "
            + ", ".join(f"{k} {v[-1]:,.0f}/s" for k, v in rates.items())
        )
    return rates


# -- setup of every side -----------------------------------------------------------------------


@dataclass
class Setup:
    """What is installed in the benchmark's database, and how to reach it."""

    engine: Engine
    info: dict[str, Any]
    pgq: bool = False
    pgmq: bool = False
    proc: Any = None  # burndown.Peer
    versions: dict[str, str] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    namespaces: list[str] = field(default_factory=list)
    proc_worker: int | None = None
    #: Namespaces changed by a profile variant.
    copies: set[str] = field(default_factory=set)

    def namespace(self, name: str, consumers: int, cap: int | None = None) -> str:
        """A fresh assetq namespace, ``consumers`` consumers on any of assets a0..a3."""
        assetq.uninstall(self.engine, namespace=name)
        assetq.install(self.engine, namespace=name)
        self.namespaces.append(name)
        with self.engine.begin() as conn:
            for c in range(consumers):
                assetq.declare_dag(
                    conn,
                    f"consumer_{c}",
                    assetq.any_of(*ASSETS),
                    max_events_per_run=cap,
                    namespace=name,
                )
        return name

    def execute(self, sql: str, params: dict[str, Any] | None = None) -> list[Any]:
        with connect(self.info) as conn:
            cur = conn.execute(sql, params)
            return cur.fetchall() if cur.description else []

    def proc_info(self) -> dict[str, Any]:
        return {**self.proc.conninfo, "autocommit": True}

    def close(self) -> None:
        for name in reversed(self.namespaces):
            if name in self.copies:  # altered by a profile variant: alembic cannot undo it
                self.execute(q("aq_drop_copy", name))
            else:
                assetq.uninstall(self.engine, namespace=name)
        if self.pgq:
            self.execute(q("pgq_uninstall"))
        if self.pgmq:
            self.execute(q("pgmq_uninstall"))
        if self.proc is not None:
            burndown.drop_peer(self.proc)


def setup(engine: Engine, mode: str) -> Setup:
    info = conninfo(engine.url)
    s = Setup(engine, info)
    why = pgq_available(info, mode)
    if why:
        s.notes[PGQ] = why
    else:
        s.execute(q("pgq_uninstall"))
        s.execute(q("pgq_install"))
        s.pgq = True
        s.versions[PGQ] = f"PgQ {s.execute(q('pgq_version'))[0][0]}"
    script, version = pgmq_script(mode)
    if script is None:
        s.notes[PGMQ] = version
    else:
        s.execute(q("pgmq_uninstall"))
        with connect(info) as conn, conn.transaction():
            conn.execute(script.encode())
        s.pgmq = True
        s.versions[PGMQ] = f"pgmq {version} (SQL-only install)"
    module = burndown.peer_module(mode)
    if module is None:
        s.notes[PROCRASTINATE] = "procrastinate is not installed: its side is skipped"
    else:
        s.proc = burndown.install_peer(engine.url, module)
        s.versions[PROCRASTINATE] = s.proc.version
        with connect(s.proc_info()) as conn:
            row = conn.execute(s.proc.register).fetchone()
            s.proc_worker = int(row[0]) if row else None
    return s


# -- producer ----------------------------------------------------------------------------------


def _pg_one(sql: str, params: dict[str, Any], expect: int | None = None) -> Callable[..., int]:
    def call(conn: psycopg.Connection[Any]) -> int:
        cur = conn.execute(sql, params, prepare=True)
        row = cur.fetchone() if cur.description else None
        if expect is not None and (row is None or row[0] != expect):
            raise SystemExit(f"{sql.split()[1]} returned {row}, not {expect}")
        return 1

    return call


def producer_alternatives(s: Setup, consumers: int, with_api: bool = True) -> list[Alternative]:
    """One event per transaction for ``consumers`` consumers, on every side."""
    ns = s.namespace(f"aqp_peer_prod_{consumers}", consumers)
    info = s.info
    alts = [
        Alternative(
            ASSETQ,
            lambda: Simple(connect(info), _pg_one(q("aq_register", ns), {"asset": "a0"})),
        )
    ]
    if with_api:
        api_engine = sa.create_engine(
            s.engine.url,
            poolclass=sa.pool.NullPool,
            connect_args={"options": "-c synchronous_commit=off"},
            isolation_level="AUTOCOMMIT",
        )

        @dataclass
        class Api:
            conn: sa.Connection

            def step(self) -> int:
                assetq.register_event(self.conn, "a0", namespace=ns)
                return 1

            def close(self) -> None:
                self.conn.close()

        alts.append(Alternative(ASSETQ_API, lambda: Api(api_engine.connect())))
    if s.pgq:
        queue = f"prod_{consumers}"
        s.execute(q("pgq_create_queue"), {"queue": queue})
        for c in range(consumers):
            s.execute(q("pgq_register_consumer"), {"queue": queue, "consumer": f"consumer_{c}"})
        alts.append(
            Alternative(
                PGQ,
                lambda: Simple(
                    connect(info), _pg_one(q("pgq_insert"), {"queue": queue, "data": "{}"})
                ),
            )
        )
    if s.pgmq:
        topic = f"prod_{consumers}"
        for c in range(consumers):
            s.execute(q("pgmq_create_queue"), {"queue": f"prod_{consumers}_{c}"})
            s.execute(q("pgmq_bind"), {"topic": topic, "queue": f"prod_{consumers}_{c}"})
        params = {"topic": topic, "msg": "{}"}
        alts.append(
            Alternative(
                PGMQ,
                lambda: Simple(connect(info), _pg_one(q("pgmq_send_topic"), params, consumers)),
            )
        )
    if s.proc is not None:
        queues = [f"prod_{consumers}_{c}" for c in range(consumers)]
        pinfo = s.proc_info()

        def defer(conn: psycopg.Connection[Any]) -> int:
            row = conn.execute(q("proc_defer"), {"queues": queues}, prepare=True).fetchone()
            if row is None or len(row[0]) != consumers:
                raise SystemExit(f"procrastinate deferred {row}, not {consumers} jobs")
            return 1

        alts.append(Alternative(PROCRASTINATE, lambda: Simple(connect(pinfo), defer)))
    return alts


def measure_producer(s: Setup, st: Settings) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for consumers in st.consumers:
        alts = producer_alternatives(s, consumers)
        for clients in st.clients:
            out[f"{consumers}/{clients}"] = interleaved(
                alts,
                clients,
                st.seconds,
                st.repetitions,
                f"peers producer, {consumers} consumers, {clients} clients",
            )
        ns = f"aqp_peer_prod_{consumers}"
        events, queued = s.execute(q("prof_rows", ns))[0]
        if queued != events * consumers:
            raise SystemExit(f"{ns}: {events} events but {queued} queue rows")
    return out


# -- batch -------------------------------------------------------------------------------------


def measure_batch(s: Setup, st: Settings) -> dict[str, list[float]]:
    n, consumers = st.batch_size, st.batch_consumers
    ns = f"aqp_peer_prod_{consumers}"
    if ns not in s.namespaces:
        producer_alternatives(s, consumers, with_api=False)  # the same sides as the producer
    info = s.info
    events = json.dumps([{"asset": f"a{i % 4}"} for i in range(n)])
    alts = [
        Alternative(
            ASSETQ,
            lambda: Simple(
                connect(info), _batch(q("aq_register_batch", ns), {"events": events}, n)
            ),
        )
    ]
    if s.pgq:
        data = ["{}"] * n
        alts.append(
            Alternative(
                PGQ,
                lambda: Simple(
                    connect(info),
                    _batch(q("pgq_insert_batch"), {"queue": f"prod_{consumers}", "data": data}, n),
                ),
            )
        )
    if s.pgmq:
        msgs = [Jsonb({"n": i}) for i in range(n)]
        topic_params = {"topic": f"prod_{consumers}", "msgs": msgs}
        alts.append(
            Alternative(
                PGMQ,
                lambda: Simple(
                    connect(info),
                    _batch(q("pgmq_send_batch_topic"), topic_params, n * consumers, n),
                ),
            )
        )
    if s.proc is not None:
        job_params = {"n": n, "queues": [f"prod_{consumers}_{c}" for c in range(consumers)]}
        pinfo = s.proc_info()
        alts.append(
            Alternative(
                PROCRASTINATE,
                lambda: Simple(
                    connect(pinfo),
                    _batch(q("proc_defer_batch"), job_params, n * consumers, n),
                ),
            )
        )
    return interleaved(alts, 1, st.seconds, st.repetitions, f"peers batch of {n:,}")


def _batch(
    sql: str, params: dict[str, Any], expect: int, events: int | None = None
) -> Callable[..., int]:
    def call(conn: psycopg.Connection[Any]) -> int:
        row = conn.execute(sql, params).fetchone()
        if row is None or row[0] != expect:
            raise SystemExit(f"a batch wrote {row}, not {expect}")
        return events if events is not None else expect

    return call


# -- drain -------------------------------------------------------------------------------------


@dataclass
class Backlog:
    """A side's queued events, topped up to ``size`` before each slice (untimed)."""

    size: int
    fill: Callable[[int], None]
    pending: int = 0

    def top_up(self) -> None:
        if self.pending < self.size:
            self.fill(self.size - self.pending)
            self.pending = self.size

    def consumed(self, n: int) -> None:
        self.pending -= n


def _assetq_backlog(s: Setup, ns: str, size: int) -> Backlog:
    def fill(n: int) -> None:
        s.execute(q("aq_fill", ns), {"n": n, "asset": "a0"})

    return Backlog(size, fill)


def _pgq_backlog(s: Setup, queue: str, size: int, per_batch: int) -> Backlog:
    s.execute(q("pgq_create_queue"), {"queue": queue})
    s.execute(q("pgq_register_consumer"), {"queue": queue, "consumer": "drain"})

    def fill(n: int) -> None:
        with connect(s.info) as conn:
            for start in range(0, n, per_batch):
                conn.execute(q("pgq_fill"), {"queue": queue, "n": min(per_batch, n - start)})
                conn.execute(q("pgq_tick"), {"queue": queue})

    return Backlog(size, fill)


@dataclass
class PgqConsumer:
    conn: psycopg.Connection[Any]
    queue: str

    def step(self) -> int:
        """One batch, as a PgQ consumer takes it: next_batch, its events, finish_batch, in
        one transaction."""
        with self.conn.transaction():
            row = self.conn.execute(
                q("pgq_next_batch"), {"queue": self.queue, "consumer": "drain"}
            ).fetchone()
            if row is None or row[0] is None:
                return 0
            events = self.conn.execute(q("pgq_batch_events"), {"batch_id": row[0]}).fetchall()
            self.conn.execute(q("pgq_finish_batch"), {"batch_id": row[0]})
        return len(events)

    def close(self) -> None:
        self.conn.close()


def _assetq_pass(ns: str, limit: int = 100) -> Callable[..., int]:
    """One pass as assetq.schedule sends it, with its default limit unless told."""
    sql = q("aq_pass", ns)
    params = {"limit": limit}

    def call(conn: psycopg.Connection[Any]) -> int:
        rows = conn.execute(sql, params, prepare=True).fetchall()
        return sum(len(r[1]) for r in rows)

    return call


def _pgmq_drain(queue: str, n: int) -> Callable[..., int]:
    def call(conn: psycopg.Connection[Any]) -> int:
        ids = [r[0] for r in conn.execute(q("pgmq_read"), {"queue": queue, "n": n}, prepare=True)]
        if not ids:
            return 0
        deleted = conn.execute(q("pgmq_delete"), {"queue": queue, "ids": ids}, prepare=True)
        row = deleted.fetchone()
        if row is None or row[0] != len(ids):
            raise SystemExit(f"pgmq deleted {row} of {len(ids)} messages")
        return len(ids)

    return call


def measure_drain(s: Setup, st: Settings) -> dict[str, Any]:
    info, size = s.info, st.backlog
    out: dict[str, Any] = {"backlog": size}

    # The whole backlog in one run: one timed operation per side per repetition.
    # One namespace and backlog for assetq's three drains: its consumer is re-declared with
    # each cap (the queue stays), which costs fewer installs than a namespace per cap.
    ns = s.namespace("aqp_peer_drain", 1)
    assetq_backlog = _assetq_backlog(s, ns, size)
    whole: list[WholeSide] = [
        (ASSETQ, assetq_backlog, _simple(info, _assetq_pass(ns)), _vacuum(s, ns))
    ]
    if s.pgq:
        whole.append(_pgq_whole(s, "drain_all", size))
    out["whole"] = _whole_runs(st, whole, "peers drain, whole backlog")

    for cap in st.drain_caps:
        with s.engine.begin() as conn:
            assetq.declare_dag(
                conn, "consumer_0", assetq.any_of(*ASSETS), max_events_per_run=cap, namespace=ns
            )
        out[str(cap)] = _capped_drain(s, st, cap, ns, assetq_backlog)
    return out


#: A side of a whole-backlog drain: its label, backlog, client, and what it does untimed
#: after its top-up (a vacuum), if anything.
WholeSide = tuple[str, Backlog, Callable[[], Client], Callable[[], None] | None]


def _whole_runs(st: Settings, sides: list[WholeSide], what: str) -> dict[str, list[float]]:
    """Events/s of one timed step per side per repetition, each consuming the side's whole
    backlog (checked), the sides taking turns (the first one rotating)."""
    size = st.backlog
    seconds: dict[str, list[float]] = {label: [] for label, *_ in sides}
    for rep in range(st.whole_repetitions):
        for label, backlog, make, settle in _rotated(sides, rep):
            backlog.top_up()
            if settle is not None:
                settle()
            client = make()
            try:
                t0 = time.perf_counter()
                n = client.step()
                seconds[label].append(time.perf_counter() - t0)
            finally:
                client.close()
            if n != size:
                raise SystemExit(f"{label}: one run consumed {n} events, not {size}")
            backlog.consumed(n)
        _progress(
            f"{what} {rep + 1}/{st.whole_repetitions}: "
            + ", ".join(f"{k} {size / v[-1]:,.0f}/s" for k, v in seconds.items())
        )
    return {label: [size / t for t in v] for label, v in seconds.items()}


def _pgq_whole(s: Setup, queue: str, size: int) -> WholeSide:
    """PgQ's side of a whole-backlog drain: a new queue of ``size`` events in one batch,
    taken by one consumer's batch."""
    info = s.info
    return (
        PGQ,
        _pgq_backlog(s, queue, size, size),
        lambda: PgqConsumer(connect(info), queue),
        None,
    )


def _vacuum(s: Setup, ns: str) -> Callable[[], None]:
    """Namespace ``ns``'s dead rows gone and its statistics fresh (untimed)."""

    def vacuum() -> None:
        s.execute(q("aq_vacuum", ns))

    return vacuum


def _capped_drain(
    s: Setup, st: Settings, cap: int, ns: str, shared: Backlog
) -> dict[str, list[float]]:
    """Events/s draining the backlog ``cap`` events per run, every side interleaved
    (assetq: namespace ``ns``, its consumer capped at ``cap``, with backlog ``shared``)."""
    info, size = s.info, st.backlog
    alts: list[Alternative] = []

    def add(
        label: str,
        backlog: Backlog,
        make: Callable[[], Client],
        settle: Callable[[], None] = lambda: None,
    ) -> None:
        alts.append(Alternative(label, make, backlog.top_up, settle, backlog.consumed))

    vacuum = _vacuum(s, ns)
    add(ASSETQ, shared, _simple(info, _assetq_pass(ns)), vacuum)
    if cap == 1:
        # One run per pass, as every pass was before development schema 0011_runs_per_pass.
        add(ASSETQ_ONE, shared, _simple(info, _assetq_pass(ns, 1)), vacuum)
        api_engine = sa.create_engine(
            s.engine.url, connect_args={"options": "-c synchronous_commit=off"}
        )
        with api_engine.connect():  # connected (and pooled) before any timed slice
            pass

        @dataclass
        class Api:
            def step(self) -> int:
                runs = assetq.schedule(api_engine, namespace=ns)
                return sum(len(r.event_ids) for r in runs)

            def close(self) -> None:
                pass

        add(ASSETQ_API, shared, Api)
    queue = f"drain_{cap}"
    if s.pgq and cap > 1:

        def pgq_consumer() -> Client:
            return PgqConsumer(connect(info), queue)

        add(PGQ, _pgq_backlog(s, queue, size, cap), pgq_consumer)
    if s.pgmq:
        s.execute(q("pgmq_create_queue"), {"queue": queue})

        def pgmq_fill(n: int) -> None:
            s.execute(q("pgmq_fill"), {"queue": queue, "n": n})

        def pgmq_vacuum() -> None:
            s.execute(q("pgmq_vacuum", f"q_{queue}"))

        add(PGMQ, Backlog(size, pgmq_fill), _simple(info, _pgmq_drain(queue, cap)), pgmq_vacuum)
    if s.proc is not None and cap == 1:
        pinfo = s.proc_info()
        # The producer's and batch's jobs wait in other queues: gone, so that fetching from
        # this queue does not step over them.
        with connect(pinfo) as conn:
            conn.execute(q("proc_reset"))

        def proc_fill(n: int) -> None:
            with connect(pinfo) as conn:
                conn.execute(q("proc_fill"), {"queue": queue, "n": n})

        def proc_vacuum() -> None:
            with connect(pinfo) as conn:
                conn.execute(q("proc_vacuum"))

        add(
            PROCRASTINATE,
            Backlog(size, proc_fill),
            _simple(pinfo, _proc_step(s, queue)),
            proc_vacuum,
        )
    return interleaved(alts, 1, st.seconds, st.repetitions, f"peers drain, {cap:,} per run")


def _proc_step(s: Setup, queue: str) -> Callable[..., int]:
    """procrastinate's worker loop: fetch one job of ``queue``, finish it."""
    params = {"queues": [queue], "worker_id": s.proc_worker}

    def call(conn: psycopg.Connection[Any]) -> int:
        row = conn.execute(s.proc.fetch, params, prepare=True).fetchone()
        if row is None or row[0] is None:
            return 0
        conn.execute(
            s.proc.finish,
            {"job_id": row[0], "status": "succeeded", "delete_job": False},
            prepare=True,
        )
        return 1

    return call


# -- producer profile --------------------------------------------------------------------------

#: (label, variant statements applied to the copy, the statement the producer sends).
PROFILE_VARIANTS: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("one client CTE instead of routine + trigger", ("prof_no_fan_out",), "prof_cte_register"),
    ("a plain INSERT of the event (trigger fans out, no routine)", (), "prof_raw_insert"),
    ("fan-out without FOR KEY SHARE and alias probe", ("prof_lean_fan_out",), "aq_register"),
    ("without the wake-up trigger", ("prof_no_notify",), "aq_register"),
    ("without the event's foreign key", ("prof_no_fk",), "aq_register"),
    ("without the capped claim's two queue indexes", ("prof_no_claim_indexes",), "aq_register"),
    ("without any secondary queue index", ("prof_no_queue_indexes",), "aq_register"),
    ("event and queue unlogged", ("prof_unlogged",), "aq_register"),
    (
        "one client CTE, without the event's foreign key",
        ("prof_no_fan_out", "prof_no_fk"),
        "prof_cte_register",
    ),
    (
        "without trigger, foreign key, secondary queue indexes",
        ("prof_no_notify", "prof_no_fk", "prof_no_queue_indexes"),
        "aq_register",
    ),
)
PROFILE_BASE = "assetq as it is"


def measure_profile(s: Setup, st: Settings) -> dict[str, Any]:
    consumers = st.batch_consumers
    info = s.info
    base = s.namespace("aqp_prof_base", consumers)
    alts = [
        Alternative(
            PROFILE_BASE,
            lambda: Simple(connect(info), _pg_one(q("aq_register", base), {"asset": "a0"})),
        )
    ]
    namespaces = {PROFILE_BASE: base}
    for i, (label, statements, producer) in enumerate(PROFILE_VARIANTS[: st.profile]):
        ns = s.namespace(f"aqp_prof_{i}", consumers)
        namespaces[label] = ns
        s.copies.add(ns)
        for name in statements:
            s.execute(q(name, ns))
        sql = q(producer, ns)
        alts.append(Alternative(label, _simple(info, _pg_one(sql, {"asset": "a0"}))))
    if s.pgq:
        queue = "prof"
        s.execute(q("pgq_create_queue"), {"queue": queue})
        for c in range(consumers):
            s.execute(q("pgq_register_consumer"), {"queue": queue, "consumer": f"consumer_{c}"})
        alts.append(
            Alternative(
                PGQ,
                lambda: Simple(
                    connect(info), _pg_one(q("pgq_insert"), {"queue": queue, "data": "{}"})
                ),
            )
        )
    rates = interleaved(alts, 1, st.seconds, st.repetitions, "peers producer profile")
    for label, ns in namespaces.items():
        events, queued = s.execute(q("prof_rows", ns))[0]
        if queued != events * consumers:
            raise SystemExit(f"{label}: {events} events but {queued} queue rows")
    return {"consumers": consumers, "clients": 1, "base": PROFILE_BASE, "rates": rates}


# -- floors ------------------------------------------------------------------------------------

FLOOR_ALL = "a plain INSERT, the trigger's queue rows, every queue index"
FLOOR_EVENT = "the event rows alone (no queue row)"
FLOOR_PK = "a plain INSERT, the trigger's queue rows, the queue's primary key only"
FLOOR_RUN = "the run's writes alone (run row, queue rows deleted, links)"


def measure_floors(s: Setup, st: Settings) -> dict[str, Any]:
    """What bounds the targets assetq misses, measured: beside assetq and PgQ in the same
    interleaved runs, the least the layout writes (benchmarks/sql/peers_postgresql.sql's
    floors), with none of assetq's routines, locks or checks. Producer and batch: the event
    rows alone (a copy namespace without the fan-out trigger), and the event and queue rows
    by a plain INSERT, into a namespace as installed and into a copy whose queue keeps its
    primary key only. Whole backlog: one statement that inserts a run, deletes the
    consumer's queue rows and links them."""
    consumers, info, n = st.batch_consumers, s.info, st.batch_size
    base = s.namespace("aqp_floor_base", consumers)
    copies = {FLOOR_ALL: None, FLOOR_PK: "prof_no_queue_indexes", FLOOR_EVENT: "prof_no_fan_out"}
    spaces = {ASSETQ: base}
    for i, (label, change) in enumerate(copies.items()):
        ns = s.namespace(f"aqp_floor_{i}", consumers)
        if change is not None:
            s.copies.add(ns)
            s.execute(q(change, ns))
        spaces[label] = ns
    if s.pgq:
        s.execute(q("pgq_create_queue"), {"queue": "floor"})
        for c in range(consumers):
            s.execute(q("pgq_register_consumer"), {"queue": "floor", "consumer": f"consumer_{c}"})
    one = {"asset": "a0"}
    producer = [Alternative(ASSETQ, _simple(info, _pg_one(q("aq_register", base), one)))]
    events = json.dumps([{"asset": ASSETS[i % len(ASSETS)]} for i in range(n)])
    batch = [
        Alternative(
            ASSETQ, _simple(info, _batch(q("aq_register_batch", base), {"events": events}, n))
        )
    ]
    for label in copies:
        ns = spaces[label]
        producer.append(Alternative(label, _simple(info, _pg_one(q("prof_raw_insert", ns), one))))
        batch.append(
            Alternative(label, _simple(info, _batch(q("floor_insert_batch", ns), {"n": n}, n)))
        )
    if s.pgq:
        pgq_one = {"queue": "floor", "data": "{}"}
        producer.append(Alternative(PGQ, _simple(info, _pg_one(q("pgq_insert"), pgq_one))))
        pgq_batch = {"queue": "floor", "data": ["{}"] * n}
        batch.append(Alternative(PGQ, _simple(info, _batch(q("pgq_insert_batch"), pgq_batch, n))))
    out: dict[str, Any] = {"consumers": consumers, "batch_size": n, "backlog": st.backlog}
    for clients in st.clients:
        out[f"producer/{clients}"] = interleaved(
            producer, clients, st.seconds, st.repetitions, f"floors, producer, {clients} clients"
        )
    out["batch"] = interleaved(batch, 1, st.seconds, st.repetitions, f"floors, batch of {n:,}")
    for label, ns in spaces.items():
        written, queued = s.execute(q("prof_rows", ns))[0]
        expected = 0 if label == FLOOR_EVENT else written * consumers
        if queued != expected:
            raise SystemExit(f"{label}: {written} events but {queued} queue rows")

    # The whole backlog: assetq's pass, the run's writes alone, PgQ's one batch.
    size = st.backlog
    passed, written = s.namespace("aqp_floor_pass", 1), s.namespace("aqp_floor_run", 1)
    whole: list[WholeSide] = [
        (
            ASSETQ,
            _assetq_backlog(s, passed, size),
            _simple(info, _assetq_pass(passed)),
            _vacuum(s, passed),
        ),
        (
            FLOOR_RUN,
            _assetq_backlog(s, written, size),
            _simple(info, _batch(q("floor_run_writes", written), {}, size)),
            _vacuum(s, written),
        ),
    ]
    if s.pgq:
        whole.append(_pgq_whole(s, "floor_all", size))
    out["whole"] = _whole_runs(st, whole, "floors, whole backlog")
    return out


# -- MySQL/MariaDB: assetq against plain statements --------------------------------------------


def measure_mysql_producer(engine: Engine, st: Settings) -> dict[str, Any]:
    """The producer figure on MySQL/MariaDB, where no peer runs: assetq's register_event
    (autocommit, its own transaction) against benchmarks/register.py's plain statements (two
    INSERTs in a transaction, the fan-out trigger off in their namespace)."""

    out: dict[str, Any] = {}
    for consumers in st.consumers:
        out.update(_mysql_producer_for(engine, st, consumers))
    return out


def _mysql_producer_for(engine: Engine, st: Settings, consumers: int) -> dict[str, Any]:
    from assetq.dialects import dialect_for

    names = {ASSETQ: f"aqp_peer_prod_{consumers}", PLAIN: f"aqp_peer_plain_{consumers}"}
    assets = ASSETS
    for ns in names.values():
        assetq.uninstall(engine, namespace=ns)
        assetq.install(engine, namespace=ns)
        with engine.begin() as conn:
            for c in range(consumers):
                assetq.declare_dag(conn, f"consumer_{c}", assetq.any_of(*assets), namespace=ns)
    with engine.begin() as conn:
        dialect = dialect_for(conn)
        plain = register.PLAIN_PATHS[dialect.name]
        plain.disable_fan_out(conn, dialect, names[PLAIN])
    auto = engine.execution_options(isolation_level="AUTOCOMMIT")

    @dataclass
    class Own:
        conn: sa.Connection = field(default_factory=auto.connect)

        def step(self) -> int:
            assetq.register_event(self.conn, "a0", namespace=names[ASSETQ])
            return 1

        def close(self) -> None:
            self.conn.close()

    @dataclass
    class Plain:
        conn: sa.Connection = field(default_factory=engine.connect)

        def step(self) -> int:
            with self.conn.begin():
                plain.register(self.conn, dialect, names[PLAIN], "a0")
            return 1

        def close(self) -> None:
            self.conn.close()

    out: dict[str, Any] = {}
    alts = [Alternative(ASSETQ, Own), Alternative(PLAIN, Plain)]
    try:
        for clients in st.clients:
            out[f"{consumers}/{clients}"] = interleaved(
                alts,
                clients,
                st.seconds,
                st.repetitions,
                f"peers producer (MariaDB), {consumers} consumers, {clients} clients",
            )
    finally:
        for ns in names.values():
            assetq.uninstall(engine, namespace=ns)
    return out


# -- the figure --------------------------------------------------------------------------------


def measure(engine: Engine, st: Settings) -> dict[str, Any]:
    """The peers figure on ``engine``'s database (PostgreSQL: every peer that is installed
    or installable; MySQL/MariaDB: assetq against plain statements)."""
    name = engine.dialect.name
    result: dict[str, Any] = {
        "settings": {
            "clients": list(st.clients),
            "consumers": list(st.consumers),
            "seconds": st.seconds,
            "repetitions": st.repetitions,
            "batch_size": st.batch_size,
            "batch_consumers": st.batch_consumers,
            "backlog": st.backlog,
            "whole_repetitions": st.whole_repetitions,
        },
    }
    if name != "postgresql":
        result["notes"] = {
            PGQ: "PostgreSQL only",
            PGMQ: "PostgreSQL only",
            PROCRASTINATE: "PostgreSQL only",
        }
        result["versions"] = {}
        result["producer"] = measure_mysql_producer(engine, st)
        return result
    s = setup(engine, st.install)
    try:
        result["versions"] = s.versions
        result["notes"] = s.notes
        result["producer"] = measure_producer(s, st)
        result["batch"] = measure_batch(s, st)
        result["drain"] = measure_drain(s, st)
        if st.profile:
            result["profile"] = measure_profile(s, st)
        if st.floors:
            result["floors"] = measure_floors(s, st)
    finally:
        s.close()
    return result


# -- standalone --------------------------------------------------------------------------------

PARTS = ("producer", "batch", "drain", "profile", "floors")


def main(argv: Sequence[str] | None = None) -> int:
    """One or more parts of the figure on PostgreSQL, printed (docs/benchmarks.md is
    bench.py's): ``python benchmarks/peers.py --parts profile --repetitions 9``."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    defaults = Settings()
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated: {PARTS}")
    parser.add_argument("--seconds", type=float, default=defaults.seconds)
    parser.add_argument("--repetitions", type=int, default=defaults.repetitions)
    parser.add_argument("--backlog", type=int, default=defaults.backlog)
    parser.add_argument(
        "--install", choices=("install", "if-installed", "off"), default=defaults.install
    )
    parser.add_argument(
        "--postgres", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
    )
    parser.add_argument("--database", default=f"aqp_peers_{os.getpid()}")
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if set(parts) - set(PARTS):
        parser.error(f"unknown parts {sorted(set(parts) - set(PARTS))}")
    st = Settings(
        seconds=args.seconds,
        repetitions=args.repetitions,
        backlog=args.backlog,
        install=args.install,
    )
    bench = importlib.import_module("bench")
    report = importlib.import_module("report")
    server = bench._postgres_server(args.postgres, args.database)
    engine = server.target.engine
    try:
        s = setup(engine, st.install)
        result: dict[str, Any] = {"settings": {**vars(st), "batch_size": st.batch_size}}
        try:
            result["versions"], result["notes"] = s.versions, s.notes
            measures: dict[str, Callable[[Setup, Settings], Any]] = {
                "producer": measure_producer,
                "batch": measure_batch,
                "drain": measure_drain,
                "profile": measure_profile,
                "floors": measure_floors,
            }
            for part in parts:
                result[part] = measures[part](s, st)
        finally:
            s.close()
    finally:
        server.close()
    lines = report.peers_section({"engines": {"postgresql": {"peers": result}}})
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
