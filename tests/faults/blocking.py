"""The waits a thread blocks in, recorded instead of timed (issue 25: no test asserts a wall-clock duration).

A hook must not hang on a stuck sensor: it may only block in waits that give up (a timed
``Condition.wait_for``, ``Event.wait``, ``Thread.join``, a ``time.sleep``), and the time those can
take is the sum of their timeouts. A stopwatch around the hook measures that plus however long a
loaded machine takes to run it; the recorded waits say the same thing on any machine.

What is counted: every such wait made by one thread, with its timeout (``math.inf`` for none) and
whether it ended because the timeout ran out (a sleep always does). :attr:`BlockingWaits.waited_s`
sums the timeouts of the waits that ran out: how long the thread waited for something that did not
come. A wait that ended because the other side answered is listed but not summed (the thread was
not stuck there). Blocking on a lock with no timeout is not seen: a hook stuck that way never
returns, and the test's timeout fails it.
"""

from __future__ import annotations

import inspect
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Wait:
    """One blocking wait of the recorded thread.

    Attributes:
        what: The call, e.g. ``"Condition.wait_for"``.
        timeout_s: Its timeout (s); ``math.inf`` when it had none.
        timed_out: True when it returned because the timeout ran out.
    """

    what: str
    timeout_s: float
    timed_out: bool


def _cond_timed_out(obj: Any, result: Any) -> bool:  # Condition.wait, wait_for, Event.wait: False on timeout
    return not result


def _join_timed_out(thread: threading.Thread, result: Any) -> bool:
    return thread.is_alive()


class BlockingWaits:
    """Record the blocking waits one thread makes while the context is open (patches ``threading`` and ``time``).

    Args:
        thread: The thread to record (default: the one that opens the context).
    """

    _METHODS = (
        (threading.Condition, "wait", _cond_timed_out),
        (threading.Condition, "wait_for", _cond_timed_out),
        (threading.Event, "wait", _cond_timed_out),
        (threading.Thread, "join", _join_timed_out),
    )

    def __init__(self, thread: threading.Thread | None = None) -> None:
        self.thread = thread or threading.current_thread()
        self.waits: list[Wait] = []
        self._nested = threading.local()  # Event.wait and wait_for call Condition.wait: one wait, recorded once
        self._saved: list[tuple[Any, str, Any]] = []

    @property
    def unbounded(self) -> list[Wait]:
        """The waits without a timeout."""
        return [w for w in self.waits if math.isinf(w.timeout_s)]

    @property
    def waited_s(self) -> float:
        """The sum of the timeouts of the waits that ran out (s): how long the thread waited in vain."""
        return sum(w.timeout_s for w in self.waits if w.timed_out)

    def _record(self, what: str, timeout: float | None, call: Callable[[], Any], timed_out: Callable[[Any], bool]):
        if threading.current_thread() is not self.thread or getattr(self._nested, "inside", False):
            return call()
        self._nested.inside = True
        try:
            result = call()
        finally:
            self._nested.inside = False
        timeout_s = math.inf if timeout is None else max(float(timeout), 0.0)
        self.waits.append(Wait(what, timeout_s, timed_out(result)))
        return result

    def __enter__(self) -> BlockingWaits:
        for owner, name, timed_out in self._METHODS:
            original = getattr(owner, name)
            signature = inspect.signature(original)

            def wrapper(obj, *args, _original=original, _sig=signature, _what=f"{owner.__name__}.{name}",
                        _timed_out=timed_out, **kwargs):  # fmt: skip
                timeout = _sig.bind(obj, *args, **kwargs).arguments.get("timeout")
                return self._record(
                    _what, timeout, lambda: _original(obj, *args, **kwargs), lambda r: _timed_out(obj, r)
                )

            self._saved.append((owner, name, original))
            setattr(owner, name, wrapper)
        sleep = time.sleep
        self._saved.append((time, "sleep", sleep))
        time.sleep = lambda secs: self._record("time.sleep", secs, lambda: sleep(secs), lambda _: True)
        return self

    def __exit__(self, *exc: object) -> None:
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()
