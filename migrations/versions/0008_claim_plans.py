"""A claim is planned once per session, and a pass reads no run history while it is planned.

Revision ID: 0008_claim_plans
Revises: 0007_capped_claim
"""

from assetq.migrate import run_revision_script

revision = "0008_claim_plans"
down_revision = "0007_capped_claim"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_revision_script(revision, "up")


def downgrade() -> None:
    run_revision_script(revision, "down")
