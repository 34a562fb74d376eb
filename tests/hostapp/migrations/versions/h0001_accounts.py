"""The application's accounts.

Revision ID: h0001_accounts
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "h0001_accounts"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "account",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("name", sa.String(100), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("account")
