"""Every error zeus-callbacks raises on purpose, under one root.

``except ZeusCallbacksError`` catches all of them. Each class also keeps the builtin base it
had before the root existed (``ValueError`` for bad input files and configurations,
``RuntimeError`` for backends and stores), so existing ``except ValueError`` / ``except
RuntimeError`` clauses keep working.

Hierarchy::

    ZeusCallbacksError
    ├── ConfigError (ValueError)          the configuration is invalid
    ├── NotAnEnergyLog (ValueError)       a file is not a JSONL energy log
    ├── NotAProfile (ValueError)          a file is not a power-profile JSON
    ├── NotAMarker (ValueError)           a file is not a power-limit restore marker
    ├── NothingToPlot (ValueError)        the input holds no data for the requested plot
    ├── TraceFormatError (ValueError)     a user trace CSV cannot be read or breaks the format
    ├── UnsafeFile (PermissionError)      a file is a symbolic link or another user's: not acted on
    ├── EnergyLogError (OSError)          the run's JSONL energy log cannot be created (logging.log_dir)
    ├── CallOrderError (RuntimeError)     a measure() call out of order (step_end without step_start)
    ├── BackendError (RuntimeError)       a GPU backend failed
    │   ├── BackendUnavailable, SensorError, NotSupported
    │   └── PermissionDenied
    │       └── ReadOnlyError
    └── StoreError (RuntimeError)         the recurring-job store failed
        ├── StoreCorruptError
        ├── StoreSchemaError
        ├── StoreUnavailableError         the store cannot be reached now (retried up to the lock timeout)
        │   └── StoreLockedError          another process held the store past the lock timeout
        ├── StoreFullError                no space left on the store's device (ENOSPC, EDQUOT)
        ├── StorePermissionError          the store file or its directory is not writable / readable
        └── StoreValueError (ValueError)  a value the store refuses to record (NaN, infinity)
"""

from __future__ import annotations


class ZeusCallbacksError(Exception):
    """Root of every error zeus-callbacks raises on purpose."""


class ConfigError(ZeusCallbacksError, ValueError):
    """The configuration is invalid; the message names the file and each bad field."""


class NotAnEnergyLog(ZeusCallbacksError, ValueError):
    """A file is not a zeus-callbacks JSONL energy log; the message names the file."""


class NotAProfile(ZeusCallbacksError, ValueError):
    """A file is not a power-profile JSON written by ``zeus-callbacks profile-kernel``; the message names the file."""


class NotAMarker(ZeusCallbacksError, ValueError):
    """A file at a restore marker's path is not a readable restore marker; it is kept untouched."""


class NothingToPlot(ZeusCallbacksError, ValueError):
    """The input (a store, a log) holds no data for the requested plot; the message names it."""


class TraceFormatError(ZeusCallbacksError, ValueError):
    """A trace file (a power-limit sweep, training paths) cannot be read or breaks the format.

    The message names the file and, for a bad value, the line and the column.
    """


class UnsafeFile(ZeusCallbacksError, PermissionError):
    """A file in a shared directory is a symbolic link or owned by another user; it is not read or acted on.

    See docs/shared-clusters.md#files-in-shared-directories.
    """


class EnergyLogError(ZeusCallbacksError, OSError):
    """The run's JSONL energy log cannot be created (``logging.log_dir`` not a writable directory).

    Raised at the run's start, before training; the message names the directory and why.
    """


class CallOrderError(ZeusCallbacksError, RuntimeError):
    """A :func:`~zeus_callbacks.measure` call came out of order; the message names the call and what was expected.

    For example ``step_end()`` without ``step_start()``, or ``step()`` outside the ``with`` block.
    """


class BackendError(ZeusCallbacksError, RuntimeError):
    """Base class of every error a GPU backend raises."""


class BackendUnavailable(BackendError):
    """The backend cannot be used here (library missing, no device, MIG, ...)."""


class SensorError(BackendError):
    """A sensor read failed (GPU lost, unknown error, counter went backwards).

    Attributes:
        kind: The failure's class (``"gpu_lost"``, ``"unknown"``, ...), for deciding whether to retry.
    """

    def __init__(self, message: str, kind: str = "unknown") -> None:
        super().__init__(message)
        self.kind = kind


class NotSupported(BackendError):
    """The device does not support this query or setting."""


class PermissionDenied(BackendError):
    """The caller may not change this setting (no root, or read-only mode)."""


class ReadOnlyError(PermissionDenied):
    """A setter was called while ``ZEUS_CALLBACKS_READ_ONLY=1`` is set."""


class StoreError(ZeusCallbacksError, RuntimeError):
    """Base class of every store error; the message names the store file."""


class StoreCorruptError(StoreError):
    """The store file cannot be read (not a store, truncated, bad JSON/SQLite). Never reset silently."""


class StoreSchemaError(StoreError):
    """The store was written by a newer zeus-callbacks (a schema version this code does not know)."""


class StoreUnavailableError(StoreError):
    """The store cannot be reached now: a database still unreachable (or deadlocked) after the retries, a lock held.

    Transient by nature, unlike a corrupt store or refused credentials: a run trains on without the
    bandit's suggestion and keeps its trial in a pending file (docs/stores.md).
    """


class StoreLockedError(StoreUnavailableError):
    """Another process held the store (its lock or a write transaction) for longer than the timeout."""


class StoreFullError(StoreError):
    """The store's device has no space left (``ENOSPC``) or the user's quota is spent (``EDQUOT``).

    Nothing was changed: the write went to a temporary file or a transaction that was rolled back.
    """


class StorePermissionError(StoreError):
    """The store file or its directory cannot be read or written by this user (``EACCES``, ``EPERM``, ``EROFS``)."""


class StoreValueError(StoreError, ValueError):
    """A value the store refuses to record: a non-finite number (NaN, ±infinity) in a trial or the bandit state.

    Raised before anything is written, so one bad run cannot poison the store for later ones.
    """
