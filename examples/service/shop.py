"""An example service: a shop whose paid orders are invoiced by an assetq consumer.

What it shows, typed: `make lint` runs ``mypy --strict`` on it, and
tests/test_example_service.py runs it on both engines.

- A request handler in FastAPI's style (:func:`create_order`: it is given an ``AsyncSession``)
  writes an order and its ``orders`` event in one transaction, through ``assetq.aio``.
- A sync ORM ``Session`` (:func:`record_payment`) marks the order paid and registers its
  ``payments`` event: both commit together, or neither does.
- The scheduler and the worker loops run beside the event loop, in threads of their own, with
  a metrics hook (:class:`ServiceMetrics`, an ``assetq.Metrics``) counting what they do; a
  service would export it (``assetq.prometheus.PrometheusMetrics`` does, for Prometheus).
- The ``invoice`` consumer's handler (:func:`invoice`) writes through an ORM ``Session`` bound
  to the run's transaction: the invoices commit with the run's success, exactly once.

Run it against a database of your own (assetq is installed there, in namespace ``assetq``)::

    python examples/service/shop.py --url postgresql+psycopg://user@host/db --orders 20
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy import Connection, Engine, String, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import assetq
from assetq import aio
from assetq.metrics import AttemptOutcome


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "shop_order"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    total: Mapped[int]
    paid: Mapped[bool] = mapped_column(default=False)
    #: The run of ``invoice`` that invoiced the order.
    invoice_run: Mapped[str | None] = mapped_column(String(250), default=None)


class ServiceMetrics(assetq.Metrics):
    """What the loops did, counted; called from their threads, hence the lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.runs_created = 0
        self.latencies: list[float] = []
        self.completed: dict[str, int] = {}

    def run_created(self, run: assetq.Run, latency: float | None) -> None:
        with self._lock:
            self.runs_created += 1
            if latency is not None:
                self.latencies.append(latency)

    def worker_completed(
        self,
        claim: assetq.Claim,
        outcome: AttemptOutcome,
        run: assetq.Run | None,
        seconds: float,
    ) -> None:
        with self._lock:
            self.completed[outcome] = self.completed.get(outcome, 0) + 1


async def create_order(session: AsyncSession, order_id: int, total: int) -> Mapping[str, int]:
    """POST /orders: the order and its event commit together (FastAPI would inject the
    session with ``Depends``)."""
    session.add(Order(id=order_id, total=total))
    event = await aio.register_event(session, "orders", extra={"order_id": order_id})
    await session.commit()
    return {"order": order_id, "event": event.id}


def record_payment(engine: Engine, order_id: int) -> assetq.Event:
    """A payment arrives (sync code, an ORM Session): the order is paid and the ``payments``
    event registered in the same transaction."""
    with Session(engine) as session:
        order = session.get_one(Order, order_id)
        order.paid = True
        event = assetq.register_event(session, "payments", extra={"order_id": order_id})
        session.commit()
    return event


def invoice(claim: assetq.Claim, conn: Connection) -> list[assetq.NewEvent]:
    """The ``invoice`` consumer's handler, in the transaction that completes the run: the
    orders of the payments it consumed are invoiced, and an ``invoices`` event produced,
    with the run's success or not at all."""
    order_ids: list[int] = []
    after: assetq.Event | None = None
    while page := assetq.consumed_events(conn, claim.dag_id, claim.run_id, after=after):
        order_ids += [int(event.extra["order_id"]) for event in page]
        after = page[-1]
    # A Session on the run's connection joins its transaction: it flushes there and leaves
    # the commit to assetq, which commits the run's success with it (closing the Session
    # does not end the transaction it joined).
    with Session(bind=conn) as session:
        for order in session.scalars(select(Order).where(Order.id.in_(order_ids))):
            order.invoice_run = claim.run_id
        session.flush()
    return [assetq.NewEvent("invoices", extra={"orders": len(order_ids)})]


def prepare(engine: Engine) -> None:
    """Deploy time: assetq's schema (idempotent), the shop's table, the consumers."""
    assetq.install(engine)
    Base.metadata.create_all(engine)
    with Session(engine) as session:
        assetq.declare_asset(session, "orders")
        assetq.declare_asset(session, "invoices")
        assetq.declare_dag(session, "invoice", "payments")
        session.commit()


@dataclass(frozen=True)
class Summary:
    orders: int
    invoiced: int
    seconds: float
    metrics: ServiceMetrics


async def run(url: str, orders: int, *, timeout: float = 60.0) -> Summary:
    """Take ``orders`` orders and their payments while the scheduler and the worker run, and
    return once every order is invoiced."""
    engine = sa.create_engine(url)
    async_engine = create_async_engine(aio.async_url(engine.url))
    sessions = async_sessionmaker(async_engine, expire_on_commit=False)
    started = time.monotonic()
    try:
        await asyncio.to_thread(prepare, engine)
        metrics = ServiceMetrics()
        stop = threading.Event()
        loops = asyncio.gather(
            asyncio.to_thread(
                assetq.run_scheduler, engine, stop_event=stop, poll_interval=0.2, metrics=metrics
            ),
            asyncio.to_thread(
                assetq.run_worker,
                engine,
                {"invoice": invoice},
                stop=stop,
                poll_interval=0.2,
                metrics=metrics,
            ),
        )
        try:
            for number in range(1, orders + 1):
                async with sessions() as session:  # one request each
                    await create_order(session, number, total=10 * number)
                await asyncio.to_thread(record_payment, engine, number)
            invoiced = 0
            deadline = time.monotonic() + timeout
            while invoiced < orders and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
                async with sessions() as session:
                    counted = await session.scalar(
                        select(func.count())
                        .select_from(Order)
                        .where(Order.invoice_run.is_not(None))
                    )
                    invoiced = int(counted or 0)
        finally:
            stop.set()
            await loops
    finally:
        await async_engine.dispose()
        engine.dispose()
    return Summary(orders, invoiced, time.monotonic() - started, metrics)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--url", required=True, help="SQLAlchemy URL of the database")
    parser.add_argument("--orders", type=int, default=10)
    args = parser.parse_args(argv)
    summary = asyncio.run(run(args.url, args.orders))
    print(
        f"{summary.invoiced} of {summary.orders} orders invoiced in {summary.seconds:.1f} s;"
        f" {summary.metrics.runs_created} runs, attempts {summary.metrics.completed}"
    )
    return 0 if summary.invoiced == summary.orders else 1


if __name__ == "__main__":
    raise SystemExit(main())
