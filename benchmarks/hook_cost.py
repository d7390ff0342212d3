"""Training-thread cost of the session's hot path, old and new code side by side (CPU only).

Three measurements, each run in a fresh process per package so that two versions of
``zeus_callbacks`` can be compared in one run (``--pkg`` names a checkout; the processes
alternate in a shuffled order, round after round):

* ``session``: microseconds per step of ``step_start`` + ``step_end`` (mode ``step``) and,
  with ``windows.phases``, of the Lightning phase sequence (mode ``phases``), on the
  virtual GPU, with the package's ``ClockTimer`` (timer ``clock``) and with its
  ``CudaEventTimer`` driven by a stand-in for ``torch.cuda`` (timer ``standin``): events
  that do what a CUDA event does minus the GPU (object creation, ``record`` on the current
  stream, ``query``, ``elapsed_time``), so the bookkeeping is what is measured. The cost of
  an empty loop is subtracted. Resolution at report intervals (every 50 steps) is included:
  a round's figure is its total time over its steps, i.e. the mean per step with the
  reports (and any garbage collection they cause) amortised; the summary gives the mean
  and the median of the rounds, and the collections (generations 0, 1, 2) that ran during
  the timed loops with their time per step.
* ``lightning``: a real Lightning ``Trainer`` on a tiny model on the CPU: milliseconds per
  step without the callback, with ``ZeusCallback`` (step windows) and with phases;
  interleaved rounds, median and spread.

    python benchmarks/hook_cost.py --pkg /work/main --pkg . --out results/
    python benchmarks/hook_cost.py --smoke

Prints a table and writes ``hook_cost.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()


# ----------------------------------------------------------------------------- worker
def _standin_cuda():
    """A stand-in for ``torch.cuda``: its Event does what torch.cuda.Event does, minus the GPU."""

    class Stream:
        __slots__ = ("stream_id", "device_index", "device_type")

        def __init__(self, stream_id: int, device_index: int, device_type: int) -> None:
            self.stream_id, self.device_index, self.device_type = stream_id, device_index, device_type

    class Event:
        __slots__ = ("_t", "enable_timing")

        def __init__(self, enable_timing: bool = False) -> None:
            self.enable_timing = enable_timing
            self._t: float | None = None

        def record(self, stream=None) -> None:
            if stream is None:  # torch.cuda.Event.record asks for the current stream
                stream = cuda.current_stream()
            self._t = time.perf_counter()

        def query(self) -> bool:
            return True

        def synchronize(self) -> None:
            pass

        def elapsed_time(self, other: Event) -> float:
            return (other._t - self._t) * 1e3  # type: ignore[operator]

    class Cuda:
        pass

    cuda = Cuda()
    cuda.Event = Event  # type: ignore[attr-defined]
    cuda.synchronize = lambda: None  # type: ignore[attr-defined]
    cuda.current_stream = lambda device=None: Stream(0, 0, 1)  # type: ignore[attr-defined]
    cuda.is_available = lambda: True  # type: ignore[attr-defined]
    return cuda


def _standin_timer(windows_mod, clock):
    """The package's own CudaEventTimer, on the stand-in (old code: ``import torch`` swapped for a moment)."""
    import inspect
    import types

    cuda = _standin_cuda()
    cls = windows_mod.CudaEventTimer
    if "cuda" in inspect.signature(cls).parameters:
        return cls(clock, cuda=cuda)
    real = sys.modules["torch"]
    sys.modules["torch"] = types.SimpleNamespace(cuda=cuda)  # type: ignore[assignment]
    try:
        return cls(clock)
    finally:
        sys.modules["torch"] = real


def use_timer(session, factory) -> None:
    """Time ``session``'s run with ``factory(backend)``: its ``timer_factory``, or an older checkout's private seam."""
    if hasattr(session, "timer_factory"):
        session.timer_factory = factory
    else:
        session._make_timer = factory


def _session_us(mode: str, timer_kind: str, steps: int, rounds: int, log_dir: str) -> tuple[list[float], dict]:
    """Microseconds per step of each round, and the garbage collections during the timed loops."""
    import gc

    from zeus_callbacks.measurement import _windows as windows_mod
    from zeus_callbacks.session import EnergySession

    cfg = {"backend": "virtual", "windows": {"phases": mode == "phases"},
           "logging": {"log_dir": log_dir, "run_name": f"{mode}-{timer_kind}", "interval_steps": 50}}  # fmt: skip
    session = EnergySession(cfg)
    if timer_kind == "standin":
        use_timer(session, lambda backend: _standin_timer(windows_mod, backend.clock))
    session.train_start()
    new_api = hasattr(session, "phase_switch")
    pc = time.perf_counter

    def loop(n: int, offset: int) -> None:
        s = session
        if mode == "step":
            for i in range(offset, offset + n):
                s.step_start(i)
                s.step_end(i, num_samples=32)
        elif new_api:  # the hooks the Lightning callback calls, in its order
            for i in range(offset, offset + n):
                s.step_start(i, phase="forward")
                s.phase_switch("forward", "backward")
                s.phase_switch("backward", "optimizer")
                s.step_end(i, num_samples=32)
        else:
            for i in range(offset, offset + n):
                s.step_start(i)
                s.phase_begin("forward")
                s.phase_end("forward")
                s.phase_begin("backward")
                s.phase_end("backward")
                s.phase_begin("optimizer")
                s.phase_end("optimizer")
                s.step_end(i, num_samples=32)

    def empty(n: int) -> None:
        for _ in range(n):
            pass

    collections = [0, 0, 0]
    gc_s = [0.0, 0.0]  # total, start of the collection under way
    timing = [False]

    def on_gc(phase: str, info: dict) -> None:  # the collections the timed loops pay for
        if not timing[0]:
            return
        if phase == "start":
            gc_s[1] = pc()
        else:
            collections[info["generation"]] += 1
            gc_s[0] += pc() - gc_s[1]

    gc.callbacks.append(on_gc)
    out = []
    step = 0
    for r in range(rounds):
        session.epoch_start(r)
        loop(200, step)  # warm-up
        step += 200
        t0 = pc()
        empty(steps)
        t_empty = pc() - t0
        timing[0] = True
        t0 = pc()
        loop(steps, step)
        t = pc() - t0
        timing[0] = False
        step += steps
        session.epoch_end(r)
        out.append(1e6 * (t - t_empty) / steps)
    gc.callbacks.remove(on_gc)
    session.train_end()
    return out, {"collections": collections, "gc_us_per_step": 1e6 * gc_s[0] / (steps * rounds)}


def _lightning_ms(steps: int, rounds: int, log_dir: str) -> dict[str, list[float]]:
    import logging
    import warnings

    import lightning.pytorch as L
    import torch

    from zeus_callbacks import ZeusCallback

    warnings.filterwarnings("ignore")
    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    torch.set_num_threads(1)

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(16, 16)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Clock(L.Callback):
        """Wall time from the end of the warm-up steps to the last step's end."""

        def __init__(self, warm: int) -> None:
            self.warm, self.t0, self.t1, self.n = warm, 0.0, 0.0, 0

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if batch_idx + 1 == self.warm:
                self.t0 = time.perf_counter()
            self.t1, self.n = time.perf_counter(), batch_idx + 1 - self.warm

    data = torch.utils.data.TensorDataset(torch.randn(8 * (steps + 50), 16), torch.randn(8 * (steps + 50), 16))

    def fit(variant: str) -> float:
        callbacks: list = []
        if variant != "none":
            callbacks.append(ZeusCallback({"backend": "virtual", "windows": {"phases": variant == "phases"},
                                           "logging": {"log_dir": log_dir, "interval_steps": 50,
                                                       "progress_bar": False}}))  # fmt: skip
        clock = Clock(50)
        trainer = L.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False,
                            callbacks=[*callbacks, clock])  # fmt: skip
        trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=8))
        return 1e3 * (clock.t1 - clock.t0) / clock.n

    variants = ["none", "step", "phases"]
    out: dict[str, list[float]] = {v: [] for v in variants}
    fit("none")  # warm-up
    for _ in range(rounds):
        random.shuffle(variants)
        for v in variants:
            out[v].append(fit(v))
    return out


def worker(args: argparse.Namespace) -> None:
    pkg = str(Path(args.pkg[-1]).resolve())
    sys.path.insert(0, pkg)
    import zeus_callbacks

    if not zeus_callbacks.__file__.startswith(pkg):
        raise SystemExit(f"imported {zeus_callbacks.__file__}, not the package under {pkg}")
    log_dir = tempfile.mkdtemp(prefix="hook_cost_")
    res: dict = {"pkg": pkg, "module": zeus_callbacks.__file__, "session": {}, "gc": {}}
    for mode in ("step", "phases"):
        for timer in ("clock", "standin"):
            key = f"{mode}/{timer}"
            res["session"][key], res["gc"][key] = _session_us(mode, timer, args.steps, args.session_rounds, log_dir)
    if args.lightning_steps:
        res["lightning"] = _lightning_ms(args.lightning_steps, args.lightning_rounds, log_dir)
    print(json.dumps(res))


# ----------------------------------------------------------------------------- parent
def _summary(values: list[float]) -> dict:
    q = statistics.quantiles(values, n=4) if len(values) >= 2 else [values[0]] * 3
    return {"mean": statistics.fmean(values), "median": statistics.median(values), "q1": q[0], "q3": q[2],
            "min": min(values), "max": max(values), "n": len(values)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pkg", action="append", help="checkout whose zeus_callbacks to measure (repeat; default here)")
    ap.add_argument("--out", default="results")
    ap.add_argument("--rounds", type=int, default=3, help="processes per package, alternating")
    ap.add_argument("--steps", type=int, default=5000, help="steps per session round")
    ap.add_argument("--session-rounds", type=int, default=5)
    ap.add_argument("--lightning-steps", type=int, default=400, help="0: skip the Lightning Trainer")
    ap.add_argument("--lightning-rounds", type=int, default=5)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.smoke:
        args.rounds, args.steps, args.session_rounds, args.lightning_steps, args.lightning_rounds = 1, 300, 2, 60, 1
    if args.worker:
        worker(args)
        return
    pkgs = [str(Path(p).resolve()) for p in (args.pkg or [HERE.parents[1]])]
    runs: dict[str, list[dict]] = {p: [] for p in pkgs}
    for _ in range(args.rounds):
        order = list(pkgs)
        random.shuffle(order)
        for pkg in order:
            cmd = [sys.executable, str(HERE), "--worker", "--pkg", pkg, "--steps", str(args.steps),
                   "--session-rounds", str(args.session_rounds), "--lightning-steps", str(args.lightning_steps),
                   "--lightning-rounds", str(args.lightning_rounds)]  # fmt: skip
            done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=tempfile.gettempdir())
            if done.returncode != 0:
                raise SystemExit(f"worker for {pkg} failed:\n{done.stderr[-3000:]}")
            runs[pkg].append(json.loads(done.stdout.strip().splitlines()[-1]))
    result: dict = {"args": vars(args), "python": sys.version.split()[0], "packages": {}}
    for pkg, rs in runs.items():
        entry: dict = {"module": rs[0]["module"], "session_us_per_step": {}, "session_gc": {},
                       "lightning_ms_per_step": {}}  # fmt: skip
        for key in rs[0]["session"]:
            entry["session_us_per_step"][key] = _summary([v for r in rs for v in r["session"][key]])
            entry["session_gc"][key] = {  # summed over the processes
                "collections": [sum(r["gc"][key]["collections"][g] for r in rs) for g in range(3)],
                "gc_us_per_step": statistics.fmean(r["gc"][key]["gc_us_per_step"] for r in rs),
            }
        if "lightning" in rs[0]:
            for v in rs[0]["lightning"]:
                entry["lightning_ms_per_step"][v] = _summary([x for r in rs for x in r["lightning"][v]])
            # Ratio per round (each round fits every variant once, in a shuffled order).
            for v in ("step", "phases"):
                ratios = [a / b for r in rs for a, b in zip(r["lightning"][v], r["lightning"]["none"], strict=True)]
                entry["lightning_ms_per_step"][f"{v}_ratio"] = _summary(ratios)
        result["packages"][pkg] = entry
    _print(result)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "hook_cost.json").write_text(json.dumps(result, indent=1), encoding="utf-8")


def _print(result: dict) -> None:
    for pkg, e in result["packages"].items():
        print(f"{pkg} ({e['module']})")
        for key, s in e["session_us_per_step"].items():
            g = e["session_gc"][key]
            print(f"  session {key:16s} mean {s['mean']:8.2f} median {s['median']:8.2f} us/step  "
                  f"[IQR {s['q1']:.2f}-{s['q3']:.2f}, n={s['n']}]  gc {g['collections']} "
                  f"{g['gc_us_per_step']:.2f} us/step")  # fmt: skip
        for key, s in e["lightning_ms_per_step"].items():
            unit = "x" if key.endswith("ratio") else "ms/step"
            print(f"  lightning {key:14s} mean {s['mean']:8.4f} median {s['median']:8.4f} {unit}  "
                  f"[IQR {s['q1']:.4f}-{s['q3']:.4f}, min {s['min']:.4f}, max {s['max']:.4f}, n={s['n']}]")  # fmt: skip


if __name__ == "__main__":
    main()
