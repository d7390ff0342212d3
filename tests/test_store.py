"""Both store backends against the Store contract, plus backend-specific checks."""

from __future__ import annotations

import sqlite3

import pytest

from tests.store_contract import BACKENDS, StoreContract, require
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
    import json

    from zeus_callbacks.store import json as json_store
    from zeus_callbacks.store import sqlite as sqlite_store

    sq, js = tmp_path / "s.sqlite", tmp_path / "s.json"
    for path in (sq, js):
        with open_store(path) as store:
            store.create_trial("j", 8)
    # Pretend the code is one schema ahead, with a migration from today's version.
    ahead = SCHEMA_VERSION + 1
    monkeypatch.setattr(sqlite_store, "SCHEMA_VERSION", ahead)
    monkeypatch.setitem(sqlite_store.MIGRATIONS, SCHEMA_VERSION,
                        lambda conn: conn.execute("ALTER TABLE jobs ADD COLUMN owner TEXT"))
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
    conn.execute("INSERT INTO trials (job_id, batch_size, status, converged, started_at, pid, host, info) "
                 "VALUES ('j', 8, 'running', 0, 1.0, 1, 'elsewhere', '{}')")
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
        "limits_W": [200.0, 300.0], "time_s": [1.25, 1.0]}
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
