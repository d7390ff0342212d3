"""Watt-hours beside joules: the summary object, its text and the ``report`` command (issue 29)."""

import math

import pytest

from zeus_callbacks._units import (
    J_PER_KWH,
    J_PER_WH,
    joule_unit,
    kwh_from_J,
    readable_energy,
    readable_interval_J,
    readable_joules,
    significant_figures,
    wh_from_J,
)
from zeus_callbacks.cli import main
from zeus_callbacks.session import EnergySession


@pytest.mark.parametrize(
    ("energy_J", "text"),
    [
        (1013.8, "0.282 Wh"),  # the README example's run: 1,013.8 J / 3600
        (3600.0, "1.00 Wh"),
        (123_456.0, "34.3 Wh"),
        (3.6e6, "1.00 kWh"),  # from 1 kWh on, kWh
        (4.5e7, "12.5 kWh"),
        (3.6e9, "1,000 kWh"),
        (None, "n/a"),
        (math.nan, "n/a"),
    ],
)
def test_readable_energy(energy_J, text):
    assert readable_energy(energy_J) == text


@pytest.mark.parametrize(
    ("energy_J", "figures", "text"),
    [
        (1534.9, 4, "1.535 kJ"),  # profile-kernel printed this as 1.535e+06 mJ
        (534.9, 4, "534.9 J"),
        (1.5349e6, 4, "1,535 kJ"),
        (2.5e9, 3, "2,500,000 kJ"),  # kJ is the largest unit: all the digits, no exponent
        (0.0123, 3, "12.3 mJ"),
        (0.5, 3, "500 mJ"),
        (1.0, 3, "1.00 J"),
        (999.4, 3, "999 J"),
        (2e-7, 3, "0.000200 mJ"),  # below 1 mJ: still mJ, still plain digits
        (-0.25, 3, "-250 mJ"),  # a CI's lower end may be negative
        (0.0, 3, "0 mJ"),
    ],
)
def test_readable_joules(energy_J, figures, text):
    assert readable_joules(energy_J, figures=figures) == text
    assert "e+" not in text and "e-" not in text


def test_an_interval_takes_its_estimates_unit():
    # Both ends in the estimate's unit, so they compare at a glance (1,002 kJ would read as smaller).
    assert joule_unit(534.9) == (1.0, "J")
    assert readable_interval_J(998.0, 1_002_000.0, 534.9, figures=4) == "[998.0, 1,002,000] J"
    assert readable_interval_J(-0.002, 0.0791, 0.0400) == "[-2.00, 79.1] mJ"
    assert significant_figures(12_345.678, 3) == "12,346"


def test_conversions_keep_unknown_unknown():
    assert wh_from_J(7200.0) == pytest.approx(2.0)  # approx: float division
    assert kwh_from_J(J_PER_KWH) == pytest.approx(1.0)
    assert J_PER_KWH == 1000 * J_PER_WH
    assert wh_from_J(None) is None and wh_from_J(math.nan) is None and kwh_from_J(math.inf) is None


def _run(tmp_path, virtual_backend, manual_clock):
    session = EnergySession(
        {"logging": {"log_dir": str(tmp_path), "run_name": "r1", "interval_steps": 2}}, backend=virtual_backend
    )
    session.train_start()
    session.epoch_start(0)
    for step in range(4):
        session.step_start(step)
        manual_clock.advance(0.5)
        session.sampler.poll_once()
        session.step_end(step)
    session.epoch_end(0)
    return session.train_end()


def test_summary_and_report_show_watt_hours(tmp_path, capsys, virtual_backend, manual_clock):
    summary = _run(tmp_path, virtual_backend, manual_clock)
    assert summary.energy_J > 0
    # approx: a float division of the same figure
    assert summary.energy_Wh == pytest.approx(summary.energy_J / 3600.0)
    assert summary.as_dict()["energy_Wh"] == summary.energy_Wh
    (line,) = [line for line in str(summary).splitlines() if line.startswith("  energy ")]
    assert f"({readable_energy(summary.energy_J)})" in line and " J " in line
    assert main(["report", str(tmp_path / "r1.jsonl")]) == 0
    (energy_line,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  energy ")]
    assert f"J ({readable_energy(summary.energy_J)}) over" in energy_line
