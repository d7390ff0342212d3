"""Deterministic drivers for the golden-JSONL characterisation tests.

Every scenario runs the real :class:`~zeus_callbacks.EnergySession` on a noisy but seeded
virtual GPU whose :class:`ManualClock` only this code advances. The sampler's background
thread is paused right after ``train_start`` (``PowerSampler.stop(final_drain=False)``, the
public pause the benchmarks use): on a manual clock the session drains the sensor itself,
and the test drains it after every step as the thread would, so no reading depends on
when a thread happened to wake. The one wall-clock governor, ``windows.sample_fraction:
auto``, is not used: every scenario sets a fixed fraction.

Only public entry points are used (``EnergySession`` and its event methods,
``pop_metrics``, ``state_dict``, ``summary``, the virtual backend, the store), so that the
tests survive code moving between modules.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zeus_callbacks import Decision, EnergySession
from zeus_callbacks.backends import ManualClock
from zeus_callbacks.backends.virtual import VirtualGPUBackend

DATA_DIR = Path(__file__).with_name("data")
REGEN_ENV = "ZEUS_CALLBACKS_REGEN_GOLDEN"
EXACT_ENV = "ZEUS_CALLBACKS_GOLDEN_EXACT"  # 1: floats must agree to the last bit, too
ABS_FLOOR = 1e-12  # J, W or s: far below any sensor's resolution, for figures that are 0 up to rounding
START_S = 1_000.0  # manual clock origin (s)

# Fields that vary from run to run, and only those: wall-clock stamps, the process and host.
# owner and heartbeat_at: a trial's lease (issue 19) names the process and is renewed on the wall clock
_VARYING_KEYS = frozenset(
    {"wall_time", "started_at", "ended_at", "created_at", "pid", "host", "time", "owner", "heartbeat_at"}
)
TMP = "<tmp>"


def merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra`` merged in, nested mappings merged key by key."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


@dataclass
class Rig:
    """One scenario's clock, virtual GPU, log directory and the lines it has observed.

    Attributes:
        tmp: The scenario's scratch directory (replaced by ``<tmp>`` in the golden file).
        clock: The manual clock of the virtual GPU.
        backend: The virtual GPU.
        lines: The golden file's lines so far (session JSONL records and observations).
    """

    tmp: Path
    clock: ManualClock
    backend: VirtualGPUBackend
    lines: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def create(cls, tmp: Path, **backend: Any) -> Rig:
        """A rig on a fresh manual clock; ``backend`` are VirtualGPUBackend arguments."""
        clock = ManualClock(START_S)
        settings = {"noise_W": 3.0, "seed": 7, "read_only": True, **backend}
        return cls(tmp, clock, VirtualGPUBackend(clock=clock, **settings))

    def config(self, **extra: Any) -> dict[str, Any]:
        """The scenarios' base configuration, with ``extra`` merged in."""
        base = {
            "backend": "virtual",
            "windows": {"sample_fraction": 1.0},
            "logging": {"log_dir": str(self.tmp / "logs"), "interval_steps": 5},
            "power_limit": {"plot": False},
            # The sensor calls are timed on the wall clock: on a loaded machine one took over the default
            # 0.5 s and the run read as degraded. The longest allowed wait keeps that race out of the goldens.
            "sampling": {"sensor_timeout_s": 60.0},
        }
        return merge(base, extra)

    def session(self, config: Mapping[str, Any], **kwargs: Any) -> EnergySession:
        """An EnergySession on this rig's backend (main process unless told otherwise)."""
        kwargs.setdefault("is_main_process", True)
        return EnergySession(dict(config), backend=self.backend, **kwargs)

    def observe(self, kind: str, **values: Any) -> None:
        """Add a line the test observed through the public API (``event: golden.<kind>``)."""
        self.lines.append({"event": f"golden.{kind}", **values})


def start(session: EnergySession, run_name: str) -> None:
    """``train_start``, then pause the sampler thread (the test drains the sensor itself)."""
    session.train_start(run_name=run_name)
    assert session.sampler is not None
    session.sampler.stop(final_drain=False)


@dataclass
class Loop:
    """How the simulated training loop runs.

    Attributes:
        epochs: Epochs to run (fewer when a Decision stops training).
        steps_per_epoch: Steps per epoch.
        step_s: Step time at the maximum power limit (s); slower under a lower limit.
        phases: Drive forward/backward/optimizer phases and a dataloader gap.
        eval_s: Evaluation time after each epoch (s); 0: no evaluation.
        eval_metrics: Validation metrics of an epoch (given its index); None: a falling loss.
        num_samples: Samples per step (None: not given).
        num_tokens: Tokens per step (None: not given).
    """

    epochs: int = 2
    steps_per_epoch: int = 12
    step_s: float = 0.05
    phases: bool = False
    eval_s: float = 0.2
    eval_metrics: Callable[[int], dict[str, float]] | None = None
    num_samples: int | None = 8
    num_tokens: int | None = None


def run_loop(rig: Rig, session: EnergySession, loop: Loop, *, first_step: int = 0, first_epoch: int = 0) -> int:
    """Drive one training loop; record every non-empty ``pop_metrics`` and every stop.

    Returns:
        The next global step index.
    """
    clock, backend = rig.clock, rig.backend
    step = first_step
    stopped = False

    def slow(dt_s: float) -> float:  # a lower power limit stretches the step (the trace's slowdown)
        return dt_s * backend.step_time_factor(backend.power_limit_W(session.gpu_indices[0]))

    def after(what: str, decision: Decision | None) -> bool:
        metrics = session.pop_metrics()
        if metrics:
            rig.observe("metrics", after=what, step=step, metrics=metrics)
        if decision is not None and decision != Decision():
            rig.observe("decision", after=what, step=step, stop_training=decision.stop_training, reason=decision.reason)
            return decision.stop_training
        return False

    for epoch in range(first_epoch, first_epoch + loop.epochs):
        session.epoch_start(epoch)
        for _ in range(loop.steps_per_epoch):
            if loop.phases:
                clock.advance(slow(0.1 * loop.step_s))  # data loading between steps
                session.step_start(step, phase="forward")
                clock.advance(slow(0.3 * loop.step_s))
                session.phase_switch("forward", "backward")
                clock.advance(slow(0.5 * loop.step_s))
                session.phase_switch("backward", "optimizer")
                clock.advance(slow(0.1 * loop.step_s))
            else:
                session.step_start(step)
                clock.advance(slow(loop.step_s))
            session.sampler.poll_once()  # what the sampler thread would have drained by now
            decision = session.step_end(step, num_samples=loop.num_samples, num_tokens=loop.num_tokens)
            step += 1
            if after("step_end", decision):
                stopped = True
                break
        epoch_metrics = session.epoch_end(epoch)
        rig.observe("epoch_end", epoch=epoch, returned=epoch_metrics)
        after("epoch_end", None)
        if stopped:
            break
        if loop.eval_s > 0:
            session.eval_start()
            clock.advance(loop.eval_s)
            session.eval_end(every_rank=True)  # a trainer's own evaluation: every rank runs it
            metrics = loop.eval_metrics(epoch) if loop.eval_metrics else {"val/loss": 1.0 / (epoch + 1)}
            if after("evaluate", session.evaluate(metrics)):
                break
        rig.observe("totals", epoch=epoch, totals=session.totals(), bar=session.progress_bar_metrics())
    return step


def finish(rig: Rig, session: EnergySession, status: str | None = None) -> None:
    """``train_end``; then the run's JSONL records, its summary and its checkpoint state."""
    summary = session.train_end(status) if status is not None else session.train_end()
    after_end = session.pop_metrics()
    if summary.jsonl_path is not None:
        rig.lines.extend(read_records(Path(summary.jsonl_path)))
    rig.observe("summary", **summary.as_dict())
    if after_end:
        rig.observe("metrics", after="train_end", metrics=after_end)
    rig.observe("state_dict", **session.state_dict())


def read_records(path: Path) -> list[dict[str, Any]]:
    """The JSON records of a JSONL file, in order."""
    with path.open(encoding="utf-8") as stream:
        return [json.loads(line) for line in stream if line.strip()]


def store_lines(store_path: Path, job_id: str) -> list[dict[str, Any]]:
    """The store's trials and bandit state of ``job_id`` as golden lines."""
    from zeus_callbacks.store import open_store

    with open_store(store_path) as store:
        trials = store.list_trials(job_id)
        bandit = store.get_bandit(job_id)
        profiles = {key: store.get_profile(key) for key in store.list_profiles()}
    lines: list[dict[str, Any]] = [{"event": "golden.store_trial", **vars(t)} for t in trials]
    if bandit is not None:
        arms = {str(k): v for k, v in sorted(bandit.arms.items())}
        lines.append({"event": "golden.store_bandit", "state": bandit.state, "arms": arms, "version": bandit.version})
    lines.extend({"event": "golden.store_profile", "key": k, "profile": p} for k, p in sorted(profiles.items()))
    return lines


# ----------------------------------------------------------------------------- golden files
def normalise(value: Any, tmp: str) -> Any:
    """``value`` with what legitimately varies replaced: wall-clock stamps, pid, host, the tmp path.

    Numbers of energy, power, time on the manual clock and steps are kept exactly.
    """
    if isinstance(value, Mapping):
        return {k: (f"<{k}>" if k in _VARYING_KEYS and v is not None else normalise(v, tmp)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [normalise(v, tmp) for v in value]
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, str):
        return value.replace(tmp, TMP)
    return value


def _differences(expected: Any, actual: Any, rel_tol: float, path: str = "") -> Iterable[str]:
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in sorted(set(expected) | set(actual)):
            if key not in actual:
                yield f"{path}.{key}: missing (golden {expected[key]!r})"
            elif key not in expected:
                yield f"{path}.{key}: new ({actual[key]!r})"
            else:
                yield from _differences(expected[key], actual[key], rel_tol, f"{path}.{key}")
    elif isinstance(expected, list) and isinstance(actual, list) and len(expected) == len(actual):
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            yield from _differences(e, a, rel_tol, f"{path}[{i}]")
    elif (
        isinstance(expected, float)
        and isinstance(actual, float)
        and os.environ.get(EXACT_ENV) != "1"
        and math.isclose(expected, actual, rel_tol=rel_tol, abs_tol=ABS_FLOOR)
    ):
        return
    elif expected != actual or type(expected) is not type(actual):
        note = ""
        if isinstance(expected, float) and isinstance(actual, float) and expected and math.isfinite(expected):
            note = f" (relative {abs(actual - expected) / abs(expected):.3g})"
        yield f"{path}: golden {expected!r}, now {actual!r}{note}"


def check_golden(name: str, lines: list[dict[str, Any]], tmp: Path, rel_tol: float) -> None:
    """Compare ``lines`` (normalised) with ``data/<name>.jsonl``; rewrite it under ZEUS_CALLBACKS_REGEN_GOLDEN=1.

    Strings, integers and flags must be equal, floats agree to ``rel_tol`` (``scenario_tolerance``).

    Raises:
        AssertionError: The lines differ from the golden file (the message lists the fields).
    """
    actual = [normalise(line, str(tmp)) for line in lines]
    actual = json.loads(json.dumps(actual))  # as read back from a file: tuples become lists
    path = DATA_DIR / f"{name}.jsonl"
    if os.environ.get(REGEN_ENV) == "1":
        DATA_DIR.mkdir(exist_ok=True)
        path.write_text("".join(json.dumps(line) + "\n" for line in actual), encoding="utf-8")
        return
    assert path.exists(), f"no golden file {path}; write it with {REGEN_ENV}=1 python -m pytest tests/golden"
    expected = read_records(path)
    problems = []
    for i in range(max(len(expected), len(actual))):
        if i >= len(actual):
            problems.append(f"line {i + 1}: missing now: {expected[i]!r}")
        elif i >= len(expected):
            problems.append(f"line {i + 1}: new: {actual[i]!r}")
        else:
            event = expected[i].get("event")
            problems.extend(f"line {i + 1} ({event}){d}" for d in _differences(expected[i], actual[i], rel_tol))
        if len(problems) > 40:
            break
    assert not problems, f"{path.name} differs from the golden file:\n" + "\n".join(problems[:40])
