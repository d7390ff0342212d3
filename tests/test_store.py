"""Both stores against the Store contract, plus store-specific checks and the migration matrix."""

from __future__ import annotations

import json
import shutil
import sqlite3

import pytest

from tests.store_contract import BACKENDS, StoreContract, _open, new_location, require
from tests.store_legacy import legacy_store, schema_of, status_check
from zeus_callbacks.store import SCHEMA_VERSION, StoreCorruptError, StoreError, open_store
from zeus_callbacks.store import _migrations as migrations
from zeus_callbacks.store._json_store import JSONStore
from zeus_callbacks.store._sql_store import SQLStore


class TestStoreContract(StoreContract):
    @pytest.fixture(params=sorted(BACKENDS))
    def kind(self, request) -> str:
        require(request.param)
        return request.param


def test_open_store_picks_the_backend_from_the_suffix(tmp_path):
    with open_store(tmp_path / "a.json") as a, open_store(tmp_path / "a.db") as b:
        assert isinstance(a, JSONStore) and isinstance(b, SQLStore)
    with open_store(tmp_path / "c.store", backend="json") as c:
        assert isinstance(c, JSONStore)
    with pytest.raises(ValueError, match="unknown store backend"):
        open_store(tmp_path / "d", backend="yaml")  # type: ignore[arg-type]


def test_sqlite_uses_wal_and_refuses_a_foreign_database(tmp_path):
    path = tmp_path / "s.sqlite"
    SQLStore(path).close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
    other = tmp_path / "other.sqlite"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE users (name TEXT)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreCorruptError, match="not a zeus-callbacks store"):
        SQLStore(other)


def test_json_refuses_other_json(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"hello": 1}')
    with pytest.raises(StoreCorruptError, match="x.json"):
        JSONStore(path)
    assert path.read_text() == '{"hello": 1}'


def test_migration_hooks_upgrade_an_older_store(tmp_path, monkeypatch):
    from zeus_callbacks.store import _json_store as json_store
    from zeus_callbacks.store import _sql_store as sql_store

    sq, js = tmp_path / "s.sqlite", tmp_path / "s.json"
    for path in (sq, js):
        with open_store(path) as store:
            store.create_trial("j", 8)
    # Pretend the code is one schema ahead, with a migration from today's version: one more Alembic revision.
    ahead = SCHEMA_VERSION + 1
    scripts = tmp_path / "migrations"
    shutil.copytree(migrations.HERE, scripts, ignore=shutil.ignore_patterns("__pycache__"))
    (scripts / "versions" / f"v{ahead}_test.py").write_text(
        "from alembic import op\nimport sqlalchemy as sa\n"
        f"revision = {migrations.revision(ahead)!r}\ndown_revision = {migrations.revision(SCHEMA_VERSION)!r}\n"
        "def upgrade():\n    op.add_column('jobs', sa.Column('owner', sa.Text))\n"
    )
    migrations._script.cache_clear()
    monkeypatch.setattr(migrations, "HERE", scripts)
    monkeypatch.setattr(sql_store, "SCHEMA_VERSION", ahead)
    monkeypatch.setattr(json_store, "SCHEMA_VERSION", ahead)
    monkeypatch.setitem(json_store.MIGRATIONS, SCHEMA_VERSION, lambda doc: doc.setdefault("owners", {}))
    try:
        with open_store(sq) as store, open_store(js) as store2:
            assert len(store.list_trials("j")) == 1 and len(store2.list_trials("j")) == 1
    finally:
        migrations._script.cache_clear()
    conn = sqlite3.connect(sq)
    assert conn.execute("SELECT version FROM schema_version").fetchone()[0] == ahead
    assert "owner" in [row[1] for row in conn.execute("PRAGMA table_info(jobs)")]
    conn.close()
    doc = json.loads(js.read_text())
    assert doc["schema_version"] == ahead and doc["owners"] == {}


def test_a_schema_1_store_gains_leases_and_reads_read_only_unmigrated(tmp_path):
    """A store written before leases (schema 1) opens read-only as it is, and migrates on a writing open."""
    path = tmp_path / "v1.sqlite"
    legacy_store("sqlite", str(path), 1)  # as store/sqlite.py wrote it: trial 2 runs on another host
    with open_store(path, read_only=True) as reader:
        (trial,) = reader.list_trials("j", status="running")
        assert (trial.owner, trial.heartbeat_at, trial.status) == ("", None, "running")
    with open_store(path) as store:
        (trial,) = store.list_trials("j", status="running")
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
    with SQLStore(path) as store:
        store.list_trials("job")  # a well-formed call reads the (empty) store
        with pytest.raises(sqlite3.ProgrammingError) as info:
            store.list_trials(object())  # type: ignore[arg-type]  # e.g. a JobRecord instead of its job_id
        assert not isinstance(info.value, StoreCorruptError)
        assert store.list_trials("job") == []  # the store is still fine


MIGRATION_MATRIX = [
    *(
        (kind, version, "pre-alembic")
        for kind in ("sqlite", "json", "rdb-sqlite", "postgresql")
        for version in (1, 2, 3)
    ),
    ("sqlite", 3, "alembic"),
    ("postgresql", 3, "alembic"),
]
"""Every layout older code wrote: (kind, schema version, writer; see ``tests/store_legacy.py``)."""


@pytest.mark.parametrize(("kind", "version", "writer"), MIGRATION_MATRIX)
def test_an_older_store_reads_read_only_as_it_is_and_migrates_on_a_writing_open(tmp_path, kind, version, writer):
    """The migration matrix: each layout older code wrote (store/sqlite.py's file, store/rdb.py's tables on SQLite
    and PostgreSQL, the JSON document, the Alembic chain's store at schema 3) at each schema version. Read-only: its
    records as they are, nothing changed. Writing open: every record kept, the newest schema (a unique pending_id,
    Alembic's revision, a status CHECK that admits withdrawn and refuses what is no status), and it takes new
    records (trial ids go on after the old ones), a withdrawn trial among them."""
    location = new_location(kind, tmp_path)
    legacy_store(kind, location, version, writer)
    revision = migrations.revision(version) if writer == "alembic" else None  # older code wrote no Alembic table
    assert schema_of(kind, location) == (version, version >= 3, revision)
    with _open(kind, location, read_only=True) as reader:
        trials = reader.list_trials("j")
        assert [(t.trial_id, t.status, t.batch_size) for t in trials] == [(1, "completed", 8), (2, "running", 16)]
        assert trials[0].cost == 7.0 and trials[0].converged and trials[0].info == {"round": 0}
        assert [t.heartbeat_at for t in trials] == ([5.0, 5.0] if version >= 2 else [None, None])
        assert [t.pending_id for t in trials] == (["p-1", None] if version >= 3 else [None, None])
    assert schema_of(kind, location) == (version, version >= 3, revision)  # read-only: not migrated
    with _open(kind, location) as store:
        # Trial 2's heartbeat (schema 2 on) is decades old: its lease expired; without one (schema 1) it never does.
        running = "running" if version == 1 else "failed"
        assert [(t.trial_id, t.status) for t in store.list_trials("j")] == [(1, "completed"), (2, running)]
        assert store.get_job("j").info == {"w": 1}
        bandit = store.get_bandit("j")
        assert (bandit.state["min_cost"], bandit.arms, bandit.version) == (7.0, {8: {"n": 1}, 16: {"n": 0}}, 2)
        assert store.get_profile("A40/bs8") == {"limits_W": [200.0, 300.0], "time_s": [1.25, 1.0]}
        first = store.create_trial("j", 32, pid=1, pending_id="p")
        assert first.trial_id == 3 and store.create_trial("j", 32, pid=1, pending_id="p") == first
        assert [t.pending_id for t in store.list_trials("j")][2:] == ["p"]
        unclaimed = store.create_trial("j", 64)
        assert unclaimed.trial_id == 4
        store.finish_trial(4, status="withdrawn", energy_J=None, time_s=None, cost=None, converged=False)
        assert store.get_trial(4).status == "withdrawn"
    assert schema_of(kind, location) == (
        SCHEMA_VERSION,
        True,
        migrations.revision(SCHEMA_VERSION) if kind != "json" else None,
    )
    if kind != "json":
        assert status_check(kind, location) == (True, True)  # withdrawn admitted, any other word refused


@pytest.mark.parametrize("kind", ["sqlite", "json", "rdb-sqlite", "postgresql"])
def test_a_new_store_is_created_at_the_newest_schema(tmp_path, kind):
    location = new_location(kind, tmp_path)
    _open(kind, location).close()
    expected = None if kind == "json" else migrations.revision(SCHEMA_VERSION)
    assert schema_of(kind, location) == (SCHEMA_VERSION, True, expected)


def test_sqlite_get_job_reads_that_job_alone_a_damaged_other_job_does_not_hide_it(tmp_path):
    # A row of another job that does not fit (created_at not a time) is that job's damage: get_job of a
    # sound job still returns it, and list_jobs (which reads every row) names the damaged one.
    path = tmp_path / "s.sqlite"
    with SQLStore(path) as store:
        store.ensure_job("sound", info={"a": 1})
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO jobs VALUES ('other', 'yesterday', '{}')")
    conn.commit()
    conn.close()
    with SQLStore(path) as store:
        job = store.get_job("sound")
        assert job is not None and job.job_id == "sound" and job.info == {"a": 1}
        with pytest.raises(StoreCorruptError, match="other"):
            store.list_jobs()
        with pytest.raises(StoreCorruptError, match="other"):
            store.get_job("other")
