"""A capped run costs what it consumes: schedule_pass reads a capped consumer's queue by index.

Revision ID: 0007_capped_claim
Revises: 0006_work_queue
"""

from assetq.migrate import run_revision_script

revision = "0007_capped_claim"
down_revision = "0006_work_queue"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_revision_script(revision, "up")


def downgrade() -> None:
    run_revision_script(revision, "down")
