"""Batch lookups: PostgreSQL's register_events finds each row it returns by index (an item
without an idempotency key needs no lookup at all) instead of joining the batch with the
whole event history; nothing on MySQL/MariaDB.

Revision ID: 0015_batch_lookups
Revises: 0014_link_keys
"""

from assetq.migrate import run_revision_script

revision = "0015_batch_lookups"
down_revision = "0014_link_keys"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_revision_script(revision, "up")


def downgrade() -> None:
    run_revision_script(revision, "down")
