"""Concurrent producers and schedulers: every committed event reaches every consumer exactly
once (I4, I5). The deterministic interleavings are in test_scheduler.py; this is the short
randomized version of the stress run, seconds long, with a fixed seed."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

import sqlalchemy as sa

import assetq
from dbs import TestDatabase

CONSUMERS: dict[str, assetq.Condition] = {
    "single": "a",
    "both": assetq.all_of("a", "b"),
    "either": assetq.any_of("b", "c"),
    "nested": assetq.any_of(assetq.all_of("a", "b"), "c"),
}
SUBSCRIBED = {"single": {"a"}, "both": {"a", "b"}, "either": {"b", "c"}, "nested": {"a", "b", "c"}}


def _holds(dag_id: str, assets: set[str]) -> bool:
    if dag_id == "single":
        return "a" in assets
    if dag_id == "both":
        return {"a", "b"} <= assets
    if dag_id == "either":
        return bool({"b", "c"} & assets)
    return {"a", "b"} <= assets or "c" in assets


def test_parallel_producers_and_schedulers_deliver_every_event_exactly_once(
    db: TestDatabase,
) -> None:
    with db.engine.begin() as conn:
        for dag_id, condition in CONSUMERS.items():
            assetq.declare_dag(conn, dag_id, condition)
    producers, schedulers, per_producer = 4, 2, 40
    engine = db.new_engine(pool_size=producers + schedulers + 2)
    committed: list[tuple[int, str]] = []
    rolled_back: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    done = threading.Event()

    def produce(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(per_producer):
                asset = rng.choice("abc")
                with engine.connect() as conn:
                    event = assetq.register_event(conn, asset)
                    time.sleep(rng.uniform(0, 0.005))  # the late commit
                    if rng.random() < 0.2:
                        conn.rollback()
                        with lock:
                            rolled_back.append(event.id)
                    else:
                        conn.commit()
                        with lock:
                            committed.append((event.id, asset))
        except BaseException as exc:
            errors.append(exc)

    def schedule() -> None:
        try:
            while not done.is_set():
                assetq.schedule(engine, limit=2)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(producers)]
    threads += [threading.Thread(target=schedule) for _ in range(schedulers)]
    for t in threads:
        t.start()
    for t in threads[:producers]:
        t.join(timeout=120)
    done.set()
    for t in threads[producers:]:
        t.join(timeout=120)
    assert errors == []
    while assetq.schedule(engine):
        pass

    expected = {
        (dag_id, event_id)
        for event_id, asset in committed
        for dag_id, assets in SUBSCRIBED.items()
        if asset in assets
    }
    links = db.links()
    queued = {
        (str(r[0]), int(r[1]))
        for r in db.rows("SELECT target_dag_id, asset_event_id FROM {ns}.asset_dag_run_queue")
    }
    duplicated = [pair for pair, n in Counter(links).items() if n > 1]
    assert duplicated == []
    # Every pair is consumed or still queued (an AND waiting for its other asset), never lost.
    assert set(links) | queued == expected
    assert set(links) & queued == set()
    # Rolled-back events left nothing.
    assert rolled_back
    stored = {int(r[0]) for r in db.rows("SELECT id FROM {ns}.asset_event")}
    assert stored == {e for e, _ in committed}
    # No run without events, and every run's events satisfy its condition.
    run_assets: dict[int, tuple[str, set[str]]] = {}
    for run_id, dag_id, asset in db.rows(
        "SELECT r.id, r.dag_id, a.name FROM {ns}.dag_run r"
        " LEFT JOIN {ns}.dagrun_asset_event l ON l.dag_run_id = r.id"
        " LEFT JOIN {ns}.asset_event e ON e.id = l.asset_event_id"
        " LEFT JOIN {ns}.asset a ON a.id = e.asset_id"
    ):
        run_assets.setdefault(run_id, (dag_id, set()))[1].add(asset)
    assert run_assets
    for dag_id, assets in run_assets.values():
        assert None not in assets, "a run without events"
        assert _holds(dag_id, assets), f"{dag_id} fired on {assets}"


def test_two_schedulers_racing_on_the_same_backlog_never_double_link(db: TestDatabase) -> None:
    with db.engine.begin() as conn:
        for n in range(20):
            assetq.declare_dag(conn, f"consumer_{n}", "orders")
        for _ in range(10):
            assetq.register_event(conn, "orders")
    engine = db.new_engine(pool_size=4)
    barrier = threading.Barrier(2)
    results: list[list[assetq.Run]] = [[], []]

    def race(slot: int) -> None:
        barrier.wait(timeout=30)
        while runs := assetq.schedule(engine, limit=3):
            results[slot].extend(runs)

    threads = [threading.Thread(target=race, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    consumed = Counter(
        (run.dag_id, event_id) for runs in results for run in runs for event_id in run.event_ids
    )
    assert len(consumed) == 200
    assert set(consumed.values()) == {1}
    assert len(db.links()) == 200
    count = db.scalar("SELECT count(*) FROM {ns}.asset_dag_run_queue")
    assert count == 0
    with db.engine.connect() as conn:
        total_runs = conn.execute(sa.text(db.sql("SELECT count(*) FROM {ns}.dag_run"))).scalar()
    assert total_runs == 20
