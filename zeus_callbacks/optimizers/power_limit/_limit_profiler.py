"""The power-limit profiling state machine (Zeus, NSDI '23, §4.3), framework- and hardware-free.

:class:`PowerLimitProfiler` is fed with step boundaries and an energy function. It decides
which limit each step should run at and, at the end, the limit that minimises the
:class:`~zeus_callbacks.optimizers.power_limit._objective.Objective`. It never touches a GPU:
:class:`~zeus_callbacks.optimizers.power_limit._power_limit_controller.PowerLimitController` applies its
limits.

States (:class:`ProfilerPhase`) and transitions; each happens at a step boundary or at one of the
three calls named below::

    IDLE ──first step_start──> WARMUP(limit) ──warm-up done (step_end)──> PROFILING(limit)
      │                          ▲   (warmup_steps = 0 and warmup_s = 0: straight to PROFILING)
      │                          └────── window decided, the search picks another limit ──┐
      │                                                                                    │
      │   PROFILING(limit) ──window decided (step_end)──> WARMUP(next) ────────────────────┘
      │                     └──────────────────────────> DONE(best)     (search finished)
      │                     └──────────────────────────> DONE(None)     (abandoned: no power
      │                                                                  samples arrived)
      │                     └──────────────────────────> OBSERVE        (observe mode: only
      │                                                                  the current limit)
      └──finish_with(limit), a cache hit──> DONE(cached)

    any phase ──restart_observing(limit)──> IDLE   (observe mode from now on: the measurements
                                                    so far are dropped, the next step_start
                                                    warms up at ``limit``, the window ends in OBSERVE)

- IDLE: nothing measured yet; :attr:`~PowerLimitProfiler.target_limit_W` is None (leave the GPU alone).
- WARMUP(limit): steps run at ``limit`` until ``warmup_steps`` steps and ``warmup_s`` seconds passed;
  they are not measured.
- PROFILING(limit): each step's energy and time at ``limit`` is measured.
- DONE(limit): the choice is made; every later step runs at it (None: keep the original limit).
- OBSERVE: observe mode measured the current limit; nothing is chosen or changed.

A window spans steps, not epochs; a step during which an evaluation ran is dropped. When a window
is decided (:meth:`PowerLimitProfiler._window_decided`), which limit comes next
(:class:`~zeus_callbacks.optimizers.power_limit._search.SearchPlan`), the revisits of ties before
the choice and, with ``job_steps`` known, the polish (:meth:`PowerLimitProfiler._polish`): see
docs/power_limit.md ("How it works").
"""

from __future__ import annotations

import enum
import logging
import math
import numbers
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np

from zeus_callbacks.optimizers.power_limit._limit_profile import LimitProfile, t_interval, t_quantile_95, t_quantile_975
from zeus_callbacks.optimizers.power_limit._objective import INFEASIBLE_COST, Objective
from zeus_callbacks.optimizers.power_limit._search import (
    Measured,
    SearchPlan,
    SearchSettings,
    neighbour_pooled_costs,
    tolerance,
    wiener_gaps,
)

logger = logging.getLogger(__name__)

_REF_SHARE = 3  # polish: the boundary limit gets this many times the steps of the (dear) time reference
_TIE_APART_W = 2.5  # max_slowdown's polish: a tie this close (W) to the best is not measured again
_EXPLORE_MIN_GAP_W = 2.0  # polish: a gap between measured limits narrower than this (W) is not probed ...
_EXPLORE_GRID_SHARE = 0.25  # ... nor one narrower than this share of the grid's spacing (the search refines there)


_SCOUT_STEPS = 2  # polish: a scout of a gap measures this many steps after its warm-up ...
_SCOUT_BUDGET_SHARE = 0.25  # ... while the scouts' excess stays under this share of the polish budget

_POOLED_CHOICE = True  # the choice compares pooled costs (off: the raw readings; a switch for benchmarks/ screens)


def _expected_saving(diff: float, sd: float) -> float:
    """``E[max(−D, 0)]`` for ``D ~ N(diff, sd²)``: what choosing a limit measured ``diff`` dearer saves, on average."""
    z = diff / sd
    return sd * math.exp(-0.5 * z * z) / math.sqrt(2 * math.pi) - diff * 0.5 * math.erfc(z / math.sqrt(2))


def check_profile_range(state: Mapping[str, Any], low_W: float, high_W: float) -> None:
    """Refuse a profile state (one :func:`check_profile_state` passed) whose choice lies outside ``low_W``–``high_W``.

    The range is this run's limits (W), known only once the profiler is built: a choice outside it was made
    on another GPU or configuration, or edited, and cannot be applied here.

    Raises:
        ValueError: ``chosen_limit_W`` is outside the range (W); the message names it and the range.
    """
    chosen = state.get("chosen_limit_W")
    if chosen is not None and not low_W <= float(chosen) <= high_W:
        raise ValueError(f"chosen_limit_W {chosen!r} is outside the limits {low_W:g}–{high_W:g} W")


def check_profile_state(state: Any) -> None:
    """Refuse a profile state that :meth:`PowerLimitProfiler.export_state` did not write, naming the key at fault.

    Only the keys present are checked (missing ones take their defaults in :meth:`PowerLimitProfiler.resume`).

    Raises:
        ValueError: ``state`` is not a mapping; ``limits`` not a list of rows each with a ``limit_W`` (W,
            finite and > 0), ``energy_J`` and ``time_s`` lists of finite numbers >= 0 (J, s) of one length,
            and ``steps`` a whole number >= 0; ``chosen_limit_W`` or ``current_limit_W`` neither null nor a
            finite number > 0 (W); ``profiling_steps`` or ``refine_probes`` not a whole number >= 0;
            ``scouted_W`` not a list of finite numbers > 0 (W); ``phase`` not a phase's name; a flag not a bool;
            a limit in two rows (the profile keeps one row a limit: a second would replace the first).
    """

    def number(key: str, value: Any, *, positive: bool = False, whole: bool = False) -> None:
        real = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
        if not real or value < 0 or (positive and value == 0) or (whole and not float(value).is_integer()):
            kind = "a whole number >= 0" if whole else "a finite number > 0" if positive else "a finite number >= 0"
            raise ValueError(f"{key} must be {kind}, not {value!r}")

    if not isinstance(state, Mapping):
        raise ValueError(f"the profile must be a mapping, not {type(state).__name__}")
    phase = state.get("phase", ProfilerPhase.IDLE.value)
    if phase not in {p.value for p in ProfilerPhase}:
        raise ValueError(f"phase must be one of {', '.join(p.value for p in ProfilerPhase)}, not {phase!r}")
    for key in ("chosen_limit_W", "current_limit_W"):
        if state.get(key) is not None:
            number(key, state[key], positive=True)
    for key in ("profiling_steps", "refine_probes"):
        if key in state:
            number(key, state[key], whole=True)
    for key in ("fallback_sweep", "observe_only"):
        if not isinstance(state.get(key, False), bool):
            raise ValueError(f"{key} must be true or false, not {state[key]!r}")
    scouted = state.get("scouted_W", [])
    if not isinstance(scouted, list):
        raise ValueError(f"scouted_W must be a list, not {scouted!r}")
    for i, value in enumerate(scouted):
        number(f"scouted_W[{i}]", value, positive=True)
    rows = state.get("limits", [])
    if not isinstance(rows, list):
        raise ValueError(f"limits must be a list, not {rows!r}")
    seen: dict[float, int] = {}  # limit (W) → its row
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise ValueError(f"limits[{i}] must be a mapping, not {row!r}")
        if "limit_W" not in row:
            raise ValueError(f"limits[{i}].limit_W is missing")
        number(f"limits[{i}].limit_W", row["limit_W"], positive=True)
        first = seen.setdefault(float(row["limit_W"]), i)
        if first != i:
            raise ValueError(f"limits[{i}].limit_W {row['limit_W']!r} repeats limits[{first}]'s")
        lengths = []
        for key in ("energy_J", "time_s"):
            values = row.get(key, [])
            if not isinstance(values, list):
                raise ValueError(f"limits[{i}].{key} must be a list, not {values!r}")
            for j, value in enumerate(values):
                number(f"limits[{i}].{key}[{j}]", value)
            lengths.append(len(values))
        if lengths[0] != lengths[1]:
            raise ValueError(f"limits[{i}].energy_J and time_s must be as long ({lengths[0]} and {lengths[1]} steps)")
        if "steps" in row:
            number(f"limits[{i}].steps", row["steps"], whole=True)


class EnergyFn(Protocol):
    """``energy_fn(start_s, end_s, samples_until_s=None)``: energy (J, summed over GPUs) in the interval."""

    def __call__(self, start_s: float, end_s: float, /, *, samples_until_s: float | None = None) -> float | None:
        """Energy (J, summed over GPUs) in ``[start_s, end_s]`` (s); None until the power samples cover ``end_s``.

        ``samples_until_s`` (s, after ``end_s``): only the samples whose interval ends by then, the
        end extrapolated by at most one sample period; NaN when that does not reach ``end_s``.
        """


class ProfilerPhase(enum.Enum):
    """Phases of the profiler (see the module docstring for the transitions)."""

    IDLE = "idle"
    WARMUP = "warmup"
    PROFILING = "profiling"
    DONE = "done"
    OBSERVE = "observe"


@dataclass(frozen=True)
class ProfilerState:
    """Where the profiler stands: phase, limit under test, and when the phase began."""

    phase: ProfilerPhase
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
    unimodal_tolerance: float = 0.002  # smallest relative cost difference taken as real; intervals widen it
    max_wait_steps: int = 20  # a full window waits this many steps ...
    max_wait_s: float = 5.0  # ... and this long for power samples, then decides or gives up
    max_revisits: int = 2  # at most this many extra windows at limits already measured (ties with the best)
    job_steps: int | None = None  # training steps the job is expected to run (None: unknown, no polish)
    polish_budget: float = 0.004  # polish while profiling's excess cost stays under this × job_steps steps
    polish_ci: float = 0.001  # ... and a tie or a boundary margin is wider than this fraction of the cost
    polish_max_share: float = 0.1  # ... and profiling stays within this share of job_steps (steps)


@dataclass
class _Pending:
    """A profiled step awaiting its energy: its limit's profile, its span (s), when another limit began (s)."""

    profile: LimitProfile
    start_s: float
    end_s: float
    switch_s: float | None = None


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
        self.state = ProfilerState(ProfilerPhase.IDLE)
        self._first_limit_W: float | None = None  # where IDLE goes on the first step (None: the maximum)
        self.profiles: dict[float, LimitProfile] = {}
        self.chosen_limit_W: float | None = None
        self.profiling_steps = 0
        self.fallback_sweep = False
        self._plan = SearchPlan(
            self.limits_W,
            SearchSettings(
                kind=self.settings.search,
                noise_floor=self.settings.unimodal_tolerance,
                max_slowdown=objective.max_slowdown if objective.name == "max_slowdown" else None,
                # a job whose length is known repays more limits off the grid, and smaller gains (see _polish)
                refine_probes=12 if self.settings.job_steps else 4,
                refine_gain=0.001 if self.settings.job_steps else 0.005,
            ),
        )
        self._step_start_s: float | None = None
        self._eval_in_step = False
        # profiled steps awaiting energy, oldest first; a window's last ones may still be here after the
        # next limit began: their energy comes from the samples before the switch only (_resolve)
        self._pending: list[_Pending] = []
        self.dropped_steps = 0  # profiled steps the power samples do not cover (energy NaN)
        self._wait_steps = 0
        self._last_dt: float | None = None
        self._full_since_s: float | None = None
        self._revisit_until_n: int | None = None  # a revisit's window ends at this many measured steps
        self._polishing = False  # the window is a polish revisit: it runs to _revisit_until_n whatever it measures
        self.revisits = 0
        self.polishes = 0  # polish windows run (see _polish)
        self._noise_terms: dict[tuple[str, int], tuple[LimitProfile, tuple[int, int], float, int]] = {}
        self.scouted_W: set[float] = set()  # limits a scout's window measured first (see _gap_to_scout)
        self.search_done = False  # the search and its revisits are done: the best measured limit may be chosen now
        self.abandoned = False

    # -- public view -----------------------------------------------------------------
    @property
    def phase(self) -> ProfilerPhase:
        """The current phase."""
        return self.state.phase

    @property
    def finished(self) -> bool:
        """True once a choice is made (DONE) or observe mode measured the current limit."""
        return self.state.phase in (ProfilerPhase.DONE, ProfilerPhase.OBSERVE)

    @property
    def target_limit_W(self) -> float | None:
        """The limit the next step should run at (None: leave the GPU alone)."""
        if self.state.phase in (ProfilerPhase.WARMUP, ProfilerPhase.PROFILING):
            return self.state.limit_W
        if self.state.phase == ProfilerPhase.DONE:
            return self.chosen_limit_W
        return None

    def start_at(self, limit_W: float) -> None:
        """Begin with ``limit_W`` (observe mode: the current limit) instead of the maximum."""
        self._first_limit_W = float(limit_W)

    def finish_with(self, limit_W: float) -> None:
        """Skip profiling and run at ``limit_W`` (a cache hit): IDLE → DONE."""
        self.chosen_limit_W = float(limit_W)
        self.state = ProfilerState(ProfilerPhase.DONE, float(limit_W))

    def restart_observing(self, limit_W: float) -> None:
        """Switch to observe mode and start over at ``limit_W`` (W), the limit the GPUs are back at: any phase → IDLE.

        The limits measured so far are dropped: they cannot be compared with what follows.
        """
        self.observe_only = True
        self.profiles.clear()
        self._noise_terms.clear()
        self.scouted_W.clear()
        self._pending = []
        self.start_at(limit_W)
        self.state = ProfilerState(ProfilerPhase.IDLE)

    # -- checkpoint state ------------------------------------------------------------
    def export_state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the profile: every limit whose window was decided, and where it stood.

        The limit under test is kept as ``current_limit_W`` without its partial window: after a
        restart its GPU state and timing are not those of the steps measured before.

        Returns:
            Plain numbers and lists (``json`` serialisable): ``phase``, ``chosen_limit_W``,
            ``current_limit_W``, ``profiling_steps``, ``fallback_sweep``, ``refine_probes``, ``scouted_W``
            (the limits a scout measured first, W) and
            ``limits`` (per decided limit: ``limit_W``, ``energy_J`` and ``time_s`` per profiled
            step, in J and s, and ``steps`` spent at it).
        """
        st = self.state
        in_window = st.phase in (ProfilerPhase.WARMUP, ProfilerPhase.PROFILING)
        current = st.limit_W if in_window else None
        return {
            "phase": st.phase.value,
            "chosen_limit_W": self.chosen_limit_W,
            "current_limit_W": current,
            "profiling_steps": self.profiling_steps,
            "fallback_sweep": self._plan.fallback_sweep,
            "refine_probes": self._plan.refine_probes,
            "observe_only": self.observe_only,
            "scouted_W": sorted(self.scouted_W),
            "limits": [
                {"limit_W": limit, "energy_J": list(p.energy_J), "time_s": list(p.time_s), "steps": p.steps}
                for limit, p in sorted(self.profiles.items())
                if limit != current
            ],
        }

    def resume(self, state: Mapping[str, Any]) -> bool:
        """Continue the profile a checkpoint kept (:meth:`export_state`), before the first step: IDLE → IDLE or DONE.

        Decided limits are not measured again; a finished profile goes straight to DONE at its
        choice. A state from observe mode is ignored; one with limits outside this profiler's range, or
        unreadable (a row without ``limit_W``, a text among the energies, a limit twice:
        :func:`check_profile_state`; a ``chosen_limit_W`` outside the range: :func:`check_profile_range`), is
        ignored with a warning.

        Args:
            state: What :meth:`export_state` returned (missing keys take their defaults).

        Returns:
            True when the state was taken, False when it was ignored (an unreadable one with a warning:
            :func:`check_profile_state`; profiling starts over).
        """
        low, high = self.limits_W[0], self.limits_W[-1]
        try:
            check_profile_state(state)
            # A finished profile's choice outside this run's limits was silently replaced by the rows' cheapest.
            check_profile_range(state, low, high)
        except ValueError as exc:
            logger.warning("zeus-callbacks: the checkpoint's power-limit profile is unreadable (power_limit.%s); "
                           "profiling starts over", exc)  # fmt: skip
            return False
        if self.state.phase != ProfilerPhase.IDLE or state.get("observe_only") or self.observe_only:
            return False
        limits = list(state.get("limits", []))
        if any(not low <= float(row["limit_W"]) <= high for row in limits):
            logger.warning("zeus-callbacks: the checkpoint's power-limit profile is outside %.0f-%.0f W; "
                           "profiling starts over", low, high)  # fmt: skip
            return False
        chosen = state.get("chosen_limit_W")
        if state.get("phase") == ProfilerPhase.DONE.value and chosen is not None:  # in range: check_profile_range
            self.finish_with(float(chosen))
        for row in limits:
            limit = float(row["limit_W"])
            self.profiles[limit] = LimitProfile(
                limit, [float(e) for e in row.get("energy_J", [])], [float(t) for t in row.get("time_s", [])],
                int(row.get("steps", 0)),
            )  # fmt: skip
        self.profiling_steps = int(state.get("profiling_steps", 0))
        self._plan.fallback_sweep = self.fallback_sweep = bool(state.get("fallback_sweep", False))
        self._plan.refine_probes = int(state.get("refine_probes", 0))
        self.scouted_W = {float(x) for x in state.get("scouted_W", [])}
        if self.state.phase == ProfilerPhase.DONE:
            return True
        current = state.get("current_limit_W")
        if current is not None and low <= float(current) <= high:
            self._first_limit_W = float(current)
        elif self.profiles:  # between two windows: the search names the next limit
            following = self._search()
            if following is None:  # every limit decided already: choose now, at the first step
                costs = self.costs()
                self.finish_with(min(costs, key=lambda k: (costs[k], -k)))
                return True
            self._first_limit_W = following
        return True

    # -- events ----------------------------------------------------------------------
    def on_step_start(self, step: int, now_s: float) -> float | None:
        """A step begins at ``now_s``; returns the limit it must run at (W), or None."""
        del step
        if self.state.phase == ProfilerPhase.IDLE:
            first = self._first_limit_W
            self._enter_limit(self.limits_W[-1] if first is None else first)
        self._step_start_s = now_s
        self._eval_in_step = False
        target = self.target_limit_W
        for pending in self._pending:  # steps of another limit still awaiting energy: the switch is now
            if pending.switch_s is None and target is not None and target != pending.profile.limit_W:
                pending.switch_s = now_s
        return target

    def on_eval_start(self, now_s: float) -> None:
        """An evaluation begins: the step it runs in is excluded from warm-up and profile windows."""
        del now_s
        self._eval_in_step = self._step_start_s is not None

    def on_step_end(self, step: int, now_s: float) -> bool:
        """A step ended at ``now_s``; advance the state machine.

        Returns:
            True when this step finished the profile (the choice is made).
        """
        del step
        start_s, self._step_start_s = self._step_start_s, None
        phase = self.state.phase
        if phase not in (ProfilerPhase.WARMUP, ProfilerPhase.PROFILING) or start_s is None:
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
        if phase == ProfilerPhase.WARMUP:
            s = self.settings
            if self.state.steps >= s.warmup_steps and self.state.active_s >= s.warmup_s:
                self.state = ProfilerState(ProfilerPhase.PROFILING, limit)
            return False
        if valid and not self._window_full(self.state):
            self._pending.append(_Pending(profile, start_s, now_s))
        self._resolve()
        if self._window_decided(profile, now_s):
            return self._next_limit()
        return False

    # -- internals --------------------------------------------------------------------
    def _enter_limit(self, limit_W: float) -> None:
        self._wait_steps = 0
        self._full_since_s = None
        self._revisit_until_n = None
        self._polishing = False
        s = self.settings
        phase = ProfilerPhase.WARMUP if (s.warmup_steps > 0 or s.warmup_s > 0) else ProfilerPhase.PROFILING
        self.state = ProfilerState(phase, float(limit_W))

    def _resolve(self) -> None:
        """Move the measured steps whose power samples have arrived, oldest first, into their limit's profile.

        A step resolved after the next limit began takes only the samples before the switch (a sample
        straddling it averages in the next limit's power: a bias of up to 0.66 % of a limit's mean on
        the noise-free simulator). A step the samples do not cover (NaN) stays out of the profile.
        """
        while self._pending:
            pending = self._pending[0]
            energy = self.energy_fn(pending.start_s, pending.end_s, samples_until_s=pending.switch_s)
            if energy is None:
                return
            self._pending.pop(0)
            if not math.isfinite(energy):
                if self.dropped_steps == 0:
                    logger.warning(
                        "power-limit profiling: the power samples do not cover a %.3f s step at %.0f W; it is "
                        "left out of the profile (later such steps are counted, not logged)",
                        pending.end_s - pending.start_s, pending.profile.limit_W,
                    )  # fmt: skip
                self.dropped_steps += 1
                continue
            pending.profile.energy_J.append(float(energy))
            pending.profile.time_s.append(pending.end_s - pending.start_s)

    def _pooled_rel_sd(self, which: Literal["cost", "time_s", "energy_J"]) -> tuple[float, int]:
        """The card's measured noise: the relative sd of a per-step value pooled over every window, and its dof.

        Step-time jitter and sensor noise are (roughly) relative, so each window's deviations
        are taken over its own mean and their squares pooled: sqrt(Σ Σ ((v − m_i)/m_i)² / Σ (n_i − 1)).
        ``which``: the per-step objective value, time (s) or energy (J).
        """
        ss, dof = 0.0, 0
        for p in self.profiles.values():
            ss_p, dof_p = self._noise_term(which, p)
            ss += ss_p
            dof += dof_p
        return (math.sqrt(ss / dof), dof) if dof else (0.0, 0)

    def _noise_term(self, which: Literal["cost", "time_s", "energy_J"], p: LimitProfile) -> tuple[float, int]:
        """One window's share of :meth:`_pooled_rel_sd`: Σ ((v − m)/m)² and n − 1 (0, 0 under two values).

        Kept until the window's steps change: the pool is read at every step and for every measured
        limit at every decision, and a long job's polish measures a hundred limits or more.
        """
        size = (len(p.energy_J), len(p.time_s))
        hit = self._noise_terms.get((which, id(p)))
        if hit is not None and hit[0] is p and hit[1] == size:
            return hit[2], hit[3]
        values = self._values(p) if which == "cost" else p.time_s if which == "time_s" else p.energy_J
        mean = sum(values) / len(values) if len(values) >= 2 else 0.0
        term = (0.0, 0)
        if mean != 0 and math.isfinite(mean):
            term = (sum(((v - mean) / mean) ** 2 for v in values), len(values) - 1)
        self._noise_terms[(which, id(p))] = (p, size, *term)  # holds p: its id is not reused while cached
        return term

    def _widened(self, values: list[float], rel_sd: float, dof: int) -> tuple[float, float]:
        """95 % interval of the mean of ``values`` that a lucky, too-quiet small window cannot make narrow.

        Its own Student-t interval while the pool holds no other window; else
        t(0.975, pooled dof) × max(own sd, pooled relative sd × |mean|) / √n.
        """
        n = len(values)
        if n < 2 or dof <= n - 1:
            return t_interval(values)
        mean = sum(values) / n
        own = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
        half = t_quantile_975(dof) * max(own, rel_sd * abs(mean)) / math.sqrt(n)
        return mean - half, mean + half

    def _values(self, profile: LimitProfile) -> list[float]:
        return [self.objective.step_value(e, t) for e, t in zip(profile.energy_J, profile.time_s, strict=True)]

    def interval(self, profile: LimitProfile) -> tuple[float, float]:
        """95 % interval (low, high) of the limit's mean per-step objective value, floored by the card's noise."""
        return self._widened(self._values(profile), *self._pooled_rel_sd("cost"))

    def time_interval(self, profile: LimitProfile) -> tuple[float, float]:
        """95 % interval (low, high) of the limit's mean time per step (s), floored by the pooled time noise."""
        return self._widened(profile.time_s, *self._pooled_rel_sd("time_s"))

    def _feasible_costs(self, exclude: float) -> dict[float, float]:
        """The costs of the feasible limits with 2 resolved steps or more, ``exclude`` aside."""
        costs = self.costs()
        return {x: c for x, c in costs.items() if x != exclude and self.profiles[x].n >= 2 and c < INFEASIBLE_COST}

    def _best_upper(self, exclude: float) -> float:
        return min((self.interval(self.profiles[x])[1] for x in self._feasible_costs(exclude)), default=math.inf)

    def _best_mean(self, exclude: float) -> float:
        """The lowest mean cost of the feasible limits measured so far, ``exclude`` aside (inf: none)."""
        return min(self._feasible_costs(exclude).values(), default=math.inf)

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
            if profile.n >= 1:  # steps still awaiting energy join the profile when it arrives
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
        if profile.n < 2:
            return False
        # the last step, still awaiting its samples, counts: waiting for it would spend a step at a decided limit
        measured = self._measured_steps(profile.limit_W)
        low, high = self.interval(profile)
        mean = 0.5 * (low + high)
        # Sequential rejection: once other windows give the card's noise, a limit whose interval lies above
        # the best's is done, even before min_profile_steps (not in a sweep: Zeus's fixed windows).
        known_noise = s.search != "sweep" and any(p.n >= 2 for p in self.profiles.values() if p is not profile)
        if self._polishing and self._revisit_until_n is not None:
            return measured >= self._revisit_until_n
        if measured < max(s.min_profile_steps, 2):
            return known_noise and self._clearly_out(profile, low)
        if self._clearly_out(profile, low):
            return True
        if self._revisit_until_n is not None:  # a revisit measures a fixed number of further steps
            return measured >= self._revisit_until_n
        if not known_noise and s.search != "sweep" and self.objective.name != "max_slowdown":
            # The first window's t-interval is wide (3.18 at n = 4) only because the card's noise is unknown: it is
            # judged again with the pooled noise later, and measured again on a tie (not max_slowdown's reference).
            return True
        if self._feasibility_unclear(profile):
            return False
        if high - mean > s.rel_ci * abs(mean):
            # Not narrow yet: a limit no cheaper than the best so far cannot displace it on this evidence (a tie
            # is measured again before the choice, see _contender); the rest measure on.
            return s.search != "sweep" and mean >= self._best_mean(profile.limit_W)
        return True

    def _clearly_out(self, profile: LimitProfile, low: float) -> bool:
        """Whether the limit cannot be the best: its interval lies above the best's, or (max_slowdown) too slow."""
        if low > self._best_upper(profile.limit_W):
            return True
        return self._slowdown_interval(profile)[0] > self.objective.max_slowdown

    def _slowdown_interval(self, profile: LimitProfile) -> tuple[float, float]:
        """max_slowdown: an approximate 95 % interval of the limit's time over the maximum limit's, else (-inf, inf).

        The two means' relative half-widths combine in quadrature (the delta method for a ratio).
        """
        ref = self.profiles.get(self.limits_W[-1])
        if self.objective.name != "max_slowdown" or ref is None or ref is profile or ref.n < 2 or profile.n < 2:
            return -math.inf, math.inf
        t_low, t_high = self.time_interval(profile)
        r_low, r_high = self.time_interval(ref)
        t_mean, r_mean = 0.5 * (t_low + t_high), 0.5 * (r_low + r_high)
        ratio = t_mean / r_mean
        half = ratio * math.hypot((t_high - t_mean) / t_mean, (r_high - r_mean) / r_mean)
        return ratio - half, ratio + half

    def slowdown_upper(self, profile: LimitProfile) -> float | None:
        """max_slowdown: a one-sided 95 % upper bound of the limit's slowdown (its time over the maximum limit's).

        ``T/R × (1 + t(0.95, dof) × hypot(sT, sR))``, ``sT``, ``sR`` the relative standard errors of the
        two mean step times, each floored by the pooled time noise (docs/power_limit.md: the mean alone
        put half the choices at the boundary over it). 1 for the maximum; None without a noise estimate.
        """
        ref = self.profiles.get(self.limits_W[-1])
        if ref is None or ref.n == 0 or profile.n == 0:
            return None
        if ref is profile:
            return 1.0
        rel_sd, dof = self._pooled_rel_sd("time_s")
        if dof < 1:
            return None
        rel_se = []
        for p in (profile, ref):
            mean = p.time_per_step_s
            own = math.sqrt(sum((t - mean) ** 2 for t in p.time_s) / (p.n - 1)) / mean if p.n >= 2 else 0.0
            rel_se.append(max(own, rel_sd) / math.sqrt(p.n))
        ratio = profile.time_per_step_s / ref.time_per_step_s
        return ratio * (1.0 + t_quantile_95(dof) * math.hypot(*rel_se))

    def _feasibility_unclear(self, profile: LimitProfile) -> bool:
        """max_slowdown: whether the limit's slowdown interval straddles the allowed factor and is still wide.

        Wide (half-width over ``rel_ci`` / 2 of the ratio): up to twice ``min_profile_steps``. Mean within
        the factor but not its bound (:meth:`slowdown_upper`): up to 4 × ``min_profile_steps``.
        """
        low, high = self._slowdown_interval(profile)
        factor = self.objective.max_slowdown
        if not low < factor < high:
            return False
        s = self.settings
        wide = 0.5 * (high - low) > 0.25 * s.rel_ci * (low + high)
        if wide and profile.n < 2 * max(s.min_profile_steps, 2):
            return True
        upper = self.slowdown_upper(profile)
        return 0.5 * (low + high) < factor < (upper or math.inf) and profile.n < 4 * max(s.min_profile_steps, 2)

    def costs(self) -> dict[float, float]:
        """Cost of every measured limit (W → cost), per :attr:`objective` (max_slowdown: on :meth:`slowdown_upper`)."""
        ref_t = self._ref_time_s()
        return {
            limit: self.objective.cost(p.energy_per_step_J, self._judged_time_s(p, ref_t), ref_t)
            for limit, p in self.profiles.items()
            if p.n
        }

    def _ref_time_s(self) -> float | None:
        """The maximum limit's mean time per step (s), max_slowdown's reference; None until measured."""
        ref = self.profiles.get(self.limits_W[-1])
        return ref.time_per_step_s if ref is not None and ref.n else None

    def _judged_time_s(self, profile: LimitProfile, ref_t: float | None) -> float:
        """The time per step feasibility is judged on: max_slowdown's upper bound × the reference, else the mean."""
        if self.objective.name != "max_slowdown" or not ref_t:
            return profile.time_per_step_s
        upper = self.slowdown_upper(profile)
        if upper is None:
            return profile.time_per_step_s
        return max(profile.time_per_step_s, upper * ref_t)

    def _next_limit(self) -> bool:
        if self.abandoned:
            self.chosen_limit_W = None
            self.state = ProfilerState(ProfilerPhase.DONE, None)
            return True
        if self.observe_only:
            self.state = ProfilerState(ProfilerPhase.OBSERVE, self.state.limit_W)
            return True
        following = self._search()
        if following is not None:
            self._enter_limit(following)
            return False
        again = self._contender()
        if again is not None:
            self._enter_limit(again)
            self._revisit_until_n = self._measured_steps(again) + max(self.settings.min_profile_steps, 2)
            self.revisits += 1
            return False
        self.search_done = True
        polish = self._polish()
        if polish is not None:
            self._enter_limit(polish[0])
            self.polishes += 1
            if polish[1]:  # a revisit of a fixed length; 0: a grid limit's first window, decided as any
                self._revisit_until_n = self._measured_steps(polish[0]) + polish[1]
                self._polishing = True
            return False
        self.chosen_limit_W = self._cheapest(self._choice_costs(self.costs()))
        self.state = ProfilerState(ProfilerPhase.DONE, self.chosen_limit_W)
        return True

    def _choice_costs(self, costs: dict[float, float]) -> dict[float, float]:
        """The costs the choice compares: each pooled with its neighbours' line (:func:`neighbour_pooled_costs`).

        Not for ``max_slowdown`` (its choice is the cheapest limit within the bound, read as measured),
        nor under a full sweep (Zeus's choice, the baseline). A limit with under two steps has no interval:
        it neither pools nor lends its reading.
        """
        if not _POOLED_CHOICE or self.objective.name == "max_slowdown" or self.settings.search == "sweep":
            return costs
        measured = self.measured()
        spread = {x: measured[x] if self.profiles[x].n >= 2 else Measured(costs[x], math.inf) for x in costs}
        return neighbour_pooled_costs(spread, variance_from_W=self.limits_W)

    def _cheapest(self, costs: dict[float, float]) -> float:
        """The cheapest limit of ``costs`` (W), the higher on a tie.

        A scout's short reading (:meth:`_gap_to_scout`) decides nothing until its limit is measured
        again, to a full window's steps.
        """
        full = max(self.settings.min_profile_steps, 2)
        # a scout named but not yet run has no profile (a run may end right after the polish picked it)
        short = {x for x in self.scouted_W if x not in self.profiles or self.profiles[x].n < full}
        decided = {x: c for x, c in costs.items() if x not in short} or costs
        return min(decided, key=lambda k: (decided[k], -k))

    def choose_now(self) -> float | None:
        """End the polish where it stands (the run ends before it did): choose the best measured limit.

        The search had finished (:attr:`search_done`): its choice is the cheapest limit with two or more
        resolved steps, as at the polish's own end. Returns the chosen limit (W), or None when the
        search had not finished or the profile is over.
        """
        if not self.search_done or self.state.phase not in (ProfilerPhase.WARMUP, ProfilerPhase.PROFILING):
            return None
        costs = {x: c for x, c in self.costs().items() if self.profiles[x].n >= 2}
        if not costs:
            return None
        self.chosen_limit_W = self._cheapest(self._choice_costs(costs))
        self.state = ProfilerState(ProfilerPhase.DONE, self.chosen_limit_W)
        return self.chosen_limit_W

    def _measured_steps(self, limit_W: float) -> int:
        """Profiled steps at ``limit_W``: those with energy and those still awaiting it."""
        profile = self.profiles.get(limit_W)
        if profile is None:  # a limit not entered yet (a scout's)
            return 0
        return profile.n + sum(1 for pending in self._pending if pending.profile is profile)

    def measured(self) -> dict[float, Measured]:
        """Every measured limit's cost, its 95 % interval's half-width and its slowdown (max_slowdown: its bound)."""
        costs = self.costs()
        ref_t = self._ref_time_s()
        out = {}
        for limit, cost in costs.items():
            prof = self.profiles[limit]
            low, high = self.interval(prof) if prof.n >= 2 else (cost, cost)
            # the slowdown the search sees is the one judged: its upper bound with max_slowdown
            slowdown = self._judged_time_s(prof, ref_t) / ref_t if ref_t else None
            out[limit] = Measured(cost, 0.5 * (high - low), slowdown)
        return out

    def _contender(self) -> float | None:
        """A measured limit to measure again before choosing, or None: the best and its runner-up are resolved.

        The runner-up is the cheapest limit the best cannot be told apart from (:func:`tolerance`); the
        wider of the two gets ``min_profile_steps`` more steps while their combined half-widths exceed
        ``rel_ci`` of the best cost, up to ``max_revisits`` times (docs/power_limit.md, "Before choosing").
        """
        s = self.settings
        if s.search == "sweep" or self.revisits >= s.max_revisits:
            return None
        feasible = {x: m for x, m in self.measured().items() if m.cost < INFEASIBLE_COST}
        if len(feasible) < 2:
            return None
        best_x = min(feasible, key=lambda x: (feasible[x].cost, -x))
        best = feasible[best_x]
        floor = s.unimodal_tolerance
        tied = [x for x, m in feasible.items() if x != best_x and m.cost - best.cost <= tolerance(m, best, floor)]
        spread = max(m.cost for m in feasible.values()) - best.cost
        if not tied or len(tied) == len(feasible) - 1 or spread <= 2 * s.rel_ci * abs(best.cost):
            return None
        runner = min(tied, key=lambda x: (feasible[x].cost, -x))
        if math.hypot(feasible[runner].half_width, best.half_width) <= s.rel_ci * abs(best.cost):
            return None
        each_resolved = max(feasible[runner].half_width, best.half_width) <= s.rel_ci * abs(best.cost)
        if self.objective.name == "max_slowdown" and each_resolved:
            # the pair sits at the slowdown boundary: its narrowing decides (measured: every family as good
            # or better, flat_topped 0.396 → 0.348 of the sweep; for energy this rule costs up to 1.4 pt of gap)
            return None
        extra = max(s.min_profile_steps, 2)
        for x in sorted((runner, best_x), key=lambda x: -feasible[x].half_width):
            if self.profiles[x].n + extra <= s.profile_steps:
                return x
        return None

    def _price(self, limit_W: float) -> float:
        """What a step at ``limit_W`` costs the job: its objective value (max_slowdown: its energy, J)."""
        p = self.profiles[limit_W]
        if self.objective.name == "max_slowdown":
            return p.energy_per_step_J
        return self.objective.step_value(p.energy_per_step_J, p.time_per_step_s)

    def excess_steps(self, best_W: float, among: Collection[float] | None = None) -> float:
        """Step-equivalents of cost profiling spent above ``best_W``'s: Σ steps × max(price / best's − 1, 0).

        ``among``: only at these limits (W); None: at every measured limit.
        """
        best = self._price(best_W)
        if not best > 0:
            return math.inf
        return sum(
            p.steps * max(self._price(x) / best - 1.0, 0.0)
            for x, p in self.profiles.items()
            if p.n and (among is None or x in among)
        )

    def _polish(self) -> tuple[float, int] | None:
        """(limit, steps) to measure again before choosing, where the remaining job repays it; None: choose now.

        Only with ``job_steps`` known, while profiling's excess cost over the best (:meth:`excess_steps`),
        this window's included, stays under ``polish_budget × job_steps`` and its steps under
        ``polish_max_share × job_steps``. In order: a grid limit the search left out
        (:meth:`_unmeasured_grid_limit`); with max_slowdown, the boundary (:meth:`_boundary_to_polish`);
        the wider of the best and a tie, while their combined half-widths exceed ``polish_ci`` of the
        best cost. Each window doubles the limit's steps (at least ``min_profile_steps``, at most
        ``profile_steps``); 0 steps: a grid limit's first window, decided as any.
        """
        s = self.settings
        if s.search == "sweep" or not s.job_steps or self.observe_only:
            return None
        measured = self.measured()
        feasible = {x: m for x, m in measured.items() if m.cost < INFEASIBLE_COST and self.profiles[x].n >= 2}
        if not feasible:
            return None
        best_x = min(feasible, key=lambda x: (feasible[x].cost, -x))
        best = feasible[best_x]
        best_price = self._price(best_x)
        if not best_price > 0:
            return None
        spent, budget = self.excess_steps(best_x), s.polish_budget * s.job_steps
        if self.profiling_steps + s.warmup_steps + s.profile_steps > s.polish_max_share * s.job_steps:
            return None  # near-free steps (ties at the optimum) are bounded in number too
        grid_x = self._unmeasured_grid_limit(best_price, budget - spent)
        if grid_x is not None:
            return grid_x, 0
        if self.objective.name != "max_slowdown":
            scouts_spent = self.excess_steps(best_x, among=self.scouted_W)
            scout_x = self._gap_to_scout(
                feasible, best_price, min(budget - spent, _SCOUT_BUDGET_SHARE * budget - scouts_spent)
            )
            if scout_x is not None:
                self.scouted_W.add(scout_x)
                return scout_x, _SCOUT_STEPS
        target = None
        if self.objective.name == "max_slowdown":
            target = self._boundary_to_polish(best_x)
        if target is None and self.objective.name != "max_slowdown":
            informative = self._most_informative(feasible, best_x, best_price, budget - spent)
            gap = self._most_promising_gap(feasible, best_x, budget - spent)
            if gap is not None and (informative is None or gap[1] > informative[1]):
                return gap[0], 0
            target = informative[0] if informative is not None else None
        elif target is None:
            floor = s.unimodal_tolerance
            tied = [x for x, m in feasible.items()
                    if abs(x - best_x) > _TIE_APART_W and m.cost - best.cost <= tolerance(m, best, floor)]  # fmt: skip
            if tied:
                runner = min(tied, key=lambda x: (feasible[x].cost, -x))
                if math.hypot(feasible[runner].half_width, best.half_width) > s.polish_ci * abs(best.cost):
                    target = max((runner, best_x), key=lambda x: feasible[x].half_width)
        if target is None:
            return None
        extra = self._polish_steps(target)
        excess = max(self._price(target) / best_price - 1.0, 0.0)
        if spent + (extra + s.warmup_steps) * excess > budget:
            return None
        return target, extra

    def _polish_steps(self, limit_W: float) -> int:
        """Profiled steps of a polish window at ``limit_W``: its steps doubled, within the window bounds."""
        s = self.settings
        return min(max(self._measured_steps(limit_W), s.min_profile_steps, 2), max(s.profile_steps, 2))

    def _most_informative(
        self, feasible: dict[float, Measured], best_x: float, best_price: float, budget_left: float
    ) -> tuple[float, float] | None:
        """(limit, gain per step) of the window that buys most expected saving per step; None: none repays it.

        For each measured limit apart from the best: the expected saving per step of choosing it over the
        best, ``E[max(best − cost, 0)]`` under a normal difference with the two intervals' combined spread
        (relative to the best's cost), times the job's steps left, less what the window costs over the
        best. The window measures the wider of the two, where the excess budget left pays it. Ranked per
        step of the window, since the polish's steps are capped: a limit dropped after a short, noisy
        window is cheap to measure again, a tie already measured long is not. Pairs whose combined
        half-widths are under ``polish_ci`` of the best's cost are settled, and so is a pair whose window
        saves under ``polish_ci`` of a step per step. A limit close to the best
        in watts is no exception: on a curve with a kink at the optimum (a trace's measured points), 2 W
        off it can cost 0.7 % more.
        """
        s = self.settings
        best = feasible[best_x]
        chosen, chosen_rate = None, 0.0
        for x, m in feasible.items():
            spread = math.hypot(m.half_width, best.half_width)
            if x == best_x or not spread > s.polish_ci * abs(best.cost):
                continue
            saving = _expected_saving(m.cost - best.cost, spread / 1.96)
            target = max((x, best_x), key=lambda y: feasible[y].half_width)
            window = self._polish_steps(target) + s.warmup_steps
            excess = max(self._price(target) / best_price - 1.0, 0.0)
            rate = self._repaid_rate(saving / abs(best.cost), window, excess, budget_left)
            if rate > chosen_rate:
                chosen, chosen_rate = target, rate
        return None if chosen is None else (chosen, chosen_rate)

    def _most_promising_gap(
        self, feasible: dict[float, Measured], best_x: float, budget_left: float
    ) -> tuple[float, float] | None:
        """(limit, gain per step) of the unmeasured limit whose first window buys the most expected saving; None: none.

        The candidates are the middles of the gaps between measured limits (:func:`wiener_gaps`: the
        cost there as a Brownian bridge between the gap's ends). Each is ranked as in
        :meth:`_most_informative`: the expected saving per step of finding it cheaper than the best,
        ``E[max(best − cost, 0)]``, times the job's steps left, less its window's predicted excess over
        the best, per step of the window. The search's grid and its local refinement see one valley and
        smooth curves; this finds a kink between two measured limits or a second valley where a long job
        repays looking (measured on the V100 and A40 traces: the knot at the optimum between two
        grid limits, a second valley the golden-section search left).
        """
        s = self.settings
        best = feasible[best_x]
        window = s.warmup_steps + max(s.min_profile_steps, 2)
        chosen, chosen_rate = None, 0.0
        spacing = (self.limits_W[-1] - self.limits_W[0]) / max(len(self.limits_W) - 1, 1)  # the grid's
        min_gap_W = max(_EXPLORE_MIN_GAP_W, _EXPLORE_GRID_SHARE * spacing)
        for gap in wiener_gaps(feasible, min_gap_W, variance_from_W=self.limits_W):
            if gap.limit_W in self.profiles or not 0 < gap.sd < math.inf:
                continue
            saving = _expected_saving(gap.cost - best.cost, gap.sd)
            excess = max(gap.cost / best.cost - 1.0, 0.0)
            rate = self._repaid_rate(saving / abs(best.cost), window, excess, budget_left)
            if rate > chosen_rate:
                chosen, chosen_rate = gap.limit_W, rate
        return None if chosen is None else (chosen, chosen_rate)

    def _gap_to_scout(self, feasible: dict[float, Measured], best_price: float, budget_left: float) -> float | None:
        """The middle of the gap between measured limits to scout next, a short window there; None: none left.

        A narrow second valley between two measured limits reads, from its ends, like the smooth curve it
        sits on, so neither the bridge's prediction (:meth:`_most_promising_gap`) nor the search's refinement
        goes there. A scout reads such a gap blind: ``_SCOUT_STEPS`` steps after the warm-up, about a tenth
        of a full window. The gap whose scout costs least per watt of gap goes first, its price
        interpolated between its ends, while that price fits ``budget_left`` (step-equivalents; the polish
        gives the scouts a ``_SCOUT_BUDGET_SHARE`` of its budget), so a longer job scouts finer. Gaps with
        an end that ties the best are the refinement's and the gap probes' ground, and gaps under twice
        :meth:`_most_promising_gap`'s narrowest are not scouted. A scout that reads low is measured again as
        any tie with the best (:meth:`_most_informative`); until then it decides nothing (:meth:`_cheapest`).
        """
        s = self.settings
        window = s.warmup_steps + _SCOUT_STEPS
        spacing = (self.limits_W[-1] - self.limits_W[0]) / max(len(self.limits_W) - 1, 1)
        min_gap_W = 2 * max(_EXPLORE_MIN_GAP_W, _EXPLORE_GRID_SHARE * spacing)
        points = sorted(self.profiles)  # infeasible limits bound gaps too: their middles are not scouted
        best = feasible[min(feasible, key=lambda x: (feasible[x].cost, -x))]

        def ties_best(x: float) -> bool:
            return feasible[x].cost - best.cost <= math.hypot(feasible[x].half_width, best.half_width)

        best_gap: tuple[float, float] | None = None  # (middle, excess per watt of gap)
        for a, b in zip(points, points[1:], strict=False):
            if b - a < min_gap_W or a not in feasible or b not in feasible or ties_best(a) or ties_best(b):
                continue
            excess = window * max(0.5 * (self._price(a) + self._price(b)) / best_price - 1.0, 0.0)
            if excess > budget_left:
                continue
            if best_gap is None or excess / (b - a) < best_gap[1]:
                best_gap = (round(0.5 * (a + b), 3), excess / (b - a))
        return None if best_gap is None else best_gap[0]

    def _repaid_rate(self, saving: float, window: int, excess: float, budget_left: float) -> float:
        """What a polish window gains per step of it (step-equivalents), or 0 when it does not repay itself.

        ``saving``: the expected saving per step of the job left (a fraction of the best's cost);
        ``window``: the window's steps; ``excess``: its price over the best's per step (a fraction).
        Gain: ``saving`` × the steps left − ``window`` × ``excess``. It must exceed a ``polish_ci`` share of a
        step per step of the window (a window at the best costs no excess, yet must save something), and
        the window's excess must fit the ``budget_left`` (step-equivalents).
        """
        s = self.settings
        assert s.job_steps is not None
        gain = saving * (s.job_steps - self.profiling_steps) - window * excess
        return gain / window if gain > window * s.polish_ci and window * excess <= budget_left else 0.0

    def _unmeasured_grid_limit(self, best_price: float, budget_left: float) -> float | None:
        """A grid limit not measured yet whose first window the budget left (step-equivalents) pays; None: none.

        Its price is interpolated linearly between measured limits; the cheapest guess first. With
        max_slowdown, none below a limit measured clearly too slow.
        """
        s = self.settings
        known = sorted(x for x, p in self.profiles.items() if p.n >= 2)
        if len(known) < 2:
            return None
        floor = -math.inf
        if self.objective.name == "max_slowdown":
            slow = [x for x in known if self._slowdown_interval(self.profiles[x])[0] > self.objective.max_slowdown]
            floor = max(slow, default=-math.inf)
        prices = [self._price(x) for x in known]
        window = s.warmup_steps + max(s.min_profile_steps, 2)
        guesses = []
        for x in self.limits_W:
            if x in self.profiles or x <= floor:
                continue
            guess = float(np.interp(x, known, prices))
            guesses.append((max(guess / best_price - 1.0, 0.0), -x))
        if not guesses:
            return None
        excess, neg_x = min(guesses)
        return -neg_x if window * excess <= budget_left else None

    def _boundary_to_polish(self, best_x: float) -> float | None:
        """max_slowdown: the limit whose further steps narrow the slowdown bound that keeps a cheaper limit out.

        The highest limit below the best, not clearly dearer, whose slowdown interval reaches below the
        factor though its bound does not, with a margin wider than ``polish_ci``; else the best itself
        when a cheaper limit below it is too slow. That limit, or the maximum limit (the time reference)
        while it has under a third of that limit's steps. None: no such limit.
        """
        ref = self.profiles[self.limits_W[-1]]
        factor = self.objective.max_slowdown
        _, best_high = self._widened(self.profiles[best_x].energy_J, *self._pooled_rel_sd("energy_J"))
        candidates = []
        for x, p in self.profiles.items():
            if x >= best_x or p.n < 2 or p.energy_per_step_J >= best_high:  # clearly dearer: no gain
                continue
            ratio = p.time_per_step_s / ref.time_per_step_s
            upper = self.slowdown_upper(p)
            # not clearly too slow (its two-sided interval reaches below the factor), not yet judged within it
            low = self._slowdown_interval(p)[0]
            if low <= factor < (upper or math.inf) and (upper or math.inf) / ratio - 1 > self.settings.polish_ci:
                candidates.append(x)
        if candidates:
            x = max(candidates)
        else:
            # the best on the boundary (a cheaper limit below it is too slow): its own margin
            best = self.profiles[best_x]
            ratio = best.time_per_step_s / ref.time_per_step_s
            upper = self.slowdown_upper(best)
            below = [x for x in self.profiles if x < best_x and self.profiles[x].n >= 2]
            cheaper_below = any(self.profiles[x].energy_per_step_J < best.energy_per_step_J for x in below)
            if best_x == self.limits_W[-1] or not cheaper_below or upper is None:
                return None
            if upper / ratio - 1 <= self.settings.polish_ci:
                return None
            x = best_x
        # the reference costs the most energy a step: it gets a third of the boundary limit's steps
        return self.limits_W[-1] if _REF_SHARE * ref.n < self.profiles[x].n else x

    def _search(self) -> float | None:
        was_sweeping = self._plan.fallback_sweep
        following = self._plan.next_limit(self.measured())
        self.fallback_sweep = self._plan.fallback_sweep
        if self.fallback_sweep and not was_sweeping:
            logger.info("zeus-callbacks: the measured cost curve is not unimodal; sweeping every limit")
        return following
