"""CPU package and DRAM energy from the Linux powercap interface (RAPL), per socket.

The kernel's powercap tree (``/sys/class/powercap``) exposes one zone per CPU socket,
``intel-rapl:<socket>`` named ``package-<socket>``, and under it subzones such as
``intel-rapl:<socket>:<n>`` named ``dram`` (AMD processors are exposed in the same tree,
usually without a DRAM zone). Each zone's ``energy_uj`` is a cumulative counter in
microjoules that wraps to 0 after ``max_energy_range_uj``; µJ are converted to J here and
nowhere else. Source: the Linux kernel's powercap documentation
(``Documentation/power/powercap/powercap.rst``) and Intel's SDM vol. 3B, section 15.10 (RAPL).

Since Linux 5.10 (the PLATYPUS side channel, CVE-2020-8694) ``energy_uj`` is readable by root
only. An unreadable counter gives one warning that names the fix, and that domain's energy is
unknown (None), never 0; the GPU figures go on. A counter that vanishes (a zone removed, a
driver unloaded) or that stops moving (``stuck_reads`` equal readings in a row: a powered
package always draws some energy) makes its domain's energy unknown from then on, with the
reason. A counter that has not moved for :data:`STILL_AFTER_S` or longer is unknown in that reading
already (a frozen counter's next figure would otherwise be short), and known again once it moves.
The reader must be read more often than a counter wraps: two wraps between reads cannot
be told from one, so readings further apart than the shortest wrap time (``max_energy_range_uj``
at :data:`MAX_DOMAIN_POWER_W`: 262 s for a 262,143 J range) make the domain unknown, with the reason.

Thread safety: a :class:`RaplReader` is used from one thread.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

logger = logging.getLogger(__name__)

POWERCAP_ROOT = Path("/sys/class/powercap")
"""Where the kernel exposes the powercap zones."""
UJ_PER_J = 1_000_000
"""Microjoules in a joule (the counters' unit)."""
PERMISSION_FIX = (
    "energy_uj is readable by root only since Linux 5.10 (CVE-2020-8694); run as root, or let this user read "
    "it: sudo chmod a+r /sys/class/powercap/intel-rapl:*/energy_uj /sys/class/powercap/intel-rapl:*:*/energy_uj "
    "(a udev rule makes it last across reboots)"
)
"""What the unreadable-counter warning says to do."""

MAX_DOMAIN_POWER_W = 1000.0
"""The most power (W) one package or DRAM domain is taken to draw: a counter then wraps no sooner than
``max_energy_range_uj`` / this, and readings further apart than that make the domain unknown."""

STILL_AFTER_S = 0.02
"""A counter that has not moved for this long (s) is unknown in that reading (known again once it moves).

RAPL counters update about every millisecond in units of about 61 µJ; a powered package or DRAM draws
well over 0.1 W, so in 20 ms it moves by far more than one unit. Equal readings closer together than
this (an epoch's end and the report right after it) are left alone: neither unknown nor counted as stuck.
A counter that froze less than this before a reading can make that one figure short by at most its power
× this time (20 J at :data:`MAX_DOMAIN_POWER_W`)."""

DomainKind = Literal["package", "dram"]
_ZONE = re.compile(r"^intel-rapl:(\d+)(?::(\d+))?$")


@dataclass(frozen=True)
class RaplDomain:
    """One powercap zone read as a CPU package or DRAM domain.

    Attributes:
        kind: ``"package"`` (the socket's package) or ``"dram"`` (its memory).
        socket: The socket index (the ``N`` of ``intel-rapl:N``).
        path: The zone's folder (holds ``energy_uj`` and ``max_energy_range_uj``).
        max_energy_range_uj: Where the counter wraps to 0 (µJ).
    """

    kind: DomainKind
    socket: int
    path: Path
    max_energy_range_uj: int

    @property
    def wrap_safe_s(self) -> float:
        """The shortest time (s) the counter can take to wrap: its range at :data:`MAX_DOMAIN_POWER_W`."""
        return self.max_energy_range_uj / UJ_PER_J / MAX_DOMAIN_POWER_W

    @property
    def label(self) -> str:
        """``package-0``, ``dram-0``: the domain's name in results and warnings."""
        return f"{self.kind}-{self.socket}"


def counter_delta_uj(previous_uj: int, current_uj: int, max_energy_range_uj: int) -> int:
    """Energy (µJ) between two readings of a counter that wraps to 0 at ``max_energy_range_uj``.

    A reading below the previous one is taken as one wrap: ``current + range - previous``.

    Args:
        previous_uj: The earlier reading (µJ), in [0, ``max_energy_range_uj``).
        current_uj: The later reading (µJ), in [0, ``max_energy_range_uj``).
        max_energy_range_uj: The counter's range (µJ), > 0.

    Returns:
        The increment (µJ), in [0, ``max_energy_range_uj``).
    """
    return current_uj - previous_uj + (max_energy_range_uj if current_uj < previous_uj else 0)


def _read_int(path: Path) -> int:
    return int(path.read_text(encoding="ascii").strip())


def discover(root: Path = POWERCAP_ROOT) -> list[RaplDomain]:
    """The package and DRAM domains under ``root`` (other zones, such as ``core`` or ``psys``, are left out).

    Args:
        root: The powercap folder (a fake tree in tests).

    Returns:
        The domains, by socket then kind; empty when there is no RAPL tree (no such folder, a VM).
        A zone whose ``name`` or ``max_energy_range_uj`` cannot be read is left out (logged at debug).
    """
    domains: list[RaplDomain] = []
    try:
        zones = sorted(root.iterdir()) if root.is_dir() else []
    except OSError:
        return []
    for zone in zones:
        match = _ZONE.match(zone.name)
        if match is None:
            continue
        try:
            name = (zone / "name").read_text(encoding="ascii").strip()
            max_range = _read_int(zone / "max_energy_range_uj")
        except (OSError, ValueError) as exc:
            logger.debug("zeus-callbacks: powercap zone %s left out (%s)", zone, exc)
            continue
        socket = int(match.group(1))
        if match.group(2) is None and name.startswith("package"):
            domains.append(RaplDomain("package", socket, zone, max_range))
        elif match.group(2) is not None and name == "dram":
            domains.append(RaplDomain("dram", socket, zone, max_range))
    return sorted(domains, key=lambda d: (d.socket, d.kind != "package"))


@dataclass
class NodeEnergy:
    """CPU package and DRAM energy since :meth:`RaplReader.start`.

    Attributes:
        cpu_J: The packages' energy summed over sockets (J); None when any package is unknown.
        dram_J: The DRAM domains' energy summed over sockets (J); None when there is no DRAM domain
            or any is unknown.
        domains_J: Each domain's energy by label (``package-0``...; J), None where unknown.
        reasons: Why a domain's energy is unknown, by label.
    """

    cpu_J: float | None
    dram_J: float | None
    domains_J: dict[str, float | None] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)

    def since(self, earlier: NodeEnergy) -> NodeEnergy:
        """The energy between ``earlier`` and this reading (both totals since the same start), per domain.

        A figure unknown in either reading is unknown in the difference, with the reasons of both readings
        (a domain's reason stays once it is unknown, so this reading's hold ``earlier``'s).

        Args:
            earlier: A reading taken before this one, from the same reader and run.

        Returns:
            The differences (J), None where unknown.
        """

        def minus(late: float | None, early: float | None) -> float | None:
            return None if late is None or early is None else late - early

        domains = {label: minus(value, earlier.domains_J.get(label)) for label, value in self.domains_J.items()}
        cpu_J, dram_J = minus(self.cpu_J, earlier.cpu_J), minus(self.dram_J, earlier.dram_J)
        return NodeEnergy(cpu_J, dram_J, domains, {**earlier.reasons, **self.reasons})


class NodeReader(Protocol):
    """What the session needs of a CPU/DRAM energy source: :class:`RaplReader`, or the simulated CPU.

    The simulated one is :class:`~zeus_callbacks.backends._virtual_cpu.VirtualCpu`. Used from one thread.

    Attributes:
        has_dram: Whether a DRAM figure is read (else the node figure is GPUs + CPU).
        simulated: True when the figures are simulated, never measured.
        parts: What the node figure holds, in words (``GPU + CPU package + DRAM``), for the records' notes.
    """

    # Read-only members: a class attribute or a property satisfies them.
    @property
    def has_dram(self) -> bool:
        """Whether a DRAM figure is read."""
        ...

    @property
    def simulated(self) -> bool:
        """True when the figures are simulated."""
        ...

    @property
    def parts(self) -> str:
        """What the node figure holds, in words."""
        ...

    def start(self) -> None:
        """Take the first reading (energy counts from here)."""
        ...

    def read(self) -> NodeEnergy:
        """Read now; the energy (J) since :meth:`start`, None where unknown, with the reasons."""
        ...

    def read_if_due(self, period_s: float = 10.0) -> None:
        """Read when the last reading is ``period_s`` (s) old or older."""
        ...


@dataclass
class _Counter:
    domain: RaplDomain
    last_uj: int | None = None
    last_s: float | None = None
    total_uj: int = 0
    unchanged: int = 0
    reason: str | None = None
    moved_s: float | None = None  # when a reading last saw it move (or the first reading)
    still: str | None = None  # why this reading's figure is unknown: it has not moved for STILL_AFTER_S


class RaplReader:
    """Reads the package and DRAM counters and accumulates their energy across wraps.

    Args:
        root: The powercap folder.
        stuck_reads: Readings in a row equal to the previous one, :data:`STILL_AFTER_S` or more after the
            counter last moved and after each other, after which a counter is taken as stuck (its energy
            unknown from then on); ≥ 2. Each such reading is unknown already (known again if it moves).
        clock: Monotonic time (s) of each reading, to bound the gap between readings (wraps).

    Raises:
        ValueError: ``stuck_reads`` < 2.
    """

    def __init__(
        self, root: Path = POWERCAP_ROOT, *, stuck_reads: int = 3, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if stuck_reads < 2:
            raise ValueError(f"stuck_reads must be at least 2, got {stuck_reads}")
        self._root = root
        self._counters = [_Counter(d) for d in discover(root)]
        self._stuck_reads = stuck_reads
        self._clock = clock
        self._last_read_s: float | None = None
        self._warned: set[str] = set()

    @property
    def domains(self) -> list[RaplDomain]:
        """The domains found."""
        return [c.domain for c in self._counters]

    @property
    def available(self) -> bool:
        """True when at least one package domain was found."""
        return any(c.domain.kind == "package" for c in self._counters)

    @property
    def readable(self) -> bool:
        """True when a package domain was found and no package counter is unknown.

        After :meth:`start`: every package counter could be read.
        """
        return self.available and all(c.reason is None for c in self._counters if c.domain.kind == "package")

    @property
    def has_dram(self) -> bool:
        """True when a DRAM domain was found."""
        return any(c.domain.kind == "dram" for c in self._counters)

    simulated = False
    """RAPL figures are the processor's own energy counters, never simulated."""

    @property
    def parts(self) -> str:
        """What the node figure holds: ``GPU + CPU package + DRAM`` (or without DRAM, said).

        With no package domain at all (a VM without RAPL, as on the project's H100/H200 hosts) nothing of
        the CPU is measured, and the words say that rather than name parts no figure holds.
        """
        if not self.available:
            return f"CPU and DRAM not measured (no RAPL package domain under {self._root})"
        return "GPU + CPU package" + (" + DRAM" if self.has_dram else " (no DRAM domain on this CPU)")

    def start(self) -> None:
        """Take the first reading of every counter (energy counts from here)."""
        self._counters = [_Counter(c.domain) for c in self._counters]
        for counter in self._counters:
            self._read(counter)
        self._last_read_s = self._clock()

    def read(self) -> NodeEnergy:
        """Read every counter and return the energy since :meth:`start`.

        Returns:
            The totals; a domain that could not be read (permission, vanished, stuck) is None with its reason.
        """
        for counter in self._counters:
            if counter.reason is None:
                self._read(counter)
        self._last_read_s = self._clock()
        return self.energy()

    def read_if_due(self, period_s: float = 10.0) -> None:
        """Read every counter when the last reading is ``period_s`` (s) old or older (keeps gaps below a wrap).

        Args:
            period_s: The least time (s) between two readings; far below any counter's
                :attr:`RaplDomain.wrap_safe_s`, far above the counters' update period (~1 ms).
        """
        if self._last_read_s is None or self._clock() - self._last_read_s >= period_s:
            self.read()

    def energy(self) -> NodeEnergy:
        """The energy accumulated so far (no new reading)."""
        domains: dict[str, float | None] = {}
        reasons: dict[str, str] = {}
        for c in self._counters:
            known = c.reason is None and c.still is None and c.last_uj is not None
            domains[c.domain.label] = c.total_uj / UJ_PER_J if known else None
            if not known:
                reasons[c.domain.label] = c.reason or c.still or "never read"
        return NodeEnergy(self._sum(domains, "package"), self._sum(domains, "dram"), domains, reasons)

    def _sum(self, domains: dict[str, float | None], kind: DomainKind) -> float | None:
        values = [domains[c.domain.label] for c in self._counters if c.domain.kind == kind]
        if not values or any(v is None for v in values):
            return None
        return float(sum(v for v in values if v is not None))

    def _read(self, counter: _Counter) -> None:
        label = counter.domain.label
        now_s = self._clock()
        try:
            value = _read_int(counter.domain.path / "energy_uj")
        except PermissionError:
            counter.reason = f"{counter.domain.path / 'energy_uj'} is not readable: {PERMISSION_FIX}"
            self._warn_once("permission", "zeus-callbacks: CPU/DRAM energy unavailable: %s; GPU figures go on",
                            counter.reason)  # fmt: skip
            return
        except (OSError, ValueError) as exc:
            counter.reason = f"the {label} counter vanished or is unreadable ({exc})"
            self._warn_once(label, "zeus-callbacks: %s; its energy is unknown from here on", counter.reason)
            return
        if counter.last_uj is not None and counter.last_s is not None:
            # Since it was last seen moving: a counter that stalls and then jumps may have wrapped meanwhile.
            still_s = now_s - (counter.moved_s if counter.moved_s is not None else counter.last_s)
            if still_s > counter.domain.wrap_safe_s:
                counter.reason = (
                    f"{still_s:.0f} s between two readings of {label} that saw it move, longer than its counter's "
                    f"shortest wrap time ({counter.domain.wrap_safe_s:.0f} s): wraps may be missed"
                )
                self._warn_once(label, "zeus-callbacks: %s; its energy is unknown from here on", counter.reason)
                return
            if value == counter.last_uj and still_s >= STILL_AFTER_S:
                # Not moved for STILL_AFTER_S: frozen or not, this reading cannot vouch for the energy since.
                # Readings closer together than that (an epoch's end and its report) are one observation.
                counter.unchanged += now_s - counter.last_s >= STILL_AFTER_S or not counter.unchanged
                counter.still = f"the {label} counter has not moved in {still_s:.3g} s (stuck?)"
                if counter.unchanged >= self._stuck_reads:
                    counter.reason = f"the {label} counter is stuck at {value} µJ ({counter.unchanged} equal readings)"
                    self._warn_once(label, "zeus-callbacks: %s; its energy is unknown from here on", counter.reason)
                    return
            elif value != counter.last_uj:
                counter.unchanged, counter.still, counter.moved_s = 0, None, now_s
            counter.total_uj += counter_delta_uj(counter.last_uj, value, counter.domain.max_energy_range_uj)
        else:
            counter.moved_s = now_s
        counter.last_uj, counter.last_s = value, now_s

    def _warn_once(self, key: str, message: str, *args: object) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message, *args)
