"""Log formats of the command line: ``--log-format text`` (the default) and ``json``.

assetq logs through child loggers of ``assetq`` (``assetq.scheduler``, ``assetq.worker``,
``assetq.migrate``, ``assetq.api``, ...): an application configures them as one, through
``logging.getLogger("assetq")``, or one by one. The library never installs a handler; only
the CLI does, with :func:`cli_handler`.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Literal, TextIO

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
