"""Node figures per step report (issue 29): CPU/DRAM read at each report, each steps record's spans.

A fake powercap tree whose counters the test moves inside each step (a known amount per step), the
noise-free virtual GPU on a manual clock: each steps record's CPU and DRAM energy must be what the
counters moved in the steps its spans hold, and its GPU part must add up to the run's GPU energy.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.test_rapl import RANGE_UJ, set_uj, zone
from zeus_callbacks import reporting as metric
from zeus_callbacks.backends.rapl import NodeEnergy
from zeus_callbacks.measurement._windows import WindowRecord
from zeus_callbacks.reporting import NODE_OFF, read_jsonl
from zeus_callbacks.session import EnergySession
from zeus_callbacks.session._node import OTHER_LOCAL_RANK
from zeus_callbacks.session._node_spans import NO_SPAN, SPAN_WINDOW, NodeSpans

START_UJ = {"package-0": RANGE_UJ - 1_500_000, "dram-0": 5_000}  # the package wraps in the second step
PACKAGE_UJ_PER_STEP = 1_000_000  # what the fake package draws in each step: 1 J
DRAM_UJ_PER_STEP = 250_000  # and its DRAM: 0.25 J


@pytest.fixture
def tree(tmp_path):
    """One socket, a package near its wrap and a DRAM zone."""
    root = tmp_path / "powercap"
    zones = {
        "package-0": zone(root, "intel-rapl:0", "package-0", START_UJ["package-0"]),
        "dram-0": zone(root, "intel-rapl:0:0", "dram", START_UJ["dram-0"]),
    }
    return root, zones


def _run(tmp_path, backend, clock, root, zones, *, steps, interval=2, node=None, epoch_end=False):
    """``steps`` steps of 0.5 s in one epoch; the counters move inside each step. Returns the log and metrics."""
    node = {"rapl": True, "powercap_root": str(root)} if node is None else node
    session = EnergySession(
        {"logging": {"log_dir": str(tmp_path / "logs"), "run_name": "s", "interval_steps": interval}, "node": node,
         "windows": {"sample_fraction": 1}},
        backend=backend,
    )  # fmt: skip
    values = {"package-0": START_UJ["package-0"], "dram-0": START_UJ["dram-0"]}  # as the fixture wrote them
    session.train_start()
    session.epoch_start(0)
    popped = []
    for step in range(steps):
        session.step_start(step)
        clock.advance(0.5)
        for label, per_step in (("package-0", PACKAGE_UJ_PER_STEP), ("dram-0", DRAM_UJ_PER_STEP)):
            values[label] = (values[label] + per_step) % RANGE_UJ
            set_uj(zones[label], values[label])
        session.sampler.poll_once()
        session.step_end(step)
        popped.append(session.pop_metrics())
    if epoch_end:
        session.epoch_end(0)
    summary = session.train_end()
    log = read_jsonl(tmp_path / "logs" / "s.jsonl")
    return [r for r in log if r["event"] == "steps"], summary, popped


@pytest.mark.parametrize("epoch_end", [False, True], ids=["run-ends-mid-epoch", "epoch-ends"])
def test_each_steps_record_holds_the_cpu_and_dram_of_its_spans_and_the_gpu_adds_up(
    tmp_path, tree, virtual_backend, manual_clock, epoch_end
):
    root, zones = tree
    steps, summary, popped = _run(tmp_path, virtual_backend, manual_clock, root, zones, steps=7, epoch_end=epoch_end)
    known = [r for r in steps if r["node_steps"]]
    assert known, steps
    for record in known:
        # approx: µJ -> J divisions and float sums; the expected values are the moves above × the spans' steps
        assert record["cpu_energy_J"] == pytest.approx(record["node_steps"] * PACKAGE_UJ_PER_STEP / 1e6)
        assert record["dram_energy_J"] == pytest.approx(record["node_steps"] * DRAM_UJ_PER_STEP / 1e6)
        gpu_J = record["node_energy_J"] - record["cpu_energy_J"] - record["dram_energy_J"]
        assert gpu_J > 0 and record["node_energy_note"] == "GPU + CPU package + DRAM"
        assert record["node_time_s"] == pytest.approx(0.5 * record["node_steps"])  # approx: float sums
    # The spans tile the run; the run's last record holds the one that closes with it (after an epoch's end: a
    # span of no steps and no time on this clock, in no record).
    assert sum(r["node_steps"] for r in steps) == 7
    gpu_J = sum(r["node_energy_J"] - r["cpu_energy_J"] - r["dram_energy_J"] for r in known)
    assert gpu_J == pytest.approx(summary.energy_J, rel=1e-9)  # approx: the same samples, summed in another order
    assert sum(r["cpu_energy_J"] for r in known) == pytest.approx(summary.cpu_energy_J)
    # Each interval's metrics: per step over its spans, the counters' move per step.
    logged = [m for m in popped if metric.STEP_CPU_ENERGY_J in m]
    assert logged
    for m in logged:
        assert m[metric.STEP_CPU_ENERGY_J] == pytest.approx(PACKAGE_UJ_PER_STEP / 1e6)
        assert m[metric.STEP_DRAM_ENERGY_J] == pytest.approx(DRAM_UJ_PER_STEP / 1e6)
        assert m[metric.STEP_NODE_ENERGY_J] > m[metric.STEP_CPU_ENERGY_J] + m[metric.STEP_DRAM_ENERGY_J]


def test_an_unreadable_counter_gives_null_step_figures_with_the_fix_and_no_metric(
    tmp_path, tree, virtual_backend, manual_clock, monkeypatch
):
    root, zones = tree
    real_read_text = Path.read_text

    def read_text(self, *args, **kwargs):
        if self.name == "energy_uj" and self.parent.name == "intel-rapl:0:0":
            raise PermissionError(13, "Permission denied", str(self))
        return real_read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    steps, _, popped = _run(tmp_path, virtual_backend, manual_clock, root, zones, steps=4)
    known = [r for r in steps if r["node_steps"]]
    assert known
    for record in known:
        assert record["cpu_energy_J"] == pytest.approx(record["node_steps"] * 1.0)  # the package is readable
        assert record["dram_energy_J"] is None and record["node_energy_J"] is None  # never 0 for unknown
        assert "not readable" in record["node_energy_note"] and "chmod" in record["node_energy_note"]
    assert not any(metric.STEP_DRAM_ENERGY_J in m or metric.STEP_NODE_ENERGY_J in m for m in popped)
    assert any(metric.STEP_CPU_ENERGY_J in m for m in popped)


def test_without_a_node_option_steps_records_say_so_and_no_span_is_marked(tmp_path, virtual_backend, manual_clock):
    session = EnergySession(
        {"logging": {"log_dir": str(tmp_path / "logs"), "run_name": "s", "interval_steps": 2},
         "windows": {"sample_fraction": 1}},
        backend=virtual_backend,
    )  # fmt: skip
    session.train_start()
    for step in range(4):
        session.step_start(step)
        manual_clock.advance(0.5)
        session.sampler.poll_once()
        session.step_end(step)
    assert not session.run.meter.is_open(SPAN_WINDOW)
    session.train_end()
    steps = [r for r in read_jsonl(tmp_path / "logs" / "s.jsonl") if r["event"] == "steps"]
    assert steps and all(r["node_energy_note"] == NODE_OFF and r["node_steps"] == 0 for r in steps)
    assert all(r["cpu_energy_J"] is None and r["node_energy_J"] is None for r in steps)


def test_the_span_window_name_is_reserved(tmp_path, virtual_backend):
    session = EnergySession({"logging": {"log_dir": str(tmp_path)}}, backend=virtual_backend)
    with pytest.raises(ValueError, match="reserved"), session.window(SPAN_WINDOW):
        pass


# ------------------------------------------------------------------ several ranks (NodeSpans alone)
class _Reader:
    has_dram, simulated, parts = True, False, "GPU + CPU package + DRAM"


def _span(number: int, gpu_J: float, cpu_J: float | None, dram_J: float, steps: int = 2) -> WindowRecord:
    start = NodeEnergy(0.0, 0.0, {"package-0": 0.0, "dram-0": 0.0})
    end = NodeEnergy(cpu_J, dram_J, {"package-0": cpu_J, "dram-0": dram_J},
                     {} if cpu_J is not None else {"package-0": "vanished"})  # fmt: skip
    info = {"span": number, "node_start": start, "node_end": end, "from_step": 0, "to_step": steps}
    return WindowRecord(SPAN_WINDOW, 0.0, 1.0, gpu_J, (gpu_J,), 50, True, info, covered_s=1.0)


def test_ranks_combine_the_spans_every_rank_has_and_count_each_nodes_cpu_once():
    reader, other = NodeSpans(), NodeSpans()  # local rank 0 of the node, and a rank that reads no counter
    reader.absorb(_span(0, 100.0, 10.0, 2.0), _Reader(), None)
    reader.absorb(_span(1, 110.0, 11.0, 2.5), _Reader(), None)
    other.absorb(_span(0, 90.0, None, 0.0), None, OTHER_LOCAL_RANK)  # its samples lag: one span so far
    rows = [reader.local_row(), other.local_row()]
    figures = reader.combine(rows)
    assert figures.count == 1 and other.combine(rows) == figures  # both ranks take the same span
    # span 0: the GPUs of both ranks, the node's CPU and DRAM once (from its reader)
    assert figures.fields["cpu_energy_J"] == 10.0 and figures.fields["dram_energy_J"] == 2.0
    assert figures.fields["node_energy_J"] == 100.0 + 90.0 + 10.0 + 2.0 and figures.fields["node_steps"] == 2
    reader.publish(figures)
    other.publish(figures)
    other.absorb(_span(1, 95.0, None, 0.0), None, OTHER_LOCAL_RANK)
    figures = reader.combine([reader.local_row(), other.local_row()])
    assert figures.count == 1 and figures.fields["node_energy_J"] == 110.0 + 95.0 + 11.0 + 2.5


def test_a_span_unknown_on_one_rank_is_null_with_the_reason_and_none_is_no_span():
    spans = NodeSpans()
    figures = spans.combine([spans.local_row()])
    assert figures.count == 0 and figures.fields["node_energy_note"] == NO_SPAN
    assert figures.fields["node_energy_J"] is None
    spans.absorb(_span(0, 100.0, None, 2.0), _Reader(), None)  # the package vanished in this span
    figures = spans.combine([spans.local_row()])
    assert figures.fields["cpu_energy_J"] is None and figures.fields["node_energy_J"] is None
    assert "vanished" in figures.fields["node_energy_note"]
    metrics = spans.publish(figures)
    assert metric.STEP_CPU_ENERGY_J not in metrics and metrics[metric.STEP_DRAM_ENERGY_J] == 1.0  # 2 J / 2 steps
    uncovered = _span(1, math.nan, 10.0, 2.0)
    spans.absorb(uncovered, _Reader(), None)
    figures = spans.combine([spans.local_row()])
    assert figures.fields["cpu_energy_J"] == 10.0 and figures.fields["node_energy_J"] is None
    assert "do not cover" in figures.fields["node_energy_note"]
