"""Atomic file writes: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_json_atomic(path: str | Path, data: Any, *, sort_keys: bool = False) -> None:
    """Write ``data`` as JSON to ``path`` atomically (temp file, ``fsync``, ``os.replace``).

    The temp file is created next to ``path`` (same filesystem, so the rename is atomic) with a
    unique name, and removed if anything fails before the rename, so no ``.tmp`` file is left behind.

    Args:
        path: The file to write; its directory is created if missing.
        data: A JSON-serialisable value.
        sort_keys: Write object keys sorted (stable diffs of a file people read).

    Raises:
        OSError: The directory or file cannot be written (the old file, if any, is unchanged).
        TypeError: ``data`` is not JSON-serialisable (the old file is unchanged).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1, sort_keys=sort_keys)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
