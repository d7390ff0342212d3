"""The restore protocol across processes: concurrent profilers, killed and live owners, narrower device views.

Every process here runs the real NVML backend on the fake NVML (``nvml_child.py``) whose power
limits live in one state file, as a driver's outlive the process that set them. Each GPU starts at
an original limit below the H200's 700 W maximum (250 W, 260 W for a second GPU: a restore that
lands on the wrong GPU shows), and every case ends by checking every GPU is back at it.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fakes.fake_pynvml import STATE_ENV, FakePyNVML
from tests.timeouts import CHILD_TIMEOUT_S
from zeus_callbacks.optimizers.power_limit import MARKER_NAME

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("nvml_child.py")
UUIDS = [gpu.uuid for gpu in FakePyNVML(num_gpus=2).gpus]
ORIGINAL_W = [250.0, 260.0]
RUN_STEPS = 60  # enough for the run to change the limit (the first change comes at step 1)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="flock, /proc and POSIX signals")


class Host:
    """The fake host: its GPUs' limit state, the lock directory, and how to start processes on it."""

    def __init__(self, root: Path, gpus: int = 1) -> None:
        self.root = root
        self.gpus = gpus
        self.state = root / "nvml_state.json"
        self.state.write_text(json.dumps({UUIDS[i]: int(ORIGINAL_W[i] * 1000) for i in range(gpus)}))
        self.procs: list[subprocess.Popen] = []

    def env(self, visible: str | None = None) -> dict[str, str]:
        env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(self.root),
               STATE_ENV: str(self.state), "ZEUS_CALLBACKS_LOCK_DIR": str(self.root / "locks"),
               "FAKE_NVML_GPUS": str(self.gpus)}  # fmt: skip
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        return env

    def limits_W(self) -> list[float]:
        data = json.loads(self.state.read_text())
        return [data[UUIDS[i]] / 1000 for i in range(self.gpus)]

    def hold(self, log_dir: Path) -> subprocess.Popen:
        """Start a run that changes every GPU's limit and stays alive; returns once it has."""
        proc = subprocess.Popen([sys.executable, str(CHILD), str(log_dir), "hold"], cwd=ROOT, env=self.env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        self.procs.append(proc)
        deadline = time.monotonic() + 400  # a loaded machine takes long to start Python and import torch
        while time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if ready:
                line = proc.stdout.readline()
                if line.startswith("CHANGED"):
                    return proc
                if not line:
                    break
        proc.kill()
        raise AssertionError(f"the holding run never changed the limit: {proc.stderr.read()[-3000:]}")

    def run(self, log_dir: Path, steps: int = RUN_STEPS) -> dict:
        """Run a whole profiling run; returns its power-limit result (source, observe, observe_reason)."""
        done = subprocess.run([sys.executable, str(CHILD), str(log_dir), "run", str(steps)], cwd=ROOT,
                              env=self.env(), capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)  # fmt: skip
        assert done.returncode == 0 and "DONE" in done.stdout, done.stderr[-3000:]
        line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
        return json.loads(line[len("RESULT ") :])

    def restore(self, *args: str, visible: str | None = None) -> subprocess.CompletedProcess:
        """``zeus-callbacks restore ARGS`` on this host."""
        return subprocess.run([sys.executable, str(CHILD), "cli", "restore", *args], cwd=ROOT,
                              env=self.env(visible), capture_output=True, text=True,
                              timeout=CHILD_TIMEOUT_S)  # fmt: skip

    def config(self, log_dir: Path) -> Path:
        path = self.root / f"{log_dir.name}.yaml"
        path.write_text(f"backend: nvml\nlogging:\n  log_dir: {log_dir}\n")
        return path

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@pytest.fixture
def host(tmp_path):
    h = Host(tmp_path)
    yield h
    h.stop_all()


@pytest.fixture
def host2(tmp_path):
    h = Host(tmp_path, gpus=2)
    yield h
    h.stop_all()


def test_a_second_profiler_on_the_same_gpu_observes_and_every_gpu_ends_at_its_original(host, record_fault):
    """Two runs on one GPU, different log dirs: the second must not record the first's limit as original."""
    first = host.hold(host.root / "a")
    held_W = host.limits_W()[0]
    second = host.run(host.root / "b")
    problems = []
    if not (second["observe"] and "another run is profiling GPU 0" in second["observe_reason"]):
        problems.append(f"the second run did not observe: {second}")
    if (host.root / "b" / MARKER_NAME).exists():
        problems.append("the second run wrote a marker")
    if host.limits_W()[0] != held_W:
        problems.append(f"the second run changed the first's limit {held_W} W to {host.limits_W()[0]} W")
    first.send_signal(signal.SIGTERM)
    first.wait(timeout=CHILD_TIMEOUT_S)
    if host.limits_W() != ORIGINAL_W[:1]:
        problems.append(f"GPU ends at {host.limits_W()} W, not {ORIGINAL_W[:1]}")
    assert record_fault("restore protocol: two profilers on one GPU", not problems), problems


def test_a_killed_owner_is_put_back_by_the_next_run_elsewhere_then_its_marker_goes(host, record_fault):
    """SIGKILL leaves the GPU changed; a run on another log dir restores the original before profiling."""
    first = host.hold(host.root / "a")
    first.kill()
    first.wait(timeout=CHILD_TIMEOUT_S)
    assert host.limits_W()[0] != ORIGINAL_W[0] and (host.root / "a" / MARKER_NAME).exists()
    second = host.run(host.root / "b")  # another log dir: it cannot see the marker, only the GPU's record
    problems = []
    if second["observe"]:
        problems.append(f"the second run could not profile: {second}")
    if host.limits_W() != ORIGINAL_W[:1]:
        problems.append(f"after the second run the GPU is at {host.limits_W()} W, not {ORIGINAL_W[:1]}")
    done = host.restore("--config", str(host.config(host.root / "a")), "--json")
    report = json.loads(done.stdout)
    if done.returncode != 0 or [r["action"] for r in report["restored"]] != ["already"]:
        problems.append(f"restore of the dead owner's marker: rc {done.returncode}, {report}")
    if (host.root / "a" / MARKER_NAME).exists():
        problems.append("the dead owner's marker is still there although its GPU is back")
    if host.limits_W() != ORIGINAL_W[:1]:
        problems.append(f"GPU ends at {host.limits_W()} W")
    assert record_fault("restore protocol: owner SIGKILLed", not problems), problems


def test_a_live_owner_is_refused_by_restore_and_by_a_run_on_its_log_dir(host, record_fault):
    """Nobody restores or deletes the marker of a live run (the attack: then SIGKILL, and no marker left)."""
    log_dir = host.root / "a"
    first = host.hold(log_dir)
    held_W = host.limits_W()[0]
    marker = json.loads((log_dir / MARKER_NAME).read_text())
    problems = []
    done = host.restore("--config", str(host.config(log_dir)))
    if done.returncode != 1 or "owner (pid" not in done.stderr or "is alive" not in done.stderr:
        problems.append(f"restore of a live owner's marker: rc {done.returncode}, {done.stderr[-500:]}")
    if "Traceback" in done.stderr:
        problems.append("restore printed a traceback")
    same_dir = host.run(log_dir)  # a second run on the same log dir
    if not same_dir["observe"]:
        problems.append(f"a second run on the live owner's log dir profiled: {same_dir}")
    if json.loads((log_dir / MARKER_NAME).read_text()) != marker or host.limits_W()[0] != held_W:
        problems.append("the live owner's marker or limit was touched")
    first.kill()  # now the owner dies: the marker is all that is left
    first.wait(timeout=CHILD_TIMEOUT_S)
    done = host.restore("--config", str(host.config(log_dir)))
    if done.returncode != 0 or "power limit restored to 250 W" not in done.stdout:
        problems.append(f"restore after the owner died: rc {done.returncode}, {done.stdout} {done.stderr[-500:]}")
    if (log_dir / MARKER_NAME).exists() or host.limits_W() != ORIGINAL_W[:1]:
        problems.append(f"GPU ends at {host.limits_W()} W, marker exists: {(log_dir / MARKER_NAME).exists()}")
    assert record_fault("restore protocol: live owner", not problems), problems


def test_restore_force_overrides_a_live_owner(host):
    log_dir = host.root / "a"
    host.hold(log_dir)
    done = host.restore("--config", str(host.config(log_dir)), "--force")
    assert done.returncode == 0, done.stderr
    assert host.limits_W() == ORIGINAL_W[:1] and not (log_dir / MARKER_NAME).exists()


def test_a_restore_that_sees_fewer_gpus_restores_those_by_uuid_and_keeps_the_rest(host2, record_fault):
    log_dir = host2.root / "a"
    first = host2.hold(log_dir)  # changes both GPUs
    first.kill()
    first.wait(timeout=CHILD_TIMEOUT_S)
    left_W = host2.limits_W()
    assert left_W[0] != ORIGINAL_W[0] and left_W[1] != ORIGINAL_W[1]
    problems = []
    # This shell sees NVML GPU 1 only, as its device 0: by index it would write GPU 0's limit there.
    done = host2.restore("--config", str(host2.config(log_dir)), "--json", visible="1")
    report = json.loads(done.stdout)
    if done.returncode != 1 or [(r["uuid"], r["limit_W"]) for r in report["restored"]] != [(UUIDS[1], 260.0)]:
        problems.append(f"narrow restore: rc {done.returncode}, {report}")
    if host2.limits_W() != [left_W[0], ORIGINAL_W[1]]:
        problems.append(f"after the narrow restore the GPUs are at {host2.limits_W()} W")
    kept = json.loads((log_dir / MARKER_NAME).read_text())["gpus"] if (log_dir / MARKER_NAME).exists() else []
    if [g["uuid"] for g in kept] != [UUIDS[0]]:
        problems.append(f"the marker should keep GPU 0 only, it holds {kept}")
    done = host2.restore("--config", str(host2.config(log_dir)))
    if done.returncode != 0 or (log_dir / MARKER_NAME).exists():
        problems.append(f"full restore: rc {done.returncode}, {done.stdout} {done.stderr[-500:]}")
    if host2.limits_W() != ORIGINAL_W:
        problems.append(f"GPUs end at {host2.limits_W()} W, not {ORIGINAL_W}")
    assert record_fault("restore protocol: narrower CUDA_VISIBLE_DEVICES", not problems), problems


@pytest.mark.parametrize("marker_W", [900.0, 50.0])
def test_a_marker_limit_outside_the_range_is_clamped_with_a_warning(host, marker_W, record_fault):
    """The H200 takes 200-700 W: the nearest end is set, said so, and no traceback."""
    log_dir = host.root / "a"
    log_dir.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (log_dir / MARKER_NAME).write_text(json.dumps(
        {"version": 2, "owner": {"pid": dead.pid}, "gpus": [{"index": 0, "uuid": UUIDS[0],
                                                             "original_limit_W": marker_W}]}))  # fmt: skip
    done = host.restore("--config", str(host.config(log_dir)))
    expected_W = min(max(marker_W, 200.0), 700.0)
    ok = (done.returncode == 0 and "Traceback" not in done.stderr and "outside the device's range" in done.stdout
          and host.limits_W() == [expected_W] and not (log_dir / MARKER_NAME).exists())  # fmt: skip
    assert record_fault("restore protocol: marker limit out of range", ok), (done.stdout, done.stderr[-2000:])


def test_the_fake_nvml_limit_outlives_its_process(host):
    """The premise of this file: a limit set in one process is the limit the next one reads."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from tests.faults.nvml_child import fake_nvml; "
        "f = fake_nvml(); f.nvmlInit(); "
        "f.nvmlDeviceSetPowerManagementLimit(f.nvmlDeviceGetHandleByIndex(0), 333000)"
    )
    subprocess.run([sys.executable, "-c", code, str(ROOT)], env=host.env(), check=True, timeout=CHILD_TIMEOUT_S)
    assert host.limits_W() == [333.0]
    fake = FakePyNVML(state_path=host.state)
    fake.nvmlInit()
    assert fake.limit_W(0) == 333.0
    assert os.environ.get(STATE_ENV) is None  # the shared state is opt-in: other tests keep in-memory fakes
