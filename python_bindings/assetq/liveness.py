"""Liveness: each scheduler and worker loop keeps a row of its own in
``process_liveness``, which ``assetq status`` shows, flagging the stale ones.

A loop makes up its process id (uuid4 hex) when it starts, records itself at once and then
at most every ``interval`` seconds (:meth:`Liveness.beat_if_due`, called between passes or
from the worker's main thread), each time in a short transaction of its own, never inside a
pass or a run. A clean stop deletes the row (:meth:`Liveness.gone`); a killed process leaves
it, and it is *stale* once it was last seen more than :data:`STALE_INTERVALS` of its
intervals ago, by the database's clock. A failed heartbeat is logged at WARNING once (until
one succeeds again) and never stops the loop: liveness is for operators, not for
correctness.

A worker's row also names the consumers it has handlers for (``process_dag``, written by
``process_handles`` in the heartbeat's transaction), so that status and doctor can tell a
consumer with runs waiting and no live worker able to run them. A handler for a consumer
that does not exist is logged at WARNING at start, or refused (``strict``: the first
heartbeat raises :class:`~assetq.UnknownDag`, and any error of its own, before the worker
claims anything).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Literal

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from . import errors
from .dialects import Dialect, dialect_of
from .logs import first_line

log = logging.getLogger("assetq.liveness")

#: A loop not seen for this many of its intervals is stale (status, doctor).
STALE_INTERVALS = 3
#: The default heartbeat interval of run_scheduler and run_worker, seconds.
DEFAULT_INTERVAL = 15.0

ProcessKind = Literal["scheduler", "worker"]

#: Column lengths of process_liveness.
_HOST_MAX = 255
_VERSION_MAX = 64


def check_interval(value: object) -> float | None:
    """A liveness interval: None (no liveness row) or a positive number of seconds, at most a
    week."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise errors.InvalidArgumentType(
            f"liveness_interval must be a number of seconds or None, got {type(value).__name__}"
        )
    if not 0 < value <= 604_800:
        raise errors.InvalidArgument(
            f"liveness_interval must be above 0 and at most 604800 seconds, got {value!r}"
        )
    return float(value)


class Liveness:
    """The liveness row of one loop. ``interval`` None: the loop keeps none (every method does
    nothing). ``shown_interval`` is the interval recorded in the row, the longest the loop may
    go between heartbeats (a scheduler's poll interval when that is longer): status calls
    the row stale after :data:`STALE_INTERVALS` of it. ``handles``: a worker's consumers,
    recorded with every heartbeat (unknown ones warned about once, or refused with
    ``strict``). Not thread-safe: one thread calls it."""

    def __init__(
        self,
        engine: Engine,
        namespace: str,
        kind: ProcessKind,
        interval: float | None,
        *,
        name: str | None = None,
        shown_interval: float | None = None,
        handles: Iterable[str] | None = None,
        strict: bool = False,
    ) -> None:
        from . import __version__

        if strict and interval is None:
            raise errors.InvalidArgument(
                "strict needs a liveness row (liveness_interval): the worker's consumers are"
                " checked when it records itself"
            )

        self._engine = engine
        self._namespace = namespace
        self.interval = interval
        self.process_id = uuid.uuid4().hex
        self._params = {
            "process_id": self.process_id,
            "kind": kind,
            "name": name,
            "host": socket.gethostname()[:_HOST_MAX] or "?",
            "pid": os.getpid(),
            "version": __version__[:_VERSION_MAX],
            "interval_seconds": max(interval or 0.0, shown_interval or 0.0) or 1.0,
        }
        self._next = 0.0  # monotonic time of the next heartbeat due
        self._failing = False
        self._recorded = False
        self._handles = None if handles is None else json.dumps(sorted(set(handles)))
        self._strict = strict
        #: The worker's consumers that no declared consumer had at its first recording.
        self.unknown: tuple[str, ...] | None = None

    @property
    def enabled(self) -> bool:
        return self.interval is not None

    def seconds_until_due(self) -> float | None:
        """How long until the next heartbeat is due (0 when due now); None when disabled."""
        if self.interval is None:
            return None
        return max(0.0, self._next - time.monotonic())

    def beat_if_due(self) -> None:
        """Heartbeat when the interval since the last attempt has passed (at once the first
        time)."""
        if self.interval is not None and time.monotonic() >= self._next:
            self.beat()

    def beat(self) -> bool:
        """Record the loop as alive now. False when that failed (logged, never raised)."""
        if self.interval is None:
            return False
        self._next = time.monotonic() + self.interval
        first = self.unknown is None and self._handles is not None
        if first and self._strict:
            # Before the worker claims anything: an error or an unknown consumer raises.
            dialect = dialect_of(self._engine)
            try:
                with self._engine.begin() as conn:
                    self._record(dialect, conn)
                    self._check_handles()
            except DBAPIError as exc:
                raise dialect.translate(exc) from exc
            self._recorded = True
            return True
        ok = self._call("process_heartbeat", self._params)
        if ok:
            self._recorded = True
            if first:
                self._check_handles()
        return ok

    def _record(self, dialect: Dialect, conn: Connection) -> None:
        dialect.execute(conn, "process_heartbeat", self._namespace, self._params)
        if self._handles is None:
            return
        params = {"process_id": self.process_id, "dag_ids": self._handles}
        rows = dialect.execute(conn, "process_handles", self._namespace, params)
        if self.unknown is None:
            self.unknown = tuple(str(row.unknown_dag_id) for row in rows)

    def _check_handles(self) -> None:
        """Warn about (or, strict, refuse) handlers of consumers nobody declared."""
        if not self.unknown:
            return
        names = ", ".join(self.unknown)
        if self._strict:
            raise errors.UnknownDag(
                f"the worker has handlers for consumers that are not declared: {names}"
                " (a typo in a dag id? declare them with assetq.declare_dag, or start"
                " without strict to run the others)",
                code="AQ003",
            )
        log.warning(
            "assetq worker: handlers for consumers that are not declared: %s; their runs"
            " never come until they are (a typo in a dag id?); the others run as usual",
            names,
            extra={"unknown_dag_ids": list(self.unknown)},
        )

    def gone(self) -> None:
        """Delete the loop's row: a clean stop. Failures are logged, never raised."""
        if self.interval is None or not self._recorded:
            return
        if self._call("process_gone", {"process_id": self.process_id}):
            self._recorded = False

    def _call(self, query: str, params: Mapping[str, object]) -> bool:
        dialect = dialect_of(self._engine)
        try:
            try:
                with self._engine.begin() as conn:
                    if query == "process_heartbeat":
                        self._record(dialect, conn)
                    else:
                        dialect.execute(conn, query, self._namespace, params)
            except DBAPIError as exc:
                raise dialect.translate(exc) from exc
        except (errors.AssetqError, SQLAlchemyError, OSError) as exc:
            if not self._failing:
                log.warning(
                    "assetq %s: could not record its liveness (%s [%s] %s); it goes on, and"
                    " tries again in %g s; not logged again until that works (`assetq status`"
                    " shows it as stale meanwhile)",
                    self._params["kind"],
                    query,
                    getattr(exc, "code", None) or "no code",
                    first_line(exc),
                    self.interval,
                )
                self._failing = True
            else:
                log.debug("assetq %s: %s failed again", self._params["kind"], query, exc_info=exc)
            return False
        if self._failing:
            log.info("assetq %s: liveness recorded again", self._params["kind"])
            self._failing = False
        return True
