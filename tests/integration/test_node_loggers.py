"""Node figures (CPU, DRAM, GPU + CPU + DRAM) reach TensorBoard, W&B and the results in both frameworks (issue 29).

A real Lightning ``Trainer`` and a real HF ``Trainer`` on the CPU, the virtual GPU and ``node.virtual_cpu``
(no RAPL counter is readable here: the process's CPU time × a power per core, flagged simulated). The
TensorBoard event files are read back; W&B runs offline, its ``log`` calls kept as they are made. Each
logged epoch figure equals its JSONL record; the step figures are per-step means of the spans between two
CPU readings; the run's figures come at its end. The virtual CPU has no DRAM domain: no DRAM figure is
logged (never a 0 for it).
"""

from __future__ import annotations

import math

import pytest
from transformers import Trainer, TrainingArguments

from tests.integration.helpers import read_scalars, spy_wandb, virtual_config
from tests.integration.test_huggingface import RandomTokens, tiny_lm
from tests.integration.test_lightning_loggers import Regressor, loaders, trainer_for
from zeus_callbacks import ZeusCallback, ZeusTrainerCallback
from zeus_callbacks import reporting as metric
from zeus_callbacks.reporting import read_jsonl

NODE = {"virtual_cpu": True, "powercap_root": "/nonexistent-powercap"}  # no RAPL, whatever this machine has


def _node_config(tmp_path) -> dict:
    config = virtual_config(tmp_path, interval_steps=4)
    config["node"] = NODE
    return config


def _epochs(jsonl) -> list[dict]:
    return [r for r in read_jsonl(jsonl) if r["event"] == "epoch"]


def _check(series: dict[str, list[tuple[int, float]]], epochs: list[dict], end: dict, prefix: str = "") -> None:
    """The logged node figures against the JSONL records (``series``: key -> [(step, value)])."""
    for key, field in ((metric.EPOCH_CPU_ENERGY_J, "cpu_energy_J"), (metric.EPOCH_NODE_ENERGY_J, "node_energy_J")):
        values = [v for _, v in series[prefix + key]]
        assert values == pytest.approx([e[field] for e in epochs], rel=1e-6), key
    for key in (metric.STEP_CPU_ENERGY_J, metric.STEP_NODE_ENERGY_J):
        points = series.get(prefix + key, [])
        assert points and all(math.isfinite(v) and v > 0 for _, v in points), (key, points)
    # Per step, the node holds the GPU too: more than the CPU alone.
    cpu = dict(series[prefix + metric.STEP_CPU_ENERGY_J])
    node = dict(series[prefix + metric.STEP_NODE_ENERGY_J])
    assert all(node[s] > cpu[s] for s in cpu if s in node)
    assert not any(k.endswith(("step_dram_J", "epoch_dram_J")) for k in series)  # no DRAM domain: nothing logged
    assert end["cpu_energy_J"] > 0 and end["dram_energy_J"] is None and end["simulated"] is True
    assert end["node_energy_J"] == pytest.approx(end["energy_J"] + end["cpu_energy_J"], rel=1e-9)


def test_lightning_logs_node_figures_to_tensorboard_and_wandb(tmp_path, monkeypatch):
    from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger

    logged = spy_wandb(monkeypatch, tmp_path)
    import wandb

    callback = ZeusCallback(_node_config(tmp_path))
    tb = TensorBoardLogger(str(tmp_path / "tb"), name="", version="")
    trainer = trainer_for(tmp_path, callback, tb, WandbLogger(name="node", project="zeus", save_dir=str(tmp_path)),
                          max_epochs=3)  # fmt: skip
    train, _ = loaders()
    try:
        trainer.fit(Regressor(), train)
    finally:
        wandb.finish()
    summary = callback.summary
    records = read_jsonl(summary.jsonl_path)
    end = records[-1]
    epochs = _epochs(summary.jsonl_path)
    assert len(epochs) == 3
    _check(read_scalars(tmp_path / "tb"), epochs, end)
    from_wandb: dict[str, list[tuple[int, float]]] = {}
    for entry in logged:
        for key, value in entry.items():
            if key != "trainer/global_step" and isinstance(value, (int, float)):
                from_wandb.setdefault(key, []).append((entry.get("trainer/global_step", -1), float(value)))
    _check(from_wandb, epochs, end)
    assert summary.cpu_energy_J == pytest.approx(end["cpu_energy_J"])
    assert "SIMULATED CPU package" in str(summary)


def test_hf_trainer_logs_node_figures_and_its_results_hold_the_run_s(tmp_path):
    callback = ZeusTrainerCallback(_node_config(tmp_path))
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), num_train_epochs=2, per_device_train_batch_size=4, logging_steps=4,
        report_to=["tensorboard"], save_strategy="no", disable_tqdm=True, use_cpu=True,
    )  # fmt: skip
    trainer = Trainer(model=tiny_lm(), args=args, train_dataset=RandomTokens(48))
    callback.attach(trainer)
    output = trainer.train()
    summary = callback.summary
    end = read_jsonl(summary.jsonl_path)[-1]
    epochs = _epochs(summary.jsonl_path)
    assert len(epochs) == 2
    _check(read_scalars(tmp_path / "out"), epochs, end, prefix="train/")
    results = output.metrics
    assert results[metric.CPU_ENERGY_J] == pytest.approx(end["cpu_energy_J"])
    assert results[metric.NODE_ENERGY_J] == pytest.approx(end["node_energy_J"])
    assert metric.DRAM_ENERGY_J not in results and results[metric.SIMULATED] == 1.0


def test_hf_trainer_sends_node_figures_to_wandb(tmp_path, monkeypatch):
    logged = spy_wandb(monkeypatch, tmp_path)
    import wandb

    callback = ZeusTrainerCallback(_node_config(tmp_path))
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), num_train_epochs=2, per_device_train_batch_size=4, logging_steps=4,
        report_to=["wandb"], save_strategy="no", disable_tqdm=True, use_cpu=True,
    )  # fmt: skip
    trainer = Trainer(model=tiny_lm(), args=args, train_dataset=RandomTokens(48))
    callback.attach(trainer)
    try:
        trainer.train()
    finally:
        wandb.finish()
    end = read_jsonl(callback.summary.jsonl_path)[-1]
    epochs = _epochs(callback.summary.jsonl_path)
    series: dict[str, list[tuple[int, float]]] = {}
    for entry in logged:  # the W&B integration prefixes training logs with "train/"
        for key, value in entry.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                series.setdefault(key, []).append((int(entry.get("train/global_step", -1)), float(value)))
    _check(series, epochs, end, prefix="train/")
