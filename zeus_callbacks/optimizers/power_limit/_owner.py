"""Who wrote a restore marker, and whether that process is still alive.

A process is named by its PID, its start time (``/proc/<pid>/stat`` field 22, clock ticks since
boot: a reused PID has another), the kernel's boot id (``/proc/sys/kernel/random/boot_id``: a
reboot kills every owner) and the host name. See docs/reliability.md#the-restore-protocol.
"""

from __future__ import annotations

import os
import socket
from dataclasses import asdict, dataclass
from typing import Any

from zeus_callbacks.store._base import process_is_alive

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def boot_id() -> str | None:
    """The kernel's boot id (a UUID that changes at every boot), or None where there is none."""
    try:
        with open(BOOT_ID_PATH, encoding="ascii") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def process_start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks after boot, ``/proc/<pid>/stat`` field 22), or None."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            text = fh.read()
        # The command name (field 2) is in parentheses and may hold spaces: split after the last ")".
        return int(text.rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class Owner:
    """The process that owns a restore marker or a GPU's profiling lock.

    Attributes:
        pid: Its process id (None in a marker written before owners were recorded).
        host: ``socket.gethostname()`` where it ran.
        boot_id: The kernel boot id it ran under.
        start_ticks: Its start time (clock ticks after boot), to tell a reused PID apart.
    """

    pid: int | None
    host: str | None = None
    boot_id: str | None = None
    start_ticks: int | None = None

    @classmethod
    def this_process(cls) -> Owner:
        """The calling process."""
        pid = os.getpid()
        return cls(pid, socket.gethostname(), boot_id(), process_start_ticks(pid))

    @classmethod
    def from_json(cls, data: Any) -> Owner:
        """Read what :meth:`as_json` wrote (missing or ill-typed fields become None)."""
        data = data if isinstance(data, dict) else {}

        def typed(key: str, kind: type) -> Any:
            value = data.get(key)
            return value if isinstance(value, kind) and not isinstance(value, bool) else None

        return cls(typed("pid", int), typed("host", str), typed("boot_id", str), typed("start_ticks", int))

    def as_json(self) -> dict[str, Any]:
        """The owner as a JSON object."""
        return asdict(self)

    def same_process(self, other: Owner) -> bool:
        """True when both name the same process (PID, host and boot id)."""
        return (self.pid, self.host, self.boot_id) == (other.pid, other.host, other.boot_id)

    def is_alive(self) -> bool:
        """True when the owner may still be running, so nobody else may touch what it owns.

        Alive means: on this host (or no host recorded), in this boot (or none recorded), its PID
        exists, and that PID's start time is the recorded one (when both are known). A marker
        from another host or an earlier boot has no live owner here: its GPUs are matched by UUID,
        so a marker from elsewhere restores nothing here.
        """
        if self.pid is None or (self.host is not None and self.host != socket.gethostname()):
            return False
        if (self.boot_id is not None and self.boot_id != boot_id()) or not process_is_alive(self.pid):
            return False
        started = None if self.start_ticks is None else process_start_ticks(self.pid)
        return started is None or started == self.start_ticks  # another start time: the PID was reused

    def describe(self) -> str:
        """``pid 123 on host h`` for messages."""
        return f"pid {self.pid}" + (f" on {self.host}" if self.host else "")
