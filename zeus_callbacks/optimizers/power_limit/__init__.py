"""Just-in-time power-limit profiling (Zeus, NSDI '23, §4.3), with a cheaper search.

- :mod:`._limit_profiler`: :class:`PowerLimitProfiler`, the framework- and hardware-free state machine,
  with what a limit is chosen for (:mod:`._objective`), a limit's window (:mod:`._limit_profile`) and
  which limit to measure next (:mod:`._search`).
- :mod:`._power_limit_controller`: :class:`PowerLimitController`, which applies the profiler's limits to a
  backend, with the profile cache (:mod:`._cache`).
- The restore protocol: who owns a marker or a GPU lock (:mod:`._owner`), the per-GPU profiling lock
  (:mod:`._gpu_lock`) and the restore marker (:mod:`._marker`).
"""

from zeus_callbacks.errors import NotAMarker
from zeus_callbacks.optimizers.power_limit._cache import CACHE_NAME, JsonProfileCache, ProfileCache, ProfileKey
from zeus_callbacks.optimizers.power_limit._gpu_lock import GpuLock
from zeus_callbacks.optimizers.power_limit._limit_profile import LimitProfile
from zeus_callbacks.optimizers.power_limit._limit_profiler import (
    PowerLimitProfiler,
    ProfilerPhase,
    ProfilerState,
    ProfileSettings,
    check_profile_state,
)
from zeus_callbacks.optimizers.power_limit._marker import (
    MARKER_NAME,
    GpuRestore,
    MarkerGpu,
    RestoreMarker,
    RestoreOutcome,
    marker_path,
    marker_paths,
    read_marker,
    restore_from_marker,
    write_marker,
)
from zeus_callbacks.optimizers.power_limit._objective import Objective
from zeus_callbacks.optimizers.power_limit._owner import Owner
from zeus_callbacks.optimizers.power_limit._power_limit_controller import (
    PowerLimitController,
    PowerLimitResult,
    limits_measured_text,
)
from zeus_callbacks.optimizers.power_limit._search import is_unimodal, power_limit_grid_W

__all__ = [
    "CACHE_NAME",
    "GpuLock",
    "GpuRestore",
    "JsonProfileCache",
    "LimitProfile",
    "MARKER_NAME",
    "MarkerGpu",
    "NotAMarker",
    "Objective",
    "Owner",
    "ProfilerPhase",
    "PowerLimitController",
    "PowerLimitProfiler",
    "PowerLimitResult",
    "ProfileCache",
    "ProfileKey",
    "ProfileSettings",
    "ProfilerState",
    "RestoreMarker",
    "RestoreOutcome",
    "check_profile_state",
    "is_unimodal",
    "limits_measured_text",
    "marker_path",
    "marker_paths",
    "power_limit_grid_W",
    "read_marker",
    "restore_from_marker",
    "write_marker",
]
