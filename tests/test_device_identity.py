"""run_start says which device stands behind cuda:0: the vendor's index and UUID (issue 26, state and identity).

With ``CUDA_VISIBLE_DEVICES=3`` the right GPU was measured, but no record said which NVML device it was.
The NVML and amdsmi cases run a real EnergySession over the real backends driven by the repository's
fakes of pynvml and amdsmi (their UUIDs and enumeration are the fakes', not invented here).
"""

from __future__ import annotations

import pytest

from zeus_callbacks.backends._amdsmi import AMDSMIBackend
from zeus_callbacks.backends._nvml import NVMLBackend
from zeus_callbacks.backends._unavailable import UnavailableBackend
from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.cli import main
from zeus_callbacks.reporting import read_jsonl
from zeus_callbacks.session import EnergySession

try:
    from tests.fakes import fake_amdsmi as fa
    from tests.fakes import fake_pynvml as fp
except ImportError:  # tests/ is not a package: pytest put tests/ itself on sys.path
    from fakes import fake_amdsmi as fa
    from fakes import fake_pynvml as fp

T0 = 1_800_000_000.0  # realtime seconds, on the fakes' 100 ms sensor grid


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for env in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "ZEUS_CALLBACKS_READ_ONLY"):
        monkeypatch.delenv(env, raising=False)


def _run_start(tmp_path, backend) -> dict:
    """Start and end a run of one step on ``backend``; return its run_start record."""
    session = EnergySession(
        {"backend": backend.name, "logging": {"log_dir": str(tmp_path), "run_name": "id"}},
        backend=backend, is_main_process=True,
    )  # fmt: skip
    session.train_start()
    session.step_start(0)
    backend.clock.advance(0.1)
    session.step_end(0)
    summary = session.train_end()
    (start,) = [r for r in read_jsonl(summary.jsonl_path) if r["event"] == "run_start"]
    return start


def test_virtual_gpu_has_a_made_up_id_marked_virtual(tmp_path, virtual_backend):
    start = _run_start(tmp_path, virtual_backend)
    (device,) = start["devices"]
    assert device["index"] == 0 == start["gpu_indices"][0]
    assert device["backend_index"] == 0
    assert device["uuid"] == "VIRTUAL-GPU-0" and device["virtual"] is True
    assert "made up" in device["note"] and device["name"] == virtual_backend.device_name(0)
    # The made-up id is for people reading the log: locks and restore markers still see no UUID.
    assert virtual_backend.device_uuid(0) is None


def test_the_virtual_id_is_the_same_in_every_run(tmp_path, manual_clock):
    from zeus_callbacks.backends.virtual import VirtualGPUBackend

    ids = []
    for run in range(2):
        backend = VirtualGPUBackend(clock=manual_clock, num_devices=2, noise_W=0.0, read_only=True, seed=run)
        ids.append([backend.device_identity(i).uuid for i in range(2)])
        backend.close()
    assert ids[0] == ids[1] == ["VIRTUAL-GPU-0", "VIRTUAL-GPU-1"]


def test_each_process_of_a_launched_job_has_its_own_virtual_gpu_id(monkeypatch):
    # An outside tester: both ranks of a 2-process run named their virtual GPU VIRTUAL-GPU-0.
    ids = []
    for rank in (0, 1):
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        session = EnergySession({"backend": "virtual"}, is_main_process=rank == 0)
        backend = session.open_backend()
        ids.append(backend.device_identity(0).uuid)
        backend.close()
    assert ids == ["VIRTUAL-GPU-RANK0-0", "VIRTUAL-GPU-RANK1-0"]
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("LOCAL_RANK")
    alone = EnergySession({"backend": "virtual"}).open_backend()
    assert alone.device_identity(0).uuid == "VIRTUAL-GPU-0"  # one process: as before
    alone.close()


def test_report_of_a_several_process_run_says_its_devices_are_rank_0s(tmp_path, capsys, virtual_backend):
    import json

    start = _run_start(tmp_path, virtual_backend)
    log = tmp_path / "id.jsonl"
    records = read_jsonl(log)
    end = records[-1]
    assert start["devices"] and end["event"] == "run_end"
    # The run_end of a 2-process job (as the main process writes it): the header counts both ranks' GPUs.
    end.update(world_size=2, gpu_energy_J=[end["energy_J"] / 2] * 2)
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["report", str(log)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "2 GPU(s) over 2 processes" in out
    assert "GPU(s) of rank 0 only (the main process's; each of the 2 processes measured its own" in out
    assert out.index("GPU(s) of rank 0 only") < out.index("GPU 0: virtual index 0")


def test_report_of_a_several_process_run_names_rank_0s_gpus_not_this_processs(tmp_path, capsys, virtual_backend):
    # Outside tester: the header of a 2-process log read "(this process's: Virtual A40 ...)", the words of the
    # run's own summary; read afterwards, the log is the main process's: rank 0's.
    import json

    _run_start(tmp_path, virtual_backend)
    log = tmp_path / "id.jsonl"
    records = read_jsonl(log)
    end = records[-1]
    end.update(world_size=2, gpu_energy_J=[end["energy_J"] / 2] * 2,
               backend="virtual: 2 GPU(s) over 2 processes (this process's: Virtual A40 (imagenet))")  # fmt: skip
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["report", str(log)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "on virtual: 2 GPU(s) over 2 processes (rank 0's: Virtual A40 (imagenet))" in out
    assert "this process's" not in out


def test_nvml_under_cuda_visible_devices_names_the_nvml_device_behind_cuda_0(tmp_path, monkeypatch, capsys):
    clock = ManualClock(T0)
    fake = fp.FakePyNVML(num_gpus=4, time_fn=clock.now_s)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    backend = NVMLBackend(nvml_module=fake, clock=clock, read_only=True)
    start = _run_start(tmp_path, backend)
    (device,) = start["devices"]
    assert device == {
        "index": 0, "backend_index": 3, "uuid": fake.gpus[3].uuid, "name": fake.gpus[3].name,
        "virtual": False, "note": None,
    }  # fmt: skip
    assert device["uuid"] == fake.nvmlDeviceGetUUID(fake.nvmlDeviceGetHandleByIndex(3))
    # `report` says it too.
    assert main(["report", str(tmp_path / "id.jsonl")]) == 0
    assert f"  GPU 0: nvml index 3, {fake.gpus[3].uuid}\n" in capsys.readouterr().out


def test_nvml_identity_follows_the_visible_order(monkeypatch):
    clock = ManualClock(T0)
    fake = fp.FakePyNVML(num_gpus=4, time_fn=clock.now_s)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{fake.gpus[2].uuid},0")
    backend = NVMLBackend(nvml_module=fake, clock=clock, read_only=True)
    calls = dict(fake.calls)
    identities = [backend.device_identity(i) for i in range(2)]
    assert [(d.index, d.backend_index, d.uuid) for d in identities] == [
        (0, 2, fake.gpus[2].uuid), (1, 0, fake.gpus[0].uuid)
    ]  # fmt: skip
    assert dict(fake.calls) == calls  # no NVML call: what discovery read
    backend.close()


def test_amdsmi_under_hip_visible_devices_names_the_amdsmi_device(tmp_path, monkeypatch):
    clock = ManualClock(T0)
    fake = fa.FakeAMDSMI(num_gpus=4, time_fn=clock.now_s)
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "2")
    backend = AMDSMIBackend(amdsmi_module=fake, clock=clock, read_only=True)
    start = _run_start(tmp_path, backend)
    (device,) = start["devices"]
    handle = fake.amdsmi_get_processor_handles()[2]
    assert device["backend_index"] == 2 and device["uuid"] == fake.amdsmi_get_gpu_device_uuid(handle)
    assert device["virtual"] is False and device["note"] is None


def test_amdsmi_without_a_uuid_says_why(monkeypatch):
    clock = ManualClock(T0)
    fake = fa.FakeAMDSMI(num_gpus=1, time_fn=clock.now_s)
    fake.make_unsupported("amdsmi_get_gpu_device_uuid")
    backend = AMDSMIBackend(amdsmi_module=fake, clock=clock, read_only=True)
    identity = backend.device_identity(0)
    assert identity.uuid is None and identity.backend_index == 0 and "UUID" in identity.note
    backend.close()


def test_an_unmeasurable_gpu_gives_its_index_and_the_reason():
    from zeus_callbacks.backends._detect import GPUPresence

    backend = UnavailableBackend(GPUPresence(nvidia_nodes=("nvidia0",)), "nvmlInit failed", "fix")
    identity = backend.device_identity(0)
    assert (identity.index, identity.backend_index, identity.uuid) == (0, None, None)
    assert "nvmlInit failed" in identity.note
