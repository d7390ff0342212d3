"""The started run's parts, all there from ``train_start`` on: backend, sampler, meter, timer, event log.

:func:`open_run` claims the JSONL file first, so a taken name gets its suffix before anything else is
named. Nothing here is Optional that exists once a run has started.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from zeus_callbacks._distributed import launcher_env_int, launcher_world_size
from zeus_callbacks.backends import BackendError, GPUBackend
from zeus_callbacks.backends.rapl import NodeReader
from zeus_callbacks.config import ZeusConfig
from zeus_callbacks.measurement._attribution import (
    COUNTER_MIN_PERIODS,
    counter_energy,
    covered_energy_J,
    extended_integral_J,
)
from zeus_callbacks.measurement._sampler import PowerSampler
from zeus_callbacks.measurement._step_phases import PhaseTracker
from zeus_callbacks.measurement._windows import BoundaryTimer, ClockTimer, CudaEventTimer, WindowMeter
from zeus_callbacks.reporting import JsonlWriter
from zeus_callbacks.session import _log_records as records
from zeus_callbacks.session._node import open_node_reader

logger = logging.getLogger(__name__)

EPOCH_FLUSH_TIMEOUT_S = 0.25
"""Wall time an epoch end may wait for the sensor to catch up (s)."""
_TAIL_S = 1.0  # the run's total so far reads the knots of this last stretch only (s), past the reach


def default_gpu_indices(backend: GPUBackend) -> list[int]:
    """GPUs this process measures by default.

    Under a distributed launcher (``WORLD_SIZE`` > 1 and ``LOCAL_RANK`` set) each process
    measures its own GPU only, so nothing is counted twice; a single process measures
    every GPU it can see.
    """
    count = backend.device_count()
    local_rank = launcher_env_int("LOCAL_RANK", -1)  # -1: not set
    if local_rank >= 0 and launcher_world_size() > 1:
        return [local_rank % count]
    return list(range(count))


def select_gpu_indices(config: ZeusConfig, backend: GPUBackend, device_index: int | None) -> list[int]:
    """The GPUs to measure: ``config.gpu_indices``, else the framework's device, else :func:`default_gpu_indices`.

    Raises:
        ValueError: ``config.gpu_indices`` names a GPU the backend does not see.
    """
    if config.gpu_indices is not None:
        bad = [i for i in config.gpu_indices if i >= backend.device_count()]
        if bad:
            raise ValueError(
                f"gpu_indices {bad} do not exist: the {backend.name} backend sees {backend.device_count()} GPU(s)"
            )
        return list(config.gpu_indices)
    if device_index is not None:
        return [device_index % backend.device_count()]
    return default_gpu_indices(backend)


def make_timer(backend: GPUBackend) -> BoundaryTimer:
    """CUDA-event timing where the backend's GPUs run queued work (and CUDA is usable), else the CPU clock."""
    if backend.times_with_gpu_events:
        try:
            import torch

            if torch.cuda.is_available():
                return CudaEventTimer(backend.clock)
        except Exception as exc:  # no torch, or CUDA unusable: fall back to the clock
            logger.info("zeus-callbacks: CUDA events unavailable (%s); timing windows on the CPU clock", exc)
    return ClockTimer(backend.clock)


def measurement_of(backend: GPUBackend) -> tuple[str, str | None]:
    """``("measured" | "simulated" | "unavailable", note)``: what the backend's energy figures are.

    The note names the cause and the fix when measurement is unavailable (None otherwise).
    """
    if not backend.measurable:
        cause, fix = getattr(backend, "cause", "the GPU cannot be measured"), getattr(backend, "fix", None)
        return "unavailable", f"{cause}. Fix: {fix}" if fix else str(cause)
    return ("simulated" if backend.simulated else "measured"), None


class EventLog:
    """The run's JSONL log, or nothing (another process, or ``logging.jsonl`` off).

    A write that fails (a full disk) is logged once and ends logging: it must not stop training.
    Every record is written with ``simulated`` (:func:`~zeus_callbacks.session._log_records.stamped`),
    so no line of a simulated run's log can be read as a measurement.

    Args:
        writer: The open writer, or None for no log.
        simulated: Whether the run's figures are simulated (the virtual GPU).
    """

    def __init__(self, writer: JsonlWriter | None, *, simulated: bool = False) -> None:
        self._writer = writer
        self._simulated = simulated

    @property
    def path(self) -> Path | None:
        """The log's file, or None."""
        return self._writer.path if self._writer is not None else None

    def write(self, record: dict[str, Any]) -> None:
        """Append one record (a no-op without a log)."""
        if self._writer is not None:
            try:
                self._writer.write(records.stamped(record, simulated=self._simulated))
            except OSError as exc:  # a full disk must not stop training
                logger.warning("zeus-callbacks: cannot write the energy log (%s); logging stops", exc)
                self._writer = None

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._writer is not None:
            self._writer.close()


@dataclass(eq=False)
class StartedRun:
    """The parts of a run that has started.

    Attributes:
        backend: The open backend.
        gpu_indices: The GPUs measured (the backend's indices).
        run_name: The run's name (a taken JSONL name got a ``-N`` suffix).
        log: The JSONL event log.
        sensor_delay_s: How far samples lag the power they show (s).
        sampler: The background power sampler.
        timer: The window boundary timer (CUDA events or the clock).
        meter: The window meter.
        phases: The per-phase energy tracker (``windows.phases``), else None.
        start_s: The run's start on the backend's clock (s); set by :meth:`start`.
        start_wall: The run's start, ``time.time()``; set by :meth:`start`.
        node: The CPU package / DRAM energy reader (``node.rapl``, ``node.virtual_cpu``), else None.
        node_note: Why a node figure was asked for but no reader runs (several processes; no RAPL beside a
            real GPU), else None.
    """

    backend: GPUBackend
    gpu_indices: list[int]
    run_name: str
    log: EventLog
    sensor_delay_s: float
    sampler: PowerSampler
    timer: BoundaryTimer
    meter: WindowMeter
    phases: PhaseTracker | None
    start_s: float = 0.0
    start_wall: float = 0.0
    node: NodeReader | None = None
    node_note: str | None = None
    _integral_at_start_J: dict[int, float] = field(default_factory=dict)  # per GPU, once the samples reach it

    def start(self) -> None:
        """Start sampling, take the CPU/DRAM counters' first reading and open the run window."""
        if self.node is not None:
            self.node.start()
        self.sampler.start()
        self.start_wall = time.time()
        self.start_s = self.backend.clock.now_s()
        self._integral_at_start_J.clear()
        self.meter.begin("run")

    def read_power_limit_W(self) -> float | None:
        """The mean power limit of the measured GPUs (W), or None if it cannot be read."""
        if not self.backend.measurable:
            return None  # the GPU cannot be measured: said once, when the backend was chosen
        try:
            limits = [self.backend.power_limit_W(i) for i in self.gpu_indices]
        except BackendError as exc:
            logger.warning("zeus-callbacks: cannot read the power limit (%s)", exc)
            return None
        return sum(limits) / len(limits)

    def flush_sensor(self, until_s: float, *, read_counter: bool = True) -> None:
        """Poll until samples cover ``until_s`` (bounded wait), and read the counter (once) if ``read_counter``.

        Waits about ``EPOCH_FLUSH_TIMEOUT_S`` (at most that plus the sampler's
        ``sensor_timeout_s``), and returns at once when the sensor is stuck
        (:meth:`PowerSampler.poll_bounded`): no vendor call runs on this thread.
        """
        try:
            self._poll_until(until_s, read_counter=read_counter)
        finally:
            self.sampler.close_check()  # the figures closed now get no later reading: doubts count

    def _poll_until(self, until_s: float, *, read_counter: bool) -> None:
        deadline = time.monotonic() + EPOCH_FLUSH_TIMEOUT_S
        delay = self.sensor_delay_s
        # read_counter: once; a counter read costs 3-5 ms on an H200
        while True:
            if not self.sampler.poll_bounded(read_counter=read_counter):
                return  # the sensor is stuck or slow: the sampler counted it, the run is degraded
            read_counter = False
            latest = self.sampler.latest_sample_s()
            if latest is not None and latest - delay >= until_s:
                return
            if time.monotonic() >= deadline or self.backend.clock.now_s() <= until_s and self.backend.clock_is_manual:
                return
            time.sleep(0.005)

    def energy_between_J(self, start_s: float, end_s: float, *, samples_until_s: float | None = None) -> float | None:
        """Energy (J) of the measured GPUs in [start_s, end_s], from the power samples' running integral.

        Args:
            start_s: Interval start (s, the backend clock).
            end_s: Interval end (s).
            samples_until_s: Use only the samples whose interval ends by this time (s; a power-limit
                switch after ``end_s``): a sample straddling it averages the next limit's power. The
                end past the last of them is extrapolated at its power by at most one sample period
                (:meth:`PowerSampler.reach_s` at the straddling sample's spacing: a stream faster than
                the polls always reaches, a gap does not); None: every sample.

        Returns:
            The energy (J); None until samples cover ``end_s``; NaN (never guessed) when the samples
            do not cover the whole window: those before ``samples_until_s`` end more than one sample
            period before ``end_s``, the oldest sample kept begins more than one sample period
            after ``start_s`` (a window longer than the sensor's history, polled only at its end), or
            samples inside it were lost before a drain (:meth:`PowerSampler.sample_gaps`).
        """
        latest = self.sampler.latest_sample_s()
        if (latest is None or latest - self.sensor_delay_s < end_s) and self.backend.clock_is_manual:
            self.sampler.poll_bounded(read_counter=False)
            latest = self.sampler.latest_sample_s()
        if latest is None or latest - self.sensor_delay_s < end_s:
            self.sampler.request_poll()
            return None
        total = 0.0
        for index in self.gpu_indices:
            if any(a < end_s and b > start_s for a, b in self.sampler.sample_gaps(index)):
                return math.nan  # the integral bridges lost samples with one sample's power: a guess
            knots, cumulative = self.sampler.cumulative_energy(index)
            if samples_until_s is None or len(knots) == 0 or knots[-1] <= samples_until_s:
                # Every sample: the window must still lie inside them. A step longer than the sensor's
                # history (2.4 s on an H200) before the first poll keeps only its last samples; read as
                # a whole it would be 0.25-0.77 of its energy, so it has none.
                reach_s, rounding_s = self.sampler.reach_s(index), 1e-9  # 1 ns: rounding, not a gap
            else:
                before = int(np.searchsorted(knots, samples_until_s, side="right"))  # knots of samples ended by then
                # The period judged by the straddling sample's own spacing: a regular stream's jitter can make
                # it longer than the newest samples' spacing (the step's end then lies inside it all the same).
                straddling_s = float(knots[before] - knots[before - 1]) if before >= 1 else None
                knots, cumulative = knots[:before], cumulative[:before]
                reach_s, rounding_s = self.sampler.reach_s(index, straddling_s), 0.0
            energy, covered_s = covered_energy_J(knots, cumulative, [start_s], [end_s], reach_s=reach_s)
            if not covered_s[0] >= end_s - start_s - rounding_s:
                return math.nan
            total += float(energy[0])
        return total

    def counter_energy(self, start_s: float, end_s: float) -> tuple[float | None, str | None]:
        """Energy (J) of the measured GPUs in [start_s, end_s] from their counters, for a cross-check.

        None, with the reason, when the span is shorter than
        :data:`~zeus_callbacks.measurement._attribution.COUNTER_MIN_PERIODS` counter update periods (its
        figure would mean nothing), a GPU has no energy counter, or a GPU lacks readings bracketing
        the span. An interval a counter reset left out (:meth:`PowerSampler.counter_gaps`) takes the
        power samples' energy, so the figure stays comparable; ``counter_resets`` in the records says
        it happened.

        Returns:
            ``(energy_J, None)`` or ``(None, why)``: the words go into the records' ``counter_energy_note``.
        """
        period_s = self.backend.energy_counter_period_s or 0.0
        min_span_s = COUNTER_MIN_PERIODS * period_s
        several = len(self.gpu_indices) > 1
        for index in self.gpu_indices:  # the first reason: no counter at all, whatever the span
            if not self.sampler.counter_supported(index):
                gpu = f"GPU {index}: " if several else ""
                return None, f"{gpu}no energy counter on the {self.backend.name} backend"
        if end_s - start_s < min_span_s:
            # "update period": how often the counter changes, not how often the sampler reads it
            # (sampling.energy_counter_period_s).
            return None, (f"shorter than {min_span_s:g} s on {self.backend.name} ({COUNTER_MIN_PERIODS} counter "
                          f"update periods of {period_s:g} s): over fewer the counter's figure can be off by "
                          f"more than 1/{COUNTER_MIN_PERIODS} of the energy")  # fmt: skip
        total = 0.0
        for index in self.gpu_indices:
            gpu = f"GPU {index}: " if several else ""
            times, readings = self.sampler.counter_readings(index)
            energy, why = counter_energy(times, readings, start_s, end_s, reach_s=period_s)
            if energy is None:
                return None, gpu + (why or "no counter figure")
            gaps = [(max(a, start_s), min(b, end_s)) for a, b in self.sampler.counter_gaps(index)]
            gaps = [(a, b) for a, b in gaps if b > a]
            if gaps:
                knots, cumulative = self.sampler.cumulative_energy(index)
                filled, _ = covered_energy_J(
                    knots, cumulative, [a for a, _ in gaps], [b for _, b in gaps], reach_s=self.sampler.reach_s(index)
                )
                if not np.isfinite(filled).all():
                    return None, f"{gpu}the power samples do not cover the interval a counter reset left out"
                energy += float(filled.sum())
            total += energy
        return total, None

    def energy_so_far_J(self, carried_J: float = 0.0) -> float:
        """Energy (J) of the measured GPUs since :meth:`start` (this process's), plus ``carried_J``: at least the run's.

        A GPU whose samples do not reach the start yet adds nothing: a lower bound, for the batch-size
        early-stop check, which must not stop a run on a cost it has not reached. A figure to report
        is :meth:`known_so_far_J` (unknown then, never 0 J). The running integral's value at the start
        is kept once the samples reach it, so each call reads only the newest knots (a call a log or
        report: its cost does not grow with the run).
        """
        return carried_J + self._since_start_J()[0]

    def known_so_far_J(self, carried_J: float = 0.0) -> float:
        """The run's energy (J) so far for the live totals: :meth:`measured_so_far_J` plus ``carried_J``.

        NaN (left out of ``totals()``, the progress bar and the loggers' points) while a GPU's samples
        do not reach the run's start (the sensor's first sample period) or the GPU cannot be measured:
        those GPUs' energy is unknown, not 0 J.
        """
        measured_J, _ = self.measured_so_far_J()
        return math.nan if measured_J is None else carried_J + measured_J

    def measured_so_far_J(self) -> tuple[float | None, str | None]:
        """This run's energy (J) since :meth:`start`, when the power samples cover it (for a checkpoint).

        As :meth:`energy_so_far_J` reads it, with one difference: a GPU whose samples do not reach the
        run's start yet (a checkpoint saved within the first sample period) makes the figure unknown
        rather than 0 J.

        Returns:
            ``(energy_J, None)``, or ``(None, why)`` when it is not measured.
        """
        if not self.backend.measurable:
            return None, measurement_of(self.backend)[1]
        energy_J, why = self._since_start_J()
        return (energy_J, None) if why is None else (None, why)

    def _since_start_J(self) -> tuple[float, str | None]:
        """``(energy_J, why)``: the covered GPUs' energy since the start, and why a GPU has none (None: all have).

        NaN (and no reason) when the backend cannot be measured.
        """
        if self.sampler.latest_sample_s() is None:
            self.sampler.poll_bounded(read_counter=False)  # early in the run: read once, off the step path
        now_s = self.backend.clock.now_s()
        if not self.backend.measurable:
            return math.nan, None
        total, why = 0.0, None
        for index in self.gpu_indices:
            reach_s = self.sampler.reach_s(index)
            at_start_J = self._integral_at_start_J.get(index)
            if at_start_J is None:
                knots, cumulative = self.sampler.cumulative_energy(index)
                if len(knots) < 2 or knots[-1] + reach_s < self.start_s:
                    gpu = f"GPU {index}: " if len(self.gpu_indices) > 1 else ""
                    why = why or (f"{gpu}no power sample covered the run's start yet, the {self.backend.name} "
                                  f"sensor samples every {self.backend.sample_period_s:g} s")  # fmt: skip
                    continue  # no samples reach the start yet: nothing is covered
                at_start_J = extended_integral_J(knots, cumulative, self.start_s, reach_s=reach_s)
                self._integral_at_start_J[index] = at_start_J
            # Samples lag the present: at most one sample period past them is extrapolated,
            # as in the run window that gives the final total.
            knots, cumulative = self.sampler.cumulative_energy(index, since_s=now_s - reach_s - _TAIL_S)
            if len(knots) < 2:
                knots, cumulative = self.sampler.cumulative_energy(index)
            total += extended_integral_J(knots, cumulative, now_s, reach_s=reach_s) - at_start_J
        return total, why

    def time_so_far_s(self, carried_s: float = 0.0) -> float:
        """Time (s) since :meth:`start`, plus ``carried_s``."""
        return carried_s + self.backend.clock.now_s() - self.start_s


def open_run(
    config: ZeusConfig,
    backend: GPUBackend,
    gpu_indices: Sequence[int],
    run_name: str,
    *,
    write_log: bool,
    make_timer: Callable[[GPUBackend], BoundaryTimer] = make_timer,
) -> StartedRun:
    """Build a run's parts, to be started with :meth:`StartedRun.start` (the JSONL file is created now).

    ``run_name`` is the wanted name (a taken one gets a suffix); ``make_timer`` builds the boundary
    timer (tests swap in a stand-in for CUDA).

    Raises:
        OSError: The JSONL log directory is not writable.
    """
    writer = JsonlWriter(config.logging.log_dir, run_name) if write_log else None
    if writer is not None:
        run_name = writer.run_name  # a taken name gets a -N suffix
    delay_s = config.windows.sensor_delay_s
    sensor_delay_s = backend.sensor_delay_s if delay_s is None else delay_s
    sampler = PowerSampler(
        backend,
        list(gpu_indices),
        poll_period_s=config.sampling.poll_period_s,
        energy_counter_period_s=config.sampling.energy_counter_period_s,
        buffer_s=config.sampling.buffer_s,
        sensor_delay_s=sensor_delay_s,
        sensor_timeout_s=config.sampling.sensor_timeout_s,
    )
    timer = make_timer(backend)
    meter = WindowMeter(sampler, timer)
    node, node_note = open_node_reader(config.node, backend)
    return StartedRun(
        node=node,
        node_note=node_note,
        backend=backend,
        gpu_indices=list(gpu_indices),
        run_name=run_name,
        log=EventLog(writer, simulated=backend.simulated),
        sensor_delay_s=sensor_delay_s,
        sampler=sampler,
        timer=timer,
        meter=meter,
        phases=PhaseTracker(sampler) if config.windows.phases else None,
    )
