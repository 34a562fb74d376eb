"""Runs per pass: a capped consumer gets as many runs in one scheduler pass as its backlog fills,
up to its share of the pass's limit.

Revision ID: 0011_runs_per_pass
Revises: 0010_liveness
"""

from assetq.migrate import run_revision_script

revision = "0011_runs_per_pass"
down_revision = "0010_liveness"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_revision_script(revision, "up")


def downgrade() -> None:
    run_revision_script(revision, "down")
