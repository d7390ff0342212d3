"""Persistent store of recurring jobs (trials, bandit state, power-limit profiles).

Example:
    >>> from zeus_callbacks.store import open_store
    >>> store = open_store("runs/zeus_store.sqlite")  # doctest: +SKIP
    >>> trial = store.create_trial("nightly", batch_size=256)  # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from zeus_callbacks.store.base import (
    SCHEMA_VERSION,
    BanditState,
    JobRecord,
    Store,
    StoreCorruptError,
    StoreError,
    StoreSchemaError,
    TrialRecord,
)

__all__ = [
    "SCHEMA_VERSION",
    "BanditState",
    "JobRecord",
    "Store",
    "StoreCorruptError",
    "StoreError",
    "StoreSchemaError",
    "TrialRecord",
    "open_store",
]


def open_store(
    path: str | Path, backend: Literal["sqlite", "json"] | None = None, *, read_only: bool = False
) -> Store:
    """Open (or create) a store file.

    Args:
        path: The store file.
        backend: ``"sqlite"`` or ``"json"``; None: ``json`` for a ``.json`` file, else ``sqlite``.
        read_only: Read an existing store without creating or changing any file (``show``,
            ``plot bandit``); a missing, empty or non-store file raises :class:`StoreError`.

    Returns:
        The open store; close it (or use it as a context manager) when done.

    Raises:
        StoreCorruptError: The file exists but is not a readable store.
        StoreSchemaError: The file was written by a newer zeus-callbacks.
        StoreError: The file cannot be opened (a directory; read-only: missing).
        ValueError: Unknown backend.
    """
    path = Path(path)
    if backend is None:
        backend = "json" if path.suffix.lower() == ".json" else "sqlite"
    if backend == "sqlite":
        from zeus_callbacks.store.sqlite import SQLiteStore

        return SQLiteStore(path, read_only=read_only)
    if backend == "json":
        from zeus_callbacks.store.json import JSONStore

        return JSONStore(path, read_only=read_only)
    raise ValueError(f"unknown store backend {backend!r}; use 'sqlite' or 'json'")
