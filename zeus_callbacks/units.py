"""Energy units people read: watt-hours and kilowatt-hours beside joules.

Every figure is kept and logged in joules (``energy_J``); these helpers only add the
equivalent a person reads on an electricity bill. 1 Wh = 3600 J, 1 kWh = 3.6e6 J (SI).
"""

from __future__ import annotations

import math

J_PER_WH = 3600.0
"""Joules in one watt-hour (1 W for 3600 s)."""
J_PER_KWH = 1000.0 * J_PER_WH
"""Joules in one kilowatt-hour."""


def wh_from_J(energy_J: float | None) -> float | None:
    """``energy_J`` in watt-hours; None for None or a non-finite figure (unknown stays unknown).

    Args:
        energy_J: Energy (J), or None.

    Returns:
        Energy (Wh), or None.
    """
    if energy_J is None or not math.isfinite(energy_J):
        return None
    return energy_J / J_PER_WH


def kwh_from_J(energy_J: float | None) -> float | None:
    """``energy_J`` in kilowatt-hours; None for None or a non-finite figure.

    Args:
        energy_J: Energy (J), or None.

    Returns:
        Energy (kWh), or None.
    """
    if energy_J is None or not math.isfinite(energy_J):
        return None
    return energy_J / J_PER_KWH


def three_figures(value: float) -> str:
    """``value`` to three significant figures, with thousands separators, never in e-notation."""
    if value == 0:
        return "0"
    decimals = max(0, 2 - math.floor(math.log10(abs(value))))
    return f"{value:,.{decimals}f}"


def readable_energy(energy_J: float | None) -> str:
    """The watt-hour reading of ``energy_J``: ``"0.282 Wh"``, or ``"12.3 kWh"`` from 1 kWh on.

    Three significant figures; ``"n/a"`` for None or a non-finite figure.

    Args:
        energy_J: Energy (J), or None.

    Returns:
        The figure with its unit (Wh below 1 kWh, else kWh).

    Example:
        >>> readable_energy(1013.8)
        '0.282 Wh'
        >>> readable_energy(4.5e7)
        '12.5 kWh'
    """
    wh = wh_from_J(energy_J)
    if wh is None:
        return "n/a"
    if abs(wh) >= 1000.0:
        return f"{three_figures(wh / 1000.0)} kWh"
    return f"{three_figures(wh)} Wh"
