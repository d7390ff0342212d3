"""The adapters measure the last step before each pause, whatever ``windows.sample_fraction`` draws.

On an H100 a sampled HF run with evaluations every 20 steps left each epoch's last steps in a
``steps`` record with null means and estimated the steps after the last drawn one before each
evaluation (docs/results/gpu_acceptance_h100_2026-12-07d.md). Here a real Lightning Trainer
(validation every 0.3 of an epoch) and a real Hugging Face Trainer (``eval_steps``, an epoch's
end, ``max_steps``) measure 2 % of their steps: the step before each pause must be measured,
and no epoch's steps be estimated.
"""

from __future__ import annotations

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, TensorDataset
from transformers import Trainer, TrainerCallback, TrainingArguments

from tests.integration.helpers import virtual_config
from tests.integration.test_huggingface import RandomTokens, tiny_lm
from tests.integration.test_lightning import TinyRegressor, loaders
from zeus_callbacks import ZeusCallback, ZeusTrainerCallback
from zeus_callbacks.reporting import read_jsonl


def sampled_config(tmp_path, name: str) -> dict:
    config = virtual_config(tmp_path, interval_steps=50, run_name=name)
    config["windows"] = {"sample_fraction": 0.02}
    return config


class MeasuredBatches(Callback):
    """After ZeusCallback's batch start (callback order): which batches of each epoch it measures."""

    def __init__(self, zeus: ZeusCallback) -> None:
        self.zeus = zeus
        self.measured: set[tuple[int, int]] = set()
        self.before_validation: set[tuple[int, int]] = set()
        self._last: tuple[int, int] | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._last = (trainer.current_epoch, batch_idx)
        if self.zeus.session.measuring:
            self.measured.add(self._last)

    def on_validation_start(self, trainer, pl_module):
        if not trainer.sanity_checking and self._last is not None:
            self.before_validation.add(self._last)


def test_lightning_measures_the_batch_before_each_validation_and_each_epochs_last_batch(tmp_path):
    zeus = ZeusCallback(sampled_config(tmp_path, "pl"))
    spy = MeasuredBatches(zeus)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(640, 16, generator=g), torch.randn(640, 1, generator=g)
    train = DataLoader(TensorDataset(x, y), batch_size=8)  # 80 batches an epoch: validation after 24, 48 and 72
    _, val = loaders()
    trainer = L.Trainer(accelerator="cpu", devices=1, callbacks=[zeus, spy], logger=False, max_epochs=3,
                        default_root_dir=str(tmp_path),
                        val_check_interval=0.3, num_sanity_val_steps=0, enable_progress_bar=False,
                        enable_model_summary=False)  # fmt: skip
    trainer.fit(TinyRegressor(), train, val)
    assert spy.before_validation == {(epoch, i) for epoch in range(3) for i in (23, 47, 71)}
    assert spy.before_validation <= spy.measured
    assert {(epoch, 79) for epoch in range(3)} <= spy.measured  # each epoch's last batch
    assert len(spy.measured) < 0.4 * 240  # still a sample: the rule adds about one step per pause
    records = read_jsonl(zeus.summary.jsonl_path)
    ledgers = [r["ledger"] for r in records if r["event"] == "epoch"]
    assert len(ledgers) == 3 and all(ledger["steps_estimated"] == 0 for ledger in ledgers)
    steps = [r for r in records if r["event"] == "steps" and r["steps"] > 0]
    assert steps and all(r["energy_J_mean"] is not None for r in steps)


class MeasuredSteps(TrainerCallback):
    """After ZeusTrainerCallback's step begin: which steps it measures (by the global step they end at)."""

    def __init__(self, zeus: ZeusTrainerCallback) -> None:
        self.zeus = zeus
        self.measured: set[int] = set()
        self.evaluated_after: list[int] = []

    def on_step_begin(self, args, state, control, **kwargs):
        if self.zeus.session.measuring:
            self.measured.add(state.global_step + 1)

    def on_evaluate(self, args, state, control, **kwargs):
        self.evaluated_after.append(state.global_step)


def test_the_hf_trainer_measures_the_step_before_each_evaluation_each_epochs_end_and_max_steps(tmp_path):
    zeus = ZeusTrainerCallback(sampled_config(tmp_path, "hf"))
    spy = MeasuredSteps(zeus)
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=60, per_device_train_batch_size=4, logging_steps=10,
        report_to=[], save_strategy="no", eval_strategy="steps", eval_steps=14, use_cpu=True, disable_tqdm=True,
    )  # fmt: skip
    trainer = Trainer(model=tiny_lm(), args=args, train_dataset=RandomTokens(200), eval_dataset=RandomTokens(8),
                      callbacks=[zeus, spy])  # fmt: skip
    trainer.train()
    assert spy.evaluated_after == [14, 28, 42, 56, 60]  # and at the end
    pauses = {14, 28, 42, 50, 56, 60}  # evaluations, the first epoch's end (200 / 4 steps), max_steps
    assert pauses <= spy.measured
    assert len(spy.measured) < 0.5 * 60
    records = read_jsonl(zeus.summary.jsonl_path)
    ledgers = [r["ledger"] for r in records if r["event"] == "epoch"]
    assert len(ledgers) == 2 and all(ledger["steps_estimated"] == 0 for ledger in ledgers)
    steps = [r for r in records if r["event"] == "steps" and r["steps"] > 0]
    assert steps and all(r["energy_J_mean"] is not None for r in steps)


def test_lightning_measures_the_last_batch_before_max_steps_cuts_an_epoch(tmp_path):
    zeus = ZeusCallback(sampled_config(tmp_path, "pl-max"))
    spy = MeasuredBatches(zeus)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(640, 16, generator=g), torch.randn(640, 1, generator=g)
    train = DataLoader(TensorDataset(x, y), batch_size=8)  # 80 batches an epoch; max_steps 100 ends 20 into the second
    trainer = L.Trainer(accelerator="cpu", devices=1, callbacks=[zeus, spy], logger=False, max_steps=100,
                        default_root_dir=str(tmp_path), num_sanity_val_steps=0, enable_progress_bar=False,
                        enable_model_summary=False)  # fmt: skip
    trainer.fit(TinyRegressor(), train)
    assert zeus.summary.steps == 100
    assert {(0, 79), (1, 19)} <= spy.measured
    records = read_jsonl(zeus.summary.jsonl_path)
    ledgers = [r["ledger"] for r in records if r["event"] == "epoch"]
    assert len(ledgers) == 2 and all(ledger["steps_estimated"] == 0 for ledger in ledgers)


def test_lightning_measures_the_batch_before_each_validation_counted_over_the_whole_fit(tmp_path):
    # check_val_every_n_epoch=None: validation every 30 batches of the fit, not of the epoch (80 batches an epoch).
    zeus = ZeusCallback(sampled_config(tmp_path, "pl-fit"))
    spy = MeasuredBatches(zeus)
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(640, 16, generator=g), torch.randn(640, 1, generator=g)
    train = DataLoader(TensorDataset(x, y), batch_size=8)
    _, val = loaders()
    trainer = L.Trainer(accelerator="cpu", devices=1, callbacks=[zeus, spy], logger=False, max_epochs=3,
                        val_check_interval=30, check_val_every_n_epoch=None, default_root_dir=str(tmp_path),
                        num_sanity_val_steps=0, enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(TinyRegressor(), train, val)
    fit_batches = {(epoch, i): 80 * epoch + i + 1 for epoch in range(3) for i in range(80)}
    assert spy.before_validation == {key for key, n in fit_batches.items() if n % 30 == 0}
    assert spy.before_validation <= spy.measured
    records = read_jsonl(zeus.summary.jsonl_path)
    ledgers = [r["ledger"] for r in records if r["event"] == "epoch"]
    assert len(ledgers) == 3 and all(ledger["steps_estimated"] == 0 for ledger in ledgers)


def test_the_hf_trainer_reads_an_eval_steps_it_kept_as_a_float(tmp_path):
    # TrainingArguments makes eval_steps above 1 an int and the Trainer a ratio below 1 a step count: 1.0
    # stays a float, and the Trainer evaluates after every step.
    zeus = ZeusTrainerCallback(sampled_config(tmp_path, "hf-float"))
    spy = MeasuredSteps(zeus)
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=6, per_device_train_batch_size=4, logging_steps=10,
        report_to=[], save_strategy="no", eval_strategy="steps", eval_steps=1.0, use_cpu=True, disable_tqdm=True,
    )  # fmt: skip
    trainer = Trainer(model=tiny_lm(), args=args, train_dataset=RandomTokens(200), eval_dataset=RandomTokens(4),
                      callbacks=[zeus, spy])  # fmt: skip
    trainer.train()
    assert isinstance(trainer.state.eval_steps, float) and spy.evaluated_after == [1, 2, 3, 4, 5, 6]
    assert set(spy.evaluated_after) <= spy.measured  # every step is the last before an evaluation
