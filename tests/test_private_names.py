"""No module of the package uses another module's private names (issue 29 item 2).

Read from the package's files with ``ast``, no database: a name that starts with one
underscore is its module's own business. A module that needs something of another one
imports it under a public name (or the thing moves to a module that both can import), so a
reader can tell from a module alone what the rest of the package relies on.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import assetq

PACKAGE = Path(assetq.__file__).resolve().parent


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module: str, path: Path, level: int, target: str | None) -> str:
    """The absolute name of ``from <level dots><target> import ...`` in ``module``."""
    if not level:
        return target or ""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{target}" if target else package


def private_uses(source: str, path: Path) -> list[str]:
    """Where the module in ``path`` (with ``source``) imports or uses another module's private
    name: ``from .x import _name``, ``import assetq.x as x; x._name``, ``from . import x;
    x._name``, ``from . import _name`` (a private module), as ``line: what`` strings."""
    module = _module_name(path)
    tree = ast.parse(source, str(path))
    found: list[str] = []
    #: Names bound in this module to another module of the package.
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            origin = _resolve(module, path, node.level, node.module)
            if origin != "assetq" and not origin.startswith("assetq."):
                continue
            for alias in node.names:
                if _private(alias.name) and origin != module:
                    found.append(f"{node.lineno}: from {origin} import {alias.name}")
                # `from . import api` binds a module: its attributes are checked below.
                if f"{origin}.{alias.name}".removeprefix("assetq.") in _SUBMODULES:
                    modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "assetq" or alias.name.startswith("assetq."):
                    if any(_private(part) for part in alias.name.split(".")):
                        found.append(f"{node.lineno}: import {alias.name}")
                    # `import assetq.migrate` binds assetq, and assetq.migrate is the module.
                    modules.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and _base(node.value) in modules:
            found.append(f"{node.lineno}: {_base(node.value)}.{node.attr}")
    return found


def _base(node: ast.expr) -> str | None:
    """``a.b.c`` for a chain of names, None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _base(node.value)
        return None if inner is None else f"{inner}.{node.attr}"
    return None


_FILES = sorted(PACKAGE.rglob("*.py"))
#: The package's modules by dotted name below assetq ("api", "web.data", ...).
_SUBMODULES = {name.removeprefix("assetq.") for name in (_module_name(path) for path in _FILES)} | {
    "assetq"
}


@pytest.mark.parametrize("path", _FILES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_uses_another_modules_private_names(path: Path) -> None:
    uses = private_uses(path.read_text(encoding="utf-8"), path)
    assert not uses, f"{path.relative_to(PACKAGE)} uses private names of other modules: {uses}"


@pytest.mark.parametrize(
    "source",
    [
        "from .api import _utc\n",
        "from assetq.migrate import _position\n",
        "from . import api\napi._translated\n",
        "import assetq.migrate\nassetq.migrate._position\n",
        "from .. import worker\nworker._Wakeup\n",
    ],
)
def test_the_check_finds_each_form_of_private_use(source: str) -> None:
    path = PACKAGE / "web" / "data.py" if ".." in source else PACKAGE / "ops.py"
    assert private_uses(source, path)


def test_the_check_allows_a_modules_own_private_names_and_public_ones() -> None:
    source = "from .api import Run\nfrom . import api\napi.Run\n_mine = 1\nself_._x = 2\n"
    assert not private_uses(source, PACKAGE / "ops.py")
