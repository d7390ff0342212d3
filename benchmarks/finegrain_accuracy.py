"""Accuracy of fine-grain energy per execution against energy-counter references (issue 5).

For bf16 GEMM chains and device-to-device copies (``dst.copy_(src)``, memory-bound) of
about 1, 10 and 100 ms:

* steady reference: one back-to-back run, cut at counter ticks into ``--trials`` trials of
  ``--ref-s`` seconds (spread reported); mean power from the energy counter between two
  ticks × the execution period from CUDA events over the run. The counter is read
  continuously by a background thread (:class:`fg_common.CounterPoller`) while the main
  thread keeps the GPU busy, so a tick is timed to one read (3-5 ms on an H200), and each
  trial reports that bound as a relative error. The mean power of the NVML samples over
  the same interval is reported beside it.
* naive: one begin/end counter read around each single execution (``--naive`` trials).
* ours, steady mode: :func:`zeus_callbacks.measurement.kernel_profiler.profile` given 2 s.
* ours, isolated mode (1 and 10 ms): random idle gaps, ``--isolated-s`` seconds; its
  reference is the same train measured by the counter minus the idle power × the idle
  time. Idle power: slope of counter energy over the ticks of ``--idle-s`` before and
  after; the reference's error terms (tick bound, 2 SE of idle power, idle drift) are
  reported. A second isolated reference measures the idle in between
  (``--interleaved-ref-s``, :func:`interleaved_reference`): idle blocks and blocks of single
  executions with the same gaps alternate, so the idle drift of the cooling GPU cancels;
  ``isolated_vs_interleaved`` compares isolated mode with it.

Defaults follow issue 5 (references 15 s × 3, isolated 60 s, 1/10/100 ms, steady 2 s):
about 13 minutes, printed per part at the start (estimate) and the end (elapsed); run
``--only gemm`` and ``--only copy`` as two calls to stay well inside a 10-minute limit.
The JSON is rewritten after every measurement, so a timeout loses only the one running.

    ZEUS_CALLBACKS_READ_ONLY=1 python benchmarks/finegrain_accuracy.py --out results/
    python benchmarks/finegrain_accuracy.py --smoke      # CPU + virtual GPU, ~1 min
    ZEUS_CALLBACKS_READ_ONLY=1 python benchmarks/finegrain_accuracy.py --only copy --lengths-ms 1,10

``--only`` takes workloads (``gemm``, ``copy``) and modes (``naive``, ``steady``,
``isolated``, ``bursts``), comma-separated: a category left out runs whole.

Prints one line per measurement and writes ``finegrain_accuracy.json`` (and profile
plots) under ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import time
from pathlib import Path

import numpy as np
from fg_common import (
    CounterPoller,
    copy_chain,
    fitted_power,
    gemm_chain,
    mean_power_between,
    open_device,
    power_limit_W,
    write_json,
)

from zeus_callbacks.measurement._sampler import PowerSampler
from zeus_callbacks.measurement._sensor import characterise_sensor
from zeus_callbacks.measurement.kernel_profiler import isolated_gap_s, profile


def keep_busy(dev, fn, seconds: float) -> tuple[int, float]:
    """Run ``fn`` back to back for ``seconds`` (CPU time); returns (executions, period_s).

    At most ~20 ms of work is queued ahead of the GPU (a CUDA event per execution), so the
    CPU's clock stays close to the GPU's work and the GPU never starves. The period comes
    from CUDA events around the whole run (perf_counter on the CPU).
    """
    import torch

    cuda = dev.torch_device == "cuda"
    if cuda:
        first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        first.record()
    t0, n, queue = time.perf_counter(), 0, []
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end:
        fn()
        n += 1
        if cuda:
            done = torch.cuda.Event()
            done.record()
            queue.append((time.perf_counter(), done))
            while len(queue) > 2 and queue[-1][0] - queue[0][0] > 0.02:
                queue.pop(0)[1].synchronize()
    if cuda:
        last.record()
        last.synchronize()
        return n, first.elapsed_time(last) / 1e3 / max(n, 1)
    return n, (time.perf_counter() - t0) / max(n, 1)


def steady_reference(dev, fn, trial_s: float, trials: int, sampler: PowerSampler, warm_s: float = 0.5) -> dict:
    """Back-to-back run with the counter polled from a background thread; ``trials`` tick-aligned segments.

    Each trial is the mean power between two counter ticks ``trial_s`` apart (energy counter,
    and the NVML samples over the same interval), with the tick-timing error bound.
    """
    with CounterPoller(dev.backend, min_interval_s=0.002 if dev.smoke else 0.0) as poller:
        keep_busy(dev, fn, warm_s)
        t_begin = dev.backend.clock.now_s()
        n, period_s = keep_busy(dev, fn, trials * trial_s + 0.35)  # 0.35 s: room for the last tick
        t_busy_end = dev.backend.clock.now_s()
        dev.sync()
        ticks = poller.ticks()
    sampler.poll_once(read_counter=False)
    ts, ps = sampler.samples(0)
    shifted = ts - sampler.sensor_delay_s
    out = []
    t_lo = t_begin
    for _ in range(trials):
        seg = mean_power_between(ticks, t_lo, min(t_lo + trial_s + 0.15, t_busy_end))
        sel = (shifted > seg["t0_s"]) & (shifted <= seg["t1_s"])
        seg["samples_power_W"] = float(np.mean(ps[sel])) if sel.any() else math.nan
        seg["t_s"] = seg["t1_s"] - seg["t0_s"]
        out.append(seg)
        t_lo = seg["t1_s"]
    u_ms = 1e3 * float(np.median(ticks.uncertainty_s)) if ticks.time_s.size else None
    return {"trials": out, "period_s": period_s, "executions": n, "tick_uncertainty_ms_median": u_ms}


def naive(dev, fn, trials: int) -> list[float]:
    energies = []
    for _ in range(trials):
        dev.sync()
        e0 = dev.backend.energy_counter_J(0)
        fn()
        dev.sync()
        energies.append(dev.backend.energy_counter_J(0) - e0)
        time.sleep(0.01 + 0.02 * np.random.rand())
    return energies


def bursts(dev, fn, sampler: PowerSampler, delay: float, n_bursts: int, per_burst: int, idle_s: float) -> dict:
    """Bursts of back-to-back executions after idle: first / warming / steady profiles (FinGraV challenge C4)."""
    from zeus_callbacks.measurement._windows import ClockTimer, CudaEventTimer
    from zeus_callbacks.measurement.finegrain import differentiate

    timer = CudaEventTimer(dev.backend.clock) if dev.torch_device == "cuda" else ClockTimer(dev.backend.clock)
    marks = []
    for b in range(n_bursts):
        time.sleep(idle_s * (0.8 + 0.4 * np.random.rand()))
        timer.anchor()
        prev = timer.mark()
        for _ in range(per_burst):
            fn()
            token = timer.mark()
            marks.append((prev, token, b))
            prev = token
        dev.sync()
    time.sleep(0.3)
    sampler.poll_once(read_counter=False)
    starts = [timer.time_of(m[0], wait=True) for m in marks]
    ends = [timer.time_of(m[1], wait=True) for m in marks]
    t, p = sampler.samples(0)
    diff = differentiate(starts, ends, [m[2] for m in marks], t, p, mode="steady", sensor_delay_s=delay, n_boot=100)
    out = {"rel_power_diff_vs_steady": diff.rel_diff, "differs": list(diff.differs)}
    for name, prof in diff.result.profiles.items():
        out[name] = {"energy_J": prof.energy_J, "ci_J": list(prof.energy_ci_J), "mean_power_W": prof.mean_power_W,
                     "executions": prof.executions}  # fmt: skip
    return out


def isolated_run(dev, fn, args, label: str, delay: float, out: Path, workload: str, target: float):
    """Isolated mode with its reference: idle, the isolated train, idle; the counter polled in the idles.

    The counter is polled only around the train (a poller before, a fresh one after): a read
    every ~4 ms for the whole 60 s would be driver traffic in every idle gap between the
    executions, the very time whose power the reference and the fit must agree on.
    """
    clock = dev.backend.clock
    interval = 0.002 if dev.smoke else 0.0
    with CounterPoller(dev.backend, min_interval_s=interval) as poller:
        time.sleep(0.15)
        t_idle0 = clock.now_s()
        time.sleep(args.idle_s)
        t_iso0 = clock.now_s()
        ticks0 = poller.ticks()
    iso = profile(fn, mode="isolated", backend=dev.backend, min_time_s=args.isolated_s,
                  max_time_s=args.isolated_s, target_ci=0.001, idle_s=0.5, name=f"{label} isolated",
                  gap_s=isolated_gap_s(dev.backend.sample_period_s),
                  sensor_delay_s=delay,
                  plot_path=out / f"profile_isolated_{workload}_{int(target)}ms.png")  # fmt: skip
    t_iso1 = clock.now_s()
    with CounterPoller(dev.backend, min_interval_s=interval) as poller:
        time.sleep(args.idle_s)
        t_idle1 = clock.now_s()
        poller.wait_tick_after(t_idle1)
        ticks1 = poller.ticks()
    idle0, idle1 = fitted_power(ticks0, t_idle0, t_iso0), fitted_power(ticks1, t_iso1, t_idle1)
    p_idle = (idle0["power_W"] + idle1["power_W"]) / 2
    before = int(np.flatnonzero(ticks0.time_s <= t_iso0)[-1])  # the train lies between these two ticks
    after = int(np.flatnonzero(ticks1.time_s >= t_iso1)[0])
    span_s = ticks1.time_s[after] - ticks0.time_s[before]
    energy_J = ticks1.energy_J[after] - ticks0.energy_J[before]
    n_all = iso.executions_used + iso.executions_dropped
    idle_time_s = span_s - n_all * iso.duration_s
    ref = (energy_J - p_idle * idle_time_s) / n_all
    # Relative uncertainty of the reference, term by term (J per execution / ref):
    tick = p_idle * (ticks0.uncertainty_s[before] + ticks1.uncertainty_s[after]) / n_all / ref  # bound
    idle_se = idle_time_s * math.hypot(idle0["se_W"], idle1["se_W"]) / 2 / n_all / ref  # 1 SE
    drift = idle_time_s * abs(idle0["power_W"] - idle1["power_W"]) / 2 / n_all / ref  # idle power moved
    rel_err = tick + 2 * idle_se + drift
    iso_ref = {"energy_J": ref, "idle_W_before": idle0["power_W"], "idle_W_after": idle1["power_W"],
               "idle_se_W": [idle0["se_W"], idle1["se_W"]], "executions": n_all, "span_s": span_s,
               "rel_err_pct": 100 * rel_err, "rel_err_terms_pct": {"tick_timing_bound": float(100 * tick),
               "idle_power_2se": float(200 * idle_se), "idle_drift": float(100 * drift)}}  # fmt: skip
    return iso, iso_ref


def interleaved_reference(
    dev, fn, duration_s: float, total_s: float, block_s: float, gap_s: tuple[float, float], seed: int = 0
) -> dict:
    """Isolated reference with its idle measured in between: idle and execution blocks alternate.

    ``I X I X … I``: each block lasts ``block_s``; an X block runs single executions, each
    waited for and followed by a random idle gap drawn from ``gap_s`` (as isolated mode
    does), the last gap inside the block so each execution's power tail is too. The counter
    is polled the whole time. Per X block: counter energy between the last tick before it
    and the first tick after it, minus the idle power × the span's idle time (the span
    less the executions, each ``duration_s`` long: isolated mode's measured duration, so both
    count the same time as the execution's); the idle power is the mean of the two
    neighbouring I blocks' fitted powers. Idle power drifts by a few W over a minute as the
    GPU cools (2-3 W between 1 s before and after a 60 s train in the H200 run), which at
    1 ms is several times the executions' own energy; bracketing every few seconds cancels
    that drift to first order, and the counter-polling traffic is the same in both kinds of
    block. The band is 2 standard errors of the per-block estimates (the block-to-block
    spread: tick timing, idle fits and any drift left over all show in it).

    Returns:
        ``energy_J`` per execution, ``rel_err_pct`` (2 SE), per-block ``blocks_J``,
        ``idle_W`` of every I block, ``executions``, ``blocks``, ``block_s``.
    """
    clock = dev.backend.clock
    rng = np.random.default_rng(seed)
    pairs = max(2, round(total_s / (2 * block_s)))
    idle_spans, exec_blocks = [], []  # (t0, t1) and (t0, t1, n)
    with CounterPoller(dev.backend, min_interval_s=0.002 if dev.smoke else 0.0) as poller:
        time.sleep(0.15)
        for k in range(pairs + 1):
            t0 = clock.now_s()
            time.sleep(block_s)
            idle_spans.append((t0, clock.now_s()))
            if k == pairs:
                break
            t0, n = clock.now_s(), 0
            while clock.now_s() - t0 < block_s:
                fn()
                dev.sync()
                n += 1
                time.sleep(float(rng.uniform(*gap_s)))
            exec_blocks.append((t0, clock.now_s(), n))
        poller.wait_tick_after(clock.now_s())
        ticks = poller.ticks()
    idle_W = [fitted_power(ticks, lo, hi)["power_W"] for lo, hi in idle_spans]
    net_J, counts = [], []
    for k, (t0, t1, n) in enumerate(exec_blocks):
        a = int(np.flatnonzero(ticks.time_s <= t0)[-1])
        b = int(np.flatnonzero(ticks.time_s >= t1)[0])
        span_s = ticks.time_s[b] - ticks.time_s[a]
        p_idle = (idle_W[k] + idle_W[k + 1]) / 2
        net_J.append(ticks.energy_J[b] - ticks.energy_J[a] - p_idle * (span_s - n * duration_s))
        counts.append(n)
    net, n_arr = np.array(net_J), np.array(counts)
    ref = float(net.sum() / n_arr.sum())
    per_block = net / n_arr
    se = float(np.std(per_block, ddof=1) / math.sqrt(per_block.size))
    return {"energy_J": ref, "rel_err_pct": 200 * se / ref, "blocks_J": per_block.tolist(),
            "idle_W": idle_W, "executions": int(n_arr.sum()), "blocks": int(per_block.size),
            "block_s": block_s}  # fmt: skip


def budget_s(args, workloads: list[str], modes: list[str]) -> dict[str, float]:
    """Estimated seconds of each part (measuring time plus the waits around it)."""
    lengths = [float(x) for x in args.lengths_ms.split(",")]
    parts = {"setup and sensor step test": 15.0}
    for w in workloads:
        for ms in lengths:
            key = f"{w} {ms:g} ms"
            t = 0.5 + args.trials * args.ref_s + 0.35 + 1.0  # warm-up, trials, last tick, copies/sync
            if "naive" in modes:
                t += args.naive * (ms / 1e3 + 0.03)
            if "steady" in modes:
                t += args.steady_s + 0.5 + 0.3 + 0.6 + 1.5  # idle, warm-up, drain, analysis
            if "isolated" in modes and ms <= args.isolated_max_ms:
                t += args.isolated_s + 2 * args.idle_s + 1.2 + 2.0
                if args.interleaved_ref_s > 0:
                    t += args.interleaved_ref_s + args.interleaved_block_s + 0.5
            if "bursts" in modes and args.bursts and w in args.bursts_on.split(",") and 5 <= ms <= 20:
                t += args.bursts * (0.3 + 30 * ms / 1e3)
            parts[key] = t
    return parts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="CPU + virtual GPU, tiny sizes")
    ap.add_argument("--out", default="results", help="output directory")
    ap.add_argument("--lengths-ms", default="1,10,100")
    ap.add_argument("--ref-s", type=float, default=15.0, help="seconds of each steady-reference trial")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--naive", type=int, default=20)
    ap.add_argument("--steady-s", type=float, default=2.0)
    ap.add_argument("--isolated-s", type=float, default=60.0)
    ap.add_argument("--idle-s", type=float, default=1.0, help="idle before and after isolated mode (idle power)")
    ap.add_argument("--bursts", type=int, default=12, help="bursts for profile differentiation (10 ms only; 0: off)")
    ap.add_argument("--bursts-on", default="gemm", help="workloads that run the bursts")
    ap.add_argument(
        "--interleaved-ref-s",
        type=float,
        default=48.0,
        help="seconds of the interleaved isolated reference (idle and execution blocks; 0: off)",
    )
    ap.add_argument("--interleaved-block-s", type=float, default=3.0, help="its block length (s)")
    ap.add_argument("--isolated-max-ms", type=float, default=10.0, help="isolated mode only up to this length")
    ap.add_argument("--only", default="", help="comma-separated workloads (gemm, copy) and/or modes "
                    "(naive, steady, isolated, bursts) to run; default everything")  # fmt: skip
    args = ap.parse_args()
    if args.smoke:
        args.ref_s, args.trials, args.naive, args.isolated_s, args.bursts, args.idle_s = 1.0, 2, 5, 4.0, 6, 0.6
        args.interleaved_ref_s, args.interleaved_block_s = 4.0, 0.5
        args.lengths_ms = "1,10"
        print("smoke: these figures come from a virtual GPU with a busy CPU; they test the benchmark, "
              "they are not accuracy results", flush=True)  # fmt: skip
    workloads, modes = _selection(args.only)
    out = Path(args.out)
    parts = budget_s(args, workloads, modes)
    print("time budget (estimate, s): " + ", ".join(f"{k} {v:.0f}" for k, v in parts.items())
          + f"; total {sum(parts.values()):.0f} s", flush=True)  # fmt: skip
    if sum(parts.values()) > 570:
        print("  (close to or over a 10-minute call: --only gemm and --only copy split it in two)", flush=True)
    t_run0 = time.monotonic()
    dev = open_device(args.smoke)
    limit_before = power_limit_W()
    step_fn, _, _ = gemm_chain(dev, 10.0)

    def busy(seconds: float) -> None:
        t_end = time.monotonic() + seconds
        while time.monotonic() < t_end:  # sync each time: the CPU must not run ahead of the edge
            step_fn()
            dev.sync()

    sensor = characterise_sensor(dev.backend, busy, idle_s=0.7, busy_s=0.8)
    delay = sensor.delay_s
    print(f"sensor: update {sensor.update_period_s * 1e3:.1f} ms, samples {sensor.sample_period_s * 1e3:.1f} ms, "
          f"fitted delay {delay * 1e3:.1f} ms (backend default {dev.backend.sensor_delay_s * 1e3:.1f} ms), "
          f"rise {sensor.rise_s * 1e3:.1f} ms, fall {sensor.fall_s * 1e3:.1f} ms, idle {sensor.idle_W:.0f} W, "
          f"busy {sensor.busy_W:.0f} W, fit rmse {sensor.fit_rmse_W:.0f} W", flush=True)  # fmt: skip
    sampler = PowerSampler(
        dev.backend,
        [0],
        poll_period_s=0.1,
        energy_counter_period_s=3600.0,
        buffer_s=600.0,
        sensor_delay_s=delay,
    )
    sampler.start()
    results = {
        "device": dev.backend.describe(),
        "smoke": args.smoke,
        "power_limit_before": limit_before,
        "args": vars(args),
        "budget_s": parts,
        "elapsed_s": {"setup and sensor step test": time.monotonic() - t_run0},
        "sensor": dataclasses.asdict(sensor),
        "lengths": [],
    }

    def save() -> None:  # after every measurement: a timeout loses at most the one running
        write_json(out / "finegrain_accuracy.json", results)

    save()
    try:
        for workload, target in [(w, float(x)) for w in workloads for x in args.lengths_ms.split(",")]:
            t_part0 = time.monotonic()
            fn, ms, label = (gemm_chain if workload == "gemm" else copy_chain)(dev, target)
            row = {"workload": workload, "target_ms": target, "kernel": label, "exec_ms": ms}
            results["lengths"].append(row)
            sr = steady_reference(dev, fn, args.ref_s, args.trials, sampler)
            period_s = sr["period_s"]
            refs = sr["trials"]
            ref_J = [r["power_W"] * period_s for r in refs]
            ref_samples_J = [r["samples_power_W"] * period_s for r in refs]
            row["steady_ref"] = {
                "energy_J": statistics.median(ref_J), "trials_J": ref_J,
                "trial_s": [r["t_s"] for r in refs], "power_W": [r["power_W"] for r in refs],
                "spread_pct": 100 * (max(ref_J) - min(ref_J)) / statistics.median(ref_J),
                "tick_rel_err_pct": [100 * r["rel_err"] for r in refs],
                "tick_uncertainty_ms_median": sr["tick_uncertainty_ms_median"],
                "samples_energy_J": statistics.median(ref_samples_J), "period_s": period_s,
                "executions": sr["executions"],
                "sensor_gap_pct": 100 * (statistics.median(ref_samples_J) / statistics.median(ref_J) - 1),
            }  # fmt: skip
            ref = row["steady_ref"]["energy_J"]
            ref_rel_err = max(r["rel_err"] for r in refs)
            save()
            if "naive" in modes:
                nv = naive(dev, fn, args.naive)
                row["naive"] = {
                    "median_J": statistics.median(nv), "zeros": sum(1 for e in nv if e == 0), "trials": len(nv),
                    "err_pct_median": 100 * (statistics.median(nv) / ref - 1),
                    "err_pct_min": 100 * (min(nv) / ref - 1), "err_pct_max": 100 * (max(nv) / ref - 1),
                }  # fmt: skip
                save()
            if "steady" in modes:
                st = profile(fn, mode="steady", backend=dev.backend, min_time_s=args.steady_s,
                             max_time_s=args.steady_s, target_ci=0.001, idle_s=0.5, warmup_s=0.3,
                             name=f"{label} steady", sensor_delay_s=delay,
                             plot_path=out / f"profile_steady_{workload}_{int(target)}ms.png")  # fmt: skip
                row["steady"] = _ours(st, ref, row["steady_ref"]["samples_energy_J"], ref_rel_err)
                # Energy per execution scales with its duration: compare mean power too, which
                # does not depend on the execution period measured separately for the reference.
                ref_W = statistics.median(r["power_W"] for r in refs)
                row["steady"]["mean_power_W"] = st.energy_J / st.duration_s
                row["steady"]["power_err_pct"] = 100 * (st.energy_J / st.duration_s / ref_W - 1)
                row["steady"]["duration_vs_ref_period_pct"] = 100 * (st.duration_s / period_s - 1)
                row["steady"]["pause_power_W"] = st.extra.get("pause_power_W")
                row["steady"]["pause_time_s"] = st.extra.get("pause_time_s")
                save()
            if "isolated" in modes and target <= args.isolated_max_ms:
                iso, iso_ref = isolated_run(dev, fn, args, label, delay, out, workload, target)
                row["isolated_ref"] = iso_ref
                row["isolated"] = _ours(iso, iso_ref["energy_J"], None, iso_ref["rel_err_pct"] / 100)
                save()
                if args.interleaved_ref_s > 0:
                    gap_s = isolated_gap_s(dev.backend.sample_period_s)
                    ir = interleaved_reference(dev, fn, iso.duration_s, args.interleaved_ref_s,
                                               args.interleaved_block_s, gap_s)  # fmt: skip
                    row["isolated_ref_interleaved"] = ir
                    row["isolated_vs_interleaved"] = _ours(iso, ir["energy_J"], None, ir["rel_err_pct"] / 100)
                    save()
            if "bursts" in modes and args.bursts and workload in args.bursts_on.split(",") and 5 <= target <= 20:
                row["differentiation"] = bursts(dev, fn, sampler, delay, args.bursts, 30, 0.3)
                print("  differentiation:", row["differentiation"]["rel_power_diff_vs_steady"], flush=True)
            results["elapsed_s"][f"{workload} {target:g} ms"] = time.monotonic() - t_part0
            save()
            _print(row)
            del fn  # a copy's buffers are GBs: free them before the next workload
            if dev.torch_device == "cuda":
                import torch

                torch.cuda.empty_cache()
    finally:
        sampler.stop()
        results["power_limit_after"] = power_limit_W()
        results["elapsed_s"]["total"] = time.monotonic() - t_run0
        save()
        dev.backend.close()
        print("elapsed (s): " + ", ".join(f"{k} {v:.0f}" for k, v in results["elapsed_s"].items()), flush=True)
    if results["power_limit_after"] != limit_before:
        raise SystemExit(f"power limit changed: {limit_before} -> {results['power_limit_after']}")


WORKLOADS = ("gemm", "copy")
MODES = ("naive", "steady", "isolated", "bursts")


def _selection(only: str) -> tuple[list[str], list[str]]:
    """Workloads and modes ``--only`` selects (a category it does not name runs whole)."""
    items = [x.strip() for x in only.split(",") if x.strip()]
    unknown = [x for x in items if x not in WORKLOADS + MODES]
    if unknown:
        raise SystemExit(f"--only: unknown {unknown}; choose from {', '.join(WORKLOADS + MODES)}")
    workloads = [w for w in WORKLOADS if w in items] or list(WORKLOADS)
    modes = [m for m in MODES if m in items] or list(MODES)
    return workloads, modes


def _ours(res, ref_J: float, samples_ref_J: float | None, ref_rel_err: float) -> dict:
    lo, hi = res.energy_ci_J
    out = {
        "energy_J": res.energy_J, "ci_J": [lo, hi], "err_pct": 100 * (res.energy_J / ref_J - 1),
        "ci_covers_ref": lo <= ref_J <= hi, "ref_rel_err_pct": 100 * ref_rel_err,
        "ci_meets_ref_band": lo <= ref_J * (1 + ref_rel_err) and hi >= ref_J * (1 - ref_rel_err),
        "rel_ci_halfwidth_pct": 100 * res.rel_ci_halfwidth,
        "executions": res.executions_used, "dropped": res.executions_dropped, "baseline_W": res.baseline_W,
        "dynamic_energy_J": res.dynamic_energy_J, "measurement_s": res.measurement_time_s, "timer": res.timer,
    }  # fmt: skip
    if samples_ref_J:
        out["err_pct_vs_samples_ref"] = 100 * (res.energy_J / samples_ref_J - 1)
    return out


def _print(row: dict) -> None:
    r = row["steady_ref"]
    print(f"{row['kernel']} ({row['exec_ms']:.2f} ms): ref {r['energy_J']:.4g} J (spread {r['spread_pct']:.1f}%, "
          f"tick timing ±{max(r['tick_rel_err_pct']):.2f}%, samples {r['sensor_gap_pct']:+.2f}%)",
          flush=True)  # fmt: skip
    if "isolated_ref" in row:
        i = row["isolated_ref"]
        print(f"  isolated ref: {i['energy_J']:.4g} J ±{i['rel_err_pct']:.1f}% (idle {i['idle_W_before']:.1f} / "
              f"{i['idle_W_after']:.1f} W; terms "
              + ", ".join(f"{k} {v:.2f}%" for k, v in i["rel_err_terms_pct"].items()) + ")", flush=True)  # fmt: skip
    if "naive" in row:
        n = row["naive"]
        print(f"  naive: median err {n['err_pct_median']:+.0f}% [{n['err_pct_min']:+.0f}, {n['err_pct_max']:+.0f}], "
              f"zeros {n['zeros']}/{n['trials']}", flush=True)  # fmt: skip
    if "isolated_ref_interleaved" in row:
        i = row["isolated_ref_interleaved"]
        print(f"  interleaved isolated ref: {i['energy_J']:.4g} J ±{i['rel_err_pct']:.1f}% ({i['blocks']} blocks "
              f"of {i['block_s']:g} s, {i['executions']} executions; idle {min(i['idle_W']):.1f}-"
              f"{max(i['idle_W']):.1f} W)", flush=True)  # fmt: skip
    for mode in ("steady", "isolated", "isolated_vs_interleaved"):
        if mode in row:
            o = row[mode]
            extra = f" (vs samples ref {o['err_pct_vs_samples_ref']:+.2f}%)" if "err_pct_vs_samples_ref" in o else ""
            if "power_err_pct" in o:
                extra += f" power err {o['power_err_pct']:+.2f}% duration {o['duration_vs_ref_period_pct']:+.2f}%"
            ci = o["rel_ci_halfwidth_pct"]
            print(f"  {mode}: {o['energy_J']:.4g} J err {o['err_pct']:+.2f}%{extra} CI ±{ci:.2f}% "
                  f"covers={o['ci_covers_ref']} n={o['executions']} dropped={o['dropped']}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
