"""Stores as older zeus-callbacks wrote them: schema versions 1, 2 and 3, in each layout.

- ``sqlite``: the file ``store/sqlite.py`` wrote (tables without a prefix);
- ``rdb-sqlite``: the tables ``store/rdb.py`` wrote (prefixed ``zeus_``) on a SQLite file;
- ``postgresql``: the same on a PostgreSQL server;
- ``json``: the JSON document.

- ``alembic``: the Alembic chain's store at schema 3 (the release before schema 4), on a SQLite file (no prefix) or
  PostgreSQL (``zeus_``): that chain's own revisions up to ``0003``, a named status CHECK, Alembic's table.

The SQLite files are loaded from the dumps in ``tests/data/legacy_stores`` (written by that release's own
code: ``make_legacy_stores.py``). PostgreSQL gets the DDL ``store/rdb.py`` emitted there, written out below,
and the same records. Every store holds job ``j``, trial 1 (completed), trial 2 (running on host
``elsewhere``), a bandit state of version 2 with arms 8 and 16 and the profile ``A40/bs8``.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

DUMPS = Path(__file__).parent / "data" / "legacy_stores"

_PG_DDL = {
    1: [
        "CREATE TABLE zeus_jobs (job_id VARCHAR(255) PRIMARY KEY, created_at DOUBLE PRECISION NOT NULL, info TEXT NOT "
        "NULL)",
        "CREATE TABLE zeus_trials (trial_id SERIAL PRIMARY KEY, job_id VARCHAR(255) NOT NULL REFERENCES zeus_jobs "
        '(job_id), batch_size INTEGER NOT NULL, "power_limit_W" DOUBLE PRECISION, status VARCHAR(16) NOT NULL, '
        '"energy_J" DOUBLE PRECISION, time_s DOUBLE PRECISION, cost DOUBLE PRECISION, converged BOOLEAN NOT NULL, '
        "started_at DOUBLE PRECISION NOT NULL, ended_at DOUBLE PRECISION, pid INTEGER NOT NULL, host VARCHAR(255) "
        "NOT NULL, info TEXT NOT NULL)",
        "CREATE INDEX zeus_trials_by_job ON zeus_trials (job_id, trial_id)",
        "CREATE TABLE zeus_bandits (job_id VARCHAR(255) PRIMARY KEY, state TEXT NOT NULL, version INTEGER NOT NULL)",
        "CREATE TABLE zeus_arms (job_id VARCHAR(255), batch_size INTEGER, state TEXT NOT NULL, "
        "PRIMARY KEY (job_id, batch_size))",
        "CREATE TABLE zeus_profiles (key VARCHAR(255) PRIMARY KEY, table_json TEXT NOT NULL, updated_at DOUBLE "
        "PRECISION NOT NULL)",
    ],
    2: [
        "ALTER TABLE zeus_trials ADD COLUMN owner VARCHAR(255) NOT NULL DEFAULT ''",
        "ALTER TABLE zeus_trials ADD COLUMN heartbeat_at DOUBLE PRECISION",
        "CREATE INDEX zeus_trials_by_status ON zeus_trials (status)",
    ],
    3: [
        "ALTER TABLE zeus_trials ADD COLUMN pending_id VARCHAR(64)",
        "CREATE UNIQUE INDEX zeus_trials_by_pending_id ON zeus_trials (pending_id)",
    ],
}


def _pg_store(location: str, version: int) -> None:
    import sqlalchemy as sa

    from tests.store_contract import db_engine

    engine = db_engine(location)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE zeus_schema_version (version INTEGER NOT NULL)"))
        conn.execute(sa.text("INSERT INTO zeus_schema_version VALUES (:v)"), {"v": version})
        for v in range(1, version + 1):
            for statement in _PG_DDL[v]:
                conn.execute(sa.text(statement))
        _insert_records(conn, "zeus_", version)
        conn.execute(sa.text("SELECT setval('zeus_trials_trial_id_seq', 2)"))
    engine.dispose()


def _insert_records(conn, prefix: str, version: int) -> None:
    """The records of the dumps, into tables of ``prefix``, as the database takes them (PostgreSQL: true/false)."""
    import sqlalchemy as sa

    for line in (DUMPS / f"rdb_v{version}.sql").read_text().splitlines():
        if line.startswith("INSERT INTO") and "sqlite_sequence" not in line and "schema_version" not in line:
            if '"zeus_trials"' in line and conn.dialect.name == "postgresql":
                head, values = line.split(" VALUES(", 1)
                fields = values.split(",")
                fields[8] = "true" if fields[8] == "1" else "false"
                line = f"{head} VALUES({','.join(fields)}"
            line = line.replace('INTO "zeus_', f'INTO "{prefix}')
            conn.execute(sa.text(line.replace("\\", "\\\\").replace(":", "\\:")))


def _alembic_store(location: str, prefix: str, version: int) -> None:
    """The store the Alembic chain wrote at schema ``version``: its revisions up to that one, and the records."""
    import sqlalchemy as sa

    from tests.store_contract import db_engine
    from zeus_callbacks.store import _migrations as migrations

    engine = db_engine(location)
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE {prefix}schema_version (version INTEGER NOT NULL)"))
        conn.execute(sa.text(f"INSERT INTO {prefix}schema_version VALUES (:v)"), {"v": version})
        migrations.upgrade(conn, prefix, 0, to_version=version)
        _insert_records(conn, prefix, version)
        if conn.dialect.name == "postgresql":
            conn.execute(sa.text(f"SELECT setval('{prefix}trials_trial_id_seq', 2)"))
    engine.dispose()


def _json_store(path: str, version: int) -> None:
    trials = [
        {
            "trial_id": 1,
            "job_id": "j",
            "batch_size": 8,
            "power_limit_W": 250.0,
            "status": "completed",
            "energy_J": 10.5,
            "time_s": 2.25,
            "cost": 7.0,
            "converged": True,
            "started_at": 2.0,
            "ended_at": 3.0,
            "pid": 1,
            "host": "elsewhere",
            "info": {"round": 0},
        },
        {
            "trial_id": 2,
            "job_id": "j",
            "batch_size": 16,
            "power_limit_W": None,
            "status": "running",
            "energy_J": None,
            "time_s": None,
            "cost": None,
            "converged": False,
            "started_at": 4.0,
            "ended_at": None,
            "pid": 1,
            "host": "elsewhere",
            "info": {},
        },
    ]
    for trial in trials:
        if version >= 2:
            trial.update(owner="", heartbeat_at=5.0)
        if version >= 3:
            trial["pending_id"] = "p-1" if trial["trial_id"] == 1 else None
    doc = {
        "format": "zeus-callbacks-store",
        "schema_version": version,
        "next_trial_id": 3,
        "jobs": {"j": {"created_at": 1.0, "info": {"w": 1}}},
        "trials": trials,
        "bandits": {
            "j": {"state": {"phase": "pruning", "min_cost": 7.0}, "arms": {"8": {"n": 1}, "16": {"n": 0}}, "version": 2}
        },
        "profiles": {"A40/bs8": {"limits_W": [200.0, 300.0], "time_s": [1.25, 1.0]}},
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(doc))


def legacy_store(kind: str, location: str, version: int, writer: str = "pre-alembic") -> None:
    """Write, at ``location`` (empty), the store of schema ``version`` that ``kind``'s older code wrote.

    ``writer``: ``"pre-alembic"`` (``store/sqlite.py``, ``store/rdb.py``, the JSON store) or ``"alembic"`` (the
    Alembic chain, for ``sqlite`` and ``postgresql``).
    """
    if writer == "alembic":
        prefix = "" if kind == "sqlite" else "zeus_"
        _alembic_store(location if "://" in location else f"sqlite:///{location}", prefix, version)
    elif kind == "json":
        _json_store(location, version)
    elif kind == "postgresql":
        _pg_store(location, version)
    else:
        layout = "sqlite" if kind == "sqlite" else "rdb"
        file = Path(location.removeprefix("sqlite:///"))
        file.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(file)
        conn.executescript((DUMPS / f"{layout}_v{version}.sql").read_text())
        conn.close()


def schema_of(kind: str, location: str) -> tuple[int, bool, str | None]:
    """(the stored schema version, whether trials have a unique pending_id, Alembic's revision), read behind the
    store's back."""
    if kind == "json":
        doc = json.loads(Path(location).read_text())
        return doc["schema_version"], all("pending_id" in t for t in doc["trials"]), None
    import sqlalchemy as sa

    from tests.store_contract import db_engine

    prefix = "" if kind == "sqlite" else "zeus_"
    engine = db_engine(location if "://" in location else f"sqlite:///{location}")
    with engine.connect() as conn:
        version = conn.execute(sa.text(f"SELECT version FROM {prefix}schema_version")).scalar_one()
        inspector = sa.inspect(conn)
        columns = [c["name"] for c in inspector.get_columns(f"{prefix}trials")]
        unique = any(
            i["unique"] and i["column_names"] == ["pending_id"] for i in inspector.get_indexes(f"{prefix}trials")
        )
        revision = None
        if f"{prefix}alembic_version" in inspector.get_table_names():
            revision = conn.execute(sa.text(f"SELECT version_num FROM {prefix}alembic_version")).scalar_one()
    engine.dispose()
    return version, "pending_id" in columns and unique, revision


def status_check(kind: str, location: str) -> tuple[bool, bool]:
    """(whether a trial row of status ``withdrawn`` is admitted, whether one of status ``bogus`` is refused), tried
    behind the store's back in a transaction that is rolled back."""
    import sqlalchemy as sa

    from tests.store_contract import db_engine

    prefix = "" if kind == "sqlite" else "zeus_"
    engine = db_engine(location if "://" in location else f"sqlite:///{location}")
    insert = sa.text(
        f"INSERT INTO {prefix}trials (job_id, batch_size, status, converged, started_at, pid, host, info) "
        "VALUES ('j', 1, :status, false, 0, 0, 'h', '{}')"
    )
    admitted = {}
    for status in ("withdrawn", "bogus"):
        with engine.connect() as conn, conn.begin() as transaction:
            try:
                conn.execute(insert, {"status": status})
                admitted[status] = True
            except sa.exc.IntegrityError:
                admitted[status] = False
            transaction.rollback()
    engine.dispose()
    return admitted["withdrawn"], not admitted["bogus"]
