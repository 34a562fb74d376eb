"""A capped run costs what it consumes (issue 16, since development revision
0007_capped_claim).

With ``max_events_per_run = N`` the pass reads the N + 1 oldest queued rows of the consumer by
index, and, when those do not satisfy the condition, each member asset's oldest row, also by
index. Two things are proven here:

- the claims are exactly those of the documented algorithm (docs/semantics.md §5), checked
  against a reference written in Python on random queues and conditions;
- the rows a capped pass reads do not grow with the backlog behind the consumer: counted,
  not timed (PostgreSQL: the table and index statistics of the queue; MariaDB/MySQL: the
  pass's Handler_read_* counters, with other consumers beside it, so that the probe for
  consumers with queued rows is counted too).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
import sqlalchemy as sa

import assetq
import pass_reads
from assetq import conditions
from dbs import TestDatabase
from scenario import declare, queued

ASSETS = ("a", "b", "c", "d")
CONDITIONS = (
    "a",
    assetq.all_of("a", "b"),
    assetq.any_of("a", "b"),
    assetq.all_of("a", assetq.any_of("b", "c")),
    assetq.any_of(assetq.all_of("a", "b"), assetq.all_of("c", "d")),
    assetq.all_of("a", "b", "c"),
)


def _clauses(condition: assetq.Condition) -> list[set[str]]:
    cnf = conditions.compile_cnf(conditions.normalize(condition))
    return [{str(member) for member in clause} for clause in cnf]


def _holds(clauses: list[set[str]], assets: set[str]) -> bool:
    return bool(clauses) and all(clause & assets for clause in clauses)


def reference_claim(
    queue: Sequence[tuple[int, str]], clauses: list[set[str]], cap: int
) -> list[int] | None:
    """The claim of docs/semantics.md §5 for ``queue`` ((event id, asset) in queue order)."""
    if not _holds(clauses, {asset for _, asset in queue}):
        return None
    if len(queue) <= cap:
        return sorted(event for event, _ in queue)
    oldest = queue[:cap]
    if _holds(clauses, {asset for _, asset in oldest}):
        return sorted(event for event, _ in oldest)
    chosen: list[str] = []
    for clause in clauses:
        if clause & set(chosen):
            continue
        chosen.append(next(asset for _, asset in queue if asset in clause))
    for i in reversed(range(len(chosen))):
        smaller = chosen[:i] + chosen[i + 1 :]
        if _holds(clauses, set(smaller)):
            chosen = smaller
    witnesses = [next(event for event, asset in queue if asset == a) for a in chosen]
    others = [event for event, _ in queue if event not in witnesses]
    return sorted(witnesses + others[: max(cap - len(witnesses), 0)])


def test_capped_claims_are_those_of_the_documented_algorithm(db: TestDatabase) -> None:
    rng = random.Random(20261201)
    with db.engine.begin() as conn:
        for asset in ASSETS:
            assetq.declare_asset(conn, asset)
    runs_checked = 0
    for trial in range(24):
        condition = CONDITIONS[trial % len(CONDITIONS)]
        clauses = _clauses(condition)
        cap = rng.randint(max(len(clauses), 1), 6)
        dag_id = f"trial_{trial}"
        declare(db, dag_id, condition, max_events_per_run=cap)
        weights = [rng.random() for _ in ASSETS]
        items = [{"asset": a} for a in rng.choices(ASSETS, weights=weights, k=rng.randint(1, 25))]
        with db.engine.begin() as conn:
            events = assetq.register_events(conn, items)
        members = set().union(*clauses)
        # One batch: queue order is id order. Events of other assets are not queued for it.
        model = [(e.id, e.asset) for e in events if e.asset in members]
        assert [event for event, _ in model] == queued(db, dag_id)
        # One pass makes every run the queue fills, one after another (0011_runs_per_pass:
        # one consumer taken, so its share is the pass's limit, more than 25 runs): each is
        # the reference's claim of what the runs before it left, and after the pass the
        # reference finds no claim either. The next pass makes nothing.
        passes = 0
        while made := [r for r in assetq.schedule(db.engine) if r.dag_id == dag_id]:
            passes += 1
            assert passes == 1, (trial, condition, cap, model)
            for run in made:
                expected = reference_claim(model, clauses, cap)
                assert list(run.event_ids) == expected, (trial, condition, cap, model)
                assert len(run.event_ids) <= max(cap, len(clauses))
                model = [(event, asset) for event, asset in model if event not in expected]
                runs_checked += 1
            assert [r.seq for r in made] == list(range(made[0].seq, made[0].seq + len(made)))
        assert reference_claim(model, clauses, cap) is None, (trial, condition, cap, model)
        assert [event for event, _ in model] == queued(db, dag_id)
        with db.engine.begin() as conn:
            assetq.delete_dag(conn, dag_id)
    assert runs_checked > 24  # most trials drained in several capped runs


# -- cost: what a capped pass reads does not grow with the backlog --------------------------


def _pg_reads(db: TestDatabase) -> dict[str, int]:
    """Rows and index entries of the queue read by one pass of limit 1 (one consumer taken,
    a share of one run: one capped claim)."""
    runs, reads = pass_reads.pg_queue_reads(db, 1)
    assert runs == 1
    return reads


#: (condition, the asset of the backlog, the asset of the witness queued behind it) of a
#: consumer capped at 2, for the cost specs of both engines.
SHAPES = pytest.mark.parametrize(
    "condition, backlog_asset, witness_asset",
    [
        ("a", "a", None),
        # The N oldest rows are all "a": the witness search finds b's oldest row by index.
        (assetq.all_of("a", "b"), "a", "b"),
        (assetq.any_of("b", "a"), "a", None),
    ],
    ids=["single", "and-with-witness", "or"],
)
#: The backlog of the second measurement; the first has 2,000 rows queued.
LARGE = pytest.mark.parametrize("large", [20_000, pytest.param(200_000, marks=pytest.mark.slow)])


@pytest.mark.engines("postgresql")
@SHAPES
@LARGE
def test_a_capped_pass_reads_a_bounded_number_of_queue_rows_whatever_the_backlog(
    db: TestDatabase,
    condition: assetq.Condition,
    backlog_asset: str,
    witness_asset: str | None,
    large: int,
) -> None:
    declare(db, "capped", condition, max_events_per_run=2)
    pass_reads.backlog(db, 2_000, backlog_asset)
    if witness_asset is not None:
        pass_reads.backlog(db, 1, witness_asset)
    small = _pg_reads(db)
    pass_reads.backlog(db, large, backlog_asset)
    if witness_asset is not None:
        pass_reads.backlog(db, 1, witness_asset)
    assert len(queued(db, "capped")) > large
    big = _pg_reads(db)
    # The candidate probe may read the consumer's first queued row by a scan that stops
    # there; everything else is read by index: a handful of entries per consumed row (the
    # N + 1 oldest, the witness probes, the deletion by key), never the backlog, ten times
    # larger the second time. (Not equal to the entry: index-only scans fetch heap rows
    # from pages the visibility map does not cover yet, which varies with vacuum's timing.)
    for reads in (small, big):
        assert reads["seq_tup_read"] <= 1, (small, big)
        assert reads["idx_tup_read"] <= 20 and reads["idx_tup_fetch"] <= 20, (small, big)


def _mysql_reads(db: TestDatabase, conn: sa.Connection) -> dict[str, int]:
    """Handler_read_* of one pass of limit 1 on ``conn``: the one consumer with work, a share
    of one run (one capped claim; the idle consumers are probed all the same)."""
    runs, reads = pass_reads.mysql_pass_reads(db, conn, 1)
    assert runs == 1
    return reads


#: Consumers beside the capped one, with nothing queued: the pass probes each for queued rows.
IDLE_CONSUMERS = 20


@pytest.mark.engines("mysql")
@SHAPES
@LARGE
def test_a_capped_pass_reads_the_same_handler_rows_whatever_the_backlog(
    db: TestDatabase,
    condition: assetq.Condition,
    backlog_asset: str,
    witness_asset: str | None,
    large: int,
    request: pytest.FixtureRequest,
) -> None:
    pass_reads.expect_mysql97_plan_flip(db, request)
    with db.engine.begin() as conn:
        for i in range(IDLE_CONSUMERS):
            assetq.declare_dag(conn, f"idle_{i}", "idle")
    declare(db, "capped", condition, max_events_per_run=2)
    pass_reads.backlog(db, 2_000, backlog_asset)
    if witness_asset is not None:
        # One for the warm-up pass, one for the measured one.
        pass_reads.backlog(db, 2, witness_asset)
    with db.engine.connect() as raw:
        # Both passes on one connection, after a first pass that did the same work: the first
        # call on a connection also reads the routine's definition into its cache, and the
        # first use of a table its statistics (MariaDB's mysql.*_stats).
        conn = raw.execution_options(isolation_level="READ COMMITTED")
        assert pass_reads.mysql_pass_reads(db, conn, 1)[0] == 1  # warm-up
        small = _mysql_reads(db, conn)
        pass_reads.backlog(db, large, backlog_asset)
        if witness_asset is not None:
            pass_reads.backlog(db, 1, witness_asset)
        assert len(queued(db, "capped")) > large
        big = _mysql_reads(db, conn)
    # The same rows, ten times the backlog behind them: the N + 1 oldest, the witness probes,
    # the deletion by key, one probe per consumer for queued rows, and the temporary tables'
    # own rows; a handful per consumer and per consumed row, never the backlog.
    assert big == small
    assert sum(small.values()) <= 10 * IDLE_CONSUMERS + 200, small
