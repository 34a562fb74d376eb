"""assetq, pinned at schema 0001_baseline (assetq 0.1.0's tables): replaying this history
with any later package installs the same tables here. Routines, triggers and views are not
pinned: they come from the package installed, once the schema reaches its head.

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
    assetq.alembic.upgrade(op, "0001_baseline", namespace=NAMESPACE)


def downgrade() -> None:
    assetq.alembic.downgrade(op, "base", namespace=NAMESPACE, from_revision="0001_baseline")
