"""Initial schema: assets, consumers, events, queue, runs, links, and their routines.

Revision ID: 0001_initial
Revises:
"""

from assetq.migrate import run_revision_script

revision = "0001_initial"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_revision_script(revision, "up")


def downgrade() -> None:
    run_revision_script(revision, "down")
