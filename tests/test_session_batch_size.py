"""EnergySession with the batch-size bandit: target, step-granular early stop, trials in the store."""

from __future__ import annotations

import json
import logging

import pytest

from zeus_callbacks import ConfigError, suggest_batch_size
from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.backends.virtual import VirtualGPUBackend
from zeus_callbacks.config import parse_config
from zeus_callbacks.optimizers.batch_size import _batch_size_controller as recurring
from zeus_callbacks.reporting import read_jsonl
from zeus_callbacks.session import EnergySession
from zeus_callbacks.store import open_store

STEP_S = 1.0
MAX_LIMIT_W = 300.0  # A40 trace


def config(tmp_path, **bs) -> dict:
    return {
        "backend": "virtual",
        "job_id": "nightly",
        "logging": {"log_dir": str(tmp_path), "interval_steps": 5},
        "batch_size": {
            "enabled": True,
            "batch_sizes": [32, 64, 128],
            "default_batch_size": 64,
            "target": {"metric": "val/acc", "value": 0.8, "direction": "max"},
            **bs,
        },
    }


def new_run(tmp_path, name: str, **bs):
    clock = ManualClock(1000.0)
    backend = VirtualGPUBackend(clock=clock, noise_W=0.0, read_only=True, sample_period_s=0.1)
    session = EnergySession(config(tmp_path, **bs), backend=backend, is_main_process=True)
    return session, backend, clock


def step(session, clock, i):
    session.step_start(i)
    clock.advance(STEP_S)
    session.sampler.poll_once()
    return session.step_end(i)


def test_target_stop_then_step_granular_early_stop(tmp_path):
    session, backend, clock = new_run(tmp_path, "one")
    assert session.suggest_batch_size() == 64 and session.suggest_batch_size() == 64
    session.train_start(run_name="one")
    power_W = backend.true_power_W(0)
    for i in range(10):
        assert not step(session, clock, i).stop_training
    decision = session.evaluate({"val/acc": 0.85, "energy/step_J": 1.0})
    assert decision.stop_training and "target val/acc=0.85 reached" in decision.reason
    summary = session.train_end()
    cost1 = 0.5 * summary.energy_J + 0.5 * MAX_LIMIT_W * summary.time_s
    assert summary.energy_J == pytest.approx(power_W * 10 * STEP_S, rel=1e-3)
    with open_store(tmp_path / "zeus_store.sqlite") as store:
        (trial,) = store.list_trials("nightly")
        assert (trial.batch_size, trial.status, trial.converged) == (64, "completed", True)
        assert trial.cost == pytest.approx(cost1) and trial.energy_J == summary.energy_J
        assert trial.power_limit_W == MAX_LIMIT_W
    assert [r for r in read_jsonl(summary.jsonl_path) if r["event"] == "trial"][0]["status"] == "completed"

    # Second recurrence: pruning goes down to 32; its cost passes 2 x cost1 at ~20 steps
    # (prune_cost_ratio off: while pruning, it would otherwise lower the factor to 1.3).
    session, backend, clock = new_run(tmp_path, "two", prune_cost_ratio=None)
    session.train_start(run_name="two")
    assert session.suggest_batch_size() == 32
    per_step_cost = 0.5 * power_W * STEP_S + 0.5 * MAX_LIMIT_W * STEP_S
    expected_stop = int(2 * cost1 // per_step_cost)  # the step whose end first exceeds the threshold
    decisions = [step(session, clock, i) for i in range(expected_stop + 3)]
    first_stop = next(i for i, d in enumerate(decisions) if d.stop_training)
    assert abs(first_stop - expected_stop) <= 1
    assert "exceeds beta_knob 2 x best cost" in decisions[first_stop].reason  # no pruning factor: beta_knob's
    session.evaluate({"val/acc": 0.5})  # the evaluation after the stop misses the target: not converged
    summary = session.train_end()
    with open_store(tmp_path / "zeus_store.sqlite") as store:
        trial = store.list_trials("nightly")[-1]
        assert (trial.batch_size, trial.status, trial.converged) == (32, "early_stopped", False)
        assert trial.info["stop_reason"].startswith("cost")
        assert store.get_bandit("nightly").state["min_cost"] == pytest.approx(cost1)
    events = [r["event"] for r in read_jsonl(summary.jsonl_path)]
    assert events.count("batch_size") == 1 and events.count("trial") == 1

    # Third: 32 did not converge, so the downward direction ends; pruning goes up to 128.
    session, _, _ = new_run(tmp_path, "three")
    assert session.suggest_batch_size() == 128


def test_cost_stop_then_target_reached_at_the_final_evaluation_counts_as_converged(tmp_path):
    # Issue 26: a run stopped on cost, then validated once more as the framework ends training
    # (Lightning validates after should_stop), reaches the target there. It converged: the trial
    # says so in the SQLite store, with the stop reason kept, and its batch size survives pruning.
    session, _, clock = new_run(tmp_path, "one")
    session.train_start(run_name="one")
    for i in range(10):
        step(session, clock, i)
    assert session.evaluate({"val/acc": 0.85}).stop_training  # 64 converges: the best cost
    session.train_end()

    session, _, clock = new_run(tmp_path, "two", prune_cost_ratio=None)  # beta_knob 2 stops it at ~2x
    session.train_start(run_name="two")
    assert session.suggest_batch_size() == 32
    stopped = next(i for i in range(40) if step(session, clock, i).stop_training)
    reason = session.evaluate({"val/acc": 0.95})  # after the stop: the target (0.8) is reached
    assert reason.stop_training and "exceeds beta_knob" in reason.reason  # the cost stop's reason stands
    session.train_end()
    with open_store(tmp_path / "zeus_store.sqlite") as store:
        trial = store.list_trials("nightly")[-1]
        assert (trial.batch_size, trial.status, trial.converged) == (32, "early_stopped", True)
        assert trial.info["stop_reason"].startswith("cost") and stopped > 10

    # Pruning goes up from the start (no size below 32): 128 converges and ends the round.
    session, _, clock = new_run(tmp_path, "three", prune_cost_ratio=None)
    session.train_start(run_name="three")
    assert session.suggest_batch_size() == 128
    for i in range(10):
        step(session, clock, i)
    session.evaluate({"val/acc": 0.85})
    session.train_end()
    with open_store(tmp_path / "zeus_store.sqlite") as store:
        state = store.get_bandit("nightly").state
    assert 32 in state["survivors"]  # converged after its stop: still a candidate


def test_pruning_candidate_stop_names_the_pruning_ratio(tmp_path):
    # Recurrence 1 converges at the default 64; recurrence 2 probes 32, the first size below the
    # start, whose stop factor is prune_cost_ratio_no_descent (1.3 < beta_knob 2): the reason says so.
    session, backend, clock = new_run(tmp_path, "one")
    session.train_start(run_name="one")
    for i in range(10):
        step(session, clock, i)
    assert session.evaluate({"val/acc": 0.85}).stop_training
    session.train_end()
    with open_store(tmp_path / "zeus_store.sqlite") as store:
        cost1 = store.list_trials("nightly")[0].cost
    session, backend, clock = new_run(tmp_path, "two")
    session.train_start(run_name="two")
    assert session.suggest_batch_size() == 32
    decisions = [step(session, clock, i) for i in range(30)]
    reason = next(d.reason for d in decisions if d.stop_training)
    assert f"exceeds prune_cost_ratio_no_descent 1.3 x best cost = {1.3 * cost1:.4g}" in reason
    assert "beta_knob" not in reason and "pruning candidate" in reason
    session.train_end()
    with open_store(tmp_path / "zeus_store.sqlite") as store:
        trial = store.list_trials("nightly")[-1]
    assert (trial.batch_size, trial.status) == (32, "early_stopped") and trial.info["stop_reason"] == reason


def test_a_target_no_run_reaches_holds_the_default_and_says_how_close_runs_came(tmp_path, caplog):
    """Issue 30: no run had ever reached the target, yet each non-converged run moved the pruning on, and Thompson
    sampling then settled on the cheapest size that never converged. Now the default is held, with a warning at
    each suggestion naming the metric, the target and the best value seen (kept in info.best_target_value)."""

    def recurrence(name: str, values: list[float], expected: int) -> str:
        session, _, clock = new_run(tmp_path, name)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="zeus_callbacks"):
            assert session.suggest_batch_size() == expected
        session.train_start(run_name=name)
        for i, value in enumerate(values):
            step(session, clock, i)
            session.evaluate({"val/acc": value})
        session.train_end()
        return caplog.text

    assert "no run has reached the target" not in recurrence("one", [0.6, 0.7, 0.65], 64)  # nothing to say yet
    said = recurrence("two", [0.75], 64)  # held: not 32, the next size down
    assert "no run has reached the target val/acc >= 0.8 yet; the best value seen is 0.7 " in said
    assert "holds batch size 64 (pruning)" in said
    said = recurrence("three", [0.75, 0.85], 64)  # reached at its second evaluation
    assert "the best value seen is 0.75 " in said
    assert "no run has reached the target" not in recurrence("four", [0.9], 32)  # the pruning goes on, down
    with open_store(tmp_path / "zeus_store.sqlite") as store:
        trials = store.list_trials("nightly")
    assert [(t.batch_size, t.converged, t.info["best_target_value"]) for t in trials] == [
        (64, False, 0.7), (64, False, 0.75), (64, True, 0.85), (32, True, 0.9),
    ]  # fmt: skip


def test_failed_run_records_a_failed_trial_and_module_suggestion_is_claimed(tmp_path):
    cfg = config(tmp_path)
    suggested = suggest_batch_size(cfg)
    assert suggested == 64
    session, _, clock = new_run(tmp_path, "x")
    assert session.suggest_batch_size(suggested) == 64  # before train_start, which would suggest anew
    session.train_start(run_name="x")
    step(session, clock, 0)
    session.use_batch_size(128)
    session.exception(RuntimeError("boom"))
    with open_store(tmp_path / "zeus_store.sqlite") as store:
        (trial,) = store.list_trials("nightly")  # one trial: the session claimed the module's suggestion
        assert (trial.status, trial.batch_size, trial.converged) == ("failed", 128, False)
    # `show` says the run failed and that it counts against its batch size (a tester found no word)
    from zeus_callbacks.cli._cmd_show import show

    (shown,) = json.loads(show(tmp_path / "zeus_store.sqlite", as_json=True))["jobs"][0]["trials"]
    assert shown["note"].startswith("the run failed") and "counted against its batch size" in shown["note"]


def test_show_says_an_interrupted_run_does_not_count_against_its_batch_size(tmp_path):
    session, _, clock = new_run(tmp_path, "x")
    session.train_start(run_name="x")
    step(session, clock, 0)
    session.exception(KeyboardInterrupt())
    from zeus_callbacks.cli._cmd_show import show

    (shown,) = json.loads(show(tmp_path / "zeus_store.sqlite", as_json=True))["jobs"][0]["trials"]
    assert shown["status"] == "failed"
    assert shown["note"].startswith("the run was interrupted") and "not counted against" in shown["note"]


def test_disabled_bandit_changes_nothing(tmp_path):
    session = EnergySession({"backend": "virtual"}, is_main_process=True)
    assert session.suggest_batch_size() is None and session.batch_size_controller is None
    with pytest.raises(ValueError, match="default_batch_size"):
        suggest_batch_size({"backend": "virtual"})
    assert suggest_batch_size({"batch_size": {"default_batch_size": 16}}) == 16


def test_suggest_batch_size_with_the_bandit_off_names_the_file_and_the_keys_to_set(tmp_path):
    # Issue 26: a plain ValueError that named neither the file nor what to write in it.
    path = tmp_path / "zeus.yaml"
    path.write_text("backend: virtual\njob_id: nightly\n")
    with pytest.raises(ConfigError) as caught:
        suggest_batch_size(path)
    message = str(caught.value)
    assert str(path) in message
    for key in ("batch_size.enabled: true", "batch_size.batch_sizes", "batch_size.default_batch_size"):
        assert key in message


def test_corrupt_store_fails_before_training_and_stops_the_sampler(tmp_path):
    from zeus_callbacks.store import StoreCorruptError

    (tmp_path / "zeus_store.sqlite").write_bytes(b"not a database at all" * 50)
    session, _, _ = new_run(tmp_path, "bad")
    with pytest.raises(StoreCorruptError, match="zeus_store.sqlite"):
        session.suggest_batch_size()
    with pytest.raises(StoreCorruptError, match="zeus_store.sqlite"):
        session.train_start(run_name="bad")
    assert not session.started and session.summary.status == "failed"


def test_exploring_thompson_run_stops_at_the_best_arms_bound_and_is_censored(tmp_path):
    from zeus_callbacks.config import parse_config
    from zeus_callbacks.optimizers.batch_size import BanditSettings, BatchSizeBandit, Suggestion

    cfg = parse_config(config(tmp_path))
    with recurring.open_job_store(cfg) as store:
        bandit = BatchSizeBandit(store, "nightly", BanditSettings.from_config(cfg.batch_size))
        for b, c in ((64, 100.0), (32, 140.0), (128, 110.0)):  # pruning: 64, down 32, up 128
            s = bandit.suggest()
            assert s.batch_size == b
            bandit.report(s.trial_id, energy_J=1, time_s=1, cost=c, converged=True)
        assert bandit.state()["phase"] == "thompson"
        bound = bandit.explore_stop_threshold(128)  # 64 has the lowest posterior mean: 128 explores
        assert bound is not None and bandit.explore_stop_threshold(64) is None
        trial = store.create_trial("nightly", 128, info={"phase": "thompson", "round": 1})
    made = recurring._Made("nightly", 128, Suggestion(128, trial.trial_id, "thompson", 1))
    controller = recurring.BatchSizeController(cfg)
    assert controller.suggest(recurring.SuggestedBatchSize(made)) == 128
    controller.start(MAX_LIMIT_W, MAX_LIMIT_W)
    # The explore bound is below beta_knob x the best converged cost (2 x 100): it is the one in force.
    assert controller.threshold == pytest.approx(bound) and bound < 200.0 and controller.rule.explore
    energy_J = 1.0  # a run always draws some energy (0 J is not a measurement: observation_problem)
    # cost 0.5 E + 0.5 x 300 W x t is bound at t = 2 (bound - 0.5 E) / 300
    time_s = 2 * (bound - 0.5 * energy_J) / MAX_LIMIT_W
    assert time_s > 0.6  # checks are at least MIN_CHECK_INTERVAL_S = 0.5 s apart
    assert controller.check(energy_J, time_s - 0.55) is None
    reason = controller.check(energy_J, time_s + 0.01)
    assert reason is not None and "exploring run stopped" in reason
    finished = controller.finish(energy_J, time_s + 0.01, "completed")
    assert (finished.status, finished.converged) == ("early_stopped", False)
    with recurring.open_job_store(cfg) as store:
        bandit = BatchSizeBandit(store, "nightly", BanditSettings.from_config(cfg.batch_size))
        post = bandit.posteriors([128])[128]
        as_cut = bandit.posteriors([128], bandit.observations())[128]
    assert post.n == 2.0 and post.mean > as_cut.mean  # counted above the cut, not at it


@pytest.mark.parametrize(
    ("evaluations", "said"),
    [
        ([{"val_acc": 0.9, "val/loss": 0.1}], "its evaluations reported val/loss, val_acc"),
        ([], "no evaluation reported any metric"),
    ],
    ids=["misnamed", "no-evaluation"],
)
def test_a_run_that_never_reports_the_target_metric_says_so_once_at_its_end(tmp_path, caplog, evaluations, said):
    # An outside tester: examples/fabric_loop.py evaluated outside its run, so every trial was recorded not converged
    # (and its arm pruned) though val/acc reached the target, without a word. Any adapter can miss the metric.
    session, _, clock = new_run(tmp_path, "one")
    session.train_start(run_name="one")
    with caplog.at_level(logging.WARNING, logger="zeus_callbacks"):
        for i in range(3):
            step(session, clock, i)
        for metrics in evaluations * 2:
            session.evaluate(metrics)
        session.train_end()
    (warning,) = [r.getMessage() for r in caplog.records if "never reported" in r.getMessage()]
    assert f"batch_size.target names metric val/acc, but this run never reported it ({said})" in warning
    assert "trial 1 (batch size 64) is recorded as not converged" in warning
    with open_store(tmp_path / "zeus_store.sqlite") as store:
        (trial,) = store.list_trials("nightly")
    assert (trial.status, trial.converged) == ("completed", False)


def test_a_target_metric_reported_but_not_reached_or_no_target_warns_nothing(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="zeus_callbacks"):
        for name, bs in (("missed", {}), ("no-target", {"target": None})):
            session, _, clock = new_run(tmp_path / name, name, **bs)
            session.train_start(run_name=name)
            step(session, clock, 0)
            session.evaluate({"val/acc": 0.1})
            session.train_end()
    assert "never reported" not in caplog.text


def test_the_store_work_of_train_start_lies_before_the_run_window(tmp_path, monkeypatch):
    """D2: whatever the bandit's store work at train start takes (here 30 s of a held store, on the manual
    clock) is in neither the run's time and energy nor the trial's; the ``batch_size`` record says it."""
    wait_s, steps = 30.0, 5
    opened = recurring.BatchSizeController.open_trial

    def run(name: str, store_wait_s: float):
        session, backend, clock = new_run(tmp_path / name, name)

        def slow_open(self) -> None:
            first = not self._opened  # a later call does nothing (and waits for nothing)
            opened(self)
            if first:
                clock.advance(store_wait_s)  # the store answered only now

        monkeypatch.setattr(recurring.BatchSizeController, "open_trial", slow_open)
        session.train_start(run_name=name)
        for i in range(steps):
            step(session, clock, i)
        summary = session.train_end()
        backend.close()
        (record,) = [r for r in read_jsonl(tmp_path / name / f"{name}.jsonl") if r["event"] == "batch_size"]
        with recurring.open_job_store(session.config) as store:
            (trial,) = store.list_trials("nightly")
        return summary, trial, record

    free = run("free", 0.0)
    held = run("held", wait_s)
    for (summary, trial, record), store_wait_s in ((free, 0.0), (held, wait_s)):
        assert summary.time_s == pytest.approx(steps * STEP_S)
        assert trial.time_s == pytest.approx(steps * STEP_S) and trial.energy_J == pytest.approx(summary.energy_J)
        assert record["store_open_s"] == pytest.approx(store_wait_s)
    assert held[1].energy_J == pytest.approx(free[1].energy_J) and held[1].cost == pytest.approx(free[1].cost)


def test_start_after_open_trial_uses_no_store(tmp_path):
    """The controller's store work is all in open_trial(): start() then only fixes the cost and threshold."""
    controller = recurring.BatchSizeController(parse_config(config(tmp_path)))
    controller.open_trial()

    def no_store(fn):
        raise AssertionError("start() used the store")

    controller._with_bandit = no_store  # type: ignore[method-assign]
    controller.start(MAX_LIMIT_W, MAX_LIMIT_W)
    assert controller.cost is not None and controller.batch_size == 64
    controller.run_store.close()


def test_a_run_resumed_without_an_energy_figure_closes_its_trial_unobserved_not_left_running(tmp_path, caplog, capsys):
    # A checkpoint saved before the first power sample has no energy figure; the run resumed from it has
    # none either. Its trial is recorded with its status and no cost (not an observation): left
    # `running` (as before), the next open marked it failed and two such runs pruned the batch size.
    first, _, clock = new_run(tmp_path, "first")
    first.train_start(run_name="first")
    first.epoch_start(0)
    for i in range(4):
        first.step_start(i)
        clock.advance(0.003)
        first.sampler.poll_once()
        first.step_end(i)
    state = first.state_dict()
    assert state["energy_J"] is None
    for i in range(4, 14):  # the first run goes on and reaches the target: the job's best cost
        step(first, clock, i)
    first.evaluate({"val/acc": 0.85})
    first.train_end()

    second, _, clock = new_run(tmp_path, "second")
    second.load_state_dict(state)
    second.train_start(run_name="second")
    for i in range(4, 14):
        step(second, clock, i)
    second.evaluate({"val/acc": 0.85})
    with caplog.at_level(logging.WARNING, logger="zeus_callbacks"):
        summary = second.train_end()
    assert summary.energy_J != summary.energy_J  # NaN: unknown
    assert "batch-size trial is recorded without a cost" in caplog.text
    with open_store(tmp_path / "zeus_store.sqlite") as store:  # a new open marks no trial failed
        trials = store.list_trials("nightly")
        assert len(trials) == 2
        resumed = trials[-1]
        assert (resumed.status, resumed.converged, resumed.energy_J, resumed.cost) == ("completed", True, None, None)
        assert "power sample" in resumed.info["energy_note"] and "cost is unknown" in resumed.info["not_observed"]
        assert resumed.time_s is not None and resumed.time_s > 10 * STEP_S
        assert all(t.status != "failed" for t in trials)
        # Not an observation: the bandit's best cost stays the first run's.
        assert store.get_bandit("nightly").state["min_cost"] == pytest.approx(trials[0].cost)
    (record,) = [r for r in read_jsonl(summary.jsonl_path) if r["event"] == "trial"]
    assert record["status"] == "completed" and record["cost"] is None
    # `show` says why the trial has no cost, and counts it in no arm's measured trials.
    from zeus_callbacks.cli import main

    store_path = str(tmp_path / "zeus_store.sqlite")
    assert main(["show", store_path, "nightly", "--json"]) == 0
    job = json.loads(capsys.readouterr().out)["jobs"][0]
    shown = {t["trial_id"]: t for t in job["trials"]}
    assert shown[resumed.trial_id]["note"] == f"{resumed.info['energy_note']}; {resumed.info['not_observed']}"
    assert shown[trials[0].trial_id]["note"] is None
    (arm,) = [a for a in job["arms"] if a["batch_size"] == resumed.batch_size]
    assert arm["measured_trials"] == sum(t.batch_size == resumed.batch_size for t in trials) - 1, (arm, trials)
    assert main(["show", store_path, "nightly"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # the note is wrapped to the console
    assert f"trial {resumed.trial_id}: {resumed.info['energy_note']}" in text
