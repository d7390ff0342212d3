"""Several processes seen from one rank with a mirrored peer (issue 26): evaluation energy and the sampled share.

The real two-process runs are in tests/distributed/test_ddp.py; here a fake group records every
collective, so what is exchanged (and what never is) is checked exactly.
"""

from __future__ import annotations

import pytest

from zeus_callbacks import reporting as metric
from zeus_callbacks._distributed import RankGroup
from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.backends.virtual import VirtualGPUBackend
from zeus_callbacks.measurement._overhead import WindowSampling
from zeus_callbacks.reporting import read_jsonl
from zeus_callbacks.session import EnergySession
from zeus_callbacks.session._rank_records import RunSoFar, StepColumns, WarmupColumns

SHARE_AT = StepColumns.width + WarmupColumns.width + RunSoFar.width  # a step report row's ShareVote column


class MirrorRanks:
    """Rank 0 of two; the peer sends ``peer(row)`` for each row this rank sends (default: the same row)."""

    num_processes = 2
    process_index = 0
    is_distributed = True

    def __init__(self, peer=None):
        self.peer = peer or (lambda row: list(row))
        self.gathers: list[list[float]] = []

    def gather(self, values):
        self.gathers.append(list(values))
        return [list(values), self.peer(list(values))]

    def broadcast(self, obj, src=0):
        return obj

    broadcast_outcome = RankGroup.broadcast_outcome


def start(tmp_path, monkeypatch, ranks, **windows):
    clock = ManualClock(1000.0)
    backend = VirtualGPUBackend(clock=clock, noise_W=0.0, read_only=True, sample_period_s=0.1)
    config = {
        "logging": {"interval_steps": 4, "log_dir": str(tmp_path), "run_name": "r"},
        "windows": {"warmup_steps": 0, **windows},
    }
    session = EnergySession(config, backend=backend, is_main_process=True)
    monkeypatch.setattr("zeus_callbacks._distributed.RankGroup.detect", lambda: ranks)
    session.train_start(run_name="r")
    return session, clock


def evaluation(session, clock, *, every_rank):
    session.eval_start()
    clock.advance(2.0)
    session.sampler.poll_once()
    return session.eval_end(report=True, every_rank=every_rank)


def test_an_evaluation_every_rank_runs_is_summed_over_the_ranks_at_its_end(tmp_path, monkeypatch):
    ranks = MirrorRanks()
    session, clock = start(tmp_path, monkeypatch, ranks)
    session.epoch_start(0)
    before = len(ranks.gathers)
    logged = evaluation(session, clock, every_rank=True)
    assert len(ranks.gathers) > before  # the ranks met at the evaluation's end
    session.epoch_end(0)
    session.train_end()
    (ev,) = [r for r in read_jsonl(tmp_path / "r.jsonl") if r["event"] == "eval"]
    (epoch,) = [r for r in read_jsonl(tmp_path / "r.jsonl") if r["event"] == "epoch"]
    assert ev["ranks"] == 2 and ev["ranks_note"] is None
    # The mirrored peer drew what this rank drew: the sum is twice this rank's, as the ledger's eval_J.
    assert ev["energy_J"] == pytest.approx(epoch["ledger"]["eval_J"], rel=1e-9)
    power_W = session.backend.true_power_W(session.gpu_indices[0])
    assert ev["energy_J"] == pytest.approx(2 * 2.0 * power_W, rel=0.05)  # two GPUs alike over 2 s
    assert logged[metric.EVAL_ENERGY_J] == pytest.approx(ev["energy_J"], rel=1e-9)
    assert ev["time_s"] == pytest.approx(2.0)


def test_an_evaluation_not_known_to_run_on_every_rank_waits_on_no_rank_and_says_it_is_this_ones(tmp_path, monkeypatch):
    # A user's trainer.evaluate() on rank 0 only: a collective here would wait for ever.
    ranks = MirrorRanks()
    session, clock = start(tmp_path, monkeypatch, ranks)
    session.epoch_start(0)
    before = len(ranks.gathers)
    logged = evaluation(session, clock, every_rank=False)
    session.evaluate({"val/acc": 0.5})
    assert len(ranks.gathers) == before  # no exchange: the peer may not be evaluating
    assert metric.EVAL_ENERGY_J not in logged  # no figure labelled as the job's
    session.epoch_end(0)
    session.train_end()
    records = read_jsonl(tmp_path / "r.jsonl")
    (ev,) = [r for r in records if r["event"] == "eval"]
    (epoch,) = [r for r in records if r["event"] == "epoch"]
    assert ev["ranks"] == 1 and "this process's GPUs only" in ev["ranks_note"]
    assert ev["energy_J"] == pytest.approx(epoch["ledger"]["eval_J"] / 2, rel=1e-9)  # one of two mirrored GPUs


def test_the_ranks_totals_leave_the_energy_out_until_power_samples_cover_the_runs_start(tmp_path, monkeypatch):
    # The first report (4 steps of 3 ms) comes before the first 0.1 s sample: the ranks' "so far" energy
    # summed each rank's uncovered GPU as 0 J, and totals() showed energy/total_J 0.0 until the next report.
    ranks = MirrorRanks()
    session, clock = start(tmp_path, monkeypatch, ranks)
    start_s = clock.now_s()
    session.epoch_start(0)
    for i in range(4):
        session.step_start(i)
        clock.advance(0.003)
        session.sampler.poll_once()
        session.step_end(i)
    assert ranks.gathers and session.sampler.latest_sample_s() is None  # the report's exchange, no sample yet
    totals = session.totals()
    assert metric.TOTAL_ENERGY_J not in totals, totals  # not measured: left out, never 0 J
    assert totals[metric.TOTAL_TIME_S] == pytest.approx(0.012, rel=1e-6)
    assert session.progress_bar_metrics() == {}
    # The next report, with samples past the start: both (mirrored) GPUs' measured energy.
    for i in range(4, 8):
        session.step_start(i)
        clock.advance(0.05)
        session.sampler.poll_once()
        session.step_end(i)
    totals = session.totals()
    elapsed_s = clock.now_s() - start_s
    power_W = session.backend.true_power_W(session.gpu_indices[0])
    assert totals[metric.TOTAL_ENERGY_J] == pytest.approx(2 * power_W * elapsed_s, rel=1e-6)
    assert totals[metric.TOTAL_TIME_S] == pytest.approx(elapsed_s, rel=1e-6)
    session.train_end()


def run_steps(session, clock, steps):
    for i in range(steps):
        session.step_start(i)
        clock.advance(0.5)
        session.sampler.poll_once()
        session.step_end(i)


def test_auto_sampling_takes_the_least_share_the_ranks_want_at_each_report(tmp_path, monkeypatch):
    def peer(row):  # the peer's budget allows 5 % of the steps (a step report row: its share column)
        if len(row) == SHARE_AT + 2:  # the row, then the degraded flag
            row[SHARE_AT] = 0.05
        return row

    session, clock = start(tmp_path, monkeypatch, MirrorRanks(peer))
    session.epoch_start(0)
    sampling = session.sampling
    assert sampling.auto and sampling.shared and sampling.fraction == 1.0
    run_steps(session, clock, 4)  # the first report (at step 4)
    assert sampling.fraction == pytest.approx(0.05)  # this rank's own budget allows every step
    assert sampling.report_every == 4  # a collective: the configured cadence on every rank
    session.train_end()


def test_a_shared_sampling_changes_its_share_only_when_the_ranks_agree():
    sampling = WindowSampling(None, 0.01, 4, stretch_reports=False, shared=True)
    sampling.observe(steps=10, elapsed_s=0.01, hook_s=0.005, measured=10, report_s=0.0)
    assert sampling.wanted < 0.1 and sampling.fraction == 1.0  # proposed, not in force
    sampling.agree(0.2)
    assert sampling.fraction == 0.2
    alone = WindowSampling(None, 0.01, 4, stretch_reports=True)
    alone.observe(steps=10, elapsed_s=0.01, hook_s=0.005, measured=10, report_s=0.0)
    assert alone.fraction == alone.wanted < 0.1  # one process: its own share at once
    # Two ranks agreeing on one share from one seed draw the same gaps.
    a, b = (WindowSampling(None, 0.01, 4, stretch_reports=False, shared=True) for _ in range(2))
    a.agree(0.1)
    b.agree(0.1)
    assert [a.next_skip() for _ in range(50)] == [b.next_skip() for _ in range(50)]


def test_a_report_where_only_some_ranks_measured_steps_waits_for_the_next_or_ends_null_and_says_why(
    tmp_path, monkeypatch
):
    lagging = {"reports": 1}  # the peer's samples lag at this many step reports

    def peer(row):  # the peer has attributed no step yet in this report
        if len(row) == SHARE_AT + 2 and lagging["reports"]:
            lagging["reports"] -= 1
            row[: StepColumns.width] = list(StepColumns().values())
        return row

    session, clock = start(tmp_path, monkeypatch, MirrorRanks(peer), sample_fraction=1)
    session.epoch_start(0)
    run_steps(session, clock, 4)
    assert metric.STEP_ENERGY_J not in session.pop_metrics()  # one GPU's mean is not the job's
    # The next report: both ranks have steps, and this rank's carried ones are in it (the newest step's
    # samples have not arrived: it waits, as with one process).
    run_steps(session, clock, 4)
    assert session.pop_metrics()[metric.STEP_COUNT] == 7
    lagging["reports"] = 10  # from here the peer has none: at the run's end every window is attributed
    run_steps(session, clock, 2)
    session.train_end()
    steps = [r for r in read_jsonl(tmp_path / "r.jsonl") if r["event"] == "steps"]
    assert [(r["count"], r["steps"]) for r in steps] == [(7, 7), (0, 3)]  # a record per report with all ranks
    assert steps[0]["energy_J_mean"] > 0 and steps[1]["energy_J_mean"] is None
    assert "only 1 of 2 ranks had measured steps" in steps[1]["incomplete_reason"] and not steps[1]["complete"]
