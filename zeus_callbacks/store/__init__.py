"""Persistent store of recurring jobs (trials, bandit state, power-limit profiles).

Example:
    >>> from zeus_callbacks.store import open_store
    >>> store = open_store("runs/zeus_store.sqlite")  # doctest: +SKIP
    >>> store = open_store("postgresql://zeus:secret@db.cluster/zeus")  # doctest: +SKIP
    >>> trial = store.create_trial("nightly", batch_size=256)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from zeus_callbacks.errors import StoreValueError
from zeus_callbacks.store._base import (
    DEFAULT_LEASE_GRACE_S,
    SCHEMA_VERSION,
    BanditState,
    JobRecord,
    Store,
    StoreCorruptError,
    StoreError,
    StoreSchemaError,
    TrialRecord,
    mask_url,
)

if TYPE_CHECKING:
    from zeus_callbacks.store._stored_records import Snapshot

__all__ = [
    "DEFAULT_LEASE_GRACE_S",
    "SCHEMA_VERSION",
    "BanditState",
    "JobRecord",
    "Store",
    "StoreCorruptError",
    "StoreError",
    "StoreSchemaError",
    "TrialRecord",
    "copy_store",
    "is_url",
    "open_configured_store",
    "open_store",
    "store_location",
]


def is_url(location: str | Path) -> bool:
    """True when ``location`` is a database URL (``scheme://…``) rather than a store file."""
    return isinstance(location, str) and "://" in location


def store_location(path: str | Path) -> str:
    """The :attr:`Store.location` that :func:`open_store` gives the store at ``path``, without opening it.

    The file, or a database URL with its password masked (never the password: it names the
    store in messages and in pending-trial files).

    Raises:
        ValueError: A ``sqlite://`` URL of no file.
    """
    if is_url(path):
        url = str(path)
        if url.split("://", 1)[0].lower() == "sqlite":
            from zeus_callbacks.store._sql_store import sqlite_url_file

            return str(Path(sqlite_url_file(url)))
        return mask_url(url)
    return str(Path(path))


def open_store(
    path: str | Path,
    backend: Literal["sqlite", "json"] | None = None,
    *,
    read_only: bool = False,
    lease_grace_s: float = DEFAULT_LEASE_GRACE_S,
    lock_timeout_s: float = 30.0,
) -> Store:
    """Open (or create) a store file, or a store in a database.

    Args:
        path: The store file, or a database URL: ``sqlite:///path`` (the built-in SQLite
            store on ``path``: ``sqlite:////abs/path`` for an absolute one),
            ``postgresql://user:password@host/db``, ``mysql://…`` or any SQLAlchemy URL
            (:class:`~zeus_callbacks.store._sql_store.SQLStore`; PostgreSQL's driver comes with
            ``zeus-callbacks[postgres]``).
        backend: For a file: ``"sqlite"`` or ``"json"``; None: ``_json_store`` for a ``.json`` file,
            else ``sqlite``. Ignored for a URL.
        read_only: Read an existing store without creating or changing any file (``show``,
            ``plot bandit``); a missing, empty or non-store file raises :class:`StoreError`.
        lease_grace_s: Grace period (s) of a running trial's lease: a running trial of another
            host whose heartbeat is older is marked failed on open (see :class:`Store`).
        lock_timeout_s: How long (s) an operation waits for another process's lock (JSON),
            write transaction (SQLite) or a transient database error (retried) before it raises.

    Returns:
        The open store; close it (or use it as a context manager) when done.

    Raises:
        StoreCorruptError: The file exists but is not a readable store.
        StoreSchemaError: The file was written by a newer zeus-callbacks.
        StoreError: The file cannot be opened (a directory; read-only: missing); a database
            URL without its driver installed, refused credentials, an unreachable server.
        ValueError: Unknown backend.
    """
    if is_url(path):  # a database, sqlite:///file included: the SQL store
        backend = "sqlite"
    else:
        path = Path(path)
        if backend is None:
            backend = "json" if path.suffix.lower() == ".json" else "sqlite"
    options: dict[str, Any] = {"read_only": read_only, "lease_grace_s": lease_grace_s, "lock_timeout_s": lock_timeout_s}
    if backend == "sqlite":
        from zeus_callbacks.store._sql_store import SQLStore

        return SQLStore(path, **options)
    if backend == "json":
        from zeus_callbacks.store._json_store import JSONStore

        return JSONStore(path, **options)
    raise ValueError(f"unknown store backend {backend!r}; use 'sqlite' or 'json'")


class StoreSettings(Protocol):
    """What :func:`open_configured_store` reads of a store section (``zeus_callbacks.config.StoreConfig``)."""

    backend: Literal["sqlite", "json"]
    lease_grace_s: float
    lock_timeout_s: float

    def location(self, log_dir: Path) -> str | Path:
        """The store file or URL."""
        ...


def open_configured_store(settings: StoreSettings, log_dir: str | Path, *, read_only: bool = False) -> Store:
    """Open the store a configuration's ``store`` section names (default ``<log_dir>/zeus_store.<backend>``).

    Called where a run (or a command) starts; the configuration itself opens nothing.

    Raises:
        StoreError: The store cannot be opened (see :func:`open_store`).
    """
    return open_store(
        settings.location(Path(log_dir)),
        settings.backend,
        read_only=read_only,
        lease_grace_s=settings.lease_grace_s,
        lock_timeout_s=settings.lock_timeout_s,
    )


def copy_store(
    source: str | Path, destination: str | Path, *, check: Callable[[Snapshot, str], None] | None = None
) -> tuple[int, int, int, int]:
    """Copy every record of one store into a new, empty one: between any two stores (SQLite, JSON, a database).

    The source is opened read-only; the destination (created when missing; its kind from its
    suffix or URL, as :func:`open_store` picks it) takes everything in one write: trial ids,
    times, leases and bandit versions are kept.

    Args:
        source: The store to read (a file or a database URL).
        destination: The store to write; it must hold no job yet.
        check: Called with the source's records and its location before the destination is opened;
            the error it raises refuses the copy (``zeus-callbacks store copy`` checks the bandit states
            as ``show`` reads them).

    Returns:
        How many jobs, trials, bandit states and profiles were copied.

    Raises:
        StoreError: Either store cannot be opened, or the destination holds jobs already
            (nothing was written).
        StoreCorruptError: ``check`` refused a record (nothing was written).
        StoreValueError: A record of the source cannot be stored (a non-finite number): named as the
            source's, and a destination file the copy created is removed.
    """
    from zeus_callbacks.store._base import snapshot

    with open_store(source, read_only=True) as src:
        records = snapshot(src)
        if check is not None:
            check(records, src.location)
    created = None if is_url(destination) or Path(destination).exists() else Path(destination)
    try:
        with open_store(destination) as dst:
            dst.import_records(records)
    except StoreValueError as exc:  # raised by the destination's checks, but the record is the source's
        _remove_created(created)
        raise StoreValueError(
            f"not copied, nothing was written to {store_location(destination)}: a record of "
            f"{store_location(source)} cannot be stored ({exc})"
        ) from exc
    except BaseException:
        _remove_created(created)
        raise
    return len(records.jobs), len(records.trials), len(records.bandits), len(records.profiles)


def _remove_created(path: Path | None) -> None:
    """Remove a store file a failed copy created (with SQLite's side files): "nothing was written" holds."""
    if path is None:
        return
    for leftover in (path, *(path.with_name(path.name + end) for end in ("-journal", "-wal", "-shm", ".lock"))):
        leftover.unlink(missing_ok=True)
