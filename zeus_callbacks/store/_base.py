"""The :class:`Store` contract and the helpers its stores share.

Below it: the records (:mod:`~zeus_callbacks.store._stored_records`) and the lease keeper
(:mod:`~zeus_callbacks.store._lease`). Above it: :class:`~zeus_callbacks.store._sql_store.SQLStore` and
:class:`~zeus_callbacks.store._json_store.JSONStore`, which pass one contract suite (``tests/store_contract.py``).
"""

from __future__ import annotations

import abc
import errno as _errno
import logging
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

# The store's error types live in errors.py; importing them from here keeps working.
from zeus_callbacks._atomic_io import ownership_problem
from zeus_callbacks.errors import StoreCorruptError as StoreCorruptError
from zeus_callbacks.errors import StoreError as StoreError
from zeus_callbacks.errors import StoreFullError, StoreLockedError, StorePermissionError
from zeus_callbacks.errors import StoreSchemaError as StoreSchemaError
from zeus_callbacks.errors import StoreValueError as StoreValueError
from zeus_callbacks.store import _stored_records as records
from zeus_callbacks.store._lease import KEEPER, this_host
from zeus_callbacks.store._stored_records import BanditState, JobRecord, Outcome, Snapshot, TrialRecord, TrialStatus

logger = logging.getLogger(__name__)
T = TypeVar("T")

SCHEMA_VERSION = 4
"""Version of the store layout this code writes; a newer one is refused.

1: jobs, trials, bandits, arms, profiles. 2: trials carry a lease (``owner``, ``heartbeat_at``).
3: trials carry the id of the pending-trial file they were recorded from (``pending_id``, unique).
4: a trial may be ``withdrawn`` (a suggestion no run claimed; the status CHECK admits it).
"""

DEFAULT_LEASE_GRACE_S = 300.0
"""A running trial of another host whose heartbeat is older than this (s) is marked failed on open."""

BanditUpdate = Callable[[BanditState], "tuple[BanditState, Any]"]
"""``update_bandit``'s callback: the current state → (new state, a value returned to the caller)."""

OutcomeUpdate = Callable[[TrialRecord, "list[TrialRecord]", BanditState], BanditState]
"""``finish_trial``'s bandit callback: (the finished trial, every trial of its job in creation order,
the finished one included, the job's current bandit state) → the job's new bandit state."""


def process_is_alive(pid: int) -> bool:
    """True when a process with id ``pid`` exists on this host (``psutil.pid_exists``; another user's counts)."""
    import psutil

    return pid > 0 and psutil.pid_exists(pid)


def now() -> float:
    """Unix time (s) used for record timestamps."""
    return time.time()


def mask_url(url: str) -> str:
    """``url`` with its password (``user:password@`` or ``?password=``) replaced by ``***``, for messages."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparsable store url>"
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, hostinfo = netloc.rsplit("@", 1)
        if ":" in userinfo:
            netloc = f"{userinfo.split(':', 1)[0]}:***@{hostinfo}"
    query = "&".join(
        f"{k}=***" if k.lower() in ("password", "passwd") else f"{k}={v}" if v else k
        for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    )
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=query))


class Store(abc.ABC):
    """Persistent store of jobs, trials, bandit state and power-limit profiles.

    Contract (every backend, checked by ``tests/store_contract.py``):

    - **Concurrency.** A store object may be shared by threads of one process, and
      several processes on one machine may open the same file at once: every write is
      one atomic transaction (SQLite transaction, or lock + atomic file replace), so
      concurrent writers never lose each other's records. :meth:`update_bandit` is an
      atomic read-modify-write: the callback runs while the store is locked, so keep
      it short and free of I/O. :meth:`finish_trial` given a ``bandit_update`` writes the
      trial's outcome and the update of its job's bandit in one transaction: both or
      neither, whatever raises or kills the process.
    - **Crash safety.** A process killed at any point leaves the store readable, with
      every write that returned intact. On open, trials left ``running`` by a process
      that no longer exists on this host are marked ``failed`` (``info["reason"] =
      "process died"``), never left dangling.
    - **Leases.** A trial created for this process carries its owner token
      (:func:`lease_owner`), and a background thread of the process renews its
      ``heartbeat_at`` every :func:`heartbeat_interval_s` until it is finished. A running
      trial of *another* host whose heartbeat is older than ``lease_grace_s`` is marked
      ``failed`` (``info["reason"] = "lease expired"``) by whichever process opens the
      store next, on any node; every process sharing a store should use the same grace.
    - **Errors.** A file that is not a readable store raises :class:`StoreCorruptError`
      naming the file; it is never reset or overwritten. A store written with a newer
      schema raises :class:`StoreSchemaError`. Older schemas are migrated on open.
    - **Return values.** Records are frozen dataclasses (:class:`JobRecord`,
      :class:`TrialRecord`, :class:`BanditState`) or plain JSON-safe dicts; they are
      copies, so mutating them never changes the store. Lists of trials are in
      creation order (``trial_id`` increasing). Missing records read as ``None``.
    - **Ownership.** A trial is owned by the process that created it (``pid``, ``owner``);
      only that process should finish it. The store is written by the main process only.

    Args:
        path: The store file; created (with its parent directory) when missing.
        lease_grace_s: Grace period (s) of a running trial's lease (see *Leases*).
    """

    def __init__(self, path: str | Path, *, lease_grace_s: float = DEFAULT_LEASE_GRACE_S) -> None:
        self.path = Path(path)
        if not lease_grace_s > 0:
            raise ValueError(f"lease_grace_s must be > 0, got {lease_grace_s!r}")
        self.lease_grace_s = float(lease_grace_s)

    @property
    def location(self) -> str:
        """The store's file or (password-masked) URL, as messages name it."""
        return str(self.path)

    # -- jobs -----------------------------------------------------------------------
    @abc.abstractmethod
    def ensure_job(self, job_id: str, info: Mapping[str, Any] | None = None) -> JobRecord:
        """Return the job, creating it (with ``info``) if missing; an existing job's info is kept."""

    def get_job(self, job_id: str) -> JobRecord | None:
        """Return the job, or None."""
        return next((job for job in self.list_jobs() if job.job_id == job_id), None)

    @abc.abstractmethod
    def list_jobs(self) -> list[JobRecord]:
        """Return every job, ordered by ``job_id``."""

    # -- trials ---------------------------------------------------------------------
    def create_trial(
        self,
        job_id: str,
        batch_size: int,
        power_limit_W: float | None = None,
        *,
        info: Mapping[str, Any] | None = None,
        pid: int | None = None,
        pending_id: str | None = None,
    ) -> TrialRecord:
        """Record a new ``running`` trial of ``job_id`` (the job is created if missing).

        Args:
            job_id: The job.
            batch_size: Batch size the trial runs at.
            power_limit_W: Power limit (W), if known.
            info: JSON-safe extras.
            pid: Owning process; default this one.
            pending_id: The pending-trial file the trial is recorded from (a run that trained
                without the store). When a trial with this id exists already, that trial is
                returned and nothing is written, in the same transaction: merging a file twice
                never makes a second trial.

        Returns:
            The new trial, with its ``trial_id`` (or the existing one of ``pending_id``).
        """
        fields = records.new_trial(
            self.location, job_id, batch_size, power_limit_W, info=info, pid=pid, pending_id=pending_id, now_s=now()
        )
        trial, created = self._insert_trial(job_id, fields, pending_id)
        if fields["owner"] and created:
            KEEPER.hold(self, trial.trial_id)
        return trial

    @abc.abstractmethod
    def _insert_trial(self, job_id: str, fields: dict[str, Any], pending_id: str | None) -> tuple[TrialRecord, bool]:
        """Insert a trial of ``fields`` (``records.new_trial``), or find ``pending_id``'s; True when inserted."""

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
        pending_id: str | None = None,
        bandit_update: OutcomeUpdate | None = None,
    ) -> TrialRecord:
        """Record a trial's outcome (status other than ``running``); ``info`` is merged in.

        ``batch_size`` / ``power_limit_W`` overwrite the recorded ones when given (the run
        used another value than it was created with). ``pending_id`` (the pending-trial file
        the outcome comes from) is recorded with the outcome, in the same transaction, so a
        merge that died before removing its file is recognised when the file is merged again.

        ``bandit_update`` (the batch-size bandit absorbing the outcome) is called, in the same
        transaction and after the outcome is written, with the finished trial, every trial of
        its job (creation order, the finished one included) and the job's bandit state (an empty
        ``BanditState`` the first time); the state it returns replaces the job's bandit state
        (version + 1). The outcome and the bandit update are one atomic write: when the callback
        raises, a new state is refused (:class:`StoreValueError`) or the process dies before
        the commit, neither is written and the trial stays ``running``; there is never an
        outcome recorded without its bandit update. Like :meth:`update_bandit`'s callback, it
        runs under the store's lock, must not call the store, and may be run again (a database
        retrying a transient error): keep it a pure function of its arguments.

        Returns:
            The finished trial.

        Raises:
            KeyError: No trial with that id.
            ValueError: ``status`` is ``running`` or unknown.
            StoreValueError: A value (or the new bandit state) holds a non-finite number;
                nothing was written.
        """
        outcome = records.outcome(
            self.location,
            trial_id,
            status=status,
            energy_J=energy_J,
            time_s=time_s,
            cost=cost,
            converged=converged,
            batch_size=batch_size,
            power_limit_W=power_limit_W,
            info=info,
            pending_id=pending_id,
        )
        finished = self._finish_trial(trial_id, outcome, pending_id, bandit_update)
        KEEPER.release(self, trial_id)
        return finished

    @abc.abstractmethod
    def _finish_trial(
        self, trial_id: int, outcome: Outcome, pending_id: str | None, bandit_update: OutcomeUpdate | None
    ) -> TrialRecord:
        """Write ``outcome`` (``records.outcome``) and ``bandit_update``'s state in one transaction."""

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

    # -- copies ------------------------------------------------------------------------
    @abc.abstractmethod
    def import_records(self, snapshot: Snapshot) -> None:
        """Write every record of ``snapshot`` (another store's, read by ``records.snapshot``) into this empty store.

        Trial ids, times and bandit versions are kept; it is one write (all or nothing).

        Raises:
            StoreError: This store holds jobs already (nothing was written).
        """

    # -- leases ------------------------------------------------------------------------
    @abc.abstractmethod
    def renew_leases(self, owner: str, trial_ids: set[int]) -> set[int]:
        """Set ``heartbeat_at`` to now on those of ``trial_ids`` still running under ``owner``.

        Returns:
            The trial ids whose lease is still held (the others were finished, or marked
            failed by another process after their lease expired).
        """

    @abc.abstractmethod
    def reopen(self) -> Store | None:
        """A new, independent store object on the same file or database (for the lease keeper).

        Returns:
            The new store; None when a store file no longer exists (it is not re-created).
        """

    # -- lifecycle ---------------------------------------------------------------------
    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the file (idempotent)."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.location!r})"


def snapshot(store: Store) -> Snapshot:
    """Read every record of ``store`` (jobs, trials in creation order, bandit states, profiles)."""
    jobs = store.list_jobs()
    bandits = [b for b in (store.get_bandit(j.job_id) for j in jobs) if b is not None]
    profiles = {key: store.get_profile(key) or {} for key in store.list_profiles()}
    return Snapshot(jobs, store.list_trials(), bandits, profiles)


_FULL_ERRNOS = {_errno.ENOSPC, _errno.EDQUOT}
_PERMISSION_ERRNOS = {_errno.EACCES, _errno.EPERM, _errno.EROFS}


def os_error(exc: OSError, location: str, what: str) -> StoreError:
    """The store error for an OS error while doing ``what`` (``"write"``) to the store's files, by its ``errno``.

    :class:`StoreFullError` for ``ENOSPC``/``EDQUOT``, :class:`StorePermissionError` for
    ``EACCES``/``EPERM``/``EROFS``, else :class:`StoreError`; raise it ``from exc``.
    """
    if exc.errno in _FULL_ERRNOS:
        return StoreFullError(
            f"store {location}: no space left on its device ({what}: {exc.strerror}); nothing was changed — free "
            "some space or set store.path to another filesystem"
        )
    if exc.errno in _PERMISSION_ERRNOS or isinstance(exc, PermissionError):
        return StorePermissionError(
            f"store {location}: permission denied ({what}: {exc.strerror}{': ' + exc.filename if exc.filename else ''}"
            "); make the file and its directory readable and writable by this user, or set store.path to another "
            "file; nothing was changed"
        )
    return StoreError(f"cannot {what} store {location}: {exc}")


def locked_error(location: str, waited_s: float, limit_s: float, detail: str) -> StoreLockedError:
    """The error for a store another process kept locked past the limit (the wait is the real one)."""
    return StoreLockedError(f"store {location} stayed locked for {waited_s:.1f} s (limit {limit_s:g} s; {detail})")


def dead_trials(trials: Iterable[T], lease_grace_s: float) -> list[tuple[T, str]]:
    """The dead ones among ``trials`` (records, or a document's dicts), each with why.

    A running trial on this host is dead when its process is gone (``"process died"``); one of another
    host, when its heartbeat is older than ``lease_grace_s`` (``"lease expired"``; a trial without a
    heartbeat, from a schema-1 store, never expires).
    """
    host, now_s = this_host(), now()
    dead = []
    for trial in trials:
        t = trial if isinstance(trial, Mapping) else vars(trial)
        if t["status"] != "running":
            continue
        if t.get("host") == host:
            if not process_is_alive(int(t["pid"])):
                dead.append((trial, "process died"))
        elif t.get("heartbeat_at") is not None and now_s - float(t["heartbeat_at"]) > lease_grace_s:
            dead.append((trial, "lease expired"))
    return dead


def refuse_foreign_store(path: Path) -> None:
    """Refuse (:class:`StoreError`) to write a store file that is a link or another user's (docs/shared-clusters.md).

    Another user's store could feed this run's bandit the batch sizes it tries, and a link could
    make this run write through it; reading one (``show``, ``simulate``) stays allowed.
    """
    problem = ownership_problem(path)
    if problem is not None:
        raise StoreError(
            f"store {path}: {problem}; it is not opened for writing (use a store of your own, or open it read-only)"
        )


def retry_transient(attempt: Callable[[], T], limit_s: float, is_transient: Callable[[BaseException], bool]) -> T:
    """``attempt()`` (one transaction, safe to re-run), re-run while ``is_transient(error)`` for up to ``limit_s``.

    The stores' one retry policy: a database unreachable, deadlocked or restarting, a SQLite file another
    process holds. Waits 20 ms, doubling up to 1 s, plus up to 20 ms of jitter (so that processes that
    collided do not collide again). Any other error, or the last one, is raised.
    """
    import tenacity

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception(is_transient),
        stop=tenacity.stop_before_delay(limit_s),
        # wait_exponential_jitter's parameters were renamed in tenacity 9.2 (initial -> multiplier, with a
        # DeprecationWarning): the sum of the two older waits says the same in every version since 8.3
        wait=tenacity.wait_exponential(multiplier=0.02, max=1.0) + tenacity.wait_random(0, 0.02),
        reraise=True,
    )
    return retrying(attempt)


def file_identity(path: Path) -> tuple[int, int] | None:
    """The file's identity (device, inode); None when there is no file."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


def log_orphan(trial: Mapping[str, Any], reason: str, lease_grace_s: float) -> None:
    """Warn that a dead trial (``reason``: see :func:`dead_trials`) was marked failed on open."""
    logger.warning(
        "zeus-callbacks: trial %d of job %s (process %d on %s) %s; marked failed",
        trial["trial_id"],
        trial["job_id"],
        trial["pid"],
        trial.get("host"),
        "died" if reason == "process died" else f"sent no heartbeat for {lease_grace_s:g} s",
    )
