"""Sensor characterisation: how often the power stream updates and how late it is.

Once per GPU model and driver (cached as JSON), read-only: idle, then a busy step, then
idle again. The update period is the *median* gap between changes of the reported value
(not the minimum: a stream can repeat values). The delay ``d`` is fitted: each sample
``(t_k, p_k)`` is modelled as the mean of a square wave (idle → busy → idle at the
measured CUDA-event times) over ``(t_{k-1} − d, t_k − d]`` — the model every attribution
in :mod:`~zeus_callbacks.measurement._attribution` and
:mod:`~zeus_callbacks.measurement.finegrain` uses — and ``d`` minimises the squared error
on a 0.5 ms grid. The rise and fall delays (first sample past half-way after each edge)
are reported as measured, for comparison with the H200 figures of docs/hardware.md#sample-semantics (16 ms, 23 ms).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zeus_callbacks.backends.base import GPUBackend, ManualClock

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SensorCharacterisation:
    """How one GPU's power stream behaves.

    Attributes:
        device: The backend's description of the GPU.
        update_period_s: Median gap between changes of the reported value (s).
        sample_period_s: Median gap between sample timestamps (s).
        delay_s: Fitted lag of the samples behind the power (s), for ``sensor_delay_s``.
        rise_s: First sample past half-way after the idle→busy edge, minus the edge (s).
        fall_s: The same after the busy→idle edge (s).
        idle_W: Median idle power (W).
        busy_W: Median busy power (W).
        fit_rmse_W: RMS error of the fitted model (W).
    """

    device: str
    update_period_s: float
    sample_period_s: float
    delay_s: float
    rise_s: float
    fall_s: float
    idle_W: float
    busy_W: float
    fit_rmse_W: float


def fit_sensor_delay(
    times_s: np.ndarray,
    power_W: np.ndarray,
    on_s: float,
    off_s: float,
    *,
    max_delay_s: float = 0.06,
    min_delay_s: float = -0.03,
    step_s: float = 5e-4,
) -> tuple[float, float, float, float]:
    """Fit the delay of a sample stream that saw one busy interval ``[on_s, off_s)``.

    Args:
        times_s: Sample timestamps, shape (n,), increasing (s).
        power_W: Sample values, shape (n,) (W).
        on_s: When the busy interval began (s, same clock).
        off_s: When it ended (s).
        max_delay_s: Largest delay tried (s).
        min_delay_s: Smallest delay tried (s); negative values allow for sample timestamps
            that lead the boundaries (a clock offset, or a timestamp at the start of the
            averaging window), as the H200 run suggested (docs/results/finegrain.md).
        step_s: Grid step (s).

    Returns:
        ``(delay_s, idle_W, busy_W, rmse_W)``.

    Raises:
        ValueError: Fewer than 5 samples.
    """
    t = np.asarray(times_s, dtype=np.float64)
    p = np.asarray(power_W, dtype=np.float64)
    if t.size < 5:
        raise ValueError("need at least 5 samples to fit the sensor delay")
    best = (np.inf, 0.0, 0.0, 0.0)
    for d in np.arange(min_delay_s, max_delay_s + step_s / 2, step_s):
        a, b = t[:-1] - d, t[1:] - d
        busy_frac = np.clip(np.minimum(b, off_s) - np.maximum(a, on_s), 0.0, None) / (b - a)
        X = np.column_stack([1.0 - busy_frac, busy_frac])  # idle and busy power
        coef, *_ = np.linalg.lstsq(X, p[1:], rcond=None)
        sse = float(np.sum((X @ coef - p[1:]) ** 2))
        if sse < best[0]:
            best = (sse, float(d), float(coef[0]), float(coef[1]))
    sse, d, idle_W, busy_W = best
    return d, idle_W, busy_W, float(np.sqrt(sse / (t.size - 1)))


def characterise_sensor(
    backend: GPUBackend,
    busy: Callable[[float], Any],
    *,
    gpu_index: int = 0,
    idle_s: float = 1.0,
    busy_s: float = 1.0,
    cache_dir: str | Path | None = None,
    refresh: bool = False,
) -> SensorCharacterisation:
    """Measure the update period and delay of GPU ``gpu_index``'s power stream (read-only).

    Args:
        backend: An open backend.
        busy: ``busy(seconds)`` keeps the GPU busy for that long and returns when the work
            is done (e.g. a loop of GEMMs followed by a device sync); on a virtual GPU it sets
            the utilization and advances its clock.
        gpu_index: Backend index of the GPU.
        idle_s: Idle time before and after the busy step (s).
        busy_s: Busy time (s).
        cache_dir: Read the result from / write it to ``<cache_dir>/<device>.json``.
        refresh: Measure even when a cached result exists.

    Returns:
        The :class:`SensorCharacterisation`.

    Raises:
        RuntimeError: Too few samples arrived (the buffer holds ~2.4 s on an H200: keep
            ``2 × idle_s + busy_s`` below that).
    """
    device = backend.describe()
    cache = None
    if cache_dir is not None:
        cache = Path(cache_dir) / (re.sub(r"[^A-Za-z0-9_.-]+", "_", device) + ".json")
        if cache.exists() and not refresh:
            return SensorCharacterisation(**json.loads(cache.read_text(encoding="utf-8")))
    clock = backend.clock

    def wait(seconds: float) -> None:
        if isinstance(clock, ManualClock):
            clock.advance(seconds)
        else:
            time.sleep(seconds)

    wait(idle_s)
    on_s = clock.now_s()
    busy(busy_s)
    off_s = clock.now_s()
    wait(idle_s)
    samples = backend.power_samples_since(gpu_index, on_s - idle_s)
    t = np.array([s.timestamp_s for s in samples])
    p = np.array([s.power_W for s in samples])
    if t.size < 10:
        raise RuntimeError(f"only {t.size} power samples arrived from GPU {gpu_index}; cannot characterise")
    changes = np.flatnonzero(np.diff(p) != 0) + 1
    update = float(np.median(np.diff(t[changes]))) if changes.size > 1 else float("nan")
    delay, idle_W, busy_W, rmse = fit_sensor_delay(t, p, on_s, off_s)
    half = (idle_W + busy_W) / 2
    rise = next((float(ts - on_s) for ts, v in zip(t, p, strict=True) if ts > on_s and v > half), float("nan"))
    fall = next((float(ts - off_s) for ts, v in zip(t, p, strict=True) if ts > off_s and v < half), float("nan"))
    result = SensorCharacterisation(
        device=device,
        update_period_s=update,
        sample_period_s=float(np.median(np.diff(t))),
        delay_s=delay,
        rise_s=rise,
        fall_s=fall,
        idle_W=idle_W,
        busy_W=busy_W,
        fit_rmse_W=rmse,
    )
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(asdict(result), indent=1), encoding="utf-8")
    return result
