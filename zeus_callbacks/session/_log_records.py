"""The JSONL records, the metrics queued for the framework's loggers, and the RunSummary.

Every record the energy log holds is a dict literal in this module with an ``"event"``
key (``docs/gen_reference.py`` reads them here to document the log), written with the
:data:`STAMPED_FIELDS` (``simulated``) added where the literal lacks them. The values are
the rank-aggregated ones (:mod:`zeus_callbacks.session._aggregate`): energy summed over
ranks, time the slowest rank's.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

from zeus_callbacks import reporting as metric
from zeus_callbacks._footprint import carbon_estimate, cost_estimate
from zeus_callbacks.backends.base import BackendError, DeviceIdentity, GPUBackend
from zeus_callbacks.config import CarbonConfig, CostConfig, ZeusConfig
from zeus_callbacks.measurement._overhead import inverse_probability_weights
from zeus_callbacks.measurement._windows import WindowBatch, WindowRecord
from zeus_callbacks.optimizers import power_limit as pl
from zeus_callbacks.reporting import NODE_OFF, RunSummary
from zeus_callbacks.session._ledger import close_ledger
from zeus_callbacks.session._node import LocalNode, node_figures
from zeus_callbacks.session._rank_records import (
    EpochColumns,
    EpochRow,
    EvalColumns,
    LedgerColumns,
    NodeColumns,
    StepColumns,
    SummaryColumns,
    SummaryRow,
    WarmupColumns,
)

logger = logging.getLogger(__name__)

_COUNTER_GAP_WARN = 0.15  # samples and counter differ by more than this share: warn
_COUNTER_GAP_MIN_S = 5.0  # ... over an epoch at least this long (s)

COUNTER_ON_ANOTHER_RANK = "unknown on another rank's GPUs (its counter gave no figure for the span)"
"""``counter_energy_note`` when this process's counters gave a figure but another rank's did not."""


def counter_note(counter_J: float, local_note: str | None) -> str | None:
    """Why a record's ``counter_energy_J`` (``counter_J``, summed over the ranks; NaN: a rank had none) is null.

    ``local_note``: why this process's counters gave no figure
    (:meth:`~zeus_callbacks.session._run.StartedRun.counter_energy`), or None.
    """
    if math.isfinite(counter_J):
        return None
    return local_note or COUNTER_ON_ANOTHER_RANK


# ------------------------------------------------------------------ every record
STAMPED_FIELDS = ("simulated",)
"""Fields every record is written with (:func:`stamped`), whether or not its literal below has them."""


def stamped(record: dict[str, Any], *, simulated: bool) -> dict[str, Any]:
    """``record`` as the log writes it: with ``simulated`` (true on the virtual GPU), so every line says so.

    A record that says it already (``run_start``, ``run_end``) is kept as it is.
    """
    return record if "simulated" in record else {**record, "simulated": simulated}


# ------------------------------------------------------------------ run records
def run_start_record(
    *,
    run_name: str,
    config: ZeusConfig,
    backend: str,
    gpu_indices: list[int],
    power_limit_W: float | None,
    read_only: bool,
    resumed_energy_J: float,
    wall_time: float,
    measurement: str = "measured",
    measurement_note: str | None = None,
    devices: Sequence[DeviceIdentity] = (),
    resumed_steps: int = 0,
    resumed_energy_note: str | None = None,
) -> dict[str, Any]:
    """The ``run_start`` record (``measurement``: ``measured``, ``simulated`` or ``unavailable``).

    ``devices`` says which device stands behind each of ``gpu_indices`` (:func:`device_identities`).
    ``resumed_energy_J`` NaN (a checkpoint without a measured energy) is written null, with
    ``resumed_energy_note`` saying why.
    """
    return {
        "event": "run_start",
        "run_name": run_name,
        "job_id": config.job_id,
        "backend": backend,
        "measurement": measurement,
        "simulated": measurement == "simulated",
        "measurement_note": measurement_note,
        "gpu_indices": gpu_indices,
        "devices": [d.as_dict() for d in devices],
        "power_limit_W": power_limit_W,
        "read_only": read_only,
        "resumed_energy_J": resumed_energy_J,
        "resumed_energy_note": resumed_energy_note,
        "resumed_steps": resumed_steps,
        "wall_time": wall_time,
        "config": config.model_dump(mode="json"),
    }


def device_identities(backend: GPUBackend, indices: Sequence[int]) -> list[DeviceIdentity]:
    """Which device stands behind each of ``indices`` (:meth:`GPUBackend.device_identity`).

    A backend that cannot say (its error, a closed backend) gives the index alone, with the reason
    in ``note``: the run starts all the same.
    """
    identities = []
    for index in indices:
        try:
            identities.append(backend.device_identity(index))
        except (BackendError, IndexError) as exc:
            note = f"the {backend.name} backend could not identify it: {exc}"
            identities.append(DeviceIdentity(index=index, backend_index=None, uuid=None, name="unknown", note=note))
    return identities


def exception_record(exc: BaseException) -> dict[str, Any]:
    """The ``exception`` record of a failed or interrupted run (message cut at 500 characters)."""
    return {"event": "exception", "type": type(exc).__name__, "message": str(exc)[:500]}


FAILURE_REASON_CHARS = 120
"""The longest failure reason a failed trial keeps (``info["error"]``), in characters."""


def exception_in_short(record: Mapping[str, Any]) -> str:
    """A failed run's exception in short, for its trial: ``Type: first line of the message``, cut to 120 characters.

    ``record`` is an :func:`exception_record`. What pruning prints as ``(last: ...)``.
    """
    lines = [line.strip() for line in str(record.get("message", "")).splitlines() if line.strip()]
    reason = f"{record['type']}: {lines[0]}" if lines else str(record["type"])
    return reason if len(reason) <= FAILURE_REASON_CHARS else reason[: FAILURE_REASON_CHARS - 3] + "..."


def run_end_record(summary: RunSummary) -> dict[str, Any]:
    """The ``run_end`` record: the summary's fields."""
    return {"event": "run_end", **summary.as_dict()}


def evaluate_record(step: int, metrics: dict[str, float]) -> dict[str, Any]:
    """The ``evaluate`` record: the framework's numeric validation metrics at ``step``."""
    return {"event": "evaluate", "step": step, "metrics": metrics}


EVAL_LOCAL_NOTE = (
    "this process's GPUs only: the session cannot know that every rank ran this evaluation (only the "
    "Lightning and Hugging Face trainers' own evaluations are known to), so its energy is not summed over the ranks"
)
"""``ranks_note`` of an ``eval`` record under several processes whose figures are this process's only."""


def eval_record(
    record: WindowRecord,
    *,
    reason: str | None = None,
    ranks: EvalColumns | None = None,
    processes: int = 1,
    local_note: str | None = None,
) -> dict[str, Any]:
    """The ``eval`` record of one evaluation window; ``step``: training steps taken before it began.

    ``dataset`` names the evaluation dataset when the framework named it (the HF Trainer's
    ``eval_dataset={"a": ...}``: ``"a"``); null for a single unnamed dataset (the HF default, a
    Lightning validation loop with all its dataloaders). With ``reason`` (an impossible window)
    its figures are null and it is not ``complete``.

    ``ranks``: the ranks' windows combined (:class:`~zeus_callbacks.session._rank_records.EvalColumns`
    reduced over ``processes`` ranks): energy summed over every GPU, time the slowest rank's; null figures
    when a rank has none. None: this process's window alone; under several processes ``local_note`` then
    says why (``ranks`` is 1 in the record).
    """
    known = reason is None
    energy_J, time_s, complete = record.energy_J, record.time_s, bool(record.complete)
    if ranks is not None:
        known = known and bool(ranks.measured)
        if reason is None and not known:
            reason = "a rank has no figure for this evaluation (its window was impossible or not measured)"
        energy_J, time_s, complete = ranks.energy_J, ranks.time_s, bool(ranks.complete)
    return {
        "event": "eval",
        "step": record.info.get("step"),
        "dataset": record.info.get("dataset"),
        "energy_J": energy_J if known else None,
        "time_s": time_s if known else None,
        "complete": complete and known,
        "incomplete_reason": reason,
        "ranks": processes if ranks is not None else 1,
        "ranks_note": local_note if ranks is None else None,
    }


def local_eval_row(record: WindowRecord | None) -> EvalColumns:
    """This rank's evaluation window as the columns every rank sends (:class:`EvalColumns`; None: none measured)."""
    if record is None or not record.time_s >= 0 or not math.isfinite(record.energy_J):
        return EvalColumns(0.0, 0.0, 0.0, 0.0)  # nothing this rank can add: the sum is unknown
    return EvalColumns(record.energy_J, record.time_s, 1.0, 1.0 if record.complete else 0.0)


def window_record(record: WindowRecord) -> dict[str, Any]:
    """The ``window`` record of one user window."""
    return {"event": "window", "name": record.name, "energy_J": record.energy_J, "time_s": record.time_s}


# ------------------------------------------------------------------ optimisers
def batch_size_record(controller: Any, *, store_open_s: float | None = None) -> dict[str, Any]:
    """The ``batch_size`` record: the bandit's choice for this recurrence.

    ``store_open_s``: how long the run's start spent on the store before the run window opened (s),
    a wait for a lock included; it is in neither the run's time nor the trial's cost.
    """
    c = controller
    return {"event": "batch_size", "trial_id": c.trial_id, "batch_size": c.batch_size, "phase": c.phase,
            "threshold_cost": c.threshold, "store_open_s": store_open_s}  # fmt: skip


def trial_record(t: Any) -> dict[str, Any]:
    """The ``trial`` record: the recurrence's trial as the store keeps it."""
    return {"event": "trial", "trial_id": t.trial_id, "batch_size": t.batch_size, "status": t.status,
            "converged": t.converged, "cost": t.cost, "stop_reason": t.info.get("stop_reason")}  # fmt: skip


def power_limit_profile_record(
    step: int,
    result: pl.PowerLimitResult,
    original_W: Any,
    *,
    time_note: str | None = None,
    job_steps: int | None = None,
    job_steps_source: str | None = None,
) -> dict[str, Any]:
    """The ``power_limit_profile`` record: the profiler's result (finished or not).

    ``time_note``: why its times are not real (the virtual GPU on the real clock,
    :func:`~zeus_callbacks.optimizers.power_limit._time_note.time_note`), or None.
    ``job_steps``: the job length (training steps) the search was told, and ``job_steps_source``
    where it came from (``config``, ``trainer`` or ``train_start``); both None when unknown.
    """
    return {
        "event": "power_limit_profile",
        "step": step,
        "source": result.source,
        "objective": result.objective,
        "chosen_limit_W": result.chosen_limit_W,
        "original_limit_W": original_W,
        "profiling_steps": result.profiling_steps,
        "job_steps": job_steps,
        "job_steps_source": job_steps_source,
        "fallback_sweep": result.fallback_sweep,
        "limits": result.rows,
        "finished": result.finished,
        "limits_measured": result.limits_measured,
        "message": result.message,
        "time_note": time_note,
    }


# ------------------------------------------------------------------------ steps
class Stretches(NamedTuple):
    """Steps without a window, measured as the stretches that hold them (the epoch ledger's ``between``).

    A stretch runs between two step windows, or from the epoch's start or an evaluation tail's end to the
    next step window, with nothing but steps in it.

    Attributes:
        energy_J: The stretches' energy (J, this process's GPUs).
        time_s: Their time (s).
        steps: The steps they hold.
    """

    energy_J: float = 0.0
    time_s: float = 0.0
    steps: int = 0

    def plus_stretch(self, stretch: tuple[float, float, int], energy_J: float) -> Stretches:
        """These and one more stretch, ``(start_s, end_s, steps)`` holding ``energy_J`` (J)."""
        start_s, end_s, steps = stretch
        return Stretches(self.energy_J + energy_J, self.time_s + (end_s - start_s), self.steps + steps)

    def plus(self, other: Stretches) -> Stretches:
        """These and ``other``'s."""
        return Stretches(self.energy_J + other.energy_J, self.time_s + other.time_s, self.steps + other.steps)


NO_STRETCH = Stretches()


def local_step_row(batches: Sequence[WindowBatch], between: Stretches = NO_STRETCH) -> StepColumns:
    """This rank's measured steps: energy (J), time (s), count, samples, tokens, power samples.

    Samples (tokens) are NaN unless every step reported them. ``between``: the steps between those
    windows, measured as stretches (:class:`Stretches`).
    """
    count = sum(b.size for b in batches)
    samples = [v for b in batches for v in b.info_values("num_samples")]
    tokens = [v for b in batches for v in b.info_values("num_tokens")]
    energy_J = sum(float(b.energy_J.sum()) for b in batches)
    time_s = sum(float(b.time_s.sum()) for b in batches)
    weighted_J, weighted_s, weight = energy_J, time_s, float(count)  # every step measured: the plain sums
    weights = [inverse_probability_weights(b.end_info) for b in batches]
    if any((w != 1.0).any() for w in weights):  # sampled steps: each weighs 1 / its chance of being measured
        weighted_J = sum(float(w @ b.energy_J) for w, b in zip(weights, batches, strict=True))
        weighted_s = sum(float(w @ b.time_s) for w, b in zip(weights, batches, strict=True))
        weight = sum(float(w.sum()) for w in weights)
    return StepColumns(
        energy_J=energy_J,
        time_s=time_s,
        steps=float(count),
        samples=float(sum(samples)) if count and all(samples) else math.nan,
        tokens=float(sum(tokens)) if count and all(tokens) else math.nan,
        power_samples=float(sum(int(b.num_power_samples.sum()) for b in batches)),
        weighted_J=weighted_J,
        weighted_s=weighted_s,
        weight=weight,
        between_J=between.energy_J,
        between_s=between.time_s,
        between_steps=float(between.steps),
    )


C = TypeVar("C", StepColumns, WarmupColumns)


def merged_rows(earlier: list[C] | None, rows: list[C]) -> list[C]:
    """One interval's records from two reports' (:func:`local_step_row`, :func:`local_warmup_row`): summed per rank.

    A rank with no step in one of the reports takes the other's record as it is (its NaN sample
    count is no part of the sum). ``earlier`` None, or of another rank count (the ranks stopped
    exchanging after a failure): the interval starts with ``rows``.
    """
    if earlier is None or len(earlier) != len(rows):
        return list(rows)
    return [old.plus(new) for old, new in zip(earlier, rows, strict=True)]


def agreed_between_steps(rows: Sequence[StepColumns]) -> int:
    """The steps measured as stretches between step windows that every rank's row holds; 0 when the ranks differ.

    A rank whose samples missed a stretch would leave its energy out of the sum over the ranks while the
    others count its steps: then no rank's stretches are used (the epoch ledger's rule).
    """
    counts = {r.between_steps for r in rows}
    return int(counts.pop()) if len(counts) == 1 else 0


def step_metrics(rows: Sequence[StepColumns]) -> dict[str, float]:
    """Per-step means from the ranks' measured steps (:func:`local_step_row`), ranks with steps only.

    One rank's record per GPU group; combined per step: energy and power sum over ranks,
    time is the slowest rank's. Where every rank measured the same stretches between its step windows
    (:func:`agreed_between_steps`), the means are over the steps with a window and those between:
    every step from the first window to the last, each measured once, so no step stands for another.
    Otherwise over the steps with a window, each weighed by 1 / its chance of being measured.
    """
    between = agreed_between_steps(rows)
    if between:
        step_J = sum((r.energy_J + r.between_J) / (r.steps + r.between_steps) for r in rows)
        step_s = max((r.time_s + r.between_s) / (r.steps + r.between_steps) for r in rows)
        power_W = sum((r.energy_J + r.between_J) / (r.time_s + r.between_s) for r in rows if r.time_s > 0)
    else:
        # Each step weighed by 1 / its chance of being measured (StepColumns.weight): auto sampling measures a
        # larger share of a loaded machine's slow stretches, and a plain mean would overstate the step.
        step_J = sum(r.weighted_J / r.weight for r in rows)
        step_s = max(r.weighted_s / r.weight for r in rows)
        power_W = sum(r.energy_J / r.time_s for r in rows if r.time_s > 0)
    samples_per_step = sum(r.samples / r.steps for r in rows)
    tokens_per_step = sum(r.tokens / r.steps for r in rows)
    combined = StepColumns.reduce(rows)
    values = {
        metric.STEP_ENERGY_J: step_J,
        metric.STEP_COUNT: combined.steps + between,
        metric.STEP_POWER_SAMPLES: combined.power_samples,
        metric.STEP_TIME_S: step_s,
        metric.MEAN_POWER_W: power_W,
    }
    if math.isfinite(samples_per_step) and samples_per_step > 0:
        values[metric.ENERGY_PER_SAMPLE_J] = step_J / samples_per_step
    if math.isfinite(tokens_per_step) and tokens_per_step > 0:
        values[metric.ENERGY_PER_TOKEN_J] = step_J / tokens_per_step
    return values


def partial_ranks_reason(with_steps: int, ranks: int) -> str:
    """``incomplete_reason`` of a ``steps`` record whose means are null: only some ranks measured steps."""
    return (f"only {with_steps} of {ranks} ranks had measured steps in this report: their mean would be "
            "a figure of part of the job's GPUs, so it is left out")  # fmt: skip


DROPPED_STEPS = "a step window ended before it began or lost its start time (boundary marks out of order)"
"""``incomplete_reason`` of a ``steps`` record that dropped impossible windows."""

NO_STEP_MEASURED = (
    "none of these steps was measured (windows.sample_fraction measures a share of the steps, and a step "
    "the power samples did not cover wholly has no energy): the means are null and nothing is scaled"
)
"""``incomplete_reason`` of a ``steps`` record that stands for steps of which none was measured."""

ONLY_WARMUP_STEPS = "no step besides warm-up steps (in the warmup record, not in this record's means)"
"""``incomplete_reason`` of a ``steps`` record that stands for warm-up steps only."""


def steps_record(
    values: Mapping[str, float],
    batches: Sequence[WindowBatch],
    *,
    steps_taken: int,
    power_limit_W: float | None,
    ranks: int,
    degraded: bool,
    warmup_steps: int = 0,
    dropped_windows: int = 0,
    node: Mapping[str, Any] | None = None,
    partial_reason: str | None = None,
    between_steps: int = 0,
) -> dict[str, Any]:
    """The ``steps`` record: the means in ``values`` (empty: no step measured) and the steps they stand for.

    The means are over ``count`` steps with a window and ``between_steps`` steps between two of them,
    measured as the stretches that hold them (:func:`step_metrics`).

    ``steps`` counts the steps taken since the last record other than warm-up steps
    (``warmup_steps`` of them, reported in the ``warmup`` record): ``energy_J_mean ×
    steps`` is the estimate of those steps' energy, and it is null when none of them was
    measured (no step's energy is scaled to steps it does not stand for).
    ``dropped_windows`` impossible windows (ending before they began) are in no mean; the
    record is then not ``complete`` and ``incomplete_reason`` says why.
    ``node``: the :class:`~zeus_callbacks.session._node_spans.SpanFigures` fields of the spans the record
    holds; None: no node option is on. ``partial_reason``: why the means are null though some rank
    measured steps (:func:`partial_ranks_reason`).
    """
    node = node or {"node_energy_note": NODE_OFF}
    reason = partial_reason or (DROPPED_STEPS if dropped_windows else None)
    if reason is None and not values:  # no step measured
        reason = NO_STEP_MEASURED if steps_taken else ONLY_WARMUP_STEPS
    return {
        "event": "steps",
        "last_step": batches[-1].info(-1).get("step") if batches else None,
        "count": int(values.get(metric.STEP_COUNT, 0)) - between_steps,
        "between_steps": between_steps,
        "steps": steps_taken,
        "warmup_steps": warmup_steps,
        "energy_J_mean": values.get(metric.STEP_ENERGY_J),
        "time_s_mean": values.get(metric.STEP_TIME_S),
        "power_W_mean": values.get(metric.MEAN_POWER_W),
        "energy_J_per_sample": values.get(metric.ENERGY_PER_SAMPLE_J),
        "energy_J_per_token": values.get(metric.ENERGY_PER_TOKEN_J),
        "power_samples": int(values.get(metric.STEP_POWER_SAMPLES, 0)),
        "complete": all(bool(b.complete.all()) for b in batches) and reason is None,
        "dropped_windows": dropped_windows,
        "incomplete_reason": reason,
        "power_limit_W": power_limit_W,
        "cpu_energy_J": node.get("cpu_energy_J"),
        "dram_energy_J": node.get("dram_energy_J"),
        "node_energy_J": node.get("node_energy_J"),
        "node_energy_note": node.get("node_energy_note"),
        "node_steps": node.get("node_steps", 0),
        "node_time_s": node.get("node_time_s"),
        "ranks": ranks,
        "degraded": degraded,
    }


def local_warmup_row(batches: Sequence[WindowBatch]) -> WarmupColumns:
    """This rank's warm-up steps: energy (J), time (s), count."""
    return WarmupColumns(
        energy_J=sum(float(b.energy_J.sum()) for b in batches),
        time_s=sum(float(b.time_s.sum()) for b in batches),
        steps=float(sum(b.size for b in batches)),
    )


def warmup_metrics(rows: Sequence[WarmupColumns]) -> dict[str, float]:
    """The warm-up steps over the ranks that had some (:func:`local_warmup_row`): energy summed, time the slowest."""
    combined = WarmupColumns.reduce(rows)
    return {metric.WARMUP_ENERGY_J: combined.energy_J, metric.WARMUP_TIME_S: combined.time_s}


def warmup_record(
    values: Mapping[str, float], batches: Sequence[WindowBatch], *, ranks: int, degraded: bool
) -> dict[str, Any]:
    """The ``warmup`` record: the run's warm-up steps (``windows.warmup_steps``), measured and kept apart.

    ``energy_J`` and ``time_s`` are totals over the warm-up steps attributed since the last
    such record (energy over every rank, the slowest rank's time); ``step_energy_J`` and
    ``step_time_s`` list this process's steps one by one.
    """
    return {
        "event": "warmup",
        "steps": [s for b in batches for s in b.info_values("step")],
        "energy_J": values.get(metric.WARMUP_ENERGY_J),
        "time_s": values.get(metric.WARMUP_TIME_S),
        "step_energy_J": [float(e) for b in batches for e in b.energy_J],
        "step_time_s": [float(t) for b in batches for t in b.time_s],
        "complete": all(bool(b.complete.all()) for b in batches),
        "ranks": ranks,
        "degraded": degraded,
    }


# ------------------------------------------------------------------------ epochs
def local_epoch_row(
    record: WindowRecord, counter_J: float | None, ledger: LedgerColumns, node: NodeColumns
) -> EpochRow:
    """This rank's epoch row: its window's figures, ``EpochLedger.row``'s ledger, ``LocalNode.columns``."""
    counter = math.nan if counter_J is None else counter_J
    epoch = EpochColumns(record.energy_J, record.time_s, counter)
    return EpochRow(epoch, ledger, node, tuple(record.gpu_energy_J))


@dataclasses.dataclass(frozen=True)
class EpochEnergy:
    """One epoch over every rank.

    Attributes:
        energy_J: Energy of all GPUs (J).
        time_s: The slowest rank's time (s).
        counter_J: Energy from the energy counters (J; NaN when a GPU has none).
        counter_note: Why ``counter_J`` is NaN (:func:`counter_note`); None when it is known.
        gpu_energy_J: Each GPU's energy, rank order (J).
        ranks: Ranks that took part.
        metrics: The epoch metrics to queue.
        ledger: The epoch's ledger (:func:`~zeus_callbacks.session._ledger.close_ledger`).
        node: ``cpu_energy_J``, ``dram_energy_J``, ``node_energy_J`` and ``node_energy_note``
            (:func:`~zeus_callbacks.session._node.node_figures`).
    """

    energy_J: float
    time_s: float
    counter_J: float
    gpu_energy_J: list[float]
    ranks: int
    metrics: dict[str, float]
    ledger: dict[str, Any]
    node: dict[str, Any]
    counter_note: str | None = None


def epoch_energy(
    rows: Sequence[EpochRow], epoch: Any, *, steps_taken: int, node: LocalNode, counter_note_local: str | None = None
) -> EpochEnergy:
    """Combine the ranks' epochs (:func:`local_epoch_row`); warn when samples and counter disagree.

    The ledger's energy columns are summed over the ranks; its times and counts are the
    slowest rank's, the rank whose time is the epoch's. The node figures add the CPU and DRAM
    energy of the processes that read them to the GPUs' (``node``: this process's part).
    ``counter_note_local``: why this process's counters gave no figure (:func:`counter_note`).
    """
    combined = EpochColumns.reduce([row.epoch for row in rows])
    energy_J, time_s, counter_J = combined.energy_J, combined.time_s, combined.counter_J
    gpu_energy_J = [e for row in rows for e in row.gpu_energy_J]
    slowest = max(range(len(rows)), key=lambda i: rows[i].epoch.time_s)  # the ledger's times are its
    ledger_row = LedgerColumns.reduce([row.ledger for row in rows], slowest=slowest)
    ledger = close_ledger(energy_J, time_s, ledger_row, steps_taken=steps_taken)
    figures = node_figures(energy_J, [row.node for row in rows], node)
    values = {
        metric.EPOCH_ENERGY_J: energy_J,
        metric.EPOCH_TIME_S: time_s,
        metric.EPOCH_MEAN_POWER_W: energy_J / time_s if time_s > 0 else math.nan,
    }
    for key, field in ((metric.EPOCH_CPU_ENERGY_J, "cpu_energy_J"), (metric.EPOCH_DRAM_ENERGY_J, "dram_energy_J"),
                       (metric.EPOCH_NODE_ENERGY_J, "node_energy_J")):  # fmt: skip
        if figures[field] is not None:  # unknown: not logged (the record says why)
            values[key] = figures[field]
    if ledger["other_J"] is not None:
        values[metric.EPOCH_OTHER_J] = ledger["other_J"]
    if len(gpu_energy_J) > 1:
        values.update({metric.gpu_energy_key(i): e for i, e in enumerate(gpu_energy_J)})
    if math.isfinite(counter_J):
        values[metric.EPOCH_COUNTER_ENERGY_J] = counter_J
        gap = abs(counter_J - energy_J) / max(counter_J, 1e-9)
        if time_s >= _COUNTER_GAP_MIN_S and gap > _COUNTER_GAP_WARN:
            logger.warning(
                "zeus-callbacks: epoch %s energy from power samples (%.1f J) and from the energy "
                "counter (%.1f J) differ by %.0f%%",
                epoch,
                energy_J,
                counter_J,
                100 * gap,
            )
    return EpochEnergy(energy_J, time_s, counter_J, gpu_energy_J, len(rows), values, ledger, figures,
                       counter_note(counter_J, counter_note_local))  # fmt: skip


def epoch_record(
    epoch: Any, e: EpochEnergy, record: WindowRecord, *, degraded: bool, counter_resets: int = 0
) -> dict[str, Any]:
    """The ``epoch`` record (``energy_J`` null when no sample covers it, ``covered_s`` the part they do).

    An epoch the run resumed inside (from a checkpoint saved after some of its steps) is not
    ``complete``: ``resumed_mid_epoch`` says why, ``covered_from_step`` where its figures begin. An epoch the
    run ended inside (``max_steps``, an interruption, a failure) is ``cut_short``: its figures are its steps'.
    ``ledger`` splits the epoch into warm-up, steps, evaluations and other
    (:mod:`zeus_callbacks.session._ledger`); the node fields add the CPU and DRAM energy between the
    epoch's start and end readings (:mod:`zeus_callbacks.session._node`).
    """
    covered_from = record.info.get("covered_from_step")
    return {
        "event": "epoch",
        "epoch": epoch,
        "end_step": record.info.get("end_step"),
        "energy_J": e.energy_J,
        "counter_energy_J": e.counter_J if math.isfinite(e.counter_J) else None,
        "counter_energy_note": e.counter_note,
        "time_s": e.time_s,
        "power_W_mean": e.metrics[metric.EPOCH_MEAN_POWER_W],
        "gpu_energy_J": e.gpu_energy_J,
        "power_samples": record.num_power_samples,
        "complete": record.complete and covered_from is None,
        "covered_s": record.covered_s,
        "resumed_mid_epoch": covered_from is not None,
        "covered_from_step": covered_from,
        "cut_short": bool(record.info.get("cut_short")),
        "counter_resets": counter_resets,
        "ledger": e.ledger,
        "cpu_energy_J": e.node["cpu_energy_J"],
        "dram_energy_J": e.node["dram_energy_J"],
        "node_energy_J": e.node["node_energy_J"],
        "node_energy_note": e.node["node_energy_note"],
        "ranks": e.ranks,
        "degraded": degraded,
    }


def phase_metrics(stats: Sequence[Any], epoch_energy_J: float) -> tuple[dict[str, float], float]:
    """The per-phase metrics of an epoch and the share of the epoch's energy they explain."""
    resolved = [p for p in stats if p.total_J is not None]
    explained = sum(p.total_J for p in resolved) / epoch_energy_J if epoch_energy_J > 0 else math.nan
    values: dict[str, float] = {}
    for p in stats:
        if p.total_J is not None:  # an unresolved phase (unresolved_reason) logs its count only: no figure
            values[metric.phase_key(p.name)] = p.energy_J
            values[metric.phase_key(p.name, "ci_low")] = p.energy_ci_J[0]
            values[metric.phase_key(p.name, "ci_high")] = p.energy_ci_J[1]
        values[metric.phase_key(p.name, "count")] = float(p.executions)
    values[metric.PHASES_EXPLAINED] = explained
    return values, explained


def phases_record(epoch: Any, stats: Sequence[Any], explained: float, epoch_energy_J: float) -> dict[str, Any]:
    """The ``phases`` record: per-phase energy of the epoch (this process's GPUs)."""
    return {
        "event": "phases",
        "epoch": epoch,
        "phases": [dataclasses.asdict(p) for p in stats],
        "explained": explained,
        "epoch_energy_J": epoch_energy_J,
    }


# ------------------------------------------------------------------------ summary
NO_SAMPLE_NOTE = "no power sample covered the run: it ended within the sensor's first sample period"
"""``energy_note`` of a run no power sample covered (its window's energy is NaN, never 0 J)."""


def local_summary_row(run: WindowRecord | None, counter_J: float | None, step_energy_J: float,
                      step_time_s: float, estimated_steps: float, node: NodeColumns) -> SummaryRow:  # fmt: skip
    """This rank's summary row; the step means are the estimates over ``estimated_steps`` steps (NaN: none).

    ``step_energy_J``, ``step_time_s`` and ``estimated_steps`` are the :class:`~zeus_callbacks.session._state.Totals`'.
    """
    figures = SummaryColumns(
        energy_J=run.energy_J if run else 0.0,
        time_s=run.time_s if run else 0.0,
        counter_J=math.nan if counter_J is None else counter_J,
        step_energy_J=step_energy_J / estimated_steps if estimated_steps else math.nan,
        step_time_s=step_time_s / estimated_steps if estimated_steps else math.nan,
        covered_s=(run.covered_s if run.covered_s is not None else run.time_s) if run else 0.0,
    )
    return SummaryRow(figures, node, tuple(run.gpu_energy_J) if run else ())


def job_backend(backend: GPUBackend, *, gpus: int, processes: int) -> str:
    """The backend line of a run's summary: the job's GPUs (every rank's measured ones) under several processes.

    ``backend.describe()`` counts the GPUs this process sees; the job's count is ``gpus``, those
    whose energy the summary holds (``gpu_energy_J``), over ``processes`` ranks.
    """
    if processes <= 1:
        return backend.describe()
    names = sorted({backend.device_name(i) for i in range(backend.device_count())})
    return f"{backend.name}: {gpus} GPU(s) over {processes} processes (this process's: {', '.join(names)})"


def step_means_within_run(
    step_energy_J: float, step_time_s: float, energy_J: float, time_s: float, steps: float
) -> tuple[float, float]:
    """A sample's step means, held to what the run holds: ``× steps``, at most the run's energy and time.

    The steps after warm-up run inside the run, in windows that do not overlap, so their energy and
    time are at most the run's. The 1/p-weighted means of a sample of them (``windows.sample_fraction``)
    are estimates: a few slow steps drawn by chance can lift them past that, and the summary then
    claimed more time for its steps than the whole run took (an outside tester: 90 steps × 58.3 ms
    beside a 4.735 s run). Both means are scaled by one factor, the least that meets both bounds, so
    the steps' mean power (energy over time) stays the sample's. A mean of every step is never
    changed: it meets both bounds.

    Args:
        step_energy_J: The sample's mean energy per step (J; NaN: none).
        step_time_s: The sample's mean time per step (s; NaN: none).
        energy_J: The run's energy (J).
        time_s: The run's time (s).
        steps: The steps the means stand for (:func:`steps_behind_means`): the run's, warm-up steps left
            out, and of a checkpoint's steps only those its means stand for.

    Returns:
        ``(step_energy_J, step_time_s)``, each × ``min(1, energy_J / (steps × step_energy_J),
        time_s / (steps × step_time_s))`` over the bounds that are known (finite and positive).
    """
    factor = 1.0
    for mean, total in ((step_energy_J, energy_J), (step_time_s, time_s)):
        if steps > 0 and math.isfinite(mean) and mean > 0 and math.isfinite(total):
            factor = min(factor, total / (steps * mean))
    return step_energy_J * factor, step_time_s * factor


def steps_behind_means(steps: int, warmup_steps: int, carried_steps: int, carried_estimated_steps: float) -> float:
    """The steps a run's step means stand for: this process's run's after its warm-up, and the checkpoint's.

    A resumed run's means combine the checkpoint's sums (over its ``estimated_steps``) with its own. The
    checkpoint's other steps (its warm-up ones, those no sample covered before it was saved, those
    measured after its last report) are in no mean: counted at the mean, they scaled a right mean down
    (3 ms steps before a checkpoint no sample covered, 50 ms steps after: by 4 to 10 %).

    Args:
        steps: The run's steps, the checkpoint's included.
        warmup_steps: This run's warm-up steps.
        carried_steps: The checkpoint's steps (0: a fresh run).
        carried_estimated_steps: The steps the checkpoint's step sums stand for (``Totals.estimated_steps``).

    Returns:
        ``steps − carried_steps − warmup_steps + carried_estimated_steps`` (at least 0).
    """
    return max(0.0, steps - carried_steps - warmup_steps + carried_estimated_steps)


def run_summary(
    rows: Sequence[SummaryRow],
    *,
    carried_energy_J: float,
    carried_time_s: float,
    run_name: str,
    status: str,
    backend: str,
    steps: int,
    epochs: int,
    epoch_energy_J: list[float],
    power_limit_W: float | None,
    faults: dict[str, int],
    jsonl_path: str | None,
    degraded: bool,
    chosen_power_limit: tuple[float, int, bool] | None = None,
    rejected_samples: dict[str, int] | None = None,
    measurement: str = "measured",
    measurement_note: str | None = None,
    counter_resets: int = 0,
    energy_source: str = "samples",
    counter_resolution_J: float | None = None,
    carbon: CarbonConfig | None = None,
    cost: CostConfig | None = None,
    node: LocalNode | None = None,
    time_note: str | None = None,
    counter_note_local: str | None = None,
    measured_steps: int | None = None,
    warmup_steps: int = 0,
    carried_energy_note: str | None = None,
    carried_steps: int = 0,
    carried_estimated_steps: float = 0.0,
) -> RunSummary:
    """The run summary from the ranks' summary columns (:func:`local_summary_row`).

    ``chosen_power_limit``: the profiler's (or the cache's) choice as (W, the step it is in force
    from, whether it was applied: False in observe mode), or None when no limit was chosen.
    ``carbon`` / ``cost``: the configuration's sections; the CO2 and cost estimates are made from the
    node's energy where it is known, else from the GPUs' (their ``energy_basis`` says which).
    ``node``: this process's part of the node figures (:func:`~zeus_callbacks.session._node.node_figures`);
    None: no node option is on. ``time_note``: why power-limit results do not show the time a limit
    costs (the virtual GPU on the real clock), or None. ``warmup_steps``: this run's warm-up steps, left
    out of the step means (:func:`step_means_within_run` holds those to the run's totals).
    ``carried_steps`` / ``carried_estimated_steps``: a checkpoint's steps and those its step sums stand
    for (:func:`steps_behind_means`).
    ``carried_energy_J`` NaN: the checkpoint's energy was not measured (``carried_energy_note`` says why),
    so the run's energy and its counter cross-check are unknown, with that note in ``energy_note``.
    """
    chosen_W, chosen_step, applied = chosen_power_limit or (None, None, False)
    runs = [row.run for row in rows]
    combined = SummaryColumns.reduce(runs) if runs else SummaryColumns()
    energy_J = carried_energy_J + combined.energy_J
    time_s = carried_time_s + combined.time_s
    counter_J = combined.counter_J
    shares = [r.covered_s / r.time_s if r.time_s > 0 else 1.0 for r in runs]
    coverage = min(1.0, min(shares)) if runs and measurement != "unavailable" else 0.0
    complete = all(r.covered_s >= r.time_s - 1e-9 for r in runs) and measurement != "unavailable"
    energy_note = carried_energy_note if not math.isfinite(carried_energy_J) else None
    if measurement == "unavailable":
        energy_J = math.nan
    mean_steps = steps_behind_means(steps, warmup_steps, carried_steps, carried_estimated_steps)
    step_energy_J, step_time_s = step_means_within_run(
        combined.step_energy_J, combined.step_time_s, energy_J, time_s, mean_steps
    )
    unknown = f"the run's energy is unknown ({measurement_note or energy_note or 'measurement unavailable'})"
    node_fields = (
        node_figures(energy_J, [row.node for row in rows], node, carried_energy_J=carried_energy_J)
        if node is not None
        else {}
    )
    node_J = node_fields.get("node_energy_J")
    basis, basis_J = ("node", node_J) if node_J is not None and math.isfinite(node_J) else ("gpu", energy_J)
    return RunSummary(
        run_name=run_name,
        status=status,
        backend=backend,
        energy_J=energy_J,
        time_s=time_s,
        steps=steps,
        epochs=epochs,
        mean_power_W=energy_J / time_s if time_s > 0 else math.nan,
        step_energy_J=step_energy_J,
        step_time_s=step_time_s,
        measured_steps=measured_steps,
        epoch_energy_J=epoch_energy_J,
        power_limit_W=power_limit_W,
        chosen_power_limit_W=chosen_W,
        power_limit_from_step=chosen_step,
        power_limit_applied=applied,
        counter_energy_J=carried_energy_J + counter_J if math.isfinite(counter_J) and energy_note is None else None,
        counter_energy_note=counter_note(counter_J, counter_note_local) or energy_note,
        energy_note=energy_note or (NO_SAMPLE_NOTE if math.isnan(energy_J) and measurement != "unavailable" else None),
        faults=faults,
        jsonl_path=jsonl_path,
        world_size=len(rows),
        gpu_energy_J=[e for row in rows for e in row.gpu_energy_J],
        degraded=degraded,
        rejected_samples=dict(rejected_samples or {}),
        measurement=measurement,
        simulated=measurement == "simulated",
        measurement_note=measurement_note,
        time_note=time_note,
        coverage=coverage,
        complete=complete,
        counter_resets=counter_resets,
        energy_source=energy_source,
        counter_resolution_J=counter_resolution_J,
        carbon=carbon_estimate(basis_J, carbon, unknown_reason=unknown, basis=basis) if carbon is not None else None,
        cost=cost_estimate(basis_J, cost, unknown_reason=unknown, basis=basis) if cost is not None else None,
        **node_fields,
    )
