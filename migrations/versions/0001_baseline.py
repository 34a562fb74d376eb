"""assetq 0.1.0: every table and index (sql/<engine>/tables.sql).

Routines, triggers and views are not revisions: each lives in one file, and assetq.routines
creates or re-creates it from that file whenever the schema reaches the package's head.
A later revision changes tables or data only (sql/<engine>/steps/<revision>.up.sql).

Revision ID: 0001_baseline
Revises:
"""

from assetq.migrate import run_baseline

revision = "0001_baseline"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_baseline("up")


def downgrade() -> None:
    run_baseline("down")
