"""Schema 3 (revision 0003): trials carry the id of the pending-trial file they were recorded from."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from zeus_callbacks.store._migrations import table_prefix

revision = "0003"
down_revision = "0002"


def upgrade() -> None:
    """Add ``pending_id`` to trials, with a unique index (NULLs are distinct)."""
    p = table_prefix()
    op.add_column(f"{p}trials", sa.Column("pending_id", sa.String(64)))
    op.create_index(f"{p}trials_by_pending_id", f"{p}trials", ["pending_id"], unique=True)
