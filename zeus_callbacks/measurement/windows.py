"""Named measurement windows whose boundaries cost nothing on the training thread.

A boundary is a mark: the clock's time, or a CUDA event when CUDA is in use (no
device sync). Energy is attributed later, off the hot path, from the power samples
the :class:`~zeus_callbacks.measurement.sampler.PowerSampler` collected.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from zeus_callbacks.backends.base import Clock
from zeus_callbacks.measurement.attribution import extrapolated_energy_J, samples_in
from zeus_callbacks.measurement.sampler import PowerSampler

logger = logging.getLogger(__name__)


class BoundaryTimer(Protocol):
    """Marks window boundaries now and tells their times later."""

    def anchor(self) -> None:
        """Re-align the timer with the backend clock (may sync the device once)."""
        ...

    def mark(self) -> Any:
        """Record a boundary now and return a token for it."""
        ...

    def time_of(self, token: Any, *, wait: bool = False) -> float | None:
        """Return the boundary's time on the backend clock (s), or None if not known yet."""
        ...


class ClockTimer:
    """Boundaries at the CPU time of the call, on the backend's clock."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def anchor(self) -> None:
        """Nothing to align: marks are taken on the backend clock itself."""

    def mark(self) -> float:
        """Return the clock's time (s)."""
        return self.clock.now_s()

    def time_of(self, token: float, *, wait: bool = False) -> float:
        """Return the token itself (s)."""
        return token


class CudaEventTimer:
    """Boundaries as CUDA events, placed on the backend clock through an anchor event.

    :meth:`anchor` synchronises the device once and records an event whose CPU time
    is known; a later event's time is the anchor's plus the GPU-measured elapsed time.
    Re-anchor at every epoch so clock drift cannot build up.
    """

    def __init__(self, clock: Clock) -> None:
        import torch  # only needed when CUDA is in use

        self._torch = torch
        self.clock = clock
        self._anchor: tuple[Any, float] | None = None
        self.anchor()

    def anchor(self) -> None:
        """Sync the device, record an anchor event and note the clock time."""
        torch = self._torch
        torch.cuda.synchronize()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        event.synchronize()
        self._anchor = (event, self.clock.now_s())

    def mark(self) -> tuple[Any, Any]:
        """Record a CUDA event on the current stream; no sync."""
        event = self._torch.cuda.Event(enable_timing=True)
        event.record()
        return (self._anchor, event)

    def time_of(self, token: tuple[Any, Any], *, wait: bool = False) -> float | None:
        """Return the event's time (s), or None while the GPU has not reached it (unless ``wait``)."""
        (anchor_event, anchor_s), event = token
        if not event.query():
            if not wait:
                return None
            event.synchronize()
        return anchor_s + anchor_event.elapsed_time(event) / 1e3  # elapsed_time is in ms


@dataclass(frozen=True)
class WindowRecord:
    """The measured energy of one execution of a named window.

    Attributes:
        name: Window name (``"step"``, ``"epoch"``, ``"eval"`` or a user name).
        start_s: Start on the backend clock (s).
        end_s: End on the backend clock (s).
        energy_J: Energy summed over the measured GPUs (J).
        gpu_energy_J: Energy per measured GPU, in ``gpu_indices`` order (J).
        num_power_samples: Power samples inside the window (fewest over the GPUs).
        complete: False when samples did not cover the whole window (the edge was
            extrapolated from the nearest sample).
        info: What the caller attached (e.g. ``num_samples``, ``num_tokens``).
    """

    name: str
    start_s: float
    end_s: float
    energy_J: float
    gpu_energy_J: tuple[float, ...]
    num_power_samples: int
    complete: bool
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def time_s(self) -> float:
        """Duration (s)."""
        return self.end_s - self.start_s


@dataclass
class _Pending:
    name: str
    start: Any
    end: Any
    info: dict[str, Any]


class WindowMeter:
    """Open and close named windows; attribute their energy from the sampler's running integral.

    Args:
        sampler: The power sampler of the GPUs to measure.
        timer: How boundaries are marked (clock or CUDA events).
        stale_after_s: A window whose end is this much older than now is attributed
            even if samples never covered it (a dead sensor must not make pending
            windows pile up); it is marked incomplete.

    Windows of different names may nest or overlap; a name is open at most once.
    """

    def __init__(
        self, sampler: PowerSampler, timer: BoundaryTimer, *, stale_after_s: float = 10.0
    ) -> None:
        self.sampler = sampler
        self.stale_after_s = stale_after_s
        self.timer = timer
        self._open: dict[str, tuple[Any, dict[str, Any]]] = {}
        self._pending: list[_Pending] = []
        self._warned_reopen: set[str] = set()

    def begin(self, name: str, **info: Any) -> None:
        """Open window ``name`` now (cheap: one clock read or one event record)."""
        if name in self._open and name not in self._warned_reopen:
            self._warned_reopen.add(name)
            logger.warning("zeus-callbacks: window %r opened again before it was closed; restarting it", name)
        self._open[name] = (self.timer.mark(), info)

    def end(self, name: str, **info: Any) -> bool:
        """Close window ``name`` now; returns False if it was not open."""
        opened = self._open.pop(name, None)
        if opened is None:
            return False
        start, start_info = opened
        self._pending.append(_Pending(name, start, self.timer.mark(), {**start_info, **info}))
        return True

    def discard(self, name: str) -> bool:
        """Drop window ``name`` without measuring it (e.g. a step cut short by an exception)."""
        return self._open.pop(name, None) is not None

    def is_open(self, name: str) -> bool:
        """True while window ``name`` is open."""
        return name in self._open

    @property
    def pending_count(self) -> int:
        """Closed windows whose energy is not attributed yet."""
        return len(self._pending)

    def resolve(self, *, final: bool = False) -> list[WindowRecord]:
        """Attribute energy to every closed window the samples now cover.

        Args:
            final: Attribute every closed window even if samples do not reach its
                end (the uncovered edge takes the nearest sample's power and the
                record is marked incomplete); waits for CUDA events.

        Returns:
            The newly attributed windows, in the order they were closed.
        """
        if not self._pending:
            return []
        timed: list[tuple[_Pending, float, float]] = []
        waiting: list[_Pending] = []
        for pending in self._pending:
            start_s = self.timer.time_of(pending.start, wait=final)
            end_s = self.timer.time_of(pending.end, wait=final)
            if start_s is None or end_s is None:
                waiting.append(pending)
            else:
                timed.append((pending, start_s, end_s))
        if not timed:
            self._pending = waiting
            return []
        starts = np.array([t[1] for t in timed])
        ends = np.array([t[2] for t in timed])
        per_gpu = []
        counts = []
        covered_end = np.inf
        ready = np.ones(len(timed), dtype=bool)
        complete = np.ones(len(timed), dtype=bool)
        for index in self.sampler.gpu_indices:
            energy, n, cov_end, is_complete = self._attribute(index, starts, ends)
            per_gpu.append(energy)
            counts.append(n)
            complete &= is_complete
            covered_end = min(covered_end, cov_end)
        if not final:
            now_s = self.sampler.backend.clock.now_s()
            ready = (ends <= covered_end) | (ends <= now_s - self.stale_after_s)
        records: list[WindowRecord] = []
        for k, (pending, start_s, end_s) in enumerate(timed):
            if not ready[k]:
                waiting.append(pending)
                continue
            gpu_J = tuple(float(e[k]) for e in per_gpu)
            records.append(
                WindowRecord(
                    name=pending.name,
                    start_s=start_s,
                    end_s=end_s,
                    energy_J=float(sum(gpu_J)),
                    gpu_energy_J=gpu_J,
                    num_power_samples=int(min(c[k] for c in counts)),
                    complete=bool(complete[k]),
                    info=pending.info,
                )
            )
        order = {id(p): i for i, p in enumerate(self._pending)}
        self._pending = sorted(waiting, key=lambda p: order[id(p)])
        return records

    def _attribute(
        self, index: int, starts: np.ndarray, ends: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, float, np.ndarray]:
        knots, cumulative = self.sampler.cumulative_energy(index)
        if len(knots) < 2:
            return np.zeros_like(starts), np.zeros(len(starts), dtype=int), -np.inf, np.zeros(len(starts), bool)
        energy = extrapolated_energy_J(knots, cumulative, starts, ends)
        cov_start, cov_end = knots[0], knots[-1]
        is_complete = (starts >= cov_start) & (ends <= cov_end)
        times, _ = self.sampler.samples(index)
        counts = samples_in(times, starts, ends, self.sampler.sensor_delay_s)
        return energy, counts, float(cov_end), is_complete
