"""ZeusCallback in a real Lightning Trainer on the CPU, measuring the virtual GPU."""

from __future__ import annotations

import logging
import math

import lightning.pytorch as L
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.integration.helpers import expected_power_W, manual_virtual_backend, read_scalars, virtual_config
from zeus_callbacks import ConfigError, ZeusCallback
from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.reporting import read_jsonl

BATCH = 8
N_TRAIN = 160  # 20 steps an epoch


class TinyRegressor(L.LightningModule):
    def __init__(self, fail_at_step: int | None = None) -> None:
        super().__init__()
        self.layer = nn.Linear(16, 1)
        self.fail_at_step = fail_at_step

    def training_step(self, batch, batch_idx):
        if self.fail_at_step is not None and self.global_step == self.fail_at_step:
            raise RuntimeError("planted failure")
        x, y = batch
        # A little real work per step, so steps span a few power samples.
        for _ in range(20):
            torch.linalg.matmul(torch.randn(96, 96), torch.randn(96, 96))
        return nn.functional.mse_loss(self.layer(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/loss", nn.functional.mse_loss(self.layer(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def loaders():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(N_TRAIN, 16, generator=g), torch.randn(N_TRAIN, 1, generator=g)
    train = DataLoader(TensorDataset(x, y), batch_size=BATCH)
    val = DataLoader(TensorDataset(x[:32], y[:32]), batch_size=16)
    return train, val


def make_trainer(tmp_path, callback, **kwargs):
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        callbacks=[callback],
        logger=TensorBoardLogger(str(tmp_path / "tb"), name="run"),
        log_every_n_steps=1,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )


def test_energy_reaches_tensorboard_and_matches_the_virtual_gpu(tmp_path):
    config = virtual_config(tmp_path)
    callback = ZeusCallback(config)
    trainer = make_trainer(tmp_path, callback, max_epochs=2)
    train, val = loaders()
    trainer.fit(TinyRegressor(), train, val)

    scalars = read_scalars(tmp_path / "tb")
    power_W = expected_power_W(config)
    for tag in (
        "energy/step_J",
        "power/mean_W",
        "energy/per_sample_J",
        "power_limit/W",
        "energy/epoch_J",
        "time/epoch_s",
        "energy/total_J",
        "time/total_s",
        "energy/eval_J",
    ):
        assert tag in scalars, f"{tag} missing from TensorBoard; have {sorted(scalars)}"
        assert all(v > 0 and math.isfinite(v) for _, v in scalars[tag]), tag
    # Mean power over the steps agrees with the trace's power at the limit in force (3 W sensor noise).
    for _, mean_W in scalars["power/mean_W"]:
        assert mean_W == pytest.approx(power_W, rel=0.05)
    # Step energy is power x step time; per-sample energy is step energy / batch size.
    # (Tags logged in one call have one event each, in the same order: zip them.)
    step_J = [v for _, v in scalars["energy/step_J"]]
    step_s = [v for _, v in scalars["time/step_s"]]
    per_sample = [v for _, v in scalars["energy/per_sample_J"]]
    assert len(step_J) == len(step_s) == len(per_sample) >= 2
    for energy, time_s, energy_per_sample in zip(step_J, step_s, per_sample, strict=True):
        assert energy == pytest.approx(power_W * time_s, rel=0.05)
        assert energy_per_sample == pytest.approx(energy / BATCH, rel=1e-4)
    # Epoch energy is power x epoch time, and the run total is at least the two epochs.
    epoch_s = [v for _, v in scalars["time/epoch_s"]]
    assert len(epoch_s) == 2
    for energy, time_s in zip((v for _, v in scalars["energy/epoch_J"]), epoch_s, strict=True):
        assert energy == pytest.approx(power_W * time_s, rel=0.05)
    total_J = scalars["energy/total_J"][-1][1]
    assert total_J >= sum(v for _, v in scalars["energy/epoch_J"]) * 0.99
    assert callback.summary is not None and callback.summary.status == "completed"
    assert callback.summary.steps == 2 * N_TRAIN // BATCH
    assert callback.summary.energy_J == pytest.approx(total_J, rel=1e-6)

    records = read_jsonl(tmp_path / "zeus" / "test.jsonl")
    events = [r["event"] for r in records]
    assert events[0] == "run_start" and events[-1] == "run_end"
    assert events.count("epoch") == 2
    # Every step measured: in the steps records' counts, or the run's warm-up step (windows.warmup_steps).
    warmup = sum(len(r["steps"]) for r in records if r["event"] == "warmup")
    assert sum(r["count"] for r in records if r["event"] == "steps") + warmup == 2 * N_TRAIN // BATCH


def test_progress_bar_shows_run_energy(tmp_path):
    callback = ZeusCallback(virtual_config(tmp_path))
    trainer = make_trainer(tmp_path, callback, max_epochs=1)
    train, _ = loaders()
    trainer.fit(TinyRegressor(), train)
    assert trainer.progress_bar_metrics["sim_energy_kJ"] > 0  # the virtual GPU: named simulated
    assert "energy_kJ" not in trainer.progress_bar_metrics
    # What Lightning's TQDM bar shows at the epoch's end in an 80-column terminal: our item comes after
    # v_num, and "simulated_energy_kJ=0.001" (its name until issue 26) ran past the line's end.
    from lightning.pytorch.callbacks import TQDMProgressBar
    from tqdm import tqdm

    items = TQDMProgressBar().get_metrics(trainer, trainer.lightning_module)
    assert list(items) == ["v_num", "sim_energy_kJ"]
    shown = {k: tqdm.format_num(v) if isinstance(v, float) else str(v) for k, v in items.items()}  # as set_postfix
    postfix = ", ".join(f"{k}={v}" for k, v in shown.items())
    steps = trainer.num_training_batches
    line = tqdm.format_meter(steps, steps, 2.0, ncols=80, prefix="Epoch 0", postfix=postfix)
    assert line.endswith(f"sim_energy_kJ={shown['sim_energy_kJ']}]"), line


def test_exception_ends_the_run_and_keeps_the_log(tmp_path):
    callback = ZeusCallback(virtual_config(tmp_path))
    trainer = make_trainer(tmp_path, callback, max_epochs=1)
    train, _ = loaders()
    with pytest.raises(RuntimeError, match="planted failure"):
        trainer.fit(TinyRegressor(fail_at_step=12), train)
    assert callback.summary is not None and callback.summary.status == "failed"
    assert callback.summary.energy_J > 0
    records = read_jsonl(tmp_path / "zeus" / "test.jsonl")
    assert [r["event"] for r in records][-2:] == ["exception", "run_end"]
    warmup = sum(len(r["steps"]) for r in records if r["event"] == "warmup")  # the run's first step
    assert sum(r["count"] for r in records if r["event"] == "steps") + warmup == 12
    assert not callback.session.started  # sampler stopped, backend released


def test_resume_from_checkpoint_carries_energy(tmp_path):
    config = virtual_config(tmp_path)
    first = ZeusCallback(config)
    trainer = make_trainer(tmp_path, first, max_epochs=1)
    train, _ = loaders()
    trainer.fit(TinyRegressor(), train)
    ckpt = tmp_path / "one_epoch.ckpt"
    trainer.save_checkpoint(ckpt)
    first_J = first.summary.energy_J

    second = ZeusCallback(config)
    trainer = make_trainer(tmp_path, second, max_epochs=2)
    trainer.fit(TinyRegressor(), train, ckpt_path=str(ckpt))
    assert second.summary.steps == 2 * N_TRAIN // BATCH  # steps of both segments
    assert second.summary.epochs == 2
    assert len(second.summary.epoch_energy_J) == 2
    # The total is the first segment's energy (carried) plus what the second measured.
    records = read_jsonl(second.summary.jsonl_path)
    assert records[0]["event"] == "run_start"
    assert records[0]["resumed_energy_J"] == pytest.approx(first_J, rel=1e-9)
    second_segment_J = second.summary.gpu_energy_J[0]
    assert second_segment_J > 0
    assert second.summary.energy_J == pytest.approx(first_J + second_segment_J, rel=1e-9)


def resume_from_an_edited_checkpoint(tmp_path, caplog, edit, **resumed):
    """One epoch fitted and checkpointed, ``edit(callbacks, key)`` applied to the checkpoint's callback states
    (``key``: the ZeusCallback's), then a second epoch resumed from it (``resumed``: sections of its config
    set anew); returns the trainer and the callback."""
    config = virtual_config(tmp_path)
    trainer = make_trainer(tmp_path, ZeusCallback(config), max_epochs=1)
    train, _ = loaders()
    trainer.fit(TinyRegressor(), train)
    ckpt = tmp_path / "one_epoch.ckpt"
    trainer.save_checkpoint(ckpt)
    checkpoint = torch.load(ckpt, weights_only=False)
    (key,) = [k for k in checkpoint["callbacks"] if k.startswith("ZeusCallback")]
    edit(checkpoint["callbacks"], key)
    torch.save(checkpoint, ckpt)

    second = ZeusCallback({**config, **resumed})
    trainer = make_trainer(tmp_path, second, max_epochs=2)
    with caplog.at_level(logging.WARNING, logger="zeus_callbacks"):
        trainer.fit(TinyRegressor(), train, ckpt_path=str(ckpt))  # training goes on
    return trainer, second


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (lambda state: state.update(energy_J=-26.1), "energy_J must be a finite number >= 0, not -26.1"),
        (lambda state: state.pop("energy_J"), "energy_J is missing"),  # was read as 0 J: a total short of epoch 1
        # An outside tester's edits that passed the type checks: an epoch of another run marked, an absurd total.
        (lambda state: state.update(open_epoch="x"), "open_epoch must be a whole number >= 0 or null, not 'x'"),
        (lambda state: state.update(energy_J=1e300), "energy_J 1e+300 is more than any job's GPUs could draw"),
    ],
    ids=["negative", "missing", "open_epoch", "absurd"],
)
def test_a_checkpoint_with_a_damaged_energy_state_resumes_with_the_energy_unknown(tmp_path, caplog, edit, said):
    def damage(callbacks, key):  # hand-edited, or written by a buggy tool
        edit(callbacks[key])

    trainer, second = resume_from_an_edited_checkpoint(tmp_path, caplog, damage)
    assert trainer.current_epoch == 2 and second.summary.status == "completed"
    assert said in caplog.text
    assert math.isnan(second.summary.energy_J)  # unknown, never a negative total or one missing the first epoch
    assert "energy state was unreadable" in second.summary.energy_note and said in second.summary.energy_note
    # What was readable is kept: the steps, epochs and time count both segments (they counted the second only).
    assert second.summary.steps == 2 * N_TRAIN // BATCH and second.summary.epochs == 2
    assert len(second.summary.epoch_energy_J) == 2
    records = read_jsonl(second.summary.jsonl_path)
    (start,) = [r for r in records if r["event"] == "run_start"]
    assert start["resumed_steps"] == N_TRAIN // BATCH
    assert not any(r.get("resumed_mid_epoch") for r in records if r["event"] == "epoch")  # saved between epochs
    assert "cover only the run after the checkpoint" not in second.summary.energy_note


def test_a_checkpoint_whose_counts_are_unreadable_says_they_cover_the_resumed_run_only(tmp_path, caplog):
    def damage(callbacks, key):
        callbacks[key].update(energy_J=-26.1, steps="twenty", time_s=None)

    trainer, second = resume_from_an_edited_checkpoint(tmp_path, caplog, damage)
    assert trainer.current_epoch == 2 and second.summary.status == "completed"
    assert math.isnan(second.summary.energy_J)
    # The epochs were readable and are kept; the steps and time count the second epoch only, and the note says so.
    assert second.summary.epochs == 2 and second.summary.steps == N_TRAIN // BATCH
    assert "its time and steps cover only the run after the checkpoint" in second.summary.energy_note
    assert "its epochs are kept" in caplog.text
    # the step means' sums stand on the steps: not carried without them (190 measured steps of 64, a tester saw)
    assert second.summary.measured_steps <= second.summary.steps


@pytest.mark.parametrize(
    ("rows", "says"),
    [
        ([{}], "limits[0].limit_W is missing"),  # stopped training: KeyError 'limit_W'
        ([{"limit_W": "250"}], "limits[0].limit_W must be a finite number > 0, not '250'"),
        ([{"limit_W": 250.0, "energy_J": ["9.5"], "time_s": [0.1]}], "limits[0].energy_J[0] must be"),
        ([{"limit_W": 250.0, "energy_J": [float("nan")], "time_s": [0.1]}], "limits[0].energy_J[0] must be"),
        ([{"limit_W": 250.0, "steps": -3}], "limits[0].steps must be a whole number >= 0, not -3"),
    ],
)
def test_a_checkpoint_with_a_damaged_power_limit_profile_profiles_again_keeping_the_energy(tmp_path, caplog, rows,
                                                                                            says):  # fmt: skip
    # A tester's checkpoint: a power_limit sub-state that is a mapping but whose rows are damaged.
    def damage(callbacks, key):
        callbacks[key]["power_limit"] = {"phase": "profiling", "profiling_steps": 4, "limits": rows}

    profiling = {"enabled": True, "search": "sweep", "warmup_steps": 1, "min_profile_steps": 2, "profile_steps": 3,
                 "step_W": 50.0, "cache": False, "plot": False}  # fmt: skip
    trainer, second = resume_from_an_edited_checkpoint(tmp_path, caplog, damage, power_limit=profiling)
    assert trainer.current_epoch == 2 and second.summary.status == "completed"
    assert "power-limit profile is unreadable" in caplog.text and says in caplog.text
    assert "profiling starts over" in caplog.text
    assert "continuing the checkpoint's power-limit profile" not in caplog.text
    # Only the profile was dropped: the energy and counts carried from the first epoch are kept.
    assert math.isfinite(second.summary.energy_J) and second.summary.energy_note is None
    assert second.summary.steps == 2 * N_TRAIN // BATCH and second.summary.epochs == 2
    records = read_jsonl(second.summary.jsonl_path)
    assert records[0]["resumed_energy_J"] > 0
    assert any(r["event"] == "power_limit_profile" for r in records)  # profiled anew in this segment


def test_a_power_limit_choice_outside_the_cards_limits_profiles_again_keeping_the_energy(tmp_path, caplog):
    # An outside tester's checkpoint: a finished profile choosing 5000 W passed, and the run went on with
    # another limit than the one saved, without a word. The card's range is known once profiling starts.
    def damage(callbacks, key):
        callbacks[key]["power_limit"] = {"phase": "done", "chosen_limit_W": 5000.0, "profiling_steps": 0, "limits": []}

    profiling = {"enabled": True, "search": "sweep", "warmup_steps": 1, "min_profile_steps": 2, "profile_steps": 3,
                 "step_W": 50.0, "cache": False, "plot": False}  # fmt: skip
    trainer, second = resume_from_an_edited_checkpoint(tmp_path, caplog, damage, power_limit=profiling)
    assert trainer.current_epoch == 2 and second.summary.status == "completed"
    assert "power-limit profile is unreadable (power_limit.chosen_limit_W 5000.0 is outside the limits" in caplog.text
    assert "profiling starts over" in caplog.text
    assert "continuing the checkpoint's power-limit profile" not in caplog.text
    assert math.isfinite(second.summary.energy_J) and second.summary.energy_note is None  # only the profile dropped
    assert any(r["event"] == "power_limit_profile" for r in read_jsonl(second.summary.jsonl_path))


def test_a_damaged_power_limit_profile_with_profiling_off_is_dropped_not_started_over(tmp_path, caplog):
    def damage(callbacks, key):
        callbacks[key]["power_limit"] = {"limits": [{}]}

    trainer, second = resume_from_an_edited_checkpoint(tmp_path, caplog, damage)
    assert trainer.current_epoch == 2 and second.summary.status == "completed"
    assert "power-limit profile is unreadable" in caplog.text and "it is dropped" in caplog.text
    assert "profiling starts over" not in caplog.text and math.isfinite(second.summary.energy_J)


@pytest.mark.parametrize("edit", ["emptied", "removed"])
def test_a_checkpoint_without_the_callbacks_state_resumes_with_the_energy_unknown(tmp_path, caplog, edit):
    # A tester's checkpoints: the callback's entry emptied (Lightning hands no empty state over) or removed.
    # The resumed total silently missed the first segment.
    def without(callbacks, key):
        if edit == "emptied":
            callbacks[key] = {}
        else:
            del callbacks[key]

    trainer, second = resume_from_an_edited_checkpoint(tmp_path, caplog, without)
    assert trainer.current_epoch == 2 and second.summary.status == "completed"
    assert "holds no energy state" in caplog.text
    assert math.isnan(second.summary.energy_J) and "holds no energy state" in second.summary.energy_note
    # Nothing was carried: the counts are the second epoch's, and the note says they are not the whole run's.
    assert second.summary.steps == N_TRAIN // BATCH
    assert "its time, steps and epochs cover only the run after the checkpoint" in second.summary.energy_note


def test_bad_config_fails_before_training(tmp_path):
    with pytest.raises(ConfigError, match=r"logging\.interval_step"):
        ZeusCallback({"backend": "virtual", "logging": {"interval_step": 5}})
    with pytest.raises(ConfigError, match="not found"):
        ZeusCallback.from_yaml(tmp_path / "missing.yaml")


def test_lightning_cli_accepts_the_callback_from_yaml(tmp_path):
    pytest.importorskip("jsonargparse")
    from lightning.pytorch.cli import LightningCLI

    zeus_yaml = tmp_path / "zeus.yaml"
    zeus_yaml.write_text(
        f"backend: virtual\nlogging:\n  interval_steps: 2\n  run_name: cli\n  log_dir: {tmp_path / 'zeus'}\n"
    )
    cli_yaml = tmp_path / "cli.yaml"
    cli_yaml.write_text(
        "trainer:\n"
        "  max_epochs: 1\n  accelerator: cpu\n  devices: 1\n  logger: false\n"
        "  enable_progress_bar: false\n  enable_checkpointing: false\n  limit_train_batches: 6\n"
        "  callbacks:\n"
        "    - class_path: zeus_callbacks.ZeusCallback\n"
        f"      init_args:\n        config: {zeus_yaml}\n"
        "    - class_path: zeus_callbacks.ZeusCallback\n"
        "      init_args:\n        config:\n          job_id: inline\n          backend: virtual\n"
        f"          logging: {{run_name: inline, log_dir: {tmp_path / 'zeus'}}}\n"
    )
    cli = LightningCLI(CLIModel, CLIData, args=["fit", "--config", str(cli_yaml)], save_config_callback=None)
    zeus = [cb for cb in cli.trainer.callbacks if isinstance(cb, ZeusCallback)]
    assert [cb.config.job_id for cb in zeus] == ["default", "inline"]
    assert zeus[0].config.logging.interval_steps == 2
    assert all(cb.summary is not None and cb.summary.steps == 6 for cb in zeus)
    assert (tmp_path / "zeus" / "cli.jsonl").exists() and (tmp_path / "zeus" / "inline.jsonl").exists()


class CLIModel(TinyRegressor):
    def __init__(self) -> None:
        super().__init__()


class CLIData(L.LightningDataModule):
    def train_dataloader(self):
        return loaders()[0]


def test_every_step_report_reaches_the_logger_whatever_log_every_n_steps(tmp_path):
    callback = ZeusCallback(virtual_config(tmp_path, interval_steps=3))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        callbacks=[callback],
        max_epochs=2,
        logger=TensorBoardLogger(str(tmp_path / "tb"), name="run"),
        log_every_n_steps=50,  # Lightning would drop step values logged between these
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    train, _ = loaders()
    trainer.fit(TinyRegressor(), train)
    records = read_jsonl(tmp_path / "zeus" / "test.jsonl")
    reports = [r for r in records if r["event"] == "steps"]
    logged = read_scalars(tmp_path / "tb")["energy/step_J"]
    # (Steps here take ~2 ms, so a report waits for the 20 ms power samples to cover its steps.)
    warmup = sum(len(r["steps"]) for r in records if r["event"] == "warmup")  # windows.warmup_steps
    assert len(reports) >= 2 and sum(r["count"] for r in reports) + warmup == 2 * N_TRAIN // BATCH
    assert [v for _, v in logged] == pytest.approx([r["energy_J_mean"] for r in reports], rel=1e-6)
    # Energy metrics are also in callback_metrics, for ModelCheckpoint / EarlyStopping monitors.
    assert "energy/epoch_J" in trainer.callback_metrics


class BatchTruth(Callback):
    """Counts the batches the trainer ran (saved in checkpoints, like ZeusCallback's totals) and the quiet ones."""

    def __init__(self, zeus: ZeusCallback) -> None:
        self.zeus = zeus
        self.batches = 0
        self.quiet = 0  # batches whose step_start returned at once (counted ahead by the session)
        self.last_quiet = False
        self.evaluations: list[int] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.last_quiet = self.zeus.session.quiet_steps_left > 0  # after ZeusCallback's step_start (callback order)
        self.quiet += self.last_quiet

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.batches += 1

    def on_validation_end(self, trainer, pl_module):
        self.evaluations.append(self.batches)

    def state_dict(self):
        return {"batches": self.batches}

    def load_state_dict(self, state_dict):
        self.batches = state_dict["batches"]


@pytest.mark.parametrize("phases", [False, True])
def test_sampled_steps_count_every_batch_through_mid_epoch_evaluations_checkpoints_and_a_resume(tmp_path, phases):
    """2 % of steps measured: quiet stretches cut by evaluations (val_check_interval 0.3), checkpoints, a failure."""
    config = virtual_config(tmp_path, interval_steps=50)
    config["windows"] = {"sample_fraction": 0.02, "phases": phases}
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(640, 16, generator=g), torch.randn(640, 1, generator=g)
    train = DataLoader(TensorDataset(x, y), batch_size=BATCH)  # 80 batches an epoch
    _, val = loaders()

    def fit(name, model, ckpt_path=None, **kwargs):
        zeus = ZeusCallback({**config, "logging": {**config["logging"], "run_name": name}})
        truth = BatchTruth(zeus)
        every = ModelCheckpoint(dirpath=tmp_path / name, every_n_train_steps=9, save_top_k=-1)
        trainer = L.Trainer(accelerator="cpu", devices=1, callbacks=[zeus, truth, every], logger=False,
                            val_check_interval=0.3, num_sanity_val_steps=0, enable_progress_bar=False,
                            enable_model_summary=False, **kwargs)  # fmt: skip
        try:
            trainer.fit(model, train, val, ckpt_path=ckpt_path)
        except RuntimeError as exc:
            assert str(exc) == "planted failure"
        records = read_jsonl(zeus.summary.jsonl_path)
        assert zeus.summary.steps == truth.batches
        assert [r["step"] for r in records if r["event"] == "evaluate"] == truth.evaluations
        saved = [torch.load(p, weights_only=False)["callbacks"] for p in sorted((tmp_path / name).glob("*.ckpt"))]
        assert len(saved) >= 8  # mid-stretch state_dict calls
        for state in saved:
            zeus_state, truth_state = (next(v for k, v in state.items() if k.startswith(n)) for n in ("Zeus", "Batch"))
            assert zeus_state["steps"] == truth_state["batches"]
        return zeus, truth, sum(r["steps"] + r["warmup_steps"] for r in records if r["event"] == "steps")

    first, truth, logged = fit("first", TinyRegressor(), max_steps=100)  # ends 20 batches into the second epoch
    assert truth.batches == logged == 100 and first.summary.epochs == 2
    assert truth.quiet > 40  # most steps were counted ahead
    ckpt = tmp_path / "first" / "epoch=1-step=99.ckpt"  # saved mid-epoch: the resume starts there

    # The resumed segment fails in the middle of its last epoch (and of a quiet stretch).
    second, truth, logged = fit("second", TinyRegressor(fail_at_step=217), ckpt_path=str(ckpt), max_epochs=3)
    assert second.summary.status == "failed" and truth.last_quiet  # the failing batch was counted ahead
    assert truth.batches == 217 and logged == 217 - 99  # this segment's JSONL counts its own steps
    assert second.summary.steps == 217 and second.summary.epochs == 3  # the last one cut short
    assert truth.quiet > 60


class ClockedRegressor(TinyRegressor):
    """Each training step takes ``step_s`` on a manual clock: windows hold counts of steps, on any machine."""

    def __init__(self, clock: ManualClock, step_s: float) -> None:
        super().__init__()
        self.clock, self.step_s = clock, step_s

    def training_step(self, batch, batch_idx):
        self.clock.advance(self.step_s)
        return super().training_step(batch, batch_idx)


def test_an_epoch_resumed_mid_way_says_its_figures_cover_only_the_steps_after_the_checkpoint(tmp_path):
    config = virtual_config(tmp_path)
    steps_per_epoch, step_s = N_TRAIN // BATCH, 0.05
    every = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=7, save_top_k=-1)
    clock = ManualClock(1_000.0)
    first = ZeusCallback(config, backend=manual_virtual_backend(config, clock))
    train, _ = loaders()
    trainer = L.Trainer(accelerator="cpu", devices=1, callbacks=[first, every], logger=False, max_epochs=2,
                        enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(ClockedRegressor(clock, step_s), train)
    first_epochs = [r for r in read_jsonl(first.summary.jsonl_path) if r["event"] == "epoch"]
    assert [r["resumed_mid_epoch"] for r in first_epochs] == [False, False]
    assert [r["time_s"] for r in first_epochs] == pytest.approx([steps_per_epoch * step_s] * 2)
    ckpt = tmp_path / "ckpt" / "epoch=1-step=28.ckpt"  # 8 batches into epoch 1

    clock = ManualClock(1_000.0)  # a new process
    second = ZeusCallback(config, backend=manual_virtual_backend(config, clock))
    trainer = L.Trainer(accelerator="cpu", devices=1, callbacks=[second], logger=False, max_epochs=2,
                        default_root_dir=tmp_path,
                        enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(ClockedRegressor(clock, step_s), train, ckpt_path=str(ckpt))
    (resumed,) = [r for r in read_jsonl(second.summary.jsonl_path) if r["event"] == "epoch"]
    assert resumed["epoch"] == 1 and resumed["resumed_mid_epoch"] and resumed["covered_from_step"] == 28
    assert not resumed["complete"] and resumed["energy_J"] > 0
    assert resumed["time_s"] == pytest.approx((steps_per_epoch - 8) * step_s)  # 12 of the epoch's 20 steps
    assert second.summary.steps == 2 * steps_per_epoch


@settings(max_examples=60, deadline=None)
@given(
    kind=st.sampled_from(["tensor", "tuple", "list", "dict"]),
    sizes=st.lists(st.integers(0, 5), min_size=1, max_size=4),
    scalar_first=st.booleans(),
)
def test_the_batch_size_fast_path_gives_lightnings_answer(kind, sizes, scalar_first):
    """``_batch_size``'s fast paths (tensor, tuple, list, dict of tensors) agree with extract_batch_size."""
    import warnings

    from lightning.pytorch.utilities.data import extract_batch_size

    from zeus_callbacks.integrations.lightning import _batch_size

    tensors = [torch.zeros(n, 2) for n in sizes]
    if scalar_first:
        tensors[0] = torch.tensor(1.0)  # a 0-d tensor first: no fast path
    batch = {
        "tensor": tensors[0],
        "tuple": tuple(tensors),
        "list": list(tensors),
        "dict": {f"k{i}": t for i, t in enumerate(tensors)},
    }[kind]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning warns when the sizes disagree
        try:
            expected = int(extract_batch_size(batch))
        except Exception:
            expected = None
    assert _batch_size(batch) == expected
