"""``copy_store`` / ``zeus-callbacks store copy``: every record of one store into a new store of any kind."""

from __future__ import annotations

import numpy as np
import pytest

from tests.store_contract import _open, new_location
from zeus_callbacks.cli._main import main
from zeus_callbacks.store import BanditState, StoreError, copy_store
from zeus_callbacks.store._base import snapshot

KINDS = ["sqlite", "json", "postgresql"]


def _bandit_state(min_cost: float) -> dict:
    """A bandit state of batch sizes 64 and 128 as the bandit writes it (show reads it)."""
    return {"phase": "pruning", "round": 0, "direction": "start", "start": 64, "candidate": 64, "survivors": [64, 128],
            "rng": np.random.PCG64(0).state, "batch_sizes": [64, 128], "min_cost": min_cost}  # fmt: skip


def _fill(location: str, kind: str) -> None:
    with _open(kind, location) as store:
        store.ensure_job("nightly", {"workload": "imagenet"})
        done = store.create_trial("nightly", 64, 250.0, info={"round": 0}, pid=1, pending_id="p-1")
        store.finish_trial(done.trial_id, status="completed", energy_J=10.5, time_s=2.0, cost=7.0, converged=True)
        store.create_trial("nightly", 128, pid=1)  # running, of another process
        store.create_trial("other", 8, pid=1)
        store.update_bandit("nightly", lambda s: (BanditState(s.job_id, _bandit_state(7.0), {64: {"n": 1}}), None))
        store.update_bandit("nightly", lambda s: (BanditState(s.job_id, _bandit_state(6.0), {64: {"n": 2}}), None))
        store.put_profile("A40/bs64", {"limits_W": [200.0, 300.0], "time_s": [1.25, 1.0]})


@pytest.mark.parametrize("dst_kind", KINDS)
@pytest.mark.parametrize("src_kind", KINDS)
def test_a_copy_holds_every_record_as_it_was(tmp_path, src_kind, dst_kind):
    src, dst = new_location(src_kind, tmp_path / "a", "src"), new_location(dst_kind, tmp_path / "b", "dst")
    _fill(src, src_kind)
    assert copy_store(src, dst) == (2, 3, 1, 1)
    with _open(src_kind, src, read_only=True) as a, _open(dst_kind, dst) as b:
        before, after = snapshot(a), snapshot(b)
        assert after == before  # trial ids, times, leases, pending ids, bandit version 2: all kept
        assert [t.status for t in after.trials] == ["completed", "running", "running"]
        assert after.bandits[0].version == 2
        assert b.create_trial("nightly", 32, pid=1).trial_id == 4  # new trials go on after the copied ones


def test_a_copy_into_a_store_with_jobs_writes_nothing(tmp_path):
    src, dst = new_location("sqlite", tmp_path, "src"), new_location("json", tmp_path, "dst")
    _fill(src, "sqlite")
    with _open("json", dst) as store:
        store.ensure_job("mine")
    with pytest.raises(StoreError, match="holds jobs already"):
        copy_store(src, dst)
    with _open("json", dst, read_only=True) as store:
        assert [j.job_id for j in store.list_jobs()] == ["mine"] and store.list_trials() == []


def test_the_store_copy_command(tmp_path, capsys):
    src, dst = new_location("sqlite", tmp_path, "src"), str(tmp_path / "copy.json")
    _fill(src, "sqlite")
    assert main(["store", "copy", src, dst]) == 0
    out = capsys.readouterr().out
    assert "copied 2 job(s), 3 trial(s), 1 bandit state(s) and 1 profile(s)" in out and "copy.json" in out
    assert main(["store", "copy", src, dst]) == 1  # the copy holds jobs now: refused, named
    assert "holds jobs already" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["sqlite", "json"])
def test_store_copy_refuses_a_bandit_state_that_show_refuses(tmp_path, capsys, kind):
    # A tester's store: `store copy` copied a bandit state that `show` then refused as malformed.
    src, dst = new_location(kind, tmp_path, "src"), tmp_path / "copy.json"
    _fill(src, kind)
    with _open(kind, src) as store:  # hand-edited: the phase gone
        store.update_bandit("nightly", lambda s: (BanditState(s.job_id, {"min_cost": 6.0}, s.arms), None))
    assert main(["show", src]) == 1
    shown = capsys.readouterr().err
    assert "the bandit state of job 'nightly' is malformed (phase: Field required)" in shown
    assert main(["store", "copy", src, str(dst)]) == 1  # the two agree: refused, named, nothing written
    err = capsys.readouterr().err
    assert "not copied, nothing was written" in err and str(src) in err
    assert "the bandit state of job 'nightly' is malformed (phase: Field required)" in err
    assert "Traceback" not in err and not dst.exists()


@pytest.mark.parametrize("dst_name", ["copy.sqlite", "copy.json"])
def test_a_source_record_the_destination_cannot_store_is_named_as_the_sources_and_leaves_no_file(
    tmp_path, capsys, dst_name
):
    # A tester's hand-edited JSON store with a NaN in an arm: the copy blamed the destination ("store
    # copy.sqlite: arm ... holds a non-finite number; nothing was written") and left an empty store file there.
    import json
    import math

    src, dst = str(tmp_path / "src.json"), tmp_path / dst_name
    _fill(src, "json")
    doc = json.loads((tmp_path / "src.json").read_text())
    doc["bandits"]["nightly"]["arms"]["64"]["std_cost"] = math.nan
    (tmp_path / "src.json").write_text(json.dumps(doc))
    assert main(["store", "copy", src, str(dst)]) == 1
    err = capsys.readouterr().err
    assert f"nothing was written to {dst}" in err and f"a record of {src} cannot be stored" in err
    assert "non-finite" in err and "Traceback" not in err
    assert all(p.name.startswith("src.json") for p in tmp_path.iterdir())  # no copy file, no side file
