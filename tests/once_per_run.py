"""A module fixture's work done once per test run, not once per pytest-xdist worker that runs its tests."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import filelock
import pytest


def once_per_run(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], Any]) -> Any:
    """``make(folder)``'s JSON-able result, computed by the first worker that asks and read back by the others.

    Under pytest-xdist a module's tests spread over the workers and each one ran a module fixture again:
    fifteen child processes twice over for the power-limit faults (97 s each on a loaded CI machine).
    The workers of one run share their base folder's parent, which holds the result and the folder
    ``make`` wrote in. Without xdist the work is done in a fresh folder of this run.
    """
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return make(tmp_path_factory.mktemp(name))
    root = tmp_path_factory.getbasetemp().parent  # this run's: each worker's base folder is a child of it
    result = root / f"{name}.json"
    with filelock.FileLock(str(root / f"{name}.lock")):
        if result.exists():
            return json.loads(result.read_text())
        folder = root / name
        folder.mkdir()
        value = make(folder)
        result.write_text(json.dumps(value))
        return value
