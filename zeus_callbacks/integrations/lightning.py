"""``ZeusCallback``: GPU energy in a PyTorch Lightning ``Trainer``.

Example:
    >>> import lightning.pytorch as L
    >>> from lightning.pytorch.loggers import TensorBoardLogger
    >>> from zeus_callbacks import ZeusCallback
    >>> trainer = L.Trainer(callbacks=[ZeusCallback.from_yaml("zeus.yaml")],  # doctest: +SKIP
    ...                     logger=TensorBoardLogger("runs"))

From ``LightningCLI``::

    trainer:
      callbacks:
        - class_path: zeus_callbacks.ZeusCallback
          init_args:
            config: zeus.yaml          # or the settings inline, as a mapping
"""

from __future__ import annotations

import functools
import logging
import math
import re
import time
import warnings
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, RichProgressBar
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.data import extract_batch_size
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.parsing import lightning_getattr, lightning_hasattr, lightning_setattr
from typing_extensions import override

from zeus_callbacks import reporting as metric
from zeus_callbacks.backends.base import GPUBackend
from zeus_callbacks.integrations._common import ConfigArg, SessionAdapter
from zeus_callbacks.optimizers.batch_size import scaled_learning_rate
from zeus_callbacks.reporting import RunSummary

logger = logging.getLogger(__name__)

# Lightning recommends sync_dist for epoch-level values under DDP; ours are aggregated
# across ranks by the session already (see ZeusCallback._log), the progress bar's energy too.
_OWN_KEYS = "|".join(
    [r"(energy|power|time|power_limit|cost)/"]
    + [re.escape(key) + "'" for key in (metric.PROGRESS_BAR_ENERGY, metric.PROGRESS_BAR_SIMULATED_ENERGY)]
)
warnings.filterwarnings("ignore", message=rf"It is recommended to use `self\.log\('({_OWN_KEYS})")


class ZeusCallback(SessionAdapter, Callback):
    """Measure and log GPU energy of a Lightning training run.

    Logs per-step energy (mean over ``logging.interval_steps``), mean power, energy
    per sample, the power limit, per-epoch energy (with the energy-counter
    cross-check) and evaluation energy through ``pl_module.log``; the run's total
    energy and time at the end through ``trainer.loggers`` (``self.log`` is refused in
    ``on_train_end``). See ``docs/metrics.md`` for every key.

    Args:
        config: Path of a YAML file, a mapping of settings, a ``ZeusConfig``, or None
            for the defaults.
        backend: An open GPU backend to use instead of the one the config names
            (tests and simulations); the caller closes it.

    Raises:
        ConfigError: The configuration is invalid (raised here, before training).

    Attributes:
        summary: The :class:`~zeus_callbacks.reporting.RunSummary` once training ended.
        session: The :class:`~zeus_callbacks.session.EnergySession` of the current fit.
    """

    def __init__(self, config: ConfigArg = None, backend: GPUBackend | None = None) -> None:
        SessionAdapter.__init__(self, config, backend)
        Callback.__init__(self)
        self._base_lr: dict[int, float] = {}  # module id -> learning rate before batch-size scaling
        self._optimizer_stepped = False
        self._epoch_unchecked = True  # the next batch start checks that the session has its epoch open
        # The step Lightning logs the current batch's metrics at: global_step when the batch began
        # (by on_train_batch_end the optimizer has stepped and global_step is one ahead).
        self._batch_step: int | None = None
        self._eval_for_monitors: dict[str, float] = {}  # eval energy, for callback_metrics at the next log_dict
        self._ended = False  # the run's end was published (loggers, summary)
        self._unprinted: RunSummary | None = None  # the summary, published and waiting to be printed (teardown)
        self._state_loaded = False  # a checkpoint restore handed this fit a state (load_state_dict)
        # A time-based val_check_interval (Lightning >= 2.6): the interval this epoch validates at (s, None: no
        # such interval), when the last batch ended (time.monotonic, Lightning's clock for it; None at an
        # epoch's start) and the last four batches' times (s), kept across epochs.
        self._val_every_s: float | None = None
        self._last_batch_end_s: float | None = None
        self._batch_s = (0.0,) * 4

    @functools.cached_property
    @override
    def state_key(self) -> str:
        # Lightning reads it at every hook call (the profiler's action name), six times a step: after
        # the first read it is a plain instance attribute (no call). Built again at each fit's setup.
        return self._generate_state_key(job_id=self.config.job_id)

    # -- setup and resume ----------------------------------------------------------
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # A fresh session per fit; a checkpoint restore (after setup) then loads its totals.
        if stage == "fit":
            self.__dict__.pop("state_key", None)  # from this fit's configuration (before a restore reads it)
            self._epoch_unchecked = True
            self._new_session(is_main_process=trainer.is_global_zero, device_index=_device_index(trainer))
            self._batch_step = None
            self._eval_for_monitors = {}
            self._ended = False
            self._unprinted = None
            self._state_loaded = False
            self.session.open_backend()  # a missing GPU or library fails here, before training
            suggested = self.session.suggest_batch_size()  # None unless batch_size.enabled (main process only)
            if self.config.batch_size.enabled and trainer.world_size > 1:
                suggested = trainer.strategy.broadcast(suggested, src=0)  # one batch size on every rank
            if suggested is not None:
                self._apply_batch_size(pl_module, suggested)

    def _apply_batch_size(self, pl_module: pl.LightningModule, batch_size: int) -> None:
        """Set the bandit's batch size (and scaled learning rate) before the data loaders are built.

        Looked up like Lightning's ``BatchSizeFinder``: an attribute of the module, its
        ``hparams``, the datamodule, or the datamodule's ``hparams``.
        """
        cfg = self.config.batch_size
        if lightning_hasattr(pl_module, cfg.module_attr):
            lightning_setattr(pl_module, cfg.module_attr, batch_size)
            rank_zero_info(f"zeus-callbacks: batch size {batch_size} (job {self.config.job_id})")
        else:
            logger.warning(
                "zeus-callbacks: neither the LightningModule nor the DataModule has a %r attribute (or hparam); "
                "build the data loaders with batch size %d yourself",
                cfg.module_attr,
                batch_size,
            )
        if cfg.lr_scaling == "none":
            return
        names = [cfg.lr_attr] if cfg.lr_attr else ["lr", "learning_rate"]
        name = next((n for n in names if lightning_hasattr(pl_module, n)), None)
        if name is None:
            logger.warning("zeus-callbacks: no learning-rate attribute %s to scale", " or ".join(names))
            return
        value = lightning_getattr(pl_module, name)
        if value is None:
            logger.warning("zeus-callbacks: learning-rate attribute %s is None; not scaled", name)
            return
        base = self._base_lr.setdefault(id(pl_module), float(value))
        assert cfg.default_batch_size is not None
        lr = scaled_learning_rate(base, batch_size, cfg.default_batch_size, cfg.lr_scaling)
        lightning_setattr(pl_module, name, lr)

    @override
    def state_dict(self) -> dict[str, Any]:
        return self.session.state_dict()

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._state_loaded = True
        self._load_checkpoint_state(state_dict)

    # -- training --------------------------------------------------------------------
    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        suggested = self.session.suggest_batch_size()
        used = getattr(trainer.train_dataloader, "batch_size", None)
        if isinstance(used, int):
            self._use_batch_size(
                suggested, used, "the train loader's batch size",
                " (data loaders passed to fit() directly cannot be changed); the trial is recorded at",
            )  # fmt: skip
        if trainer.global_step > 0 and not self._state_loaded:
            # Resumed from a checkpoint with no state of this callback (an empty one, which Lightning does
            # not hand over, or another job_id's)
            self._load_checkpoint_state(self._state_for_a_resume_without_one(trainer.global_step, self.state_key))
        self.session.train_start(
            run_name=self._run_name(_logger_run_name(trainer)),
            job_steps=_steps_left(trainer),
            job_steps_source="trainer",
        )

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.session.epoch_start(trainer.current_epoch)
        self._plan_epoch(trainer, 0)

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step  # a chain of properties: read once
        self._batch_step = step
        session = self.session
        if self._epoch_unchecked:  # the fit's or an epoch's first batch: the only ones that may find no epoch open
            self._epoch_unchecked = False
            if session.open_epoch is None:  # resumed mid-epoch: Lightning calls no on_train_epoch_start
                session.epoch_start(trainer.current_epoch)
                self._plan_epoch(trainer, batch_idx)
        session.step_start(step, phase="forward")  # one mark: step and forward begin
        self._optimizer_stepped = False

    def _plan_epoch(self, trainer: pl.Trainer, done: int) -> None:
        """At an epoch's start (``done`` of its batches taken: a mid-epoch resume), plan its measured pauses."""
        self._plan_pauses(done, *_pauses(trainer, done))
        self._val_every_s, self._last_batch_end_s = _time_based_validation(trainer), None

    def _before_a_timed_validation(self, trainer: pl.Trainer, batch_idx: int) -> None:
        """A time-based validation: measure the next batch if, as long as the longest of the last four, it ends past it.

        Lightning validates after the first batch that ends ``_val_every_s`` after its last validation
        (``trainer._last_val_time``, ``time.monotonic``). One clock read a step, with such an interval only.
        The longest of four batches covers batch times that repeat in short cycles (accumulation); the times
        are kept over an epoch's end, so an epoch's first batches are guessed too. A guess too early costs
        one measured step; one too late leaves the steps after the last measured one estimated, as before.
        """
        now_s = time.monotonic()
        last_end_s, self._last_batch_end_s = self._last_batch_end_s, now_s
        if last_end_s is not None:
            self._batch_s = (*self._batch_s[1:], now_s - last_end_s)
        last_val_s = getattr(trainer, "_last_val_time", None)
        if not isinstance(last_val_s, (int, float)) or self._val_every_s is None:
            return
        due_s = last_val_s + self._val_every_s
        if now_s < due_s <= now_s + max(self._batch_s):
            self._measure_next_step(batch_idx + 1)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        session = self.session
        if not self._optimizer_stepped:  # a micro-batch of gradient accumulation: no optimizer step
            session.phase_discard("optimizer")
        if batch_idx + 1 == self._measure_after:  # the next batch is the last before a validation or the epoch's end
            self._measure_next_step(batch_idx + 1)
        elif self._val_every_s is not None:
            self._before_a_timed_validation(trainer, batch_idx)
        # One mark: the optimizer phase and the step end, the dataloader phase begins. Under DDP
        # the session has agreed the decision across ranks (the same step everywhere).
        if session.step_end_reads_arguments:
            decision = session.step_end(trainer.global_step, num_samples=_batch_size(batch))
        else:  # most steps under sample_fraction: neither the step nor the batch walk (µs a step) is needed
            step = self._batch_step
            decision = session.step_end(trainer.global_step if step is None else step)
        metrics = session.pop_metrics()
        if metrics:
            # At the step Lightning logs this batch's own metrics at (a logger that passes step=, as
            # W&B does, drops points logged below its current step).
            self._log(trainer, pl_module, metrics, on_step=True, step=self._batch_step)
        if decision.stop_training:
            logger.info("zeus-callbacks: stopping training (%s)", decision.reason)
            trainer.should_stop = True

    # -- step phases (windows.phases; no-ops otherwise) ----------------------------------
    @override
    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Any) -> None:
        self.session.phase_switch("forward", "backward")  # one shared mark

    @override
    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # The optimizer phase starts here so that gradient clipping belongs to it and the
        # phases tile the step; it is dropped at batch end if no optimizer step followed.
        self.session.phase_switch("backward", "optimizer")

    @override
    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        self._optimizer_stepped = True

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self.session.eval_start()
            self._last_batch_end_s = None  # the next batch's time would hold this validation's

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        # Lightning runs a fit's validation on every rank: its energy is summed over them here.
        self.session.eval_end(every_rank=True)  # attributes the evaluation's energy now
        metrics = self.session.pop_metrics()
        if metrics:
            # One point per evaluation, at the step Lightning logs its validation metrics at (the last
            # batch's); self.log is refused here, so monitors see them with the next training log.
            step = trainer.global_step if self._batch_step is None else self._batch_step
            self._to_loggers(trainer, metrics, step)
            self._eval_for_monitors.update(metrics)
        decision = self.session.evaluate(trainer.callback_metrics)
        if decision.stop_training:
            trainer.should_stop = True

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.session.epoch_end(trainer.current_epoch)
        self._epoch_unchecked = True
        self._log(trainer, pl_module, self.session.pop_metrics(), on_step=False)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # The summary waits for teardown: the progress bar is still drawing here (tqdm closes its bars in
        # on_train_end after ours, Rich stops its live display in teardown), and a summary printed now
        # has the bar drawn again under it.
        self._finish(trainer, status="completed")

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        # teardown is skipped on an exception: end the run here so nothing is lost (a Ctrl-C is a
        # KeyboardInterrupt here). After a SIGTERM the session's handler has ended it already:
        # exception() returns that summary. Either way the totals reach the loggers, and the summary is printed.
        summary = self.session.exception(exception, interrupted=isinstance(exception, SIGTERMException))
        if summary is not None:
            self._publish_end(trainer, summary)
        self._print_summary(trainer, pl_module)  # teardown is skipped: now, a Rich bar stopped first

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.session.started:
            self._finish(trainer, status="completed")
        self._print_summary(trainer, pl_module)

    # -- helpers -----------------------------------------------------------------------
    def _to_loggers(self, trainer: pl.Trainer, metrics: dict[str, float], step: int) -> None:
        """Hand ``metrics`` to every logger at ``step``; the flags once per step (see ``once_per_step``)."""
        metrics = self.session.once_per_step(metrics, step)
        if not metrics:
            return
        for pl_logger in trainer.loggers:
            pl_logger.log_metrics(metrics, step=step)

    def _log(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        metrics: dict[str, float],
        *,
        on_step: bool,
        step: int | None = None,
    ) -> None:
        """Hand ``metrics`` to every logger at ``step`` (default ``trainer.global_step``) and to callback_metrics."""
        if not metrics:
            return
        # Loggers get every report directly (pl_module.log would drop step values that
        # fall between log_every_n_steps); callback_metrics get them too, so other callbacks
        # (checkpointing, early stopping) can monitor energy.
        self._to_loggers(trainer, metrics, trainer.global_step if step is None else step)
        # No sync_dist: the session already aggregated the values over ranks, and a
        # reduce per key would be a collective that ranks with different keys (the main
        # rank reports the power-limit choice) would not all join.
        if self._eval_for_monitors:
            metrics = {**self._eval_for_monitors, **metrics}
            self._eval_for_monitors = {}
        bar = self.session.progress_bar_metrics() if self.config.logging.progress_bar else {}
        if on_step:
            # A step report is a plain value for monitors: written to callback_metrics (and the bar) directly.
            # pl_module.log costs ~4 ms a key on a busy host (a result metric per key, moved to the device)
            # and makes every later step of the epoch walk those keys (docs/results/gpu_overhead.md).
            trainer.callback_metrics.update({key: torch.tensor(value) for key, value in metrics.items()})
            if bar:
                trainer.progress_bar_metrics.update(bar)
            return
        pl_module.log_dict(metrics, on_step=False, on_epoch=True, batch_size=1, logger=False)
        if bar:
            pl_module.log_dict(bar, on_step=False, on_epoch=True, prog_bar=True, logger=False, batch_size=1)

    def _finish(self, trainer: pl.Trainer, *, status: str) -> None:
        self._publish_end(trainer, self.session.train_end(status=status))

    def _print_summary(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Print the run's summary once, under a finished progress bar (a no-op when printed already or none)."""
        summary, self._unprinted = self._unprinted, None
        if summary is None:
            return
        bar = trainer.progress_bar_callback
        if isinstance(bar, RichProgressBar):
            # Its teardown, which stops the live display, comes after ours (Lightning appends the bar after
            # the user's callbacks): stopped here first, or the bar is drawn again under the summary.
            # Stopping twice is harmless.
            bar.teardown(trainer, pl_module, stage="fit")
        rank_zero_info(str(summary))

    def _publish_end(self, trainer: pl.Trainer, summary: RunSummary) -> None:
        """Once per run, however it ended: the last report and the totals to every logger.

        The summary waits for :meth:`_print_summary` (teardown, or the exception), under a finished progress bar.

        Logged at ``trainer.global_step``, the steps taken: past every batch's step, where
        Lightning also logs its epoch-end metrics, so the last report never shares a step with
        the report of the last batch.
        """
        self.summary = summary
        if self._ended:
            return
        self._ended = True
        final = {key: float(value) for key, value in self.session.pop_metrics().items()}
        final.update(self.session.totals())
        self._to_loggers(trainer, final, trainer.global_step)
        for pl_logger in trainer.loggers:
            pl_logger.save()
        self._unprinted = summary


def _logger_run_name(trainer: pl.Trainer) -> str | None:
    """The first logger's run name: a W&B run's name, else name and version (``lightning_logs-3``), or None.

    ``WandbLogger``'s ``name`` is its project and its ``version`` the run id; the run's own name
    (``WandbLogger(name=...)``, or the one W&B made up) is what users know the run by.
    """
    if isinstance(trainer.logger, WandbLogger):
        run_name = getattr(trainer.logger.experiment, "name", None)
        if isinstance(run_name, str) and run_name:
            return run_name
    if trainer.logger is None or trainer.logger.version is None:
        return None
    version = trainer.logger.version
    return f"{trainer.logger.name}-{version}" if isinstance(version, int) else str(version)


def _device_index(trainer: pl.Trainer) -> int | None:
    """The GPU this process trains on: the CUDA device, else the local rank under DDP."""
    device = trainer.strategy.root_device
    if device.type == "cuda":
        return device.index or 0
    return trainer.local_rank if trainer.world_size > 1 else None


def _batch_size(batch: Any) -> int | None:
    """Samples in ``batch``, as Lightning's ``extract_batch_size`` finds them (its answer for exotic batches)."""
    # Fast path for the common batches (a tensor; a tuple, list or dict of tensors of one length), the
    # same answer as extract_batch_size without its generator walk, which cost ~15 µs a step: half the
    # callback's time on a 3 ms step. One plain loop, shape[0] (len() of a tensor is ~6x slower): ~1 µs.
    if isinstance(batch, torch.Tensor):
        if batch.ndim:
            return int(batch.shape[0])
    elif type(batch) in (tuple, list, dict) and batch:
        n = -1
        for x in batch.values() if type(batch) is dict else batch:
            if not isinstance(x, torch.Tensor) or not x.ndim:
                n = -1
                break
            size = x.shape[0]
            if n == -1:
                n = size
            elif size != n:
                n = -1
                break
        if n != -1:
            return int(n)
    try:
        return int(extract_batch_size(batch))
    except Exception:  # an exotic batch: energy per sample is simply not reported
        return None


def _pauses(trainer: pl.Trainer, done: int) -> tuple[int | None, tuple[int | None, ...], int]:
    """This epoch's pauses in batches, ``done`` taken (``every``, ``ends``, ``offset`` of :func:`~._common.next_pause`).

    A validation every ``val_check_batch`` batches: of the epoch when it validates this epoch, of the
    whole fit with ``check_val_every_n_epoch=None`` (``offset``: the fit's batches before this epoch);
    the epoch's end after ``num_training_batches``; the fit's end at ``max_steps`` (its optimizer steps
    left × ``accumulate_grad_batches``). None where Lightning does not say.
    """
    batches = trainer.num_training_batches
    end = batches if isinstance(batches, int) else None  # inf: a loader without a length
    steps_left = trainer.max_steps - trainer.global_step if trainer.max_steps > 0 else None
    fit_end = done + steps_left * trainer.accumulate_grad_batches if steps_left is not None else None
    every = trainer.val_check_batch
    per_epoch = trainer.check_val_every_n_epoch
    offset = 0
    validates = _validates_this_epoch(trainer)
    if per_epoch is None:  # validations counted over the fit's batches, not the epoch's
        progress = getattr(getattr(trainer.fit_loop, "epoch_loop", None), "batch_progress", None)
        fit_total = getattr(progress, "total", None)  # the fit's batches so far (Lightning's loop progress)
        offset = fit_total.completed - done if fit_total is not None else 0
        validates = validates and fit_total is not None
    return (every if validates and isinstance(every, int) else None), (end, fit_end), offset


def _validates_this_epoch(trainer: pl.Trainer) -> bool:
    """Whether the fit validates in this epoch (``check_val_every_n_epoch``; None: every epoch, by the fit's count)."""
    per_epoch = trainer.check_val_every_n_epoch
    return trainer.enable_validation and (per_epoch is None or (trainer.current_epoch + 1) % per_epoch == 0)


def _time_based_validation(trainer: pl.Trainer) -> float | None:
    """The time-based ``val_check_interval`` (s) when this epoch validates by time; None otherwise.

    Lightning >= 2.6 takes a duration there (``"00:00:10:00"``, a ``timedelta``, a dict) and validates after
    the first batch that ends that long after the last validation (``trainer._val_check_time_interval``).
    """
    interval = getattr(trainer, "_val_check_time_interval", None)
    if not isinstance(interval, (int, float)) or interval <= 0 or not _validates_this_epoch(trainer):
        return None
    return float(interval)


def _steps_left(trainer: pl.Trainer) -> int | None:
    """The optimizer steps the fit has left (``max_steps``, or epochs × batches), None when unknown or endless."""
    try:
        total = trainer.estimated_stepping_batches
    except Exception:  # e.g. a loader without a length and no max_steps: the length is unknown
        return None
    if not isinstance(total, (int, float)) or not math.isfinite(total):
        return None
    left = int(total) - int(trainer.global_step)
    return left if left > 0 else None
