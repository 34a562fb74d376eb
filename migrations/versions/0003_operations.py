"""Operations: scheduler wake-ups, status view, retention, least privilege.

Revision ID: 0003_operations
Revises: 0002_batch_registration
"""

from assetq.migrate import run_revision_script

revision = "0003_operations"
down_revision = "0002_batch_registration"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_revision_script(revision, "up")


def downgrade() -> None:
    run_revision_script(revision, "down")
