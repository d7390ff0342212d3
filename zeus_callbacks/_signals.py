"""A SIGTERM handler that does our cleanup first (see :mod:`zeus_callbacks._lifecycle`), then what was there before.

The handler is installed from the main thread only (Python's rule) and chains to the previous
handler, or to the default action (the process still dies of SIGTERM), so frameworks that handle
SIGTERM themselves (Lightning) keep working.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)


class ChainedSigterm:
    """Run ``cleanup`` on SIGTERM (its exceptions logged, never raised), then the previous handler.

    ``what`` describes the cleanup in the log line.
    """

    def __init__(self, cleanup: Callable[[], object], what: str) -> None:
        self.cleanup = cleanup
        self.what = what
        self._previous: Any = None

    @property
    def installed(self) -> bool:
        """True while this handler is registered."""
        return self._previous is not None

    def install(self) -> None:
        """Register the handler (no-op off the main thread, when installed, or if SIGTERM is ignored)."""
        if threading.current_thread() is not threading.main_thread() or self.installed:
            return
        previous = signal.getsignal(signal.SIGTERM)
        if previous == signal.SIG_IGN:
            return
        self._previous = previous if previous is not None else signal.SIG_DFL
        signal.signal(signal.SIGTERM, self._handle)

    def uninstall(self) -> None:
        """Put the previous handler back, if ours is still the registered one."""
        previous, self._previous = self._previous, None
        if previous is None or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) == self._handle:
            signal.signal(signal.SIGTERM, previous)

    def _handle(self, signum: int, frame: Any) -> None:
        previous = self._previous
        # False: a handler installed over ours called us as its previous one (Lightning composes them so).
        outermost = signal.getsignal(signum) == self._handle
        logger.warning("zeus-callbacks: SIGTERM: %s", self.what)
        try:
            self.cleanup()
        except Exception:  # the process is being stopped: log, and go on to the previous handler
            logger.exception("zeus-callbacks: cleanup on SIGTERM failed")
        self.uninstall()
        if callable(previous):
            previous(signum, frame)
        elif outermost:  # the default action, as without us: the process dies of SIGTERM
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        # Otherwise what the signal does is the outer handler's call (Lightning stops at its next check):
        # dying here would take that away, as the default action under it would not have run.
