"""The lease keeper: one daemon thread per process renews the leases of its running trials.

A trial created for this process (:meth:`Store.create_trial` without another ``pid``) is
*held* here until it is finished; every :func:`~zeus_callbacks.store.base.heartbeat_interval_s`
the thread sets its ``heartbeat_at`` through a store object of its own (so the caller may
close its store while the trial runs). When the process dies the heartbeats stop, and after
the grace period any process that opens the store, on any node, marks the trial failed.

The keeper is process-global and fork-aware: a forked child starts with no leases (it
owns none of its parent's trials) and starts its own thread when it creates a trial.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from zeus_callbacks.store.base import Store, heartbeat_interval_s, lease_owner

logger = logging.getLogger(__name__)


@dataclass
class _Held:
    """The leases this process holds in one store."""

    opener: Callable[[], Store | None]
    interval_s: float
    due_at: float  # time.monotonic() of the next renewal
    trial_ids: set[int] = field(default_factory=set)
    failing: bool = False  # a renewal failed: warn once until one succeeds


class LeaseKeeper:
    """Renews this process's leases in the background (see the module docstring).

    Each renewal opens the store, renews and closes it again: between renewals the keeper
    holds no connection, file or lock.
    """

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._held: dict[str, _Held] = {}
        self._thread: threading.Thread | None = None

    def hold(self, store: Store, trial_id: int) -> None:
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

    def release(self, store: Store, trial_id: int) -> None:
        """Stop renewing ``trial_id``'s lease (it was finished)."""
        with self._lock:
            held = self._held.get(store.location)
            if held is not None:
                held.trial_ids.discard(int(trial_id))

    def release_all(self) -> None:
        """Stop renewing every lease this process holds (the keeper thread then ends).

        For a process that hands its trials over, and for test suites that leave trials running.
        """
        with self._lock:
            for held in self._held.values():
                held.trial_ids.clear()
            self._wake.notify()

    def held(self) -> dict[str, set[int]]:
        """Store location → the trial ids whose leases this process renews (a copy)."""
        with self._lock:
            return {key: set(h.trial_ids) for key, h in self._held.items() if h.trial_ids}

    def _run(self) -> None:
        while True:
            with self._lock:
                for key in [k for k, h in self._held.items() if not h.trial_ids]:
                    del self._held[key]
                if not self._held:
                    self._thread = None
                    return
                wait_s = min(h.due_at for h in self._held.values()) - time.monotonic()
                if wait_s > 0:
                    self._wake.wait(wait_s)
                    continue  # re-read: a hold or release may have changed what is due
                due = []
                for key, held in self._held.items():
                    if held.trial_ids and held.due_at <= time.monotonic():
                        held.due_at = time.monotonic() + held.interval_s
                        due.append((key, held, set(held.trial_ids)))
            for key, held, trial_ids in due:  # outside the lock: a finish_trial never waits for a renewal
                self._renew(key, held, trial_ids)

    def _renew(self, key: str, held: _Held, trial_ids: set[int]) -> None:
        """One renewal of one store's leases: open, renew, close."""
        try:
            store = held.opener()
            if store is None:  # the store file is gone: nothing left to renew
                kept: set[int] = set()
            else:
                with store:
                    kept = store.renew_leases(lease_owner(), trial_ids)
        except Exception as exc:  # the store is down or locked: try again next interval
            if not held.failing:
                logger.warning("zeus-callbacks: cannot renew the lease of trial(s) %s in %s: %s (retrying every "
                               "%.0f s)", sorted(trial_ids), key, exc, held.interval_s)
            held.failing = True
            return
        held.failing = False
        with self._lock:
            lost = (trial_ids - kept) & held.trial_ids  # not released meanwhile: really lost
            held.trial_ids -= lost
        if lost and store is not None:
            logger.warning("zeus-callbacks: trial(s) %s in %s are no longer running under this process's lease "
                           "(finished elsewhere, or marked failed after a missed heartbeat)", sorted(lost), key)


KEEPER = LeaseKeeper()
"""The process's lease keeper."""

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=KEEPER._reset)
