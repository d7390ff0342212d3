"""A report killed (SIGKILL) inside it records the outcome and its bandit update both or neither.

:meth:`BatchSizeBandit.report` records a recurrence's outcome (the trial finished, its cost) and
the bandit's update from it (the best cost, the pruning moved on, the arm's observation count).
Were they two transactions, a process killed between them would leave the trial finished with
the bandit never told, and nothing would redo the update later (a merged pending trial is
recognised as merged, ``test_fault_store_merge.py``): the observation lost to the bandit for good.

One real process per case, on SQLite, JSON and PostgreSQL (``ZEUS_CALLBACKS_TEST_DB_URL``): it
opens the store, takes a suggestion and reports its outcome, and is SIGKILLed

- *inside the bandit update*: through the bandit's test hook ``_bandit_update_hook``, called in
  the transform that turns the outcome into the new bandit state, where the outcome is written
  but not yet committed. The next open must find neither: the trial marked failed ("process
  died") and the bandit as the suggestion left it.
- *after the report*: once ``report`` returned. The next open must find both: the trial
  completed with its cost, and the bandit one version on, its best cost that cost, the
  observation counted and the pruning moved past the size.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.store_contract import FAULT_KINDS, _open, new_location
from tests.timeouts import CHILD_TIMEOUT_S

ROOT = Path(__file__).resolve().parents[2]
JOB = "nightly"
ENERGY_J, TIME_S, COST = 1234.5, 60.0, 1500.0

REPORT = textwrap.dedent("""
    import json, os, signal, sys
    from tests.store_contract import _open
    from zeus_callbacks.optimizers.batch_size import _bandit as bandit_module
    from zeus_callbacks.optimizers.batch_size import BanditSettings, BatchSizeBandit

    kind, location, point, job = sys.argv[1:5]
    energy_J, time_s, cost = (float(v) for v in sys.argv[5:8])
    store = _open(kind, location)
    bandit = BatchSizeBandit(store, job, BanditSettings((16, 32, 64), 32))
    s = bandit.suggest(power_limit_W=250.0)
    before = store.get_bandit(job)
    print(json.dumps({"trial_id": s.trial_id, "batch_size": s.batch_size, "version": before.version,
                      "state": before.state}), flush=True)

    def die():
        print("killed", point, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    if point == "inside the bandit update":
        bandit_module._bandit_update_hook = die
    bandit.report(s.trial_id, energy_J=energy_J, time_s=time_s, cost=cost, converged=True, power_limit_W=250.0)
    if point == "after the report":
        die()
    print("not killed", flush=True)
""")


@pytest.mark.parametrize("point", ["inside the bandit update", "after the report"])
@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_a_report_killed_records_outcome_and_bandit_update_both_or_neither(tmp_path, kind, point, record_fault):
    location = new_location(kind, tmp_path)
    child = subprocess.run(
        [sys.executable, "-c", REPORT, kind, location, point, JOB, str(ENERGY_J), str(TIME_S), str(COST)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
    )
    lines = child.stdout.strip().splitlines()
    before = json.loads(lines[0]) if lines else {}
    with _open(kind, location) as store:  # the next open: marks a trial of the dead process failed
        trial = store.get_trial(before["trial_id"]) if before else None
        bandit = store.get_bandit(JOB)
        trials = store.list_trials(JOB)
    size = before.get("batch_size")
    finished = trial is not None and trial.status == "completed" and trial.cost == COST
    absorbed = (
        bandit is not None
        and bandit.version == before.get("version", -1) + 1
        and bandit.state.get("min_cost") == COST
        and bandit.arms.get(size, {}).get("observations") == 1
        and bandit.state.get("candidate") != size  # the pruning moved past the size it waited for
    )
    untouched = (
        trial is not None
        and trial.status == "failed"
        and trial.info.get("reason") == "process died"
        and trial.cost is None
        and bandit is not None
        and bandit.version == before.get("version")
        and bandit.state == before.get("state")
    )
    ok = (
        child.returncode == -signal.SIGKILL
        and f"killed {point}" in child.stdout
        and len(trials) == 1
        and (finished and absorbed if point == "after the report" else untouched)
        and not (finished and not absorbed)  # never the outcome without its bandit update
    )
    record_fault("store: report killed", ok)
    assert ok, (child.returncode, child.stdout, child.stderr[-2000:], trial, bandit, before)
