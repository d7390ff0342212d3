"""What the session's calls cost right after a step of other work, measured or not (CPU, issue 5).

A Python call made right after ~1 ms of other work runs with cold caches and costs several
times what it costs in a tight loop. This benchmark shows that on the machine it runs on:

* ``trivial``: a method with the body of an unmeasured ``step_start`` (a few attribute reads),
  timed from outside, in a tight loop and after ``--spin-ms`` of busy work (a Python spin);
* ``session``: an :class:`~zeus_callbacks.session.EnergySession` on the virtual GPU with the
  default ``windows.sample_fraction: auto``, one ``step_start`` + ``step_end`` per spun step:
  time per step inside the calls, split into quiet steps (unmeasured steps the session
  counted ahead, whose calls return at once), the other unmeasured steps, measured steps and
  the steps that reported, the share of steps auto measured at the end, and auto's own estimates
  (its per-unmeasured-step cost ``u`` and per-measured-step cost ``c``).

    python benchmarks/cold_call_cost.py            # ~1 minute
    python benchmarks/cold_call_cost.py --steps 3000 --spin-ms 1

Prints a table and, with ``--out``, writes ``cold_call_cost.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

import numpy as np

from zeus_callbacks.session import EnergySession


class Trivial:
    """A call of a few attribute reads and one decrement, nothing else: the cost floor of any call.

    Its fields are its own, not copies of the session's (those change with the session; a quiet
    step of today's session reads one attribute, see ``quiet_steps_left``).
    """

    def __init__(self) -> None:
        self.active, self.step_hook, self.steps_left, self.gap_open = True, None, 10**9, False

    def step_start(self, step: int, *, phase: str | None = None) -> None:
        if not self.active:
            return
        if self.step_hook is not None:
            return
        if self.steps_left:
            self.steps_left -= 1
            if self.gap_open:
                return


def spin(seconds: float) -> None:
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        pass


def trivial_us(steps: int, spin_s: float) -> float:
    obj, clock, total = Trivial(), time.perf_counter_ns, 0
    for i in range(steps):
        if spin_s:
            spin(spin_s)
        t0 = clock()
        obj.step_start(i, phase="forward")
        total += clock() - t0
    return total / steps / 1e3


def session_costs(steps: int, spin_s: float) -> dict:
    logging.disable(logging.WARNING)
    cfg = {"backend": "virtual", "logging": {"log_dir": tempfile.mkdtemp(), "run_name": "cold"}}
    session = EnergySession(cfg)
    session.train_start()
    session.epoch_start(0)
    clock = time.perf_counter_ns
    rows = np.zeros((steps, 4))  # ns inside the calls, quiet, measured, reported
    for i in range(steps):
        spin(spin_s)
        reported, quiet = session.reports_made, session.quiet_steps_left > 0
        t0 = clock()
        session.step_start(i)
        measured = session.measuring
        session.step_end(i)
        rows[i] = (clock() - t0, quiet, measured, session.reports_made != reported)
    sampling = session.sampling  # auto's estimates below are its private fields: no public reader yet
    session.epoch_end(0)
    session.train_end()
    logging.disable(logging.NOTSET)
    ns, quiet, measured, reported = rows[:, 0], rows[:, 1] == 1, rows[:, 2] == 1, rows[:, 3] == 1
    split = {}
    for name, mask in (("quiet", quiet), ("unmeasured", ~quiet & ~measured & ~reported),
                       ("measured", measured & ~reported), ("reporting", reported)):  # fmt: skip
        split[name] = {"steps": int(mask.sum()), "us_mean": float(ns[mask].mean() / 1e3) if mask.any() else None,
                       "share_of_total": float(ns[mask].sum() / ns.sum())}  # fmt: skip
    return {"us_per_step": float(ns.mean() / 1e3), "split": split, "fraction_at_end": sampling.fraction,
            "report_every": sampling.report_every,
            "auto_u_us": None if sampling._unmeasured_s is None else sampling._unmeasured_s * 1e6,
            "auto_c_us": None if sampling._cost_s is None else sampling._cost_s * 1e6}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--spin-ms", type=float, default=1.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    spin_s = args.spin_ms / 1e3
    result = {"steps": args.steps, "spin_ms": args.spin_ms,
              "trivial_us_tight": trivial_us(args.steps, 0.0),
              "trivial_us_after_work": trivial_us(min(args.steps, 5000), spin_s),
              "session": session_costs(args.steps, spin_s)}  # fmt: skip
    s = result["session"]
    print(f"trivial call: {result['trivial_us_tight']:.2f} us in a tight loop, "
          f"{result['trivial_us_after_work']:.2f} us after {args.spin_ms:g} ms of work")  # fmt: skip
    print(f"session (auto): {s['us_per_step']:.2f} us per step in its calls; {100 * s['fraction_at_end']:.2f} % "
          f"of steps measured at the end, a report every {s['report_every']} steps; auto's estimates "
          f"u = {s['auto_u_us'] or float('nan'):.2f} us, c = {s['auto_c_us'] or float('nan'):.1f} us")  # fmt: skip
    for name, v in s["split"].items():
        mean = "-" if v["us_mean"] is None else f"{v['us_mean']:.2f} us"
        print(
            f"  {name:10s} steps {v['steps']:6d}  mean {mean:>10s}  share of the calls' time {v['share_of_total']:.2f}"
        )
    if s["auto_u_us"] and s["auto_c_us"]:  # a speed claim, so timed here and not in tests/test_window_sampling.py
        print(f"auto's u / c = {s['auto_u_us'] / s['auto_c_us']:.3f}: an unmeasured step's calls cost less than "
              f"a measured step's when < 1")  # fmt: skip
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "cold_call_cost.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
