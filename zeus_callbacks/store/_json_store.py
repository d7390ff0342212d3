"""JSON store: one human-readable file, replaced atomically under a file lock.

A write takes an exclusive :class:`filelock.FileLock` on ``<file>.lock``, reads the file, changes it and
writes it back, one record a line (:func:`document_text`), with :func:`~zeus_callbacks._atomic_io.atomic_output`
(fsync'ed, then ``os.replace``): a reader, who takes no lock, or a process killed mid-write only ever sees a
complete file. The whole file is rewritten per write: for small stores (SQLite for many concurrent runs). On a
network filesystem (:mod:`~zeus_callbacks.store._netfs`) the lock is a :class:`filelock.SoftFileLock` (``O_EXCL``
create), as ``fcntl`` locks are unreliable there. Opening reads first, and locks only to migrate or mark dead
trials.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from filelock import FileLock, SoftFileLock, Timeout

from zeus_callbacks._atomic_io import atomic_output
from zeus_callbacks.store import _netfs as netfs
from zeus_callbacks.store import _stored_records as records
from zeus_callbacks.store._base import (
    DEFAULT_LEASE_GRACE_S,
    SCHEMA_VERSION,
    BanditState,
    BanditUpdate,
    JobRecord,
    OutcomeUpdate,
    Store,
    StoreCorruptError,
    StoreError,
    StoreSchemaError,
    TrialRecord,
    dead_trials,
    locked_error,
    log_orphan,
    now,
    os_error,
    refuse_foreign_store,
)

logger = logging.getLogger(__name__)

FORMAT = "zeus-callbacks-store"
"""Value of the document's ``format`` key: tells a store from any other JSON file."""

Document = dict[str, Any]


def _migrate_1_to_2(doc: Document) -> None:
    for trial in doc["trials"]:
        trial.setdefault("owner", "")
        trial.setdefault("heartbeat_at", None)


def _migrate_2_to_3(doc: Document) -> None:
    for trial in doc["trials"]:
        trial.setdefault("pending_id", None)


def _migrate_3_to_4(doc: Document) -> None:
    """Schema 4 admits the status ``withdrawn``: no record changes, the version tells older code to keep off."""


MIGRATIONS: dict[int, Callable[[Document], None]] = {1: _migrate_1_to_2, 2: _migrate_2_to_3, 3: _migrate_3_to_4}
"""``MIGRATIONS[v]`` turns a version-``v`` document into version ``v + 1`` in place."""


_ENCODE = json.JSONEncoder(sort_keys=True).encode  # one encoder for every record: json.dumps builds one a call


def document_text(doc: Document) -> str:
    """The store's JSON text: one record a line (a trial, a job, a bandit), keys sorted.

    Readable and diffable as an indented file is, but each line comes from the C encoder: ``json.dump``
    with an indent runs the pure-Python one (benchmarks/json_store_write.py), with writers queued on the lock.
    """

    def block(value: Any) -> str:
        if isinstance(value, list) and value:
            return "[\n  " + ",\n  ".join(map(_ENCODE, value)) + "\n ]"
        if isinstance(value, dict) and value:
            return "{\n" + ",\n".join(f"  {_ENCODE(k)}: {_ENCODE(v)}" for k, v in sorted(value.items())) + "\n }"
        return _ENCODE(value)

    return "{\n" + ",\n".join(f" {_ENCODE(k)}: {block(v)}" for k, v in sorted(doc.items())) + "\n}\n"


def _empty_document() -> Document:
    return {
        "format": FORMAT,
        "schema_version": SCHEMA_VERSION,
        "next_trial_id": 1,
        "jobs": {},
        "trials": [],
        "bandits": {},
        "profiles": {},
    }


class JSONStore(Store):
    """The :class:`~zeus_callbacks.store._base.Store` contract on a JSON file.

    Args:
        path: The JSON file; created with its parent directory when missing.
        lock_timeout_s: How long a write waits for another writer's lock (s).
        lease_grace_s: Grace period (s) of a running trial's lease (see :class:`Store`).
        read_only: Open for reading only (``show``, ``plot``): the file must exist and be a
            store; no lock file, migration or orphan recovery; writes raise :class:`StoreError`.

    Raises:
        StoreCorruptError: The file exists but is not a readable zeus-callbacks store.
        StoreSchemaError: The file's schema is newer than this code's.
        StoreError: The lock could not be taken within ``lock_timeout_s``.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        lock_timeout_s: float = 30.0,
        lease_grace_s: float = DEFAULT_LEASE_GRACE_S,
        read_only: bool = False,
    ) -> None:
        super().__init__(path, lease_grace_s=lease_grace_s)
        self.lock_timeout_s = float(lock_timeout_s)
        self.read_only = read_only
        if self.path.is_dir():
            raise StoreError(f"store {self.path} is a directory, not a store file")
        if not read_only:
            refuse_foreign_store(self.path)
        self.network_fs = netfs.is_network_filesystem(self.path)
        lock_class = SoftFileLock if self.network_fs else FileLock
        if self.network_fs and not read_only:
            netfs.warn_network_filesystem(
                self.path,
                "the JSON store locks with an O_EXCL lock file there (a writer killed while holding it "
                "leaves it behind: remove it by hand)",
            )
        # A write holds the lock for milliseconds: a waiting writer looks every 5 ms, not filelock's 50.
        self._lock = lock_class(str(self.path) + ".lock", timeout=self.lock_timeout_s, poll_interval=0.005)
        if read_only:  # no lock file, no write: each read loads the whole (atomically replaced) file
            if not self.path.exists():
                raise StoreError(f"no such store: {self.path}")
            self._load()
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise os_error(exc, str(self.path), "create the directory of") from exc
        if self.path.exists():  # a read first: the common open (current schema, no dead trial) takes no lock
            doc = self._load()
            if doc["schema_version"] == SCHEMA_VERSION and not dead_trials(doc["trials"], self.lease_grace_s):
                return
        self._mutate(self._migrate_and_recover, always_write=not self.path.exists())

    # -- plumbing -----------------------------------------------------------------------
    def _load(self) -> Document:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return _empty_document()
        except OSError as exc:
            raise os_error(exc, str(self.path), "read") from exc
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise StoreCorruptError(
                f"store {self.path} is not valid JSON ({exc}); it was left untouched — move it away to start a new one"
            ) from exc
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise StoreCorruptError(
                f'{self.path} is not a zeus-callbacks store (no "format": "{FORMAT}"); it was left untouched'
            )
        version = doc.get("schema_version")
        if not isinstance(version, int):
            raise StoreCorruptError(f"store {self.path} has no integer schema_version")
        if version > SCHEMA_VERSION:
            raise StoreSchemaError(
                f"store {self.path} has schema version {version}, newer than this zeus-callbacks understands "
                f"({SCHEMA_VERSION}); upgrade zeus-callbacks or use another store file"
            )
        return records.validate_document(doc, str(self.path))  # every record checked before any use or write

    def _mutate(self, change: Callable[[Document], Any], *, always_write: bool = True) -> Any:
        """Run ``change`` on the document under the lock and write it back atomically."""
        if self.read_only:
            raise StoreError(f"store {self.path} was opened read-only")
        start = time.monotonic()
        try:
            with self._lock:
                doc = self._load()
                before = copy.deepcopy(doc) if not always_write else None
                result = change(doc)
                if always_write or doc != before:
                    with atomic_output(self.path) as fh:
                        fh.write(document_text(doc))
                return result
        except Timeout as exc:
            raise locked_error(
                str(self.path), time.monotonic() - start, self.lock_timeout_s, f"lock file {self._lock.lock_file}"
            ) from exc
        except OSError as exc:  # the lock file or the new document could not be written: nothing changed
            raise os_error(exc, str(self.path), "write") from exc

    def _migrate_and_recover(self, doc: Document) -> None:
        while doc["schema_version"] < SCHEMA_VERSION:
            MIGRATIONS[doc["schema_version"]](doc)
            doc["schema_version"] += 1
        for trial, reason in dead_trials(doc["trials"], self.lease_grace_s):
            trial.update(records.orphan_fields(self._record(trial), reason, now()))
            log_orphan(trial, reason, self.lease_grace_s)

    # -- jobs ---------------------------------------------------------------------------
    def ensure_job(self, job_id: str, info: Mapping[str, Any] | None = None) -> JobRecord:
        """See :meth:`Store.ensure_job`."""

        def change(doc: Document) -> JobRecord:
            job = _ensure_job(doc, job_id, info)
            return JobRecord(job_id, job["created_at"], copy.deepcopy(job["info"]))

        return self._mutate(change)

    def list_jobs(self) -> list[JobRecord]:
        """See :meth:`Store.list_jobs`."""
        jobs = self._load()["jobs"]
        return [JobRecord(k, jobs[k]["created_at"], jobs[k]["info"]) for k in sorted(jobs)]

    # -- trials -------------------------------------------------------------------------
    def _insert_trial(self, job_id: str, fields: dict[str, Any], pending_id: str | None) -> tuple[TrialRecord, bool]:
        created = True

        def change(doc: Document) -> TrialRecord:
            nonlocal created
            if pending_id is not None:  # recorded from this pending file already: that trial, nothing new
                existing = next((t for t in doc["trials"] if t.get("pending_id") == pending_id), None)
                if existing is not None:
                    created = False
                    return self._record(existing)
            _ensure_job(doc, job_id, None)
            trial = {"trial_id": doc["next_trial_id"], **copy.deepcopy(fields)}
            doc["next_trial_id"] += 1
            doc["trials"].append(trial)
            return self._record(trial)

        return self._mutate(change, always_write=pending_id is None), created  # an existing one: no rewrite

    def _finish_trial(
        self, trial_id: int, outcome: records.Outcome, pending_id: str | None, bandit_update: OutcomeUpdate | None
    ) -> TrialRecord:
        """With ``bandit_update``: one locked read-modify-write of the file."""

        def change(doc: Document) -> TrialRecord:
            trial = next((t for t in doc["trials"] if t["trial_id"] == trial_id), None)
            if trial is None:
                raise KeyError(f"no trial {trial_id} in store {self.path}")
            if pending_id is not None and any(
                t.get("pending_id") == pending_id and t is not trial for t in doc["trials"]
            ):
                raise StoreError(
                    f"store {self.path}: pending trial {pending_id} is already recorded as another trial; nothing "
                    "was written"
                )
            trial.update(copy.deepcopy(records.finished_fields(self._record(trial), outcome, now())))
            finished = self._record(trial)
            if bandit_update is not None:  # on the same document: one file replace writes both, or none
                job_id = finished.job_id
                current = self._bandit(job_id, doc) or BanditState(job_id)
                new = bandit_update(finished, self._trials(doc, job_id), current)
                doc["bandits"][job_id] = _bandit_entry(new, current.version + 1, self.location)
            return finished

        return self._mutate(change)

    def get_trial(self, trial_id: int) -> TrialRecord | None:
        """See :meth:`Store.get_trial`."""
        trial = next((t for t in self._load()["trials"] if t["trial_id"] == trial_id), None)
        return None if trial is None else self._record(trial)

    def list_trials(self, job_id: str | None = None, *, status: str | None = None) -> list[TrialRecord]:
        """See :meth:`Store.list_trials`."""
        return self._trials(self._load(), job_id, status)

    def _trials(self, doc: Document, job_id: str | None, status: str | None = None) -> list[TrialRecord]:
        return [
            self._record(t)
            for t in sorted(doc["trials"], key=lambda t: t["trial_id"])
            if (job_id is None or t["job_id"] == job_id) and (status is None or t["status"] == status)
        ]

    # -- bandit -------------------------------------------------------------------------
    def get_bandit(self, job_id: str) -> BanditState | None:
        """See :meth:`Store.get_bandit`."""
        return self._bandit(job_id, self._load())

    def update_bandit(self, job_id: str, update: BanditUpdate) -> Any:
        """See :meth:`Store.update_bandit`."""

        def change(doc: Document) -> Any:
            _ensure_job(doc, job_id, None)
            current = self._bandit(job_id, doc) or BanditState(job_id)
            new, result = update(current)
            doc["bandits"][job_id] = _bandit_entry(new, current.version + 1, self.location)
            return result

        return self._mutate(change)

    def _bandit(self, job_id: str, doc: Document) -> BanditState | None:
        entry = doc["bandits"].get(job_id)
        if entry is None:
            return None
        return records.bandit(job_id, entry["state"], entry["version"], entry["arms"].items(), self.location)

    def _record(self, trial: Mapping[str, Any]) -> TrialRecord:
        """A trial of the (validated) document as a record: a copy, never the document's own dicts."""
        return records.trial(copy.deepcopy(trial), self.location)

    # -- profiles -----------------------------------------------------------------------
    def put_profile(self, key: str, table: Mapping[str, Any]) -> None:
        """See :meth:`Store.put_profile`."""

        def change(doc: Document) -> None:
            doc["profiles"][key] = json.loads(json.dumps(dict(table)))

        self._mutate(change)

    def get_profile(self, key: str) -> dict[str, Any] | None:
        """See :meth:`Store.get_profile`."""
        return self._load()["profiles"].get(key)

    def list_profiles(self) -> list[str]:
        """See :meth:`Store.list_profiles`."""
        return sorted(self._load()["profiles"])

    # -- copies -------------------------------------------------------------------------
    def import_records(self, snapshot: records.Snapshot) -> None:
        """See :meth:`Store.import_records` (one locked replace of the file)."""

        def change(doc: Document) -> None:
            if doc["jobs"]:
                raise StoreError(f"store {self.path} holds jobs already: copy into a new, empty store")
            for job in snapshot.jobs:
                doc["jobs"][job.job_id] = {"created_at": job.created_at, "info": copy.deepcopy(job.info)}
            doc["trials"] = [{**copy.deepcopy(t.__dict__)} for t in snapshot.trials]
            doc["next_trial_id"] = max((t.trial_id for t in snapshot.trials), default=0) + 1
            for state in snapshot.bandits:
                doc["bandits"][state.job_id] = _bandit_entry(state, state.version, self.location)
            doc["profiles"] = copy.deepcopy(snapshot.profiles)

        self._mutate(change)

    # -- leases -------------------------------------------------------------------------
    def renew_leases(self, owner: str, trial_ids: set[int]) -> set[int]:
        """See :meth:`Store.renew_leases`; none is held once the file is gone (it is not re-created)."""
        if not self.path.exists():  # gone: a lease is never a reason to create a store
            return set()

        def change(doc: Document) -> set[int]:
            kept, now_s = set(), now()
            for trial in doc["trials"]:
                if trial["trial_id"] in trial_ids and trial["status"] == "running" and trial.get("owner") == owner:
                    trial["heartbeat_at"] = now_s
                    kept.add(trial["trial_id"])
            return kept

        # always_write=False: a file removed since the check above reads as empty and is not re-created
        return self._mutate(change, always_write=False) if trial_ids else set()

    def reopen(self) -> JSONStore | None:
        """See :meth:`Store.reopen`; None when the file is gone (never re-created for a lease)."""
        if not self.path.exists():
            return None
        return JSONStore(self.path, lock_timeout_s=self.lock_timeout_s, lease_grace_s=self.lease_grace_s)


def _ensure_job(doc: Document, job_id: str, info: Mapping[str, Any] | None) -> dict[str, Any]:
    if job_id not in doc["jobs"]:
        doc["jobs"][job_id] = {"created_at": now(), "info": dict(info or {})}
    return doc["jobs"][job_id]


def _bandit_entry(state: BanditState, version: int, location: str) -> dict[str, Any]:
    """A bandit state as the document keeps it (arms keyed by the batch size as text); refused if not JSON-safe."""
    state_json, arms_json = records.bandit_json(state, location)
    return {
        "state": json.loads(state_json),
        "arms": {str(b): json.loads(a) for b, a in arms_json.items()},
        "version": version,
    }
