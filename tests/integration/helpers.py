"""Shared pieces of the framework integration tests: a tiny model, TB read-back, virtual-GPU truth."""

from __future__ import annotations

from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.timeouts import CHILD_TIMEOUT_S
from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.backends.virtual import VirtualGPUBackend
from zeus_callbacks.config import ZeusConfig


def virtual_config(tmp_path: Path, **logging: object) -> dict:
    """A config that measures the virtual GPU and logs under ``tmp_path``."""
    return {
        "backend": "virtual",
        "virtual": {"gpu": "A40", "workload": "imagenet", "noise_W": 3.0},
        # Tiny CPU steps would be sampled (windows.sample_fraction auto); these tests check every step.
        "windows": {"sample_fraction": 1.0},
        "logging": {"interval_steps": 5, "log_dir": str(tmp_path / "zeus"), "run_name": "test", **logging},
    }


def expected_power_W(config: dict) -> float:
    """The virtual GPU's power at its default (maximum) limit, from the trace itself."""
    cfg = ZeusConfig.model_validate(config).virtual
    backend = VirtualGPUBackend(gpu=cfg.gpu, workload=cfg.workload, batch_size=cfg.batch_size)
    return backend.average_power_W(backend.power_limit_W(0))


def read_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the TensorBoard event files under ``log_dir``: tag -> [(step, value)]."""
    scalars: dict[str, list[tuple[int, float]]] = {}
    event_dirs = {p.parent for p in Path(log_dir).rglob("events.out.tfevents.*")}
    assert event_dirs, f"no TensorBoard event files under {log_dir}"
    for directory in event_dirs:
        acc = EventAccumulator(str(directory), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            scalars.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return scalars


def manual_virtual_backend(config: dict, clock: ManualClock) -> VirtualGPUBackend:
    """The config's virtual GPU on ``clock``: a window's time is what the test advanced, whatever the load."""
    cfg = ZeusConfig.model_validate(config).virtual
    return VirtualGPUBackend(
        gpu=cfg.gpu, workload=cfg.workload, batch_size=cfg.batch_size, noise_W=cfg.noise_W, clock=clock, read_only=True
    )


class SampledClock(ManualClock):
    """A manual clock after whose every advance the session's sampler has read the sensor.

    A step report holds the steps the power samples cover. The sampler thread reads on the wall
    clock, so how many steps a report held depended on when that thread ran (2 reports of 20 steps
    instead of 6, in CI). Set ``adapter`` to the callback once it exists: the clock reads its
    ``session`` at each advance, because the callback makes a new session when training begins
    (a session taken at construction is never started, and no read happened).
    """

    def __init__(self, start_s: float = 0.0) -> None:
        super().__init__(start_s)
        self.adapter = None
        self.reads = 0  # sensor reads this clock had made: a test can check it drove them

    def advance(self, dt_s: float) -> float:
        now_s = super().advance(dt_s)
        session = None if self.adapter is None else self.adapter.session
        if session is not None and session.started:
            session.run.sampler.poll_bounded(read_counter=False, timeout_s=CHILD_TIMEOUT_S)
            self.reads += 1
        return now_s


def spy_wandb(monkeypatch, tmp_path: Path) -> list[dict]:
    """Run W&B offline under ``tmp_path`` and keep every dict a run is given to log, as it is given.

    Offline runs cannot be read back, so ``wandb.init`` is wrapped: the run's ``log`` (what Lightning's
    WandbLogger calls) and the module-level ``wandb.log`` that ``init`` binds to it (what the HF
    integration calls) both append to the returned list, then log for real.
    """
    import pytest

    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    logged: list[dict] = []
    real_init = wandb.init

    def spying_init(*args, **kwargs):
        run = real_init(*args, **kwargs)
        real_log = run.log

        def log(data, *a, **k):
            logged.append(dict(data))
            return real_log(data, *a, **k)

        monkeypatch.setattr(run, "log", log)
        monkeypatch.setattr(wandb, "log", log)
        return run

    monkeypatch.setattr(wandb, "init", spying_init)
    return logged
