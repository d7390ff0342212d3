"""Both store backends against the Store contract, plus backend-specific checks."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from tests.store_contract import BACKENDS, StoreContract, _open, db_engine, new_location, require
from zeus_callbacks.store import SCHEMA_VERSION, StoreCorruptError, StoreError, open_store
from zeus_callbacks.store.json import JSONStore
from zeus_callbacks.store.sqlite import SQLiteStore


class TestStoreContract(StoreContract):
    @pytest.fixture(params=sorted(BACKENDS))
    def kind(self, request) -> str:
        require(request.param)
        return request.param


def test_open_store_picks_the_backend_from_the_suffix(tmp_path):
    with open_store(tmp_path / "a.json") as a, open_store(tmp_path / "a.db") as b:
        assert isinstance(a, JSONStore) and isinstance(b, SQLiteStore)
    with open_store(tmp_path / "c.store", backend="json") as c:
        assert isinstance(c, JSONStore)
    with pytest.raises(ValueError, match="unknown store backend"):
        open_store(tmp_path / "d", backend="yaml")  # type: ignore[arg-type]


def test_sqlite_uses_wal_and_refuses_a_foreign_database(tmp_path):
    path = tmp_path / "s.sqlite"
    SQLiteStore(path).close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
    other = tmp_path / "other.sqlite"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE users (name TEXT)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreCorruptError, match="not a zeus-callbacks store"):
        SQLiteStore(other)


def test_json_refuses_other_json(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"hello": 1}')
    with pytest.raises(StoreCorruptError, match="x.json"):
        JSONStore(path)
    assert path.read_text() == '{"hello": 1}'


def test_migration_hooks_upgrade_an_older_store(tmp_path, monkeypatch):
    from zeus_callbacks.store import json as json_store
    from zeus_callbacks.store import sqlite as sqlite_store

    sq, js = tmp_path / "s.sqlite", tmp_path / "s.json"
    for path in (sq, js):
        with open_store(path) as store:
            store.create_trial("j", 8)
    # Pretend the code is one schema ahead, with a migration from today's version.
    ahead = SCHEMA_VERSION + 1
    monkeypatch.setattr(sqlite_store, "SCHEMA_VERSION", ahead)
    monkeypatch.setitem(
        sqlite_store.MIGRATIONS, SCHEMA_VERSION, lambda conn: conn.execute("ALTER TABLE jobs ADD COLUMN owner TEXT")
    )
    monkeypatch.setattr(json_store, "SCHEMA_VERSION", ahead)
    monkeypatch.setitem(json_store.MIGRATIONS, SCHEMA_VERSION, lambda doc: doc.setdefault("owners", {}))
    with open_store(sq) as store, open_store(js) as store2:
        assert len(store.list_trials("j")) == 1 and len(store2.list_trials("j")) == 1
    conn = sqlite3.connect(sq)
    assert conn.execute("SELECT version FROM schema_version").fetchone()[0] == ahead
    assert "owner" in [row[1] for row in conn.execute("PRAGMA table_info(jobs)")]
    conn.close()
    doc = json.loads(js.read_text())
    assert doc["schema_version"] == ahead and doc["owners"] == {}


def test_a_schema_1_store_gains_leases_and_reads_read_only_unmigrated(tmp_path):
    """A store written before leases (schema 1) opens read-only as it is, and migrates on a writing open."""
    from zeus_callbacks.store import sqlite as sqlite_store

    path = tmp_path / "v1.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    conn.execute("INSERT INTO schema_version VALUES (1)")
    sqlite_store.MIGRATIONS[0](conn)
    conn.execute("INSERT INTO jobs VALUES ('j', 1.0, '{}')")
    conn.execute(
        "INSERT INTO trials (job_id, batch_size, status, converged, started_at, pid, host, info) "
        "VALUES ('j', 8, 'running', 0, 1.0, 1, 'elsewhere', '{}')"
    )
    conn.commit()
    conn.close()
    with open_store(path, read_only=True) as reader:
        (trial,) = reader.list_trials("j")
        assert (trial.owner, trial.heartbeat_at, trial.status) == ("", None, "running")
    with open_store(path) as store:
        (trial,) = store.list_trials("j")
        # Another host's trial without a heartbeat (schema 1) never expires: only its own host can tell.
        assert (trial.owner, trial.heartbeat_at, trial.status) == ("", None, "running")
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT version FROM schema_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()


@pytest.mark.parametrize("suffix", ["sqlite", "json"])
def test_store_is_a_power_limit_profile_cache(tmp_path, suffix):
    from dataclasses import dataclass

    from zeus_callbacks.store.profile_cache import StoreProfileCache

    @dataclass(frozen=True)
    class Key:  # the shape of power_limit.ProfileKey
        job_id: str
        batch_size: int

        def as_str(self) -> str:
            return f"{self.job_id}/{self.batch_size}"

    cache = StoreProfileCache(tmp_path / f"store.{suffix}")
    assert cache.get(Key("j", 8)) is None
    cache.put(Key("j", 8), {"limits_W": [200.0, 300.0], "time_s": [1.25, 1.0]})
    assert StoreProfileCache(tmp_path / f"store.{suffix}").get(Key("j", 8)) == {
        "limits_W": [200.0, 300.0],
        "time_s": [1.25, 1.0],
    }
    with open_store(tmp_path / f"store.{suffix}") as store:
        assert store.list_profiles() == ["j/8"]


def test_read_only_open_sees_a_live_writer_and_creates_nothing(tmp_path):
    path = tmp_path / "live.sqlite"
    writer = open_store(path)
    try:
        trial = writer.create_trial("job", 8)  # committed, still in the -wal file
        files = sorted(p.name for p in tmp_path.iterdir())
        assert f"{path.name}-wal" in files
        with open_store(path, read_only=True) as reader:
            assert [t.trial_id for t in reader.list_trials("job")] == [trial.trial_id]
            with pytest.raises(StoreError, match="cannot write"):
                reader.create_trial("job", 16)
        assert sorted(p.name for p in tmp_path.iterdir()) == files
    finally:
        writer.close()
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}  # closed: no -wal, read immutably
    with open_store(path, read_only=True) as reader:
        assert len(reader.list_trials("job")) == 1
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    with pytest.raises(StoreError, match="no such store"):
        open_store(tmp_path / "missing.sqlite", read_only=True)
    assert not (tmp_path / "missing.sqlite").exists()


def test_a_wrong_argument_type_is_the_callers_error_not_a_corrupt_store(tmp_path):
    """sqlite3 rejects a parameter it cannot bind: that names the call, and the file is not called corrupt."""
    path = tmp_path / "s.sqlite"
    with SQLiteStore(path) as store:
        store.list_trials("job")  # a well-formed call reads the (empty) store
        with pytest.raises(sqlite3.ProgrammingError) as info:
            store.list_trials(object())  # type: ignore[arg-type]  # e.g. a JobRecord instead of its job_id
        assert not isinstance(info.value, StoreCorruptError)
        assert store.list_trials("job") == []  # the store is still fine


def _schema_2_store(kind: str, location: str) -> None:
    """A store as zeus-callbacks wrote it before pending ids (schema 2), built with that version's migrations,
    holding job ``j`` and one finished trial."""
    trial = (
        "INSERT INTO {p}trials (job_id, batch_size, status, converged, started_at, ended_at, pid, host, info, "
        "owner, heartbeat_at) VALUES ('j', 8, 'completed', {false}, 1.0, 2.0, 1, 'elsewhere', '{{}}', '', 1.0)"
    )
    if kind == "json":
        Path(location).write_text(
            json.dumps(
                {
                    "format": "zeus-callbacks-store",
                    "schema_version": 2,
                    "next_trial_id": 2,
                    "jobs": {"j": {"created_at": 1.0, "info": {}}},
                    "trials": [
                        {
                            "trial_id": 1,
                            "job_id": "j",
                            "batch_size": 8,
                            "power_limit_W": None,
                            "status": "completed",
                            "energy_J": None,
                            "time_s": None,
                            "cost": None,
                            "converged": False,
                            "started_at": 1.0,
                            "ended_at": 2.0,
                            "pid": 1,
                            "host": "elsewhere",
                            "info": {},
                            "owner": "",
                            "heartbeat_at": 1.0,
                        }
                    ],
                    "bandits": {},
                    "profiles": {},
                }
            )
        )
    elif kind == "sqlite":
        from zeus_callbacks.store import sqlite as sqlite_store

        conn = sqlite3.connect(location)
        conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        conn.execute("INSERT INTO schema_version VALUES (2)")
        for version in (0, 1):
            sqlite_store.MIGRATIONS[version](conn)
        conn.execute("INSERT INTO jobs VALUES ('j', 1.0, '{}')")
        conn.execute(trial.format(p="", false=0))
        conn.commit()
        conn.close()
    else:
        import sqlalchemy as sa

        from zeus_callbacks.store import rdb

        _, tables = rdb._tables(sa)
        engine = db_engine(location)
        with engine.begin() as conn:
            tables["schema_version"].create(conn)
            conn.execute(tables["schema_version"].insert().values(version=2))
            for version in (0, 1):
                rdb.MIGRATIONS[version](conn, sa, tables)
            conn.execute(sa.text("INSERT INTO zeus_jobs VALUES ('j', 1.0, '{}')"))
            conn.execute(sa.text(trial.format(p="zeus_", false="false")))
        engine.dispose()


def _has_pending_column(kind: str, location: str) -> tuple[int, bool]:
    """(the stored schema version, whether trials have a unique pending_id), read behind the store's back."""
    if kind == "json":
        doc = json.loads(Path(location).read_text())
        return doc["schema_version"], all("pending_id" in t for t in doc["trials"])
    if kind == "sqlite":
        conn = sqlite3.connect(location)
        version = conn.execute("SELECT version FROM schema_version").fetchone()[0]
        columns = [row[1] for row in conn.execute("PRAGMA table_info(trials)")]
        unique = any(
            row[2] and [c[2] for c in conn.execute(f"PRAGMA index_info({row[1]})")] == ["pending_id"]
            for row in conn.execute("PRAGMA index_list(trials)")
        )
        conn.close()
        return version, "pending_id" in columns and unique
    import sqlalchemy as sa

    engine = db_engine(location)
    with engine.connect() as conn:
        version = conn.execute(sa.text("SELECT version FROM zeus_schema_version")).scalar_one()
        inspector = sa.inspect(conn)
        columns = [c["name"] for c in inspector.get_columns("zeus_trials")]
        unique = any(i["unique"] and i["column_names"] == ["pending_id"] for i in inspector.get_indexes("zeus_trials"))
    engine.dispose()
    return version, "pending_id" in columns and unique


@pytest.mark.parametrize("kind", ["sqlite", "json", "rdb-sqlite", "postgresql"])
def test_a_schema_2_store_opens_and_gains_the_pending_id(tmp_path, kind):
    """A store from before pending ids (schema 2) reads as it is read-only, and gains a unique pending_id on a
    writing open; its trials read pending_id None and a pending trial is then recorded once."""
    location = new_location(kind, tmp_path)
    _schema_2_store(kind, location)
    assert _has_pending_column(kind, location) == (2, False)
    if kind in ("sqlite", "json"):  # a database store of an older schema is refused read-only: open it to migrate
        with open_store(location, read_only=True) as reader:
            assert [(t.trial_id, t.status, t.pending_id) for t in reader.list_trials("j")] == [(1, "completed", None)]
        assert _has_pending_column(kind, location) == (2, False)  # read-only: not migrated
    with _open(kind, location) as store:
        assert [(t.trial_id, t.status, t.pending_id) for t in store.list_trials("j")] == [(1, "completed", None)]
        first = store.create_trial("j", 32, pid=1, pending_id="p")
        assert store.create_trial("j", 32, pid=1, pending_id="p") == first
        assert [t.pending_id for t in store.list_trials("j")] == [None, "p"]
    assert _has_pending_column(kind, location) == (SCHEMA_VERSION, True)
