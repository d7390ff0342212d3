"""The persistent store of recurring jobs: one interface, several file backends.

A *job* is a recurring training job (``ZeusConfig.job_id``); each recurrence of it is a
*trial* (the batch size and power limit it ran at, the energy and time it took, whether
it reached its target). The batch-size bandit keeps its state (arms, pruning progress,
random-generator state) per job, and the power-limit profiler caches its profiles by key.

Backends: :class:`~zeus_callbacks.store.sqlite.SQLiteStore` (default) and
:class:`~zeus_callbacks.store.json.JSONStore`; :func:`open_store` picks one. Every
backend passes the same contract suite (``tests/store_contract.py``).
"""

from __future__ import annotations

import abc
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

# The store's error types live in errors.py; importing them from here keeps working.
from zeus_callbacks.errors import StoreCorruptError as StoreCorruptError
from zeus_callbacks.errors import StoreError as StoreError
from zeus_callbacks.errors import StoreSchemaError as StoreSchemaError

SCHEMA_VERSION = 1
"""Version of the store layout this code writes; a newer one is refused."""

TrialStatus = Literal["running", "completed", "failed", "early_stopped"]
TRIAL_STATUSES: tuple[str, ...] = ("running", "completed", "failed", "early_stopped")




@dataclass(frozen=True)
class JobRecord:
    """One recurring job.

    Attributes:
        job_id: The job's name (``ZeusConfig.job_id``).
        created_at: Unix time (s) of the job's first record.
        info: Free-form JSON-safe description (workload, GPU, ...).
    """

    job_id: str
    created_at: float
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TrialRecord:
    """One recurrence of a job.

    Attributes:
        trial_id: Unique within the store, increasing in creation order.
        job_id: The job it belongs to.
        batch_size: Batch size it ran at.
        power_limit_W: Power limit it ran at (W); None if unknown.
        status: ``running``, ``completed``, ``failed`` (crashed, or its process died) or
            ``early_stopped`` (cost exceeded ``beta_knob`` × the best cost).
        energy_J: GPU energy of the run (J); None while running or when unknown.
        time_s: Wall time of the run (s); None while running or when unknown.
        cost: ZeusCost of the run (J-equivalent); None while running or when unknown.
        converged: True when the run reached its target metric.
        started_at: Unix time (s) the trial was created.
        ended_at: Unix time (s) it finished; None while running.
        pid: Process id that runs it.
        host: Host name of that process (dead-process recovery only touches this host's trials).
        info: Free-form JSON-safe extras (phase of the bandit, reason of a stop, ...).
    """

    trial_id: int
    job_id: str
    batch_size: int
    power_limit_W: float | None
    status: TrialStatus
    energy_J: float | None
    time_s: float | None
    cost: float | None
    converged: bool
    started_at: float
    ended_at: float | None
    pid: int
    host: str
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BanditState:
    """The batch-size bandit's persisted state of one job.

    Attributes:
        job_id: The job.
        state: JSON-safe optimiser state (phase, pruning progress, RNG state, min cost).
        arms: Batch size → JSON-safe per-arm state (e.g. pruned, last posterior).
        version: Incremented by every update (optimistic readers can compare).
    """

    job_id: str
    state: dict[str, Any] = field(default_factory=dict)
    arms: dict[int, dict[str, Any]] = field(default_factory=dict)
    version: int = 0


BanditUpdate = Callable[[BanditState], "tuple[BanditState, Any]"]
"""``update_bandit``'s callback: the current state → (new state, a value returned to the caller)."""


def process_is_alive(pid: int) -> bool:
    """True when a process with id ``pid`` exists on this host (signal 0 probe)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:
        return False
    return True


def this_host() -> str:
    """This machine's host name, as trials record it."""
    return socket.gethostname()


def now() -> float:
    """Unix time (s) used for record timestamps."""
    return time.time()


class Store(abc.ABC):
    """Persistent store of jobs, trials, bandit state and power-limit profiles.

    Contract (every backend, checked by ``tests/store_contract.py``):

    - **Concurrency.** A store object may be shared by threads of one process, and
      several processes on one machine may open the same file at once: every write is
      one atomic transaction (SQLite transaction, or lock + atomic file replace), so
      concurrent writers never lose each other's records. :meth:`update_bandit` is an
      atomic read-modify-write: the callback runs while the store is locked, so keep
      it short and free of I/O.
    - **Crash safety.** A process killed at any point leaves the store readable, with
      every write that returned intact. On open, trials left ``running`` by a process
      that no longer exists on this host are marked ``failed`` (``info["reason"] =
      "process died"``), never left dangling.
    - **Errors.** A file that is not a readable store raises :class:`StoreCorruptError`
      naming the file; it is never reset or overwritten. A store written with a newer
      schema raises :class:`StoreSchemaError`. Older schemas are migrated on open.
    - **Return values.** Records are frozen dataclasses (:class:`JobRecord`,
      :class:`TrialRecord`, :class:`BanditState`) or plain JSON-safe dicts; they are
      copies, so mutating them never changes the store. Lists of trials are in
      creation order (``trial_id`` increasing). Missing records read as ``None``.
    - **Ownership.** A trial is owned by the process that created it (``pid``); only
      that process should finish it. The store is written by the main process only.

    Args:
        path: The store file; created (with its parent directory) when missing.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    # -- jobs -----------------------------------------------------------------------
    @abc.abstractmethod
    def ensure_job(self, job_id: str, info: Mapping[str, Any] | None = None) -> JobRecord:
        """Return the job, creating it (with ``info``) if missing; an existing job's info is kept."""

    @abc.abstractmethod
    def get_job(self, job_id: str) -> JobRecord | None:
        """Return the job, or None."""

    @abc.abstractmethod
    def list_jobs(self) -> list[JobRecord]:
        """Return every job, ordered by ``job_id``."""

    # -- trials ---------------------------------------------------------------------
    @abc.abstractmethod
    def create_trial(
        self,
        job_id: str,
        batch_size: int,
        power_limit_W: float | None = None,
        *,
        info: Mapping[str, Any] | None = None,
        pid: int | None = None,
    ) -> TrialRecord:
        """Record a new ``running`` trial of ``job_id`` (the job is created if missing).

        Args:
            job_id: The job.
            batch_size: Batch size the trial runs at.
            power_limit_W: Power limit (W), if known.
            info: JSON-safe extras.
            pid: Owning process; default this one.

        Returns:
            The new trial, with its ``trial_id``.
        """

    @abc.abstractmethod
    def finish_trial(
        self,
        trial_id: int,
        *,
        status: TrialStatus,
        energy_J: float | None,
        time_s: float | None,
        cost: float | None,
        converged: bool,
        batch_size: int | None = None,
        power_limit_W: float | None = None,
        info: Mapping[str, Any] | None = None,
    ) -> TrialRecord:
        """Record a trial's outcome (status other than ``running``); ``info`` is merged in.

        ``batch_size`` / ``power_limit_W`` overwrite the recorded ones when given (the run
        used another value than it was created with).

        Raises:
            KeyError: No trial with that id.
            ValueError: ``status`` is ``running`` or unknown.
        """

    @abc.abstractmethod
    def get_trial(self, trial_id: int) -> TrialRecord | None:
        """Return the trial, or None."""

    @abc.abstractmethod
    def list_trials(self, job_id: str | None = None, *, status: str | None = None) -> list[TrialRecord]:
        """Return the trials of ``job_id`` (None: all), optionally of one status, in creation order."""

    # -- batch-size bandit -------------------------------------------------------------
    @abc.abstractmethod
    def get_bandit(self, job_id: str) -> BanditState | None:
        """Return the bandit state of ``job_id``, or None if it never had one."""

    @abc.abstractmethod
    def update_bandit(self, job_id: str, update: BanditUpdate) -> Any:
        """Atomically read, transform and write the bandit state of ``job_id``.

        Args:
            job_id: The job (created if missing).
            update: Called with the current state (an empty ``BanditState`` the first
                time); returns ``(new_state, result)``. It runs under the store's lock:
                it must not call the store itself.

        Returns:
            The ``result`` the callback returned.
        """

    # -- power-limit profiles ----------------------------------------------------------
    @abc.abstractmethod
    def put_profile(self, key: str, table: Mapping[str, Any]) -> None:
        """Store (replace) the power-limit profile ``key`` → ``table`` (JSON-safe mapping)."""

    @abc.abstractmethod
    def get_profile(self, key: str) -> dict[str, Any] | None:
        """Return the profile stored under ``key``, or None."""

    @abc.abstractmethod
    def list_profiles(self) -> list[str]:
        """Return the stored profile keys, sorted."""

    # -- lifecycle ---------------------------------------------------------------------
    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the file (idempotent)."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r})"


def trial_from_dict(d: Mapping[str, Any]) -> TrialRecord:
    """Build a :class:`TrialRecord` from its dict form (JSON backend, SQLite rows)."""
    return TrialRecord(
        trial_id=int(d["trial_id"]),
        job_id=str(d["job_id"]),
        batch_size=int(d["batch_size"]),
        power_limit_W=None if d.get("power_limit_W") is None else float(d["power_limit_W"]),
        status=d["status"],
        energy_J=None if d.get("energy_J") is None else float(d["energy_J"]),
        time_s=None if d.get("time_s") is None else float(d["time_s"]),
        cost=None if d.get("cost") is None else float(d["cost"]),
        converged=bool(d.get("converged", False)),
        started_at=float(d["started_at"]),
        ended_at=None if d.get("ended_at") is None else float(d["ended_at"]),
        pid=int(d.get("pid", 0)),
        host=str(d.get("host", "")),
        info=dict(d.get("info") or {}),
    )


def check_finish_status(status: str) -> None:
    """Raise ValueError unless ``status`` is a final trial status."""
    if status not in TRIAL_STATUSES or status == "running":
        raise ValueError(f"a finished trial's status must be completed, failed or early_stopped, got {status!r}")


def is_orphan(trial: Mapping[str, Any], host: str) -> bool:
    """True for a ``running`` trial of this host whose process is gone."""
    return trial["status"] == "running" and trial.get("host") == host and not process_is_alive(int(trial["pid"]))
