"""The application's orders, and an e-mail address per account: ordinary op.* calls in the
same `alembic upgrade` run after assetq's step.

Revision ID: h0003_orders
Revises: h0002_assetq
"""

import sqlalchemy as sa
from alembic import op

revision = "h0003_orders"
down_revision = "h0002_assetq"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("account", sa.Column("email", sa.String(200), nullable=True))
    op.create_table(
        "orders",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("account_id", sa.Integer, sa.ForeignKey("account.id"), nullable=False),
        sa.Column("amount", sa.Integer, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("orders")
    op.drop_column("account", "email")
