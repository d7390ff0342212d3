"""Two real processes (gloo on the CPU) train through EnergySession, each on its own virtual GPU.

Usage: ``python tests/golden/two_rank_job.py OUT_DIR``. Rank 0 writes ``OUT_DIR/two_rank.jsonl``;
each rank writes its summary to ``OUT_DIR/rank<r>.json``. Both ranks run the same scripted loop on
manual clocks, so their collectives meet at the same steps and the log is deterministic.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from dataclasses import asdict
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.golden.scenarios import START_S, base_config, train  # noqa: E402
from zeus_callbacks import EnergySession  # noqa: E402
from zeus_callbacks.backends import ManualClock  # noqa: E402
from zeus_callbacks.backends.virtual import VirtualGPUBackend  # noqa: E402

WORLD_SIZE = 2
OFFSETS_W = [0.0, 60.0]  # the two virtual GPUs draw different power


def free_port() -> int:
    """A TCP port on localhost that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank: int, out: str, port: int) -> None:
    out_dir = Path(out)
    # What a launcher (torchrun) sets: each rank then measures its own GPU only.
    os.environ.update({
        "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(WORLD_SIZE),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
    })  # fmt: skip
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    try:
        clock = ManualClock(START_S)
        backend = VirtualGPUBackend(
            clock=clock, noise_W=0.0, read_only=True, num_devices=WORLD_SIZE, power_offset_W=OFFSETS_W
        )
        session = EnergySession(
            base_config(out_dir / "logs", "two_rank", windows={"phases": True}), backend=backend,
            is_main_process=rank == 0,
        )  # fmt: skip
        summary = train(session, backend, clock, phases=True)
        backend.close()
        (out_dir / f"rank{rank}.json").write_text(json.dumps(asdict(summary), default=str))
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(rank_main, args=(sys.argv[1], free_port()), nprocs=WORLD_SIZE, join=True)
