"""Step-time overhead of measuring, with the power to see 0.5 % (issue 28).

One process per run. For each workload (Lightning and HF ``Trainer``; steps of ~1.5, ~4 and
~12 ms) it builds ONE Trainer and runs ONE long fit. Every mode's callback is built before
the fit, so the Trainer calls its start hooks (setup, train start, epoch start) normally; a
driver callback, first in the list, then takes every mode's callback out of the list and parks
its sampler thread. After a warm-up (and a calibration of the model's depth to the target
step time, with no callback), the fit is a series of *rounds*: in each, every mode runs one
block of ``--block-steps`` steps, in a fresh random order. At a block's first step the driver
synchronises the device, reads the clock and the training thread's CPU time, and swaps the
mode's callback into the list (its sampler thread resumed); at the next block's first step it
reads them again and swaps it back out. Process start, Trainer construction, warm-up and the
callbacks' start are in no timed block. Modes:

* ``none``: no callback; ``noop``: a callback with empty methods on the same hooks;
* ``default``: ``ZeusCallback`` / ``ZeusTrainerCallback`` with the default config;
* ``sampled``: ``windows.sample_fraction: 0.05``, a share like the one auto settles at, but fixed (two
  auto sessions settle at different shares, from their own noisy timings: not comparable);
* ``every_step``: ``windows.sample_fraction: 1``; ``every_step_phases``: and ``windows.phases: true``;
* ``half_budget``: auto sampling with ``windows.max_overhead: 0.001`` (half the default);
* ``sampler``: the package's ``PowerSampler`` thread alone (default sampling config), no callback.

Per round, each mode's block time over the same round's ``none`` block; reported: the median
of these ratios with a 95 % bootstrap CI of the median, the geometric mean with a paired-t CI
on the log ratios, and the training thread's CPU time per step (``time.thread_time``: a second
figure, free of the GPU's and the host's timing noise).

Two direct figures beside the ratios, far less noisy on a shared host (whose CPU speed drifts by
5-7 % within a fraction of a second, issue 28's notes): ``hook_us``, the time spent inside the mode's
callback hooks per step (every ``on_*`` method is wrapped with two ``perf_counter`` reads; the
``noop`` mode shows what the wrapper itself costs; ``--hook-clock cpu``: two reads of the thread's CPU
clock instead, free of the preemptions of a loaded host), and ``sampler_cpu_us``, the CPU time of the
sampler thread per step (its thread CPU clock, read at the block's ends). On a loop that
synchronises every step (HF's default ``logging_nan_inf_filter``) hook time adds to the step 1:1.

The last line printed is JSON: ``{"<workload>": {"<mode>": [median ratio, lo, hi], ...,
"step_ms": none's median step (ms), "cpu_us": {"<mode>": training-thread CPU µs per step}}}``.

Safety on a shared GPU: ``ZEUS_CALLBACKS_READ_ONLY=1`` is set before the package is imported;
nothing is set on the GPU; on CUDA every GPU's power limit is read (pynvml, read-only) before
and after, and the script fails when one differs.

    # on the H200 (about 5 minutes)
    python benchmarks/gpu_overhead.py --device cuda --budget-s 270 --out results/
    # here (CPU, virtual GPU; proves that it runs)
    python benchmarks/gpu_overhead.py --device cpu --budget-s 60 --workloads lightning_small,hf_small
    # where the training thread's time goes, one mode (cProfile of the timed blocks only)
    python benchmarks/gpu_overhead.py --device cpu --profile every_step_phases --workloads lightning_small
    # old and new code side by side in one fit: every ZeusCallback mode also runs as <mode>@base
    python benchmarks/gpu_overhead.py --device cpu --baseline /path/to/other/checkout --modes default,every_step

``--baseline DIR``: a copy of ``DIR/zeus_callbacks`` is imported as ``zeus_callbacks_base`` (every
``zeus_callbacks`` name in its sources renamed, so its own imports, lazy ones included, stay inside
the copy) and each callback mode ``m`` gets a twin ``m@base`` built from it. Both run in the same
Trainer, in the same rounds, in a shuffled order: the paired hook times are the before/after figure.
"""

from __future__ import annotations

import os

os.environ["ZEUS_CALLBACKS_READ_ONLY"] = "1"  # before zeus_callbacks is imported: every setter refuses

import argparse
import cProfile
import gc
import io
import json
import logging
import math
import pstats
import random
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

MODES = ("none", "noop", "default", "every_step", "every_step_phases", "sampler")
CONFIGS: dict[str, dict[str, Any]] = {
    "default": {},
    "sampled": {"windows": {"sample_fraction": 0.05}},  # default's kind of share, fixed: comparable across runs
    "every_step": {"windows": {"sample_fraction": 1}},
    "every_step_phases": {"windows": {"sample_fraction": 1, "phases": True}},
    # auto sampling with half the default budget: how the governed part of the cost scales
    "half_budget": {"windows": {"max_overhead": 0.001}},
}
BASE = "@base"  # suffix of the modes built from the --baseline copy
TARGET_MS = {"small": 1.5, "mid": 4.0, "large": 12.0}
WORKLOADS = tuple(f"{fw}_{size}" for fw in ("lightning", "hf") for size in TARGET_MS)


# ----------------------------------------------------------------------------- model and data
class DeepMLP(nn.Module):
    """``depth`` square layers of which the first ``active`` run: the depth is tuned after the Trainer is built."""

    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.inp = nn.Linear(width, width)
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.active = 0

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> Any:
        h = torch.relu(self.inp(x))
        for layer in self.layers[: self.active]:
            h = torch.relu(layer(h))
        loss = nn.functional.mse_loss(h, labels if labels is not None else x)
        return {"loss": loss}


class Batches(torch.utils.data.Dataset):
    """Premade batches on the device, served round-robin: an item is a whole batch (no collation)."""

    def __init__(self, width: int, batch: int, device: str, length: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.items = [
            {name: torch.randn(batch, width, generator=g).to(device) for name in ("x", "labels")} for _ in range(8)
        ]
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.items[i % len(self.items)]


# ----------------------------------------------------------------------------- the driver
class Driver:
    """Runs the schedule: warm-up, calibration, rounds of blocks; swaps each block's callback in and out.

    ``callbacks`` is the framework's own callback list (modified in place, at index 1 on: the driver is at 0).
    """

    def __init__(self, args: argparse.Namespace, model: DeepMLP, target_ms: float, sync: Any, modes: dict[str, Any]):
        self.args, self.model, self.target_ms, self.sync = args, model, target_ms, sync
        self.modes = modes  # mode -> None | callback | Parked sampler
        self.callbacks: list[Any] = []
        self.step = 0
        self.phase = "warmup"
        self.plan: list[tuple[int, str, str | None]] = []  # (round, mode, partner) blocks still to run
        self.current: tuple[int, str, str | None] | None = None
        self.pairs = args.design == "pairs"
        self.pair_none: dict[str, list[float]] = {m: [] for m in modes}  # --design pairs: the partner none block
        self.block_left = 0
        self.t0 = self.cpu0 = 0.0
        self.wall: dict[str, list[float]] = {m: [] for m in modes}  # per round, s per step
        self.cpu: dict[str, list[float]] = {m: [] for m in modes}
        self.calib: list[tuple[int, float]] = []
        self.deadline = 0.0
        self.profiler = cProfile.Profile() if args.profile else None
        self.done = False
        self.block_steps = args.block_steps
        self.hook: dict[str, list[float]] = {m: [] for m in modes}  # per round, s inside the mode's hooks per step
        self.sampler_cpu: dict[str, list[float]] = {m: [] for m in modes}  # per round, sampler thread CPU s per step
        self._sampler_cpu0 = 0.0
        self.gc: dict[str, list[float]] = {m: [] for m in modes}  # per round, s of garbage collection per step
        self.steps: dict[str, list[list[float]]] = {m: [] for m in modes}  # --step-times: each block's step times (s)
        self._gc_s = 0.0
        self._gc_t0 = 0.0
        self._last_step_t = 0.0
        self._block_step_times: list[float] = []
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        """Sums the time the collector runs (a noise source the ratios share with every mode)."""
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        else:
            self._gc_s += time.perf_counter() - self._gc_t0

    def parked(self) -> None:
        """Take every mode's callback out of the list; pause their samplers (once, at the first step)."""
        for obj in self.modes.values():
            if obj is not None and obj is not PARKED_NONE:
                obj.park(self.callbacks)

    def on_step(self) -> bool:
        """Called at every step's start, before any other callback; returns True to stop the fit."""
        self.step += 1
        if self.phase == "warmup":
            if self.step == 1:
                self.parked()
            if self.step >= self.args.warmup_steps:
                self.phase, self.calib_at = "calib", [1, max(2, len(self.model.layers))]
                self._start_calib()
            return False
        if self.phase == "calib":
            self.block_left -= 1
            if self.block_left > 0:
                return False
            self.sync()
            per_step_ms = (time.perf_counter() - self.t0) / self.calib_steps * 1e3
            self.calib.append((self.model.active, per_step_ms))
            if len(self.calib) < 2:
                self.model.active = self.calib_at[1]
                self._start_calib()
                return False
            (d1, t1), (d2, t2) = self.calib
            per_layer = max((t2 - t1) / (d2 - d1), 1e-6)
            self.model.active = int(min(max(round(d1 + (self.target_ms - t1) / per_layer), 0), len(self.model.layers)))
            self.phase = "settle"
            self.block_left = self.args.warmup_steps // 2
            return False
        if self.phase == "settle":
            self.block_left -= 1
            if self.block_left > 0:
                return False
            self.sync()
            self.t0 = time.perf_counter()
            self.block_left = self.args.warmup_steps
            self.phase = "measure_none"
            return False
        if self.phase == "measure_none":  # the step time at the chosen depth sets the block length
            self.block_left -= 1
            if self.block_left > 0:
                return False
            self.sync()
            step_s = (time.perf_counter() - self.t0) / self.args.warmup_steps
            if self.block_steps is None:
                self.block_steps = max(20, round(self.args.block_s / step_s))
            budget_s = self.deadline - time.perf_counter()
            blocks = 2 * (len(self.modes) - 1) if self.pairs else len(self.modes)
            rounds = max(self.args.min_rounds, int(budget_s / (blocks * self.block_steps * step_s * 1.15)))
            if self.args.rounds:
                rounds = self.args.rounds
            rng = random.Random(self.args.seed)
            for r in range(rounds):
                if not self.pairs:
                    order = list(self.modes)
                    rng.shuffle(order)
                    self.plan += [(r, m, None) for m in order]
                    continue
                # each mode beside its own none block, the two in random order
                order = [m for m in self.modes if m != "none"]
                rng.shuffle(order)
                for m in order:
                    pair = [(r, "none", m), (r, m, None)]
                    rng.shuffle(pair)
                    self.plan += pair
            self.phase = "rounds"
            self._begin_block()
            return False
        # rounds
        if self.args.step_times:
            now = time.perf_counter()
            self._block_step_times.append(now - self._last_step_t)
            self._last_step_t = now
        self.block_left -= 1
        if self.block_left > 0:
            return False
        self._end_block()
        if self.plan and self.plan[0][0] != self.current[0] and self.current[0] + 1 >= self.args.min_rounds:
            if time.perf_counter() > self.deadline and not self.args.rounds:  # out of time: whole rounds only
                self.plan.clear()
        if not self.plan:
            self.done = True
            return True
        self._begin_block()
        return False

    def _start_calib(self) -> None:
        self.calib_steps = max(10, self.args.warmup_steps // 2)
        self.sync()
        self.t0 = time.perf_counter()
        self.block_left = self.calib_steps

    def _begin_block(self) -> None:
        r, mode, partner = self.plan.pop(0)
        obj = self.modes[mode]
        if obj is not None:
            obj.unpark(self.callbacks)  # its hooks run from this very step on
        self.current = (r, mode, partner)
        self.block_left = self.block_steps
        self.sync()
        if self.profiler is not None and mode == self.args.profile:
            self.profiler.enable()
        if self.args.gc_freeze:
            gc.collect()
            gc.freeze()
        self._gc_s = 0.0
        self._block_step_times = []
        self._sampler_cpu0 = obj.sampler_cpu_s() if obj is not None else 0.0
        if obj is not None:
            obj.hook_s = 0.0
        self.cpu0 = time.thread_time()
        self.t0 = self._last_step_t = time.perf_counter()

    def _end_block(self) -> None:
        self.sync()
        wall = time.perf_counter() - self.t0
        cpu = time.thread_time() - self.cpu0
        assert self.current is not None
        r, mode, partner = self.current
        if self.profiler is not None and mode == self.args.profile:
            self.profiler.disable()
        obj = self.modes[mode]
        hook_s = sampler_s = 0.0
        if obj is not None:
            sampler_s = obj.sampler_cpu_s() - self._sampler_cpu0
            hook_s = obj.hook_s
            obj.park(self.callbacks)
        self.hook[mode].append(hook_s / self.block_steps)
        self.sampler_cpu[mode].append(sampler_s / self.block_steps)
        self.wall[mode].append(wall / self.block_steps)
        if partner is not None:
            self.pair_none[partner].append(wall / self.block_steps)
        self.cpu[mode].append(cpu / self.block_steps)
        self.gc[mode].append(self._gc_s / self.block_steps)
        if self.args.step_times:
            self.steps[mode].append(self._block_step_times)


PARKED_NONE = object()


def wrapper_floor_us(driver: Any) -> float | None:
    """What one wrapped call of an empty hook costs inside the timed interval (µs), from the noop mode.

    Subtract ``floor × the mode's hook calls per step`` from a mode's ``hook_us`` for the time its hooks'
    bodies take; HF's or Lightning's own dispatch to the callback is outside both (None without noop).
    """
    noop = driver.modes.get("noop")
    if noop is None or not getattr(noop, "calls", 0):
        return None
    return round(sum(noop.by_hook.values()) / noop.calls * 1e6, 3)


def thread_cpu_s(thread: Any) -> float:
    """CPU time (s) a running thread has used, from its own CPU clock; 0 when it is not running."""
    if thread is None or not thread.is_alive() or thread.ident is None:
        return 0.0
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    except (OSError, AttributeError):  # the thread ended in between, or no per-thread clocks here
        return 0.0


HOOK_CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time, "none": None}
"""``--hook-clock``: what the hook wrapper reads. ``cpu``: the training thread's CPU time, which a
loaded host's preemptions (the wall clock runs on while the thread waits for a core) do not inflate.
``none``: no wrapper at all, so the wall ratios carry none of its cost (a few µs a call); no hook_us then."""
hook_clock = HOOK_CLOCKS["wall"]


def time_hooks(parked: Any) -> None:
    """Wrap every ``on_*`` method of ``parked.callback`` so the time spent inside adds to ``parked.hook_s``."""
    callback = parked.callback
    clock = hook_clock
    if clock is None:  # --hook-clock none: the callback's own methods, unwrapped
        return
    for name in dir(type(callback)):
        method = getattr(callback, name, None)
        if not name.startswith("on_") or not callable(method):
            continue

        def timed(*a: Any, _method: Any = method, _name: str = name, **k: Any) -> Any:
            t0 = clock()
            try:
                return _method(*a, **k)
            finally:
                spent = clock() - t0
                parked.hook_s += spent
                parked.by_hook[_name] = parked.by_hook.get(_name, 0.0) + spent
                parked.calls += 1

        setattr(callback, name, timed)


def _timing(session: Any, action: str) -> None:
    """Pause or resume the session's step timing (auto sampling); a baseline before 228e9ff kept it on the session."""
    steps = getattr(session, "_steps", None)
    if steps is not None:
        getattr(steps, f"{action}_timing")()
    else:
        getattr(session, f"_{action}_timing")()


class ParkedCallback:
    """A mode's callback, in the framework's list only during its own blocks; its sampler thread likewise.

    The session's own step-time accounting (auto sampling) is paused with a private method while
    parked: a benchmark, not an API.
    """

    def __init__(self, callback: Any) -> None:
        self.callback = callback
        self.index = 1  # where it was in the list (the driver is at 0)
        self.hook_s = 0.0
        self.by_hook: dict[str, float] = {}  # s inside each hook, over the whole fit (warm-up included)
        self.calls = 0  # hook calls, over the whole fit (with hook_s summed: the wrapper's floor per call)
        time_hooks(self)

    def _session(self) -> Any:
        return getattr(self.callback, "session", None)

    def sampler_cpu_s(self) -> float:
        session = self._session()
        sampler = None if session is None else session.sampler
        return thread_cpu_s(None if sampler is None else sampler._thread)

    def park(self, callbacks: list[Any]) -> None:
        if self.callback in callbacks:
            self.index = callbacks.index(self.callback)
            callbacks.remove(self.callback)
        session = self._session()
        if session is not None and session.sampler is not None:
            session.sampler.stop(final_drain=False)
            _timing(session, "pause")

    def unpark(self, callbacks: list[Any]) -> None:
        session = self._session()
        if session is not None and session.sampler is not None:
            session.sampler.start(first_poll=False)
            _timing(session, "resume")
        callbacks.insert(self.index, self.callback)


class ParkedSampler:
    """The package's PowerSampler alone: its thread runs only during its own blocks."""

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler
        self.hook_s = 0.0
        sampler.start()

    def sampler_cpu_s(self) -> float:
        return thread_cpu_s(self.sampler._thread)

    def park(self, callbacks: list[Any]) -> None:
        self.sampler.stop(final_drain=False)

    def unpark(self, callbacks: list[Any]) -> None:
        self.sampler.start(first_poll=False)


def sampler_alone() -> ParkedSampler:
    """A PowerSampler as a default session builds it (its backend, GPU and sampling settings)."""
    from zeus_callbacks.measurement._sampler import PowerSampler
    from zeus_callbacks.session import EnergySession
    from zeus_callbacks.session._run import select_gpu_indices

    session = EnergySession({})
    cfg = session.config
    backend = session.open_backend()
    sampler = PowerSampler(
        backend,
        list(select_gpu_indices(cfg, backend, None)),
        poll_period_s=cfg.sampling.poll_period_s,
        energy_counter_period_s=cfg.sampling.energy_counter_period_s,
        buffer_s=cfg.sampling.buffer_s,
        sensor_delay_s=backend.sensor_delay_s,
        sensor_timeout_s=cfg.sampling.sensor_timeout_s,
    )
    return ParkedSampler(sampler)


def load_baseline(checkout: str, into: str) -> Any:
    """Import ``checkout``'s ``zeus_callbacks`` as ``zeus_callbacks_base`` (a renamed copy under ``into``)."""
    import importlib
    import re
    import shutil

    src = Path(checkout).resolve() / "zeus_callbacks"
    dst = Path(into) / "zeus_callbacks_base"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
    for path in dst.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        path.write_text(re.sub(r"\bzeus_callbacks\b", "zeus_callbacks_base", text), encoding="utf-8")
    sys.path.insert(0, str(Path(into)))
    try:
        return importlib.import_module("zeus_callbacks_base")
    finally:
        sys.path.remove(str(Path(into)))


def zeus_config(mode: str, log_dir: str) -> dict[str, Any]:
    cfg = json.loads(json.dumps(CONFIGS[mode.removesuffix(BASE)]))
    cfg.setdefault("logging", {})["log_dir"] = log_dir
    cfg["logging"]["run_name"] = mode
    cfg["job_id"] = f"gpu_overhead_{mode}"  # Lightning: one state_key per callback
    return cfg


# ----------------------------------------------------------------------------- Lightning
def run_lightning(args: argparse.Namespace, target_ms: float, tmp: str, sync: Any) -> Driver:
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import CSVLogger

    from zeus_callbacks import ZeusCallback

    width, batch, depth = shapes(args)
    model = DeepMLP(width, depth)

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = model

        def training_step(self, b: dict[str, torch.Tensor], i: int) -> torch.Tensor:
            return self.net(b["x"], b["labels"])["loss"]

        def configure_optimizers(self) -> Any:
            return torch.optim.Adam(self.parameters(), lr=1e-5)

    class Noop(pl.Callback):
        def on_train_batch_start(self, *a: Any) -> None: ...
        def on_train_batch_end(self, *a: Any) -> None: ...
        def on_before_backward(self, *a: Any) -> None: ...
        def on_after_backward(self, *a: Any) -> None: ...
        def on_before_optimizer_step(self, *a: Any) -> None: ...

    class DriverCallback(pl.Callback):
        def on_train_batch_start(self, trainer: Any, *a: Any) -> None:
            if driver.on_step():
                trainer.should_stop = True

    def zeus(m: str) -> Any:
        cls = args.baseline_pkg.ZeusCallback if m.endswith(BASE) else ZeusCallback
        return cls(zeus_config(m, tmp))

    modes = build_modes(args, zeus, Noop)
    driver = Driver(args, model, target_ms, sync, modes)
    driver.deadline = time.perf_counter() + args.workload_s
    callbacks: list[Any] = [DriverCallback()] + [o.callback for o in modes.values() if isinstance(o, ParkedCallback)]
    data = torch.utils.data.DataLoader(Batches(width, batch, args.device, 10**8), batch_size=None, shuffle=False)
    trainer = pl.Trainer(
        accelerator="gpu" if args.device == "cuda" else "cpu",
        devices=1,
        max_epochs=1,
        callbacks=callbacks,
        logger=CSVLogger(tmp, name="lightning"),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    driver.callbacks = trainer.callbacks
    assert isinstance(trainer.callbacks[0], DriverCallback), "the driver must run first"
    trainer.fit(Module(), data)
    return driver


# ----------------------------------------------------------------------------- Hugging Face
def run_hf(args: argparse.Namespace, target_ms: float, tmp: str, sync: Any) -> Driver:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from zeus_callbacks import ZeusTrainerCallback

    width, batch, depth = shapes(args)
    model = DeepMLP(width, depth)

    class Noop(TrainerCallback):
        def on_step_begin(self, *a: Any, **k: Any) -> None: ...
        def on_pre_optimizer_step(self, *a: Any, **k: Any) -> None: ...
        def on_step_end(self, *a: Any, **k: Any) -> None: ...

    class DriverCallback(TrainerCallback):
        def on_step_begin(self, args_: Any, state: Any, control: Any, **k: Any) -> None:
            if driver.on_step():
                control.should_training_stop = True

    def zeus(m: str) -> Any:
        cls = args.baseline_pkg.ZeusTrainerCallback if m.endswith(BASE) else ZeusTrainerCallback
        return cls(zeus_config(m, tmp))

    modes = build_modes(args, zeus, Noop)
    driver = Driver(args, model, target_ms, sync, modes)
    driver.deadline = time.perf_counter() + args.workload_s
    targs = TrainingArguments(
        output_dir=tmp,
        per_device_train_batch_size=1,
        max_steps=10**8,
        learning_rate=1e-5,
        save_strategy="no",
        logging_steps=args.hf_logging_steps,
        report_to="none",
        disable_tqdm=True,
        dataloader_pin_memory=False,
        remove_unused_columns=False,
        use_cpu=args.device == "cpu",
        logging_nan_inf_filter=args.hf_nan_filter == "on",  # on (HF's default): a host sync every step
    )
    trainer = Trainer(
        model=model,
        args=targs,
        train_dataset=Batches(width, batch, args.device, 10**6),
        data_collator=lambda items: items[0],
    )
    trainer.callback_handler.callbacks.insert(0, DriverCallback())
    for obj in modes.values():
        if isinstance(obj, ParkedCallback):
            if hasattr(obj.callback, "attach"):  # a ZeusTrainerCallback, this checkout's or the baseline's
                obj.callback.attach(trainer)
            else:
                trainer.callback_handler.add_callback(obj.callback)
    driver.callbacks = trainer.callback_handler.callbacks
    trainer.train()
    return driver


def build_modes(args: argparse.Namespace, zeus: Any, noop_cls: Any) -> dict[str, Any]:
    modes: dict[str, Any] = {}
    for mode in args.modes:
        if mode == "none":
            modes[mode] = None
        elif mode == "noop":
            modes[mode] = ParkedCallback(noop_cls())
        elif mode == "sampler":
            modes[mode] = sampler_alone()
        else:
            modes[mode] = ParkedCallback(zeus(mode))
    return modes


def shapes(args: argparse.Namespace) -> tuple[int, int, int]:
    """(width, batch, most layers): ~0.5 ms a layer (fp32) on an H200; small on the CPU."""
    if args.device == "cuda":
        return 2048, 1024, 48
    return 64, 32, 48


# ----------------------------------------------------------------------------- statistics
def summarise(driver: Driver, n_boot: int = 5000) -> dict[str, Any]:
    base = np.array(driver.wall["none"])
    out: dict[str, Any] = {
        "step_ms": float(np.median(base) * 1e3),
        "cpu_us": {},
        "gc_us": {},
        "hook_us": {},
        "sampler_cpu_us": {},
        "rounds": max(len(w) for m, w in driver.wall.items() if m != "none") if driver.pairs else len(base),
        "design": "pairs" if driver.pairs else "rounds",
    }
    detail: dict[str, Any] = {}
    rng = np.random.default_rng(0)
    for mode, wall in driver.wall.items():
        out["cpu_us"][mode] = round(float(np.median(driver.cpu[mode]) * 1e6), 1)
        out["gc_us"][mode] = round(float(np.mean(driver.gc[mode]) * 1e6), 1)
        out["hook_us"][mode] = round(float(np.mean(driver.hook[mode]) * 1e6), 2)
        out["sampler_cpu_us"][mode] = round(float(np.mean(driver.sampler_cpu[mode]) * 1e6), 2)
        if mode == "none":
            continue
        ratios = np.array(wall) / (np.array(driver.pair_none[mode]) if driver.pairs else base)
        idx = rng.integers(0, len(ratios), size=(n_boot, len(ratios)))
        lo, hi = np.percentile(np.median(ratios[idx], axis=1), [2.5, 97.5])
        out[mode] = [round(float(np.median(ratios)), 4), round(float(lo), 4), round(float(hi), 4)]
        logs = np.log(ratios)
        n = len(logs)
        half = t_quantile(n - 1) * logs.std(ddof=1) / math.sqrt(n) if n > 1 else float("nan")
        detail[mode] = {
            "gmean": float(np.exp(logs.mean())),
            "gmean_ci95": [float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half))],
            "rounds_above_1": int((ratios > 1).sum()),
        }
    # --baseline: per round, this checkout's hook time minus the baseline's (the same round's blocks)
    for mode in driver.wall:
        if mode.endswith(BASE) or mode + BASE not in driver.wall:
            continue
        new_us, old_us = np.array(driver.hook[mode]) * 1e6, np.array(driver.hook[mode + BASE]) * 1e6
        diff = new_us - old_us
        idx = rng.integers(0, len(diff), size=(n_boot, len(diff)))
        lo, hi = np.percentile(np.median(diff[idx], axis=1), [2.5, 97.5])
        out.setdefault("hook_paired_us", {})[mode] = {
            "base_median": round(float(np.median(old_us)), 2), "median": round(float(np.median(new_us)), 2),
            "diff_median": round(float(np.median(diff)), 2), "diff_ci95": [round(float(lo), 2), round(float(hi), 2)],
        }  # fmt: skip
    out["_detail"] = detail
    out["_blocks"] = {
        m: {"wall": driver.wall[m], "cpu": driver.cpu[m], "gc": driver.gc[m], "hook": driver.hook[m]}
        for m in driver.wall
    }
    if driver.steps["none"]:
        out["_steps"] = driver.steps
    return out


def t_quantile(df: int) -> float:
    """Two-sided 95 % quantile of Student's t (scipy when present, else a close approximation)."""
    try:
        from scipy.stats import t

        return float(t.ppf(0.975, df))
    except ImportError:  # Cornish-Fisher expansion around the normal quantile
        z = 1.959964
        return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


# ----------------------------------------------------------------------------- power limits
def power_limits_W() -> list[float]:
    """Every GPU's power limit (W), read-only through pynvml."""
    import pynvml

    pynvml.nvmlInit()
    try:
        return [
            pynvml.nvmlDeviceGetPowerManagementLimit(pynvml.nvmlDeviceGetHandleByIndex(i)) / 1000.0
            for i in range(pynvml.nvmlDeviceGetCount())
        ]
    finally:
        pynvml.nvmlShutdown()


# ----------------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--budget-s", type=float, default=270.0, help="wall time for all workloads, setup included (s)")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, of {', '.join(WORKLOADS)}")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated; 'none' is always run")
    ap.add_argument("--block-s", type=float, default=0.4, help="target length of one block (s)")
    ap.add_argument("--block-steps", type=int, default=None, help="steps a block (default: from --block-s)")
    design_help = (
        "rounds: every mode once a round, shuffled, each over the round's none block; pairs: each mode's block "
        "beside a none block of its own (the host's drift cancels between neighbours)"
    )
    ap.add_argument("--design", choices=("rounds", "pairs"), default="rounds", help=design_help)
    ap.add_argument("--rounds", type=int, default=0, help="rounds (default: as many as the budget allows)")
    ap.add_argument("--min-rounds", type=int, default=6)
    ap.add_argument("--warmup-steps", type=int, default=100)
    ap.add_argument("--setup-s", type=float, default=12.0, help="time a workload's setup and warm-up take (s)")
    ap.add_argument("--profile", default=None, help="cProfile the training thread in this mode's blocks")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--step-times", action="store_true", help="keep every step's wall time (in the JSON)")
    ap.add_argument("--gc-freeze", action="store_true", help="gc.collect + gc.freeze before every block")
    ap.add_argument("--hf-logging-steps", type=int, default=50, help="HF logging_steps (its own default: 500)")
    ap.add_argument("--hf-nan-filter", choices=("on", "off"), default="on", help="HF logging_nan_inf_filter")
    ap.add_argument("--out", default=None, help="directory for gpu_overhead.json")
    ap.add_argument("--baseline", default=None, help="another checkout: each callback mode also runs as <mode>@base")
    ap.add_argument(
        "--baseline-modes", default=None, help="comma-separated: the modes that get an @base twin (default all)"
    )
    ap.add_argument("--hook-clock", choices=tuple(HOOK_CLOCKS), default="wall",
                    help="hook_us from the wall clock or the training thread's CPU time (a loaded host)")  # fmt: skip
    args = ap.parse_args()
    global hook_clock
    hook_clock = HOOK_CLOCKS[args.hook_clock]
    args.modes = ["none"] + [m for m in args.modes.split(",") if m and m != "none"]
    args.baseline_pkg = None
    if args.baseline:
        args.baseline_pkg = load_baseline(args.baseline, tempfile.mkdtemp(prefix="gpu_overhead_base_"))
        twins = args.baseline_modes.split(",") if args.baseline_modes else list(CONFIGS)
        args.modes += [m + BASE for m in args.modes if m in CONFIGS and m in twins and m + BASE not in args.modes]
    workloads = [w for w in args.workloads.split(",") if w]
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device")
    if args.profile and args.profile not in args.modes:
        raise SystemExit(f"--profile {args.profile}: not among --modes")
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    if args.device == "cpu":
        torch.set_num_threads(1)  # a shared CPU: intra-op threads would time the neighbours
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    limits_before = power_limits_W() if args.device == "cuda" else []
    print(f"power limits before (W): {limits_before}", flush=True)
    started = time.perf_counter()
    results: dict[str, Any] = {}
    try:
        for k, workload in enumerate(workloads):
            left_s = args.budget_s - (time.perf_counter() - started)
            args.workload_s = max(left_s / (len(workloads) - k) - args.setup_s, 1.0)
            fw, size = workload.split("_")
            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.perf_counter()
                driver = (run_lightning if fw == "lightning" else run_hf)(args, TARGET_MS[size], tmp, sync)
                if not driver.done:
                    raise SystemExit(f"{workload}: the fit ended before the schedule did")
                gc.callbacks.remove(driver._on_gc)  # the next workload's driver adds its own
                results[workload] = summarise(driver)
                results[workload]["layers"] = driver.model.active
                results[workload]["hook_floor_us"] = wrapper_floor_us(driver)
                results[workload]["_by_hook_s"] = {
                    m: getattr(o, "by_hook", {}) for m, o in driver.modes.items() if o is not None
                }
                results[workload]["block_steps"] = driver.block_steps
                results[workload]["wall_s"] = round(time.perf_counter() - t0, 1)
            print_table(workload, results[workload])
            if driver.profiler is not None:
                if args.out:
                    Path(args.out).mkdir(parents=True, exist_ok=True)
                    driver.profiler.dump_stats(str(Path(args.out) / f"profile_{workload}_{args.profile}.pstats"))
                s = io.StringIO()
                pstats.Stats(driver.profiler, stream=s).sort_stats("tottime").print_stats(30)
                print(s.getvalue(), flush=True)
                s = io.StringIO()
                pstats.Stats(driver.profiler, stream=s).sort_stats("cumulative").print_stats(40)
                print(s.getvalue(), flush=True)
            del driver
            if args.device == "cuda":
                torch.cuda.empty_cache()
    finally:
        if args.device == "cuda":
            limits_after = power_limits_W()
            print(f"power limits after (W): {limits_after}", flush=True)
            if limits_after != limits_before:
                raise SystemExit(f"POWER LIMIT CHANGED: before {limits_before} W, after {limits_after} W")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "gpu_overhead.json").write_text(json.dumps(results))
    print(f"total wall time {time.perf_counter() - started:.0f} s", file=sys.stderr)
    print(json.dumps({w: {k: v for k, v in r.items() if not k.startswith("_")} for w, r in results.items()}))


def print_table(workload: str, r: dict[str, Any]) -> None:
    print(
        f"\n{workload}: none {r['step_ms']:.3f} ms/step, {r['layers']} layers, {r['rounds']} rounds of "
        f"{r['block_steps']} steps, {r['wall_s']} s",
        flush=True,
    )
    print(
        f"  {'mode':24s} {'median [95% CI]':>26s} {'gmean [paired-t CI]':>26s} {'>1':>4s} {'cpu us/step':>12s}"
        f" {'hook us':>8s} {'hook %':>7s} {'sampler us':>10s}"
    )
    for mode, cpu in r["cpu_us"].items():
        hook, sampler = r["hook_us"][mode], r["sampler_cpu_us"][mode]
        direct = f" {hook:8.2f} {100 * hook / (r['step_ms'] * 1e3):7.3f} {sampler:10.2f}"
        if mode == "none":
            print(f"  {mode:24s} {'':>26s} {'':>26s} {'':>4s} {cpu:12.1f}{direct}")
            continue
        m, lo, hi = r[mode]
        d = r["_detail"][mode]
        g, glo, ghi = d["gmean"], *d["gmean_ci95"]
        print(
            f"  {mode:24s} {m:8.4f} [{lo:.4f}, {hi:.4f}] {g:8.4f} [{glo:.4f}, {ghi:.4f}] "
            f"{d['rounds_above_1']:4d} {cpu:12.1f}{direct}",
            flush=True,
        )
    for mode, p in r.get("hook_paired_us", {}).items():
        lo, hi = p["diff_ci95"]
        print(
            f"  hook us/step, median of rounds: {mode} {p['median']:.2f} vs {mode}{BASE} {p['base_median']:.2f}; "
            f"paired difference {p['diff_median']:+.2f} [{lo:+.2f}, {hi:+.2f}]",
            flush=True,
        )


if __name__ == "__main__":
    main()
