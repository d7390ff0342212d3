"""A 2-process Hugging Face Trainer run under torchrun on the CPU (gloo).

Run by tests/distributed/test_ddp.py as
``python -m torch.distributed.run --nproc_per_node 2 hf_ddp_job.py OUT [--store S --target-loss L]``.
Each rank measures its own virtual GPU (rank 1's draws 60 W more) and writes ``OUT/rank<r>.json``.
With ``--store`` the batch-size bandit runs: every rank asks ``suggest_batch_size`` before
building ``TrainingArguments`` (the main process alone reads the store), and training evaluates
every 4 steps against the target ``eval_loss <= L``. With ``--step-s S`` the virtual GPUs run on a
manual clock that each training step advances by ``S`` (both ranks' windows then hold the same time);
``--eval-s E`` makes each evaluation batch advance it by ``E`` too. ``--eval-on-start`` sets the
Trainer's ``eval_on_start`` (an evaluation before the first step). ``--power-limit`` profiles power
limits over 32 steps, as the Lightning job's ``--power-limit`` does.

Several runs can share one launch (the two processes, their imports and their process group):
``hf_ddp_job.py OUT1 [options] --then OUT2 [options] ...`` runs them one after the other, each
with its own Trainer, callback, virtual GPUs and folder, in the same two processes.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from pathlib import Path

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from tests.distributed.job_runs import runs
from zeus_callbacks import ZeusTrainerCallback, suggest_batch_size
from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.backends.virtual import VirtualGPUBackend

OFFSETS_W = [0.0, 60.0]


class Tokens(Dataset):
    def __init__(self, n: int) -> None:
        self.ids = torch.randint(0, 64, (n, 32), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class LogProbe(TrainerCallback):
    """The running totals each periodic log carries (it runs after the energy callback)."""

    def __init__(self) -> None:
        self.totals: list[tuple[int, float, float]] = []  # (global step, J, s)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "energy/total_J" in logs and "train_loss" not in logs:
            self.totals.append((state.global_step, logs["energy/total_J"], logs["time/total_s"]))


def main(argv: list[str]) -> None:
    """One run (one ``train``) of the options ``argv``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--store", type=Path, help="run the batch-size bandit with this store")
    parser.add_argument("--target-loss", type=float, default=0.0, help="the bandit's target: eval_loss <= this")
    parser.add_argument("--run-name", default="hf-ddp")
    parser.add_argument("--step-s", type=float, help="each training step takes this long on a manual clock")
    parser.add_argument("--evaluate", action="store_true", help="the Trainer evaluates every 4 steps")
    parser.add_argument("--eval-on-start", action="store_true", help="and once before training (eval_on_start)")
    parser.add_argument("--eval-s", type=float, help="each evaluation batch takes this long on the manual clock")
    parser.add_argument("--power-limit", action="store_true", help="profile power limits (agreed across ranks)")
    cli = parser.parse_args(argv)
    out = cli.out
    local_rank = int(os.environ["LOCAL_RANK"])
    clock = ManualClock(1_000.0) if cli.step_s else None  # None: the wall clock
    backend = VirtualGPUBackend(num_devices=2, power_offset_W=OFFSETS_W, seed=local_rank, clock=clock)
    config = {"logging": {"interval_steps": 3, "log_dir": str(out / "zeus"), "run_name": cli.run_name}}
    batch_size, extra = 4, {}
    if cli.store:
        config["job_id"] = "hf-ddp-job"
        config["store"] = {"path": str(cli.store)}
        config["batch_size"] = {
            "enabled": True, "batch_sizes": [2, 4, 8], "default_batch_size": 4, "stop_agreement_steps": 2,
            "target": {"metric": "eval_loss", "value": cli.target_loss, "direction": "min"},
        }  # fmt: skip
        # Before TrainingArguments, with the same device and backend: the group made here is the Trainer's.
        batch_size = suggest_batch_size(config, cpu=True, ddp_backend="gloo")
        extra = {"eval_strategy": "steps", "eval_steps": 4, "per_device_eval_batch_size": 4}
    if cli.power_limit:
        config["power_limit"] = {
            "enabled": True, "warmup_steps": 0, "min_profile_steps": 2, "profile_steps": 3, "step_W": 100.0,
            "cache": False, "plot": False,
        }  # fmt: skip
    if cli.evaluate:
        extra = {"eval_strategy": "steps", "eval_steps": 4, "per_device_eval_batch_size": 4}
        extra["eval_on_start"] = cli.eval_on_start
    zeus = ZeusTrainerCallback(config, backend=backend)
    args = TrainingArguments(
        output_dir=str(out / "hf"),
        max_steps=60 if cli.store else 32 if cli.power_limit else 12,
        per_device_train_batch_size=batch_size,
        logging_steps=4,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        ddp_backend="gloo",
        disable_tqdm=True,
        **extra,
    )
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=1, n_head=2))
    if clock is not None:
        forward = model.forward

        @functools.wraps(forward)  # the Trainer reads forward's signature
        def clocked_forward(*a, **kw):
            if model.training:
                clock.advance(cli.step_s)
            elif cli.eval_s:
                clock.advance(cli.eval_s)
            return forward(*a, **kw)

        model.forward = clocked_forward
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=Tokens(256),
        eval_dataset=Tokens(16) if cli.store or cli.evaluate else None,
        callbacks=[zeus, probe := LogProbe()],
    )
    trainer.train()
    (out / f"rank{args.process_index}.json").write_text(
        json.dumps(
            {
                "global_rank": args.process_index,
                "trainer_world_size": args.world_size,
                "process_group_backend": str(torch.distributed.get_backend()),
                "pid": os.getpid(),
                "gpu_indices": zeus.session.gpu_indices,
                "true_power_W": backend.true_power_W(zeus.session.gpu_indices[0]),
                "eval_on_start": args.eval_on_start,
                "summary": zeus.summary.as_dict(),
                "suggested_batch_size": batch_size if cli.store else None,
                "claimed_batch_size": zeus.session.suggest_batch_size(),
                "batch_size_used": args.per_device_train_batch_size,
                "stopped_at_step": trainer.state.global_step,
                "logged_totals": probe.totals,
            }
        )
    )


if __name__ == "__main__":
    for run in runs(sys.argv[1:]):
        main(run)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    # Every result is written and closed by now. Skip the interpreter's teardown: on the CPU a
    # gloo thread sometimes aborts the process there ("terminate called without an active
    # exception"), which torchrun would report as a failed run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
