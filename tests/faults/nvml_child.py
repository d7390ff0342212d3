"""Child process of test_fault_restore.py: a run profiling power limits on the fake NVML, whose limits persist.

Usage: ``python nvml_child.py LOG_DIR MODE [STEPS]`` with ``ZEUS_FAKE_NVML_STATE`` (the GPUs'
limit state, shared by every process), ``ZEUS_CALLBACKS_LOCK_DIR`` and ``FAKE_NVML_GPUS`` (how many
H200s; ``CUDA_VISIBLE_DEVICES`` narrows them as on a real host) set by the test.

- ``hold``: profile until every GPU it sees is at a limit other than the one it found, print
  ``CHANGED <W>``, then sleep (the test kills it, or lets it live while others try their luck);
  it restores on SIGTERM like any run.
- ``run``: train ``STEPS`` steps and end; print ``RESULT <json>`` (the power-limit result's
  source and the observe reason) and ``DONE``.

``python nvml_child.py cli ARGS...`` runs ``zeus-callbacks ARGS...`` with the fake as ``pynvml``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.fakes.fake_pynvml import FakePyNVML  # noqa: E402
from zeus_callbacks.backends.base import ManualClock  # noqa: E402

T0 = 1_800_000_000.0  # realtime seconds on the fake's 100 ms sensor grid
STEP_S = 0.1


def fake_nvml(clock_fn=time.time) -> FakePyNVML:
    fake = FakePyNVML(num_gpus=int(os.environ.get("FAKE_NVML_GPUS", "1")), time_fn=clock_fn)
    fake.set_load(450.0)
    return fake


def run(log_dir: Path, mode: str, steps: int) -> None:
    from zeus_callbacks.backends._nvml import NVMLBackend
    from zeus_callbacks.session import EnergySession

    clock = ManualClock(T0)
    fake = fake_nvml(clock.now_s)
    backend = NVMLBackend(nvml_module=fake, clock=clock, read_only=False)
    found_W = [backend.power_limit_W(i) for i in range(backend.device_count())]
    config = {
        "backend": "nvml",
        "logging": {"log_dir": str(log_dir), "run_name": "child"},
        "power_limit": {"enabled": True, "warmup_steps": 0, "plot": False, "cache": False},
    }
    session = EnergySession(config, backend=backend, is_main_process=True)
    session.train_start()
    for step in range(steps if mode == "run" else 10_000):
        session.step_start(step)
        clock.advance(STEP_S)
        session.step_end(step, num_samples=8)
        if mode == "hold":
            now = [backend.power_limit_W(i) for i in range(backend.device_count())]
            if all(a != b for a, b in zip(now, found_W, strict=True)):
                print("CHANGED", now[0], flush=True)
                time.sleep(600)
    limiter = session.power_limiter
    result = limiter.result if limiter is not None else None
    print(
        "RESULT",
        json.dumps(
            {
                "source": result.source if result is not None else None,
                "observe": limiter.observe if limiter is not None else None,
                "observe_reason": limiter.observe_reason if limiter is not None else None,
            }
        ),
        flush=True,
    )
    session.train_end()
    backend.close()
    print("DONE", flush=True)


def cli(args: list[str]) -> int:
    sys.modules["pynvml"] = fake_nvml()  # type: ignore[assignment]
    from zeus_callbacks.cli import main

    return main(args)


if __name__ == "__main__":
    if sys.argv[1] == "cli":
        sys.exit(cli(sys.argv[2:]))
    run(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 0)
