"""Train a small CNN on scikit-learn's handwritten digits with Lightning Fabric, with GPU energy measured.

``@meter`` (``zeus_callbacks.measure``) makes each call of the training function one measured
run; the loop marks epochs and steps with ``epoch_start``/``epoch_end`` and
``step_start``/``step_end``, evaluates each epoch inside the run (``meter.evaluation()``), and
hands the energy metrics to Fabric's TensorBoard logger.
Real data (the digits that ship with scikit-learn); the model and data are ``raw_loop.py``'s.
Runs on the GPU when there is one, else on the CPU with the virtual GPU reporting power.

    python examples/fabric_loop.py [--epochs 3] [--config examples/zeus.yaml] [--log-dir runs]

Then: ``tensorboard --logdir runs`` (scalars under energy/, power/, time/).
With the batch-size optimiser on (``batch_size.enabled: true`` in the config) the loaders are built at
the size ``suggest_batch_size`` returns, handed to ``measure(batch_size=...)`` so that the run is recorded
at it, and the loop stops when the optimiser asks (``meter.should_stop``). Each epoch's validation accuracy
goes to ``meter.evaluation()``, so that a run reaching ``batch_size.target`` is recorded as converged.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from lightning.fabric import Fabric
from lightning.fabric.loggers import TensorBoardLogger
from raw_loop import accuracy, digits_cnn, digits_loaders
from torch import nn

import zeus_callbacks
from zeus_callbacks import ConfigError, ZeusCallbacksError

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument(
        "--batch-size", type=int, default=32, help="training batch size when the config's batch-size optimiser is off"
    )
    parser.add_argument("--config", default=str(HERE / "zeus.yaml"))
    parser.add_argument("--log-dir", default="runs")
    parser.add_argument("--summary-json", help="also write the run summary to this JSON file")
    args = parser.parse_args(argv)

    fabric = Fabric(accelerator="auto", devices=1, loggers=TensorBoardLogger(args.log_dir, name="fabric_loop"))
    fabric.seed_everything(0)
    try:
        config = zeus_callbacks.load_config(args.config)
    except ConfigError as exc:  # a bad or missing --config: one clear line, not a traceback
        parser.error(f"--config: {exc}")
    try:
        # The batch-size optimiser's choice, drawn before the loaders are built (on every process).
        batch_size = zeus_callbacks.suggest_batch_size(config) if config.batch_size.enabled else args.batch_size
    except ZeusCallbacksError as exc:  # e.g. a store that cannot be opened: its one-line message
        raise SystemExit(f"zeus-callbacks: {exc}") from None
    meter = zeus_callbacks.measure(
        config,
        is_main_process=fabric.is_global_zero,  # only the main process writes the log
        device_index=fabric.local_rank if fabric.world_size > 1 else None,
        batch_size=batch_size,  # the size trained: the run claims the suggestion's trial and is recorded at it
    )
    train_loader, val_loader = fabric.setup_dataloaders(*digits_loaders(batch_size))
    model = digits_cnn()
    model, optimizer = fabric.setup(model, torch.optim.Adam(model.parameters(), lr=2e-3))

    @meter  # each call is one run: train_start on entry, train_end (or exception) on exit
    def fit(model: nn.Module, optimizer: torch.optim.Optimizer) -> float:
        step, val_acc = 0, float("nan")
        for _ in range(args.epochs):
            meter.epoch_start()
            for x, y in train_loader:
                meter.step_start()
                loss = nn.functional.cross_entropy(model(x), y)
                optimizer.zero_grad()
                fabric.backward(loss)
                optimizer.step()
                meter.step_end(num_samples=len(x))
                fabric.log_dict(meter.pop_metrics(), step=step)  # step reports, every interval_steps
                step += 1
                if meter.should_stop:  # the batch-size optimiser stopped this run early (its cost is too high)
                    break
            # Inside the run: the target is checked here. Every process runs it (each on its shard of the data).
            with meter.evaluation(every_rank=True) as results:
                val_acc = accuracy(model, val_loader, fabric.device)
                results["val/acc"] = val_acc  # reaching batch_size.target sets meter.should_stop
            meter.epoch_end()
            fabric.log_dict(meter.pop_metrics(), step=step)  # the epoch's energy and its evaluation's
            if meter.should_stop:
                break
        return val_acc

    try:
        val_acc = fit(model, optimizer)
    except ZeusCallbacksError as exc:  # e.g. a store that cannot be opened: its one-line message
        raise SystemExit(f"zeus-callbacks: {exc}") from None
    summary = meter.summary
    assert summary is not None  # the decorated call ended the run
    fabric.logger.finalize("success")
    result = {
        "example": "fabric_loop",
        "epochs": summary.epochs,
        "batch_size": int(batch_size),
        "should_stop": meter.should_stop,
        "val_acc": val_acc,
        "summary": summary.as_dict(),
    }
    if fabric.is_global_zero:
        print(summary, flush=True)
        stopped = " (stopped by the batch-size optimiser)" if meter.should_stop else ""
        print(f"fabric_loop: {summary.epochs} epochs, {summary.steps} steps at batch size {batch_size}, "
              f"val/acc {val_acc:.3f}{stopped}")  # fmt: skip
        if args.summary_json:
            Path(args.summary_json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
