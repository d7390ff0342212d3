"""The run's running totals and the resume state a checkpoint carries (``state_dict``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any


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
        estimated_steps=float(state.get("estimated_steps", measured)),
        energy_note=note,
    )
