"""Per-step and per-phase window overhead on real training steps, and in-training accuracy (issue 5).

Workloads: a ~1 ms MLP step and a ~40 ms GPT-2 (6-layer) step. Modes: ``base`` (no
measurement); ``base_aa`` (``base`` again: an A/A control whose ratio shows the noise floor);
``noop`` and ``noop_phases`` (two and four empty Python calls per step, where a step-window
and a phases session are called: what any callback called there costs in this loop);
``ours_step`` (:class:`~zeus_callbacks.session.EnergySession` step windows, default
``windows.sample_fraction: auto``); ``ours_phases`` (step + forward/backward/optimizer/dataloader
phase windows, auto); ``ours_step_all`` and ``ours_phases_all`` (the same with every step
measured, ``sample_fraction: 1``); ``zeus`` (Zeus 0.16 ``ZeusMonitor.begin_window/end_window``
per step when the ``zeus`` package imports, else ``zeus_style``: what it does, a device sync and
an energy-counter read at each boundary).

The run is a series of *cycles*: in each, every mode runs one block of about ``--block-s``
seconds (its steps set from the base step time; Zeus's from its own), in a fresh random order.
A session's sampler thread runs only during its own blocks (:class:`Parked`), so ``base`` pays
for no sampler and no session blurs another's blocks; each session's own timing, which auto
sampling uses, is paused likewise. Per cycle, each mode's step time over ``base``'s; reported:
the median of these ratios, their IQR and a 95 % bootstrap CI of the median, the ratio of the
summed times with its CI, and the time spent inside the session's (or Zeus's) calls per step
(``hook_us_per_step``: the direct cost, free of the step-time noise; ``hook_us_above_noop``: its
excess over the noop control with the same calls), beside the samplers' user and system CPU time.

In-training accuracy (``ours_phases``, after the timed cycles, ``--accuracy-epochs`` epochs of
``--accuracy-steps`` steps): per-step energy × steps against the energy counter over each epoch,
and the phase windows' sum against the step windows.

    ZEUS_CALLBACKS_READ_ONLY=1 python benchmarks/step_overhead.py --out results/
    python benchmarks/step_overhead.py --smoke
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import statistics
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from fg_common import open_device, power_limit_W, write_json

from zeus_callbacks.reporting import read_jsonl
from zeus_callbacks.session import EnergySession


def make_workload(kind: str, dev):
    cuda = dev.torch_device == "cuda"
    torch.manual_seed(0)
    if kind == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        if dev.smoke:
            cfg, batch, seq = GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=64, vocab_size=128), 4, 32
        else:
            cfg, batch, seq = GPT2Config(n_layer=6, n_embd=768, n_head=12, n_positions=512), 16, 512
        model = GPT2LMHeadModel(cfg).to(dev.torch_device)
        x = torch.randint(0, cfg.vocab_size, (batch, seq), device=dev.torch_device)

        def forward():
            with torch.autocast(dev.torch_device, dtype=torch.bfloat16, enabled=cuda):
                return model(input_ids=x, labels=x).loss
    else:
        width = 64 if dev.smoke else 1024
        model = torch.nn.Sequential(
            torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width)
        ).to(dev.torch_device)
        x = torch.randn(256, width, device=dev.torch_device)

        def forward():
            return model(x).square().mean()

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return forward, opt


class ZeusWindows:
    """Zeus 0.16's per-step windows, or (without the package) what they cost: sync + counter read."""

    def __init__(self, dev) -> None:
        self.dev = dev
        self.real = False
        reason = "smoke mode (virtual GPU: ZeusMonitor needs NVML)"
        if not dev.smoke:
            try:
                from zeus.monitor import ZeusMonitor

                self.monitor = ZeusMonitor(gpu_indices=[0])
                self.real = True
            except Exception as exc:  # not carried, or it failed to start
                missing = isinstance(exc, ModuleNotFoundError) and exc.name in ("zeus", "zeus.monitor")
                reason = "zeus not installed" if missing else f"zeus unavailable ({type(exc).__name__}: {exc})"
        if not self.real:
            print(f"{reason}: zeus_style stand-in (sync + counter read per boundary)", flush=True)

    def begin(self) -> None:
        if self.real:
            self.monitor.begin_window("step")
        else:
            self.dev.sync()
            self.dev.backend.energy_counter_J(0)

    def end(self) -> None:
        if self.real:
            self.monitor.end_window("step")
        else:
            self.dev.sync()
            self.dev.backend.energy_counter_J(0)


HOOK_NS: dict[str, int] = {}  # per mode: nanoseconds spent inside the session's (or Zeus's) calls
HOOK_STEPS: dict[str, int] = {}


def run_mode(mode, forward, opt, n, dev, session, zeus, first_step: int = 0) -> float:
    """Seconds per step of n steps in this mode (the session hooks the Lightning callback calls).

    The time inside the session's calls (or Zeus's) is summed into ``HOOK_NS[mode]``: the
    training thread's direct cost, measured call by call (a ``perf_counter_ns`` pair costs
    ~0.1 µs), beside the step-time ratio that also holds indirect costs and the noise.
    """
    phases = mode.startswith(("ours_phases", "noop_phases"))
    busy = dev.smoke
    clock = time.perf_counter_ns
    hook_ns = 0
    dev.sync()
    t0 = time.perf_counter()
    for i in range(first_step, first_step + n):
        if busy:
            dev.backend.set_utilization(1.0)
        h = clock()
        if mode == "zeus":
            zeus.begin()
        elif session is not None:
            session.step_start(i, phase="forward")  # the forward phase opens at the step's mark
        hook_ns += clock() - h
        loss = forward()
        if phases:
            h = clock()
            session.phase_switch("forward", "backward")  # one shared mark
            hook_ns += clock() - h
        loss.backward()
        if phases:
            h = clock()
            session.phase_switch("backward", "optimizer")
            hook_ns += clock() - h
        opt.step()
        opt.zero_grad(set_to_none=True)
        h = clock()
        if mode == "zeus":
            zeus.end()
        elif session is not None:
            session.step_end(i)  # closes the optimizer phase at the step's end mark
        hook_ns += clock() - h
        if busy:
            dev.backend.set_utilization(0.0)
    dev.sync()
    HOOK_NS[mode] = HOOK_NS.get(mode, 0) + hook_ns
    HOOK_STEPS[mode] = HOOK_STEPS.get(mode, 0) + n
    return (time.perf_counter() - t0) / n


def thread_cpu_s(native_id: int) -> tuple[float, float]:
    """User and system CPU seconds of one thread of this process (Linux ``/proc``; 0 elsewhere).

    A sampler thread's system time is the driver's (NVML ioctls, run without the GIL); its user
    time bounds the Python work that holds the GIL.
    """
    try:
        fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def ratio_stats(mode_s: list[float], base_s: list[float], n_boot: int = 2000, seed: int = 0) -> dict:
    """Per-cycle ratios mode/base: their median, IQR and a 95 % bootstrap CI of the median.

    Beside it, the ratio of the total times (``ratio_of_totals``) with its own bootstrap CI:
    the more efficient estimator when the noise is symmetric, the median the more robust.
    """
    mode_a, base_a = np.array(mode_s), np.array(base_s)
    ratios = mode_a / base_a
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(ratios), size=(n_boot, len(ratios)))
    boot = np.median(ratios[idx], axis=1)
    boot_tot = mode_a[idx].sum(axis=1) / base_a[idx].sum(axis=1)
    q1, q3 = np.percentile(ratios, [25, 75])
    lo, hi = np.percentile(boot, [2.5, 97.5])
    tlo, thi = np.percentile(boot_tot, [2.5, 97.5])
    return {"ratio": float(np.median(ratios)), "ratio_iqr": [float(q1), float(q3)],
            "ratio_ci95": [float(lo), float(hi)], "ratio_of_totals": float(mode_a.sum() / base_a.sum()),
            "ratio_of_totals_ci95": [float(tlo), float(thi)], "ratios": ratios.tolist()}  # fmt: skip


class NoopSession:
    """The ``noop`` controls: the calls a session takes per step, doing nothing.

    ``noop`` takes a step-window session's two calls, ``noop_phases`` a phases session's four
    (the two phase switches too). What any Python callback called at those points costs in
    this loop (the calls, and caches the step left cold): the frameworks call every callback's
    hooks, so a callback pays this floor whatever it does. A session's own share of
    ``hook_us_per_step`` is its excess over the control with its calls
    (``hook_us_above_noop``).
    """

    def step_start(self, step: int, *, phase: str | None = None) -> None:
        return None

    def step_end(self, step: int) -> None:
        return None

    def phase_switch(self, ended: str, begun: str) -> None:
        return None


class Parked:
    """Stops and restarts a session's sampler thread and its own timing around other modes' blocks.

    While one mode runs its block, the other sessions must cost nothing (else ``base`` pays for
    their samplers and they blur every block): each session's sampler thread runs only during its
    own blocks, paused with ``stop(final_drain=False)`` and resumed with ``start(first_poll=False)``
    (the device keeps ~2.4 s of power samples on an H200; the next poll of the session's own block
    drains them). The thread's CPU time is summed per session (user and system). The session's
    own timing is paused with a private method: a benchmark, not an API.
    """

    def __init__(self, session: EnergySession) -> None:
        self.session, self.sampler = session, session.sampler
        self.user_s = self.sys_s = 0.0
        self.active_s = 0.0
        self._t0 = 0.0
        self.park(first=True)

    def park(self, first: bool = False) -> None:
        native_id = self.sampler.thread_native_id
        if native_id is not None:
            user_s, sys_s = thread_cpu_s(native_id)
            self.user_s += user_s
            self.sys_s += sys_s
        self.sampler.stop(final_drain=False)
        if not first:
            self.active_s += time.perf_counter() - self._t0
        self.session._steps.pause_timing()  # the other modes' blocks are no step of this session's

    def unpark(self) -> None:
        self.sampler.start(first_poll=False)
        self.session._steps.resume_timing()
        self._t0 = time.perf_counter()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default="results")
    ap.add_argument("--mlp-cycles", type=int, default=72, help="MLP cycles (every mode one block, in a fresh order)")
    ap.add_argument("--gpt2-cycles", type=int, default=24, help="GPT-2 cycles")
    ap.add_argument("--block-s", type=float, default=0.4, help="seconds of one block (its steps are set from the "
                    "base step time; Zeus's blocks from its own)")  # fmt: skip
    ap.add_argument("--cycles-per-epoch", type=int, default=8, help="cycles per session epoch")
    ap.add_argument("--workloads", default="mlp,gpt2")
    ap.add_argument("--accuracy-epochs", type=int, default=2, help="in-training accuracy epochs (ours_phases)")
    ap.add_argument("--accuracy-steps", type=int, default=120, help="steps per accuracy epoch (GPT-2: ~5 s)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.smoke:
        args.mlp_cycles, args.gpt2_cycles, args.block_s, args.accuracy_steps = 8, 4, 0.05, 20
        print("smoke: tiny blocks on the CPU and a virtual GPU; the ratios below are noise, not overhead results",
              flush=True)  # fmt: skip
    warnings.filterwarnings("ignore")
    logging.getLogger("zeus").setLevel(logging.ERROR)
    out = Path(args.out)
    dev = open_device(args.smoke)
    limit_before = power_limit_W()
    zeus = ZeusWindows(dev)
    session_modes = ["ours_step", "ours_phases", "ours_step_all", "ours_phases_all"]
    modes = ["base", "base_aa", "noop", "noop_phases", *session_modes, "zeus"]
    results = {"device": dev.backend.describe(), "smoke": args.smoke, "power_limit_before": limit_before,
               "zeus": "ZeusMonitor 0.16" if zeus.real else "zeus_style (sync + counter read per boundary)",
               "args": vars(args), "workloads": {}}  # fmt: skip
    backend_name = "virtual" if args.smoke else "nvml"
    try:
        rng = random.Random(args.seed)
        cycles_of = {"mlp": args.mlp_cycles, "gpt2": args.gpt2_cycles}
        for kind in args.workloads.split(","):
            forward, opt = make_workload(kind, dev)
            for _ in range(20):  # warm-up
                run_mode("base", forward, opt, 1, dev, None, zeus)
            base_s = statistics.median(run_mode("base", forward, opt, 5, dev, None, zeus) for _ in range(6))
            zeus_s = statistics.median(run_mode("zeus", forward, opt, 2, dev, None, zeus) for _ in range(3))
            block = max(1, round(args.block_s / base_s))
            block_of = {m: block for m in modes} | {"zeus": max(1, round(args.block_s / zeus_s))}
            sessions, parked, noop = {}, {}, NoopSession()
            for mode in session_modes:
                cfg = {"backend": backend_name,
                       "windows": {"phases": mode.startswith("ours_phases"),
                                   "sample_fraction": 1.0 if mode.endswith("_all") else "auto"},
                       "sampling": {"energy_counter_period_s": 0.5},
                       "logging": {"log_dir": str(out / "jsonl"), "run_name": f"{kind}-{mode}",
                                   "interval_steps": 50}}  # fmt: skip
                session = EnergySession(cfg, backend=dev.backend)
                session.train_start()
                sessions[mode] = session
            step = {m: 0 for m in modes}
            for mode, session in sessions.items():  # untimed: auto sampling settles on its fraction
                session.epoch_start(-1)
                run_mode(mode, forward, opt, 6 * block, dev, session, zeus, 0)
                step[mode] = 6 * block
                session.epoch_end(-1)
                parked[mode] = Parked(session)
            times = {m: [] for m in modes}  # seconds per step, one entry per cycle
            HOOK_NS.clear()
            HOOK_STEPS.clear()
            epoch = 0
            for c in range(cycles_of[kind]):
                first_of_epoch = c % args.cycles_per_epoch == 0
                last_of_epoch = (c + 1) % args.cycles_per_epoch == 0 or c + 1 == cycles_of[kind]
                if first_of_epoch:
                    for session in sessions.values():
                        session.epoch_start(epoch)
                        session._steps.pause_timing()
                order = list(modes)
                rng.shuffle(order)
                for mode in order:
                    session = sessions.get(mode)
                    if session is not None:
                        parked[mode].unpark()
                    elif mode.startswith("noop"):
                        session = noop
                    n = block_of[mode]
                    times[mode].append(run_mode(mode, forward, opt, n, dev, session, zeus, step[mode]))
                    step[mode] += n
                    if mode in parked:
                        parked[mode].park()
                if last_of_epoch:
                    for session in sessions.values():
                        session._steps.resume_timing()
                        session.epoch_end(epoch)
                    epoch += 1
            hook_us = {m: HOOK_NS[m] / 1e3 / HOOK_STEPS[m] for m in modes}
            for mode in sessions:
                parked[mode].unpark()  # running again, as train_end and the accuracy epochs expect
            sampling = {m: {"fraction": s.sampling.fraction, "report_every": s.sampling.report_every,
                            "sampler_user_cpu_pct": 100 * parked[m].user_s / max(parked[m].active_s, 1e-9),
                            "sampler_sys_cpu_pct": 100 * parked[m].sys_s / max(parked[m].active_s, 1e-9)}
                        for m, s in sessions.items()}  # fmt: skip
            for mode in ("ours_step", "ours_step_all", "ours_phases_all"):
                sessions.pop(mode).train_end()
            # In-training accuracy: longer epochs of the phases session (outside the timed cycles).
            session = sessions.pop("ours_phases")
            acc_steps = args.accuracy_steps if kind == "gpt2" else 5 * args.accuracy_steps
            for e in range(args.accuracy_epochs):
                session.epoch_start(epoch + e)
                run_mode("ours_phases", forward, opt, acc_steps, dev, session, zeus, step["ours_phases"])
                step["ours_phases"] += acc_steps
                session.epoch_end(epoch + e)
            session.train_end()
            row = {m: {"ms_per_step_median": 1e3 * statistics.median(v), "all_ms": [1e3 * x for x in v],
                       "block_steps": block_of[m], "hook_us_per_step": hook_us[m],
                       "hook_pct_of_base_step": 100 * hook_us[m] / (1e6 * statistics.median(times["base"])),
                       **(ratio_stats(v, times["base"]) if m != "base" else {})}
                   for m, v in times.items()}  # fmt: skip
            for m in session_modes:  # the session's own cost: its excess over the same calls doing nothing
                above_us = hook_us[m] - hook_us["noop_phases" if m.startswith("ours_phases") else "noop"]
                row[m]["hook_us_above_noop"] = above_us
                row[m]["hook_above_noop_pct_of_base_step"] = 100 * above_us / (1e6 * statistics.median(times["base"]))
            row["sampling"] = sampling
            row["in_training"] = in_training(out / "jsonl" / f"{kind}-ours_phases.jsonl", acc_steps)[
                -args.accuracy_epochs :
            ]
            results["workloads"][kind] = row
            print(f"{kind}: base {row['base']['ms_per_step_median']:.3f} ms/step, {len(times['base'])} cycles, "
                  f"blocks of {block} steps (zeus {block_of['zeus']})", flush=True)  # fmt: skip
            for m in modes[1:]:
                x = row[m]
                print(f"  {m:15s} {x['ms_per_step_median']:8.3f} ms/step  ratio {x['ratio']:.4f}  "
                      f"IQR [{x['ratio_iqr'][0]:.4f}, {x['ratio_iqr'][1]:.4f}]  "
                      f"95% CI [{x['ratio_ci95'][0]:.4f}, {x['ratio_ci95'][1]:.4f}]  "
                      f"totals {x['ratio_of_totals']:.4f} [{x['ratio_of_totals_ci95'][0]:.4f}, "
                      f"{x['ratio_of_totals_ci95'][1]:.4f}]  hooks {x['hook_us_per_step']:.2f} us/step "
                      f"({x['hook_pct_of_base_step']:.3f} % of base"
                      + (f"; {x['hook_above_noop_pct_of_base_step']:.3f} % above noop)" if m in session_modes else ")"),
                      flush=True)  # fmt: skip
            print("  sampling:", sampling, flush=True)
            print("  in training:", row["in_training"], flush=True)
    finally:
        results["power_limit_after"] = power_limit_W()
        write_json(out / "step_overhead.json", results)
        dev.backend.close()
    if results["power_limit_after"] != limit_before:
        raise SystemExit(f"power limit changed: {limit_before} -> {results['power_limit_after']}")


def in_training(path: Path, steps_per_epoch: int) -> list[dict]:
    """Per epoch: step windows vs the energy counter, and phase windows vs step windows.

    The session writes an epoch's last ``steps`` report right after its ``epoch`` record
    (and its ``phases`` record right before it). Step energy × steps is the mean energy of
    the epoch's measured steps (``count``-weighted over its reports) × ``steps_per_epoch``:
    with ``windows.sample_fraction`` below 1 a report's ``steps`` can span an epoch boundary.
    """
    records = [r for r in read_jsonl(path) if r["event"] in ("steps", "phases", "epoch")]
    epochs, start = [], 0
    for i, r in enumerate(records):
        if r["event"] != "epoch":
            continue
        end = i + 2 if i + 1 < len(records) and records[i + 1]["event"] == "steps" else i + 1
        window = records[start:end]
        start = end
        reports = [x for x in window if x["event"] == "steps" and x["count"]]
        measured = sum(x["count"] for x in reports)
        mean_J = sum(x["energy_J_mean"] * x["count"] for x in reports) / measured if measured else 0.0
        steps_J = mean_J * steps_per_epoch
        phases = next((x for x in window if x["event"] == "phases"), None)
        counter = r.get("counter_energy_J")
        phase_J = sum(p["total_J"] for p in phases["phases"] if p["name"] != "dataloader") if phases else None
        epochs.append({
            "epoch": r["epoch"], "epoch_J": r["energy_J"], "counter_J": counter, "steps_J": steps_J,
            "steps_vs_counter_pct": 100 * (steps_J / counter - 1) if counter else None,
            "epoch_samples_vs_counter_pct": 100 * (r["energy_J"] / counter - 1) if counter else None,
            "phases_vs_steps_pct": 100 * (phase_J / steps_J - 1) if phase_J and steps_J else None,
            "explained": phases["explained"] if phases else None,
            "phases": {p["name"]: [p["energy_J"], *p["energy_ci_J"], p["executions"]] for p in phases["phases"]}
            if phases else None,
        })  # fmt: skip
    return epochs


if __name__ == "__main__":
    main()
