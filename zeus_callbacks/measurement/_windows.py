"""Named measurement windows whose boundaries cost nothing on the training thread.

A boundary is a mark: the clock's time, or a CUDA event when CUDA is in use (no
device sync). Energy is attributed later, off the hot path, from the power samples
the :class:`~zeus_callbacks.measurement._sampler.PowerSampler` collected.
"""

from __future__ import annotations

import bisect
import logging
import math
from itertools import repeat
from operator import itemgetter
from typing import Any, NamedTuple, Protocol

import numpy as np

from zeus_callbacks.backends.base import Clock
from zeus_callbacks.measurement._attribution import covered_energy_J, excluding_gaps, samples_in
from zeus_callbacks.measurement._sampler import PowerSampler

logger = logging.getLogger(__name__)


class BoundaryTimer(Protocol):
    """Marks window boundaries now and tells their times later.

    A token is whatever :meth:`mark` returned. Once :meth:`read` has read a mark's time,
    :meth:`time_of` returns it until :meth:`forget_before` drops it.
    """

    def anchor(self) -> None:
        """Re-align the timer with the backend clock (may sync the device once)."""
        ...

    def mark(self) -> Any:
        """Record a boundary now and return a token for it (the training thread's hot path)."""
        ...

    def read(self, *, wait: bool = False) -> None:
        """Read the times of the marks recorded so far that the device has reached (all with ``wait``)."""
        ...

    def time_of(self, token: Any, *, wait: bool = False) -> float | None:
        """Return the boundary's time on the backend clock (s), or None if not known yet."""
        ...

    def forget_before(self, token: Any | None) -> None:
        """Drop the read times of marks older than ``token`` (every read one when None)."""
        ...


class ClockTimer:
    """Boundaries at the CPU time of the call, on the backend's clock; a token is that time (s)."""

    tokens_are_times = True  # WindowMeter skips time_of for these tokens

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.mark = clock.now_s  # type: ignore[method-assign]  # the hot path: one clock read, no wrapper call

    def anchor(self) -> None:
        """Nothing to align: marks are taken on the backend clock itself."""

    def mark(self) -> float:  # replaced per instance by the clock's own method
        """Return the clock's time (s)."""
        return self.clock.now_s()

    def read(self, *, wait: bool = False) -> None:
        """Nothing to read: a token is its time."""

    def time_of(self, token: float, *, wait: bool = False) -> float:
        """Return the token itself (s)."""
        return token

    def forget_before(self, token: Any | None) -> None:
        """Nothing is kept."""


class CudaEventTimer:
    """Boundaries as CUDA events, placed on the backend clock through an anchor event.

    :meth:`anchor` synchronises the device once and records an event whose CPU time
    is known; a later event's time is the anchor's plus the GPU-measured elapsed time.
    Re-anchor at every epoch so clock drift cannot build up.

    Hot path: :meth:`mark` takes a CUDA event from a pool (creating one only when the
    pool is empty), records it on the stream that was current at the last anchor and
    returns the mark's sequence number. :meth:`read` reads the times of every mark the
    GPU has reached in one batch (one ``query`` of the newest, then one ``elapsed_time``
    each) and puts those events back in the pool: an event is never recorded again
    before its time was read.

    Args:
        clock: The backend clock that times are placed on.
        cuda: The ``torch.cuda`` module, or a stand-in with the same ``Event``,
            ``synchronize`` and ``current_stream`` (tests, ``benchmarks/hook_cost.py``).
    """

    def __init__(self, clock: Clock, *, cuda: Any = None) -> None:
        if cuda is None:
            import torch  # only needed when CUDA is in use

            cuda = torch.cuda
        self._cuda = cuda
        self.clock = clock
        self._free: list[Any] = []  # events whose time was read: free to record again
        self._unread: list[Any] = []  # recorded events, oldest first; mark number _read_upto + i
        self._times: list[float] = []  # read times (s); mark number _times_from + i
        self._times_from = 0
        self._read_upto = 0  # marks before this number have their time read
        self._next = 0  # number of the next mark
        self.events_created = 0
        self._anchor_event: Any = None
        self._anchor_s = 0.0
        self._stream: Any = None
        self.anchor()

    def _new_event(self) -> Any:
        self.events_created += 1
        return self._cuda.Event(enable_timing=True)

    def anchor(self) -> None:
        """Sync the device, read every outstanding mark, record an anchor event and note the clock time."""
        cuda = self._cuda
        cuda.synchronize()
        if self._unread:
            self.read(wait=True)  # their times are relative to the old anchor
        event = self._new_event()  # a fresh one: anchors are rare (each epoch, every 30 s)
        self._stream = cuda.current_stream()
        event.record(self._stream)
        event.synchronize()
        self._anchor_event, self._anchor_s = event, self.clock.now_s()

    def mark(self) -> int:
        """Record a CUDA event on the anchored stream (no sync); return the mark's number."""
        free = self._free
        event = free.pop() if free else self._new_event()
        event.record(self._stream)
        self._unread.append(event)
        number = self._next
        self._next = number + 1
        return number

    def read(self, *, wait: bool = False) -> None:
        """Read the times of the marks the GPU has reached (every mark with ``wait``); recycle their events."""
        unread = self._unread
        if not unread:
            return
        newest = unread[-1]
        if wait:
            newest.synchronize()
            done = len(unread)
        elif newest.query():  # one stream: the newest done means every older one is
            done = len(unread)
        else:
            done = 0
            for event in unread:
                if not event.query():
                    break
                done += 1
            if done == 0:
                return
        events = unread[:done]
        del unread[:done]
        elapsed_ms = self._anchor_event.elapsed_time
        anchor_s = self._anchor_s
        self._times.extend([anchor_s + elapsed_ms(event) / 1e3 for event in events])  # elapsed_time is in ms
        self._read_upto += done
        self._free.extend(events)

    def time_of(self, token: int, *, wait: bool = False) -> float | None:
        """Return mark ``token``'s time (s), or None while the GPU has not reached it (unless ``wait``).

        Raises:
            LookupError: The mark's time was dropped by :meth:`forget_before`.
        """
        if token >= self._read_upto:
            self.read(wait=wait)
            if token >= self._read_upto:
                return None
        i = token - self._times_from
        if i < 0:
            raise LookupError(f"the time of mark {token} was forgotten")
        return self._times[i]

    def forget_before(self, token: int | None) -> None:
        """Drop the read times of marks numbered below ``token`` (every read one but the newest when None).

        The newest mark is always kept: a caller may still open a window at it (an evaluation's
        end mark is the next step's start, and its window opens after the evaluation's attribution).
        """
        newest = self._next - 1
        upto = min(self._read_upto, newest) if token is None else min(token, self._read_upto, newest)
        if upto > self._times_from:
            del self._times[: upto - self._times_from]
            self._times_from = upto

    def read_table(self) -> tuple[int, int, list[float]]:
        """The read times as a table, for a batch of look-ups without a call per mark.

        Returns:
            ``(first, read_upto, times)``: mark ``k`` with ``first <= k < read_upto`` has
            time ``times[k - first]`` (s); the list is the timer's own (do not modify).
        """
        return self._times_from, self._read_upto, self._times

    @property
    def pool_size(self) -> int:
        """Events waiting in the pool for reuse."""
        return len(self._free)


class WindowRecord(NamedTuple):
    """The measured energy of one execution of a named window (immutable).

    Attributes:
        name: Window name (``"step"``, ``"epoch"``, ``"eval"`` or a user name).
        start_s: Start on the backend clock (s).
        end_s: End on the backend clock (s).
        energy_J: Energy summed over the measured GPUs (J); NaN (reported as null) when no
            sample covers the window, the energy of the covered part when some do.
        gpu_energy_J: Energy per measured GPU, in ``gpu_indices`` order (J).
        num_power_samples: Power samples inside the window (fewest over the GPUs).
        complete: False when samples did not cover the whole window (an edge was
            extrapolated by at most one sample period, or not covered at all).
        info: What the caller attached (e.g. ``num_samples``, ``num_tokens``).
        covered_s: How much of the window the samples cover (s; the least over the GPUs);
            None where not computed.
    """

    name: str
    start_s: float
    end_s: float
    energy_J: float
    gpu_energy_J: tuple[float, ...]
    num_power_samples: int
    complete: bool
    info: dict[str, Any]
    covered_s: float | None = None

    @property
    def time_s(self) -> float:
        """Duration (s)."""
        return self.end_s - self.start_s


class WindowBatch(NamedTuple):
    """Windows attributed in one :meth:`WindowMeter.resolve`, as arrays in the order they closed.

    Steps and phases close thousands of times a minute; a report aggregates them from
    these arrays instead of building one :class:`WindowRecord` per window.

    Attributes:
        names: Window names, shape (m,) (object array of str).
        start_s: Starts on the backend clock, shape (m,) (s).
        end_s: Ends on the backend clock, shape (m,) (s).
        energy_J: Energy summed over the measured GPUs, shape (m,) (J).
        gpu_energy_J: Energy per measured GPU, shape (g, m), rows in ``gpu_indices`` order (J).
        num_power_samples: Power samples inside each window (fewest over the GPUs), shape (m,).
        complete: False where samples did not cover the whole window, shape (m,).
        start_info: What was attached at the window's begin (a dict or None), shape (m,) (object).
        end_info: What was attached at its end (a dict or None), shape (m,) (object).
        covered_s: Time the samples cover, shape (m,) (s; the least over the GPUs).
    """

    names: np.ndarray
    start_s: np.ndarray
    end_s: np.ndarray
    energy_J: np.ndarray
    gpu_energy_J: np.ndarray
    num_power_samples: np.ndarray
    complete: np.ndarray
    start_info: np.ndarray
    end_info: np.ndarray
    covered_s: np.ndarray

    @property
    def size(self) -> int:
        """Number of windows."""
        return len(self.names)

    @property
    def time_s(self) -> np.ndarray:
        """Durations, shape (m,) (s)."""
        return self.end_s - self.start_s

    def select(self, mask: np.ndarray) -> WindowBatch:
        """The windows where ``mask`` (shape (m,), bool) is True, in the same order."""
        return WindowBatch(
            self.names[mask], self.start_s[mask], self.end_s[mask], self.energy_J[mask],
            self.gpu_energy_J[:, mask], self.num_power_samples[mask], self.complete[mask],
            self.start_info[mask], self.end_info[mask], self.covered_s[mask],
        )  # fmt: skip

    def info(self, k: int) -> dict[str, Any]:
        """Window ``k``'s info: the begin's, updated by the end's (a new dict)."""
        start_info, end_info = self.start_info[k], self.end_info[k]
        if start_info is None:
            return dict(end_info) if end_info else {}
        return {**start_info, **end_info} if end_info else dict(start_info)

    def info_values(self, key: str) -> list[Any]:
        """``info(k).get(key)`` for every window, without building the merged dicts."""
        try:  # the session's steps: every end carries the key
            return list(map(itemgetter(key), self.end_info))
        except (KeyError, TypeError):
            pass
        out = []
        for start_info, end_info in zip(self.start_info, self.end_info, strict=True):
            if end_info and key in end_info:
                out.append(end_info[key])
            else:
                out.append(start_info.get(key) if start_info else None)
        return out

    def records(self) -> list[WindowRecord]:
        """One :class:`WindowRecord` per window, in the same order."""
        names = self.names.tolist()
        starts, ends = self.start_s.tolist(), self.end_s.tolist()
        energy = self.energy_J.tolist()
        per_gpu = self.gpu_energy_J.T.tolist()
        fewest, complete = self.num_power_samples.tolist(), self.complete.tolist()
        covered = self.covered_s.tolist()
        return [
            WindowRecord(names[k], starts[k], ends[k], energy[k], tuple(per_gpu[k]), int(fewest[k]), complete[k],
                         self.info(k), covered[k])
            for k in range(len(names))
        ]  # fmt: skip


class WindowMeter:
    """Open and close named windows; attribute their energy from the sampler's running integral.

    Args:
        sampler: The power sampler of the GPUs to measure.
        timer: How boundaries are marked (clock or CUDA events).
        stale_after_s: A window whose end is this much older than now is attributed
            even if samples never covered it (a dead sensor must not make pending
            windows pile up); it is marked incomplete.

    Windows of different names may nest or overlap; a name is open at most once. Where
    one window ends and the next begins at the same point (phases that tile a step),
    take one :meth:`mark` and pass it to :meth:`end_at` and :meth:`begin_at`: the two
    share the boundary exactly and the training thread records one event, not two.

    Closed windows wait as tuples of tokens; their times are read in one batch by
    :meth:`resolve` (at report intervals), never on the way in.
    """

    def __init__(self, sampler: PowerSampler, timer: BoundaryTimer, *, stale_after_s: float = 10.0) -> None:
        self.sampler = sampler
        self.stale_after_s = stale_after_s
        self.timer = timer
        self.mark = timer.mark  # one boundary now; a token for begin_at / end_at
        # name -> [token, info, time_s or None]
        self._open: dict[str, list[Any]] = {}
        # closed, times not read yet: (name, start token, start time or None, end token, start info, end info)
        self._closed: list[tuple[Any, ...]] = []
        # closed and timed, oldest end first: as closed, with start_s at [1] and end_s at [3]
        self._timed: list[tuple[Any, ...]] = []
        self._timed_ends: list[float] = []  # their end times (s), for a binary search of the ready ones
        self._tokens_are_times = getattr(timer, "tokens_are_times", False)
        self._warned_reopen: set[str] = set()

    def begin(self, name: str, **info: Any) -> None:
        """Open window ``name`` now (cheap: one clock read or one event record)."""
        self.begin_at(name, self.mark(), info or None)

    def begin_at(self, name: str, token: Any, info: dict[str, Any] | None = None) -> None:
        """Open window ``name`` at the boundary ``token`` (from :meth:`mark`)."""
        if name in self._open and name not in self._warned_reopen:
            self._warned_reopen.add(name)
            logger.warning("zeus-callbacks: window %r opened again before it was closed; restarting it", name)
        self._open[name] = [token, info, None]

    def end(self, name: str, **info: Any) -> bool:
        """Close window ``name`` now; returns False if it was not open."""
        if name not in self._open:
            return False
        return self.end_at(name, self.mark(), info or None)

    def end_at(self, name: str, token: Any, info: dict[str, Any] | None = None) -> bool:
        """Close window ``name`` at the boundary ``token``; returns False if it was not open."""
        opened = self._open.pop(name, None)
        if opened is None:
            return False
        self._closed.append((name, opened[0], opened[2], token, opened[1], info))
        return True

    def discard(self, name: str) -> bool:
        """Drop window ``name`` without measuring it (e.g. a step cut short by an exception)."""
        return self._open.pop(name, None) is not None

    def is_open(self, name: str) -> bool:
        """True while window ``name`` is open."""
        return name in self._open

    def open_start(self, name: str) -> tuple[float, dict[str, Any]] | None:
        """An open window's start (s on the backend clock) and its start info, once its mark was read.

        None: ``name`` is not open, or its start mark has no time yet (a CUDA event not read) or none at all.
        """
        opened = self._open.get(name)
        if opened is None:
            return None
        start_s = opened[0] if self._tokens_are_times else opened[2]
        if start_s is None or not math.isfinite(start_s):
            return None
        return float(start_s), dict(opened[1] or {})

    @property
    def pending_count(self) -> int:
        """Closed windows whose energy is not attributed yet."""
        return len(self._closed) + len(self._timed)

    def _read_times(self, *, wait: bool) -> None:
        """Turn closed windows' tokens into times (one batch read); let the timer forget the rest."""
        closed = self._closed
        if self._tokens_are_times:  # a token is its time: the closed tuples are timed already
            self._timed += closed
            self._timed_ends += map(_END, closed)
            closed.clear()
            return
        timer = self.timer
        timer.read(wait=wait)
        time_of = timer.time_of
        timed, timed_ends = self._timed, self._timed_ends
        table = getattr(timer, "read_table", None)
        if table is not None:  # CudaEventTimer: index its read times directly, all windows at once
            first, read_upto, times = table()
            # End marks never decrease in close order, and a start is marked before its end:
            # the windows whose end mark was read are a prefix, and their starts were read too.
            done = bisect.bisect_left(list(map(_END, closed)), read_upto)
            if done:
                names, start, given_start_s, end, start_info, end_info = zip(*closed[:done], strict=True)
                # A start mark whose time was forgotten has none (NaN: an impossible window, dropped
                # and flagged downstream), never another mark's (a negative index would give a later one).
                starts_s = [
                    c if c is not None else (times[t - first] if t >= first else math.nan)
                    for t, c in zip(start, given_start_s, strict=True)
                ]
                ends_s = [times[t - first] for t in end]
                timed += zip(names, starts_s, repeat(None), ends_s, start_info, end_info)
                timed_ends += ends_s
        else:
            done = 0
            for name, start, start_s, end, start_info, end_info in closed:
                end_s = time_of(end)
                if end_s is None:
                    break  # marks are read in order: later windows end later
                if start_s is None:
                    start_s = time_of(start)
                    if start_s is None:
                        break
                timed.append((name, start_s, None, end_s, start_info, end_info))
                timed_ends.append(end_s)
                done += 1
        if done:
            del closed[:done]
        oldest = None  # the oldest mark still needed (an open window's, a waiting window's start)
        for opened in self._open.values():
            if opened[2] is None:
                try:
                    opened[2] = time_of(opened[0])
                except LookupError:  # opened at a mark already forgotten: no start time (impossible window)
                    opened[2] = math.nan
                if opened[2] is None and (oldest is None or opened[0] < oldest):
                    oldest = opened[0]
        for _, start, start_s, *_ in closed:
            if start_s is None and (oldest is None or start < oldest):
                oldest = start
        timer.forget_before(oldest)

    def resolve(self, *, final: bool = False) -> list[WindowRecord]:
        """Attribute energy to every closed window the samples now cover.

        Args:
            final: Attribute every closed window even if samples do not reach its
                end (the uncovered edge takes the nearest sample's power and the
                record is marked incomplete); waits for CUDA events.

        Returns:
            The newly attributed windows, in the order they were closed.
        """
        batch = self.resolve_batch(final=final)
        return [] if batch is None else batch.records()

    def resolve_bulk(
        self, bulk: frozenset[str] | set[str], *, final: bool = False
    ) -> tuple[list[WindowRecord], WindowBatch | None]:
        """Like :meth:`resolve`, but the windows named in ``bulk`` come back as one batch of arrays.

        Args:
            bulk: Names to aggregate in bulk (steps, phases).
            final: As for :meth:`resolve`.

        Returns:
            ``(records, batch)``: a record per newly attributed window of another name, and
            the windows of the ``bulk`` names (None when there is none), each in close order.
        """
        batch = self.resolve_batch(final=final)
        if batch is None:
            return [], None
        names = batch.names
        in_bulk = np.fromiter(map(bulk.__contains__, names), dtype=bool, count=len(names))
        if in_bulk.all():
            return [], batch
        records = batch.select(~in_bulk).records()
        return records, (batch.select(in_bulk) if in_bulk.any() else None)

    def resolve_batch(self, *, final: bool = False) -> WindowBatch | None:
        """Attribute energy to every closed window the samples now cover, in one vectorised pass.

        Args:
            final: As for :meth:`resolve`.

        Returns:
            The newly attributed windows as arrays, in close order; None when there is none.
        """
        if not self._closed and not self._timed:
            return None
        self._read_times(wait=final)
        timed = self._timed
        if not timed:
            return None
        timed_ends = self._timed_ends
        if final:
            n = len(timed)
        else:
            # Windows wait in the order they ended: the ready ones (covered by samples, or
            # stale) are a prefix, found by binary search.
            ready_until = max(self._covered_end_s(), self.sampler.backend.clock.now_s() - self.stale_after_s)
            n = bisect.bisect_right(timed_ends, ready_until)
            if n == 0:
                return None
        ends = np.array(timed_ends[:n], dtype=np.float64)
        names, start_s, _, _, start_info, end_info = zip(*timed[:n], strict=True)
        del timed[:n]
        del timed_ends[:n]
        starts = np.array(start_s, dtype=np.float64)
        since_s = float(starts.min()) - abs(self.sampler.sensor_delay_s)
        per_gpu = []
        counts = []
        complete = np.ones(n, dtype=bool)
        covered_s = ends - starts
        for index in self.sampler.gpu_indices:
            energy, num, is_complete, covered = self._attribute(index, starts, ends, since_s)
            per_gpu.append(energy)
            counts.append(num)
            complete &= is_complete
            covered_s = np.minimum(covered_s, covered)
        energy_J: np.ndarray = per_gpu[0] if len(per_gpu) == 1 else sum(per_gpu)  # type: ignore[assignment]  # as Python sums a GPU tuple: 0 + e0 + e1 ...
        return WindowBatch(
            _objects(names), starts, ends, energy_J, np.vstack(per_gpu), np.min(counts, axis=0), complete,
            _objects(start_info), _objects(end_info), covered_s,
        )  # fmt: skip

    def span_energy_J(self, starts_s: np.ndarray, ends_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Energy of stretches that are no window (the steps between two measured step windows).

        Args:
            starts_s: Starts on the backend clock, shape (m,) (s).
            ends_s: Ends, shape (m,) (s).

        Returns:
            ``(energy_J, complete)``: energy summed over the measured GPUs, shape (m,) (J; NaN where no
            sample covers it), and whether the samples cover each stretch wholly, shape (m,).
        """
        since_s = float(starts_s.min()) - abs(self.sampler.sensor_delay_s)
        energy_J = np.zeros(len(starts_s))
        complete = np.ones(len(starts_s), dtype=bool)
        for index in self.sampler.gpu_indices:
            energy, _, is_complete, covered = self._attribute(index, starts_s, ends_s, since_s)
            energy_J = energy_J + energy
            complete &= is_complete & (covered >= ends_s - starts_s - 1e-9)
        return energy_J, complete

    def _covered_end_s(self) -> float:
        """The oldest of the GPUs' newest integral knots (-inf before two knots)."""
        covered = np.inf
        for index in self.sampler.gpu_indices:
            knots, _ = self.sampler.cumulative_energy(index, since_s=np.inf)
            covered = min(covered, float(knots[-1]) if len(knots) else -np.inf)
        return covered

    def _attribute(
        self, index: int, starts: np.ndarray, ends: np.ndarray, since_s: float
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Energy, sample count, completeness and covered time of each window on GPU ``index``.

        No power is extrapolated more than one sample period past the samples
        (:meth:`PowerSampler.reach_s`): a window past that is partial (its covered time
        says how much) or, with nothing covered, NaN. A stretch whose samples were lost
        (:meth:`PowerSampler.sample_gaps`) counts as not covered either.
        """
        knots, cumulative = self.sampler.cumulative_energy(index, since_s)
        if len(knots) < 2:
            nothing = np.zeros(len(starts))
            return np.full(len(starts), np.nan), np.zeros(len(starts), dtype=int), np.zeros(len(starts), bool), nothing
        energy, covered = covered_energy_J(knots, cumulative, starts, ends, reach_s=self.sampler.reach_s(index))
        # knots[0] is at or before since_s, or (since_s older than every knot) the first knot there is.
        is_complete = (starts >= knots[0]) & (ends <= knots[-1])
        first_s, last_s = float(starts.min()), float(ends.max())
        gaps = [gap for gap in self.sampler.sample_gaps(index) if gap[1] > first_s and gap[0] < last_s]
        if gaps:  # lost samples: the integral bridges them with a guess, which no window may count
            energy, covered, touched = excluding_gaps(knots, cumulative, starts, ends, energy, covered, gaps)
            is_complete &= ~touched
        times, _ = self.sampler.samples(index, since_s)
        counts = samples_in(times, starts, ends, self.sampler.sensor_delay_s)
        return energy, counts, is_complete, covered


_END = itemgetter(3)  # a closed window's end token (its end time once timed)


def _objects(values: tuple[Any, ...]) -> np.ndarray:
    """A 1-D object array of ``values`` (dicts stay whole)."""
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out
