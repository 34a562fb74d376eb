"""Runs as work: claims, leases, fencing, retries, outputs committed with success.

Revision ID: 0006_work_queue
Revises: 0005_wakeup_on_demand
"""

from assetq.migrate import run_revision_script

revision = "0006_work_queue"
down_revision = "0005_wakeup_on_demand"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_revision_script(revision, "up")


def downgrade() -> None:
    run_revision_script(revision, "down")
