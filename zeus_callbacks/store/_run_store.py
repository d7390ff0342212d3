"""The store of one run: opened once, on first use, and shared by everything in the run that uses it.

The batch-size controller and the power-limit profile cache (``power_limit.cache_in: store``) take the
store from one :class:`RunStore`, so a run pays for one open (one schema check, one scan for dead trials,
one merge of waiting trials, one connection pool) instead of one per call. An open that fails is not
retried within the run: every later use raises the same error at once, so a database that is down at run
start costs ``store.lock_timeout_s`` once, not at every step that would use it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from zeus_callbacks.errors import StoreError
from zeus_callbacks.store._base import Store


class RunStore:
    """One run's store handle (see the module docstring).

    Args:
        opener: Opens the store (e.g. :func:`~zeus_callbacks.optimizers.batch_size.open_job_store`);
            called at most once per run, on the first :meth:`get`.

    Example:
        >>> run_store = RunStore(lambda: open_store("runs/zeus_store.sqlite"))  # doctest: +SKIP
        >>> run_store.get().list_trials("nightly")                             # doctest: +SKIP
        >>> run_store.close()                                                  # doctest: +SKIP
    """

    def __init__(self, opener: Callable[[], Store]) -> None:
        self._opener = opener
        self._lock = threading.Lock()
        self._store: Store | None = None
        self._failure: StoreError | None = None

    def get(self) -> Store:
        """The run's open store, opened now if this is the first use.

        Raises:
            StoreError: The open failed (now, or at an earlier call of this run: the same error
                again, without another attempt).
        """
        with self._lock:
            if self._store is None:
                if self._failure is not None:
                    raise self._failure
                try:
                    self._store = self._opener()
                except StoreError as exc:
                    self._failure = exc
                    raise
            return self._store

    def adopt(self, store: Store) -> None:
        """Make ``store`` (opened before the run, by ``suggest_batch_size()``) the run's store.

        Closes ``store`` instead when the run already has one open.
        """
        with self._lock:
            if self._store is None and self._failure is None:
                self._store = store
                return
        store.close()

    def close(self) -> None:
        """Close the store (idempotent); a later :meth:`get` opens it afresh, for another run."""
        with self._lock:
            store, self._store, self._failure = self._store, None, None
        if store is not None:
            store.close()
