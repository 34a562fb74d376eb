"""The revision catalogue: which schema revisions this package knows, in order, and which of
them an older package survives.

Read from the alembic revision files shipped in ``assetq/migrations/versions`` (no database).
Both sides use it: the runtime's schema check (:mod:`assetq.namespace`) asks which revision is
this package's head, the migration runner (:mod:`assetq.migrate`) which steps lead from one
revision to another. It imports neither.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import TYPE_CHECKING, Literal

from .errors import SchemaTooNew, SchemaTooOld, UnknownRevision

if TYPE_CHECKING:
    from alembic.script import ScriptDirectory

#: The last development revision: its tables are the baseline's (tests/test_migrations.py).
ADOPTABLE_REVISION = "0015_batch_lookups"

#: Revisions an older package does not survive. None since the 0.1.0 baseline: a released
#: routine signature never changes (a new one is a new name, tests/test_signatures.py holds
#: them to sql/<engine>/signatures.txt) and tables change by expand, then contract, so every
#: revision keeps what the packages of the compatibility window use (docs/operations.md). A
#: revision that cannot (a contract step removing what a package still in the window calls)
#: is added here: packages older than it then refuse the schema with SchemaTooNew.
BREAKING_REVISIONS: frozenset[str] = frozenset()

#: The revisions of assetq's development before 0.1.0, which no release ever had. 0.1.0's
#: baseline replaced them: a namespace at one of them is re-installed (CHANGELOG, 0.1.0).
DEVELOPMENT_REVISIONS = frozenset(
    {
        "0001_initial",
        "0002_batch_registration",
        "0003_operations",
        "0004_semantics",
        "0005_wakeup_on_demand",
        "0006_work_queue",
        "0007_capped_claim",
        "0008_claim_plans",
        "0009_partitions",
        "0010_liveness",
        "0011_runs_per_pass",
        "0012_link_checks",
        "0013_queue_checks",
        "0014_link_keys",
        "0015_batch_lookups",
    }
)

#: Folders of extra revisions after this package's own (tests: test-only table steps).
_extra_locations: list[str] = []

Direction = Literal["up", "down"]


def version_locations() -> list[str]:
    """Where the revision files are: this package's folder, then use_revisions' folder."""
    return [str(resources.files("assetq.migrations").joinpath("versions")), *_extra_locations]


@functools.cache
def _script() -> ScriptDirectory:
    # Imported here: a process that only checks its schema (the runtime API) reads the
    # revision files once, on its first check, and never loads alembic's runner.
    from alembic.script import ScriptDirectory

    return ScriptDirectory(
        str(resources.files("assetq.migrations")), version_locations=version_locations()
    )


def use_revisions(folder: str | None) -> None:
    """Add a folder of revisions after this package's own (``None``: remove them again).
    For tests, whose test-only table steps exercise the upgrade machinery; never needed by
    an application."""
    _extra_locations.clear()
    if folder is not None:
        _extra_locations.append(folder)
    _script.cache_clear()
    revisions.cache_clear()


@functools.cache
def revisions() -> tuple[str, ...]:
    """Every revision this package knows, oldest first."""
    return tuple(reversed([s.revision for s in _script().walk_revisions()]))


def head_revision() -> str:
    """The newest revision this package knows."""
    head = _script().get_current_head()
    assert head is not None
    return head


def resolve_revision(revision: str | None) -> str | None:
    """The full id of ``revision``: ``"head"``, a full id, or an unambiguous start of one
    (``"0005"``); None for ``"base"`` (nothing installed). UnknownRevision otherwise."""
    if revision is None or revision == "base":
        return None
    if revision == "head":
        return head_revision()
    known = revisions()
    if revision in known:
        return revision
    matches = [r for r in known if r.startswith(revision)]
    if len(matches) == 1:
        return matches[0]
    raise UnknownRevision(
        f"unknown assetq schema revision {revision!r}: this package knows"
        f" {', '.join(known)} (or 'head', 'base')"
    )


def position(revision: str | None) -> int:
    """-1 for base, else the revision's place in the history."""
    return -1 if revision is None else revisions().index(revision)


def development_advice(revision: str, namespace: str) -> str:
    """Why no package upgrades development revision ``revision``, and the fix."""
    fix = development_fix(revision, namespace)
    return (
        f"namespace {namespace!r} holds assetq development schema {revision}, from before"
        " assetq 0.1.0, whose baseline revision 0001_baseline replaced every development"
        f" revision: no package upgrades it. {fix[0].upper()}{fix[1:]} (CHANGELOG, 0.1.0)"
    )


def development_fix(revision: str, namespace: str) -> str:
    """What to do with a namespace at development revision ``revision``."""
    if revision == ADOPTABLE_REVISION:  # its tables are the baseline's
        return (
            f"keep its data with `assetq upgrade --adopt-development --namespace {namespace}`,"
            " or re-install: `assetq uninstall --yes` then `assetq install`"
        )
    return (
        "re-install: `assetq uninstall --yes` then `assetq install` (this deletes its events"
        " and runs: export what you need first)"
    )


def require_known(revision: str | None, namespace: str) -> None:
    """SchemaTooOld for a development revision, SchemaTooNew for one this package does not
    know (a newer package installed it); nothing for None (not installed) or a known one."""
    if revision in DEVELOPMENT_REVISIONS:
        raise SchemaTooOld(development_advice(revision, namespace))
    if revision is not None and revision not in revisions():
        raise SchemaTooNew(
            f"namespace {namespace!r} holds assetq schema {revision}, which this package"
            f" (newest schema {head_revision()}) does not know: a newer assetq installed it."
            " Run that newer assetq (pip install -U assetq); this package never changes a"
            " newer schema"
        )


def oldest_client(revision: str) -> str:
    """The oldest package (named by its head revision) whose calls work against schema
    ``revision``: the packages from the last breaking revision up to ``revision`` itself."""
    known = revisions()
    oldest = known[0]
    for rev in known[: known.index(revision) + 1]:
        if rev in BREAKING_REVISIONS:
            oldest = rev
    return oldest
