"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
"""

from assetq.migrate import run_revision_script

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_revision_script(revision, "up")


def downgrade() -> None:
    run_revision_script(revision, "down")
