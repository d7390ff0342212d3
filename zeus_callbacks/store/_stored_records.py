"""The store's records (frozen dataclasses) and their one schema: checked on load (pydantic), built here on write.

Below the Store contract: of the store it imports only the lease owner token (a new trial's lease fields).

Each store reads its rows or its document through these models before it returns a record or writes
anything back; a record that does not fit is a :class:`~zeus_callbacks.errors.StoreCorruptError` naming the
store, the record (``trial 7``, ``the bandit of job 'nightly'``) and the field, the store left untouched.
The models are lax where a value keeps its meaning (SQLite's ``1`` for true, ``"8"`` for 8), strict in the
rest; a stored energy, time, cost or power limit that is not finite (a NaN an older version let through)
reads as None: unknown, and a negative energy, time or cost, or an arm's negative or non-numeric cost or count, is
refused (no run measures one: the file was damaged or edited). Both stores build what they write here too (a new,
finished or dead trial, a bandit state's JSON), so the SQL rows and the JSON document hold the same fields, refused
by the same checks.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from zeus_callbacks.errors import StoreCorruptError, StoreValueError
from zeus_callbacks.store._lease import lease_owner, this_host

M = TypeVar("M", bound=BaseModel)
TrialStatus = Literal["running", "completed", "failed", "early_stopped", "withdrawn"]
TRIAL_STATUSES: tuple[str, ...] = get_args(TrialStatus)


@dataclass(frozen=True)
class JobRecord:
    """One recurring job.

    Attributes:
        job_id: The job's name (``ZeusConfig.job_id``).
        created_at: Unix time (s) of the job's first record.
        info: Free-form JSON-safe description (workload, GPU, ...).
    """

    job_id: str
    created_at: float
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TrialRecord:
    """One recurrence of a job.

    Attributes:
        trial_id: Unique within the store, increasing in creation order.
        job_id: The job it belongs to.
        batch_size: Batch size it ran at.
        power_limit_W: Power limit it ran at (W); None if unknown.
        status: ``running``, ``completed``, ``failed`` (crashed, or its process died),
            ``early_stopped`` (cost exceeded ``beta_knob`` × the best cost) or ``withdrawn`` (a
            suggestion no run claimed: neither an observation nor a failure of its batch size).
        energy_J: GPU energy of the run (J); None while running or when unknown.
        time_s: Wall time of the run (s); None while running or when unknown.
        cost: ZeusCost of the run (J-equivalent); None while running or when unknown.
        converged: True when the run reached its target metric.
        started_at: Unix time (s) the trial was created.
        ended_at: Unix time (s) it finished; None while running.
        pid: Process id that runs it.
        host: Host name of that process (a dead process is recognised on its own host at once).
        info: Free-form JSON-safe extras (phase of the bandit, reason of a stop, ...).
        owner: Lease owner token of the process that runs it (``host:pid:random``); "" when the
            trial was recorded for another process, or by a schema-1 store.
        heartbeat_at: Unix time (s) its owner last renewed the lease; None: no lease (schema 1).
        pending_id: The id of the pending-trial file it was recorded from (a run that could not
            reach the store at its start or end; docs/stores.md): set when the trial is created
            from that file or its outcome merged from it; None otherwise. Unique within the store,
            so merging the same file again records nothing new.
    """

    trial_id: int
    job_id: str
    batch_size: int
    power_limit_W: float | None
    status: TrialStatus
    energy_J: float | None
    time_s: float | None
    cost: float | None
    converged: bool
    started_at: float
    ended_at: float | None
    pid: int
    host: str
    info: dict[str, Any] = field(default_factory=dict)
    owner: str = ""
    heartbeat_at: float | None = None
    pending_id: str | None = None


@dataclass(frozen=True)
class BanditState:
    """The batch-size bandit's persisted state of one job.

    Attributes:
        job_id: The job.
        state: JSON-safe optimiser state (phase, pruning progress, RNG state, min cost).
        arms: Batch size → JSON-safe per-arm state (e.g. pruned, last posterior).
        version: Incremented by every update (optimistic readers can compare).
    """

    job_id: str
    state: dict[str, Any] = field(default_factory=dict)
    arms: dict[int, dict[str, Any]] = field(default_factory=dict)
    version: int = 0


def check_finite(location: str, what: str, **values: float | None) -> None:
    """Refuse a NaN or infinite value (None, unknown, passes) with a :class:`StoreValueError` naming ``what``.

    A NaN or infinite energy, time, cost or power limit is not a measurement: recorded, it
    would poison every later suggestion of the bandit (a NaN mean, a NaN best cost).
    """
    bad = {k: v for k, v in values.items() if v is not None and not math.isfinite(float(v))}
    if bad:
        named = ", ".join(f"{k}={v!r}" for k, v in bad.items())
        raise StoreValueError(
            f"store {location}: {what}: {named} is not a finite number; record None (unknown) instead — nothing "
            "was written"
        )


def dumps_strict(value: Any, location: str, what: str) -> str:
    """``value`` as JSON text; NaN or ±infinity anywhere in it (not JSON) is a :class:`StoreValueError`."""
    try:
        return json.dumps(value, allow_nan=False)
    except ValueError as exc:
        raise StoreValueError(
            f"store {location}: {what} holds a non-finite number ({exc}); nothing was written"
        ) from exc


TRIAL_FIELDS = tuple(f.name for f in dataclasses.fields(TrialRecord))
"""The fields of :class:`TrialRecord`, in order (the trials table's columns)."""


class _Record(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=False)


class TrialModel(_Record):
    """One trial as stored (the fields of :class:`TrialRecord`)."""

    trial_id: int = Field(gt=0)
    job_id: str
    batch_size: int
    power_limit_W: float | None = None
    status: TrialStatus
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
        return None if value is not None and not math.isfinite(value) else value

    @field_validator("energy_J", "time_s", "cost", mode="after")
    @classmethod
    def _not_negative(cls, value: float | None) -> float | None:
        if value is not None and value < 0:
            raise ValueError("must be ≥ 0 (a run's energy, time and cost are never negative)")
        return value

    @field_validator("started_at", "ended_at", "heartbeat_at", mode="after")
    @classmethod
    def _finite_time(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError("must be a finite Unix time")
        return value


class ArmModel(_Record):
    """One arm's snapshot as the bandit stores it (``_bandit._arm_snapshot``); other keys pass unchecked."""

    pruned: bool | None = None
    observations: int | None = Field(None, ge=0)
    mean_cost: float | None = None
    std_cost: float | None = None

    @field_validator("mean_cost", "std_cost", mode="after")
    @classmethod
    def _not_negative(cls, value: float | None) -> float | None:
        # A NaN reads as before (an older version's); it is refused on the way in (dumps_strict), not here.
        if value is not None and value < 0:
            raise ValueError("must be ≥ 0 (a cost and its spread are never negative)")
        return value


def arm_problem(arm: Mapping[str, Any]) -> tuple[str, str] | None:
    """The first field of an arm's snapshot that no bandit writes (a negative count, a cost not a number), or None.

    Returns:
        (field, problem) of the first misfit; None when the arm fits :class:`ArmModel`.
    """
    try:
        ArmModel.model_validate(dict(arm))
    except ValidationError as exc:
        error = exc.errors()[0]
        return str(error["loc"][0]), f"{error['msg']}, got {error.get('input')!r}"
    return None


def check_arm(arm: Mapping[str, Any], location: str, record: str) -> dict[str, Any]:
    """``arm`` as read from a store, checked (:func:`arm_problem`); a misfit is a :class:`StoreCorruptError`."""
    problem = arm_problem(arm)
    if problem is not None:
        raise corrupt(location, f"{record} field {problem[0]}", problem[1])
    return dict(arm)


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
    for job_id, entry in model.bandits.items():
        for key, arm in entry.arms.items():
            check_arm(arm, location, f"the bandit of job {job_id!r}, arm {key}")
    return model.model_dump()


def json_column(text: Any, location: str, record: str) -> Any:
    """A JSON column of a SQL row (``info``, ``state``), decoded; not JSON text: :class:`StoreCorruptError`."""
    if not isinstance(text, (str, bytes)):
        raise corrupt(location, record, f"expected JSON text, got {type(text).__name__}")
    try:
        return json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise corrupt(location, record, f"not JSON: {exc}") from exc


def _validated(model: type[M], fields: Mapping[str, Any], location: str, name: str) -> M:
    """``fields`` as ``model``, an info given as JSON text (a SQL column) decoded; a misfit is a StoreCorruptError."""
    if not isinstance(fields.get("info"), Mapping):
        fields = {**fields, "info": json_column(fields.get("info"), location, name)}
    try:
        return model.model_validate(dict(fields))
    except ValidationError as exc:
        raise corrupt(location, name, _first_error(exc, None)[1] + f" (field {exc.errors()[0]['loc'][0]})") from exc


def trial(d: Mapping[str, Any], location: str) -> TrialRecord:
    """A :class:`TrialRecord` from its stored fields (a SQL row or a JSON object), checked."""
    m = _validated(TrialModel, d, location, f"trial {d.get('trial_id')!r}")
    return TrialRecord(**{**{key: getattr(m, key) for key in TRIAL_FIELDS}, "info": dict(m.info)})


def job(job_id: Any, created_at: Any, info: Any, location: str) -> JobRecord:
    """A :class:`JobRecord` from its stored fields, checked."""
    name = f"job {job_id!r}"
    if not isinstance(job_id, str):
        raise corrupt(location, name, f"job_id must be text, got {type(job_id).__name__}")
    m = _validated(JobModel, {"created_at": created_at, "info": info}, location, name)
    return JobRecord(job_id, m.created_at, dict(m.info))


def mapping_column(value: Any, location: str, record: str) -> dict[str, Any]:
    """A stored JSON object (a bandit state, an arm, a profile): a mapping, or JSON text holding one, checked."""
    if isinstance(value, Mapping):
        return dict(value)
    value = json_column(value, location, record)
    if not isinstance(value, dict):
        raise corrupt(location, record, f"expected a JSON object, got {type(value).__name__}")
    return value


def batch_size_key(value: Any, location: str, record: str) -> int:
    """An arm's batch size as stored (an integer column, or the JSON store's text key), checked."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise corrupt(location, record, f"batch size {value!r} is not a whole number") from None
    if isinstance(value, bool) or not isinstance(value, (int, str)) or str(number) != str(value).strip():
        raise corrupt(location, record, f"batch size {value!r} is not a whole number")
    return number


def version(value: Any, location: str, record: str) -> int:
    """A version counter as stored (a bandit's, the schema's), checked: a whole number ≥ 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise corrupt(location, record, f"version {value!r} is not a whole number ≥ 0")
    return value


def bandit(job_id: str, state: Any, version_value: Any, arms: Iterable[tuple[Any, Any]], location: str) -> BanditState:
    """A :class:`BanditState` from its stored parts (JSON text or mappings; batch sizes integers or text), checked."""
    name = f"the bandit of job {job_id!r}"
    decoded = {
        batch_size_key(b, location, f"{name}, arm {b!r}"): check_arm(
            mapping_column(s, location, f"{name}, arm {b!r}"), location, f"{name}, arm {b!r}"
        )
        for b, s in arms
    }
    return BanditState(
        job_id=job_id,
        state=mapping_column(state, location, name),
        arms=dict(sorted(decoded.items())),
        version=version(version_value, location, name),
    )


def bandit_json(state: BanditState, location: str) -> tuple[str, dict[int, str]]:
    """A bandit state as stored: its state's JSON and each arm's (batch size → JSON), checked (:func:`dumps_strict`)."""
    job_id = state.job_id
    for b, arm in state.arms.items():  # what a read would refuse is never written
        problem = arm_problem(arm)
        if problem is not None:
            raise StoreValueError(
                f"store {location}: arm {b} of job {job_id}: field {problem[0]}: {problem[1]}; nothing was written"
            )
    return dumps_strict(state.state, location, f"the bandit state of job {job_id}"), {
        int(b): dumps_strict(s, location, f"arm {b} of job {job_id}") for b, s in state.arms.items()
    }


def new_trial(
    location: str,
    job_id: str,
    batch_size: int,
    power_limit_W: float | None,
    *,
    info: Mapping[str, Any] | None,
    pid: int | None,
    pending_id: str | None,
    now_s: float,
) -> dict[str, Any]:
    """The stored fields of a new ``running`` trial (all but its ``trial_id``), checked.

    A trial of this process (``pid`` None or ours) carries this process's lease owner token; one
    recorded for another process carries none. A non-finite number is a :class:`StoreValueError`.
    """
    check_finite(location, f"create a trial of job {job_id}", power_limit_W=power_limit_W)
    info_json = dumps_strict(dict(info or {}), location, f"the info of a new trial of job {job_id}")
    mine = pid is None or int(pid) == os.getpid()
    return {
        "job_id": job_id,
        "batch_size": int(batch_size),
        "power_limit_W": None if power_limit_W is None else float(power_limit_W),
        "status": "running",
        "energy_J": None,
        "time_s": None,
        "cost": None,
        "converged": False,
        "started_at": now_s,
        "ended_at": None,
        "pid": os.getpid() if pid is None else int(pid),
        "host": this_host(),
        "info": json.loads(info_json),
        "owner": lease_owner() if mine else "",
        "heartbeat_at": now_s,
        "pending_id": pending_id,
    }


@dataclass(frozen=True)
class Outcome:
    """A trial's outcome as :meth:`~zeus_callbacks.store._base.Store.finish_trial` is given it, checked."""

    status: str
    energy_J: float | None
    time_s: float | None
    cost: float | None
    converged: bool
    batch_size: int | None
    power_limit_W: float | None
    info: dict[str, Any]
    pending_id: str | None


def outcome(location: str, trial_id: int, **given: Any) -> Outcome:
    """The outcome ``finish_trial`` was given (its keyword arguments but ``bandit_update``), checked before any write.

    Raises:
        ValueError: ``status`` is ``running`` or unknown.
        StoreValueError: A number (or a value of ``info``) is not finite, or an energy, time or cost is negative.
    """
    result = Outcome(**{**given, "info": dict(given.get("info") or {})})
    if result.status not in TRIAL_STATUSES or result.status == "running":
        raise ValueError(
            f"a finished trial's status must be completed, failed, early_stopped or withdrawn, got {result.status!r}"
        )
    check_finite(
        location,
        f"finish trial {trial_id}",
        energy_J=result.energy_J,
        time_s=result.time_s,
        cost=result.cost,
        power_limit_W=result.power_limit_W,
    )
    negative = {k: v for k, v in (("energy_J", result.energy_J), ("time_s", result.time_s), ("cost", result.cost))
                if v is not None and v < 0}  # fmt: skip
    if negative:  # a read would refuse it: never written
        named = ", ".join(f"{k}={v!r}" for k, v in negative.items())
        raise StoreValueError(
            f"store {location}: finish trial {trial_id}: {named} is negative; record None (unknown) instead — "
            "nothing was written"
        )
    dumps_strict(result.info, location, f"the info of trial {trial_id}")
    return result


def finished_fields(old: TrialRecord, done: Outcome, now_s: float) -> dict[str, Any]:
    """The stored fields a finished trial changes: its outcome, ``info`` merged, the rest kept unless given."""
    return {
        "status": done.status,
        "energy_J": done.energy_J,
        "time_s": done.time_s,
        "cost": done.cost,
        "converged": bool(done.converged),
        "ended_at": now_s,
        "batch_size": old.batch_size if done.batch_size is None else int(done.batch_size),
        "power_limit_W": old.power_limit_W if done.power_limit_W is None else float(done.power_limit_W),
        "info": {**old.info, **done.info},
        "pending_id": old.pending_id if done.pending_id is None else done.pending_id,
    }


def orphan_fields(trial: TrialRecord, reason: str, now_s: float) -> dict[str, Any]:
    """The stored fields of a dead trial marked failed on open (``reason``: see ``_base.dead_trials``)."""
    return {"status": "failed", "ended_at": now_s, "info": {**trial.info, "reason": reason}}


@dataclass(frozen=True)
class Snapshot:
    """Every record of a store, as `_base.snapshot` reads it and ``Store.import_records`` writes it."""

    jobs: list[JobRecord] = field(default_factory=list)
    trials: list[TrialRecord] = field(default_factory=list)
    bandits: list[BanditState] = field(default_factory=list)
    profiles: dict[str, dict[str, Any]] = field(default_factory=dict)
