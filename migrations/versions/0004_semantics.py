"""Scheduling semantics: aliases, references by uri, run states and caps, lifecycle, read API.

Revision ID: 0004_semantics
Revises: 0003_operations
"""

from assetq.migrate import run_revision_script

revision = "0004_semantics"
down_revision = "0003_operations"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_revision_script(revision, "up")


def downgrade() -> None:
    run_revision_script(revision, "down")
