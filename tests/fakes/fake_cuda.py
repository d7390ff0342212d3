"""A fake ``torch.cuda`` whose one stream runs behind the host, as a GPU does (issue 27 item 3).

:class:`FakeCuda` stands in for the ``torch.cuda`` module that
:class:`~zeus_callbacks.measurement._windows.CudaEventTimer` takes (``cuda=``): ``Event``,
``synchronize``, ``current_stream``, ``is_available``. Time is a
:class:`~zeus_callbacks.backends.base.ManualClock`, the host's; the GPU has its own timeline on
the same clock:

* The host submits work (:meth:`FakeCuda.launch`, a kernel of a given GPU duration). The GPU runs
  it after everything submitted before it, and no sooner than ``launch_lag_s`` after the launch:
  ``start = max(now + launch_lag_s, gpu_free_s)``, ``end = start + duration``. The host goes on at
  once, so it runs ahead of the GPU, by at most ``queue_depth`` unfinished kernels: a launch into
  a full queue blocks the host (the clock advances) until the oldest one finishes.
* An event recorded by the host completes when the GPU reaches it: its GPU time is
  ``max(now + launch_lag_s, gpu_free_s)`` (an event takes no GPU time and no queue slot).
  ``query()`` is False before that; ``synchronize()`` moves the host's clock to it;
  ``elapsed_time`` raises ``RuntimeError`` (``cudaErrorNotReady``) unless both events are
  recorded and complete, and returns milliseconds, like ``torch.cuda.Event``. An event recorded
  again takes its new place (CUDA keeps only the last record).
* ``synchronize()`` (the device), :meth:`FakeCuda.item` (a ``.item()``, a logger reading a loss) move
  the host's clock to the GPU's: the host waits for every kernel submitted so far.
* Evaluation, optimizer steps and the anchor's event all run on the one stream
  (``current_stream()`` returns it every time).

Power: while the GPU runs a kernel, the true power is the busy power, else idle. Given a
:class:`~zeus_callbacks.backends.virtual.VirtualGPUBackend` on the same clock, each kernel sets its
utilization to 1 at its GPU start and back to 0 at its end (changes in the future are allowed), so
the backend's samples follow the GPU's activity, not the host's. :meth:`FakeCuda.true_energy_J` is the
truth on the GPU timeline: idle power over the interval plus the busy excess over the kernels in it.

Usage::

    clock = ManualClock(1000.0)
    backend = VirtualGPUBackend(clock=clock, noise_W=0.0, read_only=True)
    cuda = FakeCuda(clock, backend=backend, queue_depth=3, launch_lag_s=2e-5)
    session = EnergySession(cfg, backend=backend, timer_factory=lambda b: CudaEventTimer(b.clock, cuda=cuda))
    cuda.launch(0.004)        # a 4 ms kernel: the host goes on at once
    cuda.item()               # the host waits for the GPU
"""

from __future__ import annotations

import bisect
from collections import deque
from typing import Any

from zeus_callbacks.backends.base import ManualClock


class FakeStream:
    """The fake's one CUDA stream (``torch.cuda.Stream`` stand-in; only identity matters)."""

    def __init__(self, cuda: FakeCuda) -> None:
        self.cuda = cuda

    def synchronize(self) -> None:
        """Wait (advance the host's clock) until the stream's work is done."""
        self.cuda.synchronize()


class FakeEvent:
    """A ``torch.cuda.Event(enable_timing=True)`` on :class:`FakeCuda`'s timeline.

    Attributes:
        gpu_s: The GPU time the event completes at (s, the host's clock), None until recorded.
        records: How many times it was recorded.
    """

    def __init__(self, cuda: FakeCuda, enable_timing: bool = False) -> None:
        if not enable_timing:
            raise ValueError("the fake times events only with enable_timing=True")
        self._cuda = cuda
        self.gpu_s: float | None = None
        self.records = 0

    def record(self, stream: FakeStream | None = None) -> None:
        """Record on ``stream`` (default: the current one): completes when the GPU gets there."""
        if stream is not None and stream.cuda is not self._cuda:
            raise RuntimeError("event recorded on another device's stream")
        self.gpu_s = self._cuda.reach_s()
        self.records += 1
        self._cuda.events_recorded += 1

    def query(self) -> bool:
        """True once the GPU has reached the event (a never-recorded event counts as complete, as in CUDA)."""
        return self.gpu_s is None or self.gpu_s <= self._cuda.clock.now_s()

    def synchronize(self) -> None:
        """Block the host until the GPU reaches the event."""
        if self.gpu_s is not None:
            self._cuda.wait_until(self.gpu_s)

    def elapsed_time(self, end: FakeEvent) -> float:
        """GPU time from this event to ``end`` (ms).

        Raises:
            RuntimeError: Either event is not recorded, or not complete (``cudaErrorNotReady``).
        """
        if self.gpu_s is None or end.gpu_s is None:
            raise RuntimeError("CUDA error: device not ready (an event was never recorded)")
        if not (self.query() and end.query()):
            raise RuntimeError("CUDA error: device not ready")
        self._cuda.elapsed_calls += 1
        return (end.gpu_s - self.gpu_s) * 1e3


class FakeCuda:
    """A ``torch.cuda`` stand-in: one stream whose GPU timeline lags the host's (see the module docstring).

    Args:
        clock: The host's clock (the backend's); the fake advances it when the host waits.
        backend: A virtual GPU on ``clock`` whose utilization follows the kernels (None: no power).
        queue_depth: Unfinished kernels the host may have in flight before a launch blocks (≥ 1).
        launch_lag_s: Time from a launch to the earliest moment the GPU can start it (s, ≥ 0).

    Attributes:
        busy: The GPU's busy intervals ``(start_s, end_s)``, merged, in time order.
        events_recorded: Event records so far.
        host_waits_s: Host time spent blocked on a full queue or a synchronisation (s).
    """

    def __init__(
        self, clock: ManualClock, *, backend: Any = None, queue_depth: int = 2, launch_lag_s: float = 0.0
    ) -> None:
        if queue_depth < 1:
            raise ValueError(f"queue_depth must be ≥ 1, got {queue_depth}")
        if launch_lag_s < 0:
            raise ValueError(f"launch_lag_s must be ≥ 0, got {launch_lag_s}")
        self.clock = clock
        self.queue_depth = queue_depth
        self.launch_lag_s = launch_lag_s
        self.backend = backend
        self.gpu_free_s = clock.now_s()
        self._in_flight: deque[float] = deque()  # end times of kernels not finished at the last look
        self.busy: list[tuple[float, float]] = []
        self._busy_ends: list[float] = []
        self.events_recorded = 0
        self.elapsed_calls = 0
        self.host_waits_s = 0.0
        self.stream = FakeStream(self)
        self.idle_W = self.busy_W = 0.0
        if backend is not None:
            now = clock.now_s()
            backend.set_utilization(1.0, at_s=now)
            self.busy_W = backend.true_power_W(0, now)
            backend.set_utilization(0.0, at_s=now)
            self.idle_W = backend.true_power_W(0, now)

    # -- the torch.cuda surface -----------------------------------------------------
    def Event(self, enable_timing: bool = False) -> FakeEvent:  # noqa: N802  # torch.cuda.Event's name
        """A new event (``torch.cuda.Event``)."""
        return FakeEvent(self, enable_timing)

    def is_available(self) -> bool:
        """Always True: the fake is a GPU."""
        return True

    def current_stream(self) -> FakeStream:
        """The one stream."""
        return self.stream

    def synchronize(self) -> None:
        """Block the host until the GPU has run everything submitted (``torch.cuda.synchronize``)."""
        self.wait_until(self.gpu_free_s)

    # -- what the training loop does ----------------------------------------------
    def reach_s(self) -> float:
        """The GPU time at which work (or an event) submitted now would begin."""
        return max(self.clock.now_s() + self.launch_lag_s, self.gpu_free_s)

    def launch(self, duration_s: float) -> tuple[float, float]:
        """Submit a kernel of ``duration_s`` GPU seconds; blocks the host while the queue is full.

        Returns:
            The kernel's ``(start_s, end_s)`` on the GPU timeline.
        """
        if duration_s < 0:
            raise ValueError(f"a kernel cannot take negative time ({duration_s} s)")
        in_flight = self._in_flight
        now = self.clock.now_s()
        while in_flight and in_flight[0] <= now:
            in_flight.popleft()
        if len(in_flight) >= self.queue_depth:  # a full queue: wait for the oldest to finish
            self.wait_until(in_flight[len(in_flight) - self.queue_depth])
            now = self.clock.now_s()
            while in_flight and in_flight[0] <= now:
                in_flight.popleft()
        start = self.reach_s()
        end = start + duration_s
        self.gpu_free_s = end
        if duration_s > 0:
            in_flight.append(end)
            self._busy(start, end)
        return start, end

    def host(self, duration_s: float) -> None:
        """The host works ``duration_s`` seconds without touching the GPU (Python, a batch fetch)."""
        self.clock.advance(duration_s)

    def item(self) -> float:
        """A synchronising read (``loss.item()``, a logger reading a tensor): the host waits for the GPU."""
        self.synchronize()
        return 0.0

    def wait_until(self, t_s: float) -> None:
        """Block the host until ``t_s`` on the clock (no-op when it is past)."""
        dt = t_s - self.clock.now_s()
        if dt > 0:
            self.clock.advance(dt)
            self.host_waits_s += dt

    # -- the truth ------------------------------------------------------------------
    def _busy(self, start: float, end: float) -> None:
        if self.busy and self.busy[-1][1] >= start:  # back to back: one busy stretch
            self.busy[-1] = (self.busy[-1][0], end)
            self._busy_ends[-1] = end
            if self.backend is not None:  # at one time the later change wins: busy on from the old end
                self.backend.set_utilization(1.0, at_s=start)
                self.backend.set_utilization(0.0, at_s=end)
            return
        self.busy.append((start, end))
        self._busy_ends.append(end)
        if self.backend is not None:
            self.backend.set_utilization(1.0, at_s=start)
            self.backend.set_utilization(0.0, at_s=end)

    def busy_s(self, a: float, b: float) -> float:
        """Time the GPU was busy in ``[a, b]`` (s)."""
        if b <= a:
            return 0.0
        total = 0.0
        for start, end in self.busy[bisect.bisect_right(self._busy_ends, a) :]:
            if start >= b:
                break
            total += min(end, b) - max(start, a)
        return total

    def true_energy_J(self, a: float, b: float) -> float:
        """The energy truly drawn in ``[a, b]`` on the GPU timeline (J; needs ``backend``)."""
        if b <= a:
            return 0.0
        return self.idle_W * (b - a) + (self.busy_W - self.idle_W) * self.busy_s(a, b)
