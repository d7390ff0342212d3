"""The run's CO2 and electricity-cost estimates: energy (kWh) times a factor the user gives.

``co2_g = energy_J / 3.6e6 * intensity_g_per_kWh`` and ``cost = energy_J / 3.6e6 * price_per_kWh``.
Both are estimates: the factor is a yearly or tariff average, not the grid at the run's hours. The
energy is the node's (GPUs + CPU package + DRAM, ``energy_basis`` ``"node"``) where the run measured it
(``node.rapl``, ``node.virtual_cpu``), else the measured GPUs' only (``"gpu"``); never cooling or the power
supply's losses. Each estimate carries the factor, where it came from and its energy basis, so a reader can
redo it; an unknown energy gives a null figure with its reason, never 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from zeus_callbacks._grid_intensity import grid_intensity
from zeus_callbacks._units import kwh_from_J
from zeus_callbacks.config import CarbonConfig, CostConfig

CONFIGURED = "carbon.intensity_g_per_kWh (configured)"
"""``intensity_source`` of an intensity the configuration gives directly."""

ENERGY_BASES = {"node": "the node's energy (GPU + CPU + DRAM as measured)", "gpu": "the GPUs' energy only"}
"""What an estimate's ``energy_basis`` means, as the summary and ``report`` print it."""


@dataclass(frozen=True)
class CarbonEstimate:
    """The run's CO2 estimate and the factor behind it.

    Attributes:
        co2_g: Estimated emissions (g CO2e), None when the energy is unknown (see ``reason``).
        intensity_g_per_kWh: The grid carbon intensity used (gCO2e/kWh).
        intensity_source: Where the intensity came from (the configuration, or the bundled table's
            source, country and year).
        estimate: Always True: the figure is an estimate, not a measurement.
        reason: Why ``co2_g`` is None; None when it is known.
        energy_basis: ``"node"`` (GPUs + CPU + DRAM as measured) or ``"gpu"`` (the GPUs only):
            :data:`ENERGY_BASES`.
    """

    co2_g: float | None
    intensity_g_per_kWh: float
    intensity_source: str
    estimate: bool = True
    reason: str | None = None
    energy_basis: str = "gpu"


@dataclass(frozen=True)
class CostEstimate:
    """The run's electricity-cost estimate and the price behind it.

    Attributes:
        cost: Estimated cost in ``currency``, None when the energy is unknown (see ``reason``).
        price_per_kWh: The price used (``currency`` per kWh).
        currency: The price's currency, as configured.
        estimate: Always True: the figure is an estimate, not a bill.
        reason: Why ``cost`` is None; None when it is known.
        energy_basis: ``"node"`` or ``"gpu"``, as :attr:`CarbonEstimate.energy_basis`.
    """

    cost: float | None
    price_per_kWh: float
    currency: str
    estimate: bool = True
    reason: str | None = None
    energy_basis: str = "gpu"


def intensity_of(config: CarbonConfig) -> tuple[float, str] | None:
    """``(intensity_g_per_kWh, intensity_source)`` the ``carbon`` section asks for, or None when it asks for none."""
    if config.intensity_g_per_kWh is not None:
        return config.intensity_g_per_kWh, CONFIGURED
    if config.region is not None:
        entry = grid_intensity(config.region)
        return entry.intensity_g_per_kWh, entry.source
    return None


def carbon_estimate(
    energy_J: float | None, config: CarbonConfig, *, unknown_reason: str, basis: str = "gpu"
) -> CarbonEstimate | None:
    """``energy_J`` in kWh times the configured grid intensity (g CO2e); None when no intensity is configured.

    An unknown energy (None, NaN) gives ``co2_g`` None with ``unknown_reason``; ``basis`` is a key of
    :data:`ENERGY_BASES`.
    """
    factor = intensity_of(config)
    if factor is None:
        return None
    intensity, source = factor
    kwh = kwh_from_J(energy_J)
    if kwh is None:
        return CarbonEstimate(None, intensity, source, reason=unknown_reason, energy_basis=basis)
    return CarbonEstimate(kwh * intensity, intensity, source, energy_basis=basis)


def cost_estimate(
    energy_J: float | None, config: CostConfig, *, unknown_reason: str, basis: str = "gpu"
) -> CostEstimate | None:
    """``energy_J`` in kWh times the configured price; None when no price is configured (as :func:`carbon_estimate`)."""
    if config.price_per_kWh is None or config.currency is None:
        return None
    kwh = kwh_from_J(energy_J)
    if kwh is None:
        return CostEstimate(None, config.price_per_kWh, config.currency, reason=unknown_reason, energy_basis=basis)
    return CostEstimate(kwh * config.price_per_kWh, config.price_per_kWh, config.currency, energy_basis=basis)
