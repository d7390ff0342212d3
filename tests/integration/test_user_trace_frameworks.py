"""A user's own trace (any GPU) drives the virtual GPU under both trainers."""

from __future__ import annotations

import pytest

from tests.integration import test_huggingface as hf
from tests.integration import test_lightning as lt
from tests.integration.helpers import virtual_config
from tests.test_user_traces import POWER_W, write_trace
from zeus_callbacks import ZeusCallback, ZeusTrainerCallback
from zeus_callbacks.reporting import read_jsonl


def trace_config(tmp_path) -> dict:
    config = virtual_config(tmp_path)
    config["virtual"] = {"trace": str(write_trace(tmp_path / "rtx6000.csv")), "batch_size": 64, "noise_W": 3.0}
    return config


def run_start_device(tmp_path) -> str:
    record = next(r for r in read_jsonl(tmp_path / "zeus" / "test.jsonl") if r["event"] == "run_start")
    return str(record)


def test_lightning_trains_on_a_user_trace(tmp_path):
    callback = ZeusCallback(trace_config(tmp_path))
    trainer = lt.make_trainer(tmp_path, callback, max_epochs=1)
    train, val = lt.loaders()
    trainer.fit(lt.TinyRegressor(), train, val)
    summary = callback.summary
    assert summary is not None and summary.status == "completed" and summary.steps == lt.N_TRAIN // lt.BATCH
    # At the maximum limit (260 W) the card draws the trace's 196 W (3 W sensor noise, a few steps).
    assert summary.energy_J / summary.time_s == pytest.approx(POWER_W[64][-1], rel=0.1)
    assert "RTX 6000" in run_start_device(tmp_path)


def test_hf_trainer_trains_on_a_user_trace(tmp_path):
    callback = ZeusTrainerCallback(trace_config(tmp_path))
    hf.make_trainer(tmp_path, callback, report_to=[]).train()
    summary = callback.summary
    assert summary is not None and summary.status == "completed" and summary.steps == 12
    assert summary.energy_J / summary.time_s == pytest.approx(POWER_W[64][-1], rel=0.1)
    assert "RTX 6000" in run_start_device(tmp_path)
