"""The package's layers (docs/python.md, "Layers"), read from the source with ``ast``: each
module is in one layer and imports only from the layers it may. Above all the runtime (what a
producer, a scheduler or a worker process runs) never imports the migration side, so the API
does not carry the migration runner: its one need of the schema's lifecycle, the
compatibility check, lives in assetq.namespace over the revision catalogue."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "python_bindings" / "assetq"

#: Every module of the package, by layer (a new module must be placed in one).
LAYERS: dict[str, frozenset[str]] = {
    # What every layer uses: errors, argument checks, the SQL loader, the engines.
    "base": frozenset(
        {
            "errors",
            "validation",
            "sqlfiles",
            "handles",
            "dialects",
            "conditions",
            "partitions",
            "logs",
        }
    ),
    # Which schema this package works against: the revision catalogue, the namespace
    # default and the compatibility check. Used by both the runtime and the migration side.
    "schema": frozenset({"catalogue", "namespace"}),
    # What producers, schedulers and workers run.
    "runtime": frozenset(
        {"api", "scheduler", "worker", "loops", "listening", "metrics", "liveness"}
    ),
    # Install, upgrade, uninstall, repair; routines re-applied by checksum; alembic hooks.
    "migration": frozenset({"migrate", "routines", "alembic"}),
    # For operators and shells over all of the above.
    "operations": frozenset(
        {
            "__init__",
            "__main__",
            "ops",
            "prometheus",
            "aio",
            "cli",
            "demo",
            "embedded",
            "web",
            "web.data",
        }
    ),
}

#: Which layers each layer may import from.
MAY_IMPORT: dict[str, frozenset[str]] = {
    "base": frozenset({"base"}),
    "schema": frozenset({"base", "schema"}),
    "runtime": frozenset({"base", "schema", "runtime"}),
    "migration": frozenset({"base", "schema", "migration"}),
    "operations": frozenset(LAYERS),
}

LAYER_OF = {module: layer for layer, modules in LAYERS.items() for module in modules}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[0] == "migrations":  # alembic revision scripts, not modules of the package
            continue
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(module: str) -> set[str]:
    """The package's modules ``module`` imports, at the top or inside a function; the
    package itself (``from . import __version__``) is left out: it is loaded before any of
    its modules."""
    is_package = MODULES[module].name == "__init__.py" and module != "__init__"
    package = module.split(".") if is_package else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("assetq.")]
            found.update(n.removeprefix("assetq.") for n in names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if node.module is None or not node.module.startswith("assetq"):
                    continue
                base = node.module.split(".")[1:]
            else:
                base = package[: len(package) - (node.level - 1)]
                if node.module:
                    base = base + node.module.split(".")
            target = ".".join(base)
            if target and target in MODULES:
                found.add(target)
            for alias in node.names:  # from . import api; from .web import data
                name = ".".join([*base, alias.name])
                if name in MODULES:
                    found.add(name)
    found.discard(module)
    return {name for name in found if name != "__init__"}


def test_every_module_is_in_one_layer() -> None:
    assert sorted(MODULES) == sorted(LAYER_OF), "place a new module in LAYERS (and the docs)"


def test_the_reader_sees_imports_of_every_form() -> None:
    # What the rules below rest on: relative, absolute and function-level imports are read.
    assert {"api", "namespace", "validation"} <= _imports("worker")
    assert "migrate" in _imports("alembic")  # from assetq import catalogue, migrate
    assert "data" not in _imports("web") and "web.data" in _imports("web")
    assert "cli" in _imports("web.data")  # imported inside a function


@pytest.mark.parametrize("module", sorted(LAYERS["runtime"] | LAYERS["schema"]))
def test_runtime_does_not_import_the_migration_side(module: str) -> None:
    assert not _imports(module) & LAYERS["migration"]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_module_imports_only_from_the_layers_it_may(module: str) -> None:
    layer = LAYER_OF[module]
    wrong = {name: LAYER_OF[name] for name in _imports(module)} if module in LAYER_OF else {}
    assert {n: lay for n, lay in wrong.items() if lay not in MAY_IMPORT[layer]} == {}
