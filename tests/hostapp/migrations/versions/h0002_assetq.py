"""assetq, pinned at schema 0003_run_attempts (this package's head): replaying this history
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
    # from_revision="base": this step installs assetq. Offline (--sql) a step that pins a
    # later revision than the baseline cannot tell that by itself (docs/alembic.md).
    assetq.alembic.upgrade(op, "0003_run_attempts", namespace=NAMESPACE, from_revision="base")


def downgrade() -> None:
    assetq.alembic.downgrade(op, "base", namespace=NAMESPACE, from_revision="0003_run_attempts")
