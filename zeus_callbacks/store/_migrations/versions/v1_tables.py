"""Schema 1 (revision 0001): jobs, trials, bandits, arms, profiles."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from zeus_callbacks.store._migrations import table_prefix

revision = "0001"
down_revision = None


def upgrade() -> None:
    """Create the schema-1 tables."""
    p = table_prefix()
    json_text = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")
    key = sa.String(255)
    op.create_table(
        f"{p}jobs",
        sa.Column("job_id", key, primary_key=True),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("info", json_text, nullable=False),
    )
    op.create_table(
        f"{p}trials",
        sa.Column("trial_id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", key, sa.ForeignKey(f"{p}jobs.job_id"), nullable=False),
        sa.Column("batch_size", sa.Integer, nullable=False),
        sa.Column("power_limit_W", sa.Double),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("energy_J", sa.Double),
        sa.Column("time_s", sa.Double),
        sa.Column("cost", sa.Double),
        sa.Column("converged", sa.Boolean, nullable=False),
        sa.Column("started_at", sa.Double, nullable=False),
        sa.Column("ended_at", sa.Double),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("host", key, nullable=False),
        sa.Column("info", json_text, nullable=False),
        sa.CheckConstraint("status IN ('running', 'completed', 'failed', 'early_stopped')", name=f"{p}trial_status"),
        sqlite_autoincrement=True,  # ids are never reused, as the first SQLite store had them
    )
    op.create_index(f"{p}trials_by_job", f"{p}trials", ["job_id", "trial_id"])
    op.create_table(
        f"{p}bandits",
        sa.Column("job_id", key, primary_key=True),
        sa.Column("state", json_text, nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
    )
    op.create_table(
        f"{p}arms",
        sa.Column("job_id", key, primary_key=True),
        sa.Column("batch_size", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("state", json_text, nullable=False),
    )
    op.create_table(
        f"{p}profiles",
        sa.Column("key", key, primary_key=True),
        sa.Column("table_json", json_text, nullable=False),
        sa.Column("updated_at", sa.Double, nullable=False),
    )
