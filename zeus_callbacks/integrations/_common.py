"""What the adapters (Lightning, Hugging Face, ``measure()``) share: configuration, the session per run, policies.

The adapters themselves only translate hooks.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from zeus_callbacks.backends.base import GPUBackend
from zeus_callbacks.config import ZeusConfig, load_config, parse_config
from zeus_callbacks.reporting import RunSummary
from zeus_callbacks.session import EnergySession, check_state

logger = logging.getLogger(__name__)

AdapterT = TypeVar("AdapterT", bound="SessionAdapter")

ConfigArg = ZeusConfig | dict[str, Any] | str | Path | None
"""What an adapter's ``config`` argument may be."""


def resolve_config(config: ConfigArg) -> ZeusConfig:
    """Accept a ZeusConfig, a mapping of settings, a YAML path, or None (defaults).

    Raises:
        ConfigError: The file or the settings are invalid.
    """
    return load_config(config) if isinstance(config, (str, Path)) else parse_config(config)


def next_pause(done: int, every: int | None, ends: Iterable[int | None], offset: int = 0) -> int | None:
    """The first step count after ``done`` at which training pauses (an evaluation, an epoch's or the run's end).

    Args:
        done: Steps taken so far (the count the framework schedules by).
        every: Training pauses after every ``every`` steps (an evaluation interval); None: no such interval.
        ends: Counts training pauses at once (the epoch's end, the run's end); None entries are unknown.
        offset: Steps before the count's zero that the interval counts too (Lightning's validation
            interval over the whole fit, counted from the epoch's start): ``offset + count`` is the multiple.

    Returns:
        The least count > ``done`` with ``offset + count`` a multiple of ``every``, or one of ``ends``;
        None when none is known.
    """
    options = [end for end in ends if end is not None and end > done]
    if every is not None and every > 0:
        options.append(((offset + done) // every + 1) * every - offset)
    return min(options, default=None)


_READABLE_PARTS = (
    ("steps",), ("epochs",), ("time_s",), ("epoch_energy_J",), ("power_limit",),
    ("measured_steps", "step_energy_J", "step_time_s", "estimated_steps"),  # the step means' sums, together
)  # fmt: skip
"""The parts of a damaged checkpoint state that are kept when each is readable on its own (check_state)."""

_COUNTS_NAMED = (("time_s", "time"), ("steps", "steps"), ("epochs", "epochs"))


def unknown_energy_state(why: str, state: Any = None) -> dict[str, Any]:
    """A checkpoint state that carries an unknown energy, ``why`` (and what else is lost) as its note.

    Of ``state`` (a damaged checkpoint state, or None: none at all) it keeps each part that is readable
    on its own (the steps, the epochs, the time, the epochs' energies, the step means' sums, the
    power-limit profile, ``open_epoch``); never its ``energy_J``. The time, steps or epochs it cannot
    keep then cover only the run after the checkpoint: the note says which, as those figures would
    otherwise pass for the whole run's.
    """
    kept: dict[str, Any] = {"energy_J": None, "energy_note": why}
    if isinstance(state, Mapping):
        for keys in _READABLE_PARTS:
            part = {key: state[key] for key in keys if key in state}
            if not part or ("measured_steps" in keys and "steps" not in kept):
                continue  # the step means' sums stand on the steps: without them, more measured steps than steps
            try:
                check_state({**kept, **part})
            except (TypeError, ValueError):
                continue
            kept.update(part)
    lost = [name for key, name in _COUNTS_NAMED if key not in kept]
    if lost:
        figures = " and ".join([", ".join(lost[:-1]), lost[-1]] if len(lost) > 1 else lost)
        verb = "covers" if len(lost) == 1 else "cover"
        kept["energy_note"] = f"{why}; its {figures} {verb} only the run after the checkpoint"
    if isinstance(state, Mapping) and "steps" in kept and state.get("open_epoch") is not None:
        try:  # an open_epoch that is no epoch number marks no epoch
            check_state({**kept, "open_epoch": state["open_epoch"]})
        except (TypeError, ValueError):
            pass
        else:
            kept["open_epoch"] = state["open_epoch"]
    return kept


def _what_is_kept(carried: Mapping[str, Any]) -> str:
    """What a resume from a damaged state keeps, for its warning."""
    kept = [name for key, name in _COUNTS_NAMED if key in carried]
    if not kept:
        return "nothing of it is kept: the run's time, steps and epochs start from this run"
    return f"its {', '.join(kept)} are kept"


class SessionAdapter:
    """The framework-independent part of a callback: its configuration and the session of each run.

    Arguments, errors and attributes: as the adapters document them (``ZeusCallback``, ...).
    """

    def __init__(self, config: ConfigArg = None, backend: GPUBackend | None = None) -> None:
        self.config = resolve_config(config)
        self._backend = backend
        self.session = EnergySession(self.config, backend=backend)
        self.summary: RunSummary | None = None
        # The last step before each pause (an evaluation, the epoch's end, the run's end) is measured:
        # the step count at whose end the session is told so, and the schedule it comes from.
        self._measure_after = -1
        self._pause_every: int | None = None
        self._pause_ends: tuple[int | None, ...] = ()
        self._pause_offset = 0

    def _plan_pauses(self, done: int, every: int | None, ends: Iterable[int | None], offset: int = 0) -> None:
        """Between steps, ``done`` taken: plan to measure the last step before each coming pause.

        ``every``, ``ends`` and ``offset`` are :func:`next_pause`'s, in the count ``done`` is in. Before
        each step's ``step_end`` the adapter compares the count that step ends with to ``_measure_after``
        (one comparison a step) and calls :meth:`_measure_next_step` when they are equal.
        """
        self._pause_every, self._pause_ends, self._pause_offset = every, tuple(ends), offset
        self._measure_after = self._step_before_last(done)
        if self._measure_after == done:  # the very next step comes right before a pause: measured from here
            self.session.measure_next_step()
            self._measure_after = self._step_before_last(done + 1)

    def _measure_next_step(self, count: int) -> None:
        """In the step that ends with ``count`` steps taken, the next one is the last before a pause: measure it.

        Its window opens at this step's end mark (:meth:`~zeus_callbacks.session.EnergySession.measure_next_step`).
        """
        self.session.measure_next_step()
        self._measure_after = self._step_before_last(count + 1)

    def _step_before_last(self, done: int) -> int:
        """The count of the step before the last one before the next pause after ``done`` (-1: none known)."""
        pause = next_pause(done, self._pause_every, self._pause_ends, self._pause_offset)
        return -1 if pause is None else pause - 1

    def _load_checkpoint_state(self, state: Any) -> None:
        """Carry a framework checkpoint's state into the session; an unreadable one leaves the energy unknown.

        Training goes on from a checkpoint whose energy state is damaged (a negative total, a key of the
        wrong type): the run's energy is then unknown, with the reason, never a total missing those steps.
        Its other parts that are readable are kept (:func:`unknown_energy_state`).
        A damaged power-limit profile alone (a row without ``limit_W``) is dropped with a warning: the
        totals are kept and profiling starts over.
        """
        try:
            self.session.load_state_dict(state)
        except (TypeError, ValueError) as exc:
            if isinstance(state, Mapping) and state.get("power_limit") is not None:
                rest = {k: v for k, v in state.items() if k != "power_limit"}
                try:
                    self.session.load_state_dict(rest)
                except (TypeError, ValueError):
                    pass  # more is damaged than the profile
                else:
                    then = "profiling starts over" if self.config.power_limit.enabled else "it is dropped"
                    logger.warning("zeus-callbacks: the checkpoint's power-limit profile is unreadable (%s): "
                                   "%s; the energy so far is kept", exc, then)  # fmt: skip
                    return
            carried = unknown_energy_state(f"its energy state was unreadable ({exc})", state)
            logger.warning("zeus-callbacks: the checkpoint's energy state is unreadable (%s): the resumed run's "
                           "energy is unknown (%s); training goes on", exc, _what_is_kept(carried))  # fmt: skip
            self.session.load_state_dict(carried)

    def _state_for_a_resume_without_one(self, step: int, state_key: str) -> dict[str, Any]:
        """The state a run resumed at ``step`` from a checkpoint holding none of ``state_key`` carries, and a warning.

        The run's total cannot hold the steps before the checkpoint: its energy is unknown, never a total
        that silently misses them.
        """
        why = f"the checkpoint holds no energy state of {state_key}"
        logger.warning("zeus-callbacks: resumed at step %d but %s: the run's energy is unknown; training goes on",
                       step, why)  # fmt: skip
        return unknown_energy_state(why)

    @classmethod
    def from_yaml(cls: type[AdapterT], path: str | Path, **kwargs: Any) -> AdapterT:
        """Build the callback from a YAML file (see ``docs/configuration.md``).

        Raises:
            ConfigError: The file is missing or invalid.
        """
        return cls(load_config(path), **kwargs)

    def _new_session(self, *, is_main_process: bool | None, device_index: int | None) -> EnergySession:
        """A fresh session for a run (a checkpoint restore then loads its totals); forgets the last summary.

        ``is_main_process`` None: the session decides (``RANK`` is 0).
        """
        self.session = EnergySession(
            self.config, backend=self._backend, is_main_process=is_main_process, device_index=device_index
        )
        self.summary = None
        return self.session

    def _run_name(self, framework_name: str | None) -> str | None:
        """The run's name: ``logging.run_name`` if set, else the framework's name for the run (or None)."""
        return self.config.logging.run_name or framework_name

    def _use_batch_size(self, suggested: int | None, used: int, what: str, advice: str) -> None:
        """The framework trains at ``used``: if the bandit ``suggested`` another size, warn; record the trial there.

        ``what`` names the framework's setting in the warning, ``advice`` ends it (why it differs, what to do).
        """
        if suggested is not None and used != suggested:
            logger.warning("zeus-callbacks: %s is %d, not the suggested %d%s %d", what, used, suggested, advice, used)
            self.session.use_batch_size(used)
