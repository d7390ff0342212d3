"""A virtual GPU driven by the public Zeus (NSDI '23) power-limit traces.

Everything runs and is tested on machines with no GPU: the callbacks train on the
CPU in real time (default :class:`WallClock`) while this backend reports the power a
traced GPU would draw, or the simulator drives it with a :class:`ManualClock`.

Model (per device ``d``, at time ``t``)::

    true_power_W(t) = idle_W + u(t) · (P_trace(limit(t)) − idle_W) + offset_W[d]

where ``P_trace`` is the trace's average power interpolated at the power limit in force
(:func:`~zeus_callbacks.backends.traces.average_power_W_at`), ``u(t)`` the utilization
(1 busy, 0 idle) set by :meth:`VirtualGPUBackend.set_utilization`, and ``idle_W`` the idle
power (:func:`resolve_idle_power_W`, capped at the curve's lowest power). Limit and utilization
changes are timestamped, so samples before a change keep the old power.

The trace is a bundled Zeus sweep (V100, A40) or any GPU's own sweep in the same format
(``trace=``, :func:`~zeus_callbacks.backends.traces.read_trace`).

Sensors imitate NVML (docs/hardware.md#h200-sensors):

- ``power_samples_since``: one sample every ``sample_period_s`` (±1 ms jitter), each the
  mean true power over the preceding sample interval plus Gaussian noise
  (``noise_W``); only the last :data:`HISTORY_SAMPLES` are kept (2.4 s at 20 ms, never less; ``sample_history_s``).
  Sample ``k`` of device ``d`` depends only
  on ``(seed, d, k)`` and the power history, never on how often the buffer is polled.
- ``energy_counter_J``: the exact integral of true power (no noise), taken at the last
  100 ms boundary and floored to 1 mJ, like the H200 counter.
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel

from zeus_callbacks.backends import traces
from zeus_callbacks.backends.base import Clock, DeviceIdentity, GPUBackend, PowerSample, SensorError

logger = logging.getLogger(__name__)

IDLE_POWER_W: dict[str, float] = {"V100": 40.0, "A40": 30.0}
"""Idle power (W) per bundled GPU: a modelling assumption, not in the Zeus traces.

Typical draw of an idle V100 (~40 W) and A40 (~30 W) with a process attached. A
backend caps it at the lowest average power of its curve so that idle never exceeds
busy (the V100 NCF sweeps average as little as 35 W); other GPUs: :func:`resolve_idle_power_W`.
"""
IDLE_FRACTION_OF_MAX_LIMIT = 0.15
"""Idle power of a GPU with no known idle power, as a fraction of its maximum limit.

A modelling assumption (an idle V100 draws ~40 W of its 250 W, an A40 ~30 W of 300 W, an
H200 ~121 W of 700 W: 10–17 %); give the real figure with ``idle_power_W`` or the trace's
``idle_power`` column.
"""


def resolve_idle_power_W(curve: traces.PowerCurve, gpu: str, configured_W: float | None = None) -> float:
    """The idle power (W) the virtual GPU uses for ``curve`` of ``gpu``.

    The first known of: ``configured_W``, the trace's ``idle_power`` of this sweep,
    :data:`IDLE_POWER_W` of a bundled GPU, :data:`IDLE_FRACTION_OF_MAX_LIMIT` × the maximum
    limit; capped at the curve's lowest average power so that idle never exceeds busy.

    Args:
        curve: The sweep.
        gpu: The GPU model's name.
        configured_W: An idle power given by the user (W), or None.

    Returns:
        The idle power (W).
    """
    known = (float(v) for v in (configured_W, curve.idle_power_W, IDLE_POWER_W.get(gpu)) if v is not None)
    return min(next(known, IDLE_FRACTION_OF_MAX_LIMIT * curve.max_limit_W), float(curve.average_power_W.min()))


HISTORY_S = 2.4
"""Seconds of power-sample history kept at the default 20 ms period, like NVML's buffer.

docs/hardware.md#h200-sensors."""
HISTORY_SAMPLES = 120
"""Power samples the sensor's buffer holds (NVML's ~2.4 s of 20 ms samples): a slower stream (the simulator's
coarse samples) reaches further back, so draining it costs no more polls; never less than ``HISTORY_S``."""
COUNTER_PERIOD_S = 0.1
"""Update period of the energy counter (s), as measured on the H200."""
COUNTER_RESOLUTION_J = 1e-3
"""Resolution of the energy counter (J): NVML counts millijoules."""
JITTER_S = 0.001
"""Half-width of the uniform jitter on sample timestamps (s); at most a quarter period."""
_BLOCK = 1024  # samples per pre-drawn block of noise and jitter
_PRUNE_AT = 512  # prune a device's power history once it holds this many changes
_PRUNE_MARGIN_S = 1.0  # history kept beyond sample_history_s when pruning (s)

SensorKind = Literal["any", "samples", "energy"]


@dataclass
class _Segment:
    """Power from ``start_s`` until the next segment: a state and the energy before it."""

    start_s: float
    limit_W: float | None  # the change this segment applies (None: keep previous)
    utilization: float | None
    power_limit_W: float = 0.0  # resulting state
    util: float = 0.0
    power_W: float = 0.0
    energy_before_J: float = 0.0  # integral of true power from the origin to start_s


class _Timeline:
    """Piecewise-constant true power of one device with timestamped changes."""

    def __init__(self, start_s: float, limit_W: float, util: float, power_fn) -> None:
        self._power_fn = power_fn
        first = _Segment(start_s, limit_W, util, limit_W, util, power_fn(limit_W, util))
        self._segments = [first]
        self._starts = [start_s]

    def change(self, at_s: float, *, limit_W: float | None = None, util: float | None = None) -> None:
        if not math.isfinite(at_s):
            raise ValueError(f"the time of a change must be finite, got {at_s}")
        if at_s < self._starts[0]:
            raise ValueError(
                f"cannot change the virtual GPU at t={at_s:.3f} s: history before {self._starts[0]:.3f} s is gone"
            )
        i = bisect.bisect_right(self._starts, at_s)
        self._segments.insert(i, _Segment(at_s, limit_W, util))
        self._starts.insert(i, at_s)
        for j in range(i, len(self._segments)):  # later segments inherit the new state
            prev, seg = self._segments[j - 1], self._segments[j]
            seg.power_limit_W = prev.power_limit_W if seg.limit_W is None else seg.limit_W
            seg.util = prev.util if seg.utilization is None else seg.utilization
            seg.power_W = self._power_fn(seg.power_limit_W, seg.util)
            seg.energy_before_J = prev.energy_before_J + prev.power_W * (seg.start_s - prev.start_s)

    def at(self, t_s: float) -> _Segment:
        return self._segments[max(bisect.bisect_right(self._starts, t_s) - 1, 0)]

    def energy_J(self, t_s: float) -> float:
        seg = self.at(t_s)
        return seg.energy_before_J + seg.power_W * (t_s - seg.start_s)

    def prune(self, before_s: float) -> None:
        if len(self._segments) < _PRUNE_AT:
            return
        keep_from = max(bisect.bisect_right(self._starts, before_s) - 1, 0)
        del self._segments[:keep_from], self._starts[:keep_from]


class VirtualGPUBackend(GPUBackend):
    """Virtual GPUs replaying a power-limit sweep: a bundled Zeus NSDI '23 one (V100, A40) or a user's.

    Thread-safe: every public method holds one re-entrant lock.

    Args:
        gpu: ``"V100"`` or ``"A40"`` (case-insensitive) for a bundled trace; with
            ``trace``, the GPU's name (default: the trace's).
        workload: Workload named by its dataset (``"cifar100"``, ``"imagenet"``,
            ``"librispeech"``, ``"movielens-1m"``, ``"sentiment140"``, ``"squad"``, or
            one of the user trace's); None: ``imagenet``, or the user trace's first.
        batch_size: Batch size; None picks the workload's default capped to the trace.
        num_devices: Number of identical virtual GPUs.
        clock: Time source; default :class:`WallClock` (real time).
        read_only: Refuse power-limit changes; None reads ``ZEUS_CALLBACKS_READ_ONLY``.
        noise_W: Standard deviation of the Gaussian noise on power samples (W).
        sample_period_s: Nominal period of power samples (s).
        seed: Seed of the sample noise and jitter (any int).
        utilization: Initial utilization of every device, in [0, 1].
        power_offset_W: Constant added to each device's true power (W): one value for
            all devices or one per device (models device-to-device spread).
        trace: A user's sweep: a :class:`~zeus_callbacks.backends.traces.GPUTrace` or the
            path of a CSV in the Zeus ``summary_power`` format (docs/backends.md).
        idle_power_W: Idle power (W); default from the trace (see :func:`resolve_idle_power_W`).
        process_rank: The global rank of the process these virtual GPUs belong to, when it is one of
            several (each process has its own): their made-up uuid carries it. None: one process.

    Raises:
        ValueError: Unknown GPU, workload or batch size (the message lists the valid
            choices), or an out-of-range argument.
        TraceFormatError: ``trace`` is a file that cannot be read or breaks the format.
    """

    name = "virtual"
    simulated = True
    energy_counter_period_s = COUNTER_PERIOD_S
    energy_counter_resolution_J = COUNTER_RESOLUTION_J

    def __init__(
        self,
        *,
        gpu: str | None = None,
        workload: traces.WorkloadLike | None = None,
        batch_size: int | None = None,
        num_devices: int = 1,
        clock: Clock | None = None,
        read_only: bool | None = None,
        noise_W: float = 3.0,
        sample_period_s: float = 0.02,
        seed: int = 0,
        utilization: float = 1.0,
        power_offset_W: float | Sequence[float] = 0.0,
        trace: traces.GPUTrace | str | Path | None = None,
        idle_power_W: float | None = None,
        process_rank: int | None = None,
    ) -> None:
        super().__init__(clock=clock, read_only=read_only)
        if process_rank is not None and process_rank < 0:
            raise ValueError(f"process_rank must be ≥ 0, got {process_rank}")
        self.process_rank = process_rank
        if trace is None:
            self.trace = traces.bundled_trace("A40" if gpu is None else gpu)
        elif isinstance(trace, traces.GPUTrace):
            self.trace = traces.with_gpu_name(trace, gpu)
        else:
            self.trace = traces.read_trace(trace, gpu=gpu)
        self.gpu = self.trace.gpu
        if workload is None:
            workload = "imagenet" if self.trace.bundled else traces.available_workloads(self.trace)[0]
        self.workload = traces.get_workload(workload, self.trace)
        self.batch_size = (
            traces.default_batch_size(self.trace, self.workload) if batch_size is None else int(batch_size)
        )
        self.curve = traces.power_curve(self.trace, self.workload, self.batch_size)
        if idle_power_W is not None and not (math.isfinite(idle_power_W) and idle_power_W >= 0):
            raise ValueError(f"idle_power_W must be a finite number ≥ 0, got {idle_power_W}")
        if num_devices < 1:
            raise ValueError(f"num_devices must be ≥ 1, got {num_devices}")
        if noise_W < 0:
            raise ValueError(f"noise_W must be ≥ 0, got {noise_W}")
        if not sample_period_s > 0:
            raise ValueError(f"sample_period_s must be > 0, got {sample_period_s}")
        _check_utilization(utilization)
        offsets = (
            [float(power_offset_W)] * num_devices
            if isinstance(power_offset_W, (int, float))
            else [float(x) for x in power_offset_W]
        )
        if len(offsets) != num_devices:
            raise ValueError(f"power_offset_W has {len(offsets)} values for {num_devices} devices")
        self.num_devices = int(num_devices)
        self.noise_W = float(noise_W)
        self.sample_period_s = float(sample_period_s)
        self.sample_history_s: float | None = max(HISTORY_S, HISTORY_SAMPLES * self.sample_period_s)
        self.seed = int(seed)
        self._jitter_s = min(JITTER_S, self.sample_period_s / 4)
        self.idle_power_W = resolve_idle_power_W(self.curve, self.gpu, idle_power_W)
        self.power_offset_W = tuple(offsets)
        self._lock = threading.RLock()
        self._start_s = self.clock.now_s()
        self._timelines = [
            _Timeline(self._start_s, self.curve.max_limit_W, float(utilization), self._power_fn(d))
            for d in range(num_devices)
        ]
        self._blocks: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        self._faults: list[list] = []  # [remaining, kind, index | None, sensor]
        logger.debug("virtual backend: %s", self.describe())

    @property
    def _history_s(self) -> float:
        return self.sample_history_s if self.sample_history_s is not None else HISTORY_S

    # -- identity -------------------------------------------------------------------
    def device_count(self) -> int:
        """Return the number of virtual GPUs."""
        return self.num_devices

    def device_name(self, index: int) -> str:
        """Return e.g. ``"Virtual A40 (zeus_nsdi23 imagenet/resnet50 bs 256)"`` (a user trace: its file name)."""
        self._check_index(index)
        w = self.workload
        return f"Virtual {self.gpu} ({self.trace.label} {w.dataset}/{w.network} bs {self.batch_size})"

    def device_identity(self, index: int) -> DeviceIdentity:
        """Return a made-up identity: ``backend_index`` = ``index``, ``uuid`` ``VIRTUAL-GPU-<index>`` (stable).

        With ``process_rank`` the uuid is ``VIRTUAL-GPU-RANK<rank>-<index>``: two processes' virtual GPUs
        of the same index are different devices. :meth:`device_uuid` stays None: no other process can
        share a virtual GPU, so no profiling lock or restore marker keys on this id.

        Raises:
            IndexError: ``index`` is out of range.
        """
        return DeviceIdentity(
            index=index, backend_index=index, uuid=self._made_up_uuid(index), name=self.device_name(index),
            virtual=True, note="a virtual GPU: the id is made up (the same in every run), no hardware stands behind it",
        )  # fmt: skip

    def _made_up_uuid(self, index: int) -> str:
        rank = "" if self.process_rank is None else f"RANK{self.process_rank}-"
        return f"VIRTUAL-GPU-{rank}{index}"

    # -- trace model ----------------------------------------------------------------
    def average_power_W(self, limit_W: float) -> float:
        """Trace average power (W) at ``limit_W``, busy, without offset (Zeus NSDI '23)."""
        return traces.average_power_W_at(self.curve, limit_W)

    def epoch_time_s(self, limit_W: float) -> float:
        """Trace time per epoch (s) at ``limit_W`` (Zeus NSDI '23)."""
        return traces.time_per_epoch_s_at(self.curve, limit_W)

    def epoch_energy_J(self, limit_W: float) -> float:
        """Trace energy per epoch (J) at ``limit_W``: time per epoch × average power."""
        return traces.epoch_energy_J_at(self.curve, limit_W)

    def step_time_factor(self, limit_W: float) -> float:
        """Slowdown at ``limit_W``: time per epoch there / at the maximum limit (≥ ~1)."""
        return self.epoch_time_s(limit_W) / self.epoch_time_s(self.curve.max_limit_W)

    def true_power_W(self, index: int, at_s: float | None = None) -> float:
        """Noise-free power (W) of GPU ``index`` at ``at_s`` (default: now)."""
        self._check_index(index)
        with self._lock:
            t_s = self.clock.now_s() if at_s is None else at_s
            return self._timelines[index].at(t_s).power_W

    def set_utilization(self, utilization: float, at_s: float | None = None, *, index: int | None = None) -> None:
        """Mark GPU ``index`` (None: all) busy (1), idle (0) or in between from ``at_s`` on.

        Args:
            utilization: Fraction of the traced busy power above idle, in [0, 1].
            at_s: When the change happens on the backend clock (default: now). It may
                lie in the future (a schedule) or in the past (power already reported
                after it is then rewritten), but not before the kept history (the
                backend's creation, or ``sample_history_s`` + 1 s ago once many changes have piled up).
            index: Device index, or None for every device.

        Raises:
            ValueError: ``utilization`` outside [0, 1] or ``at_s`` too old.
        """
        _check_utilization(utilization)
        indices = range(self.num_devices) if index is None else [self._check_index(index)]
        with self._lock:
            t_s = self.clock.now_s() if at_s is None else float(at_s)
            for d in indices:
                self._timelines[d].change(t_s, util=float(utilization))
                self._timelines[d].prune(self.clock.now_s() - self._history_s - _PRUNE_MARGIN_S)

    # -- faults ---------------------------------------------------------------------
    def inject_fault(
        self, reads: int = 1, kind: str = "unknown", *, index: int | None = None, sensor: SensorKind = "any"
    ) -> None:
        """Make the next ``reads`` sensor reads raise :class:`SensorError` (for tests).

        Args:
            reads: How many reads fail.
            kind: The ``SensorError.kind`` to raise (e.g. ``"gpu_lost"``).
            index: Only reads of this device; None: any device.
            sensor: ``"samples"`` (power_samples_since), ``"energy"`` (energy_counter_J)
                or ``"any"``.
        """
        with self._lock:
            self._faults.append([int(reads), kind, index, sensor])

    def clear_faults(self) -> None:
        """Drop every pending injected fault."""
        with self._lock:
            self._faults.clear()

    # -- sensors --------------------------------------------------------------------
    def power_samples_since(self, index: int, since_s: float) -> list[PowerSample]:
        """Return the buffered samples of GPU ``index`` newer than ``since_s``.

        Samples of the last ``sample_history_s`` only; see the module docstring for their model.

        Raises:
            SensorError: An injected fault.
        """
        self._check_index(index)
        with self._lock:
            self._maybe_fault(index, "samples")
            now_s = self.clock.now_s()
            timeline = self._timelines[index]
            lower_s = since_s if since_s > now_s - self._history_s else now_s - self._history_s  # NaN: all
            period = self.sample_period_s
            k = max(1, math.floor((lower_s - self._start_s - self._jitter_s) / period))
            samples = []
            prev_t = self._sample_time(index, k - 1)
            while True:
                t_s = self._sample_time(index, k)
                if t_s > now_s:
                    break
                if t_s > lower_s:
                    mean_W = (timeline.energy_J(t_s) - timeline.energy_J(prev_t)) / (t_s - prev_t)
                    samples.append(PowerSample(t_s, mean_W + self._noise(index, k)))
                prev_t, k = t_s, k + 1
            timeline.prune(now_s - self._history_s - _PRUNE_MARGIN_S)
            return samples

    def energy_counter_J(self, index: int) -> float:
        """Return the energy (J) GPU ``index`` used since the backend was created.

        The exact integral of true power at the last 100 ms boundary, floored to 1 mJ.

        Raises:
            SensorError: An injected fault.
        """
        self._check_index(index)
        with self._lock:
            self._maybe_fault(index, "energy")
            now_s = self.clock.now_s()
            ticks = max(math.floor((now_s - self._start_s) / COUNTER_PERIOD_S + 1e-9), 0)
            energy_J = self._timelines[index].energy_J(self._start_s + ticks * COUNTER_PERIOD_S)
            return math.floor(energy_J / COUNTER_RESOLUTION_J + 1e-6) * COUNTER_RESOLUTION_J

    # -- power limit ----------------------------------------------------------------
    def power_limit_constraints_W(self, index: int) -> tuple[float, float]:
        """Return the lowest and highest power limit in the trace (W)."""
        self._check_index(index)
        return self.curve.min_limit_W, self.curve.max_limit_W

    def power_limit_W(self, index: int) -> float:
        """Return the power limit in force on GPU ``index`` now (W)."""
        self._check_index(index)
        with self._lock:
            return self._timelines[index].at(self.clock.now_s()).power_limit_W

    def _set_power_limit_W(self, index: int, limit_W: float) -> None:
        self._check_index(index)
        with self._lock:
            now_s = self.clock.now_s()
            self._timelines[index].change(now_s, limit_W=float(limit_W))
            self._timelines[index].prune(now_s - self._history_s - _PRUNE_MARGIN_S)
        logger.debug("virtual GPU %d: power limit set to %.0f W", index, limit_W)

    # -- internals ------------------------------------------------------------------
    def _power_fn(self, index: int):
        def power_W(limit_W: float, util: float) -> float:
            busy_W = traces.average_power_W_at(self.curve, limit_W)
            idle_W = self.idle_power_W
            return max(idle_W + util * (busy_W - idle_W) + self.power_offset_W[index], 0.0)

        return power_W

    def _block(self, index: int, k: int) -> tuple[np.ndarray, np.ndarray, int]:
        block, offset = divmod(k, _BLOCK)
        key = (index, block)
        if key not in self._blocks:
            if len(self._blocks) > 4 * self.num_devices:
                self._blocks.clear()
            rng = np.random.default_rng((self.seed & 0xFFFF_FFFF_FFFF_FFFF, index, block))
            jitter = rng.uniform(-self._jitter_s, self._jitter_s, _BLOCK)
            noise = rng.normal(0.0, 1.0, _BLOCK)
            self._blocks[key] = (jitter, noise)
        return (*self._blocks[key], offset)

    def _sample_time(self, index: int, k: int) -> float:
        jitter, _, offset = self._block(index, k)
        return self._start_s + k * self.sample_period_s + float(jitter[offset])

    def _noise(self, index: int, k: int) -> float:
        _, noise, offset = self._block(index, k)
        return self.noise_W * float(noise[offset])

    def _maybe_fault(self, index: int, sensor: str) -> None:
        for fault in self._faults:
            _, kind, fault_index, fault_sensor = fault
            if fault_index in (None, index) and fault_sensor in ("any", sensor):
                fault[0] -= 1
                if fault[0] <= 0:
                    self._faults.remove(fault)
                raise SensorError(f"virtual GPU {index}: injected {sensor} fault ({kind})", kind=kind)

    def _check_index(self, index: int) -> int:
        if not 0 <= index < self.num_devices:
            raise IndexError(f"virtual GPU index {index} out of range [0, {self.num_devices - 1}]")
        return index


def _check_utilization(utilization: float) -> None:
    if not 0.0 <= utilization <= 1.0:
        raise ValueError(f"utilization must be in [0, 1], got {utilization}")


_FILES = ("trace", "train_trace")  # the settings that name files: read here, not passed on


def virtual_backend_kwargs(settings: BaseModel) -> dict[str, Any]:
    """Keyword arguments of :class:`VirtualGPUBackend` for the virtual GPU's settings, reading a user trace.

    The configuration is data: the trace file is read here, when the virtual GPU opens, not when the
    configuration is parsed. With ``trace``, a ``gpu``/``workload`` the user did not set is left to the
    trace (its name, its first workload).

    Args:
        settings: The ``virtual`` section (``VirtualGPUConfig``): every field but the files is a keyword.

    Returns:
        The keyword arguments (``trace`` a :class:`~zeus_callbacks.backends.traces.GPUTrace` when set).

    Raises:
        TraceFormatError: ``trace`` or ``train_trace`` cannot be read or breaks the format.
    """
    values = settings.model_dump()
    kwargs: dict[str, Any] = {name: value for name, value in values.items() if name not in _FILES}
    if values["trace"] is not None:
        for name in ("gpu", "workload"):
            if name not in settings.model_fields_set:
                kwargs[name] = None
        kwargs["trace"] = traces.read_trace(values["trace"], train_path=values["train_trace"], gpu=kwargs["gpu"])
    return kwargs
