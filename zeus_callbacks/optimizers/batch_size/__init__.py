"""Batch-size optimisation across recurrences of a job (Zeus, NSDI '23, §4.2–4.4).

The package reads top-down:

- :mod:`._controller`: one recurrence of a job (suggest, watch the target, stop early, record the trial);
  what the session delegates to.
- :mod:`._bandit`: :class:`BatchSizeBandit`, pruning then Gaussian Thompson sampling, persisted in a store
  (the method and its fixes to Zeus's version are described there).
- :mod:`._settings`: :class:`BanditSettings`, checked when built.
- :mod:`._observations`: which trials are observations of their arm, and which count against it.
- :mod:`._state`: the shape of the bandit's stored state, checked on every read.
- :mod:`._maths`: the pure functions the bandit uses.
"""

from zeus_callbacks.optimizers.batch_size._bandit import BanditPhase, BatchSizeBandit, Suggestion
from zeus_callbacks.optimizers.batch_size._controller import (
    MIN_CHECK_INTERVAL_S,
    BatchSizeController,
    EarlyStopRule,
    SuggestedBatchSize,
    open_job_store,
    run_store,
    suggest_batch_size,
)
from zeus_callbacks.optimizers.batch_size._maths import (
    ArmPosterior,
    eliminate_arms,
    gaussian_posterior,
    gaussian_tail_mean,
    observation_weights,
    pooled_relative_variance,
    prior_from_costs,
    satisficing_choice,
    scaled_learning_rate,
)
from zeus_callbacks.optimizers.batch_size._settings import BanditSettings

__all__ = [
    "ArmPosterior",
    "BanditSettings",
    "BatchSizeBandit",
    "BatchSizeController",
    "EarlyStopRule",
    "MIN_CHECK_INTERVAL_S",
    "BanditPhase",
    "Suggestion",
    "SuggestedBatchSize",
    "eliminate_arms",
    "gaussian_posterior",
    "gaussian_tail_mean",
    "observation_weights",
    "open_job_store",
    "pooled_relative_variance",
    "prior_from_costs",
    "run_store",
    "satisficing_choice",
    "scaled_learning_rate",
    "suggest_batch_size",
]
