"""Attempt history: one row per ended attempt of a run (dag_run_attempt), written by the trigger
dag_run_attempt_end (sql/<engine>/steps/0003_run_attempts.up.sql).

Revision ID: 0003_run_attempts
Revises: 0002_run_operations
"""

from assetq.migrate import run_revision_script

revision = "0003_run_attempts"
down_revision = "0002_run_operations"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_revision_script(revision, "up")


def downgrade() -> None:
    run_revision_script(revision, "down")
