"""Schema 4 (revision 0004): a trial may be ``withdrawn`` (a suggestion no run claimed)."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from zeus_callbacks.store._migrations import table_prefix

revision = "0004"
down_revision = "0003"

# Spelled out, not imported: a revision keeps the schema of its version whatever later code calls a status.
STATUSES = ("running", "completed", "failed", "early_stopped", "withdrawn")


def upgrade() -> None:
    """Replace the CHECK on ``trials.status`` with one that admits ``withdrawn``, named ``<prefix>trial_status``.

    Older layouts differ: this chain's schema 1 named the CHECK, ``store/sqlite.py``'s file had it
    unnamed on the column, ``store/rdb.py``'s tables had none. Every one ends with the same named CHECK.
    SQLite cannot alter a constraint: its table is rebuilt (Alembic's batch mode, rows, indexes and
    foreign key kept; the unnamed CHECK is not carried over, the new one replaces it).
    """
    p = table_prefix()
    table = f"{p}trials"
    name = f"{p}trial_status"
    check = sa.CheckConstraint("status IN ({})".format(", ".join(f"'{s}'" for s in STATUSES)), name=name)
    bind = op.get_bind()
    named = {c["name"] for c in sa.inspect(bind).get_check_constraints(table) if c.get("name")}
    if bind.dialect.name == "sqlite":
        _rebuild_sqlite(table, check, drop=name if name in named else None)
        return
    if name in named:
        op.drop_constraint(name, table, type_="check")
    op.create_check_constraint(name, table, check.sqltext)


def _rebuild_sqlite(table: str, check: sa.CheckConstraint, drop: str | None) -> None:
    """Rebuild ``table`` with ``check`` in place of its status CHECK; ``AUTOINCREMENT`` and its counter are kept."""
    bind = op.get_bind()
    created = bind.execute(
        sa.text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = :name"), {"name": table}
    ).scalar_one()
    autoincrement = "AUTOINCREMENT" in str(created).upper()
    sequence = _sqlite_sequence(bind, table) if autoincrement else None
    with op.batch_alter_table(
        table, recreate="always", table_args=(check,), table_kwargs={"sqlite_autoincrement": autoincrement}
    ) as batch:
        if drop is not None:
            batch.drop_constraint(drop, type_="check")
    if sequence is not None:  # ids are never reused: the rebuilt table's counter goes on from the old one's
        bind.execute(sa.text("DELETE FROM sqlite_sequence WHERE name = :name"), {"name": table})
        bind.execute(
            sa.text("INSERT INTO sqlite_sequence (name, seq) VALUES (:name, :seq)"), {"name": table, "seq": sequence}
        )


def _sqlite_sequence(bind: sa.engine.Connection, table: str) -> int | None:
    """The ``AUTOINCREMENT`` counter of ``table`` (None: nothing inserted yet)."""
    row = bind.execute(sa.text("SELECT seq FROM sqlite_sequence WHERE name = :name"), {"name": table}).first()
    return None if row is None else int(row[0])
