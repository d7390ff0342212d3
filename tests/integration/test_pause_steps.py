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


def fit_lightning(tmp_path, name: str, seed: int, *, validate: bool, extra_callbacks=(), **trainer_args):
    """A sampled Lightning fit of 80 batches an epoch; returns the callback, its spy and the JSONL records."""
    zeus = ZeusCallback(sampled_config(tmp_path, name))
    spy = MeasuredBatches(zeus)
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(640, 16, generator=g), torch.randn(640, 1, generator=g)
    train = DataLoader(TensorDataset(x, y), batch_size=8)
    trainer = L.Trainer(accelerator="cpu", devices=1, callbacks=[zeus, spy, *extra_callbacks], logger=False,
                        default_root_dir=str(tmp_path), num_sanity_val_steps=0, enable_progress_bar=False,
                        enable_model_summary=False, **trainer_args)  # fmt: skip
    trainer.fit(TinyRegressor(), train, loaders()[1] if validate else None)
    return zeus, spy, read_jsonl(zeus.summary.jsonl_path)


def train_hf(tmp_path, name: str, eval_rows: int, **args):
    """A sampled HF Trainer run (200 rows, 4 a batch: 50 steps an epoch); returns its parts and JSONL records."""
    zeus = ZeusTrainerCallback(sampled_config(tmp_path, name))
    spy = MeasuredSteps(zeus)
    arguments = TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, logging_steps=10, report_to=[],
        save_strategy="no", eval_strategy="steps", use_cpu=True, disable_tqdm=True, **args,
    )  # fmt: skip
    trainer = Trainer(model=tiny_lm(), args=arguments, train_dataset=RandomTokens(200),
                      eval_dataset=RandomTokens(eval_rows), callbacks=[zeus, spy])  # fmt: skip
    trainer.train()
    return trainer, spy, read_jsonl(zeus.summary.jsonl_path)


def assert_no_step_estimated(records: list[dict], epochs: int) -> None:
    ledgers = [r["ledger"] for r in records if r["event"] == "epoch"]
    assert len(ledgers) == epochs and all(ledger["steps_estimated"] == 0 for ledger in ledgers)


def assert_no_null_step_means(records: list[dict]) -> None:
    steps = [r for r in records if r["event"] == "steps" and r["steps"] > 0]
    assert steps and all(r["energy_J_mean"] is not None for r in steps)


def test_lightning_measures_the_batch_before_each_validation_and_each_epochs_last_batch(tmp_path):
    # validation after 24, 48 and 72 of each epoch's 80 batches
    _, spy, records = fit_lightning(tmp_path, "pl", 0, validate=True, max_epochs=3, val_check_interval=0.3)
    assert spy.before_validation == {(epoch, i) for epoch in range(3) for i in (23, 47, 71)}
    assert spy.before_validation <= spy.measured
    assert {(epoch, 79) for epoch in range(3)} <= spy.measured  # each epoch's last batch
    assert len(spy.measured) < 0.4 * 240  # still a sample: the rule adds about one step per pause
    assert_no_step_estimated(records, 3)
    assert_no_null_step_means(records)


class TimedBatches(Callback):
    """Lightning's and the adapter's clock (``time.monotonic`` in the modules that read it) moves only here:
    each batch takes ``batch_s`` of it, the first of each third batch three times as long, and a validation
    ``validation_s``."""

    def __init__(self, monkeypatch, batch_s: float, validation_s: float = 0.0) -> None:
        import time as real_time
        import types

        from lightning.pytorch.loops import evaluation_loop, fit_loop, training_epoch_loop

        import zeus_callbacks.integrations.lightning as adapter

        self.now_s, self.batch_s, self.batches, self.validation_s = 1_000.0, batch_s, 0, validation_s
        clock = types.SimpleNamespace(**{k: getattr(real_time, k) for k in dir(real_time) if not k.startswith("_")})
        clock.monotonic = lambda: self.now_s
        for module in (fit_loop, evaluation_loop, training_epoch_loop, adapter):
            monkeypatch.setattr(module, "time", clock, raising=module is not adapter)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.now_s += self.batch_s * (3 if self.batches % 3 == 0 else 1)
        self.batches += 1

    def on_validation_start(self, trainer, pl_module):
        self.now_s += self.validation_s


def test_lightning_measures_the_batch_before_each_time_based_validation(tmp_path, monkeypatch):
    # val_check_interval as a duration (Lightning >= 2.6): validation after the first batch that ends 0.5 s
    # after the last one. On a fake clock (no wall-clock race) whose batch times vary, the adapter measures
    # the batch it predicts crosses the interval, from the batch before it.
    from datetime import timedelta

    timed = TimedBatches(monkeypatch, batch_s=0.02)
    zeus, spy, records = fit_lightning(tmp_path, "pl-time", 5, validate=True, max_epochs=2,
                                       val_check_interval=timedelta(seconds=0.5), extra_callbacks=[timed])  # fmt: skip
    assert len(spy.before_validation) >= 4  # 80 batches of 20-60 ms an epoch: several validations
    assert spy.before_validation <= spy.measured
    assert len(spy.measured) < 0.4 * 160
    assert_no_step_estimated(records, 2)


def test_a_validation_longer_than_the_interval_does_not_pass_for_a_batch_time(tmp_path, monkeypatch):
    # Each validation takes 0.8 s, longer than the 0.5 s interval. The batch after it must not count that
    # time as its own: with it, every batch looked long enough to cross the interval and was measured.
    from datetime import timedelta

    timed = TimedBatches(monkeypatch, batch_s=0.02, validation_s=0.8)
    zeus, spy, records = fit_lightning(tmp_path, "pl-long-val", 5, validate=True, max_epochs=2,
                                       val_check_interval=timedelta(seconds=0.5), extra_callbacks=[timed])  # fmt: skip
    assert len(spy.before_validation) >= 4
    assert spy.before_validation <= spy.measured
    # at most the three batches before each validation (a guess early by up to two), and each epoch's
    # first and last: 23 here; with the validation taken as a batch time, 57 (every batch after one)
    assert len(spy.measured) <= 3 * len(spy.before_validation) + 2 * 2
    assert_no_step_estimated(records, 2)


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
    _, spy, records = train_hf(tmp_path, "hf", 8, max_steps=60, eval_steps=14)
    assert spy.evaluated_after == [14, 28, 42, 56, 60]  # and at the end
    pauses = {14, 28, 42, 50, 56, 60}  # evaluations, the first epoch's end (200 / 4 steps), max_steps
    assert pauses <= spy.measured
    assert len(spy.measured) < 0.5 * 60
    assert_no_step_estimated(records, 2)
    assert_no_null_step_means(records)


def test_lightning_measures_the_last_batch_before_max_steps_cuts_an_epoch(tmp_path):
    # max_steps 100 ends 20 batches into the second epoch
    zeus, spy, records = fit_lightning(tmp_path, "pl-max", 1, validate=False, max_steps=100)
    assert zeus.summary.steps == 100
    assert {(0, 79), (1, 19)} <= spy.measured
    assert_no_step_estimated(records, 2)


def test_lightning_measures_the_batch_before_each_validation_counted_over_the_whole_fit(tmp_path):
    # check_val_every_n_epoch=None: validation every 30 batches of the fit, not of the epoch (80 batches an epoch).
    _, spy, records = fit_lightning(
        tmp_path, "pl-fit", 2, validate=True, max_epochs=3, val_check_interval=30, check_val_every_n_epoch=None
    )
    fit_batches = {(epoch, i): 80 * epoch + i + 1 for epoch in range(3) for i in range(80)}
    assert spy.before_validation == {key for key, n in fit_batches.items() if n % 30 == 0}
    assert spy.before_validation <= spy.measured
    assert_no_step_estimated(records, 3)


def test_the_hf_trainer_reads_an_eval_steps_it_kept_as_a_float(tmp_path):
    # TrainingArguments makes eval_steps above 1 an int and the Trainer a ratio below 1 a step count: 1.0
    # stays a float, and the Trainer evaluates after every step.
    trainer, spy, _ = train_hf(tmp_path, "hf-float", 4, max_steps=6, eval_steps=1.0)
    assert isinstance(trainer.state.eval_steps, float) and spy.evaluated_after == [1, 2, 3, 4, 5, 6]
    assert set(spy.evaluated_after) <= spy.measured  # every step is the last before an evaluation
