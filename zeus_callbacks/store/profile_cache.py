"""The store as the power-limit profiler's profile cache.

The just-in-time power-limit profiler (``zeus_callbacks.optimizers.power_limit``) caches
its per-limit profiles behind a small ``get(key)`` / ``put(key, profile)`` protocol keyed
by a ``ProfileKey`` (anything with ``as_str()``). :class:`StoreProfileCache` implements
that protocol on a :class:`~zeus_callbacks.store.base.Store` file, so profiles live next to
the batch-size bandit's trials, with the store's locking, crash safety and errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from zeus_callbacks.store import DEFAULT_LEASE_GRACE_S, is_url, open_store


def _key_str(key: Any) -> str:
    as_str = getattr(key, "as_str", None)
    return as_str() if callable(as_str) else str(key)


class StoreProfileCache:
    """Power-limit profiles in a store (opened per call: profiles are read and written rarely).

    Args:
        path: The store file, or a database URL (see :func:`~zeus_callbacks.store.open_store`).
        backend: ``"sqlite"`` or ``"json"``; None: from the file's suffix.
        lease_grace_s: The store's lease grace period (s), as every opener of the store should use.

    Raises:
        StoreCorruptError: On :meth:`get`/:meth:`put`, when the file is not a readable store.

    Example:
        >>> cache = StoreProfileCache("runs/zeus_store.sqlite")  # doctest: +SKIP
        >>> cache.put(key, {"limits_W": [200.0, 300.0], "time_s": [1.2, 1.0]})  # doctest: +SKIP
    """

    def __init__(
        self,
        path: str | Path,
        backend: Literal["sqlite", "json"] | None = None,
        *,
        lease_grace_s: float = DEFAULT_LEASE_GRACE_S,
    ) -> None:
        self.path: str | Path = str(path) if is_url(path) else Path(path)
        self.backend = backend
        self.lease_grace_s = lease_grace_s

    def get(self, key: Any) -> dict[str, Any] | None:
        """The profile stored under ``key`` (``key.as_str()``, else ``str(key)``), or None."""
        with open_store(self.path, self.backend, lease_grace_s=self.lease_grace_s) as store:
            return store.get_profile(_key_str(key))

    def put(self, key: Any, profile: dict[str, Any]) -> None:
        """Store ``profile`` (JSON-serialisable) under ``key``, replacing any earlier one."""
        with open_store(self.path, self.backend, lease_grace_s=self.lease_grace_s) as store:
            store.put_profile(_key_str(key), profile)
