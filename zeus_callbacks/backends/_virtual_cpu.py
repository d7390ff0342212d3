"""A SIMULATED CPU package beside the virtual GPU, for machines whose RAPL counters cannot be read.

Model::

    cpu_energy_J = power_per_core_W × (process CPU time now − process CPU time at start)

where the process CPU time (s) is this process's user + system time over all its threads
(:func:`time.process_time`, the figure ``psutil.Process().cpu_times()`` gives as ``user + system``).
A core kept busy for one second by this process counts ``power_per_core_W`` joules; idle cores,
other processes (DataLoader workers included), the package's static power and DRAM count nothing.
It is the "CPU load × TDP" estimate CodeCarbon makes where RAPL is missing (its process mode: the
process's share of the CPU capacity × the CPU's TDP; docs.codecarbon.io, Methodology), with the TDP
spread over the cores: TDP / cores × CPU seconds = TDP × load × wall seconds.

The default per-core power, :data:`DEFAULT_POWER_PER_CORE_W` = 6.25 W, is the TDP of an Intel Xeon
Platinum 8480+ (350 W, 56 cores; Intel's product specifications), the CPU of an NVIDIA DGX H100:
a nominal figure for a server core at full load, not a measurement of this machine.

Every figure is simulated: it is only used beside the virtual GPU (whose records all carry
``simulated: true``), never beside a real GPU, and the records' notes say ``SIMULATED``.

Thread safety: a :class:`VirtualCpu` is used from one thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from zeus_callbacks.backends.rapl import NodeEnergy

DEFAULT_POWER_PER_CORE_W = 6.25
"""Power (W) of one core kept busy: Intel Xeon Platinum 8480+ TDP 350 W / 56 cores (a nominal figure)."""

LABEL = "virtual-cpu"
"""The simulated domain's label in :attr:`NodeEnergy.domains_J`."""


def process_cpu_time_s() -> float:
    """This process's CPU time (s): user + system, all threads (:func:`time.process_time`)."""
    return time.process_time()


class VirtualCpu:
    """A simulated CPU package: ``power_per_core_W`` (> 0) × this process's ``cpu_time_s()`` (the module docstring).

    Raises:
        ValueError: ``power_per_core_W`` is not positive.
    """

    has_dram = False
    simulated = True

    def __init__(
        self, power_per_core_W: float = DEFAULT_POWER_PER_CORE_W, *, cpu_time_s: Callable[[], float] | None = None
    ) -> None:
        if not power_per_core_W > 0:
            raise ValueError(f"power_per_core_W must be positive, got {power_per_core_W}")
        self.power_per_core_W = float(power_per_core_W)
        self._cpu_time_s = cpu_time_s or process_cpu_time_s
        self._start_s: float | None = None

    @property
    def parts(self) -> str:
        """What the node figure holds, with the model stated."""
        return (
            f"GPU + SIMULATED CPU package (virtual CPU: this process's CPU time × {self.power_per_core_W:g} W "
            "per busy core; no DRAM)"
        )

    def start(self) -> None:
        """Take the process's CPU time now (energy counts from here)."""
        self._start_s = self._cpu_time_s()

    def read(self) -> NodeEnergy:
        """The simulated CPU energy (J) since :meth:`start`; unknown (None, with the reason) before it."""
        if self._start_s is None:
            return NodeEnergy(None, None, {LABEL: None}, {LABEL: "never read"})
        cpu_J = self.power_per_core_W * (self._cpu_time_s() - self._start_s)
        return NodeEnergy(cpu_J, None, {LABEL: cpu_J}, {})

    def read_if_due(self, period_s: float = 10.0) -> None:
        """Nothing to do: the CPU time is a running total that never wraps."""
