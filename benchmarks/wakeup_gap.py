"""The wake-up gap of a capped consumer, and the first hop, with the processes users deploy.

    python benchmarks/wakeup_gap.py                  # both engines, about 6 minutes on 2 cores
    python benchmarks/wakeup_gap.py --quick          # a smoke run, under a minute

Everything runs as users deploy it: ``assetq scheduler`` and ``assetq worker`` are processes
started from the command line with their default settings (the worker's handlers are
benchmarks/wakeup_handlers.py), and, on PostgreSQL, ``procrastinate worker`` beside them with
its defaults. This process only produces events (and defers jobs) and reads the clock.

The gap (issue 26, item 4). A consumer with ``max_active_runs=1`` and ``max_events_per_run=1``
gets a backlog of ``--backlog`` events in one transaction; its handler sleeps ``--sleeps``
seconds (0.5 s: the report's demo, 10 runs that must take about 10 x 0.5 s; and 0 s). The
gap is read from the database's own timestamps of the consecutive runs k, k+1: ``ended_at``
of run k (its completion, after the handler) to ``created_at`` of run k+1 (the pass that
made it: the wake-up's hop) and to ``started_at`` of run k+1 (its claim). The backlog's
total is from its commit to the last run's ``ended_at``.

The first hop (PostgreSQL): from a producer's COMMIT returning to the handler's first line:
assetq (``register_event`` of an asset whose consumer ``hop`` has no cap; on PostgreSQL the
worker, woken by the producer's notification, makes the run with a pass of its own and claims
it in the same statement, the scheduler giving it a head start; on MariaDB the scheduler's
pass makes it and the worker claims it) against procrastinate's defer-to-start (``defer`` of
a task; its worker fetches the job). Probes alternate between the two systems, one at a
time, 50-150 ms apart, so each finds its system idle but for the load. Both instants are
``time.time()`` (a handler's first line sends it to this process over UDP, before anything
else). The split of assetq's hop reads the run's ``created_at`` (the pass) and
``started_at`` (the claim), procrastinate's its job's ``started`` event: database
timestamps, on the same machine's clock. MariaDB's first hop is measured too (assetq alone:
procrastinate has no MySQL support), with fewer probes: its scheduler polls (``assetq
scheduler``'s default ``--poll-interval`` is 5 s; MySQL has no notifications), so it is
about half the poll interval by construction.

Load: *idle* (nothing else), and *flood*: a second producer process registering events
back to back at ``--flood-rate`` events/s (0: as fast as it can) on 4 other assets, each
with a consumer of its own (no cap, the worker's handler does nothing), and on PostgreSQL
deferring as many procrastinate jobs of another task, so that both schedulers and workers
have other work all along. The flood's backlog is counted at the end of each flood block (a
system that falls behind would measure its queue, not its wake-up) and drained before the
next idle block.

Repetitions: ``--repetitions`` rounds, each an idle block and a flood block (their order
alternates), each block all the gap trials and a share of the probes; figures are pooled
over the rounds (p50, p99: nearest rank; with fewer than 100 samples p99 is close to the
largest), and per round where a ratio or a total is shown: median (min-max) over rounds.
The machine is shared: read ratios and medians, not one absolute time.

Servers: PostgreSQL at ``--postgres`` (default postgres@127.0.0.1:5432), in a database
made for the run and dropped after; MariaDB/MySQL at ``--mysql`` (default
root@127.0.0.1:3306), in a namespace (database) made for the run and dropped after.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import itertools
import logging
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from benchmark_db import Server, make_server, pct

import assetq

HERE = Path(__file__).resolve().parent

FLOOD_CONSUMERS = 4
HOP = "hop"
IDLE, FLOOD = "idle", "flood"


def gap_dag(seconds: float) -> str:
    return f"gap_{round(seconds * 1000)}ms"


# -- statistics ----------------------------------------------------------------------------


def spread(values: Sequence[float], fmt: str = "{:,.1f}") -> str:
    if not values:
        return "-"
    text = fmt.format(statistics.median(values))
    if len(values) > 1:
        text += f" ({fmt.format(min(values))}-{fmt.format(max(values))})"
    return text


def _epoch(moment: datetime | None) -> float:
    if moment is None:
        raise RuntimeError("a run without the timestamp it should have")
    if moment.tzinfo is None:  # MySQL: naive UTC
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


# -- servers -------------------------------------------------------------------------------


def declare(server: Server, sleeps: Sequence[float]) -> dict[str, float]:
    """The consumers; returns what the worker's handlers do (dag id -> seconds)."""
    dags: dict[str, float] = {}
    with server.engine.begin() as conn:
        for seconds in sleeps:
            dag = gap_dag(seconds)
            assetq.declare_dag(
                conn, dag, dag, max_active_runs=1, max_events_per_run=1, namespace=server.namespace
            )
            dags[dag] = seconds
        assetq.declare_dag(conn, HOP, HOP, namespace=server.namespace)
        dags[HOP] = 0.0
        for i in range(FLOOD_CONSUMERS):
            assetq.declare_dag(conn, f"flood_{i}", f"flood_{i}", namespace=server.namespace)
            dags[f"flood_{i}"] = 0.0
    return dags


# -- the processes -------------------------------------------------------------------------


def _assetq_command() -> list[str]:
    script = Path(sys.executable).parent / "assetq"
    return [str(script)] if script.exists() else [sys.executable, "-m", "assetq"]


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def stop(self, timeout: float = 20) -> str:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        return self.log.read_text("utf-8", errors="replace")

    def check(self) -> None:
        if self.popen.poll() is not None:
            tail = self.log.read_text("utf-8", errors="replace")[-2000:]
            raise RuntimeError(f"{self.name} exited ({self.popen.returncode}):\n{tail}")


def start(name: str, argv: list[str], logdir: Path, env: dict[str, str]) -> Proc:
    log = logdir / f"{name}.log"
    with log.open("wb") as out:
        popen = subprocess.Popen(
            argv, cwd=HERE, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT
        )
    return Proc(name, popen, log)


class Reports:
    """The UDP socket the handlers' first lines report to."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.seen: dict[tuple[str, str], float] = {}

    def wait(self, system: str, key: str, timeout: float, procs: Sequence[Proc]) -> float:
        deadline = time.monotonic() + timeout
        while (system, key) not in self.seen:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                for proc in procs:
                    proc.check()
                raise RuntimeError(f"{system}: no handler ran for {key} in {timeout:g} s")
            self.sock.settimeout(min(remaining, 1.0))
            try:
                data = self.sock.recv(512).decode()
            except TimeoutError:
                for proc in procs:
                    proc.check()
                continue
            got_system, _dag, got_key, at = data.split()
            self.seen[(got_system, got_key)] = float(at)
        return self.seen.pop((system, key))

    def close(self) -> None:
        self.sock.close()


class Procrastinate:
    """procrastinate in the PostgreSQL database of the run (schema public): its schema, a
    producer and the tasks' names. None of it when procrastinate is not installed."""

    def __init__(self, server: Server) -> None:
        import psycopg

        # Imported by name: procrastinate is the bench extra's, not the test extra's, whose
        # mypy checks this file.
        procrastinate: Any = importlib.import_module("procrastinate")
        SchemaManager: Any = importlib.import_module("procrastinate.schema").SchemaManager

        # Its one warning: an App made in a script's main module (this one) is fine here.
        logging.getLogger("procrastinate.blueprints").setLevel(logging.ERROR)
        self.conninfo = server.libpq()
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            conn.execute(SchemaManager.get_schema())
        self.app = procrastinate.App(
            connector=procrastinate.SyncPsycopgConnector(conninfo=self.conninfo)
        )
        self.app.open()
        self.version = importlib.metadata.version("procrastinate")

    def defer(self, task: str, token: int) -> None:
        self.app.configure_task(task).defer(token=token)

    def started(self) -> dict[str, float]:
        """token -> the 'started' event's time of each hop job."""
        import psycopg

        with psycopg.connect(self.conninfo) as conn:
            rows = conn.execute(
                "SELECT j.args->>'token', e.at FROM procrastinate_jobs j"
                " JOIN procrastinate_events e ON e.job_id = j.id AND e.type = 'started'"
                " WHERE j.task_name = 'hop'"
            ).fetchall()
        return {str(token): _epoch(at) for token, at in rows}

    def backlog(self) -> int:
        import psycopg

        with psycopg.connect(self.conninfo) as conn:
            row = conn.execute(
                "SELECT count(*) FROM procrastinate_jobs WHERE status = 'todo'"
            ).fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        self.app.close()


def peer_installed() -> bool:
    return importlib.util.find_spec("procrastinate") is not None


# -- the flood producer (a process of its own) -------------------------------------------


def flood_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="wakeup_gap.py flood")
    parser.add_argument("--url", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--procrastinate", help="libpq string: defer as many jobs too")
    args = parser.parse_args(argv)
    stop = False

    def stopping(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, stopping)
    engine = sa.create_engine(args.url)
    app: Any = None
    if args.procrastinate:
        procrastinate: Any = importlib.import_module("procrastinate")  # the bench extra's

        # Its one warning: an App made in a script's main module (this one) is fine here.
        logging.getLogger("procrastinate.blueprints").setLevel(logging.ERROR)

        app = procrastinate.App(
            connector=procrastinate.SyncPsycopgConnector(conninfo=args.procrastinate)
        )
        app.open()
        deferrer = app.configure_task("flood")
    events = jobs = 0
    started = time.monotonic()
    with engine.connect() as conn:
        while not stop:
            assetq.register_event(
                conn, f"flood_{events % FLOOD_CONSUMERS}", namespace=args.namespace
            )
            conn.commit()
            events += 1
            if app is not None:
                deferrer.defer(token=jobs)
                jobs += 1
            if args.rate > 0:
                ahead = started + events / args.rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
    elapsed = time.monotonic() - started
    print(f"flood: {events} events, {jobs} jobs in {elapsed:.2f} s", flush=True)
    if app is not None:
        app.close()
    engine.dispose()
    return 0


# -- the measurements ----------------------------------------------------------------------


@dataclass
class GapTrial:
    engine: str
    load: str
    sleep: float
    round: int
    runs: int
    to_created_ms: list[float]
    to_started_ms: list[float]
    #: The first run's started_at to the last run's ended_at.
    total_s: float
    #: The backlog's commit to the first run's created_at (the first hop's pass).
    first_ms: float


@dataclass
class Probe:
    engine: str
    system: str
    load: str
    round: int
    key: str
    committed: float
    handler: float
    #: assetq: run created, run claimed; procrastinate: job started.
    marks: dict[str, float] = field(default_factory=dict)

    @property
    def ms(self) -> float:
        return (self.handler - self.committed) * 1000


@dataclass
class Block:
    engine: str
    load: str
    round: int
    flood_events_per_s: float | None = None
    flood_backlog: dict[str, int] = field(default_factory=dict)


def gap_trial(server: Server, seconds: float, backlog: int, load: str, round_: int) -> GapTrial:
    dag = gap_dag(seconds)
    ns = server.namespace
    with server.engine.connect() as conn:
        newest = assetq.runs(conn, dag, limit=1, namespace=ns)
        before = newest[0].seq if newest else 0
        assetq.register_events(conn, [assetq.NewEvent(asset=dag)] * backlog, namespace=ns)
        conn.commit()
        committed = time.time()
    deadline = time.monotonic() + backlog * (seconds + 10) + 30
    while True:
        with server.engine.connect() as conn:
            runs = [
                r for r in assetq.runs(conn, dag, limit=backlog, namespace=ns) if r.seq > before
            ]
        if len(runs) == backlog and all(r.state == "success" for r in runs):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"{dag}: {len(runs)} of {backlog} runs after the deadline")
        time.sleep(0.1)
    runs.sort(key=lambda r: r.seq)
    to_created, to_started = [], []
    for prev, run in itertools.pairwise(runs):
        end = _epoch(prev.ended_at)
        to_created.append((_epoch(run.created_at) - end) * 1000)
        to_started.append((_epoch(run.started_at) - end) * 1000)
    total = _epoch(runs[-1].ended_at) - _epoch(runs[0].started_at)
    first = (_epoch(runs[0].created_at) - committed) * 1000
    return GapTrial(
        server.name, load, seconds, round_, backlog, to_created, to_started, total, first
    )


def hop_probes(
    server: Server,
    peer: Procrastinate | None,
    reports: Reports,
    procs: Sequence[Proc],
    count: int,
    load: str,
    round_: int,
    token: Iterator[int],
    rng: random.Random,
) -> list[Probe]:
    """``count`` probes per system, alternating (which goes first alternates too)."""
    systems = ["assetq"] + (["procrastinate"] if peer is not None else [])
    probes: list[Probe] = []
    timeout = 60.0 if server.name == "postgresql" else 30.0
    with server.engine.connect() as conn:
        for i in range(count):
            order = systems if i % 2 == 0 else systems[::-1]
            for system in order:
                time.sleep(rng.uniform(0.05, 0.15))
                if system == "assetq":
                    event = assetq.register_event(conn, HOP, namespace=server.namespace)
                    conn.commit()
                    committed = time.time()
                    key = str(event.id)
                else:
                    assert peer is not None
                    key = str(next(token))
                    peer.defer("hop", int(key))
                    committed = time.time()
                handler = reports.wait(system, key, timeout, procs)
                probes.append(Probe(server.name, system, load, round_, key, committed, handler))
    return probes


def mark_probes(server: Server, peer: Procrastinate | None, probes: list[Probe]) -> None:
    """The database's timestamps of each probe's run (assetq) or job (procrastinate)."""
    with server.engine.connect() as conn:
        runs: list[Any] = []
        page = assetq.runs(conn, HOP, limit=1000, namespace=server.namespace)
        while page:
            runs += page
            page = assetq.runs(conn, HOP, limit=1000, before=page[-1], namespace=server.namespace)
    by_event = {str(r.triggering_event_id): r for r in runs}
    started = peer.started() if peer is not None else {}
    for probe in probes:
        if probe.system == "assetq":
            run = by_event.get(probe.key)
            if run is not None and run.event_count == 1:
                probe.marks["created"] = _epoch(run.created_at)
                probe.marks["claimed"] = _epoch(run.started_at)
        elif probe.key in started:
            probe.marks["started"] = started[probe.key]


def flood_backlog(server: Server, peer: Procrastinate | None) -> dict[str, int]:
    """What the flood left undone: assetq's queued events and runs of the flood consumers,
    procrastinate's jobs to do."""
    out: dict[str, int] = {}
    ns = server.namespace
    with server.engine.connect() as conn:
        out["assetq queued runs"] = sum(
            len(assetq.runs(conn, f"flood_{i}", state="queued", limit=10_000, namespace=ns))
            for i in range(FLOOD_CONSUMERS)
        )
    if peer is not None:
        out["procrastinate jobs to do"] = peer.backlog()
    return out


def drain(
    server: Server, peer: Procrastinate | None, procs: Sequence[Proc], timeout: float = 60
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = flood_backlog(server, peer)
        if not any(left.values()):
            return
        for proc in procs:
            proc.check()
        time.sleep(0.2)
    raise RuntimeError(f"the flood's backlog did not drain in {timeout:g} s: {left}")


@dataclass
class EngineResult:
    engine: str
    version: str
    gaps: list[GapTrial]
    probes: list[Probe]
    blocks: list[Block]
    counters: dict[str, str]
    peer_version: str | None


def measure_engine(
    engine_name: str,
    server_url: str,
    args: argparse.Namespace,
    figures: set[str],
) -> EngineResult:
    tag = f"{os.getpid()}_{engine_name[:2]}"
    server = make_server(engine_name, server_url, f"aqbench_wakeup_{tag}")
    logdir = Path(tempfile.mkdtemp(prefix="aqbench_wakeup_"))
    procs: list[Proc] = []
    peer: Procrastinate | None = None
    reports = Reports()
    rng = random.Random(args.seed)
    tokens = iter(range(1, 1 << 62))
    gaps: list[GapTrial] = []
    probes: list[Probe] = []
    blocks: list[Block] = []
    counters: dict[str, str] = {}
    try:
        dags = declare(server, args.sleeps)
        with_peer = (
            engine_name == "postgresql"
            and "hop" in figures
            and args.peer != "off"
            and peer_installed()
        )
        if with_peer:
            peer = Procrastinate(server)
        common = ["--url", server.cli_url, "--namespace", server.namespace]
        env = {
            "AQB_DAGS": ",".join(f"{dag}={s:g}" for dag, s in dags.items()),
            "AQB_REPORT": reports.address,
            "PYTHONUNBUFFERED": "1",
        }
        polling = (
            [] if args.scheduler_poll is None else ["--poll-interval", f"{args.scheduler_poll:g}"]
        )
        procs.append(
            start("scheduler", [*_assetq_command(), "scheduler", *common, *polling], logdir, env)
        )
        procs.append(
            start(
                "worker",
                [*_assetq_command(), "worker", *common, "--handlers", "wakeup_handlers:HANDLERS"],
                logdir,
                env,
            )
        )
        if peer is not None:
            procs.append(
                start(
                    "procrastinate",
                    [
                        sys.executable,
                        "-m",
                        "procrastinate",
                        "--app",
                        "wakeup_handlers.procrastinate_app",
                        "worker",
                    ],
                    logdir,
                    {**env, "AQB_PG": peer.conninfo},
                )
            )
        # Up and idle: one probe each, not counted (the MySQL scheduler may take a poll).
        hop_probes(server, peer, reports, procs, 1, "warm-up", -1, tokens, rng)
        hop_count = args.probes if engine_name == "postgresql" else args.mysql_probes
        for round_ in range(args.repetitions):
            loads = (IDLE, FLOOD) if round_ % 2 == 0 else (FLOOD, IDLE)
            for load in loads:
                block = Block(engine_name, load, round_)
                flood: Proc | None = None
                if load == FLOOD:
                    flood_argv = [
                        sys.executable,
                        str(HERE / "wakeup_gap.py"),
                        "flood",
                        "--url",
                        server.cli_url,
                        "--namespace",
                        server.namespace,
                        "--rate",
                        f"{args.flood_rate:g}",
                    ]
                    if peer is not None:
                        flood_argv += ["--procrastinate", peer.conninfo]
                    flood = start(f"flood_{round_}", flood_argv, logdir, {})
                    time.sleep(1.0)  # at its rate, the flood's runs and jobs flowing
                try:
                    if "gap" in figures:
                        for seconds in args.sleeps:
                            backlog = args.backlog if seconds else args.backlog_fast
                            trial = gap_trial(server, seconds, backlog, load, round_)
                            print(
                                f"{engine_name} {load} gap {seconds:g}s round {round_}:"
                                f" p50 {statistics.median(trial.to_started_ms):.1f} ms,"
                                f" total {trial.total_s:.2f} s",
                                file=sys.stderr,
                                flush=True,
                            )
                            gaps.append(trial)
                    if "hop" in figures and hop_count:
                        got = hop_probes(
                            server, peer, reports, procs, hop_count, load, round_, tokens, rng
                        )
                        probes += got
                        print(
                            f"{engine_name} {load} hop round {round_}: "
                            + ", ".join(f"{s} p50 {ms:.1f} ms" for s, ms in _p50s(got)),
                            file=sys.stderr,
                            flush=True,
                        )
                    if flood is not None:
                        block.flood_backlog = flood_backlog(server, peer)
                finally:
                    if flood is not None:
                        out = flood.stop()
                        found = re.search(r"flood: (\d+) events, (\d+) jobs in ([\d.]+) s", out)
                        if found:
                            block.flood_events_per_s = int(found[1]) / float(found[3])
                if flood is not None:
                    drain(server, peer, procs)
                blocks.append(block)
        mark_probes(server, peer, probes)
        for proc in procs:
            proc.check()
    finally:
        for proc in reversed(procs):
            text = proc.stop()
            last = [line for line in text.splitlines() if "stopped after" in line]
            if last:
                counters[proc.name] = last[-1].split(": ", 1)[-1] if ": " in last[-1] else last[-1]
        if peer is not None:
            peer.close()
        reports.close()
        server.drop()
        if not args.keep_logs:
            shutil.rmtree(logdir, ignore_errors=True)
        else:
            print(f"logs kept in {logdir}", file=sys.stderr)
    return EngineResult(
        engine_name,
        server.version,
        gaps,
        probes,
        blocks,
        counters,
        peer.version if peer is not None else None,
    )


def _p50s(probes: Sequence[Probe]) -> list[tuple[str, float]]:
    systems = sorted({p.system for p in probes})
    return [(s, statistics.median(p.ms for p in probes if p.system == s)) for s in systems]


# -- the tables ----------------------------------------------------------------------------


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def gap_table(results: Sequence[EngineResult], sleeps: Sequence[float]) -> list[str]:
    lines = [
        _row(
            [
                "engine",
                "load",
                "handler",
                "runs x rounds",
                "end -> next created, p50 / p99 ms",
                "end -> next started, p50 / p99 ms",
                "p50 per round, ms",
                "first run's start -> last run's end, s",
                "/ runs x handler",
                "commit -> first run created, ms",
            ]
        ),
        "|" + "|".join("---" for _ in range(10)) + "|",
    ]
    for result in results:
        for load in (IDLE, FLOOD):
            for seconds in sleeps:
                trials = [t for t in result.gaps if t.load == load and t.sleep == seconds]
                if not trials:
                    continue
                created = [g for t in trials for g in t.to_created_ms]
                started = [g for t in trials for g in t.to_started_ms]
                per_round = [statistics.median(t.to_started_ms) for t in trials]
                totals = [t.total_s for t in trials]
                ideal = (
                    spread([t.total_s / (t.runs * seconds) for t in trials], "{:.2f}x")
                    if seconds
                    else ""
                )
                lines.append(
                    _row(
                        [
                            result.version,
                            load,
                            f"{seconds:g} s",
                            f"{trials[0].runs} x {len(trials)}",
                            f"{pct(created, 0.5):,.1f} / {pct(created, 0.99):,.1f}",
                            f"{pct(started, 0.5):,.1f} / {pct(started, 0.99):,.1f}",
                            spread(per_round),
                            spread(totals, "{:,.2f}"),
                            ideal,
                            spread([t.first_ms for t in trials], "{:,.0f}"),
                        ]
                    )
                )
    return lines


def hop_table(results: Sequence[EngineResult]) -> list[str]:
    lines = [
        _row(
            [
                "engine",
                "load",
                "system",
                "probes",
                "p50 ms",
                "p99 ms",
                "max ms",
                "p50 per round, ms",
                "assetq / procrastinate, p50 per round",
                "p99 per round",
                "share: commit -> created / -> claimed / -> handler",
            ]
        ),
        "|" + "|".join("---" for _ in range(11)) + "|",
    ]
    for result in results:
        for load in (IDLE, FLOOD):
            mine = [p for p in result.probes if p.load == load]
            if not mine:
                continue
            rounds = sorted({p.round for p in mine})
            for system in ("assetq", "procrastinate"):
                these = [p for p in mine if p.system == system]
                if not these:
                    continue
                ms = [p.ms for p in these]
                per_round = [statistics.median(p.ms for p in these if p.round == r) for r in rounds]
                ratio50 = ratio99 = ""
                if system == "assetq" and any(p.system == "procrastinate" for p in mine):
                    r50, r99 = [], []
                    for r in rounds:
                        a = [p.ms for p in these if p.round == r]
                        b = [p.ms for p in mine if p.round == r and p.system == "procrastinate"]
                        r50.append(statistics.median(a) / statistics.median(b))
                        r99.append(pct(a, 0.99) / pct(b, 0.99))
                    ratio50, ratio99 = spread(r50, "{:.2f}x"), spread(r99, "{:.2f}x")
                lines.append(
                    _row(
                        [
                            result.version,
                            load,
                            system,
                            f"{len(these)}",
                            f"{pct(ms, 0.5):,.1f}",
                            f"{pct(ms, 0.99):,.1f}",
                            f"{max(ms):,.1f}",
                            spread(per_round),
                            ratio50,
                            ratio99,
                            _split(these),
                        ]
                    )
                )
    return lines


def _split(probes: Sequence[Probe]) -> str:
    """Median milliseconds of each stretch of the hop, from the database's timestamps."""
    if probes[0].system == "assetq":
        marked = [p for p in probes if "created" in p.marks]
        if not marked:
            return ""
        a = statistics.median((p.marks["created"] - p.committed) * 1000 for p in marked)
        b = statistics.median((p.marks["claimed"] - p.marks["created"]) * 1000 for p in marked)
        c = statistics.median((p.handler - p.marks["claimed"]) * 1000 for p in marked)
        return f"pass {a:.1f} / claim {b:.1f} / handler {c:.1f}"
    marked = [p for p in probes if "started" in p.marks]
    if not marked:
        return ""
    a = statistics.median((p.marks["started"] - p.committed) * 1000 for p in marked)
    c = statistics.median((p.handler - p.marks["started"]) * 1000 for p in marked)
    return f"fetch {a:.1f} / handler {c:.1f}"


def block_lines(results: Sequence[EngineResult]) -> list[str]:
    out = []
    for result in results:
        floods = [b for b in result.blocks if b.load == FLOOD]
        rates = [b.flood_events_per_s for b in floods if b.flood_events_per_s]
        left: dict[str, list[int]] = {}
        for b in floods:
            for k, v in b.flood_backlog.items():
                left.setdefault(k, []).append(v)
        text = f"- {result.version}: flood {spread(rates, '{:,.0f}')} events/s"
        if result.peer_version:
            text += " (and as many procrastinate jobs/s)"
        if left:
            text += "; left undone at the end of a flood block: " + ", ".join(
                f"{k} {spread([float(x) for x in v], '{:,.0f}')}" for k, v in left.items()
            )
        if result.counters:
            text += "; the processes at their stop: " + "; ".join(
                f"{name}: {line}" for name, line in result.counters.items()
            )
        out.append(text + ".")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["flood"]:
        return flood_main(argv[1:])
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", default="postgresql,mysql")
    parser.add_argument("--figures", default="gap,hop", help="gap, hop, or both")
    parser.add_argument("--repetitions", type=int, default=3, help="rounds (idle + flood each)")
    parser.add_argument("--backlog", type=int, default=10, help="events of the 0.5 s backlog")
    parser.add_argument(
        "--backlog-fast", type=int, default=30, help="events of the 0 s handler's backlog"
    )
    parser.add_argument(
        "--sleeps", default="0.5,0", help="the capped consumers' handler times, seconds"
    )
    parser.add_argument(
        "--probes",
        type=int,
        default=60,
        help="first-hop probes per system per block (PostgreSQL); 60: the p99 of 4 rounds of 30"
        " was the second-largest of 120 probes, one slow hop moved it",
    )
    parser.add_argument("--mysql-probes", type=int, default=4, help="the same on MySQL (it polls)")
    parser.add_argument(
        "--flood-rate",
        type=float,
        default=25,
        help="flood events/s (0: back to back); above what one default `assetq worker` completes"
        " (about 50-60 runs/s here) its queue grows and the gap measures that queue",
    )
    parser.add_argument("--peer", choices=("if-installed", "off"), default="if-installed")
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--mysql", default="mysql://root@127.0.0.1:3306")
    parser.add_argument("--seed", type=int, default=26)
    parser.add_argument("--keep-logs", action="store_true")
    parser.add_argument(
        "--scheduler-poll",
        type=float,
        help="give `assetq scheduler` this --poll-interval instead of its default (the smoke"
        " test's MySQL runs, which would wait for 5 s polls; never for a figure)",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 round, tiny")
    parser.add_argument(
        "--output",
        type=Path,
        help="also write the tables, with the command and the machine's load, to this Markdown"
        " file (docs/benchmarks.md includes docs/benchmarks/wakeup_gap.md)",
    )
    args = parser.parse_args(argv)
    command = " ".join(["python benchmarks/wakeup_gap.py", *argv])
    # SIGTERM as Ctrl-C: the processes started are stopped and the databases dropped.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    if args.quick:
        args.repetitions, args.backlog, args.backlog_fast = 1, 3, 3
        args.probes, args.mysql_probes, args.flood_rate = 3, 1, min(args.flood_rate or 50, 50)
    args.sleeps = [float(s) for s in str(args.sleeps).split(",")]
    if args.quick:
        args.sleeps = [min(s, 0.1) for s in args.sleeps]
    figures = set(args.figures.split(","))
    if not figures <= {"gap", "hop"}:
        parser.error(f"unknown figures {sorted(figures - {'gap', 'hop'})}")
    load_before = os.getloadavg()
    started = time.monotonic()
    results = []
    for name in args.engines.split(","):
        if name not in ("postgresql", "mysql"):
            parser.error(f"unknown engine {name!r}")
        url = args.postgres if name == "postgresql" else args.mysql
        results.append(measure_engine(name, url, args, figures))
    load_after = os.getloadavg()
    lines = render(results, args, figures)
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


def render(
    results: Sequence[EngineResult], args: argparse.Namespace, figures: set[str]
) -> list[str]:
    lines: list[str] = []
    rounds = args.repetitions
    if "gap" in figures:
        lines += [
            f"The gap: a consumer with max_active_runs=1, max_events_per_run=1 and a backlog of"
            f" {args.backlog} events (0 s handler: {args.backlog_fast}) committed in one"
            f" transaction; `assetq scheduler` and `assetq worker` with their defaults;"
            f" {rounds} rounds. From run k's ended_at to run k+1's created_at (the pass that"
            " the end woke) and started_at (its claim), the database's timestamps; the"
            " runs' total from the first run's started_at to the last one's ended_at, and that"
            " total over runs x handler time (1.00x: no gaps at all); and the backlog's commit"
            " to the first run's created_at (the first hop's pass, not a gap after a run).",
            "",
            *gap_table(results, args.sleeps),
            "",
        ]
    if "hop" in figures and any(r.probes for r in results):
        peer = next((r.peer_version for r in results if r.peer_version), None)
        lines += [
            "The first hop: a producer's COMMIT returning -> the handler's first line"
            f" (time.time() on both sides); {args.probes} probes per system per block on"
            f" PostgreSQL ({args.mysql_probes} on MariaDB: its scheduler polls), alternating"
            f" systems, 50-150 ms apart; {rounds} rounds."
            + (
                f" procrastinate {peer}: `procrastinate worker` with its defaults (LISTEN/NOTIFY,"
                " concurrency 1), `defer` of a task, in the same database."
                if peer
                else " procrastinate is not installed: its side is skipped."
                if any(r.engine == "postgresql" for r in results)
                else " procrastinate runs on PostgreSQL only."
            )
            + " The split: medians of commit -> the run's created_at (the worker woken by the"
            " producer's notification, its pass: PostgreSQL's one hop) -> its started_at (the"
            " claim, in the same statement) -> the handler's first line (the commit, the"
            " handler's call); procrastinate's job: commit -> its 'started' event (the worker"
            " woken, its fetch) -> the handler. The scheduler's own runs (after its head start,"
            " those no worker took; on MariaDB, all) are in the process counts below.",
            "",
            *hop_table(results),
            "",
        ]
    lines += [
        f"Flood: 1 producer process, {args.flood_rate:g} events/s target"
        f" ({'back to back' if not args.flood_rate else 'paced'}), {FLOOD_CONSUMERS} consumers"
        " without a cap, the worker's handler a no-op.",
        *block_lines(results),
    ]
    return lines


if __name__ == "__main__":
    sys.exit(main())
