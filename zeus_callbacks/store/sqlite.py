"""SQLite store (the default): one file, WAL journal, one transaction per write.

Several processes on one machine may write the same file: each write is a
``BEGIN IMMEDIATE`` transaction and waits up to ``busy_timeout_s`` for the others.
On a network filesystem (NFS, CIFS, Lustre, GPFS: :mod:`~zeus_callbacks.store.netfs`)
the file keeps SQLite's rollback journal instead of WAL, whose shared memory only works
on one host. Opening reads first and takes a write transaction only when there is a
migration or a dead trial to mark.
The layout is versioned in a ``schema_version`` table; :data:`MIGRATIONS` brings an
older file up to :data:`~zeus_callbacks.store.base.SCHEMA_VERSION` on open, and a newer
one is refused.
"""

from __future__ import annotations

import json
import logging
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from zeus_callbacks.errors import StoreFullError, StorePermissionError
from zeus_callbacks.store import netfs, records
from zeus_callbacks.store.base import (
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
    TrialStatus,
    check_finish_status,
    check_finite,
    dumps_strict,
    lease_owner,
    locked_error,
    now,
    orphan_reason,
    os_error,
    refuse_foreign_store,
    this_host,
)
from zeus_callbacks.store.lease import KEEPER

logger = logging.getLogger(__name__)

_TRIAL_COLUMNS = (
    "trial_id, job_id, batch_size, power_limit_W, status, energy_J, time_s, cost, converged, "
    "started_at, ended_at, pid, host, info, owner, heartbeat_at, pending_id"
)
_OLD_TRIAL_COLUMNS = {
    1: _TRIAL_COLUMNS.replace(
        "owner, heartbeat_at, pending_id", "'' AS owner, NULL AS heartbeat_at, NULL AS pending_id"
    ),
    2: _TRIAL_COLUMNS.replace("pending_id", "NULL AS pending_id"),
}
"""A read-only open of an older file (never migrated: read-only) reads its trials with the newer fields empty."""


def _migrate_0_to_1(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE TABLE jobs (job_id TEXT PRIMARY KEY, created_at REAL NOT NULL, info TEXT NOT NULL)")
    conn.execute(
        """CREATE TABLE trials (
            trial_id INTEGER PRIMARY KEY AUTOINCREMENT,
            job_id TEXT NOT NULL REFERENCES jobs(job_id),
            batch_size INTEGER NOT NULL,
            power_limit_W REAL,
            status TEXT NOT NULL CHECK (status IN ('running', 'completed', 'failed', 'early_stopped')),
            energy_J REAL, time_s REAL, cost REAL,
            converged INTEGER NOT NULL DEFAULT 0,
            started_at REAL NOT NULL, ended_at REAL,
            pid INTEGER NOT NULL, host TEXT NOT NULL,
            info TEXT NOT NULL)"""
    )
    conn.execute("CREATE INDEX trials_by_job ON trials (job_id, trial_id)")
    conn.execute("CREATE TABLE bandits (job_id TEXT PRIMARY KEY, state TEXT NOT NULL, version INTEGER NOT NULL)")
    conn.execute(
        "CREATE TABLE arms (job_id TEXT NOT NULL, batch_size INTEGER NOT NULL, state TEXT NOT NULL, "
        "PRIMARY KEY (job_id, batch_size))"
    )
    conn.execute("CREATE TABLE profiles (key TEXT PRIMARY KEY, table_json TEXT NOT NULL, updated_at REAL NOT NULL)")


def _migrate_1_to_2(conn: sqlite3.Connection) -> None:
    conn.execute("ALTER TABLE trials ADD COLUMN owner TEXT NOT NULL DEFAULT ''")
    conn.execute("ALTER TABLE trials ADD COLUMN heartbeat_at REAL")
    conn.execute("CREATE INDEX trials_by_status ON trials (status)")


def _migrate_2_to_3(conn: sqlite3.Connection) -> None:
    conn.execute("ALTER TABLE trials ADD COLUMN pending_id TEXT")
    conn.execute("CREATE UNIQUE INDEX trials_by_pending_id ON trials (pending_id)")  # NULLs are distinct


MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {
    0: _migrate_0_to_1,
    1: _migrate_1_to_2,
    2: _migrate_2_to_3,
}
"""``MIGRATIONS[v]`` turns a version-``v`` file into version ``v + 1`` (inside one transaction)."""


class SQLiteStore(Store):
    """The :class:`~zeus_callbacks.store.base.Store` contract on a SQLite file (stdlib ``sqlite3``).

    Args:
        path: The database file; created with its parent directory when missing.
        busy_timeout_s: How long a write waits for another process's transaction (s).
        lease_grace_s: Grace period (s) of a running trial's lease (see :class:`Store`).
        read_only: Open for reading only, creating and changing nothing (``show``, ``plot``):
            the file must exist and be a store; no migration or orphan recovery is done,
            and writes raise :class:`StoreError`. It opens with SQLite's ``mode=ro`` when a
            writer's ``-wal`` file is present (so its committed transactions are seen), and
            ``immutable=1`` otherwise, so no ``-wal``/``-shm`` file is ever created.

    Raises:
        StoreCorruptError: The file exists but is not a readable zeus-callbacks store (read-only:
            also an empty file).
        StoreSchemaError: The file's schema is newer than this code's.
        StoreError: The file cannot be opened (a directory, permissions, no such file when
            read-only, or still locked after the timeout).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        busy_timeout_s: float = 30.0,
        lease_grace_s: float = DEFAULT_LEASE_GRACE_S,
        read_only: bool = False,
    ) -> None:
        super().__init__(path, lease_grace_s=lease_grace_s)
        self.busy_timeout_s = float(busy_timeout_s)
        self.read_only = read_only
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        self._columns = _TRIAL_COLUMNS
        self._file_id: tuple[int, int] | None = None
        if self.path.is_dir():
            raise StoreError(f"store {self.path} is a directory, not a store file")
        if not read_only:
            refuse_foreign_store(self.path)
        if read_only:
            _check_readable_store_file(self.path)
        else:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise os_error(exc, str(self.path), "create the directory of") from exc
        self.network_fs = netfs.is_network_filesystem(self.path)
        try:
            with self._translate("open"):
                if read_only:
                    live = Path(f"{self.path}-wal").exists()
                    uri = f"{self.path.resolve().as_uri()}?{'mode=ro' if live else 'immutable=1'}"
                    self._conn = sqlite3.connect(
                        uri, uri=True, timeout=self.busy_timeout_s, isolation_level=None, check_same_thread=False
                    )
                else:
                    self._conn = sqlite3.connect(
                        str(self.path), timeout=self.busy_timeout_s, isolation_level=None, check_same_thread=False
                    )
                self._conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
                if not read_only:
                    self._set_journal_mode()
                    self._conn.execute("PRAGMA foreign_keys = ON")
            if read_only:
                self._check_schema_read_only()
            else:
                self._migrate_and_recover()
            self._file_id = _file_id(self.path)  # what renew_leases checks the path still names
        except BaseException:
            self.close()
            raise

    # -- plumbing -----------------------------------------------------------------------
    def _set_journal_mode(self) -> None:
        """WAL (rollback journal on a network filesystem), retried while another opener holds the lock.

        Switching a new file to WAL needs an exclusive lock, and SQLite answers "database is
        locked" at once rather than through the busy handler: so many processes opening a new
        store together retry here, with jittered backoff, up to ``busy_timeout_s``.
        """
        conn = self._connection()
        wanted = "delete" if self.network_fs else "wal"
        if self.network_fs:
            netfs.warn_network_filesystem(self.path, "SQLite keeps its rollback journal there (no WAL)")
        start, delay_s = time.monotonic(), 0.005
        while True:
            try:
                current = str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()
                mode = (
                    current
                    if current == wanted
                    else str(conn.execute(f"PRAGMA journal_mode = {wanted.upper()}").fetchone()[0]).lower()
                )
                break
            except sqlite3.OperationalError as exc:
                waited_s = time.monotonic() - start
                if "locked" not in str(exc).lower() or waited_s + delay_s > self.busy_timeout_s:
                    raise
                time.sleep(delay_s * (0.5 + random.random()))
                delay_s = min(2 * delay_s, 0.25)
        if mode != wanted:
            logger.info("zeus-callbacks: store %s uses journal mode %s (%s unavailable)", self.path, mode, wanted)
        conn.execute("PRAGMA synchronous = NORMAL" if mode == "wal" else "PRAGMA synchronous = FULL")

    @contextmanager
    def _translate(self, what: str) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        except sqlite3.OperationalError as exc:
            message = str(exc).lower()
            if "locked" in message or "busy" in message:
                raise locked_error(
                    str(self.path),
                    time.monotonic() - start,
                    self.busy_timeout_s,
                    f"{what}: another process holds a long write transaction",
                ) from exc
            if "full" in message:  # SQLITE_FULL: "database or disk is full"; the transaction was rolled back
                raise StoreFullError(
                    f"store {self.path}: the database or its disk is full ({what}: {exc}); nothing was changed — "
                    "free some space or set store.path to another filesystem"
                ) from exc
            if "readonly" in message and not self.read_only:
                raise StorePermissionError(
                    f"store {self.path} is not writable ({exc}): make the file and its directory writable by "
                    "this user, or set store.path to another file; nothing was changed"
                ) from exc
            if "unable to open" in message or "readonly" in message or "disk i/o" in message:
                raise StoreError(f"cannot {what} store {self.path}: {exc}") from exc
            raise StoreCorruptError(f"store {self.path} is unreadable ({what}: {exc}); it was left untouched") from exc
        except sqlite3.ProgrammingError:
            raise  # the caller's mistake (e.g. a parameter of the wrong type), not the file's
        except sqlite3.IntegrityError as exc:  # a write the schema refuses (a pending_id recorded twice): not corrupt
            raise StoreError(f"store {self.path}: {what} refused by the schema ({exc}); nothing was written") from exc
        except sqlite3.DatabaseError as exc:
            raise StoreCorruptError(
                f"store {self.path} is not a readable SQLite store ({exc}); it was left untouched — "
                "move it away to start a new one"
            ) from exc

    @contextmanager
    def _tx(self, what: str) -> Iterator[sqlite3.Connection]:
        conn = self._connection()
        with self._lock, self._translate(what):
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                if conn.in_transaction:  # SQLite rolls back itself on some errors (SQLITE_FULL): no second error
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    @contextmanager
    def _read(self, what: str) -> Iterator[sqlite3.Connection]:
        conn = self._connection()
        with self._lock, self._translate(what):
            yield conn

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(f"store {self.path} is closed")
        return self._conn

    def _check_schema_read_only(self) -> None:
        with self._read("open") as conn:
            self._columns = _OLD_TRIAL_COLUMNS.get(self._schema_version(conn, create=False), _TRIAL_COLUMNS)

    def _schema_version(self, conn: sqlite3.Connection, *, create: bool) -> int:
        """The store's schema version; refuse a foreign or newer file (``create``: stamp a new, empty one)."""
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "schema_version" not in tables:
            if not create or tables - {"sqlite_sequence"}:
                raise StoreCorruptError(
                    f"{self.path} is a SQLite database but not a zeus-callbacks store (no schema_version "
                    f"table; has {sorted(tables)}); it was left untouched"
                )
            conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
            conn.execute("INSERT INTO schema_version VALUES (0)")
        row = conn.execute("SELECT version FROM schema_version").fetchone()
        if row is None:
            raise StoreCorruptError(f"store {self.path} has an empty schema_version table; it was left untouched")
        version = records.version(row[0], str(self.path), "the schema_version table")
        if version > SCHEMA_VERSION:
            raise StoreSchemaError(
                f"store {self.path} has schema version {version}, newer than this zeus-callbacks "
                f"understands ({SCHEMA_VERSION}); upgrade zeus-callbacks or use another store file"
            )
        return version

    def _orphans(self, conn: sqlite3.Connection) -> list[tuple[TrialRecord, str]]:
        rows = conn.execute(f"SELECT {self._columns} FROM trials WHERE status = 'running'").fetchall()
        host, now_s = this_host(), now()
        found = []
        for trial in (_trial_row(r, self.location) for r in rows):
            reason = orphan_reason(trial.__dict__, host, now_s, self.lease_grace_s)
            if reason is not None:
                found.append((trial, reason))
        return found

    def _migrate_and_recover(self) -> None:
        # A read first: the common open (current schema, no dead trial) takes no write lock.
        with self._read("open") as conn:
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "schema_version" in tables and self._schema_version(conn, create=False) == SCHEMA_VERSION:
                if not self._orphans(conn):
                    return
        with self._tx("open") as conn:
            version = self._schema_version(conn, create=True)
            while version < SCHEMA_VERSION:
                MIGRATIONS[version](conn)
                version += 1
                conn.execute("UPDATE schema_version SET version = ?", (version,))
                logger.info("zeus-callbacks: store %s migrated to schema version %d", self.path, version)
            for trial, reason in self._orphans(conn):
                info = {**trial.info, "reason": reason}
                conn.execute(
                    "UPDATE trials SET status = 'failed', ended_at = ?, info = ? WHERE trial_id = ?",
                    (now(), json.dumps(info), trial.trial_id),
                )
                logger.warning(
                    "zeus-callbacks: trial %d of job %s (process %d on %s) %s; marked failed",
                    trial.trial_id,
                    trial.job_id,
                    trial.pid,
                    trial.host,
                    "died" if reason == "process died" else f"sent no heartbeat for {self.lease_grace_s:g} s",
                )

    # -- jobs ---------------------------------------------------------------------------
    def ensure_job(self, job_id: str, info: Mapping[str, Any] | None = None) -> JobRecord:
        """See :meth:`Store.ensure_job`."""
        with self._tx("write") as conn:
            _ensure_job(conn, job_id, info)
            return _job_row(conn.execute("SELECT * FROM jobs WHERE job_id = ?", (job_id,)).fetchone(), self.location)

    def get_job(self, job_id: str) -> JobRecord | None:
        """See :meth:`Store.get_job`."""
        with self._read("read") as conn:
            row = conn.execute("SELECT * FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
        return None if row is None else _job_row(row, self.location)

    def list_jobs(self) -> list[JobRecord]:
        """See :meth:`Store.list_jobs`."""
        with self._read("read") as conn:
            return [_job_row(r, self.location) for r in conn.execute("SELECT * FROM jobs ORDER BY job_id").fetchall()]

    # -- trials -------------------------------------------------------------------------
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
        """See :meth:`Store.create_trial`."""
        check_finite(self.location, f"create a trial of job {job_id}", power_limit_W=power_limit_W)
        info_json = dumps_strict(dict(info or {}), self.location, f"the info of a new trial of job {job_id}")
        mine = pid is None or int(pid) == os.getpid()
        started_at = now()
        with self._tx("write") as conn:
            if pending_id is not None:  # recorded from this pending file already: that trial, nothing new
                row = conn.execute(f"SELECT {self._columns} FROM trials WHERE pending_id = ?", (pending_id,))
                existing = row.fetchone()
                if existing is not None:
                    return _trial_row(existing, self.location)
            _ensure_job(conn, job_id, None)
            cursor = conn.execute(
                "INSERT INTO trials (job_id, batch_size, power_limit_W, status, converged, started_at, pid, host, "
                "info, owner, heartbeat_at, pending_id) VALUES (?, ?, ?, 'running', 0, ?, ?, ?, ?, ?, ?, ?)",
                (
                    job_id,
                    int(batch_size),
                    power_limit_W,
                    started_at,
                    os.getpid() if pid is None else int(pid),
                    this_host(),
                    info_json,
                    lease_owner() if mine else "",
                    started_at,
                    pending_id,
                ),
            )
            row = conn.execute(f"SELECT {self._columns} FROM trials WHERE trial_id = ?", (cursor.lastrowid,))
            trial = _trial_row(row.fetchone(), self.location)
        if mine:
            KEEPER.hold(self, trial.trial_id)
        return trial

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
        """See :meth:`Store.finish_trial` (with ``bandit_update``: one ``BEGIN IMMEDIATE`` transaction)."""
        check_finish_status(status)
        check_finite(
            self.location,
            f"finish trial {trial_id}",
            energy_J=energy_J,
            time_s=time_s,
            cost=cost,
            power_limit_W=power_limit_W,
        )
        dumps_strict(dict(info or {}), self.location, f"the info of trial {trial_id}")
        with self._tx("write") as conn:
            row = conn.execute(f"SELECT {self._columns} FROM trials WHERE trial_id = ?", (trial_id,)).fetchone()
            if row is None:
                raise KeyError(f"no trial {trial_id} in store {self.path}")
            old = _trial_row(row, self.location)
            merged = {**old.info, **dict(info or {})}
            conn.execute(
                "UPDATE trials SET status = ?, energy_J = ?, time_s = ?, cost = ?, converged = ?, ended_at = ?, "
                "batch_size = ?, power_limit_W = ?, info = ?, pending_id = ? WHERE trial_id = ?",
                (
                    status,
                    energy_J,
                    time_s,
                    cost,
                    int(bool(converged)),
                    now(),
                    old.batch_size if batch_size is None else int(batch_size),
                    old.power_limit_W if power_limit_W is None else float(power_limit_W),
                    json.dumps(merged),
                    old.pending_id if pending_id is None else pending_id,
                    trial_id,
                ),
            )
            row = conn.execute(f"SELECT {self._columns} FROM trials WHERE trial_id = ?", (trial_id,)).fetchone()
            finished = _trial_row(row, self.location)
            if bandit_update is not None:
                job_id = finished.job_id
                rows = conn.execute(
                    f"SELECT {self._columns} FROM trials WHERE job_id = ? ORDER BY trial_id", (job_id,)
                ).fetchall()
                current = _load_bandit(conn, job_id, self.location) or BanditState(job_id)
                new = bandit_update(finished, [_trial_row(r, self.location) for r in rows], current)
                self._write_bandit(conn, job_id, current, new)
        KEEPER.release(self, trial_id)
        return finished

    def get_trial(self, trial_id: int) -> TrialRecord | None:
        """See :meth:`Store.get_trial`."""
        with self._read("read") as conn:
            row = conn.execute(f"SELECT {self._columns} FROM trials WHERE trial_id = ?", (trial_id,)).fetchone()
        return None if row is None else _trial_row(row, self.location)

    def list_trials(self, job_id: str | None = None, *, status: str | None = None) -> list[TrialRecord]:
        """See :meth:`Store.list_trials`."""
        query, args = f"SELECT {self._columns} FROM trials WHERE 1 = 1", []
        if job_id is not None:
            query += " AND job_id = ?"
            args.append(job_id)
        if status is not None:
            query += " AND status = ?"
            args.append(status)
        with self._read("read") as conn:
            return [_trial_row(r, self.location) for r in conn.execute(query + " ORDER BY trial_id", args).fetchall()]

    # -- bandit -------------------------------------------------------------------------
    def get_bandit(self, job_id: str) -> BanditState | None:
        """See :meth:`Store.get_bandit`."""
        with self._read("read") as conn:
            return _load_bandit(conn, job_id, self.location)

    def update_bandit(self, job_id: str, update: BanditUpdate) -> Any:
        """See :meth:`Store.update_bandit`."""
        with self._tx("write") as conn:
            _ensure_job(conn, job_id, None)
            current = _load_bandit(conn, job_id, self.location) or BanditState(job_id)
            new, result = update(current)
            self._write_bandit(conn, job_id, current, new)
            return result

    def _write_bandit(self, conn: sqlite3.Connection, job_id: str, current: BanditState, new: BanditState) -> None:
        """Replace the job's bandit state read as ``current`` by ``new`` (inside the caller's transaction)."""
        conn.execute(
            "INSERT INTO bandits (job_id, state, version) VALUES (?, ?, ?) "
            "ON CONFLICT (job_id) DO UPDATE SET state = excluded.state, version = excluded.version",
            (job_id, dumps_strict(new.state, self.location, f"the bandit state of job {job_id}"), current.version + 1),
        )
        conn.execute("DELETE FROM arms WHERE job_id = ?", (job_id,))
        conn.executemany(
            "INSERT INTO arms (job_id, batch_size, state) VALUES (?, ?, ?)",
            [(job_id, int(b), dumps_strict(s, self.location, f"arm {b} of job {job_id}")) for b, s in new.arms.items()],
        )

    # -- profiles -----------------------------------------------------------------------
    def put_profile(self, key: str, table: Mapping[str, Any]) -> None:
        """See :meth:`Store.put_profile`."""
        with self._tx("write") as conn:
            conn.execute(
                "INSERT INTO profiles (key, table_json, updated_at) VALUES (?, ?, ?) ON CONFLICT (key) DO UPDATE "
                "SET table_json = excluded.table_json, updated_at = excluded.updated_at",
                (key, json.dumps(dict(table)), now()),
            )

    def get_profile(self, key: str) -> dict[str, Any] | None:
        """See :meth:`Store.get_profile`."""
        with self._read("read") as conn:
            row = conn.execute("SELECT table_json FROM profiles WHERE key = ?", (key,)).fetchone()
        return None if row is None else records.mapping_column(row[0], self.location, f"profile {key!r}")

    def list_profiles(self) -> list[str]:
        """See :meth:`Store.list_profiles`."""
        with self._read("read") as conn:
            return [r[0] for r in conn.execute("SELECT key FROM profiles ORDER BY key").fetchall()]

    # -- leases -------------------------------------------------------------------------
    def renew_leases(self, owner: str, trial_ids: set[int]) -> set[int]:
        """See :meth:`Store.renew_leases`; none is held once the file is gone or replaced by another.

        The lease keeper keeps its connection between renewals: without this check it would go on
        renewing the trials of a deleted (or moved-away) file.
        """
        if not trial_ids or _file_id(self.path) != self._file_id:
            return set()
        marks = ", ".join("?" * len(trial_ids))
        ids = sorted(int(t) for t in trial_ids)
        with self._tx("renew leases") as conn:
            conn.execute(
                f"UPDATE trials SET heartbeat_at = ? WHERE owner = ? AND status = 'running' AND trial_id IN ({marks})",
                (now(), owner, *ids),
            )
            rows = conn.execute(
                f"SELECT trial_id FROM trials WHERE owner = ? AND status = 'running' AND trial_id IN ({marks})",
                (owner, *ids),
            ).fetchall()
        return {int(r[0]) for r in rows}

    def reopen(self) -> SQLiteStore | None:
        """See :meth:`Store.reopen`; None when the file is gone (never re-created for a lease)."""
        if not self.path.exists():
            return None
        return SQLiteStore(self.path, busy_timeout_s=self.busy_timeout_s, lease_grace_s=self.lease_grace_s)

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def _file_id(path: Path) -> tuple[int, int] | None:
    """The file's identity (device, inode); None when there is no file."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _check_readable_store_file(path: Path) -> None:
    """Refuse, before SQLite sees it, a file a read-only open cannot use (missing, empty)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise StoreError(f"no such store: {path}") from None
    except OSError as exc:
        raise StoreError(f"cannot read store {path}: {exc}") from exc
    if size == 0:
        raise StoreCorruptError(f"{path} is an empty file, not a zeus-callbacks store; it was left untouched")


def _ensure_job(conn: sqlite3.Connection, job_id: str, info: Mapping[str, Any] | None) -> None:
    conn.execute(
        "INSERT OR IGNORE INTO jobs (job_id, created_at, info) VALUES (?, ?, ?)",
        (job_id, now(), json.dumps(dict(info or {}))),
    )


def _job_row(row: tuple, location: str) -> JobRecord:
    return records.job(row[0], row[1], row[2], location)


def _trial_row(row: tuple, location: str) -> TrialRecord:
    names = [n.strip() for n in _TRIAL_COLUMNS.split(",")]
    return records.trial(dict(zip(names, row, strict=True)), location)


def _load_bandit(conn: sqlite3.Connection, job_id: str, location: str) -> BanditState | None:
    row = conn.execute("SELECT state, version FROM bandits WHERE job_id = ?", (job_id,)).fetchone()
    if row is None:
        return None
    name = f"the bandit of job {job_id!r}"
    arms = {
        records.batch_size_key(b, location, f"{name}, arm {b!r}"): records.mapping_column(
            s, location, f"{name}, arm {b!r}"
        )
        for b, s in conn.execute("SELECT batch_size, state FROM arms WHERE job_id = ? ORDER BY batch_size", (job_id,))
    }
    return BanditState(
        job_id=job_id,
        state=records.mapping_column(row[0], location, name),
        arms=arms,
        version=records.version(row[1], location, name),
    )
