"""The lease keeper renews through one store handle per store, kept between renewals and closed at release.

Real stores, a real keeper thread, a short grace period (0.25 s: one renewal every 0.05 s). The
handles the keeper opens are the objects ``Store.reopen`` returns; the tests track them by
wrapping the backend's ``reopen`` and ``close``:

- many renewals, one open; the handle is closed once the last lease is released;
- a renewal that fails (the store locked past its timeout) closes its handle; the next renewal
  opens a fresh one, and heartbeats resume once the lock is gone;
- a forked child starts with no leases and renews its own trial through a handle of its own,
  without closing its parent's (which survives garbage collection in the child), while the
  parent's renewals go on through the handle it had.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sqlite3
import time
import weakref

import pytest
from filelock import FileLock

from tests.store_contract import _open, new_location
from zeus_callbacks.store import Store
from zeus_callbacks.store._lease import KEEPER

GRACE_S = 0.25  # renewals every 0.05 s


class _Handles:
    """The store objects ``reopen`` made (the keeper's handles) and which of them were closed."""

    def __init__(self, monkeypatch, store: Store) -> None:
        self.opened: list[weakref.ref] = []
        self.closed: weakref.WeakSet[Store] = weakref.WeakSet()
        cls = type(store)
        reopen, close = cls.reopen, cls.close

        def tracked_reopen(s):
            handle = reopen(s)
            if handle is not None:
                self.opened.append(weakref.ref(handle))
            return handle

        def tracked_close(s):
            self.closed.add(s)
            close(s)

        monkeypatch.setattr(cls, "reopen", tracked_reopen)
        monkeypatch.setattr(cls, "close", tracked_close)

    def open_now(self) -> list[Store]:
        """The keeper's handles not closed yet."""
        return [h for h in (r() for r in self.opened) if h is not None and h not in self.closed]


def _wait_for(predicate, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def _renewed(store: Store, trial_id: int, times: int, timeout_s: float = 20.0) -> bool:
    """Whether the trial's heartbeat moves on ``times`` times within ``timeout_s`` (read through ``store``)."""
    seen: set[float | None] = set()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen.add(store.get_trial(trial_id).heartbeat_at)
        if len(seen) > times:
            return True
        time.sleep(0.01)
    return False


@pytest.mark.parametrize("kind", ["sqlite", "json", "rdb-sqlite", "postgresql"])
def test_renewals_share_one_handle_closed_when_the_last_lease_is_released(tmp_path, monkeypatch, kind):
    location = new_location(kind, tmp_path)
    store = _open(kind, location, lease_grace_s=GRACE_S)
    try:
        handles = _Handles(monkeypatch, store)
        first = store.create_trial("j", 8)
        second = store.create_trial("j", 16)
        assert _renewed(store, first.trial_id, 5)  # five renewals at least
        assert store.get_trial(second.trial_id).heartbeat_at > second.started_at  # renewed with it
        assert len(handles.opened) == 1 and len(handles.open_now()) == 1  # one open for all of them
        store.finish_trial(first.trial_id, status="completed", energy_J=1.0, time_s=1.0, cost=1.0, converged=True)
        assert _renewed(store, second.trial_id, 2) and len(handles.opened) == 1  # the same handle goes on
        store.finish_trial(second.trial_id, status="completed", energy_J=1.0, time_s=1.0, cost=1.0, converged=True)
        assert _wait_for(lambda: handles.open_now() == [], 5.0)  # the last release closes it (not the next renewal)
        assert KEEPER.held() == {}
    finally:
        store.close()


def _locked(kind: str, location: str):
    """Hold the store the way another writer does (a SQLite write transaction, the JSON lock file)."""
    if kind == "sqlite":
        conn = sqlite3.connect(location, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        return lambda: (conn.execute("ROLLBACK"), conn.close())
    lock = FileLock(location + ".lock")
    lock.acquire()
    return lock.release


@pytest.mark.parametrize("kind", ["sqlite", "json"])
def test_a_failed_renewal_closes_its_handle_and_the_next_opens_a_fresh_one(tmp_path, monkeypatch, kind, caplog):
    location = new_location(kind, tmp_path)
    store = _open(kind, location, lease_grace_s=GRACE_S, lock_timeout_s=0.1)
    try:
        handles = _Handles(monkeypatch, store)
        trial = store.create_trial("j", 8)
        assert _renewed(store, trial.trial_id, 2) and len(handles.opened) == 1
        with caplog.at_level(logging.WARNING, logger="zeus_callbacks.store._lease"):
            unlock = _locked(kind, location)
            try:  # each renewal waits 0.1 s for the lock, fails, and closes its handle
                assert _wait_for(lambda: len(handles.opened) >= 3, 20.0)
                assert len(handles.open_now()) <= 1  # at most the one of the renewal in progress
            finally:
                unlock()
            assert _renewed(store, trial.trial_id, 2)  # heartbeats resume, on a fresh handle
        warnings = [r.getMessage() for r in caplog.records if "cannot renew the lease" in r.getMessage()]
        assert len(warnings) == 1 and location in warnings[0]  # once, until a renewal succeeds
        assert len(handles.open_now()) == 1
        opened = len(handles.opened)
        assert _renewed(store, trial.trial_id, 3) and len(handles.opened) == opened  # kept again
    finally:
        store.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="POSIX fork")
def test_a_forked_child_renews_through_its_own_handle_and_leaves_its_parents(tmp_path, monkeypatch):
    grace_s = 1.0  # one renewal every 0.2 s: the fork, right after one, lands between two
    location = new_location("sqlite", tmp_path)
    store = _open("sqlite", location, lease_grace_s=grace_s)
    try:
        handles = _Handles(monkeypatch, store)
        mine = store.create_trial("j", 8)
        assert _renewed(store, mine.trial_id, 2) and len(handles.opened) == 1
        parents = handles.opened[0]
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                gc.collect()  # the parent's handle must survive collection here: it is not ours to close
                ok = KEEPER.held() == {} and parents() is not None and parents() not in handles.closed
                with _open("sqlite", location, lease_grace_s=grace_s) as child_store:
                    child_trial = child_store.create_trial("j", 16)
                    ok = ok and _renewed(child_store, child_trial.trial_id, 2)
                    ok = ok and len(handles.opened) == 2 and handles.opened[1]() is not parents()
                    child_store.finish_trial(
                        child_trial.trial_id, status="completed", energy_J=1.0, time_s=1.0, cost=1.0, converged=True
                    )
                KEEPER.release_all()
                code = 0 if ok else 2
            finally:
                os.write(wfd, str(code).encode())
                os._exit(code)
        os.close(wfd)
        deadline, status = time.monotonic() + 60.0, None
        while status is None and time.monotonic() < deadline:  # a child that hangs fails the test, not the suite
            done, code = os.waitpid(pid, os.WNOHANG)
            status = code if done else None
            time.sleep(0.02)
        if status is None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        child_said = os.read(rfd, 16).decode()
        os.close(rfd)
        assert status is not None, "the forked child hung"
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (status, child_said)
        assert _renewed(store, mine.trial_id, 3)  # the parent's renewals go on, through the handle it had
        assert len(handles.opened) == 1 and handles.open_now() == [parents()]
    finally:
        store.close()
