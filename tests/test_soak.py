"""The chaos soak (tests/soak.py) on every engine: producers, schedulers and workers as
processes of the command line, SIGKILLed and SIGSTOPped past their lease at random, then
checked on the database. Short in the default suite (300 events, 6 kills: about 30 s per
engine); long with ``-m slow`` (100,000 events, 120 kills).

The kills are random: the seed is ASSETQ_SOAK_SEED, or a new one each run, printed with the
final line and in the failure message, and a failure reruns with it (the processes' timing
is never the same twice, the plan of kills is). Pass or fail is decided by the checks on the
database only; the deadlines are guards against a hang.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from dbs import TestDatabase
from soak import Config, Report, run_soak


def _seed() -> int:
    return int(os.environ.get("ASSETQ_SOAK_SEED") or random.randrange(1 << 30))


def _soak(db: TestDatabase, tmp_path: Path, config: Config, patroni: bool = False) -> Report:
    """The soak on ``db``, or with ``patroni`` on a throw-away Patroni cluster (``db`` then
    only selects the engine: the cluster is the database)."""
    if patroni:
        from soak import patroni_database

        with patroni_database() as (url, namespace, failover):
            report = run_soak(url, namespace, config, "postgresql-patroni", tmp_path, failover)
    else:
        url = db.url.render_as_string(hide_password=False)
        report = run_soak(url, db.namespace, config, db.engine_name, tmp_path)
    for note in report.notes:
        print(note)
    print(report.line())
    return report


def _assert_clean(report: Report, config: Config) -> None:
    line = report.line()
    assert report.kills == config.kills, line
    assert report.zombies >= 1 and report.sigstops >= report.zombies, line
    assert all(report.sigkill[role] >= 1 for role in ("producer", "scheduler", "worker")), line
    assert report.restarts >= 1, line
    assert report.events == report.planned == config.events, line
    assert report.acknowledged == config.events and report.runs > 0, line
    assert report.cap_samples > 0, line
    assert (report.lost, report.duplicated) == (0, 0), line
    assert (report.double_effects, report.wrong_effects, report.outputs_wrong) == (0, 0, 0), line
    assert (report.over_cap, report.stalled, report.failed) == (0, 0, 0), line
    assert report.unexpected_exits == 0, line
    assert report.ok, line


def test_chaos_soak_loses_duplicates_and_stalls_nothing(db: TestDatabase, tmp_path: Path) -> None:
    """300 events from 2 producers (10/s each), 2 schedulers, 2 workers of 2 slots; 6 kills,
    one of them a worker stopped with a run past its 3 s lease until another worker took the
    run over. Every committed event reaches each of its consumers once, every run ends in
    success with one effect (and, for `load`, one output event), no capped consumer is ever
    seen over its cap, and everything drains."""
    config = Config(
        events=300,
        producers=2,
        schedulers=2,
        workers=2,
        rate=10.0,
        kills=6,
        lease=3.0,
        seed=_seed(),
        deadline=180.0,
        drain_timeout=120.0,
    )
    _assert_clean(_soak(db, tmp_path, config), config)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_long_chaos_soak_loses_duplicates_and_stalls_nothing(
    db: TestDatabase, tmp_path: Path
) -> None:
    """The long soak: 100,000 events from 4 producers (100/s each), 2 schedulers, 3 workers
    of 2 slots, 120 kills (15% of them zombies), a 4 s lease."""
    config = _long_config()
    _assert_clean(_soak(db, tmp_path, config), config)


def _long_config(failovers: int = 0) -> Config:
    return Config(
        events=100_000,
        producers=4,
        schedulers=2,
        workers=3,
        rate=100.0,
        kills=120,
        lease=4.0,
        seed=_seed(),
        deadline=2400.0,
        drain_timeout=600.0,
        failovers=failovers,
    )


@pytest.mark.slow
@pytest.mark.engines("postgresql")
@pytest.mark.timeout(3600)
def test_long_chaos_soak_across_a_patroni_failover(db: TestDatabase, tmp_path: Path) -> None:
    """The long soak on a throw-away Patroni cluster in synchronous mode, through a
    multi-host URL: besides its 120 kills, a kill -9 of the leader's postmaster, and Patroni
    promotes the synchronous standby by itself. (``db`` only selects the engine: the cluster
    is the database.) The same as ``python tests/soak.py --engines postgresql --failover
    patroni --events 100000 --producers 4 --rate 100 --kills 120 --workers 3 --lease 4``."""
    config = _long_config(failovers=1)
    report = _soak(db, tmp_path, config, patroni=True)
    assert report.failovers == 1, report.line()
    _assert_clean(report, config)
