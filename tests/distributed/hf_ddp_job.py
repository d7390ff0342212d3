"""A 2-process Hugging Face Trainer run under torchrun on the CPU (gloo).

Run by tests/distributed/test_ddp.py as
``python -m torch.distributed.run --nproc_per_node 2 hf_ddp_job.py OUT``. Each rank measures
its own virtual GPU (rank 1's draws 60 W more) and writes ``OUT/rank<r>.json``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from zeus_callbacks import ZeusTrainerCallback
from zeus_callbacks.backends.virtual import VirtualGPUBackend

OFFSETS_W = [0.0, 60.0]


class Tokens(Dataset):
    def __init__(self, n: int) -> None:
        self.ids = torch.randint(0, 64, (n, 32), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    out = Path(sys.argv[1])
    local_rank = int(os.environ["LOCAL_RANK"])
    backend = VirtualGPUBackend(num_devices=2, power_offset_W=OFFSETS_W, seed=local_rank)
    zeus = ZeusTrainerCallback(
        {"logging": {"interval_steps": 3, "log_dir": str(out / "zeus"), "run_name": "hf-ddp"}}, backend=backend
    )
    args = TrainingArguments(
        output_dir=str(out / "hf"),
        max_steps=12,
        per_device_train_batch_size=4,
        logging_steps=4,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        ddp_backend="gloo",
        disable_tqdm=True,
    )
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=1, n_head=2))
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(256), callbacks=[zeus])
    trainer.train()
    (out / f"rank{args.process_index}.json").write_text(
        json.dumps(
            {
                "global_rank": args.process_index,
                "trainer_world_size": args.world_size,
                "pid": os.getpid(),
                "gpu_indices": zeus.session.gpu_indices,
                "summary": zeus.summary.as_dict(),
            }
        )
    )


if __name__ == "__main__":
    main()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    # Every result is written and closed by now. Skip the interpreter's teardown: on the CPU a
    # gloo thread sometimes aborts the process there ("terminate called without an active
    # exception"), which torchrun would report as a failed run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
