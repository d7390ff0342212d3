"""A 2-process Lightning DDP run on the CPU (gloo), each rank measuring its own virtual GPU.

Run by tests/distributed/test_ddp.py as ``python lightning_ddp_job.py OUT [--faulty-rank R] [--store S]``;
Lightning's launcher starts the second process by re-running this script. Each rank writes
``OUT/rank<r>.json`` with what it saw. With ``--step-s S`` the virtual GPUs run on a manual clock that
each training step advances by ``S``: both ranks' windows then hold the same steps' time, however
differently the machine starts and runs the two processes.

Several runs can share one launch (the two processes, their imports and their process group):
``python lightning_ddp_job.py OUT1 [options] --then OUT2 [options] ...`` runs them one after the
other, each with its own Trainer, callback, virtual GPUs and folder, in the same two processes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import lightning.pytorch as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.distributed.job_runs import runs
from tests.timeouts import CHILD_TIMEOUT_S
from zeus_callbacks import ZeusCallback
from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.backends.virtual import VirtualGPUBackend

OFFSETS_W = [0.0, 60.0]  # the two virtual GPUs draw different power


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(32, 1)
        self.batch_size = 16  # the batch-size bandit sets this before the loader is built
        self.raise_at: tuple[int, int] | None = None  # (rank, global step): fail there
        self.clock: ManualClock | None = None  # --step-s: each step advances it by step_s
        self.step_s = 0.0

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        data = TensorDataset(torch.randn(256, 32, generator=g), torch.randn(256, 1, generator=g))
        return DataLoader(data, batch_size=self.batch_size)

    def training_step(self, batch, batch_idx):
        if self.raise_at == (self.global_rank, self.global_step):
            raise RuntimeError(f"planted failure on rank {self.global_rank}")
        if self.clock is not None:
            self.clock.advance(self.step_s)
        for _ in range(10):  # a few ms of work a step
            torch.linalg.matmul(torch.randn(128, 128), torch.randn(128, 128))
        return nn.functional.mse_loss(self.layer(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        if self.clock is not None:
            self.clock.advance(self.step_s)  # the evaluation takes time on the manual clock too
        return nn.functional.mse_loss(self.layer(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Probe(L.Callback):
    """Records what each rank saw, after the ZeusCallback ended the run."""

    def __init__(self, out: Path, zeus: ZeusCallback) -> None:
        self.out, self.zeus = out, zeus
        self.limits: list[tuple[int, float]] = []  # (global step, limit in force) at each step start
        self.measured: list[int] = []  # the global steps this rank measured (a step window open at its start)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        # Runs after the ZeusCallback's hook, which applied this step's limit.
        backend = self.zeus.session.backend
        self.limits.append((trainer.global_step, backend.power_limit_W(self.zeus.session.gpu_indices[0])))
        if self.zeus.session.measuring:
            self.measured.append(trainer.global_step)

    def on_fit_end(self, trainer, pl_module):
        from accelerate import PartialState

        summary = self.zeus.summary
        (self.out / f"rank{trainer.global_rank}.json").write_text(
            json.dumps(
                {
                    "global_rank": trainer.global_rank,
                    "trainer_world_size": trainer.world_size,
                    "accelerate_num_processes": PartialState(cpu=True).num_processes,
                    "pid": os.getpid(),
                    "gpu_indices": self.zeus.session.gpu_indices,
                    "gpu_uuid": self.zeus.session.backend.device_identity(self.zeus.session.gpu_indices[0]).uuid,
                    "true_power_W": self.zeus.session.backend.true_power_W(self.zeus.session.gpu_indices[0]),
                    "summary": summary.as_dict(),
                    "limits": self.limits,
                    "limit_after_W": self.zeus.session.backend.power_limit_W(self.zeus.session.gpu_indices[0]),
                    "batch_size_used": pl_module.batch_size,
                    "stopped_at_step": trainer.global_step,
                    "measured_steps": self.measured,
                }
            )
        )


def main(argv: list[str]) -> L.Trainer:
    """One run (one ``fit``) of the options ``argv``; its Trainer."""
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--faulty-rank", type=int)
    parser.add_argument("--power-limit", action="store_true", help="profile power limits (agreed across ranks)")
    parser.add_argument("--store", type=Path, help="run the batch-size bandit with this store")
    parser.add_argument("--max-epochs", type=int)
    parser.add_argument("--raise-on-rank", type=int, help="this rank raises in its training step 12 (epoch 1)")
    parser.add_argument("--step-s", type=float, help="each training step takes this long on a manual clock")
    parser.add_argument("--validate", action="store_true", help="validate at each epoch's end")
    parser.add_argument("--overheads", type=float, nargs=2, help="windows.max_overhead of rank 0 and of rank 1")
    parser.add_argument("--sample-fraction", type=float, help="windows.sample_fraction (default: auto)")
    parser.add_argument("--session-backend", action="store_true", help="each rank's session opens its virtual GPU")
    args = parser.parse_args(argv)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    clock = ManualClock(1_000.0) if args.step_s else None  # None: the wall clock
    backend = VirtualGPUBackend(
        gpu="A40", workload="imagenet", num_devices=2, power_offset_W=OFFSETS_W, seed=local_rank, clock=clock
    )
    if args.faulty_rank == local_rank:
        backend.inject_fault(reads=10**6, kind="gpu_lost", sensor="samples")
    config = {"logging": {"interval_steps": 4, "log_dir": str(args.out / "zeus"), "run_name": "ddp"}}
    if args.overheads:  # the ranks' budgets differ: alone, each would settle its own share of measured steps
        config["windows"] = {"max_overhead": args.overheads[local_rank]}
    if args.sample_fraction:
        config["windows"] = {"sample_fraction": args.sample_fraction}
    if args.power_limit:
        config["power_limit"] = {
            "enabled": True,
            "warmup_steps": 0,
            "min_profile_steps": 2,
            "profile_steps": 3,
            "step_W": 100.0,
            "cache": False,
            "plot": False,
        }
    if args.store:
        config["job_id"] = "ddp-job"
        config["batch_size"] = {
            "enabled": True, "batch_sizes": [8, 16, 32], "default_batch_size": 16, "stop_agreement_steps": 3,
        }  # fmt: skip
        config["store"] = {"path": str(args.store)}
    if args.session_backend:  # as a user's job does: backend virtual from the config, one GPU a process
        backend.close()
        config["backend"] = "virtual"
    zeus = ZeusCallback(config, backend=None if args.session_backend else backend)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=args.max_epochs or (4 if args.power_limit else 2),
        callbacks=[zeus, Probe(args.out, zeus)],
        num_sanity_val_steps=0,
        logger=TensorBoardLogger(str(args.out / "tb"), name="ddp"),
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    model = Model()
    model.clock, model.step_s = clock, args.step_s or 0.0
    if args.raise_on_rank is not None:
        model.raise_at = (args.raise_on_rank, 12)
    if args.validate:
        g = torch.Generator().manual_seed(1)
        data = TensorDataset(torch.randn(64, 32, generator=g), torch.randn(64, 1, generator=g))
        val = DataLoader(data, batch_size=16)
        trainer.fit(model, val_dataloaders=val)
    else:
        trainer.fit(model)
    return trainer


if __name__ == "__main__":
    # Rank 1 re-runs this command line, so both ranks play the same runs in the same order. The first
    # fit starts rank 1 and the process group; later Trainers find both (LOCAL_RANK is set by then).
    children = []
    for run in runs(sys.argv[1:]):
        children += getattr(main(run).strategy.launcher, "procs", [])
    # Rank 0 started rank 1 (Lightning re-ran this script) and does not wait for it: wait here, so
    # that rank 1's exit status is this job's too and a failure there fails the test.
    for child in children:
        if (code := child.wait(timeout=CHILD_TIMEOUT_S)) != 0:
            print(f"rank 1 (pid {child.pid}) exited with status {code}", file=sys.stderr)
            sys.exit(1)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    # Every result is written and closed by now. Skip the interpreter's teardown: on the CPU a
    # gloo thread sometimes aborts the process there ("terminate called without an active
    # exception"), which the test would see as a failed run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
