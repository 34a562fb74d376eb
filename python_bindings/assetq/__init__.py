"""assetq: asset-triggered scheduling inside PostgreSQL and MySQL/MariaDB.

Producers register asset events; a database trigger queues each event for every consumer of
its asset in the same commit; schedulers turn queued events into runs, consuming them by
reference, so every committed event reaches every consumer exactly once.
"""

import warnings
from typing import TYPE_CHECKING

from . import api
from .api import (
    ACTIVE_RUN_STATES,
    RUN_STATES,
    Claim,
    CompletionState,
    Event,
    NewEvent,
    Run,
    RunState,
    Source,
    cancel_run,
    claim_runs,
    complete_run,
    consumed_events,
    declare_asset,
    declare_dag,
    delete_asset,
    delete_dag,
    get_run,
    heartbeat,
    is_run_state,
    pause_dag,
    queued_events,
    register_event,
    register_events,
    retry_run,
    runs,
    schedule,
    set_run_state,
    unpause_dag,
)
from .conditions import AllOf, AnyOf, Condition, Ref, alias, all_of, any_of, asset_name, asset_uri
from .errors import (
    AssetInUse,
    AssetqError,
    ClaimGuardAbort,
    ConnectionLost,
    DatabaseError,
    IdempotencyConflict,
    InstallRefused,
    InvalidArgument,
    InvalidArgumentType,
    InvalidCondition,
    InvalidExtra,
    InvalidRunState,
    LeaseLost,
    MigrationFailed,
    NameTooLong,
    NotInstalled,
    PreparedStatementConflict,
    ReadOnlyServer,
    RoutineUnavailable,
    SchemaTooNew,
    SchemaTooOld,
    TransientError,
    UnknownAsset,
    UnknownDag,
    UnknownRevision,
    UnknownRun,
    UnmappablePartition,
    UnsupportedServerSetting,
)
from .handles import Handle
from .metrics import AttemptOutcome, Metrics, WaitOutcome
from .migrate import (
    current_revision,
    head_revision,
    install,
    repair,
    uninstall,
)
from .namespace import DEFAULT_NAMESPACE
from .ops import (
    Check,
    DagStatus,
    DoctorReport,
    ProcessStatus,
    PurgePreview,
    PurgeResult,
    UninstallPreview,
    WorkerCoverage,
    doctor,
    grant_roles,
    processes,
    purge,
    purge_preview,
    revoke_roles,
    status,
    uninstall_preview,
    worker_coverage,
)
from .partitions import Partitioned, PartitionMapping, Rollup, StaticPartitions
from .scheduler import SchedulerStats, run_scheduler
from .validation import BATCH_MAX_BYTES, BATCH_MAX_EVENTS
from .worker import Handler, WorkerStats, run_worker

__version__ = "0.1.0"

if TYPE_CHECKING:  # the old names type-check as the new ones for the deprecation window
    from .api import EventRecord as EventRecord
    from .api import RunInfo as RunInfo
else:

    def __getattr__(name: str) -> object:
        """The names of earlier versions (api.DEPRECATED_NAMES): the new type, with a
        DeprecationWarning that names it."""
        new = api.DEPRECATED_NAMES.get(name)
        if new is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        warnings.warn(
            f"assetq.{name} is deprecated: use assetq.{new} (CHANGELOG.md)",
            DeprecationWarning,
            stacklevel=2,
        )
        return globals()[new]


__all__ = [
    "ACTIVE_RUN_STATES",
    "BATCH_MAX_BYTES",
    "BATCH_MAX_EVENTS",
    "DEFAULT_NAMESPACE",
    "RUN_STATES",
    "AllOf",
    "AnyOf",
    "AssetInUse",
    "AssetqError",
    "AttemptOutcome",
    "Check",
    "Claim",
    "ClaimGuardAbort",
    "CompletionState",
    "Condition",
    "ConnectionLost",
    "DagStatus",
    "DatabaseError",
    "DoctorReport",
    "Event",
    "Handle",
    "Handler",
    "IdempotencyConflict",
    "InstallRefused",
    "InvalidArgument",
    "InvalidArgumentType",
    "InvalidCondition",
    "InvalidExtra",
    "InvalidRunState",
    "LeaseLost",
    "Metrics",
    "MigrationFailed",
    "NameTooLong",
    "NewEvent",
    "NotInstalled",
    "PartitionMapping",
    "Partitioned",
    "PreparedStatementConflict",
    "ProcessStatus",
    "PurgePreview",
    "PurgeResult",
    "ReadOnlyServer",
    "Ref",
    "Rollup",
    "RoutineUnavailable",
    "Run",
    "RunState",
    "SchedulerStats",
    "SchemaTooNew",
    "SchemaTooOld",
    "Source",
    "StaticPartitions",
    "TransientError",
    "UninstallPreview",
    "UnknownAsset",
    "UnknownDag",
    "UnknownRevision",
    "UnknownRun",
    "UnmappablePartition",
    "UnsupportedServerSetting",
    "WaitOutcome",
    "WorkerCoverage",
    "WorkerStats",
    "alias",
    "all_of",
    "any_of",
    "asset_name",
    "asset_uri",
    "cancel_run",
    "claim_runs",
    "complete_run",
    "consumed_events",
    "current_revision",
    "declare_asset",
    "declare_dag",
    "delete_asset",
    "delete_dag",
    "doctor",
    "get_run",
    "grant_roles",
    "head_revision",
    "heartbeat",
    "install",
    "is_run_state",
    "pause_dag",
    "processes",
    "purge",
    "purge_preview",
    "queued_events",
    "register_event",
    "register_events",
    "repair",
    "retry_run",
    "revoke_roles",
    "run_scheduler",
    "run_worker",
    "runs",
    "schedule",
    "set_run_state",
    "status",
    "uninstall",
    "uninstall_preview",
    "unpause_dag",
    "worker_coverage",
]
