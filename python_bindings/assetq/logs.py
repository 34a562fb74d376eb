"""Log formats of the command line (``--log-format text``, the default, and ``json``), and
how the long-running loops log the errors they retry (a lost connection is a WARNING line).

assetq logs through child loggers of ``assetq`` (``assetq.scheduler``, ``assetq.worker``,
``assetq.migrate``, ``assetq.api``, ...): an application configures them as one, through
``logging.getLogger("assetq")``, or one by one. The library never installs a handler; only
the CLI does, with :func:`cli_handler`. A line about one run comes from the loop that acted
on it, with the run's fields (:func:`run_fields`, :func:`attempt_fields`).
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Literal, Protocol, TextIO

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import PoolProxiedConnection

from . import errors

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")

#: The text format: what the CLI always printed, with the logger's name before the message.
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"

#: Attributes every LogRecord has: anything else on a record came from ``extra=`` and is
#: written as a field of its own in JSON.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: ``time`` (UTC, ISO 8601, microseconds),
    ``level``, ``logger``, ``message``, ``exception`` when there is one, and every field
    given as ``extra=`` (values JSON cannot hold are written as their ``str``)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_") and key not in entry:
                entry[key] = value
        return json.dumps(entry, default=str)


if TYPE_CHECKING:
    _StreamHandler = logging.StreamHandler[TextIO]
else:  # not subscriptable at run time before Python 3.11
    _StreamHandler = logging.StreamHandler


class _StderrHandler(_StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record is emitted, not when the handler
    was made: tests that capture stderr, then put it back, leave no dangling stream."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, value: TextIO) -> None:
        pass


def cli_handler(log_format: LogFormat) -> logging.Handler:
    """The handler the CLI puts on the root logger for ``--log-format``."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}")
    handler = _StderrHandler()
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    return handler


# -- fields of a line about one run ---------------------------------------------------------


class _RunLike(Protocol):
    @property
    def dag_id(self) -> str: ...
    @property
    def run_id(self) -> str: ...


class _ClaimLike(_RunLike, Protocol):
    @property
    def attempt(self) -> int: ...
    @property
    def worker(self) -> str: ...


def run_fields(run: _RunLike, **more: object) -> dict[str, object]:
    """``extra=`` of a log line about one run: ``dag_id`` and ``run_id``, then ``more``.
    JSON logs carry them as fields of their own, so a run's lines are found by filtering,
    not by parsing messages."""
    return {"dag_id": run.dag_id, "run_id": run.run_id, **more}


def attempt_fields(claim: _ClaimLike) -> dict[str, object]:
    """:func:`run_fields` of one attempt: also ``attempt`` and ``worker``."""
    return run_fields(claim, attempt=claim.attempt, worker=claim.worker)


# -- what the loops log when they retry -----------------------------------------------------


def connection_lost(exc: BaseException) -> bool:
    """True when ``exc`` says the connection to the database broke or could not be made (a
    restart, a failover, a killed session, a network cut): what a long-running loop expects
    now and then and rides out by retrying. assetq's own ConnectionLost, SQLAlchemy's
    disconnect errors, and the drivers' OperationalError as the listening connections get
    them straight from psycopg (the server closed the connection, terminated it, refused
    it)."""
    if isinstance(exc, errors.ConnectionLost):
        return True
    if isinstance(exc, DBAPIError):
        if exc.connection_invalidated:
            return True
        exc = exc.orig if exc.orig is not None else exc
    # DB-API 2 names the class of "the connection broke / could not be made" OperationalError
    # (psycopg's AdminShutdown, 57P01, is one; so is PyMySQL's 2013).
    return isinstance(exc, OSError) or any(
        cls.__name__ == "OperationalError" for cls in type(exc).__mro__
    )


def first_line(exc: BaseException) -> str:
    """The first line of an error's message (psycopg's connection errors add hint lines), or
    its class name: log lines stay one line."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def log_retried(
    logger: logging.Logger,
    exc: BaseException,
    message: str,
    *args: object,
    extra: Mapping[str, object] | None = None,
) -> None:
    """Log ``message`` once for an error a loop retries after a backoff.

    A lost connection is expected: one WARNING line, its traceback at DEBUG only (an operator
    restarting the database gets no pages of tracebacks). An assetq or database error with
    its code is an ERROR line: its message says what to do. Anything else is unexpected (a
    bug): an ERROR with its traceback."""
    if connection_lost(exc):
        logger.warning(message, *args, stacklevel=2, extra=extra)
        logger.debug("the lost connection's traceback:", exc_info=exc, stacklevel=2, extra=extra)
    elif isinstance(exc, errors.AssetqError):
        logger.error(message, *args, stacklevel=2, extra=extra)
    else:
        logger.error(message, *args, exc_info=exc, stacklevel=2, extra=extra)


def close_detached(raw: PoolProxiedConnection) -> None:
    """Close ``raw``, a connection detached from its pool (the loops' listening ones), without
    SQLAlchemy's reset on close: the reset's rollback, on a connection the server cut, is
    logged by sqlalchemy.pool as "Exception during reset or similar", at ERROR with a
    traceback, for what is an expected loss. A detached connection in autocommit has nothing
    to roll back; its session state (LISTEN, session locks) ends with the session."""
    dbapi_connection = raw.dbapi_connection
    if dbapi_connection is not None:
        try:
            dbapi_connection.close()
        except Exception:  # a dead connection may fail to close; it is gone anyway
            logging.getLogger("assetq").debug("closing a connection failed", exc_info=True)
        raw.invalidate()  # detached: marks it closed, no reset, no I/O


#: Engines (by URL, password hidden) whose connection is lost: a call's retry of a lost
#: connection is a WARNING the first time, DEBUG while it stays lost, so that an outage
#: under a loop is not one WARNING per attempt of every pass.
_lost: set[str] = set()
_lost_lock = threading.Lock()


def retry_level(engine: Engine, exc: BaseException) -> int:
    """The level of a call's "attempt failed, retrying" line for ``exc`` on ``engine``."""
    if not connection_lost(exc):
        return logging.WARNING
    with _lost_lock:
        if str(engine.url) in _lost:
            return logging.DEBUG
        _lost.add(str(engine.url))
    return logging.WARNING


def connection_back(engine: Engine) -> None:
    """A call on ``engine`` succeeded: its next lost connection is a WARNING again."""
    if _lost:  # read without the lock: the common case costs nothing
        with _lost_lock:
            _lost.discard(str(engine.url))
