"""Power-limit profiling end to end in real Lightning and Hugging Face trainers (virtual GPU, wall clock)."""

from __future__ import annotations

from tests.integration.helpers import SampledClock, read_scalars, virtual_config
from tests.integration.test_huggingface import make_trainer as make_hf_trainer
from tests.integration.test_lightning import TinyRegressor, loaders
from tests.integration.test_lightning import make_trainer as make_pl_trainer
from zeus_callbacks import ZeusCallback, ZeusTrainerCallback
from zeus_callbacks.backends.base import Clock, WallClock
from zeus_callbacks.backends.virtual import VirtualGPUBackend
from zeus_callbacks.optimizers.power_limit import MARKER_NAME
from zeus_callbacks.reporting import read_jsonl

ORIGINAL_W = 275.0


def profiling_config(tmp_path) -> dict:
    config = virtual_config(tmp_path)
    config["sampling"] = {"poll_period_s": 0.02}
    config["power_limit"] = {
        "enabled": True,
        "warmup_steps": 1,
        "min_profile_steps": 2,
        "profile_steps": 3,
        "step_W": 100.0,
    }
    return config


STEP_S = 0.25  # a step's time at the maximum limit on the simulated clock (s)


def backend_at_original(clock: Clock | None = None) -> VirtualGPUBackend:
    clock = WallClock() if clock is None else clock
    backend = VirtualGPUBackend(gpu="A40", workload="imagenet", clock=clock, noise_W=3.0, read_only=False)
    backend.set_power_limit_W(0, ORIGINAL_W)
    return backend


class SimulatedTimeRegressor(TinyRegressor):
    """Each training step takes the trace's time at the limit in force, on a clock only the steps move.

    On the wall clock a step took this machine's time: under load the power samples lagged the steps,
    profiling waited for them, and the search could still be running when the fit ended ("unfinished",
    once in CI). Here every step and its samples are where the clock says, whatever the load.
    """

    def __init__(self, clock: SampledClock, backend: VirtualGPUBackend) -> None:
        super().__init__()
        self.clock, self.backend = clock, backend

    def training_step(self, batch, batch_idx):
        self.clock.advance(STEP_S * self.backend.step_time_factor(self.backend.power_limit_W(0)))
        return super().training_step(batch, batch_idx)


def check_run(tmp_path, backend: VirtualGPUBackend, *, wall_clock: bool = True) -> dict:
    assert backend.power_limit_W(0) == ORIGINAL_W  # restored at the end
    assert not (tmp_path / "zeus" / MARKER_NAME).exists()
    records = read_jsonl(tmp_path / "zeus" / "test.jsonl")
    (profile,) = [r for r in records if r["event"] == "power_limit_profile"]
    assert profile["source"] == "profile" and profile["profiling_steps"] > 0
    assert len(profile["limits"]) >= 2
    limits_logged = {r["power_limit_W"] for r in records if r["event"] == "steps"}
    assert profile["chosen_limit_W"] in limits_logged or len(limits_logged) > 1
    assert records[-1]["event"] == "run_end" and records[-1]["power_limit_W"] == ORIGINAL_W
    if wall_clock:  # the virtual GPU on the wall clock: power simulated, time not; the results say so (issue 26)
        assert "not a saving" in profile["time_note"] and records[-1]["time_note"] == profile["time_note"]
    else:  # the trace's time too: nothing to say
        assert profile["time_note"] is None and records[-1]["time_note"] is None
    return profile


def test_lightning_profiles_applies_and_restores(tmp_path):
    # A real Lightning fit on a simulated clock (SimulatedTimeRegressor): where the search ends does not
    # depend on how fast this machine runs the steps or the sampler thread.
    clock = SampledClock(1_000.0)
    backend = backend_at_original(clock)
    callback = ZeusCallback(profiling_config(tmp_path), backend=backend)
    clock.adapter = callback
    trainer = make_pl_trainer(tmp_path, callback, max_epochs=3, val_check_interval=7)
    train, val = loaders()
    trainer.fit(SimulatedTimeRegressor(clock, backend), train, val)
    assert clock.reads >= 60  # the steps moved the clock, and the sensor was read after each
    profile = check_run(tmp_path, backend, wall_clock=False)
    # The fit's length reached the search (issue 31): 3 epochs of 20 steps, power_limit.job_steps unset.
    assert job_steps_of(callback) == 60 == trainer.estimated_stepping_batches
    assert (profile["job_steps"], profile["job_steps_source"]) == (60, "trainer")  # and its record says so
    scalars = read_scalars(tmp_path / "tb")
    assert "power_limit/chosen_W" in scalars and "power_limit/profiling_steps" in scalars
    assert len({v for _, v in scalars["power_limit/W"]}) >= 2  # the limit in force changed


def test_huggingface_profiles_applies_and_restores(tmp_path):
    backend = backend_at_original()
    callback = ZeusTrainerCallback(profiling_config(tmp_path), backend=backend)
    trainer = make_hf_trainer(tmp_path, callback, report_to="none", max_steps=60, eval_steps=10)
    trainer.train()
    profile = check_run(tmp_path, backend)
    assert job_steps_of(callback) == 60  # the Trainer's max_steps reached the search (issue 31)
    assert (profile["job_steps"], profile["job_steps_source"]) == (60, "trainer")  # max_steps − global_step 0


def test_a_resumed_lightning_fit_records_the_steps_it_has_left(tmp_path):
    train, val = loaders()
    first = make_pl_trainer(tmp_path / "first", ZeusCallback(virtual_config(tmp_path / "first")), max_epochs=1)
    first.fit(TinyRegressor(), train)
    ckpt = tmp_path / "one_epoch.ckpt"
    first.save_checkpoint(ckpt)
    assert first.global_step == 20

    backend = backend_at_original()
    callback = ZeusCallback(profiling_config(tmp_path), backend=backend)
    trainer = make_pl_trainer(tmp_path, callback, max_steps=70)
    trainer.fit(TinyRegressor(), train, val, ckpt_path=str(ckpt))
    # Whether the search ends within the 50 steps depends on the wall-clock step times (the virtual GPU
    # simulates power, not time): this test is about the length it was told, not where it ended.
    assert backend.power_limit_W(0) == ORIGINAL_W  # restored at the end
    (profile,) = [r for r in read_jsonl(tmp_path / "zeus" / "test.jsonl") if r["event"] == "power_limit_profile"]
    assert profile["source"] in ("profile", "unfinished") and profile["profiling_steps"] > 0
    # max_steps 70, 20 of them done before the checkpoint: the search was told the 50 left (issue 31).
    assert (profile["job_steps"], profile["job_steps_source"]) == (50, "trainer")
    assert job_steps_of(callback) == 50


def job_steps_of(callback) -> int | None:
    """The job length the power-limit search was given (its profiler's settings)."""
    limiter = callback.session._power.power_limiter
    assert limiter is not None
    return limiter.profiler.settings.job_steps


def test_a_configured_job_length_wins_over_the_framework_s(tmp_path):
    backend = backend_at_original()
    config = profiling_config(tmp_path)
    config["power_limit"]["job_steps"] = 5000
    callback = ZeusTrainerCallback(config, backend=backend)
    trainer = make_hf_trainer(tmp_path, callback, report_to="none", max_steps=30)
    trainer.train()
    assert job_steps_of(callback) == 5000
    (profile,) = [r for r in read_jsonl(tmp_path / "zeus" / "test.jsonl") if r["event"] == "power_limit_profile"]
    assert (profile["job_steps"], profile["job_steps_source"]) == (5000, "config")  # not the Trainer's 30
