"""The lease owner token, and the lease keeper: one daemon thread per process renews its running trials' leases.

A trial created for this process (:meth:`Store.create_trial` without another ``pid``) is *held* here
until it is finished; every :func:`heartbeat_interval_s` the thread sets its ``heartbeat_at`` through a
store object of its own (so the caller may close its store while the trial runs, and a heartbeat never
waits behind the caller's transactions). When the process dies the heartbeats stop, and after the grace
period any process that opens the store, on any node, marks the trial failed.

The keeper opens its store object (:meth:`Store.reopen`) at the first renewal and reuses it until the last
lease in that store is released (then closed) or a renewal fails (closed, opened afresh at the next try): an
open costs far more than a renewal (a connection and its password handshake, the schema check, the scan
for dead trials: ``benchmarks/lease_renewal.py``). Reuse is safe: only the keeper thread uses the handle,
and between renewals it is an idle connection, holding no transaction or lock. A forked child starts with
no leases and opens handles of its own; its parent's stay referenced there, never closed
(:attr:`LeaseKeeper._inherited`): closing a connection inherited across ``fork`` can end the parent's
database session (a driver sends its goodbye on the shared socket), and SQLite forbids using one in a child.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

logger = logging.getLogger(__name__)


def this_host() -> str:
    """This machine's host name, as trials record it."""
    return socket.gethostname()


_OWNER: tuple[int, str] | None = None  # (pid, token): a forked child makes its own


def lease_owner() -> str:
    """This process's lease owner token, ``host:pid:random`` (new in a forked child)."""
    global _OWNER
    pid = os.getpid()
    if _OWNER is None or _OWNER[0] != pid:
        _OWNER = (pid, f"{this_host()}:{pid}:{uuid.uuid4().hex[:12]}")
    return _OWNER[1]


def heartbeat_interval_s(lease_grace_s: float) -> float:
    """How often an owner renews its leases (s): a fifth of the grace period, at most 30 s."""
    return min(30.0, float(lease_grace_s) / 5.0)


class LeaseStore(Protocol):
    """What the keeper needs of a store: its lease methods (the Store contract, above this module, has them)."""

    @property
    def location(self) -> str: ...

    lease_grace_s: float

    def reopen(self) -> LeaseStore | None: ...

    def renew_leases(self, owner: str, trial_ids: set[int]) -> set[int]: ...

    def close(self) -> None: ...


@dataclass
class _Held:
    """The leases this process holds in one store."""

    opener: Callable[[], LeaseStore | None]
    interval_s: float
    due_at: float  # time.monotonic() of the next renewal
    trial_ids: set[int] = field(default_factory=set)
    failing: bool = False  # a renewal failed: warn once until one succeeds
    store: LeaseStore | None = None  # the keeper's own handle: opened at the first renewal, reused, closed at release


class LeaseKeeper:
    """Renews this process's leases in the background (see the module docstring)."""

    def __init__(self) -> None:
        self._inherited: list[LeaseStore] = []  # a forked child's copies of its parent's handles: never used or closed
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._held: dict[str, _Held] = {}
        self._thread: threading.Thread | None = None

    def _after_fork_in_child(self) -> None:
        """A forked child: no leases, and its parent's handles kept referenced, never closed (module docstring)."""
        self._inherited.extend(h.store for h in self._held.values() if h.store is not None)
        self._reset()

    def hold(self, store: LeaseStore, trial_id: int) -> None:
        """Keep renewing ``trial_id``'s lease in ``store`` (its file or database) until :meth:`release`."""
        interval_s = heartbeat_interval_s(store.lease_grace_s)
        with self._lock:
            held = self._held.get(store.location)
            if held is None:
                held = self._held[store.location] = _Held(store.reopen, interval_s, time.monotonic() + interval_s)
            if interval_s < held.interval_s:
                held.interval_s = interval_s
                held.due_at = min(held.due_at, time.monotonic() + interval_s)
            held.trial_ids.add(int(trial_id))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="zeus-callbacks-lease-keeper", daemon=True)
                self._thread.start()
            self._wake.notify()

    def release(self, store: LeaseStore, trial_id: int) -> None:
        """Stop renewing ``trial_id``'s lease (it was finished); the last one of a store closes the keeper's handle.

        The handle is closed by the keeper thread, woken here, so this never waits for a renewal.
        """
        with self._lock:
            held = self._held.get(store.location)
            if held is not None:
                held.trial_ids.discard(int(trial_id))
                if not held.trial_ids:
                    self._wake.notify()

    def release_all(self, wait_s: float = 5.0) -> None:
        """Stop renewing every lease this process holds; the keeper thread closes its handles and ends.

        For a process that hands its trials over, and for test suites that leave trials running.

        Args:
            wait_s: How long (s) to wait for the thread to close its handles and end (a renewal in
                progress finishes first); 0: do not wait. Afterwards no keeper thread is inside a
                store, so a ``fork`` cannot copy one mid-call.
        """
        with self._lock:
            for held in self._held.values():
                held.trial_ids.clear()
            self._wake.notify()
            thread = self._thread
        if thread is not None and wait_s > 0 and thread is not threading.current_thread():
            thread.join(wait_s)

    def held(self) -> dict[str, set[int]]:
        """Store location → the trial ids whose leases this process renews (a copy)."""
        with self._lock:
            return {key: set(h.trial_ids) for key, h in self._held.items() if h.trial_ids}

    def _run(self) -> None:
        while True:
            with self._lock:
                released = [self._held.pop(k) for k in [k for k, h in self._held.items() if not h.trial_ids]]
                if not self._held:
                    self._thread = None  # a hold() from now on starts a new thread (with handles of its own)
                due: list[tuple[str, _Held, set[int]]] = []
                if self._held and not released:
                    wait_s = min(h.due_at for h in self._held.values()) - time.monotonic()
                    if wait_s > 0:
                        self._wake.wait(wait_s)
                        continue  # re-read: a hold or release may have changed what is due
                    for key, held in self._held.items():
                        if held.trial_ids and held.due_at <= time.monotonic():
                            held.due_at = time.monotonic() + held.interval_s
                            due.append((key, held, set(held.trial_ids)))
                ending = not self._held
            for held in released:  # outside the lock, like the renewals: release() never waits for a close
                self._close(held)
            if ending:
                return
            for key, held, trial_ids in due:  # outside the lock: a finish_trial never waits for a renewal
                self._renew(key, held, trial_ids)

    @staticmethod
    def _close(held: _Held) -> None:
        store, held.store = held.store, None
        if store is not None:
            try:
                store.close()
            except Exception as exc:  # a connection already broken: nothing left to release
                logger.debug("zeus-callbacks: closing the lease keeper's store %s: %s", store.location, exc)

    def _renew(self, key: str, held: _Held, trial_ids: set[int]) -> None:
        """One renewal of one store's leases, through the keeper's handle (opened now if it has none)."""
        try:
            if held.store is None:
                held.store = held.opener()
            store = held.store  # None: the store file is gone, nothing left to renew
            kept = set() if store is None else store.renew_leases(lease_owner(), trial_ids)
        except Exception as exc:  # the store is down or locked: try again next interval, on a fresh handle
            self._close(held)
            if not held.failing:
                logger.warning(
                    "zeus-callbacks: cannot renew the lease of trial(s) %s in %s: %s (retrying every %.3g s)",
                    sorted(trial_ids),
                    key,
                    exc,
                    held.interval_s,
                )
            held.failing = True
            return
        held.failing = False
        with self._lock:
            lost = (trial_ids - kept) & held.trial_ids  # not released meanwhile: really lost
            held.trial_ids -= lost
        if lost and store is not None:
            logger.warning(
                "zeus-callbacks: trial(s) %s in %s are no longer running under this process's lease "
                "(finished elsewhere, or marked failed after a missed heartbeat)",
                sorted(lost),
                key,
            )


KEEPER = LeaseKeeper()
"""The process's lease keeper."""

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=KEEPER._after_fork_in_child)
