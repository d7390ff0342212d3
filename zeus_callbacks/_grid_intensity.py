"""Yearly average grid carbon intensity by country, from a small table shipped with the package.

The table (``data/grid_intensity/owid_ember_2023.csv``) holds the 2023 carbon intensity of
electricity generation (gCO2e/kWh, lifecycle) of the countries it lists, from Our World in
Data's series built on Ember's yearly electricity data and the Energy Institute (CC BY 4.0);
its header cites the page. It is read from the installed package: nothing is fetched at run
time. A yearly national average is an estimate of any one run's grid: see docs/node_energy.md.
"""

from __future__ import annotations

import csv
import functools
import io
from dataclasses import dataclass
from importlib import resources

TABLE = "owid_ember_2023.csv"
"""The bundled table's file name (under ``zeus_callbacks/data/grid_intensity/``)."""
SOURCE = "Our World in Data / Ember and Energy Institute, yearly average"
"""How a looked-up intensity's source is named in records (with the region and year)."""


@dataclass(frozen=True)
class GridIntensity:
    """One country's yearly average carbon intensity of electricity generation.

    Attributes:
        region: ISO 3166-1 alpha-2 code (upper case).
        country: The country's name as the source gives it.
        year: The year the average covers.
        intensity_g_per_kWh: Grams of CO2-equivalents per kilowatt-hour generated (gCO2e/kWh).
    """

    region: str
    country: str
    year: int
    intensity_g_per_kWh: float

    @property
    def source(self) -> str:
        """``"<SOURCE>, <country> (<region>) <year>"``: what a record names as the factor's origin."""
        return f"{SOURCE}, {self.country} ({self.region}) {self.year}"


@functools.cache
def _table() -> dict[str, GridIntensity]:
    text = resources.files("zeus_callbacks").joinpath(f"data/grid_intensity/{TABLE}").read_text(encoding="utf-8")
    rows = csv.DictReader(io.StringIO("".join(line for line in text.splitlines(True) if not line.startswith("#"))))
    return {
        row["region"]: GridIntensity(row["region"], row["country"], int(row["year"]), float(row["intensity_g_per_kWh"]))
        for row in rows
    }


def known_regions() -> list[str]:
    """The ISO 3166-1 alpha-2 codes the bundled table holds, sorted."""
    return sorted(_table())


def grid_intensity(region: str) -> GridIntensity:
    """The bundled yearly average carbon intensity of ``region`` (ISO 3166-1 alpha-2, case-insensitive).

    Raises:
        ValueError: The table has no value for ``region``; the message lists the codes it has and
            says to set ``carbon.intensity_g_per_kWh`` instead.
    """
    entry = _table().get(region.strip().upper())
    if entry is None:
        raise ValueError(
            f"no bundled grid carbon intensity for region {region!r}; the table ({TABLE}) has "
            f"{', '.join(known_regions())}. Set carbon.intensity_g_per_kWh to your grid's figure instead"
        )
    return entry
