"""What assetq's functions accept as a database handle, in one place.

Two kinds of function, two kinds of handle:

* a function that runs in the caller's transaction (``register_event``, ``declare_dag``,
  ``status``, ...) takes a SQLAlchemy ``Connection`` or an ORM ``Session`` (or a
  ``scoped_session``). A Session is used through ``session.connection()``: the Session's
  own transaction, begun there if it was not yet (a Session begins lazily), so assetq's
  writes commit or roll back with the Session's;
* a function that owns its transactions (``schedule``, ``claim_runs``, ``doctor``,
  ``purge``, the loops) takes an ``Engine``: it connects, commits and retries on its own.

Anything else raises :class:`~assetq.errors.InvalidArgumentType` saying what to pass
instead; the asyncio extension's objects are pointed at :mod:`assetq.aio`.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from typing import Any, TypeAlias, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session, scoped_session

from . import errors

#: What a function that runs in the caller's transaction accepts.
Handle: TypeAlias = Connection | Session | scoped_session[Any]

_F = TypeVar("_F", bound=Callable[..., Any])

#: Code of every InvalidArgumentType raised for a handle of the wrong kind.
WRONG_HANDLE_CODE = "AQ101"


def _is_async(handle: object) -> bool:
    # By module, not isinstance: sqlalchemy.ext.asyncio needs greenlet, which a sync-only
    # installation may lack.
    return type(handle).__module__.startswith("sqlalchemy.ext.asyncio")


def _wrong(message: str) -> errors.InvalidArgumentType:
    return errors.InvalidArgumentType(message, code=WRONG_HANDLE_CODE)


def connection_of(handle: object, function: str, *, or_engine: bool = False) -> Connection:
    """The Connection to run ``function`` on, in the caller's transaction: ``handle`` itself,
    or a Session's connection (which begins the Session's transaction if it had not).
    ``or_engine``: ``function`` takes an Engine too (the caller checks for one first), and
    the refusal of anything else says so."""
    if isinstance(handle, Connection):
        return handle
    if isinstance(handle, scoped_session):
        handle = handle()
    if isinstance(handle, Session):
        return handle.connection()
    name = type(handle).__name__
    if _is_async(handle):
        raise _wrong(
            f"{function} got an asyncio {name}: use assetq.aio.{function}, which takes an"
            " AsyncConnection or AsyncSession (docs/python.md)"
        )
    if isinstance(handle, Engine):
        raise _wrong(
            f"{function} runs in the caller's transaction: pass a Connection or an ORM"
            f" Session, not an Engine (with engine.begin() as conn: assetq.{function}(conn,"
            " ...))"
        )
    kinds = (
        "a SQLAlchemy Connection, an ORM Session or an Engine"
        if or_engine
        else ("a SQLAlchemy Connection or an ORM Session")
    )
    raise _wrong(f"{function} takes {kinds}, got {name} (docs/python.md)")


def engine_of(handle: object, function: str) -> Engine:
    """The Engine ``function`` opens its own transactions on; ``handle`` must be one."""
    if isinstance(handle, Engine):
        return handle
    name = type(handle).__name__
    if _is_async(handle):
        raise _wrong(
            f"{function} got an asyncio {name}: use assetq.aio.{function}, which takes an"
            " AsyncEngine (docs/python.md)"
        )
    if isinstance(handle, Connection):
        raise _wrong(
            f"{function} opens and commits transactions of its own: pass an Engine, not a"
            " Connection (conn.engine is the one it came from)"
        )
    if isinstance(handle, Session | scoped_session):
        raise _wrong(
            f"{function} opens and commits transactions of its own: pass an Engine, not a"
            " Session (session.get_bind() is the Session's engine)"
        )
    raise _wrong(f"{function} takes a SQLAlchemy Engine, got {name} (docs/python.md)")


def bind_of(handle: object, function: str) -> Engine | Connection:
    """The bind of ``install``/``uninstall``: an Engine (its own transactions) or a
    Connection (the caller's, as in a host's alembic revision); a Session's connection."""
    if isinstance(handle, Engine | Connection):
        return handle
    if isinstance(handle, scoped_session):
        handle = handle()
    if isinstance(handle, Session):
        return handle.connection()
    name = type(handle).__name__
    if _is_async(handle):
        raise _wrong(
            f"{function} got an asyncio {name}: use assetq.aio.{function}, which takes an"
            " AsyncEngine (docs/python.md)"
        )
    raise _wrong(f"{function} takes a SQLAlchemy Engine or Connection, got {name} (docs/python.md)")


def keyword_namespace(func: _F) -> _F:
    """Make ``namespace`` keyword-only while still accepting it positionally, with a
    DeprecationWarning (0.1 took it positionally in a few functions)."""
    signature = inspect.signature(func)
    positional = sum(
        1
        for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    )
    assert signature.parameters["namespace"].kind is inspect.Parameter.KEYWORD_ONLY

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if len(args) == positional + 1 and "namespace" not in kwargs:
            warnings.warn(
                f"passing namespace positionally to assetq.{func.__name__} is deprecated:"
                f" write namespace={args[-1]!r}",
                DeprecationWarning,
                stacklevel=2,
            )
            kwargs["namespace"] = args[-1]
            args = args[:-1]
        return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
