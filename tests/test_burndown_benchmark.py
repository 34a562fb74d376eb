"""benchmarks/burndown.py cannot rot: a tiny burn-down (200 runs, 2 threads, 1 round) runs on
each engine and every run is claimed and completed exactly once; the runs it inserts directly
are shaped like the scheduler pass's; procrastinate's side runs when procrastinate is
installed (the bench extra) and is skipped, with one line, when it is not. Timing decides
nothing here."""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from datetime import timezone
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import sqlalchemy as sa

import assetq
from dbs import TestDatabase

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
PEER_MISSING = importlib.util.find_spec("procrastinate") is None
#: The pass's run ids: asset_triggered__<run_after, UTC, microseconds>+00:00__<seq>.
RUN_ID = r"asset_triggered__\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}\+00:00__\d+"


@pytest.fixture(scope="module")
def burndown() -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module("burndown")


def test_a_tiny_burn_down_completes_every_run_exactly_once(
    db: TestDatabase, burndown: ModuleType
) -> None:
    # Never installs anything from the test suite: without procrastinate its side is skipped.
    settings = burndown.Settings(
        runs=200, threads=2, rounds=1, history=500, probes=2, peer="if-installed"
    )
    result = burndown.measure(db.engine, settings)
    # measure() raises when a burn-down did not leave every run succeeded at attempt 1, or
    # when its threads made more or fewer steps than there were runs.
    expected = {burndown.ASSETQ, burndown.HISTORY, burndown.ON_ENGINE, burndown.IN_TRANSACTION}
    if db.engine_name == "postgresql" and not PEER_MISSING:
        expected.add(burndown.PEER)
    assert set(result["rates"]) == expected
    assert all(len(v) == 1 and v[0] > 0 for v in result["rates"].values())
    # The counters of one claim, without and with the finished runs.
    assert set(result["probes"]) == {"0", "500"}
    for counts in result["probes"].values():
        assert all(len(v) == 2 and min(v) > 0 for v in counts.values())
    # The namespaces (MySQL: databases) of the figure are gone.
    with db.engine.connect() as conn:
        names = sa.inspect(conn).get_schema_names()
    assert not [n for n in names if n.startswith("aqbd_")]


@pytest.mark.engines("postgresql")
def test_the_procrastinate_side_fetches_and_finishes_every_job(
    db: TestDatabase, burndown: ModuleType
) -> None:
    if PEER_MISSING:
        pytest.skip(
            "procrastinate is not installed (the bench extra): its burn-down side is not run"
        )
    peer = burndown.install_peer(db.engine.url, importlib.import_module("procrastinate"))
    try:
        burndown.fill_peer(peer, 200)
        ((done, _),) = burndown.burn_sliced([("peer", burndown._peer_worker(peer))], 2).values()
        assert done == 200
        assert burndown.peer_outcome(peer) == {"succeeded": 200}
    finally:
        burndown.drop_peer(peer)


def _shape(row: sa.Row[Any], links: list[tuple[int, str]]) -> dict[str, Any]:
    """What a run row must have in common with the pass's, whatever its ids and times."""
    run = row._mapping
    run_after = run["run_after"]
    if run_after.tzinfo is not None:  # PostgreSQL: in the session's time zone
        run_after = run_after.astimezone(timezone.utc)
    return {
        "run_id_form": re.fullmatch(RUN_ID, run["run_id"]) is not None,
        "run_id_seq": run["run_id"].rsplit("__", 1)[1] == str(run["seq"]),
        "run_id_is_run_after": run["run_id"]
        .split("__")[1]
        .startswith(run_after.strftime("%Y-%m-%dT%H:%M:%S.%f")),
        "claimable_from_creation": run["not_before"] == run["created_at"],
        "links": links == [(run["triggering_event_id"], run["dag_id"])],
        **{
            k: run[k]
            for k in (
                "dag_id",
                "run_type",
                "state",
                "event_count",
                "attempt",
                "worker",
                "lease_until",
                "started_at",
                "ended_at",
                "error",
            )
        },
    }


def test_the_runs_it_inserts_are_shaped_like_the_pass_s(
    db: TestDatabase, burndown: ModuleType
) -> None:
    namespace = burndown.namespace_name(0)
    burndown.install_namespace(db.engine, namespace)
    try:
        # One run per consumer (seq 1), inserted directly; then one of consumer_0 by a pass.
        burndown.fill_namespace(db.engine, namespace, burndown.CONSUMERS, 0)
        with db.engine.begin() as conn:
            assetq.register_event(conn, "orders_0", namespace=namespace)
        (made,) = assetq.schedule(db.engine, namespace=namespace)
        assert made.dag_id == "consumer_0" and made.run_id.endswith("__2")
        ns = db.dialect.quote_ns(namespace)
        with db.engine.connect() as conn:
            runs = conn.execute(
                sa.text(f"SELECT * FROM {ns}.dag_run WHERE dag_id = 'consumer_0' ORDER BY seq")
            ).all()
            shapes = []
            for run in runs:
                links = conn.execute(
                    sa.text(
                        f"SELECT asset_event_id, dag_id FROM {ns}.dagrun_asset_event"
                        " WHERE dag_run_id = :id"
                    ),
                    {"id": run._mapping["id"]},
                ).all()
                shapes.append(_shape(run, [tuple(link) for link in links]))
            queued = conn.execute(sa.text(f"SELECT count(*) FROM {ns}.asset_dag_run_queue"))
            assert queued.scalar_one() == 0
        direct, by_pass = shapes
        assert direct == by_pass
        assert by_pass["claimable_from_creation"] and by_pass["links"]
    finally:
        assetq.uninstall(db.engine, namespace=namespace)


def test_the_command_line_burn_down_completes_every_job_of_both_handlers(
    db: TestDatabase, burndown: ModuleType, tmp_path: Path
) -> None:
    """benchmarks/burndown_cli.py cannot rot: ``assetq worker`` (and, on PostgreSQL with the
    bench extra, ``procrastinate worker``) burn down 60 jobs with each handler; a turn raises
    unless every job succeeded once and the row handler left one row per job."""
    cli = importlib.import_module("burndown_cli")
    rates = cli.measure(db.engine, 60, 2, 1, "if-installed", tmp_path)
    systems = {cli.ASSETQ}
    if db.engine_name == "postgresql" and not PEER_MISSING:
        systems.add(cli.PEER)
    for handler in cli.HANDLERS:
        measured = {system for system, values in rates[handler].items() if values}
        assert measured == systems, handler
        assert all(v > 0 for values in rates[handler].values() for v in values)
    label = cli.server_label(db.engine)
    assert label.split()[0] in {"PostgreSQL", "MariaDB", "MySQL"} and label.split()[1][0].isdigit()
    table = "\n".join(cli.table({label: rates}, 2))
    assert "| noop |" in table and "| row |" in table
    with db.engine.connect() as conn:
        names = sa.inspect(conn).get_schema_names()
        tables = sa.inspect(conn).get_table_names()
    assert not [n for n in names if n.startswith("aqbd_")]
    assert "aqbd_sink" not in tables
