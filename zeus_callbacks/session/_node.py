"""The node's CPU package and DRAM energy in the records: which reader a run gets, and its figures over the ranks.

An epoch's figures are the difference of two readings (its start and its end), the run's the reading
at its end. Each process contributes its :class:`~zeus_callbacks.session._rank_records.NodeColumns` to a
record's row (:func:`local_node`); :func:`node_figures` combines those of the processes that read a node's
counters, so each node's CPU is counted once. A figure is a number or None with the reason in
``node_energy_note``, never 0 for unknown.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from zeus_callbacks._distributed import launcher_env_int, launcher_world_size
from zeus_callbacks.backends import GPUBackend
from zeus_callbacks.backends._virtual_cpu import VirtualCpu
from zeus_callbacks.backends.rapl import NodeEnergy, NodeReader, RaplReader
from zeus_callbacks.config import NodeConfig
from zeus_callbacks.reporting import NODE_OFF
from zeus_callbacks.session._rank_records import NodeColumns

logger = logging.getLogger(__name__)

OTHER_LOCAL_RANK = "this node's CPU/DRAM counters are read by its local rank 0 (each node counted once)"
"""Why a process whose ``LOCAL_RANK`` is not 0 has no RAPL reader under several processes."""

RESUMED = "a resumed run: the CPU/DRAM energy before the checkpoint was not carried"
"""Why a resumed run's node figure is unknown."""


def open_node_reader(config: NodeConfig, backend: GPUBackend) -> tuple[NodeReader | None, str | None]:
    """The run's CPU/DRAM energy reader in this process, or None with why there is none.

    RAPL first (started here once, to learn whether its counters can be read); the virtual CPU where no
    package counter can be read, ``node.virtual_cpu`` is on and the GPU is the virtual GPU on the wall
    clock. A real GPU never gets the simulated CPU: its CPU figure is then unknown, with the reason.

    Under several processes a node's RAPL counters are read by its local rank 0 only (``LOCAL_RANK``),
    so each node's CPU is counted once in the ranks' sum; the virtual CPU, which models a process's own
    CPU time, is read by every process. Without ``LOCAL_RANK`` which processes share a node is unknown.

    Returns:
        (the reader, None), or (None, why there is none); (None, None) when both options are off.
    """
    if not (config.rapl or config.virtual_cpu):
        return None, None
    reads_rapl = True
    if launcher_world_size() > 1:
        local_rank = launcher_env_int("LOCAL_RANK", -1)
        if local_rank < 0:
            note = (
                "several processes without LOCAL_RANK: which of them share a node is unknown, so no CPU/DRAM "
                "energy (a node's CPU would be counted once per process)"
            )
            logger.warning("zeus-callbacks: %s", note)
            return None, note
        reads_rapl = local_rank == 0
    if not reads_rapl and not config.virtual_cpu:
        return None, OTHER_LOCAL_RANK
    # The simulator's manual clock is the run's time; otherwise the monotonic clock (the wall clock can jump).
    rapl = RaplReader(config.powercap_root, clock=backend.clock.now_s if backend.clock_is_manual else time.monotonic)
    if rapl.available:
        rapl.start()  # the first reading: an unreadable counter (non-root) shows here
        if rapl.readable or not config.virtual_cpu:
            return (rapl, None) if reads_rapl else (None, OTHER_LOCAL_RANK)
    elif not config.virtual_cpu:
        logger.warning("zeus-callbacks: node.rapl: no RAPL package domain under %s; no CPU/DRAM energy",
                       config.powercap_root)  # fmt: skip
        return rapl, None
    no_rapl = f"no readable RAPL package counter under {config.powercap_root}"
    refusal = _virtual_cpu_refusal(backend)
    if refusal is not None:
        note = f"{no_rapl}, and {refusal}: no CPU/DRAM energy"
        logger.warning("zeus-callbacks: node.virtual_cpu: %s", note)
        return (rapl, None) if rapl.available and reads_rapl else (None, note)
    logger.info("zeus-callbacks: node.virtual_cpu: %s; the CPU package energy is SIMULATED", no_rapl)
    return VirtualCpu(config.virtual_cpu_power_per_core_W), None


def _virtual_cpu_refusal(backend: GPUBackend) -> str | None:
    """Why the simulated CPU may not stand in beside ``backend`` (None: it may)."""
    if not backend.simulated:
        return "node.virtual_cpu simulates a CPU only beside the virtual GPU (this run's GPU is real)"
    if backend.clock_is_manual:
        return "the virtual GPU runs on a manual clock (the simulator): the process's CPU time does not follow it"
    return None


@dataclass(frozen=True)
class LocalNode:
    """This process's part of a record's node figures.

    Attributes:
        columns: The figures for the record's row.
        parts: What the node figure holds (the reader's :attr:`~zeus_callbacks.backends.rapl.NodeReader.parts`).
        reasons: Why this process's figures are unknown ("" when known).
        no_reader: Why this process has no reader (None when it has one).
    """

    columns: NodeColumns
    parts: str = ""
    reasons: str = ""
    no_reader: str | None = None


def local_node(reader: NodeReader | None, energy: NodeEnergy | None, no_reader: str | None) -> LocalNode:
    """This process's node columns and words, from its reader's figures (``energy``; None: no reading).

    ``energy``: a run's reading, or an epoch's difference of two; ``no_reader``: why there is no
    ``reader`` (None: :data:`NODE_OFF`).
    """
    if reader is None:
        return LocalNode(NodeColumns(0.0, math.nan, math.nan, 0.0), no_reader=no_reader or NODE_OFF)
    has_dram = 1.0 if reader.has_dram else 0.0
    if energy is None:
        unread = NodeColumns(1.0, math.nan, math.nan, has_dram)
        return LocalNode(unread, reader.parts, "no reading at the window's start or end")
    reasons = "; ".join(f"{label}: {why}" for label, why in energy.reasons.items())
    if not energy.domains_J:
        reasons = "this machine exposes no CPU energy counter"
    columns = NodeColumns(1.0, _number(energy.cpu_J), _number(energy.dram_J), has_dram)
    return LocalNode(columns, reader.parts, reasons)


def _number(value: float | None) -> float:
    return math.nan if value is None else value


def node_figures(
    gpu_energy_J: float, rows: Sequence[NodeColumns], local: LocalNode, *, carried_energy_J: float = 0.0
) -> dict[str, Any]:
    """The CPU, DRAM and node energy (J) of a record and their note, combined over the ranks.

    Sums over the processes that read a node's counters (each node's CPU once); a figure unknown on
    any of them is unknown. ``node_energy_J`` = ``gpu_energy_J`` (over every rank; NaN: unknown) + CPU
    (+ DRAM where a DRAM domain exists). ``local``: this process's part (its words go into the note).
    ``carried_energy_J``: a run's GPU energy from a checkpoint (J), whose CPU energy was not read.

    Returns:
        ``cpu_energy_J``, ``dram_energy_J``, ``node_energy_J`` (J or None) and ``node_energy_note``.
    """
    readers = [row for row in rows if row.reads > 0]
    if not readers:
        note = local.no_reader or "no process read a node's CPU/DRAM counters"
        return {"cpu_energy_J": None, "dram_energy_J": None, "node_energy_J": None, "node_energy_note": note}
    cpu_J = sum(row.cpu_J for row in readers) if all(math.isfinite(row.cpu_J) for row in readers) else None
    with_dram = [row for row in readers if row.has_dram > 0]
    dram_known = with_dram and all(math.isfinite(r.dram_J) for r in with_dram)
    dram_J = sum(row.dram_J for row in with_dram) if dram_known else None
    node_J = None
    if cpu_J is not None and (dram_J is not None or not with_dram) and math.isfinite(gpu_energy_J):
        node_J = gpu_energy_J + cpu_J + (dram_J or 0.0)  # dram_J None here only when no DRAM domain exists
    reasons = local.reasons
    if carried_energy_J > 0 or math.isnan(carried_energy_J):  # NaN: the checkpoint's energy is unknown
        node_J = None
        reasons = RESUMED + (f"; {reasons}" if reasons else "")
    elif node_J is None and not reasons:
        known = cpu_J is not None and (dram_J is not None or not with_dram)
        reasons = "the GPU energy is unknown" if known else "unknown on another node's reader"
    # A process that reads no counter (not its node's local rank 0) words the parts as the readers' columns say.
    parts = local.parts or "GPU + CPU package" + (" + DRAM" if with_dram else " (no DRAM domain on this CPU)")
    return {
        "cpu_energy_J": cpu_J,
        "dram_energy_J": dram_J,
        "node_energy_J": node_J,
        "node_energy_note": f"{parts}; unknown: {reasons}" if reasons else parts,
    }
