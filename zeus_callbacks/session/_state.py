"""The run's running totals and the resume state a checkpoint carries (``state_dict``)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from zeus_callbacks.optimizers.power_limit._limit_profiler import check_profile_state


@dataclass
class Totals:
    """Running totals of the training run (carried across checkpoint resumes).

    Attributes:
        energy_J: Energy of the run (J); NaN when unknown (``energy_note`` says why).
        time_s: Time of the run (s).
        steps: Steps executed.
        measured_steps: Steps whose energy has been attributed (warm-up steps left out): those with a
            window, and those the step means hold as stretches between windows.
        epochs: Epochs executed (an epoch cut short counts).
        step_energy_J: The energy of the steps after warm-up that the step means stand for (J), per
            report as its ``steps`` record draws its means: the steps with a window and the stretches
            between them where the record used those (each step measured once), else ``Σ E/p`` over
            the measured steps, ``p`` each one's chance of being measured (Horvitz-Thompson: the
            steps they stand for, in expectation). Under ``windows.sample_fraction: auto`` the share
            measured follows the step time, so a plain mean would weigh each stretch by that share.
        step_time_s: Alike (s).
        estimated_steps: The steps those sums stand for (``Σ 1/p`` where sampled);
            ``step_energy_J / estimated_steps`` is the run's mean step energy.
        epoch_energy_J: Each epoch's energy (J).
        energy_note: Why ``energy_J`` is unknown (a checkpoint saved before the power samples covered
            the run's start); None when it is known.
    """

    energy_J: float = 0.0
    time_s: float = 0.0
    steps: int = 0
    measured_steps: int = 0
    epochs: int = 0
    step_energy_J: float = 0.0
    step_time_s: float = 0.0
    estimated_steps: float = 0.0
    epoch_energy_J: list[float] = field(default_factory=list)
    energy_note: str | None = None

    def copy(self) -> Totals:
        """A copy whose epoch list is its own."""
        return replace(self, epoch_energy_J=list(self.epoch_energy_J))


UNKNOWN_CARRIED = "the checkpoint this run resumed from holds no measured energy"
"""Prefix of a resumed run's ``energy_note`` when the checkpoint's energy so far was not measured."""


def resume_state(
    totals: Totals,
    *,
    energy_J: float | None,
    time_s: float,
    run_name: str | None,
    open_epoch: Any = None,
    energy_note: str | None = None,
) -> dict[str, Any]:
    """The checkpoint state, in plain numbers, lists and strings: ``totals`` with the run's energy (J) and time (s).

    ``energy_J`` None or NaN (not measured) is saved as None, with ``energy_note`` (why), never as a
    number: a run resumed from the state then has an unknown energy rather than one missing those steps.
    ``run_name`` is informative (a resumed run has a new log). ``open_epoch``: the epoch under way with
    steps taken in it (None: between epochs); a run resumed inside it says so in its ``epoch`` record.
    """
    known = energy_J is not None and math.isfinite(energy_J)
    return {
        **asdict(totals),
        "energy_J": energy_J if known else None,
        "energy_note": None if known else energy_note or "the run's energy so far was not measured",
        "time_s": time_s,
        "run_name": run_name,
        "open_epoch": open_epoch,
    }


_COUNTS = ("steps", "measured_steps", "epochs")  # whole numbers, at least 0
_AMOUNTS = ("time_s", "step_energy_J", "step_time_s", "estimated_steps")  # finite numbers, at least 0

JOB_POWER_CEILING_W = 1e9
"""Above any training job's GPU draw (W): the largest clusters draw a few hundred MW in all.

A state's ``energy_J`` above this × (``time_s`` + 1 s) cannot be measured; the second covers the sensors'
averaging (up to ~1 s). ``energy_J`` may sum every rank's GPUs, and the state does not say how many: hence
a whole job's ceiling rather than one GPU's.
"""


def check_state(state: Any) -> None:
    """Refuse a checkpoint state that is not one :func:`resume_state` wrote, naming the key at fault.

    ``energy_J`` must be present, and with a known energy ``time_s``, ``steps`` and ``epochs`` too (a
    missing one was read as 0); the other keys are checked where present (older states lack some). A
    mapping with none of the totals' keys is refused, as a state handed at the wrong level (a
    checkpoint's whole ``callbacks`` dict) would otherwise start the run from nothing without a word.

    Raises:
        TypeError: ``state`` is not a mapping.
        ValueError: A count is not a whole number >= 0, an amount (s, J) not a finite number >= 0,
            ``energy_J`` neither null nor one, or above :data:`JOB_POWER_CEILING_W` × (``time_s`` + 1 s),
            ``measured_steps`` above ``steps``, ``energy_note`` or ``run_name`` not text or null,
            ``open_epoch`` neither null nor a whole number >= 0, ``epoch_energy_J`` not a list of
            energies >= 0 (J) or NaN, step sums over 0 estimated steps, ``power_limit`` not a mapping or
            not a profile the profiler wrote (a row without ``limit_W``, a text among its energies, a limit
            twice: ``power_limit.limits[0].limit_W`` named), ``energy_J`` missing, or with a known energy
            ``time_s``, ``steps`` or ``epochs`` missing, or no totals key at all.
    """
    if not isinstance(state, Mapping):
        raise TypeError(f"a checkpoint state must be a mapping (from state_dict()), not {type(state).__name__}")
    if not any(key in state for key in (*_COUNTS, *_AMOUNTS, "energy_J")):
        shown = ", ".join(sorted(map(str, state))[:6]) or "none"
        raise ValueError(f"not a zeus-callbacks checkpoint state: none of its keys ({shown}) is a total such as "
                         "steps or energy_J; pass what state_dict() returned")  # fmt: skip

    def number(key: str, value: Any) -> None:
        if not _is_amount(value):
            raise ValueError(f"checkpoint state: {key} must be a finite number >= 0, not {value!r}")

    for key in _COUNTS:
        if key in state:
            number(key, state[key])
            if not _is_count(state[key]):
                raise ValueError(f"checkpoint state: {key} must be a whole number, not {state[key]!r}")
    for key in _AMOUNTS:
        if key in state:
            number(key, state[key])
    if state.get("energy_J") is not None:
        number("energy_J", state["energy_J"])
    for key in ("energy_note", "run_name"):
        if not isinstance(state.get(key), (str, type(None))):
            raise ValueError(f"checkpoint state: {key} must be text or null, not {state[key]!r}")
    # Counts are whole numbers by now; carried_totals reads a missing steps as 0.
    if state.get("measured_steps", 0) > state.get("steps", 0):
        raise ValueError(f"checkpoint state: measured_steps {state['measured_steps']!r} is more than the "
                         f"{state.get('steps', 0)!r} steps taken (steps)")  # fmt: skip
    # open_epoch is the framework's epoch number, not bounded by `epochs`: it counts on past this state's epochs
    # when the callback joined a run already under way or a trainer fits again.
    open_epoch = state.get("open_epoch")
    if open_epoch is not None and not _is_count(open_epoch):
        raise ValueError(f"checkpoint state: open_epoch must be a whole number >= 0 or null, not {open_epoch!r}")
    epochs_J = state.get("epoch_energy_J", [])
    if not isinstance(epochs_J, list):
        raise ValueError(f"checkpoint state: epoch_energy_J must be a list, not {epochs_J!r}")
    for value in epochs_J:  # an epoch's energy is NaN when it was not measured
        known = isinstance(value, numbers.Real) and not isinstance(value, bool)
        if not known or not (math.isnan(float(value)) or 0 <= float(value) < math.inf):
            raise ValueError(f"checkpoint state: epoch_energy_J holds {value!r}, not a finite energy >= 0 (J) or NaN")
    if state.get("estimated_steps") == 0 and (state.get("step_energy_J") or state.get("step_time_s")):
        raise ValueError("checkpoint state: step_energy_J and step_time_s are sums over estimated_steps, which is 0")
    if not isinstance(state.get("power_limit"), (Mapping, type(None))):
        raise ValueError(f"checkpoint state: power_limit must be a mapping or null, not {state['power_limit']!r}")
    if state.get("power_limit") is not None:
        try:
            check_profile_state(state["power_limit"])
        except ValueError as exc:
            raise ValueError(f"checkpoint state: power_limit.{exc}") from None
    # energy_J is in every state resume_state wrote (null when unknown); a known energy comes with the counts
    # it covers. A missing one was read as 0: a total short of the checkpoint's energy, without a word.
    required = ("energy_J",) if state.get("energy_J") is None else ("energy_J", "time_s", "steps", "epochs")
    for key in required:
        if key not in state:
            raise ValueError(f"checkpoint state: {key} is missing (state_dict() always writes it)")
    energy_J = state.get("energy_J")
    if energy_J is not None and energy_J > JOB_POWER_CEILING_W * (state["time_s"] + 1.0):
        raise ValueError(f"checkpoint state: energy_J {energy_J!r} is more than any job's GPUs could draw in "
                         f"time_s {state['time_s']!r} (at most {JOB_POWER_CEILING_W:.0e} W)")  # fmt: skip


def _is_amount(value: Any) -> bool:
    """A finite number >= 0 (a bool is not one)."""
    real = isinstance(value, numbers.Real) and not isinstance(value, bool)
    return real and math.isfinite(value) and float(value) >= 0


def _is_count(value: Any) -> bool:
    """A whole number >= 0 (``2.0`` is one: JSON may write a count so)."""
    return _is_amount(value) and float(value).is_integer()


def carried_totals(state: Mapping[str, Any]) -> Totals:
    """The totals a checkpoint's state carries into the next run (missing keys: zero; unknown keys ignored).

    A state from before ``estimated_steps`` holds the measured steps' sum over their count: it is
    carried as that count's estimate. A null ``energy_J`` (not measured when saved) is carried as
    unknown (NaN) with its ``energy_note``; a state from before ``energy_note`` has a number there.
    """
    measured = int(state.get("measured_steps", state.get("steps", 0)))
    saved_J = state.get("energy_J", 0.0)
    energy_J = math.nan if saved_J is None else float(saved_J)
    note = None
    if not math.isfinite(energy_J):
        saved_note = state.get("energy_note")
        note = UNKNOWN_CARRIED if not saved_note else f"{UNKNOWN_CARRIED}: {saved_note}"
        if saved_note and saved_note.startswith(UNKNOWN_CARRIED):  # saved again by a resumed run
            note = saved_note
    return Totals(
        energy_J=energy_J,
        time_s=float(state.get("time_s", 0.0)),
        steps=int(state.get("steps", 0)),
        measured_steps=measured,
        epochs=int(state.get("epochs", 0)),
        step_energy_J=float(state.get("step_energy_J", 0.0)),
        step_time_s=float(state.get("step_time_s", 0.0)),
        epoch_energy_J=[float(e) for e in state.get("epoch_energy_J", [])],
        # a state with no step sums carries no steps behind them (they would count as 0 J in the mean)
        estimated_steps=float(state.get("estimated_steps", measured if "step_energy_J" in state else 0.0)),
        energy_note=note,
    )
