"""One profiler per GPU: a lock file per GPU UUID, held while a run may change that GPU's limit.

The lock is an ``flock`` (through ``filelock``, which opens with ``O_NOFOLLOW``) on
``<lock dir>/<GPU UUID>.lock``; the kernel drops it when its holder dies, however it dies, so
holding it is proof of a live owner on this host. Beside it, ``<GPU UUID>.json`` (the GPU's
record) holds the original limit its holder found, written before the first change and removed
once that limit is back: a run that takes over the lock of a killed owner restores the record's
limit before it reads the "original" one, so it never records a profiling limit as original.

The lock directory is ``$ZEUS_CALLBACKS_LOCK_DIR`` or ``<tempdir>/zeus-callbacks-locks``
(created sticky and world-writable, like ``/tmp``, so runs of different users on one GPU see each
other). It must be a real directory owned by this user or root, and sticky if others may write
it. See docs/reliability.md#the-restore-protocol.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Any

import filelock

from zeus_callbacks._atomic_io import read_owned_text, write_json_atomic
from zeus_callbacks.errors import UnsafeFile
from zeus_callbacks.optimizers.power_limit._owner import Owner

logger = logging.getLogger(__name__)

LOCK_DIR_ENV = "ZEUS_CALLBACKS_LOCK_DIR"


def lock_dir() -> Path:
    """The directory of the per-GPU locks (``$ZEUS_CALLBACKS_LOCK_DIR`` or ``<tempdir>/zeus-callbacks-locks``)."""
    configured = os.environ.get(LOCK_DIR_ENV, "").strip()
    return Path(configured) if configured else Path(tempfile.gettempdir()) / "zeus-callbacks-locks"


def _checked_dir(path: Path) -> Path:
    """Create ``path`` (sticky, world-writable) if missing and check it is safe to keep locks in.

    Raises:
        UnsafeFile: It is a link, not a directory, another user's, or writable by others without
            the sticky bit (anyone could replace a lock file).
        OSError: It cannot be created.
    """
    if not path.exists() and not path.is_symlink():
        try:
            path.mkdir(parents=True)
            os.chmod(path, 0o1777)
        except FileExistsError:
            pass
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UnsafeFile(f"the GPU lock directory {path} is not a directory (a link or a file)")
    if st.st_uid not in (os.geteuid(), 0):
        raise UnsafeFile(f"the GPU lock directory {path} is owned by uid {st.st_uid}, not by this user or root")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        raise UnsafeFile(f"the GPU lock directory {path} is writable by others and not sticky")
    return path


def _file_stem(uuid: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", uuid)


class GpuLock:
    """The profiling lock of one GPU and its record of the original limit.

    Args:
        uuid: The GPU's UUID (``GPU-…`` on NVIDIA), as the backend reports it.
        directory: The lock directory; default :func:`lock_dir`.

    Raises:
        UnsafeFile: The lock directory is unsafe (see :func:`_checked_dir`).
        OSError: The lock directory cannot be created.
    """

    def __init__(self, uuid: str, directory: Path | None = None) -> None:
        self.uuid = uuid
        base = _checked_dir(directory or lock_dir())
        stem = _file_stem(uuid)
        self.path = base / f"{stem}.lock"
        self.record_path = base / f"{stem}.json"
        self._lock = filelock.FileLock(self.path, thread_local=False, fallback_to_soft=False)

    @property
    def held(self) -> bool:
        """True while this object holds the lock."""
        return bool(self._lock.is_locked)

    def try_acquire(self) -> bool:
        """Take the lock without waiting; False when another live process (or object) holds it.

        Raises:
            UnsafeFile: The lock file is a link or another user's (an ``flock`` on it proves nothing).
            OSError: The lock file cannot be opened (permissions, a filesystem without ``flock``).
        """
        if self.held:
            return True
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            st = None
        if st is not None and (stat.S_ISLNK(st.st_mode) or st.st_uid not in (os.geteuid(), 0)):
            raise UnsafeFile(f"the GPU lock file {self.path} is a link or another user's; it is not used")
        try:
            self._lock.acquire(blocking=False)
        except filelock.Timeout:
            return False
        return True

    def release(self) -> None:
        """Let the lock go (idempotent)."""
        if self.held:
            self._lock.release(force=True)

    # -- the record of the original limit ------------------------------------------------
    def read_record(self) -> tuple[float, Owner, str | None] | None:
        """``(original_limit_W, owner, marker path)`` of the GPU's record, or None if there is none or it is unusable.

        An unusable record (not JSON, another user's, a link) is logged and ignored.
        """
        try:
            data: Any = json.loads(read_owned_text(self.record_path))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            logger.warning("zeus-callbacks: ignoring the GPU record %s (%s)", self.record_path, exc)
            return None
        limit = data.get("original_limit_W") if isinstance(data, dict) else None
        if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not math.isfinite(limit) or limit <= 0:
            logger.warning("zeus-callbacks: ignoring the GPU record %s (no valid original_limit_W)", self.record_path)
            return None
        marker = data.get("marker")
        return float(limit), Owner.from_json(data.get("owner")), marker if isinstance(marker, str) else None

    def write_record(self, original_limit_W: float, owner: Owner, marker: Path | None) -> None:
        """Record the limit this holder found, before its first change (atomic write).

        Raises:
            OSError: It cannot be written (the caller must not change the limit then).
        """
        write_json_atomic(
            self.record_path,
            {"uuid": self.uuid, "original_limit_W": original_limit_W, "owner": owner.as_json(),
             "marker": str(marker) if marker is not None else None},
        )  # fmt: skip

    def clear_record(self) -> None:
        """Remove the record (the original limit is back)."""
        self.record_path.unlink(missing_ok=True)
