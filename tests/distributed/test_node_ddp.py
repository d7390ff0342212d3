"""node.rapl under two real processes (gloo): each node's CPU and DRAM counted once, by its local rank 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.distributed.node_rank_job import MOVES_UJ
from tests.timeouts import CHILD_TIMEOUT_S
from zeus_callbacks.reporting import read_jsonl

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
JOB = Path(__file__).with_name("node_rank_job.py")


def _J(nodes, zone):  # the µJ the nodes' counters moved, in J
    return sum(MOVES_UJ[n][zone] for n in nodes) / 1e6


@pytest.mark.parametrize(
    "layout, nodes",
    [
        ("one-node", [0]),  # two ranks on one node: its counters once, not once per rank
        ("two-nodes", [0, 1]),  # a local rank 0 on each node: both nodes, summed
    ],
)
def test_each_nodes_cpu_is_counted_once(tmp_path, layout, nodes):
    done = subprocess.run([sys.executable, str(JOB), str(tmp_path), layout], capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT_S, cwd=tmp_path, env=ENV)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    cpu_J, dram_J = _J(nodes, "intel-rapl:0"), _J(nodes, "intel-rapl:0:0")
    summaries = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    (epoch,) = [r for r in read_jsonl(tmp_path / "logs" / f"{layout}.jsonl") if r["event"] == "epoch"]
    (end,) = [r for r in read_jsonl(tmp_path / "logs" / f"{layout}.jsonl") if r["event"] == "run_end"]
    assert epoch["ranks"] == 2 and end["world_size"] == 2
    for figures in (*summaries, epoch, end):  # every rank agrees; the log holds the same
        # approx: µJ -> J divisions and float sums
        assert figures["cpu_energy_J"] == pytest.approx(cpu_J) and figures["dram_energy_J"] == pytest.approx(dram_J)
        assert figures["node_energy_J"] == pytest.approx(figures["energy_J"] + cpu_J + dram_J)
        assert figures["node_energy_note"] == "GPU + CPU package + DRAM"
    # The steps record at the epoch's end holds the span from the run's start to that report: both ranks'
    # GPUs over it (the epoch's, on these manual clocks) and each node's CPU and DRAM once.
    (steps,) = [r for r in read_jsonl(tmp_path / "logs" / f"{layout}.jsonl") if r["event"] == "steps"]
    assert steps["node_steps"] == 2 and steps["node_energy_note"] == "GPU + CPU package + DRAM"
    assert steps["cpu_energy_J"] == pytest.approx(cpu_J) and steps["dram_energy_J"] == pytest.approx(dram_J)
    assert steps["node_energy_J"] == pytest.approx(epoch["energy_J"] + cpu_J + dram_J)
