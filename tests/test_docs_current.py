"""What README.md and docs/operations.md show of the command line is what it does at this commit:
the commands it lists, the answer it quotes, the schema revision in its sample output, the roles
an example grants to. Each of these once drifted (issue 18: a status sample two revisions
behind, a synopsis without the newer commands). No database: the texts against the code."""

from __future__ import annotations

import re
from pathlib import Path

from sqlalchemy.engine import make_url

import assetq
from assetq import cli
from assetq.errors import NotInstalled

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text("utf-8")
OPERATIONS = (ROOT / "docs" / "operations.md").read_text("utf-8")
COMMANDS = {command.name for command in cli.COMMANDS}


def _section(text: str, heading: str) -> str:
    """The Markdown section under ``heading``, up to the next heading (## or deeper: a line
    starting with one # is a comment of a shell example)."""
    start = text.index(f"{heading}\n")
    following = re.search(r"^#{2,6} ", text[start + len(heading) :], re.MULTILINE)
    return text[start : start + len(heading) + (following.start() if following else len(text))]


def test_the_readme_synopsis_lists_every_command() -> None:
    section = _section(README, "### The command line")
    listed = re.search(r"^COMMAND: (.+)$", section, re.MULTILINE)
    assert listed is not None, "the synopsis lists the commands on a line 'COMMAND: ...'"
    assert {name.strip() for name in listed.group(1).split(",")} == COMMANDS


def test_the_cli_docstring_lists_every_command() -> None:
    listed = (cli.__doc__ or "").split("Commands:", 1)[1].split(";", 1)[0]
    assert set(re.findall(r"``(\w+)``", listed)) == COMMANDS


def test_the_operations_guide_quotes_the_answer_for_a_missing_namespace() -> None:
    url = make_url("postgresql+psycopg://assetq_owner@db.internal/app")
    answer = f"assetq status: error [{NotInstalled('').code}]: {cli._not_installed('asetq', url)}"
    assert f"```\n{answer}\n```" in OPERATIONS


def test_the_sample_outputs_show_the_schema_this_package_installs() -> None:
    """A new revision must bring the samples along (run the commands again, or edit the
    revision in them if nothing else of the output changed)."""
    head = assetq.head_revision()
    status = _section(OPERATIONS, "## 3. Watch: status and the dag_queue_status view")
    (line,) = [line for line in status.splitlines() if line.startswith("assetq namespace ")]
    assert line.endswith(f": schema {head}")
    doctor = _section(OPERATIONS, "## 4. Check: doctor")
    revisions = set(re.findall(r"revision (\d{4}_\w+)", doctor))
    assert revisions == {head}


def test_the_grant_example_creates_every_role_it_grants_to() -> None:
    grant = _section(OPERATIONS, "## 6. Least privilege: grant")
    example = grant.split("```sh\n", 1)[1].split("\n```", 1)[0]
    postgres = example.split("# MySQL/MariaDB", 1)[0]
    created = set(re.findall(r"CREATE ROLE (\w+)", postgres))
    (command,) = [line for line in postgres.splitlines() if line.startswith("assetq grant ")]
    granted = set(re.findall(r"--(?:producer|scheduler|worker|reader) (\S+)", command))
    assert granted and granted <= created


def test_the_functions_the_operations_guide_names_are_exported() -> None:
    """Issue 26: purge_preview, uninstall_preview and repair were named here as API
    functions, but only reachable through assetq.ops and assetq.migrate."""
    from assetq import aio

    listed = OPERATIONS.split("The functions that look at or change a schema of any revision", 1)
    named = set(re.findall(r"`(\w+)`", listed[1].split("Outside the window", 1)[0]))
    assert {"purge_preview", "uninstall_preview", "repair"} <= named
    for name in named:
        assert name in assetq.__all__ and callable(getattr(assetq, name)), name
        assert name in aio.__all__ and callable(getattr(aio, name)), name


def _passages(text: str) -> list[str]:
    """Paragraphs, list items and table rows: the units a claim must be whole in."""
    return [p for block in re.split(r"\n\s*\n", text) for p in re.split(r"\n\s*(?:- |\| )", block)]


def test_no_text_says_a_dead_workers_run_is_claimed_again_without_its_last_attempt() -> None:
    """Issue 26: the docs said a crashed worker's run is claimed again when its lease expires,
    while the default max_attempts=1 fails it. Wherever a text says a run is claimed again,
    the same passage says what happens on its last attempt."""
    texts = {"README.md": README}
    texts |= {f"docs/{p.name}": p.read_text("utf-8") for p in (ROOT / "docs").glob("*.md")}
    package = ROOT / "python_bindings" / "assetq"
    texts |= {f"assetq/{p.name}": p.read_text("utf-8") for p in package.glob("*.py")}
    unqualified = [
        (name, " ".join(passage.split()))
        for name, text in texts.items()
        for passage in _passages(text)
        if re.search(r"claim(?:ed|able) again", passage)
        and not re.search(r"last attempt|attempts left|its last|their last", passage)
    ]
    assert unqualified == []
