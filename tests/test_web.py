"""The operator's console (issue 27, docs/web.md): every page and its /api twin, on both
engines; what it shows is escaped; actions only with a CSRF token and never in read-only, and
nothing written when refused; the statements a page sends do not grow with the history; and
a real browser (Debian's headless Chromium, driven by selenium) clicking through to a run and
cancelling it.
"""

from __future__ import annotations

import contextlib
import html
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import sqlalchemy as sa
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

import assetq
import assetq.web
from assetq import cli, liveness
from dbs import TestDatabase, made_logins
from scenario import declare, register
from servers import free_port
from work_scenario import join_all

XSS = "<script>alert(1)</script>"


@dataclass
class Scene:
    db: TestDatabase
    failed: assetq.Run
    succeeded: assetq.Run
    running: assetq.Claim
    queued: assetq.Run

    def state(self, run_id: str) -> str:
        return str(self.db.scalar("SELECT state FROM {ns}.dag_run WHERE run_id = :r", r=run_id))

    def paused(self, dag_id: str) -> bool:
        return bool(self.db.scalar("SELECT is_paused FROM {ns}.dag WHERE dag_id = :d", d=dag_id))

    def client(self, *, read_only: bool = False, **options: Any) -> TestClient:
        console = assetq.web.app(
            self.db.engine, namespace=self.db.namespace, read_only=read_only, **options
        )
        return TestClient(console, follow_redirects=False)


@pytest.fixture
def scene(db: TestDatabase) -> Iterator[Scene]:
    """report (on orders, 3 attempts): a failed run whose error holds HTML, a successful one
    with an output event, one a worker holds, one queued; publish on report's output; xss on
    an asset named like a script; a worker that runs report, alive."""
    declare(db, "report", "orders", max_attempts=1)
    declare(db, "publish", "report_done")
    declare(db, "xss", XSS)
    register(db, XSS)
    runs: list[assetq.Run] = []
    for _ in range(4):
        register(db, "orders")
        runs += [
            r for r in assetq.schedule(db.engine, namespace=db.namespace) if r.dag_id == "report"
        ]
    ns = db.namespace
    (claim,) = assetq.claim_runs(db.engine, "w-1", dag_ids=["report"], namespace=ns)
    failed = assetq.complete_run(
        db.engine, claim, "failed", error=f"ValueError: {XSS}\n  at line 3", namespace=ns
    )
    (claim,) = assetq.claim_runs(db.engine, "w-2", dag_ids=["report"], namespace=ns)
    succeeded = assetq.complete_run(
        db.engine,
        claim,
        "success",
        events=[assetq.NewEvent("report_done", extra={"rows": 7})],
        namespace=ns,
    )
    (running,) = assetq.claim_runs(db.engine, "w-3", dag_ids=["report"], namespace=ns)
    assetq.schedule(db.engine, namespace=ns)  # publish's run, of report's output
    alive = liveness.Liveness(db.engine, ns, "worker", 30.0, name="w-3", handles=["report"])
    alive.beat()
    try:
        yield Scene(db, failed, succeeded, running, runs[3])
    finally:
        alive.gone()


def _pages(scene: Scene) -> dict[str, str]:
    report = "/dags/report"
    return {
        "/": "/api",
        report: "/api" + report,
        f"{report}/runs/{scene.failed.run_id}": f"/api{report}/runs/{scene.failed.run_id}",
        "/assets": "/api/assets",
        "/assets/orders": "/api/assets/orders",
        "/workers": "/api/workers",
    }


# -- pages and their JSON ----------------------------------------------------------------------


def test_every_page_renders_and_its_api_twin_answers(scene: Scene) -> None:
    client = scene.client(read_only=True)
    for page, api in _pages(scene).items():
        shown = client.get(page)
        assert shown.status_code == 200, (page, shown.text)
        assert shown.headers["content-type"].startswith("text/html"), page
        answer = client.get(api)
        assert answer.status_code == 200, (api, answer.text)
        assert answer.headers["content-type"] == "application/json", api
    css = client.get("/static/style.css")
    assert css.status_code == 200 and "font" in css.text


def test_the_overview_shows_each_consumer_with_its_queue_runs_and_workers(scene: Scene) -> None:
    client = scene.client(read_only=True)
    found = client.get("/api").json()
    consumers = {c["dag_id"]: c for c in found["consumers"]}
    assert set(consumers) == {"report", "publish", "xss"}
    report = consumers["report"]
    assert report["condition_text"] == "orders"
    assert report["is_paused"] is False and report["max_attempts"] == 1
    assert (report["queued_runs"], report["running_runs"], report["failed_runs"]) == (1, 1, 1)
    assert report["active_runs"] == 2 and report["last_run_at"] is not None
    assert report["no_worker"] is False  # w-3 is alive and runs report
    # publish's run (from report's output) waits, and no worker has a handler for it.
    assert consumers["publish"]["queued_runs"] == 1 and consumers["publish"]["no_worker"]
    assert found["totals"]["consumers"] == 3 and found["totals"]["failed_runs"] == 1
    assert found["workers_alive"] == 1 and found["schedulers_alive"] == 0
    page = client.get("/").text
    assert 'href="/dags/report"' in page and "no worker" in page


def test_htmx_is_served_from_the_package_and_nothing_from_elsewhere(scene: Scene) -> None:
    client = scene.client(read_only=True)
    served = client.get("/static/htmx.min.js")
    assert served.status_code == 200
    assert "javascript" in served.headers["content-type"]
    vendored = resources.files("assetq.web") / "static" / "htmx.min.js"
    assert served.content == vendored.read_bytes() and served.text.startswith("var htmx=")
    license_ = client.get("/static/htmx.LICENSE.txt")
    assert license_.status_code == 200 and "Zero-Clause BSD" in license_.text
    for page in _pages(scene):
        text = client.get(page).text
        assert '<script src="/static/htmx.min.js" defer></script>' in text, page
        # No CDN: every script and stylesheet is the console's own.
        assert not re.search(r"""(src|href)=["'](https?:)?//""", text), page


def test_the_overview_and_a_run_page_refresh_their_live_part(scene: Scene) -> None:
    client = scene.client(read_only=True, refresh_seconds=2)
    overview = client.get("/", params={"after": "a"}).text
    assert 'hx-get="/partials/consumers?after=a" hx-trigger="every 2000ms"' in overview
    run_page = f"/dags/report/runs/{scene.running.run_id}"
    quoted = f"/dags/report/runs/{quote(scene.running.run_id, safe='')}"
    assert f'hx-get="/partials{quoted}" hx-trigger="every 2000ms"' in client.get(run_page).text
    # The consumers' partial: the table alone, as it is now.
    table = client.get("/partials/consumers")
    assert table.status_code == 200 and table.headers["content-type"].startswith("text/html")
    assert '<table id="consumers">' in table.text and "<html" not in table.text
    assert 'href="/dags/report"' in table.text and "1 workers alive" in table.text
    assert 'href="/dags/report"' not in client.get("/partials/consumers?after=report").text
    # The run's partial follows the run: cancelled by someone else, it says so.
    live = client.get(f"/partials{run_page}")
    assert live.status_code == 200 and "<html" not in live.text
    assert '<dd id="run-state" class="state running">running</dd>' in live.text
    with scene.db.engine.begin() as conn:
        assetq.cancel_run(
            conn, "report", scene.running.run_id, "elsewhere", namespace=scene.db.namespace
        )
    live = client.get(f"/partials{run_page}").text
    assert '<dd id="run-state" class="state cancelled">cancelled</dd>' in live
    assert "cancelled: elsewhere" in live
    missing = client.get("/partials/dags/report/runs/nothing")
    assert missing.status_code == 404 and "unknown" in missing.text and "<html" not in missing.text
    with pytest.raises(ValueError):
        assetq.web.app(scene.db.engine, namespace=scene.db.namespace, refresh_seconds=0)


def _age(db: TestDatabase, table: str, column: str, row_id: int, minutes: int) -> None:
    """Make row ``row_id`` of ``table`` ``minutes`` older."""
    if db.engine_name == "postgresql":
        shift = f'"{column}" = "{column}" - make_interval(mins => {minutes})'
    else:
        shift = f"`{column}` = `{column}` - INTERVAL {minutes} MINUTE"
    db.execute(f"UPDATE {{ns}}.{table} SET {shift} WHERE id = :i", i=row_id)


def test_the_overview_counts_events_and_runs_per_minute_of_the_last_hour(
    db: TestDatabase,
) -> None:
    declare(db, "tick", "tick", max_events_per_run=1)
    made = []
    for _ in range(3):  # 3 runs, of one event each
        made += register(db, "tick")
        made += assetq.schedule(db.engine, namespace=db.namespace)
    events = [e for e in made if isinstance(e, assetq.Event)]
    runs = [r for r in made if isinstance(r, assetq.Run)]
    with db.engine.begin() as conn:
        assetq.declare_asset(conn, "other")
    events += register(db, "other", "other", "other", "other")  # no consumer: no run
    assert (len(events), len(runs)) == (7, 3)
    _age(db, "asset_event", "timestamp", events[0].id, 5)  # 5 minutes ago
    _age(db, "asset_event", "timestamp", events[1].id, 120)  # before the hour: not shown
    run_id = db.scalar("SELECT id FROM {ns}.dag_run WHERE run_id = :r", r=runs[0].run_id)
    _age(db, "dag_run", "created_at", int(run_id), 30)
    client = TestClient(assetq.web.app(db.engine, namespace=db.namespace))
    found = client.get("/api").json()["activity"]
    assert found["minutes"] == 60
    assert (found["events_last_hour"], found["runs_last_hour"]) == (6, 3)
    per_event, per_run = found["events_per_minute"], found["runs_per_minute"]
    assert len(per_event) == len(per_run) == 60
    # Index 59 is the last minute; the test registered everything well within it.
    assert per_event[59] == 5 and per_event[59 - 5] == 1 and sum(per_event) == 6
    assert per_run[59] == 2 and per_run[59 - 30] == 1 and sum(per_run) == 3
    page = client.get("/").text
    assert "events per minute, last hour: 6 in all, at most 5 a minute" in page
    assert "runs per minute, last hour: 3 in all, at most 2 a minute" in page
    assert page.count("<rect ") == 4  # a bar per minute that had any
    assert "<rect " in client.get("/partials/consumers").text  # the chart refreshes too


def test_a_consumer_page_pages_its_runs_by_key_and_filters_by_state(scene: Scene) -> None:
    client = scene.client(read_only=True)
    found = client.get("/api/dags/report").json()
    assert found["dag"]["dag_id"] == "report" and found["dag"]["condition_text"] == "orders"
    assert [r["run_id"] for r in found["runs"]] == [
        scene.queued.run_id,
        scene.running.run_id,
        scene.succeeded.run_id,
        scene.failed.run_id,
    ]
    failed = client.get("/api/dags/report", params={"state": "failed"}).json()
    assert [r["run_id"] for r in failed["runs"]] == [scene.failed.run_id]
    older = client.get("/api/dags/report", params={"before": scene.running.seq}).json()
    assert [r["run_id"] for r in older["runs"]] == [scene.succeeded.run_id, scene.failed.run_id]
    assert client.get("/api/dags/report", params={"state": "lost"}).status_code == 400
    # xss's event waits in its queue (its condition is met, but no pass ran since).
    register(scene.db, XSS)
    queued = client.get("/api/dags/xss").json()["queued_events"]
    assert [e["asset"] for e in queued] == [XSS]


def test_a_consumer_page_shows_its_condition_as_a_tree(scene: Scene) -> None:
    db = scene.db
    nested = assetq.all_of(
        "orders", assetq.any_of(XSS, assetq.alias("feeds"), assetq.asset_uri("s3://b/k"))
    )
    declare(db, "tree", nested)
    client = scene.client(read_only=True)
    stored = client.get("/api/dags/tree").json()["dag"]["condition"]
    assert stored == {
        "all_of": [
            {"asset": "orders"},
            {"any_of": [{"asset": XSS}, {"alias": "feeds"}, {"uri": "s3://b/k"}]},
        ]
    }
    page = client.get("/dags/tree").text
    tree = page[page.index('<ul class="condition" id="condition-tree">') :]
    tree = re.sub(r"\s+", " ", tree[: tree.index("</dd>")])
    assert XSS not in page and html.escape(XSS, quote=False) in tree
    # all of (orders, any of (<script>, alias feeds, asset uri s3://b/k)), nested in that order
    assert re.search(
        r'<span class="op">all of</span> <ul> <li><span class="kind">asset</span>'
        r' <a href="/assets/orders">orders</a></li> <li><span class="op">any of</span> <ul>'
        r' <li><span class="kind">asset</span> <a href="/assets/%3Cscript%3E[^"]*">&lt;script&gt;'
        r'.*</a></li> <li><span class="kind">alias</span> feeds</li>'
        r' <li><span class="kind">asset uri</span> <a href="/assets/s3%3A%2F%2Fb%2Fk">s3://b/k</a>'
        r"</li> </ul> </li> </ul> </li>",
        tree,
    ), tree


def test_a_run_page_has_what_run_show_has(scene: Scene) -> None:
    client = scene.client(read_only=True)
    found = client.get(f"/api/dags/report/runs/{scene.succeeded.run_id}").json()
    assert found["run"]["state"] == "success" and found["run"]["worker"].startswith("w-2")
    assert found["run"]["attempt"] == 1 and found["max_attempts"] == 1
    assert [e["asset"] for e in found["consumed_events"]] == ["orders"]
    assert [(e["asset"], e["extra"]) for e in found["outputs"]] == [("report_done", {"rows": 7})]
    failed = client.get(f"/api/dags/report/runs/{scene.failed.run_id}").json()
    assert failed["run"]["error"].startswith(f"ValueError: {XSS}")


def test_a_run_page_gives_every_attempt_and_the_timeline(scene: Scene) -> None:
    """A run failed once (its error with HTML), then held: both attempts, newest first, in
    the JSON and the page; the timeline in order, the error's first line in it as text."""
    db, ns = scene.db, scene.db.namespace
    declare(db, "flaky", "flaky_input", max_attempts=2, retry_delay=0)
    register(db, "flaky_input")
    (run,) = [r for r in assetq.schedule(db.engine, namespace=ns) if r.dag_id == "flaky"]
    (first,) = assetq.claim_runs(db.engine, "w-a", dag_ids=["flaky"], namespace=ns)
    assetq.complete_run(db.engine, first, "failed", error=f"Traceback\n{XSS}", namespace=ns)
    (second,) = assetq.claim_runs(db.engine, "w-b", dag_ids=["flaky"], namespace=ns)
    client = scene.client(read_only=True)
    found = client.get(f"/api/dags/flaky/runs/{run.run_id}").json()
    assert [(a["attempt"], a["outcome"], a["worker"]) for a in found["attempts"]] == [
        (2, "running", second.worker),
        (1, "failed", first.worker),
    ]
    assert found["attempts"][1]["error"] == f"Traceback\n{XSS}"
    assert [t["what"] for t in found["timeline"]] == [
        "created with 1 event(s)",
        f"attempt 1 claimed by {first.worker}",
        "attempt 1 failed: Traceback",
        f"attempt 2 claimed by {second.worker}",
    ]
    assert [t["at"] for t in found["timeline"]] == sorted(t["at"] for t in found["timeline"])
    page = client.get(f"/dags/flaky/runs/{run.run_id}").text
    assert page.count('<tr class="attempt">') == 2
    assert "attempt 1 failed: Traceback" in page
    assert XSS not in page and html.escape(XSS, quote=False) in page


def test_a_partitioned_consumer_page_shows_its_pending_partitions_by_key(scene: Scene) -> None:
    db, ns = scene.db, scene.db.namespace
    declare(db, "daily", assetq.all_of("sales", "costs"), partitioned=True)
    with db.engine.begin() as conn:
        for asset, key in (("sales", "d2"), ("sales", "d1"), ("costs", "d2"), ("sales", "d3")):
            assetq.register_event(conn, asset, partition_key=key, namespace=ns)
    client = scene.client(read_only=True)
    found = client.get("/api/dags/daily").json()
    assert [(p["partition_key"], p["events"], p["asset_names"]) for p in found["partitions"]] == [
        ("d1", 1, ["sales"]),
        ("d2", 2, ["costs", "sales"]),
        ("d3", 1, ["sales"]),
    ]
    assert all(p["oldest_queued_at"] for p in found["partitions"])
    assert found["partitions_next_after"] is None
    later = client.get("/api/dags/daily?partitions_after=d2").json()["partitions"]
    assert [p["partition_key"] for p in later] == ["d3"]
    page = client.get("/dags/daily").text
    assert page.count('<tr class="partition">') == 3 and "Pending partitions" in page
    # A consumer that is not partitioned has no such section.
    assert "Pending partitions" not in client.get("/dags/report").text
    assert client.get("/api/dags/report").json()["partitions"] == []


def test_the_asset_pages_show_events_and_consumers(scene: Scene) -> None:
    client = scene.client(read_only=True)
    names = [a["name"] for a in client.get("/api/assets").json()["assets"]]
    assert names == sorted([XSS, "orders", "report_done"])
    orders = client.get("/api/assets/orders").json()
    assert orders["asset"]["name"] == "orders" and len(orders["events"]) == 4
    assert [c["dag_id"] for c in orders["consumers"]] == ["report"]
    paged = client.get("/api/assets/orders", params={"before": _cursor(orders["events"][1])})
    assert [e["id"] for e in paged.json()["events"]] == [e["id"] for e in orders["events"][2:]]


def test_an_asset_page_finds_an_event_by_idempotency_key_and_shows_its_aliases(
    scene: Scene,
) -> None:
    db = scene.db
    with db.engine.begin() as conn:
        keyed = assetq.register_event(
            conn, "orders", idempotency_key="batch-42", aliases=["orders_feed", "all_orders"]
        )
        other = assetq.register_event(conn, "orders", idempotency_key="batch-43")
    # Older than the page's seven days: the unique index still finds it by key.
    _age(db, "asset_event", "timestamp", keyed.id, 30 * 24 * 60)
    client = scene.client(read_only=True)
    found = client.get("/api/assets/orders", params={"key": "batch-42"}).json()
    assert [e["id"] for e in found["events"]] == [keyed.id] and found["key"] == "batch-42"
    assert found["events"][0]["aliases"] == ["all_orders", "orders_feed"]
    assert found["events_next_before"] is None
    assert keyed.id not in [e["id"] for e in client.get("/api/assets/orders").json()["events"]]
    assert [e["id"] for e in client.get("/api/assets/orders?key=batch-43").json()["events"]] == [
        other.id
    ]
    assert client.get("/api/assets/orders", params={"key": "nothing"}).json()["events"] == []
    # The key is the asset's own: another asset's page does not find it.
    assert client.get("/api/assets/report_done", params={"key": "batch-42"}).json()["events"] == []
    assert found["aliases"] == ["all_orders", "orders_feed"]
    assert client.get("/api/assets/report_done").json()["aliases"] == []
    page = client.get("/assets/orders", params={"key": "batch-42"}).text
    assert '<input type="search" name="key" value="batch-42"' in page
    assert "<li>orders_feed</li>" in page and f"<td>{keyed.id}</td>" in page
    shown = client.get("/assets/orders", params={"key": XSS}).text
    assert XSS not in shown and html.escape(XSS, quote=False) in shown


def _cursor(event: dict[str, Any]) -> str:
    return f"{event['timestamp']}~{event['id']}"


def test_the_workers_page_shows_each_worker_with_its_consumers(scene: Scene) -> None:
    client = scene.client(read_only=True)
    (worker,) = client.get("/api/workers").json()["processes"]
    assert worker["kind"] == "worker" and worker["name"] == "w-3"
    assert worker["dag_ids"] == ["report"] and worker["stale"] is False
    assert 'href="/dags/report"' in client.get("/workers").text


def test_unknown_dags_runs_and_assets_are_404_with_the_error(scene: Scene) -> None:
    client = scene.client(read_only=True)
    for path in ("/dags/nothing", "/dags/report/runs/nothing", "/assets/nothing"):
        assert client.get(path).status_code == 404, path
        answer = client.get("/api" + path)
        assert answer.status_code == 404 and "unknown" in answer.json()["error"], path


def test_the_pages_need_only_a_readers_rights(scene: Scene) -> None:
    db = scene.db
    with made_logins(db, ["reader"], "aqweb") as logins:
        login = logins["reader"]
        assetq.grant_roles(db.engine, reader=[login.grantee], namespace=db.namespace)
        try:
            console = assetq.web.app(login.engine, namespace=db.namespace)
            with TestClient(console) as client:
                for page, api in _pages(scene).items():
                    assert client.get(page).status_code == 200, page
                    assert client.get(api).status_code == 200, api
        finally:
            assetq.revoke_roles(db.engine, [login.grantee], namespace=db.namespace)


def test_a_mounted_console_links_under_its_mount_path(scene: Scene) -> None:
    console = assetq.web.app(scene.db.engine, namespace=scene.db.namespace)
    host = Starlette(routes=[Mount("/ops/assetq", app=console)])
    with TestClient(host) as client:
        page = client.get("/ops/assetq/")
        assert page.status_code == 200
        assert 'href="/ops/assetq/dags/report"' in page.text
        assert 'href="/ops/assetq/static/style.css"' in page.text
        assert client.get("/ops/assetq/static/style.css").status_code == 200


# -- escaping ----------------------------------------------------------------------------------


def test_asset_names_and_errors_are_shown_as_text(scene: Scene) -> None:
    client = scene.client()
    escaped = html.escape(XSS, quote=False)
    for path in (
        "/",
        "/assets",
        f"/assets/{XSS}",
        "/dags/xss",
        f"/dags/report/runs/{scene.failed.run_id}",
        "/dags/report",
    ):
        page = client.get(path)
        assert page.status_code == 200, (path, page.text)
        assert XSS not in page.text, path
        assert escaped in page.text, path


# -- actions -----------------------------------------------------------------------------------


def _token(client: TestClient) -> str:
    token = client.app.state.csrf_token  # type: ignore[attr-defined]
    assert isinstance(token, str) and len(token) == 64
    return token


def test_an_action_without_the_csrf_token_is_refused_and_writes_nothing(scene: Scene) -> None:
    client = scene.client()
    cancel = f"/dags/report/runs/{scene.running.run_id}/cancel"
    retry = f"/dags/report/runs/{scene.failed.run_id}/retry"
    for data in ({}, {"csrf_token": "0" * 64}):
        assert client.post(cancel, data=data).status_code == 403
        assert client.post(retry, data=data).status_code == 403
        assert client.post("/dags/report/pause", data=data).status_code == 403
    assert scene.state(scene.running.run_id) == "running"
    assert scene.state(scene.failed.run_id) == "failed"
    assert not scene.paused("report")


def test_cancel_with_the_token_cancels_through_the_api_and_is_logged(
    scene: Scene, caplog: pytest.LogCaptureFixture
) -> None:
    client = scene.client()
    page = client.get(f"/dags/report/runs/{scene.running.run_id}").text
    token = _token(client)
    assert f'value="{token}"' in page and "/cancel" in page
    with caplog.at_level(logging.INFO, logger="assetq.web"):
        done = client.post(
            f"/dags/report/runs/{scene.running.run_id}/cancel",
            data={"csrf_token": token, "reason": "bad input"},
        )
    assert done.status_code == 303
    assert done.headers["location"] == f"/dags/report/runs/{quote(scene.running.run_id, safe='')}"
    assert scene.state(scene.running.run_id) == "cancelled"
    shown = client.get(f"/api/dags/report/runs/{scene.running.run_id}").json()["run"]
    assert shown["error"] == "cancelled: bad input"
    (line,) = [r for r in caplog.records if r.name == "assetq.web"]
    assert "cancel" in line.getMessage() and "testclient" in line.getMessage()


def test_retry_pause_and_unpause_with_the_token(scene: Scene) -> None:
    client = scene.client()
    token = {"csrf_token": _token(client)}
    retried = client.post(f"/dags/report/runs/{scene.failed.run_id}/retry", data=token)
    assert retried.status_code == 303 and scene.state(scene.failed.run_id) == "queued"
    assert client.post("/dags/report/pause", data=token).status_code == 303
    assert scene.paused("report")
    assert client.get("/api/dags/report").json()["dag"]["is_paused"] is True
    assert client.post("/dags/report/unpause", data=token).status_code == 303
    assert not scene.paused("report")


def test_an_action_the_api_refuses_is_shown_and_writes_nothing(scene: Scene) -> None:
    client = scene.client()
    token = {"csrf_token": _token(client)}
    refused = client.post(f"/dags/report/runs/{scene.succeeded.run_id}/retry", data=token)
    assert refused.status_code == 409 and "success" in refused.text
    assert scene.state(scene.succeeded.run_id) == "success"
    assert client.post("/dags/nothing/pause", data=token).status_code == 404
    assert client.post("/dags/report/explode", data=token).status_code == 404


def test_read_only_shows_no_action_and_refuses_every_post(scene: Scene) -> None:
    client = scene.client(read_only=True)
    token = {"csrf_token": _token(client)}
    for path in (
        "/dags/report",
        f"/dags/report/runs/{scene.running.run_id}",
        f"/dags/report/runs/{scene.failed.run_id}",
    ):
        page = client.get(path).text
        assert "<form" not in page and token["csrf_token"] not in page, path
    assert (
        client.post(f"/dags/report/runs/{scene.running.run_id}/cancel", data=token).status_code
        == 403
    )
    assert (
        client.post(f"/dags/report/runs/{scene.failed.run_id}/retry", data=token).status_code == 403
    )
    assert client.post("/dags/report/pause", data=token).status_code == 403
    assert scene.state(scene.running.run_id) == "running"
    assert scene.state(scene.failed.run_id) == "failed"
    assert not scene.paused("report")


def test_the_app_is_read_only_unless_asked(scene: Scene) -> None:
    console = assetq.web.app(scene.db.engine, namespace=scene.db.namespace)
    with TestClient(console) as client:
        assert "<form" not in client.get(f"/dags/report/runs/{scene.running.run_id}").text


def test_a_password_asks_for_http_basic_authentication(scene: Scene) -> None:
    client = scene.client(password="s3cret")
    assert client.get("/").status_code == 401
    assert client.get("/api").headers["www-authenticate"].startswith("Basic")
    assert client.get("/", auth=("ops", "wrong")).status_code == 401
    assert client.get("/", auth=("ops", "s3cret")).status_code == 200


# -- bounded statements ------------------------------------------------------------------------


def _statements(db: TestDatabase, client: TestClient, path: str) -> int:
    count = 0

    def counted(*_: Any) -> None:
        nonlocal count
        count += 1

    sa.event.listen(db.engine, "before_cursor_execute", counted)
    try:
        assert client.get(path).status_code == 200, path
    finally:
        sa.event.remove(db.engine, "before_cursor_execute", counted)
    return count


def _grow(db: TestDatabase, runs: int) -> None:
    """``runs`` more runs of many (one event each) and as many events queued for backlog."""
    for _ in range(runs):
        register(db, "many")
        assetq.schedule(db.engine, namespace=db.namespace)
    with db.engine.begin() as conn:
        assetq.register_events(conn, [assetq.NewEvent("waiting") for _ in range(runs)])


def test_the_statements_a_page_sends_do_not_grow_with_the_history(db: TestDatabase) -> None:
    declare(db, "many", "many", max_events_per_run=1)
    declare(db, "backlog", "waiting")
    _grow(db, 10)
    with db.engine.connect() as conn:
        (run,) = assetq.runs(conn, "many", limit=1, namespace=db.namespace)
    console = assetq.web.app(db.engine, namespace=db.namespace)
    client = TestClient(console)
    pages = [
        "/",
        "/dags/many",
        "/dags/backlog",
        f"/dags/many/runs/{run.run_id}",
        "/assets",
        "/assets/many",
        "/assets/waiting",
        "/assets/many?key=nothing",
        "/workers",
        "/partials/consumers",
        f"/partials/dags/many/runs/{run.run_id}",
    ]
    for page in pages:  # the first call of a process checks the schema once
        client.get(page)
    before = {page: _statements(db, client, page) for page in pages}
    _grow(db, 190)
    after = {page: _statements(db, client, page) for page in pages}
    assert after == before
    assert db.scalar("SELECT COUNT(*) FROM {ns}.dag_run WHERE dag_id = 'many'") == 200
    assert len(client.get("/api/dags/backlog").json()["queued_events"]) == 50
    assert all(count <= 8 for count in after.values()), after


# -- the command line --------------------------------------------------------------------------


def test_web_refuses_another_address_without_auth(capsys: pytest.CaptureFixture[str]) -> None:
    url = "postgresql://nobody@127.0.0.1:1/nothing"
    assert cli.main(["web", "--url", url, "--host", "0.0.0.0"]) == cli.EXIT_USAGE
    assert "without --auth" in capsys.readouterr().err


def test_web_auth_needs_the_password_in_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(cli.WEB_PASSWORD_ENV, raising=False)
    url = "postgresql://nobody@127.0.0.1:1/nothing"
    assert cli.main(["web", "--url", url, "--host", "0.0.0.0", "--auth"]) == cli.EXIT_USAGE
    assert cli.WEB_PASSWORD_ENV in capsys.readouterr().err


# -- a real browser ----------------------------------------------------------------------------


@contextlib.contextmanager
def _serving(console: Starlette) -> Iterator[str]:
    """``console`` served by uvicorn on a free port of 127.0.0.1."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(console, host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture
def served(scene: Scene) -> Iterator[str]:
    """The console with actions, served by uvicorn on a free port of 127.0.0.1."""
    console = assetq.web.app(scene.db.engine, namespace=scene.db.namespace, read_only=False)
    with _serving(console) as url:
        yield url


def _browser() -> Any:
    chromium = shutil.which("chromium")
    driver = shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.skip(
            "no chromium or chromedriver on this machine: apt-get install chromium"
            " chromium-driver (.ci/run does)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,860",
    ):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(executable_path=driver), options=options)


def test_in_a_browser_click_through_to_a_running_run_and_cancel_it(
    scene: Scene, served: str, tmp_path: Path
) -> None:
    """Also the README's screenshot of the overview: ``ASSETQ_WEB_SCREENSHOT=docs/web.png
    pytest tests/test_web.py -k click_through -k postgresql`` writes it there."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    browser = _browser()
    try:
        browser.get(served + "/")
        assert "Consumers" in browser.title
        shot = Path(os.environ.get("ASSETQ_WEB_SCREENSHOT") or tmp_path / "overview.png")
        assert browser.save_screenshot(str(shot))
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        browser.find_element(By.LINK_TEXT, "report").click()
        assert browser.find_element(By.ID, "dag-state").text == "active"
        browser.find_element(By.LINK_TEXT, scene.running.run_id).click()
        assert browser.find_element(By.ID, "run-state").text == "running"
        browser.find_element(By.NAME, "reason").send_keys("from the browser")
        browser.find_element(By.CSS_SELECTOR, "button[value=cancel]").click()
        WebDriverWait(browser, 10).until(expected_conditions.alert_is_present())
        browser.switch_to.alert.accept()  # the page asks to confirm
        WebDriverWait(browser, 10).until(
            lambda b: b.find_element(By.ID, "run-state").text == "cancelled"
        )
        assert "cancelled: from the browser" in browser.find_element(By.ID, "run-error").text
        assert scene.state(scene.running.run_id) == "cancelled"
        # Retry it from the same page: queued again.
        browser.find_element(By.CSS_SELECTOR, "button[value=retry]").click()
        WebDriverWait(browser, 10).until(expected_conditions.alert_is_present())
        browser.switch_to.alert.accept()
        WebDriverWait(browser, 10).until(
            lambda b: b.find_element(By.ID, "run-state").text == "queued"
        )
        assert scene.state(scene.running.run_id) == "queued"
    finally:
        browser.quit()


def test_in_a_browser_the_pages_refresh_themselves_with_the_vendored_htmx(scene: Scene) -> None:
    """No reload (a mark left in the window survives): the run page shows the run cancelled
    elsewhere, the overview a consumer declared since, within a few refreshes."""
    from selenium.webdriver.support.ui import WebDriverWait

    console = assetq.web.app(scene.db.engine, namespace=scene.db.namespace, refresh_seconds=0.5)
    browser = _browser()
    try:
        with _serving(console) as url:
            browser.get(f"{url}/dags/report/runs/{scene.running.run_id}")
            state = "return document.getElementById('run-state').textContent"
            assert browser.execute_script(state) == "running"
            assert browser.execute_script("return typeof htmx") == "object"
            browser.execute_script("window.assetqMark = 1")
            with scene.db.engine.begin() as conn:
                assetq.cancel_run(
                    conn, "report", scene.running.run_id, None, namespace=scene.db.namespace
                )
            WebDriverWait(browser, 15).until(lambda b: b.execute_script(state) == "cancelled")
            assert browser.execute_script("return window.assetqMark") == 1
            # Every half second, not as fast as the answers come back (htmx 4 took "every
            # 0.5s" for no interval at all): the requests since the page's first, counted
            # against the time the page itself measured.
            polls = (
                "return [performance.now(), performance.getEntriesByType('resource')"
                ".filter(e => e.name.includes('/partials/')).length]"
            )
            elapsed_ms, requests = browser.execute_script(polls)
            assert 1 <= requests <= elapsed_ms / 500 + 2, (elapsed_ms, requests)
            browser.get(f"{url}/")
            browser.execute_script("window.assetqMark = 2")
            declare(scene.db, "later", "orders")
            WebDriverWait(browser, 15).until(
                lambda b: b.execute_script(
                    "return document.querySelector('#consumers a[href=\"/dags/later\"]') !== null"
                )
            )
            assert browser.execute_script("return window.assetqMark") == 2
    finally:
        browser.quit()


@dataclass
class WebCommand:
    """`python -m assetq web` as a user runs it, in a child process."""

    process: subprocess.Popen[bytes]
    url: str
    #: What it printed and its exit status, once stopped.
    out: str = ""
    err: str = ""

    def api(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.url}/api{path}", timeout=5) as answer:
            return json.loads(answer.read())


@contextlib.contextmanager
def _assetq_web(db: TestDatabase, *flags: str) -> Iterator[WebCommand]:
    """`python -m assetq web --url ... --port P *flags`, answering on 127.0.0.1; stopped with
    SIGTERM on the way out, its output and exit status then in the WebCommand."""
    port = free_port()
    url = db.url.render_as_string(hide_password=False)
    server = subprocess.Popen(
        [sys.executable, "-m", "assetq", "web", "--url", url, "--namespace", db.namespace,
         "--port", str(port), *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    command = WebCommand(server, f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                command.api("")
                break
            except OSError:
                assert server.poll() is None, server.communicate()
                assert time.monotonic() < deadline, "assetq web did not answer"
                time.sleep(0.1)
        yield command
    finally:
        server.send_signal(signal.SIGTERM)
        out, err = server.communicate(timeout=20)
        command.out, command.err = out.decode(), err.decode()


def test_assetq_web_serves_the_console(scene: Scene) -> None:
    """The command as a user runs it: `python -m assetq web --url ... --port P --read-only`
    answers on 127.0.0.1, shows no action, and stops on SIGTERM."""
    with _assetq_web(scene.db, "--read-only") as web:
        found = web.api("")
        assert {c["dag_id"] for c in found["consumers"]} == {"report", "publish", "xss"}
        with urllib.request.urlopen(f"{web.url}/dags/report", timeout=5) as page:
            assert "<form" not in page.read().decode()
    assert web.process.returncode == 0, web.err
    assert f"{web.url}/ (read-only)" in web.out


def test_in_a_browser_with_a_producer_a_scheduler_and_a_worker_running(
    db: TestDatabase,
) -> None:
    """The console as an operator meets it: `assetq web --actions` while a producer registers
    events, a scheduler makes runs and a worker executes them (ingest succeeds, flaky fails,
    slow runs until told to stop). Through the pages only: every page is opened by following
    links; flaky's failed run is retried and fails again as its second attempt; slow's
    running run is cancelled and its handler told; the pages then show both."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    ns = db.namespace
    declare(db, "ingest", "raw")
    declare(db, "flaky", "bad", max_attempts=1)
    declare(db, "slow", "big", max_attempts=1)
    stop = threading.Event()
    told = threading.Event()

    def ok(claim: assetq.Claim, conn: sa.Connection) -> None:
        return None

    def fail(claim: assetq.Claim, conn: sa.Connection) -> None:
        raise RuntimeError(f"bad input {XSS}")

    def hang(claim: assetq.Claim, conn: sa.Connection) -> None:
        assert claim.cancelled is not None
        if claim.cancelled.wait(120):  # the worker sets it when the run is cancelled
            told.set()
        raise RuntimeError("stopped")

    def produce() -> None:
        while not stop.wait(0.2):
            with db.engine.begin() as conn:
                assetq.register_event(conn, "raw", extra={"n": 1}, namespace=ns)

    with db.engine.begin() as conn:
        assetq.register_event(conn, "bad", namespace=ns)
        assetq.register_event(conn, "big", namespace=ns)
    threads = [
        threading.Thread(target=produce, name="producer"),
        threading.Thread(
            target=assetq.run_scheduler,
            args=(db.engine,),
            kwargs={"namespace": ns, "poll_interval": 0.5, "stop_event": stop},
            name="scheduler",
        ),
        threading.Thread(
            target=assetq.run_worker,
            args=(db.engine, {"ingest": ok, "flaky": fail, "slow": hang}),
            kwargs={
                "worker": "live-worker",
                "concurrency": 3,
                "lease": timedelta(seconds=3),
                "poll_interval": 0.2,
                "stop": stop,
                "namespace": ns,
            },
            name="worker",
        ),
    ]
    for thread in threads:
        thread.start()
    browser = _browser()
    try:
        with _assetq_web(db, "--actions", "--refresh", "0.5") as web:
            # The overview's and a run page's live parts are swapped in every 0.5 s: an
            # element found a moment ago may be gone, so every look is retried until it holds.
            wait = WebDriverWait(
                browser,
                60,
                poll_frequency=0.2,
                ignored_exceptions=(StaleElementReferenceException,),
            )

            def click(by: str, value: str) -> None:
                wait.until(lambda b: b.find_element(by, value).click() or True)

            def shown(by: str, value: str) -> Any:
                """The element, once a reload of the page shows it."""

                def found(b: Any) -> Any:
                    hits = b.find_elements(by, value)
                    if not hits:
                        b.refresh()
                    return hits[0] if hits else False

                return wait.until(found)

            def click_shown(by: str, value: str) -> None:
                """Click the element, reloading the page until it shows it."""
                shown(by, value)
                click(by, value)

            def confirm_click(selector: str) -> None:
                click(By.CSS_SELECTOR, selector)
                wait.until(expected_conditions.alert_is_present())
                browser.switch_to.alert.accept()  # the page asks to confirm

            def run_state() -> str:
                return str(browser.find_element(By.ID, "run-state").text)

            def outcomes(b: Any) -> list[str]:
                """The outcomes in the run page's attempts table, newest first."""
                return [e.text for e in b.find_elements(By.CSS_SELECTOR, "tr.attempt td.state")]

            browser.get(web.url + "/")
            # The overview: the three consumers, a scheduler and a worker alive.
            for dag_id in ("ingest", "flaky", "slow"):
                shown(By.LINK_TEXT, dag_id)
            wait.until(lambda b: web.api("")["workers_alive"] == 1)
            wait.until(lambda b: web.api("")["schedulers_alive"] == 1)

            # flaky's run fails; retried from its page, it fails again as attempt 2.
            click(By.LINK_TEXT, "flaky")
            click(By.LINK_TEXT, "failed")
            click_shown(By.CSS_SELECTOR, "#runs a")
            wait.until(lambda b: run_state() == "failed" and outcomes(b) == ["failed"])
            confirm_click("button[value=retry]")
            wait.until(lambda b: run_state() == "failed" and outcomes(b) == ["failed", "failed"])
            assert "attempt 2 failed: RuntimeError: bad input" in browser.page_source
            assert XSS not in browser.page_source  # the handler's error is shown as text

            # slow's run is running; cancelled from its page, its handler is told.
            browser.get(web.url + "/")
            click(By.LINK_TEXT, "slow")
            click(By.LINK_TEXT, "running")
            click_shown(By.CSS_SELECTOR, "#runs a")
            wait.until(lambda b: run_state() == "running")
            browser.find_element(By.NAME, "reason").send_keys("operator in a browser")
            confirm_click("button[value=cancel]")
            wait.until(lambda b: run_state() == "cancelled")
            assert told.wait(30), "the worker did not tell the handler its run was cancelled"
            reason = "cancelled: operator in a browser"
            wait.until(
                lambda b: (
                    reason in b.find_element(By.ID, "run-error").text
                    and outcomes(b) == ["cancelled"]
                )
            )

            # ingest's runs succeed while the producer goes on.
            browser.get(web.url + "/dags/ingest?state=success")
            click_shown(By.CSS_SELECTOR, "#runs a")
            wait.until(lambda b: run_state() == "success" and outcomes(b) == ["success"])
            wait.until(lambda b: "live-worker" in b.find_element(By.ID, "attempts").text)

            # The assets and the workers, by their links.
            browser.get(web.url + "/")
            click(By.LINK_TEXT, "Assets")
            click(By.LINK_TEXT, "raw")
            assert "ingest" in browser.page_source
            click(By.LINK_TEXT, "Workers")
            assert "live-worker" in browser.page_source and "slow" in browser.page_source
    finally:
        browser.quit()
        stop.set()
        join_all(threads)
    assert web.process.returncode == 0, web.err
    with db.engine.connect() as conn:
        flaky = assetq.runs(conn, "flaky", namespace=ns)
        slow = assetq.runs(conn, "slow", namespace=ns)
    assert [(r.state, r.attempt) for r in flaky] == [("failed", 2)]
    assert [r.state for r in slow] == ["cancelled"]


def test_the_console_acts_by_default_only_for_a_role_that_may(scene: Scene) -> None:
    """`assetq web` with neither --read-only nor --actions: actions when the URL's role may
    retry, cancel and pause (the owner here), read-only for a reader; on MySQL, whose routine
    rights an account cannot always read, read-only."""
    db = scene.db
    with db.engine.connect() as conn:
        owner = assetq.ops.can_operate(conn, namespace=db.namespace)
    assert owner is (True if db.engine_name == "postgresql" else None)
    with made_logins(db, ["reader"], "aqwebop") as logins:
        login = logins["reader"]
        assetq.grant_roles(db.engine, reader=[login.grantee], namespace=db.namespace)
        try:
            with login.engine.connect() as conn:
                reader = assetq.ops.can_operate(conn, namespace=db.namespace)
        finally:
            assetq.revoke_roles(db.engine, [login.grantee], namespace=db.namespace)
    assert reader is (False if db.engine_name == "postgresql" else None)
