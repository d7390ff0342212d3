"""Machinery shared by the vendor-library backends (NVML, amdsmi).

:class:`VendorBackend` holds what does not depend on the vendor: starting and shutting down
the library, the device-index checks, warn-once logging and the translation of the vendor's
exceptions into the :mod:`zeus_callbacks.backends.base` hierarchy.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Generic, TypeVar

from zeus_callbacks.backends.base import (
    BackendError,
    BackendUnavailable,
    Clock,
    DeviceIdentity,
    GPUBackend,
    NotSupported,
    PermissionDenied,
    SensorError,
)


@dataclass
class VendorDevice:
    """What discovery reads of one visible device; vendors subclass it to add their sensor state.

    Attributes:
        backend_index: The library's own index of the device (not remapped by ``*_VISIBLE_DEVICES``).
        handle: The library's device handle.
        name: Model name.
        uuid: The library's device UUID; None where it could not be read.
        lock: Guards the subclass's sensor state.
    """

    backend_index: int
    handle: Any
    name: str
    uuid: str | None
    lock: threading.Lock = field(default_factory=threading.Lock)


DeviceT = TypeVar("DeviceT", bound=VendorDevice)


class VendorBackend(GPUBackend, Generic[DeviceT]):
    """A :class:`GPUBackend` over a vendor library, with per-device state ``DeviceT``.

    Subclasses set :attr:`vendor`, ``_log`` and ``_error_cls`` (the vendor's base exception
    class), call :meth:`_start` from ``__init__``, and implement :meth:`_error_kind`.
    Messages are prefixed with the backend's :attr:`name`. Every per-device call raises
    :class:`BackendError` once the backend is closed and ``IndexError`` for an index out of range;
    a vendor call that fails raises what :meth:`_translate` makes of its error (power-limit calls:
    :class:`NotSupported` on a GPU without power management, :class:`SensorError` when a read fails).

    Thread safety: :meth:`close` and :meth:`_warn_once` each take their own lock;
    device state is the subclass's to guard.

    Args:
        clock: Time source for readings the library does not stamp (default: wall clock).
        read_only: Refuse every setter; default from ``ZEUS_CALLBACKS_READ_ONLY``.
    """

    #: Vendor name in :class:`BackendUnavailable` messages (``"NVIDIA"``, ``"AMD"``).
    vendor: str = "vendor"
    #: Logger of the subclass's module, so warnings keep their source.
    _log: logging.Logger = logging.getLogger(__name__)
    _error_cls: type[BaseException] = Exception
    _devices: list[DeviceT]

    def __init__(self, *, clock: Clock | None = None, read_only: bool | None = None) -> None:
        super().__init__(clock=clock, read_only=read_only)
        self._closed = False
        self._close_lock = threading.Lock()
        self._warned: set[tuple[str, int]] = set()
        self._warned_lock = threading.Lock()

    def _start(
        self, init: Callable[[], object], shutdown: Callable[[], object], discover: Callable[[], list[DeviceT]]
    ) -> None:
        """Run the library's ``init``, then ``discover`` the visible devices (``shutdown`` if that fails).

        Raises:
            BackendUnavailable: ``init`` raised the vendor's error (chained), or
                ``discover`` raised it.
        """
        self._shutdown_call = shutdown
        try:
            init()
        except self._error_cls as exc:
            init_name = getattr(init, "__name__", "init")
            raise BackendUnavailable(f"{self.vendor} backend unavailable: {init_name} failed ({exc})") from exc
        try:
            self._devices = discover()
        except BaseException:
            self._shutdown()
            raise

    def _shutdown(self) -> None:
        """Shut the vendor library down; its error is logged at debug level, never raised."""
        try:
            self._shutdown_call()
        except self._error_cls as exc:
            self._log.debug("%s: %s failed: %s", self.name, getattr(self._shutdown_call, "__name__", "shutdown"), exc)

    # -- error translation ---------------------------------------------------------------
    @abc.abstractmethod
    def _error_kind(self, exc: BaseException) -> str | None:
        """Classify vendor error ``exc``: ``"no_permission"``, ``"not_supported"``, ``"gpu_lost"`` or None."""

    def _translate(self, exc: BaseException, what: str, index: int, *, sensor: bool) -> BackendError:
        """The error for vendor error ``exc`` while doing ``what`` on GPU ``index``; the caller raises it ``from exc``.

        An unsupported call is :class:`NotSupported`, or ``SensorError(kind="not_supported")`` when
        ``sensor`` (a failed reading rather than a missing feature); an unclassified error is
        ``SensorError(kind="unknown")``.
        """
        message = f"{self.name}: {what} failed on GPU {index}: {exc}"
        kind = self._error_kind(exc)
        if kind == "no_permission":
            return PermissionDenied(message + " (run as root, or ask an administrator)")
        if kind == "not_supported" and not sensor:
            return NotSupported(message)
        return SensorError(message, kind=kind or "unknown")

    # -- shared machinery --------------------------------------------------------------
    @contextlib.contextmanager
    def _translated(self, what: str, index: int, *, sensor: bool = False) -> Iterator[None]:
        """Translate the vendor's errors raised inside the block, chained with ``from exc``.

        Raises:
            BackendError: What :meth:`_translate` makes of the vendor's error.
        """
        try:
            yield
        except self._error_cls as exc:
            raise self._translate(exc, what, index, sensor=sensor) from exc

    def _device(self, index: int) -> DeviceT:
        """Return the state of GPU ``index`` (process view), checking as the class docstring says."""
        if self._closed:
            raise BackendError(f"{self.name}: the backend is closed")
        if not 0 <= index < len(self._devices):
            raise IndexError(f"{self.name}: GPU index {index} is out of range (0..{len(self._devices) - 1})")
        return self._devices[index]

    def _counter_backwards(self, index: int, before: str, after: str) -> SensorError:
        """The error for GPU ``index``'s energy counter going from ``before`` to a lower ``after``."""
        return SensorError(
            f"{self.name}: GPU {index} energy counter went backwards ({before} -> {after})", kind="counter_backwards"
        )

    def _warn_once(self, kind: str, index: int, message: str, *args: object) -> None:
        """Log ``message % args`` as a warning the first time ``(kind, index)`` occurs."""
        with self._warned_lock:
            if (kind, index) in self._warned:
                return
            self._warned.add((kind, index))
        self._log.warning(message, *args)

    # -- identity and lifecycle ----------------------------------------------------------
    def device_count(self) -> int:
        """Return how many GPUs are visible to this process."""
        return len(self._devices)

    def device_name(self, index: int) -> str:
        """Return the model name of GPU ``index`` (e.g. ``"NVIDIA H200"``, ``"AMD Instinct MI300X"``)."""
        return self._device(index).name

    def device_uuid(self, index: int) -> str | None:
        """Return the library's UUID of GPU ``index`` (``GPU-<uuid>`` on NVIDIA), None if it could not say."""
        return self._device(index).uuid

    def device_identity(self, index: int) -> DeviceIdentity:
        """Return GPU ``index``'s library index and UUID, as read at discovery (no library call)."""
        device = self._device(index)
        note = None if device.uuid is not None else f"{self.name} could not read the device's UUID (see the warning)"
        return DeviceIdentity(
            index=index, backend_index=device.backend_index, uuid=device.uuid, name=device.name, note=note
        )

    def close(self) -> None:
        """Shut the vendor library down (once); later calls on this backend raise :class:`BackendError`."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._shutdown()


def parse_visible_list(
    spec: str | None, default: list[int], resolve: Callable[[str], int | None], on_stop: Callable[[str], object]
) -> list[int]:
    """Walk a comma-separated ``*_VISIBLE_DEVICES`` value ``spec`` (None: unset, ``default``) as CUDA and HIP do.

    Each stripped entry goes through ``resolve`` (the library index it names, or None; it may raise
    to refuse one outright). The list ends at the first entry that names no device or one already
    selected; ``on_stop`` is called with it (to log it) unless it is empty.

    Returns:
        Library indices in the process's order (possibly empty).
    """
    if spec is None:
        return default
    selected: list[int] = []
    for raw in spec.split(","):
        token = raw.strip()
        found = resolve(token)
        if found is None or found in selected:
            if token:
                on_stop(token)
            break
        selected.append(found)
    return selected


def import_vendor_module(name: str, vendor: str, advice: str) -> ModuleType:
    """Import the vendor's Python module ``name``.

    Raises:
        BackendUnavailable: The import failed (``ImportError``, or ``OSError`` from a missing
            shared library); ``advice`` ends the message (e.g. which package to install).
    """
    try:
        module: ModuleType = __import__(name)  # through builtins.__import__, which tests replace
    except (ImportError, OSError) as exc:
        raise BackendUnavailable(f"{vendor} backend unavailable: cannot import {name} ({exc}); {advice}") from exc
    return module
