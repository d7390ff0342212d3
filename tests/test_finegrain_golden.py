"""Characterisation (golden) test of the FinGraV maths in ``zeus_callbacks.measurement.finegrain``.

Every public entry point (``bin_executions``, ``binning_warning``, ``position_labels``, ``superpose``,
``differentiate``) runs on seeded synthetic sample streams (square-wave and step power profiles,
sensor noise, delay, jitter, pauses between chunks, several runs, outliers) with its keyword
arguments varied, and every field of every result, the warnings logged and the errors raised are
compared with ``tests/golden/data/finegrain_<case>.json``: integers, strings, flags and errors
exactly, floats to a tolerance derived from the computation that made them (:func:`fit_tolerance`,
:data:`TABLE_REL_TOL`). The floats are not bit-exact across machines: the BLAS kernel OpenBLAS picks
for the CPU (``OPENBLAS_CORETYPE``) sums the Gram matrix in another order, and the solve carries
that difference through its conditioning. CI runs this file under two kernels. Regenerate (only
for an intended change of numbers) with::

    ZEUS_CALLBACKS_REGEN_GOLDEN=1 python -m pytest -q tests/test_finegrain_golden.py
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.golden.tolerance import EPS, fit_tolerance, solve_conditioning
from zeus_callbacks.measurement.finegrain import (
    DROPPED,
    SuperposeSettings,
    bin_executions,
    binning_warning,
    differentiate,
    position_labels,
    superpose,
)
from zeus_callbacks.measurement.finegrain._superposition import solve as solve_module

GOLDEN_DIR = Path(__file__).parent / "golden" / "data"
REGEN = os.environ.get("ZEUS_CALLBACKS_REGEN_GOLDEN") == "1"
IDLE_W = 80.0
GRID_S = 1e-4
TABLE_REL_TOL = 100 * EPS
"""Binning and labels: medians, quantiles and sums of at most 100 durations, no solve (n·ε)."""


# ------------------------------------------------------------------------- synthetic data
def stream(
    seed: int,
    *,
    n: int,
    dur_s: float,
    gap_s: tuple[float, float],
    runs: int = 1,
    run_gap_s: float = 0.3,
    chunk: int = 0,
    chunk_pause_s: float = 0.0,
    shape: str = "square",
    busy_W: float = 300.0,
    warm: tuple[int, float] | None = None,
    outliers: int = 0,
    tail_W: float = 0.0,
    tau_s: float = 0.02,
    period_s: float = 0.02,
    delay_s: float = 0.004,
    noise_W: float = 2.0,
) -> dict[str, np.ndarray]:
    """Executions on a fine power grid and a sensor that averages it over each sample interval.

    ``shape``: ``"square"`` (``busy_W`` flat while running) or ``"step"`` (``busy_W`` in the first
    half, half of it in the second). ``chunk``/``chunk_pause_s``: a pause after every ``chunk``
    executions. ``warm = (k, f)`` scales the first k executions of each run by f. ``outliers``
    executions per run last 3x longer. Times in s, powers in W.
    """
    rng = np.random.default_rng(seed)
    starts, ends, run_ids, factors = [], [], [], []
    t = 0.25 + rng.uniform(0, period_s)
    for r in range(runs):
        for j in range(n // runs):
            d = dur_s * (1 + rng.uniform(-0.02, 0.02)) * (3.0 if j < outliers else 1.0)
            starts.append(t)
            ends.append(t + d)
            run_ids.append(r)
            factors.append(warm[1] if warm and j < warm[0] else 1.0)
            t += d + rng.uniform(*gap_s)
            if chunk and (j + 1) % chunk == 0:
                t += chunk_pause_s
        t += run_gap_s + rng.uniform(0, period_s)
    t_end = t + 0.25
    grid = np.arange(0.0, t_end, GRID_S)
    power = np.full(grid.size, IDLE_W)
    for s, e, f in zip(starts, ends, factors, strict=True):
        i0, i1 = np.searchsorted(grid, [s, e])
        if shape == "step":
            mid = np.searchsorted(grid, (s + e) / 2)
            power[i0:mid] += f * busy_W
            power[mid:i1] += f * busy_W / 2
        else:
            power[i0:i1] += f * busy_W
        if tail_W:
            i2 = np.searchsorted(grid, e + 6 * tau_s)
            power[i1:i2] += f * tail_W * np.exp(-(grid[i1:i2] - e) / tau_s)
    cum = np.concatenate(([0.0], np.cumsum(power) * GRID_S))
    knots = np.concatenate((grid, [t_end]))
    k = np.arange(1, int((t_end - 0.05) / period_s))
    times = k * period_s + rng.uniform(-period_s / 50, period_s / 50, k.size)
    energy = np.interp(times - delay_s, knots, cum)
    sample_power = np.diff(energy) / np.diff(times) + rng.normal(0, noise_W, k.size - 1)
    return {
        "starts_s": np.array(starts),
        "ends_s": np.array(ends),
        "run_ids": np.array(run_ids),
        "sample_times_s": times[1:],
        "sample_power_W": sample_power,
    }


def _xy(data: dict[str, np.ndarray]) -> tuple[np.ndarray, ...]:
    return data["starts_s"], data["ends_s"], data["sample_times_s"], data["sample_power_W"]


# ------------------------------------------------------------------------------- encoding
def encode(value: Any) -> Any:
    """Plain JSON of a result: dataclasses as dicts, arrays and tuples as lists, NaN/inf tagged."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
        out["__type__"] = type(value).__name__
        return out
    if isinstance(value, dict):
        return {str(k): encode(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return {"__array__": str(value.dtype), "shape": list(value.shape), "data": encode(value.tolist())}
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        v = float(value)
        return v if math.isfinite(v) else {"__float__": repr(v)}
    if value is None or isinstance(value, str):
        return value
    raise TypeError(f"cannot encode {type(value).__name__}")


def superposition_record(res: Any) -> dict[str, Any]:
    """Every field, plus each profile's derived ``rel_ci_halfwidth`` and ``__getitem__`` lookups."""
    rec = encode(res)
    rec["rel_ci_halfwidth"] = {lab: encode(p.rel_ci_halfwidth) for lab, p in res.profiles.items()}
    rec["getitem_is_profile"] = {lab: res[lab] is p for lab, p in res.profiles.items()}
    return rec


def capture(fn: Callable[[], Any], caplog: pytest.LogCaptureFixture) -> dict[str, Any]:
    """Run ``fn``; record its encoded result or error, and the warnings the module logged."""
    caplog.clear()
    with caplog.at_level(logging.INFO):
        try:
            out: dict[str, Any] = {"result": fn()}
        except Exception as exc:  # the error is part of the behaviour being pinned
            out = {"error": type(exc).__name__, "message": str(exc)}
    out["logs"] = [
        [r.levelname, r.getMessage()] for r in caplog.records if r.name.startswith("zeus_callbacks.measurement")
    ]
    return out


def check_golden(name: str, record: dict[str, Any], rel_tol: float) -> None:
    """Compare ``record`` with the golden file ``finegrain_<name>.json`` (or rewrite it).

    Integers, strings, flags and non-finite markers must be equal; floats agree to ``rel_tol``
    of their family's scale (:func:`_scales`).
    """
    path = GOLDEN_DIR / f"finegrain_{name}.json"
    text = json.dumps(record, indent=1, sort_keys=True) + "\n"
    if REGEN:
        GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    assert path.exists(), f"{path} missing: record it with ZEUS_CALLBACKS_REGEN_GOLDEN=1"
    golden = json.loads(path.read_text())
    fresh = json.loads(text)  # same float round trip as the file (repr is exact)
    problem = _first_difference(golden, fresh, rel_tol, _scales(golden))
    assert problem is None, f"{problem} (rel_tol {rel_tol:.2e})"


def _family(where: str) -> str:
    """A float's family: its path without list indices (one array, one field across classes)."""
    return "".join(part for part in where.replace("[", " [").split(" ") if not part.startswith("["))


def _scales(golden: Any, where: str = "", out: dict[str, float] | None = None) -> dict[str, float]:
    """Largest magnitude of each float family in the golden record: the norm of a normwise bound.

    A figure whose path holds ``rel_`` (``rel_ci_halfwidth``: an interval's half width over its
    energy) has scale 1: its absolute error is the energies' relative error, however small it is.
    """
    out = {} if out is None else out
    if isinstance(golden, dict):
        for k, v in golden.items():
            _scales(v, f"{where}.{k}", out)
    elif isinstance(golden, list):
        for i, v in enumerate(golden):
            _scales(v, f"{where}[{i}]", out)
    elif isinstance(golden, float):
        family = _family(where)
        floor = 1.0 if "rel_" in where else 0.0
        out[family] = max(out.get(family, floor), abs(golden))
    return out


def _first_difference(golden: Any, fresh: Any, rel_tol: float, scales: dict[str, float], where: str = "") -> str | None:
    """Where ``fresh`` first departs from ``golden`` beyond the tolerance, or None."""
    if type(golden) is not type(fresh):
        return f"{where}: type {type(golden).__name__} != {type(fresh).__name__}"
    if isinstance(golden, dict):
        if golden.keys() != fresh.keys():
            return f"{where}: keys {sorted(golden)} != {sorted(fresh)}"
        for k in golden:
            found = _first_difference(golden[k], fresh[k], rel_tol, scales, f"{where}.{k}")
            if found:
                return found
        return None
    if isinstance(golden, list):
        if len(golden) != len(fresh):
            return f"{where}: length {len(golden)} != {len(fresh)}"
        for i, (g, f) in enumerate(zip(golden, fresh, strict=True)):
            found = _first_difference(g, f, rel_tol, scales, f"{where}[{i}]")
            if found:
                return found
        return None
    if isinstance(golden, float):
        scale = max(abs(golden), abs(fresh), scales[_family(where)])
        if abs(golden - fresh) <= rel_tol * scale:
            return None
        return f"{where}: golden {golden!r} != now {fresh!r} (|diff| {abs(golden - fresh):.3e}, scale {scale:.3g})"
    return None if golden == fresh else f"{where}: golden {golden!r} != now {fresh!r}"


# ---------------------------------------------------------------------------------- cases
def _steady_default():
    data = stream(1, n=150, dur_s=0.004, gap_s=(1e-5, 3e-5))
    return lambda: superposition_record(superpose(*_xy(data)))


def _steady_pauses_runs():
    # Chunks of back-to-back work with a few-ms sync pause between chunks, three runs, labels.
    data = stream(2, n=240, dur_s=0.002, gap_s=(1e-5, 2e-5), runs=3, chunk=20, chunk_pause_s=0.004, tail_W=60.0)
    labels = position_labels(data["run_ids"], warm_executions=3)
    return lambda: superposition_record(
        superpose(
            *_xy(data),
            mode="steady",
            sensor_delay_s=0.004,
            labels=labels,
            n_bins=4,
            post_s=0.08,
            n_post=4,
            smoothing=1e-2,
            n_boot=60,
            confidence=0.9,
            seed=np.random.default_rng(5),
        )
    )


def _steady_shared_marks_given_baseline():
    # Boundary marks shared by consecutive executions (gap exactly 0), every pause idle, baseline given.
    data = stream(3, n=200, dur_s=0.003, gap_s=(0.0, 0.0), runs=2, chunk=50, chunk_pause_s=0.03)
    return lambda: superposition_record(
        superpose(
            *_xy(data),
            sensor_delay_s=0.002,
            launch_gap_s=0.0,
            short_gap_s=0.0,
            baseline_W=IDLE_W,
            n_boot=0,
            n_bins=2,
        )
    )


def _steady_long_launch_gap():
    # An explicit launch gap and short-gap threshold; a step profile; 100 ms sensor.
    data = stream(4, n=120, dur_s=0.01, gap_s=(0.001, 0.004), shape="step", period_s=0.1, noise_W=5.0)
    return lambda: superposition_record(
        superpose(*_xy(data), launch_gap_s=0.002, short_gap_s=0.05, n_bins=6, n_boot=40, seed=11)
    )


def _isolated_step_tail():
    data = stream(5, n=50, dur_s=0.03, gap_s=(0.18, 0.3), shape="step", tail_W=120.0, noise_W=4.0)
    return lambda: superposition_record(
        superpose(
            *_xy(data),
            mode="isolated",
            sensor_delay_s=0.004,
            n_bins=8,
            pre_s=0.03,
            post_s=0.08,
            n_pre=3,
            n_post=5,
            n_boot=50,
            seed=3,
        )
    )


def _isolated_dropped_unsorted():
    # Outliers dropped by binning; the executions handed over in shuffled order with their labels.
    data = stream(6, n=60, dur_s=0.01, gap_s=(0.16, 0.25), runs=2, outliers=3, tail_W=80.0)
    binning = bin_executions(data["ends_s"] - data["starts_s"])
    labels = np.where(binning.keep, "all", DROPPED)
    order = np.random.default_rng(0).permutation(labels.size)
    starts, ends, times, power = _xy(data)
    return lambda: superposition_record(
        superpose(starts[order], ends[order], times, power, mode="isolated", labels=labels[order].tolist(), n_boot=30)
    )


def _isolated_no_idle():
    # Gaps shorter than pre_s + post_s: no idle time, so the baseline is unknown.
    # The samples are cut to the executions' span, so no idle time is left before or after them either.
    data = stream(7, n=40, dur_s=0.02, gap_s=(0.05, 0.07), tail_W=50.0)
    starts, ends, times, power = _xy(data)
    span = (times > starts[0] - 0.02) & (times < ends[-1] + 0.06)
    return lambda: superposition_record(
        superpose(starts, ends, times[span], power[span], mode="isolated", n_boot=20, seed=2, n_bins=4)
    )


def _isolated_given_baseline_low_confidence():
    data = stream(8, n=30, dur_s=0.05, gap_s=(0.2, 0.3), period_s=0.1, noise_W=8.0)
    return lambda: superposition_record(
        superpose(
            *_xy(data),
            mode="isolated",
            baseline_W=75.0,
            confidence=0.5,
            smoothing=0.1,
            n_boot=25,
            seed=np.random.default_rng(9),
            pre_s=0.0,
            n_pre=0,
            n_post=0,
            post_s=0.0,
        )
    )


def _differentiate_steady():
    data = stream(9, n=240, dur_s=0.003, gap_s=(1e-5, 2e-5), runs=4, warm=(4, 1.3))
    starts, ends, times, power = _xy(data)

    def run():
        d = differentiate(starts, ends, data["run_ids"], times, power, sensor_delay_s=0.004, n_boot=30)
        return {"diff": encode(d), "result": superposition_record(d.result)}

    return run


def _differentiate_isolated_keep():
    data = stream(10, n=80, dur_s=0.01, gap_s=(0.16, 0.22), runs=4, warm=(2, 1.15), outliers=1, tail_W=60.0)
    starts, ends, times, power = _xy(data)
    keep = bin_executions(ends - starts, warn=False).keep

    def run():
        d = differentiate(
            starts,
            ends,
            data["run_ids"],
            times,
            power,
            warm_executions=2,
            threshold=0.05,
            keep=keep,
            n_bins=3,
            mode="isolated",
            n_boot=20,
            seed=4,
        )
        return {"diff": encode(d), "result": superposition_record(d.result)}

    return run


def _differentiate_no_steady():
    # Runs of two executions: only first and warming classes, no steady one to compare with.
    data = stream(11, n=40, dur_s=0.01, gap_s=(1e-5, 2e-5), runs=20, run_gap_s=0.2)

    def run():
        d = differentiate(*_xy(data)[:2], data["run_ids"], *_xy(data)[2:], n_boot=5)
        return {"diff": encode(d), "result": superposition_record(d.result)}

    return run


def _binning():
    rng = np.random.default_rng(12)
    base = rng.normal(0.01, 0.0003, 100)
    base[rng.choice(100, 9, replace=False)] *= 2.2
    bimodal = np.r_[np.full(10, 0.01), np.full(9, 0.03), [0.011, 0.0095]]
    runs = {
        "default": lambda: encode(bin_executions(base)),
        "list_input": lambda: encode(bin_executions(base.tolist())),
        "tight": lambda: encode(bin_executions(base, rel_tol=0.01, max_drop_fraction=0.5)),
        "loose": lambda: encode(bin_executions(base, rel_tol=2.0)),
        "bimodal_warns": lambda: encode(bin_executions(bimodal)),
        "bimodal_quiet": lambda: encode(bin_executions(bimodal, warn=False, max_drop_fraction=0.1)),
        "empty": lambda: encode(bin_executions([])),
        "one": lambda: encode(bin_executions([0.5])),
        "warning": lambda: binning_warning(bin_executions(bimodal, warn=False), 0.3),
        "warning_default": lambda: binning_warning(bin_executions(bimodal, warn=False)),
        "bad_tol": lambda: bin_executions(base, rel_tol=0.0),
        "bad_duration": lambda: bin_executions([0.1, 0.0, 0.2]),
    }
    return runs


def _labels():
    return {
        "default": lambda: encode(position_labels([0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 2])),
        "warm_1": lambda: encode(position_labels(np.array([3, 3, 3, 7, 7, 3]), warm_executions=1)),
        "warm_0": lambda: encode(position_labels([0, 0, 1, 1], warm_executions=0)),
        "empty": lambda: encode(position_labels([])),
    }


def _errors():
    data = stream(13, n=10, dur_s=0.01, gap_s=(0.1, 0.2))
    s, e, t, p = _xy(data)
    return {
        "mode": lambda: superpose(s, e, t, p, mode="burst"),  # type: ignore[arg-type]
        "shape": lambda: superpose(s, e[:-1], t, p),
        "empty": lambda: superpose([], [], t, p),
        "two_d": lambda: superpose(s[None, :], e[None, :], t, p),
        "few_samples": lambda: superpose(s, e, t[:2], p[:2]),
        "sample_shape": lambda: superpose(s, e, t, p[:-1]),
        "negative_duration": lambda: superpose(s, s, t, p),
        "launch_gap": lambda: superpose(s, e, t, p, launch_gap_s=-1.0),
        "short_gap": lambda: superpose(s, e, t, p, short_gap_s=-0.1),
        "labels": lambda: superpose(s, e, t, p, labels=["all"] * 3),
    }


SUPERPOSE_CASES = {
    "steady_default": _steady_default,
    "steady_pauses_runs": _steady_pauses_runs,
    "steady_shared_marks_given_baseline": _steady_shared_marks_given_baseline,
    "steady_long_launch_gap": _steady_long_launch_gap,
    "isolated_step_tail": _isolated_step_tail,
    "isolated_dropped_unsorted": _isolated_dropped_unsorted,
    "isolated_no_idle": _isolated_no_idle,
    "isolated_given_baseline_low_confidence": _isolated_given_baseline_low_confidence,
    "differentiate_steady": _differentiate_steady,
    "differentiate_isolated_keep": _differentiate_isolated_keep,
    "differentiate_no_steady": _differentiate_no_steady,
}
TABLE_CASES = {"binning": _binning, "position_labels": _labels, "errors": _errors}


@pytest.mark.parametrize("name", sorted(SUPERPOSE_CASES))
def test_superpose_matches_golden(name, caplog):
    fit = SUPERPOSE_CASES[name]()
    with solve_conditioning() as seen:
        record = capture(fit, caplog)
    check_golden(name, record, fit_tolerance(seen))


@pytest.mark.parametrize("name", sorted(TABLE_CASES))
def test_table_matches_golden(name, caplog):
    check_golden(name, {key: capture(fn, caplog) for key, fn in TABLE_CASES[name]().items()}, TABLE_REL_TOL)


def test_tolerance_tells_a_changed_fit_from_a_reordered_sum(caplog, monkeypatch):
    """The tolerance admits another summation order and refuses a fit with other settings.

    The golden case solved with the sample rows summed in reverse order (what another BLAS kernel
    does to ``AᵀWA``) passes; the same case with a smoothing 10 % higher, a change of behaviour,
    fails.
    """
    data = stream(5, n=50, dur_s=0.03, gap_s=(0.18, 0.3), shape="step", tail_W=120.0, noise_W=4.0)
    options = dict(mode="isolated", sensor_delay_s=0.004, n_bins=8, pre_s=0.03, post_s=0.08, n_pre=3, n_post=5)
    original = solve_module.augmented_system

    def reversed_rows(prob, weights):
        flipped = dataclasses.replace(prob, matrix=prob.matrix[::-1], energy_J=prob.energy_J[::-1])
        return original(flipped, weights[::-1])

    monkeypatch.setattr(solve_module, "augmented_system", reversed_rows)
    with solve_conditioning() as seen:
        record = capture(lambda: superposition_record(superpose(*_xy(data), **options, n_boot=50, seed=3)), caplog)
    check_golden("isolated_step_tail", record, fit_tolerance(seen))

    golden = json.loads((GOLDEN_DIR / "finegrain_isolated_step_tail.json").read_text())
    smoother = capture(
        lambda: superposition_record(superpose(*_xy(data), **options, n_boot=50, seed=3, smoothing=1.1e-3)), caplog
    )
    changed = json.loads(json.dumps(smoother))
    assert _first_difference(golden, changed, fit_tolerance(seen), _scales(golden)) is not None


def test_goldens_are_not_trivial():
    """The recorded cases exercise what they claim (so an empty golden cannot pass silently)."""
    if REGEN:
        pytest.skip("regenerating")
    load = lambda name: json.loads((GOLDEN_DIR / f"finegrain_{name}.json").read_text())  # noqa: E731
    pauses = load("steady_pauses_runs")["result"]
    assert pauses["gap_power_W"] is not None and pauses["tail_power_W"] is not None
    assert set(pauses["profiles"]) == {"first", "warming", "steady"}
    assert load("isolated_no_idle")["result"]["baseline_source"] == "unknown"
    assert load("steady_shared_marks_given_baseline")["result"]["baseline_source"] == "given"
    assert load("isolated_step_tail")["result"]["baseline_source"] == "idle samples"
    assert load("differentiate_steady")["logs"], "the warm executions should trigger the differentiation warning"
    errors = load("errors")
    assert all("error" in v for v in errors.values())
    assert load("binning")["bimodal_warns"]["logs"]


def test_settings_object_reproduces_the_keyword_golden(caplog):
    """``superpose(settings=SuperposeSettings(...))`` is the same fit as the keyword call it replaces."""
    data = stream(5, n=50, dur_s=0.03, gap_s=(0.18, 0.3), shape="step", tail_W=120.0, noise_W=4.0)
    settings = SuperposeSettings(
        mode="isolated", sensor_delay_s=0.004, n_bins=8, pre_s=0.03, post_s=0.08, n_pre=3, n_post=5, n_boot=50
    )
    with solve_conditioning() as seen:
        record = capture(lambda: superposition_record(superpose(*_xy(data), settings=settings, seed=3)), caplog)
    check_golden("isolated_step_tail", record, fit_tolerance(seen))
    # A keyword overrides the settings' field.
    wider = SuperposeSettings(
        mode="isolated", sensor_delay_s=0.004, n_bins=8, pre_s=0.03, post_s=0.08, n_pre=3, n_post=5
    )
    with solve_conditioning() as seen:
        record = capture(lambda: superposition_record(superpose(*_xy(data), settings=wider, n_boot=50, seed=3)), caplog)
    check_golden("isolated_step_tail", record, fit_tolerance(seen))


def test_settings_validate_on_construction():
    with pytest.raises(ValueError, match="mode must be 'steady' or 'isolated'"):
        SuperposeSettings(mode="burst")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="launch_gap_s and short_gap_s must be >= 0"):
        SuperposeSettings(short_gap_s=-1e-3)
    with pytest.raises(TypeError, match="n_bin"):
        superpose([0.0], [1.0], [0.0, 1.0, 2.0], [1.0, 1.0, 1.0], n_bin=3)
