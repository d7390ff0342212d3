"""The Store contract suite: every store backend must pass these (tests/test_store.py runs them)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from zeus_callbacks.store import SCHEMA_VERSION, BanditState, Store, StoreCorruptError, StoreSchemaError
from zeus_callbacks.store.json import JSONStore
from zeus_callbacks.store.sqlite import SQLiteStore

BACKENDS: dict[str, tuple[type[Store], str]] = {
    "sqlite": (SQLiteStore, "store.sqlite"),
    "json": (JSONStore, "store.json"),
}
WORKERS = 8
TRIALS_PER_WORKER = 12
_CTX = multiprocessing.get_context("fork")


def _open(kind: str, path: str) -> Store:
    return BACKENDS[kind][0](path)


def _worker(kind: str, path: str, worker: int, n: int) -> None:
    store = _open(kind, path)
    for i in range(n):
        trial = store.create_trial("shared", batch_size=worker * 100 + i, power_limit_W=200.0, info={"w": worker})
        store.finish_trial(trial.trial_id, status="completed", energy_J=float(i), time_s=1.0, cost=2.0 * i,
                           converged=True)

        def bump(state: BanditState, worker=worker) -> tuple[BanditState, int]:
            count = state.state.get("count", 0) + 1
            arms = dict(state.arms)
            arms[worker] = {"n": arms.get(worker, {}).get("n", 0) + 1}
            return BanditState(state.job_id, {"count": count}, arms), count

        store.update_bandit("shared", bump)
    store.close()


def _writer_forever(kind: str, path: str, ready) -> None:
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


class StoreContract:
    """Subclass with a ``kind`` fixture naming the backend."""

    @pytest.fixture
    def path(self, tmp_path: Path, kind: str) -> Path:
        return tmp_path / "sub" / BACKENDS[kind][1]

    @pytest.fixture
    def store(self, kind: str, path: Path):
        store = _open(kind, str(path))
        yield store
        store.close()

    def test_round_trip_of_every_record(self, kind: str, store: Store, path: Path) -> None:
        job = store.ensure_job("nightly", {"workload": "imagenet"})
        assert job.job_id == "nightly" and job.info == {"workload": "imagenet"}
        assert store.ensure_job("nightly", {"other": 1}).info == {"workload": "imagenet"}  # kept
        t1 = store.create_trial("nightly", 256, 250.0, info={"phase": "pruning"})
        t2 = store.create_trial("other", 128)
        assert (t1.status, t1.pid, t1.converged, t1.energy_J) == ("running", os.getpid(), False, None)
        assert t2.trial_id > t1.trial_id
        done = store.finish_trial(t1.trial_id, status="early_stopped", energy_J=10.5, time_s=2.25, cost=7.0,
                                  converged=False, batch_size=128, info={"reason": "cost"})
        assert (done.status, done.energy_J, done.time_s, done.cost, done.batch_size) == (
            "early_stopped", 10.5, 2.25, 7.0, 128)
        assert done.info == {"phase": "pruning", "reason": "cost"} and done.ended_at >= done.started_at
        with pytest.raises(ValueError):
            store.finish_trial(t2.trial_id, status="running", energy_J=None, time_s=None, cost=None, converged=False)
        with pytest.raises(KeyError):
            store.finish_trial(999, status="failed", energy_J=None, time_s=None, cost=None, converged=False)

        rng_state = {"bit_generator": "PCG64", "state": {"state": 2**100 + 7, "inc": 3}, "has_uint32": 0}
        result = store.update_bandit("nightly", lambda s: (BanditState(s.job_id, {"rng": rng_state, "min_cost": 1.5},
                                                                       {256: {"pruned": False}, 8: {"pruned": True}}),
                                                           "ok"))
        assert result == "ok"
        store.put_profile("A40/resnet50/bs256", {"limits_W": [100.0, 300.0], "time_s": [2.0, 1.0]})
        store.close()

        reopened = _open(kind, str(path))
        assert [j.job_id for j in reopened.list_jobs()] == ["nightly", "other"]
        assert reopened.get_job("nightly").info == {"workload": "imagenet"} and reopened.get_job("x") is None
        assert reopened.get_trial(t1.trial_id) == done
        assert [t.trial_id for t in reopened.list_trials("nightly")] == [t1.trial_id]
        assert [t.trial_id for t in reopened.list_trials(status="running")] == [t2.trial_id]  # our pid lives
        bandit = reopened.get_bandit("nightly")
        assert bandit.state == {"rng": rng_state, "min_cost": 1.5} and bandit.arms == {8: {"pruned": True},
                                                                                         256: {"pruned": False}}
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

    def test_corrupt_file_is_a_clear_error_and_left_untouched(self, kind: str, path: Path) -> None:
        path.parent.mkdir(parents=True)
        garbage = b"\x00\x01 this is not a store {" * 100
        path.write_bytes(garbage)
        with pytest.raises(StoreCorruptError, match=str(path).replace("\\", "\\\\")):
            _open(kind, str(path))
        assert path.read_bytes() == garbage

    def test_truncated_file_is_a_clear_error(self, kind: str, path: Path) -> None:
        store = _open(kind, str(path))
        for i in range(50):
            store.create_trial("j", i)
        store.close()
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 3])
        if kind == "sqlite":
            for extra in (path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
                extra.unlink(missing_ok=True)
        with pytest.raises(StoreCorruptError, match=path.name):
            _open(kind, str(path)).list_trials()

    def test_newer_schema_is_refused(self, kind: str, path: Path) -> None:
        _open(kind, str(path)).close()
        if kind == "sqlite":
            conn = sqlite3.connect(path)
            conn.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
            conn.commit()
            conn.close()
        else:
            import json

            doc = json.loads(path.read_text())
            doc["schema_version"] = SCHEMA_VERSION + 1
            path.write_text(json.dumps(doc))
        with pytest.raises(StoreSchemaError, match=rf"{path.name}.*version {SCHEMA_VERSION + 1}"):
            _open(kind, str(path))

    def test_trial_of_a_dead_process_is_marked_failed_on_open(self, kind: str, store: Store, path: Path) -> None:
        proc = _CTX.Process(target=os.getpid)
        proc.start()
        proc.join()
        dead_pid = proc.pid
        orphan = store.create_trial("j", 64, pid=dead_pid)
        alive = store.create_trial("j", 32)
        store.close()
        reopened = _open(kind, str(path))
        got = reopened.get_trial(orphan.trial_id)
        assert got.status == "failed" and got.info["reason"] == "process died" and got.ended_at is not None
        assert reopened.get_trial(alive.trial_id).status == "running"
        reopened.close()

    def test_concurrent_processes_lose_nothing(self, kind: str, path: Path) -> None:
        _open(kind, str(path)).close()
        procs = [_CTX.Process(target=_worker, args=(kind, str(path), w, TRIALS_PER_WORKER)) for w in range(WORKERS)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        assert [p.exitcode for p in procs] == [0] * WORKERS
        store = _open(kind, str(path))
        trials = store.list_trials("shared")
        assert len(trials) == WORKERS * TRIALS_PER_WORKER
        assert len({t.trial_id for t in trials}) == len(trials)
        assert sorted(t.batch_size for t in trials) == sorted(
            w * 100 + i for w in range(WORKERS) for i in range(TRIALS_PER_WORKER))
        assert all(t.status == "completed" for t in trials)
        bandit = store.get_bandit("shared")
        assert bandit.state["count"] == WORKERS * TRIALS_PER_WORKER
        assert bandit.arms == {w: {"n": TRIALS_PER_WORKER} for w in range(WORKERS)}
        assert bandit.version == WORKERS * TRIALS_PER_WORKER
        store.close()

    def test_process_killed_mid_write_leaves_a_readable_store(self, kind: str, path: Path) -> None:
        _open(kind, str(path)).close()
        ready = _CTX.Event()
        proc = _CTX.Process(target=_writer_forever, args=(kind, str(path), ready))
        proc.start()
        assert ready.wait(20)
        time.sleep(0.3)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        store = _open(kind, str(path))
        trials = store.list_trials("victim")
        assert len(trials) >= 2
        assert trials[0].status == "failed" and trials[0].info["reason"] == "process died"
        # The last trial may have been caught between create and finish: it is failed, not running.
        assert all(t.status in ("completed", "failed") for t in trials)
        assert all(t.status == "completed" for t in trials[1:-1])
        for key in store.list_profiles():
            assert len(store.get_profile(key)["limits_W"]) == 2000
        store.create_trial("victim", 1)  # still writable
        store.close()

