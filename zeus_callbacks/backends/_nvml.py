"""NVIDIA GPUs through NVML (``pynvml``, package nvidia-ml-py).

What is read, and why (NVIDIA H200 on driver 580, see docs/hardware.md#h200-sensors):

* **Power samples**: ``nvmlDeviceGetSamples(h, NVML_TOTAL_POWER_SAMPLES, last_us)``
  returns the driver's buffer of power samples, one every ~20 ms, each roughly the
  average of the preceding 10–20 ms, in mW with µs timestamps on the CPU realtime
  clock, ~2.4 s deep. It is the finest stream NVML offers, so
  :meth:`NVMLBackend.power_samples_since` drains it. Where the device does not support
  it, the backend falls back, for good and with one warning, to polling field
  ``NVML_FI_DEV_POWER_INSTANT`` (186, refreshed every ~100 ms, µs timestamp), and
  failing that to ``nvmlDeviceGetPowerUsage`` (a ~1 s average, stamped with the clock).
* **Energy counter**: ``nvmlDeviceGetTotalEnergyConsumption`` (mJ) refreshes every
  ~100 ms and one call costs 3.3–4.8 ms: call it from the sampler thread only.
* **Power limit**: ``nvmlDeviceGet/SetPowerManagementLimit`` and
  ``...LimitConstraints``, all in mW.

mW and mJ are converted to W and J here and nowhere else.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

from zeus_callbacks.backends._vendor import VendorBackend, VendorDevice, import_vendor_module, parse_visible_list
from zeus_callbacks.backends.base import BackendUnavailable, Clock, PowerSample

logger = logging.getLogger(__name__)

#: NVML reports power in milliwatts.
MW_PER_W = 1000.0
#: NVML reports energy in millijoules.
MJ_PER_J = 1000.0
#: NVML timestamps are microseconds since the epoch (CPU realtime clock).
US_PER_S = 1_000_000

#: ``NVML_FI_DEV_POWER_INSTANT``; older nvidia-ml-py releases lack the constant.
FIELD_POWER_INSTANT = 186
#: ``NVML_TOTAL_POWER_SAMPLES``.
TOTAL_POWER_SAMPLES = 0

CUDA_VISIBLE_DEVICES_ENV = "CUDA_VISIBLE_DEVICES"

PowerSource = Literal["samples", "field", "power_usage"]
_FALLBACK_ORDER: tuple[PowerSource, ...] = ("samples", "field", "power_usage")


@dataclass
class _DeviceState(VendorDevice):
    """Per-device state of the sensor stream; guarded by ``lock``."""

    power_source: PowerSource = "samples"
    last_field_us: int = -1
    last_energy_mJ: int | None = None
    constraints_W: tuple[float, float] | None = None


class NVMLBackend(VendorBackend[_DeviceState]):
    """Measure and cap NVIDIA GPUs through NVML.

    Device indices are the process's view after ``CUDA_VISIBLE_DEVICES`` (integers
    and ``GPU-<uuid>`` prefixes; CUDA's rule applies: the list ends at the first
    entry that names no device). Like CUDA's ``PCI_BUS_ID`` order, integers index
    NVML's enumeration; set ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` or use UUIDs so that
    CUDA and this backend agree. MIG is refused: NVML cannot attribute power or set a
    limit per MIG instance.

    Thread safety: NVML is thread-safe. Each device's sensor state (fallback source,
    last field timestamp, last counter value) has its own lock, held only around
    that state, so the training thread's power-limit calls never wait behind the
    sampler thread's slow energy-counter read.

    Sample timestamps are NVML's CPU-realtime µs timestamps converted to seconds,
    so ``clock`` should be a realtime clock (the default
    :class:`~zeus_callbacks.backends.base.WallClock`); it stamps only the last-resort
    ``nvmlDeviceGetPowerUsage`` readings.

    Args:
        clock: Time source for readings NVML does not stamp (default: wall clock).
        read_only: Refuse every setter; default from ``ZEUS_CALLBACKS_READ_ONLY``.
        nvml_module: A ``pynvml``-compatible module (tests inject a fake); default ``import pynvml``.

    Raises:
        BackendUnavailable: ``pynvml`` is missing, NVML cannot initialise, no GPU is
            visible, or a visible GPU is in MIG mode.

    Example::

        backend = NVMLBackend(read_only=True)
        e0 = backend.energy_counter_J(0)
        samples = backend.power_samples_since(0, since_s=0.0)
        backend.close()
    """

    name = "nvml"
    times_with_gpu_events = True
    vendor = "NVIDIA"
    _log = logger
    sample_period_s = 0.02
    # H200 step test (docs/hardware.md#sample-semantics): the first 20 ms sample after an idle->busy edge, 16 ms
    # later, is already ~90 % busy, so a sample covers roughly the preceding 20 ms with
    # only a few ms of lag.
    sensor_delay_s = 0.004
    # nvmlDeviceGetSamples keeps ~2.4 s of power samples on an H200 (docs/hardware.md): older ones are lost
    sample_history_s = 2.4
    # nvmlDeviceGetTotalEnergyConsumption counts mJ and changes every ~100 ms (docs/hardware.md).
    energy_counter_period_s = 0.1
    energy_counter_resolution_J = 1.0 / MJ_PER_J

    def __init__(
        self, *, clock: Clock | None = None, read_only: bool | None = None, nvml_module: ModuleType | Any | None = None
    ) -> None:
        super().__init__(clock=clock, read_only=read_only)
        self._nvml = nvml_module if nvml_module is not None else import_vendor_module("pynvml", "NVIDIA", _ADVICE)
        self._error_cls = self._nvml.NVMLError
        self._start(self._nvml.nvmlInit, self._nvml.nvmlShutdown, self._discover_devices)

    # -- discovery ---------------------------------------------------------------------
    def _discover_devices(self) -> list[_DeviceState]:
        nvml = self._nvml
        try:
            count = int(nvml.nvmlDeviceGetCount())
            handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            uuids = [_text(nvml.nvmlDeviceGetUUID(h)) for h in handles]
        except self._error_cls as exc:
            raise BackendUnavailable(f"NVIDIA backend unavailable: cannot enumerate GPUs ({exc})") from exc
        if count == 0:
            raise BackendUnavailable("NVIDIA backend unavailable: NVML reports no GPU")
        visible = _visible_nvml_indices(os.environ.get(CUDA_VISIBLE_DEVICES_ENV), uuids)
        if not visible:
            raise BackendUnavailable(
                f"NVIDIA backend unavailable: {CUDA_VISIBLE_DEVICES_ENV}="
                f"{os.environ.get(CUDA_VISIBLE_DEVICES_ENV)!r} leaves no GPU visible"
            )
        devices = []
        for process_index, nvml_index in enumerate(visible):
            handle = handles[nvml_index]
            try:
                name = _text(nvml.nvmlDeviceGetName(handle))
            except self._error_cls as exc:
                raise BackendUnavailable(
                    f"NVIDIA backend unavailable: cannot read the name of GPU {nvml_index} ({exc})"
                ) from exc
            if self._mig_enabled(handle):
                raise BackendUnavailable(
                    f"NVIDIA backend unavailable: GPU {process_index} (NVML index {nvml_index}, {name}, "
                    f"{uuids[nvml_index]}) is in MIG mode; NVML cannot measure or cap a MIG instance"
                )
            devices.append(_DeviceState(backend_index=nvml_index, handle=handle, name=name, uuid=uuids[nvml_index]))
        return devices

    def _mig_enabled(self, handle: Any) -> bool:
        get_mig_mode = getattr(self._nvml, "nvmlDeviceGetMigMode", None)
        if get_mig_mode is None:
            return False
        try:
            current, _pending = get_mig_mode(handle)
        except self._error_cls:
            return False  # NotSupported / FunctionNotFound: a GPU without MIG
        return current == getattr(self._nvml, "NVML_DEVICE_MIG_ENABLE", 1)

    # -- error translation ---------------------------------------------------------------
    def _error_kind(self, exc: BaseException) -> str | None:
        return next((kind for name, kind in _ERROR_KINDS if self._is(exc, name)), None)

    def _unsupported(self, exc: BaseException) -> bool:
        return self._is(exc, "NVMLError_NotSupported") or self._is(exc, "NVMLError_FunctionNotFound")

    def _is(self, exc: BaseException, class_name: str) -> bool:
        cls = getattr(self._nvml, class_name, None)
        return cls is not None and isinstance(exc, cls)

    # -- identity ----------------------------------------------------------------------
    def nvml_index(self, index: int) -> int:
        """Return NVML's index of the process's GPU ``index`` (after ``CUDA_VISIBLE_DEVICES``)."""
        return self._device(index).backend_index

    def power_source(self, index: int) -> PowerSource:
        """Return which NVML stream :meth:`power_samples_since` reads for GPU ``index``.

        One of ``"samples"`` (``nvmlDeviceGetSamples``, ~20 ms), ``"field"``
        (field 186, ~100 ms) or ``"power_usage"`` (~1 s average).
        """
        return self._device(index).power_source

    # -- sensors -----------------------------------------------------------------------
    def power_samples_since(self, index: int, since_s: float) -> list[PowerSample]:
        """Return GPU ``index``'s power samples (W) newer than ``since_s`` (CPU realtime clock), oldest first.

        Drains NVML's ~2.4 s buffer (see the module docstring): call at least once a second or
        samples are lost. Falls back to field 186, then to ``nvmlDeviceGetPowerUsage``, when a
        source is not supported (logged once per device).

        Raises:
            SensorError: The read failed; ``kind`` is ``"gpu_lost"``,
                ``"not_supported"`` (no source at all) or ``"unknown"``.
        """
        device = self._device(index)
        with device.lock:
            while True:
                source = device.power_source
                try:
                    if source == "samples":
                        return self._buffered_samples(device, since_s)
                    if source == "field":
                        return self._field_sample(device, since_s)
                    return self._power_usage_sample(device, since_s)
                except self._error_cls as exc:
                    if not self._unsupported(exc) or source == _FALLBACK_ORDER[-1]:
                        raise self._translate(exc, f"reading power ({source})", index, sensor=True) from exc
                    device.power_source = _FALLBACK_ORDER[_FALLBACK_ORDER.index(source) + 1]
                    logger.warning(
                        "nvml: GPU %d (%s) does not support power source %r; falling back to %r "
                        "for the rest of this run (coarser power readings)",
                        index,
                        device.name,
                        source,
                        device.power_source,
                    )

    def _buffered_samples(self, device: _DeviceState, since_s: float) -> list[PowerSample]:
        sampling_type = getattr(self._nvml, "NVML_TOTAL_POWER_SAMPLES", TOTAL_POWER_SAMPLES)
        last_seen_us = max(0, math.floor(since_s * US_PER_S)) if math.isfinite(since_s) else 0
        try:
            value_type, raw = self._nvml.nvmlDeviceGetSamples(device.handle, sampling_type, last_seen_us)
        except self._error_cls as exc:
            if self._is(exc, "NVMLError_NotFound"):
                return []  # no sample newer than last_seen_us yet
            raise
        samples = []
        for item in raw:
            timestamp_s = item.timeStamp / US_PER_S
            if timestamp_s > since_s:
                power_W = _union_value(self._nvml, value_type, item.sampleValue) / MW_PER_W
                samples.append(PowerSample(timestamp_s, power_W))
        samples.sort(key=lambda s: s.timestamp_s)
        return samples

    def _field_sample(self, device: _DeviceState, since_s: float) -> list[PowerSample]:
        field_id = getattr(self._nvml, "NVML_FI_DEV_POWER_INSTANT", FIELD_POWER_INSTANT)
        value = self._nvml.nvmlDeviceGetFieldValues(device.handle, [field_id])[0]
        if value.nvmlReturn != getattr(self._nvml, "NVML_SUCCESS", 0):
            raise self._error_cls(value.nvmlReturn)
        if value.timestamp <= device.last_field_us:
            return []  # the field has not refreshed since the last poll
        device.last_field_us = value.timestamp
        timestamp_s = value.timestamp / US_PER_S
        if timestamp_s <= since_s:
            return []
        return [PowerSample(timestamp_s, _union_value(self._nvml, value.valueType, value.value) / MW_PER_W)]

    def _power_usage_sample(self, device: _DeviceState, since_s: float) -> list[PowerSample]:
        power_W = self._nvml.nvmlDeviceGetPowerUsage(device.handle) / MW_PER_W
        now_s = self.clock.now_s()
        return [PowerSample(now_s, power_W)] if now_s > since_s else []

    def energy_counter_J(self, index: int) -> float:
        """Return GPU ``index``'s cumulative energy counter (J; only differences are meaningful).

        ``nvmlDeviceGetTotalEnergyConsumption`` costs 3–5 ms on an H200: call it from the sampler thread only.

        Raises:
            NotSupported: The GPU has no energy counter (pre-Volta).
            SensorError: The read failed (``kind="gpu_lost"`` / ``"unknown"``), or the
                counter went backwards since the last read (``kind="counter_backwards"``;
                the next read is measured from the new value).
        """
        device = self._device(index)
        with self._translated("reading the energy counter", index):
            energy_mJ = int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(device.handle))
        with device.lock:
            previous_mJ, device.last_energy_mJ = device.last_energy_mJ, energy_mJ
        if previous_mJ is not None and energy_mJ < previous_mJ:
            # No warning here: the sampler warns once per kind of fault.
            raise self._counter_backwards(index, f"{previous_mJ} mJ", f"{energy_mJ} mJ")
        return energy_mJ / MJ_PER_J

    # -- power limit -------------------------------------------------------------------
    def power_limit_constraints_W(self, index: int) -> tuple[float, float]:
        """Return the ``(min, max)`` power limit GPU ``index`` accepts (W), read once."""
        device = self._device(index)
        if device.constraints_W is None:
            with self._translated("reading the power limit constraints", index):
                low_mW, high_mW = self._nvml.nvmlDeviceGetPowerManagementLimitConstraints(device.handle)
            device.constraints_W = (low_mW / MW_PER_W, high_mW / MW_PER_W)
        return device.constraints_W

    def power_limit_W(self, index: int) -> float:
        """Return the power limit in force on GPU ``index`` (W)."""
        device = self._device(index)
        with self._translated("reading the power limit", index):
            return self._nvml.nvmlDeviceGetPowerManagementLimit(device.handle) / MW_PER_W

    def _set_power_limit_W(self, index: int, limit_W: float) -> None:
        device = self._device(index)
        limit_mW = int(round(limit_W * MW_PER_W))
        with self._translated(f"setting the power limit to {limit_W:.0f} W", index):
            self._nvml.nvmlDeviceSetPowerManagementLimit(device.handle, limit_mW)
        logger.info("nvml: GPU %d power limit set to %.0f W", index, limit_W)


# -- helpers -------------------------------------------------------------------------------
_ADVICE = "install nvidia-ml-py"
_ERROR_KINDS = (("NVMLError_NoPermission", "no_permission"), ("NVMLError_NotSupported", "not_supported"),
                ("NVMLError_GpuIsLost", "gpu_lost"), ("NVMLError_ResetRequired", "gpu_lost"))  # fmt: skip


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


_UNION_MEMBER = {
    "NVML_VALUE_TYPE_DOUBLE": "dVal",
    "NVML_VALUE_TYPE_UNSIGNED_INT": "uiVal",
    "NVML_VALUE_TYPE_UNSIGNED_LONG": "ulVal",
    "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG": "ullVal",
    "NVML_VALUE_TYPE_SIGNED_LONG_LONG": "sllVal",
    "NVML_VALUE_TYPE_SIGNED_INT": "siVal",
}


def _union_value(nvml: Any, value_type: int, union: Any) -> float:
    """Read the member of NVML's value union that ``value_type`` names (default ``uiVal``)."""
    member = next((m for constant, m in _UNION_MEMBER.items() if getattr(nvml, constant, None) == value_type), "uiVal")
    return float(getattr(union, member))


def _visible_nvml_indices(spec: str | None, uuids: list[str]) -> list[int]:
    """Map ``CUDA_VISIBLE_DEVICES`` (None: every GPU) to NVML indices, as CUDA parses it.

    ``uuids`` holds ``GPU-<uuid>`` of each NVML index. Like CUDA, the list stops at the first
    entry that names no device (out of range, unknown or ambiguous UUID prefix, duplicate), with a warning.

    Raises:
        BackendUnavailable: An entry names a MIG instance (``MIG-...``).
    """

    def stop(token: str) -> None:
        logger.warning(
            "nvml: %s entry %r names no (new) GPU; like CUDA, ignoring it and every later entry",
            CUDA_VISIBLE_DEVICES_ENV,
            token,
        )

    return parse_visible_list(spec, list(range(len(uuids))), lambda token: _resolve_device_token(token, uuids), stop)


def _resolve_device_token(token: str, uuids: list[str]) -> int | None:
    """Return the NVML index that ``token`` names, or None.

    An entry names a GPU by its NVML index or by a ``GPU-<uuid>`` prefix (case-insensitive) that
    matches exactly one of ``uuids``.

    Raises:
        BackendUnavailable: The entry names a MIG instance (``MIG-...``).
    """
    if token.upper().startswith("MIG-"):
        raise BackendUnavailable(
            f"NVIDIA backend unavailable: {CUDA_VISIBLE_DEVICES_ENV} names MIG instance {token!r}; "
            "NVML cannot measure or cap a MIG instance"
        )
    try:
        number = int(token)
    except ValueError:
        pass
    else:
        return number if 0 <= number < len(uuids) else None
    if not token.upper().startswith("GPU-") or len(token) <= len("GPU-"):
        return None
    matches = [i for i, u in enumerate(uuids) if u.lower().startswith(token.lower())]
    return matches[0] if len(matches) == 1 else None
