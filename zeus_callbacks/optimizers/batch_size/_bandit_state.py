"""The bandit's state (:class:`StoredState`): typed and frozen, checked on every read from the store."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from zeus_callbacks.store._stored_records import corrupt


class StoredState(BaseModel):
    """The batch-size bandit's state of one job; checked on every read from the store (:func:`read_state`).

    Frozen: a transition makes a new state (:meth:`replace`). What the store keeps is
    :meth:`to_stored`: the fields that were set, so a state written by an older version gains
    no key it did not have; keys this version does not know are kept.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    phase: Literal["pruning", "thompson"]
    round: int = Field(ge=0)
    direction: Literal["start", "down", "up", "done"]
    start: int
    candidate: int | None
    survivors: list[int] = Field(min_length=1)
    round_results: dict[str, list[Any]] = Field(default_factory=dict)
    descending: bool = False
    min_cost: float | None = None
    rng: dict[str, Any]
    batch_sizes: list[int] = Field(min_length=1)
    failed_arms: dict[str, str] = Field(default_factory=dict)

    @field_validator("round_results", mode="after")
    @classmethod
    def _results_are_cost_and_flag(cls, value: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for size, pair in value.items():
            if (
                not size.lstrip("-").isdigit()
                or len(pair) != 2
                or not isinstance(pair[1], bool)
                or not (pair[0] is None or (isinstance(pair[0], (int, float)) and not isinstance(pair[0], bool)))
            ):
                raise ValueError(f"round result of {size!r} must be [cost or null, true/false], got {pair!r}")
        return value

    @field_validator("rng", mode="after")
    @classmethod
    def _rng_state_is_pcg64(cls, value: dict[str, Any]) -> dict[str, Any]:
        try:
            np.random.PCG64().state = value  # type: ignore[assignment]  # numpy types it as its TypedDict
        except (TypeError, ValueError, KeyError, OverflowError) as exc:
            raise ValueError(f"not a PCG64 generator state ({exc})") from None
        return value

    @model_validator(mode="after")
    def _sizes_are_arms(self) -> StoredState:
        sizes = set(self.batch_sizes)
        if self.start not in sizes or not set(self.survivors) <= sizes:
            raise ValueError("start and survivors must be among batch_sizes")
        if self.phase == "pruning" and self.candidate not in sizes:
            raise ValueError("a pruning state's candidate must be one of batch_sizes")
        return self

    def replace(self, **changes: Any) -> StoredState:
        """A copy with ``changes`` (not checked again: transitions keep the shape)."""
        return self.model_copy(update=changes)

    def to_stored(self) -> dict[str, Any]:
        """The JSON-safe mapping the store keeps (the fields set, no default added)."""
        return self.model_dump(exclude_unset=True)


def read_state(state: Mapping[str, Any], location: str, job_id: str) -> StoredState:
    """The job's bandit state as read from the store, its shape checked (``location``, ``job_id``: for the message).

    Raises:
        StoreCorruptError: The state does not fit (a hand edit, a damaged file); names the store and the job.
    """
    try:
        return StoredState.model_validate(dict(state))
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(p) for p in error["loc"]) or "the state"
        raise corrupt(location, f"the bandit state of job {job_id!r}", f"{field}: {error['msg']}") from exc
