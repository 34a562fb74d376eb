"""A built wheel carries its SQL and migrations and works from any directory.

The repository keeps ``sql/`` and ``migrations/`` at the top level; pyproject.toml maps them
into the package: per engine ``tables.sql`` (the 0.1.0 baseline's tables), ``uninstall.sql``,
one file per routine, trigger and view, table steps (none yet), and the baseline revision.
These tests build a real wheel from a copy of the checkout, look inside it, and install
assetq into a fresh database from the unpacked wheel alone, with the checkout out of reach
(another working directory, no site-packages hooks, so no editable install).
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from assetq import migrate, sqlfiles
from dbs import TestDatabase

ROOT = Path(__file__).resolve().parent.parent

_IGNORED = shutil.ignore_patterns(
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".*_cache"
)


def _setuptools_is_recent() -> bool:
    major, minor = (int(p) for p in metadata.version("setuptools").split(".")[:2])
    return (major, minor) >= (70, 1)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A wheel built from a copy of the checkout (so no build/ or egg-info lands in it)."""
    if not _setuptools_is_recent():
        pytest.fail(
            "building without isolation needs setuptools>=70.1 (it has bdist_wheel built in);"
            " install the test extras: pip install -e '.[test]'"
        )
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    shutil.copytree(ROOT, source, ignore=_IGNORED)
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"),
            *("--quiet", "--wheel-dir", str(work / "dist"), str(source)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (built,) = (work / "dist").glob("assetq-*.whl")
    yield built


@pytest.fixture(scope="module")
def unpacked(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("unpacked")
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(target)
    return target


#: The engines whose SQL the wheel ships (sql/<engine>/).
ENGINES = ("postgresql", "mysql")
#: Per engine: the tables (the baseline's up), their removal (its down), the named queries,
#: the upgrade helpers; routines/, triggers/ and views/ hold one file per object.
ENGINE_FILES = ("tables.sql", "uninstall.sql", "queries.sql", "upgrades.sql")


def test_wheel_ships_the_sql_the_baseline_and_the_type_marker(wheel: Path) -> None:
    archive = zipfile.ZipFile(wheel)
    names = set(archive.namelist())
    required = {
        "assetq/py.typed",
        "assetq/migrations/env.py",
        "assetq/migrations/script.py.mako",
        "assetq/migrations/versions/0001_baseline.py",
    }
    for engine in ENGINES:
        required |= {f"assetq/sql/{engine}/{name}" for name in ENGINE_FILES}
        # One file per routine, trigger and view, as assetq.sqlfiles finds them in the
        # checkout; each kind has files on each engine.
        objects = sqlfiles.object_files(engine)
        assert {f.kind for f in objects} == set(sqlfiles.OBJECT_FOLDERS), engine
        required |= {f"assetq/sql/{engine}/{f.path}" for f in objects}
    # Every SQL (and text) file and alembic revision in the checkout, whichever engines and
    # table steps exist by now.
    checkout_sql = {
        "assetq/sql/" + p.relative_to(ROOT / "sql").as_posix(): p
        for p in (ROOT / "sql").rglob("*")
        if p.suffix in (".sql", ".txt")
    }
    required |= set(checkout_sql)
    required |= {
        "assetq/migrations/versions/" + p.name
        for p in (ROOT / "migrations" / "versions").glob("*.py")
    }
    assert not required - names, f"missing from the wheel: {sorted(required - names)}"
    # Each the checkout's, byte for byte.
    for name, path in checkout_sql.items():
        assert archive.read(name) == path.read_bytes(), name
    # Table steps: exactly the checkout's (none yet: the folder holds only a .keep, which
    # is not shipped, so the installed package has no steps/ folder at all).
    steps = {n for n in names if n.startswith("assetq/sql/") and "/steps/" in n}
    assert steps == {n for n in checkout_sql if "/steps/" in n}
    # Nothing of the development layout (one schema.sql, a script per revision).
    stale = [
        n
        for n in names
        if n.startswith("assetq/sql/") and (n.endswith("/schema.sql") or "/migrations/" in n)
    ]
    assert not stale, stale
    revisions = {n for n in names if n.startswith("assetq/migrations/versions/0")}
    assert revisions == {
        "assetq/migrations/versions/" + p.name
        for p in (ROOT / "migrations" / "versions").glob("0*.py")
    }
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "assetq = assetq.cli:main" in archive.read(entry_points).decode()


_INSTALL_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from importlib import resources
    import sqlalchemy as sa
    import assetq
    from assetq import sqlfiles

    url, namespace = sys.argv[1], sys.argv[2]
    engine = sa.create_engine(url)
    revision = assetq.install(engine, namespace=namespace)
    with engine.begin() as conn:
        assetq.declare_dag(conn, "consumer", "orders", namespace=namespace)
        assetq.register_event(conn, "orders", namespace=namespace)
    runs = assetq.schedule(engine, namespace=namespace)
    doctor = assetq.doctor(engine, namespace=namespace)
    assetq.uninstall(engine, namespace=namespace)
    engine.dispose()
    print(json.dumps({
        "module": assetq.__file__,
        "sql": str(resources.files("assetq.sql")),
        "object_files": len(sqlfiles.object_files(engine.dialect.name)),
        "revision": revision,
        "head": assetq.head_revision(),
        "runs": len(runs),
        "checks": {c.name: c.severity for c in doctor.checks},
    }))
    """
)


def _isolated_env(unpacked: Path) -> dict[str, str]:
    """PYTHONPATH = the unpacked wheel, then the directories holding assetq's dependencies.
    Run with ``python -S``: no .pth files, so an editable install cannot slip in."""
    # The environment's site-packages holds at most an editable-install hook for assetq
    # (a .pth file and a finder module), which -S keeps from running; the checkout's .venv
    # may well live under ROOT, so it is not filtered out by path.
    deps = [
        p for p in [*site.getsitepackages(), sysconfig.get_paths()["purelib"]] if Path(p).is_dir()
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "ASSETQ_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(unpacked), *dict.fromkeys(deps)])
    return env


def test_unpacked_wheel_installs_assetq_from_another_directory(
    unpacked: Path, empty_db: TestDatabase, tmp_path: Path
) -> None:
    url = empty_db.url.render_as_string(hide_password=False)
    done = subprocess.run(
        [sys.executable, "-S", "-c", _INSTALL_SCRIPT, url, "aq_from_wheel"],
        cwd=tmp_path,
        env=_isolated_env(unpacked),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(report["module"]).resolve().is_relative_to(unpacked.resolve())
    assert Path(report["sql"]).resolve().is_relative_to(unpacked.resolve())
    assert report["object_files"] == len(sqlfiles.object_files(empty_db.engine_name))
    assert report["revision"] == report["head"] == migrate.head_revision()
    assert report["runs"] == 1
    # Every table, routine, trigger and view the wheel's files define was there, each as its
    # file defines it (the routine catalogue's checksums, the definitions the server prints).
    # (doctor: one "objects" check when none is missing, one per missing object otherwise.)
    checks = report["checks"]
    assert checks["revision"] == checks["objects"] == checks["definitions"] == "ok", checks


def test_unpacked_wheel_runs_the_command_line(unpacked: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-S", "-m", "assetq", "--help"],
        cwd=tmp_path,
        env=_isolated_env(unpacked),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    assert "install" in done.stdout


def test_wheel_ships_the_consoles_templates_and_static_files(wheel: Path) -> None:
    """assetq.web renders from files inside the package (no CDN, nothing to build): every
    template and static file of the checkout is in the wheel, byte for byte."""
    archive = zipfile.ZipFile(wheel)
    names = set(archive.namelist())
    web = ROOT / "python_bindings" / "assetq" / "web"
    shipped = {
        "assetq/web/" + p.relative_to(web).as_posix(): p
        for folder in ("templates", "static")
        for p in (web / folder).rglob("*")
        if p.is_file()
    }
    assert any(n.endswith(".html") for n in shipped) and any(n.endswith(".css") for n in shipped)
    assert "assetq/web/__init__.py" in names
    assert not set(shipped) - names, sorted(set(shipped) - names)
    for name, path in shipped.items():
        assert archive.read(name) == path.read_bytes(), name
    # The pages' one script, htmx, is vendored with its license (no CDN, no Node).
    assert archive.read("assetq/web/static/htmx.min.js").startswith(b"var htmx=")
    assert b"Zero-Clause BSD" in archive.read("assetq/web/static/htmx.LICENSE.txt")
