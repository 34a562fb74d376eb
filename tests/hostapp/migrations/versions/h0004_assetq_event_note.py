"""assetq upgraded to schema t0003_event_note_index (a test-only revision standing for a
newer package's table step: tests/revisions), then an index of the application's own, in
the same revision: op works after assetq's step.

Offline (`alembic upgrade --sql`) this step takes the revision the earlier assetq step of the
same run wrote; a `--sql` run that starts after h0002 would need from_revision= here.

Revision ID: h0004_assetq_event_note
Revises: h0003_orders
"""

import os

from alembic import op

import assetq.alembic

revision = "h0004_assetq_event_note"
down_revision = "h0003_orders"
branch_labels = None
depends_on = None

NAMESPACE = os.environ.get("HOSTAPP_ASSETQ_NAMESPACE", "assetq")


def upgrade() -> None:
    assetq.alembic.upgrade(op, "t0003_event_note_index", namespace=NAMESPACE)
    op.create_index("orders_amount_idx", "orders", ["amount"])


def downgrade() -> None:
    op.drop_index("orders_amount_idx", table_name="orders")
    assetq.alembic.downgrade(
        op, "0003_run_attempts", namespace=NAMESPACE, from_revision="t0003_event_note_index"
    )
