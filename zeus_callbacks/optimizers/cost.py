"""The energy–time cost both optimisers minimise (Zeus, NSDI '23, §3, eq. 2).

``ZeusCost = eta_knob · E + (1 − eta_knob) · MaxPower · T``: energy and time made
commensurable by the GPUs' maximum power. ``eta_knob = 1`` optimises energy only,
``eta_knob = 0`` time only.

Multi-GPU runs use one definition everywhere (docs/hardware.md#multi-gpu): ``E`` is summed over all
GPUs, ``T`` is the slowest rank's time, and ``MaxPower`` is the per-GPU maximum power
limit times the number of GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ZeusCost:
    """The cost function ``eta_knob · E + (1 − eta_knob) · MaxPower · T``.

    Args:
        eta_knob: Weight of energy in [0, 1].
        max_power_W: Maximum power of all GPUs together (W): per-GPU maximum limit ×
            number of GPUs.

    Raises:
        ValueError: ``eta_knob`` is outside [0, 1] or ``max_power_W`` is not positive.

    Example:
        >>> ZeusCost(eta_knob=0.5, max_power_W=300.0)(energy_J=1000.0, time_s=10.0)
        2000.0
    """

    eta_knob: float
    max_power_W: float

    def __post_init__(self) -> None:
        if not 0.0 <= self.eta_knob <= 1.0:
            raise ValueError(f"eta_knob must be in [0, 1], got {self.eta_knob}")
        if not self.max_power_W > 0:
            raise ValueError(f"max_power_W must be positive, got {self.max_power_W}")

    @classmethod
    def for_gpus(cls, eta_knob: float, max_limit_W: float, num_gpus: int) -> ZeusCost:
        """Build the cost of ``num_gpus`` GPUs whose maximum power limit is ``max_limit_W`` each."""
        if num_gpus < 1:
            raise ValueError(f"num_gpus must be at least 1, got {num_gpus}")
        return cls(eta_knob=eta_knob, max_power_W=max_limit_W * num_gpus)

    def __call__(self, energy_J: float, time_s: float) -> float:
        """Return the cost (J-equivalent) of a run that used ``energy_J`` over ``time_s``."""
        return self.eta_knob * energy_J + (1.0 - self.eta_knob) * self.max_power_W * time_s

    def of_ranks(self, energy_J: Sequence[float], time_s: Sequence[float]) -> float:
        """Cost of a multi-GPU measurement: energies summed, time of the slowest rank."""
        return self(float(sum(energy_J)), float(max(time_s)))
