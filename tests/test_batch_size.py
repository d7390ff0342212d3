"""The batch-size bandit: posterior maths by hand, pruning order, early stop, seeded determinism."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
from scipy import stats

from zeus_callbacks.optimizers.batch_size import (
    ArmPosterior,
    BanditSettings,
    BatchSizeBandit,
    eliminate_arms,
    gaussian_posterior,
    gaussian_tail_mean,
    observation_weights,
    prior_from_costs,
    satisficing_choice,
    scaled_learning_rate,
)
from zeus_callbacks.optimizers.batch_size._observations import arm_failures
from zeus_callbacks.store import open_store

SIZES = (8, 16, 32, 64, 128, 256)


def cost_of(b: int) -> float:
    return 100.0 * (abs(math.log2(b) - 5) + 1)  # cheapest at 32


@pytest.fixture(params=["sqlite", "json"])
def store(request, tmp_path):
    s = open_store(tmp_path / f"store.{request.param}", backend=request.param)
    yield s
    s.close()


def run(bandit: BatchSizeBandit, converges=lambda b: True, cost=cost_of) -> int:
    s = bandit.suggest()
    ok = converges(s.batch_size)
    bandit.report(s.trial_id, energy_J=1.0, time_s=1.0, cost=cost(s.batch_size), converged=ok)
    return s.batch_size


def test_posterior_matches_hand_computation():
    # Prior: mean of all costs 10, 12, 20 → μ0 = 14, τ0 = 1 / (0.5·14)² = 1/49.
    mu0, tau0 = prior_from_costs([10.0, 12.0, 20.0], prior_std_rel=0.5)
    assert mu0 == 14.0 and tau0 == pytest.approx(1 / 49)
    # Arm with 10, 12: x̄ = 11, s² = 2, floor (0.05·11)² = 0.3025 < 2 → σ² = 2.
    # τn = 1/49 + 2/2 = 50/49; μn = (14/49 + 11) / (50/49) = (14 + 539) / 50 = 11.06.
    mean, precision, var = gaussian_posterior([10.0, 12.0], [1, 1], mu0, tau0, 0.05)
    assert var == pytest.approx(2.0) and precision == pytest.approx(50 / 49) and mean == pytest.approx(11.06)
    # Identical costs: s² = 0, the floor (0.1·20)² = 4 keeps the precision finite: τn = 1/49 + 3/4.
    mean, precision, var = gaussian_posterior([20.0] * 3, [1, 1, 1], mu0, tau0, 0.1)
    assert var == pytest.approx(4.0) and precision == pytest.approx(1 / 49 + 0.75)
    assert mean == pytest.approx((14 / 49 + 0.75 * 20) / (1 / 49 + 0.75))
    # No observation: the prior itself.
    assert gaussian_posterior([], [], mu0, tau0, 0.05)[:2] == (mu0, tau0)
    # Weighted: weights 1 and 0.5 on 10 and 16: n = 1.5, x̄ = 12, s² = (4 + 0.5·16)/0.5 = 24.
    mean, precision, var = gaussian_posterior([10.0, 16.0], [1.0, 0.5], mu0, tau0, 0.05)
    assert var == pytest.approx(24.0) and precision == pytest.approx(1 / 49 + 1.5 / 24)


def test_window_and_discount_weights():
    assert observation_weights([0, 3, 7], None, None).tolist() == [1, 1, 1]
    assert observation_weights([0, 3, 7], 2, None).tolist() == [1, 1, 0]
    assert observation_weights([5, 0, 7], None, 0.5) == pytest.approx([0.5**5, 1, 0.5**7])
    assert observation_weights([5, 0, 7], 1, 0.5) == pytest.approx([0, 1, 0])


def test_learning_rate_scaling():
    assert scaled_learning_rate(0.1, 256, 64, "none") == 0.1
    assert scaled_learning_rate(0.1, 256, 64, "linear") == pytest.approx(0.4)
    assert scaled_learning_rate(0.1, 256, 64, "sqrt") == pytest.approx(0.2)
    with pytest.raises(ValueError):
        scaled_learning_rate(0.1, 1, 1, "cubic")


def test_settings_validate():
    with pytest.raises(ValueError, match="default_batch_size"):
        BanditSettings((8, 16), 32)
    with pytest.raises(ValueError, match="beta_knob"):
        BanditSettings((8, 16), 8, beta_knob=1.0)


def test_pruning_order_down_then_up_stopping_at_first_failure(store):
    bandit = BatchSizeBandit(store, "job", BanditSettings(SIZES, 64, pruning_rounds=2, prune_cost_ratio=None))
    converges = {16, 32, 64, 128}.__contains__
    order = [run(bandit, converges) for _ in range(10)]
    # Round 0 from the default 64: down 32, 16, 8 (fails: stop), up 128, 256 (fails: stop).
    # Round 1 from the cheapest converged (32) over survivors {16, 32, 64, 128}: down 16, up 64, 128.
    assert order == [64, 32, 16, 8, 128, 256, 32, 16, 64, 128]
    state = bandit.state()
    assert state["phase"] == "thompson" and state["survivors"] == [16, 32, 64, 128]
    arms = store.get_bandit("job").arms
    assert arms[8]["pruned"] and arms[256]["pruned"] and not arms[32]["pruned"]
    # Thompson sampling only ever picks survivors, and mostly the cheapest.
    picks = [run(bandit, converges) for _ in range(30)]
    assert set(picks) <= {16, 32, 64, 128} and picks.count(32) > 15


def test_pruning_also_ends_a_direction_when_cost_rises(store):
    # Costs V-shaped around 32 (cost_of: 100 at 32, 200 at 16 and 64, 300 at 8 and 128):
    # down from 64, 32 is the cheapest; 16 costs 2x > 1.5x the cheapest: the direction ends at
    # 16 (it converged, so it survives) and 8 is never tried; up from 64, 128 costs 3x: ends too.
    bandit = BatchSizeBandit(store, "job", BanditSettings(SIZES, 64, pruning_rounds=1, prune_cost_ratio=1.5))
    order = [run(bandit) for _ in range(4)]
    assert order == [64, 32, 16, 128]
    assert bandit.state()["phase"] == "thompson" and bandit.state()["survivors"] == [16, 32, 64, 128]


def test_failed_trials_neither_count_nor_move_pruning(store):
    bandit = BatchSizeBandit(store, "job", BanditSettings(SIZES, 64))
    s = bandit.suggest()
    bandit.report(s.trial_id, energy_J=None, time_s=None, cost=None, converged=False, status="failed")
    assert bandit.suggest().batch_size == 64 and bandit.observations() == {}


@pytest.mark.parametrize("used", [None, 32])
def test_a_trial_that_is_no_observation_is_named_by_its_batch_size(store, caplog, used):
    # The warning said "batch size (suggested)" where the run trained at the suggestion, not its size.
    bandit = BatchSizeBandit(store, "job", BanditSettings(SIZES, 64))
    s = bandit.suggest()
    with caplog.at_level(logging.WARNING, logger="zeus_callbacks"):
        bandit.report(s.trial_id, energy_J=math.nan, time_s=10.0, cost=None, converged=False, batch_size=used)
    (warning,) = [r.getMessage() for r in caplog.records if "not an observation" in r.getMessage()]
    assert f"trial {s.trial_id} is not an observation of batch size {used or 64}: " in warning
    assert "(suggested)" not in warning


def test_a_failed_run_reporting_a_negative_figure_stores_it_as_unknown(store):
    # The store refuses a negative energy or time (it could not have been measured): the report keeps the
    # failure on record with the figure unknown, rather than raising on the failed run's way out
    bandit = BatchSizeBandit(store, "job", BanditSettings(SIZES, 64))
    s = bandit.suggest()
    bandit.report(s.trial_id, energy_J=-5.0, time_s=-1.0, cost=None, converged=False, status="failed")
    (trial,) = store.list_trials("job")
    assert trial.status == "failed" and trial.energy_J is None and trial.time_s is None


def test_withdrawn_trials_neither_count_as_failures_nor_move_pruning(store):
    """Issue 30: a suggestion no run claimed (withdrawn) is not a failure of its batch size: failed, withdrawn, failed
    is two failures in a row (max_failures 2), and a withdrawn pruning candidate is suggested again."""
    from zeus_callbacks.optimizers.batch_size._batch_size_controller import withdraw_suggestion

    bandit = BatchSizeBandit(store, "job", BanditSettings(SIZES, 64))
    s = bandit.suggest()
    assert withdraw_suggestion(store, s.trial_id, "not claimed").status == "withdrawn"
    assert withdraw_suggestion(store, s.trial_id, "again") is None  # not running any more: left as it is
    assert bandit.suggest().batch_size == 64 and bandit.observations() == {}
    for trial in store.list_trials("job", status="running"):
        store.finish_trial(trial.trial_id, status="failed", energy_J=None, time_s=None, cost=None, converged=False)
    withdraw_suggestion(store, bandit.suggest().trial_id, "not claimed")
    assert arm_failures(store.list_trials("job")) == {64: (1, "the run failed")}  # the withdrawn one is skipped
    s = bandit.suggest()
    bandit.report(s.trial_id, energy_J=None, time_s=None, cost=None, converged=False, status="failed")
    assert arm_failures(store.list_trials("job")) == {64: (2, "the run failed")}
    assert bandit.suggest().batch_size == 32  # 64 pruned after two failures in a row: the pruning moved on
    assert "64" in bandit.state()["failed_arms"]


OOM = {"run_status": "failed", "error": "RuntimeError: CUDA out of memory"}


def fail(bandit: BatchSizeBandit, info: dict | None = None) -> int:
    """One recurrence whose run raised (``info``: what the session stores with a failed trial)."""
    s = bandit.suggest()
    bandit.report(s.trial_id, energy_J=None, time_s=None, cost=None, converged=False, status="failed", info=info)
    return s.batch_size


def test_a_batch_size_is_pruned_as_soon_as_its_last_allowed_failure_is_recorded(store):
    """Outside tester: a size that failed max_failures times was pruned only when the next run drew its suggestion,
    so the stored state (what `show` prints) called it live in between. The failure's report prunes it now, with
    the job's own max_failures, and the next suggestion sees the same state."""
    bandit = BatchSizeBandit(store, "job", BanditSettings(SIZES, 64))
    assert [fail(bandit, OOM) for _ in range(2)] == [64, 64]  # max_failures 2
    state = bandit.state()  # read before any other suggestion
    assert state["failed_arms"] == {"64": "failed 2 times in a row (last: RuntimeError: CUDA out of memory)"}
    assert 64 not in state["survivors"] and state["candidate"] == 32  # a failing candidate: the pruning moved on
    assert store.get_bandit("job").arms[64]["pruned"]
    assert bandit.suggest().batch_size == 32 and bandit.state()["failed_arms"] == state["failed_arms"]

    patient = BatchSizeBandit(store, "patient", BanditSettings(SIZES, 64, max_failures=3))
    assert [fail(patient, OOM) for _ in range(2)] == [64, 64]
    assert "failed_arms" not in patient.state() and 64 in patient.state()["survivors"]  # the job's limit, not 2
    fail(patient, OOM)
    assert "failed 3 times in a row" in patient.state()["failed_arms"]["64"]


def test_while_no_run_reached_the_target_the_hint_names_the_failure_of_runs_that_crashed(store, caplog):
    """Outside tester: runs that crashed before any evaluation were told "no run reported the metric at all: check
    its name". The hint names the failure then; a run that finished without the metric still gets the name hint."""
    target = {"target_metric": "val/acc", "target_value": 0.9, "target_direction": "max"}
    bandit = BatchSizeBandit(store, "job", BanditSettings(SIZES, 64, max_failures=None, **target))

    def hint() -> str:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="zeus_callbacks"):
            s = bandit.suggest()
        (warning,) = [r.getMessage() for r in caplog.records if "no run has reached the target" in r.getMessage()]
        assert s.batch_size == 64  # held: no run has reached the target
        return warning

    fail(bandit, OOM)
    fail(bandit, {"run_status": "failed", "error": "ValueError: bad shape"})
    warning = hint()
    assert "the runs failed before any evaluation reported it (last: ValueError: bad shape)" in warning
    assert "check its name" not in warning
    s = store.list_trials("job", status="running")[-1]
    bandit.report(s.trial_id, energy_J=1.0, time_s=1.0, cost=cost_of(64), converged=False)  # finished, no metric
    assert "no run reported the metric at all: check its name" in hint()


def test_while_no_run_ever_reached_the_target_pruning_holds_its_start(store, caplog):
    """Issue 30: with a target no run reaches, every candidate failed to converge, every direction ended at once,
    and Thompson sampling settled on the cheapest size that never converged. The pruning holds its start now,
    warning at each suggestion; without a target (no run ever converges) the pruning moves on as before."""
    target = {"target_metric": "val/loss", "target_value": 0.1, "target_direction": "min"}
    bandit = BatchSizeBandit(store, "job", BanditSettings(SIZES, 64, **target))
    assert bandit.settings.has_target and not BanditSettings(SIZES, 64).has_target
    for loss in (0.5, 0.3, 0.4, 0.35):
        with caplog.at_level(logging.WARNING, logger="zeus_callbacks"):
            s = bandit.suggest()
        assert (s.batch_size, s.phase) == (64, "pruning")
        bandit.report(
            s.trial_id, energy_J=1.0, time_s=1.0, cost=cost_of(64), converged=False, info={"best_target_value": loss}
        )
    warnings = [r.getMessage() for r in caplog.records if "no run has reached the target" in r.getMessage()]
    assert len(warnings) == 3  # once per suggestion after the first run, none before it
    assert "val/loss <= 0.1 yet; the best value seen is 0.3 " in warnings[-1]  # the lowest: a loss
    assert bandit.state()["round_results"] == {}  # nothing recorded: no direction ended
    s = bandit.suggest()
    bandit.report(s.trial_id, energy_J=1.0, time_s=1.0, cost=cost_of(64), converged=True)
    assert bandit.suggest().batch_size == 32  # a run reached the target: the pruning goes down from the start

    untargeted = BatchSizeBandit(store, "other", BanditSettings(SIZES, 64))
    assert [run(untargeted, converges=lambda b: False) for _ in range(3)] == [64, 32, 128]


def test_min_cost_only_from_converged_and_early_stop_threshold(store):
    bandit = BatchSizeBandit(store, "job", BanditSettings(SIZES, 64, beta_knob=2.0, prune_cost_ratio=None))
    assert bandit.early_stop_threshold() is None
    s = bandit.suggest()  # 64
    bandit.report(s.trial_id, energy_J=1, time_s=1, cost=50.0, converged=False)  # not converged: no min_cost
    assert bandit.min_cost is None
    s = bandit.suggest()  # 32
    bandit.report(s.trial_id, energy_J=1, time_s=1, cost=300.0, converged=True)
    assert bandit.min_cost == 300.0 and bandit.early_stop_threshold() == 600.0
    s = bandit.suggest()  # 16
    bandit.report(s.trial_id, energy_J=1, time_s=1, cost=40.0, converged=False, status="early_stopped")
    assert bandit.min_cost == 300.0  # an early-stopped run that did not reach the target never sets min_cost
    s = bandit.suggest()  # the early stop ended the downward direction: 128
    assert s.batch_size == 128


def test_identical_rewards_do_not_freeze_an_arm(store):
    # Two arms, each observed twice with identical costs: with Zeus's 1/var precision the
    # arms' precisions are infinite and sampling is deterministic; here both keep a spread.
    bandit = BatchSizeBandit(store, "job", BanditSettings((32, 64), 32, pruning_rounds=1))
    for _ in range(2):
        for b, c in ((32, 100.0), (64, 103.0)):
            t = store.create_trial("job", b)
            store.finish_trial(t.trial_id, status="completed", energy_J=1, time_s=1, cost=c, converged=True)
    posts = bandit.posteriors([32, 64])
    assert all(math.isfinite(p.precision) and p.std > 1.0 for p in posts.values())


def test_seeded_determinism_across_a_store_round_trip(tmp_path):
    def sequence(path, reopen_every: int | None) -> list[int]:
        settings = BanditSettings(SIZES, 64, seed=7, pruning_rounds=1)
        store = open_store(path)
        picks = []
        rng = np.random.default_rng(1)  # the "world": noisy costs, same for both sequences
        for i in range(25):
            if reopen_every and i % reopen_every == 0:
                store.close()
                store = open_store(path)
            bandit = BatchSizeBandit(store, "job", settings)
            picks.append(run(bandit, cost=lambda b, rng=rng: 100 + cost_of(b) / 20 * (1 + 0.3 * rng.standard_normal())))
        store.close()
        return picks

    a = sequence(tmp_path / "a.sqlite", None)
    b = sequence(tmp_path / "b.sqlite", 3)
    c = sequence(tmp_path / "c.json", 1)
    assert a == b == c
    assert len(set(a[6:])) > 1  # Thompson sampling really sampled


def test_discount_and_window_shape_the_posterior(store):
    settings = BanditSettings((32, 64), 32, pruning_rounds=1, discount=0.5, window=2)
    bandit = BatchSizeBandit(store, "job", settings)
    for b, c in ((32, 100.0), (32, 100.0), (32, 100.0), (64, 90.0)):
        t = store.create_trial("job", b)
        store.finish_trial(t.trial_id, status="completed", energy_J=1, time_s=1, cost=c, converged=True)
    posts = bandit.posteriors([32, 64])
    # Ages (newest 0): 64 has age 0; 32 has ages 1, 2, 3 -> window keeps 1 and 2 -> n = 0.5 + 0.25.
    assert posts[64].n == 1.0 and posts[32].n == pytest.approx(0.75)


def test_lower_confidence_bound_elimination_by_hand():
    # sd = 1/sqrt(precision). Arm 32: mean 100, sd 5 -> bounds [90, 110]; arm 64: mean 130, sd 8 ->
    # lower bound 130 - 16 = 114 > 110: skipped at z = 2; at z = 3, 130 - 24 = 106 <= 115: kept.
    a = ArmPosterior(32, 3.0, 100.0, 1 / 25, 75.0)
    b = ArmPosterior(64, 1.0, 130.0, 1 / 64, 64.0)
    c = ArmPosterior(128, 1.0, 112.0, 1 / 16, 16.0)  # sd 4: lower bound 104 <= 110 -> kept
    assert eliminate_arms({32: a, 64: b, 128: c}, 2.0) == [32, 128]
    assert eliminate_arms({32: a, 64: b, 128: c}, 3.0) == [32, 64, 128]
    assert eliminate_arms({32: a, 64: b}, None) == [32, 64]
    assert eliminate_arms({64: b}, 2.0) == [64]  # the best arm always stays


def test_elimination_on_the_bandits_own_posteriors(store):
    # Two survivors: 32 at 100 (five runs, 100 +- 2) and 64 at 300 (once). Pooled relative noise
    # r = (4 x 0.02^2) / 4 = 4e-4 < floor 0.05^2 -> sd(64) ~ 0.05 x 300 = 15 (the prior barely
    # moves it): lower bound ~270, far above 32's upper bound ~105 -> 64 is not drawn.
    settings = BanditSettings((32, 64), 32, pruning_rounds=1)
    bandit = BatchSizeBandit(store, "job", settings)
    for b, c in ((32, 98.0), (64, 300.0), (32, 102.0), (32, 98.0), (32, 102.0), (32, 100.0)):
        t = store.create_trial("job", b)
        store.finish_trial(t.trial_id, status="completed", energy_J=1, time_s=1, cost=c, converged=True)
    posts = bandit.posteriors([32, 64])
    assert eliminate_arms(posts, settings.elimination_z) == [32]
    assert eliminate_arms(posts, None) == [32, 64]


def test_censored_costs_stay_out_of_the_noise_variance_and_count_at_their_tail_mean(store):
    # Arm 32: 100, 100 (completed) and 190 (early-stopped, censored): the pooled relative variance
    # comes from the completed runs only -> 0 -> the floor 0.05; with the censored cost it would be
    # ((100/130 - 1)^2 x 2 + (190/130 - 1)^2) / 2 = 0.1598 (sd 40 % of the mean).
    bandit = BatchSizeBandit(store, "job", BanditSettings((32, 64), 32, pruning_rounds=1))
    for c, status in ((100.0, "completed"), (100.0, "completed"), (190.0, "early_stopped")):
        t = store.create_trial("job", 32)
        store.finish_trial(t.trial_id, status=status, energy_J=1, time_s=1, cost=c, converged=status == "completed")
    # The censored 190 counts at E[X | X > 190] under the predictive of the completed runs alone:
    # prior mu0 = 130 (all costs), tau0 = 1/130^2; sigma^2 = (0.05 x 100)^2 = 25; tau = tau0 + 2/25;
    # mu = (130 tau0 + 200/25) / tau; predictive sd sqrt(25 + 1/tau). The truncated mean is taken
    # from scipy.stats.truncnorm, not from the code under test.
    tau0 = 1 / 130.0**2
    tau = tau0 + 2 / 25
    mu = (130 * tau0 + 200 / 25) / tau
    sd = math.sqrt(25 + 1 / tau)
    imputed = stats.truncnorm((190 - mu) / sd, np.inf, loc=mu, scale=sd).mean()
    assert 190 < imputed < 191  # 14.7 sd above the mean: the tail mean is just above the cut
    post = bandit.posteriors([32])[32]
    assert post.n == 3.0  # the censored cost still counts as an observation of its arm
    mean = (200 + imputed) / 3
    assert post.noise_var == pytest.approx((0.05 * mean) ** 2)
    assert post.mean == pytest.approx((130 * tau0 + 3 * mean / post.noise_var) / (tau0 + 3 / post.noise_var))
    assert bandit.observations(completed_only=True) == {32: [(100.0, 1), (100.0, 2)]}  # ages: 190 is 0


def test_an_early_stopped_run_that_reached_the_target_is_an_uncensored_converged_observation(store):
    # Issue 26: stopped on cost, then its last evaluation reached the target. Its cost is its cost to
    # the target (not a cut), so it is reported converged and enters the noise variance as is.
    bandit = BatchSizeBandit(store, "job", BanditSettings((32, 64), 32, pruning_rounds=1))
    s = bandit.suggest()
    finished = bandit.report(s.trial_id, energy_J=1, time_s=1, cost=150.0, converged=True, status="early_stopped")
    assert (finished.status, finished.converged) == ("early_stopped", True)
    assert bandit.observations(completed_only=True) == {32: [(150.0, 0)]}
    assert bandit.min_cost == 150.0  # a converged cost: the job's best so far
    t = store.create_trial("job", 64)
    failed = bandit.report(t.trial_id, energy_J=1, time_s=1, cost=90.0, converged=True, status="failed")
    assert not failed.converged and bandit.min_cost == 150.0  # a failed run never converged


def test_gaussian_tail_mean_by_hand():
    # Half-normal: E[X | X > 0] for N(0, 1) is sqrt(2/pi).
    assert gaussian_tail_mean(0.0, 1.0, 0.0) == pytest.approx(math.sqrt(2 / math.pi))
    # N(10, 2^2) cut at 12: alpha = 1, inverse Mills ratio phi(1) / (1 - Phi(1)) = 0.2419707 / 0.1586553.
    assert gaussian_tail_mean(10.0, 2.0, 12.0) == pytest.approx(10 + 2 * 0.2419707 / 0.1586553, rel=1e-6)
    # A cut far below the mean changes nothing: the mean itself.
    assert gaussian_tail_mean(100.0, 5.0, 0.0) == pytest.approx(100.0)
    # 40 sd above the mean (1 - Phi underflows a naive ratio): finite, just above the cut (~ c + s/alpha).
    far = gaussian_tail_mean(0.0, 1.0, 40.0)
    assert 40.0 < far < 40.0 + 1 / 40 + 1e-3
    with pytest.raises(ValueError, match="std"):
        gaussian_tail_mean(0.0, 0.0, 1.0)


def _thompson_bandit(store, **settings) -> BatchSizeBandit:
    """Thompson phase over 32 (costs 100, 98, 102) and 64 (cost 110), all converged."""
    bandit = BatchSizeBandit(store, "job", BanditSettings((32, 64), 32, **settings))
    for b, c in ((32, 100.0), (64, 110.0)):  # pruning: 32 (default), then up to 64
        s = bandit.suggest()
        assert s.batch_size == b
        bandit.report(s.trial_id, energy_J=1, time_s=1, cost=c, converged=True)
    for c in (98.0, 102.0):
        t = store.create_trial("job", 32)
        store.finish_trial(t.trial_id, status="completed", energy_J=1, time_s=1, cost=c, converged=True)
    assert bandit.state()["phase"] == "thompson"
    return bandit


def test_explore_stop_threshold_by_hand(store):
    bandit = _thompson_bandit(store)
    # Pooled relative variance: arm 32 (mean 100) gives (0.02^2 x 2) / 2 = 0.0004 < floor 0.05^2.
    # Best arm 32: sigma^2 = 0.0025 x 100^2 = 25; prior mu0 = 102.5 (all four costs), tau0 = 1/102.5^2;
    # tau = tau0 + 3/25; mu = (102.5 tau0 + 300/25) / tau. Threshold: mu + 2 x 5.
    tau0 = 1 / 102.5**2
    mu = (102.5 * tau0 + 300 / 25) / (tau0 + 3 / 25)
    assert bandit.explore_stop_threshold(64) == pytest.approx(mu + 2 * 5.0)
    assert bandit.explore_stop_threshold(32) is None  # the best arm's runs are never cut
    # Beta x min_cost (2 x 100: the 98 was written to the store directly, not reported) is far above.
    assert bandit.early_stop_threshold() == pytest.approx(200.0)
    assert (
        BatchSizeBandit(store, "job", BanditSettings((32, 64), 32, explore_stop_z=None)).explore_stop_threshold(64)
        is None
    )


def test_explore_stop_is_off_while_pruning(store):
    bandit = BatchSizeBandit(store, "job", BanditSettings((32, 64), 32))
    s = bandit.suggest()
    bandit.report(s.trial_id, energy_J=1, time_s=1, cost=100.0, converged=True)
    assert bandit.state()["phase"] == "pruning" and bandit.explore_stop_threshold(64) is None


def test_a_cut_run_does_not_make_its_arm_look_cheaper(store):
    # Arm 64 (completed 110) is explored and stopped at 111: counted at the cut it would pull the
    # arm's mean to 110.5; at its tail mean (above the cut under 64's predictive) the mean rises.
    bandit = _thompson_bandit(store)
    before = bandit.posteriors([64])[64].mean
    t = store.create_trial("job", 64)
    store.finish_trial(t.trial_id, status="early_stopped", energy_J=1, time_s=1, cost=111.0, converged=False)
    after = bandit.posteriors([64])[64]
    assert after.n == 2.0
    as_cut = bandit.posteriors([64], bandit.observations())[64]  # the same costs, all taken at face value
    assert after.mean > as_cut.mean and after.mean > before
    # Its decision: with 64's mean up, the best arm stays 32 and 64's next run is still cut at 32's bound.
    assert bandit.explore_stop_threshold(64) is not None and bandit.explore_stop_threshold(32) is None


def test_pruning_candidates_stop_at_prune_cost_ratio(store):
    settings = BanditSettings(SIZES, 64, beta_knob=2.0, prune_cost_ratio=1.5, prune_cost_ratio_no_descent=None)
    bandit = BatchSizeBandit(store, "job", settings)
    s = bandit.suggest()  # 64: no converged run yet, no threshold
    assert bandit.early_stop_threshold() is None
    bandit.report(s.trial_id, energy_J=1, time_s=1, cost=200.0, converged=True)
    assert bandit.early_stop_threshold() == 300.0  # pruning: min(2.0, 1.5) x 200
    s = bandit.suggest()  # 32, stopped at 1.5 x: not converged, the downward direction ends
    bandit.report(s.trial_id, energy_J=1, time_s=1, cost=301.0, converged=False, status="early_stopped")
    for b, c in ((128, 150.0), (256, 250.0)):  # 256 costs 1.67 x 150 > 1.5: ends the upward direction
        s = bandit.suggest()
        assert s.batch_size == b
        bandit.report(s.trial_id, energy_J=1, time_s=1, cost=c, converged=True)
    state = bandit.state()
    assert state["phase"] == "thompson" and state["survivors"] == [64, 128, 256]
    assert bandit.early_stop_threshold() == 300.0  # Thompson phase: beta_knob x 150
    # A pruning factor at or above beta_knob does not set the threshold: beta_knob does.
    high = BatchSizeBandit(store, "high", BanditSettings(SIZES, 64, beta_knob=1.4, prune_cost_ratio_no_descent=1.5))
    s = high.suggest()
    high.report(s.trial_id, energy_J=1, time_s=1, cost=200.0, converged=True)
    assert high.early_stop_factor() == ("beta_knob", 1.4, 200.0)
    no_ratio = BatchSizeBandit(store, "other", BanditSettings(SIZES, 64, beta_knob=2.0, prune_cost_ratio=None))
    s = no_ratio.suggest()
    no_ratio.report(s.trial_id, energy_J=1, time_s=1, cost=200.0, converged=True)
    assert no_ratio.early_stop_threshold() == 400.0


def report(bandit: BatchSizeBandit, expect: int, cost: float, status: str = "completed") -> None:
    s = bandit.suggest()
    assert s.batch_size == expect
    bandit.report(s.trial_id, energy_J=1, time_s=1, cost=cost, converged=status == "completed", status=status)


def test_pruning_stop_factor_follows_the_direction_by_hand(store):
    # prune_cost_ratio 1.5 after a size that lowered the cheapest converged cost, 1.3 otherwise.
    settings = BanditSettings(SIZES, 64, beta_knob=2.0, prune_cost_ratio=1.5, prune_cost_ratio_no_descent=1.3)
    bandit = BatchSizeBandit(store, "job", settings)
    report(bandit, 64, 200.0)
    assert bandit.early_stop_threshold() == pytest.approx(260.0)  # 32: first size below the start, 1.3 x 200
    assert bandit.early_stop_factor() == ("prune_cost_ratio_no_descent", 1.3, 200.0)
    report(bandit, 32, 150.0)  # lowers the cheapest (200 → 150): the direction is descending
    assert bandit.state()["descending"] and bandit.early_stop_threshold() == pytest.approx(225.0)  # 16: 1.5 x 150
    assert bandit.early_stop_factor() == ("prune_cost_ratio", 1.5, 150.0)
    report(bandit, 16, 210.0)  # 210 ≤ 225: the direction goes on, but 16 did not lower the cheapest
    assert not bandit.state()["descending"] and bandit.early_stop_threshold() == pytest.approx(195.0)  # 8: 1.3 x 150
    report(bandit, 8, 196.0, "early_stopped")  # stopped past 195: the downward direction ends
    assert bandit.early_stop_threshold() == pytest.approx(195.0)  # 128: first size above the start
    report(bandit, 128, 190.0)  # 190 ≤ 195 goes on; 190 > 150: not descending
    assert bandit.early_stop_threshold() == pytest.approx(195.0)  # 256
    report(bandit, 256, 180.0)
    state = bandit.state()
    assert state["phase"] == "thompson" and state["survivors"] == [16, 32, 64, 128, 256]
    assert bandit.early_stop_threshold() == pytest.approx(300.0)  # Thompson phase: beta_knob x 150
    assert bandit.early_stop_factor() == ("beta_knob", 2.0, 150.0)


def test_pruning_direction_end_uses_the_direction_factor(store):
    sizes = (16, 32, 64, 128, 256, 512)
    both = BanditSettings(sizes, 64, beta_knob=None, prune_cost_ratio=1.5, prune_cost_ratio_no_descent=1.3)
    bandit = BatchSizeBandit(store, "job", both)
    report(bandit, 64, 100.0)
    report(bandit, 32, 140.0)  # first size below: 140 > 1.3 x 100 ends the downward direction; 16 is skipped
    report(bandit, 128, 90.0)  # first size above, cheaper: descending
    report(bandit, 256, 130.0)  # 130 ≤ 1.5 x 90 = 135: the upward direction goes on
    report(bandit, 512, 120.0)  # after 256 (no new cheapest) the factor is 1.3: 120 > 117 ends it; 512 survives
    state = bandit.state()
    assert state["phase"] == "thompson" and state["survivors"] == [32, 64, 128, 256, 512]
    # With one factor (1.5) everywhere, 140 ≤ 150: the downward direction goes on to 16.
    single = BanditSettings(sizes, 64, beta_knob=None, prune_cost_ratio=1.5, prune_cost_ratio_no_descent=None)
    other = BatchSizeBandit(store, "other", single)
    report(other, 64, 100.0)
    report(other, 32, 140.0)
    assert other.suggest().batch_size == 16


def test_stored_state_without_descending_flag_counts_as_not_descending(store):
    settings = BanditSettings(SIZES, 64, beta_knob=2.0, prune_cost_ratio=1.5, prune_cost_ratio_no_descent=1.3)
    bandit = BatchSizeBandit(store, "job", settings)
    report(bandit, 64, 200.0)
    report(bandit, 32, 150.0)
    assert bandit.early_stop_threshold() == pytest.approx(225.0)

    def drop_flag(current):
        state = {k: v for k, v in current.state.items() if k != "descending"}
        return type(current)(current.job_id, state, current.arms), None

    store.update_bandit("job", drop_flag)  # a state written before the flag existed
    assert "descending" not in bandit.state() and bandit.early_stop_threshold() == pytest.approx(195.0)
    with pytest.raises(ValueError, match="prune_cost_ratio_no_descent"):
        BanditSettings(SIZES, 64, prune_cost_ratio_no_descent=0.9)


def test_satisficing_choice_by_hand():
    draws = {16: 100.0, 32: 100.8, 64: 101.5}
    means = {16: 104.0, 32: 99.0, 64: 98.0}
    # Lowest draw 100 (arm 16); within 1 %: draws <= 101 -> {16, 32}; lowest mean of those: 32.
    assert satisficing_choice(draws, means, 0.01) == 32
    # Within 2 %: <= 102 -> all three; lowest mean: 64.
    assert satisficing_choice(draws, means, 0.02) == 64
    # Plain Thompson sampling: the lowest draw.
    assert satisficing_choice(draws, means, None) == 16 and satisficing_choice(draws, means, 0.0) == 16


def test_the_typed_state_is_frozen_and_stores_only_the_keys_it_was_read_with(store):
    import pydantic

    from zeus_callbacks.optimizers.batch_size._bandit_state import read_state

    bandit = BatchSizeBandit(store, "job", BanditSettings(SIZES, 64))
    report(bandit, 64, 200.0)
    stored = {k: v for k, v in bandit.state().items() if k != "descending"}
    stored["written_by_a_newer_version"] = 1
    state = read_state(stored, "here", "job")
    assert (state.phase, state.candidate, state.descending) == ("pruning", 32, False)
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        state.candidate = 16  # type: ignore[misc]
    moved = state.replace(candidate=16)
    assert moved.to_stored() == {**stored, "candidate": 16} and state.to_stored() == stored
