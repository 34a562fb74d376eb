"""The Python examples of README.md and docs/*.md run: an example that stops working fails here.

Which examples run: those with the marker ``<!-- runnable -->`` on the line right before their
```` ```python ```` fence. The marker may name the engines the example is written for,
``<!-- runnable: postgresql -->``; without names it runs on every engine of the suite.

How an example runs: alone, in a fresh database with assetq installed in the default namespace
(``assetq``), as a module whose globals already hold

- ``assetq``, the package, and ``engine``, a SQLAlchemy ``Engine`` on that database: what
  docs/semantics.md tells readers its examples assume;
- the test database's URL in place of a URL the example passes to ``create_engine(...)``
  itself: ``sa.create_engine("postgresql+psycopg://app@db.internal/app")`` connects to the
  test database, so an example can show a realistic URL.

An example of the scheduler loop (``assetq.run_scheduler``, which runs until stopped) makes
one pass: the test bounds it with ``max_passes=1``. Tracebacks give the Markdown file and
line.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

import assetq
from dbs import TestDatabase

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_MARKER = re.compile(r"^<!--\s*runnable(?::\s*(?P<engines>[a-z, ]+))?\s*-->\s*$")
_CREATE_ENGINE = re.compile(r"""(create_engine\(\s*)(["'])[^"']*\2""")


@dataclass(frozen=True)
class Example:
    path: Path
    #: Line number of the first line of code (1-based).
    line: int
    code: str
    #: The engines it is written for; empty: every engine.
    engines: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def examples_in(path: Path, text: str | None = None) -> list[Example]:
    """The marked examples of a Markdown file; ValueError for a marker with no Python block
    right after it."""
    lines = (path.read_text("utf-8") if text is None else text).splitlines()
    found: list[Example] = []
    for number, line in enumerate(lines, start=1):
        match = _MARKER.match(line.strip())
        if match is None:
            continue
        if number >= len(lines) or lines[number].strip() != "```python":
            raise ValueError(f"{path}:{number}: the runnable marker is not followed by ```python")
        end = next((i for i in range(number + 1, len(lines)) if lines[i].strip() == "```"), None)
        if end is None:
            raise ValueError(f"{path}:{number}: the ```python block is never closed")
        engines = tuple(e.strip() for e in (match.group("engines") or "").split(",") if e.strip())
        code = "\n".join(lines[number + 1 : end])
        found.append(Example(path, number + 2, code, engines))
    return found


def _all_examples() -> list[Example]:
    return [example for path in DOCUMENTS for example in examples_in(path)]


def prepared(example: Example) -> str:
    """The example's code as it runs: URLs given to create_engine replaced, and padded so
    that line numbers are the Markdown file's."""
    code = _CREATE_ENGINE.sub(r"\1__example_url__", example.code)
    return "\n" * (example.line - 1) + code


EXAMPLES = _all_examples()


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.name for e in EXAMPLES])
def test_the_example_runs(
    example: Example,
    engine_name: str,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if example.engines and engine_name not in example.engines:
        pytest.skip(f"an example for {', '.join(example.engines)}")
    db: TestDatabase = request.getfixturevalue("db")  # after the skip: no database for it
    monkeypatch.setattr(
        assetq, "run_scheduler", functools.partial(assetq.run_scheduler, max_passes=1)
    )
    scope = {
        "__name__": "__doc_example__",
        "assetq": assetq,
        "engine": db.engine,
        "__example_url__": db.url,
    }
    exec(compile(prepared(example), str(example.path), "exec"), scope)


def test_the_docs_have_runnable_examples() -> None:
    """A marker spelled wrong, or a file moved, would silently leave every example out; the
    README's example is the first a new user runs."""
    documents = {example.path.name for example in EXAMPLES}
    assert {"README.md", "semantics.md", "operations.md", "workers.md"} <= documents
    assert len(EXAMPLES) >= 9


def test_a_marker_without_a_python_block_is_an_error() -> None:
    with pytest.raises(ValueError, match="not followed by"):
        examples_in(ROOT / "x.md", "<!-- runnable -->\n```sh\nassetq status\n```\n")


def test_a_marker_names_the_engines_and_the_code_keeps_its_lines() -> None:
    text = "intro\n\n<!-- runnable: postgresql -->\n```python\nx = 1\ny = 2\n```\n"
    (example,) = examples_in(ROOT / "x.md", text)
    assert (example.line, example.code, example.engines) == (5, "x = 1\ny = 2", ("postgresql",))
    assert prepared(example).splitlines()[4] == "x = 1"


def test_a_url_given_to_create_engine_becomes_the_test_databases() -> None:
    code = 'engine = sa.create_engine("postgresql+psycopg://app@db.internal/app", echo=True)'
    example = Example(ROOT / "x.md", 1, code, ())
    assert prepared(example) == "engine = sa.create_engine(__example_url__, echo=True)"
