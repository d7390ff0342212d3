"""Cross-rank aggregation through ``accelerate``, with a single-process fallback.

Under DDP/FSDP each process measures only its own GPU; the session combines the ranks'
figures here with one definition everywhere (docs/hardware.md#multi-gpu): energy is summed over GPUs,
time is the slowest rank's, power is summed. Every rank calls the same collectives at
the same events (epoch end, step reports, train end), so none waits on a collective the
others skip. The process group is the one the framework already created; nothing here
creates networking of its own.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from zeus_callbacks.errors import ConfigError

logger = logging.getLogger(__name__)


def _process_group_size() -> int:
    if "torch" not in sys.modules:  # a process group needs torch imported here: none yet, and no import to pay
        return 1
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is always there with the frameworks
        return 1
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def launcher_env_int(name: str, default: int) -> int:
    """The non-negative integer a launcher sets in ``name`` (``WORLD_SIZE``, ``RANK``, ...); ``default`` when unset.

    Raises:
        ConfigError: The variable is set but is not a non-negative integer; the message names it.
    """
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ConfigError(f"environment variable {name}={raw[:40]!r} is not a non-negative integer (a launcher's?)")
    return value


def launcher_world_size() -> int:
    """How many processes the launcher started (``WORLD_SIZE``, else the live process group's size; 1 alone).

    Lightning deletes ``WORLD_SIZE`` when a fit ends, but a later fit in the same processes still
    runs in the same process group: without it, both ranks would name one restore marker.

    Raises:
        ConfigError: ``WORLD_SIZE`` is set but is not a non-negative integer.
    """
    return max(1, launcher_env_int("WORLD_SIZE", 1), _process_group_size())


def process_rank() -> int | None:
    """This process's global rank when it is one of several (the process group's, else ``RANK``); None when alone.

    Raises:
        ConfigError: ``WORLD_SIZE`` or ``RANK`` is set but is not a non-negative integer.
    """
    if _process_group_size() > 1:
        import torch.distributed as dist

        return int(dist.get_rank())
    return launcher_env_int("RANK", 0) if launcher_world_size() > 1 else None


@dataclass
class RankGroup:
    """The processes of one training run and the collectives between them.

    Attributes:
        num_processes: How many processes train together (1 without a process group).
        process_index: This process's global rank.
    """

    num_processes: int = 1
    process_index: int = 0
    _state: Any = None

    @classmethod
    def detect(cls) -> RankGroup:
        """Join the framework's process group through ``accelerate``, or stand alone.

        ``PartialState(cpu=True)`` is used on CPU process groups: a plain
        ``PartialState()`` there can report a single process (docs/hardware.md#multi-gpu).
        """
        if _process_group_size() <= 1:
            return cls()
        import torch
        from accelerate import PartialState

        state = PartialState(cpu=not torch.cuda.is_available())
        return cls(num_processes=state.num_processes, process_index=state.process_index, _state=state)

    @classmethod
    def from_launcher(
        cls, *, cpu: bool | None = None, backend: str | None = None, timeout_s: float | None = None
    ) -> RankGroup:
        """Join the process group a launcher describes, before any framework has built it.

        Under ``torchrun`` or ``accelerate launch`` (``WORLD_SIZE`` > 1 in the environment)
        this builds ``accelerate``'s ``PartialState``, which creates the process group from
        the launcher's variables, as ``TrainingArguments`` would. ``TrainingArguments``
        later resets that state and builds its own; the process group, once created, is
        kept (``init_process_group`` runs only when none exists), so its backend must be
        the one the Trainer would choose: pass the same values as to ``TrainingArguments``.
        Without a launcher (or with a group already there) nothing is created.

        Args:
            cpu: ``TrainingArguments(use_cpu=...)``; default: True when CUDA is unavailable
                (a GPU-less ``PartialState(cpu=False)`` would see a single process) or when
                ``ACCELERATE_USE_CPU`` is set (``accelerate launch --cpu``), as the Trainer does.
            backend: ``TrainingArguments(ddp_backend=...)``; default: accelerate's choice
                (``nccl`` on CUDA, ``gloo`` on the CPU), which is also the Trainer's.
            timeout_s: ``TrainingArguments(ddp_timeout=...)`` (s); default 1800, the Trainer's.

        Returns:
            The group (a single process without a launcher).

        Raises:
            RuntimeError: The group does not have the launcher's ``WORLD_SIZE`` processes.
        """
        world_size = launcher_world_size()
        if world_size <= 1:
            return cls()
        if _process_group_size() > 1:
            return cls.detect()
        import torch
        from accelerate import PartialState

        kwargs: dict[str, Any] = {"timeout": timedelta(seconds=1800.0 if timeout_s is None else timeout_s)}
        if backend is not None:
            kwargs["backend"] = backend
        if cpu is None:
            use_cpu_env = os.environ.get("ACCELERATE_USE_CPU", "false").lower() in ("1", "true", "yes", "on")
            cpu = use_cpu_env or not torch.cuda.is_available()
        state = PartialState(cpu=cpu, **kwargs)
        if state.num_processes != world_size:
            raise RuntimeError(
                f"the launcher started {world_size} processes but accelerate sees {state.num_processes} "
                "(on a machine without CUDA pass cpu=True, as TrainingArguments(use_cpu=True))"
            )
        return cls(num_processes=state.num_processes, process_index=state.process_index, _state=state)

    @property
    def is_distributed(self) -> bool:
        """True when more than one process trains together."""
        return self.num_processes > 1

    def gather(self, values: list[float]) -> list[list[float]]:
        """Return every rank's ``values`` (same length on every rank), ordered by rank.

        Collective: every rank must call it at the same point.
        """
        if not self.is_distributed:
            return [list(values)]
        from accelerate.utils import gather_object

        # gather_object flattens one level: wrap so each rank contributes one list.
        return [list(v) for v in gather_object([list(values)])]

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Return rank ``src``'s ``obj`` (picklable) on every rank.

        Collective: every rank must call it at the same point.
        """
        if not self.is_distributed:
            return obj
        from accelerate.utils import broadcast_object_list

        return broadcast_object_list([obj], from_process=src)[0]

    def broadcast_outcome(self, value: Any, failure: BaseException | None, doing: str) -> Any:
        """Rank 0's ``value`` on every rank, or its ``failure`` on every rank (collective).

        The main process may fail where the others cannot (it alone opens the store): the
        failure travels with the broadcast, so no rank waits for a value that never comes.

        ``value`` is ignored on other ranks; ``doing`` names the work in their message ("suggest a batch size").

        Raises:
            BaseException: ``failure`` itself, on the rank where it happened.
            RuntimeError: On the other ranks, when rank 0 failed (its error is named).
        """
        message = None if failure is None else f"{type(failure).__name__}: {failure}"
        value, message = self.broadcast((value, message))
        if failure is not None:
            raise failure
        if message is not None:
            raise RuntimeError(f"the main process could not {doing} ({message})")
        return value

    def any(self, flag: bool) -> bool:
        """True if ``flag`` is true on any rank (collective)."""
        return any(bool(v[0]) for v in self.gather([1.0 if flag else 0.0]))
