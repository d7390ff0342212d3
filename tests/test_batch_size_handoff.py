"""The hand-off from ``suggest_batch_size()`` to the run: carried by the value returned, no module state."""

from __future__ import annotations

import copy
import gc
import pickle

from zeus_callbacks import suggest_batch_size
from zeus_callbacks.optimizers.batch_size import SuggestedBatchSize
from zeus_callbacks.optimizers.batch_size import controller as recurring
from zeus_callbacks.session import EnergySession
from zeus_callbacks.store import open_store


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


def test_two_suggestions_of_one_job_are_two_trials_each_claimed_by_its_run(tmp_path):
    one, two = suggest_batch_size(config(tmp_path)), suggest_batch_size(config(tmp_path))
    runs = [EnergySession(config(tmp_path), is_main_process=True) for _ in range(2)]
    runs[1].suggest_batch_size(two)
    runs[0].suggest_batch_size(one)
    with open_store(tmp_path / "zeus_store.sqlite") as store:
        ids = [t.trial_id for t in store.list_trials("nightly")]
    assert len(ids) == 2 and [r.batch_size_controller.trial_id for r in runs] == ids
    for run in runs:
        run.train_start()
        run.train_end()


def test_a_suggestion_no_run_claims_closes_its_store(tmp_path, monkeypatch):
    closed = closes_counted(monkeypatch)
    suggested = suggest_batch_size(config(tmp_path))
    assert suggested == 64 and closed == []  # kept open for the run
    del suggested
    gc.collect()
    assert len(closed) == 1


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
