"""A locked store never stops training, and a trial the store cannot take at train end is kept, not lost.

- at run start, the store locked past ``store.lock_timeout_s``: the run trains at
  ``default_batch_size`` without the bandit (a warning), ends normally, and its trial waits in
  a pending file; the next open records it (at the batch size it trained at, with its real
  outcome) without moving the bandit's pruning on, and removes the file;
- at run end, the store locked (SQLite: another process's write transaction; JSON: another
  process's lock file) past the limit: the trial's outcome goes to a pending file in
  ``<log_dir>/zeus_pending_trials``; when the store is next opened it is merged — the trial gets
  its real outcome, not "failed: process died" — and the file is removed. The run that ends
  is a real process that exits (so the store's dead-process scan sees it first).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from filelock import FileLock

from tests.timeouts import CHILD_TIMEOUT_S
from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.backends.virtual import VirtualGPUBackend
from zeus_callbacks.config import parse_config
from zeus_callbacks.optimizers.batch_size import _batch_size_controller as recurring
from zeus_callbacks.optimizers.cost import ZeusCost
from zeus_callbacks.session import EnergySession
from zeus_callbacks.store import open_store

ROOT = Path(__file__).resolve().parents[2]


def _config(tmp_path: Path, kind: str) -> dict:
    return {
        "backend": "virtual",
        "job_id": "nightly",
        "logging": {"log_dir": str(tmp_path / "logs"), "run_name": "r"},
        "store": {"backend": kind, "path": str(tmp_path / f"store.{kind}"), "lock_timeout_s": 0.5},
        "batch_size": {
            "enabled": True,
            "batch_sizes": [16, 32, 64],
            "default_batch_size": 32,
            "target": {"metric": "acc", "value": 0.5},
        },
    }


class _Locked:
    """Hold the store the way another writer does: a SQLite write transaction, or the JSON lock file."""

    def __init__(self, kind: str, path: Path) -> None:
        self.kind, self.path = kind, path

    def __enter__(self):
        if self.kind == "sqlite":
            self.conn = sqlite3.connect(self.path, isolation_level=None)
            self.conn.execute("BEGIN IMMEDIATE")
        else:
            self.lock = FileLock(str(self.path) + ".lock")
            self.lock.acquire()
        return self

    def __exit__(self, *exc) -> None:
        if self.kind == "sqlite":
            self.conn.execute("ROLLBACK")
            self.conn.close()
        else:
            self.lock.release()


@pytest.mark.parametrize("kind", ["sqlite", "json"])
def test_a_store_locked_at_run_start_does_not_stop_training(tmp_path, kind, virtual_backend, record_fault, caplog):
    cfg = _config(tmp_path, kind)
    open_store(cfg["store"]["path"], kind).close()  # an existing store, held by another writer
    with _Locked(kind, Path(cfg["store"]["path"])):
        session = EnergySession(cfg, backend=virtual_backend, is_main_process=True)
        batch_size = session.suggest_batch_size()
        session.train_start()
        for i in range(3):
            session.step_start(i)
            virtual_backend.clock.advance(0.5)
            session.step_end(i)
        summary = session.train_end()
    with open_store(cfg["store"]["path"], kind) as store:  # a plain open merges nothing
        trials = store.list_trials()
    folder = tmp_path / "logs" / recurring.PENDING_DIR
    pending = sorted(folder.glob("*.json"))
    config = parse_config(cfg)
    with recurring.open_job_store(config) as store:  # the next run's open: the trial is recorded
        merged = store.list_trials("nightly")
        state = store.get_bandit("nightly")
    trial = merged[0] if len(merged) == 1 else None
    ok = (
        batch_size == 32
        and summary.status == "completed"
        and summary.steps == 3
        and trials == []
        and "without the bandit's suggestion" in caplog.text
        and "stayed locked" in caplog.text
        and len(pending) == 1
        and trial is not None
        and trial.status == "completed"
        and trial.batch_size == 32
        and trial.energy_J == pytest.approx(summary.energy_J)
        and trial.cost is not None
        and trial.cost > 0
        and "could not be reached at train start" in trial.info.get("reason", "")
        and trial.info.get("round", 0) is None
        and list(folder.glob("*.json")) == []
        and (state is None or state.state.get("candidate") in (None, 32))
    )  # pruning not moved on
    record_fault("store: locked", ok)
    assert ok, (batch_size, summary.status, trials, pending, merged, state, caplog.text[-2000:])


CHILD = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from zeus_callbacks.backends.base import ManualClock
    from zeus_callbacks.backends.virtual import VirtualGPUBackend
    from zeus_callbacks.session import EnergySession

    cfg, started, locked = json.loads(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    clock = ManualClock(1000.0)
    backend = VirtualGPUBackend(clock=clock, noise_W=0.0, read_only=True, sample_period_s=0.1)
    session = EnergySession(cfg, backend=backend, is_main_process=True)
    print("batch", session.suggest_batch_size(), flush=True)
    session.train_start()
    for i in range(5):
        session.step_start(i)
        clock.advance(1.0)
        session.sampler.poll_once()
        session.step_end(i)
    session.evaluate({"acc": 0.9})
    started.write_text("started")
    deadline = time.monotonic() + 60
    while not locked.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    summary = session.train_end()
    print("status", summary.status, "energy", summary.energy_J, flush=True)
""")


@pytest.mark.parametrize("kind", ["sqlite", "json"])
def test_a_store_locked_at_run_end_keeps_the_trial_and_merges_it(tmp_path, kind, record_fault):
    cfg = _config(tmp_path, kind)
    started, locked = tmp_path / "started", tmp_path / "locked"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, json.dumps(cfg), str(started), str(locked)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + CHILD_TIMEOUT_S  # a hang guard: start-up is slow under load
    while not started.exists() and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    with _Locked(kind, Path(cfg["store"]["path"])):
        locked.write_text("locked")
        out, err = child.communicate(timeout=CHILD_TIMEOUT_S)
        pending = sorted((tmp_path / "logs" / recurring.PENDING_DIR).glob("*.json"))
    assert child.returncode == 0, err[-3000:]
    config = parse_config(cfg)
    with recurring.open_job_store(config) as store:  # the next open: the dead process's trial, then the merge
        trials = store.list_trials("nightly")
    left = sorted((tmp_path / "logs" / recurring.PENDING_DIR).glob("*.json"))
    trial = trials[-1] if trials else None
    ok = (
        len(pending) == 1
        and "status completed" in out
        and "kept in" in err
        and trial is not None
        and trial.status == "completed"
        and trial.converged
        and trial.cost is not None
        and trial.cost > 0
        and "recorded late" in trial.info.get("reason", "")
        and left == []
    )
    record_fault("store: locked", ok)
    assert ok, (pending, out, err[-2000:], trials, left)


class _ManualPlusWallClock(ManualClock):
    """A manual clock that real time moves too: a wait for a lock shows in it, the steps stay exact.

    Real time passed is folded into the manual time at each :meth:`advance`, so the sampler's drain
    alarms (due on this clock) keep their place.
    """

    def __init__(self, start_s: float) -> None:
        super().__init__(start_s)
        self._fold = threading.Lock()
        self._wall0_s = time.monotonic()

    def now_s(self) -> float:
        with self._fold:
            return super().now_s() + (time.monotonic() - self._wall0_s)

    def advance(self, dt_s: float) -> float:
        with self._fold:
            wall_s = time.monotonic()
            self._now_s += wall_s - self._wall0_s
            self._wall0_s = wall_s
        return super().advance(dt_s)


class _HeldFor:
    """Hold the store (as :class:`_Locked`) from a thread, for ``hold_s`` (s, real time) or until the block ends."""

    def __init__(self, kind: str, path: Path, hold_s: float | None) -> None:
        self.kind, self.path, self.hold_s = kind, path, hold_s
        self._taken, self._done = threading.Event(), threading.Event()

    def _hold(self) -> None:
        with _Locked(self.kind, self.path):  # a SQLite connection stays on the thread that made it
            self._taken.set()
            self._done.wait(self.hold_s)

    def __enter__(self) -> _HeldFor:
        self._thread = threading.Thread(target=self._hold, daemon=True)
        self._thread.start()
        assert self._taken.wait(CHILD_TIMEOUT_S)
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join(CHILD_TIMEOUT_S)


def _run_and_trial(tmp_path: Path, kind: str, *, lock_timeout_s: float, hold_s: float | None = None, free=False):
    """One run of 5 steps of 1 s (manual clock) on the virtual GPU, the store held at its start (``hold_s``:
    for that long, None: past ``lock_timeout_s``) or free; its trial (merged from the pending file if
    need be), the seconds its ``train_start`` took and its ``batch_size`` log record."""
    cfg = _config(tmp_path, kind)
    cfg["store"]["lock_timeout_s"] = lock_timeout_s
    open_store(cfg["store"]["path"], kind).close()
    clock = _ManualPlusWallClock(1000.0)
    backend = VirtualGPUBackend(clock=clock, noise_W=0.0, read_only=True)
    try:
        session = EnergySession(cfg, backend=backend, is_main_process=True)
        with contextlib.nullcontext() if free else _HeldFor(kind, Path(cfg["store"]["path"]), hold_s):
            session.train_start()  # the bandit's store is opened here (as the raw loop and the callbacks do)
            start_took_s = clock.now_s() - 1000.0
            for i in range(5):
                session.step_start(i)
                clock.advance(1.0)
                session.step_end(i)
        session.train_end()
    finally:
        backend.close()
    with recurring.open_job_store(parse_config(cfg)) as store:  # merges the pending trial of a locked run
        trials = store.list_trials("nightly")
    assert len(trials) == 1, trials
    log = [json.loads(line) for line in (tmp_path / "logs" / "r.jsonl").read_text().splitlines()]
    (batch_record,) = [r for r in log if r["event"] == "batch_size"]
    return trials[0], start_took_s, batch_record


@pytest.mark.parametrize("kind", ["sqlite", "json"])
@pytest.mark.parametrize(
    ("lock_timeout_s", "hold_s"),
    [(1.5, None), (4.0, 1.5)],
    ids=["held-past-the-timeout", "released-after-a-wait"],
)
def test_the_wait_for_a_locked_store_is_not_in_the_trials_cost(tmp_path, kind, lock_timeout_s, hold_s, record_fault):
    """D2: time and energy spent waiting for a locked store at train start stay out of the bandit's trial.

    The clock moves with real time, so the wait is seen by the run if it falls inside it; the steps move
    it by exact seconds. The same run with the store free is the reference: the two trials may differ only
    by the real time the runs' own work takes, which must stay under half the wait. The wait is in the
    ``batch_size`` record instead (``store_open_s``).
    """
    wait_s = lock_timeout_s if hold_s is None else hold_s
    free, _, _ = _run_and_trial(tmp_path / "free", kind, lock_timeout_s=lock_timeout_s, free=True)
    held, start_took_s, record = _run_and_trial(tmp_path / "held", kind, lock_timeout_s=lock_timeout_s, hold_s=hold_s)
    # Bounds from the setup: half the wait at the run's mean power (the virtual GPU's power is constant),
    # and the cost of that much energy and time (MaxPower: the virtual GPU's maximum limit).
    slack_s = wait_s / 2
    power_W = free.energy_J / free.time_s
    max_power_W = VirtualGPUBackend(clock=ManualClock(), read_only=True).power_limit_constraints_W(0)[1]
    eta = parse_config(_config(tmp_path, kind)).batch_size.eta_knob
    slack_cost = ZeusCost(eta, max_power_W)(power_W * slack_s, slack_s)
    detached = "could not be reached at train start" in held.info.get("reason", "")
    ok = (
        start_took_s >= wait_s  # the run did wait for the lock
        and detached == (hold_s is None)  # past the timeout: trained without the bandit; else its suggestion
        and held.status == "completed"
        and abs(held.time_s - free.time_s) < slack_s
        and abs(held.energy_J - free.energy_J) < power_W * slack_s
        and abs(held.cost - free.cost) < slack_cost
        and record["store_open_s"] >= wait_s  # the wait, said in the log
    )
    record_fault("store: locked", ok)
    figures = [(t.time_s, t.energy_J, t.cost) for t in (free, held)]
    assert ok, (start_took_s, slack_s, slack_cost, figures, record, held.info)
