"""The restore protocol's parts in one process: owners, markers by UUID, the per-GPU lock, the cleanup registry.

The cross-process cases (concurrent profilers, killed and live owners) are in
tests/faults/test_fault_restore.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.fake_pynvml import FakePyNVML
from zeus_callbacks._lifecycle import CLEANUPS, CleanupOrder
from zeus_callbacks.backends._nvml import NVMLBackend
from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.config import parse_config
from zeus_callbacks.optimizers.power_limit import GpuLock, Owner, PowerLimitController, read_marker, write_marker
from zeus_callbacks.optimizers.power_limit._owner import boot_id, process_start_ticks

T0 = 1_800_000_000.0


def nvml_backend(num_gpus: int = 1) -> tuple[NVMLBackend, FakePyNVML]:
    fake = FakePyNVML(num_gpus=num_gpus, time_fn=ManualClock(T0).now_s)
    return NVMLBackend(nvml_module=fake, clock=ManualClock(T0), read_only=False), fake


def controller(backend, tmp_path: Path) -> PowerLimitController:
    cfg = parse_config({"power_limit": {"enabled": True, "plot": False, "cache": False}}).power_limit
    return PowerLimitController(cfg, backend, range(backend.device_count()), lambda a, b, **_: None, log_dir=tmp_path)


def exited_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_this_process_is_named_by_pid_start_time_boot_id_and_host():
    me = Owner.this_process()
    assert me.pid == os.getpid() and me.host == socket.gethostname()
    if sys.platform == "linux":
        assert me.boot_id == Path("/proc/sys/kernel/random/boot_id").read_text().strip() == boot_id()
        assert me.start_ticks == process_start_ticks(os.getpid()) is not None
    assert me.is_alive()


@pytest.mark.parametrize(
    "change, why",
    [
        ({"pid": "exited"}, "the PID has exited"),
        ({"boot_id": "00000000-0000-0000-0000-000000000000"}, "another boot"),
        ({"host": "some-other-host"}, "another host: nothing of it runs here"),
        ({"start_ticks": -1}, "the PID is alive but was reused by another process"),
    ],
)
def test_an_owner_is_dead_when(change, why):
    me = Owner.this_process()
    fields = {**me.as_json(), **change}
    if fields["pid"] == "exited":
        fields["pid"] = exited_pid()
    if change.get("start_ticks") and me.start_ticks is None:
        pytest.skip("no /proc start time here")
    assert not Owner.from_json(fields).is_alive(), why


def test_the_marker_records_each_gpu_by_uuid_and_its_owner(tmp_path):
    backend, fake = nvml_backend(num_gpus=2)
    path = tmp_path / "m.json"
    write_marker(path, backend, {0: 250.0, 1: 260.0})
    data = json.loads(path.read_text())
    assert [g["uuid"] for g in data["gpus"]] == [g.uuid for g in fake.gpus]
    assert data["version"] == 2 and Owner.from_json(data["owner"]) == Owner.this_process()
    marker = read_marker(path)
    assert marker.limits_W == {0: 250.0, 1: 260.0} and marker.owner.is_alive()


def test_a_second_controller_on_the_same_gpu_observes_until_the_first_restores(tmp_path):
    backend, fake = nvml_backend()
    first = controller(backend, tmp_path / "a")
    assert not first.observe
    first.apply(300.0)  # the first change: the GPU's record and the marker are written first
    lock = GpuLock(fake.gpus[0].uuid)
    assert lock.read_record()[0] == 700.0
    second = controller(backend, tmp_path / "b")
    assert second.observe and "another run is profiling GPU 0" in second.observe_reason
    assert second.original_W == {0: 300.0}  # what it sees, never written anywhere as an original
    second.apply(200.0)
    assert backend.power_limit_W(0) == 300.0 and not (tmp_path / "b" / "power_limit_restore.json").exists()
    first.restore()
    assert backend.power_limit_W(0) == 700.0 and lock.read_record() is None
    third = controller(backend, tmp_path / "c")  # the lock was let go with the restore
    assert not third.observe
    third.restore()


def test_the_controller_restores_through_the_one_cleanup_registry(tmp_path):
    backend, _ = nvml_backend()
    limiter = controller(backend, tmp_path)
    limiter.apply(300.0)
    mine = [r for r in CLEANUPS.registered if r.what == "restoring the original power limits"]
    assert len(mine) == 1 and mine[0].order == CleanupOrder.RESTORE_POWER_LIMITS and mine[0].at_exit
    mine[0].cleanup()  # what SIGTERM or interpreter exit runs
    assert backend.power_limit_W(0) == 700.0
    assert not [r for r in CLEANUPS.registered if r.what == "restoring the original power limits"]


def test_an_unsafe_lock_directory_means_observe(tmp_path, monkeypatch):
    locks = tmp_path / "locks"
    locks.mkdir()
    os.chmod(locks, 0o777)  # anyone could swap a lock file: an flock there proves nothing
    monkeypatch.setenv("ZEUS_CALLBACKS_LOCK_DIR", str(locks))
    backend, _ = nvml_backend()
    limiter = controller(backend, tmp_path)
    assert limiter.observe and "writable by others and not sticky" in limiter.observe_reason


def test_a_lock_taken_over_from_a_killed_owner_puts_its_original_back_first(tmp_path):
    backend, fake = nvml_backend()
    backend.set_power_limit_W(0, 250.0)
    dead = Owner.from_json({**Owner.this_process().as_json(), "pid": exited_pid()})
    GpuLock(fake.gpus[0].uuid).write_record(250.0, dead, tmp_path / "gone" / "marker.json")
    backend.set_power_limit_W(0, 210.0)  # the dead owner's profiling limit, still in force
    limiter = controller(backend, tmp_path)
    assert not limiter.observe and limiter.original_W == {0: 250.0}
    limiter.restore()


def _as_host(monkeypatch, host: str) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: host)


def _restarted_run(tmp_path: Path, limit_W: float):
    """A run's session start on a virtual GPU left at ``limit_W`` (where a killed run put it)."""
    from zeus_callbacks.backends.virtual import VirtualGPUBackend
    from zeus_callbacks.session import EnergySession

    backend = VirtualGPUBackend(clock=ManualClock(T0), noise_W=0.0, read_only=False)
    backend.set_power_limit_W(0, limit_W)
    session = EnergySession(
        {"backend": "virtual", "logging": {"log_dir": str(tmp_path), "jsonl": False}},
        backend=backend,
        is_main_process=True,
    )
    session.train_start()  # restores what an earlier run in its place left
    restored_W = backend.power_limit_W(0)
    session.train_end()
    backend.close()
    return restored_W


def test_ranks_of_two_hosts_with_the_same_local_rank_write_and_restore_only_their_own_markers(tmp_path, monkeypatch):
    from zeus_callbacks.backends.virtual import VirtualGPUBackend
    from zeus_callbacks.optimizers.power_limit import marker_path

    monkeypatch.setenv("WORLD_SIZE", "4")  # two nodes of two GPUs, one log directory
    monkeypatch.setenv("LOCAL_RANK", "0")
    originals = {"node-a": 250.0, "node-b": 260.0}
    paths = {}
    for host, original_W in originals.items():  # each node's rank 0 was killed mid-profiling
        _as_host(monkeypatch, host)
        paths[host] = marker_path(tmp_path)
        write_marker(
            paths[host],
            VirtualGPUBackend(clock=ManualClock(T0)),
            {0: original_W},
            owner=Owner(exited_pid(), host, boot_id(), None),
        )
    assert paths["node-a"] != paths["node-b"] and all(p.exists() for p in paths.values())
    assert {p.name for p in paths.values()} == {
        "power_limit_restore.node-a.rank0.json",
        "power_limit_restore.node-b.rank0.json",
    }
    b_bytes = paths["node-b"].read_bytes()
    _as_host(monkeypatch, "node-a")
    assert _restarted_run(tmp_path, 150.0) == 250.0  # node a's original, not node b's
    assert not paths["node-a"].exists() and paths["node-b"].read_bytes() == b_bytes
    _as_host(monkeypatch, "node-b")
    assert _restarted_run(tmp_path, 150.0) == 260.0
    assert not paths["node-b"].exists()


def test_a_rank_marker_of_the_old_name_is_still_restored_by_its_own_host_only(tmp_path, monkeypatch):
    from zeus_callbacks.backends.virtual import VirtualGPUBackend

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    old = tmp_path / "power_limit_restore.rank0.json"  # as versions before host names wrote it
    _as_host(monkeypatch, "node-a")
    write_marker(
        old, VirtualGPUBackend(clock=ManualClock(T0)), {0: 250.0}, owner=Owner(exited_pid(), "node-a", boot_id(), None)
    )
    kept = old.read_bytes()
    _as_host(monkeypatch, "node-b")  # its GPU 0 is not node a's (no UUID to tell): refused, untouched
    assert _restarted_run(tmp_path, 150.0) == 150.0 and old.read_bytes() == kept
    _as_host(monkeypatch, "node-a")
    assert _restarted_run(tmp_path, 150.0) == 250.0 and not old.exists()


def test_another_nodes_old_named_marker_is_left_as_it_is_and_keeps_this_rank_from_changing_limits(
    tmp_path, monkeypatch
):
    from zeus_callbacks.optimizers.power_limit import restore_from_marker

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    old = tmp_path / "power_limit_restore.rank0.json"
    old.write_text(
        json.dumps(
            {
                "version": 2,
                "backend": "nvml",
                "owner": {"pid": exited_pid(), "host": "node-b"},
                "gpus": [{"index": 0, "uuid": "GPU-of-node-b", "original_limit_W": 250.0}],
            }
        )
    )
    kept = old.read_bytes()
    backend, _ = nvml_backend()
    outcome = restore_from_marker(old, backend)  # its GPU is not here: nothing back, nothing rewritten
    assert [r.action for r in outcome.gpus] == ["not_visible"] and old.read_bytes() == kept
    limiter = controller(backend, tmp_path)
    limiter.apply(300.0)
    assert limiter.observe and str(old) in limiter.observe_reason and backend.power_limit_W(0) == 700.0
    limiter.restore()
