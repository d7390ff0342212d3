"""The session's parts on their own: cleanup order, rank aggregation, the agreements' pure decisions."""

from __future__ import annotations

import signal
import sys

import pytest

from zeus_callbacks._lifecycle import CleanupOrder, CleanupRegistry
from zeus_callbacks.optimizers.batch_size import EarlyStopRule
from zeus_callbacks.optimizers.cost import ZeusCost
from zeus_callbacks.session import _agreement as agreement
from zeus_callbacks.session._aggregate import RankAggregator
from zeus_callbacks.session._power_limit_steps import job_length
from zeus_callbacks.session._rank_records import PowerLimitVote, StopVote


class TwoRanks:
    """A scripted two-process group: the peer's row is a function of ours."""

    num_processes = 2
    process_index = 0
    is_distributed = True

    def __init__(self, peer):
        self.peer = peer
        self.gathers = 0

    def gather(self, values):
        self.gathers += 1
        return [list(values), self.peer(list(values))]

    def broadcast_outcome(self, value, failure, doing):
        return value


# -- lifecycle ---------------------------------------------------------------------------------
@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_cleanups_run_in_order_on_sigterm_then_the_previous_handler(monkeypatch):
    ran = []
    previous = []
    old = signal.signal(signal.SIGTERM, lambda signum, frame: previous.append(signum))
    try:
        registry = CleanupRegistry()
        registry.register(lambda: ran.append("end run"), what="ending the energy log", order=CleanupOrder.END_RUN)
        limits = CleanupOrder.RESTORE_POWER_LIMITS
        registry.register(lambda: ran.append("limits"), what="restoring limits", order=limits)
        assert [e.what for e in registry.registered] == ["restoring limits", "ending the energy log"]
        signal.raise_signal(signal.SIGTERM)
        assert ran == ["limits", "end run"]  # hardware first, whatever the registration order
        assert previous == [signal.SIGTERM]  # then the handler that was there before
        assert registry.registered == []
    finally:
        signal.signal(signal.SIGTERM, old)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_the_handler_goes_with_the_last_registration_and_exit_runs_only_at_exit_cleanups():
    before = signal.getsignal(signal.SIGTERM)
    registry = CleanupRegistry()
    ran = []
    first = registry.register(lambda: ran.append("a"), what="a", order=1, at_exit=True)
    second = registry.register(lambda: ran.append("b"), what="b", order=2)
    assert signal.getsignal(signal.SIGTERM) != before
    first.cancel()
    assert signal.getsignal(signal.SIGTERM) != before  # "b" still needs it
    second.cancel()
    second.cancel()  # idempotent
    assert signal.getsignal(signal.SIGTERM) == before
    registry.register(lambda: ran.append("c"), what="c", order=1, at_exit=True)
    last = registry.register(lambda: ran.append("d"), what="d", order=2)
    registry.run_at_exit()
    assert ran == ["c"]
    # "d" still holds the handler: cancelled here, or a later test in this worker that sends itself SIGTERM
    # (Lightning's sigterm ending) reaches this test's handler, whose previous action kills the worker.
    last.cancel()
    assert signal.getsignal(signal.SIGTERM) == before


# -- aggregation -------------------------------------------------------------------------------
def test_energy_sums_time_is_the_slowest_and_a_peer_fault_degrades_every_rank():
    ranks = TwoRanks(lambda row: [2 * row[0], row[1] + 1.0, 5.0, 1.0])  # the peer is degraded
    agg = RankAggregator(ranks)
    rows = agg.gather([10.0, 3.0, 7.0], degraded=False)
    assert rows == [[10.0, 3.0, 7.0], [20.0, 4.0, 5.0]]  # the flag is not part of the rows
    assert agg.peer_degraded
    # Named records: packed, gathered, unpacked, and each field reduced as it declares.
    peer = TwoRanks(lambda row: [2 * row[0], row[1] + 1.0, 1.0, 0.0, 0.0])  # twice the energy, slower, saw the target
    votes = RankAggregator(peer).exchange(StopVote(10.0, 3.0, 0.0, 0.0), StopVote.of, degraded=False)
    assert votes == [StopVote(10.0, 3.0, 0.0, 0.0), StopVote(20.0, 4.0, 1.0, 0.0)]
    assert StopVote.reduce(votes) == StopVote(energy_J=30.0, time_s=4.0, target=1.0, converged=0.0)


def test_after_a_failure_the_exchange_stays_local():
    ranks = TwoRanks(lambda row: row)
    agg = RankAggregator(ranks)
    agg.collectives_ok = False
    assert not agg.collective
    assert agg.gather([1.0], degraded=True) == [[1.0]] and ranks.gathers == 0
    assert not agg.peer_degraded  # this rank's own fault is not a peer's


# -- agreements --------------------------------------------------------------------------------
def test_power_limit_verdict_follows_the_main_rank_and_observe_anywhere_wins():
    votes = [PowerLimitVote(250.0, 0.0, 0.0), PowerLimitVote(300.0, 0.0, 0.0)]
    assert agreement.decide_power_limit(votes) == agreement.PowerLimitVerdict(
        observe_everywhere=False, target_W=250.0, settled=False
    )
    verdict = agreement.decide_power_limit([PowerLimitVote(250.0, 1.0, 0.0), PowerLimitVote(300.0, 0.0, 1.0)])
    assert verdict.observe_everywhere and verdict.settled


def test_stop_on_the_summed_energy_and_the_slowest_time():
    rule = EarlyStopRule(ZeusCost(0.5, 600.0), threshold_cost=4000.0)
    state = agreement.StopAgreement()
    state.start(rule, target_set=False, stop_at_target=True)
    assert state.active and state.cost
    energy_J, time_s = 2000.0, 5.0
    alone = rule.reason(energy_J, time_s)
    both = rule.reason(energy_J + 3 * energy_J, time_s + 2.0)
    assert alone is None and both is not None  # only the ranks together cost too much
    votes = [StopVote(energy_J, time_s, 0.0, 0.0), StopVote(3 * energy_J, time_s + 2.0, 0.0, 0.0)]
    verdict = agreement.decide_stop(votes, None, state, stop_at_target=True)
    assert verdict == agreement.StopVerdict(both, on_cost=True)
    assert not state.active and not state.cost  # nothing left to agree on


def test_a_target_seen_by_the_main_rank_stops_every_rank_and_convergence_ends_cost_checks():
    rule = EarlyStopRule(ZeusCost(0.5, 600.0), threshold_cost=4000.0)
    state = agreement.StopAgreement()
    state.start(rule, target_set=True, stop_at_target=True)
    seen = [StopVote(1.0, 1.0, 1.0, 0.0), StopVote(1.0, 1.0, 0.0, 0.0)]
    follower = agreement.decide_stop(seen, None, state, stop_at_target=True)
    assert follower.reason == agreement.TARGET_BY_MAIN and not follower.on_cost
    state = agreement.StopAgreement()
    state.start(rule, target_set=True, stop_at_target=False)
    converged = [StopVote(1e9, 1e9, 0.0, 1.0), StopVote(1e9, 1e9, 0.0, 0.0)]
    verdict = agreement.decide_stop(converged, None, state, stop_at_target=False)
    assert verdict.reason is None and state.converged and not state.active  # converged: never stopped on cost


# -- named cross-rank records ------------------------------------------------------------------
def test_a_step_report_row_packs_and_unpacks_by_name_and_each_field_reduces_as_declared():
    from zeus_callbacks.session._rank_records import RunSoFar, ShareVote, StepColumns, StepReportRow, WarmupColumns

    mine = StepReportRow(StepColumns(10.0, 2.0, 4.0, 128.0, 0.0, 100.0), WarmupColumns(1.0, 0.5, 1.0),
                         RunSoFar(50.0, 9.0), ShareVote(0.25), (1.0, 2.0, 3.0))  # fmt: skip
    peer = StepReportRow(StepColumns(30.0, 3.0, 3.0, 96.0, 0.0, 90.0), WarmupColumns(), RunSoFar(70.0, 8.0),
                         ShareVote(0.5), (4.0,) * 3)  # fmt: skip
    assert StepReportRow.of(mine.values(), so_far=True) == mine
    alone = StepReportRow(mine.steps, mine.warmup)
    assert StepReportRow.of(alone.values(), so_far=False) == alone  # one process: no run so far on the wire
    steps = StepColumns.reduce([mine.steps, peer.steps])
    assert (steps.energy_J, steps.time_s, steps.steps, steps.power_samples) == (40.0, 3.0, 3.0, 190.0)
    assert RunSoFar.reduce([mine.so_far, peer.so_far]) == RunSoFar(120.0, 9.0)  # energy sums, time the slowest
    assert ShareVote.reduce([mine.share, peer.share]) == ShareVote(0.25)  # every rank draws at the least share
    assert mine.steps.plus(StepColumns()) == mine.steps  # a report without steps adds nothing
    assert mine.warmup.plus(peer.warmup) == mine.warmup
    with pytest.raises(ValueError):
        RunSoFar.reduce([])


@pytest.mark.parametrize(
    ("configured", "given", "given_by", "expected"),
    [
        (5000, 60, "trainer", (5000, "config")),  # a configured length wins over the framework's
        (None, 60, "trainer", (60, "trainer")),
        (None, 60, "train_start", (60, "train_start")),
        (None, 0, "trainer", (None, None)),  # nothing left, or an endless fit: unknown
        (None, None, "train_start", (None, None)),
    ],
)
def test_job_length_says_where_it_came_from(configured, given, given_by, expected):
    assert job_length(configured, given, given_by) == expected
