"""Batch-size optimisation across recurrences of a job (Zeus, NSDI '23, §4.2–4.4).

- :mod:`._batch_size_controller`: one recurrence of a job (suggest, watch the target, stop early,
  record the trial); what the session delegates to.
- :mod:`._bandit`: :class:`BatchSizeBandit`, pruning then Gaussian Thompson sampling, persisted in a store.
- :mod:`._bandit_settings`, :mod:`._bandit_state`: its settings and its stored state, both checked.
- :mod:`._observations`: which trials are observations of their arm, and which count against it.
- :mod:`._maths`: the pure functions the bandit uses.
"""

from zeus_callbacks.optimizers.batch_size._bandit import BanditPhase, BatchSizeBandit, Suggestion
from zeus_callbacks.optimizers.batch_size._bandit_settings import BanditSettings
from zeus_callbacks.optimizers.batch_size._batch_size_controller import (
    BatchSizeController,
    EarlyStopRule,
    SuggestedBatchSize,
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

__all__ = [
    "ArmPosterior",
    "BanditPhase",
    "BanditSettings",
    "BatchSizeBandit",
    "BatchSizeController",
    "EarlyStopRule",
    "Suggestion",
    "SuggestedBatchSize",
    "eliminate_arms",
    "gaussian_posterior",
    "gaussian_tail_mean",
    "observation_weights",
    "pooled_relative_variance",
    "prior_from_costs",
    "satisficing_choice",
    "scaled_learning_rate",
    "suggest_batch_size",
]
