"""A throw-away Patroni cluster for the deployment tests (tests/test_deploy_patroni.py): one
etcd and three PostgreSQL nodes, each under its own Patroni, on free loopback ports in a
temporary directory, from Debian's packages (``apt-get install patroni etcd-server``:
.ci/run installs them; a test without them is skipped, saying so).

Patroni fails over by itself: when the leader's postmaster dies (``primary_start_timeout:
0``: no restart in place first) or its Patroni stops renewing the leader key (``ttl``), a
replica is promoted, in ``synchronous_mode`` only the synchronous one, so nothing a commit
acknowledged is lost. Clients reach the leader through a libpq multi-host URL with
``target_session_attrs=read-write``. The settings are small (16 MB of shared buffers, no
fsync: the data only has to outlive processes, not the machine) and the timings short
(``ttl`` 20 s, ``loop_wait`` 1 s), so a failover takes seconds, not minutes.

Everything runs as the ``postgres`` system user when the suite runs as root (PostgreSQL
refuses root), as in tests/servers.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL

from servers import (
    STAT_SESSION,
    _pg_binary,
    _run_as_server_user,
    _wait_for,
    _workdir,
    free_port,
    kill_server,
    processes_where,
)

#: The DCS settings: a leader key that lives 20 s (Patroni's minimum), renewed every second;
#: a crashed primary is failed over at once instead of being restarted in place.
TTL = 20


def _get(url: str, timeout: float = 2.0) -> tuple[int, Any]:
    """GET ``url``: (status, JSON body or None); (0, None) when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as exc:
        with contextlib.suppress(ValueError):
            return exc.code, json.loads(exc.read() or b"null")
        return exc.code, None
    except (OSError, ValueError):
        return 0, None


@dataclass
class PatroniNode:
    name: str
    pg_port: int
    api_port: int
    datadir: Path
    config: Path
    log: Path
    process: subprocess.Popen[bytes] | None = None

    def url(self, dbname: str = "postgres") -> URL:
        return URL.create(
            "postgresql+psycopg", username="postgres", host="127.0.0.1", port=self.pg_port,
            database=dbname,
        )  # fmt: skip

    def api(self, path: str) -> tuple[int, Any]:
        return _get(f"http://127.0.0.1:{self.api_port}{path}")

    def is_leader(self) -> bool:
        return self.api("/primary")[0] == 200

    def postmaster_pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int((self.datadir / "postmaster.pid").read_text().splitlines()[0])
        return None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                _run_as_server_user(["patroni", str(self.config)]),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def kill_postmaster(self) -> None:
        """kill -9 of the postmaster alone: the server crashes, its Patroni lives on."""
        pid = self.postmaster_pid()
        assert pid is not None, f"{self.name} runs no postmaster"
        os.kill(pid, signal.SIGKILL)

    def reset(self) -> None:
        """What Patroni's watchdog does to a node whose Patroni stopped feeding it, before
        its leader key expires: the machine is reset, here every process of its PostgreSQL
        killed (kill -9)."""
        kill_server(self.postmaster_pid())

    def kill_patroni(self) -> None:
        """kill -9 of this node's Patroni alone: its PostgreSQL runs on, unmanaged."""
        assert self.process is not None
        # runuser forks Patroni: the session's processes other than the postmaster's tree.
        for pid in _session_pids(self.process.pid):
            if pid != self.postmaster_pid() and not _in_tree(pid, self.postmaster_pid()):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.process.wait(30)
        self.process = None

    def stop(self) -> None:
        """Patroni stopped (SIGTERM stops its PostgreSQL too), then whatever is left killed."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(30)
        if self.process is not None:
            for pid in _session_pids(self.process.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        kill_server(self.postmaster_pid())


def _session_pids(session: int) -> list[int]:
    """Every process of the session (and process group) ``session`` leads."""
    return processes_where(STAT_SESSION, session)


def _in_tree(pid: int, root: int | None) -> bool:
    """Whether ``pid`` descends from ``root``."""
    while root is not None and pid > 1:
        if pid == root:
            return True
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return False
        pid = int(fields[1])
    return False


@dataclass
class PatroniCluster:
    workdir: Path
    synchronous: bool
    etcd: subprocess.Popen[bytes]
    etcd_port: int
    nodes: list[PatroniNode] = field(default_factory=list)

    def multi_host_url(self, dbname: str) -> URL:
        """Every node in one libpq multi-host URL: connections go to whichever accepts
        writes."""
        return URL.create(
            "postgresql+psycopg",
            username="postgres",
            database=dbname,
            query={
                "host": tuple(f"127.0.0.1:{n.pg_port}" for n in self.nodes),
                "target_session_attrs": "read-write",
                "connect_timeout": "3",
            },
        )

    def leader(self, timeout: float = 90) -> PatroniNode:
        """The node whose Patroni says it is the leader, once one does."""
        found: list[PatroniNode] = []

        def one() -> bool:
            found[:] = [n for n in self.nodes if n.is_leader()]
            return len(found) == 1

        _wait_for("a Patroni leader", one, timeout, self.nodes[0].log)
        return found[0]

    def new_leader(self, old: PatroniNode, timeout: float = 120) -> PatroniNode:
        """The node other than ``old`` that Patroni promoted, once one is."""
        found: list[PatroniNode] = []

        def promoted() -> bool:
            found[:] = [n for n in self.nodes if n is not old and n.is_leader()]
            return len(found) == 1

        wait_until(f"a node other than {old.name} promoted", promoted, timeout)
        return found[0]

    def members(self) -> list[dict[str, Any]]:
        for node in self.nodes:
            status, body = node.api("/cluster")
            if status == 200 and body:
                return list(body.get("members", []))
        return []

    def wait_healthy(self, timeout: float = 120) -> None:
        """Until one node is the leader and every other one streams from it (in synchronous
        mode, one of them synchronously), by the leader's pg_stat_replication (a replica can
        be "running" to Patroni while it cannot stream yet: its slot not made again) and by
        Patroni's members (a synchronous standby streams before Patroni has recorded it, and
        until then a crashed leader is restarted in place, not failed over)."""

        def healthy() -> bool:
            leaders = [n for n in self.nodes if n.is_leader()]
            if len(leaders) != 1:
                return False
            engine = sa.create_engine(leaders[0].url(), poolclass=sa.NullPool)
            try:
                with engine.connect() as conn:
                    streaming, sync = conn.execute(
                        sa.text(
                            "SELECT count(*) FILTER (WHERE state = 'streaming'),"
                            " count(*) FILTER (WHERE state = 'streaming' AND sync_state = 'sync')"
                            " FROM pg_stat_replication"
                        )
                    ).one()
            finally:
                engine.dispose()
            if streaming != len(self.nodes) - 1 or (self.synchronous and sync != 1):
                return False
            # Patroni's own view too: the synchronous standby recorded in etcd (the only
            # node it may promote in synchronous mode) and every member up.
            roles = sorted(str(m.get("role")) for m in self.members())
            wanted = ["leader", "replica", "replica"][: len(self.nodes)]
            if self.synchronous:
                wanted = sorted(["leader", "sync_standby", *["replica"] * (len(self.nodes) - 2)])
            return roles == wanted

        _wait_for("a healthy Patroni cluster", healthy, timeout, self.nodes[0].log)

    def logs(self) -> str:
        """Each node's last Patroni lines (its decisions) and last PostgreSQL lines."""
        parts = []
        for n in self.nodes:
            lines = n.log.read_text(errors="replace").splitlines()
            patroni = [line for line in lines if " INFO: " in line or "WARNING: " in line]
            decisions = [line for line in patroni if "INFO: no action" not in line]
            postgres = [
                line
                for line in lines
                if line not in set(patroni)
                and re.search(r"promot|redo done|last completed|timeline|shut|standby|FATAL", line)
            ]
            parts.append(
                f"--- {n.name}: Patroni\n" + "\n".join(decisions[-40:])
                + f"\n--- {n.name}: PostgreSQL\n" + "\n".join(postgres[-30:])
            )  # fmt: skip
        return "\n".join(parts)

    def stop(self) -> None:
        try:
            for node in self.nodes:
                node.stop()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.etcd.pid, signal.SIGKILL)
            self.etcd.wait(30)
            shutil.rmtree(self.workdir, ignore_errors=True)


def _node_config(
    cluster: PatroniCluster, node: PatroniNode, bin_dir: str, synchronous: bool
) -> dict[str, Any]:
    parameters = {
        "shared_buffers": "16MB",
        "max_connections": 40,
        "fsync": "off",
        "full_page_writes": "on",
        "wal_log_hints": "on",
        "wal_keep_size": "64MB",
        "log_min_messages": "warning",
        "unix_socket_directories": str(cluster.workdir),
    }
    return {
        "scope": f"assetq-{cluster.workdir.name}",
        "name": node.name,
        "log": {"level": "INFO"},
        "restapi": {
            "listen": f"127.0.0.1:{node.api_port}",
            "connect_address": f"127.0.0.1:{node.api_port}",
        },
        "etcd3": {"hosts": [f"127.0.0.1:{cluster.etcd_port}"]},
        "bootstrap": {
            "dcs": {
                "ttl": TTL,
                "loop_wait": 1,
                "retry_timeout": 5,
                "primary_start_timeout": 0,
                "maximum_lag_on_failover": 16 * 1024 * 1024,
                "synchronous_mode": synchronous,
                "synchronous_mode_strict": False,
                "postgresql": {
                    "use_pg_rewind": True,
                    "use_slots": True,
                    "parameters": {"max_wal_senders": 10, "max_replication_slots": 10},
                },
            },
            "initdb": [{"encoding": "UTF8"}, {"locale": "C"}, {"auth": "trust"}, "no-sync"],
        },
        "postgresql": {
            "listen": f"127.0.0.1:{node.pg_port}",
            "connect_address": f"127.0.0.1:{node.pg_port}",
            "data_dir": str(node.datadir),
            "bin_dir": bin_dir,
            "pgpass": str(cluster.workdir / f"{node.name}.pgpass"),
            "authentication": {
                "superuser": {"username": "postgres"},
                "replication": {"username": "postgres"},
                "rewind": {"username": "postgres"},
            },
            "pg_hba": [
                "local all all trust",
                "host all all 127.0.0.1/32 trust",
                "host replication all 127.0.0.1/32 trust",
            ],
            "parameters": parameters,
        },
        "tags": {"nofailover": False, "noloadbalance": False},
    }


@contextlib.contextmanager
def patroni_cluster(*, synchronous: bool, size: int = 3) -> Iterator[PatroniCluster]:
    """etcd and ``size`` PostgreSQL nodes under Patroni, healthy; stopped and removed
    afterwards, also when a test fails."""
    for binary, package in (("patroni", "patroni"), ("etcd", "etcd-server")):
        if shutil.which(binary) is None:
            pytest.skip(f"no {binary} on this machine (Debian: apt-get install {package})")
    bin_dir = str(Path(_pg_binary("pg_ctl")).parent)
    workdir = _workdir("assetq-patroni-")
    etcd_port, peer_port = free_port(), free_port()
    with (workdir / "etcd.log").open("ab") as log:
        etcd = subprocess.Popen(
            _run_as_server_user([
                "etcd", "--name", "etcd0", "--data-dir", str(workdir / "etcd"),
                "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
                "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
                "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
                "--initial-cluster", f"etcd0=http://127.0.0.1:{peer_port}",
                "--unsafe-no-fsync",
            ]),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
    cluster = PatroniCluster(workdir, synchronous, etcd, etcd_port)
    try:
        _wait_for(
            "etcd",
            lambda: _get(f"http://127.0.0.1:{etcd_port}/health")[0] == 200,
            30,
            workdir / "etcd.log",
        )
        for n in range(size):
            name = f"n{n}"
            node = PatroniNode(
                name,
                free_port(),
                free_port(),
                workdir / name,
                workdir / f"{name}.yml",
                workdir / f"{name}.log",
            )
            cluster.nodes.append(node)
            config = _node_config(cluster, node, bin_dir, synchronous)
            node.config.write_text(json.dumps(config, indent=1))  # JSON is YAML
            _chown_to_server_user(workdir)
        cluster.nodes[0].start()
        cluster.leader()
        for node in cluster.nodes[1:]:
            node.start()
        cluster.wait_healthy()
        yield cluster
    except BaseException:
        print(cluster.logs())
        raise
    finally:
        cluster.stop()


def _chown_to_server_user(path: Path) -> None:
    owner = path.stat()
    for entry in path.iterdir():
        with contextlib.suppress(OSError):
            os.chown(entry, owner.st_uid, owner.st_gid)


def wait_until(what: str, check: Any, timeout: float) -> None:
    """Call ``check`` until it returns true, at most ``timeout`` seconds (a hang's guard)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {timeout:g} s")
        time.sleep(0.1)
