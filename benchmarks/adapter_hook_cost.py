"""Training-thread cost of the adapters' per-step hooks, this checkout beside another, in one process (CPU).

A real Lightning ``Trainer`` and a real HF ``Trainer`` (tiny model, virtual GPU) each run a few
batches so that the callbacks are set up as in training; then, from inside a batch, each
callback's per-step hook sequence is called in a tight loop, as the framework calls it:

* Lightning: ``on_train_batch_start``, ``on_before_backward``, ``on_after_backward``,
  ``on_before_optimizer_step``, ``on_train_batch_end`` (and ``state_key`` six times, as
  Lightning reads it for the profiler's action name at each hook call);
* HF: ``on_step_begin``, ``on_pre_optimizer_step``, ``on_optimizer_step``, ``on_step_end``.

No compute between the hooks, so the figure is the hooks alone (the session's step path, its
reports every ``logging.interval_steps`` amortised, the adapter's own work); not the step-time
overhead of a training run (``gpu_overhead.py``). Each configuration (``default``, every step
measured, every step with phases) runs for this checkout and for ``--baseline`` (imported as a
renamed copy, ``zeus_callbacks_base``: see ``gpu_overhead.load_baseline``), in
``--repeats`` rounds of ``--steps`` steps, in a fresh random order each round (a fixed order
showed ~1 µs of position bias); the figure is the fastest round (µs per step): on a
loaded host the slower rounds are the ones other processes interrupted. With ``--clock cpu`` the
rounds are timed on the thread's CPU clock instead.

    PYTHONPATH=. python benchmarks/adapter_hook_cost.py --baseline /path/to/main
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

os.environ["ZEUS_CALLBACKS_READ_ONLY"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from gpu_overhead import load_baseline  # noqa: E402

CONFIGS: dict[str, dict[str, Any]] = {
    "default": {},
    "every_step": {"windows": {"sample_fraction": 1}},
    "every_step_phases": {"windows": {"sample_fraction": 1, "phases": True}},
}


_RNG = random.Random(0)


def shuffled(callbacks: dict[str, Any]) -> list[tuple[str, Any]]:
    """The callbacks in a fresh random order: no configuration or package always runs in the same slot."""
    items = list(callbacks.items())
    _RNG.shuffle(items)
    return items


def _cfg(name: str, log_dir: str, tag: str) -> dict[str, Any]:
    cfg = json.loads(json.dumps(CONFIGS[name]))
    cfg.update(backend="virtual", job_id=f"hooks_{name}_{tag}")
    cfg["logging"] = {"log_dir": log_dir, "run_name": f"{name}-{tag}", "progress_bar": False}
    return cfg


def lightning_costs(pkgs: dict[str, Any], args: argparse.Namespace, log_dir: str) -> dict[str, list[float]]:
    """µs per step of the Lightning hook sequence, per ``<config>@<package>``, one figure per round."""
    import lightning.pytorch as pl

    callbacks = {f"{c}@{tag}": pkg.ZeusCallback(_cfg(c, log_dir, tag)) for tag, pkg in pkgs.items() for c in CONFIGS}
    out: dict[str, list[float]] = {key: [] for key in callbacks}
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(16, 16)

        def training_step(self, batch: Any, i: int) -> torch.Tensor:
            return torch.nn.functional.mse_loss(self.layer(batch["x"]), batch["y"])

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Probe(pl.Callback):
        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, i: int) -> None:
            if i != 5:
                return
            loss = outputs["loss"] if isinstance(outputs, dict) else outputs
            optimizer = trainer.optimizers[0]
            for _ in range(args.repeats):
                for key, cb in shuffled(callbacks):
                    start, before_bw, after_bw, before_opt, end = (
                        cb.on_train_batch_start, cb.on_before_backward, cb.on_after_backward,
                        cb.on_before_optimizer_step, cb.on_train_batch_end,
                    )  # fmt: skip
                    t0 = clock()
                    for k in range(args.steps):
                        _ = cb.state_key
                        start(trainer, module, batch, k)
                        _ = cb.state_key
                        before_bw(trainer, module, loss)
                        _ = cb.state_key
                        after_bw(trainer, module)
                        _ = cb.state_key
                        before_opt(trainer, module, optimizer)
                        _ = cb.state_key
                        end(trainer, module, outputs, batch, k)
                        _ = cb.state_key
                    out[key].append((clock() - t0) / args.steps * 1e6)

    data = [{"x": torch.randn(8, 16), "y": torch.randn(8, 16)} for _ in range(8)]
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_epochs=1, limit_train_batches=8, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[*callbacks.values(), Probe()],
    )  # fmt: skip
    trainer.fit(Module(), torch.utils.data.DataLoader(data, batch_size=None))
    return out


def hf_costs(pkgs: dict[str, Any], args: argparse.Namespace, log_dir: str) -> dict[str, list[float]]:
    """µs per step of the HF hook sequence, per ``<config>@<package>``, one figure per round."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    callbacks = {
        f"{c}@{tag}": pkg.ZeusTrainerCallback(_cfg(c, log_dir, tag)) for tag, pkg in pkgs.items() for c in CONFIGS
    }
    out: dict[str, list[float]] = {key: [] for key in callbacks}
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(16, 16)

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": torch.nn.functional.mse_loss(self.layer(x), labels)}

    class Probe(TrainerCallback):
        def on_step_end(self, targs: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step != 5:
                return
            for _ in range(args.repeats):
                for key, cb in shuffled(callbacks):
                    begin, pre_opt, opt, end = (
                        cb.on_step_begin,
                        cb.on_pre_optimizer_step,
                        cb.on_optimizer_step,
                        cb.on_step_end,
                    )
                    t0 = clock()
                    for _k in range(args.steps):
                        begin(targs, state, control, **kw)
                        pre_opt(targs, state, control, **kw)
                        opt(targs, state, control, **kw)
                        end(targs, state, control, **kw)
                    out[key].append((clock() - t0) / args.steps * 1e6)

    data = [{"x": torch.randn(16), "labels": torch.randn(16)} for _ in range(64)]
    targs = TrainingArguments(
        output_dir=log_dir, per_device_train_batch_size=8, max_steps=8, save_strategy="no", report_to="none",
        disable_tqdm=True, use_cpu=True, logging_steps=1000,
    )  # fmt: skip
    trainer = Trainer(model=Model(), args=targs, train_dataset=data)
    for cb in callbacks.values():
        cb.attach(trainer)
    trainer.add_callback(Probe())
    trainer.train()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", required=True, help="the other checkout (its zeus_callbacks)")
    ap.add_argument("--steps", type=int, default=2000, help="steps a round")
    ap.add_argument("--repeats", type=int, default=7, help="rounds per configuration and package")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    ap.add_argument("--frameworks", default="lightning,hf")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    torch.set_num_threads(1)
    import zeus_callbacks

    pkgs = {"new": zeus_callbacks, "base": load_baseline(args.baseline, tempfile.mkdtemp(prefix="hooks_base_"))}
    results: dict[str, Any] = {
        "clock": args.clock,
        "steps": args.steps,
        "repeats": args.repeats,
        "module": zeus_callbacks.__file__,
    }
    with tempfile.TemporaryDirectory() as log_dir:
        for fw in args.frameworks.split(","):
            costs = (lightning_costs if fw == "lightning" else hf_costs)(pkgs, args, log_dir)
            results[fw] = costs
            print(f"{fw}: µs per step of the hooks, fastest of {args.repeats} rounds of {args.steps} steps (median)")
            for c in CONFIGS:
                new, base = costs[f"{c}@new"], costs[f"{c}@base"]
                print(f"  {c:18s} base {min(base):7.2f} ({statistics.median(base):7.2f})   "
                      f"this {min(new):7.2f} ({statistics.median(new):7.2f})")  # fmt: skip
    print(json.dumps(results))


if __name__ == "__main__":
    main()
