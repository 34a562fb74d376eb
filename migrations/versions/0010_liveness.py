"""Liveness: a table of the schedulers and workers that run, each loop's heartbeat, shown by
`assetq status` with the stale ones flagged.

Revision ID: 0010_liveness
Revises: 0009_partitions
"""

from assetq.migrate import run_revision_script

revision = "0010_liveness"
down_revision = "0009_partitions"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_revision_script(revision, "up")


def downgrade() -> None:
    run_revision_script(revision, "down")
