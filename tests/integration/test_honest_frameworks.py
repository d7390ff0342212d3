"""A real Lightning Trainer on a GPU that cannot be measured, and on the virtual GPU (issue 16 item 1).

Only the hardware is faked: NVML is the fake library with ``nvmlInit`` failing, the machine shows
``/dev/nvidia0`` (through the injectable detection), amdsmi is absent. Training must go on; the
TensorBoard event files (read back) must hold no energy or power figure, only the
``energy/unavailable`` flag; on the virtual GPU every batch carries ``energy/simulated``.
"""

from __future__ import annotations

import math
import sys

from tests.fakes import fake_pynvml as fp
from tests.integration.helpers import read_scalars, virtual_config
from tests.integration.test_lightning import BATCH, N_TRAIN, TinyRegressor, loaders, make_trainer
from zeus_callbacks import ZeusCallback, backends
from zeus_callbacks.backends import GPUPresence
from zeus_callbacks.reporting import read_jsonl


def test_lightning_on_an_unmeasurable_gpu_trains_and_logs_no_energy(tmp_path, monkeypatch):
    fake = fp.FakePyNVML(num_gpus=1)
    fake.fail_always("nvmlInit", fp.NVML_ERROR_DRIVER_NOT_LOADED)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    monkeypatch.setattr(backends, "detect_gpus", lambda: GPUPresence(nvidia_nodes=("nvidia0",)))
    config = {**virtual_config(tmp_path), "backend": "auto"}
    callback = ZeusCallback(config)
    trainer = make_trainer(tmp_path, callback, max_epochs=1)
    train, val = loaders()
    trainer.fit(TinyRegressor(), train, val)

    summary = callback.summary
    assert summary is not None and summary.status == "completed" and summary.steps == N_TRAIN // BATCH
    assert summary.measurement == "unavailable" and math.isnan(summary.energy_J)
    scalars = read_scalars(tmp_path / "tb")
    assert "energy/unavailable" in scalars
    figures = [t for t in scalars if t.startswith(("energy/", "power/")) and t != "energy/unavailable"]
    assert figures == [], figures
    records = read_jsonl(tmp_path / "zeus" / "test.jsonl")
    assert records[0]["measurement"] == "unavailable" and records[-1]["energy_J"] is None


def test_lightning_on_the_virtual_gpu_flags_every_logged_batch_simulated(tmp_path):
    callback = ZeusCallback(virtual_config(tmp_path))
    trainer = make_trainer(tmp_path, callback, max_epochs=1)
    train, val = loaders()
    trainer.fit(TinyRegressor(), train, val)
    scalars = read_scalars(tmp_path / "tb")
    assert scalars["energy/simulated"] and all(v == 1.0 for _, v in scalars["energy/simulated"])
    steps_logged = {s for s, _ in scalars["energy/step_J"]}
    assert steps_logged <= {s for s, _ in scalars["energy/simulated"]}
    assert callback.summary is not None and callback.summary.simulated
