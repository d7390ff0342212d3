"""Eight processes record trials into one store at once, 100 each (JSON: 50): none lost or duplicated."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.store_contract import _CTX, FAULT_KINDS, PATIENT_S, _open, _worker, new_location, open_patient

PROCESSES = 8
TRIALS_EACH = 100

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="fork start method")


def _recorder(kind: str, path: str, worker: int, n: int) -> None:
    """What a recurrence writes: create its trial at the start, finish it at the end."""
    with open_patient(kind, path) as store:
        for i in range(n):
            trial = store.create_trial("shared", batch_size=worker * 100 + i, power_limit_W=200.0)
            store.finish_trial(
                trial.trial_id, status="completed", energy_J=float(i), time_s=1.0, cost=float(i), converged=True
            )


def _bandit_worker(kind: str, path: str, worker: int, n: int) -> None:
    """The contract suite's worker (create + finish + an atomic bandit update per trial)."""
    _worker(kind, path, worker, n)


# The JSON store reads, checks and rewrites its whole file per write (~20 ms of CPU at 800 trials, so the
# cost grows with the square of the trials): it gets the lighter recorder and 50 trials a writer (800 writes,
# ~10 s on 2 cores). SQLite and PostgreSQL also get a bandit update per trial.
WORKERS = {"sqlite": _bandit_worker, "json": _recorder, "postgresql": _bandit_worker}
TRIALS = {"sqlite": TRIALS_EACH, "json": 50, "postgresql": TRIALS_EACH}


@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_eight_writers_lose_and_duplicate_nothing(tmp_path: Path, kind: str, record_fault) -> None:
    path = new_location(kind, tmp_path)
    _open(kind, path).close()
    target = WORKERS[kind]
    each = TRIALS[kind]
    procs = [_CTX.Process(target=target, args=(kind, path, w, each)) for w in range(PROCESSES)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(PATIENT_S)
    exit_codes = [p.exitcode for p in procs]
    with _open(kind, path) as store:
        trials = store.list_trials("shared")
        bandit = store.get_bandit("shared")
    expected = sorted(w * 100 + i for w in range(PROCESSES) for i in range(each))
    ids = [t.trial_id for t in trials]
    checks = {
        "every writer finished": exit_codes == [0] * PROCESSES,
        "no trial lost or duplicated": sorted(t.batch_size for t in trials) == expected,
        "trial ids unique": len(set(ids)) == len(ids) == PROCESSES * each,
        "ids in creation order": ids == sorted(ids),
        "every trial completed": all(t.status == "completed" for t in trials),
    }
    if target is _bandit_worker:
        checks["no bandit update lost"] = (
            bandit is not None
            and bandit.state.get("count") == PROCESSES * each
            and bandit.arms == {w: {"n": each} for w in range(PROCESSES)}
        )
    record_fault(f"8 concurrent writers ({kind})", all(checks.values()))
    assert all(checks.values()), {name: ok for name, ok in checks.items() if not ok}
