"""Deterministic training runs on the virtual GPU, driven through the public API only.

Each scenario builds an :class:`~zeus_callbacks.EnergySession` on a noise-free
:class:`~zeus_callbacks.backends.virtual.VirtualGPUBackend` whose
:class:`~zeus_callbacks.backends.ManualClock` only moves when the driver advances it, runs
a scripted training loop (epochs, steps, phases, evaluations), and returns the paths of the
JSONL logs it wrote. Only public names are used, so the scenarios survive moves of the
package's internals: they characterise what a user sees.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from zeus_callbacks import EnergySession, RunSummary, suggest_batch_size
from zeus_callbacks.backends import ManualClock
from zeus_callbacks.backends.virtual import VirtualGPUBackend

START_S = 1_000.0  # manual clock origin (s); non-zero catches origin bugs
STEP_S = 0.05  # one step at the maximum power limit (s)
EVAL_S = 0.1  # one evaluation loop (s)
NUM_SAMPLES = 8
NUM_TOKENS = 96
# Phase split of a step with windows.phases (forward, backward, optimizer), fractions of STEP_S.
PHASE_SPLIT = (("forward", 0.4), ("backward", 0.4), ("optimizer", 0.2))


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra`` merged in, nested mappings merged key by key."""
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def base_config(log_dir: Path, run_name: str, **extra: Any) -> dict[str, Any]:
    """Settings every scenario shares: the virtual backend, a fixed sample fraction, logs under ``log_dir``.

    ``windows.sample_fraction`` is never ``auto`` here: auto sizes the sample from the hooks'
    wall-clock cost, which no manual clock controls.
    """
    base = {
        "backend": "virtual",
        "windows": {"sample_fraction": 1.0},
        "logging": {"log_dir": str(log_dir), "run_name": run_name, "interval_steps": 5},
        "power_limit": {"plot": False},
    }
    return deep_merge(base, extra)


def step_time_s(backend: VirtualGPUBackend) -> float:
    """Step time at the power limit in force: slower below the maximum (a smooth, made-up law)."""
    limit_W = backend.power_limit_W(0)
    max_W = backend.power_limit_constraints_W(0)[1]
    return STEP_S * (max_W / limit_W) ** 0.25


def train(
    session: EnergySession,
    backend: VirtualGPUBackend,
    clock: ManualClock,
    *,
    epochs: int = 2,
    steps_per_epoch: int = 12,
    phases: bool = False,
    metric: Callable[[int], dict[str, float]] | None = None,
    run_name: str | None = None,
) -> RunSummary:
    """Run a scripted training loop through ``session`` and end it.

    Args:
        session: A session not yet started.
        backend: Its virtual GPU.
        clock: The backend's manual clock.
        epochs: Most epochs to train (fewer if the session says stop).
        steps_per_epoch: Steps per epoch.
        phases: Mark forward / backward / optimizer phases inside each step.
        metric: Validation metrics after epoch ``e`` (default ``val/acc`` rising by 0.1 per epoch).
        run_name: Passed to ``train_start``.

    Returns:
        The run's summary.
    """
    metric = metric or (lambda e: {"val/acc": 0.5 + 0.1 * e})
    session.train_start(run_name=run_name)
    sampler = session.sampler
    assert sampler is not None
    step = 0
    for epoch in range(epochs):
        session.epoch_start(epoch)
        stop = False
        for _ in range(steps_per_epoch):
            session.step_start(step, phase="forward" if phases else None)
            dt_s = step_time_s(backend)  # the limit in force was applied at step_start
            if phases:
                for i, (name, share) in enumerate(PHASE_SPLIT):
                    clock.advance(share * dt_s)
                    if i + 1 < len(PHASE_SPLIT):
                        session.phase_switch(name, PHASE_SPLIT[i + 1][0])
                    else:
                        session.phase_end(name)
            else:
                clock.advance(dt_s)
            sampler.poll_once()  # drain the sensor as the sampler thread would
            decision = session.step_end(step, num_samples=NUM_SAMPLES, num_tokens=NUM_TOKENS)
            step += 1
            if decision.stop_training:
                stop = True
                break
        session.eval_start()
        clock.advance(EVAL_S)
        sampler.poll_once()
        session.eval_end()
        stop = session.evaluate(metric(epoch)).stop_training or stop
        session.epoch_end(epoch)
        if stop:
            break
    return session.train_end()


def virtual_gpu(clock: ManualClock, **kwargs: Any) -> VirtualGPUBackend:
    """A noise-free virtual A40 on ``clock`` (read-only unless ``read_only=False``)."""
    kwargs.setdefault("read_only", True)
    return VirtualGPUBackend(clock=clock, noise_W=0.0, **kwargs)


def single_run(log_dir: Path, name: str, config: dict[str, Any], *, phases: bool = False, **train_kw: Any) -> Path:
    """One run of :func:`train` with ``config`` merged over :func:`base_config`; its JSONL path."""
    clock = ManualClock(START_S)
    read_only = not config.get("power_limit", {}).get("enabled", False)
    backend = virtual_gpu(clock, read_only=read_only)
    try:
        session = EnergySession(base_config(log_dir, name, **config), backend=backend, is_main_process=True)
        summary = train(session, backend, clock, phases=phases, **train_kw)
    finally:
        backend.close()
    assert summary.jsonl_path is not None
    return Path(summary.jsonl_path)


def plain(log_dir: Path) -> list[Path]:
    """Every step measured, no phases, no optimiser."""
    return [single_run(log_dir, "plain", {})]


def phases(log_dir: Path) -> list[Path]:
    """``windows.phases`` on: forward / backward / optimizer per measured step."""
    return [single_run(log_dir, "phases", {"windows": {"phases": True}}, phases=True)]


def sample_fraction(log_dir: Path) -> list[Path]:
    """A fixed ``windows.sample_fraction`` of 0.25 (the seeded random subset of steps), with phases."""
    config = {"windows": {"sample_fraction": 0.25, "phases": True}}
    return [single_run(log_dir, "sample_fraction", config, phases=True, epochs=3, steps_per_epoch=40)]


def power_limit(log_dir: Path) -> list[Path]:
    """Just-in-time power-limit profiling on a settable virtual GPU, then a second run that hits the cache."""
    config = {
        "power_limit": {
            "enabled": True,
            "objective": "zeus_cost",
            "cache_path": str(log_dir / "power_limit_cache.json"),
            "restore_marker": str(log_dir / "power_limit_restore.json"),
        },
    }
    first = single_run(log_dir, "power_limit", config, epochs=3, steps_per_epoch=80)
    cached = single_run(log_dir, "power_limit_cached", config, epochs=1, steps_per_epoch=20)
    return [first, cached]


BANDIT_SIZES = (32, 64, 128)
BANDIT_RECURRENCES = 5


def bandit_epochs_to_target(batch_size: int) -> int:
    """Epochs a recurrence at ``batch_size`` needs to reach the target (larger batches need more)."""
    return {32: 3, 64: 2, 128: 4}[batch_size]


def bandit(log_dir: Path) -> list[Path]:
    """The batch-size bandit over a few recurrences of one job, against a real SQLite store."""
    paths = []
    for index in range(BANDIT_RECURRENCES):
        config = {
            "job_id": "golden-bandit",
            "store": {"backend": "sqlite", "path": str(log_dir / "store.sqlite")},
            "batch_size": {
                "enabled": True,
                "batch_sizes": list(BANDIT_SIZES),
                "default_batch_size": 64,
                "target": {"metric": "val/acc", "value": 0.8, "direction": "max"},
                "seed": 7,
                "stop_agreement_steps": 4,
            },
        }
        settings = base_config(log_dir, f"bandit-{index}", **config)
        # As a launcher script does: ask before the data loaders (and here the GPU) exist.
        batch_size = suggest_batch_size(settings)
        assert batch_size in BANDIT_SIZES
        clock = ManualClock(START_S)
        # The GPU's workload follows the chosen batch size: a larger batch draws more power.
        backend = virtual_gpu(clock, workload="cifar100", batch_size=batch_size)
        session = EnergySession(settings, backend=backend, is_main_process=True)
        assert session.suggest_batch_size() == batch_size  # claims the suggestion made above
        reached = bandit_epochs_to_target(batch_size)
        try:
            train(session, backend, clock, epochs=5, steps_per_epoch=6,
                  metric=lambda e, reached=reached: {"val/acc": 0.8 if e + 1 >= reached else 0.5})  # fmt: skip
        finally:
            backend.close()
        paths.append(log_dir / f"bandit-{index}.jsonl")
    return paths


SCENARIOS: dict[str, Callable[[Path], list[Path]]] = {
    "plain": plain,
    "phases": phases,
    "sample_fraction": sample_fraction,
    "power_limit": power_limit,
    "bandit": bandit,
}

