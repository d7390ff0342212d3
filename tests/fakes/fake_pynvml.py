"""A fake ``pynvml`` (nvidia-ml-py) that behaves like an NVIDIA H200 on driver 580.

Numbers come from ``shared/h200/h200_nvml_probe_2026-11-29.json`` and
``h200_sample_semantics_2026-11-29.json``:

* power limit constraints 200–700 W, default and current 700 W (reported in mW);
* ``nvmlDeviceGetTotalEnergyConsumption``: mJ, updates every 100 ms, one call costs
  3.3–4.8 ms (:data:`H200_CALL_COST_S`; the fake sleeps only when asked to);
* ``nvmlDeviceGetSamples(h, NVML_TOTAL_POWER_SAMPLES, last_us)``: one sample every
  20 ms, µs timestamps on the CPU realtime clock, ~2.4 s of history, each value the
  mean power of the previous ~15 ms; ``NVMLError_NotFound`` when nothing is newer;
* ``nvmlDeviceGetPowerUsage``: mW, a ~1 s average that updates every 100 ms;
* field ``NVML_FI_DEV_POWER_INSTANT`` (186): mW, updates every 100 ms.

Constants and the ``NVMLError`` class hierarchy mirror nvidia-ml-py 13 (same names,
same codes, ``NVMLError(code)`` returns the matching subclass).

Usage::

    fake = FakePyNVML(num_gpus=2, time_fn=clock.now_s)
    fake.set_load(500.0)                          # every GPU now draws 500 W
    fake.fail_next("nvmlDeviceGetTotalEnergyConsumption", NVMLError_GpuIsLost, count=2)
    fake.make_unsupported("nvmlDeviceGetSamples")  # forces the field-186 fallback
    backend = NVMLBackend(nvml_module=fake, clock=clock)
"""

from __future__ import annotations

import fcntl
import json
import os
import string
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import US_PER_S, FakeLibrary, PowerModel, to_us

# -- constants (values as in nvidia-ml-py 13.x) ---------------------------------------
NVML_SUCCESS = 0
NVML_TOTAL_POWER_SAMPLES = 0
NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION = 83
NVML_FI_DEV_POWER_AVERAGE = 185
NVML_FI_DEV_POWER_INSTANT = 186
NVML_VALUE_TYPE_DOUBLE = 0
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_LONG = 2
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
NVML_VALUE_TYPE_SIGNED_LONG_LONG = 4
NVML_VALUE_TYPE_SIGNED_INT = 5
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_FREQ_NOT_SUPPORTED = 24
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_DEPRECATED = 26
NVML_ERROR_NOT_READY = 27
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_INVALID_STATE = 29
NVML_ERROR_RESET_TYPE_NOT_SUPPORTED = 30
NVML_ERROR_UNKNOWN = 999

_ERROR_CODES = {name: value for name, value in globals().items() if name.startswith("NVML_ERROR_")}
_ERROR_STRINGS = {
    1: "Uninitialized",
    2: "Invalid Argument",
    3: "Not Supported",
    4: "Insufficient Permissions",
    5: "Already Initialized",
    6: "Not Found",
    9: "Driver Not Loaded",
    10: "Timeout",
    12: "NVML Shared Library Not Found",
    13: "Function Not Found",
    15: "GPU is lost",
    16: "GPU requires restart",
    999: "Unknown Error",
}


STATE_ENV = "ZEUS_FAKE_NVML_STATE"
"""Environment variable naming the shared limit-state file (see :class:`FakePyNVML`)."""


class NVMLError(Exception):
    """Base NVML error; ``NVMLError(code)`` returns the subclass for ``code`` (as pynvml does)."""

    _code_to_class: dict[int, type[NVMLError]] = {}
    _code: int | None = None

    def __new__(cls, value: int | None = None):
        if cls is NVMLError and value in NVMLError._code_to_class:
            cls = NVMLError._code_to_class[value]
        obj = Exception.__new__(cls)
        obj.value = cls._code if cls._code is not None else value
        return obj

    def __init__(self, value: int | None = None) -> None:
        super().__init__(self.value)

    def __str__(self) -> str:
        return _ERROR_STRINGS.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NVMLError) and self.value == other.value

    __hash__ = Exception.__hash__


def _class_name(constant: str) -> str:
    # NVML_ERROR_GPU_IS_LOST -> NVMLError_GpuIsLost, the naming nvidia-ml-py uses.
    return "NVMLError_" + string.capwords(constant.replace("NVML_ERROR_", ""), "_").replace("_", "")


for _const, _code in _ERROR_CODES.items():
    _cls = type(_class_name(_const), (NVMLError,), {"_code": _code, "__module__": __name__})
    globals()[_cls.__name__] = _cls
    NVMLError._code_to_class[_code] = _cls
del _const, _code, _cls


def error_class(code: int) -> type[NVMLError]:
    """Return the ``NVMLError`` subclass for an ``NVML_ERROR_*`` code."""
    return NVMLError._code_to_class[code]


# -- H200 sensor facts ------------------------------------------------------------------
H200_NAME = "NVIDIA H200"
H200_MIN_LIMIT_mW = 200_000
H200_MAX_LIMIT_mW = 700_000
H200_DEFAULT_LIMIT_mW = 700_000
H200_IDLE_W = 121.0
H200_ENERGY_AT_START_mJ = 2_691_675
H200_SAMPLE_PERIOD_S = 0.020
H200_SAMPLE_HISTORY_S = 2.4
H200_SAMPLE_WINDOW_S = 0.015
H200_SENSOR_REFRESH_S = 0.100  # power usage, field 186 and the energy counter
H200_POWER_USAGE_AVERAGE_S = 1.0
H200_INSTANT_WINDOW_S = 0.020
#: Measured cost of one call (s): energy counter 3.3 ms idle, 4.8 ms busy.
H200_CALL_COST_S = {
    "nvmlDeviceGetTotalEnergyConsumption": 0.0043,
    "nvmlDeviceGetPowerUsage": 1.4e-6,
    "nvmlDeviceGetFieldValues": 5.0e-6,
}


# -- the structures pynvml returns ------------------------------------------------------
@dataclass
class c_nvmlValue_t:
    """The value union: every integer member holds the same number."""

    dVal: float = 0.0
    uiVal: int = 0
    ulVal: int = 0
    ullVal: int = 0
    sllVal: int = 0
    siVal: int = 0
    usVal: int = 0

    @classmethod
    def of(cls, value: int) -> c_nvmlValue_t:
        """Return a union holding ``value`` in every member."""
        v = int(value)
        return cls(float(v), v, v, v, v, v, v & 0xFFFF)


@dataclass
class c_nvmlSample_t:
    """One buffered sample: ``timeStamp`` (µs, realtime clock) and ``sampleValue``."""

    timeStamp: int
    sampleValue: c_nvmlValue_t


@dataclass
class c_nvmlFieldValue_t:
    """One field value, with its own return code (fields do not raise)."""

    fieldId: int
    scopeId: int = 0
    timestamp: int = 0
    latencyUsec: int = 0
    valueType: int = NVML_VALUE_TYPE_UNSIGNED_INT
    nvmlReturn: int = NVML_SUCCESS
    value: c_nvmlValue_t = field(default_factory=c_nvmlValue_t)


@dataclass(eq=False)
class FakeHandle:
    """Stands in for ``c_nvmlDevice_t``."""

    owner: FakePyNVML
    index: int


@dataclass
class FakeGPU:
    """The state of one fake GPU. Tests may read or change any field."""

    index: int
    uuid: str
    model: PowerModel
    name: str = H200_NAME
    min_limit_mW: int = H200_MIN_LIMIT_mW
    max_limit_mW: int = H200_MAX_LIMIT_mW
    default_limit_mW: int = H200_DEFAULT_LIMIT_mW
    limit_mW: int = H200_DEFAULT_LIMIT_mW
    mig_mode: int = NVML_DEVICE_MIG_DISABLE
    mig_capable: bool = True
    energy_offset_mJ: int = H200_ENERGY_AT_START_mJ
    origin_s: float = 0.0
    unsupported_fields: set[int] = field(default_factory=set)
    stuck_mJ: int | None = None  # the energy counter's frozen value, while stuck
    corrupt: list[tuple[float | None, float]] = field(default_factory=list)  # (power_W, shift_s), next samples


class FakePyNVML(FakeLibrary):
    """A module-like fake of ``pynvml`` for ``num_gpus`` H200s.

    Args:
        num_gpus: How many GPUs ``nvmlDeviceGetCount`` reports (0 is allowed).
        time_fn: The realtime clock the sensors run on (s); pass a
            :class:`~zeus_callbacks.backends.base.ManualClock`'s ``now_s`` for
            deterministic tests.
        idle_W: True power of every GPU until :meth:`set_load` (W).
        call_cost_s: Seconds each named function sleeps per call (real
            ``time.sleep``); ``H200_CALL_COST_S`` holds the measured values.

        state_path: A JSON file holding each GPU's power limit (mW) by UUID, shared by every
            fake built on it (default ``$ZEUS_FAKE_NVML_STATE``): like a real driver, the limit
            outlives the process that set it, so tests of killed runs and concurrent processes
            can check what a GPU is left at. Reads and writes hold an ``flock``.

    Fault injection: :meth:`fail_next`, :meth:`fail_always`, :meth:`make_unsupported`,
    :meth:`make_field_unsupported`, :meth:`deny_permission`, :meth:`set_mig`,
    :meth:`counter_backwards`, :meth:`clear_faults`. ``calls`` counts every call by name.
    """

    _INIT_FUNC = "nvmlInit"
    _NOT_SUPPORTED = NVML_ERROR_NOT_SUPPORTED
    _NO_PERMISSION = NVML_ERROR_NO_PERMISSION
    _SET_LIMIT_FUNC = "nvmlDeviceSetPowerManagementLimit"

    def __init__(
        self,
        num_gpus: int = 1,
        *,
        time_fn: Callable[[], float] = time.time,
        idle_W: float = H200_IDLE_W,
        call_cost_s: dict[str, float] | None = None,
        state_path: str | Path | None = None,
    ) -> None:
        super().__init__(time_fn=time_fn, call_cost_s=call_cost_s)
        configured = state_path if state_path is not None else os.environ.get(STATE_ENV) or None
        self.state_path = Path(configured) if configured else None
        start_s = time_fn()
        self.gpus = [
            FakeGPU(
                index=i,
                uuid="GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"fake-h200-{i}")),
                model=PowerModel(idle_W, time_fn),
                origin_s=start_s,
            )
            for i in range(num_gpus)
        ]

    # -- module-like attribute access: constants and error classes -------------------
    def __getattr__(self, name: str) -> Any:
        if name.startswith(("NVML", "c_nvml")):
            try:
                return globals()[name]
            except KeyError:
                pass
        raise AttributeError(name)

    # -- test controls (the rest are FakeLibrary's) ------------------------------------
    @staticmethod
    def _exc_factory(error: int | type[NVMLError] | NVMLError) -> Callable[[], NVMLError]:
        if isinstance(error, NVMLError):
            return lambda: error
        if isinstance(error, type):
            return lambda: error()
        return lambda: NVMLError(error)

    @staticmethod
    def _uninitialized() -> NVMLError:
        return NVMLError(NVML_ERROR_UNINITIALIZED)

    def make_field_unsupported(self, field_id: int, index: int | None = None) -> None:
        """Make field ``field_id`` come back with ``NVML_ERROR_NOT_SUPPORTED``."""
        for gpu in self._targets(index):
            gpu.unsupported_fields.add(field_id)

    def set_mig(self, index: int, enabled: bool = True) -> None:
        """Switch MIG mode of GPU ``index`` on or off (current and pending)."""
        self.gpus[index].mig_mode = NVML_DEVICE_MIG_ENABLE if enabled else NVML_DEVICE_MIG_DISABLE

    def corrupt_next_sample(self, power_W: float | None = None, shift_s: float = 0.0, index: int = 0) -> None:
        """Make the newest sample of GPU ``index``'s next non-empty ``nvmlDeviceGetSamples`` read wrong.

        Its value becomes ``power_W`` (W; NaN, negative or huge allowed: that read then comes back with
        ``NVML_VALUE_TYPE_DOUBLE``, the one union member that holds them) and its timestamp moves by
        ``shift_s`` (s; positive: a sample from the future). The true power is unchanged.
        """
        self.gpus[index].corrupt.append((power_W, shift_s))

    def counter_backwards(self, index: int = 0, by_mJ: int = 1_000_000) -> None:
        """Make GPU ``index``'s energy counter jump back by ``by_mJ`` millijoules."""
        self.gpus[index].energy_offset_mJ -= by_mJ

    # -- internals ---------------------------------------------------------------------
    def _enter(self, func: str, handle: FakeHandle | None = None) -> FakeGPU | None:
        self._begin(func, handle.index if handle is not None else None)
        if handle is None:
            return None
        if not isinstance(handle, FakeHandle) or handle.owner is not self or handle.index >= len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[handle.index]

    def _now_us(self) -> int:
        return to_us(self.time_fn())

    @staticmethod
    def _last_tick_us(now_us: int, period_s: float) -> int:
        period_us = to_us(period_s)
        return now_us - now_us % period_us

    def _mean_mW(self, gpu: FakeGPU, end_us: int, window_s: float) -> int:
        end_s = end_us / US_PER_S
        return int(round(gpu.model.mean_power_W(end_s - window_s, end_s) * 1000))

    def stick_counter(self, index: int = 0, stuck: bool = True) -> None:
        """Make GPU ``index``'s energy counter stop advancing, or resume (jumping to the true total)."""
        gpu = self.gpus[index]
        gpu.stuck_mJ = None
        if stuck:
            gpu.stuck_mJ = self._energy_mJ(gpu, self._last_tick_us(self._now_us(), H200_SENSOR_REFRESH_S))

    def _energy_mJ(self, gpu: FakeGPU, at_us: int) -> int:
        if gpu.stuck_mJ is not None:
            return gpu.stuck_mJ
        energy_J = gpu.model.energy_J(gpu.origin_s, at_us / US_PER_S)
        return gpu.energy_offset_mJ + round(energy_J * 1000)

    # -- the pynvml API ------------------------------------------------------------------
    def nvmlInit(self) -> None:
        """Initialise (reference counted, as NVML is)."""
        self._enter("nvmlInit")
        self._count_init(+1)

    def nvmlShutdown(self) -> None:
        """Drop one reference; raises ``NVMLError_Uninitialized`` if none is held."""
        self._enter("nvmlShutdown")
        self._count_init(-1)

    def nvmlSystemGetDriverVersion(self) -> str:
        """Return the driver version of the probed H200."""
        self._enter("nvmlSystemGetDriverVersion")
        return "580.159.04"

    def nvmlDeviceGetCount(self) -> int:
        """Return the number of GPUs."""
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        """Return the handle of GPU ``index`` (NVML order)."""
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return FakeHandle(self, index)

    def nvmlDeviceGetHandleByUUID(self, uuid_str: str | bytes) -> FakeHandle:
        """Return the handle of the GPU with this exact UUID."""
        self._enter("nvmlDeviceGetHandleByUUID")
        text = uuid_str.decode() if isinstance(uuid_str, bytes) else uuid_str
        for gpu in self.gpus:
            if gpu.uuid == text:
                return FakeHandle(self, gpu.index)
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str:
        """Return ``GPU-<uuid>``."""
        return self._enter("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:
        """Return the model name."""
        return self._enter("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetMigMode(self, handle: FakeHandle) -> list[int]:
        """Return ``[current, pending]`` MIG mode; NotSupported on GPUs without MIG."""
        gpu = self._enter("nvmlDeviceGetMigMode", handle)
        if not gpu.mig_capable:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return [gpu.mig_mode, gpu.mig_mode]

    def nvmlDeviceGetSamples(
        self, handle: FakeHandle, sampling_type: int, timeStamp: int
    ) -> tuple[int, list[c_nvmlSample_t]]:
        """Return buffered power samples (mW) newer than ``timeStamp`` (µs).

        Raises:
            NVMLError_NotFound: No buffered sample is newer than ``timeStamp``.
        """
        gpu = self._enter("nvmlDeviceGetSamples", handle)
        if sampling_type != NVML_TOTAL_POWER_SAMPLES:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        now_us = self._now_us()
        period_us = to_us(H200_SAMPLE_PERIOD_S)
        oldest_us = max(now_us - to_us(H200_SAMPLE_HISTORY_S), to_us(gpu.origin_s), int(timeStamp) + 1)
        first_us = -(-oldest_us // period_us) * period_us  # first grid point >= oldest_us
        samples = [
            c_nvmlSample_t(ts, c_nvmlValue_t.of(self._mean_mW(gpu, ts, H200_SAMPLE_WINDOW_S)))
            for ts in range(first_us, now_us + 1, period_us)
        ]
        if not samples:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        if gpu.corrupt:
            power_W, shift_s = gpu.corrupt.pop(0)
            last = samples[-1]
            if power_W is not None:
                last.sampleValue = c_nvmlValue_t(dVal=power_W * 1000)
                for sample in samples[:-1]:
                    sample.sampleValue = c_nvmlValue_t(dVal=float(sample.sampleValue.uiVal))
            last.timeStamp += to_us(shift_s)
            return (NVML_VALUE_TYPE_DOUBLE if power_W is not None else NVML_VALUE_TYPE_UNSIGNED_INT), samples
        return NVML_VALUE_TYPE_UNSIGNED_INT, samples

    def nvmlDeviceGetFieldValues(self, handle: FakeHandle, fieldIds: list) -> list[c_nvmlFieldValue_t]:
        """Return field values; an unsupported field carries its error in ``nvmlReturn``."""
        gpu = self._enter("nvmlDeviceGetFieldValues", handle)
        now_us = self._now_us()
        tick_us = self._last_tick_us(now_us, H200_SENSOR_REFRESH_S)
        out = []
        for fid in fieldIds:
            fid, scope = fid if isinstance(fid, tuple) else (fid, 0)
            value = c_nvmlFieldValue_t(fieldId=fid, scopeId=scope, timestamp=tick_us)
            if fid in gpu.unsupported_fields or fid not in (
                NVML_FI_DEV_POWER_INSTANT,
                NVML_FI_DEV_POWER_AVERAGE,
                NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
            ):
                value.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
                value.timestamp = 0
            elif fid == NVML_FI_DEV_POWER_INSTANT:
                value.value = c_nvmlValue_t.of(self._mean_mW(gpu, tick_us, H200_INSTANT_WINDOW_S))
            elif fid == NVML_FI_DEV_POWER_AVERAGE:
                value.value = c_nvmlValue_t.of(self._mean_mW(gpu, tick_us, H200_POWER_USAGE_AVERAGE_S))
            else:
                value.valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                value.value = c_nvmlValue_t.of(self._energy_mJ(gpu, tick_us))
            out.append(value)
        return out

    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:
        """Return the ~1 s average power (mW), refreshed every 100 ms."""
        gpu = self._enter("nvmlDeviceGetPowerUsage", handle)
        tick_us = self._last_tick_us(self._now_us(), H200_SENSOR_REFRESH_S)
        return self._mean_mW(gpu, tick_us, H200_POWER_USAGE_AVERAGE_S)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeHandle) -> int:
        """Return the energy counter (mJ), refreshed every 100 ms; slow (see ``H200_CALL_COST_S``)."""
        gpu = self._enter("nvmlDeviceGetTotalEnergyConsumption", handle)
        tick_us = self._last_tick_us(self._now_us(), H200_SENSOR_REFRESH_S)
        return self._energy_mJ(gpu, max(tick_us, to_us(gpu.origin_s)))

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: FakeHandle) -> list[int]:
        """Return ``[min, max]`` power limit (mW)."""
        gpu = self._enter("nvmlDeviceGetPowerManagementLimitConstraints", handle)
        return [gpu.min_limit_mW, gpu.max_limit_mW]

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: FakeHandle) -> int:
        """Return the default power limit (mW)."""
        return self._enter("nvmlDeviceGetPowerManagementDefaultLimit", handle).default_limit_mW

    def nvmlDeviceGetPowerManagementLimit(self, handle: FakeHandle) -> int:
        """Return the power limit in force (mW)."""
        return self._limit_mW(self._enter("nvmlDeviceGetPowerManagementLimit", handle))

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeHandle) -> int:
        """Return the enforced power limit (mW)."""
        return self._limit_mW(self._enter("nvmlDeviceGetEnforcedPowerLimit", handle))

    # -- the limit state shared across processes (``state_path``) -----------------------
    def _state(self, update: Callable[[dict[str, int]], None] | None = None) -> dict[str, int]:
        assert self.state_path is not None
        with open(self.state_path.with_name(self.state_path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                data = json.loads(self.state_path.read_text()) if self.state_path.exists() else {}
                if update is not None:
                    update(data)
                    tmp = self.state_path.with_name(f".{self.state_path.name}.{os.getpid()}")
                    tmp.write_text(json.dumps(data))
                    os.replace(tmp, self.state_path)
                return data
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _limit_mW(self, gpu: FakeGPU) -> int:
        if self.state_path is not None:
            gpu.limit_mW = int(self._state().get(gpu.uuid, gpu.limit_mW))
        return gpu.limit_mW

    def limit_W(self, index: int) -> float:
        """The limit GPU ``index`` is at (W), from the shared state when there is one (a test helper)."""
        return self._limit_mW(self.gpus[index]) / 1000

    def nvmlDeviceSetPowerManagementLimit(self, handle: FakeHandle, limit: int) -> None:
        """Set the power limit (mW) in the fake's memory only; InvalidArgument when out of range."""
        gpu = self._enter("nvmlDeviceSetPowerManagementLimit", handle)
        if not isinstance(limit, int):
            raise TypeError(f"limit must be an int number of mW, got {type(limit).__name__}")
        if not gpu.min_limit_mW <= limit <= gpu.max_limit_mW:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        gpu.limit_mW = limit
        if self.state_path is not None:
            self._state(lambda data: data.__setitem__(gpu.uuid, limit))
