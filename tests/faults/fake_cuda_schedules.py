"""Random training schedules on the fake CUDA timeline, played through a real EnergySession (issue 27 item 3).

A :class:`Plan` is a short run drawn from a seed: epochs of steps (GPU work of random length on
the fake's one stream, host overhead, a batch fetch), gradient accumulation, evaluation inside the
epoch, logging that synchronises (``.item()``), checkpoint saves between steps, and possibly a
resume (the run is interrupted after a checkpoint and a new session continues from its state).
:func:`play` drives :class:`~zeus_callbacks.session.EnergySession` with the hook order of one adapter
(``"lightning"``: ``ZeusCallback``; ``"hf"``: ``ZeusTrainerCallback``, attached or not) and one timer
(``"clock"``: :class:`~zeus_callbacks.measurement._windows.ClockTimer`; ``"cuda"``:
:class:`~zeus_callbacks.measurement._windows.CudaEventTimer` on :class:`tests.fakes.fake_cuda.FakeCuda`,
through the session's ``timer_factory`` seam). The power is the virtual GPU's, busy exactly while
the fake GPU runs a kernel.

The truth of a boundary is where the timer promises to put it: the GPU time an event recorded at
the hook completes at (CUDA events), the host's time of the hook (the clock). :func:`violations`
lists every figure that breaks the invariant: no negative or NaN figure in any record; each step
window's boundaries where the hooks put them; each ``steps`` record's means within tolerance of the
means of the windows it stands for, or flagged (``complete: false``, ``degraded``); each evaluation,
epoch and run within tolerance or null/flagged; and, where the records carry it, the epoch ledger
closes (warm-up + steps + eval + eval_tail + other = the epoch) and its ``eval_tail`` holds the truth of
the stretches from each evaluation's end to the next boundary (a step's start, an evaluation's start, the
epoch's start or end, the run's end).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tests.fakes.fake_cuda import FakeCuda
from tests.faults.scratch import scratch_dir
from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.backends.virtual import VirtualGPUBackend
from zeus_callbacks.measurement._windows import ClockTimer, CudaEventTimer, WindowBatch
from zeus_callbacks.reporting import read_jsonl
from zeus_callbacks.session import EnergySession

T0 = 10_000.0
SAMPLE_PERIOD_S = 0.002  # the virtual GPU's samples (a short period keeps the edge tolerance useful)
EDGE_S = SAMPLE_PERIOD_S * 1.5  # a boundary's error: the power change within one sample (and its jitter)
TIME_EPS_S = 1e-7  # event times pass through ms and an anchor: rounding only
ABS_EPS_J = 1e-6
REL_EPS = 1e-6
LEDGER_PARTS = ("warmup", "steps", "eval", "eval_tail", "other")


@dataclass(frozen=True)
class Plan:
    """One run, drawn by :func:`draw_plan`."""

    seed: int
    timer: str  # "clock" | "cuda"
    order: str  # "lightning" | "hf"
    epochs: tuple[int, ...]  # optimizer steps per epoch (Lightning: batches = steps × accumulate)
    accumulate: int
    queue_depth: int
    launch_lag_s: float
    eval_every: int  # evaluate every this many optimizer steps inside the epoch (0: at the epoch's end only)
    eval_at_epoch_end: bool
    eval_batches: int
    log_every: int  # a synchronising log every this many optimizer steps
    save_every: int  # a checkpoint save every this many optimizer steps (0: none)
    resume_at: int | None  # interrupt after this global optimizer step's save and resume (None: no resume)
    hf_attached: bool  # HF: the evaluation window opens as evaluate() is entered (else at the first prediction step)
    sample_fraction: float | str
    phases: bool
    gpu_ms: tuple[float, float]  # range of one micro-batch's GPU time (ms)
    host_ms: tuple[float, float]  # range of one micro-batch's host overhead (ms)
    fetch_ms: tuple[float, float]  # range of one batch fetch (ms)


def draw_plan(seed: int, timer: str, order: str) -> Plan:
    """A random small schedule for ``seed`` (deterministic)."""
    r = random.Random(seed * 7919 + (timer == "cuda") * 2 + (order == "hf"))
    epochs = tuple(r.randint(1, 7) for _ in range(r.choice((1, 1, 2))))
    total = sum(epochs)
    eval_every = r.choice((0, 0, 2, 3, 4))
    log_every = r.choice((1, 2, 5))
    save_every = r.choice((0, 0, 3, 4))
    resume_at = None
    if save_every and total > save_every and r.random() < 0.5:
        resume_at = save_every * r.randint(1, (total - 1) // save_every)
    gpu_lo = r.choice((0.2, 1.0, 3.0))
    host_lo = r.choice((0.05, 0.5, 2.0))
    return Plan(
        seed=seed,
        timer=timer,
        order=order,
        epochs=epochs,
        accumulate=r.choice((1, 1, 2, 3)),
        queue_depth=r.choice((1, 2, 4, 16)),
        launch_lag_s=r.choice((0.0, 2e-5, 5e-4)),
        eval_every=eval_every,
        eval_at_epoch_end=order == "lightning" and r.random() < 0.6,
        eval_batches=r.randint(1, 2),
        log_every=log_every,
        save_every=save_every,
        resume_at=resume_at,
        hf_attached=r.random() < 0.5,
        sample_fraction=r.choice((1.0, 1.0, 0.5, "auto")),
        phases=r.random() < 0.15,
        gpu_ms=(gpu_lo, gpu_lo * r.choice((1.0, 3.0, 10.0))),
        host_ms=(host_lo, host_lo * r.choice((1.0, 4.0))),
        fetch_ms=(0.0, r.choice((0.0, 0.5, 3.0))),
    )


@dataclass
class Figure:
    """One reported figure against its truth."""

    what: str
    value: float | None
    truth: float
    tolerance: float
    flagged: bool

    @property
    def violation(self) -> bool:
        """Neither right, nor null, nor flagged."""
        if self.value is None or self.flagged:
            return False
        if not math.isfinite(self.value):
            return True
        return abs(self.value - self.truth) > self.tolerance


@dataclass
class Outcome:
    """What one plan's runs reported, and what is wrong with it."""

    figures: list[Figure] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # negative/NaN figures, misplaced windows, open ledgers
    known: list[str] = field(default_factory=list)  # negative phase estimates (KNOWN_NEGATIVE): counted, not violations
    ledgers: int = 0  # epoch records that carried a ledger
    epochs: int = 0  # epoch records

    def violations(self) -> list[str]:
        """Every break of the invariant, as text."""
        bad = [f"{f.what}: {f.value!r} vs truth {f.truth:.6g} ± {f.tolerance:.3g}" for f in self.figures if f.violation]
        return self.problems + bad


class _Player:
    """Plays one plan: the fake GPU, the virtual power, the sessions and the truth of every boundary."""

    def __init__(self, plan: Plan, log_dir: Path) -> None:
        self.plan = plan
        self.log_dir = log_dir
        self.rng = random.Random(plan.seed)
        self.clock = ManualClock(T0)
        self.backend = VirtualGPUBackend(
            clock=self.clock, noise_W=0.0, read_only=True, utilization=0.0, sample_period_s=SAMPLE_PERIOD_S
        )
        self.cuda = FakeCuda(
            self.clock, backend=self.backend, queue_depth=plan.queue_depth, launch_lag_s=plan.launch_lag_s
        )
        self.session: EnergySession | None = None
        self.global_step = 0  # optimizer steps taken (all runs)
        self.run_step = 0  # session step_end calls (all runs): the windows' run_step
        self.boundary: float | None = None  # the last boundary a step window may open at
        self.step_truth: dict[int, tuple[float, float]] = {}  # run_step -> (start, end) boundary
        self.eval_truth: list[tuple[float, float]] = []
        self.epoch_truth: dict[int, tuple[float, float]] = {}
        self.eval_open: float | None = None
        self.tail_open: float | None = None  # an evaluation ended here: its tail is open until the next boundary
        self.tail_truth: list[tuple[float, float]] = []
        self.epoch_open: float | None = None
        self.epoch_index = 0
        self.runs: list[dict[str, Any]] = []  # per session: observed windows, record count at each, run truth
        self.writes = 0

    # -- the timeline ------------------------------------------------------------------
    def now_boundary(self) -> float:
        """Where a mark taken now lands: the GPU's reach (events) or the host's time (clock)."""
        return self.cuda.reach_s() if self.plan.timer == "cuda" else self.clock.now_s()

    def ms(self, span: tuple[float, float]) -> float:
        return self.rng.uniform(*span) / 1e3

    def poll(self) -> None:
        assert self.session is not None and self.session.sampler is not None
        self.session.sampler.poll_once()

    # -- sessions ------------------------------------------------------------------------
    def start_session(self, state: dict[str, Any] | None) -> None:
        plan = self.plan
        run: dict[str, Any] = {"windows": []}

        def observer(batch: WindowBatch) -> None:
            run["windows"].append((self.writes, batch))

        def timer_factory(backend: Any) -> Any:
            if plan.timer == "cuda":
                return CudaEventTimer(backend.clock, cuda=self.cuda)
            return ClockTimer(backend.clock)

        session = EnergySession(
            {
                "backend": "virtual",
                "windows": {"sample_fraction": plan.sample_fraction, "phases": plan.phases},
                "logging": {"log_dir": str(self.log_dir), "run_name": f"run{len(self.runs)}", "interval_steps": 4},
            },
            backend=self.backend,
            is_main_process=True,
            timer_factory=timer_factory,
            window_observer=observer,
        )
        if state is not None:
            session.load_state_dict(state)
        self.session = session
        session.train_start()
        session.sampler.stop(final_drain=False)  # the test plays the sampler thread, on the fake clock
        log = session.run.log
        write = log.write

        def counted(record: dict[str, Any]) -> None:
            self.writes += 1
            write(record)

        log.write = counted  # type: ignore[method-assign]  # count the records, to pair them with the windows
        flush = session.run.flush_sensor

        def waited_flush(until_s: float, *, read_counter: bool = True) -> None:
            # On hardware the session's wait for the sensor (eval end, epoch end) lasts until a sample covers
            # until_s: the clock moves on (the GPU reaches its marks meanwhile). The manual clock stands still.
            self.clock.advance(2 * SAMPLE_PERIOD_S)  # a sample (period + jitter) past until_s
            self.poll()
            flush(until_s, read_counter=read_counter)

        session.run.flush_sensor = waited_flush  # type: ignore[method-assign]
        self.writes = 0
        run["start"] = self.now_boundary()
        run["carried_J"] = float(state["energy_J"]) if state is not None else 0.0
        self.runs.append(run)

    def end_session(self, *, interrupted: bool = False) -> None:
        session = self.session
        assert session is not None
        run = self.runs[-1]
        end = self.now_boundary()
        summary = session.exception(KeyboardInterrupt()) if interrupted else session.train_end()
        assert summary is not None
        run["end"] = end
        self.close_tail(end)
        if self.epoch_open is not None:  # cut short: the run's end closes the epoch window
            self.epoch_truth[self.epoch_index] = (self.epoch_open, end)
            self.epoch_open = None
        run["summary"] = summary
        run["records"] = read_jsonl(summary.jsonl_path)
        run["eval_truth"] = self.eval_truth
        run["epoch_truth"] = self.epoch_truth
        run["tail_truth"] = self.tail_truth
        self.eval_truth, self.epoch_truth, self.tail_truth = [], {}, []
        self.session = None

    # -- hooks with their truth ------------------------------------------------------------
    def epoch_start(self, epoch: int) -> None:
        assert self.session is not None
        self.session.epoch_start(epoch)
        self.boundary = self.epoch_open = self.now_boundary()  # after the anchor's sync: where the mark lands
        self.close_tail(self.boundary)
        self.epoch_index = epoch

    def close_tail(self, at: float) -> None:
        """The boundary at ``at`` ends an evaluation's open tail (the session's eval_tail window)."""
        if self.tail_open is not None:
            self.tail_truth.append((self.tail_open, at))
            self.tail_open = None

    def epoch_end(self, epoch: int) -> None:
        assert self.session is not None
        end = self.now_boundary()
        self.close_tail(end)
        self.session.epoch_end(epoch, report=self.plan.order == "hf")
        if self.plan.order == "lightning":
            self.session.pop_metrics()
        assert self.epoch_open is not None
        self.epoch_truth[epoch] = (self.epoch_open, end)
        self.epoch_open = self.boundary = None

    def step_start(self, step: int, phase: str) -> None:
        assert self.session is not None
        if self.boundary is None:  # no boundary before it: the step opens here
            self.boundary = self.now_boundary()
        self.close_tail(self.boundary)  # after an evaluation: the step's start mark ends its tail
        self.session.step_start(step, phase=phase)

    def step_end(self, step: int) -> None:
        assert self.session is not None
        end = self.now_boundary()
        assert self.boundary is not None
        self.step_truth[self.run_step] = (self.boundary, end)
        self.session.step_end(step, num_samples=8)
        self.run_step += 1
        self.boundary = end

    def eval_start(self) -> None:
        assert self.session is not None
        self.eval_open = self.now_boundary()
        self.close_tail(self.eval_open)
        self.session.eval_start()

    def eval_end(self, *, report: bool) -> None:
        assert self.session is not None and self.eval_open is not None
        end = self.now_boundary()
        self.session.eval_end(report=report)
        self.eval_truth.append((self.eval_open, end))
        self.eval_open = None
        self.tail_open = end  # the session's eval_tail opens at the evaluation's end mark
        self.boundary = None  # what follows the evaluation is no step's: the next step opens at its step_start

    # -- work ----------------------------------------------------------------------------------
    def micro_batch(self, *, optimizer: bool) -> None:
        """Forward, backward (and the optimizer step) of one micro-batch: kernels and host time."""
        s, cuda, plan = self.session, self.cuda, self.plan
        assert s is not None
        cuda.launch(self.ms(plan.gpu_ms) * 0.4)
        cuda.host(self.ms(plan.host_ms) * 0.5)
        if plan.order == "lightning":
            s.phase_switch("forward", "backward")
        cuda.launch(self.ms(plan.gpu_ms) * 0.6)
        cuda.host(self.ms(plan.host_ms) * 0.3)
        if plan.order == "lightning":
            s.phase_switch("backward", "optimizer")
        if optimizer:
            if plan.order == "hf":
                s.phase_switch("forward_backward", "optimizer")
            cuda.launch(self.ms(plan.gpu_ms) * 0.2)
            cuda.host(self.ms(plan.host_ms) * 0.2)

    def evaluation(self) -> None:
        """One evaluation loop, in the adapter's order."""
        s, cuda, plan = self.session, self.cuda, self.plan
        assert s is not None
        if plan.order == "lightning":
            self.eval_start()
        elif plan.hf_attached:
            self.eval_start()  # attach(): the window opens as evaluate() is entered
        cuda.host(self.ms(plan.host_ms))  # the loop's set-up
        for b in range(plan.eval_batches):
            cuda.host(self.ms(plan.fetch_ms))
            cuda.launch(self.ms(plan.gpu_ms) * 0.4)
            cuda.host(self.ms(plan.host_ms) * 0.3)
            if plan.order == "hf" and b == 0 and not plan.hf_attached:
                self.eval_start()  # on_prediction_step after the first batch
            self.poll()
        cuda.item()  # the metrics are read: a sync
        if plan.order == "lightning":
            self.eval_end(report=False)
            s.pop_metrics()
            s.evaluate({"val_loss": 1.0})
        else:
            self.eval_end(report=True)  # on_log of the evaluation's log
            s.evaluate({"eval_loss": 1.0})  # on_evaluate
        self.poll()

    def checkpoint(self) -> dict[str, Any]:
        """A checkpoint save: the tensors are copied to the host (a sync), the session's state taken."""
        assert self.session is not None
        self.cuda.item()
        self.cuda.host(self.ms((0.5, 3.0)))
        return self.session.state_dict()

    # -- the whole plan ---------------------------------------------------------------------------
    def play(self) -> None:
        plan = self.plan
        self.start_session(None)
        resumed_from: int | None = None
        epoch = 0
        while epoch < len(plan.epochs):
            steps = plan.epochs[epoch]
            first = 0
            if resumed_from is not None:
                first, resumed_from = resumed_from, None
            if plan.order == "hf" or first == 0:
                self.epoch_start(epoch)
            restart = self.play_epoch(epoch, first, steps)
            if restart is not None:
                state, in_epoch = restart
                self.end_session(interrupted=True)
                self.start_session(state)
                if in_epoch >= steps:  # saved at the epoch's last step: resume at the next epoch
                    epoch += 1
                    continue
                resumed_from = in_epoch  # Lightning: no on_train_epoch_start, the first batch opens the epoch
                continue
            epoch += 1
        self.end_session()

    def play_epoch(self, epoch: int, first: int, steps: int) -> tuple[dict[str, Any], int] | None:
        """Play steps ``first..steps-1`` of ``epoch``; returns (state, step in epoch) when the run stops to resume."""
        plan, cuda = self.plan, self.cuda
        s = self.session
        assert s is not None
        for k in range(first, steps):
            if plan.order == "lightning":
                for micro in range(plan.accumulate):
                    cuda.host(self.ms(plan.fetch_ms))  # the batch fetch, before on_train_batch_start
                    if s.open_epoch is None:  # resumed mid-epoch: the first batch opens the epoch
                        self.epoch_start(epoch)
                    self.step_start(self.global_step, "forward")
                    last = micro == plan.accumulate - 1
                    self.micro_batch(optimizer=last)
                    if not last:
                        s.phase_discard("optimizer")
                    self.step_end(self.global_step)
                    s.pop_metrics()
                    self.poll()
                self.global_step += 1
            else:
                for _ in range(plan.accumulate):
                    cuda.host(self.ms(plan.fetch_ms))  # HF fetches the step's batches before on_step_begin
                self.step_start(self.global_step, "forward_backward")
                for micro in range(plan.accumulate):
                    self.micro_batch(optimizer=micro == plan.accumulate - 1)
                self.global_step += 1
                self.step_end(self.global_step)
                self.poll()
            if self.global_step % plan.log_every == 0:
                cuda.item()  # the loss is read
                if plan.order == "hf":
                    s.pop_metrics(flush_steps=True)
                    s.totals()
            last_in_epoch = k == steps - 1
            if plan.eval_every and self.global_step % plan.eval_every == 0 and not last_in_epoch:
                self.evaluation()
            if last_in_epoch and plan.eval_at_epoch_end:
                self.evaluation()
            if plan.save_every and self.global_step % plan.save_every == 0:
                state = self.checkpoint()
                if plan.resume_at == self.global_step:
                    return state, k + 1
            self.poll()
        self.epoch_end(epoch)
        return None


def play(plan: Plan) -> Outcome:
    """Play ``plan`` and judge every figure its runs reported."""
    with scratch_dir() as tmp:
        player = _Player(plan, Path(tmp))
        player.play()
        return _judge(player)


def _edges_near(cuda: FakeCuda, t: float) -> bool:
    """True when the GPU's power changes within EDGE_S of ``t``."""
    for start, end in cuda.busy:
        if start > t + EDGE_S:
            break
        if abs(start - t) <= EDGE_S or abs(end - t) <= EDGE_S:
            return True
    return False


def _truth(cuda: FakeCuda, a: float, b: float) -> tuple[float, float]:
    """(energy J, tolerance J) of ``[a, b]``."""
    delta_W = cuda.busy_W - cuda.idle_W
    energy = cuda.true_energy_J(a, b)
    tol = ABS_EPS_J + REL_EPS * energy + sum(delta_W * EDGE_S for t in (a, b) if _edges_near(cuda, t))
    return energy, tol


_NON_NEGATIVE_SUFFIXES = ("_J", "_s", "_W", "_mean", "_per_sample", "_per_token")
_SIGNED = frozenset({"energy_ci_J"})  # a phase's 95 % interval may reach below 0 (a bound, not a figure)
KNOWN_NEGATIVE: frozenset[str] = frozenset()  # none: an unresolved phase is null with its reason
"""Records whose negative figures are a known finding for another branch, counted apart (``Outcome.known``):
the FinGraV per-phase estimates (``windows.phases``) of a short epoch can fall below 0 J. The lead flips this."""


def _check_numbers(record: dict[str, Any], where: str, out: Outcome) -> None:
    """No negative figure, no NaN/inf anywhere in a record (nested lists and dicts included)."""

    def walk(key: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(str(k), v)
        elif isinstance(value, list):
            for v in value:
                walk(key, v)
        elif isinstance(value, float | int) and not isinstance(value, bool):
            if not math.isfinite(value):
                out.problems.append(f"{where}: {key} = {value}")
            elif value < 0 and key.endswith(_NON_NEGATIVE_SUFFIXES) and key not in _SIGNED:
                known = record.get("event") in KNOWN_NEGATIVE
                (out.known if known else out.problems).append(f"{where}: {key} = {value} < 0")

    walk("", {k: v for k, v in record.items() if k not in ("config",)})


def _bound_means(
    out: Outcome, where: str, record: dict[str, Any], cuda: FakeCuda, windows: list[tuple[float, float]],
    candidates: list[tuple[float, float]], between: int,
) -> None:  # fmt: skip
    """A steps record whose means hold ``between`` unwindowed steps: each mean within the bounds any such set gives."""
    if len(candidates) < between:
        out.problems.append(f"{where}: between_steps {between} but {len(candidates)} unwindowed steps in its range")
        return
    count = len(windows)
    if record.get("count") != count:
        out.problems.append(f"{where}: count {record.get('count')} but {count} windows before it")
        return
    flagged = record.get("complete") is False or bool(record.get("degraded"))
    n = count + between
    window_truths = [_truth(cuda, a, b) for a, b in windows]
    energies = sorted(_truth(cuda, a, b)[0] for a, b in candidates)
    times = sorted(b - a for a, b in candidates)
    base_J, base_tol = sum(t for t, _ in window_truths), sum(tol for _, tol in window_truths)
    base_s = sum(b - a for a, b in windows)
    candidates_tol = sum(_truth(cuda, a, b)[1] for a, b in candidates)
    for key, value, low, high, tol in (
        ("energy_J_mean", record["energy_J_mean"], base_J + sum(energies[:between]),
         base_J + sum(energies[len(energies) - between:]), base_tol + candidates_tol),
        ("time_s_mean", record["time_s_mean"], base_s + sum(times[:between]),
         base_s + sum(times[len(times) - between:]), 1e-6 * n),
    ):  # fmt: skip
        mid, half = (low + high) / (2 * n), (high - low + 2 * tol) / (2 * n)
        out.figures.append(Figure(f"{where} {key}", value, mid, half, flagged))


def _judge(player: _Player) -> Outcome:
    out = Outcome()
    cuda = player.cuda
    for n, run in enumerate(player.runs):
        records = run["records"]
        for i, r in enumerate(records):
            _check_numbers(r, f"run {n} record {i} ({r.get('event')})", out)
        # -- each step window where the hooks put it, and its energy
        windows: list[tuple[int, dict[str, Any], float, float, float, bool]] = []  # (writes, info, a, b, J, covered)
        for writes, batch in run["windows"]:
            steps = batch.select(batch.names == "step")
            for k in range(steps.size):
                info = steps.info(k)
                a, b = float(steps.start_s[k]), float(steps.end_s[k])
                energy = float(steps.energy_J[k])
                covered = bool(np.isfinite(energy) and steps.covered_s[k] >= (b - a) - 1e-9)
                windows.append((writes, info, a, b, energy, covered))
                truth = player.step_truth.get(info["run_step"])
                if truth is None:
                    out.problems.append(f"run {n}: a step window of unknown run_step {info['run_step']}")
                    continue
                ta, tb = truth
                if abs(a - ta) > TIME_EPS_S or abs(b - tb) > TIME_EPS_S:
                    out.problems.append(
                        f"run {n} step {info['run_step']}: window [{a:.6f}, {b:.6f}] but the hooks put it at "
                        f"[{ta:.6f}, {tb:.6f}] (time {b - a:.6f} s vs {tb - ta:.6f} s)"
                    )
        # -- each steps record against the windows it stands for
        taken = 0  # windows consumed by earlier steps records
        counted = [w for w in windows if w[5] and not w[1].get("warmup")]
        windowed = {w[1]["run_step"] for w in windows if w[5]}  # a stretch may hold a step not wholly covered
        after_step = -1  # the last run_step an earlier steps record's windows reached
        for i, r in enumerate(records):
            if r["event"] != "steps":
                continue
            mine = [w for w in counted[taken:] if w[0] < i]  # absorbed before record i was written (run_start: 0)
            between = r.get("between_steps") or 0
            if mine and between:
                # Steps without a window in the means, measured as the stretches that hold them: which stretches
                # the session took (no evaluation between, the samples covering them) is its rule, so the truth
                # is bounded: the mean over the windows and any `between` of the unwindowed steps in the record's
                # range lies between the means with the cheapest and with the dearest of them.
                last = max(w[1]["run_step"] for w in mine)
                spans = {k: player.step_truth[k] for k in range(after_step + 1, last) if k not in windowed}
                _bound_means(out, f"run {n} steps {i}", r, cuda, [player.step_truth[w[1]["run_step"]] for w in mine],
                             list(spans.values()), between)  # fmt: skip
                taken += len(mine)
                after_step = last
                continue
            if mine:
                after_step = max(w[1]["run_step"] for w in mine)
            if r.get("dropped_windows") and r.get("complete") is not False:  # dropped as impossible: said so
                out.problems.append(f"run {n} steps record {i}: {r['dropped_windows']} windows dropped, not flagged")
            count = r.get("count") or 0
            if count != len(mine):
                out.problems.append(f"run {n} steps record {i}: count {count} but {len(mine)} windows before it")
                continue
            taken += count
            if not count:
                continue
            flagged = r.get("complete") is False or bool(r.get("degraded"))
            truths = [_truth(cuda, *player.step_truth[w[1]["run_step"]]) for w in mine]
            # A record's means weigh each measured step by 1 / its chance of being measured (auto sampling):
            # the truth is the same weighted mean of the true steps.
            weights = [1.0 / w[1].get("measure_probability", 1.0) for w in mine]
            total_weight = sum(weights)
            true_J = sum(wt * t for wt, (t, _) in zip(weights, truths, strict=True)) / total_weight
            tol_J = sum(wt * tol for wt, (_, tol) in zip(weights, truths, strict=True)) / total_weight
            true_s = sum(
                wt * (player.step_truth[w[1]["run_step"]][1] - player.step_truth[w[1]["run_step"]][0])
                for wt, w in zip(weights, mine, strict=True)
            )
            out.figures.append(Figure(f"run {n} steps {i} energy_J_mean", r["energy_J_mean"], true_J, tol_J, flagged))
            out.figures.append(
                Figure(f"run {n} steps {i} time_s_mean", r["time_s_mean"], true_s / total_weight, 1e-6, flagged)
            )
        # -- evaluations, epochs, the run
        evals = [r for r in records if r["event"] == "eval"]
        if len(evals) != len(run["eval_truth"]):
            out.problems.append(f"run {n}: {len(evals)} eval records for {len(run['eval_truth'])} evaluations")
        for r, (a, b) in zip(evals, run["eval_truth"], strict=False):
            truth, tol = _truth(cuda, a, b)
            out.figures.append(Figure(f"run {n} eval at {r['step']}", r["energy_J"], truth, tol, False))
            out.figures.append(Figure(f"run {n} eval time at {r['step']}", r["time_s"], b - a, 1e-6, False))
        for r in records:
            if r["event"] != "epoch":
                continue
            out.epochs += 1
            a, b = run["epoch_truth"][r["epoch"]]
            truth, tol = _truth(cuda, a, b)
            flagged = r.get("complete") is False or bool(r.get("degraded"))
            out.figures.append(Figure(f"run {n} epoch {r['epoch']}", r["energy_J"], truth, tol, flagged))
            _check_ledger(r, f"run {n} epoch {r['epoch']}", out)
            ledger = r.get("ledger")
            if ledger is not None:  # the tails that begin inside the epoch: the ledger's eval_tail
                tails = [(ta, tb) for ta, tb in run["tail_truth"] if a <= ta <= b]
                parts = [_truth(cuda, ta, tb) for ta, tb in tails]
                where = f"run {n} epoch {r['epoch']} eval_tail"
                tail_J, tail_tol = sum(t for t, _ in parts), sum(tol for _, tol in parts)
                out.figures.append(Figure(f"{where}_J", ledger.get("eval_tail_J"), tail_J, tail_tol, flagged))
                tail_s = sum(tb - ta for ta, tb in tails)
                out.figures.append(Figure(f"{where}_s", ledger.get("eval_tail_s"), tail_s, 1e-6, flagged))
        summary = run["summary"]
        truth, tol = _truth(cuda, run["start"], run["end"])
        flagged = summary.degraded or summary.complete is False
        value = summary.energy_J - run["carried_J"]
        out.figures.append(Figure(f"run {n} total", value, truth, tol, flagged))
    return out


def _check_ledger(r: dict[str, Any], where: str, out: Outcome) -> None:
    """Warm-up + steps + eval + eval_tail + other == the epoch (energy and time), when the record carries a ledger."""
    ledger = r.get("ledger")
    if ledger is None:
        return
    out.ledgers += 1
    for unit, total in (("J", r.get("energy_J")), ("s", r.get("time_s"))):
        # The split with no estimate in it closes whatever the sampling, wherever the epoch is known.
        exact = [ledger.get(f"{p}_{unit}") for p in ("warmup", "steps_windowed", "eval", "eval_tail", "unwindowed")]
        if total is not None and (any(p is None or p < 0 for p in exact) or not math.isclose(
            math.fsum(exact), total, rel_tol=1e-6, abs_tol=1e-9
        )):  # fmt: skip
            out.problems.append(f"{where}: exact ledger {unit} {exact} for an epoch of {total}")
        parts = [ledger.get(f"{p}_{unit}") for p in LEDGER_PARTS]
        if parts[-1] is None:
            if not ledger.get("other_reason"):
                out.problems.append(f"{where}: ledger other_{unit} is null without other_reason")
            continue
        if total is None or any(p is None for p in parts):
            out.problems.append(f"{where}: ledger {unit} parts {parts} for an epoch of {total}")
            continue
        if any(p < -1e-9 for p in parts):
            out.problems.append(f"{where}: a negative ledger part {parts}")
        if abs(sum(parts) - total) > 1e-6 * max(1.0, abs(total)):
            out.problems.append(f"{where}: ledger {unit} {sum(parts)} != epoch {total} ({parts})")
