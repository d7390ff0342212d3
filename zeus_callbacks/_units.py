"""Energy units people read: watt-hours and kilowatt-hours beside joules, and joules at a readable scale.

Every figure is kept and logged in joules (``energy_J``); these helpers only add the
equivalent a person reads on an electricity bill, or pick mJ, J or kJ for a printed figure.
1 Wh = 3600 J, 1 kWh = 3.6e6 J (SI).
"""

from __future__ import annotations

import math

J_PER_WH = 3600.0
"""Joules in one watt-hour (1 W for 3600 s)."""
J_PER_KWH = 1000.0 * J_PER_WH
"""Joules in one kilowatt-hour."""


def wh_from_J(energy_J: float | None) -> float | None:
    """``energy_J`` (J) in watt-hours; None for None or a non-finite figure (unknown stays unknown)."""
    return _scaled(energy_J, J_PER_WH)


def kwh_from_J(energy_J: float | None) -> float | None:
    """``energy_J`` (J) in kilowatt-hours; None for None or a non-finite figure."""
    return _scaled(energy_J, J_PER_KWH)


def _scaled(energy_J: float | None, joules_per_unit: float) -> float | None:
    return None if energy_J is None or not math.isfinite(energy_J) else energy_J / joules_per_unit


def three_figures(value: float) -> str:
    """``value`` to three significant figures, with thousands separators, never in e-notation."""
    return significant_figures(value, 3)


def significant_figures(value: float, figures: int) -> str:
    """``value`` to ``figures`` significant figures, with thousands separators, never in e-notation.

    Large values keep all their integer digits (``12,345`` at three figures).
    """
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    decimals = max(0, figures - 1 - math.floor(math.log10(abs(value))))
    return f"{value:,.{decimals}f}"


_JOULE_SCALES = ((1e3, "kJ"), (1.0, "J"), (1e-3, "mJ"))  # largest first; mJ below 1 J


def joule_unit(energy_J: float) -> tuple[float, str]:
    """``(joules per unit, unit name)`` printing ``energy_J`` with 1 to 999 before the point, e.g. ``(1e-3, "mJ")``."""
    size = abs(energy_J) if math.isfinite(energy_J) else 0.0
    return next(((scale, unit) for scale, unit in _JOULE_SCALES if size >= scale), _JOULE_SCALES[-1])


def readable_joules(energy_J: float, figures: int = 3) -> str:
    """``energy_J`` in mJ, J or kJ by its size, to ``figures`` significant figures, in plain digits.

    Example:
        >>> readable_joules(1534.9, figures=4)
        '1.535 kJ'
        >>> readable_joules(0.0123)
        '12.3 mJ'
    """
    scale, name = joule_unit(energy_J)
    return f"{significant_figures(energy_J / scale, figures)} {name}"


def readable_energy(energy_J: float | None) -> str:
    """``energy_J`` in Wh (kWh from 1 kWh on) to three significant figures; ``"n/a"`` for None or non-finite.

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


def readable_interval_J(low_J: float, high_J: float, estimate_J: float, figures: int = 3) -> str:
    """An interval's ends (J) in the unit of its estimate, so they compare at a glance: ``"[79.3, 80.8] mJ"``."""
    scale, unit = joule_unit(estimate_J)
    return f"[{significant_figures(low_J / scale, figures)}, {significant_figures(high_J / scale, figures)}] {unit}"
