"""A scratch folder in memory for the property suites' thousands of short runs.

Each truth-or-flag schedule opens a session whose JSONL log is written and ``fsync``-ed, in a
temporary folder made and removed per schedule. On a disk every ``fsync`` waits for the write-back,
and the folder's create and remove touch the file system's journal: the 1,000 NVML/amdsmi schedules
took 98 s of wall time and 32.6 s of CPU with their folders under /tmp, 58 s and 28.9 s under
/dev/shm (one run each, a 2-core machine at load 10); at load 2.5, 33 s -> 29 s of wall time, the CPU
within noise (~26 s). In memory (tmpfs) ``fsync`` returns at once; every
file is written and read back as before, so the suites check the same figures.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

MEMORY = Path("/dev/shm")
"""Linux's tmpfs for every user; where it is missing or not writable, the usual temporary folder."""


def scratch_dir() -> tempfile.TemporaryDirectory[str]:
    """A temporary folder on tmpfs where there is one (else the usual place), removed on exit."""
    in_memory = MEMORY.is_dir() and os.access(MEMORY, os.W_OK | os.X_OK)
    return tempfile.TemporaryDirectory(prefix="zc-schedule-", dir=str(MEMORY) if in_memory else None)
