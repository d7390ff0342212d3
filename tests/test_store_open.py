"""Opening stores: URLs, clear errors for databases, cheap opens, network filesystems, many openers at once."""

from __future__ import annotations

import logging
import multiprocessing
import os
import socket
import sqlite3
import sys
from types import SimpleNamespace

import pytest
from filelock import FileLock, SoftFileLock

from tests.store_contract import DB_URL_ENV, require
from zeus_callbacks.config import ZeusConfig
from zeus_callbacks.store import StoreError, open_configured_store, open_store
from zeus_callbacks.store import _netfs as netfs
from zeus_callbacks.store._base import mask_url
from zeus_callbacks.store._json_store import JSONStore
from zeus_callbacks.store._sql_store import SQLStore


def test_mask_url_hides_the_password_only():
    assert mask_url("postgresql://zeus:s3cret@db.example:5432/runs") == "postgresql://zeus:***@db.example:5432/runs"
    assert mask_url("postgresql://zeus@db/runs") == "postgresql://zeus@db/runs"
    assert "s3cret" not in mask_url("mysql://u@h/db?password=s3cret&charset=utf8mb4")
    assert "charset=utf8mb4" in mask_url("mysql://u@h/db?password=s3cret&charset=utf8mb4")


def test_sqlite_url_is_the_builtin_sqlite_store(tmp_path):
    with open_store(f"sqlite:///{tmp_path}/a.sqlite") as store:
        assert isinstance(store, SQLStore) and store.path == tmp_path / "a.sqlite"
    with pytest.raises(ValueError, match="sqlite:///"):
        open_store("sqlite://")


def test_config_url_opens_that_store(tmp_path):
    cfg = ZeusConfig.model_validate({"store": {"url": f"sqlite:///{tmp_path}/c.sqlite", "lease_grace_s": 60}})
    with open_configured_store(cfg.store, tmp_path / "logs") as store:
        assert isinstance(store, SQLStore) and store.lease_grace_s == 60
    with pytest.raises(ValueError, match="either store.url or store.path"):
        ZeusConfig.model_validate({"store": {"url": "postgresql://h/db", "path": "x.sqlite"}})
    with pytest.raises(ValueError, match="must be a URL"):
        ZeusConfig.model_validate({"store": {"url": "db.example"}})


def test_a_database_url_without_sqlalchemy_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "sqlalchemy", None)  # import sqlalchemy now raises ImportError
    with pytest.raises(StoreError, match=r"zeus-callbacks\[postgres\]") as info:
        open_store("postgresql://zeus:s3cret@db.example/runs")
    assert "s3cret" not in str(info.value) and "zeus:***@db.example" in str(info.value)


def test_an_unreachable_server_is_retried_then_named_with_the_password_masked():
    require("rdb-sqlite")  # SQLAlchemy
    pytest.importorskip("psycopg")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    with pytest.raises(StoreError, match=r"still failing after \d+\.\d s and [2-9]\d* tries") as info:
        SQLStore(f"postgresql://zeus:s3cret@127.0.0.1:{port}/runs", lock_timeout_s=1.0)
    assert "s3cret" not in str(info.value) and f"zeus:***@127.0.0.1:{port}/runs" in str(info.value)


def test_refused_credentials_fail_at_once_with_the_password_masked():
    require("postgresql")
    import sqlalchemy as sa

    url = sa.engine.make_url(os.environ[DB_URL_ENV]).set(password="wrong-password")
    if url.host in (None, "", "localhost") and not url.password:
        pytest.skip("the test server must check passwords over TCP")
    with pytest.raises(StoreError, match="refused the credentials") as info:
        SQLStore(url.render_as_string(hide_password=False), lock_timeout_s=30.0)
    assert "wrong-password" not in str(info.value) and ":***@" in str(info.value)


def test_opening_an_up_to_date_store_takes_no_write_lock(tmp_path):
    """A writer holds the lock: opening still works, and names the real wait once there is work to do."""
    path = tmp_path / "s.sqlite"
    SQLStore(path).close()
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with SQLStore(path, lock_timeout_s=0.3) as store:  # reads only
            assert store.list_trials() == []
            with pytest.raises(StoreError, match=r"stayed locked for 0\.[3-9] s \(limit 0\.3 s; write"):
                store.create_trial("j", 8)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    json_path = tmp_path / "s.json"
    JSONStore(json_path).close()
    with FileLock(f"{json_path}.lock"):
        with JSONStore(json_path, lock_timeout_s=0.3) as store:
            assert store.list_trials() == []
            with pytest.raises(StoreError, match=r"stayed locked for 0\.[3-9] s"):
                store.create_trial("j", 8)


def _open_new_store(path: str, barrier, errors) -> None:
    try:
        barrier.wait(30)
        SQLStore(path).close()
    except BaseException as exc:
        errors.put(f"{type(exc).__name__}: {exc}")
        raise


@pytest.mark.skipif(sys.platform == "win32", reason="fork")
def test_sixteen_processes_opening_a_new_sqlite_store_at_once_all_succeed(tmp_path):
    for attempt in range(3):  # the race needs the openers to collide: a few rounds of it
        path = str(tmp_path / f"new{attempt}.sqlite")
        # forkserver: the openers do not inherit this process's threads (a lock held by one of them
        # at fork time once hung a child in sqlite3.connect, and the hung child blocked pytest's exit)
        ctx = multiprocessing.get_context("forkserver")
        barrier, errors = ctx.Barrier(16), ctx.Queue()
        procs = [ctx.Process(target=_open_new_store, args=(path, barrier, errors)) for _ in range(16)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        for p in procs:
            if p.is_alive():  # a hung opener fails the test instead of hanging the run
                p.kill()
                p.join()
        problems = [errors.get() for _ in range(errors.qsize())] if not errors.empty() else []
        assert [p.exitcode for p in procs] == [0] * 16, problems
        conn = sqlite3.connect(path)
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        conn.close()


MOUNTS = [  # as psutil.disk_partitions(all=True) gives the mount table (an escaped space already read as one)
    SimpleNamespace(mountpoint="/", fstype="ext4"),
    SimpleNamespace(mountpoint="/mnt/shared", fstype="nfs4"),
    SimpleNamespace(mountpoint="/mnt/my smb", fstype="cifs"),
    SimpleNamespace(mountpoint="/scratch", fstype="lustre"),
]


def test_network_filesystems_are_told_from_the_mount_table():
    assert netfs.filesystem_type("/mnt/shared/runs/zeus_store.sqlite", MOUNTS) == "nfs4"
    assert netfs.is_network_filesystem("/mnt/my smb/store.json", MOUNTS)
    assert netfs.is_network_filesystem("/scratch/u/store.sqlite", MOUNTS)
    assert not netfs.is_network_filesystem("/home/u/store.sqlite", MOUNTS)
    assert not netfs.is_network_filesystem("/mnt/sharedother/store.sqlite", MOUNTS)  # a prefix is not a parent


def test_a_store_on_a_network_filesystem_avoids_wal_and_fcntl_locks(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(netfs, "is_network_filesystem", lambda path, mounts=None: True)
    monkeypatch.setattr(netfs, "filesystem_type", lambda path, mounts=None: "nfs4")
    with caplog.at_level(logging.WARNING, logger="zeus_callbacks.store._netfs"):
        with SQLStore(tmp_path / "n.sqlite") as store:
            store.create_trial("j", 8, pid=1)
        with JSONStore(tmp_path / "n.json") as store:
            store.create_trial("j", 8, pid=1)
            assert isinstance(store._lock, SoftFileLock)
    conn = sqlite3.connect(tmp_path / "n.sqlite")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    conn.close()
    assert not (tmp_path / "n.sqlite-wal").exists()
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2 and all("network filesystem (nfs4)" in w and "store.url" in w for w in warnings)
    monkeypatch.undo()
    with JSONStore(tmp_path / "local.json") as local:  # a local disk keeps the fcntl lock
        assert isinstance(local._lock, FileLock) and not isinstance(local._lock, SoftFileLock)


def test_a_retried_store_operation_raises_no_deprecation_warning():
    # tenacity 9.2 deprecated wait_exponential_jitter(initial=...): under -W error a run's first store
    # retry then failed the run (an outside tester). Two transient failures, then success, warnings as errors.
    import warnings

    from zeus_callbacks.store._base import retry_transient

    calls = []

    def attempt() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise TimeoutError("held")
        return "done"

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert retry_transient(attempt, 5.0, lambda exc: isinstance(exc, TimeoutError)) == "done"
    assert len(calls) == 3
