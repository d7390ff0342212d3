"""The hand-off from ``suggest_batch_size()`` to the run: carried by the value returned (a weak registry of the
unclaimed ones only lets a later suggestion of the job withdraw them), and what becomes of one no run claims."""

from __future__ import annotations

import copy
import gc
import json
import logging
import os
import pickle
import subprocess
import sys
from pathlib import Path

from zeus_callbacks import suggest_batch_size
from zeus_callbacks.optimizers.batch_size import SuggestedBatchSize
from zeus_callbacks.optimizers.batch_size import _batch_size_controller as recurring
from zeus_callbacks.session import EnergySession
from zeus_callbacks.store import open_store

ROOT = Path(__file__).resolve().parents[1]


def config(tmp_path, job_id: str = "nightly") -> dict:
    return {
        "backend": "virtual",
        "job_id": job_id,
        "logging": {"log_dir": str(tmp_path)},
        "batch_size": {"enabled": True, "batch_sizes": [32, 64, 128], "default_batch_size": 64},
    }


def closes_counted(monkeypatch) -> list[str]:
    """Count the closes of every store that suggest_batch_size() opens (by location)."""
    closed: list[str] = []
    opened = recurring.open_job_store

    def counting(cfg):
        store = opened(cfg)
        close = store.close

        def close_counted() -> None:
            closed.append(store.location)
            close()

        store.close = close_counted  # type: ignore[method-assign]
        return store

    monkeypatch.setattr(recurring, "open_job_store", counting)
    return closed


def test_two_jobs_in_one_process_claim_only_their_own_trial(tmp_path):
    first = suggest_batch_size(config(tmp_path, "first"))
    second = suggest_batch_size(config(tmp_path, "second"))
    assert isinstance(first, SuggestedBatchSize) and isinstance(second, SuggestedBatchSize)
    # A run of one job ignores the other's suggestion: it makes its own trial, and the other stays claimable.
    session = EnergySession(config(tmp_path, "second"), is_main_process=True)
    assert session.suggest_batch_size(first) == 64
    made = first.claim("first")
    assert made is not None and made.suggestion is not None
    made.store.close()
    other = EnergySession(config(tmp_path, "second"), is_main_process=True)
    assert other.suggest_batch_size(second) == 64 and second.claim("second") is None  # claimed once
    with open_store(tmp_path / "zeus_store.sqlite") as store:
        trials = {job: [t.trial_id for t in store.list_trials(job)] for job in ("first", "second")}
    assert len(trials["first"]) == 1 and len(trials["second"]) == 2
    assert other.batch_size_controller.trial_id == trials["second"][0]  # the claimed one, not a new one
    assert session.batch_size_controller.trial_id == trials["second"][1]
    for run in (session, other):
        run.train_start()
        run.train_end()


def test_a_second_suggestion_of_a_job_withdraws_the_earlier_unclaimed_one(tmp_path, caplog):
    """Issue 30: suggest_batch_size() called twice in one process left the first trial running, later marked failed
    ("process died") and counted against its batch size. The earlier one is withdrawn, with a warning."""
    one = suggest_batch_size(config(tmp_path))
    with caplog.at_level(logging.WARNING, logger="zeus_callbacks"):
        two = suggest_batch_size(config(tmp_path))
    assert "called again for job nightly" in caplog.text and "trial 1" in caplog.text
    # Its advice names both ways to hand the value on, not the Hugging Face one alone (a raw loop's user read it too).
    assert "per_device_train_batch_size=...) for the Hugging Face Trainer" in caplog.text
    assert "measure(config, batch_size=...) for a raw loop" in caplog.text
    assert one.withdrawn and not two.withdrawn
    with open_store(tmp_path / "zeus_store.sqlite") as store:
        first = store.get_trial(1)
    assert (first.status, first.info["reason"]) == ("withdrawn", recurring.REPLACED_REASON)
    caplog.clear()
    runs = [EnergySession(config(tmp_path), is_main_process=True) for _ in range(2)]
    runs[1].suggest_batch_size(two)  # claimed: the run reports into trial 2
    with caplog.at_level(logging.WARNING, logger="zeus_callbacks"):
        runs[0].suggest_batch_size(one)  # withdrawn: a trial of its own
    assert "suggestion that was withdrawn" in caplog.text
    assert [r.batch_size_controller.trial_id for r in runs] == [3, 2]
    for run in runs:
        run.train_start()
        run.train_end()
    with open_store(tmp_path / "zeus_store.sqlite") as store:
        assert [t.status for t in store.list_trials("nightly")] == ["withdrawn", "completed", "completed"]


def test_a_suggestion_no_run_claims_is_withdrawn_and_its_store_closed_when_dropped(tmp_path, monkeypatch):
    closed = closes_counted(monkeypatch)
    suggested = suggest_batch_size(config(tmp_path))
    assert suggested == 64 and closed == []  # kept open for the run
    del suggested
    gc.collect()
    assert len(closed) == 1
    with open_store(tmp_path / "zeus_store.sqlite") as store:
        (trial,) = store.list_trials("nightly")
    assert (trial.status, trial.info["reason"]) == ("withdrawn", recurring.UNCLAIMED_REASON)


def test_a_suggestion_no_run_claims_is_withdrawn_when_the_process_ends(tmp_path):
    """The process ends before training (or trains with a number of its own): its trial is withdrawn at exit, not
    left running to be marked failed ("process died") by the next open, which counted against the batch size."""
    script = (
        "import json, sys\n"
        "from zeus_callbacks import suggest_batch_size\n"
        "kept = suggest_batch_size(json.loads(sys.argv[1]))\n"  # held until the interpreter exits
        "print(int(kept))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(config(tmp_path))],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},  # this checkout's package
    )
    assert done.returncode == 0 and done.stdout.strip() == "64", done.stderr[-2000:]
    with open_store(tmp_path / "zeus_store.sqlite") as store:
        (trial,) = store.list_trials("nightly")
    assert (trial.status, trial.info["reason"]) == ("withdrawn", recurring.UNCLAIMED_REASON)


def test_a_claimed_suggestion_hands_its_open_store_to_the_run_which_closes_it_once(tmp_path, monkeypatch):
    closed = closes_counted(monkeypatch)
    suggested = suggest_batch_size(config(tmp_path))
    session = EnergySession(config(tmp_path), is_main_process=True)
    assert session.suggest_batch_size(suggested) == 64
    del suggested
    gc.collect()
    assert closed == []  # the run goes on with it
    session.train_start()
    session.train_end()
    assert len(closed) == 1


def test_copies_and_pickles_are_plain_ints_without_the_trial(tmp_path):
    suggested = suggest_batch_size(config(tmp_path))
    for copied in (copy.deepcopy(suggested), copy.copy(suggested), pickle.loads(pickle.dumps(suggested))):
        assert type(copied) is int and copied == 64
    assert suggested.claim("nightly") is not None  # still with the original
