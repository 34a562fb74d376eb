"""benchmarks/web_pages.py cannot rot: at a tiny scale it loads its history on each engine,
requests every page of the console and writes its table. Timing decides nothing: what is
checked is that every page's row is there with its statement count, and that the run leaves
no database behind."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
import sqlalchemy as sa

from dbs import TestDatabase

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"

PAGES = (
    ("overview", "/"),
    ("consumer", "/dags/<dag>"),
    ("partitioned consumer", "/dags/<partitioned>"),
    ("run", "/dags/<dag>/runs/<run>"),
    ("assets", "/assets"),
    ("asset", "/assets/<name>"),
    ("workers", "/workers"),
)


@pytest.fixture(scope="module")
def web_pages() -> ModuleType:
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module("web_pages")


def _databases(db: TestDatabase) -> set[str]:
    query = (
        "SELECT datname FROM pg_database"
        if db.engine_name == "postgresql"
        else "SELECT schema_name FROM information_schema.schemata"
    )
    with db.engine.connect() as conn:
        names = conn.execute(sa.text(query)).scalars().all()
    return {name for name in names if name.startswith("aqbench_web_")}


def test_a_tiny_scale_writes_every_page_row(
    db: TestDatabase, web_pages: ModuleType, tmp_path: Path
) -> None:
    server = db.url.set(database="postgres" if db.engine_name == "postgresql" else None)
    page = tmp_path / "benchmarks" / "web_pages.md"
    argv = ["--scale", "0.001", "--requests", "2", "--warmup", "1"]
    argv += ["--engines", db.engine_name, "--output", str(page)]
    argv += [f"--{'postgres' if db.engine_name == 'postgresql' else 'mysql'}"]
    argv += [server.render_as_string(hide_password=False)]
    before = _databases(db)
    assert web_pages.main(argv) == 0
    assert _databases(db) == before  # the run's database is dropped

    text = page.read_text("utf-8")
    assert text.startswith("Measured with `python benchmarks/web_pages.py --scale 0.001")
    assert "load average (1 min)" in text
    # The volumes at that scale: 1,000 events, 10 consumers, 10 runs each.
    volumes = r"1,000 events over 1 assets, 100 runs \(500 links, 5 per run\), 10 consumers"
    assert re.search(volumes, text)
    for label, path in PAGES:
        for shown in (path, "/api" + path.rstrip("/")):
            cells = rf"\| {label} \| `{re.escape(shown)}` \| 2 \| [\d.,]+ \| [\d.,]+ \|"
            found = re.search(cells + r" (\d+) \| [\d,]+ \|", text)
            assert found, (label, shown)
            assert int(found.group(1)) >= 1, (label, shown)  # every page reads the database
