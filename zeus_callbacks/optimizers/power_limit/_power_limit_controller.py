"""Apply the profiler's limits to a backend's GPUs safely: marker first, observe mode, cache, restore on every exit."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from zeus_callbacks._lifecycle import CLEANUPS, CleanupOrder, Registration
from zeus_callbacks._plots import plot_profile
from zeus_callbacks.optimizers.cost import ZeusCost
from zeus_callbacks.optimizers.power_limit._actuator import ActuatorError, ActuatorPermissionDenied, PowerLimitActuator
from zeus_callbacks.optimizers.power_limit._cache import CACHE_NAME, JsonProfileCache, ProfileCache, ProfileKey
from zeus_callbacks.optimizers.power_limit._gpu_lock import GpuLock
from zeus_callbacks.optimizers.power_limit._limit_profiler import (
    EnergyFn,
    PowerLimitProfiler,
    ProfilerPhase,
    ProfileSettings,
)
from zeus_callbacks.optimizers.power_limit._marker import marker_path, marker_paths, write_marker
from zeus_callbacks.optimizers.power_limit._objective import Objective
from zeus_callbacks.optimizers.power_limit._owner import Owner
from zeus_callbacks.optimizers.power_limit._search import power_limit_grid_W
from zeus_callbacks.optimizers.power_limit._time_note import time_note

logger = logging.getLogger(__name__)


def limits_measured_text(measured: int, tried: int) -> str:
    """How much of an unfinished profile was measured, as the warning and ``zeus-callbacks report`` say it.

    Args:
        measured: Limits whose window was decided (the one under test and a limit never profiled are not).
        tried: Limits the profile record lists (:attr:`PowerLimitResult.rows`).

    Returns:
        E.g. ``"9 of the 10 limits tried measured"``.
    """
    return f"{measured} of the {tried} limit{'' if tried == 1 else 's'} tried measured"


@dataclass(frozen=True)
class PowerLimitResult:
    """The outcome, for the log (source: profile, cache, checkpoint, observe, unfinished or abandoned)."""

    source: str
    chosen_limit_W: float | None
    profiling_steps: int
    objective: str
    rows: list[dict[str, Any]]
    fallback_sweep: bool
    message: str
    finished: bool = True
    limits_measured: int | None = None  # unfinished only: the rows whose window was decided (see unfinished)


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
        backend: PowerLimitActuator,
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
        # A leftover at a rank marker's old name (no host) may hold this GPU's original limit too.
        self._old_marker_paths = marker_paths(log_dir, config.restore_marker)[1:]
        cache_path = Path(config.cache_path) if config.cache_path else Path(log_dir) / CACHE_NAME
        self.cache: ProfileCache | None = (cache or JsonProfileCache(cache_path)) if config.cache else None
        self.job_id = job_id
        self.world_size = world_size
        self.is_main_process = is_main_process
        self.observe = bool(backend.read_only)
        self.observe_reason = "read-only mode (ZEUS_CALLBACKS_READ_ONLY)" if self.observe else ""
        self._owner = Owner.this_process()
        self._locks: dict[int, GpuLock] = {}
        if not self.observe:
            busy = self._lock_gpus()  # before the original limits are read: never record another run's
            if busy:
                self.observe, self.observe_reason = True, busy
        self.original_W = {i: backend.power_limit_W(i) for i in self.gpu_indices}
        low = max(backend.power_limit_constraints_W(i)[0] for i in self.gpu_indices)
        high = min(backend.power_limit_constraints_W(i)[1] for i in self.gpu_indices)
        objective = Objective(
            config.objective,
            config.eta_knob,
            config.max_slowdown,
            ZeusCost.for_gpus(config.eta_knob, high, len(self.gpu_indices)).max_power_W,
        )
        # the config's fields of the settings' names (the rest are the profiler's own constants)
        settings = ProfileSettings(
            **{f.name: getattr(config, f.name) for f in fields(ProfileSettings) if hasattr(config, f.name)}
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
        self._cleanup: Registration | None = None
        self._lock = threading.RLock()
        self._step_index = 0

    # -- state -------------------------------------------------------------------------
    @property
    def limit_W(self) -> float:
        """The limit in force (mean over the GPUs, W)."""
        return self.applied_W if self.applied_W is not None else sum(self.original_W.values()) / len(self.original_W)

    def _warn_observe(self) -> None:
        logger.warning(
            "zeus-callbacks: power-limit profiling runs in observe mode (%s): it measures at the "
            "current limit only and changes nothing",
            self.observe_reason,
        )

    def enter_observe(self, reason: str) -> None:
        """Switch to observe mode now (restore the original limits), saying why once."""
        if self.observe:
            return
        self.observe = True
        self.observe_reason = reason
        self._warn_observe()
        self.restore()
        self.profiler.restart_observing(self.limit_W)

    def time_note(self) -> str | None:
        """Why this profile's times are not real (the virtual GPU on the real clock), or None.

        See :mod:`~zeus_callbacks.optimizers.power_limit._time_note`. None in observe mode: only the
        limit in force is measured, so no two limits are compared.
        """
        if self.observe:
            return None
        chosen = self.result.chosen_limit_W if self.result is not None else None
        return time_note(self.backend, chosen if chosen is not None else self.profiler.limits_W[0])

    # -- checkpoint state ------------------------------------------------------------------
    def export_state(self) -> dict[str, Any] | None:
        """The profile so far, for a checkpoint (:meth:`PowerLimitProfiler.export_state`); None in observe mode."""
        return None if self.observe else self.profiler.export_state()

    def resume(self, state: Mapping[str, Any]) -> bool:
        """Continue a checkpoint's profile before the first step (:meth:`PowerLimitProfiler.resume`); True if taken.

        A profile that had finished applies its choice from the first step, without the cache.
        """
        if self.observe or not self.profiler.resume(state):
            return False
        p = self.profiler
        if p.phase == ProfilerPhase.DONE and p.chosen_limit_W is not None:
            message = f"continued the checkpoint's power-limit choice {p.chosen_limit_W:.0f} W without profiling"
            self._conclude("checkpoint", p.chosen_limit_W, message)
        decided = sorted(p.profiles)
        logger.info(
            "zeus-callbacks: continuing the checkpoint's power-limit profile (%d limits decided: %s W)",
            len(decided), ", ".join(f"{x:.0f}" for x in decided) or "none",
        )  # fmt: skip
        return True

    # -- events ------------------------------------------------------------------------
    def on_step_start(self, step: int, now_s: float) -> None:
        """Apply the limit the next step must run at (before its window opens)."""
        if self.profiler.phase == ProfilerPhase.IDLE and self._step_index == 0:
            return  # the first step runs untouched: its batch size keys the cache
        if self.profiler.phase == ProfilerPhase.IDLE and self.observe:
            self.profiler.start_at(self.limit_W)
        target = self.profiler.on_step_start(step, now_s)
        if target is not None and not self.observe:
            self.apply(target)

    def on_step_end(self, step: int, now_s: float, num_samples: int | None = None) -> PowerLimitResult | None:
        """Advance the profiler; returns the result once, when the choice is made."""
        self._step_index += 1
        if self._step_index == 1 and self.profiler.phase == ProfilerPhase.IDLE:
            return self._consult_cache(num_samples)
        if self.profiler.on_step_end(step, now_s):
            return self._finish()
        return None

    def on_eval_start(self, now_s: float) -> None:
        """An evaluation begins (excluded from profiling)."""
        self.profiler.on_eval_start(now_s)

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
        if not self.profiler.limits_W[0] <= limit <= self.profiler.limits_W[-1]:
            logger.warning("zeus-callbacks: cached power limit %.0f W is out of range; profiling again", limit)
            return None
        self.profiler.finish_with(limit)
        self.apply(limit)
        message = f"applied the cached power limit {limit:.0f} W for {self.key.as_str()} without profiling"
        return self._conclude(
            "cache", limit, message, logging.INFO, rows=_cached_rows(entry), profiling_steps=0, sweep=False
        )

    def _conclude(
        self,
        source: str,
        chosen_W: float | None,
        message: str,
        level: int | None = None,
        *,
        rows: list[dict[str, Any]] | None = None,
        profiling_steps: int | None = None,
        sweep: bool | None = None,
        finished: bool = True,
        limits_measured: int | None = None,
    ) -> PowerLimitResult:
        """Keep (and log at ``level``) the outcome; what is not given comes from the profiler."""
        p = self.profiler
        if level is not None:
            logger.log(level, "zeus-callbacks: %s", message)
        steps = p.profiling_steps if profiling_steps is None else profiling_steps
        rows = self._rows() if rows is None else rows
        sweep = p.fallback_sweep if sweep is None else sweep
        self.result = PowerLimitResult(
            source, chosen_W, steps, p.objective.key(), rows, sweep, message, finished, limits_measured
        )
        return self.result

    def _rows(self) -> list[dict[str, Any]]:
        """The per-limit table of what was measured, highest limit first (``scout``: first measured by a scout)."""
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
                "scout": limit in p.scouted_W,
            }
            for limit, prof in sorted(p.profiles.items(), reverse=True)
        ]

    def unfinished(self, steps: int) -> PowerLimitResult | None:
        """The outcome (``finished=False``) when training ends after ``steps`` steps, before profiling did.

        None when a result exists already or no limit was tried. A run that ends during the polish
        (``job_steps`` told, the search done) gets the best measured limit, cached for the next run
        (``finished=True``: only the polish was cut short).
        """
        p = self.profiler
        if self.result is not None or not p.profiles:
            return None
        if not self.observe and p.choose_now() is not None:
            told = p.settings.job_steps
            return self._finish(
                apply=False,
                note=f"; the run ended after {steps} of the {told} steps it was expected to run, before the polish did",
            )
        rows = self._rows()
        tried = sorted({r["limit_W"] for r in rows})
        trained = f"{tried[0]:.0f} W" if len(tried) == 1 else f"{tried[0]:.0f}–{tried[-1]:.0f} W"
        # decided windows: every measured limit but the one under test (a limit clearly worse than the
        # best is decided on fewer than min_profile_steps steps)
        under_test = p.state.limit_W if p.phase in (ProfilerPhase.WARMUP, ProfilerPhase.PROFILING) else None
        done = sum(1 for r in rows if r["limit_W"] != under_test and r["profiled_steps"] >= 2)
        if self.observe:  # observe mode was announced once already: the run's end is no second warning
            message = (
                f"observe mode ({self.observe_reason}): measured the limit in force ({trained}) until the run "
                f"ended after {steps} steps; nothing was chosen or changed"
            )
            return self._conclude("observe", None, message, logging.INFO, rows=rows, finished=False)
        # "of" the rows the record lists (the search adds limits off the grid, and never tries some on it)
        message = (
            f"power-limit profiling did not finish in {steps} steps ({limits_measured_text(done, len(rows))}); "
            f"the run trained at {trained} and no limit was chosen; raise max_steps/epochs, or "
            "lower power_limit.profile_steps / warmup_steps so profiling ends within the run"
        )
        return self._conclude(
            "unfinished", None, message, logging.WARNING, rows=rows, finished=False, limits_measured=done
        )

    def _finish(self, *, apply: bool = True, note: str = "") -> PowerLimitResult:
        """Conclude a decided profile: apply its choice (unless ``apply`` is False), log, plot and cache it."""
        p = self.profiler
        rows = self._rows()
        if p.phase == ProfilerPhase.OBSERVE:
            current = p.state.limit_W
            message = (
                f"observe mode ({self.observe_reason}): measured only the current limit "
                f"{current:.0f} W; cannot profile other limits, so no limit is chosen or changed"
            )
            return self._conclude("observe", None, message, logging.WARNING, rows=rows, sweep=False)
        chosen = p.chosen_limit_W
        if chosen is None:  # abandoned: no power samples
            self.restore()
            message = "profiling abandoned (no power samples arrived); the original limits are kept"
            return self._conclude("abandoned", None, message, rows=rows, sweep=False)
        if apply:
            self.apply(chosen)
        message = (
            f"chose power limit {chosen:.0f} W ({p.objective.key()}) after {p.profiling_steps} profiling "
            f"steps over {len(rows)} limits{_scouts_note(rows)}"
            f"{' (full sweep: cost curve not unimodal)' if p.fallback_sweep else ''}"
            f"{note}"
        )
        result = self._conclude("profile", chosen, message, logging.INFO, rows=rows)
        if self.plot_path is not None and self.is_main_process:
            try:
                plot_profile(rows, chosen, self.plot_path, simulated=self.backend.simulated, time_note=self.time_note())
            except ImportError as exc:  # the plot extra is not installed: the run goes on, and says so
                logger.warning(
                    "zeus-callbacks: power_limit.plot is on but %s: install zeus-callbacks[plot] "
                    "(pip install 'zeus-callbacks[plot]'); the profile PNG %s is skipped", exc, self.plot_path,
                )  # fmt: skip
            except Exception as exc:  # no display, full disk: the run goes on
                logger.warning("zeus-callbacks: cannot plot the power-limit profile (%s)", exc)
        if self.cache is not None and self.key is not None and self.is_main_process:
            try:
                self.cache.put(self.key, {"chosen_limit_W": chosen, "limits": rows, "time": time.time()})
            except OSError as exc:
                logger.warning("zeus-callbacks: cannot write the power-limit cache (%s)", exc)
        return result

    # -- hardware --------------------------------------------------------------------------
    def _lock_gpus(self) -> str:
        """Take every GPU's profiling lock (docs/reliability.md#the-restore-protocol); why not, or "".

        A GPU whose lock another live run holds is being profiled by it: this run observes. A
        lock taken over from a killed owner may come with that owner's record of the original
        limit: it is put back first, so the limit read next is the true original.
        """
        for i in self.gpu_indices:
            uuid = self.backend.device_uuid(i)
            if uuid is None:  # no identity outside this process (the virtual GPU): nothing to share
                continue
            try:
                lock = GpuLock(uuid)
                taken = lock.try_acquire()
            except OSError as exc:
                self._release_locks()
                return f"cannot take the profiling lock of GPU {i} ({uuid}): {exc}"
            if not taken:
                self._release_locks()
                return (f"another run is profiling GPU {i} ({uuid}) and holds its lock {lock.path}; "
                        "this run measures at the limit that run sets")  # fmt: skip
            self._locks[i] = lock
            record = lock.read_record()
            if record is not None:
                limit, owner, marker = record
                try:
                    low, high = self.backend.power_limit_constraints_W(i)
                    self.backend.set_power_limit_W(i, min(max(limit, low), high))
                except (ActuatorError, ValueError) as exc:
                    self._release_locks()
                    return f"cannot put back GPU {i}'s original limit {limit:.0f} W left by {owner.describe()}: {exc}"
                lock.clear_record()
                logger.warning(
                    "zeus-callbacks: GPU %d (%s): put back the original %.0f W that %s left (marker %s)",
                    i, uuid, limit, owner.describe(), marker,
                )  # fmt: skip
        return ""

    def _release_locks(self) -> None:
        for lock in self._locks.values():
            lock.release()
        self._locks.clear()

    def apply(self, limit_W: float) -> None:
        """Apply ``limit_W`` to every GPU (the restore marker and GPU records first)."""
        with self._lock:
            if self.observe or self.applied_W == limit_W:
                return
            if not self._marker_written:
                held = next((p for p in (self.marker_path, *self._old_marker_paths) if p.exists()), None)
                if held is not None:  # not ours: another run's, one kept after a failure, or no marker
                    self.enter_observe(
                        f"the restore marker path {held} holds a file this run did not write; it may hold a "
                        "GPU's original limit (run `zeus-callbacks restore`, or move it away)"
                    )
                    return
                try:
                    for i, lock in self._locks.items():
                        lock.write_record(self.original_W[i], self._owner, self.marker_path)
                    write_marker(self.marker_path, self.backend, self.original_W, owner=self._owner)
                except OSError as exc:
                    self.enter_observe(f"cannot write the restore marker {self.marker_path} or a GPU record: {exc}")
                    return
                self._marker_written = True
                self._install_sigterm()
            try:
                for i in self.gpu_indices:
                    self.backend.set_power_limit_W(i, limit_W)
            except ActuatorPermissionDenied as exc:
                self.enter_observe(f"no permission to change the power limit: {exc}")
                return
            self.applied_W = limit_W

    def restore(self) -> None:
        """Put every GPU back to its original limit, remove the marker and records, release the locks (idempotent)."""
        with self._lock:
            if not self._marker_written:  # nothing changed: only the locks to let go
                self._release_locks()
                return
            failed = False
            for i, limit in self.original_W.items():
                try:
                    if self.backend.power_limit_W(i) != limit:
                        self.backend.set_power_limit_W(i, limit)
                except ActuatorError as exc:
                    failed = True
                    logger.error("zeus-callbacks: cannot restore GPU %d to %.0f W (%s)", i, limit, exc)
            self.applied_W = None
            if not failed:  # else the marker and the records stay, and the locks until this process ends
                self.marker_path.unlink(missing_ok=True)
                for lock in self._locks.values():
                    lock.clear_record()
                self._release_locks()
                self._marker_written = False
            self._uninstall_sigterm()

    def _install_sigterm(self) -> None:
        if self._cleanup is None:
            self._cleanup = CLEANUPS.register(
                self.restore, what="restoring the original power limits",
                order=CleanupOrder.RESTORE_POWER_LIMITS, at_exit=True,
            )  # fmt: skip

    def _uninstall_sigterm(self) -> None:
        cleanup, self._cleanup = self._cleanup, None
        if cleanup is not None:
            cleanup.cancel()


def _scouts_note(rows: list[dict[str, Any]]) -> str:
    """`` (N of them scouts)`` when the polish scouted gaps (short windows, docs/power_limit.md), else empty."""
    scouts = sum(1 for row in rows if row.get("scout"))
    return f" ({scouts} of them scouts)" if scouts else ""


def _cached_rows(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """A cache entry's rows; those cached before rows said ``scout`` get ``scout: False`` (no scout then)."""
    return [{**row, "scout": bool(row.get("scout", False))} for row in entry.get("limits", [])]
