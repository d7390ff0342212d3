"""A merge of a pending trial killed (SIGKILL) after it committed and before it removed its file records the trial once.

A run whose store could not take its trial keeps it in ``<log_dir>/zeus_pending_trials``; the next
open of the store merges it and removes the file. A process killed between the two leaves the
file behind, and the open after it merges the file again. Each file carries an id that the store
records with the merged trial, so that second merge must add nothing: no second trial, no second
observation for the bandit (its version does not move), the trial not rewritten.

Three real processes per case, on SQLite, JSON and PostgreSQL (``ZEUS_CALLBACKS_TEST_DB_URL``):

1. *the run*: a :class:`BatchSizeController` whose store goes down (its opener raises
   :class:`StoreUnavailableError`, as a database that stopped answering does). ``trained without
   the store``: down from the start (no trial; the merge creates it). ``store down at train end``:
   up for the suggestion (the trial is created), down for the outcome. The run keeps its trial
   in a pending file and exits.
2. *the killed merge*: opens the store for the job (``open_job_store``, which merges), with the
   controller's test hook ``_after_merge_hook`` set to SIGKILL the process at the point between
   the merge's commit and the file's removal.
3. *the next open*, in this process: merges what is left and must find it merged already.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.store_contract import FAULT_KINDS, new_location
from tests.timeouts import CHILD_TIMEOUT_S
from zeus_callbacks.config import parse_config
from zeus_callbacks.optimizers.batch_size import _batch_size_controller as recurring
from zeus_callbacks.store import open_configured_store

ROOT = Path(__file__).resolve().parents[2]
JOB = "nightly"
ENERGY_J, TIME_S = 1234.5, 60.0

RUN = textwrap.dedent("""
    import json, sys
    from zeus_callbacks.config import parse_config
    from zeus_callbacks.errors import StoreUnavailableError
    from zeus_callbacks.optimizers.batch_size import _batch_size_controller as recurring
    from zeus_callbacks.store._run_store import RunStore

    config, up = parse_config(json.loads(sys.argv[1])), int(sys.argv[2])
    opens = []

    def opener():  # the store answers the run's first `up` opens, then is down
        opens.append(1)
        if len(opens) > up:
            raise StoreUnavailableError("injected fault: the store stopped answering")
        return recurring.open_job_store(config)

    run_store = RunStore(opener)
    run = recurring.BatchSizeController(config, run_store)
    run.start(max_power_W=300.0, power_limit_W=250.0)
    run_store.close()  # the run's open store is gone: recording the outcome needs an open, which fails
    run.finish(float(sys.argv[3]), float(sys.argv[4]), "completed")
    print(json.dumps({"pending": str(run.pending_path), "trial_id": run.trial_id}), flush=True)
""")

KILLED_MERGE = textwrap.dedent("""
    import json, os, signal, sys
    from zeus_callbacks.config import parse_config
    from zeus_callbacks.optimizers.batch_size import _batch_size_controller as recurring

    def die(path):  # the merge has committed; the pending file is not removed yet
        print("merged", path.name, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    recurring._after_merge_hook = die
    recurring.open_job_store(parse_config(json.loads(sys.argv[1]))).close()
    print("not killed", flush=True)
""")


def _config(tmp_path: Path, kind: str, location: str) -> dict:
    store = {"url": location} if kind == "postgresql" else {"backend": kind, "path": location}
    return {
        "backend": "virtual",
        "job_id": JOB,
        "logging": {"log_dir": str(tmp_path / "logs"), "run_name": "r"},
        "store": {**store, "lock_timeout_s": 1.0},
        "batch_size": {"enabled": True, "batch_sizes": [16, 32, 64], "default_batch_size": 32},
    }


def _python(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", script, *args], cwd=ROOT, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S
    )


def _state(config) -> tuple[list, int]:
    """The job's trials and its bandit's version, read with a plain open (which merges nothing)."""
    with open_configured_store(config.store, config.logging.log_dir) as store:
        state = store.get_bandit(JOB)
        return store.list_trials(JOB), 0 if state is None else state.version


@pytest.mark.parametrize("flow", ["trained without the store", "store down at train end"])
@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_a_merge_killed_before_removing_its_file_records_the_trial_once(tmp_path, kind, flow, record_fault):
    location = new_location(kind, tmp_path)
    cfg = _config(tmp_path, kind, location)
    config = parse_config(cfg)
    up = 0 if flow == "trained without the store" else 1
    run = _python(RUN, json.dumps(cfg), str(up), str(ENERGY_J), str(TIME_S))
    assert run.returncode == 0, run.stderr[-3000:]
    kept = json.loads(run.stdout.strip().splitlines()[-1])
    pending = Path(kept["pending"])
    pending_id = json.loads(pending.read_text())["pending_id"]
    assert (kept["trial_id"] is None) == (up == 0)
    before, _ = _state(config)

    killed = _python(KILLED_MERGE, json.dumps(cfg))
    left_by_kill = pending.exists()
    after_kill, version_after_kill = _state(config)
    merged = [t for t in after_kill if t.pending_id == pending_id]

    with recurring.open_job_store(config):  # the next open: the file is still there, merged again
        pass
    after_next, version_after_next = _state(config)

    ok = (
        killed.returncode == -signal.SIGKILL
        and f"merged {pending.name}" in killed.stdout
        and len(before) == (0 if up == 0 else 1)
        # the killed merge committed, and left its file
        and left_by_kill
        and len(merged) == 1
        and merged[0].status == "completed"
        and merged[0].energy_J == ENERGY_J
        and "recorded late" in merged[0].info.get("reason", "")
        and version_after_kill >= 1
        # the next open recorded nothing new: one trial, not rewritten, no second bandit update
        and after_next == after_kill
        and len(after_next) == 1
        and version_after_next == version_after_kill
        and not pending.exists()  # and removed the file
    )
    record_fault("store: merge killed", ok)
    assert ok, (
        killed.returncode,
        killed.stdout,
        killed.stderr[-2000:],
        left_by_kill,
        before,
        after_kill,
        after_next,
        version_after_kill,
        version_after_next,
        pending.exists(),
    )
