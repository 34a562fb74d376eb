"""Test-only table step: a nullable note column on asset_event (the producers' table).

Revision ID: t0002_event_note
Revises: 0003_run_attempts
"""

from pathlib import Path

from assetq.migrate import run_revision_script

revision = "t0002_event_note"
down_revision = "0003_run_attempts"
branch_labels = None
depends_on = None
FOLDER = str(Path(__file__).parent)


def upgrade() -> None:
    run_revision_script(revision, "up", folder=FOLDER)


def downgrade() -> None:
    run_revision_script(revision, "down", folder=FOLDER)
