"""What :class:`~zeus_callbacks.session.EnergySession` gives the parts it is built from.

The power-limit part (:mod:`~zeus_callbacks.session.power`) and the batch-size part
(:mod:`~zeus_callbacks.session.batch`) are base classes of the session, like the step
path (:class:`~zeus_callbacks.session.scheduler.StepScheduler`): their hooks are bound
methods of the object the step calls are made on. :class:`SessionPart` declares, for the
type checker, what they read of the session; the session sets or overrides each of them.
"""

from __future__ import annotations

from typing import Any

from zeus_callbacks.config import ZeusConfig
from zeus_callbacks.distributed import RankGroup
from zeus_callbacks.reporting import RunSummary
from zeus_callbacks.session.aggregate import RankAggregator
from zeus_callbacks.session.run import StartedRun
from zeus_callbacks.session.scheduler import StepScheduler
from zeus_callbacks.store.run_store import RunStore


class SessionPart(StepScheduler):
    """A part of the session: it reads the session's configuration, run, ranks and log through these."""

    # Set by the session's __init__ (config, is_main_process and run_store before the parts' own __init__).
    config: ZeusConfig
    is_main_process: bool
    run_store: RunStore
    _pending_metrics: dict[str, float]
    _ranks: RankAggregator

    @property
    def run(self) -> StartedRun:
        """The started run's parts (the session's)."""
        raise NotImplementedError

    @property
    def ranks(self) -> RankGroup:
        """The process group (the session's)."""
        raise NotImplementedError

    @property
    def started(self) -> bool:
        """True between train start and train end (the session's)."""
        raise NotImplementedError

    @property
    def steps_this_run(self) -> int:
        """Steps since train start (the session's)."""
        raise NotImplementedError

    @property
    def degraded(self) -> bool:
        """True when a sensor fault made the measurement incomplete (the session's)."""
        raise NotImplementedError

    def _write(self, record: dict[str, Any]) -> None:
        """Append a record to the run's JSONL log (the session's)."""
        raise NotImplementedError

    def _run_energy_so_far_J(self) -> float:
        """The run's energy so far (J; the session's)."""
        raise NotImplementedError

    def _run_time_so_far_s(self) -> float:
        """The run's time so far (s; the session's)."""
        raise NotImplementedError

    def exception(self, exc: BaseException | None = None, *, interrupted: bool = False) -> RunSummary | None:
        """End the run after a failure (the session's)."""
        raise NotImplementedError
