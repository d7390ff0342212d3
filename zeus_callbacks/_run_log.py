"""What a run's JSONL energy log says, in shapes the plot and the report commands draw and tabulate.

Pure functions over the records :func:`zeus_callbacks.reporting.read_jsonl` returns: no I/O, no
matplotlib. The log holds no timestamps per record and no power timeline (its power figures are
means over windows), so a run's course is laid on its **step axis**: training steps taken, counted
as ``eval.step`` and ``epoch.end_step`` count them (checkpoint steps included, ``run_start.resumed_steps``).
A ``steps`` record stands for the ``warmup_steps + steps`` steps after the previous record's.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from zeus_callbacks._run_course import EvalMark, LimitSegment, PowerLimitSwitch, RunCourse, StepSpan
from zeus_callbacks._units import wh_from_J
from zeus_callbacks.errors import NothingToPlot
from zeus_callbacks.reporting import energy_split

Record = dict[str, Any]


def _number(value: Any) -> float | None:
    """``value`` as a finite float, or None (null, NaN, a string, a bool: not a figure)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def time_note_of(records: Sequence[Record]) -> str | None:
    """The log's ``time_note`` (power-limit results on the virtual GPU: time not simulated), or None.

    From the last ``run_end`` record, else the last ``power_limit_profile`` (a run killed before its end).
    """
    for event in ("run_end", "power_limit_profile"):
        note = (last_record(records, event) or {}).get("time_note")
        if isinstance(note, str) and note:
            return note
    return None


def is_simulated(records: Sequence[Record]) -> bool:
    """True when the log's figures are simulated: a record says ``simulated``, or names the virtual backend.

    Logs older than the ``simulated`` field name the virtual GPU as their backend (``run_start``/``run_end``).
    """
    return any(r.get("simulated") is True for r in records) or any(
        str(r.get("backend", "")).startswith("virtual") for r in records if r.get("event") in ("run_start", "run_end")
    )


def _first(records: Sequence[Record], event: str) -> Record | None:
    return next((r for r in records if r.get("event") == event), None)


def last_record(records: Sequence[Record], event: str) -> Record | None:
    """The last record of ``event`` in the log (None when it has none: a run still going, or killed)."""
    return next((r for r in reversed(records) if r.get("event") == event), None)


def run_course(records: Sequence[Record], source: str = "the log") -> RunCourse:
    """Lay a run's records (in file order) on its step axis (see the module docstring); ``source`` names the log.

    Raises:
        NothingToPlot: The log has no ``steps`` or ``warmup`` record with a measured mean.
    """
    start, end = _first(records, "run_start"), last_record(records, "run_end")
    resumed = _number((start or {}).get("resumed_steps")) or 0.0
    course = RunCourse(run_name=(end or start or {}).get("run_name"), simulated=is_simulated(records),
                       ended=end is not None, time_note=time_note_of(records))  # fmt: skip
    at = resumed
    for r in records:
        kind = r.get("event")
        if kind == "warmup":
            n = len(r.get("steps") or [])
            energy, time = _number(r.get("energy_J")), _number(r.get("time_s"))
            power = energy / time if energy is not None and time else None
            course.spans.append(StepSpan(resumed, resumed + n, power, energy / n if energy is not None and n else None,
                                         None, complete=r.get("complete") is not False, warmup=True))  # fmt: skip
        elif kind == "steps":
            warm = int(_number(r.get("warmup_steps")) or 0)
            stood_for = int(_number(r.get("steps")) or 0)
            first, at = at + warm, at + warm + stood_for
            count = int(_number(r.get("count")) or 0)
            course.spans.append(StepSpan(
                first, at, _number(r.get("power_W_mean")), _number(r.get("energy_J_mean")),
                _number(r.get("power_limit_W")), sampled=0 < count < stood_for, complete=r.get("complete") is not False,
            ))  # fmt: skip
        elif kind == "eval" and _number(r.get("step")) is not None:
            energy, time = _number(r.get("energy_J")), _number(r.get("time_s"))
            power = energy / time if energy is not None and time else None
            dataset = r.get("dataset")
            course.evals.append(
                EvalMark(float(r["step"]), energy, time, power, dataset if isinstance(dataset, str) else None)
            )
        elif kind == "epoch":
            end_step = _number(r.get("end_step"))
            if end_step is None:
                course.epochs_without_step += 1
            else:
                course.epoch_ends.append((r.get("epoch"), end_step))
    if not any(s.power_W is not None for s in course.spans):
        raise NothingToPlot(f"{source}: no step report with a measured power (no steps record with a mean)")
    profile = last_record(records, "power_limit_profile")
    if profile is not None:
        from_step = _number((end or {}).get("power_limit_from_step"))
        step = from_step if from_step is not None else _number(profile.get("step")) or resumed
        limits = profile.get("limits")
        rows = limits if isinstance(limits, list) else []
        trials = tuple(x for x in (_number(r.get("limit_W")) for r in rows if isinstance(r, dict)) if x is not None)
        # observe mode writes no chosen_limit_W; run_end keeps what profiling would choose
        chosen = _number(profile.get("chosen_limit_W")) or _number((end or {}).get("chosen_power_limit_W"))
        course.switch = PowerLimitSwitch(
            step=step, limit_W=chosen,
            applied=(end or {}).get("power_limit_applied", profile.get("source") != "observe") is not False,
            source=str(profile.get("source")), profiling_from=resumed, finished=profile.get("finished") is not False,
            trial_limits_W=trials if profile.get("source") in ("profile", "unfinished") else (),
        )  # fmt: skip
    course.limits = _limit_segments(course, _number((start or {}).get("power_limit_W")), resumed)
    course.notes = _notes(course)
    return course


def _limit_segments(course: RunCourse, original_W: float | None, first_step: float) -> list[LimitSegment]:
    """The stretches at a limit the log states: the start's limit until profiling (or throughout), the chosen after."""
    end = max(s.end_step for s in course.spans)
    switch = course.switch
    if switch is None or not switch.applied or switch.limit_W is None:
        if switch is not None and switch.trial_limits_W:  # unfinished or abandoned: trial limits to the end
            return []
        return [] if original_W is None else [LimitSegment(first_step, end, original_W)]
    segments = []
    if not switch.trial_limits_W and original_W is not None and switch.step > first_step:  # from the cache
        segments.append(LimitSegment(first_step, switch.step, original_W))
    segments.append(LimitSegment(switch.step, max(end, switch.step), switch.limit_W))
    return segments


def _notes(course: RunCourse) -> list[str]:
    """What the figure cannot show by itself."""
    notes = []
    measured = [s for s in course.spans if not s.warmup]
    if any(s.sampled for s in measured):
        notes.append("step means from a sampled share of the steps (windows.sample_fraction)")
    partial = sum(not s.complete for s in course.spans if s.power_W is not None)  # one with no mean is not drawn
    if partial:
        notes.append(f"{partial} of {len(course.spans)} step reports not complete (samples did not cover every window)")
    if course.epochs_without_step:
        notes.append(f"{course.epochs_without_step} epoch end(s) not marked: the log predates epoch.end_step")
    if not course.ended:
        notes.append("no run_end record (still running, or killed before it ended)")
    return notes


# --------------------------------------------------------------------------- the report's comparison
COMPARED = (
    ("energy_J", "energy (J)"),
    ("energy_Wh", "energy (Wh)"),
    ("time_s", "time (s)"),
    ("steps", "steps"),
    ("mean_power_W", "mean power (W)"),
    ("power_limit_W", "power limit (W)"),
    ("epochs_energy_J", "parts: epochs (J)"),
    ("outside_energy_J", "parts: outside (J)"),
    ("cpu_energy_J", "CPU (J)"),
    ("dram_energy_J", "DRAM (J)"),
    ("node_energy_J", "node (J)"),
    ("status", "status"),
)
"""The figures ``zeus-callbacks report A.jsonl B.jsonl`` compares: (key of :func:`run_figures`, row label)."""


def run_figures(records: Sequence[Record]) -> dict[str, Any]:
    """A run's headline figures, from its ``run_end`` record (None for each one it lacks).

    ``energy_Wh`` is derived from ``energy_J`` when the record predates it; ``power_limit_W`` is the limit
    training ran at after profiling: the chosen one where profiling applied one, else the one in force.
    ``epochs_energy_J`` and ``outside_energy_J`` are the run's parts (J; the single-run ``parts`` line,
    :func:`~zeus_callbacks.reporting.energy_split`): its epochs' energy and the rest, outside every epoch.
    ``cpu_energy_J``, ``dram_energy_J`` and ``node_energy_J`` are the run's node figures (J; None where the
    run measured none: ``node.rapl`` and ``node.virtual_cpu`` off, or the reason in its ``node_energy_note``).
    A log without ``run_end`` (still running, or killed) has every figure None and ``ended`` False;
    ``simulated`` says whether the figures are simulated, ``time_note`` why the run's power-limit
    results do not show the time a limit costs (:func:`time_note_of`; None when they do).

    Returns:
        Keys of :data:`COMPARED` plus ``run_name``, ``ended``, ``simulated`` and ``time_note``.
    """
    end = last_record(records, "run_end")
    start = _first(records, "run_start") or {}
    if end is None:
        figures: dict[str, Any] = dict.fromkeys(key for key, _ in COMPARED)
        figures.update(run_name=start.get("run_name"), ended=False)
    else:
        chosen = end.get("chosen_power_limit_W")
        applied = chosen is not None and end.get("power_limit_applied") is not False
        energy = _number(end.get("energy_J"))
        parts = energy_split(end.get("energy_J"), end.get("epoch_energy_J"))
        figures = {
            "run_name": end.get("run_name", start.get("run_name")),
            "energy_J": energy,
            "energy_Wh": _number(end.get("energy_Wh")) if "energy_Wh" in end else wh_from_J(energy),
            "time_s": _number(end.get("time_s")),
            "steps": end.get("steps"),
            "mean_power_W": _number(end.get("mean_power_W")),
            "power_limit_W": _number(chosen if applied else end.get("power_limit_W")),
            "epochs_energy_J": parts[0] if parts else None,
            "outside_energy_J": parts[1] if parts else None,
            "cpu_energy_J": _number(end.get("cpu_energy_J")),
            "dram_energy_J": _number(end.get("dram_energy_J")),
            "node_energy_J": _number(end.get("node_energy_J")),
            "status": end.get("status"),
            "ended": True,
        }
    figures["simulated"] = is_simulated(records)
    figures["time_note"] = time_note_of(records)
    return figures


# The figures of the records a report or a plot reads that the library writes as a number >= 0 or null.
_NON_NEGATIVE_FIELDS = (
    "energy_J", "energy_J_mean", "counter_energy_J", "cpu_energy_J", "dram_energy_J", "node_energy_J",
    "power_W_mean", "mean_power_W",
)  # fmt: skip


def impossible_figures(records: Sequence[Record]) -> list[str]:
    """Energy and power figures no run writes: negative, or not a number (an edited or foreign log), in log order.

    Returns:
        One ``"record <n> (<event>)'s <field> (<value>) is negative"`` (or ``is not a number``) per such
        figure; n counts from 1. Empty for a log as the library writes it.
    """
    found = []
    for number, record in enumerate(records, start=1):
        for key in _NON_NEGATIVE_FIELDS:
            if key not in record or record[key] is None:
                continue
            value = record[key]
            where = f"record {number} ({record.get('event')})'s {key}"
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                found.append(f"{where} ({json.dumps(value)}) is not a number")
            elif value < 0:
                found.append(f"{where} ({value:g}) is negative")
    return found
