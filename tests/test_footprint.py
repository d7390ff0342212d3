"""CO2 and cost estimates (issue 29): a real Lightning run, the region table, bad configuration."""

from __future__ import annotations

import math

import lightning.pytorch as L
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.integration.helpers import read_scalars, virtual_config
from zeus_callbacks import ZeusCallback
from zeus_callbacks._footprint import CONFIGURED, ENERGY_BASES, carbon_estimate, cost_estimate
from zeus_callbacks._grid_intensity import grid_intensity, known_regions
from zeus_callbacks._units import three_figures
from zeus_callbacks.cli import main
from zeus_callbacks.config import ConfigError, parse_config
from zeus_callbacks.reporting import read_jsonl

INTENSITY_G_PER_KWH = 420.0
PRICE_PER_KWH = 0.31


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _fit(tmp_path, config: dict):
    callback = ZeusCallback(config)
    trainer = L.Trainer(
        accelerator="cpu", devices=1, callbacks=[callback], logger=TensorBoardLogger(str(tmp_path / "tb"), name="run"),
        max_epochs=1, log_every_n_steps=1, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False,
    )  # fmt: skip
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g))
    trainer.fit(Tiny(), DataLoader(data, batch_size=8))
    return callback.summary


@pytest.mark.parametrize("node", [False, True], ids=["gpu-only", "node"])
def test_a_lightning_run_logs_co2_and_cost_estimates_with_their_factors(tmp_path, capsys, node):
    config = virtual_config(tmp_path)
    config["carbon"] = {"intensity_g_per_kWh": INTENSITY_G_PER_KWH}
    config["cost"] = {"price_per_kWh": PRICE_PER_KWH, "currency": "EUR"}
    if node:  # the whole node measured (here the virtual CPU beside the virtual GPU): the estimates are of it
        config["node"] = {"virtual_cpu": True, "powercap_root": str(tmp_path / "no-powercap")}
    summary = _fit(tmp_path, config)

    end = [r for r in read_jsonl(tmp_path / "zeus" / "test.jsonl") if r["event"] == "run_end"][-1]
    energy_J = end["node_energy_J"] if node else end["energy_J"]
    basis = "node" if node else "gpu"
    assert energy_J > 0 and (not node or energy_J > end["energy_J"])
    # The hand calculation: J -> kWh (3.6e6 J) times the factor. approx: one float product in another order.
    co2_g = energy_J / 3.6e6 * INTENSITY_G_PER_KWH
    cost = energy_J / 3.6e6 * PRICE_PER_KWH
    assert end["carbon"] == {"co2_g": pytest.approx(co2_g, rel=1e-12), "intensity_g_per_kWh": INTENSITY_G_PER_KWH,
                             "intensity_source": CONFIGURED, "estimate": True, "reason": None,
                             "energy_basis": basis}  # fmt: skip
    assert end["cost"] == {"cost": pytest.approx(cost, rel=1e-12), "price_per_kWh": PRICE_PER_KWH,
                           "currency": "EUR", "estimate": True, "reason": None, "energy_basis": basis}  # fmt: skip
    assert end["simulated"] is True  # the virtual GPU's energy: so are the estimates

    assert summary.carbon.co2_g == pytest.approx(co2_g, rel=1e-12) and summary.cost.cost == pytest.approx(cost)
    text = str(summary)
    assert "CO2 (ESTIMATE)" in text and "420 gCO2e/kWh" in text and "0.31 EUR/kWh" in text
    said = f"on {ENERGY_BASES[basis]}"
    assert text.count(said) == 2  # CO2 and cost each say whose energy they are of

    scalars = read_scalars(tmp_path / "tb")
    # One point each, at the end; approx: TensorBoard stores float32.
    (co2_point,) = scalars["energy/co2_g"]
    (cost_point,) = scalars["cost/run"]
    assert co2_point[1] == pytest.approx(co2_g, rel=1e-6) and cost_point[1] == pytest.approx(cost, rel=1e-6)
    assert co2_point[0] == scalars["energy/total_J"][-1][0]

    capsys.readouterr()
    assert main(["report", str(tmp_path / "zeus" / "test.jsonl")]) == 0
    out = " ".join(capsys.readouterr().out.split())  # report wraps long lines
    assert f"CO2 (ESTIMATE) {three_figures(co2_g)} g CO2e at 420 gCO2e/kWh" in out
    assert f"cost (ESTIMATE) {three_figures(cost)} EUR at 0.31 EUR/kWh, {said}" in out


def test_without_a_factor_there_is_no_estimate(tmp_path):
    summary = _fit(tmp_path, virtual_config(tmp_path))
    end = [r for r in read_jsonl(tmp_path / "zeus" / "test.jsonl") if r["event"] == "run_end"][-1]
    assert end["carbon"] is None and end["cost"] is None and summary.carbon is None
    scalars = read_scalars(tmp_path / "tb")
    assert "energy/co2_g" not in scalars and "cost/run" not in scalars


def test_unknown_energy_gives_null_with_a_reason_never_0():
    cfg = parse_config({"carbon": {"region": "FR"}, "cost": {"price_per_kWh": 0.2, "currency": "EUR"}})
    for energy_J in (None, math.nan):
        carbon = carbon_estimate(energy_J, cfg.carbon, unknown_reason="the GPU cannot be measured")
        cost = cost_estimate(energy_J, cfg.cost, unknown_reason="the GPU cannot be measured")
        assert carbon is not None and carbon.co2_g is None and carbon.reason == "the GPU cannot be measured"
        assert carbon.intensity_g_per_kWh == 56.0
        assert cost is not None and cost.cost is None and cost.reason == "the GPU cannot be measured"


def test_region_lookup_uses_the_bundled_table():
    de = grid_intensity("de")  # case-insensitive
    assert (de.region, de.year, de.intensity_g_per_kWh) == ("DE", 2023, 381.0)
    assert "Ember" in de.source and "Germany (DE) 2023" in de.source
    assert {"FR", "IN", "BR", "CN"} <= set(known_regions())
    cfg = parse_config({"carbon": {"region": "in"}})
    assert cfg.carbon.region == "IN"
    carbon = carbon_estimate(3.6e6, cfg.carbon, unknown_reason="-")  # 1 kWh
    assert carbon is not None and carbon.co2_g == pytest.approx(713.0)  # approx: 3.6e6 / 3.6e6 * 713 in floats
    assert carbon.intensity_source == de.source.replace("Germany (DE)", "India (IN)")


@pytest.mark.parametrize(
    ("data", "names"),
    [
        ({"carbon": {"region": "XX"}}, ["carbon.region", "no bundled grid carbon intensity", "DE"]),
        ({"carbon": {"region": "US"}}, ["carbon.region", "carbon.intensity_g_per_kWh"]),
        ({"cost": {"price_per_kWh": -0.1, "currency": "EUR"}}, ["cost.price_per_kWh", "greater than or equal to 0"]),
        ({"cost": {"price_per_kWh": 0.1}}, ["cost:", "cost.currency"]),
        ({"carbon": {"intensity_g_per_kWh": -5}}, ["carbon.intensity_g_per_kWh"]),
        ({"carbon": {"intensity_g_per_kWh": 300, "region": "FR"}}, ["carbon:", "not both"]),
        ({"carbon": {"intensity_g_per_kwh": 300}}, ["carbon.intensity_g_per_kwh", "Extra inputs"]),
        ({"cost": {"price": 0.1}}, ["cost.price", "Extra inputs"]),
    ],
)
def test_bad_configuration_names_the_key(data, names):
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    for name in names:
        assert name in str(info.value)


def test_an_unmeasurable_gpu_gives_null_estimates_with_the_reason(tmp_path):
    from zeus_callbacks.backends._detect import GPUPresence
    from zeus_callbacks.backends._unavailable import UnavailableBackend
    from zeus_callbacks.session import EnergySession

    backend = UnavailableBackend(GPUPresence(nvidia_nodes=("nvidia0",)), "nvmlInit failed", "load the driver")
    session = EnergySession(
        {"logging": {"log_dir": str(tmp_path), "run_name": "u"}, "carbon": {"region": "FR"},
         "cost": {"price_per_kWh": 0.2, "currency": "EUR"}},
        backend=backend, is_main_process=True,
    )  # fmt: skip
    session.train_start()
    summary = session.train_end()
    end = [r for r in read_jsonl(tmp_path / "u.jsonl") if r["event"] == "run_end"][-1]
    assert end["carbon"]["co2_g"] is None and "nvmlInit failed" in end["carbon"]["reason"]
    assert end["carbon"]["intensity_g_per_kWh"] == 56.0 and end["cost"]["cost"] is None
    assert end["energy_Wh"] is None
    assert "energy/co2_g" not in session.totals() and "cost/run" not in session.totals()
    assert "CO2 (ESTIMATE) unknown" in str(summary)
