"""Step windows tile the epoch in real Trainers, and the epoch ledger closes (issues 16 item 4, 25, 27).

The batch preparation is a busy wait in the DataLoader's collate function, set to a share of
the iteration (40 % and 5 %); the step's compute is a sleep in the training step. The virtual
GPU's power is constant (3 W sensor noise).

What is asserted holds on a loaded machine as on an idle one, because it is structure, not
speed: the epoch ledger (warm-up + steps + evaluations + other) equals the epoch exactly;
every step has a window; and ``other``, what no step window holds, lies inside the one stretch
the windows leave by design, from the last step's end to the epoch's end, bracketed by two
spy callbacks on the same clock (one runs before the energy callback at the last batch end,
one after it at the epoch end). A window that failed to tile (a fetch between two steps
outside both) would put time in ``other`` outside that bracket and fail.

Cause of the old 2 % miss (issue 25): that stretch, the loader's StopIteration and the
trainer's epoch-end bookkeeping after the last step, is 5-10 ms on an idle machine and was
seen at 17-25 ms with four runs on two cores here (~35 ms in CI): its length is the
machine's load, not the windows'. It is measured now (``other`` in the ledger) instead of
being bounded by a share of the epoch.
"""

from __future__ import annotations

import math
import time

import lightning.pytorch as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from transformers import Trainer, TrainerCallback, TrainingArguments

from tests.integration.helpers import virtual_config
from zeus_callbacks import ZeusCallback, ZeusTrainerCallback
from zeus_callbacks.reporting import read_jsonl

STEPS = 120
BATCH = 4
COMPUTE_S = 0.025


class Rows(Dataset):
    def __init__(self, n: int) -> None:
        self.x = torch.randn(n, 8, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i]


class SlowCollate:
    """Stack the rows, then busy-wait ``prep_s`` (the batch preparation)."""

    def __init__(self, prep_s: float, as_dict: bool) -> None:
        self.prep_s, self.as_dict = prep_s, as_dict

    def __call__(self, rows):
        x = torch.stack(rows)
        until = time.perf_counter() + self.prep_s
        while time.perf_counter() < until:
            pass
        y = torch.zeros(len(x), 1)
        return {"x": x, "labels": y} if self.as_dict else (x, y)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 1)

    def forward(self, x, labels=None):
        time.sleep(COMPUTE_S)  # the step's compute
        out = self.layer(x)
        return {"loss": nn.functional.mse_loss(out, labels if labels is not None else torch.zeros_like(out))}


class Module(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = Net()

    def training_step(self, batch, batch_idx):
        return self.net(*batch)["loss"]

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def prep_s(share: float) -> float:
    return COMPUTE_S * share / (1 - share)


def closure(records) -> tuple[float, float, float]:
    """(Σ energy_J_mean × steps + warm-up energy) / epoch energy; measured step time / epoch time; steps."""
    steps = [r for r in records if r["event"] == "steps"]
    (warmup,) = [r for r in records if r["event"] == "warmup"]
    (epoch,) = [r for r in records if r["event"] == "epoch"]
    step_J = sum(r["energy_J_mean"] * r["steps"] for r in steps if r["steps"]) + warmup["energy_J"]
    step_s = sum(r["time_s_mean"] * r["count"] for r in steps if r["count"]) + warmup["time_s"]
    counted = sum(r["steps"] + r["warmup_steps"] for r in steps)
    return step_J / epoch["energy_J"], step_s / epoch["time_s"], counted


class ClockSpy:
    """Reads the session's clock at the last batch end (placed before the energy callback) or at epoch end (after)."""

    def __init__(self, session_of) -> None:
        self.session_of = session_of
        self.last_batch_end_s: float | None = None
        self.epoch_end_s: float | None = None

    def now_s(self) -> float:
        return self.session_of().backend.clock.now_s()


def config(tmp_path):
    cfg = virtual_config(tmp_path, interval_steps=10)  # every step measured (sample_fraction 1)
    cfg["windows"]["phases"] = True  # the dataloader phase is checked against the batch preparation
    return cfg


def check(records, share: float, spy_before: ClockSpy, spy_after: ClockSpy) -> None:
    energy_ratio, time_ratio, counted = closure(records)
    assert counted == STEPS
    (epoch,) = [r for r in records if r["event"] == "epoch"]
    ledger = epoch["ledger"]
    message = f"ledger {ledger}; epoch {epoch['energy_J']} J, {epoch['time_s']} s"
    # Every step has a window (sample_fraction 1): nothing in the steps is an estimate.
    assert ledger["steps_estimated"] == 0 and ledger["other_reason"] is None, message
    # The ledger closes by construction: warm-up + steps + evaluations + other = the epoch.
    for unit, whole in (("J", epoch["energy_J"]), ("s", epoch["time_s"])):
        parts = [ledger[f"{part}_{unit}"] for part in ("warmup", "steps", "eval", "other")]
        assert min(parts) >= 0, message
        assert math.isclose(math.fsum(parts), whole, rel_tol=1e-9), message
    # The step records say the same as the ledger (their means × counts are its step windows).
    assert math.isclose(energy_ratio, (ledger["warmup_J"] + ledger["steps_J"]) / epoch["energy_J"], rel_tol=1e-6)
    assert math.isclose(time_ratio, (ledger["warmup_s"] + ledger["steps_s"]) / epoch["time_s"], rel_tol=1e-6)
    # What no step window holds lies after the last step: the spies bracket that stretch on the same clock.
    bracket_s = spy_after.epoch_end_s - spy_before.last_batch_end_s
    assert 0 <= ledger["other_s"] <= bracket_s + 1e-6, f"other {ledger['other_s']} s > bracket {bracket_s} s; {message}"
    # The compute-only split stays in the phases: the dataloader phase is the batch preparation.
    (phases,) = [r for r in records if r["event"] == "phases"]
    loading = {p["name"]: p for p in phases["phases"]}["dataloader"]
    assert loading["executions"] == STEPS
    assert loading["time_s"] >= prep_s(share)  # at least the busy wait, per fetch
    assert {p["name"]: p for p in phases["phases"]}.keys() - {"dataloader"}  # the compute phases apart
    # Every step's window holds its fetch: steps are no shorter than fetch + compute on average.
    steps = [r for r in records if r["event"] == "steps" and r["count"]]
    mean_s = sum(r["time_s_mean"] * r["count"] for r in steps) / sum(r["count"] for r in steps)
    assert mean_s >= prep_s(share) + COMPUTE_S


class LightningBefore(L.Callback, ClockSpy):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.last_batch_end_s = self.now_s()


class LightningAfter(L.Callback, ClockSpy):
    def on_train_epoch_end(self, trainer, pl_module):
        self.epoch_end_s = self.now_s()


class HFBefore(TrainerCallback, ClockSpy):
    def on_step_end(self, args, state, control, **kwargs):
        self.last_batch_end_s = self.now_s()


class HFAfter(TrainerCallback, ClockSpy):
    def on_epoch_end(self, args, state, control, **kwargs):
        self.epoch_end_s = self.now_s()


@pytest.mark.parametrize("share", [0.4, 0.05])
def test_lightning_steps_close_to_the_epoch(tmp_path, share):
    callback = ZeusCallback(config(tmp_path))
    before, after = LightningBefore(lambda: callback.session), LightningAfter(lambda: callback.session)
    loader = DataLoader(Rows(STEPS * BATCH), batch_size=BATCH, collate_fn=SlowCollate(prep_s(share), as_dict=False))
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_epochs=1, callbacks=[before, callback, after], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(Module(), loader)
    check(read_jsonl(callback.summary.jsonl_path), share, before, after)


@pytest.mark.parametrize("share", [0.4, 0.05])
def test_huggingface_steps_close_to_the_epoch(tmp_path, share):
    callback = ZeusTrainerCallback(config(tmp_path))
    before, after = HFBefore(lambda: callback.session), HFAfter(lambda: callback.session)
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), num_train_epochs=1, per_device_train_batch_size=BATCH, logging_steps=10,
        report_to=[], save_strategy="no", disable_tqdm=True, use_cpu=True, dataloader_pin_memory=False,
    )  # fmt: skip
    trainer = Trainer(model=Net(), args=args, train_dataset=Rows(STEPS * BATCH),
                      data_collator=SlowCollate(prep_s(share), as_dict=True), callbacks=[callback, after])  # fmt: skip
    trainer.callback_handler.callbacks.insert(0, before)  # before every other callback, ours included
    handler = trainer.callback_handler.callbacks
    assert handler.index(before) < handler.index(callback) < handler.index(after)
    trainer.train()
    check(read_jsonl(callback.summary.jsonl_path), share, before, after)
