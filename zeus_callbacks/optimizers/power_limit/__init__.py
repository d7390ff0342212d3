"""Just-in-time power-limit profiling (Zeus, NSDI '23, §4.3), with a cheaper search.

The package reads top-down:

- :mod:`._objective`: what a limit is chosen for (energy, time, ZeusCost, max_slowdown).
- :mod:`._limit_profile`: a limit's window of measured steps and its Student-t interval.
- :mod:`._search`: the candidate grid from the device's range and which limit to measure next
  (ends first, a noise-aware golden-section search, shape checks, refinement off the grid).
- :mod:`._limit_profiler`: :class:`PowerLimitProfiler`, the framework- and hardware-free state machine
  (its states and transitions are documented there).
- :mod:`._cache`: profiles kept between runs.
- :mod:`._owner`: who owns a marker or a GPU lock (PID, start time, boot id, host) and whether it is alive.
- :mod:`._gpu_lock`: the per-GPU profiling lock (by UUID) and its record of the original limit.
- :mod:`._marker`: the restore marker (original limits by GPU UUID, written before the first change)
  and the restore protocol.
- :mod:`._controller`: :class:`PowerLimitController`, which applies the profiler's limits to a backend.

The ``zeus-callbacks restore`` command is in :mod:`zeus_callbacks.cli._cmd_restore`, the profile plot in
:mod:`zeus_callbacks._plots`.
"""

from zeus_callbacks.errors import NotAMarker
from zeus_callbacks.optimizers.power_limit._cache import CACHE_NAME, JsonProfileCache, ProfileCache, ProfileKey
from zeus_callbacks.optimizers.power_limit._gpu_lock import GpuLock
from zeus_callbacks.optimizers.power_limit._limit_profile import LimitProfile, t_interval, t_quantile_975
from zeus_callbacks.optimizers.power_limit._limit_profiler import (
    EnergyFn,
    PowerLimitProfiler,
    ProfilerPhase,
    ProfilerState,
    ProfileSettings,
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
from zeus_callbacks.optimizers.power_limit._objective import Objective, ObjectiveName
from zeus_callbacks.optimizers.power_limit._owner import Owner
from zeus_callbacks.optimizers.power_limit._power_limit_controller import PowerLimitController, PowerLimitResult
from zeus_callbacks.optimizers.power_limit._search import (
    Measured,
    SearchPlan,
    SearchSettings,
    is_unimodal,
    power_limit_grid_W,
)

__all__ = [
    "CACHE_NAME",
    "EnergyFn",
    "GpuLock",
    "GpuRestore",
    "JsonProfileCache",
    "LimitProfile",
    "MARKER_NAME",
    "MarkerGpu",
    "Measured",
    "NotAMarker",
    "Objective",
    "ObjectiveName",
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
    "SearchPlan",
    "SearchSettings",
    "is_unimodal",
    "marker_path",
    "marker_paths",
    "power_limit_grid_W",
    "read_marker",
    "restore_from_marker",
    "t_interval",
    "t_quantile_975",
    "write_marker",
]
