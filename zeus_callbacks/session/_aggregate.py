"""Rank aggregation, written once for every record: energy sums, time is the slowest rank's.

Under several processes each rank measures its own GPUs. Every cross-rank record gathers one row
of numbers per rank (the named records of :mod:`~zeus_callbacks.session._rank_records`, whose fields
declare how they combine), with this rank's degraded flag appended: one rank's sensor fault puts
every rank in the same degraded mode. After a failure the ranks may no longer meet at the same
collective, so :class:`RankAggregator` then stays local.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar


class Collectives(Protocol):
    """What the session needs from a process group (:class:`~zeus_callbacks._distributed.RankGroup`).

    Every method is a collective: every rank calls it at the same point, with values of
    the same length.
    """

    num_processes: int
    process_index: int

    @property
    def is_distributed(self) -> bool:
        """True when more than one process trains together."""
        ...

    def gather(self, values: list[float]) -> list[list[float]]:
        """Every rank's ``values``, ordered by rank."""
        ...

    def broadcast_outcome(self, value: Any, failure: BaseException | None, doing: str) -> Any:
        """Rank 0's ``value`` on every rank, or its failure raised on every rank."""
        ...


Rows = list[list[float]]
"""One row of numbers per rank, ordered by rank."""

T = TypeVar("T")


class Packed(Protocol):
    """A record a rank sends (:mod:`~zeus_callbacks.session._rank_records`): it packs into row values."""

    def values(self) -> list[float]:
        """The record as row values."""
        ...


class RankAggregator:
    """The ranks' exchanges of numbers, with the degraded flag and the after-failure fallback.

    Args:
        ranks: The process group (one process: exchanges are local).

    Attributes:
        ranks: The process group.
        collectives_ok: False once a failure may leave the ranks out of step: exchanges stay local.
        peer_degraded: Another rank reported a sensor fault.
    """

    def __init__(self, ranks: Collectives) -> None:
        self.ranks = ranks
        self.collectives_ok = True
        self.peer_degraded = False

    @property
    def collective(self) -> bool:
        """True when exchanges go to every rank (several processes, no failure)."""
        return self.ranks.is_distributed and self.collectives_ok

    def gather(self, values: Sequence[float], *, degraded: bool) -> Rows:
        """Every rank's ``values`` (collective when :attr:`collective`, else this rank's only), rank order.

        ``degraded``: this rank's measurement is (a sensor fault); :attr:`peer_degraded` is set when
        another rank's was.
        """
        local = [*values, 1.0 if degraded else 0.0]
        rows = self.ranks.gather(local) if self.collective else [local]
        if any(row[-1] for row in rows) and not degraded:
            self.peer_degraded = True  # one rank's fault: the same degraded mode everywhere
        return [row[:-1] for row in rows]

    def exchange(self, local: Packed, unpack: Callable[[list[float]], T], *, degraded: bool) -> list[T]:
        """Every rank's record, rank order: ``local`` packed, gathered (:meth:`gather`), each row ``unpack``-ed."""
        return [unpack(row) for row in self.gather(local.values(), degraded=degraded)]
