"""The SQL store's schema migrations: one Alembic chain, run programmatically when a store is opened.

Revision ``"000N"`` (``versions/vN_*.py``) brings a store to schema version N
(:data:`~zeus_callbacks.store._base.SCHEMA_VERSION`). The store keeps its version in two places: the
integer ``schema_version`` table every zeus-callbacks release reads (so an older release refuses a
newer store by name), and Alembic's own version table. A store written before Alembic has only the
first; :func:`upgrade` stamps Alembic's table from it, then runs the revisions that are missing.

No ``alembic.ini`` or ``env.py`` is needed at run time: the revisions are read from this folder and
run on the store's own connection, inside the transaction that holds the store's migration lock.
The tables' names carry the store's prefix (``""`` for a SQLite store file, ``"zeus_"`` in a shared
database), which the revisions read with :func:`table_prefix`.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent


def revision(version: int) -> str:
    """The Alembic revision id of schema ``version`` (``3`` → ``"0003"``)."""
    return f"{version:04d}"


@lru_cache(maxsize=1)
def _script() -> Any:
    from alembic.script import ScriptDirectory

    return ScriptDirectory(str(HERE))


def upgrade(conn: Any, prefix: str, from_version: int, to_version: int | None = None) -> None:
    """Bring the store on ``conn`` from schema ``from_version`` to the newest (inside the caller's transaction).

    Args:
        conn: A SQLAlchemy connection in a transaction (the caller commits or rolls back).
        prefix: The store's table prefix.
        from_version: The version its ``schema_version`` table holds (0: a new store).
        to_version: Stop at this version instead (the tests write the stores older releases wrote).
    """
    from alembic.config import Config
    from alembic.runtime.environment import EnvironmentContext

    script = _script()
    target = "head" if to_version is None else revision(to_version)

    def to_target(current: Any, context: Any) -> Any:
        return script._upgrade_revs(target, current)

    with EnvironmentContext(Config(), script, fn=to_target) as env:
        env.configure(connection=conn, version_table=f"{prefix}alembic_version", table_prefix=prefix)
        if from_version > 0:  # a store older than Alembic's table, or at the version it names already
            env.get_context().stamp(script, revision(from_version))
        env.run_migrations()


def table_prefix() -> str:
    """The prefix of the store's tables, for a revision's operations."""
    from alembic import op

    return str(op.get_context().opts["table_prefix"])
