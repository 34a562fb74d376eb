"""The handlers benchmarks/burndown_cli.py gives the worker processes it starts.

``assetq worker --handlers burndown_handlers:NOOP`` (or ``:ROW``) and ``procrastinate --app
burndown_handlers.procrastinate_app worker`` import this module (the benchmark starts them
in this directory). Each has two handlers: ``noop`` does nothing; ``row`` inserts one row
into the table ``aqbd_sink``: assetq's in the transaction that completes the run (the
``conn`` it is given), procrastinate's on its job's connector (its worker gives a task no
connection of its own; the insert is a statement of its own before the job's finish).

AQB_CONSUMERS  comma-separated dag ids the assetq handlers are for;
AQB_PG         procrastinate's connection string (its worker only).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import sqlalchemy as sa

#: The row handlers' table (made by the benchmark: ``job`` text).
SINK = "aqbd_sink"
_INSERT = sa.text(f"INSERT INTO {SINK} (job) VALUES (:job)")


def _noop(claim: Any, conn: Any) -> None:
    return None


def _row(claim: Any, conn: Any) -> None:
    conn.execute(_INSERT, {"job": claim.run_id})


def _consumers() -> list[str]:
    return [c for c in os.environ.get("AQB_CONSUMERS", "").split(",") if c]


#: dag id -> handler, for ``assetq worker --handlers burndown_handlers:NOOP`` / ``:ROW``.
NOOP = {dag_id: _noop for dag_id in _consumers()}
ROW = {dag_id: _row for dag_id in _consumers()}


def _procrastinate_app() -> Any:
    # Imported by name, its tasks registered by call, not decorator: procrastinate is the
    # bench extra's, not the test extra's, whose mypy checks this file.
    procrastinate: Any = importlib.import_module("procrastinate")
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=os.environ["AQB_PG"]))

    async def noop() -> None:
        return None

    async def row(context: Any) -> None:
        await context.app.connector.execute_query_async(
            f"INSERT INTO public.{SINK} (job) VALUES (%(job)s)", job=str(context.job.id)
        )

    app.task(name="noop")(noop)
    app.task(name="row", pass_context=True)(row)
    return app


def __getattr__(name: str) -> Any:
    # Built on first use: the assetq worker never imports procrastinate.
    if name == "procrastinate_app":
        app = _procrastinate_app()
        globals()[name] = app
        return app
    raise AttributeError(name)
