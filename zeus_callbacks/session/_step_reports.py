"""The session's reports: closed windows attributed, their metrics queued, their JSONL records written.

:class:`StepReports` is the session's report hook (:meth:`~zeus_callbacks.session._scheduler.StepScheduler.report`):
it attributes the closed windows the samples cover (step and phase windows in bulk, as arrays; the
rare others one record each), exchanges the per-rank rows and turns them into metrics and records
(:mod:`~zeus_callbacks.session._log_records`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from zeus_callbacks import reporting as metric
from zeus_callbacks.config import ZeusConfig
from zeus_callbacks.measurement._overhead import WindowSampling
from zeus_callbacks.measurement._step_phases import PHASES
from zeus_callbacks.measurement._windows import WindowBatch, WindowRecord
from zeus_callbacks.reporting import RunSummary
from zeus_callbacks.session import _log_records as records
from zeus_callbacks.session._aggregate import RankAggregator
from zeus_callbacks.session._ledger import EpochLedger
from zeus_callbacks.session._node import local_node
from zeus_callbacks.session._node_spans import SPAN_WINDOW, STEP_METRICS, NodeSpans, SpanFigures
from zeus_callbacks.session._rank_records import (
    EpochRow,
    EvalColumns,
    RunSoFar,
    ShareVote,
    StepColumns,
    StepReportRow,
    SummaryRow,
    WarmupColumns,
)
from zeus_callbacks.session._run import StartedRun, measurement_of
from zeus_callbacks.session._scheduler import EVAL_TAIL
from zeus_callbacks.session._state import Totals

_BULK_WINDOWS = frozenset(("step", *PHASES))  # attributed and aggregated as arrays at each report


class StepReports:
    """The session's reports, what they carry from one report to the next, and the run summary.

    Args:
        config: The session's configuration.
        pending_metrics: The session's queue of metrics for the loggers (this part adds to it).
        window_observer: Called with each report's step and phase windows (the session's seam).
        degraded: Whether the measurement is degraded now (a sensor fault here or on a peer).
        power_limit_W: The limit in force now (W; None where unreadable).
        warmup_done: Warm-up steps taken so far in the run.
        sampling: Which steps the scheduler measures: under several processes each report carries this
            rank's wanted share and sets the agreed one (None: no agreement, e.g. tests of this part alone).

    Attributes:
        reports_made: Step reports made since the run began (every ``interval_steps``, epoch ends, flushes).
        ranks_totals: Several processes: (J, s) of all ranks as of the last report; None before it, or
            with one process. The energy is NaN while any rank's GPU had no sample reaching the run's start.
        last_epoch_metrics: What the last attributed epoch queued (its phases too).
        phase_summary_s: Time of the last epoch's phase superposition (s): not a step's cost.
    """

    def __init__(
        self,
        config: ZeusConfig,
        pending_metrics: dict[str, float],
        *,
        window_observer: Callable[[WindowBatch], None] | None,
        degraded: Callable[[], bool],
        power_limit_W: Callable[[], float | None],
        warmup_done: Callable[[], int],
        sampling: Callable[[], WindowSampling] | None = None,
    ) -> None:
        self._config = config
        self._pending_metrics = pending_metrics
        self._window_observer = window_observer
        self._degraded = degraded
        self._power_limit_W = power_limit_W
        self._warmup_done = warmup_done
        self._sampling = sampling
        # The run's, from begin(): its parts, totals, the totals a checkpoint carried in, the rank exchanges.
        self._run: StartedRun
        self._totals = Totals()
        self._carried = Totals()
        self._ranks: RankAggregator
        self._unreported_steps: list[WindowBatch] = []  # step windows attributed since the last step metrics
        self._unreported_warmup: list[WindowBatch] = []  # warm-up step windows attributed since then
        self._unreported_between = records.NO_STRETCH  # stretches of steps without a window attributed since then
        self._steps_logged_upto = 0  # steps (run_step order) the "steps" records stood for so far
        # The step (warm-up) columns of the reports since the last pop_metrics, summed per rank: the
        # metrics queued are the means over that whole interval, however many reports it held.
        self._interval_rows: list[StepColumns] | None = None
        self._interval_warmup: list[WarmupColumns] | None = None
        self._run_record: WindowRecord | None = None
        self.ranks_totals: tuple[float, float] | None = None
        self._epoch_sampled = (0, 0)  # (steps, measured steps) of the last ended epoch
        self.last_epoch_metrics: dict[str, float] = {}
        self.phase_summary_s = 0.0
        self._ledger = EpochLedger()  # the open epoch's windows so far (reset when its record is written)
        self._dropped_windows = 0  # impossible step windows dropped since the last steps record
        self.reports_made = 0
        self._node_spans: NodeSpans | None = None  # node.rapl / node.virtual_cpu: spans between readings
        self._node_unwritten: SpanFigures | None = None  # spans a report combined but wrote in no record
        self._held_eval: WindowRecord | None = None  # an evaluation every rank ran, until eval_exchange()

    def begin(self, run: StartedRun, totals: Totals, carried: Totals, ranks: RankAggregator) -> None:
        """At train start: the steps records go on from the carried steps; no ranks' totals yet."""
        self._run, self._totals, self._carried, self._ranks = run, totals, carried, ranks
        self._steps_logged_upto = self._carried.steps
        self.ranks_totals = None
        self.reports_made = 0
        node = self._config.node
        self._node_spans = NodeSpans() if node.rapl or node.virtual_cpu else None
        self._node_unwritten = None
        self._held_eval = None

    def epoch_ended(self, counts: tuple[int, int]) -> None:
        """An epoch ended with ``counts`` (steps, measured steps); its report comes next."""
        self._epoch_sampled = counts
        self.phase_summary_s = 0.0
        self.last_epoch_metrics = {}

    def node_span_boundary(self, *, last: bool = False) -> None:
        """Read the CPU/DRAM counters and mark a node span boundary (run start, each report, run end)."""
        if self._node_spans is not None:
            self._node_spans.boundary(self._run.meter, self._run.node, self._totals.steps, last=last)

    def report(self, resolve_final: bool, stepped: bool, active: bool) -> None:
        """Attribute closed windows and queue their metrics (:data:`~zeus_callbacks.session._scheduler.ReportHook`).

        ``resolve_final``: every closed window, even those the samples do not cover yet.
        """
        self.reports_made += 1
        if active:  # a span boundary: the CPU/DRAM counters read once per report, never per step
            self.node_span_boundary()
        elif self._run.node is not None:
            self._run.node.read_if_due()  # CPU/DRAM counters: often enough that no wrap is missed
        # An epoch's record waits for its steps: the steps record of the epoch's last steps, written
        # below, comes before the epoch record in the log (the epoch's ledger has its steps already).
        epochs: list[WindowRecord] = []
        self.attribute_closed(final=resolve_final, hold_epochs=epochs)
        power_limit_W = self._power_limit_W()
        if (stepped or self._unreported_steps) and power_limit_W is not None:
            # The limit in force, with the step metrics or without them (no step measured: windows.sample_fraction).
            self._pending_metrics[metric.POWER_LIMIT_W] = power_limit_W
        if self._unreported_steps or self._unreported_warmup or self._ranks.collective:
            self._queue_step_metrics(final=resolve_final, closed_epoch=epochs[0] if epochs else None)
        if resolve_final and self._totals.steps > self._steps_logged_upto:  # the last steps, none measured
            self._write_steps_record({}, [], self._ranks.ranks.num_processes, final=True)
        for record in epochs:
            self._absorb(record)

    def attribute_closed(self, *, final: bool = False, hold_epochs: list[WindowRecord] | None = None) -> None:
        """Attribute the closed windows the samples cover (all of them if ``final``); queue no step metrics.

        With ``hold_epochs``, epoch windows are appended there instead of being absorbed (the caller
        absorbs them once the steps before their end are written).
        """
        windows, batch = self._run.meter.resolve_bulk(_BULK_WINDOWS, final=final)
        if batch is not None:
            if self._window_observer is not None:
                self._window_observer(batch)
            self._absorb_bulk(batch)
        for record in windows:
            if hold_epochs is not None and record.name == "epoch":
                hold_epochs.append(record)
            else:
                self._absorb(record)

    def _absorb_bulk(self, batch: WindowBatch) -> None:
        """Take one report's step and phase windows (close order) into the totals and the phase tracker."""
        is_step = batch.names == "step"
        steps = batch if is_step.all() else batch.select(is_step)
        # A window that ends before it starts, or whose start time was lost (NaN), is impossible: dropped and counted.
        possible = steps.time_s >= 0
        if not possible.all():
            self._dropped_windows += int((~possible).sum())
        # A step the samples do not cover wholly has no energy (NaN) or only a part's: neither is in the means.
        covered = possible & np.isfinite(steps.energy_J) & (steps.covered_s >= steps.time_s - 1e-9)
        if not covered.all():
            steps = steps.select(covered)
        if steps.size:
            # the steps between two step windows: in the epoch ledger and in the next steps record's means
            self._add_stretches(self._ledger.stretches_between(steps), in_steps_record=True)
            warmup = np.fromiter((bool(i and i.get("warmup")) for i in steps.end_info), dtype=bool, count=steps.size)
            rest = steps
            if warmup.any():  # the run's first steps: reported apart (windows.warmup_steps)
                first = steps.select(warmup)
                self._unreported_warmup.append(first)
                self._ledger.add_steps(first, warmup=True)
                rest = steps.select(~warmup)
            if rest.size:
                self._unreported_steps.append(rest)
                self._ledger.add_steps(rest, warmup=False)
            self._totals.measured_steps += steps.size - int(warmup.sum())
        phases = self._run.phases
        if phases is not None and steps.size < batch.size:
            phases.add_batch(batch.select(~is_step))

    def _add_stretches(self, stretches: list[tuple[float, float, int]], *, in_steps_record: bool = False) -> None:
        """Attribute stretches that hold steps only and give them to the ledger (those the samples cover wholly).

        ``in_steps_record``: their steps also go into the next ``steps`` record's means (the stretches a report
        finds; those left to the epoch's end come after its records).
        """
        if not stretches:
            return
        starts, ends, _ = (np.array(column, dtype=np.float64) for column in zip(*stretches, strict=True))
        energy_J, complete = self._run.meter.span_energy_J(starts, ends)
        for stretch, energy, whole in zip(stretches, energy_J.tolist(), complete.tolist(), strict=True):
            if whole and math.isfinite(energy):
                self._ledger.add_between(stretch, energy)
                if in_steps_record:
                    self._unreported_between = self._unreported_between.plus_stretch(stretch, energy)

    def _absorb(self, record: WindowRecord) -> None:
        """Take one window other than a step or a phase (those go through :meth:`_absorb_bulk`)."""
        if record.name == "epoch":
            self._queue_epoch_metrics(record)
        elif record.name == "eval":
            self._absorb_eval(record)
        elif record.name == EVAL_TAIL:  # the epoch ledger's eval_tail: no record, no metric of its own
            if record.time_s >= 0 and math.isfinite(record.energy_J):
                self._ledger.add_eval_tail(record.start_s, record.energy_J, record.time_s)
                self._ledger.add_tail_end(record.end_s, record.info)
        elif record.name == "run":
            self._run_record = record
        elif record.name == SPAN_WINDOW:
            if self._node_spans is not None:
                self._node_spans.absorb(record, self._run.node, self._run.node_note)
        else:
            self._pending_metrics[metric.window_energy_key(record.name)] = record.energy_J
            self._run.log.write(records.window_record(record))

    def _absorb_eval(self, record: WindowRecord) -> None:
        """Take an evaluation window: held for the ranks' exchange, or written as this process's figures."""
        possible = record.time_s >= 0  # False: marks out of order, or a start time lost
        if possible and math.isfinite(record.energy_J):
            self._ledger.add_eval(record.start_s, record.energy_J, record.time_s)  # the ledger sums ranks at epoch end
        if record.info.get("every_rank"):
            self._held_eval = record  # eval_exchange() sums it over the ranks at the evaluation's end
            return
        reason = None if possible else "the evaluation window ended before it began"
        processes = self._ranks.ranks.num_processes
        if possible and processes == 1:
            self._pending_metrics[metric.EVAL_ENERGY_J] = record.energy_J
            self._pending_metrics[metric.EVAL_TIME_S] = record.time_s
        # Several processes and not known to be every rank's evaluation: in the log as this process's, no metric.
        note = records.EVAL_LOCAL_NOTE if processes > 1 else None
        self._run.log.write(records.eval_record(record, reason=reason, local_note=note))

    def eval_exchange(self) -> None:
        """At the end of an evaluation every rank ran (collective): its energy summed over the ranks, then written.

        Every rank calls it at the same evaluation's end, after attributing its window
        (``final``): a rank without a figure makes the sum unknown (null, with a reason).
        """
        held, self._held_eval = self._held_eval, None
        rows = self._ranks.exchange(records.local_eval_row(held), EvalColumns.of, degraded=self._degraded())
        combined = EvalColumns.reduce(rows)
        if held is None:
            return  # this rank had no window (windows.eval off): nothing to write
        if combined.measured:
            self._pending_metrics[metric.EVAL_ENERGY_J] = combined.energy_J
            self._pending_metrics[metric.EVAL_TIME_S] = combined.time_s
        reason = None if held.time_s >= 0 else "the evaluation window ended before it began"
        self._run.log.write(records.eval_record(held, reason=reason, ranks=combined, processes=len(rows)))

    def _queue_step_metrics(self, *, final: bool = False, closed_epoch: WindowRecord | None = None) -> None:
        # the steps from the epoch's start, and from an evaluation's tail, to the next step window, once known;
        # an epoch this report closed (its record held until after this one) starts them as the open one would
        epoch = self._run.meter.open_start("epoch")
        if epoch is None and closed_epoch is not None and math.isfinite(closed_epoch.start_s):
            epoch = (closed_epoch.start_s, dict(closed_epoch.info or {}))
        self._add_stretches(self._ledger.stretches_known_now(epoch), in_steps_record=True)
        batches, warmup, between = self._unreported_steps, self._unreported_warmup, self._unreported_between
        self._unreported_steps, self._unreported_warmup = [], []
        self._unreported_between = records.NO_STRETCH
        count = sum(b.size for b in batches)
        collective = self._ranks.collective
        sampling = self._sampling() if self._sampling is not None else None
        run = self._run
        spans = self._node_spans
        # The warm-up steps, the run so far (several processes: every rank shows the run's) and the node
        # spans travel with the steps: one exchange per report.
        local = StepReportRow(
            records.local_step_row(batches, between),
            records.local_warmup_row(warmup),
            RunSoFar(run.known_so_far_J(self._carried.energy_J), run.time_so_far_s(self._carried.time_s))
            if collective else None,
            ShareVote(sampling.wanted if sampling is not None else 1.0) if collective else None,
            tuple(spans.local_row()) if spans is not None else (),
        )  # fmt: skip
        gathered = self._ranks.exchange(
            local, lambda row: StepReportRow.of(row, so_far=collective), degraded=self._degraded()
        )
        if spans is not None:
            self._node_unwritten = spans.combine([list(row.spans) for row in gathered])
        if collective:
            so_far = RunSoFar.reduce([row.so_far for row in gathered if row.so_far is not None])
            self.ranks_totals = (so_far.energy_J, so_far.time_s)
            if sampling is not None:  # the same share on every rank from here: the same steps measured
                sampling.agree(ShareVote.reduce([row.share for row in gathered if row.share is not None]).fraction)
        warmups = [row.warmup for row in gathered]
        if any(w.steps > 0 for w in warmups):
            values = records.warmup_metrics([w for w in warmups if w.steps > 0])
            self._interval_warmup = records.merged_rows(self._interval_warmup, warmups)
            self._pending_metrics.update(records.warmup_metrics([w for w in self._interval_warmup if w.steps > 0]))
            run.log.write(records.warmup_record(values, warmup, ranks=len(gathered), degraded=self._degraded()))
        steps = [row.steps for row in gathered]
        rows = [s for s in steps if s.steps > 0]  # ranks with steps attributed this time
        if not rows:
            return
        # A rank without a measured step here (its samples lag): a figure of the others' GPUs only is not the
        # job's. Every rank sees the same rows: each keeps its steps for the next report, which then has them
        # all. At an epoch's or the run's end every window is attributed: a rank without steps measured none
        # of them, and the means are null, with the reason.
        partial = None if len(rows) == len(steps) else records.partial_ranks_reason(len(rows), len(steps))
        if partial and not final:
            self._unreported_steps[:0] = batches
            self._unreported_between = between.plus(self._unreported_between)
            return
        values = {} if partial else records.step_metrics(rows)  # this report's (the JSONL record)
        self._interval_rows = records.merged_rows(self._interval_rows, steps)
        interval = [s for s in self._interval_rows if s.steps > 0]  # queued: the interval's, once every rank has steps
        if len(interval) == len(self._interval_rows):
            self._pending_metrics.update(records.step_metrics(interval))
        between_steps = records.agreed_between_steps(rows) if values else 0
        steps_taken = self._write_steps_record(values, batches if count else [], len(gathered), final=final,
                                               partial=partial, between_steps=between_steps)  # fmt: skip
        if values:
            self._add_to_run_means(local.steps, steps_taken, stretches_used=between_steps > 0)

    def _add_to_run_means(self, mine: StepColumns, steps: int, *, stretches_used: bool) -> None:
        """Add a ``steps`` record's estimate to the run's step means (:class:`~zeus_callbacks.session._state.Totals`).

        ``mine``: this rank's part of the record; ``steps``: the steps the record stands for. This rank's
        mean step is the one the record's means sum over ranks (with the stretches between the windows
        where it used them, else each measured step weighed by 1 / its chance of being measured), and it
        counts ``steps`` times: the run's mean is the records' means weighed by their steps. A summary
        drawn from the windows alone disagreed with its own records when few steps were measured on a
        loaded machine (16.6 J against 56.6 J).
        """
        if stretches_used:
            energy_J, time_s = mine.energy_J + mine.between_J, mine.time_s + mine.between_s
            count = mine.steps + mine.between_steps
            self._totals.measured_steps += int(mine.between_steps)  # measured as stretches, not sampled
        else:
            energy_J, time_s, count = mine.weighted_J, mine.weighted_s, mine.weight
        if count <= 0 or steps <= 0:
            return
        self._totals.step_energy_J += energy_J / count * steps
        self._totals.step_time_s += time_s / count * steps
        self._totals.estimated_steps += steps

    def end_interval(self) -> None:
        """The loggers took the queued metrics: the next interval's means start from nothing."""
        self._interval_rows = self._interval_warmup = None
        if self._node_spans is not None:
            self._node_spans.end_interval()

    def _write_steps_record(
        self, values: dict[str, float], batches: list[WindowBatch], ranks: int, *, final: bool,
        partial: str | None = None, between_steps: int = 0,
    ) -> int:  # fmt: skip
        """Write the ``steps`` record (:func:`~zeus_callbacks.session._log_records.steps_record`).

        The record stands for the steps after the last record's, up to its last measured
        step (to the last step taken when ``final``: every window is attributed then), the
        warm-up steps among them counted apart. So ``energy_J_mean × steps`` pairs a mean
        with the steps it was drawn from, even when attribution lags a report behind.
        Returns the steps it stands for (``steps``: after warm-up).
        """
        lo = self._steps_logged_upto
        if final:
            upto = self._totals.steps
        elif batches:
            upto = max(int(max(b.info_values("run_step"))) for b in batches if b.size) + 1
        else:
            upto = lo
        upto = max(upto, lo)
        self._steps_logged_upto = upto
        first_warmup = self._carried.steps  # warm-up steps are the run's first ones
        warmup = max(0, min(upto, first_warmup + self._warmup_done()) - max(lo, first_warmup))
        node = self._node_figures()
        steps_taken = upto - lo - warmup
        self._run.log.write(
            records.steps_record(
                values, batches, steps_taken=steps_taken, warmup_steps=warmup,
                power_limit_W=self._power_limit_W(), ranks=ranks, degraded=self._degraded(),
                dropped_windows=self._dropped_windows, node=node.fields if node is not None else None,
                partial_reason=partial, between_steps=between_steps,
            )
        )  # fmt: skip
        self._dropped_windows = 0
        if node is not None and self._node_spans is not None:
            for key in STEP_METRICS:  # an earlier report's value in this interval: replaced, or gone if now unknown
                self._pending_metrics.pop(key, None)
            self._pending_metrics.update(self._node_spans.publish(node))
        return steps_taken

    def _node_figures(self) -> SpanFigures | None:
        """The node spans for the record being written: those the last exchange combined (None: no node option).

        With one process the spans attributed so far; under several, a record written without an exchange
        (the run's last, no step measured) takes those of the report's exchange, if it wrote no record.
        """
        spans = self._node_spans
        if spans is None:
            return None
        figures, self._node_unwritten = self._node_unwritten, None
        if figures is None and not self._ranks.collective:
            figures = spans.combine([spans.local_row()])
        return figures if figures is not None else spans.combine([[0.0]])

    def _queue_epoch_metrics(self, record: WindowRecord) -> None:
        run = self._run
        counter_J, counter_why = run.counter_energy(record.start_s, record.end_s)
        self._add_stretches(self._ledger.stretches_from_boundaries(record.info, record.start_s))
        ledger = self._ledger.row(record.start_s, record.end_s)
        self._ledger = EpochLedger()  # the next epoch's; an evaluation after this epoch's end goes there (and out)
        start, end = record.info.get("node_start"), record.info.get("node_end")  # CPU/DRAM readings (epoch_start/end)
        node = local_node(run.node, end.since(start) if start is not None and end is not None else None, run.node_note)
        rows = self._ranks.exchange(
            records.local_epoch_row(record, counter_J, ledger, node.columns), EpochRow.of, degraded=self._degraded()
        )
        epoch = record.info.get("epoch")
        e = records.epoch_energy(rows, epoch, steps_taken=self._epoch_sampled[0], node=node,
                                 counter_note_local=counter_why)  # fmt: skip
        if record.info.get("covered_from_step") is not None or record.info.get("cut_short"):
            e.metrics[metric.EPOCH_PARTIAL] = 1.0  # resumed inside it, or the run ended inside it: a part
        self._totals.epoch_energy_J.append(e.energy_J)
        self._pending_metrics.update(e.metrics)
        self.last_epoch_metrics = dict(e.metrics)
        if run.phases is not None:
            self._queue_phase_metrics(epoch, record.energy_J)
        self._run.log.write(
            records.epoch_record(epoch, e, record, degraded=self._degraded(),
                                 counter_resets=run.sampler.health.counter_resets)
        )  # fmt: skip

    def _queue_phase_metrics(self, epoch: Any, epoch_energy_J: float) -> None:
        """Per-phase energy of the epoch (this process's GPUs), from the superposed phase windows."""
        phases = self._run.phases
        assert phases is not None
        steps, measured = self._epoch_sampled
        started = time.perf_counter()
        stats = phases.epoch_summary(measured_fraction=measured / steps if measured and steps else 1.0)
        self.phase_summary_s = time.perf_counter() - started
        if not stats:
            return
        values, explained = records.phase_metrics(stats, epoch_energy_J)
        self._pending_metrics.update(values)
        self.last_epoch_metrics.update(values)
        self._run.log.write(records.phases_record(epoch, stats, explained, epoch_energy_J))

    def summary(
        self, status: str, *, chosen_power_limit: tuple[float, int, bool] | None, time_note: str | None
    ) -> RunSummary:
        """The run summary from the run window and the totals, gathered over the ranks (see ``run_summary``)."""
        run = self._run
        record = self._run_record
        t = self._totals
        counter_J, counter_why = (run.counter_energy(record.start_s, record.end_s) if record
                                  else (None, "the run's window was not measured"))  # fmt: skip
        reader = run.node  # None with both node options off: run_end's note says so, as each epoch record's does
        node = local_node(reader, reader.read() if reader is not None else None, run.node_note)
        rows = self._ranks.exchange(
            records.local_summary_row(record, counter_J, t.step_energy_J, t.step_time_s, t.estimated_steps,
                                      node.columns),
            SummaryRow.of,
            degraded=self._degraded(),
        )  # fmt: skip
        measurement, note = measurement_of(run.backend)
        expected = getattr(self._ranks.ranks, "num_processes", len(rows))
        if note is None and len(rows) < expected:
            # After a failure each rank ends alone: the total is not the run's, and must say so.
            note = (f"this process's GPUs only ({len(rows)} of {expected} ranks): the run ended after a failure "
                    "without the other ranks' figures; epoch records before it combine every rank")  # fmt: skip
        health = run.sampler.health
        resolution = run.backend.energy_counter_resolution_J if health.counter_fallback else None
        return records.run_summary(
            rows,
            measurement=measurement,
            measurement_note=note,
            counter_resets=health.counter_resets,
            energy_source="samples+counter" if health.counter_fallback else "samples",
            counter_resolution_J=resolution,
            carried_energy_J=self._carried.energy_J,
            carried_time_s=self._carried.time_s,
            carried_energy_note=self._carried.energy_note,
            carried_steps=self._carried.steps,
            carried_estimated_steps=self._carried.estimated_steps,
            run_name=run.run_name or "",
            status=status,
            backend=records.job_backend(
                run.backend, gpus=sum(len(row.gpu_energy_J) for row in rows), processes=len(rows)
            ),
            steps=t.steps,
            epochs=t.epochs,
            epoch_energy_J=list(t.epoch_energy_J),
            power_limit_W=self._power_limit_W(),
            chosen_power_limit=chosen_power_limit,
            faults=dict(run.sampler.health.faults),
            jsonl_path=str(run.log.path) if run.log.path is not None else None,
            degraded=self._degraded(),
            rejected_samples=dict(run.sampler.health.rejected),
            carbon=self._config.carbon,
            cost=self._config.cost,
            node=node,
            time_note=time_note,
            counter_note_local=counter_why,
            measured_steps=t.measured_steps,
            warmup_steps=self._warmup_done(),
        )
