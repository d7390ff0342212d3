"""One registry for what must run when the process is stopped: SIGTERM and interpreter exit.

A scheduler's kill (SIGTERM) skips ``atexit``, and a run that never saw ``train_end``
would lose its summary and leave a changed power limit behind. Every part that needs a
last word registers a cleanup here with an order; the registry installs one chained
SIGTERM handler (:class:`~zeus_callbacks._signals.ChainedSigterm`) while any cleanup is
registered, and runs the ``at_exit`` ones at interpreter exit. Lower orders run first:
power limits are put back before the energy log is closed.

Example:
    >>> registration = CLEANUPS.register(lambda: None, what="ending the energy log",
    ...                                  order=CleanupOrder.END_RUN)
    >>> registration.cancel()
"""

from __future__ import annotations

import atexit
import enum
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from zeus_callbacks._signals import ChainedSigterm

logger = logging.getLogger(__name__)


class CleanupOrder(enum.IntEnum):
    """When a cleanup runs relative to the others (lower first)."""

    RESTORE_POWER_LIMITS = 10
    """Hardware first: a GPU left at a profiling limit outlives the process."""
    END_RUN = 20
    """Then the run's summary and the energy log (it restores limits again, idempotently)."""


@dataclass(eq=False)
class Registration:
    """A registered cleanup; :meth:`cancel` removes it (idempotent).

    Attributes:
        cleanup: Called once with no arguments; its exceptions are logged, never raised.
        what: What it does, for the log line (``"ending the energy log"``).
        order: A :class:`CleanupOrder` (lower runs first).
        at_exit: Whether it also runs at interpreter exit if still registered then (not only on SIGTERM).
    """

    cleanup: Callable[[], None]
    what: str
    order: int
    at_exit: bool
    _registry: CleanupRegistry = field(repr=False)

    def cancel(self) -> None:
        """Remove the cleanup; the SIGTERM handler goes once nothing is registered."""
        self._registry._remove(self)


class CleanupRegistry:
    """Cleanups in order, one SIGTERM handler for all of them, one ``atexit`` hook.

    Thread safety: registering and cancelling take a lock; the SIGTERM handler itself is
    installed from the main thread only (Python's rule: elsewhere, cleanups still run at
    exit but not on SIGTERM).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: list[Registration] = []
        self._sigterm = ChainedSigterm(self._on_sigterm, "running the cleanups")

    def register(self, cleanup: Callable[[], None], *, what: str, order: int, at_exit: bool = False) -> Registration:
        """Add ``cleanup`` (see :class:`Registration`); install the SIGTERM handler if it is the first one.

        Returns:
            The registration; cancel it once the cleanup is no longer needed.
        """
        entry = Registration(cleanup, what, int(order), at_exit, self)
        with self._lock:
            self._entries.append(entry)
            self._entries.sort(key=lambda e: e.order)  # stable: equal orders keep registration order
            self._sigterm.what = self._describe()
        self._sigterm.install()
        return entry

    @property
    def registered(self) -> list[Registration]:
        """The registrations, in the order they run."""
        with self._lock:
            return list(self._entries)

    def _describe(self) -> str:
        return "; ".join(e.what for e in self._entries) or "nothing to clean up"

    def _remove(self, entry: Registration) -> None:
        with self._lock:
            if entry not in self._entries:
                return
            self._entries.remove(entry)
            self._sigterm.what = self._describe()
            empty = not self._entries
        if empty:
            self._sigterm.uninstall()

    def _run(self, entries: list[Registration], *, log_failures: bool) -> None:
        for entry in entries:
            try:
                entry.cleanup()
            except Exception:  # the process is being stopped: go on to the next cleanup
                if log_failures:
                    logger.exception("zeus-callbacks: cleanup failed (%s)", entry.what)
            self._remove(entry)

    def _on_sigterm(self) -> None:
        self._run(self.registered, log_failures=True)

    def run_at_exit(self) -> None:
        """Run the ``at_exit`` cleanups still registered (the interpreter is exiting; best effort, silent)."""
        self._run([e for e in self.registered if e.at_exit], log_failures=False)


CLEANUPS = CleanupRegistry()
"""The process's registry: the session and the power-limit controller register here."""

atexit.register(CLEANUPS.run_at_exit)
