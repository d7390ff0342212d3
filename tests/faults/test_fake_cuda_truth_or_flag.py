"""The truth-or-flag suite on the fake CUDA timeline (issue 27 item 3), and the regression of issue 27's HF job.

Seeded random schedules (tests/faults/fake_cuda_schedules.py) over both boundary timers (clock marks,
CUDA-event marks on :class:`tests.fakes.fake_cuda.FakeCuda`) and both adapters' hook orders (Lightning,
Hugging Face), each played through a real EnergySession: no figure negative or NaN, every step window
where the hooks put it, every figure within tolerance of the truth on the GPU timeline or null or
flagged, and the epoch ledger closed wherever the records carry one. The session ends with the line
``fake-cuda truth-or-flag: N schedules (clock: a, cuda: b; lightning-order: c, hf-order: d), V violations``
(tests/faults/tally.py).
"""

from __future__ import annotations

import dataclasses

import pytest

from tests.fakes.fake_cuda import FakeCuda
from tests.faults import tally
from tests.faults.fake_cuda_schedules import Plan, draw_plan, play
from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.backends.virtual import VirtualGPUBackend
from zeus_callbacks.measurement._windows import CudaEventTimer

SCHEDULES_PER_CASE = 520  # x 2 timers x 2 orders: > 2,000 schedules per CI run (issue 27 "Done when")
CASES = [(timer, order) for timer in ("clock", "cuda") for order in ("lightning", "hf")]


def _tally(plan: Plan, bad: list[str], ledgers: int, known: int) -> None:
    counts = tally.CUDA
    counts["known"] += known
    counts["schedules"] += 1
    counts[plan.timer] += 1
    counts[plan.order] += 1
    counts["violations"] += bool(bad)
    counts["ledgers"] += ledgers


@pytest.mark.parametrize(("timer", "order"), CASES, ids=[f"{t}-{o}" for t, o in CASES])
def test_every_figure_is_true_or_flagged_on_the_cuda_timeline(timer, order):
    failures = []
    for seed in range(SCHEDULES_PER_CASE):
        plan = draw_plan(seed, timer, order)
        try:
            outcome = play(plan)
        except Exception as exc:  # a crash of the session is a violation too (and must not hide the others)
            bad, ledgers, known = [f"{type(exc).__name__}: {exc}"], 0, 0
        else:
            bad, ledgers, known = outcome.violations(), outcome.ledgers, len(outcome.known)
        _tally(plan, bad, ledgers, known)
        if bad:
            failures.append((plan, bad[:3]))
    assert not failures, f"{len(failures)} of {SCHEDULES_PER_CASE} schedules broke the invariant; first: {failures[:2]}"


# ---- the fake itself ------------------------------------------------------------------------------------
def test_the_host_runs_ahead_of_the_gpu_up_to_the_queue_depth():
    clock = ManualClock(0.0)
    cuda = FakeCuda(clock, queue_depth=2, launch_lag_s=0.001)
    assert cuda.launch(0.010) == pytest.approx((0.001, 0.011))
    assert cuda.launch(0.010) == pytest.approx((0.011, 0.021))
    assert clock.now_s() == 0.0  # two in flight: the host never waited
    cuda.launch(0.010)  # a full queue: the host waits for the first kernel to finish
    assert clock.now_s() == pytest.approx(0.011)
    event = cuda.Event(enable_timing=True)
    event.record()
    assert not event.query()
    start = cuda.Event(enable_timing=True)
    with pytest.raises(RuntimeError):
        start.elapsed_time(event)  # never recorded
    start.record()
    with pytest.raises(RuntimeError):
        start.elapsed_time(event)  # not complete yet
    cuda.item()  # a synchronising read
    assert clock.now_s() == pytest.approx(0.031) and event.query()
    assert start.elapsed_time(event) == pytest.approx(0.0)


def test_the_power_follows_the_gpu_not_the_host():
    clock = ManualClock(100.0)
    backend = VirtualGPUBackend(clock=clock, noise_W=0.0, read_only=True, utilization=0.0)
    cuda = FakeCuda(clock, backend=backend, queue_depth=8)
    for _ in range(4):
        cuda.launch(0.005)  # queued back to back: one busy stretch of 20 ms
    assert cuda.busy == [(pytest.approx(100.0), pytest.approx(100.02))]
    assert backend.true_power_W(0, 100.019) == pytest.approx(cuda.busy_W)
    assert backend.true_power_W(0, 100.021) == pytest.approx(cuda.idle_W)
    assert cuda.true_energy_J(100.0, 100.03) == pytest.approx(0.02 * cuda.busy_W + 0.01 * cuda.idle_W)


def test_cuda_event_marks_land_at_the_gpu_time():
    clock = ManualClock(5.0)
    cuda = FakeCuda(clock, queue_depth=4)
    timer = CudaEventTimer(clock, cuda=cuda)
    cuda.launch(0.010)
    token = timer.mark()  # recorded now, reached when the kernel ends
    assert timer.time_of(token) is None
    assert timer.time_of(token, wait=True) == pytest.approx(5.010)


def test_the_suite_is_not_vacuous():
    """A schedule with lagging CUDA marks, evaluation, accumulation and logging checks real figures."""
    plan = dataclasses.replace(draw_plan(0, "cuda", "hf"), epochs=(6,), eval_every=2, accumulate=2, queue_depth=4)
    outcome = play(plan)
    checked = [f for f in outcome.figures if not f.flagged and f.value is not None]
    assert any("steps" in f.what for f in checked) and any("eval" in f.what for f in checked)
    assert not outcome.violations()


# ---- issue 27's Hugging Face job ------------------------------------------------------------------------
ISSUE_27_HF = Plan(
    seed=27,
    timer="cuda",
    order="hf",
    epochs=(45, 45),
    accumulate=1,
    queue_depth=4,  # CUDA-event marks lag the host
    launch_lag_s=2e-5,
    eval_every=20,  # eval_strategy="steps", eval_steps=20
    eval_at_epoch_end=False,
    eval_batches=3,
    log_every=10,  # logging_steps=10 (the loss read by .item())
    save_every=0,
    resume_at=None,
    hf_attached=True,
    sample_fraction=1.0,  # windows.sample_fraction: 1
    phases=False,
    gpu_ms=(8.0, 12.0),
    host_ms=(1.0, 3.0),
    fetch_ms=(0.0, 1.0),
)


@pytest.mark.parametrize("attached", [True, False], ids=["attached", "fallback"])
def test_issue_27_hf_evaluation_inside_the_epoch_gives_no_negative_step(attached):
    """HF order, evaluation every 20 steps, a log every 10, lagging CUDA marks, every step measured.

    On main before the fix the step after each evaluation opened at the evaluation's end mark only after
    that mark's time had been read and forgotten (``EnergySession.eval_end`` attributed first): the step
    window then took a later mark's time for its start (negative ``time_s_mean`` / ``energy_J_mean``), or
    the time lookup raised ``LookupError`` inside the Trainer's ``on_log``.
    """
    outcome = play(dataclasses.replace(ISSUE_27_HF, hf_attached=attached))
    assert not outcome.violations(), outcome.violations()[:5]
