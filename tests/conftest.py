"""Shared fixtures: virtual GPUs on a manual clock or on the wall clock (only hardware is faked)."""

from __future__ import annotations

import os

# One compute thread per test process, set before torch is imported (its children inherit it):
# pytest-xdist runs four workers on the CI's two cores, and each torch process would spin a pool of
# OpenMP threads per core; oversubscribed, a 96×96 matmul loop once took over the 300 s timeout.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

from zeus_callbacks.backends.base import ManualClock, WallClock  # noqa: E402

# Hypothesis's default 200 ms deadline per example is a wall-clock race: under four workers on two loaded
# cores, test_pooling_keeps_a_straight_cost_line... exceeded it. The property still runs every example.
settings.register_profile("any-machine", deadline=None)
settings.load_profile("any-machine")
from zeus_callbacks.backends.virtual import VirtualGPUBackend  # noqa: E402

MANUAL_START_S = 1_000.0
"""Start time of the manual clock (s); any value works, a non-zero one catches origin bugs."""


@pytest.fixture
def manual_clock() -> ManualClock:
    """A clock that only moves when a test advances it."""
    return ManualClock(MANUAL_START_S)


@pytest.fixture
def virtual_backend(manual_clock: ManualClock):
    """One noise-free virtual GPU, busy at its maximum power limit, on ``manual_clock``."""
    backend = VirtualGPUBackend(clock=manual_clock, noise_W=0.0, read_only=True)
    yield backend
    backend.close()


@pytest.fixture
def wall_virtual_backend():
    """One noise-free virtual GPU on the real (wall) clock."""
    backend = VirtualGPUBackend(clock=WallClock(), noise_W=0.0, read_only=True)
    yield backend
    backend.close()


@pytest.fixture(autouse=True)
def _no_lease_left_renewing():
    """A test that leaves a trial running must not leave the lease keeper renewing it during later tests.

    Later tests fork (the SIGKILL suite): a child forked while that thread is inside SQLite can hang.
    """
    yield
    from zeus_callbacks.store._lease import KEEPER

    KEEPER.release_all()


@pytest.fixture(autouse=True)
def _private_gpu_lock_dir(tmp_path_factory, monkeypatch):
    """Each test's per-GPU profiling locks live in its own directory (the fakes' GPU UUIDs repeat across tests)."""
    monkeypatch.setenv("ZEUS_CALLBACKS_LOCK_DIR", str(tmp_path_factory.mktemp("gpu-locks")))


# The fault-injection and truth-or-flag tallies (tests/faults/tally.py): each pytest-xdist worker
# sends its counts to the controller, which prints one summary; without xdist this process prints.
def pytest_sessionfinish(session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        from tests.faults import tally

        workeroutput[tally.WORKER_OUTPUT_KEY] = tally.snapshot()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    from tests.faults import tally

    tally.merge(getattr(node, "workeroutput", {}).get(tally.WORKER_OUTPUT_KEY, {}))


def pytest_terminal_summary(terminalreporter) -> None:
    from tests.faults import tally

    tally.write_summary(terminalreporter)
