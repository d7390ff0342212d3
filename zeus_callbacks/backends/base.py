"""The GPU backend contract: one interface for NVIDIA, AMD and the virtual GPU.

Every backend converts vendor units (mW, mJ, µJ ticks) to SI units here, at the
boundary, and nowhere else: powers are watts, energies joules, times seconds.
Vendor exceptions are translated into the small hierarchy below and chained with
``raise ... from exc``.

Thread safety: a backend is called from two threads, the sampler thread (samples,
energy counter) and the training thread (power-limit get/set at step boundaries).
Implementations must make those calls safe to interleave.
"""

from __future__ import annotations

import abc
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

# The backends' error types live in errors.py; importing them from here keeps working.
from zeus_callbacks.errors import BackendError as BackendError
from zeus_callbacks.errors import BackendUnavailable as BackendUnavailable
from zeus_callbacks.errors import NotSupported as NotSupported
from zeus_callbacks.errors import PermissionDenied as PermissionDenied
from zeus_callbacks.errors import ReadOnlyError as ReadOnlyError
from zeus_callbacks.errors import SensorError as SensorError

READ_ONLY_ENV = "ZEUS_CALLBACKS_READ_ONLY"


def read_only_from_env() -> bool:
    """Return True when ``ZEUS_CALLBACKS_READ_ONLY`` asks for read-only mode.

    Any value other than empty, ``0``, ``false`` or ``no`` (case-insensitive) counts.
    """
    value = os.environ.get(READ_ONLY_ENV, "").strip().lower()
    return value not in ("", "0", "false", "no")


class Clock(Protocol):
    """A source of time in seconds, on the same time base as a backend's samples."""

    def now_s(self) -> float:
        """Return the current time in seconds."""
        ...


class WallClock:
    """The CPU realtime clock (seconds since the epoch).

    NVML's buffered power samples carry µs timestamps on this clock, so window
    boundaries must be taken on it too.
    """

    def now_s(self) -> float:
        """Return ``time.time()`` in seconds."""
        return time.time()


class ManualClock:
    """A virtual clock that only moves when told to; used by the simulator and tests.

    A background poller cannot run inside one :meth:`advance`: a thread on the wall clock sees
    virtual time only before and after the jump. What must happen at points of virtual time
    (the power sampler's drains, which keep a sensor's short buffer from overflowing) registers
    an alarm (:meth:`add_alarm`); :meth:`advance` stops at each alarm's due time on the way and
    calls it there. Alarms run on the thread that advances the clock.
    """

    def __init__(self, start_s: float = 0.0) -> None:
        self._now_s = float(start_s)
        self._alarms: list[tuple[Callable[[], float], Callable[[], object]]] = []
        self._alarms_lock = threading.Lock()

    def now_s(self) -> float:
        """Return the current virtual time in seconds."""
        return self._now_s

    def add_alarm(self, due_s: Callable[[], float], callback: Callable[[], object]) -> object:
        """Call ``callback`` whenever an :meth:`advance` passes ``due_s()`` (s, virtual time).

        ``due_s`` is asked again after each call (it must then lie later, or the alarm rests
        until the next :meth:`advance`). Returns a token for :meth:`remove_alarm`.
        """
        alarm = (due_s, callback)
        with self._alarms_lock:
            self._alarms.append(alarm)
        return alarm

    def remove_alarm(self, token: object) -> None:
        """Remove an alarm added by :meth:`add_alarm` (idempotent)."""
        with self._alarms_lock:
            self._alarms = [a for a in self._alarms if a is not token]

    def advance(self, dt_s: float) -> float:
        """Move time forward by ``dt_s`` seconds (must be ≥ 0) and return the new time.

        Time stops at every alarm due before the new time, and the alarm runs there.
        """
        if dt_s < 0:
            raise ValueError(f"cannot move a clock backwards (dt_s={dt_s})")
        target_s = self._now_s + dt_s
        with self._alarms_lock:
            alarms = list(self._alarms)
        resting: set[int] = set()
        while alarms:
            due = [(alarm[0](), i) for i, alarm in enumerate(alarms) if i not in resting]
            if not due:
                break
            at_s, i = min(due)
            if not at_s < target_s:
                break
            self._now_s = max(self._now_s, at_s)
            alarms[i][1]()
            if not alarms[i][0]() > self._now_s:
                resting.add(i)  # it did not move its due time on: no loop at one instant
        self._now_s = target_s
        return self._now_s


@dataclass(frozen=True)
class PowerSample:
    """One power reading of one GPU.

    Attributes:
        timestamp_s: When the sensor produced the value, on the backend's clock (s).
        power_W: The power the sensor reported (W). On NVIDIA this is roughly an
            average over the preceding 10–20 ms (docs/hardware.md#sample-semantics).
    """

    timestamp_s: float
    power_W: float


@dataclass(frozen=True)
class DeviceIdentity:
    """Which device stands behind one of the process's GPU indices (``cuda:0`` after ``CUDA_VISIBLE_DEVICES``).

    Attributes:
        index: The process's index (``cuda:<index>``; :class:`GPUBackend`'s device index).
        backend_index: The vendor library's own index of that device (NVML's, amdsmi's), which
            ``CUDA_VISIBLE_DEVICES`` / ``HIP_VISIBLE_DEVICES`` do not remap; None when the backend does not know it.
        uuid: The device's UUID (``GPU-…`` from ``nvmlDeviceGetUUID``, amdsmi's device UUID); on the virtual
            GPU a made-up id that starts with ``VIRTUAL-``; None when unknown (``note`` says why).
        name: The device's model name.
        virtual: True for the virtual GPU: no hardware stands behind ``uuid``.
        note: Why a field is null, or what a made-up one means; None when every field is the device's own.
    """

    index: int
    backend_index: int | None
    uuid: str | None
    name: str
    virtual: bool = False
    note: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """Return the JSON-serialisable fields (``run_start``'s ``devices`` entries)."""
        return asdict(self)


class GPUBackend(abc.ABC):
    """A set of GPUs this process may measure, and their power limits.

    Device indices are the process's own view (0..device_count()-1), i.e. after
    ``CUDA_VISIBLE_DEVICES`` / ``HIP_VISIBLE_DEVICES`` remapping.

    Attributes:
        name: Short backend name (``"nvml"``, ``"amdsmi"``, ``"virtual"``).
        clock: The clock whose time base sample timestamps use.
        read_only: When True, every setter raises :class:`ReadOnlyError`.
        sample_period_s: Nominal period of :meth:`power_samples_since` (s).
        sensor_delay_s: How long after a power change the first sample showing it
            arrives (s); 0.016 on an H200 (docs/hardware.md#sample-semantics). Window attribution shifts
            samples back by this much.
        sample_history_s: How far back :meth:`power_samples_since` still returns samples (s): a
            buffered stream drained less often than this loses the oldest (NVML ~2.4 s); None when
            not known or not bounded.
    """

    name: str = "abstract"
    sample_period_s: float = 0.02
    sensor_delay_s: float = 0.0
    sample_history_s: float | None = None
    times_with_gpu_events: bool = False
    """Whether window boundaries are timed with CUDA/HIP events (real GPUs running queued work)."""
    energy_counter_period_s: float | None = None
    """How often the energy counter changes (s), where known: readings are stamped at its change."""
    energy_counter_resolution_J: float | None = None
    """The energy counter's step (J), where known; stated where a figure comes from the counter."""
    simulated: bool = False
    """True for the virtual GPU: its energy is simulated from traces, not measured."""
    measurable: bool = True
    """False for a GPU that is present but cannot be measured (every energy figure is then null)."""

    def __init__(self, *, clock: Clock | None = None, read_only: bool | None = None) -> None:
        self.clock: Clock = clock if clock is not None else WallClock()
        self.read_only = read_only_from_env() if read_only is None else bool(read_only)

    @property
    def clock_is_manual(self) -> bool:
        """True when the clock moves only when told (a simulation): waiting for new samples is pointless."""
        return isinstance(self.clock, ManualClock)

    # -- identity ---------------------------------------------------------------
    @abc.abstractmethod
    def device_count(self) -> int:
        """Return how many GPUs this backend exposes to the process."""

    @abc.abstractmethod
    def device_name(self, index: int) -> str:
        """Return the model name of GPU ``index`` (e.g. ``"NVIDIA H200"``)."""

    def device_uuid(self, index: int) -> str | None:
        """Return GPU ``index``'s UUID (``GPU-…`` on NVIDIA), or None when it has none.

        The UUID names a physical GPU whatever ``CUDA_VISIBLE_DEVICES`` says; restore markers and
        the per-GPU profiling locks key on it. None (the default, and the virtual GPU's answer)
        means the device has no identity outside this process: markers then fall back to the index.
        """
        return None

    def device_identity(self, index: int) -> DeviceIdentity:
        """Return which device stands behind GPU ``index``: the vendor's index and UUID, where known.

        Makes no vendor call in the backends here (what discovery read is kept), so it is safe at
        ``train_start``. This default knows only :meth:`device_uuid`; backends that know more override it.

        Raises:
            IndexError: ``index`` is out of range.
        """
        uuid = self.device_uuid(index)
        return DeviceIdentity(
            index=index, backend_index=None, uuid=uuid, name=self.device_name(index),
            note=f"the {self.name} backend does not say which device index stands behind GPU {index}"
            + ("" if uuid is not None else " nor its UUID"),
        )  # fmt: skip

    # -- sensors (called from the sampler thread) --------------------------------
    @abc.abstractmethod
    def power_samples_since(self, index: int, since_s: float) -> list[PowerSample]:
        """Return buffered power samples of GPU ``index`` newer than ``since_s``.

        Args:
            index: Device index.
            since_s: Only samples with ``timestamp_s > since_s`` are returned.

        Returns:
            Samples in increasing timestamp order (possibly empty).

        Raises:
            SensorError: The read failed; ``kind`` names the fault.
        """

    @abc.abstractmethod
    def energy_counter_J(self, index: int) -> float:
        """Return the cumulative energy counter of GPU ``index`` (J).

        The counter's origin is arbitrary; only differences are meaningful. On
        NVIDIA one call costs 3–5 ms: call it from the sampler thread only.

        Raises:
            SensorError: The read failed.
            NotSupported: The device has no energy counter.
        """

    def readings_in_doubt(self, index: int, *, closing: bool) -> str | None:
        """Say whether power already returned for GPU ``index`` has turned out not to be known.

        Called by the sampler after each poll (``closing=False``) and when a window, epoch or
        run is closed (``closing=True``: no later reading will settle a pending doubt). Must
        make no vendor call (it may run on the training thread). Each doubt is reported once.

        Returns:
            A fault kind (e.g. ``"counter_stuck"``) to count, or None (the default: never).
        """
        return None

    # -- power limit (called from the training thread) -------------------------
    @abc.abstractmethod
    def power_limit_constraints_W(self, index: int) -> tuple[float, float]:
        """Return the ``(min, max)`` power limit GPU ``index`` accepts (W)."""

    @abc.abstractmethod
    def power_limit_W(self, index: int) -> float:
        """Return the power limit in force on GPU ``index`` (W)."""

    def set_power_limit_W(self, index: int, limit_W: float) -> None:
        """Set the power limit of GPU ``index`` to ``limit_W`` watts.

        Raises:
            ReadOnlyError: Read-only mode is on (``ZEUS_CALLBACKS_READ_ONLY=1``).
            PermissionDenied: The process may not change the limit.
            ValueError: ``limit_W`` is outside :meth:`power_limit_constraints_W`.
        """
        if self.read_only:
            raise ReadOnlyError(
                f"{self.name}: refusing to set the power limit of GPU {index} to {limit_W:.0f} W "
                f"because {READ_ONLY_ENV} is set"
            )
        low, high = self.power_limit_constraints_W(index)
        if not low <= limit_W <= high:
            raise ValueError(f"power limit {limit_W:.0f} W is outside GPU {index}'s range [{low:.0f}, {high:.0f}] W")
        self._set_power_limit_W(index, limit_W)

    @abc.abstractmethod
    def _set_power_limit_W(self, index: int, limit_W: float) -> None:
        """Apply a validated limit; read-only and range checks are already done."""

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release vendor handles. Safe to call more than once."""

    def describe(self) -> str:
        """Return a one-line human description of the devices."""
        count = self.device_count()
        names = sorted({self.device_name(i) for i in range(count)})
        return f"{self.name}: {count} GPU(s) ({', '.join(names)})"
