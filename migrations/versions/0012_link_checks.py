"""Link checks: the link table loses its two foreign keys (1.9 s of a 3.3 s pass over a
100,000-event backlog); the routines that delete runs or events delete their links themselves.

Revision ID: 0012_link_checks
Revises: 0011_runs_per_pass
"""

from assetq.migrate import run_revision_script

revision = "0012_link_checks"
down_revision = "0011_runs_per_pass"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_revision_script(revision, "up")


def downgrade() -> None:
    run_revision_script(revision, "down")
