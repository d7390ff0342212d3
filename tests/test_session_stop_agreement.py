"""Several processes: the session's early-stop agreement, seen from one rank with a scripted peer.

The real two-process runs are in tests/distributed/; here a fake RankGroup records every
collective, so the cadence (which steps exchange, which never do) is checked exactly.
"""

from __future__ import annotations

import pytest

from zeus_callbacks import suggest_batch_size
from zeus_callbacks._distributed import RankGroup
from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.backends.virtual import VirtualGPUBackend
from zeus_callbacks.config import parse_config
from zeus_callbacks.optimizers.batch_size import BanditSettings, BatchSizeBandit, EarlyStopRule, Suggestion
from zeus_callbacks.optimizers.cost import ZeusCost
from zeus_callbacks.session import EnergySession
from zeus_callbacks.store import open_store

N = 4  # batch_size.stop_agreement_steps
PLANTED_COST = 3000.0


class FakeRanks:
    """A two-process group seen from ``process_index``; the other rank's answers are scripted.

    Args:
        process_index: This rank.
        peer_row: The other rank's early-stop row for this rank's (default: the same row);
            other gathered rows are mirrored.
        main_broadcast: What the main rank broadcasts (seen by rank 1 only).
    """

    num_processes = 2
    is_distributed = True

    def __init__(self, process_index, peer_row=None, main_broadcast=None):
        self.process_index = process_index
        self.peer_row = peer_row or (lambda row: list(row))
        self.main_broadcast = main_broadcast
        self.calls: list[tuple[str, int, list]] = []  # (kind, steps seen so far, payload)
        self.session: EnergySession | None = None

    def _steps(self) -> int:
        s = self.session
        return s.steps_this_run if s is not None else -1  # steps since train_start

    def gather(self, values):
        self.calls.append(("gather", self._steps(), list(values)))
        peer = self.peer_row(list(values)) if len(values) == 4 else list(values)
        return [list(values), peer] if self.process_index == 0 else [peer, list(values)]

    def broadcast(self, obj, src=0):
        self.calls.append(("broadcast", self._steps(), obj))
        return obj if self.process_index == 0 else self.main_broadcast

    broadcast_outcome = RankGroup.broadcast_outcome  # the real rule, over the scripted broadcast

    def stop_exchanges(self) -> list[tuple[int, list]]:
        """The early-stop exchanges: rows of [energy_J, time_s, target flag, converged flag]."""
        return [(steps, row) for kind, steps, row in self.calls if kind == "gather" and len(row) == 4]


def settings(tmp_path, **bs) -> dict:
    return {
        "backend": "virtual",
        "job_id": "nightly",
        "logging": {"log_dir": str(tmp_path), "interval_steps": 1000, "jsonl": False},
        "windows": {"epoch": False},
        "batch_size": {
            "enabled": True, "batch_sizes": [32, 64, 128], "default_batch_size": 64, "stop_agreement_steps": N,
            "target": {"metric": "val/acc", "value": 0.8, "direction": "max"}, **bs,
        },
    }  # fmt: skip


def plant_converged_trial(tmp_path) -> None:
    """A first recurrence that converged at cost PLANTED_COST (the threshold is then 1.5 x that)."""
    cfg = parse_config(settings(tmp_path))
    with open_store(tmp_path / "zeus_store.sqlite") as store:
        bandit = BatchSizeBandit(store, "nightly", BanditSettings.from_config(cfg.batch_size))
        first = bandit.suggest()
        bandit.report(first.trial_id, energy_J=1000.0, time_s=10.0, cost=PLANTED_COST, converged=True)


def start(tmp_path, monkeypatch, ranks: FakeRanks, *, main: bool, **bs):
    clock = ManualClock(1000.0)
    backend = VirtualGPUBackend(clock=clock, noise_W=0.0, read_only=True, sample_period_s=0.1)
    session = EnergySession(settings(tmp_path, **bs), backend=backend, is_main_process=main)
    ranks.session = session
    monkeypatch.setattr("zeus_callbacks._distributed.RankGroup.detect", lambda: ranks)
    session.train_start(run_name="r")
    return session, clock


def step(session, clock, i):
    session.step_start(i)
    clock.advance(1.0)
    session.sampler.poll_once()
    return session.step_end(i)


def run_until_stop(session, clock, max_steps=200):
    for i in range(1, max_steps + 1):
        decision = step(session, clock, i)
        if decision.stop_training:
            return i, decision
    raise AssertionError("never stopped")


def test_main_rank_exchanges_every_n_steps_and_stops_on_the_summed_cost(tmp_path, monkeypatch):
    plant_converged_trial(tmp_path)
    ranks = FakeRanks(0, peer_row=lambda row: [3 * row[0], row[1] + 0.5, 0.0, 0.0])  # a hotter, slower peer
    session, clock = start(tmp_path, monkeypatch, ranks, main=True)
    rule = session.stop_rule
    # MaxPower of the cost is the sum over both ranks' GPUs (the peer's is scripted equal).
    assert rule.cost.max_power_W == pytest.approx(2 * session.backend.power_limit_constraints_W(0)[1])
    stopped_at, decision = run_until_stop(session, clock)
    exchanges = ranks.stop_exchanges()
    assert [steps for steps, _ in exchanges] == list(range(N, stopped_at + 1, N))  # every N steps, no others
    assert stopped_at % N == 0 and "early stop" in decision.reason

    def cost(row):  # what both ranks compute: energy summed, time of the slower rank
        return rule.cost(row[0] + 3 * row[0], row[1] + 0.5)

    assert cost(exchanges[-1][1]) > rule.threshold_cost >= cost(exchanges[-2][1])
    # The peer's energy counts: alone, this rank's cost was still under the threshold.
    assert rule.cost(*exchanges[-1][1][:2]) < rule.threshold_cost
    session.train_end()
    with open_store(tmp_path / "zeus_store.sqlite") as store:
        assert store.list_trials("nightly")[-1].status == "early_stopped"


def test_follower_applies_the_main_rule_and_never_opens_the_store(tmp_path, monkeypatch):
    rule = EarlyStopRule(ZeusCost(0.5, 600.0), threshold_cost=4000.0)
    ranks = FakeRanks(1, main_broadcast=(rule, None))
    session, clock = start(tmp_path, monkeypatch, ranks, main=False)
    assert session.batch_size_controller is None and session.stop_rule == rule
    stopped_at, _ = run_until_stop(session, clock)
    (_, row) = ranks.stop_exchanges()[-1]
    assert stopped_at % N == 0 and rule.cost(2 * row[0], row[1]) > rule.threshold_cost
    session.train_end()
    assert not (tmp_path / "zeus_store.sqlite").exists()


def test_target_reached_on_the_main_rank_stops_the_follower_at_that_evaluation(tmp_path, monkeypatch):
    rule = EarlyStopRule(ZeusCost(0.5, 600.0), threshold_cost=1e12)
    main_reached = lambda row: [row[0], row[1], 1.0, 1.0]  # noqa: E731 - the main rank's row at the evaluation
    ranks = FakeRanks(1, peer_row=main_reached, main_broadcast=(rule, None))
    session, clock = start(tmp_path, monkeypatch, ranks, main=False)
    before = len(ranks.stop_exchanges())
    decision = session.evaluate({"val/acc": 0.1})  # this rank knows nothing of the target
    assert decision.stop_training and "target reached" in decision.reason
    assert len(ranks.stop_exchanges()) == before + 1
    for i in range(3 * N):  # stopped: no more exchanges, whatever the steps
        step(session, clock, i)
    session.evaluate({"val/acc": 0.1})
    assert len(ranks.stop_exchanges()) == before + 1
    session.train_end()


def test_a_target_reached_at_an_evaluation_of_the_main_rank_alone_waits_on_no_rank_and_goes_with_the_next_exchange(
    tmp_path, monkeypatch
):
    # Issue 26: a user's evaluation on rank 0 only (eval_end without every_rank) must not enter a collective.
    plant_converged_trial(tmp_path)
    ranks = FakeRanks(0)
    session, clock = start(tmp_path, monkeypatch, ranks, main=True)
    before = len(ranks.stop_exchanges())
    session.eval_start()
    session.eval_end()  # not known to run on every rank
    decision = session.evaluate({"val/acc": 0.9})  # the target, seen here alone
    assert not decision.stop_training and len(ranks.stop_exchanges()) == before
    for i in range(1, N + 1):  # the next step exchange carries it: every rank stops there
        decision = step(session, clock, i)
    assert decision.stop_training and "target" in decision.reason
    assert ranks.stop_exchanges()[-1][1][2] == 1.0 and len(ranks.stop_exchanges()) == before + 1
    session.train_end()


def test_nothing_to_stop_on_means_no_exchange(tmp_path, monkeypatch):
    ranks = FakeRanks(0)
    # First recurrence (no best cost yet) and no target: nothing can stop the run.
    session, clock = start(tmp_path, monkeypatch, ranks, main=True, target=None)
    for i in range(3 * N):
        assert not step(session, clock, i).stop_training
    session.evaluate({"val/acc": 0.9})
    assert ranks.stop_exchanges() == []
    assert [kind for kind, *_ in ranks.calls] == ["gather", "broadcast"]  # MaxPower and the rule, at start
    session.train_end()


def test_single_process_stops_without_any_collective(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a collective on a single process")

    monkeypatch.setattr("zeus_callbacks._distributed.RankGroup.gather", refuse)
    monkeypatch.setattr("zeus_callbacks._distributed.RankGroup.broadcast", refuse)
    plant_converged_trial(tmp_path)
    clock = ManualClock(1000.0)
    backend = VirtualGPUBackend(clock=clock, noise_W=0.0, read_only=True, sample_period_s=0.1)
    session = EnergySession(settings(tmp_path), backend=backend, is_main_process=True)
    session.train_start(run_name="one")
    assert not session.ranks.is_distributed
    stopped_at, decision = run_until_stop(session, clock)
    assert "early stop" in decision.reason and stopped_at > 1
    assert session.train_end().status == "completed"


def test_main_failure_at_start_fails_the_follower_instead_of_hanging(tmp_path, monkeypatch):
    ranks = FakeRanks(1, main_broadcast=(None, "StoreCorruptError: zeus_store.sqlite is not a store"))
    with pytest.raises(RuntimeError, match="main process could not start the batch-size bandit"):
        start(tmp_path, monkeypatch, ranks, main=False)
    assert ranks.session.summary.status == "failed"


def test_suggest_batch_size_under_a_launcher_returns_the_main_suggestion(tmp_path, monkeypatch):
    main_suggestion = Suggestion(batch_size=128, trial_id=7, phase="pruning", round=0)
    ranks = FakeRanks(1, main_broadcast=((128, main_suggestion, None), None))
    monkeypatch.setattr(
        "zeus_callbacks.optimizers.batch_size._batch_size_controller.RankGroup.from_launcher", lambda **kw: ranks
    )
    suggested = suggest_batch_size(settings(tmp_path))
    assert suggested == 128
    assert not (tmp_path / "zeus_store.sqlite").exists()  # only the main process touches the store
    # The callback's session claims it on this rank too (no second exchange).
    session = EnergySession(settings(tmp_path), is_main_process=False)
    assert session.suggest_batch_size(suggested) == 128 and suggested.claim("nightly") is None
    assert [kind for kind, *_ in ranks.calls] == ["broadcast"]


def test_a_store_the_main_cannot_reach_gives_every_rank_the_default_batch_size(tmp_path, monkeypatch, caplog):
    import sqlite3

    from zeus_callbacks.store import open_store

    cfg = {**settings(tmp_path), "store": {"lock_timeout_s": 0.3}}
    open_store(tmp_path / "zeus_store.sqlite").close()
    blocker = sqlite3.connect(tmp_path / "zeus_store.sqlite", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # another writer holds the store past the lock timeout
    main = FakeRanks(0)
    monkeypatch.setattr(
        "zeus_callbacks.optimizers.batch_size._batch_size_controller.RankGroup.from_launcher", lambda **kw: main
    )
    try:
        assert suggest_batch_size(cfg) == 64  # trains on, at the default
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    ((kind, _, shared),) = main.calls
    assert kind == "broadcast" and shared[0][:2] == (64, None) and "stayed locked" in shared[0][2]
    assert "without the bandit's suggestion" in caplog.text
    follower = FakeRanks(1, main_broadcast=shared)
    monkeypatch.setattr(
        "zeus_callbacks.optimizers.batch_size._batch_size_controller.RankGroup.from_launcher", lambda **kw: follower
    )
    assert suggest_batch_size(cfg) == 64


def test_suggest_batch_size_fails_every_rank_when_the_main_cannot_suggest(tmp_path, monkeypatch):
    ranks = FakeRanks(1, main_broadcast=(None, "StoreCorruptError: bad store"))
    monkeypatch.setattr(
        "zeus_callbacks.optimizers.batch_size._batch_size_controller.RankGroup.from_launcher", lambda **kw: ranks
    )
    with pytest.raises(RuntimeError, match="main process could not suggest a batch size.*bad store"):
        suggest_batch_size(settings(tmp_path))


def test_stop_reason_names_the_factor_that_set_the_threshold():
    cost = ZeusCost(0.5, 600.0)  # 0.5 E + 0.5 x 600 W x t: 1000 J over 1 s cost 800
    assert cost(1000.0, 1.0) == pytest.approx(800.0)
    prune = EarlyStopRule(cost, 780.0, factor_name="prune_cost_ratio", factor=1.5)
    assert prune.reason(1000.0, 1.0) == (
        "cost 800 exceeds prune_cost_ratio 1.5 x best cost = 780 "
        "(early stop of a pruning candidate: its direction ends)"
    )
    beta = EarlyStopRule(cost, 780.0, factor=2.0)
    assert beta.reason(1000.0, 1.0) == "cost 800 exceeds beta_knob 2 x best cost = 780 (early stop, Zeus §4.4)"
    assert beta.reason(900.0, 1.0) is None  # cost 750 ≤ 780
