"""Train a small CNN on scikit-learn's handwritten digits with GPU energy logged.

Real data (1,797 8×8 images that ship with scikit-learn), a real Lightning Trainer,
TensorBoard logging, and the ZeusCallback configured from ``examples/zeus.yaml``.
Runs on the GPU when there is one (NVIDIA/AMD backend), else on the CPU with the
virtual GPU reporting power.

    python examples/lightning_digits.py [--epochs 10] [--config examples/zeus.yaml] [--log-dir DIR] [--no-callback]
    python examples/lightning_digits.py --devices 2      # DDP: one process per GPU (gloo on the CPU)

Then: ``tensorboard --logdir runs`` (scalars under energy/, power/, time/). The JSONL energy log
goes to the config's ``logging.log_dir`` (``zeus_logs/``); ``--log-dir DIR`` puts both logs in DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import lightning.pytorch as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from zeus_callbacks import ConfigError, ZeusCallback, ZeusCallbacksError, load_config

HERE = Path(__file__).resolve().parent


class DigitsCNN(L.LightningModule):
    def __init__(self, lr: float = 2e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(64 * 4 * 4, 128),
            nn.ReLU(),
            nn.Linear(128, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        # sync_dist: under DDP each process validates its share of the data; the figures are the mean over them.
        self.log("val/loss", nn.functional.cross_entropy(logits, y), sync_dist=True)
        self.log("val/acc", (logits.argmax(-1) == y).float().mean(), prog_bar=True, sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


class StepClock(L.Callback):
    """Median time between consecutive training steps (within an epoch), for overhead checks."""

    def __init__(self) -> None:
        self.gaps_s: list[float] = []
        self._last: float | None = None

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._last = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = time.perf_counter()
        if self._last is not None:
            self.gaps_s.append(now - self._last)
        self._last = now

    @property
    def median_step_s(self) -> float:
        return statistics.median(self.gaps_s) if self.gaps_s else float("nan")


class DigitsData(L.LightningDataModule):
    def __init__(self, batch_size: int = 32) -> None:
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage: str | None = None) -> None:
        digits = load_digits()
        x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
        y = torch.tensor(digits.target, dtype=torch.long)
        generator = torch.Generator().manual_seed(0)
        order = torch.randperm(len(x), generator=generator)
        split = int(0.8 * len(x))
        self.train_set = TensorDataset(x[order[:split]], y[order[:split]])
        self.val_set = TensorDataset(x[order[split:]], y[order[split:]])

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=256)


def _positive_int(text: str) -> int:
    """An argparse type: an integer ≥ 1 (0 trains nothing; Lightning reads -1 as 'no limit')."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def exit_skipping_gloo_teardown() -> None:
    """End a process of a data-parallel run on the CPU (gloo) once everything is written.

    There a gloo thread sometimes aborts the process during the interpreter's teardown
    ("terminate called without an active exception"), and the launcher then reports the
    finished run as failed; os._exit skips that teardown. Otherwise (one process, or NCCL
    on GPUs) this returns and Python exits as usual.
    """
    if not (torch.distributed.is_initialized() and torch.distributed.get_backend() == "gloo"):
        return
    torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=_positive_int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--devices", type=int, default=1, help="GPUs (or CPU processes); more than 1 runs DDP")
    parser.add_argument("--config", default=str(HERE / "zeus.yaml"))
    parser.add_argument(
        "--log-dir",
        help="one folder for the run's logs: TensorBoard's (DIR/lightning_digits/) and the JSONL energy log, "
        "in place of --config's logging.log_dir (what defaults to that folder, such as the store, follows it); "
        "default: TensorBoard in runs/, the energy log where --config says",
    )
    parser.add_argument("--no-callback", action="store_true", help="train without zeus-callbacks (baseline)")
    parser.add_argument("--summary-json", help="also write the run summary to this JSON file")
    args = parser.parse_args()

    L.seed_everything(0, workers=True)
    try:
        config = None if args.no_callback else load_config(args.config)
    except ConfigError as exc:  # a bad or missing --config: one clear line, not a traceback
        parser.error(f"--config: {exc}")
    if config is not None and args.log_dir is not None:
        config.logging.log_dir = Path(args.log_dir)  # one folder for the run: the energy log beside TensorBoard's
    zeus = None if config is None else ZeusCallback(config)
    step_clock = StepClock()
    trainer = L.Trainer(
        max_epochs=args.epochs,
        accelerator="auto",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        callbacks=[step_clock] + ([zeus] if zeus else []),
        logger=TensorBoardLogger(args.log_dir or "runs", name="lightning_digits"),
        log_every_n_steps=10,
        enable_model_summary=False,
    )
    model = DigitsCNN()
    start = time.perf_counter()
    try:
        trainer.fit(model, datamodule=DigitsData(args.batch_size))
    except ZeusCallbacksError as exc:  # e.g. a store that cannot be opened: its one-line message
        raise SystemExit(f"zeus-callbacks: {exc}") from None
    wall_s = time.perf_counter() - start
    if not trainer.is_global_zero:
        return  # under DDP the main process reports for all
    val_acc = float(trainer.callback_metrics.get("val/acc", float("nan")))
    steps = trainer.global_step
    epochs = trainer.current_epoch  # epochs really trained: stop_at_target may end the run before args.epochs
    print(
        f"\nlightning_digits: {epochs} epochs, {steps} steps, val/acc {val_acc:.3f}, "
        f"{wall_s:.1f} s wall, median step {1e3 * step_clock.median_step_s:.2f} ms"
    )
    result = {
        "example": "lightning_digits",
        "epochs": epochs,
        "steps": steps,
        "val_acc": val_acc,
        "wall_s": wall_s,
        "median_step_s": step_clock.median_step_s,
        "world_size": trainer.world_size,
    }
    if zeus is not None and zeus.summary is not None:  # None when no training step ran (e.g. --epochs 0)
        result["summary"] = zeus.summary.as_dict()  # the callback printed it already
    if args.summary_json:
        Path(args.summary_json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
    exit_skipping_gloo_teardown()
