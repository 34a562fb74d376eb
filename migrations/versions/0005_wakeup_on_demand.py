"""Wake-ups on demand: producers notify (PostgreSQL) only while a scheduler waits.

Revision ID: 0005_wakeup_on_demand
Revises: 0004_semantics
"""

from assetq.migrate import run_revision_script

revision = "0005_wakeup_on_demand"
down_revision = "0004_semantics"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_revision_script(revision, "up")


def downgrade() -> None:
    run_revision_script(revision, "down")
