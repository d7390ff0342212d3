"""Named records that cross ranks: each field declares how it combines over the ranks.

A report exchanges one row of numbers per rank (:class:`~zeus_callbacks.session._aggregate.RankAggregator`).
The records here name those numbers: a frozen dataclass per record, each field with its :data:`Reduction`
beside it, as torchmetrics declares a state's ``dist_reduce_fx``. The rows a report sends
(:class:`StepReportRow`, :class:`EpochRow`, :class:`SummaryRow`) are such records side by side,
with this rank's per-GPU energies last.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal, TypeVar

Reduction = Literal["sum", "max", "min", "any", "slowest", "main"]
"""How a field combines over the ranks: energy and counts sum, time is the longest, flags any; ``slowest``:
the value of the slowest rank (the one whose time is the record's), for figures that belong with that time;
``main``: the main rank's (rank 0), for what it decides for every rank."""

_REDUCE: dict[str, Callable[[list[float]], float]] = {
    "sum": sum,
    "max": max,
    "min": min,
    "any": lambda values: 1.0 if any(values) else 0.0,
}

R = TypeVar("R", bound="RankRecord")


def reduced(how: Reduction) -> Any:
    """A field of a :class:`RankRecord` that combines over the ranks by ``how`` (default 0.0)."""
    return field(default=0.0, metadata={"reduce": how})


@dataclass(frozen=True)
class RankRecord:
    """A record one rank sends; its fields are floats, each declared with :func:`reduced`."""

    width: ClassVar[int]
    count_field: ClassVar[str | None] = None
    """A field that counts what the record holds: :meth:`plus` keeps the other record where it is 0."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.width = sum(1 for kind in cls.__annotations__.values() if "ClassVar" not in str(kind))

    def values(self) -> list[float]:
        """The record as row values, in field order."""
        return [float(getattr(self, f.name)) for f in fields(self)]

    @classmethod
    def of(cls: type[R], row: Sequence[float]) -> R:
        """The record from ``row``'s first :attr:`width` values (field order).

        Raises:
            ValueError: ``row`` is shorter than the record (another layout was sent).
        """
        if len(row) < cls.width:
            raise ValueError(f"a {cls.__name__} needs {cls.width} values, the row has {len(row)}")
        return cls(*row[: cls.width])

    @classmethod
    def reduce(cls: type[R], records: Sequence[R], *, slowest: int = 0) -> R:
        """The ranks' records (rank order) combined field by field, each by its declared reduction.

        ``slowest``: index of the slowest rank (its values stand for the ``slowest`` fields).

        Raises:
            ValueError: ``records`` is empty.
        """
        if not records:
            raise ValueError(f"no {cls.__name__} to reduce")

        def combined(f: Any) -> float:
            values = [getattr(r, f.name) for r in records]
            how = f.metadata["reduce"]
            if how in ("slowest", "main"):
                return values[slowest if how == "slowest" else 0]
            return _REDUCE[how](values)

        return cls(*(combined(f) for f in fields(cls)))

    def plus(self: R, other: R) -> R:
        """This rank's record of two reports, summed field by field (one interval of this rank).

        A record whose :attr:`count_field` is 0 holds nothing: the other is returned as it is.
        """
        count = self.count_field
        if count is not None and not getattr(self, count):
            return other
        if count is not None and not getattr(other, count):
            return self
        return type(self)(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))


@dataclass(frozen=True)
class StepColumns(RankRecord):
    """One rank's measured steps of one report (or of an interval of reports).

    Attributes:
        energy_J: Energy of the steps (J).
        time_s: Their time (s).
        steps: How many (each rank's own; the ranks' least is the count every rank reached).
        samples: Training samples in them (NaN unless every step reported them).
        tokens: Input tokens in them (NaN unless every step reported them).
        power_samples: Power samples behind them.
        weighted_J: ``Σ E/p`` (J), ``p`` each step's chance of being measured (``windows.sample_fraction``).
        weighted_s: ``Σ t/p`` (s).
        weight: ``Σ 1/p``: the steps they stand for, in expectation; ``weighted_J / weight`` is the
            mean step with no share of the run counting more than another (the plain mean when every p is equal).
        between_J: Energy of the steps between two of these windows, measured as the stretches that hold them (J).
        between_s: Their time (s).
        between_steps: How many (each rank's own: the ranks' least).
    """

    energy_J: float = reduced("sum")
    time_s: float = reduced("max")
    steps: float = reduced("min")
    samples: float = reduced("sum")
    tokens: float = reduced("sum")
    power_samples: float = reduced("sum")
    weighted_J: float = reduced("sum")
    weighted_s: float = reduced("max")
    weight: float = reduced("min")
    between_J: float = reduced("sum")
    between_s: float = reduced("max")
    between_steps: float = reduced("min")

    count_field = "steps"  # a report without steps adds nothing to an interval (its NaN counts neither)


@dataclass(frozen=True)
class WarmupColumns(RankRecord):
    """One rank's warm-up steps of one report (``windows.warmup_steps``): their energy (J), time (s), count."""

    energy_J: float = reduced("sum")
    time_s: float = reduced("max")
    steps: float = reduced("sum")

    count_field = "steps"


@dataclass(frozen=True)
class RunSoFar(RankRecord):
    """One rank's energy (J) and time (s) since the run began, sent with each report under several processes."""

    energy_J: float = reduced("sum")
    time_s: float = reduced("max")


@dataclass(frozen=True)
class ShareVote(RankRecord):
    """The share of steps (in [0.001, 1]) a rank's overhead budget allows (``windows.sample_fraction: auto``).

    Every rank measures the least share from the report on: the ranks draw the same steps (one seed)
    only while they draw them at the same share.
    """

    fraction: float = reduced("min")


@dataclass(frozen=True)
class StepReportRow:
    """What one rank sends at a step report: its steps, its warm-up steps, its run so far, its node spans.

    ``so_far`` and ``share`` are None with one process (nothing to agree on); ``spans`` is empty without a
    node option (:meth:`~zeus_callbacks.session._node_spans.NodeSpans.local_row`).
    """

    steps: StepColumns
    warmup: WarmupColumns
    so_far: RunSoFar | None = None
    share: ShareVote | None = None
    spans: tuple[float, ...] = ()

    def values(self) -> list[float]:
        """The row this rank sends (every rank sends the same layout)."""
        so_far = self.so_far.values() if self.so_far is not None else []
        share = self.share.values() if self.share is not None else []
        return [*self.steps.values(), *self.warmup.values(), *so_far, *share, *self.spans]

    @classmethod
    def of(cls, row: Sequence[float], *, so_far: bool) -> StepReportRow:
        """A rank's row unpacked; ``so_far``: it carries :class:`RunSoFar` and :class:`ShareVote` (several ranks)."""
        if so_far:
            (steps, warmup, carried, share), spans = _split(row, StepColumns, WarmupColumns, RunSoFar, ShareVote)
            return cls(steps, warmup, carried, share, spans)  # type: ignore[arg-type]
        (steps, warmup), spans = _split(row, StepColumns, WarmupColumns)
        return cls(steps, warmup, spans=spans)  # type: ignore[arg-type]


@dataclass(frozen=True)
class NodeColumns(RankRecord):
    """One process's CPU/DRAM energy of a record (:func:`~zeus_callbacks.session._node.local_node`).

    Attributes:
        reads: 1 when this process reads its node's counters, else 0.
        cpu_J: CPU package energy (J; NaN unknown).
        dram_J: DRAM energy (J; NaN unknown or no DRAM domain).
        has_dram: 1 when the node has a DRAM domain, else 0.
    """

    reads: float = reduced("sum")
    cpu_J: float = reduced("sum")
    dram_J: float = reduced("sum")
    has_dram: float = reduced("any")


@dataclass(frozen=True)
class LedgerColumns(RankRecord):
    """One rank's epoch ledger (:meth:`~zeus_callbacks.session._ledger.EpochLedger.row`).

    The fields are :class:`~zeus_callbacks.session._ledger.EpochLedger`'s, with the energy (J), time (s)
    and count of the evaluations that began inside the epoch as ``eval_J``, ``eval_s``, ``evals``, and
    the energy (J) and time (s) of their tails as ``eval_tail_J``, ``eval_tail_s``, and the energy (J), time (s)
    and steps of the stretches between step windows that hold steps only as ``between_J``, ``between_s``,
    ``between_steps`` (the least over the ranks) and ``between_steps_most`` (the most).
    Energy sums over the ranks; times and counts are the slowest rank's (the rank whose time is the epoch's).
    """

    warmup_J: float = reduced("sum")
    warmup_s: float = reduced("slowest")
    warmup_windows: float = reduced("slowest")
    steps_J: float = reduced("sum")
    steps_s: float = reduced("slowest")
    step_windows: float = reduced("slowest")
    eval_J: float = reduced("sum")
    eval_s: float = reduced("slowest")
    evals: float = reduced("slowest")
    eval_tail_J: float = reduced("sum")
    eval_tail_s: float = reduced("slowest")
    stand_in_J: float = reduced("sum")
    stand_in_s: float = reduced("slowest")
    stand_in_steps: float = reduced("slowest")
    between_J: float = reduced("sum")
    between_s: float = reduced("slowest")
    between_steps: float = reduced("min")
    between_steps_most: float = reduced("max")  # differs from between_steps: the ranks measured different stretches


@dataclass(frozen=True)
class EvalColumns(RankRecord):
    """One rank's evaluation window, exchanged at the evaluation's end when every rank evaluates.

    Attributes:
        energy_J: Its energy (J; 0 when not measured).
        time_s: Its time (s).
        measured: 1 when this rank has the evaluation's energy (a possible window, a finite figure), else 0.
        complete: 1 when the samples cover the whole window, else 0.
    """

    energy_J: float = reduced("sum")
    time_s: float = reduced("max")
    measured: float = reduced("min")
    complete: float = reduced("min")


@dataclass(frozen=True)
class EpochColumns(RankRecord):
    """One rank's epoch window: its energy from the power samples (J), time (s), counter energy (J; NaN: none)."""

    energy_J: float = reduced("sum")
    time_s: float = reduced("max")
    counter_J: float = reduced("sum")


@dataclass(frozen=True)
class EpochRow:
    """What one rank sends at an epoch's end: the epoch, its ledger, its node figures, then each GPU's energy (J)."""

    epoch: EpochColumns
    ledger: LedgerColumns
    node: NodeColumns
    gpu_energy_J: tuple[float, ...] = ()

    def values(self) -> list[float]:
        """The row this rank sends."""
        return [*self.epoch.values(), *self.ledger.values(), *self.node.values(), *self.gpu_energy_J]

    @classmethod
    def of(cls, row: Sequence[float]) -> EpochRow:
        """A rank's row unpacked."""
        (epoch, ledger, node), rest = _split(row, EpochColumns, LedgerColumns, NodeColumns)
        return cls(epoch, ledger, node, rest)  # type: ignore[arg-type]


@dataclass(frozen=True)
class SummaryColumns(RankRecord):
    """One rank's run window and step means, for the run summary.

    Attributes:
        energy_J: The run window's energy (J).
        time_s: Its time (s).
        counter_J: Its energy from the energy counters (J; NaN when a GPU has none).
        step_energy_J: The mean step's energy (J; NaN when no step was estimated).
        step_time_s: The mean step's time (s; NaN likewise).
        covered_s: The part of the run window the samples cover (s).
    """

    energy_J: float = reduced("sum")
    time_s: float = reduced("max")
    counter_J: float = reduced("sum")
    step_energy_J: float = reduced("sum")
    step_time_s: float = reduced("max")
    covered_s: float = reduced("min")


@dataclass(frozen=True)
class SummaryRow:
    """What one rank sends at the run's end: its run window and step means, its node figures, each GPU's energy (J)."""

    run: SummaryColumns
    node: NodeColumns
    gpu_energy_J: tuple[float, ...] = ()

    def values(self) -> list[float]:
        """The row this rank sends."""
        return [*self.run.values(), *self.node.values(), *self.gpu_energy_J]

    @classmethod
    def of(cls, row: Sequence[float]) -> SummaryRow:
        """A rank's row unpacked."""
        (run, node), rest = _split(row, SummaryColumns, NodeColumns)
        return cls(run, node, rest)  # type: ignore[arg-type]


@dataclass(frozen=True)
class PowerLimitVote(RankRecord):
    """One rank's state at a power-limit exchange (every step while the main rank profiles).

    Attributes:
        limit_W: Its limit in force (W); the main rank's is the one every rank runs.
        done: 1 when its profiling is over (or it observes only); the main rank's settles the exchanges.
        observe: 1 when it cannot change its limit (observe mode): one such rank puts every rank there.
    """

    limit_W: float = reduced("main")
    done: float = reduced("main")
    observe: float = reduced("any")


@dataclass(frozen=True)
class StopVote(RankRecord):
    """One rank's part of an early-stop exchange.

    Attributes:
        energy_J: Its run energy so far (J).
        time_s: Its run time so far (s).
        target: 1 when it saw the batch-size target (the main rank only).
        converged: 1 when its bandit converged (the main rank only).
    """

    energy_J: float = reduced("sum")
    time_s: float = reduced("max")
    target: float = reduced("any")
    converged: float = reduced("any")


@dataclass(frozen=True)
class Ready(RankRecord):
    """1 when a rank can take part (e.g. it has a power-limit controller): every rank must, or none does."""

    ready: float = reduced("min")


@dataclass(frozen=True)
class MaxPower(RankRecord):
    """The sum of a rank's GPUs' maximum limits (W): the cost's ``MaxPower`` is their sum over the ranks."""

    max_power_W: float = reduced("sum")


def gathered(ranks: Any, local: R) -> list[R]:
    """Every rank's ``local`` record (a collective over ``ranks``' ``gather``), rank order."""
    return [type(local).of(row) for row in ranks.gather(local.values())]


def _split(row: Sequence[float], *kinds: type[RankRecord]) -> tuple[list[RankRecord], tuple[float, ...]]:
    """``row`` cut into one record of each of ``kinds``, in order, and the values after them."""
    out, at = [], 0
    for kind in kinds:
        out.append(kind.of(row[at:]))
        at += kind.width
    return out, tuple(row[at:])
