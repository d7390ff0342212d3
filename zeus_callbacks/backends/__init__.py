"""GPU backends (NVIDIA via pynvml, AMD via amdsmi, a trace-driven virtual GPU) and their selection."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from zeus_callbacks.backends.base import (
    BackendError,
    BackendUnavailable,
    Clock,
    GPUBackend,
    ManualClock,
    NotSupported,
    PermissionDenied,
    PowerSample,
    ReadOnlyError,
    SensorError,
    WallClock,
    read_only_from_env,
)

if TYPE_CHECKING:
    from zeus_callbacks.config import VirtualGPUConfig

logger = logging.getLogger(__name__)

__all__ = [
    "BackendError",
    "BackendUnavailable",
    "Clock",
    "GPUBackend",
    "ManualClock",
    "NotSupported",
    "PermissionDenied",
    "PowerSample",
    "ReadOnlyError",
    "SensorError",
    "WallClock",
    "get_backend",
    "read_only_from_env",
]


def _virtual(config: VirtualGPUConfig | None, clock: Clock | None, read_only: bool | None) -> GPUBackend:
    from zeus_callbacks.backends.virtual import VirtualGPUBackend
    from zeus_callbacks.config import VirtualGPUConfig

    cfg = config if config is not None else VirtualGPUConfig()
    return VirtualGPUBackend(**cfg.backend_kwargs(), clock=clock, read_only=read_only)


def _open_vendor(name: str, read_only: bool | None) -> GPUBackend:
    if name == "nvml":
        from zeus_callbacks.backends.nvml import NVMLBackend

        return NVMLBackend(read_only=read_only)
    from zeus_callbacks.backends.amdsmi import AMDSMIBackend

    return AMDSMIBackend(read_only=read_only)


def get_backend(
    name: str = "auto",
    *,
    virtual: VirtualGPUConfig | None = None,
    clock: Clock | None = None,
    read_only: bool | None = None,
) -> GPUBackend:
    """Open a GPU backend by name.

    ``auto`` tries NVIDIA (pynvml), then AMD (amdsmi), then falls back to the virtual
    GPU, and logs one line saying which it chose and why.

    Args:
        name: ``"auto"``, ``"nvml"``, ``"amdsmi"`` or ``"virtual"``.
        virtual: Settings of the virtual GPU.
        clock: Clock for the virtual GPU (real backends use the CPU realtime clock).
        read_only: Force read-only mode; default from ``ZEUS_CALLBACKS_READ_ONLY``.

    Returns:
        An open backend; the caller closes it.

    Raises:
        BackendUnavailable: A named backend (not ``auto``) cannot be opened here.
        ValueError: ``name`` is not a known backend.
    """
    if name in ("nvml", "amdsmi"):
        try:
            return _open_vendor(name, read_only)
        except BackendUnavailable as exc:
            raise BackendUnavailable(
                f"{exc} (the configuration asks for backend: {name}; use backend: auto to fall back to "
                "the virtual GPU where there is no such GPU)"
            ) from None
    if name == "virtual":
        return _virtual(virtual, clock, read_only)
    if name != "auto":
        raise ValueError(f"unknown backend {name!r}; choose auto, nvml, amdsmi or virtual")

    reasons = []
    for candidate in ("nvml", "amdsmi"):
        try:
            backend = _open_vendor(candidate, read_only)
        except BackendUnavailable as exc:
            reasons.append(f"{candidate}: {exc}")
            continue
        logger.info("zeus-callbacks: using the %s backend (%s)", candidate, backend.describe())
        return backend
    backend = _virtual(virtual, clock, read_only)
    logger.warning(
        "zeus-callbacks: no NVIDIA or AMD GPU found, using the virtual GPU (%s). Energy figures are "
        "simulated from the Zeus traces. [%s]",
        backend.describe(),
        "; ".join(reasons),
    )
    return backend
