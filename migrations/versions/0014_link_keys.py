"""Link keys: the link table's unique key (I4) turned around to (asset_event_id, dag_id),
which serves lookups by event too, and its event index dropped (one index entry fewer per
link a pass inserts); delete_dag deletes links through the dag's runs.

Revision ID: 0014_link_keys
Revises: 0013_queue_checks
"""

from assetq.migrate import run_revision_script

revision = "0014_link_keys"
down_revision = "0013_queue_checks"
branch_labels = None
depends_on = None


def upgrade() -> None:
    run_revision_script(revision, "up")


def downgrade() -> None:
    run_revision_script(revision, "down")
