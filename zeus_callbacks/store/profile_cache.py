"""The store as the power-limit profiler's profile cache.

The just-in-time power-limit profiler (``zeus_callbacks.optimizers.power_limit``) caches
its per-limit profiles behind a small ``get(key)`` / ``put(key, profile)`` protocol keyed
by a ``ProfileKey`` (anything with ``as_str()``). :class:`StoreProfileCache` implements
that protocol on a :class:`~zeus_callbacks.store._base.Store` file, so profiles live next to
the batch-size bandit's trials, with the store's locking, crash safety and errors.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from zeus_callbacks.errors import StoreUnavailableError
from zeus_callbacks.store import DEFAULT_LEASE_GRACE_S, is_url, open_store
from zeus_callbacks.store._base import Store
from zeus_callbacks.store._run_store import RunStore

logger = logging.getLogger(__name__)


def _key_str(key: Any) -> str:
    as_str = getattr(key, "as_str", None)
    return as_str() if callable(as_str) else str(key)


class StoreProfileCache:
    """Power-limit profiles in a store: the run's shared store, or a store file opened per call.

    A store that cannot be reached now (:class:`~zeus_callbacks.errors.StoreUnavailableError`:
    locked, a database down) is a cache miss on :meth:`get` (the run profiles) and a profile not
    kept on :meth:`put`, each with a warning: the cache must never stop training.

    Args:
        path: The run's :class:`~zeus_callbacks.store._run_store.RunStore` (the session passes
            its own: one open per run), or a store file or database URL, opened and closed
            at each call (see :func:`~zeus_callbacks.store.open_store`).
        backend: For a file: ``"sqlite"`` or ``"json"``; None: from the file's suffix.
        lease_grace_s: For a file or URL: the store's lease grace period (s), as every opener
            of the store should use.

    Raises:
        StoreCorruptError: On :meth:`get`/:meth:`put`, when the file is not a readable store.

    Example:
        >>> cache = StoreProfileCache("runs/zeus_store.sqlite")  # doctest: +SKIP
        >>> cache.put(key, {"limits_W": [200.0, 300.0], "time_s": [1.2, 1.0]})  # doctest: +SKIP
    """

    def __init__(
        self,
        path: str | Path | RunStore,
        backend: Literal["sqlite", "json"] | None = None,
        *,
        lease_grace_s: float = DEFAULT_LEASE_GRACE_S,
    ) -> None:
        self.run_store = path if isinstance(path, RunStore) else None
        self.path = None if isinstance(path, RunStore) else str(path) if is_url(path) else Path(path)
        self.backend = backend
        self.lease_grace_s = lease_grace_s

    @contextmanager
    def _store(self) -> Iterator[Store]:
        if self.run_store is not None:
            yield self.run_store.get()  # the run's: it stays open
            return
        assert self.path is not None
        with open_store(self.path, self.backend, lease_grace_s=self.lease_grace_s) as store:
            yield store

    def get(self, key: Any) -> dict[str, Any] | None:
        """The profile stored under ``key`` (``key.as_str()``, else ``str(key)``), or None (also: store unavailable)."""
        try:
            with self._store() as store:
                return store.get_profile(_key_str(key))
        except StoreUnavailableError as exc:
            logger.warning("zeus-callbacks: cannot read the power-limit profile cache (%s); profiling", exc)
            return None

    def put(self, key: Any, profile: dict[str, Any]) -> None:
        """Store ``profile`` (JSON-serialisable) under ``key``, replacing any earlier one."""
        try:
            with self._store() as store:
                store.put_profile(_key_str(key), profile)
        except StoreUnavailableError as exc:
            logger.warning("zeus-callbacks: the power-limit profile for %s is not cached: %s", _key_str(key), exc)
