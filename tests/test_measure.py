"""``zeus_callbacks.measure``: a raw loop's run as a context manager or a decorator, on a virtual GPU.

The virtual GPU runs on a manual clock without noise, so a window's energy is the GPU's power
times the time the test advanced; the JSONL log each run writes is read back.
"""

from __future__ import annotations

import pathlib
import re

import pytest

import zeus_callbacks
from zeus_callbacks import CallOrderError, Decision
from zeus_callbacks.reporting import read_jsonl

STEP_S = 0.05
STEPS_PER_EPOCH = 6
EVAL_S = 0.2
WINDOW_S = 0.1
REL = 1e-9  # noise-free constant power: energy = power × time up to float rounding


@pytest.fixture
def config(tmp_path) -> dict:
    return {
        "backend": "virtual",
        "windows": {"sample_fraction": 1.0},  # every step measured: these tests check each one
        "logging": {"log_dir": str(tmp_path), "run_name": "loop", "interval_steps": 3},
    }


def work(m, clock, seconds: float) -> None:
    """``seconds`` of manual time pass, and the sampler reads the sensor (as its thread would)."""
    clock.advance(seconds)
    m.session.sampler.poll_once()


def records(m, event: str) -> list[dict]:
    return [r for r in read_jsonl(m.summary.jsonl_path) if r["event"] == event]


def test_a_with_block_measures_epochs_steps_an_evaluation_and_a_window(config, virtual_backend, manual_clock):
    power_W = virtual_backend.true_power_W(0)
    with zeus_callbacks.measure(config, backend=virtual_backend) as m:
        assert m.summary is None  # the run is under way
        start_s = manual_clock.now_s()
        for _ in range(2):
            with m.epoch():
                for _ in range(STEPS_PER_EPOCH):
                    with m.step(num_samples=8):
                        work(m, manual_clock, STEP_S)
                with m.evaluation() as results:
                    work(m, manual_clock, EVAL_S)
                    results["val/acc"] = 0.5
        with m.window("export"):
            work(m, manual_clock, WINDOW_S)
        work(m, manual_clock, 2 * virtual_backend.sample_period_s)  # samples cover the last window
        run_s = manual_clock.now_s() - start_s
    summary = m.summary
    assert summary is not None and summary.status == "completed"
    assert (summary.steps, summary.epochs) == (2 * STEPS_PER_EPOCH, 2)
    assert summary.energy_J == pytest.approx(power_W * run_s, rel=REL)
    assert summary.step_energy_J == pytest.approx(power_W * STEP_S, rel=REL)
    epochs = records(m, "epoch")
    assert [r["epoch"] for r in epochs] == [0, 1]
    for record in epochs:  # six steps and the evaluation
        assert record["time_s"] == pytest.approx(STEPS_PER_EPOCH * STEP_S + EVAL_S, rel=REL)
        assert record["energy_J"] == pytest.approx(power_W * record["time_s"], rel=REL)
    evals = records(m, "eval")
    assert [r["step"] for r in evals] == [STEPS_PER_EPOCH, 2 * STEPS_PER_EPOCH]
    assert all(r["energy_J"] == pytest.approx(power_W * EVAL_S, rel=REL) for r in evals)
    assert [r["metrics"] for r in records(m, "evaluate")] == [{"val/acc": 0.5}] * 2
    (window,) = records(m, "window")
    assert window["name"] == "export" and window["energy_J"] == pytest.approx(power_W * WINDOW_S, rel=REL)
    steps = records(m, "steps")
    assert sum(r["steps"] + r["warmup_steps"] for r in steps) == 2 * STEPS_PER_EPOCH
    assert all(r["energy_J_per_sample"] == pytest.approx(power_W * STEP_S / 8, rel=REL) for r in steps if r["count"])
    (end,) = records(m, "run_end")
    assert end["energy_J"] == pytest.approx(summary.energy_J, rel=REL)


def test_the_decorator_makes_each_call_one_run(config, virtual_backend, manual_clock):
    meter = zeus_callbacks.measure(config, backend=virtual_backend)

    @meter
    def train(steps: int) -> str:
        """Train."""
        for _ in range(steps):
            meter.step_start()
            work(meter, manual_clock, STEP_S)
            assert meter.step_end() == Decision()
        return "trained"

    assert train.__name__ == "train" and train.__doc__ == "Train."
    assert train(3) == "trained"
    first = meter.summary
    assert train(5) == "trained"
    assert first is not None and meter.summary is not None and meter.summary is not first
    assert (first.steps, meter.summary.steps) == (3, 5)  # a fresh run per call, not a running sum
    assert meter.summary.status == "completed"


def test_steps_with_no_epoch_make_a_run_with_steps_and_no_epoch_record(config, virtual_backend, manual_clock):
    power_W = virtual_backend.true_power_W(0)
    with zeus_callbacks.measure(config, backend=virtual_backend) as m:
        for _ in range(7):
            with m.step():
                work(m, manual_clock, STEP_S)
        work(m, manual_clock, 2 * virtual_backend.sample_period_s)
    assert (m.summary.steps, m.summary.epochs) == (7, 0)
    assert records(m, "epoch") == []
    assert m.summary.step_energy_J == pytest.approx(power_W * STEP_S, rel=REL)
    assert sum(r["steps"] + r["warmup_steps"] for r in records(m, "steps")) == 7


def test_an_exception_in_the_block_ends_the_run_writes_the_summary_and_propagates(
    config, virtual_backend, manual_clock
):
    meter = zeus_callbacks.measure(config, backend=virtual_backend)
    with pytest.raises(ZeroDivisionError), meter as m:
        with m.epoch():
            for step in range(4):
                with m.step():
                    work(m, manual_clock, STEP_S)
                    if step == 2:
                        raise ZeroDivisionError("loss is nan")
    summary = meter.summary
    assert summary is not None and summary.status == "failed"
    assert summary.steps == 2  # the step that raised is no step
    assert summary.epochs == 1  # the epoch cut short is measured up to the failure
    assert not meter.session.started and meter.session.sampler is not None
    assert not meter.session.sampler.running  # sampling stopped
    (failure,) = records(meter, "exception")
    assert failure["type"] == "ZeroDivisionError" and failure["message"] == "loss is nan"
    (end,) = records(meter, "run_end")
    assert end["status"] == "failed" and end["energy_J"] == pytest.approx(summary.energy_J, rel=REL)


def test_a_ctrl_c_in_the_block_is_an_interrupted_run(config, virtual_backend, manual_clock):
    with pytest.raises(KeyboardInterrupt), zeus_callbacks.measure(config, backend=virtual_backend) as m:
        raise KeyboardInterrupt
    assert m.summary is not None and m.summary.status == "interrupted"


def test_a_step_that_raised_and_was_caught_lets_the_loop_go_on(config, virtual_backend, manual_clock):
    with zeus_callbacks.measure(config, backend=virtual_backend) as m:
        for step in range(4):
            try:
                with m.step():
                    work(m, manual_clock, STEP_S)
                    if step == 1:
                        raise ValueError("bad batch")
            except ValueError:
                continue
    assert m.summary.status == "completed" and m.summary.steps == 3


def test_an_epoch_left_open_at_the_end_is_measured_and_warned_about_as_a_step_is(
    config, virtual_backend, manual_clock, caplog
):
    # Outside tester: an open step got a warning at the run's end, an open epoch was closed silently.
    caplog.set_level("WARNING", logger="zeus_callbacks")
    with zeus_callbacks.measure(config, backend=virtual_backend) as m:
        m.epoch_start()
        for _ in range(STEPS_PER_EPOCH):
            with m.step():
                work(m, manual_clock, STEP_S)
    (epoch,) = records(m, "epoch")
    assert epoch["epoch"] == 0 and epoch["energy_J"] > 0  # measured up to the run's end
    (warning,) = [r.getMessage() for r in caplog.records if "epoch_start without epoch_end" in r.getMessage()]
    assert "ended inside epoch 0" in warning


@pytest.mark.parametrize(
    ("misuse", "message"),
    [
        (lambda m: m.step_end(), r"step_end\(\) without step_start\(\)"),
        (lambda m: (m.step_start(), m.step_start()), r"step_start\(\): the previous step is still open"),
        (lambda m: m.epoch_end(), r"epoch_end\(\) without epoch_start\(\)"),
        (lambda m: (m.epoch_start(), m.epoch_start()), r"epoch_start\(\): epoch 0 is still open"),
        (lambda m: (m.step_start(), m.epoch_start()), r"epoch_start\(\) inside a step"),
        (lambda m: (m.step_start(), m.evaluation().__enter__()), r"evaluation\(\) inside a step"),
        (lambda m: m.__enter__(), "a run is already under way"),
    ],
    ids=["step_end-first", "step_start-twice", "epoch_end-first", "epoch_start-twice", "epoch-in-step",
         "eval-in-step", "nested-with"],
)  # fmt: skip
def test_a_mark_out_of_order_is_a_clear_error_and_the_run_still_ends(config, virtual_backend, misuse, message):
    with pytest.raises(CallOrderError, match=message), zeus_callbacks.measure(config, backend=virtual_backend) as m:
        misuse(m)
    assert m.summary is not None and m.summary.status == "failed"  # the error went through the with block
    assert records(m, "exception")[0]["type"] == "CallOrderError"


@pytest.mark.parametrize("how", ["with", "decorator"])
def test_a_run_of_another_measure_inside_a_run_is_refused(config, virtual_backend, manual_clock, how):
    # An outside tester: two measure() objects nested ran silently; the outer run's energy held the inner's, and
    # both were recorded (with the bandit on, as two trials). The inner one is refused where it starts.
    outer, inner = (zeus_callbacks.measure(config, backend=virtual_backend) for _ in range(2))

    @inner
    def inner_run() -> None: ...

    with outer:
        with outer.step():
            work(outer, manual_clock, STEP_S)
        with pytest.raises(CallOrderError, match="a run of another measure\\(\\) object is under way in this process"):
            if how == "with":
                with inner:
                    pass
            else:
                inner_run()
        assert inner.summary is None and not inner._running  # never started: nothing measured, nothing recorded
        with outer.step():  # the outer run goes on
            work(outer, manual_clock, STEP_S)
    assert outer.summary is not None and (outer.summary.status, outer.summary.steps) == ("completed", 2)
    with inner:  # one after the other is fine
        pass
    with pytest.raises(RuntimeError, match="boom"), outer:  # a run that failed frees the process too
        raise RuntimeError("boom")
    inner_run()
    assert inner.summary is not None and inner.summary.status == "completed"


@pytest.mark.parametrize(
    "mark", [lambda m: m.step_start(), lambda m: m.step_end(), lambda m: m.epoch_start(), lambda m: m.window("w")]
)
def test_a_mark_outside_the_run_is_a_clear_error(config, virtual_backend, mark):
    meter = zeus_callbacks.measure(config, backend=virtual_backend)
    with pytest.raises(CallOrderError, match=r"outside a run: call it inside `with measure\(...\)`"):
        mark(meter)
    with meter:
        pass
    with pytest.raises(CallOrderError, match="outside a run"):  # after it too
        mark(meter)


def test_measure_without_parentheses_says_how_to_decorate():
    with pytest.raises(TypeError, match=r"decorate with @measure\(config\)"):

        @zeus_callbacks.measure
        def train() -> None: ...


def test_a_reserved_window_name_is_refused(config, virtual_backend):
    with pytest.raises(ValueError, match="reserved"), zeus_callbacks.measure(config, backend=virtual_backend) as m:
        with m.window("step"):
            pass


@pytest.mark.parametrize("kind", ["generator", "async", "async generator"])
def test_a_generator_or_async_function_cannot_be_decorated(config, virtual_backend, kind):
    # An outside tester (issue 26): the decorated generator's run ended before its body ran, and its steps then
    # said "outside a run: call it inside the decorated function", which they were.
    m = zeus_callbacks.measure(config, backend=virtual_backend)
    if kind == "generator":

        def func():
            yield m.step_start()

    elif kind == "async":

        async def func():
            m.step_start()

    else:

        async def func():
            yield m.step_start()

    with pytest.raises(TypeError, match="cannot decorate a(n async)? .*with measure"):
        m(func)
    assert not list(pathlib.Path(config["logging"]["log_dir"]).glob("*.jsonl"))  # no empty run was written


def test_a_loop_resumed_from_its_checkpoint_goes_on_from_its_totals_steps_and_epoch(
    config, virtual_backend, manual_clock
):
    # A raw loop saves m.state_dict() in its checkpoint mid-epoch; the next process loads it before `with`.
    # Before, the new run's session dropped a state loaded outside the run: it started from 0 J and step 0.
    power_W = virtual_backend.true_power_W(0)
    first = zeus_callbacks.measure({**config, "logging": {**config["logging"], "run_name": "first"}},
                                   backend=virtual_backend)  # fmt: skip
    with first as m:
        start_s = manual_clock.now_s()
        with m.epoch():
            for _ in range(STEPS_PER_EPOCH):
                with m.step():
                    work(m, manual_clock, STEP_S)
        m.epoch_start()
        for _ in range(2):
            with m.step():
                work(m, manual_clock, STEP_S)
        work(m, manual_clock, 0.2)  # the samples cover the save moment (the sensor's lag passes)
        state = m.state_dict()
        saved_s = manual_clock.now_s() - start_s
        with pytest.raises(CallOrderError, match="before `with"):
            m.load_state_dict(state)
    assert (state["steps"], state["epochs"], state["open_epoch"]) == (STEPS_PER_EPOCH + 2, 1, 1)
    assert state["energy_J"] == pytest.approx(power_W * saved_s, rel=REL)

    second = zeus_callbacks.measure({**config, "logging": {**config["logging"], "run_name": "second"}},
                                    backend=virtual_backend)  # fmt: skip
    second.load_state_dict(state)
    with second as m:
        start_s = manual_clock.now_s()
        with m.epoch():  # the epoch the checkpoint was saved in, resumed
            for _ in range(STEPS_PER_EPOCH - 2):
                with m.step():
                    work(m, manual_clock, STEP_S)
        work(m, manual_clock, 2 * virtual_backend.sample_period_s)
        resumed_s = manual_clock.now_s() - start_s
    summary = m.summary
    assert (summary.steps, summary.epochs) == (2 * STEPS_PER_EPOCH, 2)
    (end,) = records(m, "run_end")  # this run's samples begin a fraction of a sample period after its start
    assert summary.energy_J == pytest.approx(power_W * (saved_s + resumed_s * end["coverage"]), rel=REL)
    (epoch,) = records(m, "epoch")
    assert epoch["epoch"] == 1 and epoch["resumed_mid_epoch"]
    (warmup,) = records(m, "warmup")
    assert warmup["steps"] == [STEPS_PER_EPOCH + 2]  # numbered on from the checkpoint's steps
    assert sum(r["steps"] + r["warmup_steps"] for r in records(m, "steps")) == STEPS_PER_EPOCH - 2
    with second as again:  # one run takes the state: the next starts from nothing
        with again.step():
            work(again, manual_clock, STEP_S)
    assert again.summary.steps == 1


def test_a_state_that_is_not_a_mapping_is_refused(config, virtual_backend):
    m = zeus_callbacks.measure(config, backend=virtual_backend)
    with pytest.raises(TypeError, match="mapping"):
        m.load_state_dict([1, 2])


def test_a_run_that_fails_to_start_keeps_the_checkpoint_state_for_the_next_try(config, virtual_backend, manual_clock):
    # A tester's run: the store was damaged when the resumed run started (StoreCorruptError at `with`); once
    # mended, the retry started from 0 steps and 0 J, without a word: the failed start had used the state up.
    from zeus_callbacks.errors import StoreError

    store = pathlib.Path(config["logging"]["log_dir"]) / "store.json"
    store.write_text("not a store")
    cfg = {**config, "job_id": "nightly", "store": {"backend": "json", "path": str(store)},
           "batch_size": {"enabled": True, "batch_sizes": [16, 32], "default_batch_size": 16}}  # fmt: skip
    meter = zeus_callbacks.measure(cfg, backend=virtual_backend)
    meter.load_state_dict({"energy_J": 50.0, "time_s": 2.0, "steps": 20, "epochs": 1})
    with pytest.raises(StoreError):
        with meter:
            pass
    store.unlink()  # mended
    with meter as m:
        m.use_batch_size(16)
        with m.step():
            work(m, manual_clock, STEP_S)
    assert m.summary.steps == 21 and m.summary.epochs == 1 and m.summary.energy_J > 50.0


@pytest.mark.parametrize(
    ("state", "says"),
    [
        ({"energy_J": -26.1, "steps": 2}, "energy_J must be a finite number >= 0, not -26.1"),
        ({"steps": None}, "steps must be a finite number >= 0, not None"),
        ({"steps": 2.5}, "steps must be a whole number"),
        ({"energy_J": float("inf")}, "energy_J must be a finite number >= 0, not inf"),
        ({"energy_J": 1.0, "energy_note": 3}, "energy_note must be text or null"),
        ({"callbacks": {"ZeusCallback": {"steps": 3}}}, "not a zeus-callbacks checkpoint state"),
        ({"steps": 1, "epoch_energy_J": [None]}, "epoch_energy_J holds None"),  # passed, then failed at every `with`
        ({"steps": 1, "epoch_energy_J": [-5.0]}, "epoch_energy_J holds -5.0"),
        ({"steps": 9, "estimated_steps": 0, "step_energy_J": 5.0}, "sums over estimated_steps, which is 0"),
        ({"steps": 1, "power_limit": "x"}, "power_limit must be a mapping or null"),
        # a mapping with damaged rows passed, then failed inside the profiler's resume (KeyError 'limit_W')
        ({"steps": 1, "power_limit": {"limits": [{}]}}, "power_limit.limits[0].limit_W is missing"),
        ({"steps": 1, "power_limit": {"limits": [{"limit_W": "x"}]}}, "power_limit.limits[0].limit_W must be"),
        (
            {"steps": 1, "power_limit": {"limits": [{"limit_W": 250, "energy_J": ["1"], "time_s": [0.1]}]}},
            "power_limit.limits[0].energy_J[0] must be a finite number >= 0, not '1'",
        ),  # fmt: skip
        (
            {"steps": 1, "power_limit": {"limits": [{"limit_W": 250, "energy_J": [float("nan")], "time_s": [0.1]}]}},
            "power_limit.limits[0].energy_J[0] must be a finite number >= 0, not nan",
        ),  # fmt: skip
        ({"steps": 1, "power_limit": {"limits": [{"limit_W": 250, "steps": -1}]}}, "power_limit.limits[0].steps"),
        ({"steps": 1, "power_limit": {"profiling_steps": -2}}, "power_limit.profiling_steps must be a whole number"),
        # An outside tester's semantic damage: each passed the type checks and was carried without a word.
        ({"steps": 1, "open_epoch": "x"}, "open_epoch must be a whole number >= 0 or null, not 'x'"),
        ({"steps": 1, "open_epoch": -4}, "open_epoch must be a whole number >= 0 or null, not -4"),
        ({"steps": 1, "run_name": 5}, "run_name must be text or null, not 5"),
        ({"steps": 4, "measured_steps": 9}, "measured_steps 9 is more than the 4 steps taken (steps)"),
        ({"energy_J": 1e300, "time_s": 3.0, "steps": 4, "epochs": 1}, "energy_J 1e+300 is more than any job's GPUs"),
        (
            {"steps": 1, "power_limit": {"limits": [{"limit_W": 250}, {"limit_W": 200}, {"limit_W": 250.0}]}},
            "power_limit.limits[2].limit_W 250.0 repeats limits[0]'s",
        ),  # fmt: skip
    ],
)
def test_a_damaged_or_misplaced_state_is_refused_when_loaded_naming_the_key(config, virtual_backend, state, says):
    m = zeus_callbacks.measure(config, backend=virtual_backend)
    with pytest.raises(ValueError, match=re.escape(says)):
        m.load_state_dict(state)
    with m:  # nothing was kept: the next run starts from nothing
        pass
    assert m.summary.steps == 0


def _store_gone(*args, **kwargs):
    from zeus_callbacks.errors import StoreError

    raise StoreError("store.json: the store went away (a fault injected after the sampler started)")


@pytest.mark.parametrize("where", ["session", "measure"])
def test_a_start_that_fails_after_sampling_began_stops_what_it_started(config, virtual_backend, monkeypatch, where):
    # A tester's run: a store error raised late in the `with`'s start left a zeus-power-sampler thread
    # running, and the log later ended "interrupted" (the exit cleanup), not with the failure.
    import threading

    from zeus_callbacks.errors import StoreError
    from zeus_callbacks.optimizers.batch_size import BatchSizeController
    from zeus_callbacks.session._batch_size_steps import BatchSizeSteps

    def sampler_threads() -> int:
        return sum(1 for t in threading.enumerate() if t.name == "zeus-power-sampler")

    before = sampler_threads()
    store = pathlib.Path(config["logging"]["log_dir"]) / "store.json"
    cfg = {**config, "job_id": "nightly", "store": {"backend": "json", "path": str(store)},
           "batch_size": {"enabled": True, "batch_sizes": [16, 32], "default_batch_size": 16}}  # fmt: skip
    if where == "session":  # the last part of the session's start
        monkeypatch.setattr(BatchSizeSteps, "start", _store_gone)
    else:  # the adapter's own work once the session started: the batch size handed to measure()
        monkeypatch.setattr(BatchSizeController, "use_batch_size", _store_gone)
    meter = zeus_callbacks.measure(cfg, backend=virtual_backend, batch_size=16)
    meter.load_state_dict({"energy_J": 50.0, "time_s": 2.0, "steps": 20, "epochs": 1})
    with pytest.raises(StoreError, match="went away"):
        with meter:
            pass
    assert sampler_threads() == before and not meter.session.started  # nothing left running
    log = read_jsonl(pathlib.Path(config["logging"]["log_dir"]) / "loop.jsonl")
    assert [r["event"] for r in log][-2:] == ["exception", "run_end"]  # the log says what happened
    assert log[-2]["type"] == "StoreError" and log[-1]["status"] == "failed"
    monkeypatch.undo()
    with meter as m:  # the next try starts, and goes on from the checkpoint the failed start kept
        with m.step():
            pass
    assert m.summary.status == "completed" and m.summary.steps == 21
