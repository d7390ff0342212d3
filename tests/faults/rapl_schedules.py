"""The RAPL truth-or-flag harness: a fake powercap tree driven by a schedule of readings, and its invariant.

A schedule is a list of readings. Before each, the fake clock moves by the reading's gap and each domain
draws its power for that gap (the true energy, kept as a float in µJ). Then the reading's faults take
effect, and each counter file is written: the true energy, floored to a µJ, modulo its
``max_energy_range_uj`` (the wrap), unless a fault holds the file. The faults:

- ``stuck``: the counter stops updating (its file keeps the last value written);
- ``thaw``: a stuck counter updates again, from the true energy (the firmware stalled, the CPU did not);
- ``deny``: reading ``energy_uj`` raises PermissionError from here on (Linux ≥ 5.10, not root);
- ``vanish``: the zone's ``energy_uj`` disappears (a driver unloaded).

Then :meth:`RaplReader.read` runs, timed on the fake clock. The figures checked: between every two
readings (the start included), each domain's energy and the sums by kind
(:meth:`~zeus_callbacks.backends.rapl.NodeEnergy.since`), and from the start the record layer's
(:func:`~zeus_callbacks.session._node.node_figures`). Each must be right within :func:`tolerance_J` of the
fake's true energy, or null with a reason; never negative, never 0 for unknown.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.faults import tally as tallies
from tests.faults.scratch import scratch_dir
from zeus_callbacks.backends.rapl import STILL_AFTER_S, UJ_PER_J, NodeEnergy, RaplReader
from zeus_callbacks.session._node import local_node, node_figures

FAULT_KINDS = ("stuck", "thaw", "deny", "vanish")
GPU_J = 100.0  # the GPU part given to the record layer: node = GPU + CPU (+ DRAM)


@dataclass(frozen=True)
class Reading:
    """One reading: the time since the previous one (s), each domain's power over it (W), the faults then."""

    gap_s: float
    power_W: tuple[float, ...]
    faults: tuple[tuple[int, str], ...] = ()  # (domain index, fault kind)


@dataclass(frozen=True)
class Schedule:
    """A fake tree (sockets, a DRAM zone on each or not, each domain's range and start) and its readings."""

    sockets: int
    dram: bool
    ranges_uj: tuple[int, ...]  # per domain, in :func:`labels` order
    starts_uj: tuple[int, ...]
    readings: tuple[Reading, ...]
    stuck_reads: int = 3


def labels(schedule: Schedule) -> list[tuple[str, str, str]]:
    """(zone folder, zone name, the reader's label) per domain: per socket its package, then its DRAM."""
    out = []
    for socket in range(schedule.sockets):
        out.append((f"intel-rapl:{socket}", f"package-{socket}", f"package-{socket}"))
        if schedule.dram:
            out.append((f"intel-rapl:{socket}:0", "dram", f"dram-{socket}"))
    return out


@dataclass
class Figure:
    """One figure: what (``package-0 2..5``), its value (J or None), the truth (J), the tolerance, why null."""

    what: str
    value_J: float | None
    truth_J: float
    tolerance_J: float
    reason: str | None

    @property
    def bad(self) -> str | None:
        """Why this figure breaks the invariant (None: it keeps it)."""
        if self.value_J is None:
            return None if self.reason else "null without a reason"
        if not math.isfinite(self.value_J) or self.value_J < 0:
            return f"impossible value {self.value_J}"
        if abs(self.value_J - self.truth_J) > self.tolerance_J:
            return f"{self.value_J} J against a true {self.truth_J} J (± {self.tolerance_J} J)"
        return None


@dataclass
class Outcome:
    """A schedule's figures."""

    figures: list[Figure] = field(default_factory=list)

    def violations(self) -> list[str]:
        """Each figure that breaks the invariant, with why."""
        return [f"{f.what}: {f.bad}" for f in self.figures if f.bad]


def tolerance_J(truth_J: float, froze: bool, power_W: float) -> float:
    """How far a right figure may be from the truth (J).

    2 µJ (each end floored to a µJ) + float rounding; once the counter has been stuck, its power ×
    :data:`~zeus_callbacks.backends.rapl.STILL_AFTER_S` too (an equal reading sooner than that after its
    last move is taken for a quiet counter, not a frozen one).
    """
    return 2 / UJ_PER_J + 1e-12 * abs(truth_J) + (power_W * STILL_AFTER_S if froze else 0.0)


def run_schedule(schedule: Schedule) -> Outcome:
    """Drive a fake tree and a :class:`RaplReader` through ``schedule``; every figure against the truth."""
    domains = labels(schedule)
    with scratch_dir() as tmp, pytest.MonkeyPatch.context() as patch:
        root = Path(tmp)
        files = []
        for (folder, name, _), range_uj, start_uj in zip(domains, schedule.ranges_uj, schedule.starts_uj, strict=True):
            (root / folder).mkdir()
            (root / folder / "name").write_text(f"{name}\n")
            (root / folder / "max_energy_range_uj").write_text(f"{range_uj}\n")
            (root / folder / "energy_uj").write_text(f"{start_uj % range_uj}\n")
            files.append(root / folder / "energy_uj")
        denied: set[Path] = set()
        real_read_text = Path.read_text

        def read_text(self, *args, **kwargs):
            if self in denied:
                raise PermissionError(13, "Permission denied", str(self))
            return real_read_text(self, *args, **kwargs)

        patch.setattr(Path, "read_text", read_text)
        now = [0.0]
        reader = RaplReader(root, stuck_reads=schedule.stuck_reads, clock=lambda: now[0])
        assert [d.label for d in reader.domains] == [label for *_, label in domains]
        reader.start()
        true_uj = [float(s) for s in schedule.starts_uj]
        stuck, froze, gone = [False] * len(domains), [False] * len(domains), [False] * len(domains)
        readings: list[tuple[NodeEnergy, list[float], list[bool]]] = [(reader.energy(), list(true_uj), list(froze))]
        for reading in schedule.readings:
            now[0] += reading.gap_s
            for d, watts in enumerate(reading.power_W):
                true_uj[d] += watts * reading.gap_s * UJ_PER_J
            for d, kind in reading.faults:
                if kind == "stuck":
                    stuck[d] = froze[d] = True
                elif kind == "thaw":
                    stuck[d] = False
                elif kind == "deny":
                    denied.add(files[d])
                elif kind == "vanish" and not gone[d]:
                    gone[d] = True
                    files[d].unlink()
            for d, path in enumerate(files):
                if not (stuck[d] or gone[d]):
                    path.write_text(f"{math.floor(true_uj[d]) % schedule.ranges_uj[d]}\n")
            readings.append((reader.read(), list(true_uj), list(froze)))
        outcome = Outcome()
        max_W = [max((r.power_W[d] for r in schedule.readings), default=0.0) for d in range(len(domains))]
        for j in range(1, len(readings)):
            for i in range(j):
                outcome.figures += _pair(domains, readings[i], readings[j], max_W, f"{i}..{j}")
            outcome.figures += _record(reader, domains, readings[0], readings[j], max_W, f"record 0..{j}")
    return outcome


def _truth(domains, early, late, max_W, kind=None, index=None):
    """(truth J, tolerance J) of one domain (``index``) or of a kind's sum."""
    picked = [d for d, (_, _, label) in enumerate(domains) if (index == d if index is not None else
              label.startswith(kind))]  # fmt: skip
    truth = sum(late[1][d] - early[1][d] for d in picked) / UJ_PER_J
    return truth, sum(tolerance_J(truth, late[2][d], max_W[d]) for d in picked)


def _pair(domains, early, late, max_W, span) -> list[Figure]:
    diff = late[0].since(early[0])
    figures = []
    for d, (*_, label) in enumerate(domains):
        truth, tol = _truth(domains, early, late, max_W, index=d)
        figures.append(Figure(f"{label} {span}", diff.domains_J[label], truth, tol, diff.reasons.get(label)))
    for kind, value in (("package", diff.cpu_J), ("dram", diff.dram_J)):
        if not any(label.startswith(kind) for *_, label in domains):
            continue  # no DRAM zone: dram_J None says so (no figure to check)
        truth, tol = _truth(domains, early, late, max_W, kind=kind)
        why = "; ".join(r for label, r in diff.reasons.items() if label.startswith(kind)) or None
        figures.append(Figure(f"{kind} sum {span}", value, truth, tol, why))
    return figures


def _record(reader, domains, early, late, max_W, span) -> list[Figure]:
    """The record layer: node_figures from this reader's columns (one process), its note for the reasons."""
    fields = node_figures(GPU_J, [local_node(reader, late[0].since(early[0]), None).columns],
                          local_node(reader, late[0].since(early[0]), None))  # fmt: skip
    note = fields["node_energy_note"]
    why = note if "unknown:" in note else None
    cpu, cpu_tol = _truth(domains, early, late, max_W, kind="package")
    figures = [Figure(f"cpu_energy_J {span}", fields["cpu_energy_J"], cpu, cpu_tol, why)]
    node, node_tol = GPU_J + cpu, cpu_tol
    if reader.has_dram:
        dram, dram_tol = _truth(domains, early, late, max_W, kind="dram")
        figures.append(Figure(f"dram_energy_J {span}", fields["dram_energy_J"], dram, dram_tol, why))
        node, node_tol = node + dram, node_tol + dram_tol
    figures.append(Figure(f"node_energy_J {span}", fields["node_energy_J"], node, node_tol, why))
    return figures


def tally(outcome: Outcome) -> list[str]:
    """Count one schedule in the RAPL tally (tests/faults/tally.py) and return its violations."""
    bad = outcome.violations()
    counts = tallies.RAPL
    counts["schedules"] += 1
    counts["violations"] += bool(bad)
    for figure in outcome.figures:
        counts["null" if figure.value_J is None else "checked"] += 1
    return bad
