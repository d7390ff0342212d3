"""Child process of test_fault_power_limit.py: profile power limits on the virtual GPU, then fail.

Usage: ``python power_limit_child.py LOG_DIR MODE STEP PHASE``. The virtual GPU starts at
``ORIGINAL_W``; every setter call is appended to ``LOG_DIR/setter_calls.txt``. At step
``STEP``, at ``PHASE`` (``start``: after step_start, ``mid``: inside the step, ``end``:
after step_end), the child prints ``LIMIT <W>`` (the limit in force) and then:

- ``exception``: raises; the loop's handler calls ``session.exception`` (as the Lightning
  adapter's ``on_exception`` does) and re-raises;
- ``exception_uncaught``: raises with no handler (the interpreter-exit hook ends the run);
- ``sigint`` / ``sigterm`` / ``sigkill``: sends itself that signal.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.backends.virtual import VirtualGPUBackend
from zeus_callbacks.session import EnergySession

ORIGINAL_W = 275.0
STEP_S = 0.2


class Recording(VirtualGPUBackend):
    """A virtual GPU that appends every power-limit setter call to a file."""

    def __init__(self, calls: Path, **kwargs) -> None:
        super().__init__(**kwargs)
        self.calls_path = calls

    def _set_power_limit_W(self, index: int, limit_W: float) -> None:
        super()._set_power_limit_W(index, limit_W)
        with open(self.calls_path, "a") as fh:
            fh.write(f"{index} {limit_W}\n")


def fault(mode: str, backend: VirtualGPUBackend) -> None:
    print("LIMIT", backend.power_limit_W(0), flush=True)
    if mode.startswith("exception"):
        raise RuntimeError("planted failure in a training step")
    os.kill(os.getpid(), {"sigint": signal.SIGINT, "sigterm": signal.SIGTERM, "sigkill": signal.SIGKILL}[mode])


def main(log_dir: Path, mode: str, fault_step: int, phase: str) -> None:
    # A child started from a background shell job inherits SIGINT ignored: restore Python's
    # default, so the planted SIGINT interrupts as it does in a terminal.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    clock = ManualClock(1000.0)
    backend = Recording(log_dir / "setter_calls.txt", clock=clock, read_only=False)
    backend.set_power_limit_W(0, ORIGINAL_W)
    config = {
        "backend": "virtual",
        "logging": {"log_dir": str(log_dir), "run_name": "child"},
        "power_limit": {"enabled": True, "warmup_steps": 0, "plot": False, "cache": False},
    }
    session = EnergySession(config, backend=backend, is_main_process=True)
    session.train_start()

    def loop() -> None:
        for step in range(fault_step + 1):
            session.step_start(step)
            if step == fault_step and phase == "start":
                fault(mode, backend)
            clock.advance(STEP_S / 2)
            if step == fault_step and phase == "mid":
                fault(mode, backend)
            clock.advance(STEP_S / 2)
            session.step_end(step, num_samples=8)
            if step == fault_step:
                fault(mode, backend)
        print("NO FAULT", flush=True)  # not reached

    if mode == "exception":
        try:
            loop()
        except BaseException as exc:
            session.exception(exc)
            raise
    else:
        loop()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4])
