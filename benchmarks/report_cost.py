"""Cost of one periodic step report (``StepScheduler.report``) on a manual clock, old and new code (CPU only).

The virtual GPU runs on a :class:`~zeus_callbacks.backends.base.ManualClock` that advances
80 µs a step (20 + 40 + 10 µs of forward, backward, optimizer and 10 µs of data loading
with phases), so every package sees the same sample stream and the same ready windows.
Every 50 steps the sampler is drained (untimed) and the report is timed alone, in thread
CPU time. Timers: ``clock`` (``ClockTimer``) and ``standin`` (the package's
``CudaEventTimer`` over ``hook_cost.py``'s stand-in for ``torch.cuda``, its event times
on the manual clock).

    python benchmarks/report_cost.py --pkg /work/main --pkg .
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

HERE = Path(__file__).resolve()


def _worker(pkg: str, mode: str, timer: str, steps: int) -> dict:
    sys.path.insert(0, pkg)
    sys.path.insert(0, str(HERE.parent))
    import gc

    import hook_cost

    from zeus_callbacks.backends.base import ManualClock
    from zeus_callbacks.backends.virtual import VirtualGPUBackend
    from zeus_callbacks.measurement import _windows as windows_mod
    from zeus_callbacks.session import EnergySession

    clock = ManualClock(1000.0)
    hook_cost.time = types.SimpleNamespace(perf_counter=clock.now_s)  # stand-in events on the manual clock
    backend = VirtualGPUBackend(clock=clock, noise_W=3.0, read_only=True)
    cfg = {"backend": "virtual", "windows": {"phases": mode == "phases"},
           "logging": {"log_dir": tempfile.mkdtemp(), "interval_steps": 10**9, "jsonl": False}}  # fmt: skip
    session = EnergySession(cfg, backend=backend)
    if timer == "standin":
        hook_cost.use_timer(session, lambda b: hook_cost._standin_timer(windows_mod, b.clock))
    session.train_start()
    session.epoch_start(0)
    collections = [0, 0, 0]
    gc.callbacks.append(lambda phase, info: phase == "stop" and collections.__setitem__(
        info["generation"], collections[info["generation"]] + 1))  # fmt: skip
    cpu = time.thread_time
    reports = []
    for i in range(steps):
        if mode == "phases":
            session.step_start(i, phase="forward")
            clock.advance(20e-6)
            session.phase_switch("forward", "backward")
            clock.advance(40e-6)
            session.phase_switch("backward", "optimizer")
            clock.advance(10e-6)
        else:
            session.step_start(i)
            clock.advance(70e-6)
        session.step_end(i, num_samples=32)
        clock.advance(10e-6)
        if i % 50 == 49:
            session.sampler.poll_once(read_counter=False)
            t0 = cpu()
            session._steps.report()
            reports.append(cpu() - t0)
    reports = reports[20:]  # past the first samples
    windows_per_step = 5 if mode == "phases" else 1
    return {"report_us_median": 1e6 * statistics.median(reports), "report_us_mean": 1e6 * statistics.fmean(reports),
            "windows_per_report": 50 * windows_per_step, "gc_collections": collections}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pkg", action="append", help="checkout whose zeus_callbacks to measure (repeat)")
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--out", default=None, help="write report_cost.json here")
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(_worker(args.worker[0], args.worker[1], args.worker[2], args.steps)))
        return
    result: dict = {"args": vars(args), "packages": {}}
    for pkg in [str(Path(p).resolve()) for p in (args.pkg or [HERE.parents[1]])]:
        result["packages"][pkg] = {}
        for mode in ("step", "phases"):
            for timer in ("clock", "standin"):
                cmd = [sys.executable, str(HERE), "--worker", pkg, mode, timer, "--steps", str(args.steps)]
                done = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=tempfile.gettempdir())
                r = json.loads(done.stdout.strip().splitlines()[-1])
                result["packages"][pkg][f"{mode}/{timer}"] = r
                print(
                    f"{pkg:28s} {mode}/{timer:8s} report median {r['report_us_median']:7.1f} us, mean "
                    f"{r['report_us_mean']:7.1f} us ({r['windows_per_report']} windows); gc {r['gc_collections']}"
                )
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "report_cost.json").write_text(json.dumps(result, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
