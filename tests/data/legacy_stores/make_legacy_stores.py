"""Write the SQL dumps of this folder: stores as zeus-callbacks wrote them before the Alembic store.

Run it with the code of that release on the path (its ``store/sqlite.py`` and ``store/rdb.py``)::

    PYTHONPATH=/path/to/zeus-callbacks-before-alembic python tests/data/legacy_stores/make_legacy_stores.py

Each dump (``<layout>_v<version>.sql``) is ``sqlite3.Connection.iterdump`` of a store of that schema version
holding the same records: job ``j`` (info ``{"w": 1}``), trial 1 completed, trial 2 running on host ``elsewhere``
(pid 1, heartbeat 5.0 where the schema has leases), a bandit state of version 2 with arms 8 and 16, and the
profile ``A40/bs8``. Layout ``sqlite``: ``store/sqlite.py``'s file; ``rdb``: ``store/rdb.py``'s tables
(prefixed ``zeus_``) on a SQLite file.
"""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
JOB = ("j", 1.0, '{"w": 1}')
TRIALS = [
    # trial_id, job_id, batch_size, power_limit_W, status, energy_J, time_s, cost, converged, started_at, ended_at,
    # pid, host, info
    (1, "j", 8, 250.0, "completed", 10.5, 2.25, 7.0, 1, 2.0, 3.0, 1, "elsewhere", '{"round": 0}'),
    (2, "j", 16, None, "running", None, None, None, 0, 4.0, None, 1, "elsewhere", "{}"),
]
BANDIT = ("j", '{"phase": "pruning", "min_cost": 7.0}', 2)
ARMS = [("j", 8, '{"n": 1}'), ("j", 16, '{"n": 0}')]
PROFILE = ("A40/bs8", '{"limits_W": [200.0, 300.0], "time_s": [1.25, 1.0]}', 3.0)


def _fill(conn, prefix: str, version: int) -> None:
    conn.execute(f"INSERT INTO {prefix}jobs VALUES (?, ?, ?)", JOB)
    for row in TRIALS:
        columns = "trial_id, job_id, batch_size, power_limit_W, status, energy_J, time_s, cost, converged, "
        columns += "started_at, ended_at, pid, host, info"
        values = list(row)
        if version >= 2:
            columns += ", owner, heartbeat_at"
            values += ["", 5.0]
        if version >= 3:
            columns += ", pending_id"
            values += ["p-1" if row[0] == 1 else None]
        marks = ", ".join("?" * len(values))
        conn.execute(f"INSERT INTO {prefix}trials ({columns}) VALUES ({marks})", values)
    conn.execute(f"INSERT INTO {prefix}bandits VALUES (?, ?, ?)", BANDIT)
    conn.executemany(f"INSERT INTO {prefix}arms VALUES (?, ?, ?)", ARMS)
    conn.execute(f"INSERT INTO {prefix}profiles VALUES (?, ?, ?)", PROFILE)


def _sqlite_layout(path: Path, version: int) -> None:
    from zeus_callbacks.store import sqlite as old

    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    conn.execute("INSERT INTO schema_version VALUES (?)", (version,))
    for v in range(version):
        old.MIGRATIONS[v](conn)
    _fill(conn, "", version)
    conn.commit()
    conn.close()


def _rdb_layout(path: Path, version: int) -> None:
    import sqlalchemy as sa

    from zeus_callbacks.store import rdb as old

    _, tables = old._tables(sa)
    engine = sa.create_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        tables["schema_version"].create(conn)
        conn.execute(tables["schema_version"].insert().values(version=version))
        for v in range(version):
            old.MIGRATIONS[v](conn, sa, tables)
        _fill(conn.connection.dbapi_connection, "zeus_", version)
    engine.dispose()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for layout, make in (("sqlite", _sqlite_layout), ("rdb", _rdb_layout)):
            for version in (1, 2, 3):
                path = Path(tmp) / f"{layout}_v{version}.sqlite"
                make(path, version)
                conn = sqlite3.connect(path)
                (HERE / f"{layout}_v{version}.sql").write_text("\n".join(conn.iterdump()) + "\n")
                conn.close()


if __name__ == "__main__":
    main()
