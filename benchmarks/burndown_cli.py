"""The command-line burn-down: ``assetq worker`` against ``procrastinate worker``, as users
start them, each burning down N queued jobs with the same concurrency.

    python benchmarks/burndown_cli.py                    # 10,000 jobs, concurrency 8, both engines
    python benchmarks/burndown_cli.py --runs 500 --rounds 1 --engines postgresql

Handlers (benchmarks/burndown_handlers.py): ``noop`` does nothing; ``row`` inserts one row:
assetq's in the transaction that completes the run (the ``conn`` a handler is given),
procrastinate's through its job's connector (procrastinate gives a task no connection of
its own). The queued runs are those of benchmarks/burndown.py (``fill_namespace``: shaped as
the scheduler pass writes them, spread over 10 consumers); procrastinate's N jobs are one
INSERT ... SELECT into procrastinate_jobs of the task (``fill_peer``).

Each turn starts one worker process (``assetq worker --concurrency C --handlers
burndown_handlers:NOOP``, all other options at their defaults; ``procrastinate --app
burndown_handlers.procrastinate_app worker --concurrency C --one-shot``: its defaults but
exiting once the queue is empty) on a fresh backlog, waits until every job is done, and stops
it (SIGTERM). Its rate is read from the database's own timestamps, so that neither process's
start-up counts: N / (last completion - first claim); assetq: the runs' ``started_at`` and
``ended_at``, procrastinate: its jobs' ``started`` and ``succeeded`` events. Both sessions
run with synchronous_commit off (PGOPTIONS), as the rest of docs/benchmarks.md.

Rounds: in each, every (handler, system) pair takes one turn, the systems' order alternating
round by round, so that load from elsewhere falls on both alike; the ratio (assetq /
procrastinate) is taken per round and per handler, medians reported. MariaDB (a throw-away
server, tests/dbs.py, or ``--mysql URL``) reports assetq alone: procrastinate has no MySQL
support. The machine's load average is printed with the table.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import burndown
import sqlalchemy as sa
from burndown_handlers import SINK
from sqlalchemy import Engine

import assetq

HERE = Path(__file__).resolve().parent
HANDLERS = ("noop", "row")
ASSETQ, PEER = "assetq worker", "procrastinate worker"
#: Longest a turn may take before it is called stuck, seconds.
TURN_LIMIT = 600.0


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env["PGOPTIONS"] = "-c synchronous_commit=off"
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def _bin(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


def _wait(proc: subprocess.Popen[bytes], done: Any, what: str) -> None:
    deadline = time.monotonic() + TURN_LIMIT
    while not done():
        if proc.poll() is not None and not done():
            raise RuntimeError(f"{what} exited ({proc.returncode}) before the backlog was done")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not finish its backlog in {TURN_LIMIT:g} s")
        time.sleep(0.2)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _sink(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text(f"DROP TABLE IF EXISTS {SINK}"))
        conn.execute(
            sa.text(f"CREATE TABLE {SINK} (id bigint PRIMARY KEY {_serial(engine)}, job text)")
        )


def _serial(engine: Engine) -> str:
    return (
        "GENERATED ALWAYS AS IDENTITY" if engine.dialect.name == "postgresql" else "AUTO_INCREMENT"
    )


def _sunk(engine: Engine) -> int:
    with engine.begin() as conn:
        return int(conn.execute(sa.text(f"SELECT count(*) FROM {SINK}")).scalar_one())


def assetq_turn(
    engine: Engine, namespace: str, handler: str, runs: int, concurrency: int, logdir: Path
) -> float:
    """One ``assetq worker`` burn-down of ``runs`` fresh runs: runs/s."""
    burndown.fill_namespace(engine, namespace, runs, 0)
    _sink(engine)
    url = engine.url.render_as_string(hide_password=False)
    consumers = ",".join(f"consumer_{c}" for c in range(burndown.CONSUMERS))
    argv = [
        _bin("assetq"), "worker", "--url", url, "--namespace", namespace,
        "--concurrency", str(concurrency), "--handlers", f"burndown_handlers:{handler.upper()}",
    ]  # fmt: skip
    stmt = sa.text(
        f"SELECT count(*), min(started_at), max(ended_at) FROM {namespace}.dag_run"
        " WHERE state <> 'queued' AND ended_at IS NOT NULL"
    )
    state: dict[str, Any] = {}

    def done() -> bool:
        with engine.connect() as conn:
            count, first, last = conn.execute(stmt).one()
        state.update(count=count, first=first, last=last)
        return bool(count >= runs)

    with open(logdir / f"assetq-{handler}.log", "ab") as log:
        proc = subprocess.Popen(
            argv, cwd=HERE, env=_env({"AQB_CONSUMERS": consumers}), stdout=log, stderr=log
        )
        try:
            _wait(proc, done, "assetq worker")
        finally:
            _stop(proc)
    outcome = burndown.outcome(engine, namespace)
    if outcome != {"success/1": runs}:
        raise RuntimeError(f"assetq worker left {outcome}")
    if handler == "row" and _sunk(engine) != runs:
        raise RuntimeError(f"assetq's row handler inserted {_sunk(engine)} rows, not {runs}")
    return float(runs / (state["last"] - state["first"]).total_seconds())


def peer_turn(
    engine: Engine, peer: burndown.Peer, handler: str, runs: int, concurrency: int, logdir: Path
) -> float:
    """One ``procrastinate worker`` burn-down of ``runs`` fresh jobs of task ``handler``."""
    burndown.fill_peer(peer, runs, task=handler)
    _sink(engine)
    info = peer.conninfo
    conninfo = (
        f"host={info['host']} port={info['port']} user={info['user']} dbname={info['dbname']}"
        f" options='{info['options']}'"
    )
    argv = [
        _bin("procrastinate"), "--app", "burndown_handlers.procrastinate_app", "worker",
        "--concurrency", str(concurrency), "--one-shot",
    ]  # fmt: skip
    with open(logdir / f"procrastinate-{handler}.log", "ab") as log:
        proc = subprocess.Popen(
            argv, cwd=HERE, env=_env({"AQB_PG": conninfo}), stdout=log, stderr=log
        )
        try:
            _wait(proc, lambda: burndown.peer_outcome(peer) == {"succeeded": runs}, "procrastinate")
        finally:
            _stop(proc)
    if handler == "row" and _sunk(engine) != runs:
        raise RuntimeError(f"procrastinate's row handler inserted {_sunk(engine)} rows")
    first, last = burndown.peer_span(peer)
    return float(runs / (last - first).total_seconds())


def measure(
    engine: Engine, runs: int, concurrency: int, rounds: int, peer_mode: str, logdir: Path
) -> dict[str, dict[str, list[float]]]:
    """Rates (jobs/s) per handler and system, one per round."""
    namespace = burndown.namespace_name(0, "cli")
    burndown.install_namespace(engine, namespace)
    module = burndown.peer_module(peer_mode) if engine.dialect.name == "postgresql" else None
    peer = None if module is None else burndown.install_peer(engine.url, module)
    rates: dict[str, dict[str, list[float]]] = {h: {ASSETQ: [], PEER: []} for h in HANDLERS}
    try:
        for round_ in range(rounds):
            for handler in HANDLERS:
                systems = [ASSETQ, PEER] if round_ % 2 == 0 else [PEER, ASSETQ]
                for system in systems:
                    if system == ASSETQ:
                        rate = assetq_turn(engine, namespace, handler, runs, concurrency, logdir)
                    elif peer is not None:
                        rate = peer_turn(engine, peer, handler, runs, concurrency, logdir)
                    else:
                        continue
                    rates[handler][system].append(rate)
                    where = f"{engine.dialect.name} round {round_ + 1} {handler}"
                    burndown._progress(f"{where}: {system} {rate:,.0f}/s")
    finally:
        if peer is not None:
            burndown.drop_peer(peer)
        assetq.uninstall(engine, namespace=namespace)
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {SINK}"))
    return rates


def table(results: dict[str, dict[str, dict[str, list[float]]]], concurrency: int) -> list[str]:
    """The burn-down table: jobs/s, median of the rounds, and the ratio per round."""
    lines = [
        f"Jobs/s at concurrency {concurrency}, median of the rounds; the ratio per round:"
        " median (min-max).",
        "",
        "| engine | handler | assetq worker, jobs/s | procrastinate worker, jobs/s"
        " | assetq / procrastinate (per round: median, min-max) |",
        "|---|---|---:|---:|---:|",
    ]
    for engine_name, rates in results.items():
        for handler in HANDLERS:
            mine, theirs = rates[handler][ASSETQ], rates[handler][PEER]
            ratios = [a / p for a, p in zip(mine, theirs, strict=True)] if theirs else []
            ratio = (
                f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
                if ratios
                else "-"
            )
            peer = f"{statistics.median(theirs):,.0f}" if theirs else "- (no MySQL support)"
            lines.append(
                f"| {engine_name} | {handler} | {statistics.median(mine):,.0f} | {peer} | {ratio} |"
            )
    return lines


def server_label(engine: Engine) -> str:
    """``PostgreSQL 15``, ``MariaDB 10.11``: the server the figures are of."""
    dialect: Any = engine.dialect
    version = ".".join(str(v) for v in (dialect.server_version_info or ())[:2])
    if dialect.name == "postgresql":
        return f"PostgreSQL {version.split('.')[0]}"
    return f"{'MariaDB' if getattr(dialect, 'is_mariadb', False) else 'MySQL'} {version}"


def _versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        peer = f", {burndown.PEER_NAME} {version(burndown.PEER_NAME)}"
    except PackageNotFoundError:
        peer = ""
    return f"assetq {version('assetq')}{peer}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--peer", choices=("install", "if-installed", "off"), default="install")
    parser.add_argument("--engines", default="postgresql,mysql")
    parser.add_argument(
        "--postgres", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
    )
    parser.add_argument("--mysql", default="private", help="'private' or a server URL")
    parser.add_argument("--logs", default=None, help="directory of the workers' logs")
    parser.add_argument("--output", default=None, help="write the table there (markdown)")
    args = parser.parse_args(argv)
    began, load_before = time.time(), os.getloadavg()[0]
    logdir = Path(args.logs) if args.logs else Path(os.environ.get("TMPDIR", "/tmp"))
    logdir.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, dict[str, list[float]]]] = {}
    for engine_name in [e.strip() for e in args.engines.split(",") if e.strip()]:
        if engine_name not in ("postgresql", "mysql"):
            parser.error(f"unknown engine {engine_name!r}")
        with burndown._server(engine_name, args) as engine:
            rates = measure(engine, args.runs, args.concurrency, args.rounds, args.peer, logdir)
            results[server_label(engine)] = rates
    given = sys.argv[1:] if argv is None else list(argv)
    if "--logs" in given:  # a directory of this machine: not part of the figures' command
        at = given.index("--logs")
        del given[at : at + 2]
    command = " ".join(["python benchmarks/burndown_cli.py", *given])
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(began))
    lines = [
        f"Measured with `{command}` on {when} ({time.time() - began:.0f} s), {_versions()};"
        f" load average (1 min) before {load_before:.2f}, after {os.getloadavg()[0]:.2f}:"
        " the machine is shared, read the ratios.",
        "",
        *table(results, args.concurrency),
    ]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.output:
        Path(args.output).write_text(text, "utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
