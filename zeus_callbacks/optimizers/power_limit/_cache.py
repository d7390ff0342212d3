"""Profiles kept between runs: the cache key and the JSON-file cache (a store-backed one is in ``store``)."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from zeus_callbacks._atomic_io import ownership_problem, read_owned_text, write_json_atomic
from zeus_callbacks.errors import UnsafeFile

logger = logging.getLogger(__name__)


CACHE_NAME = "power_limit_cache.json"
"""Default profile-cache file name, under ``logging.log_dir``."""


@dataclass(frozen=True)
class ProfileKey:
    """What a cached profile is valid for; any difference means a fresh profile."""

    job_id: str
    gpu_model: str
    batch_size: int | None
    world_size: int
    objective: str

    def as_str(self) -> str:
        """The key as one string (JSON of its fields)."""
        return json.dumps(asdict(self), sort_keys=True)


class ProfileCache(Protocol):
    """Stores per-limit profiles by :class:`ProfileKey`."""

    def get(self, key: ProfileKey) -> dict[str, Any] | None:
        """The profile stored under ``key``, or None."""

    def put(self, key: ProfileKey, profile: dict[str, Any]) -> None:
        """Store ``profile`` (JSON-serialisable) under ``key``."""


class JsonProfileCache:
    """A :class:`ProfileCache` in one small JSON file, written atomically (main process only).

    A cache file that is a symbolic link or another user's is neither read nor replaced
    (docs/shared-clusters.md#files-in-shared-directories).

    Args:
        path: The JSON file (created on the first :meth:`put`).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(read_owned_text(self.path))
        except UnsafeFile as exc:  # another user's cache could choose this run's limit: ignored
            logger.warning("zeus-callbacks: ignoring the power-limit cache: %s", exc)
            return {}
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, key: ProfileKey) -> dict[str, Any] | None:
        """The profile stored under ``key``, or None (also for an unreadable file)."""
        entry = self._read().get(key.as_str())
        return entry if isinstance(entry, dict) else None

    def put(self, key: ProfileKey, profile: dict[str, Any]) -> None:
        """Store ``profile`` under ``key`` (atomic replace of the file).

        Raises:
            UnsafeFile: The cache file is a link or another user's: it is left as it is.
            OSError: The file cannot be written.
        """
        problem = ownership_problem(self.path)
        if problem is not None:
            raise UnsafeFile(f"not writing the power-limit cache: {problem}")
        data = self._read()
        data[key.as_str()] = profile
        write_json_atomic(self.path, data)
