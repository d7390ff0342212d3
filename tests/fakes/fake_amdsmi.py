"""A fake ``amdsmi`` (ROCm SMI Python interface) for tests.

Sensor behaviour (docs/hardware.md#amdsmi):

* ``amdsmi_get_energy_count(h)`` returns ``{<key>: ticks, "counter_resolution": µJ per
  tick, "timestamp": ns}``; the tick key is ``"energy_accumulator"`` from ROCm 6.4 and
  ``"power"`` before (``energy_key=``); the counter refreshes every ~1 ms;
* ``amdsmi_get_power_info(h)``: socket power in W (``"N/A"`` where unsupported);
* ``amdsmi_get_power_cap_info(h)``: ``power_cap``, ``min_power_cap``, ``max_power_cap``,
  ``default_power_cap`` in µW; ``amdsmi_set_power_cap(h, 0, cap_uW)`` sets it in
  the fake's memory only.

The device numbers (MI300X name, 200–750 W caps, 140 W idle) are illustrative, not
measured. Errors are ``AmdSmiLibraryException(err_code)`` with the real status codes.

Usage::

    fake = FakeAMDSMI(energy_key="power", time_fn=clock.now_s)
    fake.set_load(600.0)
    fake.deny_permission()        # amdsmi_set_power_cap raises ERR_NO_PERM
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from . import US_PER_S, FakeLibrary, PowerModel, to_us


class AmdSmiRetCode(IntEnum):
    """Status codes of ``amdsmi_status_t`` (the C header's values)."""

    SUCCESS = 0
    ERR_INVAL = 1
    ERR_NOT_SUPPORTED = 2
    NOT_IMPLEMENTED = 3
    FAIL_LOAD_MODULE = 4
    FAIL_LOAD_SYMBOL = 5
    DRM_ERROR = 6
    API_FAILED = 7
    TIMEOUT = 8
    RETRY = 9
    ERR_NO_PERM = 10
    INTERRUPT = 11
    ERR_IO = 12
    FAULT = 13
    FILE_ERROR = 14
    ERR_OUT_OF_RESOURCES = 15
    INTERNAL_EXCEPTION = 16
    INPUT_OUT_OF_BOUNDS = 17
    INIT_ERROR = 18
    REFCOUNT_OVERFLOW = 19
    ERR_BUSY = 30
    ERR_NOT_FOUND = 31
    NOT_INIT = 32
    NO_SLOT = 33
    NO_DATA = 40
    INSUFFICIENT_SIZE = 41
    UNEXPECTED_SIZE = 42
    UNKNOWN_ERROR = 0xFFFFFFFF


class AmdSmiException(Exception):
    """Base class of every amdsmi error."""


class AmdSmiLibraryException(AmdSmiException):
    """An error status from the library; ``err_code`` holds it."""

    def __init__(self, err_code: int) -> None:
        err_code = abs(int(err_code))
        super().__init__(err_code)
        self.err_code = err_code
        try:
            self.err_info = f"AMDSMI_STATUS_{AmdSmiRetCode(err_code).name}"
        except ValueError:
            self.err_info = "AMDSMI_STATUS_UNKNOWN_ERROR"

    def __str__(self) -> str:
        return f"An error occured with code: {self.err_code}({self.err_info})"

    def get_error_code(self) -> int:
        """Return the status code."""
        return self.err_code


class AmdSmiRetryException(AmdSmiLibraryException):
    """The device is busy; retry."""

    def __init__(self) -> None:
        super().__init__(AmdSmiRetCode.RETRY)


class AmdSmiTimeoutException(AmdSmiLibraryException):
    """The call timed out."""

    def __init__(self) -> None:
        super().__init__(AmdSmiRetCode.TIMEOUT)


class AmdSmiParameterException(AmdSmiException):
    """A Python argument had the wrong type."""


MI300X_NAME = "AMD Instinct MI300X"
UW_PER_W = 1_000_000
DEFAULT_COUNTER_RESOLUTION_UJ = 15.3
DEFAULT_REFRESH_S = 0.001
DEFAULT_IDLE_W = 140.0
DEFAULT_MIN_CAP_UW = 200 * UW_PER_W
DEFAULT_MAX_CAP_UW = 750 * UW_PER_W


@dataclass(eq=False)
class FakeProcessorHandle:
    """Stands in for ``amdsmi_processor_handle``."""

    owner: FakeAMDSMI
    index: int


@dataclass
class FakeAMDGPU:
    """The state of one fake AMD GPU. Tests may read or change any field."""

    index: int
    model: PowerModel
    origin_s: float
    name: str = MI300X_NAME
    power_cap_uW: int = DEFAULT_MAX_CAP_UW
    min_power_cap_uW: int = DEFAULT_MIN_CAP_UW
    max_power_cap_uW: int = DEFAULT_MAX_CAP_UW
    default_power_cap_uW: int = DEFAULT_MAX_CAP_UW
    tick_offset: int = 123_456_789
    power_info_scale: float = 1.0
    power_info_fields: dict[str, bool] = field(
        default_factory=lambda: {"average_socket_power": True, "current_socket_power": True}
    )
    stuck_from_s: float | None = None  # the energy counter stops advancing from then (seen on amdsmi)


class FakeAMDSMI(FakeLibrary):
    """A module-like fake of ``amdsmi`` for ``num_gpus`` GPUs.

    Args:
        num_gpus: How many processor handles ``amdsmi_get_processor_handles`` returns.
        time_fn: The clock the sensors run on (s).
        idle_W: True power of every GPU until :meth:`set_load` (W).
        energy_key: ``"energy_accumulator"`` (ROCm ≥ 6.4) or ``"power"`` (older).
        counter_resolution_uJ: µJ per counter tick.
        refresh_s: How often the energy counter refreshes (s).
        call_cost_s: Seconds each named function sleeps per call.

    Fault injection: :meth:`fail_next`, :meth:`fail_always`, :meth:`make_unsupported`,
    :meth:`deny_permission`, :meth:`counter_backwards`, :meth:`stick_counter`,
    :meth:`set_power_info_scale`, :meth:`clear_faults`. ``calls`` counts every call by name.
    """

    AmdSmiRetCode = AmdSmiRetCode
    AmdSmiException = AmdSmiException
    AmdSmiLibraryException = AmdSmiLibraryException
    AmdSmiRetryException = AmdSmiRetryException
    AmdSmiTimeoutException = AmdSmiTimeoutException
    AmdSmiParameterException = AmdSmiParameterException

    _INIT_FUNC = "amdsmi_init"
    _NOT_SUPPORTED = AmdSmiRetCode.ERR_NOT_SUPPORTED
    _NO_PERMISSION = AmdSmiRetCode.ERR_NO_PERM
    _SET_LIMIT_FUNC = "amdsmi_set_power_cap"

    def __init__(
        self,
        num_gpus: int = 1,
        *,
        time_fn: Callable[[], float] = time.time,
        idle_W: float = DEFAULT_IDLE_W,
        energy_key: str = "energy_accumulator",
        counter_resolution_uJ: float = DEFAULT_COUNTER_RESOLUTION_UJ,
        refresh_s: float = DEFAULT_REFRESH_S,
        call_cost_s: dict[str, float] | None = None,
    ) -> None:
        if energy_key not in ("energy_accumulator", "power"):
            raise ValueError(f"energy_key must be 'energy_accumulator' or 'power', not {energy_key!r}")
        super().__init__(time_fn=time_fn, call_cost_s=call_cost_s)
        self.energy_key = energy_key
        self.counter_resolution_uJ = counter_resolution_uJ
        self.refresh_s = refresh_s
        start_s = time_fn()
        self.gpus = [FakeAMDGPU(index=i, model=PowerModel(idle_W, time_fn), origin_s=start_s) for i in range(num_gpus)]

    # -- test controls (the rest are FakeLibrary's) ------------------------------------
    @staticmethod
    def _exc_factory(err_code: int) -> Callable[[], AmdSmiLibraryException]:
        return lambda: AmdSmiLibraryException(err_code)

    @staticmethod
    def _uninitialized() -> AmdSmiLibraryException:
        return AmdSmiLibraryException(AmdSmiRetCode.NOT_INIT)

    def counter_backwards(self, index: int = 0, by_ticks: int = 1_000_000) -> None:
        """Make GPU ``index``'s energy counter jump back by ``by_ticks`` ticks."""
        self.gpus[index].tick_offset -= by_ticks

    def stick_counter(self, index: int = 0, stuck: bool = True, at_s: float | None = None) -> None:
        """Make GPU ``index``'s energy counter stop advancing from ``at_s`` (default: now) while power
        goes on (a fault reported against amdsmi: the accumulator freezes, socket power does not);
        ``stuck=False`` resumes it, and it jumps to the true total, as a driver that kept accumulating does."""
        self.gpus[index].stuck_from_s = None if not stuck else (self.time_fn() if at_s is None else at_s)

    def set_power_info_scale(self, scale: float, index: int | None = None) -> None:
        """Make ``amdsmi_get_power_info`` report ``scale`` × the true power (a lying sensor)."""
        for gpu in self._targets(index):
            gpu.power_info_scale = scale

    # -- internals ---------------------------------------------------------------------
    def _enter(self, func: str, handle: FakeProcessorHandle | None = None) -> FakeAMDGPU | None:
        self._begin(func, handle.index if isinstance(handle, FakeProcessorHandle) else None)
        if handle is None:
            return None
        if not isinstance(handle, FakeProcessorHandle) or handle.owner is not self:
            raise AmdSmiParameterException(f"not a processor handle: {handle!r}")
        return self.gpus[handle.index]

    def _tick_us(self) -> int:
        now_us = to_us(self.time_fn())
        period_us = max(1, to_us(self.refresh_s))
        return now_us - now_us % period_us

    # -- the amdsmi API ------------------------------------------------------------------
    def amdsmi_init(self, flag: int = 0) -> None:
        """Initialise the library."""
        self._enter("amdsmi_init")
        self._count_init(+1)

    def amdsmi_shut_down(self) -> None:
        """Shut the library down."""
        self._enter("amdsmi_shut_down")
        self._count_init(-1)

    def amdsmi_get_processor_handles(self) -> list[FakeProcessorHandle]:
        """Return one handle per GPU."""
        self._enter("amdsmi_get_processor_handles")
        return [FakeProcessorHandle(self, g.index) for g in self.gpus]

    def amdsmi_get_gpu_asic_info(self, handle: FakeProcessorHandle) -> dict[str, Any]:
        """Return ASIC info; ``market_name`` is the model name."""
        gpu = self._enter("amdsmi_get_gpu_asic_info", handle)
        return {"market_name": gpu.name, "vendor_id": "0x1002", "device_id": "0x74a1", "rev_id": "0x00"}

    def amdsmi_get_gpu_device_uuid(self, handle: FakeProcessorHandle) -> str:
        """Return the device UUID (a fixed one per index, in amdsmi's ``xxxxxxxx-xxxx-…`` form)."""
        gpu = self._enter("amdsmi_get_gpu_device_uuid", handle)
        return str(uuid.uuid5(uuid.NAMESPACE_DNS, f"fake-mi300x-{gpu.index}"))

    def amdsmi_get_energy_count(self, handle: FakeProcessorHandle) -> dict[str, Any]:
        """Return the energy accumulator (ticks), its resolution (µJ/tick) and a timestamp (ns)."""
        gpu = self._enter("amdsmi_get_energy_count", handle)
        tick_us = max(self._tick_us(), to_us(gpu.origin_s))
        if gpu.stuck_from_s is not None:
            tick_us = min(tick_us, max(to_us(gpu.stuck_from_s), to_us(gpu.origin_s)))
        energy_uJ = gpu.model.energy_J(gpu.origin_s, tick_us / US_PER_S) * 1e6
        ticks = gpu.tick_offset + round(energy_uJ / self.counter_resolution_uJ)
        return {self.energy_key: ticks, "counter_resolution": self.counter_resolution_uJ, "timestamp": tick_us * 1000}

    def amdsmi_get_power_info(self, handle: FakeProcessorHandle) -> dict[str, Any]:
        """Return socket power (W, ints as amdsmi gives them; ``"N/A"`` when disabled)."""
        gpu = self._enter("amdsmi_get_power_info", handle)
        now_s = self.time_fn()
        average_W = int(round(gpu.model.mean_power_W(now_s - 1.0, now_s) * gpu.power_info_scale))
        current_W = int(round(gpu.model.power_W(now_s) * gpu.power_info_scale))
        return {
            "average_socket_power": average_W if gpu.power_info_fields["average_socket_power"] else "N/A",
            "current_socket_power": current_W if gpu.power_info_fields["current_socket_power"] else "N/A",
            "gfx_voltage": 800,
            "soc_voltage": 900,
            "mem_voltage": 1100,
            "power_limit": gpu.power_cap_uW // UW_PER_W,
        }

    def amdsmi_get_power_cap_info(self, handle: FakeProcessorHandle) -> dict[str, int]:
        """Return power caps (µW)."""
        gpu = self._enter("amdsmi_get_power_cap_info", handle)
        return {
            "power_cap": gpu.power_cap_uW,
            "default_power_cap": gpu.default_power_cap_uW,
            "dpm_cap": 0,
            "min_power_cap": gpu.min_power_cap_uW,
            "max_power_cap": gpu.max_power_cap_uW,
        }

    def amdsmi_set_power_cap(self, handle: FakeProcessorHandle, sensor_ind: int, cap: int) -> None:
        """Set the power cap (µW) in the fake's memory only."""
        gpu = self._enter("amdsmi_set_power_cap", handle)
        if not isinstance(cap, int) or not isinstance(sensor_ind, int):
            raise AmdSmiParameterException(f"cap and sensor_ind must be int, got {cap!r}, {sensor_ind!r}")
        if not gpu.min_power_cap_uW <= cap <= gpu.max_power_cap_uW:
            raise AmdSmiLibraryException(AmdSmiRetCode.ERR_INVAL)
        gpu.power_cap_uW = cap
