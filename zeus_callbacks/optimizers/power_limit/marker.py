"""The restore marker: the original power limits, written before the first change, read back after a crash.

A marker left by a killed run is restored (and removed) by the next run on the same log directory or by
``zeus-callbacks restore``; see docs/power_limit.md.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import NamedTuple

from zeus_callbacks.atomic_io import write_json_atomic
from zeus_callbacks.backends.base import GPUBackend
from zeus_callbacks.distributed import launcher_env_int, launcher_world_size
from zeus_callbacks.errors import NotAMarker

logger = logging.getLogger(__name__)


MARKER_NAME = "power_limit_restore.json"
"""Default restore-marker file name, under ``logging.log_dir``."""


def write_marker(path: str | Path, backend: GPUBackend, original_W: dict[int, float]) -> None:
    """Write the restore marker: GPU index → original limit (W), device name, pid."""
    gpus = [{"index": i, "name": backend.device_name(i), "original_limit_W": limit} for i, limit in original_W.items()]
    write_json_atomic(Path(path), {"pid": os.getpid(), "backend": backend.name, "time": time.time(), "gpus": gpus})


def marker_path(log_dir: str | Path, configured: str | Path | None = None) -> Path:
    """The restore-marker file of this process.

    ``configured`` (``power_limit.restore_marker``) or ``<log_dir>/power_limit_restore.json``;
    under a multi-process launcher (``WORLD_SIZE`` > 1) each local rank gets its own file
    (``power_limit_restore.rank<LOCAL_RANK>.json``) so ranks never overwrite each other's.
    """
    path = Path(configured) if configured else Path(log_dir) / MARKER_NAME
    local_rank = launcher_env_int("LOCAL_RANK", -1)  # -1: not set
    if local_rank >= 0 and launcher_world_size() > 1:
        path = path.with_name(f"{path.stem}.rank{local_rank}{path.suffix}")
    return path




class RestoreMarker(NamedTuple):
    """What a restore marker records.

    Attributes:
        limits_W: GPU index → original power limit (W).
        pid: The process that wrote it, if recorded.
    """

    limits_W: dict[int, float]
    pid: int | None


def read_marker(path: str | Path) -> RestoreMarker | None:
    """The limits a restore marker records, without touching the file.

    A marker is what :func:`write_marker` writes: a JSON object with a non-empty ``gpus``
    list of ``{"index": int, "original_limit_W": number > 0}``.

    Args:
        path: The marker file.

    Returns:
        The marker's limits and writer, or None when there is no file.

    Raises:
        NotAMarker: The path is a directory, unreadable, not JSON, or JSON of another shape
            (a torn marker included): nobody can tell what limit it held, so it is kept.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise NotAMarker(f"{path} is a directory, not a power-limit restore marker") from None
    except (OSError, ValueError) as exc:
        raise NotAMarker(f"{path} is not a power-limit restore marker (not readable JSON: {exc})") from exc
    gpus = data.get("gpus") if isinstance(data, dict) else None
    if not isinstance(gpus, list) or not gpus:
        raise NotAMarker(f'{path} is not a power-limit restore marker (no "gpus" list)')
    limits: dict[int, float] = {}
    for gpu in gpus:
        index = gpu.get("index") if isinstance(gpu, dict) else None
        limit = gpu.get("original_limit_W") if isinstance(gpu, dict) else None
        if (
            isinstance(index, bool) or not isinstance(index, int) or index < 0
            or isinstance(limit, bool) or not isinstance(limit, (int, float)) or not math.isfinite(limit) or limit <= 0
        ):  # fmt: skip
            raise NotAMarker(
                f"{path} is not a valid power-limit restore marker (GPU entry {gpu!r}: need an index ≥ 0 "
                "and an original_limit_W > 0)"
            )
        limits[index] = float(limit)
    return RestoreMarker(limits, data.get("pid"))


def restore_from_marker(path: str | Path, backend: GPUBackend) -> dict[int, float] | None:
    """Put back the limits a run left changed (SIGKILL, power loss), then remove the marker.

    Only a file that reads as a marker (:func:`read_marker`) is ever removed.

    Args:
        path: The marker file (``<log_dir>/power_limit_restore.json`` by default).
        backend: An open backend seeing the same GPUs.

    Returns:
        GPU index → restored limit (W), or None when there was no marker.

    Raises:
        NotAMarker: The file is not a marker (or a torn one); it is kept byte for byte.
        BackendError: A limit could not be restored (the marker is kept for a later try).
    """
    path = Path(path)
    marker = read_marker(path)
    if marker is None:
        return None
    restored: dict[int, float] = {}
    for index, limit in marker.limits_W.items():
        if index >= backend.device_count():
            logger.warning("zeus-callbacks: restore marker names GPU %d, which this process does not see", index)
            continue
        backend.set_power_limit_W(index, limit)
        restored[index] = limit
    path.unlink(missing_ok=True)
    logger.warning(
        "zeus-callbacks: restored power limits left by an earlier run (pid %s): %s",
        marker.pid,
        ", ".join(f"GPU {i} → {w:.0f} W" for i, w in restored.items()),
    )
    return restored
