"""Schema 2 (revision 0002): trials carry a lease (owner token, heartbeat)."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from zeus_callbacks.store._migrations import table_prefix

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    """Add ``owner`` and ``heartbeat_at`` to trials, and an index by status."""
    p = table_prefix()
    op.add_column(f"{p}trials", sa.Column("owner", sa.String(255), nullable=False, server_default=""))
    op.add_column(f"{p}trials", sa.Column("heartbeat_at", sa.Double))
    op.create_index(f"{p}trials_by_status", f"{p}trials", ["status"])
