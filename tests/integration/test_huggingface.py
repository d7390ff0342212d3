"""ZeusTrainerCallback in a real Hugging Face Trainer on the CPU, measuring the virtual GPU."""

from __future__ import annotations

import functools
import io
import math
import sys

import pytest
import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from transformers.integrations import TensorBoardCallback
from transformers.trainer_callback import DefaultFlowCallback

from tests.integration.helpers import expected_power_W, read_scalars, spy_wandb, virtual_config
from zeus_callbacks import ZeusTrainerCallback
from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.reporting import read_jsonl

BLOCK = 32


class RandomTokens(Dataset):
    def __init__(self, n: int) -> None:
        self.ids = torch.randint(0, 64, (n, BLOCK), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def tiny_lm() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=BLOCK, n_embd=32, n_layer=1, n_head=2))


def clocked_lm(clock: ManualClock, step_s: float):
    """The tiny LM, each forward taking ``step_s`` on ``clock`` (a manual one): windows hold counts of forwards.

    A report holds only the steps the power samples already cover. On the wall clock, with the tiny LM's
    ~5 ms steps or with 30 ms sleeps, how many steps that was depended on when a loaded machine ran the
    sampler thread (2 of 20 steps seen, against 7); on this clock the samples cover what the steps advanced.
    """
    model = tiny_lm()
    forward = model.forward

    @functools.wraps(forward)  # the Trainer reads forward's signature
    def clocked_forward(*args, **kwargs):
        clock.advance(step_s)
        return forward(*args, **kwargs)

    model.forward = clocked_forward
    return model


def make_trainer(tmp_path, callback, *, report_to, max_steps=12, grad_accum=1, eval_steps=None, **kwargs):
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=max_steps,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=grad_accum,
        logging_steps=4,
        report_to=report_to,
        save_strategy="no",
        eval_strategy="steps" if eval_steps else "no",
        eval_steps=eval_steps,
        include_num_input_tokens_seen=True,
        use_cpu=True,
        **{"disable_tqdm": True, **kwargs},
    )
    return Trainer(
        model=tiny_lm(),
        args=args,
        train_dataset=RandomTokens(200),
        eval_dataset=RandomTokens(16) if eval_steps else None,
        callbacks=[callback],
    )


def test_callback_runs_before_the_reporters(tmp_path):
    callback = ZeusTrainerCallback(virtual_config(tmp_path))
    trainer = make_trainer(tmp_path, callback, report_to=["tensorboard"])
    kinds = [type(cb) for cb in trainer.callback_handler.callbacks]
    assert kinds.index(DefaultFlowCallback) + 1 == kinds.index(ZeusTrainerCallback)
    assert kinds.index(ZeusTrainerCallback) < kinds.index(TensorBoardCallback)


def test_energy_reaches_tensorboard(tmp_path):
    config = virtual_config(tmp_path, interval_steps=2)
    callback = ZeusTrainerCallback(config)
    trainer = make_trainer(tmp_path, callback, report_to=["tensorboard"], eval_steps=6)
    trainer.train()

    # transformers 5 writes TB events under output_dir and prefixes training logs with "train/".
    scalars = {tag.removeprefix("train/"): values for tag, values in read_scalars(tmp_path / "out").items()}
    power_W = expected_power_W(config)
    for tag in (
        "energy/step_J",
        "power/mean_W",
        "energy/per_sample_J",
        "energy/per_token_J",
        "power_limit/W",
        "time/total_s",
        "eval/energy_J",  # HF files eval_energy_J under eval/, beside eval/loss
        "energy/epoch_J",
    ):
        assert tag in scalars, f"{tag} missing; have {sorted(scalars)}"
        assert all(v > 0 and math.isfinite(v) for _, v in scalars[tag]), tag
    # The running total never decreases (it may be 0 before the first 20 ms power sample).
    totals = [v for _, v in scalars["energy/total_J"]]
    assert totals == sorted(totals) and totals[-1] > 0
    for _, mean_W in scalars["power/mean_W"]:
        assert mean_W == pytest.approx(power_W, rel=0.05)
    step_J = [v for _, v in scalars["energy/step_J"]]
    per_sample = [v for _, v in scalars["energy/per_sample_J"]]
    per_token = [v for _, v in scalars["energy/per_token_J"]]
    for energy, sample_J, token_J in zip(step_J, per_sample, per_token, strict=True):
        assert sample_J == pytest.approx(energy / 4, rel=1e-4)  # 4 sequences a step
        assert token_J == pytest.approx(energy / (4 * BLOCK), rel=1e-4)
    # The last logged total is the run's total, and equals the summary.
    assert scalars["energy/total_J"][-1][1] == pytest.approx(callback.summary.energy_J, rel=1e-5)
    assert callback.summary.steps == 12 and callback.summary.status == "completed"


def test_gradient_accumulation_makes_one_window_per_optimizer_step(tmp_path):
    callback = ZeusTrainerCallback(virtual_config(tmp_path, interval_steps=3))
    trainer = make_trainer(tmp_path, callback, report_to="none", max_steps=6, grad_accum=3)
    trainer.train()
    records = read_jsonl(tmp_path / "zeus" / "test.jsonl")
    steps = [r for r in records if r["event"] == "steps"]
    assert sum(r["count"] for r in steps) + sum(len(r["steps"]) for r in records if r["event"] == "warmup") == 6
    # 6 steps are a fraction of one epoch: that partial epoch is epoch 0.
    assert [r["epoch"] for r in records if r["event"] == "epoch"] == [0]
    for r in steps:  # 4 per micro-batch x 3 micro-batches; BLOCK tokens each
        assert r["energy_J_per_sample"] == pytest.approx(r["energy_J_mean"] / 12, rel=1e-6)
        assert r["energy_J_per_token"] == pytest.approx(r["energy_J_mean"] / (12 * BLOCK), rel=1e-6)


def test_energy_reaches_wandb(tmp_path, monkeypatch):
    logged = spy_wandb(monkeypatch, tmp_path)
    import wandb

    callback = ZeusTrainerCallback(virtual_config(tmp_path))
    trainer = make_trainer(tmp_path, callback, report_to=["wandb"])
    trainer.train()
    wandb.finish()
    keys = {k for entry in logged for k in entry}
    # The W&B integration prefixes training logs with "train/".
    for key in ("train/energy/step_J", "train/power/mean_W", "train/energy/total_J"):
        assert key in keys, f"{key} not sent to W&B; sent {sorted(keys)}"
    totals = [entry["train/energy/total_J"] for entry in logged if "train/energy/total_J" in entry]
    assert totals[-1] == pytest.approx(callback.summary.energy_J, rel=1e-5)


def test_a_failing_training_step_ends_the_run_with_its_log(tmp_path):
    callback = ZeusTrainerCallback(virtual_config(tmp_path, interval_steps=2))
    trainer = make_trainer(tmp_path, callback, report_to="none", max_steps=10)
    calls = {"n": 0}
    original = type(trainer).training_step

    def failing_step(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 5:
            raise RuntimeError("planted failure")
        return original(self, *args, **kwargs)

    trainer.training_step = failing_step.__get__(trainer)
    with pytest.raises(RuntimeError, match="planted failure"):
        trainer.train()
    assert callback.summary is not None and callback.summary.status == "failed"
    assert callback.summary.steps == 4 and not callback.session.started
    events = [r["event"] for r in read_jsonl(tmp_path / "zeus" / "test.jsonl")]
    assert events[-2:] == ["exception", "run_end"]


def test_the_summary_prints_above_the_trainers_progress_bar(tmp_path, monkeypatch):
    # Issue 26: the summary was print()ed while the Trainer's tqdm bar was still open (its callback ends after
    # this one): on a terminal, where stdout and stderr share the screen, it began on the bar's own line.
    screen = io.StringIO()  # one screen for both streams, as a terminal shows them
    monkeypatch.setattr(sys, "stdout", screen)
    monkeypatch.setattr(sys, "stderr", screen)
    callback = ZeusTrainerCallback(virtual_config(tmp_path))
    make_trainer(tmp_path, callback, report_to="none", max_steps=6, disable_tqdm=False).train()
    text = screen.getvalue()
    first_line = str(callback.summary).splitlines()[0]
    at = text.index(first_line)
    assert "6/6" in text  # the Trainer's bar was drawn on this screen
    # The bar was cleared before the summary: what stands on the summary's line before it is blank.
    line_start = max(text.rfind("\n", 0, at), text.rfind("\r", 0, at)) + 1
    assert text[line_start:at].strip() == "", repr(text[max(0, at - 120) : at + 40])
