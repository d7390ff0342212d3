"""Whether a store file is on a network filesystem (NFS, CIFS/SMB, Lustre, GPFS, ...).

SQLite's WAL journal needs shared memory that only one host sees, and ``fcntl``/``flock``
locks are unreliable on many NFS set-ups: a file store there uses SQLite's rollback
journal and an ``O_EXCL`` lock file instead (see ``docs/stores.md``). ``os.statvfs`` has
no filesystem type, so this reads the mount table (``psutil.disk_partitions``) and takes the
longest mount point above the path.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "lustre",
        "gpfs",
        "beegfs",
        "ceph",
        "glusterfs",
        "fuse.glusterfs",
        "fuse.sshfs",
        "fuse.cephfs",
        "fuse.s3fs",
        "afs",
        "panfs",
        "wekafs",
        "orangefs",
    }
)
"""Filesystem types (``/proc/mounts`` third column) treated as network filesystems."""

_warned: set[str] = set()


def filesystem_type(path: str | Path, mounts: Iterable[Any] | None = None) -> str | None:
    """The type (``"nfs4"``) of the filesystem holding ``path`` (it need not exist yet); None: no mount table.

    ``mounts``: items with ``mountpoint`` and ``fstype``; default ``psutil.disk_partitions(all=True)``
    (this process's ``/proc/self/mounts`` on Linux).
    """
    if mounts is None:
        import psutil

        try:
            mounts = psutil.disk_partitions(all=True)
        except (OSError, RuntimeError):
            return None
    target_s = os.path.realpath(path)  # a missing tail is fine: the longest mount point above it counts
    best, best_type = "", None
    for part in mounts:
        mount_point = part.mountpoint
        inside = target_s == mount_point or target_s.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best):
            best, best_type = mount_point, part.fstype
    return best_type


def is_network_filesystem(path: str | Path, mounts: Iterable[Any] | None = None) -> bool:
    """True when ``path`` is on one of :data:`NETWORK_FILESYSTEMS` (see :func:`filesystem_type`)."""
    return (filesystem_type(path, mounts) or "").lower() in NETWORK_FILESYSTEMS


def warn_network_filesystem(path: Path, what: str) -> None:
    """Warn once per store file that it is on a network filesystem, and what the store does about it."""
    key = str(path)
    if key not in _warned:
        _warned.add(key)
        logger.warning(
            "zeus-callbacks: store %s is on a network filesystem (%s): %s. Several processes of one node are "
            "safe; for many nodes use a database server (store.url: postgresql://..., see docs/stores.md)",
            path,
            filesystem_type(path),
            what,
        )
