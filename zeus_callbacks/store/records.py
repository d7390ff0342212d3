"""The shape of every stored record, checked on load (pydantic): a hand edit or a flipped bit is named, never a crash.

Each backend reads its rows or its document through these models before it returns a record
or writes anything back. A record that does not fit raises
:class:`~zeus_callbacks.errors.StoreCorruptError` naming the store and the record (``trial 7``,
``job 'nightly'``, ``the bandit of job 'nightly'``) and the field; the store is left untouched.

The models are lax in the ways a value keeps its meaning (SQLite's ``1`` for true, ``"8"`` for
8) and strict in the rest. A stored energy, time, cost or power limit that is not a finite number
(a NaN an older version let through) reads as None: unknown, which is what it is.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from zeus_callbacks.errors import StoreCorruptError
from zeus_callbacks.store.base import JobRecord, TrialRecord


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class _Record(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=False)


class TrialModel(_Record):
    """One trial as stored (the fields of :class:`~zeus_callbacks.store.base.TrialRecord`)."""

    trial_id: int = Field(gt=0)
    job_id: str
    batch_size: int
    power_limit_W: float | None = None
    status: Literal["running", "completed", "failed", "early_stopped"]
    energy_J: float | None = None
    time_s: float | None = None
    cost: float | None = None
    converged: bool = False
    started_at: float
    ended_at: float | None = None
    pid: int = 0
    host: str = ""
    info: dict[str, Any] = Field(default_factory=dict)
    owner: str = ""
    heartbeat_at: float | None = None
    pending_id: str | None = None

    @field_validator("power_limit_W", "energy_J", "time_s", "cost", mode="after")
    @classmethod
    def _unknown_when_not_finite(cls, value: float | None) -> float | None:
        return _finite_or_none(value)

    @field_validator("started_at", "ended_at", "heartbeat_at", mode="after")
    @classmethod
    def _finite_time(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError("must be a finite Unix time")
        return value


class JobModel(_Record):
    """One job as stored."""

    created_at: float
    info: dict[str, Any] = Field(default_factory=dict)


class BanditModel(_Record):
    """One job's bandit state as the JSON store keeps it (``arms`` keyed by the batch size as text)."""

    state: dict[str, Any]
    arms: dict[str, dict[str, Any]] = Field(default_factory=dict)
    version: int = Field(ge=0)

    @field_validator("arms", mode="after")
    @classmethod
    def _arm_keys_are_batch_sizes(cls, arms: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for key in arms:
            if not key.lstrip("-").isdigit():
                raise ValueError(f"arm key {key!r} is not a batch size")
        return arms


class DocumentModel(_Record):
    """The JSON store's whole document (``format`` and ``schema_version`` are checked before)."""

    format: str
    schema_version: int
    next_trial_id: int = Field(gt=0)
    jobs: dict[str, JobModel]
    trials: list[TrialModel]
    bandits: dict[str, BanditModel]
    profiles: dict[str, dict[str, Any]]

    @model_validator(mode="after")
    def _ids_are_unique_and_below_next(self) -> DocumentModel:
        ids = [t.trial_id for t in self.trials]
        if len(set(ids)) != len(ids):
            raise ValueError("two trials share a trial_id")
        pending = [t.pending_id for t in self.trials if t.pending_id is not None]
        if len(set(pending)) != len(pending):
            raise ValueError("two trials share a pending_id")
        if ids and max(ids) >= self.next_trial_id:
            raise ValueError(f"next_trial_id {self.next_trial_id} is not above the largest trial_id {max(ids)}")
        return self


def _where(loc: tuple[Any, ...], doc: Mapping[str, Any] | None) -> str:
    """A validation error's location in words: ``trial 7 (trials[3]) field batch_size``."""
    parts = list(loc)
    if doc is not None and len(parts) >= 2 and parts[0] == "trials" and isinstance(parts[1], int):
        try:
            trial_id = doc["trials"][parts[1]].get("trial_id")
        except (AttributeError, IndexError, KeyError, TypeError):
            trial_id = None
        head = f"trial {trial_id} (trials[{parts[1]}])" if trial_id is not None else f"trials[{parts[1]}]"
        rest = parts[2:]
    elif len(parts) >= 2 and parts[0] in ("jobs", "bandits", "profiles"):
        head = {"jobs": "job", "bandits": "the bandit of job", "profiles": "profile"}[parts[0]] + f" {parts[1]!r}"
        rest = parts[2:]
    else:
        head, rest = "the document", parts
    return head + (f" field {'.'.join(str(p) for p in rest)}" if rest else "")


def corrupt(location: str, record: str, problem: str) -> StoreCorruptError:
    """The error for a record that does not fit: names the store, the record and the problem."""
    return StoreCorruptError(
        f"store {location}: {record} is malformed ({problem}); the store was left untouched — restore it from a "
        "backup, fix the record by hand, or move the file away to start a new one"
    )


def _first_error(exc: ValidationError, doc: Mapping[str, Any] | None) -> tuple[str, str]:
    error = exc.errors()[0]
    value = repr(error.get("input"))
    value = value if len(value) <= 60 else value[:57] + "..."
    return _where(tuple(error["loc"]), doc), f"{error['msg']}, got {value}" if error.get("loc") else error["msg"]


def validate_document(doc: dict[str, Any], location: str) -> dict[str, Any]:
    """The JSON store's document, every record checked and normalised (``"8"`` → 8).

    Raises:
        StoreCorruptError: A record does not fit; the message names the store, the record and the field.
    """
    try:
        model = DocumentModel.model_validate(doc)
    except ValidationError as exc:
        record, problem = _first_error(exc, doc)
        raise corrupt(location, record, problem) from exc
    return model.model_dump()


def json_column(text: Any, location: str, record: str) -> Any:
    """A JSON column of a SQL row (``info``, ``state``), decoded.

    Raises:
        StoreCorruptError: Not text, or not JSON.
    """
    if not isinstance(text, (str, bytes)):
        raise corrupt(location, record, f"expected JSON text, got {type(text).__name__}")
    try:
        return json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise corrupt(location, record, f"not JSON: {exc}") from exc


def trial(d: Mapping[str, Any], location: str) -> TrialRecord:
    """A :class:`TrialRecord` from its stored fields (a SQL row or a JSON object), checked.

    ``info`` may be JSON text (a SQL column) or a mapping.

    Raises:
        StoreCorruptError: A field does not fit.
    """
    name = f"trial {d.get('trial_id')!r}"
    fields = dict(d)
    if not isinstance(fields.get("info"), Mapping):
        fields["info"] = json_column(fields.get("info"), location, name)
    try:
        m = TrialModel.model_validate(fields)
    except ValidationError as exc:
        raise corrupt(location, name, _first_error(exc, None)[1] + f" (field {exc.errors()[0]['loc'][0]})") from exc
    return TrialRecord(
        trial_id=m.trial_id,
        job_id=m.job_id,
        batch_size=m.batch_size,
        power_limit_W=m.power_limit_W,
        status=m.status,
        energy_J=m.energy_J,
        time_s=m.time_s,
        cost=m.cost,
        converged=m.converged,
        started_at=m.started_at,
        ended_at=m.ended_at,
        pid=m.pid,
        host=m.host,
        info=dict(m.info),
        owner=m.owner,
        heartbeat_at=m.heartbeat_at,
        pending_id=m.pending_id,
    )


def job(job_id: Any, created_at: Any, info: Any, location: str) -> JobRecord:
    """A :class:`JobRecord` from its stored fields (``info`` as JSON text or a mapping), checked.

    Raises:
        StoreCorruptError: A field does not fit.
    """
    name = f"job {job_id!r}"
    if not isinstance(job_id, str):
        raise corrupt(location, name, f"job_id must be text, got {type(job_id).__name__}")
    if not isinstance(info, Mapping):
        info = json_column(info, location, name)
    try:
        m = JobModel.model_validate({"created_at": created_at, "info": info})
    except ValidationError as exc:
        raise corrupt(location, name, _first_error(exc, None)[1] + f" (field {exc.errors()[0]['loc'][0]})") from exc
    return JobRecord(job_id, m.created_at, dict(m.info))


def mapping_column(text: Any, location: str, record: str) -> dict[str, Any]:
    """A JSON column that must hold an object (a bandit state, an arm, a profile), decoded.

    Raises:
        StoreCorruptError: Not JSON, or not an object.
    """
    value = json_column(text, location, record)
    if not isinstance(value, dict):
        raise corrupt(location, record, f"expected a JSON object, got {type(value).__name__}")
    return value


def batch_size_key(value: Any, location: str, record: str) -> int:
    """An arm's batch size as stored (an integer column, or the JSON store's text key), checked.

    Raises:
        StoreCorruptError: Not a whole number.
    """
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise corrupt(location, record, f"batch size {value!r} is not a whole number") from None
    if isinstance(value, bool) or not isinstance(value, (int, str)) or str(number) != str(value).strip():
        raise corrupt(location, record, f"batch size {value!r} is not a whole number")
    return number


def version(value: Any, location: str, record: str) -> int:
    """A bandit's version counter as stored, checked.

    Raises:
        StoreCorruptError: Not a whole number ≥ 0.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise corrupt(location, record, f"version {value!r} is not a whole number ≥ 0")
    return value
