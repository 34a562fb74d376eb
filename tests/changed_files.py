"""Routine files as a newer package would ship them: the same objects, some bodies changed.

A body change is the one kind of routine change the upgrade machinery has to apply by itself
(assetq.routines.sync, by checksum), so the tests that prove it run against real files with a
real change: a comment line inside the body (after its first ``BEGIN`` line), which changes
the definition the server prints, and so the file's checksum and the object's definition;
an object without a ``BEGIN`` line (a PostgreSQL trigger statement, a view) gets the comment
above its statement, which changes only the checksum (and still makes sync re-create it).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import pytest

from assetq import sqlfiles
from assetq.sqlfiles import ObjectFile

MARK = "-- changed by a test: the body a newer package ships"


def changed_text(text: str, mark: str = MARK) -> str:
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip().upper() == "BEGIN":
            indent = line[: len(line) - len(line.lstrip())]
            return "\n".join([*lines[: i + 1], f"{indent}    {mark}", *lines[i + 1 :]]) + "\n"
    return f"{mark}\n{text}"


def changed(engine: str, names: Iterable[str], mark: str = MARK) -> tuple[ObjectFile, ...]:
    """Every object file of ``engine``, those named ``names`` (any kind) changed."""
    wanted = set(names)
    real = _REAL(engine)
    unknown = wanted - {f.name for f in real}
    assert not unknown, f"no such object files: {unknown}"
    out = []
    for f in real:
        if f.name in wanted:
            text = changed_text(f.text, mark)
            f = dataclasses.replace(
                f, text=text, checksum=hashlib.sha256(text.encode("utf-8")).hexdigest()
            )
        out.append(f)
    return tuple(out)


_REAL = sqlfiles.object_files


@contextmanager
def shipped(
    monkeypatch: pytest.MonkeyPatch, names: dict[str, Iterable[str]], mark: str = MARK
) -> Iterator[dict[str, tuple[ObjectFile, ...]]]:
    """The package's object files are, for the block, those of a newer package in which the
    objects ``names[engine]`` changed."""
    files = {engine: changed(engine, objects, mark) for engine, objects in names.items()}
    with monkeypatch.context() as patch:
        patch.setattr(sqlfiles, "object_files", lambda engine: files.get(engine) or _REAL(engine))
        yield files
