"""The operator's command line for runs (issue 26 item 6): `assetq runs`, `run show`, `run
retry`, `dags`, `dag pause|unpause`, `events`, `status --dag`. The reads run as a reader
(assetq grant --reader); bad input is one line with the code and the fix, exit 1 (2 for a
usage error), and nothing written.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa

import assetq
from assetq import cli
from dbs import TestDatabase, made_logins
from scenario import declare, register


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


def _run(url: sa.URL, namespace: str, *args: str) -> Result:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(
                ["--url", url.render_as_string(hide_password=False), "--namespace", namespace,
                 *args]
            )  # fmt: skip
        except SystemExit as exc:  # argparse's usage errors
            code = int(exc.code or 0)
    return Result(code, out.getvalue(), err.getvalue())


@dataclass
class Scene:
    db: TestDatabase
    #: The URL of a login with reader access only.
    reader: sa.URL
    failed: assetq.Run
    succeeded: assetq.Run
    queued: assetq.Run

    def owner(self, *args: str) -> Result:
        return _run(self.db.url, self.db.namespace, *args)

    def read(self, *args: str) -> Result:
        return _run(self.reader, self.db.namespace, *args)

    def state(self, run_id: str) -> str:
        return str(self.db.scalar("SELECT state FROM {ns}.dag_run WHERE run_id = :r", r=run_id))


@pytest.fixture
def scene(db: TestDatabase) -> Iterator[Scene]:
    """report (on orders): a failed run, a successful one with an output event, a queued
    one; publish on report's output; idle, paused, with nothing."""
    declare(db, "report", "orders")
    declare(db, "publish", "report_done")
    declare(db, "idle", "misc", max_active_runs=2, max_attempts=3)
    runs: list[assetq.Run] = []
    for _ in range(3):
        register(db, "orders")
        runs += assetq.schedule(db.engine, namespace=db.namespace)
    first, _second, third = runs
    (claim,) = assetq.claim_runs(db.engine, "w-1", limit=1, namespace=db.namespace)
    assert claim.run_id == first.run_id
    failed = assetq.complete_run(
        db.engine, claim, "failed", error="ValueError: boom\n  at line 3", namespace=db.namespace
    )
    (claim,) = assetq.claim_runs(db.engine, "w-2", limit=1, namespace=db.namespace)
    succeeded = assetq.complete_run(
        db.engine,
        claim,
        "success",
        events=[assetq.NewEvent("report_done", extra={"rows": 7})],
        namespace=db.namespace,
    )
    with db.engine.begin() as conn:
        assetq.pause_dag(conn, "idle", namespace=db.namespace)
    with made_logins(db, ["reader"], "aqruns") as logins:
        login = logins["reader"]
        assetq.grant_roles(db.engine, reader=[login.grantee], namespace=db.namespace)
        try:
            yield Scene(db, login.engine.url, failed, succeeded, third)
        finally:
            assetq.revoke_roles(db.engine, [login.grantee], namespace=db.namespace)


# -- runs ---------------------------------------------------------------------------------------


def test_runs_lists_runs_newest_first_as_a_reader(scene: Scene) -> None:
    result = scene.read("runs", "--json")
    assert result.code == 0, result.err
    runs = result.json()["runs"]
    assert [r["run_id"] for r in runs] == [
        scene.queued.run_id,
        scene.succeeded.run_id,
        scene.failed.run_id,
    ]
    assert [r["state"] for r in runs] == ["queued", "success", "failed"]
    text = scene.read("runs")
    assert text.code == 0 and "ValueError: boom" in text.out and "w-1" in text.out


def test_runs_state_failed_shows_only_what_failed(scene: Scene) -> None:
    result = scene.read("runs", "--state", "failed", "--json")
    assert [r["run_id"] for r in result.json()["runs"]] == [scene.failed.run_id]
    assert result.json()["runs"][0]["error"].startswith("ValueError: boom")


def test_runs_dag_limit_and_since(scene: Scene) -> None:
    assert scene.read("runs", "--dag", "publish", "--json").json()["runs"] == []
    limited = scene.read("runs", "--dag", "report", "--limit", "2", "--json").json()["runs"]
    assert [r["run_id"] for r in limited] == [scene.queued.run_id, scene.succeeded.run_id]
    scene.db.execute(
        "UPDATE {ns}.dag_run SET created_at = created_at - INTERVAL '2' HOUR WHERE run_id = :r",
        r=scene.failed.run_id,
    )
    recent = scene.read("runs", "--since", "1h", "--json").json()["runs"]
    assert scene.failed.run_id not in [r["run_id"] for r in recent]
    assert len(recent) == 2
    assert len(scene.read("runs", "--since", "3h", "--json").json()["runs"]) == 3


def test_runs_of_an_unknown_dag_is_one_line_with_the_code_and_the_fix(scene: Scene) -> None:
    result = scene.read("runs", "--dag", "nope")
    assert result.code == 1 and result.out == ""
    assert result.err.count("\n") == 1
    assert "[AQ003]" in result.err and "assetq dags" in result.err


@pytest.mark.parametrize(
    "args",
    [("runs", "--state", "nope"), ("runs", "--limit", "0"), ("runs", "--since", "-1h"),
     ("run",), ("run", "show", "report"), ("dag", "stop", "report"), ("events",)],
    ids=["state", "limit", "since", "no-action", "no-run", "bad-action", "no-asset"],
)  # fmt: skip
def test_bad_usage_exits_2(scene: Scene, args: tuple[str, ...]) -> None:
    assert scene.read(*args).code == 2


# -- run show -----------------------------------------------------------------------------------


def test_run_show_gives_the_last_attempt_its_consumed_events_and_outputs(scene: Scene) -> None:
    failed = scene.read("run", "show", "report", scene.failed.run_id, "--json")
    assert failed.code == 0, failed.err
    data = failed.json()
    assert (data["run"]["state"], data["run"]["attempt"], data["run"]["worker"]) == (
        "failed",
        1,
        "w-1",
    )
    assert data["run"]["error"].startswith("ValueError: boom")
    assert data["max_attempts"] == 1
    ((attempt),) = data["attempts"]
    assert (attempt["attempt"], attempt["outcome"], attempt["worker"]) == (1, "failed", "w-1")
    assert attempt["error"].startswith("ValueError: boom") and attempt["ended_at"]
    assert [e["asset"] for e in data["consumed_events"]] == ["orders"]
    assert data["outputs"] == []

    done = scene.read("run", "show", "report", scene.succeeded.run_id, "--json").json()
    assert [e["id"] for e in done["outputs"]] == list(scene.succeeded.output_event_ids)
    assert done["outputs"][0]["asset"] == "report_done"
    assert done["outputs"][0]["extra"] == {"rows": 7}
    assert done["outputs"][0]["source"]["run_id"] == scene.succeeded.run_id

    text = scene.read("run", "show", "report", scene.failed.run_id)
    assert text.code == 0
    assert "attempt        1 of 1" in text.out and "ValueError: boom" in text.out
    assert "attempts: 1" in text.out and "1  failed" in text.out
    assert "consumed events: 1" in text.out


def test_run_show_of_an_unknown_run_or_dag_is_refused(scene: Scene) -> None:
    run = scene.read("run", "show", "report", "nope")
    assert run.code == 1 and "[AQ006]" in run.err and "assetq runs --dag report" in run.err
    assert run.err.count("\n") == 1
    dag = scene.read("run", "show", "nope", scene.failed.run_id)
    assert dag.code == 1 and "[AQ003]" in dag.err and "assetq dags" in dag.err


# -- run retry ----------------------------------------------------------------------------------


def test_run_retry_queues_a_failed_run_again(scene: Scene) -> None:
    result = scene.owner("run", "retry", "report", scene.failed.run_id, "--json")
    assert result.code == 0, result.err
    assert result.json()["run"]["state"] == "queued"
    assert scene.state(scene.failed.run_id) == "queued"
    claims = assetq.claim_runs(
        scene.db.engine, "w-3", limit=2, dag_ids=["report"], namespace=scene.db.namespace
    )
    # The same run, its next attempt.
    assert {c.run_id: c.attempt for c in claims}[scene.failed.run_id] == 2


def test_run_retry_of_a_final_run_that_did_not_fail_is_refused_and_writes_nothing(
    scene: Scene,
) -> None:
    result = scene.owner("run", "retry", "report", scene.succeeded.run_id)
    assert result.code == 1 and result.out == ""
    assert result.err.count("\n") == 1, result.err
    assert "[AQ008]" in result.err and "can be retried" in result.err
    assert result.err.count("[AQ008]") == 1  # the database's own code is not repeated
    assert scene.state(scene.succeeded.run_id) == "success"
    unknown = scene.owner("run", "retry", "report", "nope")
    assert unknown.code == 1 and "[AQ006]" in unknown.err


def test_run_retry_is_refused_to_a_reader(scene: Scene) -> None:
    result = scene.read("run", "retry", "report", scene.failed.run_id)
    assert result.code == 1
    assert scene.state(scene.failed.run_id) == "failed"


# -- dags, dag pause|unpause ----------------------------------------------------------------


def test_dags_lists_consumers_with_their_queues_and_runs(scene: Scene) -> None:
    register(scene.db, "report_done")  # publish's output event is queued already: two now
    result = scene.read("dags", "--json")
    assert result.code == 0, result.err
    found = {d["dag_id"]: d for d in result.json()["dags"]}
    assert list(found) == ["idle", "publish", "report"]
    assert (found["idle"]["is_paused"], found["idle"]["max_active_runs"]) == (True, 2)
    assert found["idle"]["max_attempts"] == 3
    assert (found["publish"]["queued_events"], found["publish"]["condition_text"]) == (
        2,
        "report_done",
    )
    assert found["publish"]["oldest_queued_age_seconds"] >= 0
    assert (found["report"]["queued_runs"], found["report"]["running_runs"]) == (1, 0)
    page = scene.read("dags", "--limit", "2", "--json").json()
    assert [d["dag_id"] for d in page["dags"]] == ["idle", "publish"]
    assert page["next_after"] == "publish"
    rest = scene.read("dags", "--after", "publish", "--json").json()
    assert [d["dag_id"] for d in rest["dags"]] == ["report"]
    text = scene.read("dags")
    assert text.code == 0 and "paused" in text.out


def test_dag_pause_and_unpause(scene: Scene) -> None:
    def paused() -> bool:
        return bool(scene.db.scalar("SELECT is_paused FROM {ns}.dag WHERE dag_id = 'report'"))

    assert scene.owner("dag", "pause", "report").code == 0
    assert paused()
    result = scene.owner("dag", "unpause", "report", "--json")
    assert result.code == 0 and result.json() == {"dag_id": "report", "is_paused": False}
    assert not paused()
    unknown = scene.owner("dag", "pause", "nope")
    assert unknown.code == 1 and "[AQ003]" in unknown.err and "assetq dags" in unknown.err
    assert scene.db.scalar("SELECT COUNT(*) FROM {ns}.dag WHERE is_paused") == 1  # idle
    refused = scene.read("dag", "pause", "report")
    assert refused.code == 1 and not paused()


# -- events, status --dag -------------------------------------------------------------------------


def test_events_lists_an_assets_recent_events_newest_first(scene: Scene) -> None:
    result = scene.read("events", "--asset", "orders", "--json")
    assert result.code == 0, result.err
    events = result.json()["events"]
    assert len(events) == 3
    assert [e["id"] for e in events] == sorted((e["id"] for e in events), reverse=True)
    oldest = events[-1]["id"]
    scene.db.execute(
        "UPDATE {ns}.asset_event SET `timestamp` = `timestamp` - INTERVAL '2' DAY WHERE id = :i"
        if scene.db.engine_name == "mysql"
        else 'UPDATE {ns}.asset_event SET "timestamp" = "timestamp" - INTERVAL \'2\' DAY'
        " WHERE id = :i",
        i=oldest,
    )
    assert len(scene.read("events", "--asset", "orders", "--json").json()["events"]) == 2
    week = scene.read("events", "--asset", "orders", "--since", "1w", "--limit", "1", "--json")
    assert len(week.json()["events"]) == 1
    outputs = scene.read("events", "--asset", "report_done", "--json").json()["events"]
    assert outputs[0]["source"]["run_id"] == scene.succeeded.run_id
    unknown = scene.read("events", "--asset", "nope")
    assert unknown.code == 1 and "[AQ001]" in unknown.err


def test_status_dag_shows_one_consumer(scene: Scene) -> None:
    result = scene.read("status", "--dag", "report", "--json")
    assert result.code == 0, result.err
    (only,) = result.json()["consumers"]
    assert only["dag_id"] == "report" and only["no_worker"] is True
    unknown = scene.read("status", "--dag", "nope")
    assert unknown.code == 1 and "[AQ003]" in unknown.err


# -- run cancel ---------------------------------------------------------------------------------


def test_run_cancel_cancels_a_queued_run_with_its_reason(scene: Scene) -> None:
    result = scene.owner("run", "cancel", "report", scene.queued.run_id, "--reason", "bad data")
    assert result.code == 0, result.err
    assert scene.state(scene.queued.run_id) == "cancelled"
    shown = scene.read("run", "show", "report", scene.queued.run_id, "--json").json()
    assert shown["run"]["state"] == "cancelled" and "bad data" in shown["run"]["error"]
    assert [r["run_id"] for r in scene.read("runs", "--state", "cancelled", "--json").json()[
        "runs"
    ]] == [scene.queued.run_id]  # fmt: skip
    # retry queues a cancelled run again.
    assert scene.owner("run", "retry", "report", scene.queued.run_id).code == 0
    assert scene.state(scene.queued.run_id) == "queued"


def test_run_cancel_of_a_running_run_fences_its_worker(scene: Scene) -> None:
    (claim,) = assetq.claim_runs(scene.db.engine, "w-9", limit=1, namespace=scene.db.namespace)
    assert claim.run_id == scene.queued.run_id
    result = scene.owner("run", "cancel", "report", claim.run_id, "--json")
    assert result.code == 0, result.err
    assert result.json()["run"]["state"] == "cancelled"
    with pytest.raises(assetq.LeaseLost):
        assetq.heartbeat(scene.db.engine, claim, namespace=scene.db.namespace)


def test_run_cancel_of_a_final_run_is_refused_and_writes_nothing(scene: Scene) -> None:
    result = scene.owner("run", "cancel", "report", scene.succeeded.run_id, "--reason", "x")
    assert result.code == 1 and result.out == ""
    assert result.err.count("\n") == 1, result.err
    assert "[AQ008]" in result.err and "assetq run show report" in result.err
    assert scene.state(scene.succeeded.run_id) == "success"
    unknown = scene.owner("run", "cancel", "nope", "x")
    assert unknown.code == 1 and "[AQ003]" in unknown.err
    refused = scene.read("run", "cancel", "report", scene.queued.run_id)
    assert refused.code == 1 and scene.state(scene.queued.run_id) == "queued"
