"""assetq: asset-triggered scheduling inside PostgreSQL and MySQL/MariaDB.

Producers register asset events; a database trigger queues each event for every consumer of
its asset in the same commit; schedulers turn queued events into runs, consuming them by
reference, so every committed event reaches every consumer exactly once.
"""

from .api import (
    Event,
    Run,
    Source,
    declare_asset,
    declare_dag,
    pause_dag,
    register_event,
    schedule,
    unpause_dag,
)
from .conditions import AllOf, AnyOf, Condition, all_of, any_of
from .errors import (
    AssetqError,
    ClaimGuardAbort,
    DatabaseError,
    IdempotencyConflict,
    InvalidArgument,
    InvalidArgumentType,
    InvalidCondition,
    InvalidExtra,
    NameTooLong,
    NotInstalled,
    TransientError,
    UnknownAsset,
    UnknownDag,
)
from .migrate import DEFAULT_NAMESPACE, current_revision, head_revision, install, uninstall

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_NAMESPACE",
    "AllOf",
    "AnyOf",
    "AssetqError",
    "ClaimGuardAbort",
    "Condition",
    "DatabaseError",
    "Event",
    "IdempotencyConflict",
    "InvalidArgument",
    "InvalidArgumentType",
    "InvalidCondition",
    "InvalidExtra",
    "NameTooLong",
    "NotInstalled",
    "Run",
    "Source",
    "TransientError",
    "UnknownAsset",
    "UnknownDag",
    "all_of",
    "any_of",
    "current_revision",
    "declare_asset",
    "declare_dag",
    "head_revision",
    "install",
    "pause_dag",
    "register_event",
    "schedule",
    "uninstall",
    "unpause_dag",
]
