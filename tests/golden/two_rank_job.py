"""Two real processes (gloo on the CPU) train through EnergySession, each on its own virtual GPU.

Usage: ``python tests/golden/two_rank_job.py OUT_DIR``. Each rank writes the golden lines it
saw to ``OUT_DIR/rank<r>.json`` (rank 0's include the JSONL records: it is the only writer).
Both ranks run the same scripted loops on manual clocks, so their collectives meet at the
same events and every figure is deterministic. Rank 1's GPU draws 60 W more and its steps
take 10 % longer, so the sums (energy) and maxima (time) of the aggregation both show.

Two runs share the process group: step, epoch, eval and phase windows; then just-in-time
power-limit profiling, which the main rank decides and every rank applies at the same step.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.golden.harness import Loop, Rig, finish, run_loop, start  # noqa: E402
from tests.golden.tolerance import solve_conditioning  # noqa: E402

WORLD_SIZE = 2
OFFSETS_W = [0.0, 60.0]  # the two virtual GPUs draw different power
STEP_SCALE = [1.0, 1.1]  # rank 1 is the slower one


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
        with solve_conditioning() as seen:  # the fits' conditioning sets the golden tolerance
            rig = Rig.create(out_dir, read_only=False, num_devices=WORLD_SIZE, power_offset_W=OFFSETS_W)
            scale = STEP_SCALE[rank]
            windows = rig.session(rig.config(windows={"phases": True}), is_main_process=rank == 0)
            start(windows, "two-rank")
            run_loop(rig, windows, Loop(epochs=2, steps_per_epoch=20, step_s=0.05 * scale, phases=True))
            finish(rig, windows)
            profiled = rig.session(
                rig.config(power_limit={"enabled": True, "warmup_steps": 1}), is_main_process=rank == 0
            )
            start(profiled, "two-rank-power-limit")
            run_loop(rig, profiled, Loop(epochs=3, steps_per_epoch=30, step_s=0.25 * scale, num_samples=32))
            finish(rig, profiled)
            rig.observe("limit_after_run", power_limit_W=rig.backend.power_limit_W(rank))
            rig.backend.close()
            (out_dir / f"rank{rank}.json").write_text(json.dumps(rig.lines, default=str))
        (out_dir / f"rank{rank}_solves.json").write_text(json.dumps(seen))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # Both result files are written and closed by now. Skip the interpreter's teardown: on the CPU a
    # gloo thread sometimes aborts the process there ("terminate called without an active
    # exception"), which mp.spawn would report as a failed rank. A rank that raised does not get here.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    mp.spawn(rank_main, args=(sys.argv[1], free_port()), nprocs=WORLD_SIZE, join=True)
