"""Train a small CNN on scikit-learn's handwritten digits in a plain PyTorch loop, with GPU energy measured.

No framework: ``zeus_callbacks.measure`` wraps the loop, and the loop marks its epochs, steps
and evaluations. Real data (1,797 8×8 images that ship with scikit-learn). Runs on the GPU
when there is one (NVIDIA/AMD backend), else on the CPU with the virtual GPU reporting power.

    python examples/raw_loop.py [--epochs 3] [--config examples/zeus.yaml] [--summary-json out.json]

The energy log is written to ``zeus_logs/<run>.jsonl`` (``logging.log_dir``); the summary is printed.
With the batch-size optimiser on (``batch_size.enabled: true`` in the config) the loop trains at the
batch size it suggests instead of ``--batch-size``, tells it so, and stops when it asks (``m.should_stop``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import zeus_callbacks
from zeus_callbacks import ConfigError, ZeusCallbacksError

HERE = Path(__file__).resolve().parent


def digits_loaders(batch_size: int = 32) -> tuple[DataLoader, DataLoader]:
    """The digits split 80/20 (seeded): a shuffled train loader and a validation loader."""
    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0  # (1797, 1, 8, 8) in [0, 1]
    y = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    split = int(0.8 * len(x))
    train = TensorDataset(x[order[:split]], y[order[:split]])
    val = TensorDataset(x[order[split:]], y[order[split:]])
    return DataLoader(train, batch_size=batch_size, shuffle=True), DataLoader(val, batch_size=256)


def digits_cnn() -> nn.Module:
    """A two-layer CNN for 8×8 digit images: (N, 1, 8, 8) → (N, 10) logits."""
    return nn.Sequential(
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


def accuracy(model: nn.Module, loader: DataLoader, device: torch.device) -> float:
    """The share of ``loader``'s samples that ``model`` classifies right."""
    model.eval()
    right = total = 0
    with torch.no_grad():
        for x, y in loader:
            right += int((model(x.to(device)).argmax(-1) == y.to(device)).sum())
            total += len(y)
    model.train()
    return right / total


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument(
        "--batch-size", type=int, default=32, help="training batch size when the config's batch-size optimiser is off"
    )
    parser.add_argument("--config", default=str(HERE / "zeus.yaml"))
    parser.add_argument("--summary-json", help="also write the run summary to this JSON file")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = digits_cnn().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    try:
        meter = zeus_callbacks.measure(args.config)
    except ConfigError as exc:  # a bad or missing --config: one clear line, not a traceback
        parser.error(f"--config: {exc}")

    val_acc = float("nan")
    try:
        with meter as m:  # the run: train_start here, train_end (or exception) on exit
            # The batch-size optimiser's choice for this run (None when it is off), drawn as the run started.
            batch_size = m.suggested_batch_size or args.batch_size
            train_loader, val_loader = digits_loaders(batch_size)
            m.use_batch_size(batch_size)  # the run's trial is recorded at the size trained, and only then
            for _ in range(args.epochs):
                with m.epoch():
                    for x, y in train_loader:  # the batch fetch belongs to the step after it
                        with m.step(num_samples=len(x)):
                            loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
                            optimizer.zero_grad()
                            loss.backward()
                            optimizer.step()
                        if m.should_stop:  # the optimiser stopped this run early (its cost is too high)
                            break
                    with m.evaluation() as results:  # no step's window holds the evaluation
                        val_acc = accuracy(model, val_loader, device)
                        results["val/acc"] = val_acc  # reaching batch_size.target sets m.should_stop
                if m.should_stop:
                    break
    except ZeusCallbacksError as exc:  # e.g. a store that cannot be opened: its one-line message
        raise SystemExit(f"zeus-callbacks: {exc}") from None

    summary = meter.summary
    assert summary is not None  # the with block ended the run
    print(summary, flush=True)
    stopped = " (stopped by the batch-size optimiser)" if m.should_stop else ""
    print(f"raw_loop: {summary.epochs} epochs, {summary.steps} steps at batch size {batch_size}, "
          f"val/acc {val_acc:.3f}{stopped}")  # fmt: skip
    result = {
        "example": "raw_loop",
        "epochs": summary.epochs,
        "batch_size": int(batch_size),
        "should_stop": m.should_stop,
        "val_acc": val_acc,
        "summary": summary.as_dict(),
    }
    if args.summary_json:
        Path(args.summary_json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
