"""assetq, pinned at schema 0005: replaying this history installs the same schema here.

Revision ID: h0002_assetq
Revises: h0001_accounts
"""

import os

from alembic import op

import assetq.alembic

revision = "h0002_assetq"
down_revision = "h0001_accounts"
branch_labels = None
depends_on = None

NAMESPACE = os.environ.get("HOSTAPP_ASSETQ_NAMESPACE", "assetq")


def upgrade() -> None:
    assetq.alembic.upgrade(op, "0005_wakeup_on_demand", namespace=NAMESPACE)


def downgrade() -> None:
    assetq.alembic.downgrade(
        op, "base", namespace=NAMESPACE, from_revision="0005_wakeup_on_demand"
    )
