"""Node figures per step report: CPU/DRAM counters read at each report, the GPUs' energy between the same marks.

At the run's start, at each step report and at the run's end the session reads the CPU/DRAM counters
(a few sysfs reads, once per report, never per step) and takes one mark (:meth:`NodeSpans.boundary`):
the span window (:data:`SPAN_WINDOW`) open since the previous boundary closes there and the next opens,
so the spans tile the run. An attributed span gives the GPUs' energy between the two marks and the
CPU/DRAM energy between the two readings.

A ``steps`` record holds the spans attributed since the previous record: the samples lag the report, so
these usually end at the previous report, and their time and steps are the record's ``node_time_s`` and
``node_steps``. A span holds everything between two reports (evaluations, an epoch's turn included).

Several processes: reports come at the same steps on every rank, so spans are numbered alike; each rank
sends up to :data:`MAX_SPANS` attributed spans and the record takes the spans every rank had (the least
count), so every rank combines the same spans.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from zeus_callbacks import reporting as metric
from zeus_callbacks.backends.rapl import NodeReader
from zeus_callbacks.measurement._windows import WindowMeter, WindowRecord
from zeus_callbacks.session._aggregate import Rows
from zeus_callbacks.session._node import LocalNode, local_node, node_figures
from zeus_callbacks.session._rank_records import NodeColumns

SPAN_WINDOW = "node_span"
"""The window between two node readings (a reserved window name)."""

MAX_SPANS = 4
"""Spans one rank sends per report (more wait for the next): usually one is attributed per report."""


@dataclass(frozen=True)
class SpanColumns:
    """One span in a report's row: the GPUs' energy, the node figures, the steps and the time it holds.

    Attributes:
        gpu_J: This rank's GPU energy over the span (J; NaN unknown).
        node: This process's CPU/DRAM energy over it.
        steps: Steps in it.
        time_s: Its time (s).
    """

    gpu_J: float
    node: NodeColumns
    steps: float
    time_s: float

    def values(self) -> list[float]:
        """The span's block of the row."""
        return [self.gpu_J, *self.node.values(), self.steps, self.time_s]

    @classmethod
    def of(cls, block: Sequence[float]) -> SpanColumns:
        """A span's block unpacked."""
        return cls(block[0], NodeColumns.of(block[1:]), block[1 + NodeColumns.width], block[2 + NodeColumns.width])


_BLOCK = 1 + NodeColumns.width + 2  # a SpanColumns block
SPAN_COLUMNS = 1 + MAX_SPANS * _BLOCK
"""A rank's span columns in a report's row: how many spans it sends, then one block per span."""

NO_SPAN = "no span between two CPU/DRAM readings attributed since the previous record (the power samples lag)"
"""``node_energy_note`` of a ``steps`` record that holds no span."""

UNCOVERED = "the power samples do not cover the span"
"""Why a span's GPU energy is unknown."""


@dataclass(frozen=True)
class _Span:
    gpu_J: float  # this process's GPUs over the span (J); NaN when unknown
    node: LocalNode
    steps: int
    time_s: float


@dataclass
class _Interval:
    """The published spans since the loggers last took the metrics: sums and whether each is known."""

    steps: int = 0
    sums_J: dict[str, float] = field(default_factory=lambda: {"cpu": 0.0, "dram": 0.0, "node": 0.0})
    known: dict[str, bool] = field(default_factory=lambda: {"cpu": True, "dram": True, "node": True})


_METRICS = {"cpu": metric.STEP_CPU_ENERGY_J, "dram": metric.STEP_DRAM_ENERGY_J, "node": metric.STEP_NODE_ENERGY_J}
STEP_METRICS = tuple(_METRICS.values())
"""The per-step node metrics (``energy/step_cpu_J``, ``energy/step_dram_J``, ``energy/step_node_J``)."""


@dataclass(frozen=True)
class SpanFigures:
    """What a ``steps`` record says of its spans (:meth:`NodeSpans.combine`).

    Attributes:
        count: Spans combined (0: none; the figures are null, with why).
        fields: ``cpu_energy_J``, ``dram_energy_J``, ``node_energy_J`` (J or None), ``node_energy_note``,
            ``node_steps`` (steps taken in the spans) and ``node_time_s`` (their time, the slowest rank's; s).
    """

    count: int
    fields: dict[str, Any]


class NodeSpans:
    """The run's node spans: their boundaries, the attributed ones not yet in a record, the interval's sums.

    Used from the training thread only.
    """

    def __init__(self) -> None:
        self._next = 0  # the next span's number
        self._open = False
        self._done: dict[int, _Span] = {}  # attributed, not yet in a record
        self._published = 0  # spans below this number are in a record
        self._interval = _Interval()

    def boundary(self, meter: WindowMeter, reader: NodeReader | None, steps: int, *, last: bool = False) -> None:
        """Read the counters and mark one boundary: close the open span, open the next (none if ``last``: the run ends).

        ``reader``: this process's CPU/DRAM reader (None: it reads none; its GPUs still count); ``steps``:
        steps taken so far in the run.
        """
        reading = reader.read() if reader is not None else None
        token = meter.mark()
        if self._open:
            meter.end_at(SPAN_WINDOW, token, {"node_end": reading, "to_step": steps})
        self._open = not last
        if not last:
            meter.begin_at(SPAN_WINDOW, token, {"node_start": reading, "from_step": steps, "span": self._next})
            self._next += 1

    def absorb(self, record: WindowRecord, reader: NodeReader | None, no_reader: str | None) -> None:
        """Take an attributed span window: its GPU energy (whole coverage only) and CPU/DRAM difference."""
        info = record.info
        start, end = info.get("node_start"), info.get("node_end")
        node = local_node(reader, end.since(start) if start is not None and end is not None else None, no_reader)
        covered = record.covered_s is None or record.covered_s >= record.time_s - 1e-9
        gpu_J = record.energy_J if covered and record.time_s >= 0 else math.nan
        if not math.isfinite(gpu_J):
            node = LocalNode(node.columns, node.parts, "; ".join(r for r in (node.reasons, UNCOVERED) if r),
                             node.no_reader)  # fmt: skip
        steps = int(info.get("to_step", 0)) - int(info.get("from_step", 0))
        self._done[int(info["span"])] = _Span(gpu_J, node, steps, record.time_s)

    def local_row(self) -> list[float]:
        """This process's :data:`SPAN_COLUMNS`: the count of attributed spans it sends, then their blocks."""
        spans = self._ready()
        row = [float(len(spans))]
        for span in spans:
            row += SpanColumns(span.gpu_J, span.node.columns, float(span.steps), span.time_s).values()
        return row + [math.nan] * (SPAN_COLUMNS - len(row))

    def combine(self, rows: Rows) -> SpanFigures:
        """The spans every rank sent (the least count), combined over the ranks (``rows``: their span columns).

        Energy sums over the ranks (the CPU over the processes that read a node's counters), time is the
        slowest rank's.
        """
        count = int(min(row[0] for row in rows))
        if count == 0:
            fields: dict[str, Any] = {"cpu_energy_J": None, "dram_energy_J": None, "node_energy_J": None,
                      "node_energy_note": NO_SPAN, "node_steps": 0, "node_time_s": None}  # fmt: skip
            return SpanFigures(0, fields)
        gpu_J, steps, time_s = 0.0, 0, 0.0
        node_rows = []
        for row in rows:
            blocks = [SpanColumns.of(row[1 + k * _BLOCK : 1 + (k + 1) * _BLOCK]) for k in range(count)]
            gpu_J += sum(b.gpu_J for b in blocks)  # NaN (unknown) on any rank: unknown
            nodes = [b.node for b in blocks]  # a rank's spans: its reader's, one after another
            node_rows.append(NodeColumns(nodes[0].reads, sum(c.cpu_J for c in nodes), sum(c.dram_J for c in nodes),
                                         nodes[0].has_dram))  # fmt: skip
            steps = max(steps, int(sum(b.steps for b in blocks)))
            time_s = max(time_s, sum(b.time_s for b in blocks))
        fields = node_figures(gpu_J, node_rows, self._local(count))
        fields.update(node_steps=steps, node_time_s=time_s)
        return SpanFigures(count, fields)

    def publish(self, figures: SpanFigures) -> dict[str, float]:
        """The record with ``figures`` was written: its spans are done; the interval's metrics so far.

        Returns:
            ``energy/step_cpu_J``, ``energy/step_dram_J``, ``energy/step_node_J``: per step over the interval's
            spans (J per step), each only where every span of the interval knows it.
        """
        for number in range(self._published, self._published + figures.count):
            self._done.pop(number, None)
        self._published += figures.count
        interval = self._interval
        if figures.count:
            interval.steps += int(figures.fields["node_steps"])
            for part in interval.sums_J:
                value = figures.fields[f"{part}_energy_J"]
                interval.known[part] = interval.known[part] and value is not None
                interval.sums_J[part] += value or 0.0
        if not interval.steps:
            return {}
        return {_METRICS[p]: interval.sums_J[p] / interval.steps for p in interval.sums_J if interval.known[p]}

    def end_interval(self) -> None:
        """The loggers took the metrics: the next interval starts empty."""
        self._interval = _Interval()

    def _ready(self) -> list[_Span]:
        spans: list[_Span] = []
        number = self._published
        while number in self._done and len(spans) < MAX_SPANS:
            spans.append(self._done[number])
            number += 1
        return spans

    def _local(self, count: int) -> LocalNode:
        """This process's words for ``count`` spans: the parts, the reasons (each once), why it has no reader."""
        spans = self._ready()[:count]
        reasons = dict.fromkeys(r for span in spans if span.node.reasons for r in span.node.reasons.split("; "))
        first = spans[0].node
        return LocalNode(first.columns, first.parts, "; ".join(reasons), first.no_reader)
