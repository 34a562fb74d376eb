"""Exceptions raised by assetq.

Every error that comes from the database carries the database's own code in ``code`` (a
PostgreSQL SQLSTATE such as ``"AQ001"`` or ``"40P01"``, or a MySQL error number as a string),
so callers can log it and operators can look it up. assetq's own routines raise codes
``AQnnn`` on both engines.
"""

from __future__ import annotations


class AssetqError(Exception):
    """Base class of every assetq error."""

    code: str | None

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        # Raised by the Python layer without a code: the class's stable one (see the end of
        # this module); a database error always brings its own.
        self.code = code if code is not None else python_side_code(type(self))


class InvalidArgument(AssetqError, ValueError):
    """A call's argument is malformed or out of range. Nothing was written."""


class InvalidArgumentType(InvalidArgument, TypeError):
    """A call's argument has the wrong Python type. Nothing was sent to the database."""


class NameTooLong(InvalidArgument):
    """A name, id or key is longer than the schema allows."""


class InvalidExtra(InvalidArgument):
    """An ``extra`` is not a JSON object that both engines can store."""


class InvalidCondition(InvalidArgument):
    """A consumer condition is empty, malformed or too complex to compile."""


class UnknownAsset(InvalidArgument, LookupError):
    """No asset has that name or uri (code AQ001)."""


class UnknownDag(InvalidArgument, LookupError):
    """No consumer has that dag id (code AQ003)."""


class UnknownRun(InvalidArgument, LookupError):
    """No run of that consumer has that run id (code AQ006)."""


class AssetInUse(InvalidArgument):
    """The asset is named in a consumer condition and cannot be deleted (code AQ007)."""


class InvalidRunState(InvalidArgument):
    """A run cannot move to that state: unknown state, or the run is finished (code AQ008)."""


class UnmappablePartition(InvalidArgument):
    """An event cannot be queued for a partitioned consumer (code AQ011): it has no
    partition key, or its key does not parse under the consumer's mapping of its asset
    (an hour or a day roll-up) or is not in its static mapping. Nothing was written."""


class IdempotencyConflict(AssetqError):
    """An idempotency key was reused for a different registration (code AQ005)."""


class LeaseLost(AssetqError):
    """A worker's call names an attempt that no longer holds the run (code AQ010): another
    worker claimed it after the lease expired, or it was finished. Nothing was written; roll
    the transaction back and stop working on the run."""


class NotInstalled(AssetqError):
    """The namespace has no assetq schema, or not the version this package needs."""


class TransientError(AssetqError):
    """A failure that a retry of the same transaction can cure: deadlock, serialization
    failure, lock timeout, or a scheduler pass aborted by its claim guard. The transaction
    was rolled back."""


class ConnectionLost(TransientError):
    """The database could not be reached, or the connection broke (a restart, a failover, a
    network cut), at connect time or during the transaction, which went with it. Retrying
    the whole transaction is safe: a producer retries with its idempotency key."""


class ReadOnlyServer(TransientError):
    """The server refuses writes (SQLSTATE 25006, MySQL 1290/1792): a standby, or a
    primary being demoted. Retried like any transient error (a promotion cures it), but
    the URL probably points at the wrong server: a libpq multi-host URL with
    ``target_session_attrs=read-write`` always reaches the writable one
    (docs/deployment.md)."""


class RoutineUnavailable(TransientError):
    """An assetq routine did not exist when it was called (MySQL/MariaDB error 1305): an
    upgrade or a repair drops a routine and creates it again (MySQL has no CREATE OR REPLACE
    PROCEDURE), and a call in between fails. Retry the transaction: assetq's own
    transactions (schedule, claim_runs, heartbeat, purge) do. If it stays missing, the schema
    lacks it: ``assetq doctor``."""


class ClaimGuardAbort(TransientError):
    """A scheduler pass deleted fewer queue rows than it claimed and rolled back (AQ900)."""


class DatabaseError(AssetqError):
    """Any other database error, with the database's code and message."""


class PreparedStatementConflict(DatabaseError):
    """A server-side prepared statement of psycopg collided with another client's on a
    pooled server connection ("prepared statement _pg3_N does not exist / already exists"):
    the connection goes through a transaction-pooling pooler (PgBouncer). Create the engine
    with ``connect_args={"prepare_threshold": None}`` (assetq's command line: append
    ``?prepare_threshold=none`` to the URL). Not transient: it comes back until the engine
    is fixed."""


class UnsupportedServerSetting(DatabaseError):
    """A server setting keeps assetq from working, whatever is retried: MySQL/MariaDB with
    ``binlog_format=STATEMENT`` refuses every write at READ COMMITTED (error 1665). The
    message says what to set."""


# -- codes of errors raised by the Python layer (issue 15) ------------------------------------
# Errors the Python layer raises before anything is sent carry a stable code too, listed in
# docs/python.md. Where the database raises the same error it uses the same code (AQ002,
# AQ004); the AQ1nn codes are the Python layer's own. Errors that only the database raises
# (IdempotencyConflict, LeaseLost, transient and database errors) keep the database's code.

_PYTHON_SIDE_CODES: dict[type[AssetqError], str] = {
    InvalidArgument: "AQ002",
    InvalidCondition: "AQ004",
    UnknownAsset: "AQ001",
    UnknownDag: "AQ003",
    UnknownRun: "AQ006",
    AssetInUse: "AQ007",
    InvalidRunState: "AQ008",
    InvalidArgumentType: "AQ100",
    NameTooLong: "AQ102",
    InvalidExtra: "AQ103",
    NotInstalled: "AQ104",
}


def python_side_code(cls: type[AssetqError]) -> str | None:
    """The stable code of an error of class ``cls`` raised by the Python layer: that of
    the nearest class in ``cls``'s bases that has one, AQ199 for a bare AssetqError."""
    if cls is AssetqError:
        return "AQ199"
    for base in cls.__mro__:
        code = _PYTHON_SIDE_CODES.get(base)
        if code is not None:
            return code
    return None


class MigrationFailed(DatabaseError):
    """Installing, upgrading or downgrading the schema failed. ``code`` is the database's code
    of the first error it reported (not a later "current transaction is aborted"),
    ``revision`` the revision being applied (the target of a fresh install). On PostgreSQL
    nothing of the failed step was kept; on MySQL/MariaDB a failed fresh install removed what
    it had created (each DDL statement commits there)."""

    revision: str | None
    #: A retry can cure it (a deadlock, a lock timeout): run the same install again.
    transient: bool

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        revision: str | None = None,
        transient: bool = False,
    ) -> None:
        super().__init__(message, code=code)
        self.revision = revision
        self.transient = transient


class InstallRefused(MigrationFailed):
    """An install or upgrade refused before it created anything: the database is exactly as
    it was. ``code`` says why (the message says what to do): AQ120 binary logging is on and
    the account may not create triggers (no SUPER, log_bin_trust_function_creators OFF:
    error 1419 half-way otherwise); AQ121 binary logging in STATEMENT format (every
    scheduler pass would fail with 1665); AQ122 the namespace holds objects of the
    application's with names assetq would create (``conflicts`` lists them); AQ123 another
    Galera node's install held the namespace's install lock too long; AQ124 re-creating
    routines on MySQL by an account that may not read mysql.procs_priv (it would lose their
    grants); AQ125 adopt_development of a namespace that is not at the last development
    schema."""

    #: The conflicting objects of AQ122, as "table dag", "routine register_event", ...
    conflicts: tuple[str, ...]

    def __init__(
        self,
        message: str,
        *,
        code: str,
        revision: str | None = None,
        conflicts: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message, code=code, revision=revision)
        self.conflicts = conflicts


class UnknownRevision(InvalidArgument):
    """A schema revision this package does not know (a typo, or a revision of a newer
    package)."""


class SchemaTooOld(NotInstalled):
    """The namespace holds an older schema revision than this package needs: upgrade it
    (``assetq upgrade``, or ``assetq.install(engine)``) before running this package."""


class SchemaTooNew(NotInstalled):
    """The namespace holds a schema revision newer than this package knows: a newer assetq
    upgraded it. Run that newer package (``pip install -U assetq``); this one never
    downgrades it."""
