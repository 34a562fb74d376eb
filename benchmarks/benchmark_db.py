"""What the benchmarks that make a database of their own share (benchmarks/wakeup_gap.py,
benchmarks/web_pages.py): the database, made for the run and dropped after, and the
nearest-rank percentile their tables show."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url

import assetq


def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))]


@dataclass
class Server:
    """One engine's database made for the run."""

    name: str  # postgresql | mysql
    url: URL  # what the command-line processes get
    namespace: str
    engine: sa.Engine
    version: str
    admin: URL

    def drop(self) -> None:
        self.engine.dispose()
        admin = sa.create_engine(self.admin, poolclass=sa.NullPool, isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                if self.name == "postgresql":
                    conn.execute(
                        sa.text(f'DROP DATABASE IF EXISTS "{self.url.database}" WITH (FORCE)')
                    )
                else:
                    conn.execute(sa.text(f"DROP DATABASE IF EXISTS `{self.namespace}`"))
        finally:
            admin.dispose()

    @property
    def cli_url(self) -> str:
        return self.url.render_as_string(hide_password=False)

    def libpq(self) -> str:
        """The database as a libpq connection string (procrastinate)."""
        url = self.url
        parts = {
            "host": url.host or "127.0.0.1",
            "port": url.port or 5432,
            "user": url.username or "postgres",
            "dbname": url.database,
            "password": url.password,
        }
        return " ".join(f"{k}={v}" for k, v in parts.items() if v is not None)

    def q(self, table: str) -> str:
        """A table of the namespace, quoted."""
        if self.name == "postgresql":
            return f'"{self.namespace}"."{table}"'
        return f"`{self.namespace}`.`{table}`"


def make_server(engine_name: str, server_url: str, name: str) -> Server:
    """assetq installed in a database ``name`` made on the PostgreSQL server at
    ``server_url`` (namespace assetq), or in namespace ``name`` on the MySQL one; dropped
    again if the install fails."""
    if engine_name == "postgresql":
        admin = make_url(server_url).set(drivername="postgresql+psycopg")
        eng = sa.create_engine(admin, poolclass=sa.NullPool, isolation_level="AUTOCOMMIT")
        with eng.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        eng.dispose()
        url = admin.set(database=name)
        namespace = "assetq"
    else:
        admin = make_url(server_url).set(drivername="mysql+pymysql", database=None)
        if "charset" not in admin.query:
            admin = admin.update_query_dict({"charset": "utf8mb4"})
        url = admin
        namespace = name
    engine = sa.create_engine(url)
    server = Server(engine_name, url, namespace, engine, "", admin)
    try:
        assetq.install(engine, namespace=namespace)
    except BaseException:
        server.drop()
        raise
    version = ".".join(str(p) for p in engine.dialect.server_version_info or ())
    if getattr(engine.dialect, "is_mariadb", False):
        version = f"MariaDB {version}"
    elif engine_name == "postgresql":
        version = f"PostgreSQL {version}"
    server.version = version
    return server
