"""Standalone fine-grain energy profiler for a callable (a kernel, a layer).

:func:`profile` runs a callable many times, marks each execution's boundaries (CUDA
events anchored to the sample clock when CUDA is in use, else the backend clock),
collects the power samples with a :class:`~zeus_callbacks.measurement._sampler.PowerSampler`
and combines them with the FinGraV maths of :mod:`~zeus_callbacks.measurement.finegrain`
into an energy per execution with a confidence interval and a power profile over the
execution's timeline (FinGraV, arXiv 2412.12426; its challenge C2, CPU–GPU time
synchronisation, is met by CUDA events anchored to the sample clock).

Example:
    >>> import torch
    >>> a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)  # doctest: +SKIP
    >>> result = profile(lambda: a @ a, mode="steady", target_ci=0.02)  # doctest: +SKIP
    >>> result.energy_J, result.energy_ci_J  # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import numpy as np

from zeus_callbacks.backends.base import GPUBackend, ManualClock
from zeus_callbacks.errors import NotAProfile
from zeus_callbacks.measurement._sampler import PowerSampler
from zeus_callbacks.measurement._windows import BoundaryTimer, ClockTimer, CudaEventTimer
from zeus_callbacks.measurement.finegrain import DROPPED, bin_executions, binning_warning, interval_reason, superpose

logger = logging.getLogger(__name__)

ProfileMode = Literal["steady", "isolated"]

ProgressCallback = Callable[[float, float | None], None]
"""Called after each measuring round with the seconds measured so far and the latest relative
CI half-width (None before the first check)."""


@dataclass
class ProfileResult:
    """What :func:`profile` measured.

    Attributes:
        name: Name of the profiled callable.
        mode: ``"steady"`` (back-to-back) or ``"isolated"`` (random idle gaps).
        device: One-line description of the backend and GPU.
        timer: ``"cuda-events"`` or ``"clock"``: how execution boundaries were taken.
        energy_J: Gross energy per execution (J); see :mod:`~zeus_callbacks.measurement.finegrain`.
        energy_ci_J: Its 95 % CI, bootstrap over executions (J); None with fewer executions than
            an interval needs (:func:`~zeus_callbacks.measurement.finegrain.min_executions_for_interval`,
            4 at 95 %), ``ci_reason`` then says why.
        dynamic_energy_J: ``energy_J − baseline_W × duration_s`` (J); None without a baseline.
        dynamic_energy_ci_J: Its CI (J); None without a baseline or without a CI.
        baseline_W: Idle power (W), or None when it could not be measured.
        baseline_source: Where ``baseline_W`` comes from.
        subtracted: What ``dynamic_energy_J`` subtracts, in words.
        duration_s: Mean execution time (s) (steady mode: including the launch gap).
        time_s: Profile bin centres from the start, shape (n_bins,) (s).
        u: Bin centres on the normalised timeline (0 start, 1 end), shape (n_bins,).
        power_W: Power profile, shape (n_bins,) (W).
        power_ci_W: Its CI band, shape (2, n_bins) (W); None without a CI.
        executions_used: Executions behind the estimate.
        executions_dropped: Executions dropped by execution-time binning.
        warmup_executions: Executions before measuring (fitted, not reported).
        measurement_time_s: Time spent measuring (s).
        samples_used: Power samples in the fit.
        sensor_delay_s: Sensor delay the samples were shifted by (s).
        target_ci: Relative CI half-width asked for.
        target_met: Whether the CI reached ``target_ci`` before ``max_time_s`` (False without a CI).
        ci_reason: Why there is no CI (too few executions), or None when there is one.
        simulated: The power samples come from the virtual GPU (simulated, not measured).
    """

    name: str
    mode: str
    device: str
    timer: str
    energy_J: float
    energy_ci_J: tuple[float, float] | None
    dynamic_energy_J: float | None
    dynamic_energy_ci_J: tuple[float, float] | None
    baseline_W: float | None
    baseline_source: str
    subtracted: str
    duration_s: float
    time_s: list[float]
    u: list[float]
    power_W: list[float]
    power_ci_W: list[list[float]] | None
    executions_used: int
    executions_dropped: int
    warmup_executions: int
    measurement_time_s: float
    samples_used: int
    sensor_delay_s: float
    target_ci: float
    target_met: bool
    ci_reason: str | None = None
    simulated: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rel_ci_halfwidth(self) -> float | None:
        """Half the CI width relative to ``energy_J``; None without a CI (``ci_reason``)."""
        if self.energy_ci_J is None:
            return None
        lo, hi = self.energy_ci_J
        return (hi - lo) / 2 / abs(self.energy_J) if self.energy_J else math.inf

    def as_dict(self) -> dict[str, Any]:
        """Return a JSON-serialisable dict."""
        return {**asdict(self), "rel_ci_halfwidth": self.rel_ci_halfwidth}

    def write_json(self, path: str | Path) -> Path:
        """Write :meth:`as_dict` to ``path`` (parents created); returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.as_dict(), indent=1), encoding="utf-8")
        return path

    @classmethod
    def read_json(cls, path: str | Path) -> ProfileResult:
        """Read a result back from the JSON that :meth:`write_json` (``profile-kernel --json``) wrote.

        Raises:
            FileNotFoundError: The file does not exist.
            NotAProfile: The file is unreadable, not JSON, JSON of another kind (fields
                missing), or holds fields of the wrong type or inconsistent lengths.
        """
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise
        except (OSError, UnicodeError) as exc:
            raise NotAProfile(f"{path} is not a power-profile JSON: {exc}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise NotAProfile(f"{path} is not JSON (line {exc.lineno}: {exc.msg})") from None
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "the data") -> ProfileResult:
        """Validate a dict of :meth:`as_dict` and build the result (``rel_ci_halfwidth`` is recomputed).

        Raises:
            NotAProfile: ``data`` is not such a dict; the message names ``source`` and the fields.
        """
        from pydantic import TypeAdapter, ValidationError

        what = "a fine-grain power profile (as written by `zeus-callbacks profile-kernel --json`)"
        if not isinstance(data, dict):
            raise NotAProfile(f"{source} is not {what}: it holds a JSON {type(data).__name__}, not an object")
        required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
        missing = [name for name in required if name not in data]
        if missing:
            shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
            raise NotAProfile(f"{source} is not {what}: missing {shown}")
        known = {f.name for f in fields(cls)}
        given = {k: v for k, v in data.items() if k in known}
        if "simulated" not in given:  # written before the field: the virtual GPU names itself in the device
            given["simulated"] = str(data.get("device", "")).startswith("virtual")
        try:
            result = TypeAdapter(cls).validate_python(given)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:4])
            raise NotAProfile(f"{source} is not {what}: {problems}") from None
        n = len(result.time_s)
        band = result.power_ci_W or []  # None: no CI, so no band to check
        bad_band = result.power_ci_W is not None and (len(band) != 2 or any(len(row) != n for row in band))
        if n == 0 or len(result.power_W) != n or bad_band:
            raise NotAProfile(
                f"{source} is not {what}: time_s, power_W and the two rows of power_ci_W must have one "
                f"equal, nonzero length (got {n}, {len(result.power_W)}, {[len(row) for row in band]})"
            )
        return result

    def plot(self, path: str | Path) -> Path:
        """Save the power profile over the execution timeline, with its CI band, as an image.

        Raises:
            ImportError: matplotlib is not installed (``pip install zeus-callbacks[plot]``).
        """
        from zeus_callbacks._plots import plot_power_profile

        return plot_power_profile(self, path)


def _make_timer(backend: GPUBackend, use_cuda: bool | None) -> tuple[BoundaryTimer, str, Callable[[], None]]:
    if use_cuda is None:
        use_cuda = False
        if backend.name in ("nvml", "amdsmi"):
            try:
                import torch

                use_cuda = torch.cuda.is_available()
            except ImportError:
                use_cuda = False
    if use_cuda:
        import torch

        return CudaEventTimer(backend.clock), "cuda-events", torch.cuda.synchronize
    return ClockTimer(backend.clock), "clock", lambda: None


def profile(
    fn: Callable[[], Any],
    *,
    mode: ProfileMode = "steady",
    target_ci: float = 0.02,
    backend: GPUBackend | None = None,
    gpu_index: int = 0,
    max_time_s: float = 10.0,
    min_time_s: float = 1.0,
    warmup_s: float = 0.2,
    idle_s: float = 0.5,
    gap_s: tuple[float, float] | None = None,
    chunk_s: float = 1.0,
    sensor_delay_s: float | None = None,
    use_cuda: bool | None = None,
    n_bins: int = 16,
    n_boot: int = 200,
    seed: int = 0,
    name: str | None = None,
    json_path: str | Path | None = None,
    plot_path: str | Path | None = None,
    progress: ProgressCallback | None = None,
) -> ProfileResult:
    """Measure the energy per execution and the power profile of ``fn``.

    Steady mode runs ``fn`` back to back in chunks of ``chunk_s`` (the CUDA event timer is
    re-anchored between chunks, so clock drift cannot build up: ~10 ppm, 10 µs a second).
    Executions in a chunk share boundary marks; the pause between chunks (a sync, a few ms,
    at near-full power) is fitted with its own power level and is part of no execution
    (:func:`~zeus_callbacks.measurement.finegrain.superpose`, ``launch_gap_s=0``); isolated mode runs one
    execution at a time, waits for it, then idles for a random gap drawn from ``gap_s``,
    so executions do not alias with the 20 ms sampler (docs/hardware.md#sample-semantics). Before
    measuring it idles ``idle_s`` (baseline power) and, in steady mode, runs ``warmup_s`` of
    executions that are fitted but not reported. It stops once the CI half-width is below
    ``target_ci`` of the estimate (after ``min_time_s``, and with at least the executions an interval
    needs: :func:`~zeus_callbacks.measurement.finegrain.min_executions_for_interval`, 4 at 95 %) or
    at ``max_time_s``. With fewer executions than that the result has no CI (its CI fields None,
    ``ci_reason`` saying why) and ``target_met`` is False.

    Args:
        fn: The callable; called with no arguments. On a GPU it may return before the
            work is done (boundaries are CUDA events on the current stream).
        mode: ``"steady"`` or ``"isolated"``.
        target_ci: Relative CI half-width to reach (0.02 = ±2 %).
        backend: An open backend (the caller closes it); default: ``get_backend("auto")``,
            closed here.
        gpu_index: Backend index of the GPU that runs ``fn``.
        max_time_s: Most measuring time (s).
        min_time_s: Least measuring time (s).
        warmup_s: Steady mode: executions run before measuring (s).
        idle_s: Idle time before measuring and after, for the baseline (s).
        gap_s: Isolated mode: ``(low, high)`` of the uniform random idle gap (s); default
            from the sensor: ``(0.16, 0.26)`` s for a 20 ms sensor.
        chunk_s: Steady mode: back-to-back time between re-anchors (s); the last chunk is
            cut to end at ``max_time_s``.
        sensor_delay_s: Sensor delay (s); default: the backend's.
        use_cuda: Mark boundaries with CUDA events; default: when the backend is a real
            GPU and CUDA is available.
        n_bins: Profile bins inside an execution.
        n_boot: Bootstrap replicates of the final estimate.
        seed: Seed of the gaps and the bootstrap.
        name: Name in the result; default: ``fn.__name__``.
        json_path: Write the result as JSON here.
        plot_path: Save the profile plot (PNG) here.
        progress: Called after each measuring round with the seconds measured so far and the
            latest relative CI half-width (None before the first check); for progress bars.

    Returns:
        The :class:`ProfileResult`.

    Raises:
        ValueError: Bad mode, times or target.
        RuntimeError: No power samples arrived (the sensor does not work).
    """
    if mode not in ("steady", "isolated"):
        raise ValueError(f"mode must be 'steady' or 'isolated', got {mode!r}")
    if not (0 < target_ci < 1) or max_time_s <= 0 or min_time_s > max_time_s:
        raise ValueError("need 0 < target_ci < 1 and 0 < min_time_s <= max_time_s")
    with ExitStack() as owned:
        if backend is None:
            from zeus_callbacks.backends import get_backend

            backend = get_backend("auto", marked_in="the result's simulated field, its JSON and its plot")
            owned.callback(backend.close)
        clock = backend.clock
        manual = isinstance(clock, ManualClock)
        period = backend.sample_period_s
        delay = backend.sensor_delay_s if sensor_delay_s is None else sensor_delay_s
        pre_s, post_s = _isolated_margins_s(period)
        if gap_s is None:
            gap_s = isolated_gap_s(period)
        rng = np.random.default_rng(seed)
        sampler = PowerSampler(backend, [gpu_index], poll_period_s=0.1, energy_counter_period_s=3600.0, buffer_s=600.0)
        timer, timer_name, sync = _make_timer(backend, use_cuda)

        def idle(seconds: float) -> None:
            if isinstance(clock, ManualClock):
                clock.advance(seconds)
                sampler.poll_once(read_counter=False)
            else:
                time.sleep(seconds)

        marks: list[tuple[Any, Any, int, bool]] = []  # (start token, end token, run id, measured)

        def call() -> None:
            before = clock.now_s()
            fn()
            if manual and clock.now_s() <= before:
                raise ValueError("on a ManualClock the profiled callable must advance the clock")

        def call_until(t_end: float, run_id: int, measured: bool) -> None:
            """Call back to back until ``t_end``, marking each execution (steady mode)."""
            prev = timer.mark()
            while clock.now_s() < t_end:
                call()
                token = timer.mark()
                marks.append((prev, token, run_id, measured))
                prev = token

        sampler.start() if not manual else sampler.poll_once(read_counter=False)
        # The sensor hands back its buffered history (~2.4 s on an H200): samples of whatever ran
        # before this call must not count as this profile's idle time.
        begin_s = clock.now_s()
        try:
            sync()
            idle(idle_s)
            run_id = 0
            if mode == "steady" and warmup_s > 0:
                call_until(clock.now_s() + warmup_s, run_id, measured=False)
            measure_start = clock.now_s()
            last_check = measure_start
            result = None
            rel_ci: float | None = None
            while True:
                if mode == "steady":
                    left_s = max(max_time_s - (clock.now_s() - measure_start), 0.0)
                    call_until(clock.now_s() + min(chunk_s, left_s), run_id, measured=True)
                    sync()
                    timer.anchor()
                else:
                    start = timer.mark()
                    call()
                    end = timer.mark()
                    sync()
                    marks.append((start, end, run_id, True))
                    run_id += 1
                    idle(float(rng.uniform(*gap_s)))
                if manual:
                    sampler.poll_once(read_counter=False)
                elapsed = clock.now_s() - measure_start
                if progress is not None:
                    progress(elapsed, rel_ci)
                if elapsed >= max_time_s:
                    break
                if elapsed >= min_time_s and clock.now_s() - last_check >= max(0.5, 0.2 * elapsed):
                    last_check = clock.now_s()
                    result = _analyse(
                        sampler, timer, marks, gpu_index, mode, delay, pre_s, post_s, n_bins, 40, seed, begin_s
                    )
                    rel_ci = None if result is None else _rel_ci(result[0])
                    if rel_ci is not None and rel_ci <= target_ci:
                        if progress is not None:
                            progress(elapsed, rel_ci)
                        break
            measurement_time_s = clock.now_s() - measure_start
            idle(max(idle_s, post_s + delay + 2 * period))
            if not manual:
                deadline = time.monotonic() + 2.0
                while time.monotonic() < deadline:
                    sampler.poll_once(read_counter=False)
                    latest = sampler.latest_sample_s()
                    if latest is not None and latest - delay >= clock.now_s() - idle_s / 2:
                        break
                    time.sleep(0.02)
        finally:
            sampler.stop() if not manual else sampler.poll_once(read_counter=False)
        result = _analyse(sampler, timer, marks, gpu_index, mode, delay, pre_s, post_s, n_bins, n_boot, seed, begin_s)
        if result is None:
            raise RuntimeError(f"no power samples arrived from GPU {gpu_index} ({backend.describe()})")
        sup, binning, warmup = result
        if binning.too_many_dropped:  # once per run, on the final analysis (not per progress round)
            binning_warning(binning, 0.2)
        est = sup["all"]
        ci_reason = interval_reason(est.executions, sup.confidence)
        has_ci = ci_reason is None
        out = ProfileResult(
            name=name or str(getattr(fn, "__name__", "fn")),
            mode=mode,
            device=backend.describe(),
            timer=timer_name,
            energy_J=est.energy_J,
            energy_ci_J=est.energy_ci_J if has_ci else None,
            dynamic_energy_J=est.dynamic_energy_J,
            dynamic_energy_ci_J=est.dynamic_energy_ci_J if has_ci else None,
            baseline_W=sup.baseline_W,
            baseline_source=sup.baseline_source,
            subtracted=sup.subtracted,
            duration_s=est.duration_s,
            time_s=est.time_s.tolist(),
            u=est.u.tolist(),
            power_W=est.power_W.tolist(),
            power_ci_W=est.power_ci_W.tolist() if has_ci else None,
            executions_used=est.executions,
            executions_dropped=binning.dropped,
            warmup_executions=warmup,
            measurement_time_s=measurement_time_s,
            samples_used=sup.samples_used,
            sensor_delay_s=delay,
            target_ci=target_ci,
            target_met=has_ci and est.rel_ci_halfwidth <= target_ci,
            ci_reason=ci_reason,
            simulated=bool(backend.simulated),
            extra={
                "duration_groups": [list(g) for g in binning.groups],
                "pause_power_W": sup.gap_power_W,
                "pause_time_s": sup.gap_time_s,
                "tail_power_W": sup.tail_power_W,
            },
        )
        if json_path is not None:
            out.write_json(json_path)
        if plot_path is not None:
            out.plot(plot_path)
        return out


def _rel_ci(sup: Any) -> float | None:
    """The relative CI half-width of a superposition's ``all`` class; None while too few executions make one."""
    est = sup["all"]
    return None if interval_reason(est.executions, sup.confidence) is not None else est.rel_ci_halfwidth


def _isolated_margins_s(sample_period_s: float) -> tuple[float, float]:
    """Time before and after an execution attributed to it (s): the sensor's rise and power tail."""
    return max(2 * sample_period_s, 0.04), max(5 * sample_period_s, 0.1)


def isolated_gap_s(sample_period_s: float) -> tuple[float, float]:
    """Isolated mode's default ``(low, high)`` random idle gap for a sensor's sample period (s).

    At least the execution's margins before and after plus one sample period, so every
    execution's timeline has idle samples around it: ``(0.16, 0.26)`` s for a 20 ms sensor.
    """
    pre_s, post_s = _isolated_margins_s(sample_period_s)
    return (pre_s + post_s + sample_period_s, pre_s + post_s + 6 * sample_period_s)


def _analyse(sampler, timer, marks, gpu_index, mode, delay, pre_s, post_s, n_bins, n_boot, seed, begin_s):
    """Resolve boundary times, bin executions by duration and superpose; None without data.

    Only samples reporting power after ``begin_s`` (the profile's start) are used.
    """
    times, power = sampler.samples(gpu_index)
    own = times - delay >= begin_s  # the first of them only bounds the next one's interval
    times, power = times[own], power[own]
    if len(times) < 3 or not marks:
        return None
    starts_a = np.array([timer.time_of(start, wait=True) for start, _, _, _ in marks])
    ends_a = np.array([timer.time_of(end, wait=True) for _, end, _, _ in marks])
    measured_a = np.array([measured for _, _, _, measured in marks])
    positive = ends_a > starts_a
    starts_a, ends_a, measured_a = starts_a[positive], ends_a[positive], measured_a[positive]
    if not measured_a.any():
        return None
    binning = bin_executions((ends_a - starts_a)[measured_a], max_drop_fraction=0.2, warn=False)
    keep = np.zeros(starts_a.size, bool)
    keep[np.flatnonzero(measured_a)[binning.keep]] = True
    labels = np.where(keep, "all", DROPPED)
    sup = superpose(
        starts_a, ends_a, times, power, mode=mode, sensor_delay_s=delay, labels=labels, n_bins=n_bins,
        pre_s=pre_s, post_s=post_s, n_boot=n_boot, seed=seed, launch_gap_s=0.0 if mode == "steady" else None,
    )  # fmt: skip
    if "all" not in sup.profiles:
        return None
    return sup, binning, int((~measured_a).sum())
