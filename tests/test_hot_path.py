"""The training thread's hot path: pooled CUDA events, shared boundary marks, ranged sampler reads."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lightning.pytorch.utilities.data import extract_batch_size

from zeus_callbacks import ZeusCallback
from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.backends.virtual import VirtualGPUBackend
from zeus_callbacks.integrations.lightning import _batch_size
from zeus_callbacks.measurement._ring import TimeSeriesRing
from zeus_callbacks.measurement._sampler import PowerSampler
from zeus_callbacks.measurement._windows import ClockTimer, CudaEventTimer, WindowMeter
from zeus_callbacks.reporting import read_jsonl
from zeus_callbacks.session import EnergySession


class LaggingGPU:
    """A stand-in for ``torch.cuda`` whose GPU reaches recorded events only when the test says so.

    Each event remembers the manual-clock time it was recorded at (its GPU time) and
    whether that time has been read (``elapsed_time`` with it as the end). Recording an
    event again before its time was read is a violation, kept in ``violations``.
    """

    def __init__(self, clock) -> None:
        self.clock = clock
        self.recorded = 0  # records so far (in order)
        self.reached = 0  # the GPU has completed the first `reached` records
        self.violations: list[str] = []
        gpu = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                assert enable_timing
                self.seq: int | None = None
                self.t_s: float | None = None
                self.read = True

            def record(self, stream=None) -> None:
                if not self.read:
                    gpu.violations.append(f"event of record {self.seq} recorded again before its time was read")
                self.seq, self.t_s, self.read = gpu.recorded, gpu.clock.now_s(), False
                gpu.recorded += 1

            def query(self) -> bool:
                return self.seq is not None and self.seq < gpu.reached

            def synchronize(self) -> None:
                gpu.reached = max(gpu.reached, self.seq + 1)

            def elapsed_time(self, end) -> float:
                if not (self.query() and end.query()):
                    raise RuntimeError("cudaErrorNotReady")
                end.read = True
                return (end.t_s - self.t_s) * 1e3  # ms, as torch.cuda.Event

        self.Event = Event

    def synchronize(self) -> None:
        self.reached = self.recorded

    def current_stream(self):
        return "stream"


def test_event_pool_never_records_an_event_again_before_its_time_was_read(manual_clock):
    gpu = LaggingGPU(manual_clock)
    timer = CudaEventTimer(manual_clock, cuda=gpu)
    rng = np.random.default_rng(0)
    marks: list[tuple[int, float]] = []
    for _ in range(300):
        manual_clock.advance(float(rng.uniform(1e-4, 2e-3)))
        marks.append((timer.mark(), manual_clock.now_s()))
        if rng.random() < 0.3:  # the GPU catches up part of the way
            gpu.reached = int(rng.integers(gpu.reached, gpu.recorded + 1))
        if rng.random() < 0.2:
            timer.read()
    assert timer.time_of(marks[-1][0], wait=True) == pytest.approx(marks[-1][1])
    assert gpu.violations == []
    for token, t_s in marks:
        assert timer.time_of(token) == pytest.approx(t_s, abs=1e-9)
    # Events were reused: far fewer created than marks (the anchor's included).
    assert timer.events_created < len(marks) / 3


def test_marks_the_gpu_has_not_reached_have_no_time_yet(manual_clock):
    gpu = LaggingGPU(manual_clock)
    timer = CudaEventTimer(manual_clock, cuda=gpu)
    first = timer.mark()
    manual_clock.advance(0.01)
    second = timer.mark()
    assert timer.time_of(first) is None and timer.time_of(second) is None
    gpu.reached = gpu.recorded - 1  # the GPU reached the first mark only
    assert timer.time_of(second) is None
    assert timer.time_of(first) == pytest.approx(manual_clock.now_s() - 0.01)
    assert timer.pool_size == 1  # the first mark's event is free again; the second's is not
    assert timer.time_of(second, wait=True) == pytest.approx(manual_clock.now_s())
    assert gpu.violations == []


def test_forgotten_marks_raise_and_the_meter_keeps_the_timer_small(manual_clock):
    backend = VirtualGPUBackend(clock=manual_clock, noise_W=0.0, read_only=True)
    gpu = LaggingGPU(manual_clock)
    timer = CudaEventTimer(manual_clock, cuda=gpu)
    sampler = PowerSampler(backend, [0], sensor_delay_s=backend.sensor_delay_s)
    meter = WindowMeter(sampler, timer)
    run_start_s = manual_clock.now_s()
    meter.begin("run")
    records = []
    for _ in range(20):
        token = meter.mark()
        meter.begin_at("w", token)
        manual_clock.advance(0.05)
        meter.end_at("w", meter.mark())
        sampler.poll_once()
        gpu.synchronize()
        records += meter.resolve()
    manual_clock.advance(2 * backend.sample_period_s)
    sampler.poll_once()
    records += meter.resolve()
    assert len(records) == 20
    assert len(timer._times) <= 2  # read times kept only while a window still needs them
    with pytest.raises(LookupError):
        timer.time_of(1)
    power_W = backend.true_power_W(0)
    for r in records:
        assert r.energy_J == pytest.approx(power_W * 0.05, rel=1e-6)
    meter.end("run")
    (run,) = meter.resolve(final=True)
    assert (run.start_s, run.end_s) == (pytest.approx(run_start_s), pytest.approx(manual_clock.now_s()))
    assert gpu.violations == []
    backend.close()


class CountingTimer:
    """A boundary timer that counts the marks taken through it (``marks``) and delegates everything else."""

    def __init__(self, timer) -> None:
        self._timer = timer
        self.marks = 0

    def mark(self):
        self.marks += 1
        return self._timer.mark()

    def __getattr__(self, name: str):
        return getattr(self._timer, name)  # anchor, read, time_of, tokens_are_times, ...


def collect(records: list):
    """A session's window_observer that keeps each attributed step and phase window in ``records``, one record each."""
    return lambda batch: records.extend(batch.records())


def phase_session(tmp_path, clock, timer: str, *, interval_steps: int, window_observer=None, **backend_kwargs):
    """A session with phase windows on a virtual GPU; ``timer="cuda"``: CUDA events on a LaggingGPU stand-in.

    Its boundary timer counts its marks: ``session.run.timer.marks`` once the run has started.
    """
    backend = VirtualGPUBackend(clock=clock, read_only=True, **backend_kwargs)
    cfg = {"backend": "virtual", "windows": {"phases": True, "sample_fraction": 1.0},
           "logging": {"log_dir": str(tmp_path), "interval_steps": interval_steps}}  # fmt: skip
    gpu = LaggingGPU(clock)

    def timer_factory(b):
        return CountingTimer(CudaEventTimer(b.clock, cuda=gpu) if timer == "cuda" else ClockTimer(b.clock))

    session = EnergySession(cfg, backend=backend, timer_factory=timer_factory, window_observer=window_observer)
    return session, backend, gpu


def run_phase_steps(session: EnergySession, clock, steps: int, *, loading_s=lambda i: 0.002, gpu=None) -> None:
    """Steps of 3 + 5 + 1 ms phases after ``loading_s(i)`` of data loading; with ``gpu`` (a
    LaggingGPU), every fifth step the sensor is drained and the GPU catches up."""
    for i in range(steps):
        clock.advance(loading_s(i))  # data loading
        session.step_start(i, phase="forward")
        clock.advance(0.003)
        session.phase_switch("forward", "backward")
        clock.advance(0.005)
        session.phase_switch("backward", "optimizer")
        clock.advance(0.001)
        session.step_end(i, num_samples=8)
        if gpu is not None and i % 5 == 4:
            session.sampler.poll_once(read_counter=False)
            gpu.reached = gpu.recorded


@pytest.mark.parametrize("timer", ["clock", "cuda"])
def test_shared_boundary_marks_make_phases_tile_the_step_exactly(tmp_path, manual_clock, timer):
    absorbed = []  # the step and phase windows, one record each, from the batches the reports attributed
    session, backend, gpu = phase_session(
        tmp_path, manual_clock, timer, interval_steps=1000, noise_W=0.0, window_observer=collect(absorbed)
    )
    session.train_start()
    session.epoch_start(0)
    marks_before = gpu.recorded
    run_phase_steps(session, manual_clock, 5)
    marks_per_step = (gpu.recorded - marks_before) / 5
    session.epoch_end(0)
    session.train_end()
    if timer == "cuda":
        # One event per boundary: step start (= dataloader end = forward begin), forward end
        # (= backward begin), backward end (= optimizer begin), step end (= optimizer end).
        assert marks_per_step == 4
    by_name: dict[str, list] = {}
    for r in absorbed:
        by_name.setdefault(r.name, []).append(r)
    steps = by_name["step"]
    assert len(steps) == 5
    for k, step in enumerate(steps):
        load = by_name["dataloader"][k]  # the batch fetch before the step is the step's first phase
        fwd, bwd, opt = by_name["forward"][k], by_name["backward"][k], by_name["optimizer"][k]
        assert load.start_s == step.start_s and load.end_s == fwd.start_s and opt.end_s == step.end_s
        assert fwd.end_s == bwd.start_s and bwd.end_s == opt.start_s
        assert load.time_s + fwd.time_s + bwd.time_s + opt.time_s == pytest.approx(step.time_s, abs=1e-12)
        assert step.time_s == pytest.approx(0.009 + 0.002)  # 2 ms of loading + 9 ms of compute
        warmup = {"warmup": True} if k == 0 else {}  # windows.warmup_steps: the run's first step
        # measure_probability: its chance of being measured (every step is: 1), the weight of issue 31.
        # evaluations_before: two windows with an evaluation between hold more than steps between them.
        info = {"step": k, "run_step": k, "num_samples": 8, "num_tokens": None, "measure_probability": 1.0,
                "evaluations_before": 0}  # fmt: skip
        assert step.info == {**info, **warmup}
        if k:  # the steps tile the epoch: one mark ends a step and begins the next
            assert step.start_s == steps[k - 1].end_s
    assert gpu.violations == []
    backend.close()


def test_ring_reads_from_a_time_on_match_the_whole_buffer():
    ring = TimeSeriesRing(16)
    for n in range(1, 40):
        ring.append(float(n), 10.0 * n)
        t, v = ring.arrays()
        for since in (-1.0, 0.5, t[0], t[len(t) // 2] + 0.5, t[-1], t[-1] + 3.0):
            ts, vs = ring.arrays(since)
            first = max(0, int(np.searchsorted(t, since, side="right")) - 1)
            assert ts.tolist() == t[first:].tolist() and vs.tolist() == v[first:].tolist(), (n, since)


@pytest.mark.parametrize(
    "batch",
    [
        torch.zeros(7, 3),
        (torch.zeros(5, 2), torch.zeros(5)),
        [torch.zeros(4, 2), torch.zeros(4, 1)],
        (torch.zeros(5, 2), torch.zeros(3)),  # ambiguous: Lightning's first size
        {"x": torch.zeros(6, 2)},
        {"x": torch.zeros(6, 2), "y": torch.zeros(4)},  # ambiguous: Lightning's first size
        {"x": torch.zeros(3, 2), "ids": [1, 2, 3]},  # not all tensors: Lightning's walk
        [torch.zeros(4, 2), torch.tensor(1.0)],  # a 0-d tensor among them: Lightning's walk
        (torch.zeros(2, 2), "label"),
        torch.tensor(3.0),
    ],
)
def test_batch_size_fast_path_agrees_with_lightning(batch):
    assert _batch_size(batch) == extract_batch_size(batch)


def test_cached_state_key_is_lightnings_own(tmp_path):
    callback = ZeusCallback({"backend": "virtual", "job_id": "job-a", "logging": {"log_dir": str(tmp_path)}})
    expected = callback._generate_state_key(job_id="job-a")
    assert callback.state_key == expected
    assert callback.state_key is callback.state_key  # built once, not at every hook call


# -- one mark per measured step (issue 16, item 4) ------------------------------------------------
def _step_session(tmp_path, clock, fraction: float, *, window_observer=None, **windows):
    """A session on a virtual GPU timed with CUDA events on a LaggingGPU stand-in."""
    backend = VirtualGPUBackend(clock=clock, noise_W=0.0, read_only=True)
    cfg = {"backend": "virtual", "windows": {"sample_fraction": fraction, **windows},
           "logging": {"log_dir": str(tmp_path), "interval_steps": 20}}  # fmt: skip
    gpu = LaggingGPU(clock)
    session = EnergySession(
        cfg, backend=backend, timer_factory=lambda b: CudaEventTimer(b.clock, cuda=gpu), window_observer=window_observer
    )
    return session, backend, gpu


def test_a_measured_step_records_one_cuda_event_and_the_steps_tile_the_epoch(tmp_path, manual_clock):
    absorbed = []
    session, backend, gpu = _step_session(tmp_path, manual_clock, 1.0, window_observer=collect(absorbed))
    session.train_start()
    before_epoch = gpu.recorded
    session.epoch_start(0)
    # The epoch's re-anchoring event, then one mark: the epoch's start and its first step's.
    assert gpu.recorded - before_epoch == 2
    steps = 100
    marks_before = gpu.recorded
    for i in range(steps):
        manual_clock.advance(0.002)  # the batch fetch
        session.step_start(i)  # no mark: the step opened at the last boundary
        manual_clock.advance(0.008)
        session.step_end(i)  # one mark: this step's end, the next step's start
        if i % 10 == 9:
            session.sampler.poll_once(read_counter=False)
            gpu.reached = gpu.recorded
    marks_per_step = (gpu.recorded - marks_before) / steps
    manual_clock.advance(0.001)  # the epoch's tail after its last step
    session.epoch_end(0)
    summary = session.train_end()
    assert marks_per_step == 1  # two (a begin and an end) before the windows tiled
    assert gpu.violations == []
    windows = [r for r in absorbed if r.name == "step"]
    assert [r.info["step"] for r in windows] == list(range(steps))
    for k, r in enumerate(windows):
        assert r.time_s == pytest.approx(0.010, abs=1e-9)  # fetch + compute
        if k:
            assert r.start_s == windows[k - 1].end_s
    (epoch,) = [r for r in read_jsonl(summary.jsonl_path) if r["event"] == "epoch"]
    assert sum(r.time_s for r in windows) == pytest.approx(epoch["time_s"] - 0.001, abs=1e-9)
    assert sum(r.energy_J for r in windows) == pytest.approx(
        epoch["energy_J"] * (epoch["time_s"] - 0.001) / epoch["time_s"], rel=1e-6
    )  # constant power: the steps hold all of the epoch but its 1 ms tail
    backend.close()


def test_a_sampled_step_takes_a_start_mark_only_after_an_unmeasured_step(tmp_path, manual_clock):
    absorbed = []
    session, backend, gpu = _step_session(tmp_path, manual_clock, 0.25, window_observer=collect(absorbed))
    session.train_start()
    session.epoch_start(0)
    marks_before = gpu.recorded
    steps = 400
    for i in range(steps):
        manual_clock.advance(0.002)
        session.step_start(i)
        manual_clock.advance(0.008)
        session.step_end(i)
        if i % 10 == 9:
            session.sampler.poll_once(read_counter=False)
            gpu.reached = gpu.recorded
    marks = gpu.recorded - marks_before
    session.epoch_end(0)
    session.train_end()
    windows = [r for r in absorbed if r.name == "step"]
    measured = sorted(r.info["step"] for r in windows)
    # One end mark per measured step, and a start mark at the end of each unmeasured step before
    # a measured one (the first step's start is the epoch's mark).
    after_unmeasured = sum(1 for s in measured if s > 0 and s - 1 not in measured)
    assert marks == len(measured) + after_unmeasured
    assert len(measured) < marks < 2 * len(measured)  # fewer than two per measured step
    assert all(r.time_s == pytest.approx(0.010, abs=1e-9) for r in windows)  # each holds its own fetch
    backend.close()


def test_a_window_opened_at_a_mark_already_read_keeps_its_start(manual_clock):
    """The Hugging Face evaluation's order on CUDA events: the eval window closes at mark C, its energy is
    attributed at once (the GPU has reached C), and only then does the next step's window open at C.

    The attribution let the timer forget every read mark, C included; the step's start was then read
    from a forgotten slot (a negative list index: a later mark's time), and the H200 printed steps of
    −2.6 ms and −0.2 J (issue 27). The newest mark is never forgotten now, and a start that was is no
    time at all: the window is impossible and dropped, never a figure.
    """
    backend = VirtualGPUBackend(clock=manual_clock, noise_W=0.0, read_only=True)
    gpu = LaggingGPU(manual_clock)
    timer = CudaEventTimer(manual_clock, cuda=gpu)
    sampler = PowerSampler(backend, [0], sensor_delay_s=backend.sensor_delay_s)
    meter = WindowMeter(sampler, timer)
    meter.begin("eval")
    manual_clock.advance(0.2)
    boundary = meter.mark()  # the evaluation ends, the next step begins
    meter.end_at("eval", boundary)
    gpu.synchronize()  # the evaluation's metrics were read: the GPU is done
    manual_clock.advance(2 * backend.sample_period_s)
    sampler.poll_once()
    (evaluation,) = meter.resolve()
    meter.begin_at("step", boundary)
    for _ in range(3):  # the step runs; other marks come and go (phases, later steps)
        manual_clock.advance(0.01)
        meter.begin_at("other", meter.mark())
        meter.end_at("other", meter.mark())
    meter.end_at("step", meter.mark())
    step_s = manual_clock.now_s() - evaluation.end_s  # from the shared boundary to the step's end mark
    manual_clock.advance(2 * backend.sample_period_s)
    sampler.poll_once()
    gpu.synchronize()
    steps = [r for r in meter.resolve(final=True) if r.name == "step"]
    assert [r.time_s for r in steps] == [pytest.approx(step_s)] and step_s > 0.03
    assert steps[0].start_s == pytest.approx(evaluation.end_s)
    assert steps[0].energy_J == pytest.approx(backend.true_power_W(0) * step_s, rel=1e-6)
    assert gpu.violations == []
    backend.close()


def _steps_records(tmp_path, *, lean: bool, fraction: float) -> list[dict]:
    """The ``steps`` records of a sampled run; ``lean``: step_end gets a wrong step and no counts where
    :attr:`EnergySession.step_end_reads_arguments` says it reads none (as the adapters call it)."""
    clock = ManualClock(1_000.0)  # any start: both runs see the same times
    absorbed: list = []
    session, backend, gpu = _step_session(tmp_path, clock, fraction, window_observer=collect(absorbed))
    session.train_start()
    # The sampler thread paused: what each report holds then depends on the polls below, not on when a
    # loaded machine ran that thread (the two runs differed so in a full suite).
    session.sampler.stop(final_drain=False)
    session.epoch_start(0)
    reads = 0
    for i in range(300):
        clock.advance(0.002)
        session.step_start(i)
        clock.advance(0.008)
        if not lean or session.step_end_reads_arguments:
            reads += 1
            session.step_end(i, num_samples=32, num_tokens=32 * (i % 7 + 1))
        else:
            session.step_end(-1)
        if i % 10 == 9:
            session.sampler.poll_once(read_counter=False)
            gpu.reached = gpu.recorded
    session.epoch_end(0)
    summary = session.train_end()
    backend.close()
    measured = sum(1 for r in absorbed if r.name == "step")
    assert 0 < measured and reads == (measured if lean else 300)  # lean: a measured step's end reads them
    return [r for r in read_jsonl(summary.jsonl_path) if r["event"] == "steps"]


@pytest.mark.parametrize("fraction", [0.25, 1.0])
def test_step_end_reads_its_arguments_only_where_the_session_says(tmp_path, fraction):
    """The adapters skip the batch walk (Lightning) where ``step_end_reads_arguments`` is False: same records."""
    full = _steps_records(tmp_path / "full", lean=False, fraction=fraction)
    lean = _steps_records(tmp_path / "lean", lean=True, fraction=fraction)
    assert full and lean == full
