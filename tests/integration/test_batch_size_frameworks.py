"""Lightning and Hugging Face runs that take the bandit's batch size and report back to the store."""

from __future__ import annotations

import logging

import lightning.pytorch as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.integration.helpers import virtual_config
from zeus_callbacks import ZeusCallback, ZeusTrainerCallback, suggest_batch_size
from zeus_callbacks.reporting import read_jsonl
from zeus_callbacks.store import open_store


def bandit_config(tmp_path, metric: str, **extra) -> dict:
    config = virtual_config(tmp_path)
    config["job_id"] = "recurring"
    config["batch_size"] = {
        "enabled": True,
        "batch_sizes": [4, 8, 16],
        "default_batch_size": 8,
        # Any finite loss reaches this target: the first evaluation converges and stops the run.
        "target": {"metric": metric, "value": 1e9, "direction": "min"},
        # Wall-clock runs vary under load: no early stop here (tests/test_session_batch_size.py covers it).
        "beta_knob": None,
        **extra,
    }
    return config


class HParamRegressor(L.LightningModule):
    """Reads its batch size from hparams when it builds its loaders, as BatchSizeFinder expects."""

    def __init__(self, batch_size: int = 32, lr: float = 0.01) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = nn.Linear(4, 1)
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g)
        self.loader_batch_sizes: list[int] = []

    def train_dataloader(self):
        self.loader_batch_sizes.append(self.hparams.batch_size)
        return DataLoader(TensorDataset(self.x, self.y), batch_size=self.hparams.batch_size)

    def val_dataloader(self):
        return DataLoader(TensorDataset(self.x[:16], self.y[:16]), batch_size=16)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/loss", nn.functional.mse_loss(self.layer(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def fit_once(tmp_path, config) -> tuple[HParamRegressor, ZeusCallback, L.Trainer]:
    model = HParamRegressor()
    callback = ZeusCallback(config)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=3,
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model)
    return model, callback, trainer


def test_lightning_takes_the_suggested_batch_size_and_reports_back(tmp_path):
    config = bandit_config(tmp_path, "val/loss", lr_scaling="linear")
    model, callback, trainer = fit_once(tmp_path, config)
    assert model.hparams.batch_size == 8 and model.loader_batch_sizes == [8]
    assert trainer.current_epoch == 1  # the target was reached at the first validation: stopped
    model, callback, trainer = fit_once(tmp_path, config)
    assert model.hparams.batch_size == 4 and model.loader_batch_sizes == [4]  # pruning goes down
    assert model.hparams.lr == pytest.approx(0.005)  # linear scaling from 0.01 at batch size 8
    with open_store(tmp_path / "zeus" / "zeus_store.sqlite") as store:
        trials = store.list_trials("recurring")
    assert [(t.batch_size, t.status, t.converged) for t in trials] == [(8, "completed", True), (4, "completed", True)]
    assert all(t.energy_J > 0 and t.cost > 0 for t in trials)
    events = [r["event"] for r in read_jsonl(callback.summary.jsonl_path)]
    assert "batch_size" in events and "trial" in events


def hf_trainer(tmp_path, callback, batch_size: int):
    from transformers import Trainer, TrainingArguments

    from tests.integration.test_huggingface import RandomTokens, tiny_lm

    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=12,
        per_device_train_batch_size=batch_size,
        eval_strategy="steps",
        eval_steps=3,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        use_cpu=True,
    )
    return Trainer(
        model=tiny_lm(), args=args, train_dataset=RandomTokens(200), eval_dataset=RandomTokens(8), callbacks=[callback]
    )


def test_huggingface_suggestion_before_training_arguments_and_mismatch_warning(tmp_path, caplog):
    config = bandit_config(tmp_path, "eval_loss")
    bs = suggest_batch_size(config)  # before TrainingArguments
    assert bs == 8
    trainer = hf_trainer(tmp_path, ZeusTrainerCallback(config), bs)
    with caplog.at_level(logging.WARNING, logger="zeus_callbacks"):
        trainer.train()
    assert "carries no suggestion" not in caplog.text  # the suggestion itself was handed on
    caplog.clear()
    assert trainer.state.global_step == 3  # stopped at the first evaluation: target reached

    # Second recurrence: the bandit wants 4 but the Trainer is built with 8 -> a warning, trial recorded at 8.
    trainer = hf_trainer(tmp_path, ZeusTrainerCallback(config), 8)
    with caplog.at_level(logging.WARNING, logger="zeus_callbacks"):
        trainer.train()
    assert "not the suggested 4" in caplog.text
    assert "carries no suggestion" in caplog.text  # a plain 8, not what suggest_batch_size() returned
    with open_store(tmp_path / "zeus" / "zeus_store.sqlite") as store:
        trials = store.list_trials("recurring")
    assert [(t.batch_size, t.status, t.converged) for t in trials] == [(8, "completed", True), (8, "completed", True)]
    assert trials[1].info["phase"] == "pruning"
