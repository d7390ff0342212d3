"""Do the step windows close to the epoch, and what does a measured step cost? (issue 16, item 4)

A real Lightning ``Trainer`` and a real Hugging Face ``Trainer`` train a small MLP whose batches
come from a DataLoader whose collate function spends a set share of the iteration preparing the
batch (``--shares``, default 40 % and 5 %). Every step is measured (``windows.sample_fraction: 1``).
For each trainer and share the JSON printed (and written to ``--out``) holds:

- ``closure``: (Σ over ``steps`` records of ``energy_J_mean × steps`` + Σ ``warmup`` energy) ÷ Σ epoch
  energy, from the run's own JSONL log: what a user gets multiplying ``energy/step_J`` by steps;
- ``marks_per_measured_step``: window marks (CUDA event records on a GPU, clock reads otherwise)
  the session took per measured step, counted through a wrapper around the run's timer;
- ``hook_us_per_step``: time inside the session's ``step_start`` + ``step_end`` per step (µs,
  perf_counter around each call; the wrapper's own ~0.2 µs included);
- ``mark_us``: one mark of the run's timer, timed alone over 2,000 marks (µs).

Run it on this checkout and on an older one (``PYTHONPATH=<checkout>``) for before/after: the
script uses only what both have. ``backend: auto``: the NVIDIA GPU when there is one (then
``ZEUS_CALLBACKS_READ_ONLY=1`` is required and the power limit is read before and after; nothing
is set), the virtual GPU on a machine without one.

    ZEUS_CALLBACKS_READ_ONLY=1 PYTHONPATH=. python benchmarks/step_closure.py --out docs/results/step_closure_h200.json
    PYTHONPATH=. python benchmarks/step_closure.py --steps 40          # CPU + virtual GPU

(``PYTHONPATH=.``: the checkout you are in, not whichever one is installed; the JSON names it.)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from zeus_callbacks.reporting import read_jsonl

WIDTH = 512


class Mlp(nn.Module):
    """``reps`` passes through one square layer: a step of adjustable length."""

    def __init__(self, reps: int) -> None:
        super().__init__()
        self.layer = nn.Linear(WIDTH, WIDTH)
        self.reps = reps

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        for _ in range(self.reps):
            x = torch.tanh(self.layer(x))
        loss = nn.functional.mse_loss(x, labels if labels is not None else torch.zeros_like(x))
        return {"loss": loss}


class Rows(Dataset):
    def __init__(self, n: int) -> None:
        self.x = torch.randn(n, WIDTH, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.x[i]


class SlowCollate:
    """Stack the rows, then spend ``prep_s`` more on the CPU (busy, like decoding or augmenting)."""

    def __init__(self, prep_s: float, as_dict: bool) -> None:
        self.prep_s = prep_s
        self.as_dict = as_dict

    def __call__(self, rows: list[torch.Tensor]) -> Any:
        x = torch.stack(rows)
        until = time.perf_counter() + self.prep_s
        while time.perf_counter() < until:
            pass
        y = torch.zeros_like(x)
        return {"x": x, "labels": y} if self.as_dict else (x, y)


def calibrate_reps(device: str, batch: int, target_ms: float) -> tuple[int, float]:
    """Layer passes whose training step (forward, backward, SGD) takes about ``target_ms``; and its ms."""
    model = Mlp(1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(batch, WIDTH, device=device)

    def step_ms(reps: int) -> float:
        model.reps = reps
        for _ in range(3):
            opt.zero_grad()
            model(x, x)["loss"].backward()
            opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(10):
            opt.zero_grad()
            model(x, x)["loss"].backward()
            opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) / 10 * 1e3

    one = step_ms(1)
    reps = max(1, round(target_ms / one))
    return reps, step_ms(reps)


class CountingTimer:
    """The run's boundary timer, counting its marks (every other attribute is the timer's own)."""

    def __init__(self, timer: Any) -> None:
        self._timer = timer
        self.marks = 0
        inner = timer.mark

        def mark() -> Any:
            self.marks += 1
            return inner()

        self.mark = mark

    def __getattr__(self, name: str) -> Any:
        return getattr(self._timer, name)


def instrument(callback: Any) -> dict[str, Any]:
    """Count the marks of the callback's session and time its step calls (each run's session, as made)."""
    from zeus_callbacks.session._run import make_timer

    probe: dict[str, Any] = {"timer": None, "hook_s": 0.0, "steps": 0}
    clock = time.perf_counter

    def counted_timer(backend: Any) -> Any:
        probe["timer"] = CountingTimer(make_timer(backend))
        return probe["timer"]

    def wrap(session: Any) -> Any:
        session.timer_factory = counted_timer  # the session's seam for its boundary timer
        start, end = session.step_start, session.step_end

        def step_start(step: int, **kw: Any) -> None:
            t0 = clock()
            start(step, **kw)
            probe["hook_s"] += clock() - t0

        def step_end(step: int, **kw: Any) -> Any:
            t0 = clock()
            out = end(step, **kw)
            probe["hook_s"] += clock() - t0
            probe["steps"] += 1
            return out

        session.step_start, session.step_end = step_start, step_end  # instance attributes shadow the methods
        return session

    new_session = callback._new_session  # the adapters make a fresh session for each run
    callback._new_session = lambda **kw: wrap(new_session(**kw))
    wrap(callback.session)
    return probe


def mark_us(timer: Any) -> float:
    """One mark of ``timer``, timed alone (µs)."""
    inner = timer._timer if isinstance(timer, CountingTimer) else timer
    n = 2000
    t0 = time.perf_counter()
    for _ in range(n):
        inner.mark()
    elapsed = time.perf_counter() - t0
    inner.read(wait=True)
    return elapsed / n * 1e6


def closure(records: list[dict[str, Any]]) -> dict[str, Any]:
    steps = [r for r in records if r["event"] == "steps"]
    estimated_J = sum(r["energy_J_mean"] * r["steps"] for r in steps if r["energy_J_mean"] is not None)
    warmup_J = sum(r["energy_J"] or 0.0 for r in records if r["event"] == "warmup")
    epoch_J = sum(r["energy_J"] for r in records if r["event"] == "epoch")
    step_time_s = sum(r["time_s_mean"] * r["count"] for r in steps if r["time_s_mean"] is not None)
    return {
        "closure": (estimated_J + warmup_J) / epoch_J if epoch_J else None,
        "step_energy_J": estimated_J + warmup_J,
        "warmup_energy_J": warmup_J,
        "epoch_energy_J": epoch_J,
        "epoch_time_s": sum(r["time_s"] for r in records if r["event"] == "epoch"),
        "measured_step_time_s": step_time_s,
        "steps": sum(r["steps"] + r.get("warmup_steps", 0) for r in steps),
        "measured": sum(r["count"] for r in steps) + sum(len(r["steps"]) for r in records if r["event"] == "warmup"),
    }


def config(log_dir: str, name: str) -> dict[str, Any]:
    return {
        "backend": "auto",
        "windows": {"sample_fraction": 1.0},
        "logging": {"log_dir": log_dir, "run_name": name, "interval_steps": 10},
    }


def run_lightning(device: str, reps: int, prep_s: float, steps: int, batch: int, log_dir: str) -> dict[str, Any]:
    import lightning.pytorch as L

    from zeus_callbacks import ZeusCallback

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = Mlp(reps)

        def training_step(self, b: Any, i: int) -> torch.Tensor:
            return self.net(*b)["loss"]

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    name = f"lightning-{prep_s:.6f}"
    callback = ZeusCallback(config(log_dir, name))
    probe = instrument(callback)
    loader = DataLoader(Rows(steps * batch), batch_size=batch, collate_fn=SlowCollate(prep_s, as_dict=False),
                        pin_memory=device == "cuda")  # fmt: skip
    trainer = L.Trainer(
        accelerator="gpu" if device == "cuda" else "cpu", devices=1, max_epochs=1, callbacks=[callback],
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(Module(), loader)
    return {**closure(read_jsonl(Path(log_dir) / f"{name}.jsonl")), **cost(probe)}


def run_hf(device: str, reps: int, prep_s: float, steps: int, batch: int, log_dir: str) -> dict[str, Any]:
    from transformers import Trainer, TrainingArguments

    from zeus_callbacks import ZeusTrainerCallback

    name = f"hf-{prep_s:.6f}"
    callback = ZeusTrainerCallback(config(log_dir, name))
    probe = instrument(callback)
    args = TrainingArguments(
        output_dir=str(Path(log_dir) / "hf-out"), num_train_epochs=1, per_device_train_batch_size=batch,
        logging_steps=10, report_to=[], save_strategy="no", disable_tqdm=True, use_cpu=device != "cuda",
        dataloader_pin_memory=device == "cuda", learning_rate=1e-3,
    )  # fmt: skip
    trainer = Trainer(model=Mlp(reps), args=args, train_dataset=Rows(steps * batch),
                      data_collator=SlowCollate(prep_s, as_dict=True), callbacks=[callback])  # fmt: skip
    trainer.train()
    return {**closure(read_jsonl(Path(log_dir) / f"{name}.jsonl")), **cost(probe)}


def cost(probe: dict[str, Any]) -> dict[str, Any]:
    timer = probe["timer"]
    steps = max(1, probe["steps"])
    return {
        "marks_per_measured_step": timer.marks / steps if timer is not None else None,
        "hook_us_per_step": probe["hook_s"] / steps * 1e6,
        "mark_us": mark_us(timer) if timer is not None else None,
        "timer": type(timer._timer).__name__ if timer is not None else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="steps of the one epoch")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--step-ms", type=float, default=5.0, help="target compute time of a step (ms)")
    parser.add_argument("--shares", type=float, nargs="+", default=[0.4, 0.05],
                        help="share of the iteration spent preparing the batch")  # fmt: skip
    parser.add_argument("--trainers", nargs="+", default=["lightning", "hf"], choices=["lightning", "hf"])
    parser.add_argument("--out", type=Path, default=None)
    a = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning").setLevel(logging.ERROR)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    limit_before = limit_after = None
    if device == "cuda":
        if os.environ.get("ZEUS_CALLBACKS_READ_ONLY", "") in ("", "0"):
            raise SystemExit("set ZEUS_CALLBACKS_READ_ONLY=1: this benchmark runs on shared GPUs")
        limit_before = read_limit_W()
    reps, compute_ms = calibrate_reps(device, a.batch, a.step_ms)
    import zeus_callbacks

    results: dict[str, Any] = {
        "zeus_callbacks": str(Path(zeus_callbacks.__file__).parent),  # which checkout ran (PYTHONPATH)
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu (virtual GPU)",
        "compute_ms": compute_ms, "layer_passes": reps, "steps": a.steps, "batch": a.batch, "runs": [],
    }  # fmt: skip
    runners = {"lightning": run_lightning, "hf": run_hf}
    with tempfile.TemporaryDirectory() as log_dir:
        for share in a.shares:
            prep_s = compute_ms / 1e3 * share / (1 - share)
            for trainer in a.trainers:
                row = runners[trainer](device, reps, prep_s, a.steps, a.batch, log_dir)
                row.update(trainer=trainer, prep_share=share, prep_ms=prep_s * 1e3)
                results["runs"].append(row)
                print(json.dumps(row), flush=True)
    if device == "cuda":
        limit_after = read_limit_W()
        results["power_limit_W"] = {"before": limit_before, "after": limit_after}
        if limit_before != limit_after:
            raise SystemExit(f"the power limit changed: {limit_before} -> {limit_after}")
    text = json.dumps(results, indent=2)
    print(text)
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n")


def read_limit_W() -> float | None:
    from zeus_callbacks.backends import get_backend

    backend = get_backend("auto", read_only=True)
    try:
        return backend.power_limit_W(0)
    finally:
        backend.close()


if __name__ == "__main__":
    main()
