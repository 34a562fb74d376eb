"""Argument checks done before anything is sent to the database.

The database routines check again (a raw SQL caller gets a clear error too), but checking
here first means bad input never costs a round trip and never touches the caller's
transaction. The limits are the schema's, identical on both engines.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from .errors import InvalidArgument, InvalidArgumentType, InvalidExtra, NameTooLong

ASSET_NAME_MAX = 512
DAG_ID_MAX = 250
RUN_ID_MAX = 250
TASK_ID_MAX = 250
IDEMPOTENCY_KEY_MAX = 200
#: A worker's name (claim_runs), and the longest error a failed attempt keeps.
WORKER_MAX = 250
ERROR_MAX = 4000
#: Longest lease, retry delay or backoff: a week, in seconds.
DURATION_MAX = 604_800.0
#: Largest ``extra`` accepted, in bytes of its UTF-8 JSON text.
EXTRA_MAX_BYTES = 65_535
#: Most objects and arrays nested in one another in an ``extra``, the outer object included:
#: MariaDB's JSON functions refuse a document nested deeper (JSON_VALID is 0 at 32), which
#: its routines then report as invalid JSON; MySQL allows 100, PostgreSQL more.
EXTRA_MAX_DEPTH = 31
NAMESPACE_MAX = 63
#: Longest table prefix of a MySQL namespace (``appdb.assetq_``): MySQL names are at most 64
#: characters and assetq's longest (a constraint name) has 42.
PREFIX_MAX = 20
#: Most events one :func:`assetq.register_events` call takes (the routines refuse more too).
BATCH_MAX_EVENTS = 10_000
#: Most bytes of JSON one batch may send: below MariaDB's default max_allowed_packet (16 MiB),
#: with room for the escaping the driver adds to the statement.
BATCH_MAX_BYTES = 8 * 1024 * 1024

_DAG_ID = re.compile(r"^[A-Za-z0-9_.\-]+$")
_NAMESPACE = re.compile(r"^[a-z_][a-z0-9_]*$")
_PREFIXED_NAMESPACE = re.compile(r"^([a-z_][a-z0-9_]*)\.([a-z_][a-z0-9_]*)$")
_INT32 = (-(2**31), 2**31 - 1)


def _has_bad_text(value: str) -> str | None:
    if "\x00" in value:
        return "contains a NUL character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid Unicode (lone surrogate)"
    return None


def check_name(value: object, what: str, limit: int) -> str:
    """A non-empty string of at most ``limit`` characters, without NUL or surrogates."""
    if not isinstance(value, str):
        raise InvalidArgumentType(f"{what} must be a str, got {type(value).__name__}")
    if value == "":
        raise InvalidArgument(f"{what} must not be empty")
    problem = _has_bad_text(value)
    if problem:
        raise InvalidArgument(f"{what} {problem}")
    if len(value) > limit:
        raise NameTooLong(f"{what} is {len(value)} characters long; the limit is {limit}")
    return value


def check_optional_name(value: object, what: str, limit: int) -> str | None:
    return None if value is None else check_name(value, what, limit)


def check_dag_id(value: object) -> str:
    dag_id = check_name(value, "dag id", DAG_ID_MAX)
    if not _DAG_ID.match(dag_id):
        raise InvalidArgument(
            f"dag id {dag_id!r} may only contain ASCII letters, digits, '_', '.' and '-'"
        )
    return dag_id


def check_namespace(value: object) -> str:
    """A namespace is a lower-case SQL identifier, so it needs no quoting rules per engine;
    on MySQL/MariaDB it may be ``database.prefix`` (two of them): assetq's objects then live
    in that database, each named with the prefix (the dialect refuses it on PostgreSQL)."""
    ns = check_name(value, "namespace", NAMESPACE_MAX + 1 + PREFIX_MAX)
    prefixed = _PREFIXED_NAMESPACE.match(ns)
    if prefixed is not None:
        database, prefix = prefixed.groups()
        if len(database) > NAMESPACE_MAX:
            raise NameTooLong(
                f"the database of namespace {ns!r} is {len(database)} characters long;"
                f" the limit is {NAMESPACE_MAX}"
            )
        if len(prefix) > PREFIX_MAX:
            raise NameTooLong(
                f"the table prefix of namespace {ns!r} is {len(prefix)} characters long;"
                f" the limit is {PREFIX_MAX}"
            )
        return ns
    if len(ns) > NAMESPACE_MAX:
        raise NameTooLong(f"namespace is {len(ns)} characters long; the limit is {NAMESPACE_MAX}")
    if not _NAMESPACE.match(ns):
        raise InvalidArgument(
            f"namespace {ns!r} must start with a lower-case letter or '_' and contain only"
            " lower-case letters, digits and '_' (on MySQL/MariaDB it may also be"
            " 'database.prefix_': assetq's tables then live in that database, named"
            " prefix_<name>)"
        )
    return ns


def split_namespace(namespace: str) -> tuple[str, str]:
    """(database or schema, table prefix) of a checked namespace; no prefix: ''."""
    database, _, prefix = namespace.partition(".")
    return database, prefix


def check_bool(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgumentType(f"{what} must be a bool, got {type(value).__name__}")
    return value


def check_int(value: object, what: str, low: int = _INT32[0], high: int = _INT32[1]) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentType(f"{what} must be an int, got {type(value).__name__}")
    if not low <= value <= high:
        raise InvalidArgument(f"{what} must be between {low} and {high}, got {value}")
    return value


def seconds(value: object, what: str, *, allow_zero: bool = False) -> float:
    """A duration given as a timedelta or a number of seconds, as seconds: above 0 (or 0
    with ``allow_zero``) and at most a week."""
    if isinstance(value, timedelta):
        number = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    else:
        raise InvalidArgumentType(
            f"{what} must be a datetime.timedelta or a number of seconds,"
            f" got {type(value).__name__}"
        )
    low_ok = number >= 0 if allow_zero else number > 0
    if not (math.isfinite(number) and low_ok and number <= DURATION_MAX):
        low = "at least 0" if allow_zero else "above 0"
        raise InvalidArgument(
            f"{what} must be {low} and at most {DURATION_MAX:g} seconds (a week), got {value!r}"
        )
    return number


def _check_json_value(value: Any, path: str, depth: int = 1) -> None:
    if value is None or isinstance(value, bool | str):
        if isinstance(value, str):
            problem = _has_bad_text(value)
            if problem:
                raise InvalidExtra(f"extra{path} {problem}")
        return
    if isinstance(value, int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidExtra(f"extra{path} is {value}, which JSON cannot represent")
        return
    if isinstance(value, Mapping | list | tuple) and depth > EXTRA_MAX_DEPTH:
        raise InvalidExtra(
            f"extra is nested too deeply: extra{path} is an object or array at level {depth};"
            f" the limit is {EXTRA_MAX_DEPTH} levels (MariaDB's JSON refuses deeper)"
        )
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidExtra(
                    f"extra{path} has a key of type {type(key).__name__}; JSON keys are strings"
                )
            problem = _has_bad_text(key)
            if problem:
                raise InvalidExtra(f"a key in extra{path} {problem}")
            _check_json_value(item, f"{path}[{key!r}]", depth + 1)
        return
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_json_value(item, f"{path}[{index}]", depth + 1)
        return
    raise InvalidExtra(f"extra{path} is a {type(value).__name__}, which is not JSON")


def extra_json(extra: object) -> str:
    """Serialize an ``extra`` mapping to JSON text both engines accept, or raise."""
    if extra is None:
        return "{}"
    if not isinstance(extra, Mapping):
        raise InvalidArgumentType(
            f"extra must be a mapping (a JSON object), got {type(extra).__name__}"
        )
    # The depth is checked as it goes (EXTRA_MAX_DEPTH): never deeper than Python's
    # recursion limit, whatever the application set it to (mypy, say, raises it to 16,384,
    # and a 5,000-level extra then reached the server).
    _check_json_value(extra, "")
    text = json.dumps(extra, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    size = len(text.encode("utf-8"))
    if size > EXTRA_MAX_BYTES:
        raise InvalidExtra(f"extra is {size} bytes of JSON; the limit is {EXTRA_MAX_BYTES}")
    return text
