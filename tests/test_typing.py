"""What ``mypy --strict`` tells a caller of assetq: a misspelt run state is a type error.

One snippet, checked once by mypy's API (a cache of its own under .mypy_cache, so a run
after the first takes about a second). Each line that must be refused ends with
``# refused``; every other line must pass.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import mypy.api
import pytest

ROOT = Path(__file__).resolve().parents[1]

# All tests of this module read the one mypy run: keep them on one xdist worker.
pytestmark = pytest.mark.xdist_group("mypy snippet")

SNIPPET = textwrap.dedent(
    """\
    from typing import Literal

    import sqlalchemy as sa
    from sqlalchemy.ext.asyncio import AsyncConnection

    import assetq
    from assetq import aio


    def sync_calls(conn: sa.Connection, claim: assetq.Claim, text: str) -> None:
        assetq.set_run_state(conn, "d", "r", "sucess")  # refused
        assetq.set_run_state(conn, "d", "r", "success")
        assetq.runs(conn, "d", state="sucess")  # refused
        assetq.runs(conn, state="failed")
        assetq.complete_run(conn, claim, "queued")  # refused
        assetq.complete_run(conn, claim, "failed", error="boom")
        assetq.set_run_state(conn, "d", "r", text)  # refused
        if assetq.is_run_state(text):
            assetq.set_run_state(conn, "d", "r", text)


    def results(run: assetq.Run, info: assetq.Run, claim: assetq.Claim) -> None:
        state: assetq.RunState = info.state
        state = run.state
        state = claim.state
        literal: Literal["queued", "running", "success", "failed", "cancelled"] = state
        if info.state == "sucess":  # refused
            pass
        completion: assetq.CompletionState = "success"
        state = completion
        print(literal, run.event_count + info.event_count)


    async def async_calls(conn: AsyncConnection) -> None:
        await aio.set_run_state(conn, "d", "r", "sucess")  # refused
        await aio.set_run_state(conn, "d", "r", "running")
        await aio.runs(conn, state="runing")  # refused


    def on_complete(
        claim: assetq.Claim, run: assetq.Run | None, outcome: assetq.AttemptOutcome
    ) -> None:
        if outcome == "lose":  # refused
            pass


    def on_complete_str(claim: assetq.Claim, run: assetq.Run | None, outcome: str) -> None:
        pass


    def workers(engine: sa.Engine) -> None:
        assetq.run_worker(engine, {}, on_complete=on_complete)
        assetq.run_worker(engine, {}, on_complete=on_complete_str)  # a str callback still fits


    def old_names(run: assetq.RunInfo, ev: assetq.EventRecord) -> tuple[assetq.Run, assetq.Event]:
        return run, ev  # deprecated names: the same types for the deprecation window


    def only_a_claim_completes(conn: sa.Connection, run: assetq.Run) -> None:
        assetq.heartbeat(conn, run)  # refused
        assetq.complete_run(conn, run, "success")  # refused
    """
)


# Session scope: mypy runs once per process. A module fixture is set up again when xdist
# runs other modules' tests between this module's, and mypy's second in-process run could not
# open the cache the first left open ("database is locked" setting its journal mode).
@pytest.fixture(scope="session")
def mypy_errors(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    folder = tmp_path_factory.mktemp("typing")
    (folder / "snippet.py").write_text(SNIPPET)
    (folder / "mypy.ini").write_text(
        f"[mypy]\nstrict = True\npython_version = 3.10\nmypy_path = {ROOT / 'python_bindings'}\n"
    )
    out, err, status = mypy.api.run(
        [
            "--config-file",
            str(folder / "mypy.ini"),
            "--cache-dir",
            str(ROOT / ".mypy_cache" / "test_typing"),
            "--no-error-summary",
            str(folder / "snippet.py"),
        ]
    )
    assert status in (0, 1), err
    found: dict[int, str] = {}
    for line in out.splitlines():
        match = re.match(r".*snippet\.py:(\d+): error: (.*)", line)
        if match:
            found[int(match.group(1))] = match.group(2)
    return found


def _lines(text: str) -> set[int]:
    return {n for n, line in enumerate(SNIPPET.splitlines(), 1) if text in line}


def test_a_misspelt_run_state_is_a_type_error(mypy_errors: dict[int, str]) -> None:
    (line,) = _lines('assetq.set_run_state(conn, "d", "r", "sucess")')
    assert "Literal['queued', 'running', 'success', 'failed', 'cancelled']" in mypy_errors[line]


def test_only_the_marked_lines_are_refused(mypy_errors: dict[int, str]) -> None:
    assert set(mypy_errors) == _lines("# refused"), mypy_errors


def test_a_str_needs_is_run_state_to_narrow_it(mypy_errors: dict[int, str]) -> None:
    (unchecked,) = _lines('set_run_state(conn, "d", "r", text)  # refused')
    assert 'incompatible type "str"' in mypy_errors[unchecked]


def test_comparing_a_result_state_with_a_typo_is_refused(mypy_errors: dict[int, str]) -> None:
    (line,) = _lines('info.state == "sucess"')
    assert "Non-overlapping equality check" in mypy_errors[line]
