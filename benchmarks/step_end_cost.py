"""Training-thread cost of ``EnergySession.step_end`` on a real GPU: median and mean per step.

The median is the hook alone; the mean also carries the periodic report (every
``logging.interval_steps`` steps), amortised. A loop of small GEMMs (~80 us of GPU work a
step on an H200) with the session off, with step windows, and with step + phase windows,
three rounds each, interleaved. Quoted in docs/results/finegrain.md
(docs/results/step_end_cost_h200.txt is its output).

    ZEUS_CALLBACKS_READ_ONLY=1 python benchmarks/step_end_cost.py
"""

from __future__ import annotations

import time

import torch

from zeus_callbacks.session import EnergySession


def run(cfg: dict | None, x: torch.Tensor, w: torch.Tensor, steps: int = 3000) -> tuple[float, float, float, float]:
    """(us per step, step_end median us, step_end mean us, step_end max us) of one round."""
    session = EnergySession(cfg) if cfg is not None else None
    if session is not None:
        session.train_start()
        session.epoch_start(0)
    costs: list[float] = []
    torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(steps):
        if session is not None:
            session.step_start(i)
        for _ in range(4):
            torch.mm(x, w)
        if session is not None:
            t0 = time.perf_counter()
            session.step_end(i, num_samples=x.shape[0])
            costs.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    per_step_us = (time.perf_counter() - start) / steps * 1e6
    if session is not None:
        session.epoch_end(0)
        session.train_end()
    if not costs:
        return per_step_us, 0.0, 0.0, 0.0
    costs.sort()
    return per_step_us, costs[len(costs) // 2] * 1e6, sum(costs) / len(costs) * 1e6, costs[-1] * 1e6


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("step_end_cost.py needs a CUDA GPU (the session's CUDA-event timer is what it measures)")
    x = torch.randn(256, 1024, device="cuda")
    w = torch.randn(1024, 1024, device="cuda")
    base = {"backend": "auto", "logging": {"jsonl": False}}
    modes = [("off", None), ("step", base), ("phases", {**base, "windows": {"phases": True}})]
    for r in range(3):
        for name, cfg in modes:
            us, median, mean, most = run(cfg, x, w)
            print(
                f"round {r} {name:7s} {us:8.1f} us/step  step_end median {median:6.1f} us "
                f"mean {mean:6.1f} max {most:8.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
