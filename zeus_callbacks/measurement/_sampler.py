"""Background power sampling: one thread per process drains the backends' streams.

The training thread never calls a sensor. A daemon thread drains each GPU's buffered
power samples every ``poll_period_s`` and reads the (slow, 3–5 ms on an H200) energy
counter every ``energy_counter_period_s``, into bounded ring buffers. Sensor errors are
caught, counted and warned about once per kind; measurement then runs degraded and
training goes on.

Sensor time is bounded: the training thread never makes a vendor call itself, and waits at most
``sensor_timeout_s`` for one (:meth:`PowerSampler.poll_bounded`); a vendor call that returns but
took longer is counted as ``slow_sensor_call``.

Samples outside physical bounds are rejected and counted by reason in
:attr:`SamplerHealth.rejected`: a non-finite time or power, a negative power, a power
above :data:`MAX_POWER_FACTOR` × the device's maximum power limit, a timestamp more than
:func:`future_tolerance_s` ahead of the clock, a timestamp older than the last sample kept.

Energy-counter readings are stamped at the counter's change, not at the read: a reading
that shows the value of the previous one is no reading (the counter has not ticked), and
a new value is stamped at the middle of the span it can have changed in, ``(max(last read
that still showed the old value, read - counter update period), read]``. A stamp is then off by
at most half a counter update period. A counter that goes backwards (a reset) drops only the
interval between the last reading and the first after the reset; the readings after it
continue the series (``SamplerHealth.counter_resets``), so cross-checks go on.

When the power stream fails but the counter works, the counter's differences take the
stream's place (read at every poll, ``SamplerHealth.counter_fallback``): the energy of the
interval between two readings is exact to the counter's resolution, its placement within
the interval unknown.

As samples arrive the sampler also integrates them into a running energy total ``F(t)``
(see :mod:`~zeus_callbacks.measurement._attribution` for how a sample is read). ``F`` is
kept at every sample for the last ``buffer_s`` seconds and once every
``coarse_period_s`` for ``history_s`` seconds, so the energy of a window of any
length, an hour-long epoch included, is ``F(end) - F(start)`` even after its raw
samples have left the buffer.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from zeus_callbacks.backends.base import BackendError, GPUBackend, ManualClock, NotSupported, PowerSample, SensorError
from zeus_callbacks.measurement._attribution import cumulative_energy
from zeus_callbacks.measurement._ring import TimeSeriesRing

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

DEFAULT_SENSOR_TIMEOUT_S = 0.5
"""How long the training thread waits for a sensor read (s): five 100 ms poll periods, ~100 energy-counter
calls at the H200's 3.3-4.8 ms (docs/hardware.md)."""

MAX_POWER_FACTOR = 2.0
"""A sample above this many times the device's maximum power limit is rejected. The H200 overshoots its
700 W limit by up to 1.26x for 50-100 ms from idle (884 W seen, docs/hardware.md#sample-semantics); twice
the limit leaves room for that and for the few percent the sample stream reads above the counter."""

FALLBACK_MAX_POWER_W = 10_000.0
"""Upper bound of a plausible sample (W) when the device's power-limit range cannot be read: the largest
accelerators sold in 2026 are rated at ~1.2 kW, so 10 kW is far above any one device."""

MANUAL_DRAIN_PERIOD_S = 1.0
"""On a :class:`ManualClock`, the longest stretch of virtual time the running sampler leaves undrained (s),
for a backend whose ``sample_history_s`` is unknown; else half that history (1.2 s for NVML's 2.4 s).

Its thread runs on the wall clock and cannot drain inside one ``advance`` of virtual time, so a step
advanced past the sensor's buffer would lose its first samples; a clock alarm drains instead."""


def future_tolerance_s(sample_period_s: float) -> float:
    """How far ahead of the clock a sample's timestamp may be before it is rejected (s).

    Samples are stamped on the clock the sampler reads right after the call, so a real one is never ahead
    of it; two sample periods (at least 0.1 s) absorb rounding of µs stamps and a clock step.
    """
    return max(0.1, 2.0 * sample_period_s)


@dataclass
class SamplerHealth:
    """What went wrong while sampling.

    Attributes:
        faults: Count of failed reads per fault kind (e.g. ``"gpu_lost"``); ``sensor_timeout``
            counts waits of the training thread cut short, ``slow_sensor_call`` vendor calls
            slower than the sampler's ``sensor_timeout_s``.
        dropped_samples: Samples overwritten because the ring buffer was full.
        rejected: Samples rejected as physically impossible, by reason (:func:`_reject_reason`).
        counter_resets: Times an energy counter went backwards (each drops one interval of
            the counter series; not a fault: the power samples are unaffected).
        counter_fallback: GPUs whose energy came, for part of the run, from counter
            differences because their power stream failed.
        lost_sample_gaps: Stretches whose power samples left the sensor's buffer before a
            drain (:meth:`PowerSampler.sample_gaps`); windows over them have no energy.
    """

    faults: Counter = field(default_factory=Counter)
    dropped_samples: int = 0
    rejected: Counter = field(default_factory=Counter)
    counter_resets: int = 0
    counter_fallback: set[int] = field(default_factory=set)
    lost_sample_gaps: int = 0

    @property
    def degraded(self) -> bool:
        """True when at least one read failed, was cut short, or returned an impossible sample."""
        return bool(self.faults) or bool(self.rejected)


class PowerSampler:
    """Collect power samples and energy-counter readings of several GPUs.

    Args:
        backend: Where the readings come from.
        gpu_indices: The backend device indices to sample.
        poll_period_s: Seconds between drains of the power stream (≤ 1 s: an H200
            keeps only ~2.4 s of samples).
        energy_counter_period_s: Seconds between energy-counter reads.
        buffer_s: Seconds of raw samples (and fine ``F`` knots) kept per GPU.
        sensor_delay_s: Lag of a sample behind the power it reports (s).
        coarse_period_s: Spacing of the coarse ``F`` knots kept for long windows (s).
        history_s: How far back the coarse knots reach (s); 48 h by default, ~2.8 MB a GPU.
        sensor_timeout_s: The longest :meth:`poll_bounded` (and :meth:`start`, :meth:`stop`)
            waits for the sensor (s); a vendor call slower than this counts as slow.

    Thread safety: ``poll_once`` runs on the sampler thread (or the caller's, when not
    started); the training thread uses :meth:`poll_bounded`, which never waits longer
    than ``sensor_timeout_s``; the readers (:meth:`samples`, :meth:`counter_readings`)
    may be called from any thread and never wait on a vendor call.
    """

    def __init__(
        self,
        backend: GPUBackend,
        gpu_indices: list[int],
        *,
        poll_period_s: float = 0.1,
        energy_counter_period_s: float = 1.0,
        buffer_s: float = 900.0,
        sensor_delay_s: float = 0.0,
        coarse_period_s: float = 1.0,
        history_s: float = 48 * 3600.0,
        sensor_timeout_s: float = DEFAULT_SENSOR_TIMEOUT_S,
    ) -> None:
        if not gpu_indices:
            raise ValueError("PowerSampler needs at least one GPU index")
        if not sensor_timeout_s > 0:
            raise ValueError(f"sensor_timeout_s must be > 0, got {sensor_timeout_s}")
        self.sensor_timeout_s = float(sensor_timeout_s)
        self.backend = backend
        self.gpu_indices = list(gpu_indices)
        self.poll_period_s = poll_period_s
        self.energy_counter_period_s = energy_counter_period_s
        period = max(backend.sample_period_s, 1e-3)
        capacity = max(16, math.ceil(buffer_s / period))
        counter_capacity = max(16, math.ceil(buffer_s / energy_counter_period_s) + 2)
        self.sensor_delay_s = sensor_delay_s
        self.coarse_period_s = coarse_period_s
        self._power = {i: TimeSeriesRing(capacity) for i in self.gpu_indices}
        # Running energy integral F: fine knots (one per sample) and coarse knots.
        self._fine = {i: TimeSeriesRing(capacity + 1) for i in self.gpu_indices}
        self._coarse = {i: TimeSeriesRing(max(16, math.ceil(history_s / coarse_period_s))) for i in self.gpu_indices}
        self._energy_J = {i: 0.0 for i in self.gpu_indices}
        self._counter = {i: TimeSeriesRing(counter_capacity) for i in self.gpu_indices}
        self._counter_supported = {i: True for i in self.gpu_indices}
        self._counter_raw: dict[int, float | None] = {i: None for i in self.gpu_indices}  # last raw reading (J)
        self._counter_seen_s: dict[int, float | None] = {i: None for i in self.gpu_indices}  # it still showed then
        self._counter_offset_J = {i: 0.0 for i in self.gpu_indices}  # added to raw readings after resets
        self._counter_reset_pending = {i: False for i in self.gpu_indices}
        self._stream_failing = {i: False for i in self.gpu_indices}
        self._counter_gaps: dict[int, list[tuple[float, float]]] = {i: [] for i in self.gpu_indices}
        self._spacing_s = {i: backend.sample_period_s for i in self.gpu_indices}  # last gap between samples
        self._drained_s = {i: -math.inf for i in self.gpu_indices}  # clock time of the last drain
        # (start_s, end_s) in knot time whose samples were lost before a drain (bounded: old ones are long closed)
        self._sample_gaps: dict[int, deque[tuple[float, float]]] = {i: deque(maxlen=4096) for i in self.gpu_indices}
        self._alarm: object | None = None  # the ManualClock alarm that drains while the sampler runs
        self._last_counter_read_s = -math.inf
        self._lock = threading.Lock()
        self._poll_lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.health = SamplerHealth()
        self._warned: set[str] = set()
        self._max_power_W: dict[int, float] = {}
        # Bounded polls: requests to the sampler thread and the polls it completed.
        self._done = threading.Condition()
        self._requested = 0
        self._completed = 0
        self._force_counter = False
        self._helper: threading.Thread | None = None
        self._poll_began: float | None = None  # time.monotonic() when the poll in progress began

    # -- lifecycle ----------------------------------------------------------------
    def start(self, *, first_poll: bool = True) -> None:
        """Take first readings and start the background thread (idempotent).

        Args:
            first_poll: Drain and read the counter before the thread starts. False resumes
                after ``stop(final_drain=False)`` as if the thread had only slept: the device
                buffers its recent samples (~2.4 s on an H200), and the thread's next poll
                drains them.
        """
        if self._thread is not None:
            return
        if first_poll:
            self.poll_bounded(read_counter=True)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="zeus-power-sampler", daemon=True)
        self._thread.start()
        clock = self.backend.clock
        if isinstance(clock, ManualClock):  # the thread cannot drain inside a jump of virtual time
            # The alarm runs on the thread that advances the clock (the training thread in a simulation): a
            # vendor call stuck on the sampler thread holds the poll lock, so an unbounded wait for it would
            # hang training. The bounded read waits at most sensor_timeout_s and counts a fault when cut short.
            self._alarm = clock.add_alarm(self._manual_drain_due_s, self.poll_bounded)

    def stop(self, *, final_drain: bool = True) -> None:
        """Stop the thread, then drain once more so nothing recorded is lost (idempotent).

        Args:
            final_drain: Drain and read the counter after the thread stops. False pauses the
                thread only (a benchmark that must keep it off the CPU between its own blocks);
                ``start(first_poll=False)`` resumes it.
        """
        thread, self._thread = self._thread, None
        alarm, self._alarm = self._alarm, None
        clock = self.backend.clock
        if alarm is not None and isinstance(clock, ManualClock):
            clock.remove_alarm(alarm)
        if thread is not None:
            self._stop.set()
            self._wake.set()
            thread.join(timeout=self.sensor_timeout_s)
            if thread.is_alive():  # stuck in a vendor call: a daemon thread, abandoned
                self._warn_once(
                    "join", f"the power sampler thread did not stop within {self.sensor_timeout_s:g} s; abandoned"
                )
        if final_drain:
            self.poll_bounded(read_counter=True)

    @property
    def running(self) -> bool:
        """True while the background thread runs."""
        return self._thread is not None

    @property
    def thread_native_id(self) -> int | None:
        """The OS id of the background thread (None when stopped), for per-thread CPU accounting."""
        thread = self._thread
        return None if thread is None else thread.native_id

    def _manual_drain_due_s(self) -> float:
        """When the :class:`ManualClock` alarm drains next: half the sensor's history after the oldest last drain."""
        history_s = self.backend.sample_history_s
        period_s = MANUAL_DRAIN_PERIOD_S if history_s is None else history_s / 2
        return min(self._drained_s.values()) + period_s

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.poll_period_s)
            self._wake.clear()
            if self._stop.is_set():
                break
            with self._done:
                target, force = self._requested, self._force_counter
                self._force_counter = False
            self.poll_once(read_counter=True if force else None)
            with self._done:
                self._completed = max(self._completed, target)
                self._done.notify_all()

    def poll_bounded(self, *, read_counter: bool | None = None, timeout_s: float | None = None) -> bool:
        """Have the sensor read now, off the calling thread, waiting at most ``timeout_s``.

        The sampler thread does the reading when it runs, a short-lived daemon thread
        otherwise. A wait cut short counts a ``sensor_timeout`` fault (the run is then
        degraded); while that read is still stuck, later calls return False at once.

        Args:
            read_counter: True to read the energy counter too (when supported); False or
                None to read it only when due.
            timeout_s: The longest wait (s); default ``sensor_timeout_s``.

        Returns:
            True when the read finished in time.
        """
        timeout_s = self.sensor_timeout_s if timeout_s is None else timeout_s
        began = self._poll_began
        if began is not None and time.monotonic() - began > self.sensor_timeout_s:
            self._sensor_timeout("a sensor read is still stuck")
            return False
        thread = self._thread
        if thread is not None and thread.is_alive() and threading.current_thread() is not thread:
            with self._done:
                self._requested += 1
                target = self._requested
                self._force_counter = self._force_counter or bool(read_counter)
                self._wake.set()
                done = self._done.wait_for(lambda: self._completed >= target, timeout_s)
        elif threading.current_thread() is thread:
            self.poll_once(read_counter=read_counter)
            return True
        else:
            helper = self._helper
            if helper is None or not helper.is_alive():
                helper = threading.Thread(
                    target=self.poll_once, kwargs={"read_counter": read_counter}, name="zeus-power-read", daemon=True
                )
                self._helper = helper
                helper.start()
            helper.join(timeout_s)
            done = not helper.is_alive()
        if not done:
            self._sensor_timeout(f"a sensor read took longer than {timeout_s:g} s")
        return done

    def _sensor_timeout(self, why: str) -> None:
        self.health.faults["sensor_timeout"] += 1
        self._warn_once(
            "sensor_timeout",
            f"{why}; training goes on without waiting for it (sampling.sensor_timeout_s) and measurement is degraded",
        )

    # -- reading the backend --------------------------------------------------------
    def poll_once(self, *, read_counter: bool | None = None) -> None:
        """Drain new power samples of every GPU; read the energy counter when due.

        Never raises: failures are counted in :attr:`health` and warned about once
        per kind.
        """
        with self._poll_lock:
            self._poll_began = time.monotonic()
            try:
                now_s = self.backend.clock.now_s()
                if read_counter is None:
                    read_counter = now_s - self._last_counter_read_s >= self.energy_counter_period_s
                for index in self.gpu_indices:
                    self._drain_samples(index)
                    self._check_doubt(index, closing=False)
                    failing = self._stream_failing[index]
                    if (read_counter or failing) and self._counter_supported[index]:
                        if self._read_counter(index) and failing:
                            self._counter_to_knots(index)
                if read_counter:
                    self._last_counter_read_s = now_s
            finally:
                self._poll_began = None

    def close_check(self) -> None:
        """A window, epoch or run is being closed: count the doubts no later reading will settle.

        :meth:`GPUBackend.readings_in_doubt` makes no vendor call, so this is safe on the training thread.
        """
        for index in self.gpu_indices:
            self._check_doubt(index, closing=True)

    def _check_doubt(self, index: int, *, closing: bool) -> None:
        kind = self.backend.readings_in_doubt(index, closing=closing)
        if kind is not None:
            self.health.faults[kind] += 1
            self._warn_once(
                f"doubt_{kind}",
                f"power already reported for GPU {index} is not known ({kind}: the energy counter stopped within "
                "a poll interval); measurement is degraded",
            )

    def _timed_call(self, what: str, call: Callable[[], _T]) -> _T:
        """Make one vendor call; count it as slow when it took longer than ``sensor_timeout_s``."""
        began = time.monotonic()
        try:
            return call()
        finally:
            took_s = time.monotonic() - began
            if took_s > self.sensor_timeout_s:
                self.health.faults["slow_sensor_call"] += 1
                self._warn_once(
                    "slow_sensor_call",
                    f"reading the {what} took {took_s:.2f} s (more than sampling.sensor_timeout_s = "
                    f"{self.sensor_timeout_s:g} s); measurement is degraded",
                )

    def _drain_samples(self, index: int) -> None:
        ring = self._power[index]
        try:
            with self._lock:
                since_s = ring.last_time()
            since = -math.inf if since_s is None else since_s
            samples = self._timed_call(
                f"power samples of GPU {index}", lambda: self.backend.power_samples_since(index, since)
            )
            now_s = self.backend.clock.now_s()
        except Exception as exc:  # measurement must never crash training
            self._record_fault(exc, f"power samples of GPU {index}")
            self._stream_failing[index] = True
            return
        max_W = self._max_power_bound_W(index)
        future_s = now_s + future_tolerance_s(self.backend.sample_period_s)
        if samples:
            self._stream_failing[index] = False
        drained_s, self._drained_s[index] = self._drained_s[index], now_s
        with self._lock:
            last = ring.last_time()
            kept_s = last
            fresh = []
            for sample in samples:  # keep plausible, strictly newer samples, in order
                reason = _reject_reason(sample, max_W, future_s, last)
                if reason is not None:
                    if reason != "duplicate":
                        self._reject(index, reason, sample)
                    continue
                fresh.append(sample)
                last = sample.timestamp_s
            if fresh:
                self._note_lost(index, kept_s, fresh[0].timestamp_s, now_s - drained_s)
                self._integrate(index, fresh)
            self.health.dropped_samples = sum(r.dropped for r in self._power.values())

    def _note_lost(self, index: int, kept_s: float | None, first_s: float, undrained_s: float) -> None:
        """Record the stretch whose samples left the sensor's buffer before this drain (the lock is held).

        Lost when the drain came later than the buffer reaches back (``sample_history_s``) and the first
        new sample is more than 1.5 periods after the last one kept. The running integral still bridges the
        stretch with the first new sample's power (the run total keeps a figure); windows over it have none.
        """
        history_s = self.backend.sample_history_s
        period_s = self.backend.sample_period_s
        if kept_s is None or history_s is None or not undrained_s > history_s or not first_s - kept_s > 1.5 * period_s:
            return
        delay_s = self.sensor_delay_s
        self._sample_gaps[index].append((kept_s - delay_s, first_s - delay_s - period_s))
        self.health.lost_sample_gaps += 1
        self._warn_once(
            "lost_samples",
            f"GPU {index}'s power samples of {first_s - kept_s:.2f} s were lost (not drained within the sensor's "
            f"{history_s:g} s history); windows over that stretch have no energy",
        )

    def _integrate(self, index: int, samples: list[PowerSample]) -> None:
        """Extend the raw ring and the running integral F by new, strictly newer samples."""
        ring = self._power[index]
        times = np.array([sample.timestamp_s for sample in samples])
        power = np.array([sample.power_W for sample in samples])
        knots, energy = cumulative_energy(
            times,
            power,
            sample_period_s=self.backend.sample_period_s,
            sensor_delay_s=self.sensor_delay_s,
            previous_timestamp_s=ring.last_time(),
            start_J=self._energy_J[index],
        )
        for knot_s, energy_J in zip(knots.tolist(), energy.tolist(), strict=True):
            self._append_knot(index, knot_s, energy_J)
        previous = ring.last_time()
        spacing = times[-1] - (times[-2] if len(times) > 1 else previous if previous is not None else times[-1])
        if spacing > 0:
            self._spacing_s[index] = float(spacing)
        for t, p in zip(times, power, strict=True):
            ring.append(float(t), float(p))

    def _max_power_bound_W(self, index: int) -> float:
        """The largest plausible sample of GPU ``index`` (W); read once, on the polling thread."""
        bound = self._max_power_W.get(index)
        if bound is None:
            try:
                bound = MAX_POWER_FACTOR * float(self.backend.power_limit_constraints_W(index)[1])
                if not (math.isfinite(bound) and bound > 0):
                    bound = FALLBACK_MAX_POWER_W
            except Exception:  # no range: the generic bound
                bound = FALLBACK_MAX_POWER_W
            self._max_power_W[index] = bound
        return bound

    def _reject(self, index: int, reason: str, sample: PowerSample) -> None:
        self.health.rejected[reason] += 1
        self._warn_once(
            f"rejected_{reason}",
            f"rejected an impossible power sample of GPU {index} ({reason}: {sample.power_W!r} W at "
            f"{sample.timestamp_s!r} s); measurement is degraded",
        )

    def _append_knot(self, index: int, knot_s: float, energy_J: float) -> None:
        """Extend the running integral F by one knot (the lock is held)."""
        self._fine[index].append(knot_s, energy_J)
        coarse = self._coarse[index]
        last_coarse = coarse.last_time()
        if last_coarse is None or knot_s - last_coarse >= self.coarse_period_s:
            coarse.append(knot_s, energy_J)
        self._energy_J[index] = energy_J

    def _counter_to_knots(self, index: int) -> None:
        """The power stream failed: extend F from the energy counter's newest difference.

        F's newest knot is carried to the newest counter reading with the counter's energy
        between them (the counter interpolated at the knot). Without a reading at or before
        that knot nothing is added: the time stays uncovered rather than guessed.
        """
        with self._lock:
            times, values = self._counter[index].arrays()
            if len(times) < 2:
                return
            new_s, new_J = float(times[-1]), float(values[-1])
            fine = self._fine[index]
            last_s = fine.last_time()
            if last_s is None:  # no sample yet: start F at the previous reading
                self._append_knot(index, float(times[-2]), self._energy_J[index])
                last_s, at_J = float(times[-2]), float(values[-2])
            elif new_s <= last_s or times[0] > last_s:
                return
            else:
                at_J = float(np.interp(last_s, times, values))
            energy_J = self._energy_J[index] + max(new_J - at_J, 0.0)
            self._append_knot(index, new_s, energy_J)
            self._drained_s[index] = max(self._drained_s[index], new_s)  # covered up to here: nothing lost before
            # A stand-in sample, so that readers of the newest sample see the counter's progress;
            # shifted by the sensor delay like a real one, so a recovered stream continues F at new_s.
            self._power[index].append(new_s + self.sensor_delay_s, (new_J - at_J) / max(new_s - last_s, 1e-9))
            self._spacing_s[index] = new_s - last_s
            if index not in self.health.counter_fallback:
                self.health.counter_fallback.add(index)
                resolution = getattr(self.backend, "energy_counter_resolution_J", None)
                self._warn_once(
                    f"counter_fallback_{index}",
                    f"GPU {index}'s power stream failed; its energy now comes from the energy counter's differences "
                    f"(resolution {resolution if resolution is not None else 'unknown'} J)",
                )

    def _read_counter(self, index: int) -> bool:
        """Read GPU ``index``'s counter; True when it showed a new value (appended, stamped at its change)."""
        try:
            raw_J = self._timed_call(f"energy counter of GPU {index}", lambda: self.backend.energy_counter_J(index))
            now_s = self.backend.clock.now_s()
        except Exception as exc:
            if isinstance(exc, NotSupported):
                self._counter_supported[index] = False
                if self.backend.measurable:  # an unmeasurable GPU was warned about once, when it was chosen
                    self._warn_once("counter_unsupported", f"GPU {index} has no energy counter; cross-checks off")
                return False
            if isinstance(exc, SensorError) and exc.kind == "counter_backwards":
                # The backend saw the reset and counts from the new value: the next reading starts a new stretch.
                with self._lock:
                    self._counter_reset(index)
                return False
            self._record_fault(exc, f"energy counter of GPU {index}")
            return False
        period_s = getattr(self.backend, "energy_counter_period_s", None) or 0.0
        with self._lock:
            last_raw = self._counter_raw[index]
            if last_raw is not None and raw_J == last_raw and not self._counter_reset_pending[index]:
                self._counter_seen_s[index] = now_s  # no tick since: the change is later than now
                return False
            if last_raw is not None and raw_J < last_raw and not self._counter_reset_pending[index]:
                self._counter_reset(index)  # seen here (a backend that reported it already set the flag)
            seen_s = self._counter_seen_s[index]
            lower_s = now_s - period_s if seen_s is None else max(seen_s, now_s - period_s)
            stamp_s = (lower_s + now_s) / 2
            ring = self._counter[index]
            last_s = ring.last_time()
            if self._counter_reset_pending[index]:
                self._counter_reset_pending[index] = False
                last_J = ring.last_value()
                self._counter_offset_J[index] = (last_J if last_J is not None else 0.0) - raw_J
                if last_s is not None:
                    self._counter_gaps[index].append((last_s, max(stamp_s, last_s)))
            if last_s is not None and stamp_s <= last_s:
                stamp_s = last_s + 1e-9 * max(1.0, abs(last_s))  # stamps increase
            ring.append(stamp_s, raw_J + self._counter_offset_J[index])
            self._counter_raw[index] = raw_J
            self._counter_seen_s[index] = now_s
        return True

    def _counter_reset(self, index: int) -> None:
        """The counter went backwards: drop the interval up to the next reading (the lock is held)."""
        self.health.counter_resets += 1
        self._counter_reset_pending[index] = True
        self._warn_once(
            "counter_backwards",
            f"the energy counter of GPU {index} went backwards (a reset); the interval around it is left out of "
            "the counter cross-check, which goes on",
        )

    def _record_fault(self, exc: Exception, what: str) -> None:
        kind = exc.kind if isinstance(exc, SensorError) else type(exc).__name__
        self.health.faults[kind] += 1
        label = "sensor error" if isinstance(exc, BackendError) else "unexpected error"
        self._warn_once(kind, f"{label} reading the {what} ({kind}): {exc}; measurement is degraded")

    def _warn_once(self, kind: str, message: str) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            logger.warning("zeus-callbacks: %s (further faults of this kind are counted, not logged)", message)

    # -- readers ------------------------------------------------------------------------
    def samples(self, index: int, since_s: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Return (timestamps_s, power_W) of GPU ``index``, oldest first; shapes (n,), (n,).

        Args:
            index: The GPU.
            since_s: Only the samples from the newest one at or before this time on (s);
                default all.
        """
        with self._lock:
            return self._power[index].arrays(since_s)

    def cumulative_energy(self, index: int, since_s: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Return the knots ``(time_s, energy_J)`` of GPU ``index``'s running energy integral F.

        Coarse knots cover the time before the oldest fine knot. Between knots F is
        linear (the power is a step function). Shapes (n,), (n,); empty before any sample.

        Args:
            index: The GPU.
            since_s: Only the knots from the newest one at or before this time on (s), so
                that F is still exact from ``since_s``; default all.
        """
        with self._lock:
            fine_t, fine_F = self._fine[index].arrays(since_s)
            coarse_t, coarse_F = self._coarse[index].arrays(since_s)
        if len(fine_t) == 0:
            return fine_t, fine_F
        older = coarse_t < fine_t[0]
        return np.concatenate((coarse_t[older], fine_t)), np.concatenate((coarse_F[older], fine_F))

    def counter_readings(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Return (timestamps_s, energy_J) energy-counter readings of GPU ``index``; shapes (n,), (n,).

        Stamped at the counter's change (module docstring); continued across resets, each of
        which leaves one interval flat (:meth:`counter_gaps`).
        """
        with self._lock:
            return self._counter[index].arrays()

    def counter_supported(self, index: int) -> bool:
        """False once GPU ``index``'s energy counter answered "not supported" (no cross-check on it)."""
        return self._counter_supported[index]

    def sample_gaps(self, index: int) -> list[tuple[float, float]]:
        """The ``(start_s, end_s)`` stretches of GPU ``index`` whose power samples were lost before a drain.

        On the knots' time base (sample times less ``sensor_delay_s``); see :attr:`SamplerHealth.lost_sample_gaps`.
        """
        with self._lock:
            return list(self._sample_gaps[index])

    def counter_gaps(self, index: int) -> list[tuple[float, float]]:
        """The ``(start_s, end_s)`` intervals left out of GPU ``index``'s counter series by resets."""
        with self._lock:
            return list(self._counter_gaps[index])

    def reach_s(self, index: int, spacing_s: float | None = None) -> float:
        """How far past GPU ``index``'s integral knots power may be extrapolated (s).

        One sample period past the last sample's timestamp (its knot sits ``sensor_delay_s`` earlier).
        The period is the backend's nominal one, or the spacing of the newest samples (or
        ``spacing_s``, the spacing at an earlier point) when they come slower (a polled stream, a
        counter fallback), at most one poll period (a gap after a lost GPU is no period).
        """
        nominal = self.backend.sample_period_s
        spacing = self._spacing_s[index] if spacing_s is None else spacing_s
        period = max(nominal, min(spacing, max(self.poll_period_s, nominal)))
        return period + max(self.sensor_delay_s, 0.0)

    def latest_sample_s(self) -> float | None:
        """Return the oldest of the GPUs' newest sample times (None before any sample)."""
        with self._lock:
            times = [ring.last_time() for ring in self._power.values()]
        if any(t is None for t in times):
            return None
        return min(times)  # type: ignore[type-var]

    def request_poll(self) -> None:
        """Wake the sampler thread for an early drain (non-blocking)."""
        self._wake.set()


def _reject_reason(sample: PowerSample, max_W: float, future_s: float, last_s: float | None) -> str | None:
    """Why ``sample`` cannot be kept (a :attr:`SamplerHealth.rejected` reason, or ``"duplicate"``), or None."""
    t, p = sample.timestamp_s, sample.power_W
    if not (math.isfinite(t) and math.isfinite(p)):
        return "non_finite"
    if p < 0:
        return "negative"
    if p > max_W:
        return "above_max"
    if t > future_s:
        return "future_timestamp"
    if last_s is not None and t <= last_s:
        return "timestamp_backwards" if t < last_s else "duplicate"
    return None
