"""The Store contract suite: every store backend must pass these (tests/test_store.py runs them).

Backends (``kind``): ``sqlite`` and ``json`` (files), ``rdb-sqlite`` (``SQLStore`` on a SQLite
file named by a ``sqlite:///`` URL, its tables prefixed ``zeus_`` as in a server database: the server
layout without a server) and ``postgresql`` (``SQLStore`` on the server ``ZEUS_CALLBACKS_TEST_DB_URL``
names; a fresh database per store).
A backend that cannot run here is skipped with the reason, except under ``ZEUS_CALLBACKS_CI=1``,
where it fails (.ci/run starts a PostgreSQL for them).
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import math
import multiprocessing
import os
import signal
import socket
import sqlite3
import sys
import time
import uuid
from pathlib import Path

import pytest

from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.errors import StoreValueError
from zeus_callbacks.store import (
    SCHEMA_VERSION,
    BanditState,
    Store,
    StoreCorruptError,
    StoreError,
    StoreSchemaError,
)
from zeus_callbacks.store import _lease as lease
from zeus_callbacks.store._json_store import JSONStore
from zeus_callbacks.store._lease import KEEPER
from zeus_callbacks.store._sql_store import SQLStore

BACKENDS: dict[str, type[Store] | None] = {
    "sqlite": SQLStore,
    "json": JSONStore,
    "rdb-sqlite": None,  # SQLStore with the server's table prefix
    "postgresql": SQLStore,
}
FILE_KINDS = ("sqlite", "json", "rdb-sqlite")
FAULT_KINDS = ("json", "postgresql", "sqlite")
"""The backends the fault suite (concurrent writers, SIGKILL) runs on."""
DB_URL_ENV = "ZEUS_CALLBACKS_TEST_DB_URL"
WORKERS = 8
TRIALS_PER_WORKER = 12
_CTX = multiprocessing.get_context("fork")
_CREATED_DATABASES: list[tuple[int, str]] = []


def require(kind: str) -> None:
    """Skip (fail under ZEUS_CALLBACKS_CI=1) a backend this machine cannot run."""
    reason = None
    if kind in ("rdb-sqlite", "postgresql") and importlib.util.find_spec("sqlalchemy") is None:
        reason = "needs SQLAlchemy: pip install 'zeus-callbacks[postgres]'"
    elif kind == "postgresql" and not os.environ.get(DB_URL_ENV):
        reason = (
            f"set {DB_URL_ENV}=postgresql://user:password@host:port/db (a server where that user may "
            "CREATE DATABASE) to run the store tests against PostgreSQL; .ci/postgres.sh starts one"
        )
    if reason is not None:
        if os.environ.get("ZEUS_CALLBACKS_CI") == "1":
            pytest.fail(f"{kind} store backend unavailable in CI: {reason}")
        pytest.skip(reason)


def db_engine(url: str, **options):
    """A SQLAlchemy engine on ``url`` with the installed driver, holding no idle connection."""
    import sqlalchemy as sa

    from zeus_callbacks.store._sql_store import _with_installed_driver

    return sa.create_engine(_with_installed_driver(sa.engine.make_url(url)), poolclass=sa.pool.NullPool, **options)


def new_location(kind: str, tmp_path: str, name: str = "store") -> str:
    """A fresh, empty store location of ``kind``: a file path, or a URL of a new database."""
    require(kind)
    if kind in ("sqlite", "json"):
        return str(tmp_path / f"{name}.{kind}")
    if kind == "rdb-sqlite":
        tmp_path.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{tmp_path / name}.db"
    import sqlalchemy as sa

    engine = db_engine(os.environ[DB_URL_ENV], isolation_level="AUTOCOMMIT")
    database = f"zc_test_{uuid.uuid4().hex[:16]}"
    with engine.connect() as conn:
        conn.execute(sa.text(f"CREATE DATABASE {database}"))
    engine.dispose()
    _CREATED_DATABASES.append((os.getpid(), database))
    return sa.engine.make_url(os.environ[DB_URL_ENV]).set(database=database).render_as_string(hide_password=False)


@atexit.register
def _drop_test_databases() -> None:
    mine = [db for pid, db in _CREATED_DATABASES if pid == os.getpid()]
    if not mine:
        return
    import sqlalchemy as sa

    engine = db_engine(os.environ[DB_URL_ENV], isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        for database in mine:
            conn.execute(sa.text(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)"))
    engine.dispose()


def _open(kind: str, location: str, **options) -> Store:
    if BACKENDS[kind] is None:
        return SQLStore(location, table_prefix="zeus_", **options)
    return BACKENDS[kind](location, **options)


def exists(kind: str, location: str) -> bool:
    """Whether the store's file exists (a database always does)."""
    return kind == "postgresql" or file_of(kind, location).exists()


def file_of(kind: str, location: str) -> Path:
    """The store file of a file backend."""
    return Path(location.removeprefix("sqlite:///"))


def set_schema_version(kind: str, location: str, version: int) -> None:
    """Overwrite the stored schema version, behind the store's back."""
    if kind == "json":
        doc = json.loads(Path(location).read_text())
        doc["schema_version"] = version
        Path(location).write_text(json.dumps(doc))
    elif kind == "sqlite":
        conn = sqlite3.connect(location)
        conn.execute("UPDATE schema_version SET version = ?", (version,))
        conn.commit()
        conn.close()
    else:
        import sqlalchemy as sa

        engine = db_engine(location)
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE zeus_schema_version SET version = :v"), {"v": version})
        engine.dispose()


def tamper(kind: str, location: str, table: str, column: str, key: dict, value) -> None:
    """Set one stored value behind the store's back, as a hand edit or a damaged file would.

    ``table`` is ``trials`` (``key``: ``trial_id``, ``value``: the column's) or ``arms`` (``key``: ``job_id``
    and ``batch_size``, ``value``: the arm's JSON object). JSON: the document's record; SQL: an UPDATE.
    """
    if kind == "json":
        doc = json.loads(Path(location).read_text())
        if table == "trials":
            record = next(t for t in doc["trials"] if t["trial_id"] == key["trial_id"])
            record[column] = value
        else:
            doc["bandits"][key["job_id"]]["arms"][str(key["batch_size"])] = value
        Path(location).write_text(json.dumps(doc))
        return
    import sqlalchemy as sa

    prefix = "" if kind == "sqlite" else "zeus_"
    engine = db_engine(location if "://" in location else f"sqlite:///{location}")
    where = " AND ".join(f"{k} = :{k}" for k in key)
    with engine.begin() as conn:
        conn.execute(
            sa.text(f'UPDATE {prefix}{table} SET "{column}" = :value WHERE {where}'),
            {**key, "value": json.dumps(value) if table == "arms" else value},
        )
    engine.dispose()


def fingerprint(kind: str, location: str):
    """What a store holds, to compare before and after: a file's bytes, a database's trials and arms rows."""
    if kind != "postgresql":
        return file_of(kind, location).read_bytes()
    import sqlalchemy as sa

    engine = db_engine(location)
    with engine.connect() as conn:
        rows = [sorted(map(tuple, conn.execute(sa.text(f"SELECT * FROM zeus_{t}")).all())) for t in ("trials", "arms")]
    engine.dispose()
    return rows


def _manual_store_time(monkeypatch) -> ManualClock:
    """The stores' Unix time (their ``now``) on a manual clock, from the real time: leases age only when told."""
    clock = ManualClock(time.time())
    for name in ("_base", "_sql_store", "_json_store"):
        module = sys.modules.get(f"zeus_callbacks.store.{name}")
        if module is not None and hasattr(module, "now"):
            monkeypatch.setattr(module, "now", clock.now_s)
    return clock


# How long a concurrent writer in these tests waits for the others (s): longer than the product's
# 30 s default, because on a loaded CI machine eight writers' turns can add up past it; these tests
# are about losing nothing, the lock timeout has tests of its own.
PATIENT_S = 300.0
_WAIT_OPTION = {
    "sqlite": "lock_timeout_s",
    "json": "lock_timeout_s",
    "rdb-sqlite": "lock_timeout_s",
    "postgresql": "lock_timeout_s",
}


def open_patient(kind: str, location: str) -> Store:
    """The store, opened by a writer that waits up to :data:`PATIENT_S` for the others' locks."""
    return _open(kind, location, **{_WAIT_OPTION[kind]: PATIENT_S})


def _worker(kind: str, path: str, worker: int, n: int) -> None:
    store = open_patient(kind, path)
    for i in range(n):
        trial = store.create_trial("shared", batch_size=worker * 100 + i, power_limit_W=200.0, info={"w": worker})
        store.finish_trial(
            trial.trial_id, status="completed", energy_J=float(i), time_s=1.0, cost=2.0 * i, converged=True
        )

        def bump(state: BanditState, worker=worker) -> tuple[BanditState, int]:
            count = state.state.get("count", 0) + 1
            arms = dict(state.arms)
            arms[worker] = {"n": arms.get(worker, {}).get("n", 0) + 1}
            return BanditState(state.job_id, {"count": count}, arms), count

        store.update_bandit("shared", bump)
    store.close()


def _writer_forever(kind: str, path: str, ready, written) -> None:
    store = _open(kind, path)
    store.create_trial("victim", batch_size=1)  # left running when this process is killed
    ready.set()
    big = {"limits_W": list(range(2000)), "time_s": [float(i) for i in range(2000)]}
    i = 0
    while True:
        trial = store.create_trial("victim", batch_size=2 + i % 5)
        store.put_profile(f"k{i % 3}", {**big, "i": i})
        store.finish_trial(trial.trial_id, status="completed", energy_J=1.0, time_s=1.0, cost=1.0, converged=True)
        i += 1
        if i == 3:
            written.set()  # three whole trials committed: from here on the kill lands among the writes


class StoreContract:
    """Subclass with a ``kind`` fixture naming the backend."""

    @pytest.fixture
    def path(self, tmp_path: str, kind: str) -> str:
        return new_location(kind, tmp_path / "sub")

    @pytest.fixture
    def store(self, kind: str, path: str):
        store = _open(kind, path)
        yield store
        store.close()

    def test_round_trip_of_every_record(self, kind: str, store: Store, path: str) -> None:
        job = store.ensure_job("nightly", {"workload": "imagenet"})
        assert job.job_id == "nightly" and job.info == {"workload": "imagenet"}
        assert store.ensure_job("nightly", {"other": 1}).info == {"workload": "imagenet"}  # kept
        t1 = store.create_trial("nightly", 256, 250.0, info={"phase": "pruning"})
        t2 = store.create_trial("other", 128)
        assert (t1.status, t1.pid, t1.converged, t1.energy_J) == ("running", os.getpid(), False, None)
        assert t2.trial_id > t1.trial_id
        done = store.finish_trial(
            t1.trial_id,
            status="early_stopped",
            energy_J=10.5,
            time_s=2.25,
            cost=7.0,
            converged=False,
            batch_size=128,
            info={"reason": "cost"},
        )
        assert (done.status, done.energy_J, done.time_s, done.cost, done.batch_size) == (
            "early_stopped",
            10.5,
            2.25,
            7.0,
            128,
        )
        assert done.info == {"phase": "pruning", "reason": "cost"} and done.ended_at >= done.started_at
        with pytest.raises(ValueError):
            store.finish_trial(t2.trial_id, status="running", energy_J=None, time_s=None, cost=None, converged=False)
        with pytest.raises(KeyError):
            store.finish_trial(999, status="failed", energy_J=None, time_s=None, cost=None, converged=False)

        rng_state = {"bit_generator": "PCG64", "state": {"state": 2**100 + 7, "inc": 3}, "has_uint32": 0}
        result = store.update_bandit(
            "nightly",
            lambda s: (
                BanditState(
                    s.job_id, {"rng": rng_state, "min_cost": 1.5}, {256: {"pruned": False}, 8: {"pruned": True}}
                ),
                "ok",
            ),
        )
        assert result == "ok"
        store.put_profile("A40/resnet50/bs256", {"limits_W": [100.0, 300.0], "time_s": [2.0, 1.0]})
        store.close()

        reopened = _open(kind, path)
        assert [j.job_id for j in reopened.list_jobs()] == ["nightly", "other"]
        assert reopened.get_job("nightly").info == {"workload": "imagenet"} and reopened.get_job("x") is None
        assert reopened.get_trial(t1.trial_id) == done
        assert [t.trial_id for t in reopened.list_trials("nightly")] == [t1.trial_id]
        assert [t.trial_id for t in reopened.list_trials(status="running")] == [t2.trial_id]  # our pid lives
        bandit = reopened.get_bandit("nightly")
        assert bandit.state == {"rng": rng_state, "min_cost": 1.5} and bandit.arms == {
            8: {"pruned": True},
            256: {"pruned": False},
        }
        assert bandit.version == 1 and reopened.get_bandit("other") is None
        assert reopened.get_profile("A40/resnet50/bs256") == {"limits_W": [100.0, 300.0], "time_s": [2.0, 1.0]}
        assert reopened.list_profiles() == ["A40/resnet50/bs256"] and reopened.get_profile("nope") is None
        reopened.close()

    def test_returned_records_are_copies(self, store: Store) -> None:
        store.update_bandit("j", lambda s: (BanditState(s.job_id, {"a": [1]}, {1: {"n": 1}}), None))
        got = store.get_bandit("j")
        got.state["a"].append(2)
        got.arms[1]["n"] = 99
        assert store.get_bandit("j").state == {"a": [1]} and store.get_bandit("j").arms == {1: {"n": 1}}

    def test_failed_update_changes_nothing(self, store: Store) -> None:
        store.update_bandit("j", lambda s: (BanditState(s.job_id, {"v": 1}), None))

        def boom(state: BanditState):
            raise RuntimeError("planted")

        with pytest.raises(RuntimeError, match="planted"):
            store.update_bandit("j", boom)
        assert store.get_bandit("j").state == {"v": 1} and store.get_bandit("j").version == 1

    def test_an_outcome_and_its_bandit_update_are_written_both_or_neither(
        self, kind: str, store: Store, path: str
    ) -> None:
        """``finish_trial(..., bandit_update=...)`` is one transaction: a failing callback leaves the trial running."""
        trial = store.create_trial("j", 32, 250.0, info={"round": 0})
        store.create_trial("other", 8)  # another job's trial: not among the ones the callback is given
        store.update_bandit("j", lambda s: (BanditState(s.job_id, {"v": 1}, {32: {"n": 0}}), None))
        before = store.get_bandit("j")
        outcome = {"status": "completed", "energy_J": 5.0, "time_s": 1.0, "cost": 5.0, "converged": True}

        def boom(finished, trials, current):
            assert finished.status == "completed"  # called after the outcome is written, before the commit
            raise RuntimeError("planted")

        with pytest.raises(RuntimeError, match="planted"):
            store.finish_trial(trial.trial_id, **outcome, pending_id="p-1", bandit_update=boom)
        with pytest.raises(StoreValueError):  # a new state the store refuses: the outcome goes with it
            store.finish_trial(
                trial.trial_id,
                **outcome,
                pending_id="p-1",
                bandit_update=lambda f, t, c: BanditState(c.job_id, {"min_cost": math.nan}),
            )
        left = store.get_trial(trial.trial_id)
        assert (left.status, left.cost, left.ended_at, left.pending_id) == ("running", None, None, None)
        assert store.get_bandit("j") == before

        seen = []

        def absorb(finished, trials, current):
            seen.append((finished, trials, current))
            completed = sum(t.status == "completed" for t in trials)
            return BanditState(
                current.job_id,
                {"v": current.state["v"] + 1, "min_cost": finished.cost},
                {finished.batch_size: {"n": completed}},
            )

        done = store.finish_trial(trial.trial_id, **outcome, pending_id="p-1", bandit_update=absorb)
        finished, trials, current = seen[-1]
        assert finished == done and trials == [done] and current == before  # what the transaction read
        assert (done.status, done.cost, done.pending_id) == ("completed", 5.0, "p-1")
        after = BanditState("j", {"v": 2, "min_cost": 5.0}, {32: {"n": 1}}, before.version + 1)
        assert store.get_bandit("j") == after

        fresh = store.create_trial("fresh", 8)  # a job's first bandit state, written by finish_trial
        store.finish_trial(
            fresh.trial_id,
            **outcome,
            bandit_update=lambda f, t, c: (seen.append(c), BanditState(c.job_id, {"n": len(t)}))[1],
        )
        assert seen[-1] == BanditState("fresh") and store.get_bandit("fresh") == BanditState("fresh", {"n": 1}, {}, 1)
        store.close()
        with _open(kind, path) as reopened:
            assert reopened.get_trial(trial.trial_id) == done and reopened.get_bandit("j") == after

    @pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
    def test_non_finite_numbers_are_refused_and_nothing_is_written(self, store: Store, bad: float) -> None:
        trial = store.create_trial("j", 8)
        store.update_bandit("j", lambda s: (BanditState(s.job_id, {"min_cost": 2.0}, {8: {"n": 1}}), None))
        for field in ("energy_J", "time_s", "cost", "power_limit_W"):
            values = {"energy_J": 1.0, "time_s": 1.0, "cost": 1.0, field: bad}
            with pytest.raises(StoreValueError, match=field):
                store.finish_trial(trial.trial_id, status="completed", converged=True, **values)
        with pytest.raises(StoreValueError, match="power_limit_W"):
            store.create_trial("j", 8, bad)
        with pytest.raises(StoreValueError):
            store.update_bandit("j", lambda s: (BanditState(s.job_id, {"min_cost": bad}), None))
        with pytest.raises(StoreValueError):
            store.update_bandit("j", lambda s: (BanditState(s.job_id, {}, {8: {"mean_cost": bad}}), None))
        with pytest.raises(StoreValueError):
            store.finish_trial(
                trial.trial_id, status="failed", energy_J=None, time_s=None, cost=None, converged=False, info={"x": bad}
            )
        assert store.get_trial(trial.trial_id).status == "running"  # no finish went through
        assert [t.trial_id for t in store.list_trials("j")] == [trial.trial_id]  # no trial was created
        assert store.get_bandit("j") == BanditState("j", {"min_cost": 2.0}, {8: {"n": 1}}, 1)

    def test_a_pending_trial_is_recorded_once(self, kind: str, store: Store, path: str) -> None:
        """A trial created from a pending file twice is one trial; its id is kept with the outcome, and unique."""
        plain = store.create_trial("j", 8, pid=1)
        first = store.create_trial("j", 32, 250.0, info={"detached": "down"}, pid=1, pending_id="p-new")
        again = store.create_trial("j", 64, None, pid=2, pending_id="p-new")  # a second merge of the same file
        assert plain.pending_id is None and first.pending_id == "p-new"
        assert again == first  # that trial, as it was: nothing written
        assert [t.trial_id for t in store.list_trials("j")] == [plain.trial_id, first.trial_id]
        done = store.finish_trial(
            plain.trial_id, status="completed", energy_J=5.0, time_s=1.0, cost=5.0, converged=True, pending_id="p-late"
        )
        assert done.pending_id == "p-late"
        kept = store.finish_trial(
            first.trial_id, status="completed", energy_J=7.0, time_s=1.0, cost=7.0, converged=True
        )  # no id given: the one it was created with stays
        assert kept.pending_id == "p-new"
        other = store.create_trial("j", 16, pid=1)
        with pytest.raises(StoreError, match="p-late|pending"):  # one file, one trial
            store.finish_trial(
                other.trial_id,
                status="completed",
                energy_J=1.0,
                time_s=1.0,
                cost=1.0,
                converged=True,
                pending_id="p-late",
            )
        assert store.get_trial(other.trial_id).status == "running"  # nothing was written
        store.close()
        with _open(kind, path) as reopened:
            assert [(t.trial_id, t.pending_id) for t in reopened.list_trials("j")] == [
                (plain.trial_id, "p-late"),
                (first.trial_id, "p-new"),
                (other.trial_id, None),
            ]

    def test_corrupt_file_is_a_clear_error_and_left_untouched(self, kind: str, path: str) -> None:
        if kind not in FILE_KINDS:  # a database: zeus tables without a schema version are a broken store
            import sqlalchemy as sa

            engine = db_engine(path)
            with engine.begin() as conn:
                conn.execute(sa.text("CREATE TABLE zeus_trials (garbage TEXT)"))
                conn.execute(sa.text("INSERT INTO zeus_trials VALUES ('kept')"))
            with pytest.raises(StoreCorruptError, match="zeus_schema_version"):
                _open(kind, path)
            with engine.begin() as conn:
                assert conn.execute(sa.text("SELECT garbage FROM zeus_trials")).all() == [("kept",)]
            engine.dispose()
            return
        file = file_of(kind, path)
        file.parent.mkdir(parents=True, exist_ok=True)
        garbage = b"\x00\x01 this is not a store {" * 100
        file.write_bytes(garbage)
        with pytest.raises(StoreCorruptError, match=file.name):
            _open(kind, path)
        assert file.read_bytes() == garbage

    @pytest.mark.parametrize(
        ("table", "column", "value", "named"),
        [
            ("trials", "energy_J", -5.0, r"trial {trial}\b.*energy_J"),
            ("trials", "time_s", -1.0, r"trial {trial}\b.*time_s"),
            ("trials", "cost", -2.0, r"trial {trial}\b.*cost"),
            ("arms", "state", {"pruned": False, "observations": -1}, r"arm '?16'? field observations"),
            ("arms", "state", {"pruned": False, "mean_cost": "abc"}, r"arm '?16'? field mean_cost"),
            ("arms", "state", {"pruned": False, "std_cost": -1.0}, r"arm '?16'? field std_cost"),
        ],
        ids=["energy", "time", "cost", "observations", "mean-cost-text", "std-cost"],
    )
    def test_an_impossible_stored_value_is_refused_by_name_and_left_untouched(
        self, kind: str, store: Store, path: str, table: str, column: str, value, named: str
    ) -> None:
        """No run records a negative energy, time or cost, nor an arm with a negative count or a cost in words."""
        trial = store.create_trial("j", 16, 250.0)
        store.finish_trial(trial.trial_id, status="completed", energy_J=5.0, time_s=1.0, cost=5.0, converged=True)
        arm = {"pruned": False, "observations": 1, "mean_cost": 5.0, "std_cost": 0.5}
        store.update_bandit("j", lambda s: (BanditState(s.job_id, {"min_cost": 5.0}, {16: arm}), None))
        store.close()
        key = {"trial_id": trial.trial_id} if table == "trials" else {"job_id": "j", "batch_size": 16}
        tamper(kind, path, table, column, key, value)
        before = fingerprint(kind, path)
        pattern = named.format(trial=trial.trial_id)
        for read_only in (True, False):  # show's open, and a run's
            with pytest.raises(StoreCorruptError, match=pattern):
                with _open(kind, path, read_only=read_only) as damaged:
                    damaged.list_trials("j")
                    damaged.get_bandit("j")
        assert fingerprint(kind, path) == before

    def test_an_impossible_value_is_never_written(self, store: Store) -> None:
        """What a read refuses, a write refuses first (StoreValueError naming the field): nothing is written."""
        trial = store.create_trial("j", 16)
        for field in ("energy_J", "time_s", "cost"):
            values = {"energy_J": 1.0, "time_s": 1.0, "cost": 1.0, field: -1.0}
            with pytest.raises(StoreValueError, match=field):
                store.finish_trial(trial.trial_id, status="completed", converged=True, **values)
        for arm, field in (({"observations": -1}, "observations"), ({"mean_cost": "abc"}, "mean_cost")):
            with pytest.raises(StoreValueError, match=f"arm 16 of job j: field {field}"):
                store.update_bandit("j", lambda s, arm=arm: (BanditState(s.job_id, {}, {16: arm}), None))
        assert store.get_trial(trial.trial_id).status == "running"
        assert store.get_bandit("j") is None

    def test_truncated_file_is_a_clear_error(self, kind: str, path: str) -> None:
        if kind not in FILE_KINDS:
            pytest.skip("a database server has no store file to truncate")
        store = _open(kind, path)
        for i in range(50):
            store.create_trial("j", i, pid=1)
        store.close()
        file = file_of(kind, path)
        data = file.read_bytes()
        file.write_bytes(data[: len(data) // 3])
        for extra in (file.with_name(file.name + "-wal"), file.with_name(file.name + "-shm")):
            extra.unlink(missing_ok=True)
        with pytest.raises(StoreCorruptError, match=file.name):
            _open(kind, path).list_trials()

    def test_newer_schema_is_refused(self, kind: str, path: str) -> None:
        _open(kind, path).close()
        set_schema_version(kind, path, SCHEMA_VERSION + 1)
        name = file_of(kind, path).name if kind in FILE_KINDS else path.rsplit("/", 1)[-1]
        with pytest.raises(StoreSchemaError, match=rf"{name}.*version {SCHEMA_VERSION + 1}"):
            _open(kind, path)

    def test_trial_of_another_host_fails_once_its_lease_expires(self, kind: str, path: str, monkeypatch) -> None:
        """Node a runs a trial and heartbeats; node b (this process) sees it run, then fail after a's death.

        Store time is a manual clock, and node a (this process under another host name) heartbeats by
        renewing its lease at the keeper's interval of that clock: the lease ages only by what the test
        advances, not by how a loaded machine schedules a keeper thread and a killed child (the keeper's
        own renewals are tests/test_store_lease.py's).
        """
        grace_s = 4.0
        _open(kind, path).close()  # imports the backend's module, whose clock is then made manual
        clock = _manual_store_time(monkeypatch)
        with monkeypatch.context() as node_a:
            node_a.setattr(socket, "gethostname", lambda: "node-a")
            node_a.setattr(lease, "_OWNER", None)  # node a's owner token, made under its host name
            node_a.setattr(KEEPER, "hold", lambda store, trial_id: None)  # its heartbeats are the renewals below
            owner = lease.lease_owner()
            a = _open(kind, path, lease_grace_s=grace_s)
            trial = a.create_trial("leased", batch_size=32)
            for _ in range(8):  # 1.6 grace periods: only the heartbeats keep it alive
                clock.advance(lease.heartbeat_interval_s(grace_s))
                assert a.renew_leases(owner, {trial.trial_id}) == {trial.trial_id}
        try:
            with _open(kind, path, lease_grace_s=grace_s) as store:
                (trial,) = store.list_trials("leased")
                assert (trial.status, trial.host) == ("running", "node-a")
                assert trial.heartbeat_at > trial.started_at and trial.owner.startswith(f"node-a:{os.getpid()}:")
            clock.advance(grace_s / 2)  # node a died after its last heartbeat: its lease is still fresh
            with _open(kind, path, lease_grace_s=grace_s) as store:
                assert store.list_trials("leased")[0].status == "running"
            clock.advance(grace_s / 2 + 0.5)
            with _open(kind, path, lease_grace_s=grace_s) as store:
                (trial,) = store.list_trials("leased")
                assert trial.status == "failed" and trial.info["reason"] == "lease expired" and trial.ended_at
        finally:
            a.close()

    def test_trial_of_a_dead_process_is_marked_failed_on_open(self, kind: str, store: Store, path: str) -> None:
        proc = _CTX.Process(target=os.getpid)
        proc.start()
        proc.join()
        dead_pid = proc.pid
        orphan = store.create_trial("j", 64, pid=dead_pid)
        alive = store.create_trial("j", 32)
        store.close()
        reopened = _open(kind, path)
        got = reopened.get_trial(orphan.trial_id)
        assert got.status == "failed" and got.info["reason"] == "process died" and got.ended_at is not None
        assert reopened.get_trial(alive.trial_id).status == "running"
        reopened.close()

    def test_a_withdrawn_trial_is_not_a_dead_trial(self, kind: str, store: Store, path: str) -> None:
        """A suggestion no run claimed is withdrawn: its process gone, the open's scan passes it by (issue 30)."""
        proc = _CTX.Process(target=os.getpid)
        proc.start()
        proc.join()
        trial = store.create_trial("j", 64, pid=proc.pid)
        store.finish_trial(
            trial.trial_id, status="withdrawn", energy_J=None, time_s=None, cost=None, converged=False,
            info={"reason": "not claimed"},
        )  # fmt: skip
        store.close()
        reopened = _open(kind, path)
        got = reopened.get_trial(trial.trial_id)
        assert (got.status, got.info, got.ended_at is not None) == ("withdrawn", {"reason": "not claimed"}, True)
        assert [t.trial_id for t in reopened.list_trials("j", status="withdrawn")] == [trial.trial_id]
        reopened.close()

    def test_concurrent_processes_lose_nothing(self, kind: str, path: str) -> None:
        _open(kind, path).close()
        procs = [_CTX.Process(target=_worker, args=(kind, path, w, TRIALS_PER_WORKER)) for w in range(WORKERS)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(PATIENT_S)
        assert [p.exitcode for p in procs] == [0] * WORKERS
        store = _open(kind, path)
        trials = store.list_trials("shared")
        assert len(trials) == WORKERS * TRIALS_PER_WORKER
        assert len({t.trial_id for t in trials}) == len(trials)
        assert sorted(t.batch_size for t in trials) == sorted(
            w * 100 + i for w in range(WORKERS) for i in range(TRIALS_PER_WORKER)
        )
        assert all(t.status == "completed" for t in trials)
        bandit = store.get_bandit("shared")
        assert bandit.state["count"] == WORKERS * TRIALS_PER_WORKER
        assert bandit.arms == {w: {"n": TRIALS_PER_WORKER} for w in range(WORKERS)}
        assert bandit.version == WORKERS * TRIALS_PER_WORKER
        store.close()

    def test_process_killed_mid_write_leaves_a_readable_store(self, kind: str, path: str) -> None:
        _open(kind, path).close()
        ready, written = _CTX.Event(), _CTX.Event()
        proc = _CTX.Process(target=_writer_forever, args=(kind, path, ready, written))
        proc.start()
        # Waited for, not slept: 0.3 s after the first trial assumed the writer had made a second by then.
        assert ready.wait(60) and written.wait(60)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        store = _open(kind, path)
        trials = store.list_trials("victim")
        assert len(trials) >= 4  # the one left running, and the three committed before the kill
        assert trials[0].status == "failed" and trials[0].info["reason"] == "process died"
        # The last trial may have been caught between create and finish: it is failed, not running.
        assert all(t.status in ("completed", "failed") for t in trials)
        assert all(t.status == "completed" for t in trials[1:-1])
        for key in store.list_profiles():
            assert len(store.get_profile(key)["limits_W"]) == 2000
        store.create_trial("victim", 1)  # still writable
        store.close()
