"""Bad runs cannot poison the batch-size bandit (issue 20, item 3).

- a NaN, infinite, zero or negative figure, or a degraded measurement, is recorded as "not an
  observation" (cost None, the reason in ``info["not_observed"]``): later suggestions still
  work and the job's best cost never becomes NaN or 0 — on every store backend;
- a non-finite number is refused at the store boundary (``StoreValueError``) before anything is
  written (the contract test ``test_non_finite_numbers_are_refused_and_nothing_is_written``);
- an arm that fails ``max_failures`` times in a row (an exception such as out of memory, or a
  killed process that the store marks failed) is pruned, with the reason shown by
  ``zeus-callbacks show``; an interrupted run does not count against its arm.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.store_contract import _open, new_location
from zeus_callbacks.cli._cmd_show import show
from zeus_callbacks.config import parse_config
from zeus_callbacks.optimizers.batch_size import BanditSettings, BatchSizeBandit
from zeus_callbacks.optimizers.batch_size._batch_size_controller import BatchSizeController
from zeus_callbacks.optimizers.batch_size._observations import arm_failures, observation_problem
from zeus_callbacks.store import open_store

KINDS = ("sqlite", "json", "rdb-sqlite")
SIZES = (8, 16, 32)


def _cost(batch_size: int) -> float:
    return {8: 120.0, 16: 100.0, 32: 140.0}[batch_size]  # cheapest at 16, the default


def _settings(**kw) -> BanditSettings:
    return BanditSettings(SIZES, 16, **kw)


BAD_FIGURES = {  # case -> (energy_J, time_s, cost, degraded)
    "nan cost": (1.0, 1.0, math.nan, False),
    "inf cost": (1.0, 1.0, math.inf, False),
    "nan energy": (math.nan, 1.0, 50.0, False),
    "zero energy (GPU lost throughout)": (0.0, 10.0, 0.0, False),
    "negative cost": (-1e6, 1.0, -5e5, False),
    "degraded measurement": (1.0, 1.0, 50.0, True),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", list(BAD_FIGURES))
def test_a_bad_run_is_not_an_observation_and_later_runs_go_on(tmp_path, kind, case, record_fault):
    energy_J, time_s, cost, degraded = BAD_FIGURES[case]
    store = _open(kind, new_location(kind, tmp_path))
    bandit = BatchSizeBandit(store, "job", _settings())
    first = bandit.suggest()
    bandit.report(first.trial_id, energy_J=1.0, time_s=1.0, cost=_cost(first.batch_size), converged=True)
    bad = bandit.suggest()
    trial = bandit.report(bad.trial_id, energy_J=energy_J, time_s=time_s, cost=cost, converged=True, degraded=degraded)
    later = []
    for _ in range(4):  # the bandit keeps working after the bad run
        s = bandit.suggest()
        later.append(s.batch_size)
        bandit.report(s.trial_id, energy_J=1.0, time_s=1.0, cost=_cost(s.batch_size), converged=True)
    min_cost = bandit.min_cost
    costs = [t.cost for t in store.list_trials("job") if t.cost is not None]
    store.close()
    ok = (
        trial.cost is None
        and "not_observed" in trial.info
        and min_cost == min(costs) == _cost(16)
        and all(math.isfinite(c) and c > 0 for c in costs)
        and len(later) == 4
    )
    record_fault("bandit input: bad figures", ok)
    assert ok, (trial, min_cost, costs)


def test_observation_problem_names_each_kind_of_bad_figure():
    assert observation_problem(1.0, 1.0, 2.0) is None
    assert "degraded" in observation_problem(1.0, 1.0, 2.0, degraded=True)
    assert "cost is nan" in observation_problem(1.0, 1.0, math.nan)
    assert "energy_J is 0" in observation_problem(0.0, 1.0, 2.0)
    assert "time_s is -1" in observation_problem(1.0, -1.0, 2.0)
    assert "unknown" in observation_problem(None, None, None)
    assert observation_problem(None, None, 3.0) is None  # unknown energy and time are not checked


def test_the_controller_records_a_degraded_run_without_a_cost(tmp_path):
    config = parse_config(
        {
            "job_id": "job",
            "logging": {"log_dir": str(tmp_path)},
            "batch_size": {
                "enabled": True,
                "batch_sizes": list(SIZES),
                "default_batch_size": 16,
                "target": {"metric": "acc", "value": 0.5},
            },
        }
    )
    controller = BatchSizeController(config)
    controller.start(max_power_W=300.0, power_limit_W=None)
    controller.observe({"acc": 0.9})
    trial = controller.finish(5000.0, 20.0, "completed", degraded=True)
    assert trial.status == "completed" and trial.converged and trial.cost is None and trial.energy_J is None
    assert trial.time_s == 20.0 and "degraded" in trial.info["not_observed"]
    with open_store(tmp_path / "zeus_store.sqlite") as store:
        assert BatchSizeBandit(store, "job", _settings()).min_cost is None  # not the best cost


def _recurrences(bandit: BatchSizeBandit, n: int, fails) -> list[int]:
    played = []
    for _ in range(n):
        s = bandit.suggest()
        played.append(s.batch_size)
        if fails(s.batch_size, len(played)):
            bandit.report(
                s.trial_id,
                energy_J=None,
                time_s=None,
                cost=None,
                converged=False,
                status="failed",
                info={"run_status": "failed", "error": "CUDA out of memory"},
            )
        else:
            bandit.report(s.trial_id, energy_J=1.0, time_s=1.0, cost=_cost(s.batch_size), converged=True)
    return played


@pytest.mark.parametrize("kind", KINDS)
def test_an_arm_that_always_runs_out_of_memory_is_pruned(tmp_path, kind, record_fault):
    store = _open(kind, new_location(kind, tmp_path))
    bandit = BatchSizeBandit(store, "job", _settings(max_failures=2))
    played = _recurrences(bandit, 15, lambda b, i: b == 32)
    state = bandit.state()
    store.close()
    # pruning plays 16, then 8, then 32 until it has failed max_failures (2) times, then moves on
    ok = (
        played.count(32) == 2
        and 32 not in state["survivors"]
        and "32" in state["failed_arms"]
        and "CUDA out of memory" in state["failed_arms"]["32"]
    )
    record_fault("bandit input: failing arm", ok)
    assert ok, (played, state.get("failed_arms"))


def test_an_arm_that_starts_failing_during_thompson_sampling_is_pruned(tmp_path, record_fault):
    with open_store(tmp_path / "s.json") as store:
        bandit = BatchSizeBandit(store, "job", _settings(max_failures=3))
        warm = _recurrences(bandit, 8, lambda b, i: False)  # pruning, then Thompson over all three
        assert bandit.state()["phase"] == "thompson"
        played = _recurrences(bandit, 20, lambda b, i: b == 16)  # the cheapest arm breaks
        state = bandit.state()
    ok = played.count(16) == 3 and state["survivors"] == [8, 32] and "failed 3 times" in state["failed_arms"]["16"]
    record_fault("bandit input: failing arm", ok)
    assert ok, (warm, played, state.get("failed_arms"))


def test_interrupted_runs_do_not_count_against_the_arm(tmp_path):
    with open_store(tmp_path / "s.sqlite") as store:
        bandit = BatchSizeBandit(store, "job", _settings(max_failures=1))
        for _ in range(3):
            s = bandit.suggest()
            bandit.report(
                s.trial_id,
                energy_J=None,
                time_s=None,
                cost=None,
                converged=False,
                status="failed",
                info={"run_status": "interrupted"},
            )
        assert s.batch_size == 16 and "failed_arms" not in bandit.state()
        assert arm_failures(store.list_trials("job")) == {}


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("kind", ["sqlite", "json"])
def test_killed_runs_count_and_show_says_why(tmp_path, kind, record_fault):
    path = tmp_path / f"s.{kind}"
    with open_store(path) as store:
        bandit = BatchSizeBandit(store, "job", _settings(max_failures=2))
        first = bandit.suggest()  # 16: converges
        bandit.report(first.trial_id, energy_J=1.0, time_s=1.0, cost=100.0, converged=True)
        for _ in range(2):  # 8: its process is SIGKILLed (host out of memory) twice
            s = bandit.suggest()
            assert s.batch_size == 8
            store.create_trial("job", 8, pid=_dead_pid(), info={"phase": "pruning", "round": 0})
            store.finish_trial(
                s.trial_id,
                status="failed",
                energy_J=None,
                time_s=None,
                cost=None,
                converged=False,
                info={"run_status": "interrupted"},
            )  # does not count
            with open_store(path) as reopened:  # the next open marks the dead one failed
                assert reopened.list_trials("job")[-1].info["reason"] == "process died"
        nxt = bandit.suggest()
        state = bandit.state()
    text, as_json = show(path), show(path, as_json=True)
    ok = (
        nxt.batch_size == 32
        and "8" in state["failed_arms"]
        and "batch size 8 pruned: failed" in text
        and "process died" in text
        and '"failed_arms"' in as_json
    )
    record_fault("bandit input: failing arm", ok)
    assert ok, (nxt, state.get("failed_arms"), text)


OUTCOME = st.tuples(
    st.sampled_from(["completed", "early_stopped", "failed"]),
    st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, math.nan, math.inf])),
    st.booleans(),  # converged
    st.booleans(),  # degraded
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OUTCOME, min_size=1, max_size=8))
def test_no_sequence_of_outcomes_breaks_the_bandit(outcomes):
    with tempfile.TemporaryDirectory() as tmp, open_store(Path(tmp) / "s.json") as store:
        bandit = BatchSizeBandit(store, "job", _settings())
        for status, cost, converged, degraded in outcomes:
            s = bandit.suggest()
            bandit.report(
                s.trial_id, energy_J=cost, time_s=1.0, cost=cost, converged=converged, status=status, degraded=degraded
            )
        bandit.suggest()  # never raises
        min_cost = bandit.min_cost
        costs = [t.cost for t in store.list_trials("job") if t.cost is not None]
    assert min_cost is None or (math.isfinite(min_cost) and min_cost > 0)
    assert all(math.isfinite(c) and c > 0 for c in costs)


def test_a_store_written_with_a_nan_best_cost_reads_as_no_best_cost(tmp_path):
    """A JSON store an older version wrote after a NaN sample (NaN is not JSON, Python wrote it anyway)."""
    path = tmp_path / "old.json"
    with open_store(path) as store:
        bandit = BatchSizeBandit(store, "job", _settings())
        s = bandit.suggest()
        bandit.report(s.trial_id, energy_J=1.0, time_s=1.0, cost=100.0, converged=True)
    path.write_text(path.read_text().replace('"min_cost": 100.0', '"min_cost": NaN'))
    with open_store(path) as store:
        bandit = BatchSizeBandit(store, "job", _settings())
        assert bandit.min_cost is None and bandit.early_stop_threshold() is None
        assert bandit.suggest().batch_size == 8
    assert os.path.exists(path)
