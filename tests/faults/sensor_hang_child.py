"""Child process of test_fault_sensor_time.py: a run whose sensor call never returns, waiting for SIGTERM.

Usage: ``python sensor_hang_child.py LOG_DIR``. The child measures a fake H200 (manual clock), makes
every ``nvmlDeviceGetSamples`` call block for good at step ``HANG_STEP``, ends an epoch (which must not
wait on the stuck sensor), prints ``EPOCH_END <waited_s> <unbounded>`` (the sum of the timeouts of the
epoch end's waits that ran out, and how many of its waits had no timeout: tests/faults/blocking.py) and
then keeps training until it is killed.
The parent sends SIGTERM: the run's SIGTERM cleanup ends the run (bounded too) and the process dies of
the signal.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from tests.fakes import fake_pynvml as fp
from tests.faults.blocking import BlockingWaits
from zeus_callbacks.backends._nvml import NVMLBackend
from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.session import EnergySession

T0 = 1_800_000_000.0
STEP_S = 0.1
HANG_STEP = 10
SENSOR_TIMEOUT_S = 0.5


def main(log_dir: Path) -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    clock = ManualClock(T0)
    fake = fp.FakePyNVML(num_gpus=1, time_fn=clock.now_s)
    fake.set_load(300.0)
    backend = NVMLBackend(nvml_module=fake, clock=clock, read_only=True)
    session = EnergySession(
        {
            "backend": "nvml",
            "sampling": {"sensor_timeout_s": SENSOR_TIMEOUT_S},
            "logging": {"log_dir": str(log_dir), "run_name": "child"},
        },
        backend=backend,
        is_main_process=True,
    )
    session.train_start()
    step = 0
    epoch = 0
    session.epoch_start(epoch)
    for _ in range(HANG_STEP):
        session.step_start(step)
        clock.advance(STEP_S)
        session.step_end(step, num_samples=8)
        step += 1
    fake.hang("nvmlDeviceGetSamples")  # never returns (until the process dies)
    if not fake.wait_hung(1, 60.0):  # the sampler thread's next poll (every 0.1 s) gets stuck in it
        raise SystemExit("the sampler thread never polled the hung sensor")
    with BlockingWaits() as waits:
        session.epoch_end(epoch)
    print("EPOCH_END", waits.waited_s, len(waits.unbounded), flush=True)
    while True:  # training goes on until the scheduler's SIGTERM
        epoch += 1
        session.epoch_start(epoch)
        for _ in range(5):
            session.step_start(step)
            clock.advance(STEP_S)
            session.step_end(step, num_samples=8)
            step += 1
            time.sleep(0.01)
        session.epoch_end(epoch)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
