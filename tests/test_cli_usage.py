"""`assetq` usage, refused before any database is reached (exit code 2): durations as people
write them, negative values, unsupported URLs; and help texts that say what the commands do.
In-process (``cli.main``), so each test costs no interpreter start."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import pytest

from assetq import cli, ops

#: Nothing answers here; every test below is refused before connecting.
NOWHERE = "postgresql://nobody@127.0.0.1:1/nothing"

#: Every command with the options it needs to get past argparse.
COMMAND_LINES = {
    "demo": ["demo"],
    "install": ["install"],
    "upgrade": ["upgrade"],
    "repair": ["repair"],
    "sql": ["sql"],
    "uninstall": ["uninstall", "--yes"],
    "scheduler": ["scheduler"],
    "worker": ["worker", "--handlers", "os:environ"],
    "status": ["status"],
    "doctor": ["doctor"],
    "purge": ["purge", "--older-than", "30d"],
    "grant": ["grant", "--reader", "grafana"],
    "runs": ["runs"],
    "run": ["run", "show", "report", "r1"],
    "dags": ["dags"],
    "dag": ["dag", "pause", "report"],
    "events": ["events", "--asset", "orders"],
    "web": ["web"],
}


def test_the_command_lines_above_are_every_command() -> None:
    assert set(COMMAND_LINES) == {command.name for command in cli.COMMANDS}


def _older_than(text: str) -> timedelta:
    args = cli.build_parser().parse_args(["purge", "--older-than", text])
    assert isinstance(args.older_than, timedelta)
    return args.older_than


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30d", timedelta(days=30)),
        ("30D", timedelta(days=30)),
        ("1d2h", timedelta(days=1, hours=2)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("90m", timedelta(minutes=90)),
        ("45s", timedelta(seconds=45)),
        ("2W", timedelta(weeks=2)),
        ("12H", timedelta(hours=12)),
        ("1.5h", timedelta(minutes=90)),
        ("1d 12h", timedelta(hours=36)),
        ("0s", timedelta(0)),
    ],
)
def test_durations_are_read_as_people_write_them(text: str, expected: timedelta) -> None:
    assert _older_than(text) == expected


def _refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """stderr of a command line that must be refused as a usage error."""
    with pytest.raises(SystemExit) as exited:
        cli.main(["--url", NOWHERE, *argv])
    assert exited.value.code == cli.EXIT_USAGE
    return capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [["--older-than", "-1d"], ["--older-than=-1d"], ["--older-than", "-30D"]],
    ids=["separate", "glued", "upper-case"],
)
def test_a_negative_duration_is_a_usage_error_that_says_so(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    err = _refused(capsys, "purge", *argv)
    assert "a duration cannot be negative" in err
    assert "expected one argument" not in err


def test_an_empty_duration_is_a_usage_error_that_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert "empty duration" in _refused(capsys, "purge", "--older-than", "")


@pytest.mark.parametrize("text", ["30", "d", "1x", "1d-2h", "one day", "1dd"])
def test_a_malformed_duration_is_a_usage_error_with_examples(
    capsys: pytest.CaptureFixture[str], text: str
) -> None:
    err = _refused(capsys, "purge", "--older-than", text)
    assert f"not a duration: {text!r}" in err and "1d12h" in err


def test_a_negative_number_reaches_the_options_own_check(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = _refused(capsys, "scheduler", "--limit", "-5")
    assert "must be at least 1, got -5" in err
    assert "expected one argument" not in err


@pytest.mark.parametrize("command", sorted(COMMAND_LINES))
def test_an_unsupported_url_is_refused_before_anything_touches_the_filesystem(
    command: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    code = cli.main(["--url", "sqlite:///x.db", *COMMAND_LINES[command]])
    assert code == cli.EXIT_USAGE
    assert "unsupported database URL 'sqlite:///x.db'" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_an_unsupported_url_from_the_environment_is_refused_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(cli.URL_ENV, "sqlite:///x.db")
    assert cli.main(["status"]) == cli.EXIT_USAGE
    assert "unsupported database URL" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def _help(capsys: pytest.CaptureFixture[str], command: str) -> str:
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines


def test_scheduler_help_says_once_how_runs_are_printed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = _help(capsys, "scheduler")
    assert "print each run created on stdout, as one JSON object per line" in text
    assert "as JSON" not in text


def test_grant_help_and_the_operations_guide_agree_that_upgrades_keep_grants(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The behaviour itself: tests/test_cli_grant_upgrade.py."""
    text = _help(capsys, "grant")
    guide = " ".join((Path(__file__).parents[1] / "docs" / "operations.md").read_text().split())
    assert "Upgrades keep what was granted" in text
    assert "Upgrades keep what was granted" in guide
    assert "again after an upgrade" not in text


@pytest.mark.parametrize("command", ["purge", "uninstall"])
def test_purge_and_uninstall_offer_a_dry_run(
    capsys: pytest.CaptureFixture[str], command: str
) -> None:
    assert "--dry-run" in _help(capsys, command)


@pytest.fixture
def no_asyncpg(monkeypatch: pytest.MonkeyPatch) -> str:
    """A URL of a supported engine whose driver is not installed (``import asyncpg`` fails
    whether or not the machine has it)."""
    monkeypatch.setitem(sys.modules, "asyncpg", None)
    return "postgresql+asyncpg://nobody@127.0.0.1:1/nothing"


@pytest.mark.parametrize("command", sorted(set(COMMAND_LINES) - {"sql"}))  # sql connects to none
def test_a_url_whose_driver_is_not_installed_is_a_usage_error(
    command: str, no_asyncpg: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["--url", no_asyncpg, *COMMAND_LINES[command]]) == cli.EXIT_USAGE
    assert "no driver for 'postgresql+asyncpg'" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["scheduler", "worker"])
def test_a_listen_url_is_checked_like_the_url(
    command: str, no_asyncpg: str, capsys: pytest.CaptureFixture[str]
) -> None:
    line = ["--url", NOWHERE, *COMMAND_LINES[command], "--listen-url"]
    assert cli.main([*line, no_asyncpg]) == cli.EXIT_USAGE
    assert "no driver for 'postgresql+asyncpg'" in capsys.readouterr().err
    assert cli.main([*line, NOWHERE + "?prepare_threshold=abc"]) == cli.EXIT_USAGE
    assert "prepare_threshold='abc'" in capsys.readouterr().err


def test_the_grant_summary_names_every_kind_of_access(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    listing = " ".join(capsys.readouterr().out.split())
    summary = listing.split(" grant ", 1)[1]
    for access in ops.ACCESS_KINDS:
        assert access in summary.split(" options:")[0], access


def test_help_texts_carry_no_markup(capsys: pytest.CaptureFixture[str]) -> None:
    """Docstrings become help texts: reStructuredText's double backquotes would show."""
    for command in cli.COMMANDS:
        assert "``" not in _help(capsys, command.name), command.name


def test_doctor_help_names_every_kind_of_check(capsys: pytest.CaptureFixture[str]) -> None:
    """ops.doctor's checks: definitions (repair), the work (leases, caps) and the
    deployment (a standby, binary logging) came after the help was written."""
    text = _help(capsys, "doctor")
    for what in ("definitions", "assetq repair", "expired leases", "cap", "standby", "binary"):
        assert what in text, what


@pytest.mark.parametrize("text", ["0s", "0m", "8d"])
def test_a_lease_of_nothing_or_over_a_week_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], text: str
) -> None:
    """Issue 26: --lease 0s reached run_worker and exited 1 with "got datetime.timedelta(0)",
    where every other bad duration is a usage error (exit 2) that says what to write."""
    # The parser refuses it: before, the command went on to wait for the database.
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args(["worker", "--handlers", "os:environ", "--lease", text])
    assert exited.value.code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert f"a lease must be above 0 and at most a week (7d), got {text!r}" in err
    assert "timedelta" not in err
