"""The bandit's settings: :class:`BanditSettings`, checked once when built (from ``BatchSizeConfig`` or by hand)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Literal


@dataclass(frozen=True)
class BanditSettings:
    """Settings of :class:`~._bandit.BatchSizeBandit`: the fields of :class:`~zeus_callbacks.config.BatchSizeConfig`.

    Each field means what the config field of its name does (docs/configuration.md), None where the
    config says null; ``batch_sizes`` may come in any order (duplicates dropped) and the target is
    ``batch_size.target``'s ``metric``, ``value`` and ``direction`` (no target: no run converges).
    """

    batch_sizes: tuple[int, ...]
    default_batch_size: int
    beta_knob: float | None = 2.0
    pruning_rounds: int = 1
    seed: int = 0
    prior_std_rel: float = 1.0
    noise_floor_rel: float = 0.05
    window: int | None = None
    discount: float | None = None
    prune_cost_ratio: float | None = 1.5
    prune_cost_ratio_no_descent: float | None = 1.3
    elimination_z: float | None = 2.0
    satisficing_rel: float | None = 0.01
    explore_stop_z: float | None = 2.0
    max_failures: int | None = 2
    target_metric: str | None = None
    target_value: float | None = None
    target_direction: Literal["max", "min"] = "max"

    @property
    def has_target(self) -> bool:
        """Whether the job has a target: a run converges by reaching it (none reached yet: the pruning holds)."""
        return self.target_metric is not None and self.target_value is not None

    def __post_init__(self) -> None:
        sizes = tuple(sorted({int(b) for b in self.batch_sizes}))
        if not sizes or sizes[0] <= 0:
            raise ValueError(f"batch_sizes must be positive integers, got {list(self.batch_sizes)}")
        object.__setattr__(self, "batch_sizes", sizes)
        if self.default_batch_size not in sizes:
            raise ValueError(f"default_batch_size {self.default_batch_size} is not one of batch_sizes {list(sizes)}")
        if self.beta_knob is not None and not self.beta_knob > 1.0:
            raise ValueError(f"beta_knob must be > 1 (or None), got {self.beta_knob}")
        if self.pruning_rounds < 1:
            raise ValueError(f"pruning_rounds must be ≥ 1, got {self.pruning_rounds}")
        if not (self.prior_std_rel > 0 and self.noise_floor_rel > 0):
            raise ValueError("prior_std_rel and noise_floor_rel must be positive")
        if self.window is not None and self.window < 1:
            raise ValueError(f"window must be ≥ 1, got {self.window}")
        if self.prune_cost_ratio is not None and not self.prune_cost_ratio >= 1.0:
            raise ValueError(f"prune_cost_ratio must be ≥ 1 (or None), got {self.prune_cost_ratio}")
        if self.prune_cost_ratio_no_descent is not None and not self.prune_cost_ratio_no_descent >= 1.0:
            raise ValueError(
                f"prune_cost_ratio_no_descent must be ≥ 1 (or None), got {self.prune_cost_ratio_no_descent}"
            )
        if self.elimination_z is not None and not self.elimination_z > 0:
            raise ValueError(f"elimination_z must be > 0 (or None), got {self.elimination_z}")
        if self.satisficing_rel is not None and not 0.0 <= self.satisficing_rel < 1.0:
            raise ValueError(f"satisficing_rel must be in [0, 1) (or None), got {self.satisficing_rel}")
        if self.explore_stop_z is not None and not self.explore_stop_z > 0:
            raise ValueError(f"explore_stop_z must be > 0 (or None), got {self.explore_stop_z}")
        if self.max_failures is not None and self.max_failures < 1:
            raise ValueError(f"max_failures must be ≥ 1 (or None), got {self.max_failures}")
        if self.discount is not None and not 0.0 < self.discount <= 1.0:
            raise ValueError(f"discount must be in (0, 1], got {self.discount}")
        if (self.target_metric is None) != (self.target_value is None):
            raise ValueError("target_metric and target_value are set together (or neither)")
        if self.target_value is not None and not math.isfinite(self.target_value):
            raise ValueError(f"target_value must be a finite number, got {self.target_value}")
        if self.target_direction not in ("max", "min"):
            raise ValueError(f"target_direction must be max or min, got {self.target_direction!r}")

    @classmethod
    def from_config(cls, config: Any) -> BanditSettings:
        """Build from a :class:`~zeus_callbacks.config.BatchSizeConfig`.

        Raises:
            ValueError: ``batch_sizes`` or ``default_batch_size`` is missing or inconsistent.
        """
        if not config.batch_sizes or config.default_batch_size is None:
            raise ValueError("batch_size.batch_sizes and batch_size.default_batch_size must be set")
        same = {f.name: getattr(config, f.name) for f in fields(cls) if not f.name.startswith("target_")}
        target = config.target
        return cls(
            **{**same, "batch_sizes": tuple(config.batch_sizes)},
            target_metric=None if target is None else target.metric,
            target_value=None if target is None else target.value,
            target_direction="max" if target is None else target.direction,
        )
