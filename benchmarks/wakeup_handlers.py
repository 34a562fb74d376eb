"""The handlers benchmarks/wakeup_gap.py gives the worker processes it starts.

``assetq worker --handlers wakeup_handlers:HANDLERS`` and ``procrastinate --app
wakeup_handlers.procrastinate_app worker`` import this module (the benchmark starts them in
this directory). What they run comes from the environment the benchmark sets:

AQB_DAGS      comma-separated ``dag_id=seconds``: a handler for each consumer, sleeping that long;
AQB_REPORT    ``host:port``: each handler's first line sends one UDP datagram there,
              ``system dag_id key time`` (key: the run's first event id for assetq, the job's
              ``token`` for procrastinate; time: ``time.time()``, the clock the database's
              timestamps are on), before anything else it does;
AQB_PG        procrastinate's connection string (its worker only).
"""

from __future__ import annotations

import importlib
import os
import socket
import time
from typing import Any

_socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
_host, _, _port = os.environ.get("AQB_REPORT", "").rpartition(":")
_address = (_host, int(_port)) if _port else None


def _report(system: str, dag_id: str, key: object, at: float) -> None:
    if _address is not None:
        _socket.sendto(f"{system} {dag_id} {key} {at!r}".encode(), _address)


def _handler(seconds: float) -> Any:
    def handle(claim: Any, conn: Any) -> None:
        at = time.time()
        _report("assetq", claim.dag_id, claim.event_ids[0], at)
        if seconds:
            time.sleep(seconds)

    return handle


def _dags() -> dict[str, float]:
    spec = os.environ.get("AQB_DAGS", "")
    pairs = (item.partition("=") for item in spec.split(",") if item)
    return {dag_id: float(seconds or 0) for dag_id, _, seconds in pairs}


#: dag id -> handler, for ``assetq worker --handlers wakeup_handlers:HANDLERS``.
HANDLERS = {dag_id: _handler(seconds) for dag_id, seconds in _dags().items()}


def _procrastinate_app() -> Any:
    # Imported by name, its tasks registered by call, not decorator: procrastinate is the
    # bench extra's, not the test extra's, whose mypy checks this file.
    procrastinate: Any = importlib.import_module("procrastinate")
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=os.environ["AQB_PG"]))

    def hop(token: int) -> None:
        _report("procrastinate", "hop", token, time.time())

    def flood(token: int) -> None:
        pass

    app.task(name="hop")(hop)
    app.task(name="flood")(flood)
    return app


def __getattr__(name: str) -> Any:
    # Built on first use: the assetq worker never imports procrastinate.
    if name == "procrastinate_app":
        app = _procrastinate_app()
        globals()[name] = app
        return app
    raise AttributeError(name)
