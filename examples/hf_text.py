"""Train a small GPT-2-style causal LM (random init) with the Hugging Face Trainer.

Real text: the Python standard library's own source files, byte-level tokenised
(vocabulary of 256 bytes, so no tokenizer download is needed). The ZeusTrainerCallback
is configured from ``examples/zeus.yaml``; energy goes to TensorBoard (and W&B with
``--report-to tensorboard wandb``) and to the JSONL log, every key; the console shows
the Trainer's own figures and a few energy ones of each log (:data:`CONSOLE_ENERGY_KEYS`).
Uses the GPU when present, else the CPU with the virtual GPU reporting power.

    python examples/hf_text.py [--max-steps 120] [--report-to tensorboard] [--no-callback]
    torchrun --standalone --nproc_per_node 2 examples/hf_text.py   # DDP, one process per GPU
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import sysconfig
import time
from pathlib import Path

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_callback import ProgressCallback
from transformers.utils import logging as hf_logging

from zeus_callbacks import ConfigError, ZeusCallbacksError, ZeusTrainerCallback
from zeus_callbacks import reporting as metric

HERE = Path(__file__).resolve().parent

CONSOLE_ENERGY_KEYS = (
    metric.STEP_ENERGY_J,  # the mean step since the last log (J)
    metric.MEAN_POWER_W,  # its mean power (W)
    metric.TOTAL_ENERGY_J,  # the run so far (J)
    metric.SIMULATED,  # 1 on the virtual GPU: the figures are simulated
    "eval_energy_J",  # an evaluation's energy (J), beside eval_loss
)
"""The energy figures the console shows of each log; TensorBoard, W&B and the JSONL log get every key."""


def stdlib_text(max_bytes: int) -> bytes:
    """Concatenate the standard library's .py sources (sorted, so runs are repeatable)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(root.glob("*.py")):
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    return b"\n".join(chunks)[:max_bytes]


class ByteBlocks(Dataset):
    """Fixed-length blocks of bytes as token ids; labels = inputs (the model shifts them)."""

    def __init__(self, data: bytes, block: int) -> None:
        ids = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
        n = len(ids) // block
        self.blocks = ids[: n * block].view(n, block)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.blocks[i], "labels": self.blocks[i]}


class StepClock(TrainerCallback):
    """Median time between consecutive optimizer steps, for overhead checks."""

    def __init__(self) -> None:
        self.gaps_s: list[float] = []
        self._last: float | None = None

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        if self._last is not None:
            self.gaps_s.append(now - self._last)
        self._last = now

    def on_evaluate(self, args, state, control, **kwargs):
        self._last = None  # a gap spanning an evaluation is not a step

    @property
    def median_step_s(self) -> float:
        return statistics.median(self.gaps_s) if self.gaps_s else float("nan")


class BriefProgressCallback(ProgressCallback):
    """The Trainer's progress bar, printing each log with only :data:`CONSOLE_ENERGY_KEYS` of the energy keys.

    The Trainer prints every key of a log above its bar: some twenty energy keys a log would bury the
    loss. The reporters have read the whole log before this callback (the Trainer calls it last).
    """

    def on_log(self, args, state, control, logs=None, **kwargs):
        shown = {k: v for k, v in (logs or {}).items() if k in CONSOLE_ENERGY_KEYS or not metric.is_own_metric(k)}
        super().on_log(args, state, control, logs=shown, **kwargs)


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
    parser.add_argument("--max-steps", type=int, default=120)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--config", default=str(HERE / "zeus.yaml"))
    parser.add_argument("--output-dir", default="runs/hf_text")
    parser.add_argument("--report-to", nargs="+", default=["tensorboard"])
    parser.add_argument("--no-callback", action="store_true", help="train without zeus-callbacks (baseline)")
    parser.add_argument("--summary-json", help="also write the run summary to this JSON file")
    args = parser.parse_args()
    hf_logging.set_verbosity_warning()
    torch.manual_seed(0)

    data = stdlib_text(2_000_000)
    split = int(0.95 * len(data))
    train_set, eval_set = ByteBlocks(data[:split], args.block), ByteBlocks(data[split:], args.block)
    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=256, n_positions=args.block, n_embd=args.width, n_layer=args.layers, n_head=4)
    )
    training_args = TrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=64,
        gradient_accumulation_steps=args.grad_accum,
        learning_rate=1e-3,
        warmup_steps=10,
        logging_steps=20,
        eval_strategy="steps",
        eval_steps=max(args.max_steps // 2, 1),
        save_strategy="no",
        report_to=args.report_to,
        include_num_input_tokens_seen=True,
        bf16=torch.cuda.is_available() and torch.cuda.is_bf16_supported(),
        use_cpu=not torch.cuda.is_available(),  # without it, torchrun on the CPU trains each process alone
        dataloader_num_workers=0,
        disable_tqdm=False,
        seed=0,
    )
    try:
        zeus = None if args.no_callback else ZeusTrainerCallback.from_yaml(args.config)
    except ConfigError as exc:  # a bad or missing --config: one clear line, not a traceback
        parser.error(f"--config: {exc}")
    step_clock = StepClock()
    trainer = Trainer(
        model=model, args=training_args, train_dataset=train_set, eval_dataset=eval_set, callbacks=[step_clock]
    )
    if trainer.pop_callback(ProgressCallback) is not None:  # None in a notebook (a table there, not a bar)
        trainer.add_callback(BriefProgressCallback)
    if zeus is not None:
        zeus.attach(trainer)  # before the reporters; a failure anywhere in train() ends the run
    start = time.perf_counter()
    try:
        output = trainer.train()
    except ZeusCallbacksError as exc:  # e.g. a store that cannot be opened: its one-line message
        raise SystemExit(f"zeus-callbacks: {exc}") from None
    wall_s = time.perf_counter() - start
    eval_loss = trainer.evaluate().get("eval_loss", float("nan"))
    if not trainer.is_world_process_zero():
        return  # under DDP the main process reports for all
    print(
        f"\nhf_text: {output.global_step} steps, train loss {output.training_loss:.3f}, "
        f"eval loss {eval_loss:.3f}, {wall_s:.1f} s wall, median step {1e3 * step_clock.median_step_s:.2f} ms"
    )
    result = {
        "example": "hf_text",
        "steps": output.global_step,
        "eval_loss": eval_loss,
        "wall_s": wall_s,
        "median_step_s": step_clock.median_step_s,
        "world_size": training_args.world_size,
    }
    if zeus is not None and zeus.summary is not None:
        result["summary"] = zeus.summary.as_dict()
    if args.summary_json:
        Path(args.summary_json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
    exit_skipping_gloo_teardown()
