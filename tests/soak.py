"""The chaos soak: producers, schedulers and workers as separate processes, started through
the command line as users deploy them, killed at random, restarted, then checked on the
database.

    python tests/soak.py --engines postgresql,mysql --events 10000 --kills 40 --seed 7
    make soak SOAK_ARGS="--events 10000 --kills 40"

Processes:

* producers: ``python tests/soak.py produce ...`` (:func:`produce_main`), each registering its
  share of the events one per transaction with ``assetq.register_event`` and an idempotency
  key of its own (``p<n>-<i>``), retrying a transient error with the same key, and appending
  the key to its acknowledgement log once the commit returned. A restarted producer resumes
  after the last key of its log, so the key that was in flight when it was killed is
  registered again with the same key;
* schedulers: ``assetq scheduler --url ... --namespace ...``;
* workers: ``assetq worker --url ... --handlers soak:HANDLERS --lease ...`` (run in this
  directory, so ``soak`` is importable). The handlers write one row to ``soak_effect`` in
  the transaction that completes the run; ``load``'s handler also returns an output event
  (``loaded``) that two consumers downstream get; the first attempt of one run in eight
  writes its row and then raises (a retried failure whose write must roll back).

Every consumer has ``max_attempts`` > 1 so killed attempts are retried; two have a
``max_active_runs`` cap, sampled by a thread of this process every few milliseconds while
everything runs.

Chaos: every ``--kill-interval`` seconds (0.5x to 1.5x, at random) one planned kill, until
``--kills`` kills were made and the producers are done. A kill is a SIGKILL of a producer,
scheduler or worker (restarted 0.1 to 1 s later), or a SIGSTOP of a worker that holds a
run, held until another worker has claimed that run (its lease expired: the stopped worker
is a zombie; thirty leases at most, a guard), then SIGCONT. One worker is stopped at a time,
and only for runs another worker can take over: a worker stopped with every run it holds in
its completion (sent, not committed: its open transaction locks the run, and claims skip
it) goes on at once, and the SIGSTOP is tried again (``taken back in a completion`` in the
final line). The plan (kinds, roles, intervals) comes from ``--seed``, printed; what the
processes are doing at each kill does not.

Failover (``--failover patroni``, PostgreSQL): the database is a throw-away Patroni cluster
(tests/patroni_cluster.py: etcd and three PostgreSQL nodes, synchronous mode) reached through a
libpq multi-host URL with ``target_session_attrs=read-write``, and besides the kills the plan
has ``--failovers`` (1 by default) ``kill -9`` of the leader's postmaster: Patroni promotes
the synchronous standby by itself and rejoins the old leader as a replica, while the kills go
on. A failover is made once the cluster is healthy again after the one before.

Then the chaos stops, every process runs undisturbed, and the soak waits (up to
``--drain-timeout``) until every run is final and no consumer's queued events satisfy its
condition. The checks are on the database, read in one snapshot:

* lost: an acknowledged key without its event, a planned key never registered, a (consumer,
  event) pair that should exist but is neither linked nor still queued (only events that
  cannot satisfy an AND yet may stay queued);
* duplicated: an idempotency key with two events, a (consumer, event) linked twice, a link
  to a consumer that does not subscribe to the event's asset, a run without events;
* double effects: a run with two effect rows; wrong effects: a success without its row, or
  a row of another attempt or worker than the one that succeeded, or of a run that did not
  succeed; outputs wrong: a ``load`` success without exactly one ``loaded`` event of its
  own, or any other run with one;
* over cap: samples that saw a capped consumer with more queued + running runs than its cap;
* stalled: runs not final and consumers whose queue satisfies their condition at the drain
  deadline; failed: runs that failed for good (each has 25 attempts; the handlers' own
  failures are first attempts only).

One final line per engine gives the counts; the exit status is 1 when any of them is not 0.
The short version runs in the default suite (tests/test_soak.py), the long one with
``pytest -m slow``.
"""

from __future__ import annotations

import argparse
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa

import assetq
from assetq.dialects import dialect_for

HERE = Path(__file__).resolve().parent
_T = TypeVar("_T")

# -- the topology --------------------------------------------------------------------------

#: Assets the producers register events of, and the one ``load`` outputs.
SOURCES = ("src_a", "src_b")
OUTPUT = "loaded"
MAX_ATTEMPTS = 25

#: consumer -> (condition, max_active_runs)
CONSUMERS: dict[str, tuple[assetq.Condition, int | None]] = {
    "load": ("src_a", None),
    "join": (assetq.all_of("src_a", "src_b"), 1),
    "either": (assetq.any_of("src_b", OUTPUT), None),
    "report": (OUTPUT, 2),
}
SUBSCRIBERS: dict[str, tuple[str, ...]] = {
    "src_a": ("load", "join"),
    "src_b": ("join", "either"),
    OUTPUT: ("either", "report"),
}

EFFECT_TABLE = "soak_effect"
_CREATE_EFFECT = (
    f"CREATE TABLE {EFFECT_TABLE} (dag_id varchar(250) NOT NULL, run_id varchar(250) NOT NULL,"
    " attempt integer NOT NULL, worker varchar(250) NOT NULL)"
)
_WRITE_EFFECT = sa.text(
    f"INSERT INTO {EFFECT_TABLE} (dag_id, run_id, attempt, worker)"
    " VALUES (:dag_id, :run_id, :attempt, :worker)"
)


def condition_holds(dag_id: str, assets: set[str]) -> bool:
    """Whether consumer ``dag_id``'s condition holds on queued events of ``assets``."""
    condition = CONSUMERS[dag_id][0]
    if isinstance(condition, str):
        return condition in assets
    if isinstance(condition, assetq.AllOf):
        return all(item in assets for item in condition.items)
    assert isinstance(condition, assetq.AnyOf)
    return any(item in assets for item in condition.items)


# -- the handlers (imported by `assetq worker --handlers soak:HANDLERS`) ---------------------


def _flaky(claim: assetq.Claim) -> bool:
    """The first attempt of one run in eight fails after writing its effect."""
    return claim.attempt == 1 and zlib.crc32(f"{claim.dag_id}/{claim.run_id}".encode()) % 8 == 0


def _handler(pause: tuple[float, float], outputs: bool) -> Callable[..., Any]:
    def handle(claim: assetq.Claim, conn: sa.Connection) -> list[assetq.NewEvent] | None:
        conn.execute(
            _WRITE_EFFECT,
            {
                "dag_id": claim.dag_id,
                "run_id": claim.run_id,
                "attempt": claim.attempt,
                "worker": claim.worker,
            },
        )
        claim.cancelled.wait(random.uniform(*pause))  # work: a kill finds runs held
        if _flaky(claim):
            raise RuntimeError("soak: a first attempt that fails after its write")
        return [assetq.NewEvent(OUTPUT)] if outputs else None

    return handle


HANDLERS = {
    "load": _handler((0.0, 0.03), outputs=True),
    "join": _handler((0.0, 0.05), outputs=False),
    "either": _handler((0.0, 0.03), outputs=False),
    # Slow on purpose: a SIGSTOP finds a worker holding a run of it.
    "report": _handler((0.2, 0.5), outputs=False),
}


# -- producers -----------------------------------------------------------------------------


def event_key(producer: int, index: int) -> str:
    return f"p{producer}-{index}"


def event_asset(seed: int, producer: int, index: int) -> str:
    """The asset of a producer's event ``index``: the same in every incarnation."""
    return random.Random(f"{seed}/{producer}/{index}").choice(SOURCES)


def acknowledged(log: Path) -> list[str]:
    """The keys of a producer's acknowledgement log (a torn last line is not one)."""
    if not log.exists():
        return []
    text = log.read_text()
    lines = text.split("\n")
    return [line for line in lines[:-1] if line]  # the part after the last newline is torn


def is_transient(engine: sa.Engine, exc: BaseException) -> bool:
    """A deadlock, lock timeout or lost connection: the transaction is gone, retry it."""
    if isinstance(exc, assetq.TransientError):
        return True
    if not isinstance(exc, sa.exc.DBAPIError):
        return False
    if exc.connection_invalidated:
        return True
    try:
        with engine.connect() as conn:
            dialect = dialect_for(conn)
    except sa.exc.DBAPIError:
        return True  # no server answers (a failover under way): the connection failed
    return isinstance(dialect.translate(exc), assetq.TransientError)


def produce_main(argv: Sequence[str]) -> int:
    """``soak.py produce``: register events ``--first`` .. ``--events``-1 of producer ``--n``,
    resuming after the last key of ``--log``."""
    parser = argparse.ArgumentParser(prog="soak.py produce")
    parser.add_argument("--url", required=True)
    parser.add_argument("--namespace", default="assetq")
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--events", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--rate", type=float, default=0.0, help="events/s (0: unpaced)")
    parser.add_argument("--log", type=Path, required=True)
    args = parser.parse_args(argv)
    from assetq.cli import database_url

    done = acknowledged(args.log)
    start = int(done[-1].rsplit("-", 1)[1]) + 1 if done else 0
    engine = sa.create_engine(database_url(args.url), pool_size=1)
    began = time.monotonic()
    with open(args.log, "a") as log:
        for index in range(start, args.events):
            if args.rate > 0:
                delay = began + (index - start) / args.rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            key = event_key(args.n, index)
            asset = event_asset(args.seed, args.n, index)
            while True:
                try:
                    with engine.begin() as conn:
                        assetq.register_event(
                            conn, asset, idempotency_key=key, namespace=args.namespace
                        )
                    break
                except Exception as exc:
                    if not is_transient(engine, exc):
                        raise
                    time.sleep(0.05)  # the same key again: a retry creates no second event
            log.write(key + "\n")
            log.flush()
    engine.dispose()
    return 0


# -- the orchestrator ----------------------------------------------------------------------


@dataclass
class Config:
    events: int = 300
    producers: int = 2
    schedulers: int = 2
    workers: int = 2
    concurrency: int = 2
    #: events/s of each producer (0: as fast as it can)
    rate: float = 10.0
    kills: int = 6
    #: share of the kills that are SIGSTOP zombies (at least one)
    zombie_ratio: float = 0.15
    #: mean seconds between two kills (None: the producers' planned time / (1.5 kills + 1))
    kill_interval: float | None = None
    lease: float = 3.0
    seed: int = 1
    drain_timeout: float = 180.0
    #: the chaos stops after this many seconds whatever was done (a guard, not a check)
    deadline: float = 3600.0
    #: failovers of the database besides the kills (needs a Soak with a failover)
    failovers: int = 0


@dataclass
class Report:
    engine: str
    seed: int
    #: the server's version() (PostgreSQL's up to its platform)
    server: str = ""
    events: int = 0
    planned: int = 0
    acknowledged: int = 0
    runs: int = 0
    attempts: int = 0
    pairs: int = 0
    sigkill: Counter[str] = field(default_factory=Counter)
    #: SIGSTOPs of a worker holding runs another worker can take over; zombies: those whose
    #: runs another worker took over before the SIGCONT (the others, whose completion was on
    #: its way when they stopped, are made again: the plan's zombies are real ones)
    sigstops: int = 0
    zombies: int = 0
    #: SIGSTOPs taken back at once (not counted in sigstops): every run the stopped worker
    #: held was locked by its completion, sent but not committed (Soak.kill says why)
    stops_undone: int = 0
    #: seconds from each zombie's SIGSTOP to the takeover of its runs
    takeovers: list[float] = field(default_factory=list)
    restarts: int = 0
    failovers: int = 0
    unexpected_exits: int = 0
    lost: int = 0
    duplicated: int = 0
    double_effects: int = 0
    wrong_effects: int = 0
    outputs_wrong: int = 0
    over_cap: int = 0
    cap_samples: int = 0
    stalled: int = 0
    failed: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def kills(self) -> int:
        return sum(self.sigkill.values()) + self.zombies

    @property
    def ok(self) -> bool:
        return not (
            self.lost
            or self.duplicated
            or self.double_effects
            or self.wrong_effects
            or self.outputs_wrong
            or self.over_cap
            or self.stalled
            or self.failed
            or self.unexpected_exits
            or self.events != self.planned
        )

    def line(self) -> str:
        killed = " ".join(f"{role}={self.sigkill[role]}" for role in ROLES)
        return (
            f"soak {self.engine} ({self.server}): seed={self.seed}"
            f" events={self.events}/{self.planned}"
            f" acknowledged={self.acknowledged} pairs={self.pairs} runs={self.runs}"
            f" attempts={self.attempts} kills={self.kills} (sigkill {killed};"
            f" sigstop={self.sigstops}, of them zombies taken over={self.zombies};"
            f" taken back in a completion={self.stops_undone})"
            f" failovers={self.failovers}"
            f" restarts={self.restarts} unexpected exits={self.unexpected_exits}"
            f" lost={self.lost} duplicated={self.duplicated}"
            f" double effects={self.double_effects} wrong effects={self.wrong_effects}"
            f" outputs wrong={self.outputs_wrong} over cap={self.over_cap}"
            f" (of {self.cap_samples} samples) stalled={self.stalled} failed={self.failed}"
            f" seconds={self.seconds:.0f}"
        )


ROLES = ("producer", "scheduler", "worker")

#: A zombie is released after this many leases even if its runs were not taken over (a guard:
#: it is then no zombie, and its SIGSTOP is made again). Not one or two: a run whose lease
#: expired is claimed in not_before order, behind every run queued before its lease ended, so
#: under a backlog its takeover waits for the backlog (the long soaks, a 4 s lease: up to
#: 63 s on PostgreSQL 15, 45 s on MariaDB 10.11).
GUARD_LEASES = 30


@dataclass
class Proc:
    role: str
    n: int
    incarnation: int = 0
    popen: subprocess.Popen[bytes] | None = None
    #: running, stopped (SIGSTOP), killed (waiting for its restart), done (a producer)
    state: str = "new"
    restart_at: float = 0.0
    #: a zombie: (stopped at, released at the latest, the runs it held that another worker
    #: can take over: (dag_id, run_id, attempt))
    stopped_at: float = 0.0
    stopped_until: float = 0.0
    held: list[tuple[str, str, int]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.role[0]}{self.n}.{self.incarnation}"


def _command_line() -> list[str]:
    """How to run the assetq command: the script beside this interpreter, as installed."""
    script = Path(sys.executable).with_name("assetq")
    return [str(script)] if script.exists() else [sys.executable, "-m", "assetq"]


#: A failover of the database the soak runs on: made in a thread of its own, it returns once
#: the database is healthy again, with a line for the report's notes.
Failover = Callable[[], str]


class Soak:
    def __init__(
        self,
        url: str,
        namespace: str,
        config: Config,
        workdir: Path,
        engine: str,
        failover: Failover | None = None,
    ):
        if config.failovers and failover is None:
            raise ValueError("failovers planned on a database that cannot fail over")
        self.failover = failover
        self._failing_over: threading.Thread | None = None
        self._failover_errors: list[BaseException] = []
        self.url = url
        self.namespace = namespace
        self.config = config
        self.workdir = workdir
        self.report = Report(engine=engine, seed=config.seed)
        self.rng = random.Random(config.seed)
        from assetq.cli import database_url

        self.engine = sa.create_engine(database_url(url), pool_size=3, pool_pre_ping=True)
        with self.engine.connect() as conn:
            self.ns = dialect_for(conn).quote_ns(namespace)
            version = str(conn.execute(sa.text("SELECT version()")).scalar_one())
        self.report.server = version.split(" on ")[0].split(",")[0]
        self.procs = (
            [Proc("producer", n) for n in range(config.producers)]
            + [Proc("scheduler", n) for n in range(config.schedulers)]
            + [Proc("worker", n) for n in range(config.workers)]
        )
        self.per_producer = [
            config.events // config.producers + (1 if n < config.events % config.producers else 0)
            for n in range(config.producers)
        ]
        self.plan_left: list[tuple[str, str]] = []
        self._sampling = threading.Event()
        self._sample_errors: list[BaseException] = []

    def q(self, statement: str) -> sa.TextClause:
        return sa.text(statement.replace("{ns}", self.ns))

    # -- setup and processes --

    def setup(self) -> None:
        with self.engine.begin() as conn:
            conn.execute(sa.text(_CREATE_EFFECT))
            for dag_id, (condition, cap) in CONSUMERS.items():
                assetq.declare_dag(
                    conn,
                    dag_id,
                    condition,
                    max_active_runs=cap,
                    max_attempts=MAX_ATTEMPTS,
                    namespace=self.namespace,
                )

    def log_of(self, proc: Proc) -> Path:
        return self.workdir / f"producer-{proc.n}.acks"

    def argv(self, proc: Proc) -> list[str]:
        common = ["--url", self.url, "--namespace", self.namespace]
        if proc.role == "producer":
            return [
                sys.executable,
                str(HERE / "soak.py"),
                "produce",
                *common,
                "--n",
                str(proc.n),
                "--events",
                str(self.per_producer[proc.n]),
                "--seed",
                str(self.config.seed),
                "--rate",
                str(self.config.rate),
                "--log",
                str(self.log_of(proc)),
            ]
        if proc.role == "scheduler":
            return [*_command_line(), "scheduler", *common, "--poll-interval", "0.5"]
        return [
            *_command_line(),
            "worker",
            *common,
            "--handlers",
            "soak:HANDLERS",
            "--concurrency",
            str(self.config.concurrency),
            "--lease",
            f"{self.config.lease:g}s",
            "--poll-interval",
            "0.2",
            "--worker-id",
            proc.name,
        ]

    def start(self, proc: Proc) -> None:
        proc.incarnation += 1
        out = open(self.workdir / f"{proc.name}.log", "wb")  # noqa: SIM115 (the child's)
        proc.popen = subprocess.Popen(
            self.argv(proc), cwd=HERE, stdout=out, stderr=subprocess.STDOUT, stdin=None
        )
        out.close()
        proc.state = "running"

    def signal(self, proc: Proc, sig: signal.Signals) -> None:
        assert proc.popen is not None
        proc.popen.send_signal(sig)

    def live(self, role: str | None = None) -> list[Proc]:
        return [p for p in self.procs if p.state == "running" and role in (None, p.role)]

    def reading(self, read: Callable[[], _T]) -> _T:
        """``read()``, tried again while no server answers: during a failover the soak's own
        reads fail as the processes' do (a guard of two minutes, then the error)."""
        give_up = time.monotonic() + 120
        while True:
            try:
                return read()
            except sa.exc.DBAPIError:
                if self.failover is None or time.monotonic() > give_up:
                    raise
                time.sleep(0.2)

    def held_runs(self) -> dict[str, list[tuple[str, str, int]]]:
        """Running runs by the worker that holds them."""
        return self.reading(self._held_runs)

    def _held_runs(self) -> dict[str, list[tuple[str, str, int]]]:
        held: dict[str, list[tuple[str, str, int]]] = {}
        with self.engine.connect() as conn:
            for worker, dag_id, run_id, attempt in conn.execute(
                self.q(
                    "SELECT worker, dag_id, run_id, attempt FROM {ns}.dag_run"
                    " WHERE state = 'running'"
                )
            ):
                # A slot's claims name the worker and the slot: w0.1#2.
                process = str(worker).split("#", 1)[0]
                held.setdefault(process, []).append((str(dag_id), str(run_id), int(attempt)))
        return held

    def locked(self, run: tuple[str, str, int]) -> bool:
        """Whether run ``run``'s row is locked by a transaction that stays open: two reads
        (``FOR UPDATE SKIP LOCKED``, by key) 50 ms apart both skip it. A stopped worker's
        completion holds it so; a heartbeat's or a claim's lock is gone by the second read."""
        return self.reading(lambda: self._locked(run))

    def _locked(self, run: tuple[str, str, int]) -> bool:
        dag_id, run_id, _ = run
        with self.engine.connect() as conn:
            pk = conn.execute(
                self.q("SELECT id FROM {ns}.dag_run WHERE dag_id = :d AND run_id = :r"),
                {"d": dag_id, "r": run_id},
            ).scalar_one()
            conn.rollback()
            for probe in range(2):
                if probe:
                    time.sleep(0.05)
                with conn.begin():
                    free = conn.execute(
                        self.q("SELECT id FROM {ns}.dag_run WHERE id = :id FOR UPDATE SKIP LOCKED"),
                        {"id": pk},
                    ).first()
                    conn.rollback()
                if free is not None:
                    return False
        return True

    def taken_over(self, held: list[tuple[str, str, int]]) -> tuple[bool, bool]:
        """(every run the zombie held is settled: at a later attempt, or finished by the
        zombie's own completion that was on its way when it stopped; at least one of them
        is at a later attempt: another worker took it over)."""
        return self.reading(lambda: self._taken_over(held))

    def _taken_over(self, held: list[tuple[str, str, int]]) -> tuple[bool, bool]:
        settled, later = True, False
        with self.engine.connect() as conn:
            for dag_id, run_id, attempt in held:
                now_at, state = conn.execute(
                    self.q(
                        "SELECT attempt, state FROM {ns}.dag_run WHERE dag_id = :d AND run_id = :r"
                    ),
                    {"d": dag_id, "r": run_id},
                ).one()
                later = later or int(now_at) > attempt
                settled = settled and (int(now_at) > attempt or state != "running")
        return settled, later

    # -- the cap sampler --

    def sample_caps(self) -> None:
        capped = {dag_id: cap for dag_id, (_, cap) in CONSUMERS.items() if cap is not None}
        statement = self.q(
            "SELECT dag_id, count(*) FROM {ns}.dag_run WHERE state IN ('queued', 'running')"
            " GROUP BY dag_id"
        )

        def sample() -> None:
            with self.engine.connect() as conn:
                while self._sampling.is_set():
                    with conn.begin():
                        counts = {str(d): int(n) for d, n in conn.execute(statement)}
                    self.report.cap_samples += 1
                    for dag_id, cap in capped.items():
                        if counts.get(dag_id, 0) > cap:
                            self.report.over_cap += 1
                            self.report.notes.append(
                                f"over cap: {dag_id} had {counts[dag_id]} active runs (cap {cap})"
                            )
                    time.sleep(0.01)

        try:
            while self._sampling.is_set():
                self.reading(sample)  # a connection lost to a failover: a new one
        except BaseException as exc:
            self._sample_errors.append(exc)

    # -- the chaos --

    def plan(self) -> list[tuple[str, str]]:
        """(kind, role) of every kill, in order: the seed decides."""
        zombies = max(1, round(self.config.kills * self.config.zombie_ratio))
        kinds = ["sigstop"] * zombies + ["sigkill"] * max(0, self.config.kills - zombies)
        self.rng.shuffle(kinds)
        # One zombie early, while the producers still make work for the workers to hold.
        kinds.remove("sigstop")
        kinds.insert(min(1, len(kinds)), "sigstop")
        # SIGKILLs go round the roles, each round in an order of its own: a short plan
        # kills every role too.
        roles: list[str] = []
        plan = []
        for kind in kinds:
            if kind == "sigstop":
                plan.append((kind, "worker"))
                continue
            if not roles:
                roles = self.rng.sample(ROLES, len(ROLES))
            plan.append((kind, roles.pop()))
        # Failovers spread over the plan, away from its ends (producers still at work).
        for n in range(self.config.failovers):
            plan.insert((n + 1) * len(plan) // (self.config.failovers + 1), ("failover", "leader"))
        return plan

    def reap(self, now: float) -> None:
        """Restart the killed processes whose time has come; notice the ones that exited."""
        for proc in self.procs:
            if proc.state == "killed" and now >= proc.restart_at:
                assert proc.popen is not None
                proc.popen.wait()
                self.report.restarts += 1
                self.start(proc)
            elif proc.state == "running":
                assert proc.popen is not None
                code = proc.popen.poll()
                if code is None:
                    continue
                if proc.role == "producer" and code == 0:
                    proc.state = "done"
                    continue
                self.report.unexpected_exits += 1
                self.report.notes.append(
                    f"{proc.name} exited by itself with {code}: "
                    + self.tail(self.workdir / f"{proc.name}.log")
                )
                self.start(proc)

    def release(self, proc: Proc, now: float) -> bool:
        """SIGCONT a zombie whose runs were taken over, or whose time is up."""
        settled, later = self.taken_over(proc.held)
        if settled or now >= proc.stopped_until:
            self.signal(proc, signal.SIGCONT)
            proc.state = "running"
            if later:
                self.report.zombies += 1
                self.report.takeovers.append(now - proc.stopped_at)
            else:
                # Not a zombie: once more, next, while the producers still make work.
                self.plan_left.insert(0, ("sigstop", "worker"))
                why = (
                    "its own completion, on its way when it stopped, finished its runs"
                    if settled
                    else f"nobody took its runs over in {GUARD_LEASES} leases"
                )
                self.report.notes.append(f"{proc.name}'s SIGSTOP made no zombie: {why}")
            return True
        return False

    def failing_over(self) -> bool:
        thread = self._failing_over
        return thread is not None and thread.is_alive()

    def _fail_over(self) -> None:
        assert self.failover is not None
        began = time.monotonic()
        try:
            note = self.failover()
        except BaseException as error:  # reported by run(), after the processes stopped
            self._failover_errors.append(error)
            return
        self.report.notes.append(f"{note} ({time.monotonic() - began:.1f} s)")

    def kill(self, kind: str, role: str) -> bool:
        """One planned kill; False when it cannot be made now (try again soon)."""
        if kind == "failover":
            if self.failing_over():
                return False
            self._failing_over = threading.Thread(
                target=self._fail_over, name="failover", daemon=True
            )
            self._failing_over.start()
            self.report.failovers += 1
            return True
        if kind == "sigkill":
            candidates = self.live(role) or self.live()
            if not candidates:
                return False
            proc = self.rng.choice(candidates)
            self.signal(proc, signal.SIGKILL)
            proc.state = "killed"
            proc.restart_at = time.monotonic() + self.rng.uniform(0.1, 1.0)
            self.report.sigkill[proc.role] += 1
            return True
        if len(self.live("worker")) < 2:
            return False  # someone must be left to take its runs over
        if any(p.state == "stopped" for p in self.procs):
            # One at a time: two stopped of three workers left one to take both over and to
            # do all the work, the backlog grew, and takeovers came later than the guard.
            return False
        held = self.held_runs()
        # A worker in report's slow handler, if any: one stopped in a short handler's
        # completion has often sent its COMMIT already, and is no zombie.
        candidates = [
            p
            for p in self.live("worker")
            if any(dag_id == "report" for dag_id, _, _ in held.get(p.name, []))
        ] or [p for p in self.live("worker") if held.get(p.name)]
        if not candidates:
            return False
        proc = self.rng.choice(candidates)
        self.signal(proc, signal.SIGSTOP)
        # What it holds now that it is stopped: a completion it sent just before is in.
        held = self.held_runs().get(proc.name, [])
        # Only runs another worker can take over: a run whose completion the worker had sent,
        # its COMMIT not yet, is locked by the worker's open transaction, and every claim
        # skips it (SKIP LOCKED) until the worker goes on and commits its success
        # (test_a_completion_not_yet_committed_keeps_its_run_past_the_lease_until_it_ends).
        # Short handlers spend most of an attempt there: stopped with only such runs, the
        # worker was no zombie (released by the guard, 10 leases then), and its SIGSTOP was
        # made again and again until the producers were done (issue 28). It goes on at once.
        proc.held = [run for run in held if not self.locked(run)]
        if not proc.held:
            self.signal(proc, signal.SIGCONT)
            if held:
                self.report.stops_undone += 1
            return False
        proc.state = "stopped"
        # Released once another worker took its runs over; the limit is only a guard.
        proc.stopped_at = time.monotonic()
        proc.stopped_until = proc.stopped_at + GUARD_LEASES * self.config.lease
        self.report.sigstops += 1
        return True

    @property
    def interval(self) -> float:
        """Mean seconds between two kills: --kill-interval, or by default the producers'
        planned time spread over the kills and half as many again (with paced producers)."""
        if self.config.kill_interval is not None:
            return self.config.kill_interval
        if self.config.rate > 0:
            seconds = max(self.per_producer) / self.config.rate
            # The plan ends at about two thirds of the production: a SIGSTOP needs runs held.
            return max(0.2, seconds / (1.5 * self.config.kills + 1))
        return 1.0

    def progress(self, kills_left: int) -> None:
        acked = sum(len(acknowledged(self.log_of(p))) for p in self.procs if p.role == "producer")
        print(
            f"soak {self.report.engine}: {acked}/{self.config.events} events acknowledged,"
            f" {self.report.kills} kills made, {kills_left} to go, states "
            + " ".join(f"{p.name}:{p.state}" for p in self.procs),
            file=sys.stderr,
            flush=True,
        )

    def producers_done(self) -> bool:
        return all(p.state == "done" for p in self.procs if p.role == "producer")

    def chaos(self) -> None:
        plan = self.plan_left = self.plan()
        started = time.monotonic()
        next_at = started + self.rng.uniform(0.5, 1.5) * self.interval
        progress_at = started + 15
        made_at = started
        #: with the producers done, how long a kill that cannot be made is waited for: a
        #: SIGSTOP needs a worker holding a run, and the backlog may be gone
        patience = max(30.0, 5 * self.config.lease)
        while time.monotonic() < started + self.config.deadline:
            now = time.monotonic()
            self.reap(now)
            for proc in self.procs:
                if proc.state == "stopped":
                    self.release(proc, now)
            if plan and now >= next_at:
                # The next kill that can be made now: a SIGSTOP waits for a worker holding a
                # run, and must not hold the SIGKILLs back meanwhile.
                made = next((i for i, item in enumerate(plan) if self.kill(*item)), None)
                if made is not None:
                    plan.pop(made)
                    made_at = now
                    next_at = now + self.rng.uniform(0.5, 1.5) * self.interval
                else:
                    next_at = now + 0.1
            if now >= progress_at:
                progress_at = now + 15
                self.progress(len(plan))
            stopped = any(p.state == "stopped" for p in self.procs)
            if not plan and self.producers_done() and not stopped:
                break
            if plan and self.producers_done() and not stopped and now > made_at + patience:
                self.report.notes.append(
                    f"{len(plan)} kills not made ({', '.join(k for k, _ in plan)}): none could"
                    f" be made for {patience:g}s after the producers were done"
                )
                break
            time.sleep(0.02)
        else:
            self.report.notes.append(
                f"the chaos stopped at its deadline ({self.config.deadline:g}s) with"
                f" {len(plan)} kills left"
            )
        if self.report.takeovers:
            self.report.notes.append(
                f"zombies taken over {min(self.report.takeovers):.1f} to"
                f" {max(self.report.takeovers):.1f} s after their SIGSTOP"
                f" (lease {self.config.lease:g} s)"
            )

    # -- drain and verify --

    def stalled(self) -> tuple[int, int]:
        """(runs not final, consumers whose queued events satisfy their condition), both read
        in one snapshot (REPEATABLE READ): read one after the other, a pass that made a run of
        the last queued events in between was seen as neither (no run yet, no queue left),
        and the drain ended with that run still queued (stalled=1 at the checks; CI saw it)."""
        return self.reading(self._stalled)

    def _stalled(self) -> tuple[int, int]:
        with self.engine.connect() as plain:
            conn = plain.execution_options(isolation_level="REPEATABLE READ")
            conn.begin()
            active = conn.execute(
                self.q("SELECT count(*) FROM {ns}.dag_run WHERE state IN ('queued', 'running')")
            ).scalar_one()
            queued: dict[str, set[str]] = {}
            for dag_id, asset in conn.execute(
                self.q(
                    "SELECT DISTINCT q.target_dag_id, a.name FROM {ns}.asset_dag_run_queue q"
                    " JOIN {ns}.asset a ON a.id = q.asset_id"
                )
            ):
                queued.setdefault(str(dag_id), set()).add(str(asset))
            conn.rollback()
        ready = sum(1 for dag_id, assets in queued.items() if condition_holds(dag_id, assets))
        return int(active), ready

    def drain(self) -> None:
        """Every process runs undisturbed until nothing is left to do, or the deadline."""
        if self._failing_over is not None:
            self._failing_over.join(self.config.drain_timeout)
        for proc in self.procs:
            if proc.state == "stopped":
                self.signal(proc, signal.SIGCONT)
                proc.state = "running"
        deadline = time.monotonic() + self.config.drain_timeout
        while True:
            now = time.monotonic()
            for proc in self.procs:
                if proc.state == "killed":
                    proc.restart_at = now
            self.reap(now)
            active, ready = self.stalled()
            if (active, ready) == (0, 0) and self.producers_done():
                return
            if now >= deadline:
                self.report.stalled = active + ready
                self.report.notes.append(
                    f"not drained after {self.config.drain_timeout:g}s: {active} runs not final,"
                    f" {ready} consumers with a satisfiable queue"
                )
                return
            time.sleep(0.25)

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.popen is not None and proc.popen.poll() is None:
                if proc.state == "stopped":
                    self.signal(proc, signal.SIGCONT)
                self.signal(proc, signal.SIGTERM)
        for proc in self.procs:
            if proc.popen is None:
                continue
            try:
                proc.popen.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait()

    @staticmethod
    def tail(path: Path, lines: int = 5) -> str:
        try:
            return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def verify(self) -> None:
        r = self.report
        # One snapshot for all the reads (nothing runs any more, but say so anyway).
        with self.engine.connect() as raw:
            conn = raw.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin():
                events = [
                    (int(i), str(a), k, sd, sr)
                    for i, a, k, sd, sr in conn.execute(
                        self.q(
                            "SELECT e.id, a.name, e.idempotency_key, e.source_dag_id,"
                            " e.source_run_id FROM {ns}.asset_event e"
                            " JOIN {ns}.asset a ON a.id = e.asset_id"
                        )
                    )
                ]
                links = [
                    (int(run), str(dag), int(event))
                    for run, dag, event in conn.execute(
                        self.q(
                            "SELECT dag_run_id, dag_id, asset_event_id FROM {ns}.dagrun_asset_event"
                        )
                    )
                ]
                runs = {
                    int(pk): (str(dag), str(run), str(state), int(attempt), worker)
                    for pk, dag, run, state, attempt, worker in conn.execute(
                        self.q(
                            "SELECT id, dag_id, run_id, state, attempt, worker FROM {ns}.dag_run"
                        )
                    )
                }
                queued = {
                    (str(d), int(e))
                    for d, e in conn.execute(
                        self.q("SELECT target_dag_id, asset_event_id FROM {ns}.asset_dag_run_queue")
                    )
                }
                effects = [
                    (str(d), str(run), int(a), str(w))
                    for d, run, a, w in conn.execute(
                        sa.text(f"SELECT dag_id, run_id, attempt, worker FROM {EFFECT_TABLE}")
                    )
                ]
        # Events: every planned key registered exactly once, every acknowledged key there.
        planned = {
            (event_asset(self.config.seed, n, i), event_key(n, i))
            for n, count in enumerate(self.per_producer)
            for i in range(count)
        }
        keys = Counter((a, k) for _, a, k, _, _ in events if a in SOURCES)
        acked = {
            key for p in self.procs if p.role == "producer" for key in acknowledged(self.log_of(p))
        }
        r.planned = len(planned)
        r.events = len(set(keys) & planned)
        r.acknowledged = len(acked)
        present = {k for _, k in keys}
        r.lost += len(acked - present)
        r.duplicated += sum(n - 1 for n in keys.values() if n > 1)
        r.duplicated += len(set(keys) - planned)  # an event nobody planned
        # Pairs: every event linked once to every consumer subscribed to its asset.
        asset_of = {e: a for e, a, _, _, _ in events}
        pairs = Counter((dag, event) for _, dag, event in links)
        expected = {(dag, e) for e, a, _, _, _ in events for dag in SUBSCRIBERS[a]}
        r.pairs = len(expected)
        missing = expected - set(pairs)
        queued_assets: dict[str, set[str]] = {}
        for dag, event in queued:
            queued_assets.setdefault(dag, set()).add(asset_of.get(event, "?"))
        ready = {dag for dag, assets in queued_assets.items() if condition_holds(dag, assets)}
        # Still queued for an AND that cannot hold yet: pending, not lost.
        pending = {pair for pair in missing & queued if pair[0] not in ready}
        r.lost += len(missing - pending)
        r.stalled += len(ready)
        r.duplicated += sum(n - 1 for n in pairs.values() if n > 1)
        r.duplicated += sum(1 for pair in pairs if pair not in expected)
        linked_runs = {run for run, _, _ in links}
        r.duplicated += sum(1 for pk in runs if pk not in linked_runs)  # a run of nothing
        for run, dag, event in links:
            if runs.get(run, ("",))[0] != dag or event not in asset_of:
                r.duplicated += 1  # a link to another consumer's run or to no event
        # Runs: final; each success with exactly one effect, of its attempt and worker.
        r.runs = len(runs)
        r.attempts = sum(attempt for _, _, _, attempt, _ in runs.values())
        r.stalled += sum(1 for _, _, s, _, _ in runs.values() if s in ("queued", "running"))
        r.failed = sum(1 for _, _, s, _, _ in runs.values() if s == "failed")
        by_run: dict[tuple[str, str], list[tuple[int, str]]] = {}
        for dag, run_id, attempt, worker in effects:
            by_run.setdefault((dag, run_id), []).append((attempt, worker))
        outputs = Counter((sd, sr) for _, a, _, sd, sr in events if a == OUTPUT)
        for dag, run_id, state, attempt, worker in runs.values():
            written = by_run.pop((dag, run_id), [])
            r.double_effects += max(0, len(written) - 1)
            if state == "success":
                # its one row, written by the attempt and the worker that succeeded
                r.wrong_effects += len(written) == 1 and written != [(attempt, worker)]
                r.wrong_effects += not written
            else:
                r.wrong_effects += len(written)  # a write that should have rolled back
            want = 1 if (dag == "load" and state == "success") else 0
            r.outputs_wrong += outputs.pop((dag, run_id), 0) != want
        r.wrong_effects += sum(len(v) for v in by_run.values())  # effects of no run
        r.outputs_wrong += sum(outputs.values())  # outputs of no run

    def run(self) -> Report:
        began = time.monotonic()
        self.setup()
        self._sampling.set()
        sampler = threading.Thread(target=self.sample_caps, name="cap-sampler", daemon=True)
        sampler.start()
        try:
            for proc in self.procs:
                self.start(proc)
            self.chaos()
            self.drain()
        finally:
            self._sampling.clear()
            sampler.join(30)
            self.stop_all()
        if self._sample_errors:
            raise RuntimeError("the cap sampler failed") from self._sample_errors[0]
        if self._failover_errors:
            raise RuntimeError("the failover failed") from self._failover_errors[0]
        self.verify()
        self.report.seconds = time.monotonic() - began
        self.engine.dispose()
        return self.report


def run_soak(
    url: str,
    namespace: str,
    config: Config,
    engine: str,
    workdir: Path,
    failover: Failover | None = None,
) -> Report:
    """One soak against the database at ``url`` with assetq installed in ``namespace``;
    ``failover`` makes the plan's failovers."""
    return Soak(url, namespace, config, workdir, engine, failover).run()


# -- the command ---------------------------------------------------------------------------


@contextmanager
def throwaway_database(engine_name: str, server: str) -> Iterator[tuple[str, str]]:
    """(url, namespace) of a fresh database with assetq installed, from tests/dbs.py's
    backends (PostgreSQL: a database named with the suite's prefix on the server, dropped
    after; MySQL: a throw-away server, or the server of a URL used as a dedicated one)."""
    import dbs

    backend = dbs.backend_for(engine_name, server)
    try:
        db = backend.database(installed=True)
        try:
            yield db.url.render_as_string(hide_password=False), db.namespace
        finally:
            backend.drop(db)
    finally:
        backend.close()


@contextmanager
def patroni_database() -> Iterator[tuple[str, str, Failover]]:
    """(multi-host url, namespace, failover) of assetq installed in a throw-away Patroni
    cluster in synchronous mode; the failover kills the leader's postmaster (kill -9) and
    returns once another node leads and the cluster is healthy again."""
    from patroni_cluster import patroni_cluster

    with patroni_cluster(synchronous=True) as cluster:
        admin = sa.create_engine(cluster.leader().url(), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(sa.text("CREATE DATABASE soak"))
        admin.dispose()
        url = cluster.multi_host_url("soak")
        engine = sa.create_engine(url)
        try:
            assetq.install(engine)
        finally:
            engine.dispose()

        def failover() -> str:
            old = cluster.leader()
            old.kill_postmaster()
            new = cluster.new_leader(old)
            cluster.wait_healthy()  # the old leader rejoined as a replica
            return f"failover: {old.name}'s postmaster killed, {new.name} leads"

        yield url.render_as_string(hide_password=False), "assetq", failover


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["produce"]:
        return produce_main(argv[1:])
    defaults = Config()
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--engines", default="postgresql,mysql", help="comma-separated: postgresql, mysql"
    )
    parser.add_argument(
        "--postgres",
        default="local",
        help="PostgreSQL server (tests/dbs.py): 'local', 'embedded' or a server URL",
    )
    parser.add_argument(
        "--mysql",
        default="private",
        help="MySQL server (tests/dbs.py): 'private' (a throw-away mariadbd/mysqld) or the URL"
        " of a server the soak may use as its own (MariaDB, MySQL 9.7, ...)",
    )
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--schedulers", type=int, default=2)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=defaults.concurrency)
    parser.add_argument(
        "--rate", type=float, default=75.0, help="events/s of each producer (0: unpaced)"
    )
    parser.add_argument("--kills", type=int, default=40)
    parser.add_argument("--zombie-ratio", type=float, default=defaults.zombie_ratio)
    parser.add_argument(
        "--kill-interval",
        type=float,
        default=None,
        metavar="SECONDS",
        help="mean time between two kills (default: the producers' planned time / (1.5 kills+1))",
    )
    parser.add_argument("--lease", type=float, default=4.0, metavar="SECONDS")
    parser.add_argument("--seed", type=int, default=None, help="default: a random one, printed")
    parser.add_argument("--drain-timeout", type=float, default=300.0, metavar="SECONDS")
    parser.add_argument("--deadline", type=float, default=defaults.deadline, metavar="SECONDS")
    parser.add_argument(
        "--failover",
        choices=["patroni"],
        default=None,
        help="PostgreSQL on a throw-away Patroni cluster (synchronous mode) whose leader's"
        " postmaster is killed --failovers times among the kills (module doc)",
    )
    parser.add_argument("--failovers", type=int, default=1, metavar="N")
    args = parser.parse_args(argv)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if args.failover and engines != ["postgresql"]:
        parser.error("--failover patroni needs --engines postgresql")

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)  # the processes, servers and databases are cleaned up

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    seed = random.randrange(1 << 30) if args.seed is None else args.seed
    print(f"soak: seed {seed}", flush=True)
    config = Config(
        events=args.events,
        producers=args.producers,
        schedulers=args.schedulers,
        workers=args.workers,
        concurrency=args.concurrency,
        rate=args.rate,
        kills=args.kills,
        zombie_ratio=args.zombie_ratio,
        kill_interval=args.kill_interval,
        lease=args.lease,
        seed=seed,
        drain_timeout=args.drain_timeout,
        deadline=args.deadline,
        failovers=args.failovers if args.failover else 0,
    )
    reports = []
    for engine_name in engines:
        server = args.postgres if engine_name == "postgresql" else args.mysql
        workdir = Path(tempfile.mkdtemp(prefix="assetq-soak-"))
        if args.failover:
            with patroni_database() as (url, namespace, failover):
                report = run_soak(url, namespace, config, "postgresql-patroni", workdir, failover)
        else:
            with throwaway_database(engine_name, server) as (url, namespace):
                report = run_soak(url, namespace, config, engine_name, workdir)
        if report.ok:
            shutil.rmtree(workdir)
        else:  # every process's log, and the producers' acknowledgements
            report.notes.append(f"the processes' logs are kept in {workdir}")
        for note in report.notes[:20]:
            print(f"soak {engine_name}: {note}", flush=True)
        print(report.line(), flush=True)
        reports.append(report)
    return 0 if reports and all(r.ok for r in reports) else 1


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))  # dbs, when run as `python tests/soak.py`
    raise SystemExit(main())
