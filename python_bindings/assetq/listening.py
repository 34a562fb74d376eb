"""The one listening connection of the loops (PostgreSQL): LISTEN on the namespace's channel.

Both loops and both shells listen through :class:`Listener`: a connection taken from the
engine (so it gets the engine's connect arguments and hooks), detached from its pool (it is
never handed to anyone else) and switched to autocommit (LISTEN in a transaction would only
take effect at commit), checked to be one server session before anything is set on it (I11:
through a transaction pooler LISTEN, advisory locks and settings would stay on a server
connection other clients get). The scheduler's wake-up lock protocol is built on it
(:class:`assetq.scheduler.WakeupListener`); workers wake their idle slots from it
(:func:`wake_slots`). The asyncio loops run its blocking waits in a thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

from sqlalchemy import Engine

from .dialects import Dialect
from .logs import close_detached, connection_lost, log_retried
from .loops import STOP_CHECK, Wakeup

log = logging.getLogger("assetq.listening")

#: How many probe transactions the session check runs, one after the other.
_PROBES = 3


def pooled_session(engine: Engine, dialect: Dialect, namespace: str, driver: Any) -> str | None:
    """None when ``driver`` (a psycopg connection of ``engine`` in autocommit, with nothing
    set on it yet) holds one server session for as long as it lives; otherwise why not.

    Session state (LISTEN, advisory locks, settings) is only safe on such a session (I11).
    Directly connected, the server's own process id comes with the handshake and is the one
    ``pg_backend_pid()`` gives. A pooler (PgBouncer, and the like) answers the handshake
    itself with made-up keys: then the session is ours only in session pooling. In
    transaction pooling the pooler lends the server connection to other clients between
    our transactions, most recently used first: a probe transaction of another client right
    after one of ours runs on our server process, or our next query runs on another one.
    Both are looked for, with up to ``_PROBES`` probes, before anything is set.
    (A pooler that hands out its idle server connections round robin may escape the probes:
    give such a deployment a direct listen engine.)
    """
    pid = _backend_pid(driver, dialect, namespace)
    if driver.info.backend_pid == pid:
        return None
    for _ in range(_PROBES):
        # This session's query first, then at once another client's transaction: a pooler
        # in transaction mode gives that one the server connection just released, ours.
        # One probe at a time, never held while this session queries: in session pooling
        # each probe holds a server connection of the pool, and the pool may have few.
        now = _backend_pid(driver, dialect, namespace)
        if now != pid:
            return f"its server process changed between two transactions ({pid}, {now})"
        probe = engine.raw_connection()
        try:
            cursor = probe.cursor()
            cursor.execute(dialect.query("backend_pid", namespace))
            row = cursor.fetchone()
            cursor.close()
        except BaseException as exc:
            # Not returned to the pool: its reset would fail on a connection the server cut
            # (an ERROR traceback from sqlalchemy.pool), and nobody should get it again.
            probe.invalidate(exc)
            raise
        try:
            probe.close()  # rolled back and returned to the engine's pool
        except Exception:
            log.debug("assetq: closing a session probe failed", exc_info=True)
        if row is not None and row[0] == pid:
            return (
                f"another client's transaction ran on this session's server process ({pid})"
                " between two of its transactions"
            )
    return None


def _backend_pid(driver: Any, dialect: Dialect, namespace: str) -> Any:
    row = driver.execute(dialect.query("backend_pid", namespace)).fetchone()
    return None if row is None else row[0]


def pooled_warning(who: str, reason: str, poll: float) -> None:
    """The one warning of a loop whose listening connection goes through a transaction
    pooler: it polls instead."""
    log.warning(
        "%s: the listening connection does not hold one server session (%s): it goes through"
        " a pooler in transaction mode (PgBouncer pool_mode=transaction?), where LISTEN,"
        " advisory locks and settings would stay on server connections other clients get,"
        " and notifications are lost. Not listening: polling every %g s. Give it a direct"
        " connection to listen on: listen_engine=, --listen-url or ASSETQ_LISTEN_URL"
        " (docs/deployment.md)",
        who,
        reason,
        poll,
    )


class Listener:
    """A connection of its own that LISTENs on the namespace's channel (PostgreSQL).

    ``setup``: the named queries :meth:`connect` runs on it, in order, once it is known to
    be one server session (LISTEN among them). ``who`` and ``meanwhile`` say, in the one
    WARNING of a lost connection, whose it is and what the loop does until it is back.
    Session state (locks, LISTEN) goes with the connection: :meth:`close` and a lost
    connection end it.
    """

    def __init__(
        self,
        engine: Engine,
        dialect: Dialect,
        namespace: str,
        setup: tuple[str, ...],
        who: str,
        meanwhile: str,
        logger: logging.Logger = log,
    ) -> None:
        self._engine = engine
        self._dialect = dialect
        self._namespace = namespace
        self._setup = setup
        self.who = who
        self._meanwhile = meanwhile
        self._log = logger
        self._raw: Any = None
        self._driver: Any = None
        self._failed_once = False
        #: Why the engine cannot listen (not one server session: a transaction pooler);
        #: set by connect(), then the loop polls for good.
        self.pooled: str | None = None

    @property
    def connected(self) -> bool:
        return self._driver is not None

    def run(self, name: str) -> None:
        """Run named query ``name`` on the listening session."""
        self._driver.execute(self._dialect.query(name, self._namespace))

    def ask(self, name: str) -> bool:
        """The first column of named query ``name``'s one row, as a bool."""
        row = self._driver.execute(self._dialect.query(name, self._namespace)).fetchone()
        return bool(row[0])

    def connect(self) -> None:
        """Connect and set the session up; :attr:`pooled` says why not when it is not one
        server session (then nothing was set, and the connection is closed)."""
        raw = self._engine.raw_connection()
        try:
            driver: Any = raw.driver_connection  # the psycopg connection; read before detach
            raw.detach()
            driver.autocommit = True
            # Before anything is set on the session: through a transaction pooler it would
            # stay on a server connection other clients get (I11).
            self.pooled = pooled_session(self._engine, self._dialect, self._namespace, driver)
            if self.pooled is None:
                for name in self._setup:
                    driver.execute(self._dialect.query(name, self._namespace))
        except BaseException:
            close_detached(raw)
            raise
        if self.pooled is not None:
            close_detached(raw)
            return
        self._raw, self._driver = raw, driver
        if self._failed_once:
            self._log.info("%s: listening again", self.who)
            self._failed_once = False
        else:
            self._log.debug("%s: listening on channel %s", self.who, self._namespace)

    def lost(self, exc: BaseException) -> None:
        """The connection failed with ``exc``: one WARNING until it is back, then closed."""
        if not self._failed_once:
            log_retried(
                self._log,
                exc,
                "%s: %s the wake-up connection (%s); %s",
                self.who,
                "lost" if connection_lost(exc) else "error on",
                _first_line(exc),
                self._meanwhile,
            )
            self._failed_once = True
        else:
            self._log.debug("%s: the wake-up connection failed again", self.who, exc_info=exc)
        self.close()

    def notifications(self, timeout: float, stop_after: int | None = None) -> Iterator[Any]:
        """The notifications that arrive within ``timeout`` seconds (at most ``stop_after``)."""
        return iter(self._driver.notifies(timeout=timeout, stop_after=stop_after))

    def close(self) -> None:
        raw = self._raw
        self._raw = self._driver = None
        if raw is not None:
            close_detached(raw)


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


#: The payloads that wake a worker's idle slots: runs were created, or a producer's events
#: were queued (then the first slot claims with a pass of its own).
WORKER_PAYLOADS = ("runs", "queued")


def worker_listener(
    engine: Engine, dialect: Dialect, namespace: str, who: str, retry: float, logger: logging.Logger
) -> Listener:
    """The listening connection of a worker (``who``, logging to ``logger``), which
    reconnects every ``retry`` seconds."""
    # Schedulers woken by producers give listening workers a head start: the mark before
    # LISTEN, the session's last statement while it waits.
    return Listener(
        engine,
        dialect,
        namespace,
        ("workers_listen_mark", "listen"),
        who,
        f"slots poll meanwhile, reconnecting every {retry:g} s",
        logger,
    )


def wake_slots(listener: Listener, wakeup: Wakeup, stop: threading.Event, retry: float) -> None:
    """A worker's listening thread, until ``stop``: wake idle slots on each notification of
    :data:`WORKER_PAYLOADS`; reconnect ``retry`` seconds after the connection broke (slots
    poll meanwhile). Through a transaction pooler it does not listen (one WARNING) and slots
    poll for good."""
    try:
        while not stop.is_set():
            if not listener.connected:
                try:
                    listener.connect()
                except Exception as exc:  # psycopg's own errors come from here
                    listener.lost(exc)
                    stop.wait(retry)
                    continue
                if listener.pooled is not None:
                    pooled_warning(listener.who, listener.pooled, retry)
                    return
            try:
                for note in listener.notifications(STOP_CHECK):
                    if note.payload in WORKER_PAYLOADS:
                        wakeup.wake(queued=note.payload == "queued")
            except Exception as exc:
                listener.lost(exc)
                stop.wait(retry)
    finally:
        listener.close()
