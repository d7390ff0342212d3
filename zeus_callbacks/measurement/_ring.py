"""A fixed-capacity ring buffer of (time, value) pairs with numpy storage."""

from __future__ import annotations

import numpy as np


class TimeSeriesRing:
    """Keep the most recent ``capacity`` (timestamp, value) pairs.

    Appends are O(1); memory never grows past ``capacity`` pairs, so a 24-hour run
    holds no more than a recent window. Timestamps are expected in increasing order.
    Not thread safe: the owner holds a lock.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 2:
            raise ValueError(f"capacity must be at least 2, got {capacity}")
        self.capacity = int(capacity)
        self._t = np.empty(self.capacity, dtype=np.float64)
        self._v = np.empty(self.capacity, dtype=np.float64)
        self._next = 0  # total number of appends ever made
        self.dropped = 0  # pairs overwritten because the buffer was full

    def __len__(self) -> int:
        return min(self._next, self.capacity)

    def append(self, timestamp_s: float, value: float) -> None:
        """Add one pair, overwriting the oldest when full."""
        if self._next >= self.capacity:
            self.dropped += 1
        slot = self._next % self.capacity
        self._t[slot] = timestamp_s
        self._v[slot] = value
        self._next += 1

    def last_time(self) -> float | None:
        """Return the newest timestamp, or None when empty."""
        if self._next == 0:
            return None
        return float(self._t[(self._next - 1) % self.capacity])

    def last_value(self) -> float | None:
        """Return the newest value, or None when empty."""
        if self._next == 0:
            return None
        return float(self._v[(self._next - 1) % self.capacity])

    def arrays(self, since: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Return copies of (timestamps, values), oldest first.

        Args:
            since: Keep only the pairs from the newest one at or before this time on
                (all when None or older than every pair): the cost then follows the span
                asked for, not the buffer's length.
        """
        n = len(self)
        if n < self.capacity:
            first = 0 if since is None else max(0, int(np.searchsorted(self._t[:n], since, side="right")) - 1)
            return self._t[first:n].copy(), self._v[first:n].copy()
        # Two sorted segments: [start, capacity) holds the older pairs, [0, start) the newer.
        start = self._next % self.capacity
        if since is not None and start > 0 and self._t[0] <= since:
            first = max(0, int(np.searchsorted(self._t[:start], since, side="right")) - 1)
            return self._t[first:start].copy(), self._v[first:start].copy()
        first = start
        if since is not None:
            first += max(0, int(np.searchsorted(self._t[start:], since, side="right")) - 1)
        order = np.r_[first : self.capacity, 0:start]
        return self._t[order], self._v[order]
