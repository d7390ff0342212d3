"""What reading the node's CPU and DRAM energy adds to the training thread's step (issue 29), CPU only.

Three configurations of one ``EnergySession`` on the virtual GPU (real clock, every step measured, a report
every ``--interval`` steps), in one process, their blocks alternating in a shuffled order round after round:

* ``off``: ``node.rapl`` and ``node.virtual_cpu`` off (no CPU/DRAM reader);
* ``rapl``: ``node.rapl`` on a powercap tree written to a temporary folder (two sockets, a package and a DRAM
  zone each, the files a kernel exposes): the reader opens and parses the real sysfs-shaped files at the run's
  start and end, each epoch's and each step report's boundary;
* ``virtual_cpu``: ``node.virtual_cpu`` (the process's CPU time × a power per core).

Each block runs ``--steps`` bare ``step_start`` + ``step_end`` calls (no model: the hooks are all there is) and
is timed on the training thread's CPU clock (``time.thread_time``), which a loaded machine's other processes do
not inflate. Per round, the ratio of each configuration's µs per step to ``off``'s in the same round; the
summary gives the median ratio with a 95 % bootstrap interval, and the median µs per step.

    python benchmarks/node_overhead.py --rounds 30 --out docs/results
    python benchmarks/node_overhead.py --smoke

The last line of stdout is JSON: ``{"rapl": [ratio, lo, hi], "virtual_cpu": [...], "us_per_step": {...}}``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from zeus_callbacks.backends.virtual import VirtualGPUBackend
from zeus_callbacks.session import EnergySession

RANGE_UJ = 262_143_328_850  # a real package's max_energy_range_uj
CONFIGS = ("off", "rapl", "virtual_cpu")


def powercap_tree(root: Path) -> Path:
    """Write two sockets' package and DRAM zones, shaped as /sys/class/powercap, under ``root``."""
    for socket in range(2):
        for name, label in ((f"intel-rapl:{socket}", f"package-{socket}"), (f"intel-rapl:{socket}:0", "dram")):
            zone = root / name
            zone.mkdir(parents=True)
            (zone / "name").write_text(f"{label}\n")
            (zone / "max_energy_range_uj").write_text(f"{RANGE_UJ}\n")
            (zone / "energy_uj").write_text(f"{1_000_000 * (socket + 1)}\n")
    return root


def node_section(config: str, root: Path) -> dict[str, Any]:
    if config == "rapl":
        return {"rapl": True, "powercap_root": str(root)}
    if config == "virtual_cpu":
        return {"virtual_cpu": True, "powercap_root": str(root / "absent")}
    return {}


def block_us_per_step(config: str, root: Path, log_dir: Path, steps: int, interval: int) -> float:
    """One session of ``steps`` bare steps under ``config``: the training thread's CPU µs per step."""
    backend = VirtualGPUBackend(read_only=True, seed=0)
    session = EnergySession(
        {
            "logging": {"log_dir": str(log_dir), "run_name": config, "interval_steps": interval, "jsonl": True},
            "windows": {"sample_fraction": 1.0},
            "node": node_section(config, root),
        },
        backend=backend,
    )
    session.train_start()
    session.epoch_start(0)
    began = time.thread_time()
    for step in range(steps):
        session.step_start(step)
        session.step_end(step, num_samples=8)
        if step % interval == interval - 1:
            session.pop_metrics()
    spent_s = time.thread_time() - began
    session.epoch_end(0)
    session.train_end()
    backend.close()
    return 1e6 * spent_s / steps


def bootstrap_median(values: list[float], seed: int = 0, draws: int = 4000) -> tuple[float, float, float]:
    """The median of ``values`` and a 95 % percentile-bootstrap interval of it."""
    data = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    medians = np.median(rng.choice(data, size=(draws, len(data)), replace=True), axis=1)
    return float(np.median(data)), float(np.quantile(medians, 0.025)), float(np.quantile(medians, 0.975))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--steps", type=int, default=2000, help="steps per block")
    ap.add_argument("--interval", type=int, default=50, help="logging.interval_steps: a node reading per report")
    ap.add_argument("--out", type=Path, default=None, help="folder for node_overhead.json")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes")
    a = ap.parse_args()
    if a.smoke:
        a.rounds, a.steps = 3, 200
    rng = random.Random(0)
    per_step: dict[str, list[float]] = {c: [] for c in CONFIGS}
    with tempfile.TemporaryDirectory() as tmp:
        root = powercap_tree(Path(tmp) / "powercap")
        for config in CONFIGS:  # a warm-up block each: imports, first allocations
            block_us_per_step(config, root, Path(tmp) / "warm", min(a.steps, 200), a.interval)
        for r in range(a.rounds):
            order = list(CONFIGS)
            rng.shuffle(order)
            for config in order:
                per_step[config].append(block_us_per_step(config, root, Path(tmp) / f"r{r}", a.steps, a.interval))
    ratios = {c: [x / o for x, o in zip(per_step[c], per_step["off"], strict=True)] for c in CONFIGS if c != "off"}
    result: dict[str, Any] = {c: list(bootstrap_median(v)) for c, v in ratios.items()}
    result["us_per_step"] = {c: statistics.median(v) for c, v in per_step.items()}
    result["rounds"], result["steps"], result["interval_steps"] = a.rounds, a.steps, a.interval
    print(f"node_overhead: {a.rounds} rounds of {a.steps} steps, a report every {a.interval} steps (thread CPU time)")
    print(f"{'config':<12} {'us/step (median)':>17} {'ratio to off [95 % CI]':>32}")
    for c in CONFIGS:
        ci = "" if c == "off" else "{:.4f} [{:.4f}, {:.4f}]".format(*result[c])
        print(f"{c:<12} {result['us_per_step'][c]:>17.2f} {ci:>32}")
    if a.out is not None:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "node_overhead.json").write_text(json.dumps(result | {"raw_us_per_step": per_step}, indent=2))
    print(json.dumps({k: result[k] for k in ("rapl", "virtual_cpu", "us_per_step")}))


if __name__ == "__main__":
    main()
