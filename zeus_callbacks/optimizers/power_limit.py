"""Just-in-time power-limit profiling (Zeus, NSDI '23, §4.3), with a cheaper search.

Two layers:

- :class:`PowerLimitProfiler`: a framework- and hardware-free state machine fed with
  step boundaries and an energy function. It decides which limit each step should run
  at and, at the end, the limit that minimises the :class:`Objective`.
- :class:`PowerLimitController`: applies the profiler's limits to every measured GPU of
  a backend, writes the restore marker *before* the first change, restores the original
  limits on every exit path (end, exception, SIGTERM, next start after SIGKILL), falls
  back to observe mode when limits cannot be changed, and consults a :class:`ProfileCache`.

State machine of :class:`PowerLimitProfiler` (each transition happens at a step boundary)::

    IDLE ──first step_start──> WARMUP(limit) ──warm-up done (step_end)──> PROFILING(limit)
      │                          ▲   (warmup_steps = 0 and warmup_s = 0: straight to PROFILING)
      │                          └────── window decided, the search picks another limit ──┐
      │                                                                                    │
      │   PROFILING(limit) ──window decided (step_end)──> WARMUP(next) ────────────────────┘
      │                     └──────────────────────────> DONE(best)     (search finished)
      │                     └──────────────────────────> OBSERVE        (observe mode: only
      │                                                                  the current limit)
      └──cache hit──> DONE(cached)

A limit's window spans steps, not epochs: epoch boundaries are invisible to the
profiler, so epochs shorter than a window never restart it. A step during which an
evaluation ran is dropped, and evaluation time never counts towards ``warmup_s`` or
``profile_s``. A window is decided once its per-step energies are resolved (power
samples cover the step's end; steps keep running at the same limit meanwhile and are
measured too) and either its 95 % confidence interval is narrow (``rel_ci``), it
separates from the best limit so far, or it reached ``profile_steps``/``profile_s``.

Search (``search: unimodal``): the maximum limit first (the time reference of
``max_slowdown``), then a discrete golden-section search over the 25 W grid, reusing
every measured limit; once the bracket closes, the measured costs are checked for
unimodality (within the noise tolerance) and, if they are not, every remaining limit
is measured, i.e. the full sweep (``search: sweep`` does that from the start).
"""

from __future__ import annotations

import enum
import json
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple, Protocol

from zeus_callbacks.backends.base import BackendError, GPUBackend, PermissionDenied
from zeus_callbacks.distributed import launcher_world_size
from zeus_callbacks.errors import NotAMarker
from zeus_callbacks.optimizers.cost import ZeusCost
from zeus_callbacks.signals import ChainedSigterm

logger = logging.getLogger(__name__)

ObjectiveName = Literal["energy", "time", "zeus_cost", "max_slowdown"]
EnergyFn = Callable[[float, float], "float | None"]
"""``energy_fn(start_s, end_s)``: energy (J, summed over GPUs) in the interval, or None
while the power samples do not cover it yet."""

_Z95 = 1.96
_INFEASIBLE = 1e12  # cost scale of a limit slower than max_slowdown allows (keeps the curve unimodal)


# ----------------------------------------------------------------------- objective
@dataclass(frozen=True)
class Objective:
    """What the profiler minimises over per-step energy ``E`` (J) and time ``T`` (s).

    Args:
        name: ``energy`` (E), ``time`` (T), ``zeus_cost`` (``eta·E + (1−eta)·MaxPower·T``,
            Zeus NSDI '23 eq. 2) or ``max_slowdown`` (lowest E whose T ≤ factor × T at the
            maximum limit, Zeus §4).
        eta_knob: Energy weight of ``zeus_cost``, in [0, 1].
        max_slowdown: Slowdown factor of ``max_slowdown``, ≥ 1.
        max_power_W: MaxPower of ``zeus_cost``: per-GPU maximum limit × number of GPUs.

    Raises:
        ValueError: A knob is out of range.
    """

    name: ObjectiveName = "zeus_cost"
    eta_knob: float = 0.5
    max_slowdown: float = 1.1
    max_power_W: float = 1.0

    def __post_init__(self) -> None:
        if self.name not in ("energy", "time", "zeus_cost", "max_slowdown"):
            raise ValueError(f"unknown objective {self.name!r}")
        if self.max_slowdown < 1.0:
            raise ValueError(f"max_slowdown must be ≥ 1, got {self.max_slowdown}")
        ZeusCost(self.eta_knob, self.max_power_W)  # validates both

    def key(self) -> str:
        """A string naming the objective and its knob (part of the cache key)."""
        if self.name == "zeus_cost":
            return f"zeus_cost(eta={self.eta_knob:g})"
        if self.name == "max_slowdown":
            return f"max_slowdown({self.max_slowdown:g})"
        return self.name

    def step_value(self, energy_J: float, time_s: float) -> float:
        """The per-step quantity whose confidence interval decides a window."""
        if self.name == "time":
            return time_s
        if self.name == "zeus_cost":
            return ZeusCost(self.eta_knob, self.max_power_W)(energy_J, time_s)
        return energy_J

    def cost(self, energy_J: float, time_s: float, reference_time_s: float | None) -> float:
        """Cost of a limit measured at ``energy_J``/``time_s`` per step (lower is better).

        Args:
            energy_J: Energy per step (J), summed over GPUs.
            time_s: Time per step (s), of the slowest GPU.
            reference_time_s: Time per step at the maximum limit (``max_slowdown`` only).
        """
        if self.name != "max_slowdown":
            return self.step_value(energy_J, time_s)
        if reference_time_s is None or time_s <= self.max_slowdown * reference_time_s:
            return energy_J
        return _INFEASIBLE * (1.0 + time_s / reference_time_s) + energy_J


def power_limit_grid_W(min_W: float, max_W: float, step_W: float = 25.0) -> list[float]:
    """Limits to profile, from ``max_W`` down in ``step_W`` steps, ``min_W`` included; shape (n,), W."""
    if step_W <= 0 or min_W > max_W:
        raise ValueError(f"bad grid: [{min_W}, {max_W}] W by {step_W} W")
    grid = []
    limit = max_W
    while limit > min_W + 1e-6:
        grid.append(round(limit, 3))
        limit -= step_W
    grid.append(round(min_W, 3))
    return grid


# ------------------------------------------------------------------- measurements
@dataclass
class LimitProfile:
    """Measurements of one power limit: per-step energy (J) and time (s) of its window."""

    limit_W: float
    energy_J: list[float] = field(default_factory=list)
    time_s: list[float] = field(default_factory=list)
    steps: int = 0  # steps spent at this limit (warm-up and profile)

    @property
    def n(self) -> int:
        """Resolved profiled steps."""
        return len(self.energy_J)

    @property
    def energy_per_step_J(self) -> float:
        """Mean energy per step (J)."""
        return sum(self.energy_J) / self.n if self.n else math.nan

    @property
    def time_per_step_s(self) -> float:
        """Mean time per step (s)."""
        return sum(self.time_s) / self.n if self.n else math.nan

    def interval(self, objective: Objective) -> tuple[float, float]:
        """95 % confidence interval (low, high) of the mean per-step value of ``objective``."""
        values = [objective.step_value(e, t) for e, t in zip(self.energy_J, self.time_s, strict=True)]
        n = len(values)
        mean = sum(values) / n
        if n < 2:
            return -math.inf, math.inf
        var = sum((v - mean) ** 2 for v in values) / (n - 1)
        half = _Z95 * math.sqrt(var / n)
        return mean - half, mean + half


class Phase(enum.Enum):
    """Phases of the profiler (see the module docstring for the transitions)."""

    IDLE = "idle"
    WARMUP = "warmup"
    PROFILING = "profiling"
    DONE = "done"
    OBSERVE = "observe"


@dataclass(frozen=True)
class ProfilerState:
    """Where the profiler stands: phase, limit under test, and when the phase began."""

    phase: Phase
    limit_W: float | None = None
    steps: int = 0  # steps completed in this phase
    active_s: float = 0.0  # step time spent in this phase, evaluations excluded (s)


@dataclass(frozen=True)
class ProfileSettings:
    """Window lengths and stopping rule (see :class:`~zeus_callbacks.config.PowerLimitConfig`)."""

    warmup_steps: int = 2
    warmup_s: float = 0.0
    min_profile_steps: int = 4
    profile_steps: int = 40
    profile_s: float | None = None
    rel_ci: float = 0.01
    search: Literal["unimodal", "sweep"] = "unimodal"
    unimodal_tolerance: float = 0.01
    max_wait_steps: int = 20  # a full window waits this many steps ...
    max_wait_s: float = 5.0  # ... and this long for power samples, then decides or gives up


class PowerLimitProfiler:
    """The profiling state machine; framework- and hardware-free.

    Args:
        limits_W: Limits to consider, shape (n,) (W), any order; the maximum is measured first.
        objective: What to minimise.
        energy_fn: ``energy_fn(start_s, end_s)`` → energy (J) summed over GPUs, None until
            the samples cover ``end_s``.
        settings: Window lengths and stopping rule.
        observe_only: Measure the first limit only (observe mode) and change nothing.

    The caller applies :attr:`target_limit_W` before each step and reports every step
    through :meth:`on_step_start`/:meth:`on_step_end`.
    """

    def __init__(
        self,
        limits_W: Sequence[float],
        objective: Objective,
        energy_fn: EnergyFn,
        settings: ProfileSettings | None = None,
        *,
        observe_only: bool = False,
    ) -> None:
        if not limits_W:
            raise ValueError("no power limits to profile")
        self.limits_W = sorted({float(x) for x in limits_W})  # ascending
        self.objective = objective
        self.energy_fn = energy_fn
        self.settings = settings or ProfileSettings()
        self.observe_only = observe_only
        self.state = ProfilerState(Phase.IDLE)
        self.profiles: dict[float, LimitProfile] = {}
        self.chosen_limit_W: float | None = None
        self.profiling_steps = 0
        self.fallback_sweep = False
        self._step_start_s: float | None = None
        self._eval_in_step = False
        self._eval_start_s: float | None = None
        self._pending: list[tuple[float, float]] = []  # profiled steps awaiting energy
        self._wait_steps = 0
        self._last_dt: float | None = None
        self._full_since_s: float | None = None
        self.abandoned = False

    # -- public view -----------------------------------------------------------------
    @property
    def phase(self) -> Phase:
        """The current phase."""
        return self.state.phase

    @property
    def finished(self) -> bool:
        """True once a choice is made (DONE) or observe mode measured the current limit."""
        return self.state.phase in (Phase.DONE, Phase.OBSERVE)

    @property
    def target_limit_W(self) -> float | None:
        """The limit the next step should run at (None: leave the GPU alone)."""
        if self.state.phase in (Phase.WARMUP, Phase.PROFILING):
            return self.state.limit_W
        if self.state.phase == Phase.DONE:
            return self.chosen_limit_W
        return None

    def start_at(self, limit_W: float) -> None:
        """Begin with ``limit_W`` (observe mode: the current limit) instead of the maximum."""
        self._first_limit_W = float(limit_W)

    def finish_with(self, limit_W: float) -> None:
        """Skip profiling and run at ``limit_W`` (a cache hit): IDLE → DONE."""
        self.chosen_limit_W = float(limit_W)
        self.state = ProfilerState(Phase.DONE, float(limit_W))

    # -- events ----------------------------------------------------------------------
    def on_step_start(self, step: int, now_s: float) -> float | None:
        """A step begins at ``now_s``; returns the limit it must run at (W), or None."""
        del step
        if self.state.phase == Phase.IDLE:
            self._enter_limit(getattr(self, "_first_limit_W", self.limits_W[-1]))
        self._step_start_s = now_s
        self._eval_in_step = False
        return self.target_limit_W

    def on_eval_start(self, now_s: float) -> None:
        """An evaluation begins: it is excluded from warm-up and profile windows."""
        self._eval_start_s = now_s
        self._eval_in_step = self._step_start_s is not None

    def on_eval_end(self, now_s: float) -> None:
        """The evaluation ended."""
        self._eval_start_s = None

    def on_step_end(self, step: int, now_s: float) -> bool:
        """A step ended at ``now_s``; advance the state machine.

        Returns:
            True when this step finished the profile (the choice is made).
        """
        del step
        start_s, self._step_start_s = self._step_start_s, None
        phase = self.state.phase
        if phase not in (Phase.WARMUP, Phase.PROFILING) or start_s is None:
            return False
        self.profiling_steps += 1
        limit = self.state.limit_W
        assert limit is not None
        profile = self.profiles.setdefault(limit, LimitProfile(limit))
        profile.steps += 1
        dt = max(now_s - start_s, 0.0)
        valid = not self._eval_in_step
        self._last_dt = dt if valid else 0.0
        st = self.state
        self.state = ProfilerState(phase, limit, st.steps + 1, st.active_s + (dt if valid else 0.0))
        if phase == Phase.WARMUP:
            s = self.settings
            if self.state.steps >= s.warmup_steps and self.state.active_s >= s.warmup_s:
                self.state = ProfilerState(Phase.PROFILING, limit)
            return False
        if valid and not self._window_full(self.state):
            self._pending.append((start_s, now_s))
        self._resolve(profile)
        if self._window_decided(profile, now_s):
            return self._next_limit()
        return False

    # -- internals --------------------------------------------------------------------
    def _enter_limit(self, limit_W: float) -> None:
        self._pending = []
        self._wait_steps = 0
        self._full_since_s = None
        s = self.settings
        phase = Phase.WARMUP if (s.warmup_steps > 0 or s.warmup_s > 0) else Phase.PROFILING
        self.state = ProfilerState(phase, float(limit_W))

    def _resolve(self, profile: LimitProfile) -> None:
        while self._pending:
            start_s, end_s = self._pending[0]
            energy = self.energy_fn(start_s, end_s)
            if energy is None:
                return
            self._pending.pop(0)
            profile.energy_J.append(float(energy))
            profile.time_s.append(end_s - start_s)

    def _best_upper(self, exclude: float) -> float:
        best = math.inf
        for limit, p in self.profiles.items():
            if limit != exclude and p.n >= 2:
                best = min(best, p.interval(self.objective)[1])
        return best

    def _window_full(self, st: ProfilerState) -> bool:
        """Whether the steps before this one already filled the window (later steps only wait)."""
        s = self.settings
        before_s = st.active_s - (self._last_dt or 0.0)
        return st.steps - 1 >= s.profile_steps or (s.profile_s is not None and before_s >= s.profile_s)

    def _window_decided(self, profile: LimitProfile, now_s: float) -> bool:
        s = self.settings
        st = self.state
        steps_up = st.steps >= s.profile_steps or (s.profile_s is not None and st.active_s >= s.profile_s)
        if steps_up:
            self._wait_steps += 1
            if self._full_since_s is None:
                self._full_since_s = now_s
            if profile.n >= 1 and not self._pending:
                return True
            if self._wait_steps > s.max_wait_steps and now_s - self._full_since_s > s.max_wait_s:
                if profile.n == 0:  # no power samples at all: give up rather than stay at a trial limit
                    self.abandoned = True
                    logger.warning(
                        "zeus-callbacks: no power samples arrived for %.0f s at %.0f W; power-limit "
                        "profiling is abandoned and the original limit is kept",
                        now_s - self._full_since_s,
                        profile.limit_W,
                    )
                return True
        if profile.n < max(s.min_profile_steps, 2):
            return False
        low, high = profile.interval(self.objective)
        mean = 0.5 * (low + high)
        if high - mean <= s.rel_ci * abs(mean):
            return True
        return low > self._best_upper(profile.limit_W)  # separated: clearly worse than the best

    def costs(self) -> dict[float, float]:
        """Cost of every measured limit (W → cost), per :attr:`objective`."""
        ref = self.profiles.get(self.limits_W[-1])
        ref_t = ref.time_per_step_s if ref is not None and ref.n else None
        return {
            limit: self.objective.cost(p.energy_per_step_J, p.time_per_step_s, ref_t)
            for limit, p in self.profiles.items()
            if p.n
        }

    def _next_limit(self) -> bool:
        if self.abandoned:
            self.chosen_limit_W = None
            self.state = ProfilerState(Phase.DONE, None)
            return True
        if self.observe_only:
            self.state = ProfilerState(Phase.OBSERVE, self.state.limit_W)
            return True
        following = self._search()
        if following is not None:
            self._enter_limit(following)
            return False
        costs = self.costs()
        self.chosen_limit_W = min(costs, key=lambda k: (costs[k], -k))
        self.state = ProfilerState(Phase.DONE, self.chosen_limit_W)
        return True

    def _search(self) -> float | None:
        limits = self.limits_W
        measured = {i for i, x in enumerate(limits) if x in self.profiles}
        unmeasured_desc = [x for x in reversed(limits) if x not in self.profiles]
        if not unmeasured_desc:
            return None
        if self.settings.search == "sweep" or self.fallback_sweep:
            return unmeasured_desc[0]
        if len(limits) - 1 not in measured:
            return limits[-1]
        costs = self.costs()
        cost = {i: costs.get(limits[i], math.inf) for i in measured}
        lo, hi = 0, len(limits) - 1
        while hi - lo > 2:
            d = max(1, round(0.382 * (hi - lo)))
            m1, m2 = lo + d, hi - d
            if m1 >= m2:
                m2 = m1 + 1
            for m in (m1, m2):
                if m not in measured:
                    return limits[m]
            if cost[m1] <= cost[m2]:
                hi = m2
            else:
                lo = m1
        for m in range(lo, hi + 1):
            if m not in measured:
                return limits[m]
        tol = self.settings.unimodal_tolerance
        if not is_unimodal([costs[x] for x in limits if x in costs], tol):
            self.fallback_sweep = True
            logger.info("zeus-callbacks: the measured cost curve is not unimodal; sweeping every limit")
            return unmeasured_desc[0]
        # Flat stretches can hide a lower dip: measure the unmeasured neighbours of every
        # limit whose cost is within the tolerance of the best.
        best = min(costs.values())
        for i in sorted(measured, reverse=True):
            if cost[i] <= best + tol * abs(best):
                for j in (i + 1, i - 1):
                    if 0 <= j < len(limits) and j not in measured:
                        return limits[j]
        return None


def is_unimodal(costs: Sequence[float], tolerance: float = 0.01) -> bool:
    """Whether ``costs`` (ordered by limit) falls to one minimum and rises after it.

    A dip smaller than ``tolerance`` × the minimum cost is noise, not a second valley.
    """
    if len(costs) < 3:
        return True
    k = min(range(len(costs)), key=costs.__getitem__)
    tol = tolerance * abs(costs[k])
    for side in (costs[k::-1], costs[k:]):
        running = side[0]
        for value in side[1:]:
            if value < running - tol:
                return False
            running = max(running, value)
    return True


# -------------------------------------------------------------------------- cache
@dataclass(frozen=True)
class ProfileKey:
    """What a cached profile is valid for; any difference means a fresh profile."""

    job_id: str
    gpu_model: str
    batch_size: int | None
    world_size: int
    objective: str

    def as_str(self) -> str:
        """The key as one string (JSON of its fields)."""
        return json.dumps(asdict(self), sort_keys=True)


class ProfileCache(Protocol):
    """Stores per-limit profiles by :class:`ProfileKey` (swap in the SQLite store later)."""

    def get(self, key: ProfileKey) -> dict[str, Any] | None:
        """The profile stored under ``key``, or None."""
        ...

    def put(self, key: ProfileKey, profile: dict[str, Any]) -> None:
        """Store ``profile`` (JSON-serialisable) under ``key``."""
        ...


class JsonProfileCache:
    """A :class:`ProfileCache` in one small JSON file, written atomically (main process only).

    Args:
        path: The JSON file (created on the first :meth:`put`).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, key: ProfileKey) -> dict[str, Any] | None:
        """The profile stored under ``key``, or None (also for an unreadable file)."""
        entry = self._read().get(key.as_str())
        return entry if isinstance(entry, dict) else None

    def put(self, key: ProfileKey, profile: dict[str, Any]) -> None:
        """Store ``profile`` under ``key`` (atomic replace of the file)."""
        data = self._read()
        data[key.as_str()] = profile
        _atomic_write_json(self.path, data)


def _atomic_write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


# ------------------------------------------------------------------ restore marker
def write_marker(path: str | Path, backend: GPUBackend, original_W: dict[int, float]) -> None:
    """Write the restore marker: GPU index → original limit (W), device name, pid."""
    gpus = [{"index": i, "name": backend.device_name(i), "original_limit_W": limit} for i, limit in original_W.items()]
    _atomic_write_json(Path(path), {"pid": os.getpid(), "backend": backend.name, "time": time.time(), "gpus": gpus})


def marker_path(log_dir: str | Path, configured: str | Path | None = None) -> Path:
    """The restore-marker file of this process.

    ``configured`` (``power_limit.restore_marker``) or ``<log_dir>/power_limit_restore.json``;
    under a multi-process launcher (``WORLD_SIZE`` > 1) each local rank gets its own file
    (``power_limit_restore.rank<LOCAL_RANK>.json``) so ranks never overwrite each other's.
    """
    path = Path(configured) if configured else Path(log_dir) / MARKER_NAME
    local_rank = os.environ.get("LOCAL_RANK")
    if local_rank is not None and launcher_world_size() > 1:
        path = path.with_name(f"{path.stem}.rank{int(local_rank)}{path.suffix}")
    return path




class RestoreMarker(NamedTuple):
    """What a restore marker records.

    Attributes:
        limits_W: GPU index → original power limit (W).
        pid: The process that wrote it, if recorded.
    """

    limits_W: dict[int, float]
    pid: int | None


def read_marker(path: str | Path) -> RestoreMarker | None:
    """The limits a restore marker records, without touching the file.

    A marker is what :func:`write_marker` writes: a JSON object with a non-empty ``gpus``
    list of ``{"index": int, "original_limit_W": number > 0}``.

    Args:
        path: The marker file.

    Returns:
        The marker's limits and writer, or None when there is no file.

    Raises:
        NotAMarker: The path is a directory, unreadable, not JSON, or JSON of another shape
            (a torn marker included): nobody can tell what limit it held, so it is kept.
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise NotAMarker(f"{path} is a directory, not a power-limit restore marker") from None
    except (OSError, ValueError) as exc:
        raise NotAMarker(f"{path} is not a power-limit restore marker (not readable JSON: {exc})") from exc
    gpus = data.get("gpus") if isinstance(data, dict) else None
    if not isinstance(gpus, list) or not gpus:
        raise NotAMarker(f'{path} is not a power-limit restore marker (no "gpus" list)')
    limits: dict[int, float] = {}
    for gpu in gpus:
        index = gpu.get("index") if isinstance(gpu, dict) else None
        limit = gpu.get("original_limit_W") if isinstance(gpu, dict) else None
        if (
            isinstance(index, bool) or not isinstance(index, int) or index < 0
            or isinstance(limit, bool) or not isinstance(limit, (int, float)) or not math.isfinite(limit) or limit <= 0
        ):  # fmt: skip
            raise NotAMarker(
                f"{path} is not a valid power-limit restore marker (GPU entry {gpu!r}: need an index ≥ 0 "
                "and an original_limit_W > 0)"
            )
        limits[index] = float(limit)
    return RestoreMarker(limits, data.get("pid"))


def restore_from_marker(path: str | Path, backend: GPUBackend) -> dict[int, float] | None:
    """Put back the limits a run left changed (SIGKILL, power loss), then remove the marker.

    Only a file that reads as a marker (:func:`read_marker`) is ever removed.

    Args:
        path: The marker file (``<log_dir>/power_limit_restore.json`` by default).
        backend: An open backend seeing the same GPUs.

    Returns:
        GPU index → restored limit (W), or None when there was no marker.

    Raises:
        NotAMarker: The file is not a marker (or a torn one); it is kept byte for byte.
        BackendError: A limit could not be restored (the marker is kept for a later try).
    """
    path = Path(path)
    marker = read_marker(path)
    if marker is None:
        return None
    restored: dict[int, float] = {}
    for index, limit in marker.limits_W.items():
        if index >= backend.device_count():
            logger.warning("zeus-callbacks: restore marker names GPU %d, which this process does not see", index)
            continue
        backend.set_power_limit_W(index, limit)
        restored[index] = limit
    path.unlink(missing_ok=True)
    logger.warning(
        "zeus-callbacks: restored power limits left by an earlier run (pid %s): %s",
        marker.pid,
        ", ".join(f"GPU {i} → {w:.0f} W" for i, w in restored.items()),
    )
    return restored


def restore_command(config_path: str | None = None, marker: str | None = None, *, as_json: bool = False) -> int:
    """``zeus-callbacks restore``: restore the limits in a leftover marker, print what was done.

    Args:
        config_path: The run's YAML configuration (backend, ``logging.log_dir``, marker path).
        marker: The marker file, overriding the configuration's.
        as_json: Print one JSON object instead of lines: ``restored`` (marker, gpu,
            limit_W per GPU) and ``failed`` (marker, error per marker kept).

    Returns:
        0 when restored (or nothing to restore), 1 when a limit could not be restored or a
        file is not a marker (it is kept).

    Raises:
        ConfigError: The configuration file is missing or invalid.
    """
    from zeus_callbacks.backends import get_backend
    from zeus_callbacks.config import load_config, parse_config

    cfg = load_config(config_path) if config_path else parse_config(None)
    if marker:
        paths = [Path(marker)]
    else:
        # This shell is no rank: look for the single-process marker and every rank's.
        base = Path(cfg.power_limit.restore_marker or Path(cfg.logging.log_dir) / MARKER_NAME)
        paths = [base, *sorted(base.parent.glob(f"{base.stem}.rank*{base.suffix}"))]
    paths = [p for p in paths if p.exists()]
    report: dict[str, list[dict[str, Any]]] = {"restored": [], "failed": []}
    if not paths:
        print(json.dumps(report) if as_json else "no power-limit restore marker found: nothing to restore")
        return 0
    backend = get_backend(cfg.backend, virtual=cfg.virtual)
    try:
        for path in paths:
            try:
                restored = restore_from_marker(path, backend)
            except NotAMarker as exc:
                report["failed"].append({"marker": str(path), "error": f"{exc}; it was left untouched"})
                if not as_json:
                    print(f"zeus-callbacks: {exc}; it was left untouched", file=sys.stderr)
                continue
            except BackendError as exc:
                report["failed"].append({"marker": str(path), "error": str(exc)})
                if not as_json:
                    print(f"cannot restore the power limits in {path}: {exc}", file=sys.stderr)
                continue
            for index, limit in (restored or {}).items():
                report["restored"].append({"marker": str(path), "gpu": index, "limit_W": limit})
                if not as_json:
                    print(f"GPU {index}: power limit restored to {limit:.0f} W ({path.name})")
    finally:
        backend.close()
    if as_json:
        print(json.dumps(report, indent=2))
    return 1 if report["failed"] else 0


# ---------------------------------------------------------------------------- plot
def plot_profile(
    rows: Sequence[dict[str, float]], chosen_limit_W: float | None, path: str | Path, *, partial: bool = False
) -> Path:
    """Plot time vs energy per step of each profiled limit, the chosen one highlighted.

    Args:
        rows: The per-limit table (``limit_W``, ``energy_per_step_J``, ``time_per_step_s``); rows
            without a measurement (null or NaN) are left out.
        chosen_limit_W: The chosen limit (W), or None (observe mode, unfinished profile).
        path: The image file to write (PNG).
        partial: The profile did not finish (said in the title).

    Returns:
        The path written.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(5, 4))
    rows = [r for r in rows if _measured(r.get("time_per_step_s")) and _measured(r.get("energy_per_step_J"))]
    try:
        xs = [r["time_per_step_s"] for r in rows]
        ys = [r["energy_per_step_J"] for r in rows]
        ax.scatter(xs, ys, color="tab:blue")
        for r, x, y in zip(rows, xs, ys, strict=True):
            ax.annotate(f"{r['limit_W']:.0f} W", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
            if chosen_limit_W is not None and r["limit_W"] == chosen_limit_W:
                ax.scatter([x], [y], s=160, facecolors="none", edgecolors="tab:red", label="chosen")
        ax.set_xlabel("time per step (s)")
        ax.set_ylabel("energy per step (J)")
        ax.set_title("Power-limit profile" + (" (partial: profiling did not finish)" if partial else ""))
        if chosen_limit_W is not None:
            ax.legend(loc="best")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return path


def _measured(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


# ---------------------------------------------------------------------- controller
@dataclass(frozen=True)
class PowerLimitResult:
    """The outcome, for the log: source is ``profile``, ``cache`` or ``observe``."""

    source: str
    chosen_limit_W: float | None
    profiling_steps: int
    objective: str
    rows: list[dict[str, float]]
    fallback_sweep: bool
    message: str
    finished: bool = True


class PowerLimitController:
    """Apply the profiler's limits to a backend's GPUs, safely.

    Args:
        config: The ``power_limit`` section (:class:`~zeus_callbacks.config.PowerLimitConfig`).
        backend: An open backend.
        gpu_indices: GPUs that all get the same limit (single-process multi-GPU).
        energy_fn: Energy (J) summed over ``gpu_indices`` between two times, or None.
        log_dir: Default home of the restore marker and the cache file.
        job_id: Part of the cache key.
        world_size: Part of the cache key.
        is_main_process: Only the main process writes the cache and the plot.
        run_name: Names the plot, ``<log_dir>/<run_name>.power_limit.png``.
        cache: The profile cache; default a :class:`JsonProfileCache` on ``config.cache_path``
            (``<log_dir>/power_limit_cache.json``). Ignored when ``config.cache`` is off.
    """

    def __init__(
        self,
        config: Any,
        backend: GPUBackend,
        gpu_indices: Sequence[int],
        energy_fn: EnergyFn,
        *,
        log_dir: Path,
        job_id: str = "default",
        world_size: int = 1,
        is_main_process: bool = True,
        run_name: str = "run",
        cache: ProfileCache | None = None,
    ) -> None:
        self.config = config
        self.plot_path = Path(log_dir) / f"{run_name}.power_limit.png" if config.plot else None
        self.backend = backend
        self.gpu_indices = list(gpu_indices)
        self.marker_path = marker_path(log_dir, config.restore_marker)
        cache_path = Path(config.cache_path) if config.cache_path else Path(log_dir) / CACHE_NAME
        self.cache: ProfileCache | None = (cache or JsonProfileCache(cache_path)) if config.cache else None
        self.job_id = job_id
        self.world_size = world_size
        self.is_main_process = is_main_process
        self.original_W = {i: backend.power_limit_W(i) for i in self.gpu_indices}
        low = max(backend.power_limit_constraints_W(i)[0] for i in self.gpu_indices)
        high = min(backend.power_limit_constraints_W(i)[1] for i in self.gpu_indices)
        self.observe = bool(backend.read_only)
        self.observe_reason = "read-only mode (ZEUS_CALLBACKS_READ_ONLY)" if self.observe else ""
        objective = Objective(
            config.objective,
            config.eta_knob,
            config.max_slowdown,
            ZeusCost.for_gpus(config.eta_knob, high, len(self.gpu_indices)).max_power_W,
        )
        settings = ProfileSettings(
            warmup_steps=config.warmup_steps,
            warmup_s=config.warmup_s,
            min_profile_steps=config.min_profile_steps,
            profile_steps=config.profile_steps,
            profile_s=config.profile_s,
            rel_ci=config.rel_ci,
            search=config.search,
        )
        self.profiler = PowerLimitProfiler(
            power_limit_grid_W(low, high, config.step_W), objective, energy_fn, settings, observe_only=self.observe
        )
        if self.observe:
            self._warn_observe()
        self.applied_W: float | None = None  # what we set last (None: untouched)
        self.key: ProfileKey | None = None
        self.result: PowerLimitResult | None = None
        self._marker_written = False
        self._sigterm = ChainedSigterm(self.restore, "restoring the original power limits")
        self._lock = threading.RLock()
        self._step_index = 0

    # -- state -------------------------------------------------------------------------
    @property
    def limit_W(self) -> float:
        """The limit in force (mean over the GPUs, W)."""
        if self.applied_W is not None:
            return self.applied_W
        return sum(self.original_W.values()) / len(self.original_W)

    def _warn_observe(self) -> None:
        logger.warning(
            "zeus-callbacks: power-limit profiling runs in observe mode (%s): it measures at the "
            "current limit only and changes nothing",
            self.observe_reason,
        )

    def enter_observe(self, reason: str) -> None:
        """Switch to observe mode now (restore the original limits), saying why once."""
        if not self.observe:
            self._enter_observe(reason)

    def apply(self, limit_W: float) -> None:
        """Apply ``limit_W`` to every GPU as another rank's profiler decided (marker first)."""
        self._apply(limit_W)

    def _enter_observe(self, reason: str) -> None:
        self.observe = True
        self.observe_reason = reason
        self.profiler.observe_only = True
        self._warn_observe()
        self.restore()
        current = self.limit_W
        self.profiler.profiles.clear()
        self.profiler.start_at(current)
        self.profiler.state = ProfilerState(Phase.IDLE)

    # -- events ------------------------------------------------------------------------
    def on_step_start(self, step: int, now_s: float) -> None:
        """Apply the limit the next step must run at (before its window opens)."""
        if self.profiler.phase == Phase.IDLE and self._step_index == 0:
            return  # the first step runs untouched: its batch size keys the cache
        if self.profiler.phase == Phase.IDLE and self.observe:
            self.profiler.start_at(self.limit_W)
        target = self.profiler.on_step_start(step, now_s)
        if target is not None and not self.observe:
            self._apply(target)

    def on_step_end(self, step: int, now_s: float, num_samples: int | None = None) -> PowerLimitResult | None:
        """Advance the profiler; returns the result once, when the choice is made."""
        self._step_index += 1
        if self._step_index == 1 and self.profiler.phase == Phase.IDLE:
            return self._consult_cache(num_samples)
        if self.profiler.on_step_end(step, now_s):
            return self._finish()
        return None

    def on_eval_start(self, now_s: float) -> None:
        """An evaluation begins (excluded from profiling)."""
        self.profiler.on_eval_start(now_s)

    def on_eval_end(self, now_s: float) -> None:
        """An evaluation ended."""
        self.profiler.on_eval_end(now_s)

    # -- cache ---------------------------------------------------------------------------
    def _consult_cache(self, batch_size: int | None) -> PowerLimitResult | None:
        self.key = ProfileKey(
            job_id=self.job_id,
            gpu_model=self.backend.device_name(self.gpu_indices[0]),
            batch_size=batch_size,
            world_size=self.world_size,
            objective=self.profiler.objective.key(),
        )
        if self.cache is None or self.observe:
            return None
        entry = self.cache.get(self.key)
        if entry is None or entry.get("chosen_limit_W") is None:
            logger.info("zeus-callbacks: no cached power-limit profile for %s; profiling", self.key)
            return None
        limit = float(entry["chosen_limit_W"])
        if limit not in self.profiler.limits_W and not (
            self.profiler.limits_W[0] <= limit <= self.profiler.limits_W[-1]
        ):
            logger.warning("zeus-callbacks: cached power limit %.0f W is out of range; profiling again", limit)
            return None
        self.profiler.finish_with(limit)
        self._apply(limit)
        message = f"applied the cached power limit {limit:.0f} W for {self.key.as_str()} without profiling"
        logger.info("zeus-callbacks: %s", message)
        self.result = PowerLimitResult(
            "cache", limit, 0, self.profiler.objective.key(), list(entry.get("limits", [])), False, message
        )
        return self.result

    def _rows(self) -> list[dict[str, float]]:
        """The per-limit table of what was measured, highest limit first."""
        p = self.profiler
        costs = p.costs()
        return [
            {
                "limit_W": limit,
                "energy_per_step_J": prof.energy_per_step_J,
                "time_per_step_s": prof.time_per_step_s,
                "cost": costs.get(limit, math.nan),
                "profiled_steps": prof.n,
                "steps": prof.steps,
            }
            for limit, prof in sorted(p.profiles.items(), reverse=True)
        ]

    def unfinished(self, steps: int) -> PowerLimitResult | None:
        """The outcome when training ends before profiling did (warned once); None if it finished or never began.

        Args:
            steps: Training steps the run executed (for the message).

        Returns:
            A result with ``finished=False``, ``source`` ``unfinished``, no chosen limit and the
            measured rows, or None when a result exists already or no limit was tried.
        """
        p = self.profiler
        if self.result is not None or not p.profiles:
            return None
        rows = self._rows()
        tried = sorted({r["limit_W"] for r in rows})
        trained = f"{tried[0]:.0f} W" if len(tried) == 1 else f"{tried[0]:.0f}–{tried[-1]:.0f} W"
        done = sum(1 for r in rows if r["profiled_steps"] >= p.settings.min_profile_steps)
        message = (
            f"power-limit profiling did not finish in {steps} steps ({done} of {len(p.limits_W)} limits "
            f"measured); the run trained at {trained} and no limit was chosen; raise max_steps/epochs, or "
            "lower power_limit.profile_steps / warmup_steps so profiling ends within the run"
        )
        logger.warning("zeus-callbacks: %s", message)
        self.result = PowerLimitResult(
            "unfinished", None, p.profiling_steps, p.objective.key(), rows, p.fallback_sweep, message, finished=False
        )
        return self.result

    def _finish(self) -> PowerLimitResult:
        p = self.profiler
        rows = self._rows()
        if p.phase == Phase.OBSERVE:
            current = p.state.limit_W
            message = (
                f"observe mode ({self.observe_reason}): measured only the current limit "
                f"{current:.0f} W; cannot profile other limits, so no limit is chosen or changed"
            )
            logger.warning("zeus-callbacks: %s", message)
            self.result = PowerLimitResult("observe", None, p.profiling_steps, p.objective.key(), rows, False, message)
            return self.result
        chosen = p.chosen_limit_W
        if chosen is None:  # abandoned: no power samples
            self.restore()
            message = "profiling abandoned (no power samples arrived); the original limits are kept"
            self.result = PowerLimitResult(
                "abandoned", None, p.profiling_steps, p.objective.key(), rows, False, message
            )
            return self.result
        self._apply(chosen)
        message = (
            f"chose power limit {chosen:.0f} W ({p.objective.key()}) after {p.profiling_steps} profiling "
            f"steps over {len(rows)} limits{' (full sweep: cost curve not unimodal)' if p.fallback_sweep else ''}"
        )
        logger.info("zeus-callbacks: %s", message)
        self.result = PowerLimitResult(
            "profile", chosen, p.profiling_steps, p.objective.key(), rows, p.fallback_sweep, message
        )
        if self.plot_path is not None and self.is_main_process:
            try:
                plot_profile(rows, chosen, self.plot_path)
            except Exception as exc:  # no matplotlib, no display, full disk: the run goes on
                logger.warning("zeus-callbacks: cannot plot the power-limit profile (%s)", exc)
        if self.cache is not None and self.key is not None and self.is_main_process:
            try:
                self.cache.put(self.key, {"chosen_limit_W": chosen, "limits": rows, "time": time.time()})
            except OSError as exc:
                logger.warning("zeus-callbacks: cannot write the power-limit cache (%s)", exc)
        return self.result

    # -- hardware --------------------------------------------------------------------------
    def _apply(self, limit_W: float) -> None:
        with self._lock:
            if self.observe or self.applied_W == limit_W:
                return
            if not self._marker_written:
                if self.marker_path.exists():  # not ours: another run's, one kept after a failure, or no marker
                    self._enter_observe(
                        f"the restore marker path {self.marker_path} holds a file this run did not write; "
                        "writing the marker would replace it (run `zeus-callbacks restore`, or move it away)"
                    )
                    return
                try:
                    write_marker(self.marker_path, self.backend, self.original_W)
                except OSError as exc:
                    self._enter_observe(f"cannot write the restore marker {self.marker_path}: {exc}")
                    return
                self._marker_written = True
                self._install_sigterm()
            try:
                for i in self.gpu_indices:
                    self.backend.set_power_limit_W(i, limit_W)
            except PermissionDenied as exc:
                self._enter_observe(f"no permission to change the power limit: {exc}")
                return
            self.applied_W = limit_W

    def restore(self) -> None:
        """Put every GPU back to its original limit and remove the marker (idempotent)."""
        with self._lock:
            if not self._marker_written:
                return
            failed = False
            for i, limit in self.original_W.items():
                try:
                    if self.backend.power_limit_W(i) != limit:
                        self.backend.set_power_limit_W(i, limit)
                except BackendError as exc:
                    failed = True
                    logger.error("zeus-callbacks: cannot restore GPU %d to %.0f W (%s)", i, limit, exc)
            self.applied_W = None
            if not failed:
                self.marker_path.unlink(missing_ok=True)
                self._marker_written = False
            self._uninstall_sigterm()

    def _install_sigterm(self) -> None:
        self._sigterm.install()

    def _uninstall_sigterm(self) -> None:
        self._sigterm.uninstall()


MARKER_NAME = "power_limit_restore.json"
"""Default restore-marker file name, under ``logging.log_dir``."""
CACHE_NAME = "power_limit_cache.json"
"""Default profile-cache file name, under ``logging.log_dir``."""
