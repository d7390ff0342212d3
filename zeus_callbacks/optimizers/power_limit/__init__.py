"""Just-in-time power-limit profiling (Zeus, NSDI '23, §4.3), with a cheaper search.

The package reads top-down:

- :mod:`.objective`: what a limit is chosen for (energy, time, ZeusCost, max_slowdown).
- :mod:`.window`: a limit's window of measured steps and its Student-t interval.
- :mod:`.search`: the candidate grid from the device's range and which limit to measure next
  (ends first, a noise-aware golden-section search, shape checks, refinement off the grid).
- :mod:`.profiler`: :class:`PowerLimitProfiler`, the framework- and hardware-free state machine
  (its states and transitions are documented there).
- :mod:`.cache`: profiles kept between runs.
- :mod:`.owner`: who owns a marker or a GPU lock (PID, start time, boot id, host) and whether it is alive.
- :mod:`.gpu_lock`: the per-GPU profiling lock (by UUID) and its record of the original limit.
- :mod:`.marker`: the restore marker (original limits by GPU UUID, written before the first change)
  and the restore protocol.
- :mod:`.controller`: :class:`PowerLimitController`, which applies the profiler's limits to a backend.

The ``zeus-callbacks restore`` command is in :mod:`zeus_callbacks.cli.restore`, the profile plot in
:mod:`zeus_callbacks.plots`.
"""

from zeus_callbacks.errors import NotAMarker
from zeus_callbacks.optimizers.power_limit.cache import CACHE_NAME, JsonProfileCache, ProfileCache, ProfileKey
from zeus_callbacks.optimizers.power_limit.controller import PowerLimitController, PowerLimitResult
from zeus_callbacks.optimizers.power_limit.gpu_lock import GpuLock
from zeus_callbacks.optimizers.power_limit.marker import (
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
from zeus_callbacks.optimizers.power_limit.objective import Objective, ObjectiveName
from zeus_callbacks.optimizers.power_limit.owner import Owner
from zeus_callbacks.optimizers.power_limit.profiler import (
    EnergyFn,
    Phase,
    PowerLimitProfiler,
    ProfilerState,
    ProfileSettings,
)
from zeus_callbacks.optimizers.power_limit.search import (
    Measured,
    SearchPlan,
    SearchSettings,
    is_unimodal,
    power_limit_grid_W,
)
from zeus_callbacks.optimizers.power_limit.window import LimitProfile, t_interval, t_quantile_975

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
    "Phase",
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
