"""AMD GPUs through the ROCm SMI Python interface (``amdsmi``).

What is read:

* **Energy counter**: ``amdsmi_get_energy_count(h)`` returns a tick count and
  ``counter_resolution`` (µJ per tick); the driver refreshes it every ~1 ms. The tick
  key was renamed in ROCm 6.4 (``power`` → ``energy_accumulator``); both are read.
* **Power**: amdsmi has no buffered power samples, so
  :meth:`AMDSMIBackend.power_samples_since` polls the energy counter and reports
  ΔE/Δt since its previous poll, stamped with the backend's clock. The first poll
  after start only primes. The first derived power is checked once against
  ``amdsmi_get_power_info`` (socket power, W); a disagreement over 25 % is logged.
* **Power cap**: ``amdsmi_get_power_cap_info(h)`` (µW) and
  ``amdsmi_set_power_cap(h, 0, cap_uW)``.

µJ ticks and µW are converted to J and W here and nowhere else.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from zeus_callbacks.backends._vendor import VendorBackend, VendorDevice, import_vendor_module, parse_visible_list
from zeus_callbacks.backends.base import BackendUnavailable, Clock, NotSupported, PowerSample, SensorError

logger = logging.getLogger(__name__)

#: amdsmi energy resolution and power caps are in micro-units.
J_PER_UJ = 1e-6
UW_PER_W = 1_000_000.0

#: ``amdsmi_status_t`` values from the C header (stable across ROCm releases).
STATUS_NOT_SUPPORTED = 2
STATUS_NOT_YET_IMPLEMENTED = 3
STATUS_NO_PERM = 10
_STATUS_KINDS: dict[object, str] = {
    STATUS_NOT_SUPPORTED: "not_supported",
    STATUS_NOT_YET_IMPLEMENTED: "not_supported",
    STATUS_NO_PERM: "no_permission",
}

#: Shortest interval between two polls that yields a power sample (s). The counter
#: refreshes every ~1 ms, so a 10 ms interval bounds the quantisation error to ~10 %.
MIN_POLL_INTERVAL_S = 0.010
#: A counter-derived power that differs from amdsmi's socket power by more than this
#: fraction is reported (once).
POWER_CHECK_TOLERANCE = 0.25

#: A counter that does not move over a poll interval while socket power reads more than this is
#: stuck: at ≥ 10 W a 10 ms interval holds ≥ 0.1 J, thousands of counter ticks (15.3 µJ each).
STUCK_MIN_POWER_W = 10.0
#: A counter unchanged over this many refresh periods while socket power reads more than
#: :data:`STUCK_MIN_POWER_W` has stopped, even over a span shorter than :data:`MIN_POLL_INTERVAL_S`
#: (5 ms at the ~1 ms refresh: the read a window's close makes shortly after the last poll).
STUCK_MIN_REFRESHES = 5

ENERGY_TICK_KEYS = ("energy_accumulator", "power")
SOCKET_POWER_KEYS = ("average_socket_power", "current_socket_power")
VISIBLE_DEVICE_ENVS = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


@dataclass
class _DeviceState(VendorDevice):
    """Per-device state; ``lock`` guards the poll and counter fields."""

    last_poll: tuple[float, float] | None = None  # (time_s, energy_J)
    power_checked: bool = False
    last_energy_J: float | None = None
    counter_stuck: bool = False  # the counter stopped advancing: power comes from socket power
    last_power_W: float | None = None  # the counter's mean power over the previous poll interval
    # The counter's power over the interval from then dropped below socket power: it may have
    # stopped in it. A later advance clears the doubt; a stop confirms it (doubt_fault); a close
    # before either reports it (readings_in_doubt).
    doubt_since_s: float | None = None
    doubt_fault: bool = False
    doubt_lock: threading.Lock = field(default_factory=threading.Lock)  # the doubt, read without a vendor call


class AMDSMIBackend(VendorBackend[_DeviceState]):
    """Measure and cap AMD GPUs through amdsmi.

    Device indices are the process's view after ``ROCR_VISIBLE_DEVICES`` and then
    ``HIP_VISIBLE_DEVICES`` (integer lists; HIP's indices refer to the devices ROCr
    left visible). Like the HIP runtime, a list ends at its first entry that names no
    device. Integers index amdsmi's enumeration order.

    Thread safety: amdsmi is called without a global lock; each device's polling
    state has its own lock, held only by sensor reads, so power-cap calls on the
    training thread never wait behind the sampler thread.

    Args:
        clock: Time source that stamps the polled power samples (default: wall clock).
        read_only: Refuse every setter; default from ``ZEUS_CALLBACKS_READ_ONLY``.
        amdsmi_module: An ``amdsmi``-compatible module (tests inject a fake); default
            ``import amdsmi``.

    Raises:
        BackendUnavailable: ``amdsmi`` or ``libamd_smi.so`` is missing, ``amdsmi_init``
            fails, or no GPU is visible.
    """

    name = "amdsmi"
    times_with_gpu_events = True
    vendor = "AMD"
    _log = logger
    sample_period_s = 0.02
    energy_counter_period_s = 0.001  # the driver refreshes the accumulator every ~1 ms

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        read_only: bool | None = None,
        amdsmi_module: ModuleType | Any | None = None,
    ) -> None:
        super().__init__(clock=clock, read_only=read_only)
        self._smi = amdsmi_module if amdsmi_module is not None else import_vendor_module("amdsmi", "AMD", _ADVICE)
        self._error_cls = getattr(self._smi, "AmdSmiException", Exception)
        self._start(self._smi.amdsmi_init, self._smi.amdsmi_shut_down, self._discover_devices)

    def _discover_devices(self) -> list[_DeviceState]:
        try:
            handles = list(self._smi.amdsmi_get_processor_handles())
        except self._error_cls as exc:
            raise BackendUnavailable(f"AMD backend unavailable: cannot enumerate GPUs ({exc})") from exc
        if not handles:
            raise BackendUnavailable("AMD backend unavailable: amdsmi reports no GPU")
        visible = list(range(len(handles)))
        for env in VISIBLE_DEVICE_ENVS:
            visible = _apply_visible_list(env, os.environ.get(env), visible)
            if not visible:
                raise BackendUnavailable(
                    f"AMD backend unavailable: {env}={os.environ.get(env)!r} leaves no GPU visible"
                )
        devices = []
        for amdsmi_index in visible:
            handle = handles[amdsmi_index]
            try:
                name = str(self._smi.amdsmi_get_gpu_asic_info(handle)["market_name"])
            except (self._error_cls, KeyError) as exc:
                logger.warning("amdsmi: cannot read the name of GPU %d: %s", amdsmi_index, exc)
                name = "AMD GPU"
            try:
                uuid: str | None = str(self._smi.amdsmi_get_gpu_device_uuid(handle)) or None
            except (self._error_cls, AttributeError) as exc:  # an older amdsmi, or the query failed
                logger.warning("amdsmi: cannot read the UUID of GPU %d: %s", amdsmi_index, exc)
                uuid = None
            devices.append(_DeviceState(backend_index=amdsmi_index, handle=handle, name=name, uuid=uuid))
        return devices

    def _error_kind(self, exc: BaseException) -> str | None:
        return _STATUS_KINDS.get(getattr(exc, "err_code", None))

    # -- identity ----------------------------------------------------------------------
    def amdsmi_index(self, index: int) -> int:
        """Return amdsmi's index of the process's GPU ``index``."""
        return self._device(index).backend_index

    # -- sensors -----------------------------------------------------------------------
    def _read_energy_J(self, device: _DeviceState, index: int, *, sensor: bool) -> float:
        with self._translated("reading the energy counter", index, sensor=sensor):
            counts = self._smi.amdsmi_get_energy_count(device.handle)
        ticks = next((counts[k] for k in ENERGY_TICK_KEYS if k in counts), None)
        if ticks is None or "counter_resolution" not in counts:
            raise SensorError(
                f"amdsmi: GPU {index} energy count has none of {ENERGY_TICK_KEYS} or no counter_resolution: "
                f"{sorted(counts)}",
                kind="unknown",
            )
        self.energy_counter_resolution_J = float(counts["counter_resolution"]) * J_PER_UJ
        return float(ticks) * float(counts["counter_resolution"]) * J_PER_UJ

    def power_samples_since(self, index: int, since_s: float) -> list[PowerSample]:
        """Poll GPU ``index``'s energy counter: the mean power (W) since the last poll, if newer than ``since_s``.

        The first call primes and returns ``[]``; so does a call less than
        :data:`MIN_POLL_INTERVAL_S` after the previous one (the poll is kept). The
        sample is the mean power over ``(previous poll, now]``, stamped ``now`` on
        the backend's clock. Poll every ~20 ms for a stream like NVIDIA's.

        Raises:
            SensorError: The read failed, or the counter went backwards
                (``kind="counter_backwards"``; polling restarts from the new value).
        """
        device = self._device(index)
        with device.lock:
            if device.counter_stuck:
                return self._socket_power_sample(device, index, since_s)
            energy_J = self._read_energy_J(device, index, sensor=True)
            now_s = self.clock.now_s()
            previous, device.last_poll = device.last_poll, (now_s, energy_J)
            if previous is None:
                return []
            then_s, then_J = previous
            span_s = now_s - then_s
            if energy_J < then_J:
                raise self._counter_backwards(index, f"{then_J:.3f} J", f"{energy_J:.3f} J")
            if span_s < MIN_POLL_INTERVAL_S:
                # Too short for a power figure; but a doubt the last poll left is settled by a counter that
                # has not moved over several refresh periods since (a window's close reads soon after a poll).
                settles = device.doubt_since_s is not None and energy_J == then_J
                if not (settles and span_s >= STUCK_MIN_REFRESHES * self.energy_counter_period_s):
                    device.last_poll = previous
                    return []
            # A powered GPU draws >= STUCK_MIN_POWER_W: a counter that advanced by less (over the interval less
            # the one refresh its last value may lag by) stopped early in the interval, or the GPU is off.
            if energy_J - then_J < STUCK_MIN_POWER_W * max(span_s - self.energy_counter_period_s, 0.0):
                return self._stopped_counter(device, index, previous, (now_s, energy_J), since_s)
            power_W = (energy_J - then_J) / span_s
            self._doubt_drop(device, index, then_s, power_W)
            device.last_power_W = power_W
            if not device.power_checked:
                device.power_checked = True
                self._check_against_socket_power(device, index, power_W)
        return [PowerSample(now_s, power_W)] if now_s > since_s else []

    def _stopped_counter(
        self,
        device: _DeviceState,
        index: int,
        previous: tuple[float, float],
        reading: tuple[float, float],
        since_s: float,
    ) -> list[PowerSample]:
        """The counter (nearly) stopped over ``(previous poll, now]``: stuck, or the GPU is off (lock held).

        With socket power above :data:`STUCK_MIN_POWER_W` it is stuck: socket power stands in from
        now on. The previous interval's figure holds unless the counter's power fell well below socket
        power in it (a doubt, :meth:`_doubt_drop`): then it stopped in that stretch, not known (``doubt_fault``).

        Raises:
            SensorError: ``kind="counter_stuck"`` when socket power cannot be read to tell.
        """
        (then_s, then_J), (now_s, energy_J) = previous, reading
        socket_W = self._socket_power_W(device, index)
        if socket_W is None:
            # A powered GPU never draws 0 W: a counter that did not move is stuck or the GPU is off,
            # and without socket power to tell which, no sample is better than a 0 W guess.
            device.last_poll = previous
            raise SensorError(
                f"amdsmi: GPU {index} energy counter did not advance over {now_s - then_s:.3f} s and "
                "socket power cannot be read to check it",
                kind="counter_stuck",
            )
        if socket_W <= STUCK_MIN_POWER_W:  # the GPU is (nearly) off: the counter is right
            power_W = (energy_J - then_J) / (now_s - then_s)
            device.last_power_W = power_W
            return [PowerSample(now_s, power_W)] if now_s > since_s else []
        device.counter_stuck = True
        with device.doubt_lock:
            device.doubt_fault = device.doubt_fault or device.doubt_since_s is not None
            device.doubt_since_s = None
        self._warn_once(
            "counter_stuck", index,
            "amdsmi: GPU %d energy counter stopped advancing over %.3f s while socket power reads %.1f W; "
            "using socket power readings for the rest of this run (energy cross-checks off)",
            index, now_s - then_s, socket_W,
        )  # fmt: skip
        return [PowerSample(now_s, socket_W)] if now_s > since_s else []

    def _doubt_drop(self, device: _DeviceState, index: int, then_s: float, power_W: float) -> None:
        """A counter that ran at ``power_W`` since ``then_s``: doubt it if it fell well below socket power (lock held).

        Socket power is read only on a drop from the previous interval (a counter that stops drops), so a
        steady run makes no extra call.
        """
        last_W = device.last_power_W
        low = False
        if last_W is not None and power_W < (1 - POWER_CHECK_TOLERANCE) * last_W:
            socket_W = self._socket_power_W(device, index)
            low = socket_W is not None and power_W < (1 - POWER_CHECK_TOLERANCE) * socket_W
        with device.doubt_lock:  # no drop: it advanced as before, so it is running
            device.doubt_since_s = then_s if low else None

    def readings_in_doubt(self, index: int, *, closing: bool) -> str | None:
        """``"counter_stuck"`` once the counter is found to have stopped inside an interval already reported.

        That interval's power (the counter's advance over it) under-reports by an unknown amount. At a
        close (``closing``), a doubt no later poll has settled counts too: the figures being closed hold it.
        No vendor call.
        """
        device = self._device(index)
        with device.doubt_lock:
            if device.doubt_fault or (closing and device.doubt_since_s is not None):
                device.doubt_fault = False
                device.doubt_since_s = None
                return "counter_stuck"
        return None

    def _socket_power_W(self, device: _DeviceState, index: int) -> float | None:
        """Socket power (W): the current reading, else the average; None where amdsmi gives neither."""
        try:
            info = self._smi.amdsmi_get_power_info(device.handle)
        except self._error_cls as exc:
            logger.debug("amdsmi: GPU %d: cannot read socket power: %s", index, exc)
            return None
        for key in reversed(SOCKET_POWER_KEYS):  # current first: the average spans ~1 s
            value = info.get(key)
            if isinstance(value, (int, float)) and value > 0:
                return float(value)
        return None

    def _socket_power_sample(self, device: _DeviceState, index: int, since_s: float) -> list[PowerSample]:
        """A stuck counter: one socket-power reading stamped now (lock held)."""
        power_W = self._socket_power_W(device, index)
        now_s = self.clock.now_s()
        if power_W is None:
            raise SensorError(f"amdsmi: GPU {index}: its counter is stuck and socket power unreadable", kind="unknown")
        return [PowerSample(now_s, power_W)] if now_s > since_s else []

    def _check_against_socket_power(self, device: _DeviceState, index: int, power_W: float) -> None:
        try:
            info = self._smi.amdsmi_get_power_info(device.handle)
        except self._error_cls as exc:
            logger.debug("amdsmi: GPU %d: cannot read socket power to check the counter: %s", index, exc)
            return
        reference = next((info[k] for k in SOCKET_POWER_KEYS if isinstance(info.get(k), (int, float))), None)
        if reference is None or reference <= 0:
            logger.debug("amdsmi: GPU %d reports no socket power to check the counter against", index)
            return
        if abs(power_W - reference) > POWER_CHECK_TOLERANCE * reference:
            self._warn_once(
                "power_mismatch", index,
                "amdsmi: GPU %d energy counter gives %.1f W but socket power reads %.1f W (> %.0f %% apart); "
                "energy figures may be off",
                index, power_W, float(reference), POWER_CHECK_TOLERANCE * 100,
            )  # fmt: skip

    def energy_counter_J(self, index: int) -> float:
        """Return GPU ``index``'s cumulative energy counter (J; only differences are meaningful).

        Raises:
            NotSupported: The GPU has no energy counter.
            SensorError: The read failed, or the counter went backwards since the last
                read (``kind="counter_backwards"``; the next read counts from the new value).
        """
        device = self._device(index)
        if device.counter_stuck:
            raise NotSupported(f"amdsmi: GPU {index}'s energy counter is stuck (it stopped advancing under load)")
        energy_J = self._read_energy_J(device, index, sensor=False)
        with device.lock:
            previous_J, device.last_energy_J = device.last_energy_J, energy_J
        if previous_J is not None and energy_J < previous_J:
            raise self._counter_backwards(index, f"{previous_J:.3f} J", f"{energy_J:.3f} J")
        return energy_J

    # -- power cap ---------------------------------------------------------------------
    def _cap_info(self, index: int) -> dict[str, Any]:
        device = self._device(index)
        with self._translated("reading the power cap", index):
            return self._smi.amdsmi_get_power_cap_info(device.handle)

    def power_limit_constraints_W(self, index: int) -> tuple[float, float]:
        """Return the ``(min, max)`` power cap GPU ``index`` accepts (W)."""
        info = self._cap_info(index)
        return info["min_power_cap"] / UW_PER_W, info["max_power_cap"] / UW_PER_W

    def power_limit_W(self, index: int) -> float:
        """Return the power cap in force on GPU ``index`` (W)."""
        return self._cap_info(index)["power_cap"] / UW_PER_W

    def _set_power_limit_W(self, index: int, limit_W: float) -> None:
        device = self._device(index)
        cap_uW = int(round(limit_W * UW_PER_W))
        with self._translated(f"setting the power cap to {limit_W:.0f} W", index):
            self._smi.amdsmi_set_power_cap(device.handle, 0, cap_uW)
        logger.info("amdsmi: GPU %d power cap set to %.0f W", index, limit_W)


_ADVICE = "install ROCm's amdsmi package"


def _apply_visible_list(env: str, spec: str | None, visible: list[int]) -> list[int]:
    """Narrow ``visible`` (amdsmi indices, process order) by the integer list ``spec`` of variable ``env``.

    ``spec`` None (unset) changes nothing; the list ends at its first entry that is not an integer
    naming a new device (logged).
    """

    def resolve(token: str) -> int | None:
        try:
            position = int(token)
        except ValueError:
            return None
        return visible[position] if 0 <= position < len(visible) else None

    def stop(token: str) -> None:
        logger.warning("amdsmi: %s entry %r names no (new) GPU; ignoring it and every later entry", env, token)

    return parse_visible_list(spec, visible, resolve, stop)
