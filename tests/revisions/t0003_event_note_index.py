"""Test-only table step: an index on asset_event.note.

Revision ID: t0003_event_note_index
Revises: t0002_event_note
"""

from pathlib import Path

from assetq.migrate import run_revision_script

revision = "t0003_event_note_index"
down_revision = "t0002_event_note"
branch_labels = None
depends_on = None
FOLDER = str(Path(__file__).parent)


def upgrade() -> None:
    run_revision_script(revision, "up", folder=FOLDER)


def downgrade() -> None:
    run_revision_script(revision, "down", folder=FOLDER)
