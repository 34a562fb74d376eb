"""assetq: asset-triggered scheduling inside PostgreSQL and MySQL/MariaDB.

Producers register asset events; a database trigger queues each event for every consumer of
its asset in the same commit; schedulers turn queued events into runs, consuming them by
reference, so every committed event reaches every consumer exactly once.
"""

from .api import (
    Event,
    NewEvent,
    Run,
    Source,
    declare_asset,
    declare_dag,
    pause_dag,
    register_event,
    register_events,
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
from .ops import (
    Check,
    DagStatus,
    DoctorReport,
    PurgeResult,
    doctor,
    grant_roles,
    purge,
    revoke_roles,
    status,
)
from .scheduler import SchedulerStats, run_scheduler
from .validation import BATCH_MAX_BYTES, BATCH_MAX_EVENTS

__version__ = "0.1.0"

__all__ = [
    "BATCH_MAX_BYTES",
    "BATCH_MAX_EVENTS",
    "DEFAULT_NAMESPACE",
    "AllOf",
    "AnyOf",
    "AssetqError",
    "Check",
    "ClaimGuardAbort",
    "Condition",
    "DagStatus",
    "DatabaseError",
    "DoctorReport",
    "Event",
    "IdempotencyConflict",
    "InvalidArgument",
    "InvalidArgumentType",
    "InvalidCondition",
    "InvalidExtra",
    "NameTooLong",
    "NewEvent",
    "NotInstalled",
    "PurgeResult",
    "Run",
    "SchedulerStats",
    "Source",
    "TransientError",
    "UnknownAsset",
    "UnknownDag",
    "all_of",
    "any_of",
    "current_revision",
    "declare_asset",
    "declare_dag",
    "doctor",
    "grant_roles",
    "head_revision",
    "install",
    "pause_dag",
    "purge",
    "register_event",
    "register_events",
    "revoke_roles",
    "run_scheduler",
    "schedule",
    "status",
    "uninstall",
    "unpause_dag",
]
