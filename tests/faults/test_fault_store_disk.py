"""Disk full and permission errors on a store are named as such (StoreFullError, StorePermissionError).

- SQLite's own "database or disk is full" (a real SQLITE_FULL, provoked with ``max_page_count``
  on the store's connection) is a :class:`StoreFullError`, not a corrupt store, and the
  transaction is rolled back;
- the JSON store whose new document cannot be written (``ENOSPC`` from the disk at ``fsync``: the
  one faked part, the hardware) is a :class:`StoreFullError` and the old file is intact with no
  temporary file left; an ``EACCES`` is a :class:`StorePermissionError`;
- the translation itself, for each errno.
"""

from __future__ import annotations

import errno
import os

import pytest
import sqlalchemy

from zeus_callbacks import _atomic_io as atomic_io
from zeus_callbacks.errors import StoreError, StoreFullError, StorePermissionError
from zeus_callbacks.store import open_store
from zeus_callbacks.store._base import os_error


def test_sqlite_disk_full_is_named_and_rolled_back(tmp_path, record_fault):
    path = tmp_path / "s.sqlite"
    with open_store(path) as store:
        store.create_trial("job", 8)
        engine = store._engine  # noqa: SLF001 - the real SQLite limit, on every connection of the store
        with engine.connect() as conn:
            pages = conn.exec_driver_sql("PRAGMA page_count").scalar()

        def no_page_more(dbapi_conn, _record) -> None:  # SQLITE_FULL at the next page
            dbapi_conn.execute(f"PRAGMA max_page_count = {pages}")

        sqlalchemy.event.listen(engine, "connect", no_page_more)
        engine.dispose()  # the pooled connections go: the next ones are limited
        with pytest.raises(StoreFullError, match="full") as info:
            for i in range(2000):
                store.put_profile(f"k{i}", {"limits_W": list(range(200))})
        full_at = i
        sqlalchemy.event.remove(engine, "connect", no_page_more)
        engine.dispose()
        kept = store.list_profiles()
    ok = str(path) in str(info.value) and len(kept) == full_at and "corrupt" not in str(info.value)
    record_fault("store: disk full", ok)
    assert ok, (str(info.value), full_at, len(kept))


@pytest.mark.parametrize(("code", "error"), [(errno.ENOSPC, StoreFullError), (errno.EACCES, StorePermissionError)])
def test_json_write_error_is_named_and_the_old_file_kept(tmp_path, monkeypatch, code, error, record_fault):
    path = tmp_path / "s.json"
    with open_store(path) as store:
        store.create_trial("job", 8)
        before = path.read_bytes()

        def disk_fails(fd: int) -> None:
            raise OSError(code, os.strerror(code))

        monkeypatch.setattr(atomic_io.os, "fsync", disk_fails)
        with pytest.raises(error) as info:
            store.create_trial("job", 16)
        monkeypatch.undo()
        left = sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp"))
        trials = store.list_trials()
    ok = str(path) in str(info.value) and path.read_bytes() == before and left == [] and len(trials) == 1
    record_fault("store: disk full" if code == errno.ENOSPC else "store: permission", ok)
    assert ok, (str(info.value), left, trials)


@pytest.mark.parametrize(
    ("code", "error"),
    [
        (errno.ENOSPC, StoreFullError),
        (errno.EDQUOT, StoreFullError),
        (errno.EACCES, StorePermissionError),
        (errno.EPERM, StorePermissionError),
        (errno.EROFS, StorePermissionError),
        (errno.EIO, StoreError),
    ],
)
def test_os_errors_are_translated_by_errno(code, error):
    got = os_error(OSError(code, os.strerror(code), "/x/store.json"), "/x/store.json", "write")
    assert type(got) is error and "/x/store.json" in str(got)


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write a read-only directory: nothing to refuse")
def test_a_read_only_directory_is_a_permission_error(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(StorePermissionError, match="permission"):
            open_store(folder / "s.json")
    finally:
        folder.chmod(0o700)
