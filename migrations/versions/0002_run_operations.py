"""Operating runs: a consumer's timeout, an attempt's deadline, the cancelled state, and the
consumers each worker can run (sql/<engine>/steps/0002_run_operations.up.sql).

Revision ID: 0002_run_operations
Revises: 0001_baseline
"""

from assetq.migrate import run_revision_script

revision = "0002_run_operations"
down_revision = "0001_baseline"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_revision_script(revision, "up")


def downgrade() -> None:
    run_revision_script(revision, "down")
