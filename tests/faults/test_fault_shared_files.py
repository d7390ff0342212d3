"""Files in a shared log directory: another user's planted markers, links, caches and stores are never acted on.

The attacker is a real second Unix user (``nobody``, through ``setpriv``), which needs root; the
run under attack is this (root) process, as on a cluster where training runs as root. A victim
file (root's, mode 0600, in a directory only root can enter) stands for anything a followed link
could overwrite. Without root (or ``setpriv``) these cases are skipped with the reason; the
umask and link rules that need no second user are checked in any case.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.test_power_limit import simulate_session
from tests.timeouts import CHILD_TIMEOUT_S
from zeus_callbacks._atomic_io import atomic_output, write_json_atomic
from zeus_callbacks.backends.base import ManualClock
from zeus_callbacks.backends.virtual import VirtualGPUBackend
from zeus_callbacks.errors import StoreError
from zeus_callbacks.optimizers.power_limit import CACHE_NAME, MARKER_NAME, JsonProfileCache, ProfileKey
from zeus_callbacks.session import EnergySession
from zeus_callbacks.store import open_store

OTHER_UID = 65534  # nobody
SECRET = b"root's precious 0600 file\n"

can_switch_user = os.geteuid() == 0 and shutil.which("setpriv") is not None and sys.platform == "linux"
needs_second_user = pytest.mark.skipif(
    not can_switch_user, reason="a second Unix user needs root and setpriv (util-linux)"
)


def as_other_user(*argv: str) -> None:
    """Run ``argv`` as ``nobody`` (no groups), as another user of the shared directory would."""
    subprocess.run(
        ["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups", *argv],
        check=True,
        timeout=CHILD_TIMEOUT_S,
    )


@pytest.fixture
def shared_dir():
    """A log directory every user may write (a group project directory; not sticky)."""
    path = Path(tempfile.mkdtemp(prefix="zeus-shared-", dir="/tmp"))
    os.chmod(path, 0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def victim(tmp_path):
    path = tmp_path / "victim"
    path.write_bytes(SECRET)
    os.chmod(path, 0o600)
    return path


def plant_link(target: Path, at: Path) -> None:
    as_other_user("ln", "-s", str(target), str(at))
    assert at.is_symlink() and os.lstat(at).st_uid == OTHER_UID


@needs_second_user
def test_another_users_marker_never_sets_this_users_gpu(shared_dir, record_fault, caplog):
    """A marker planted by another user (limit 100 W) must not be applied, even with profiling off."""
    content = json.dumps({"pid": 999999, "gpus": [{"index": 0, "original_limit_W": 100.0}]})
    as_other_user("sh", "-c", f"printf '%s' '{content}' > {shared_dir / MARKER_NAME}")
    backend = VirtualGPUBackend(clock=ManualClock(1000.0), read_only=False)
    before_W = backend.power_limit_W(0)
    with caplog.at_level(logging.WARNING):
        session = EnergySession({"backend": "virtual", "logging": {"log_dir": str(shared_dir), "run_name": "r"}},
                                backend=backend, is_main_process=True)  # fmt: skip
        session.train_start()
        session.train_end()
    ok = (backend.power_limit_W(0) == before_W and (shared_dir / MARKER_NAME).read_text() == content
          and any("owned by uid 65534" in r.getMessage() for r in caplog.records))  # fmt: skip
    assert record_fault("shared files: another user's marker", ok), (backend.power_limit_W(0), caplog.text[-2000:])


@needs_second_user
def test_links_at_the_plot_and_cache_are_replaced_never_followed(shared_dir, victim, record_fault):
    plant_link(victim, shared_dir / "run.power_limit.png")
    plant_link(victim, shared_dir / CACHE_NAME)
    backend = VirtualGPUBackend(clock=ManualClock(1000.0), noise_W=3.0, read_only=False)
    session, _ = simulate_session(shared_dir, backend, plot=True, cache=True)
    result = session.power_limiter.result
    session.train_end()
    problems = []
    if result is None or result.source != "profile":
        problems.append(f"the run did not profile: {result}")
    if victim.read_bytes() != SECRET or stat.S_IMODE(victim.stat().st_mode) != 0o600:
        problems.append("the victim file was written through a link")
    png = shared_dir / "run.power_limit.png"
    if png.is_symlink() or not png.read_bytes().startswith(b"\x89PNG"):
        problems.append("the plot was not written as a file of its own")
    if not (shared_dir / CACHE_NAME).is_symlink():  # another user's link: left alone, the cache is not written
        problems.append("the cache link was replaced although it is another user's")
    assert record_fault("shared files: links at the plot and cache", not problems), problems


@needs_second_user
def test_a_link_at_the_marker_path_makes_the_run_observe(shared_dir, victim, record_fault):
    plant_link(victim, shared_dir / MARKER_NAME)
    backend = VirtualGPUBackend(clock=ManualClock(1000.0), noise_W=3.0, read_only=False)
    before_W = backend.power_limit_W(0)
    session, applied = simulate_session(shared_dir, backend, plot=False, cache=False)
    limiter = session.power_limiter
    session.train_end()
    ok = (victim.read_bytes() == SECRET and limiter.observe and set(applied) == {before_W}
          and (shared_dir / MARKER_NAME).is_symlink())  # fmt: skip
    assert record_fault("shared files: a link at the marker path", ok), (limiter.observe_reason, set(applied))


@needs_second_user
@pytest.mark.parametrize("backend", ["json", "sqlite"])
def test_another_users_store_is_not_opened_for_writing(shared_dir, backend, record_fault):
    path = shared_dir / f"store.{'json' if backend == 'json' else 'db'}"
    open_store(path, backend).close()  # a valid store ...
    os.chown(path, OTHER_UID, OTHER_UID)  # ... that belongs to another user
    with pytest.raises(StoreError, match="owned by uid 65534") as err:
        open_store(path, backend)
    assert record_fault("shared files: another user's store", "not opened for writing" in str(err.value))
    open_store(path, backend, read_only=True).close()  # reading it (show, simulate) stays allowed


@needs_second_user
def test_another_users_cache_is_ignored(shared_dir, caplog):
    key = ProfileKey("job", "GPU", 32, 1, "zeus_cost")
    path = shared_dir / CACHE_NAME
    as_other_user("sh", "-c", f"printf '%s' '{json.dumps({key.as_str(): {'chosen_limit_W': 100.0}})}' > {path}")
    cache = JsonProfileCache(path)
    with caplog.at_level(logging.WARNING):
        assert cache.get(key) is None
    assert "owned by uid 65534" in caplog.text
    with pytest.raises(OSError, match="not writing the power-limit cache"):
        cache.put(key, {"chosen_limit_W": 200.0})


# -- no second user needed --------------------------------------------------------------------
@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002, 0o077])
def test_new_files_get_the_umasks_permissions(tmp_path, umask):
    old = os.umask(umask)
    try:
        write_json_atomic(tmp_path / "a.json", {"x": 1})
        with atomic_output(tmp_path / "b.png", "wb") as fh:
            fh.write(b"png")
        with open(tmp_path / "reference", "w"):  # what plain open() gives under this umask
            pass
    finally:
        os.umask(old)
    expected = stat.S_IMODE((tmp_path / "reference").stat().st_mode)
    assert expected == 0o666 & ~umask
    assert {stat.S_IMODE((tmp_path / n).stat().st_mode) for n in ("a.json", "b.png")} == {expected}


def test_a_link_at_the_target_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(SECRET)
    link = tmp_path / "out.json"
    link.symlink_to(victim)
    write_json_atomic(link, {"x": 1})
    assert victim.read_bytes() == SECRET and not link.is_symlink() and json.loads(link.read_text()) == {"x": 1}
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
