"""Batch registration: register_events, many events in one round trip.

Revision ID: 0002_batch_registration
Revises: 0001_initial
"""

from assetq.migrate import run_revision_script

revision = "0002_batch_registration"
down_revision = "0001_initial"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_revision_script(revision, "up")


def downgrade() -> None:
    run_revision_script(revision, "down")
