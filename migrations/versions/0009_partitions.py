"""Partitioned assets: events, consumers and runs carry partition keys, and a partitioned
consumer's condition is evaluated per key.

Revision ID: 0009_partitions
Revises: 0008_claim_plans
"""

from assetq.migrate import run_revision_script

revision = "0009_partitions"
down_revision = "0008_claim_plans"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_revision_script(revision, "up")


def downgrade() -> None:
    run_revision_script(revision, "down")
