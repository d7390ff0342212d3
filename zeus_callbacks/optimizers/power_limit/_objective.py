"""What a power limit is chosen for: the objectives (energy, time, ZeusCost, max_slowdown) as per-step costs.

Source: Zeus (You, Chung, Chowdhury, NSDI '23), §3 (eq. 2, ZeusCost) and §4.3.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from zeus_callbacks.optimizers.cost import ZeusCost

ObjectiveName = Literal["energy", "time", "zeus_cost", "max_slowdown"]

INFEASIBLE_COST = 1e12
"""Cost scale of a limit slower than max_slowdown allows (a huge, still ordered cost: slower is worse)."""


@dataclass(frozen=True)
class Objective:
    """What the profiler minimises over per-step energy ``E`` (J) and time ``T`` (s).

    Args:
        name: ``energy`` (E), ``time`` (T), ``zeus_cost`` (``eta·E + (1−eta)·MaxPower·T``,
            Zeus NSDI '23 eq. 2) or ``max_slowdown`` (lowest E whose T ≤ factor × T at the
            maximum limit, Zeus §4).
        eta_knob: Energy weight of ``zeus_cost``, in [0, 1].
        max_slowdown: Slowdown factor of ``max_slowdown``, ≥ 1.
        max_power_W: MaxPower of ``zeus_cost``: per-GPU maximum limit × number of GPUs.

    Raises:
        ValueError: A knob is out of range.
    """

    name: ObjectiveName = "zeus_cost"
    eta_knob: float = 0.5
    max_slowdown: float = 1.1
    max_power_W: float = 1.0

    def __post_init__(self) -> None:
        if self.name not in ("energy", "time", "zeus_cost", "max_slowdown"):
            raise ValueError(f"unknown objective {self.name!r}")
        if self.max_slowdown < 1.0:
            raise ValueError(f"max_slowdown must be ≥ 1, got {self.max_slowdown}")
        ZeusCost(self.eta_knob, self.max_power_W)  # validates both

    def key(self) -> str:
        """A string naming the objective and its knob (part of the cache key)."""
        if self.name == "zeus_cost":
            return f"zeus_cost(eta={self.eta_knob:g})"
        if self.name == "max_slowdown":
            return f"max_slowdown({self.max_slowdown:g})"
        return self.name

    def step_value(self, energy_J: float, time_s: float) -> float:
        """The per-step quantity whose confidence interval decides a window."""
        if self.name == "time":
            return time_s
        if self.name == "zeus_cost":
            return ZeusCost(self.eta_knob, self.max_power_W)(energy_J, time_s)
        return energy_J

    def cost(self, energy_J: float, time_s: float, reference_time_s: float | None) -> float:
        """Cost of a limit measured at ``energy_J``/``time_s`` per step (lower is better).

        Args:
            energy_J: Energy per step (J), summed over GPUs.
            time_s: Time per step (s), of the slowest GPU.
            reference_time_s: Time per step at the maximum limit (``max_slowdown`` only).
        """
        if self.name != "max_slowdown":
            return self.step_value(energy_J, time_s)
        if reference_time_s is None or time_s <= self.max_slowdown * reference_time_s:
            return energy_J
        return INFEASIBLE_COST * (1.0 + time_s / reference_time_s) + energy_J
