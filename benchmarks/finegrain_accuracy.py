"""Accuracy of fine-grain energy per execution against energy-counter references (issue 5).

For bf16 GEMM chains and device-to-device copies (``dst.copy_(src)``, memory-bound) of
about 1, 10 and 100 ms:

* steady reference: a long back-to-back run; mean power from the energy counter between
  two counter ticks (``--ref-s`` seconds, ``--trials`` trials, spread reported) × the
  execution period from CUDA events. The mean power of the NVML samples over the same
  interval is reported beside it (the two sensors differ by a few percent on an H200).
* naive: one begin/end counter read around each single execution (``--naive`` trials).
* ours, steady mode: :func:`zeus_callbacks.measurement.profiler.profile` given 2 s.
* ours, isolated mode (1 and 10 ms): random idle gaps, ``--isolated-s`` seconds; its
  reference is the same train measured by the counter minus the idle power (counter,
  measured before and after) × the idle time.

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
from fg_common import copy_chain, counter_edge, gemm_chain, open_device, power_limit_W, write_json

from zeus_callbacks.measurement.profiler import profile
from zeus_callbacks.measurement.sampler import PowerSampler
from zeus_callbacks.measurement.sensor import characterise_sensor


def steady_reference(dev, fn, seconds: float, sampler: PowerSampler) -> dict:
    """Mean power between two counter ticks of a back-to-back run (counter and samples)."""
    t_warm = time.monotonic() + 0.5
    while time.monotonic() < t_warm:
        fn()
    t0, e0 = counter_edge(dev, work=fn)  # the GPU stays busy while we wait for the tick
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end:
        fn()
    t1, e1 = counter_edge(dev, work=fn)
    t_stop = time.monotonic() + 0.2  # stay busy past the tick, then drain
    while time.monotonic() < t_stop:
        fn()
    dev.sync()
    sampler.poll_once(read_counter=False)
    ts, ps = sampler.samples(0)
    shifted = ts - sampler.sensor_delay_s
    sel = (shifted > t0) & (shifted <= t1)
    samples_W = float(np.mean(ps[sel])) if sel.any() else math.nan
    return {"power_W": (e1 - e0) / (t1 - t0), "samples_power_W": samples_W, "t_s": t1 - t0}


def measure_period_s(dev, fn, seconds: float = 0.5) -> float:
    import torch

    if dev.torch_device != "cuda":
        t0, n = time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds:
            fn()
            n += 1
        return (time.perf_counter() - t0) / n
    for _ in range(3):
        fn()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    n = max(3, int(seconds / max(1e-4, _quick_ms(dev, fn) / 1e3)))
    s.record()
    for _ in range(n):
        fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / 1e3 / n


def _quick_ms(dev, fn) -> float:
    t0 = time.perf_counter()
    fn()
    dev.sync()
    return (time.perf_counter() - t0) * 1e3


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
    from zeus_callbacks.measurement.finegrain import differentiate
    from zeus_callbacks.measurement.windows import ClockTimer, CudaEventTimer

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


def idle_power_W(dev, seconds: float) -> float:
    t0, e0 = counter_edge(dev)
    time.sleep(seconds)
    t1, e1 = counter_edge(dev)
    return (e1 - e0) / (t1 - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="CPU + virtual GPU, tiny sizes")
    ap.add_argument("--out", default="results", help="output directory")
    ap.add_argument("--lengths-ms", default="1,10,100")
    ap.add_argument("--ref-s", type=float, default=5.0, help="seconds of each steady-reference trial")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--naive", type=int, default=40)
    ap.add_argument("--steady-s", type=float, default=2.0)
    ap.add_argument("--isolated-s", type=float, default=40.0)
    ap.add_argument("--bursts", type=int, default=20, help="bursts for profile differentiation (10 ms only; 0: off)")
    ap.add_argument("--isolated-max-ms", type=float, default=10.0, help="isolated mode only up to this length")
    ap.add_argument("--only", default="", help="comma-separated workloads (gemm, copy) and/or modes "
                    "(naive, steady, isolated, bursts) to run; default everything")  # fmt: skip
    args = ap.parse_args()
    if args.smoke:
        args.ref_s, args.trials, args.naive, args.isolated_s, args.bursts = 1.0, 2, 5, 4.0, 6
        args.lengths_ms = "1,10"
    workloads, modes = _selection(args.only)
    out = Path(args.out)
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
        "sensor": dataclasses.asdict(sensor),
        "lengths": [],
    }
    try:
        for workload, target in [(w, float(x)) for w in workloads for x in args.lengths_ms.split(",")]:
            fn, ms, label = (gemm_chain if workload == "gemm" else copy_chain)(dev, target)
            row = {"workload": workload, "target_ms": target, "kernel": label, "exec_ms": ms}
            refs = [steady_reference(dev, fn, args.ref_s, sampler) for _ in range(args.trials)]
            period_s = measure_period_s(dev, fn)
            ref_J = [r["power_W"] * period_s for r in refs]
            ref_samples_J = [r["samples_power_W"] * period_s for r in refs]
            row["steady_ref"] = {
                "energy_J": statistics.median(ref_J), "trials_J": ref_J,
                "spread_pct": 100 * (max(ref_J) - min(ref_J)) / statistics.median(ref_J),
                "samples_energy_J": statistics.median(ref_samples_J), "period_s": period_s,
                "sensor_gap_pct": 100 * (statistics.median(ref_samples_J) / statistics.median(ref_J) - 1),
            }  # fmt: skip
            ref = row["steady_ref"]["energy_J"]
            if "naive" in modes:
                nv = naive(dev, fn, args.naive)
                row["naive"] = {
                    "median_J": statistics.median(nv), "zeros": sum(1 for e in nv if e == 0), "trials": len(nv),
                    "err_pct_median": 100 * (statistics.median(nv) / ref - 1),
                    "err_pct_min": 100 * (min(nv) / ref - 1), "err_pct_max": 100 * (max(nv) / ref - 1),
                }  # fmt: skip
            if "steady" in modes:
                st = profile(fn, mode="steady", backend=dev.backend, min_time_s=args.steady_s,
                             max_time_s=args.steady_s, target_ci=0.001, idle_s=0.5, warmup_s=0.3,
                             name=f"{label} steady", sensor_delay_s=delay,
                             plot_path=out / f"profile_steady_{workload}_{int(target)}ms.png")  # fmt: skip
                row["steady"] = _ours(st, ref, row["steady_ref"]["samples_energy_J"])
                # Energy per execution scales with its duration: compare mean power too, which
                # does not depend on the execution period measured separately for the reference.
                ref_W = statistics.median(r["power_W"] for r in refs)
                row["steady"]["mean_power_W"] = st.energy_J / st.duration_s
                row["steady"]["power_err_pct"] = 100 * (st.energy_J / st.duration_s / ref_W - 1)
                row["steady"]["duration_vs_ref_period_pct"] = 100 * (st.duration_s / period_s - 1)
            if "isolated" in modes and target <= args.isolated_max_ms:
                p_idle0 = idle_power_W(dev, 1.5)
                t0, e0 = counter_edge(dev)
                iso = profile(fn, mode="isolated", backend=dev.backend, min_time_s=args.isolated_s,
                              max_time_s=args.isolated_s, target_ci=0.001, idle_s=0.5, name=f"{label} isolated",
                              sensor_delay_s=delay,
                              plot_path=out / f"profile_isolated_{workload}_{int(target)}ms.png")  # fmt: skip
                t1, e1 = counter_edge(dev)
                p_idle1 = idle_power_W(dev, 1.5)
                p_idle = (p_idle0 + p_idle1) / 2
                n_all = iso.executions_used + iso.executions_dropped
                iso_ref = ((e1 - e0) - p_idle * ((t1 - t0) - n_all * iso.duration_s)) / n_all
                row["isolated_ref"] = {"energy_J": iso_ref, "idle_W_before": p_idle0, "idle_W_after": p_idle1,
                                       "executions": n_all}  # fmt: skip
                row["isolated"] = _ours(iso, iso_ref, None)
            if "bursts" in modes and args.bursts and 5 <= target <= 20:
                row["differentiation"] = bursts(dev, fn, sampler, delay, args.bursts, 30, 0.3)
                print("  differentiation:", row["differentiation"]["rel_power_diff_vs_steady"], flush=True)
            results["lengths"].append(row)
            _print(row)
            del fn  # a copy's buffers are GBs: free them before the next workload
            if dev.torch_device == "cuda":
                import torch

                torch.cuda.empty_cache()
    finally:
        sampler.stop()
        results["power_limit_after"] = power_limit_W()
        write_json(out / "finegrain_accuracy.json", results)
        dev.backend.close()
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


def _ours(res, ref_J: float, samples_ref_J: float | None) -> dict:
    lo, hi = res.energy_ci_J
    out = {
        "energy_J": res.energy_J, "ci_J": [lo, hi], "err_pct": 100 * (res.energy_J / ref_J - 1),
        "ci_covers_ref": lo <= ref_J <= hi, "rel_ci_halfwidth_pct": 100 * res.rel_ci_halfwidth,
        "executions": res.executions_used, "dropped": res.executions_dropped, "baseline_W": res.baseline_W,
        "dynamic_energy_J": res.dynamic_energy_J, "measurement_s": res.measurement_time_s, "timer": res.timer,
    }  # fmt: skip
    if samples_ref_J:
        out["err_pct_vs_samples_ref"] = 100 * (res.energy_J / samples_ref_J - 1)
    return out


def _print(row: dict) -> None:
    r = row["steady_ref"]
    print(f"{row['kernel']} ({row['exec_ms']:.2f} ms): ref {r['energy_J']:.4g} J (spread {r['spread_pct']:.1f}%, "
          f"samples {r['sensor_gap_pct']:+.1f}%)", flush=True)  # fmt: skip
    if "naive" in row:
        n = row["naive"]
        print(f"  naive: median err {n['err_pct_median']:+.0f}% [{n['err_pct_min']:+.0f}, {n['err_pct_max']:+.0f}], "
              f"zeros {n['zeros']}/{n['trials']}", flush=True)  # fmt: skip
    for mode in ("steady", "isolated"):
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
