"""Two real processes (gloo on the CPU) with ``node.rapl`` on fake powercap trees: each node's CPU counted once.

Usage: ``python tests/distributed/node_rank_job.py OUT_DIR LAYOUT``, LAYOUT one of

- ``one-node``: ranks 0 and 1 on one node (``LOCAL_RANK`` 0 and 1) with one powercap tree; rank 0
  moves its counters by :data:`MOVES_UJ` [0] during the epoch (the node's CPU drew that energy once);
- ``two-nodes``: each rank is local rank 0 of a node of its own, with its own tree, moved by
  :data:`MOVES_UJ` [rank].

Each rank writes its run summary to ``OUT_DIR/rank<r>.json``; rank 0 writes the JSONL log
``OUT_DIR/logs/<LAYOUT>.jsonl``. Both ranks run the same scripted loop on manual clocks, so their
collectives meet at the same events.
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

from zeus_callbacks.backends.base import ManualClock  # noqa: E402
from zeus_callbacks.backends.virtual import VirtualGPUBackend  # noqa: E402
from zeus_callbacks.session import EnergySession  # noqa: E402

WORLD_SIZE = 2
RANGE_UJ = 262_143_328_850
START_UJ = {"intel-rapl:0": 1_000_000, "intel-rapl:0:0": 5_000}
MOVES_UJ = [
    {"intel-rapl:0": 3_000_000, "intel-rapl:0:0": 1_000_000},
    {"intel-rapl:0": 5_000_000, "intel-rapl:0:0": 2_000_000},
]
"""What each node's package and DRAM counters move by during the epoch (µJ)."""


def make_tree(root: Path) -> None:
    """One socket: a package zone and its DRAM subzone."""
    for zone, label in (("intel-rapl:0", "package-0"), ("intel-rapl:0:0", "dram")):
        path = root / zone
        path.mkdir(parents=True)
        (path / "name").write_text(f"{label}\n")
        (path / "max_energy_range_uj").write_text(f"{RANGE_UJ}\n")
        (path / "energy_uj").write_text(f"{START_UJ[zone]}\n")


def tree_of(out_dir: Path, layout: str, rank: int) -> Path:
    """The powercap tree a rank's node has."""
    return out_dir / ("node0" if layout == "one-node" else f"node{rank}")


def free_port() -> int:
    """A TCP port on localhost that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank: int, out: str, layout: str, port: int) -> None:
    out_dir = Path(out)
    local_rank = rank if layout == "one-node" else 0
    os.environ.update({
        "RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(WORLD_SIZE),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
    })  # fmt: skip
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    try:
        clock = ManualClock(1_000.0)
        backend = VirtualGPUBackend(clock=clock, noise_W=0.0, read_only=True)
        root = tree_of(out_dir, layout, rank)
        config = {
            "logging": {"log_dir": str(out_dir / "logs"), "run_name": layout},
            "node": {"rapl": True, "powercap_root": str(root)},
        }
        session = EnergySession(config, backend=backend, is_main_process=rank == 0)
        session.train_start()
        session.epoch_start(0)
        for step in range(2):
            session.step_start(step)
            clock.advance(0.5)
            session.sampler.poll_once()
            session.step_end(step)
        if local_rank == 0:  # the node's CPU drew this during the epoch (one tree per node)
            for zone, delta in MOVES_UJ[rank].items():
                (root / zone / "energy_uj").write_text(f"{START_UJ[zone] + delta}\n")
        session.epoch_end(0)
        summary = session.train_end()
        backend.close()
        (out_dir / f"rank{rank}.json").write_text(json.dumps(summary.as_dict(), default=str))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # As in tests/golden/two_rank_job.py: skip the interpreter's teardown (a gloo thread may abort it).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    out_dir, layout = Path(sys.argv[1]), sys.argv[2]
    for rank in range(WORLD_SIZE):
        root = tree_of(out_dir, layout, rank)
        if not root.exists():
            make_tree(root)
    mp.spawn(rank_main, args=(str(out_dir), layout, free_port()), nprocs=WORLD_SIZE, join=True)
