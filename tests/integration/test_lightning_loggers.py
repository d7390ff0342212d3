"""What Lightning's loggers get from ZeusCallback: every evaluation, the right steps, every ending.

A real Trainer on the CPU measuring the virtual GPU; TensorBoard event files and CSV files
are read back, and a logger with W&B's step rule (a point below the current step is
dropped) checks that nobody's points are lost.
"""

from __future__ import annotations

import csv
import os
import signal
from collections import Counter
from pathlib import Path

import lightning.pytorch as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.loggers.logger import Logger
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.integration.helpers import read_scalars, spy_wandb, virtual_config
from zeus_callbacks import ZeusCallback
from zeus_callbacks.reporting import is_own_metric, read_jsonl

BATCH = 8
N_TRAIN = 160  # 20 batches an epoch


class Regressor(L.LightningModule):
    def __init__(self, stop_at_step: int | None = None, stop_with: str = "") -> None:
        super().__init__()
        self.layer = nn.Linear(16, 1)
        self.stop_at_step = stop_at_step
        self.stop_with = stop_with

    def training_step(self, batch, batch_idx):
        if self.global_step == self.stop_at_step:
            if self.stop_with == "error":
                raise RuntimeError("planted failure")
            if self.stop_with == "ctrl-c":
                raise KeyboardInterrupt
            if self.stop_with == "sigterm":
                os.kill(os.getpid(), signal.SIGTERM)  # Lightning stops at its next check
        x, y = batch
        for _ in range(20):  # a little real work, so steps span a few power samples
            torch.linalg.matmul(torch.randn(96, 96), torch.randn(96, 96))
        loss = nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.layer(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def loaders():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(N_TRAIN, 16, generator=g), torch.randn(N_TRAIN, 1, generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=BATCH), DataLoader(TensorDataset(x[:32], y[:32]), batch_size=16)


class StepRuleLogger(Logger):
    """Keeps points as W&B does when it is given ``step=``: a point below the current step is dropped."""

    def __init__(self) -> None:
        super().__init__()
        self.points: list[tuple[str, int, float]] = []
        self.dropped: list[tuple[int, dict]] = []
        self._current = -1

    @property
    def name(self) -> str:
        return "steprule"

    @property
    def version(self) -> int:
        return 0

    @rank_zero_only
    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    @rank_zero_only
    def log_metrics(self, metrics, step=None) -> None:
        assert step is not None
        if step < self._current:
            self.dropped.append((step, dict(metrics)))
            return
        self._current = step
        self.points.extend((key, step, float(value)) for key, value in metrics.items())

    def series(self, key: str) -> list[tuple[int, float]]:
        return [(step, value) for k, step, value in self.points if k == key]


def trainer_for(tmp_path: Path, callback: ZeusCallback, *loggers: Logger, **kwargs) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu", devices=1, callbacks=[callback], logger=list(loggers), log_every_n_steps=1,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False, **kwargs,
    )  # fmt: skip


def csv_points(path: Path) -> list[tuple[str, int, float]]:
    """(key, step, value) of every value in a CSVLogger's metrics.csv."""
    with open(path, newline="") as f:
        return [(key, int(row["step"]), float(value)) for row in csv.DictReader(f)
                for key, value in row.items() if key != "step" and value != ""]  # fmt: skip


def test_one_point_per_evaluation_at_its_step_and_no_point_is_dropped(tmp_path):
    # Validation every 3 batches, step reports every 5: before, TensorBoard got one energy/eval_J
    # per report (the last evaluation's), and the reports at global_step (k+1) made a W&B-like
    # logger drop the user's own train_loss at k.
    callback = ZeusCallback(virtual_config(tmp_path, interval_steps=5))
    rule = StepRuleLogger()
    trainer = trainer_for(tmp_path, callback, TensorBoardLogger(str(tmp_path / "tb"), name="run"), rule,
                          max_epochs=2, val_check_interval=3)  # fmt: skip
    train, val = loaders()
    trainer.fit(Regressor(), train, val)

    records = read_jsonl(tmp_path / "zeus" / "test.jsonl")
    evals = [r for r in records if r["event"] == "eval"]
    steps_per_epoch = N_TRAIN // BATCH
    validations = 2 * (steps_per_epoch // 3)  # after batches 3, 6, ... 18 of each epoch
    assert len(evals) == validations
    # Each eval record carries the training steps taken before it (3, 6, ..., 18, 23, ...).
    assert [r["step"] for r in evals] == [e * steps_per_epoch + 3 * k for e in (0, 1) for k in range(1, 7)]

    scalars = read_scalars(tmp_path / "tb")
    # One energy/eval_J point per evaluation, at the step Lightning logs val_loss at, with the record's value.
    assert [s for s, _ in scalars["energy/eval_J"]] == [s for s, _ in scalars["val_loss"]]
    assert [s for s, _ in scalars["energy/eval_J"]] == [r["step"] - 1 for r in evals]
    assert [v for _, v in scalars["energy/eval_J"]] == pytest.approx([r["energy_J"] for r in evals], rel=1e-6)
    assert [v for _, v in scalars["time/eval_s"]] == pytest.approx([r["time_s"] for r in evals], rel=1e-6)

    # The W&B-like logger dropped nothing: the user's train_loss at every step, ours all there too.
    assert rule.dropped == []
    assert [s for s, _ in rule.series("train_loss")] == list(range(2 * steps_per_epoch))
    assert [v for _, v in rule.series("energy/eval_J")] == pytest.approx([r["energy_J"] for r in evals])
    reports = [r for r in records if r["event"] == "steps" and r["count"]]
    assert [v for _, v in rule.series("energy/step_J")] == pytest.approx([r["energy_J_mean"] for r in reports])
    # None of our keys has two points at one step (TensorBoard or the W&B-like logger).
    for tag, points in scalars.items():
        if is_own_metric(tag):
            assert len({s for s, _ in points}) == len(points), f"{tag}: {points}"
    assert not [k for k, n in Counter((k, s) for k, s, _ in rule.points if is_own_metric(k)).items() if n > 1]


def test_under_gradient_accumulation_an_eval_record_counts_batches_and_its_point_is_at_global_step_minus_1(tmp_path):
    # With accumulate_grad_batches=2 the eval record's step (batches taken, docs/concepts.md) is
    # twice the optimizer steps: its energy/eval_J point is at trainer.global_step - 1, with
    # val_loss, not at the record's step - 1 (what docs/metrics.md said).
    callback = ZeusCallback(virtual_config(tmp_path, interval_steps=5))
    trainer = trainer_for(tmp_path, callback, TensorBoardLogger(str(tmp_path / "tb"), name="run"),
                          max_epochs=1, val_check_interval=10, accumulate_grad_batches=2)  # fmt: skip
    train, val = loaders()
    trainer.fit(Regressor(), train, val)

    evals = [r for r in read_jsonl(tmp_path / "zeus" / "test.jsonl") if r["event"] == "eval"]
    assert [r["step"] for r in evals] == [10, 20]  # batches before each validation (20 an epoch)
    scalars = read_scalars(tmp_path / "tb")
    assert [s for s, _ in scalars["energy/eval_J"]] == [s for s, _ in scalars["val_loss"]]
    assert [s for s, _ in scalars["energy/eval_J"]] == [r["step"] // 2 - 1 for r in evals]
    assert [v for _, v in scalars["energy/eval_J"]] == pytest.approx([r["energy_J"] for r in evals], rel=1e-6)


def test_the_end_of_training_flush_logs_no_second_step_point(tmp_path):
    # max_steps=20 ends mid-run: before, the last batch's report and the end's flush were both
    # logged at step 20 with different energy/step_J values (CSV and TensorBoard).
    config = virtual_config(tmp_path, interval_steps=5)
    callback = ZeusCallback(config)
    trainer = trainer_for(tmp_path, callback, TensorBoardLogger(str(tmp_path / "tb"), name="run"),
                          CSVLogger(str(tmp_path / "csv"), name="run"), max_steps=20, max_epochs=5)  # fmt: skip
    train, _ = loaders()
    trainer.fit(Regressor(), train)
    records = read_jsonl(tmp_path / "zeus" / "test.jsonl")
    reports = [r for r in records if r["event"] == "steps" and r["count"]]
    warmup_steps = sum(r.get("warmup_steps", 0) for r in records if r["event"] == "steps")
    assert warmup_steps == 1 and sum(r["count"] for r in reports) + warmup_steps == 20  # the first step reported apart
    tb = read_scalars(tmp_path / "tb")["energy/step_J"]
    (csv_file,) = (tmp_path / "csv").rglob("metrics.csv")
    in_csv = [(s, v) for k, s, v in csv_points(csv_file) if k == "energy/step_J"]
    for points in (tb, in_csv):
        steps = [s for s, _ in points]
        assert len(set(steps)) == len(steps) == len(reports), points
        assert steps == sorted(steps) and steps[-1] == 20  # the end's flush: after the last batch (19)
        assert [v for _, v in points] == pytest.approx([r["energy_J_mean"] for r in reports], rel=1e-6)


@pytest.mark.parametrize("ending", ["completed", "error", "ctrl-c", "sigterm"])
def test_every_ending_reaches_the_loggers_and_prints_the_summary(tmp_path, caplog, ending):
    callback = ZeusCallback(virtual_config(tmp_path, interval_steps=5))
    rule = StepRuleLogger()
    trainer = trainer_for(tmp_path, callback, TensorBoardLogger(str(tmp_path / "tb"), name="run"), rule,
                          max_epochs=1)  # fmt: skip
    train, _ = loaders()
    model = Regressor(stop_at_step=None if ending == "completed" else 12, stop_with=ending)
    if ending == "error":
        with pytest.raises(RuntimeError, match="planted failure"):
            trainer.fit(model, train)
    elif ending == "ctrl-c":
        with pytest.raises(SystemExit):  # Lightning ends a Ctrl-C with exit(1) after its on_exception hooks
            trainer.fit(model, train)
    elif ending == "sigterm":
        with pytest.raises(SIGTERMException):  # Lightning raises it at its next check, after on_exception
            trainer.fit(model, train)
    else:
        trainer.fit(model, train)
    summary = callback.summary
    status = {"completed": "completed", "error": "failed"}.get(ending, "interrupted")
    assert summary is not None and summary.status == status
    records = read_jsonl(tmp_path / "zeus" / "test.jsonl")
    assert records[-1]["event"] == "run_end" and records[-1]["status"] == status
    assert summary.steps == (N_TRAIN // BATCH if ending == "completed" else records[-1]["steps"])
    if ending != "completed":
        assert 12 <= summary.steps <= 13  # stopped at step 12 (SIGTERM: at Lightning's next check)
    # The run totals reach both loggers, equal to the summary's.
    tb = read_scalars(tmp_path / "tb")
    assert tb["energy/total_J"] == [(trainer.global_step, pytest.approx(summary.energy_J, rel=1e-6))]
    assert tb["time/total_s"] == [(trainer.global_step, pytest.approx(summary.time_s, rel=1e-6))]
    assert rule.series("energy/total_J") == [(trainer.global_step, summary.energy_J)]
    # An epoch the run ended inside says so, in its record and beside its figures
    (epoch,) = [r for r in records if r["event"] == "epoch"]
    assert epoch["cut_short"] is (ending != "completed")
    assert [v for _, v in tb.get("energy/epoch_partial", [])] == ([] if ending == "completed" else [1.0])
    # ... and so do the run's means, as docs/metrics.md lists them (the HF results have them too)
    means = {"power/run_mean_W": summary.mean_power_W, "energy/run_step_mean_J": summary.step_energy_J,
             "time/run_step_mean_s": summary.step_time_s, "energy/run_step_count": summary.steps}  # fmt: skip
    for name, value in means.items():
        assert tb[name] == [(trainer.global_step, pytest.approx(value, rel=1e-6))], name
    assert rule.dropped == []
    # The summary is printed once, whatever the ending (through Lightning's own console logger, shown at INFO).
    printed = [r for r in caplog.records if r.getMessage().startswith("zeus-callbacks run 'test'")]
    assert len(printed) == 1 and printed[0].name.startswith("lightning.pytorch")
    assert printed[0].getMessage().startswith(f"zeus-callbacks run 'test' ({status})")


def test_wandb_logger_name_names_the_jsonl_and_its_points_keep_every_step(tmp_path, monkeypatch):
    logged = spy_wandb(monkeypatch, tmp_path)
    import wandb
    from lightning.pytorch.loggers import WandbLogger

    config = virtual_config(tmp_path, interval_steps=5)
    del config["logging"]["run_name"]  # the name comes from the logger
    callback = ZeusCallback(config)
    trainer = trainer_for(tmp_path, callback, WandbLogger(name="digits-exp", project="zeus", save_dir=str(tmp_path)),
                          max_steps=12)  # fmt: skip
    train, _ = loaders()
    try:
        trainer.fit(Regressor(), train)
    finally:
        wandb.finish()
    # Before, the JSONL was named after the W&B run id; docs/getting-started.md says the run's name.
    assert callback.summary.run_name == "digits-exp"
    assert (tmp_path / "zeus" / "digits-exp.jsonl").exists()
    steps = [(e["trainer/global_step"], k) for e in logged for k in e if k != "trainer/global_step"]
    assert [s for s, k in steps if k == "train_loss"] == list(range(12))
    # Every report the JSONL holds reaches W&B at a step of its own. How many reports hold energy depends on
    # when the virtual sensor's samples arrive (3 ms steps, 20 ms samples), so the count comes from the log.
    reports = [r for r in read_jsonl(tmp_path / "zeus" / "digits-exp.jsonl") if r["event"] == "steps" and r["count"]]
    energy_points = [(e["trainer/global_step"], e["energy/step_J"]) for e in logged if "energy/step_J" in e]
    energy_steps = [s for s, _ in energy_points]
    assert len(set(energy_steps)) == len(energy_steps) == len(reports) >= 1 and energy_steps[-1] == 12
    assert [v for _, v in energy_points] == pytest.approx([r["energy_J_mean"] for r in reports], rel=1e-6)
    assert [s for s, k in steps if k == "energy/total_J"] == [12]
