"""Queue checks: the queue loses its two foreign keys (8 of a producer's 9 checks at 4
consumers); delete_dag deletes its consumer's queue rows itself.

Revision ID: 0013_queue_checks
Revises: 0012_link_checks
"""

from assetq.migrate import run_revision_script

revision = "0013_queue_checks"
down_revision = "0012_link_checks"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_revision_script(revision, "up")


def downgrade() -> None:
    run_revision_script(revision, "down")
