"""SQL-database store (SQLAlchemy 2 Core): PostgreSQL, MySQL/MariaDB or any SQLAlchemy dialect.

The store for many nodes: every node of a cluster reaches the same database server, so
the batch-size bandit of a recurring job sees every recurrence wherever the scheduler ran
it. Install with ``pip install 'zeus-callbacks[postgres]'`` (SQLAlchemy and psycopg 3);
for MySQL add a driver such as ``pymysql``.

Design:

- **One transaction per write**; the bandit update locks its row (``SELECT … FOR
  UPDATE``) and writes it back with a compare-and-swap on ``version``, so concurrent
  updates from any number of nodes serialise and none is lost. A trial's outcome and its
  bandit update (``finish_trial(..., bandit_update=...)``) are one transaction: the trial's
  row is locked, then the bandit's.
- **Transient errors are retried** with jittered exponential backoff for up to
  ``retry_s``: a refused or dropped connection, a deadlock, a serialisation failure, a
  lock-wait timeout. A transaction is re-run from its start (the bandit callback is a pure
  function of the state, so re-running it is safe); still failing after it, a
  :class:`~zeus_callbacks.errors.StoreUnavailableError`. Bad credentials, a missing database and
  every other error fail at once, as a :class:`StoreError` that names the URL with its
  password masked.
- **Schema versions** are the project's own (the ``zeus_schema_version`` table and
  :data:`MIGRATIONS`, the same numbers as the SQLite and JSON stores), not alembic: the
  library migrates on open with no migration environment or CLI step to ship, and a schema
  of six tables needs no autogeneration. Migrations run under a database-wide lock
  (PostgreSQL advisory lock, MySQL ``GET_LOCK``, SQLite ``BEGIN IMMEDIATE``) so nodes
  opening a new database together create it once.
- **Tables are prefixed** ``zeus_``, so the store can live in a database that holds other
  tables.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from zeus_callbacks.errors import StoreUnavailableError
from zeus_callbacks.store import records
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
    mask_url,
    now,
    orphan_reason,
    this_host,
)
from zeus_callbacks.store.lease import KEEPER

logger = logging.getLogger(__name__)

EXTRA = "postgres"
"""The pip extra that installs SQLAlchemy and a PostgreSQL driver."""

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


def _import_sqlalchemy(url: str):
    try:
        import sqlalchemy
    except ImportError as exc:
        raise StoreError(
            f"store {mask_url(url)} is a database URL, which needs SQLAlchemy and a database driver: "
            f"pip install 'zeus-callbacks[{EXTRA}]' (PostgreSQL; for MySQL also pymysql)"
        ) from exc
    return sqlalchemy


def _tables(sa, *, version: int = SCHEMA_VERSION):
    """The tables of schema ``version`` (1: without the lease columns; 2: without ``pending_id``)."""
    from sqlalchemy.dialects import mysql

    meta = sa.MetaData()
    json_text = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")
    lease = (
        [
            sa.Column("owner", sa.String(255), nullable=False, server_default=""),
            sa.Column("heartbeat_at", sa.Double),
            sa.Index("zeus_trials_by_status", "status"),
        ]
        if version >= 2
        else []
    )
    pending = (
        [sa.Column("pending_id", sa.String(64)), sa.Index("zeus_trials_by_pending_id", "pending_id", unique=True)]
        if version >= 3
        else []
    )
    key = sa.String(255)
    tables = {
        "schema_version": sa.Table("zeus_schema_version", meta, sa.Column("version", sa.Integer, nullable=False)),
        "jobs": sa.Table(
            "zeus_jobs",
            meta,
            sa.Column("job_id", key, primary_key=True),
            sa.Column("created_at", sa.Double, nullable=False),
            sa.Column("info", json_text, nullable=False),
        ),
        "trials": sa.Table(
            "zeus_trials",
            meta,
            sa.Column("trial_id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("job_id", key, sa.ForeignKey("zeus_jobs.job_id"), nullable=False),
            sa.Column("batch_size", sa.Integer, nullable=False),
            sa.Column("power_limit_W", sa.Double),
            sa.Column("status", sa.String(16), nullable=False),
            sa.Column("energy_J", sa.Double),
            sa.Column("time_s", sa.Double),
            sa.Column("cost", sa.Double),
            sa.Column("converged", sa.Boolean, nullable=False),
            sa.Column("started_at", sa.Double, nullable=False),
            sa.Column("ended_at", sa.Double),
            sa.Column("pid", sa.Integer, nullable=False),
            sa.Column("host", key, nullable=False),
            sa.Column("info", json_text, nullable=False),
            sa.Index("zeus_trials_by_job", "job_id", "trial_id"),
            *lease,
            *pending,
        ),
        "bandits": sa.Table(
            "zeus_bandits",
            meta,
            sa.Column("job_id", key, primary_key=True),
            sa.Column("state", json_text, nullable=False),
            sa.Column("version", sa.Integer, nullable=False),
        ),
        "arms": sa.Table(
            "zeus_arms",
            meta,
            sa.Column("job_id", key, primary_key=True),
            sa.Column("batch_size", sa.Integer, primary_key=True, autoincrement=False),
            sa.Column("state", json_text, nullable=False),
        ),
        "profiles": sa.Table(
            "zeus_profiles",
            meta,
            sa.Column("key", key, primary_key=True),
            sa.Column("table_json", json_text, nullable=False),
            sa.Column("updated_at", sa.Double, nullable=False),
        ),
    }
    return meta, tables


def _migrate_0_to_1(conn, sa, t) -> None:
    """Create the schema-1 tables."""
    _, v1 = _tables(sa, version=1)
    for name in ("jobs", "trials", "bandits", "arms", "profiles"):
        v1[name].create(conn)


def _migrate_1_to_2(conn, sa, t) -> None:
    """Add the lease (owner token, heartbeat) to trials."""
    owner_type = t["trials"].c.owner.type.compile(dialect=conn.dialect)
    double = t["trials"].c.heartbeat_at.type.compile(dialect=conn.dialect)
    conn.execute(sa.text(f"ALTER TABLE zeus_trials ADD COLUMN owner {owner_type} NOT NULL DEFAULT ''"))
    conn.execute(sa.text(f"ALTER TABLE zeus_trials ADD COLUMN heartbeat_at {double}"))
    sa.Index("zeus_trials_by_status", t["trials"].c.status).create(conn)


def _migrate_2_to_3(conn, sa, t) -> None:
    """Add the id of the pending-trial file a trial was recorded from (unique; NULLs are distinct)."""
    column = t["trials"].c.pending_id.type.compile(dialect=conn.dialect)
    conn.execute(sa.text(f"ALTER TABLE zeus_trials ADD COLUMN pending_id {column}"))
    sa.Index("zeus_trials_by_pending_id", t["trials"].c.pending_id, unique=True).create(conn)


MIGRATIONS: dict[int, Callable[..., None]] = {0: _migrate_0_to_1, 1: _migrate_1_to_2, 2: _migrate_2_to_3}
"""``MIGRATIONS[v](conn, sqlalchemy, tables)`` turns a version-``v`` database into version ``v + 1``."""


class RDBStore(Store):
    """The :class:`~zeus_callbacks.store.base.Store` contract on a SQL database (SQLAlchemy 2).

    Args:
        url: A SQLAlchemy URL: ``postgresql://user:password@host:5432/db`` (psycopg 3 or
            psycopg2, whichever is installed), ``mysql://…`` (mysqlclient or pymysql),
            ``sqlite:///file`` (through SQLAlchemy; :func:`open_store` gives such a URL to
            the built-in :class:`~zeus_callbacks.store.sqlite.SQLiteStore` instead).
        retry_s: How long a transient error (server unreachable, deadlock, ...) is retried (s).
        lease_grace_s: Grace period (s) of a running trial's lease (see :class:`Store`).
        read_only: Read an existing store; no migration or recovery; writes raise :class:`StoreError`.
        engine_options: Extra keyword arguments of ``sqlalchemy.create_engine``.

    Raises:
        StoreUnavailableError: The server stayed unreachable (or the error transient) for ``retry_s``.
        StoreError: SQLAlchemy or the driver is missing, the credentials are refused, the
            database does not exist.
        StoreCorruptError: The database holds a broken zeus store (tables without a schema version).
        StoreSchemaError: The store's schema is newer than this code's.
    """

    def __init__(
        self,
        url: str,
        *,
        retry_s: float = 30.0,
        lease_grace_s: float = DEFAULT_LEASE_GRACE_S,
        read_only: bool = False,
        engine_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(mask_url(url), lease_grace_s=lease_grace_s)
        self.url = url
        self.masked_url = mask_url(url)
        self.retry_s = float(retry_s)
        self.read_only = read_only
        self._engine_options = dict(engine_options or {})
        self._sa = _import_sqlalchemy(url)
        self._meta, self._t = _tables(self._sa)
        self._lock = threading.Lock()
        self._engine = None
        self._engine_pid = 0
        try:
            if read_only:
                self._run("open", lambda conn: self._schema_version(conn, required=True), write=False)
            else:
                self._migrate_and_recover()
        except BaseException:
            self.close()
            raise

    @property
    def location(self) -> str:
        """The store's URL with its password masked."""
        return self.masked_url

    # -- plumbing -----------------------------------------------------------------------
    def _make_engine(self):
        sa = self._sa
        try:
            url = sa.engine.make_url(self.url)
        except Exception as exc:
            raise StoreError(f"store.url {self.masked_url} is not a database URL: {exc}") from exc
        url = _with_installed_driver(url)
        options: dict[str, Any] = {"pool_pre_ping": True, "pool_size": 2, "max_overflow": 4}
        backend = url.get_backend_name()
        if backend == "postgresql":
            options["connect_args"] = {"connect_timeout": 10}
        elif backend == "sqlite":
            options = {"connect_args": {"timeout": self.retry_s, "check_same_thread": False}}
        options.update(self._engine_options)
        try:
            engine = sa.create_engine(url, **options)
        except ImportError as exc:
            raise StoreError(
                f"store {self.masked_url} needs the database driver {exc.name or exc}: pip install "
                f"'zeus-callbacks[{EXTRA}]' (PostgreSQL) or the driver of your database"
            ) from exc
        if backend == "sqlite":
            _sqlite_immediate_transactions(sa, engine)
        return engine

    def _connect(self):
        with self._lock:
            if self._engine is not None and self._engine_pid != os.getpid():
                self._engine.dispose(close=False)  # a forked child must not share its parent's sockets
                self._engine = None
            if self._engine is None:
                self._engine = self._make_engine()
                self._engine_pid = os.getpid()
            return self._engine

    def _run(self, what: str, body: Callable[[Any], Any], *, write: bool = True) -> Any:
        """Run ``body(conn)`` in one transaction, re-run on transient errors for up to ``retry_s``."""
        if write and self.read_only:
            raise StoreError(f"store {self.masked_url} was opened read-only: cannot write")
        sa = self._sa
        start, delay_s, tries = time.monotonic(), 0.02, 0
        while True:
            tries += 1
            try:
                with self._connect().begin() as conn:
                    return body(conn)
            except sa.exc.DBAPIError as exc:
                waited_s = time.monotonic() - start
                if _is_transient(exc) and not _is_auth(exc) and waited_s + delay_s < self.retry_s:
                    time.sleep(delay_s * (0.5 + random.random()))
                    delay_s = min(2 * delay_s, 1.0)
                    continue
                raise self._error(exc, what, waited_s, tries) from exc
            except sa.exc.SQLAlchemyError as exc:
                raise StoreError(f"cannot {what} store {self.masked_url}: {exc}") from exc

    def _error(self, exc, what: str, waited_s: float, tries: int) -> StoreError:
        reason = _first_line(exc.orig if getattr(exc, "orig", None) is not None else exc)
        if "file is not a database" in reason or "malformed" in reason:
            return StoreCorruptError(
                f"store {self.masked_url} is not a readable database ({reason}); it was left untouched"
            )
        if _is_auth(exc):
            return StoreError(
                f"the database of store {self.masked_url} refused the credentials ({reason}): check "
                "the user and password in store.url"
            )
        missing_db = "database" in reason.lower() and "does not exist" in reason.lower()
        if _sqlstate(exc) == "3D000" or _mysql_errno(exc) == 1049 or missing_db:
            return StoreError(f"store {self.masked_url}: the database does not exist ({reason}); create it first")
        if _is_transient(exc):  # down, restarting, deadlocked: a run trains on and keeps its trial locally
            return StoreUnavailableError(
                f"cannot {what} store {self.masked_url}: still failing after {waited_s:.1f} s "
                f"and {tries} tries ({reason})"
            )
        return StoreError(f"cannot {what} store {self.masked_url}: {reason}")

    def _schema_version(self, conn, *, required: bool) -> int | None:
        """The store's schema version (None: no store yet); refuse a broken or newer one."""
        sa = self._sa
        names = set(sa.inspect(conn).get_table_names())
        ours = {t.name for t in self._t.values()}
        if "zeus_schema_version" not in names:
            if names & ours or required:
                raise StoreCorruptError(
                    f"store {self.masked_url} has no zeus_schema_version table"
                    + (f" but has {sorted(names & ours)}" if names & ours else "")
                    + "; it was left untouched"
                )
            return None
        row = conn.execute(sa.select(self._t["schema_version"].c.version)).first()
        if row is None:
            raise StoreCorruptError(f"store {self.masked_url} has an empty schema_version table; it was left untouched")
        version = records.version(row[0], str(self.masked_url), "the schema_version table")
        if version > SCHEMA_VERSION:
            raise StoreSchemaError(
                f"store {self.masked_url} has schema version {version}, newer than this zeus-callbacks understands "
                f"({SCHEMA_VERSION}); upgrade zeus-callbacks or use another database"
            )
        if version < SCHEMA_VERSION and self.read_only:
            raise StoreSchemaError(
                f"store {self.masked_url} has schema version {version}: open it once for writing to migrate it"
            )
        return version

    def _orphans(self, conn) -> list[tuple[TrialRecord, str]]:
        t = self._t["trials"]
        rows = conn.execute(self._sa.select(t).where(t.c.status == "running")).mappings().all()
        host, now_s = this_host(), now()
        found = []
        for trial in (_trial(r, self.masked_url) for r in rows):
            reason = orphan_reason(trial.__dict__, host, now_s, self.lease_grace_s)
            if reason is not None:
                found.append((trial, reason))
        return found

    def _migrate_and_recover(self) -> None:
        def look(conn) -> bool:  # a read: True when there is work (migration or dead trials)
            version = self._schema_version(conn, required=False)
            return version != SCHEMA_VERSION or bool(self._orphans(conn))

        if self._run("open", look, write=False):
            self._run("open", self._migrate_and_recover_tx)

    def _migrate_and_recover_tx(self, conn) -> None:
        sa, t = self._sa, self._t
        dialect = conn.dialect.name
        if dialect == "postgresql":
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK_KEY})
        elif dialect in ("mysql", "mariadb"):
            conn.execute(sa.text("SELECT GET_LOCK('zeus_callbacks_migration', :s)"), {"s": int(self.retry_s)})
        try:
            version = self._schema_version(conn, required=False)
            if version is None:
                t["schema_version"].create(conn)
                conn.execute(t["schema_version"].insert().values(version=0))
                version = 0
            while version < SCHEMA_VERSION:
                MIGRATIONS[version](conn, sa, t)
                version += 1
                conn.execute(t["schema_version"].update().values(version=version))
                logger.info("zeus-callbacks: store %s migrated to schema version %d", self.masked_url, version)
            for trial, reason in self._orphans(conn):
                tr = t["trials"]
                done = conn.execute(
                    tr.update()
                    .where(tr.c.trial_id == trial.trial_id, tr.c.status == "running")
                    # compare-and-swap: an owner that renewed its lease meanwhile keeps its trial
                    .where(
                        tr.c.heartbeat_at == trial.heartbeat_at
                        if trial.heartbeat_at is not None
                        else tr.c.heartbeat_at.is_(None)
                    )
                    .values(status="failed", ended_at=now(), info=json.dumps({**trial.info, "reason": reason}))
                ).rowcount
                if done:
                    logger.warning(
                        "zeus-callbacks: trial %d of job %s (process %d on %s) %s; marked failed",
                        trial.trial_id,
                        trial.job_id,
                        trial.pid,
                        trial.host,
                        "died" if reason == "process died" else f"sent no heartbeat for {self.lease_grace_s:g} s",
                    )
        finally:
            if dialect in ("mysql", "mariadb"):
                conn.execute(sa.text("SELECT RELEASE_LOCK('zeus_callbacks_migration')"))

    def _ensure_job(self, conn, job_id: str, info: Mapping[str, Any] | None) -> None:
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

        def body(conn) -> JobRecord:
            self._ensure_job(conn, job_id, info)
            row = conn.execute(self._sa.select(t).where(t.c.job_id == job_id)).mappings().one()
            return _job(row, self.masked_url)

        return self._run("write", body)

    def get_job(self, job_id: str) -> JobRecord | None:
        """See :meth:`Store.get_job`."""
        t = self._t["jobs"]
        row = self._run(
            "read", lambda c: c.execute(self._sa.select(t).where(t.c.job_id == job_id)).mappings().first(), write=False
        )
        return None if row is None else _job(row, self.masked_url)

    def list_jobs(self) -> list[JobRecord]:
        """See :meth:`Store.list_jobs`."""
        t = self._t["jobs"]
        rows = self._run(
            "read", lambda c: c.execute(self._sa.select(t).order_by(t.c.job_id)).mappings().all(), write=False
        )
        return [_job(r, self.masked_url) for r in rows]

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
        sa, t = self._sa, self._t["trials"]
        mine = pid is None or int(pid) == os.getpid()

        def recorded(conn) -> TrialRecord | None:
            row = conn.execute(sa.select(t).where(t.c.pending_id == pending_id)).mappings().first()
            return None if row is None else _trial(row, self.masked_url)

        def body(conn) -> tuple[TrialRecord, bool]:
            if pending_id is not None and (existing := recorded(conn)) is not None:
                return existing, False  # recorded from this pending file already: that trial, nothing new
            self._ensure_job(conn, job_id, None)
            started_at = now()
            insert = t.insert().values(
                job_id=job_id,
                batch_size=int(batch_size),
                power_limit_W=None if power_limit_W is None else float(power_limit_W),
                status="running",
                converged=False,
                started_at=started_at,
                pid=os.getpid() if pid is None else int(pid),
                host=this_host(),
                info=info_json,
                owner=lease_owner() if mine else "",
                heartbeat_at=started_at,
                pending_id=pending_id,
            )
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
            trial_id = result.inserted_primary_key[0]
            row = conn.execute(sa.select(t).where(t.c.trial_id == trial_id)).mappings().one()
            return _trial(row, self.masked_url), True

        trial, created = self._run("write", body)
        if mine and created:
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
        """See :meth:`Store.finish_trial`; with ``bandit_update``, one transaction locks the trial, then the bandit.

        A transient error re-runs the whole transaction, ``bandit_update`` included, on what it reads again.
        """
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
        t = self._t["trials"]

        def body(conn) -> TrialRecord:
            select = self._sa.select(t).where(t.c.trial_id == trial_id)
            row = conn.execute(select.with_for_update()).mappings().first()
            if row is None:
                raise KeyError(f"no trial {trial_id} in store {self.masked_url}")
            old = _trial(row, self.masked_url)
            conn.execute(
                t.update()
                .where(t.c.trial_id == trial_id)
                .values(
                    status=status,
                    energy_J=energy_J,
                    time_s=time_s,
                    cost=cost,
                    converged=bool(converged),
                    ended_at=now(),
                    batch_size=old.batch_size if batch_size is None else int(batch_size),
                    power_limit_W=old.power_limit_W if power_limit_W is None else float(power_limit_W),
                    info=json.dumps({**old.info, **dict(info or {})}),
                    pending_id=old.pending_id if pending_id is None else pending_id,
                )
            )
            finished = _trial(conn.execute(select).mappings().one(), self.masked_url)
            if bandit_update is not None:
                job_id = finished.job_id
                current = self._lock_bandit(conn, job_id)
                # Read after taking the bandit's lock: under READ COMMITTED this sees the outcome of
                # every trial whose bandit update committed before ours.
                rows = conn.execute(self._sa.select(t).where(t.c.job_id == job_id).order_by(t.c.trial_id)).mappings()
                trials = [_trial(r, self.masked_url) for r in rows]
                self._write_bandit(conn, job_id, current, bandit_update(finished, trials, self._visible(current)))
            return finished

        finished = self._run("write", body)
        KEEPER.release(self, trial_id)
        return finished

    def get_trial(self, trial_id: int) -> TrialRecord | None:
        """See :meth:`Store.get_trial`."""
        t = self._t["trials"]
        row = self._run(
            "read",
            lambda c: c.execute(self._sa.select(t).where(t.c.trial_id == trial_id)).mappings().first(),
            write=False,
        )
        return None if row is None else _trial(row, self.masked_url)

    def list_trials(self, job_id: str | None = None, *, status: str | None = None) -> list[TrialRecord]:
        """See :meth:`Store.list_trials`."""
        t = self._t["trials"]
        query = self._sa.select(t).order_by(t.c.trial_id)
        if job_id is not None:
            query = query.where(t.c.job_id == job_id)
        if status is not None:
            query = query.where(t.c.status == status)
        rows = self._run("read", lambda c: c.execute(query).mappings().all(), write=False)
        return [_trial(r, self.masked_url) for r in rows]

    # -- bandit -------------------------------------------------------------------------
    def _load_bandit(self, conn, job_id: str, *, lock: bool) -> BanditState | None:
        sa, b, a = self._sa, self._t["bandits"], self._t["arms"]
        query = sa.select(b.c.state, b.c.version).where(b.c.job_id == job_id)
        row = conn.execute(query.with_for_update() if lock else query).first()
        if row is None:
            return None
        name, where = f"the bandit of job {job_id!r}", self.masked_url
        arms = {
            records.batch_size_key(r[0], where, f"{name}, arm {r[0]!r}"): records.mapping_column(
                r[1], where, f"{name}, arm {r[0]!r}"
            )
            for r in conn.execute(
                sa.select(a.c.batch_size, a.c.state).where(a.c.job_id == job_id).order_by(a.c.batch_size)
            )
        }
        return BanditState(
            job_id=job_id,
            state=records.mapping_column(row[0], where, name),
            arms=arms,
            version=records.version(row[1], where, name),
        )

    def get_bandit(self, job_id: str) -> BanditState | None:
        """See :meth:`Store.get_bandit`."""
        state = self._run("read", lambda c: self._load_bandit(c, job_id, lock=False), write=False)
        return None if state is None or state.version == 0 else state

    def update_bandit(self, job_id: str, update: BanditUpdate) -> Any:
        """See :meth:`Store.update_bandit` (a transient error re-runs ``update`` on the state read again)."""

        def body(conn) -> Any:
            self._ensure_job(conn, job_id, None)
            current = self._lock_bandit(conn, job_id)
            new, result = update(self._visible(current))
            self._write_bandit(conn, job_id, current, new)
            return result

        return self._run("write", body)

    def _lock_bandit(self, conn, job_id: str) -> BanditState:
        """The job's bandit row, locked until the transaction ends (version 0: no state yet)."""
        # A version-0 row gives the first update a row to lock; it is never visible as a state
        # (get_bandit reads version 0 as None, and a failed first update rolls it back).
        _insert_ignore(self._sa, conn, self._t["bandits"], {"job_id": job_id, "state": "{}", "version": 0}, ["job_id"])
        current = self._load_bandit(conn, job_id, lock=True)
        assert current is not None
        return current

    @staticmethod
    def _visible(current: BanditState) -> BanditState:
        """The state an update callback is given: an empty one for the placeholder row (version 0)."""
        return BanditState(current.job_id) if current.version == 0 else current

    def _write_bandit(self, conn, job_id: str, current: BanditState, new: BanditState) -> None:
        """Replace the locked bandit row read as ``current`` by ``new`` (compare-and-swap on its version)."""
        b, a = self._t["bandits"], self._t["arms"]
        swapped = conn.execute(
            b.update()
            .where(b.c.job_id == job_id, b.c.version == current.version)
            .values(
                state=dumps_strict(new.state, self.location, f"the bandit state of job {job_id}"),
                version=current.version + 1,
            )
        ).rowcount
        if swapped != 1:  # the row lock makes this unreachable; never write over another update
            raise StoreError(f"store {self.masked_url}: bandit of job {job_id} changed during its update")
        conn.execute(a.delete().where(a.c.job_id == job_id))
        if new.arms:
            conn.execute(
                a.insert(),
                [
                    {
                        "job_id": job_id,
                        "batch_size": int(k),
                        "state": dumps_strict(v, self.location, f"arm {k} of job {job_id}"),
                    }
                    for k, v in new.arms.items()
                ],
            )

    # -- profiles -----------------------------------------------------------------------
    def put_profile(self, key: str, table: Mapping[str, Any]) -> None:
        """See :meth:`Store.put_profile`."""
        p = self._t["profiles"]

        def body(conn) -> None:
            values = {"table_json": json.dumps(dict(table)), "updated_at": now()}
            _insert_ignore(self._sa, conn, p, {"key": key, **values}, ["key"])
            conn.execute(p.update().where(p.c.key == key).values(**values))

        self._run("write", body)

    def get_profile(self, key: str) -> dict[str, Any] | None:
        """See :meth:`Store.get_profile`."""
        p = self._t["profiles"]
        row = self._run(
            "read", lambda c: c.execute(self._sa.select(p.c.table_json).where(p.c.key == key)).first(), write=False
        )
        return None if row is None else records.mapping_column(row[0], self.masked_url, f"profile {key!r}")

    def list_profiles(self) -> list[str]:
        """See :meth:`Store.list_profiles`."""
        p = self._t["profiles"]
        rows = self._run("read", lambda c: c.execute(self._sa.select(p.c.key).order_by(p.c.key)).all(), write=False)
        return [r[0] for r in rows]

    # -- leases -------------------------------------------------------------------------
    def renew_leases(self, owner: str, trial_ids: set[int]) -> set[int]:
        """See :meth:`Store.renew_leases`."""
        if not trial_ids:
            return set()
        sa, t = self._sa, self._t["trials"]
        ids = sorted(int(i) for i in trial_ids)
        mine = sa.and_(t.c.owner == owner, t.c.status == "running", t.c.trial_id.in_(ids))

        def body(conn) -> set[int]:
            conn.execute(t.update().where(mine).values(heartbeat_at=now()))
            return {int(r[0]) for r in conn.execute(sa.select(t.c.trial_id).where(mine))}

        return self._run("renew leases", body)

    def reopen(self) -> RDBStore:
        """See :meth:`Store.reopen`."""
        return RDBStore(
            self.url, retry_s=self.retry_s, lease_grace_s=self.lease_grace_s, engine_options=self._engine_options
        )

    def close(self) -> None:
        """Release the connection pool (idempotent)."""
        with self._lock:
            if self._engine is not None:
                self._engine.dispose(close=self._engine_pid == os.getpid())
                self._engine = None


def _with_installed_driver(url):
    """``postgresql://`` / ``mysql://`` with the driver that is installed (SQLAlchemy's default may not be)."""
    import importlib.util

    if url.drivername == "postgresql" and importlib.util.find_spec("psycopg2") is None:
        if importlib.util.find_spec("psycopg") is not None:
            return url.set(drivername="postgresql+psycopg")
    if url.drivername in ("mysql", "mariadb") and importlib.util.find_spec("MySQLdb") is None:
        if importlib.util.find_spec("pymysql") is not None:
            return url.set(drivername=f"{url.drivername}+pymysql")
    return url


def _sqlite_immediate_transactions(sa, engine) -> None:
    """SQLite through SQLAlchemy: ``BEGIN IMMEDIATE`` (pysqlite's deferred BEGIN deadlocks read-then-write)."""

    @sa.event.listens_for(engine, "connect")
    def _connect(dbapi_conn, _record) -> None:
        dbapi_conn.isolation_level = None
        dbapi_conn.execute("PRAGMA foreign_keys = ON")

    @sa.event.listens_for(engine, "begin")
    def _begin(conn) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def _insert_ignore(sa, conn, table, values: Mapping[str, Any], keys: list[str]) -> None:
    """Insert a row unless one with the same ``keys`` exists (also when another transaction races)."""
    name = conn.dialect.name
    if name in ("postgresql", "sqlite"):
        from sqlalchemy.dialects import postgresql, sqlite

        module = postgresql if name == "postgresql" else sqlite
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


def _job(row: Mapping[str, Any], location: str) -> JobRecord:
    return records.job(row["job_id"], row["created_at"], row["info"], location)


def _trial(row: Mapping[str, Any], location: str) -> TrialRecord:
    return records.trial(row, location)


def _sqlstate(exc) -> str:
    orig = getattr(exc, "orig", None)
    return str(getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None) or "")


def _mysql_errno(exc) -> int | None:
    args = getattr(getattr(exc, "orig", None), "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def _is_auth(exc) -> bool:
    message = str(getattr(exc, "orig", exc)).lower()
    return _sqlstate(exc) in ("28P01", "28000") or _mysql_errno(exc) == 1045 or any(w in message for w in _AUTH_WORDS)


def _is_transient(exc) -> bool:
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
