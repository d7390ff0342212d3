"""GPU backends (NVIDIA via pynvml, AMD via amdsmi, a trace-driven virtual GPU) and their selection."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from zeus_callbacks.backends._detect import GPUPresence, detect_gpus
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

logger = logging.getLogger(__name__)

__all__ = [
    "BackendError",
    "BackendUnavailable",
    "Clock",
    "GPUBackend",
    "GPUPresence",
    "ManualClock",
    "NotSupported",
    "PermissionDenied",
    "PowerSample",
    "ReadOnlyError",
    "SensorError",
    "WallClock",
    "detect_gpus",
    "get_backend",
    "read_only_from_env",
]


VirtualSettings = Callable[[], Mapping[str, Any]]
"""Returns the virtual GPU's keyword arguments; called only when the virtual GPU is opened (it may read a trace)."""


def _virtual(settings: VirtualSettings | None, clock: Clock | None, read_only: bool | None) -> GPUBackend:
    from zeus_callbacks.backends.virtual import VirtualGPUBackend

    kwargs = settings() if settings is not None else {}  # none: the backend's defaults (the config's too)
    return VirtualGPUBackend(**kwargs, clock=clock, read_only=read_only)


def _open_vendor(name: str, read_only: bool | None) -> GPUBackend:
    if name == "nvml":
        from zeus_callbacks.backends._nvml import NVMLBackend

        return NVMLBackend(read_only=read_only)
    from zeus_callbacks.backends._amdsmi import AMDSMIBackend

    return AMDSMIBackend(read_only=read_only)


RUN_MARKS = "run_start, run_end, the summary and the logged metrics"
"""What says a run's figures are SIMULATED, named when ``auto`` falls back to the virtual GPU."""


def get_backend(
    name: str = "auto",
    *,
    virtual: VirtualSettings | None = None,
    clock: Clock | None = None,
    read_only: bool | None = None,
    detect: Callable[[], GPUPresence] | None = None,
    announce: bool = True,
    marked_in: str = RUN_MARKS,
) -> GPUBackend:
    """Open a GPU backend by name.

    ``auto`` tries NVIDIA (pynvml), then AMD (amdsmi). When neither opens it looks for
    a GPU without them (``_detect``: device nodes, CUDA devices): where there is none it
    falls back to the virtual GPU (simulated energy, said so in every record); where a
    GPU is present but cannot be measured it returns an
    :class:`~zeus_callbacks.backends._unavailable.UnavailableBackend` (every energy figure
    null). Either way it logs one warning naming the cause and the fix (with ``announce``; else at
    INFO: under several processes one of them says it, not every rank).

    Args:
        name: ``"auto"``, ``"nvml"``, ``"amdsmi"`` or ``"virtual"``.
        virtual: Returns the virtual GPU's keyword arguments
            (:class:`~zeus_callbacks.backends.virtual.VirtualGPUBackend`), e.g. a
            ``VirtualGPUConfig``'s ``backend_kwargs``; called only if the virtual GPU is opened.
            None: its defaults.
        clock: Clock for the virtual GPU (real backends use the CPU realtime clock).
        read_only: Force read-only mode; default from ``ZEUS_CALLBACKS_READ_ONLY``.
        detect: Finds GPUs without the vendor libraries; default :func:`detect_gpus` (looked up
            at the call, so a test may replace ``zeus_callbacks.backends.detect_gpus``).
        announce: Warn when ``auto`` falls back (True: this process speaks for the job, e.g. rank 0);
            False logs the same message at INFO, so a 2-process job does not print it twice.
        marked_in: What marks the figures SIMULATED, for that warning: a run's records by default
            (:data:`RUN_MARKS`); a command without run records names its own (``profile-kernel``: its
            summary and JSON).

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

    reasons: dict[str, str] = {}
    for candidate in ("nvml", "amdsmi"):
        try:
            backend = _open_vendor(candidate, read_only)
        except BackendUnavailable as exc:
            reasons[candidate] = str(exc)
            continue
        logger.info("zeus-callbacks: using the %s backend (%s)", candidate, backend.describe())
        return backend
    presence = (detect or globals()["detect_gpus"])()
    level = logging.WARNING if announce else logging.INFO  # the fallback is said once per job, not per rank
    if presence.any_gpu:
        from zeus_callbacks.backends._unavailable import UnavailableBackend

        # The cause is the library of the GPU found: NVML for NVIDIA nodes / CUDA devices, amdsmi for /dev/kfd.
        relevant = [
            reasons[n]
            for n, found in (("nvml", presence.nvidia_nodes or presence.cuda_devices), ("amdsmi", presence.amd_kfd))
            if found
        ]
        cause = "; ".join(relevant or reasons.values())
        fix = _unmeasurable_fix(cause)
        logger.log(
            level,
            "zeus-callbacks: a GPU is present (%s) but cannot be measured: %s. Training continues; every "
            "energy figure of this run is null (measurement unavailable). Fix: %s",
            presence.describe(),
            cause,
            fix,
        )
        return UnavailableBackend(presence, cause, fix)
    backend = _virtual(virtual, clock, read_only)
    logger.log(
        level,
        "zeus-callbacks: no GPU on this machine (no /dev/nvidia* node, no CUDA device, no /dev/kfd), using the "
        "virtual GPU (%s). Energy figures are SIMULATED from the Zeus traces; %s say so. [%s]",
        backend.describe(),
        marked_in,
        "; ".join(f"{n}: {r}" for n, r in reasons.items()),
    )
    return backend


def _unmeasurable_fix(cause: str) -> str:
    """One sentence for the warning: what to do about a GPU the backends tried could not measure (``cause``)."""
    text = cause.lower()
    if "mig" in text:
        return (
            "NVML cannot measure a MIG instance: train on a full GPU (MIG disabled) to measure energy, "
            "or set backend: virtual for simulated figures"
        )
    if "permission" in text:  # no_permission, NoPermission too
        return "give this process access to the GPU's management interface (/dev/nvidiactl, /dev/kfd), or run as root"
    if "cannot import" in text:
        return "install the vendor library (pip install nvidia-ml-py for NVIDIA, ROCm's amdsmi for AMD)"
    return (
        "check that the GPU driver is loaded and matches the library (nvidia-smi / amd-smi should work), "
        "or set backend: virtual for simulated figures"
    )
