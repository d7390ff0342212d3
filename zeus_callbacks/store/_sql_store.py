"""The relational store (SQLAlchemy 2 Core): a SQLite file (the default) or a database many nodes share.

- **One transaction per write.** On SQLite a write is ``BEGIN IMMEDIATE`` (a read a plain ``BEGIN``), so
  writers queue on the file lock for up to ``lock_timeout_s`` and a reader never blocks a writer. On a server
  the bandit update locks its row (``SELECT … FOR UPDATE``) and writes it back with a compare-and-swap on
  ``version``. A trial's outcome and its bandit update are one transaction.
- **WAL only where it is safe**: on a network filesystem (:mod:`~zeus_callbacks.store._netfs`) the file keeps
  SQLite's rollback journal, as WAL's shared memory works on one host only. A read-only open creates no file:
  ``mode=ro`` while a writer's ``-wal`` file exists, ``immutable=1`` otherwise.
- **Transient errors are retried** (:func:`~zeus_callbacks.store._base.retry_transient`) for up to
  ``lock_timeout_s``, the transaction re-run from its start (the bandit callbacks are pure): a locked file, a
  refused or dropped connection, a deadlock, a serialisation failure. Bad credentials, a missing database, a
  corrupt file fail at once, named, with the password masked.
- **Schema versions** are Alembic revisions (:mod:`~zeus_callbacks.store._migrations`), run at open under a
  database-wide lock (SQLite ``BEGIN IMMEDIATE``, a PostgreSQL advisory lock, MySQL ``GET_LOCK``), taken only
  when there is a migration or a dead trial to mark.
- **Table names**: a store file's have no prefix (as the first SQLite store wrote them); a server database's
  are prefixed ``zeus_``, so the store can share a database. An existing store keeps the layout it has.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from zeus_callbacks.errors import StoreFullError, StorePermissionError, StoreUnavailableError
from zeus_callbacks.store import _migrations as migrations
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
    file_identity,
    locked_error,
    log_orphan,
    mask_url,
    now,
    os_error,
    refuse_foreign_store,
    retry_transient,
)

logger = logging.getLogger(__name__)

EXTRA = "postgres"
"""The pip extra that installs a PostgreSQL driver."""

SERVER_PREFIX = "zeus_"
"""Table prefix of a new store in a server database (a store file's tables have none)."""

_MIGRATION_LOCK_KEY = 0x7A657573  # "zeus": PostgreSQL advisory lock key of the schema migration

# SQLSTATE classes/codes and MySQL error numbers worth a retry: connection failures, deadlocks,
# serialisation failures, lock-wait timeouts, "too many connections", a server starting up.
_TRANSIENT_SQLSTATES = ("08", "40001", "40P01", "53300", "57P01", "57P02", "57P03", "55P03")
_TRANSIENT_MYSQL = {1040, 1205, 1213, 2002, 2003, 2006, 2013, 2055}
_TRANSIENT_WORDS = (
    "could not connect",
    "connection refused",
    "connection reset",
    "server closed the connection",
    "terminating connection",
    "timeout expired",
    "timed out",
    "deadlock",
    "could not serialize",
    "database is locked",
    "database table is locked",
    "lock wait timeout",
    "too many connections",
    "the database system is starting up",
    "the database system is shutting down",
    "connection is closed",
    "lost connection",
)
_AUTH_WORDS = (
    "password authentication failed",
    "authentication failed",
    "access denied",
    "no password supplied",
    'role "',
    "no pg_hba.conf entry",
)


def _tables(sa: Any, prefix: str) -> dict[str, Any]:
    """The current schema's tables, for queries (the migrations create them; values pass as stored)."""
    meta = sa.MetaData()
    raw = sa.types.NullType  # no result conversion: _stored_records.py checks every value read
    columns: dict[str, list[Any]] = {
        "schema_version": [sa.Column("version", raw)],
        "jobs": [
            sa.Column("job_id", sa.String, primary_key=True),
            sa.Column("created_at", raw),
            sa.Column("info", raw),
        ],
        "trials": [
            sa.Column("trial_id", sa.Integer, primary_key=True, autoincrement=True),
            *(
                sa.Column(name, sa.String if name in ("job_id", "status", "owner") else raw)
                for name in records.TRIAL_FIELDS[1:]
            ),
        ],
        "bandits": [
            sa.Column("job_id", sa.String, primary_key=True),
            sa.Column("state", raw),
            sa.Column("version", raw),
        ],
        "arms": [
            sa.Column("job_id", sa.String, primary_key=True),
            sa.Column("batch_size", raw, primary_key=True),
            sa.Column("state", raw),
        ],
        "profiles": [
            sa.Column("key", sa.String, primary_key=True),
            sa.Column("table_json", raw),
            sa.Column("updated_at", raw),
        ],
    }
    return {name: sa.Table(f"{prefix}{name}", meta, *cols) for name, cols in columns.items()}


class SQLStore(Store):
    """The :class:`~zeus_callbacks.store._base.Store` contract on a SQL database (SQLAlchemy 2 Core).

    Args:
        location: A store file (created with its parent directory when missing; ``sqlite:///path``
            names one too), or a database URL: ``postgresql://user:password@host:5432/db``
            (psycopg 3 or psycopg2, whichever is installed), ``mysql://…``, any SQLAlchemy URL.
        lock_timeout_s: How long (s) an operation waits for another process's write transaction
            (a file) or retries a transient error (a server) before it raises.
        lease_grace_s: Grace period (s) of a running trial's lease (see :class:`Store`).
        read_only: Read an existing store, creating and changing nothing (``show``, ``plot``): no
            migration or recovery; an older schema reads with the newer fields empty; writes raise
            :class:`StoreError`.
        table_prefix: Prefix of the store's table names; None: the one the store has, else ``""`` for
            a file and ``"zeus_"`` for a server.

    Raises:
        StoreCorruptError: Not a readable zeus-callbacks store (read-only: also an empty file).
        StoreSchemaError: The store's schema is newer than this code's.
        StoreLockedError: Another process kept the file locked for ``lock_timeout_s``.
        StoreUnavailableError: The server stayed unreachable (or the error transient) for ``lock_timeout_s``.
        StoreError: The file cannot be opened; the driver is missing, the credentials are refused, the
            database does not exist.
    """

    def __init__(
        self,
        location: str | Path,
        *,
        lock_timeout_s: float = 30.0,
        lease_grace_s: float = DEFAULT_LEASE_GRACE_S,
        read_only: bool = False,
        table_prefix: str | None = None,
    ) -> None:
        url = str(location) if "://" in str(location) else None
        self.file: Path | None = None
        if url is None or url.split("://", 1)[0].lower() == "sqlite":
            self.file = Path(sqlite_url_file(url)) if url is not None else Path(location)
            url = None
        self.url = url
        self._location = str(self.file) if self.file is not None else mask_url(str(url))
        super().__init__(self._location, lease_grace_s=lease_grace_s)
        self.lock_timeout_s = float(lock_timeout_s)
        self.read_only = read_only
        self.network_fs = False
        self._requested_prefix = table_prefix
        self._lock = threading.Lock()
        self._engine: Any = None
        self._engine_pid = 0
        self._closed = False
        self._file_id: tuple[int, int] | None = None
        try:
            import sqlalchemy
        except ImportError as exc:  # a dependency of zeus-callbacks: a broken install
            raise StoreError(
                f"store {self.location} needs SQLAlchemy and a database driver: pip install "
                f"'zeus-callbacks[{EXTRA}]' (PostgreSQL; for MySQL also pymysql)"
            ) from exc
        self._sa = sqlalchemy
        if self.file is not None:
            self._check_file()
        try:
            self._open()
            if self.file is not None:
                self._file_id = file_identity(self.file)  # what renew_leases checks the path still names
        except BaseException:
            self.close()
            raise

    @property
    def location(self) -> str:
        """The store's file, or its URL with the password masked."""
        return self._location

    # -- plumbing -----------------------------------------------------------------------
    def _check_file(self) -> None:
        file = self.file
        assert file is not None
        if file.is_dir():
            raise StoreError(f"store {file} is a directory, not a store file")
        if self.read_only:
            try:
                size = file.stat().st_size
            except FileNotFoundError:
                raise StoreError(f"no such store: {file}") from None
            except OSError as exc:
                raise StoreError(f"cannot read store {file}: {exc}") from exc
            if size == 0:
                raise StoreCorruptError(f"{file} is an empty file, not a zeus-callbacks store; it was left untouched")
            return
        refuse_foreign_store(file)
        try:
            file.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise os_error(exc, str(file), "create the directory of") from exc
        self.network_fs = netfs.is_network_filesystem(file)

    def _make_engine(self) -> Any:
        sa = self._sa
        if self.file is not None:
            engine = sa.create_engine(
                "sqlite://", creator=self._sqlite_connection, poolclass=sa.pool.QueuePool, pool_size=2, max_overflow=4
            )
            sa.event.listen(engine, "begin", _sqlite_begin)
            return engine
        try:
            url = _with_installed_driver(sa.engine.make_url(self.url))
        except Exception as exc:
            raise StoreError(f"store.url {self.location} is not a database URL: {exc}") from exc
        options: dict[str, Any] = {"pool_pre_ping": True, "pool_size": 2, "max_overflow": 4}
        if url.get_backend_name() == "postgresql":
            options["connect_args"] = {"connect_timeout": 10}
        try:
            return sa.create_engine(url, **options)
        except ImportError as exc:
            raise StoreError(
                f"store {self.location} needs the database driver {exc.name or exc}: pip install "
                f"'zeus-callbacks[{EXTRA}]' (PostgreSQL) or the driver of your database"
            ) from exc

    def _sqlite_connection(self) -> sqlite3.Connection:
        """A connection to the store file; the engine's ``begin`` listener opens its transactions."""
        file = self.file
        assert file is not None
        if self.read_only:
            live = Path(f"{file}-wal").exists()
            target, uri = f"{file.resolve().as_uri()}?{'mode=ro' if live else 'immutable=1'}", True
        else:
            target, uri = str(file), False
        conn = sqlite3.connect(
            target, uri=uri, timeout=self.lock_timeout_s, isolation_level=None, check_same_thread=False
        )
        conn.execute(f"PRAGMA busy_timeout = {int(self.lock_timeout_s * 1000)}")
        if not self.read_only:
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute(f"PRAGMA synchronous = {'FULL' if self.network_fs else 'NORMAL'}")
        return conn

    def _connect(self) -> Any:
        with self._lock:
            if self._closed:
                raise StoreError(f"store {self.location} is closed")
            if self._engine is not None and self._engine_pid != os.getpid():
                self._engine.dispose(close=False)  # a forked child must not share its parent's connections
                self._engine = None
            if self._engine is None:
                self._engine = self._make_engine()
                self._engine_pid = os.getpid()
            return self._engine

    def _run(self, what: str, body: Callable[[Any], Any], *, mode: str = "write") -> Any:
        """Run ``body(conn)`` in one transaction, re-run on a transient error for up to ``lock_timeout_s``.

        ``mode``: ``"write"`` (SQLite ``BEGIN IMMEDIATE``), ``"read"`` (``BEGIN``) or ``"none"`` (SQLite:
        no transaction, for a ``PRAGMA journal_mode``).
        """
        if mode == "write" and self.read_only:
            raise StoreError(f"store {self.location} was opened read-only: cannot write")
        sa = self._sa

        tries = 0

        def attempt() -> Any:
            nonlocal tries
            tries += 1
            with self._connect().connect() as conn:
                conn.execution_options(zeus_mode=mode)
                with conn.begin():
                    return body(conn)

        start = time.monotonic()
        try:
            return retry_transient(attempt, self.lock_timeout_s, self._transient)
        except sa.exc.DBAPIError as exc:
            raise self._error(exc, what, time.monotonic() - start, tries) from exc
        except sa.exc.SQLAlchemyError as exc:
            raise StoreError(f"cannot {what} store {self.location}: {exc}") from exc

    def _transient(self, exc: BaseException) -> bool:
        return isinstance(exc, self._sa.exc.DBAPIError) and _is_transient(exc) and not _is_auth(exc)

    def _error(self, exc: Any, what: str, waited_s: float, tries: int) -> Exception:
        orig = getattr(exc, "orig", None)
        if isinstance(orig, (sqlite3.ProgrammingError, sqlite3.InterfaceError)):
            return orig  # the caller's mistake (e.g. a parameter of the wrong type), not the file's
        reason = _first_line(orig if orig is not None else exc)
        lower = reason.lower()
        if isinstance(exc, self._sa.exc.IntegrityError):  # a write the schema refuses (a pending_id recorded twice)
            return StoreError(f"store {self.location}: {what} refused by the schema ({reason}); nothing was written")
        if "file is not a database" in lower or "malformed" in lower:
            return self._damaged(reason)
        if self.file is not None:
            return self._file_error(reason, what, waited_s)
        if _is_auth(exc):
            return StoreError(
                f"the database of store {self.location} refused the credentials ({reason}): check "
                "the user and password in store.url"
            )
        if (
            _sqlstate(exc) == "3D000"
            or _mysql_errno(exc) == 1049
            or ("database" in lower and "does not exist" in lower)
        ):
            return StoreError(f"store {self.location}: the database does not exist ({reason}); create it first")
        if _is_transient(exc):  # down, restarting, deadlocked: a run trains on and keeps its trial locally
            return StoreUnavailableError(
                f"cannot {what} store {self.location}: still failing after {waited_s:.1f} s and {tries} tries "
                f"({reason})"
            )
        return StoreError(f"cannot {what} store {self.location}: {reason}")

    def _file_error(self, reason: str, what: str, waited_s: float) -> Exception:
        lower = reason.lower()
        if "locked" in lower or "busy" in lower:
            return locked_error(
                self.location, waited_s, self.lock_timeout_s, f"{what}: another process holds a long write transaction"
            )
        if "full" in lower:  # SQLITE_FULL: "database or disk is full"; the transaction was rolled back
            return StoreFullError(
                f"store {self.location}: the database or its disk is full ({what}: {reason}); nothing was changed — "
                "free some space or set store.path to another filesystem"
            )
        if "readonly" in lower and not self.read_only:
            return StorePermissionError(
                f"store {self.location} is not writable ({reason}): make the file and its directory writable by "
                "this user, or set store.path to another file; nothing was changed"
            )
        if "unable to open" in lower or "readonly" in lower or "disk i/o" in lower:
            return StoreError(f"cannot {what} store {self.location}: {reason}")
        return self._damaged(f"{what}: {reason}")

    def _damaged(self, detail: str) -> StoreCorruptError:
        """The one message of a SQLite file SQLite cannot read, whatever found it (``detail``: what SQLite said)."""
        return StoreCorruptError(
            f"store {self.location} is damaged: SQLite cannot read it ({detail}); it was left untouched — "
            "restore it from a backup, or move it away to start a new store (the batch-size bandit then starts over)"
        )

    # -- opening ------------------------------------------------------------------------
    def _open(self) -> None:
        if self.file is not None and not self.read_only:
            self._run("open", self._set_journal_mode, mode="none")
        if self.file is not None:
            self._run("open", self._check_integrity, mode="read")
        if self._run("open", self._look, mode="read") and not self.read_only:
            self._run("open", self._migrate_and_recover)

    def _check_integrity(self, conn: Any) -> None:
        """Refuse a damaged SQLite file before anything is written to it.

        A flipped bit in an index page passes every read the open makes; the first write that
        touches the index then fails half-way (a fault test found it). SQLite's own check reads
        every page: under a millisecond for a store of this size (~70 KB).
        """
        rows = conn.exec_driver_sql("PRAGMA integrity_check").fetchall()
        if [tuple(row) for row in rows] != [("ok",)]:
            found = " ".join(str(rows[0][0]).split())
            raise self._damaged(f"its integrity check: {found}")

    def _set_journal_mode(self, conn: Any) -> None:
        """WAL, or the rollback journal on a network filesystem (a new file's switch is retried while locked)."""
        wanted = "delete" if self.network_fs else "wal"
        if self.network_fs:
            netfs.warn_network_filesystem(self.path, "SQLite keeps its rollback journal there (no WAL)")
        mode = str(conn.exec_driver_sql("PRAGMA journal_mode").scalar()).lower()
        if mode != wanted:
            mode = str(conn.exec_driver_sql(f"PRAGMA journal_mode = {wanted.upper()}").scalar()).lower()
        if mode != wanted:
            logger.info("zeus-callbacks: store %s uses journal mode %s (%s unavailable)", self.location, mode, wanted)

    def _layout(self, conn: Any) -> int | None:
        """Find the store's tables and schema version (None: no store yet); refuse a foreign, broken or newer one."""
        sa = self._sa
        names = set(sa.inspect(conn).get_table_names())
        prefix = self._requested_prefix
        if prefix is None:
            prefix = next((p for p in ("", SERVER_PREFIX) if f"{p}schema_version" in names), None)
            prefix = prefix if prefix is not None else ("" if self.file is not None else SERVER_PREFIX)
        self._t = _tables(sa, prefix)
        self._prefix = prefix
        self._trial_columns = list(self._t["trials"].c)
        version_table = f"{prefix}schema_version"
        if version_table not in names:
            ours = sorted(names & {t.name for t in self._t.values()})
            foreign = sorted(names - {"sqlite_sequence"}) if self.file is not None and prefix == "" else ours
            if foreign or self.read_only:
                raise StoreCorruptError(
                    f"store {self.location} is not a zeus-callbacks store (no {version_table} table"
                    + (f"; has {foreign}" if foreign else "")
                    + "); it was left untouched"
                )
            return None
        row = conn.execute(sa.select(self._t["schema_version"].c.version)).first()
        if row is None:
            raise StoreCorruptError(f"store {self.location} has an empty schema_version table; it was left untouched")
        version = records.version(row[0], self.location, "the schema_version table")
        if version > SCHEMA_VERSION:
            raise StoreSchemaError(
                f"store {self.location} has schema version {version}, newer than this zeus-callbacks understands "
                f"({SCHEMA_VERSION}); upgrade zeus-callbacks or use another store"
            )
        if version < SCHEMA_VERSION and self.read_only:  # not migrated: the newer fields read as empty
            present = {c["name"] for c in sa.inspect(conn).get_columns(self._t["trials"].name)}
            self._trial_columns = [c for c in self._t["trials"].c if c.name in present]
        return version

    def _look(self, conn: Any) -> bool:
        """A read: True when opening has work to do (a new store, a migration, dead trials)."""
        version = self._layout(conn)
        return version != SCHEMA_VERSION or (not self.read_only and bool(self._orphans(conn)))

    def _orphans(self, conn: Any) -> list[tuple[TrialRecord, str]]:
        t = self._t["trials"]
        rows = conn.execute(self._select_trials().where(t.c.status == "running")).mappings().all()
        return dead_trials([self._trial(r) for r in rows], self.lease_grace_s)

    def _migrate_and_recover(self, conn: Any) -> None:
        sa = self._sa
        dialect = conn.dialect.name
        if dialect == "postgresql":
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK_KEY})
        elif dialect in ("mysql", "mariadb"):
            conn.execute(sa.text("SELECT GET_LOCK('zeus_callbacks_migration', :s)"), {"s": int(self.lock_timeout_s)})
        try:
            version = self._layout(conn)  # again, under the lock: another opener may have migrated it
            if version is None:
                sa.Table(
                    f"{self._prefix}schema_version", sa.MetaData(), sa.Column("version", sa.Integer, nullable=False)
                ).create(conn)
                conn.execute(self._t["schema_version"].insert().values(version=0))
                version = 0
            if version < SCHEMA_VERSION:
                migrations.upgrade(conn, self._prefix, version)
                conn.execute(self._t["schema_version"].update().values(version=SCHEMA_VERSION))
                logger.info("zeus-callbacks: store %s migrated to schema version %d", self.location, SCHEMA_VERSION)
                self._trial_columns = list(self._t["trials"].c)
            tr = self._t["trials"]
            for trial, reason in self._orphans(conn):
                # compare-and-swap: an owner that renewed its lease meanwhile keeps its trial
                same_beat = (
                    tr.c.heartbeat_at == trial.heartbeat_at
                    if trial.heartbeat_at is not None
                    else tr.c.heartbeat_at.is_(None)
                )
                fields = records.orphan_fields(trial, reason, now())
                done = conn.execute(
                    tr.update()
                    .where(tr.c.trial_id == trial.trial_id, tr.c.status == "running", same_beat)
                    .values(**{**fields, "info": json.dumps(fields["info"])})
                ).rowcount
                if done:
                    log_orphan(trial.__dict__, reason, self.lease_grace_s)
        finally:
            if dialect in ("mysql", "mariadb"):
                conn.execute(sa.text("SELECT RELEASE_LOCK('zeus_callbacks_migration')"))

    # -- rows ---------------------------------------------------------------------------
    def _select_trials(self) -> Any:
        return self._sa.select(*self._trial_columns)

    def _trial(self, row: Mapping[str, Any]) -> TrialRecord:
        return records.trial(row, self.location)

    def _trial_by_id(self, conn: Any, trial_id: int, *, lock: bool = False) -> TrialRecord | None:
        query = self._select_trials().where(self._t["trials"].c.trial_id == trial_id)
        row = conn.execute(query.with_for_update() if lock else query).mappings().first()
        return None if row is None else self._trial(row)

    def _ensure_job(self, conn: Any, job_id: str, info: Mapping[str, Any] | None) -> None:
        _insert_ignore(
            self._sa,
            conn,
            self._t["jobs"],
            {"job_id": job_id, "created_at": now(), "info": json.dumps(dict(info or {}))},
            ["job_id"],
        )

    # -- jobs ---------------------------------------------------------------------------
    def ensure_job(self, job_id: str, info: Mapping[str, Any] | None = None) -> JobRecord:
        """See :meth:`Store.ensure_job`."""
        t = self._t["jobs"]

        def body(conn: Any) -> JobRecord:
            self._ensure_job(conn, job_id, info)
            row = conn.execute(self._sa.select(t).where(t.c.job_id == job_id)).mappings().one()
            return records.job(row["job_id"], row["created_at"], row["info"], self.location)

        return self._run("write", body)

    def get_job(self, job_id: str) -> JobRecord | None:
        """See :meth:`Store.get_job`: this job's row alone (another job's damage is not this one's)."""
        jobs = self._jobs(self._t["jobs"].c.job_id == job_id)
        return jobs[0] if jobs else None

    def list_jobs(self) -> list[JobRecord]:
        """See :meth:`Store.list_jobs`."""
        return self._jobs(None)

    def _jobs(self, where: Any) -> list[JobRecord]:
        t = self._t["jobs"]
        query = self._sa.select(t).order_by(t.c.job_id)
        if where is not None:
            query = query.where(where)
        rows = self._run("read", lambda c: c.execute(query).mappings().all(), mode="read")
        return [records.job(r["job_id"], r["created_at"], r["info"], self.location) for r in rows]

    # -- trials -------------------------------------------------------------------------
    def _insert_trial(self, job_id: str, fields: dict[str, Any], pending_id: str | None) -> tuple[TrialRecord, bool]:
        sa, t = self._sa, self._t["trials"]

        def recorded(conn: Any) -> TrialRecord | None:
            row = conn.execute(self._select_trials().where(t.c.pending_id == pending_id)).mappings().first()
            return None if row is None else self._trial(row)

        def body(conn: Any) -> tuple[TrialRecord, bool]:
            if pending_id is not None and (existing := recorded(conn)) is not None:
                return existing, False  # recorded from this pending file already: that trial, nothing new
            self._ensure_job(conn, job_id, None)
            insert = t.insert().values(**{**fields, "info": json.dumps(fields["info"])})
            if pending_id is None:
                result = conn.execute(insert)
            else:
                try:  # another node merging the same file may insert first: its trial is the one
                    with conn.begin_nested():
                        result = conn.execute(insert)
                except sa.exc.IntegrityError:
                    if (existing := recorded(conn)) is None:
                        raise
                    return existing, False
            trial = self._trial_by_id(conn, result.inserted_primary_key[0])
            assert trial is not None
            return trial, True

        return self._run("write", body)

    def _finish_trial(
        self, trial_id: int, outcome: records.Outcome, pending_id: str | None, bandit_update: OutcomeUpdate | None
    ) -> TrialRecord:
        """With ``bandit_update``, one transaction locks the trial, then the bandit.

        A transient error re-runs the whole transaction, ``bandit_update`` included, on what it reads again.
        """
        t = self._t["trials"]

        def body(conn: Any) -> TrialRecord:
            old = self._trial_by_id(conn, trial_id, lock=True)
            if old is None:
                raise KeyError(f"no trial {trial_id} in store {self.location}")
            fields = records.finished_fields(old, outcome, now())
            conn.execute(
                t.update().where(t.c.trial_id == trial_id).values(**{**fields, "info": json.dumps(fields["info"])})
            )
            finished = self._trial_by_id(conn, trial_id)
            assert finished is not None
            if bandit_update is not None:
                job_id = finished.job_id
                current = self._lock_bandit(conn, job_id)
                # Read after taking the bandit's lock: under READ COMMITTED this sees the outcome of
                # every trial whose bandit update committed before ours.
                rows = conn.execute(self._select_trials().where(t.c.job_id == job_id).order_by(t.c.trial_id)).mappings()
                trials = [self._trial(r) for r in rows]
                self._write_bandit(conn, job_id, current, bandit_update(finished, trials, _visible(current)))
            return finished

        return self._run("write", body)

    def get_trial(self, trial_id: int) -> TrialRecord | None:
        """See :meth:`Store.get_trial`."""
        return self._run("read", lambda c: self._trial_by_id(c, trial_id), mode="read")

    def list_trials(self, job_id: str | None = None, *, status: str | None = None) -> list[TrialRecord]:
        """See :meth:`Store.list_trials`."""
        t = self._t["trials"]
        query = self._select_trials().order_by(t.c.trial_id)
        if job_id is not None:
            query = query.where(t.c.job_id == job_id)
        if status is not None:
            query = query.where(t.c.status == status)
        rows = self._run("read", lambda c: c.execute(query).mappings().all(), mode="read")
        return [self._trial(r) for r in rows]

    # -- bandit -------------------------------------------------------------------------
    def _load_bandit(self, conn: Any, job_id: str, *, lock: bool) -> BanditState | None:
        sa, b, a = self._sa, self._t["bandits"], self._t["arms"]
        query = sa.select(b.c.state, b.c.version).where(b.c.job_id == job_id)
        row = conn.execute(query.with_for_update() if lock else query).first()
        if row is None:
            return None
        arms = conn.execute(sa.select(a.c.batch_size, a.c.state).where(a.c.job_id == job_id).order_by(a.c.batch_size))
        return records.bandit(job_id, row[0], row[1], list(arms), self.location)

    def get_bandit(self, job_id: str) -> BanditState | None:
        """See :meth:`Store.get_bandit`."""
        state = self._run("read", lambda c: self._load_bandit(c, job_id, lock=False), mode="read")
        return None if state is None or state.version == 0 else state

    def update_bandit(self, job_id: str, update: BanditUpdate) -> Any:
        """See :meth:`Store.update_bandit` (a transient error re-runs ``update`` on the state read again)."""

        def body(conn: Any) -> Any:
            self._ensure_job(conn, job_id, None)
            current = self._lock_bandit(conn, job_id)
            new, result = update(_visible(current))
            self._write_bandit(conn, job_id, current, new)
            return result

        return self._run("write", body)

    def _lock_bandit(self, conn: Any, job_id: str) -> BanditState:
        """The job's bandit row, locked until the transaction ends (version 0: no state yet)."""
        # A version-0 row gives the first update a row to lock; it is never visible as a state
        # (get_bandit reads version 0 as None, and a failed first update rolls it back).
        _insert_ignore(self._sa, conn, self._t["bandits"], {"job_id": job_id, "state": "{}", "version": 0}, ["job_id"])
        current = self._load_bandit(conn, job_id, lock=True)
        assert current is not None
        return current

    def _write_bandit(self, conn: Any, job_id: str, current: BanditState, new: BanditState) -> None:
        """Replace the locked bandit row read as ``current`` by ``new`` (compare-and-swap on its version)."""
        b, a = self._t["bandits"], self._t["arms"]
        state_json, arms_json = records.bandit_json(new, self.location)
        swapped = conn.execute(
            b.update()
            .where(b.c.job_id == job_id, b.c.version == current.version)
            .values(state=state_json, version=current.version + 1)
        ).rowcount
        if swapped != 1:  # the row lock makes this unreachable; never write over another update
            raise StoreError(f"store {self.location}: bandit of job {job_id} changed during its update")
        conn.execute(a.delete().where(a.c.job_id == job_id))
        if arms_json:
            conn.execute(a.insert(), [{"job_id": job_id, "batch_size": k, "state": v} for k, v in arms_json.items()])

    # -- profiles -----------------------------------------------------------------------
    def put_profile(self, key: str, table: Mapping[str, Any]) -> None:
        """See :meth:`Store.put_profile`."""
        p = self._t["profiles"]

        def body(conn: Any) -> None:
            values = {"table_json": json.dumps(dict(table)), "updated_at": now()}
            _insert_ignore(self._sa, conn, p, {"key": key, **values}, ["key"])
            conn.execute(p.update().where(p.c.key == key).values(**values))

        self._run("write", body)

    def get_profile(self, key: str) -> dict[str, Any] | None:
        """See :meth:`Store.get_profile`."""
        p = self._t["profiles"]
        query = self._sa.select(p.c.table_json).where(p.c.key == key)
        row = self._run("read", lambda c: c.execute(query).first(), mode="read")
        return None if row is None else records.mapping_column(row[0], self.location, f"profile {key!r}")

    def list_profiles(self) -> list[str]:
        """See :meth:`Store.list_profiles`."""
        p = self._t["profiles"]
        rows = self._run("read", lambda c: c.execute(self._sa.select(p.c.key).order_by(p.c.key)).all(), mode="read")
        return [r[0] for r in rows]

    # -- copies -------------------------------------------------------------------------
    def import_records(self, snapshot: records.Snapshot) -> None:
        """See :meth:`Store.import_records` (one transaction)."""
        t = self._t

        def body(conn: Any) -> None:
            if conn.execute(self._sa.select(t["jobs"].c.job_id).limit(1)).first() is not None:
                raise StoreError(f"store {self.location} holds jobs already: copy into a new, empty store")
            for job in snapshot.jobs:
                conn.execute(
                    t["jobs"].insert().values(job_id=job.job_id, created_at=job.created_at, info=json.dumps(job.info))
                )
            for trial in snapshot.trials:
                row = {k: getattr(trial, k) for k in records.TRIAL_FIELDS}
                conn.execute(t["trials"].insert().values(**{**row, "info": json.dumps(trial.info)}))
            for state in snapshot.bandits:
                state_json, arms_json = records.bandit_json(state, self.location)
                conn.execute(t["bandits"].insert().values(job_id=state.job_id, state=state_json, version=state.version))
                for batch_size, arm in arms_json.items():
                    conn.execute(t["arms"].insert().values(job_id=state.job_id, batch_size=batch_size, state=arm))
            for key, table in snapshot.profiles.items():
                conn.execute(t["profiles"].insert().values(key=key, table_json=json.dumps(table), updated_at=now()))
            if conn.dialect.name == "postgresql" and snapshot.trials:  # the next new trial follows the copied ones
                name = t["trials"].name
                conn.execute(
                    self._sa.text(
                        f"SELECT setval(pg_get_serial_sequence('{name}', 'trial_id'), "
                        f"(SELECT MAX(trial_id) FROM {name}))"
                    )
                )

        self._run("write", body)

    # -- leases -------------------------------------------------------------------------
    def renew_leases(self, owner: str, trial_ids: set[int]) -> set[int]:
        """See :meth:`Store.renew_leases`; a store file that is gone or replaced holds none.

        The lease keeper keeps its handle between renewals: without the file check it would go on
        renewing the trials of a deleted (or moved-away) file.
        """
        if not trial_ids or (self.file is not None and file_identity(self.file) != self._file_id):
            return set()
        sa, t = self._sa, self._t["trials"]
        mine = sa.and_(t.c.owner == owner, t.c.status == "running", t.c.trial_id.in_(sorted(int(i) for i in trial_ids)))

        def body(conn: Any) -> set[int]:
            conn.execute(t.update().where(mine).values(heartbeat_at=now()))
            return {int(r[0]) for r in conn.execute(sa.select(t.c.trial_id).where(mine))}

        return self._run("renew leases", body)

    def reopen(self) -> SQLStore | None:
        """See :meth:`Store.reopen`; None when the store file is gone (never re-created for a lease)."""
        if self.file is not None and not self.file.exists():
            return None
        return SQLStore(
            self.file if self.file is not None else str(self.url),
            lock_timeout_s=self.lock_timeout_s,
            lease_grace_s=self.lease_grace_s,
            table_prefix=self._requested_prefix,
        )

    def close(self) -> None:
        """Release the connections (idempotent)."""
        with self._lock:
            self._closed = True
            if self._engine is not None:
                self._engine.dispose(close=self._engine_pid == os.getpid())
                self._engine = None


def sqlite_url_file(url: str) -> str:
    """The file of a ``sqlite:///relative`` / ``sqlite:////absolute`` URL.

    Raises:
        ValueError: A URL of no file (``sqlite://``, ``sqlite:///:memory:``).
    """
    file = url.split("://", 1)[1]
    if not file.startswith("/") or file in ("/", "/:memory:"):
        raise ValueError(f"store URL {url!r}: use sqlite:///relative/path or sqlite:////absolute/path")
    return file[1:]


def _visible(current: BanditState) -> BanditState:
    """The state an update callback is given: an empty one for the placeholder row (version 0)."""
    return BanditState(current.job_id) if current.version == 0 else current


def _sqlite_begin(conn: Any) -> None:
    """SQLite: ``BEGIN IMMEDIATE`` to write (a deferred BEGIN deadlocks read-then-write), ``BEGIN`` to read."""
    mode = conn.get_execution_options().get("zeus_mode", "write")
    if mode != "none":
        conn.exec_driver_sql("BEGIN IMMEDIATE" if mode == "write" else "BEGIN")


def _with_installed_driver(url: Any) -> Any:
    """``postgresql://`` / ``mysql://`` with the driver that is installed (SQLAlchemy's default may not be)."""
    import importlib.util

    if url.drivername == "postgresql" and importlib.util.find_spec("psycopg2") is None:
        if importlib.util.find_spec("psycopg") is not None:
            return url.set(drivername="postgresql+psycopg")
    if url.drivername in ("mysql", "mariadb") and importlib.util.find_spec("MySQLdb") is None:
        if importlib.util.find_spec("pymysql") is not None:
            return url.set(drivername=f"{url.drivername}+pymysql")
    return url


def _insert_ignore(sa: Any, conn: Any, table: Any, values: Mapping[str, Any], keys: list[str]) -> None:
    """Insert a row unless one with the same ``keys`` exists (also when another transaction races)."""
    name = conn.dialect.name
    if name in ("postgresql", "sqlite"):
        from sqlalchemy.dialects import postgresql, sqlite

        module: Any = postgresql if name == "postgresql" else sqlite
        conn.execute(module.insert(table).values(**values).on_conflict_do_nothing(index_elements=keys))
    elif name in ("mysql", "mariadb"):
        conn.execute(table.insert().values(**values).prefix_with("IGNORE"))
    else:
        where = sa.and_(*(table.c[k] == values[k] for k in keys))
        if conn.execute(sa.select(*(table.c[k] for k in keys)).where(where)).first() is None:
            try:
                with conn.begin_nested():
                    conn.execute(table.insert().values(**values))
            except sa.exc.IntegrityError:
                pass  # another transaction inserted it first


def _sqlstate(exc: Any) -> str:
    orig = getattr(exc, "orig", None)
    return str(getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None) or "")


def _mysql_errno(exc: Any) -> int | None:
    args = getattr(getattr(exc, "orig", None), "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def _is_auth(exc: Any) -> bool:
    message = str(getattr(exc, "orig", exc)).lower()
    return _sqlstate(exc) in ("28P01", "28000") or _mysql_errno(exc) == 1045 or any(w in message for w in _AUTH_WORDS)


def _is_transient(exc: Any) -> bool:
    if getattr(exc, "connection_invalidated", False):
        return True
    state = _sqlstate(exc)
    if state and any(state.startswith(code) for code in _TRANSIENT_SQLSTATES):
        return True
    if _mysql_errno(exc) in _TRANSIENT_MYSQL:
        return True
    message = str(getattr(exc, "orig", exc)).lower()
    return any(w in message for w in _TRANSIENT_WORDS)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
