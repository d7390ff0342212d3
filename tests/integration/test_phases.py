"""Step-phase windows (windows.phases) in both trainers on the virtual GPU, and the default staying off."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, default_collate
from transformers import Trainer, TrainerCallback, TrainingArguments

from tests.integration.helpers import expected_power_W, manual_virtual_backend, virtual_config
from tests.integration.test_huggingface import RandomTokens, clocked_lm
from tests.integration.test_lightning import BATCH, N_TRAIN, TinyRegressor, loaders, make_trainer
from zeus_callbacks import ZeusCallback, ZeusTrainerCallback
from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.reporting import read_jsonl

PHASE_S = {"dataloader": 0.003, "forward": 0.004, "backward": 0.007, "optimizer": 0.002}
"""What each phase of a step takes on the manual clock (s), on any machine: the model, its optimizer and
the data advance it (on the wall clock, sleeps made the steps long enough for the 20 ms samples)."""
HF_PHASE_S = {"dataloader": 0.003, "forward_backward": 0.030, "optimizer": 0.002}


def clocked_loader(clock: ManualClock, loader: DataLoader) -> DataLoader:
    """``loader`` whose every batch takes ``PHASE_S["dataloader"]`` to fetch, on ``clock``."""

    def collate(batch):
        clock.advance(PHASE_S["dataloader"])
        return default_collate(batch)

    return DataLoader(loader.dataset, batch_size=loader.batch_size, collate_fn=collate)


def clocked_sgd(clock: ManualClock, params) -> torch.optim.SGD:
    """SGD whose step takes ``PHASE_S["optimizer"]`` on ``clock``, after its closure (forward, backward) ran."""

    class ClockedSGD(torch.optim.SGD):
        def step(self, closure=None):
            loss = None
            if closure is not None:
                with torch.enable_grad():
                    loss = closure()
            clock.advance(PHASE_S["optimizer"])
            super().step()
            return loss

    return ClockedSGD(params, lr=0.01)


class ClockedRegressor(TinyRegressor):
    """Forward, backward and the optimizer step each take their ``PHASE_S`` on a manual clock."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__()
        self.clock = clock

    def training_step(self, batch, batch_idx):
        self.clock.advance(PHASE_S["forward"])
        return super().training_step(batch, batch_idx)

    def backward(self, loss, *args, **kwargs):
        self.clock.advance(PHASE_S["backward"])
        super().backward(loss, *args, **kwargs)

    def configure_optimizers(self):
        return clocked_sgd(self.clock, self.parameters())


class ClockedGaps(TrainerCallback):
    """HF: the time between steps (``PHASE_S["dataloader"]``), on a manual clock, after the energy callback's hooks.

    Not in the data collator: the batches are fetched one ahead, so the last step's gap would hold none.
    """

    def __init__(self, clock: ManualClock, steps_per_epoch: int) -> None:
        self.clock, self.steps_per_epoch = clock, steps_per_epoch

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.clock.advance(PHASE_S["dataloader"])

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.steps_per_epoch:  # not the epoch's last step
            self.clock.advance(PHASE_S["dataloader"])


def phase_config(tmp_path, **windows):
    config = virtual_config(tmp_path, interval_steps=5)
    config["windows"] = {**config["windows"], "phases": True, **windows}
    # Noise-free sensor: a sub-millisecond phase seen through 20 ms samples is otherwise a
    # ~±0.3 J estimate over only 20 executions an epoch (the statistics are tested on
    # synthetic streams in tests/test_finegrain.py); here the plumbing is under test.
    config["virtual"]["noise_W"] = 0.0
    return config


def check_epochs(records, config, phase_s, steps_per_epoch, epochs):
    """The ``phases`` records, checked; ``phase_s``: each phase's time per execution on the manual clock (s)."""
    power_W = expected_power_W(config)
    phases = [r for r in records if r["event"] == "phases"]
    assert [r["epoch"] for r in phases] == list(range(epochs))
    for record in phases:
        by_name = {p["name"]: p for p in record["phases"]}
        assert set(by_name) == set(phase_s)
        for name, p in by_name.items():
            # Every step's fetch is its dataloader phase, the epoch's first one's included.
            assert p["executions"] == steps_per_epoch, name
            assert p["time_s"] == pytest.approx(phase_s[name]), name
            # Constant virtual power: energy per execution = power x duration (±10 %: a few-ms phase seen
            # through 20 ms samples).
            assert p["energy_J"] == pytest.approx(power_W * p["time_s"], rel=0.1, abs=0.25), name
            lo, hi = p["energy_ci_J"]
            assert lo <= hi
        # The phases tile the steps and the gaps between them: all of the epoch's time on this clock.
        assert record["explained"] == pytest.approx(1.0, rel=0.01)
    return phases


def test_lightning_phases_per_epoch(tmp_path):
    config = phase_config(tmp_path)
    clock = ManualClock(1_000.0)
    trainer = make_trainer(tmp_path, ZeusCallback(config, backend=manual_virtual_backend(config, clock)), max_epochs=2)
    train, val = loaders()
    trainer.fit(ClockedRegressor(clock), clocked_loader(clock, train), val)
    records = read_jsonl(tmp_path / "zeus" / "test.jsonl")
    steps = N_TRAIN // BATCH
    phases = check_epochs(records, config, PHASE_S, steps, 2)
    # Over the run, dataloader + forward + backward + optimizer add up to the step windows (warm-up included).
    steps_J = sum(r["energy_J_mean"] * r["count"] for r in records if r["event"] == "steps" and r["count"])
    steps_J += sum(r["energy_J"] for r in records if r["event"] == "warmup")
    phases_J = sum(p["total_J"] for r in phases for p in r["phases"])
    assert phases_J == pytest.approx(steps_J, rel=0.05)
    assert not any(r["event"] == "window" for r in records)  # phases are not per-execution records


def test_lightning_phases_with_gradient_accumulation(tmp_path):
    config = phase_config(tmp_path)
    trainer = make_trainer(tmp_path, ZeusCallback(config), max_epochs=1, accumulate_grad_batches=2)
    trainer.fit(TinyRegressor(), *loaders())
    records = read_jsonl(tmp_path / "zeus" / "test.jsonl")
    (phases,) = [r for r in records if r["event"] == "phases"]
    counts = {p["name"]: p["executions"] for p in phases["phases"]}
    assert counts["forward"] == counts["backward"] == N_TRAIN // BATCH
    assert counts["optimizer"] == N_TRAIN // BATCH // 2


def test_huggingface_phases_per_epoch(tmp_path):
    config = phase_config(tmp_path)
    clock = ManualClock(1_000.0)
    callback = ZeusTrainerCallback(config, backend=manual_virtual_backend(config, clock))
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), num_train_epochs=2, per_device_train_batch_size=4, logging_steps=4,
        report_to=[], save_strategy="no", disable_tqdm=True, use_cpu=True,
    )  # fmt: skip
    # HF's one phase holds forward and backward: 30 ms, so that an epoch of 10 steps spans enough samples.
    model = clocked_lm(clock, HF_PHASE_S["forward_backward"])
    trainer = Trainer(model=model, args=args, train_dataset=RandomTokens(40),
                      optimizers=(clocked_sgd(clock, model.parameters()), None),
                      callbacks=[callback, ClockedGaps(clock, steps_per_epoch=10)])  # fmt: skip
    trainer.train()
    records = read_jsonl(tmp_path / "zeus" / "test.jsonl")
    check_epochs(records, config, HF_PHASE_S, 10, 2)


def test_phases_are_off_by_default_and_exact_on_a_manual_clock(tmp_path, virtual_backend, manual_clock):
    from zeus_callbacks.session import EnergySession

    def run(phases: bool) -> list[dict]:
        config = virtual_config(tmp_path, run_name=f"phases-{phases}")
        config["windows"] = {**config["windows"], "phases": phases}
        session = EnergySession(config, backend=virtual_backend)
        session.train_start()
        anchors = []
        session.run.timer.anchor = lambda: anchors.append(manual_clock.now_s())  # spy on re-anchoring
        session.epoch_start(0)
        for step in range(50):
            manual_clock.advance(0.003)  # the batch fetch: the step's dataloader phase
            session.step_start(step)
            for name, dt in (("forward", 0.004), ("backward", 0.007), ("optimizer", 0.002)):
                session.phase_begin(name)
                manual_clock.advance(dt)
                session.phase_end(name)
            session.step_end(step)
        manual_clock.advance(0.5)
        session.epoch_end(0)
        session.epoch_start(1)
        manual_clock.advance(31.0)
        session.step_start(50)  # more than 30 s after the last anchor: re-anchor (phases only)
        session.step_end(50)
        session.train_end()
        assert len(anchors) == (3 if phases else 2)
        return read_jsonl(tmp_path / "zeus" / f"phases-{phases}.jsonl")

    assert not any(r["event"] == "phases" for r in run(False))
    # Epoch 1's one step has only its dataloader phase (31 s from the epoch's start): epoch 0 is checked.
    record, later = [r for r in run(True) if r["event"] == "phases"]
    assert [p["name"] for p in later["phases"]] == ["dataloader"] and later["epoch"] == 1
    power_W = virtual_backend.true_power_W(0)
    for p in record["phases"]:
        expected_s = {"forward": 0.004, "backward": 0.007, "optimizer": 0.002, "dataloader": 0.003}[p["name"]]
        assert p["executions"] == 50
        assert p["time_s"] == pytest.approx(expected_s)
        assert p["energy_J"] == pytest.approx(power_W * expected_s, rel=0.02)
        assert p["energy_ci_J"][0] - 1e-6 <= power_W * expected_s <= p["energy_ci_J"][1] + 1e-6
    # 16 ms of every step is measured; the epoch also holds its last 0.5 s idle tail.
    assert record["explained"] == pytest.approx((50 * 0.016) / (50 * 0.016 + 0.5), rel=0.02)
