"""Throw-away servers of the deployment tests (tests/test_deploy_*.py): a PgBouncer in front of
the suite's PostgreSQL, a PostgreSQL primary with a streaming standby, a MariaDB with binary
logging, a TCP forwarder that plays a database that is down and comes back.

Each one runs in a temporary directory on ports picked free at run time, is small (a few MB
of shared buffers, a handful of connections: the machine is shared), and is stopped, its
directory deleted, by the fixture that started it, also when the test fails. Binaries come
from Debian (``apt-get install pgbouncer postgresql-15 mariadb-server``: .ci/run installs the
missing ones); a test whose binary is missing is skipped, saying which package gives it.

PostgreSQL refuses to run as root: when the suite runs as root, the servers started here run
as the ``postgres`` system user (PgBouncer with ``-u postgres``, initdb and pg_ctl through
``runuser``), in directories given to it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import random
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pymysql
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL

#: Debian's PostgreSQL server binaries (pg_basebackup, pg_ctl, initdb), newest first.
_PG_BIN_DIRS = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)


def _ephemeral_ports() -> tuple[int, int]:
    """The kernel's range of ports for outgoing connections (Linux; its default elsewhere)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port() -> int:
    """A TCP port of 127.0.0.1 nothing listens on right now, outside the kernel's range for
    outgoing connections: a port the kernel picked from that range (bind to port 0) was taken
    by one of the suite's own client connections before the server it was for could listen
    on it (a Galera node aborted with "Address already in use" in a loaded run). At random,
    so that concurrent test processes rarely pick the same one, and tried first."""
    low, high = _ephemeral_ports()
    choices = [(10000, low)] if low > 11000 else [(high + 1, 65536)]
    for _ in range(200):
        port = random.randrange(*random.choice(choices))
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free TCP port outside the ephemeral range in 200 tries")


def _as_root() -> bool:
    return os.geteuid() == 0


def _server_user() -> str | None:
    """The system user the PostgreSQL-family servers run as when we are root."""
    if not _as_root():
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("running as root without a 'postgres' system user to run servers as")
    return "postgres"


def _workdir(prefix: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix=prefix))
    user = _server_user()
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(path, entry.pw_uid, entry.pw_gid)
    return path


def _run_as_server_user(command: Sequence[str]) -> list[str]:
    user = _server_user()
    return ["runuser", "-u", user, "--", *command] if user else list(command)


def _wait_for(what: str, check: object, timeout: float, log: Path | None = None) -> None:
    """Call ``check`` until it returns true, at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():  # type: ignore[operator]
                return
        except Exception:
            pass
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
            raise RuntimeError(f"{what} did not come up within {timeout:g} s: {tail}")
        time.sleep(0.05)


def _answers(url: URL) -> bool:
    engine = sa.create_engine(url, poolclass=sa.NullPool, connect_args={"connect_timeout": 2})
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
        return True
    finally:
        engine.dispose()


# -- PgBouncer -------------------------------------------------------------------------------


@dataclass
class PgBouncer:
    """A PgBouncer process in front of one PostgreSQL server, every database passed through,
    clients trusted. ``url(dbname)`` reaches ``dbname`` through it."""

    host: str
    port: int
    pool_mode: str
    workdir: Path
    process: subprocess.Popen[bytes]

    def url(self, dbname: str, **query: str) -> URL:
        return URL.create(
            "postgresql+psycopg",
            username="postgres",
            host=self.host,
            port=self.port,
            database=dbname,
            query=query,
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)

    @property
    def log(self) -> str:
        path = self.workdir / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""


def start_pgbouncer(
    server_host: str, server_port: int, *, pool_mode: str, pool_size: int = 2
) -> PgBouncer:
    """A PgBouncer in ``pool_mode`` (transaction or session) in front of the server, with
    at most ``pool_size`` server connections per (database, user): few, so that clients
    share them as they would under load."""
    binary = shutil.which("pgbouncer", path=f"{os.environ.get('PATH', '')}:/usr/sbin")
    if binary is None:
        pytest.skip("no pgbouncer on this machine (Debian: apt-get install pgbouncer)")
    workdir = _workdir("assetq-pgbouncer-")
    port = free_port()
    (workdir / "users.txt").write_text('"postgres" ""\n')
    (workdir / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host={server_host} port={server_port}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        f"auth_file = {workdir / 'users.txt'}\n"
        f"pool_mode = {pool_mode}\n"
        f"default_pool_size = {pool_size}\n"
        "max_client_conn = 100\n"
        # PgBouncer's defaults, written out because the tests rely on them: a server
        # connection goes back to the pool with DISCARD ALL in session mode, not in
        # transaction mode (so session state stays there for the next client).
        "server_reset_query = DISCARD ALL\n"
        "server_reset_query_always = 0\n"
        f"logfile = {workdir / 'pgbouncer.log'}\n"
        f"pidfile = {workdir / 'pgbouncer.pid'}\n"
    )
    user = _server_user()
    command = [binary, *(["-u", user] if user else []), str(workdir / "pgbouncer.ini")]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    bouncer = PgBouncer("127.0.0.1", port, pool_mode, workdir, process)
    try:
        _wait_for(
            "pgbouncer", lambda: _answers(bouncer.url("postgres")), 30, workdir / "pgbouncer.log"
        )
    except BaseException:
        bouncer.stop()
        raise
    return bouncer


# -- PostgreSQL primary and streaming standby ---------------------------------------------------


def _pg_binary(name: str) -> str:
    for directory in _PG_BIN_DIRS:
        if (directory / name).exists():
            return str(directory / name)
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"no {name} on this machine (Debian: apt-get install postgresql-15)")
    return found


@dataclass
class PgNode:
    """One throw-away PostgreSQL server (a primary or a standby) in ``datadir``."""

    name: str
    port: int
    datadir: Path

    @property
    def log(self) -> Path:
        return self.datadir.parent / f"{self.name}.log"

    def url(self, dbname: str = "postgres") -> URL:
        return URL.create(
            "postgresql+psycopg",
            username="postgres",
            host="127.0.0.1",
            port=self.port,
            database=dbname,
        )

    def pg_ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = _run_as_server_user([_pg_binary("pg_ctl"), "-D", str(self.datadir), *args])
        return subprocess.run(command, capture_output=True, text=True, check=check, timeout=120)

    def start(self) -> None:
        options = f"-c port={self.port} -c unix_socket_directories={self.datadir.parent}"
        self.pg_ctl("start", "-w", "-t", "60", "-l", str(self.log), "-o", options)

    def postmaster_pid(self) -> int | None:
        pidfile = self.datadir / "postmaster.pid"
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int(pidfile.read_text().splitlines()[0])
        return None

    def crash(self) -> None:
        """kill -9 of the postmaster and every process of the server: a machine that died."""
        kill_server(self.postmaster_pid())

    def stop(self) -> None:
        if self.postmaster_pid() is not None:
            done = self.pg_ctl("stop", "-m", "immediate", "-w", "-t", "30", check=False)
            if done.returncode != 0:
                self.crash()


def kill_server(postmaster: int | None) -> None:
    """kill -9 of ``postmaster`` (None: nothing runs) and every process it started."""
    if postmaster is None:
        return
    for victim in [postmaster, *_children(postmaster)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)


#: Fields of /proc/<pid>/stat after the command's closing parenthesis, by position.
STAT_PARENT, STAT_SESSION = 1, 3


def processes_where(field: int, value: int) -> list[int]:
    """The processes whose /proc/<pid>/stat field ``field`` (STAT_PARENT, STAT_SESSION) is
    ``value``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[field]) == value:
                found.append(int(entry.name))
    return found


def _children(pid: int) -> list[int]:
    return processes_where(STAT_PARENT, pid)


@dataclass
class ReplicatedPostgres:
    """A primary and a standby streaming from it (``synchronous``: every commit waits until
    the standby has flushed its WAL)."""

    primary: PgNode
    standby: PgNode
    workdir: Path
    synchronous: bool

    def multi_host_url(self, dbname: str) -> URL:
        """Both nodes in one libpq multi-host URL: connections go to whichever accepts
        writes."""
        return URL.create(
            "postgresql+psycopg",
            username="postgres",
            database=dbname,
            query={
                "host": (
                    f"127.0.0.1:{self.primary.port}",
                    f"127.0.0.1:{self.standby.port}",
                ),
                "target_session_attrs": "read-write",
                "connect_timeout": "3",
            },
        )

    def wait_replayed(self, timeout: float = 60) -> None:
        """Until the standby has replayed everything the primary wrote so far."""
        primary = sa.create_engine(self.primary.url(), poolclass=sa.NullPool)
        standby = sa.create_engine(self.standby.url(), poolclass=sa.NullPool)
        try:
            with primary.connect() as conn:
                lsn = conn.execute(sa.text("SELECT pg_current_wal_lsn()")).scalar_one()

            def replayed() -> bool:
                with standby.connect() as conn:
                    return bool(
                        conn.execute(
                            sa.text("SELECT pg_last_wal_replay_lsn() >= CAST(:lsn AS pg_lsn)"),
                            {"lsn": str(lsn)},
                        ).scalar_one()
                    )

            _wait_for("standby replay", replayed, timeout, self.standby.log)
        finally:
            primary.dispose()
            standby.dispose()

    def promote(self) -> None:
        """Promote the standby, as an operator (or Patroni) does: pg_ctl promote, then, when
        replication was synchronous, synchronous_standby_names cleared on the new primary.
        It came with the base backup, and with no standby of its own left every commit
        there would wait for one forever (seen here: producers and passes hung at COMMIT)."""
        self.standby.pg_ctl("promote", "-w", "-t", "60")
        if self.synchronous:
            engine = sa.create_engine(self.standby.url(), isolation_level="AUTOCOMMIT")
            try:
                with engine.connect() as conn:
                    conn.execute(sa.text("ALTER SYSTEM SET synchronous_standby_names = ''"))
                    conn.execute(sa.text("SELECT pg_reload_conf()"))
            finally:
                engine.dispose()

    def stop(self) -> None:
        try:
            self.standby.stop()
        finally:
            try:
                self.primary.stop()
            finally:
                shutil.rmtree(self.workdir, ignore_errors=True)


def _initdb(node: PgNode) -> None:
    """initdb ``node``'s data directory: trust authentication, UTF8, C locale, no sync."""
    subprocess.run(
        _run_as_server_user(
            [
                _pg_binary("initdb"),
                "-D",
                str(node.datadir),
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "-E",
                "UTF8",
                "--locale=C",
            ]
        ),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )


@contextlib.contextmanager
def lone_postgres(*settings: str) -> Iterator[PgNode]:
    """A throw-away PostgreSQL server on a free loopback port (small: 16 MB of shared
    buffers, 20 connections), with ``settings`` added to its postgresql.conf; stopped and
    removed afterwards."""
    workdir = _workdir("assetq-pg-lone-")
    node = PgNode("lone", free_port(), workdir / "lone")
    try:
        _initdb(node)
        lines = [
            "listen_addresses = '127.0.0.1'",
            "shared_buffers = 16MB",
            "max_connections = 20",
            "log_min_messages = warning",
            *settings,
        ]
        with (node.datadir / "postgresql.conf").open("a") as conf:
            conf.write("\n".join(lines) + "\n")
        node.start()
        yield node
    finally:
        node.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def start_replicated_postgres(*, synchronous: bool = True) -> ReplicatedPostgres:
    """initdb a primary (small: 16 MB of shared buffers, 30 connections, no fsync: its data
    only has to outlive processes, not the machine), pg_basebackup a standby from it, start
    both. With ``synchronous`` the primary waits for the standby on every commit
    (synchronous_standby_names = '*', synchronous_commit = on)."""
    workdir = _workdir("assetq-pg-replicated-")
    primary = PgNode("primary", free_port(), workdir / "primary")
    standby = PgNode("standby", free_port(), workdir / "standby")
    pair = ReplicatedPostgres(primary, standby, workdir, synchronous)
    try:
        _initdb(primary)
        settings = [
            "listen_addresses = '127.0.0.1'",
            "shared_buffers = 16MB",
            "max_connections = 30",
            "max_wal_senders = 4",
            "wal_level = replica",
            "fsync = off",
            "full_page_writes = off",
            "hot_standby = on",
            "wal_keep_size = 64MB",
            "log_min_messages = warning",
        ]
        if synchronous:
            settings += ["synchronous_standby_names = '*'", "synchronous_commit = on"]
        with (primary.datadir / "postgresql.conf").open("a") as conf:
            conf.write("\n".join(settings) + "\n")
        primary.start()
        subprocess.run(
            _run_as_server_user(
                [
                    _pg_binary("pg_basebackup"),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(primary.port),
                    "-U",
                    "postgres",
                    "-D",
                    str(standby.datadir),
                    "-R",  # standby.signal and primary_conninfo
                    "-X",
                    "stream",
                    "--no-sync",
                ]
            ),
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        standby.start()
        _wait_for("standby", lambda: _answers(standby.url()), 60, standby.log)
        if synchronous:
            # Until the standby is the synchronous one, commits would wait or not say so.
            engine = sa.create_engine(primary.url(), poolclass=sa.NullPool)

            def streaming_sync() -> bool:
                with engine.connect() as conn:
                    return bool(
                        conn.execute(
                            sa.text(
                                "SELECT count(*) FROM pg_stat_replication"
                                " WHERE state = 'streaming' AND sync_state = 'sync'"
                            )
                        ).scalar_one()
                    )

            try:
                _wait_for("synchronous replication", streaming_sync, 60, primary.log)
            finally:
                engine.dispose()
    except BaseException:
        pair.stop()
        raise
    return pair


# -- MariaDB with binary logging ---------------------------------------------------------------


@dataclass
class BinlogMariaDB:
    """A private mariadbd (pytest-mysql's executor) with binary logging on."""

    executor: object
    workdir: Path
    port: int

    def url(self, database: str | None = None) -> URL:
        return URL.create(
            "mysql+pymysql",
            username="root",
            host="127.0.0.1",
            port=self.port,
            database=database,
            query={"charset": "utf8mb4"},
        )

    def stop(self) -> None:
        try:
            self.executor.stop()  # type: ignore[attr-defined]
        except Exception:
            with contextlib.suppress(Exception):
                self.executor.kill()  # type: ignore[attr-defined]
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_binlog_mariadb(binlog_format: str) -> BinlogMariaDB:
    """mariadbd with ``--log-bin --binlog-format=<binlog_format>``, started with pytest-mysql's
    process executor (the plain server it knows how to run), small buffers, TCP on a free
    port."""
    from pytest_mysql.executor import MySQLExecutor

    search = f"{os.environ.get('PATH', '')}:/usr/sbin:/usr/bin"
    mysqld = shutil.which("mariadbd", path=search) or shutil.which("mysqld", path=search)
    mysqld_safe = shutil.which("mariadbd-safe", path=search) or shutil.which(
        "mysqld_safe", path=search
    )
    admin = shutil.which("mariadb-admin", path=search) or shutil.which("mysqladmin", path=search)
    install_db = shutil.which("mariadb-install-db", path=search) or shutil.which(
        "mysql_install_db", path=search
    )
    if not (mysqld and mysqld_safe and admin and install_db):
        pytest.skip("no MariaDB server binaries here (Debian: apt-get install mariadb-server)")
    workdir = Path(tempfile.mkdtemp(prefix="assetq-binlog-"))
    port = free_port()
    user = "root" if _as_root() else os.environ.get("USER", "mysql")
    executor = MySQLExecutor(
        mysqld_safe=Path(f"{mysqld_safe} --no-defaults"),
        mysqld=Path(mysqld),
        admin_exec=admin,
        logfile_path=str(workdir / "error.log"),
        params=(
            f"--log-bin={workdir / 'binlog'} --binlog-format={binlog_format} --server-id=1"
            " --innodb-buffer-pool-size=32M --innodb-flush-log-at-trx-commit=2"
            " --bind-address=127.0.0.1 --max-connections=50 --skip-name-resolve"
        ),
        base_directory=workdir,
        user=user,
        host="127.0.0.1",
        port=port,
        timeout=60,
        install_db=install_db,
    )
    server = BinlogMariaDB(executor, workdir, port)
    try:
        # The executor runs mysqld_safe and install-db with the machine's option files
        # (/etc/mysql: user=mysql, the shared server's log file): this server must read none.
        # So its data directory is initialised here, with --no-defaults, and mysqld_safe got
        # --no-defaults as its first option (the executor puts the path first in the command).
        subprocess.run(
            [
                install_db,
                "--no-defaults",
                f"--datadir={executor.datadir}",
                f"--user={user}",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--skip-name-resolve",
                f"--tmpdir={workdir}",
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=180,
        )
        executor._initialised = True
        executor.start()
        _wait_for("mariadbd", lambda: _answers(server.url()), 60, workdir / "error.log")
    except BaseException:
        server.stop()
        raise
    return server


# -- a database that is down, then comes back ----------------------------------------------------


class TcpForwarder:
    """Forwards connections on ``port`` to ``target``: before :meth:`start` (and after
    :meth:`stop`) nothing listens there, as with a database that is down. A ``target_host``
    that is a directory is a PostgreSQL server's unix socket directory (the embedded server
    listens there only), ``target_port`` its port."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.port = free_port()
        self._target = (target_host, target_port)
        self._server: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", self.port))
        server.listen(16)
        self._server = server
        thread = threading.Thread(target=self._accept, args=(server,), daemon=True)
        thread.start()
        self._threads.append(thread)

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            try:
                upstream = self._connect_upstream()
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                thread = threading.Thread(target=self._pipe, args=(a, b), daemon=True)
                thread.start()
                self._threads.append(thread)

    def _connect_upstream(self) -> socket.socket:
        host, port = self._target
        if not host.startswith("/"):
            return socket.create_connection(self._target, timeout=5)
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        upstream.settimeout(5)
        try:
            upstream.connect(f"{host}/.s.PGSQL.{port}")
        except OSError:
            upstream.close()
            raise
        return upstream

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)

    def stop(self) -> None:
        """Stop listening and cut every forwarded connection."""
        if self._server is not None:
            with contextlib.suppress(OSError):
                self._server.shutdown(socket.SHUT_RDWR)  # wakes accept() (close alone does not)
            with contextlib.suppress(OSError):
                self._server.close()
            self._server = None
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads = []


@contextlib.contextmanager
def stopped_at_end(server: object) -> Iterator[object]:
    try:
        yield server
    finally:
        server.stop()  # type: ignore[attr-defined]


# -- MariaDB Galera cluster -----------------------------------------------------------------------
#
# How a cluster starts here, fast and the same way every time (measured on 2 shared cores):
#
# - One data directory is made once (mariadb-install-db) and run alone as a cluster of one
#   (the "seed run") so that it gets the cluster's identity (grastate.dat: a uuid and a
#   seqno). The seed is stopped *cleanly* (SQL SHUTDOWN once it answers), and that is
#   checked: a SIGTERM sent while mariadbd was still starting was seen to hang it until the
#   SIGKILL 60 s later (2 seed runs in 3 here), leaving its socket, seqno -1 and
#   gvwstate.dat behind. Copied to the joiners, the socket broke the copy (ENXIO); without
#   it, each joiner restored node0's own gcomm uuid from gvwstate.dat and exited at once
#   ("131: A node with the same UUID already exists in the cluster"), while the old wait
#   polled it for 120 s. pc.recovery=0 keeps gvwstate.dat from being written at all, and a
#   node that exits while it is waited for fails the start at once, with its log.
# - Every node starts from a copy of that directory: joiners are at the cluster's position,
#   so they need no full state transfer (SST), only rsync's bypass handshake and an
#   incremental one (IST) of the few configuration changes since, from node0's gcache.
# - Node0 bootstraps (--wsrep-new-cluster); joiners start one at a time, each once the one
#   before is Synced (two joiners at once compete for the one donor).
# - Nodes are stopped with SIGKILL of their process group: the data is thrown away, and the
#   group includes the SST scripts' rsync daemons, which would outlive a killed mariadbd.


@dataclass
class GaleraNode:
    """One private mariadbd of a Galera cluster; ``home`` holds its data, socket and log."""

    name: str
    port: int
    home: Path
    command: list[str]
    process: subprocess.Popen[bytes] | None = None

    def url(self, database: str | None = None) -> URL:
        return URL.create(
            "mysql+pymysql",
            username="root",
            host="127.0.0.1",
            port=self.port,
            database=database,
            query={"charset": "utf8mb4"},
        )

    @property
    def log(self) -> Path:
        return self.home / "error.log"

    @property
    def socket(self) -> Path:
        return self.home / "mysqld.sock"

    @property
    def datadir(self) -> Path:
        return self.home / "data"

    def start(self, *extra: str) -> None:
        # A process group of its own: kill() takes the SST scripts' children with it.
        self.process = subprocess.Popen(
            [*self.command, *extra],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def _connect(self, via_socket: bool) -> pymysql.connections.Connection[Any]:
        """The driver's own connection (the seed run listens on the unix socket only).
        Not SQLAlchemy's: its first connect runs queries and a rollback, which a node that is
        not ready refuses (1047) and its pool logs as a traceback."""
        if via_socket:
            return pymysql.connect(user="root", unix_socket=str(self.socket), connect_timeout=2)
        return pymysql.connect(user="root", host="127.0.0.1", port=self.port, connect_timeout=2)

    def state(self, via_socket: bool = False) -> str | None:
        """wsrep_local_state_comment (Synced, Joining, Donor/Desynced...), None if it does
        not answer."""
        try:
            conn = self._connect(via_socket)
        except (pymysql.err.Error, OSError):
            return None
        try:
            with conn.cursor() as cursor:
                cursor.execute("SHOW STATUS LIKE 'wsrep_local_state_comment'")
                row = cursor.fetchone()
            return str(row[1]) if row else None
        except pymysql.err.Error:
            return None
        finally:
            conn.close()

    def synced(self) -> bool:
        return self.state() == "Synced"

    def wait_synced(self, timeout: float, via_socket: bool = False) -> None:
        """Until the node says Synced; fails at once, with its log, if mariadbd exits."""
        deadline = time.monotonic() + timeout
        while self.state(via_socket) != "Synced":
            exited = self.process is not None and self.process.poll() is not None
            if exited or time.monotonic() > deadline:
                why = "exited" if exited else f"was not Synced within {timeout:g} s"
                raise RuntimeError(f"galera {self.name} {why}: {self._log_tail()}")
            time.sleep(0.1)

    def shutdown(self, via_socket: bool = False, timeout: float = 60) -> None:
        """A clean shutdown (SQL SHUTDOWN), waited for: the node saves its position."""
        assert self.process is not None
        conn = self._connect(via_socket)
        try:
            with conn.cursor() as cursor:
                cursor.execute("SHUTDOWN")
        except pymysql.err.Error:
            pass  # the server may close the connection before answering
        finally:
            with contextlib.suppress(pymysql.err.Error, OSError):
                conn.close()
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(
                f"galera {self.name} did not shut down within {timeout:g} s: {self._log_tail()}"
            ) from None
        if code != 0:
            raise RuntimeError(f"galera {self.name} exited {code}: {self._log_tail()}")

    def kill(self) -> None:
        """kill -9 of mariadbd and whatever it started (a machine that died)."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        self.kill()

    def _log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""


@dataclass
class GaleraCluster:
    nodes: list[GaleraNode]
    workdir: Path

    def stop(self) -> None:
        try:
            for node in self.nodes:
                node.stop()
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)


def start_galera(size: int = 3, *, timeout: float = 90) -> GaleraCluster:
    """``size`` private mariadbd processes (small: 32 MB buffer pool, 16 MB gcache) in one
    galera-4 cluster on free ports, every node Synced (the section comment above says how
    and why). ``timeout`` bounds each node's start: a hang fails with the node's log."""
    provider = Path("/usr/lib/galera/libgalera_smm.so")
    search = f"{os.environ.get('PATH', '')}:/usr/sbin:/usr/bin"
    mysqld = shutil.which("mariadbd", path=search)
    install_db = shutil.which("mariadb-install-db", path=search)
    if not provider.exists() or mysqld is None or install_db is None:
        pytest.skip("no galera-4 or MariaDB here (Debian: apt-get install galera-4 mariadb-server)")
    if shutil.which("rsync") is None:
        pytest.skip("no rsync here (Galera's state transfer; Debian: apt-get install rsync)")
    workdir = Path(tempfile.mkdtemp(prefix="assetq-galera-"))
    os.chmod(workdir, 0o755)  # the joiners' rsync daemon runs as nobody
    ports = [(free_port(), free_port(), free_port(), free_port()) for _ in range(size)]
    address = "gcomm://" + ",".join(f"127.0.0.1:{p[1]}" for p in ports)
    user = ["--user=root"] if _as_root() else []
    # Small redo logs: the seed's directory is copied to every joiner (10.11's default is
    # 96 MB a node).
    innodb = ["--innodb-log-file-size=8M", "--innodb-buffer-pool-size=32M"]
    nodes = []
    for i, (port, gcomm, ist, sst) in enumerate(ports):
        home = workdir / f"node{i}"
        provider_options = [
            f"base_port={gcomm}",  # not galera's default 4567, which others may use
            f"gmcast.listen_addr=tcp://127.0.0.1:{gcomm}",
            f"ist.recv_addr=127.0.0.1:{ist}",
            "gcache.size=16M",
            "evs.join_retrans_period=PT0.25S",
            # No gvwstate.dat: a node's saved view (its own gcomm uuid) must never reach a
            # copy of its directory, and nothing here restarts a whole cluster.
            "pc.recovery=0",
        ]
        nodes.append(
            GaleraNode(
                f"node{i}",
                port,
                home,
                [
                    mysqld,
                    "--no-defaults",
                    f"--datadir={home / 'data'}",
                    f"--socket={home / 'mysqld.sock'}",
                    f"--pid-file={home / 'mysqld.pid'}",
                    f"--log-error={home / 'error.log'}",
                    f"--tmpdir={home}",
                    f"--port={port}",
                    "--bind-address=127.0.0.1",
                    "--skip-name-resolve",
                    *user,
                    *innodb,
                    "--innodb-flush-log-at-trx-commit=2",
                    "--innodb-autoinc-lock-mode=2",
                    "--binlog-format=ROW",
                    "--max-connections=60",
                    "--wsrep-on=ON",
                    f"--wsrep-provider={provider}",
                    f"--wsrep-cluster-address={address}",
                    "--wsrep-cluster-name=assetq_test",
                    "--wsrep-node-address=127.0.0.1",
                    f"--wsrep-node-name=node{i}",
                    f"--wsrep-sst-receive-address=127.0.0.1:{sst}",
                    "--wsrep-sst-method=rsync",
                    f"--wsrep-provider-options={';'.join(provider_options)}",
                ],
            )
        )
    cluster = GaleraCluster(nodes, workdir)
    try:
        seed = nodes[0]
        seed.home.mkdir()
        subprocess.run(
            [
                install_db,
                "--no-defaults",
                f"--datadir={seed.datadir}",
                *user,
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--skip-name-resolve",
                *innodb,
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=180,
        )
        # The seed run: a cluster of one, on no TCP port, stopped cleanly once it answers.
        seed.start("--wsrep-new-cluster", "--skip-networking")
        seed.wait_synced(timeout, via_socket=True)
        seed.shutdown(via_socket=True)
        grastate = (seed.datadir / "grastate.dat").read_text()
        if re.search(r"seqno:\s+-1", grastate) or (seed.datadir / "gvwstate.dat").exists():
            raise RuntimeError(f"the seed run saved no cluster position: {grastate}")
        for node in nodes[1:]:
            # Not the seed's gcache (16 MB of nothing a joiner needs): each node makes its own.
            shutil.copytree(
                seed.datadir, node.datadir, ignore=shutil.ignore_patterns("galera.cache")
            )
        for node in nodes:
            for directory, _, _ in os.walk(node.home):
                os.chmod(directory, 0o777)  # rsync's daemon (nobody) writes there
        for i, node in enumerate(nodes):
            node.start(*(["--wsrep-new-cluster"] if i == 0 else []))
            node.wait_synced(timeout)
    except BaseException:
        cluster.stop()
        raise
    return cluster
