"""The public Zeus (NSDI '23) traces: power-limit sweeps and training paths.

Source: J. You, J.-W. Chung, M. Chowdhury, "Zeus: Understanding and Optimizing GPU
Energy Consumption of DNN Training", USENIX NSDI 2023; data files from the public
repository ml-energy/zeus (Apache-2.0), shipped in ``zeus_callbacks/data/zeus_nsdi23/``
(see ``zeus_callbacks/data/README.md``).

- ``summary_power_{v100,a40}.csv``: one row per (dataset, network, batch size,
  optimizer, power limit) with the measured time per epoch (s) and average power (W).
- ``summary_train.csv``: one row per (configuration, learning rate, run, target metric)
  with the epoch at which validation reached the target (``nan`` when it never did).

A user's own sweep in the same format (any GPU, see ``docs/backends.md``) is read by
:func:`read_trace` into a :class:`GPUTrace`; every lookup below takes either a bundled
GPU's name or such a trace.

Example:
    >>> curve = power_curve("A40", "imagenet")            # default batch size 256
    >>> time_per_epoch_s_at(curve, 300.0) < time_per_epoch_s_at(curve, 150.0)
    True
"""

from __future__ import annotations

import csv
import functools
import io
import logging
import math
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from importlib.resources import files
from pathlib import Path
from types import MappingProxyType
from typing import NamedTuple

import numpy as np

from zeus_callbacks.errors import TraceFormatError

logger = logging.getLogger(__name__)

GPUName = str
"""A GPU model name: ``"V100"``/``"A40"`` (bundled traces) or any name a user trace carries."""
GPUS: tuple[str, ...] = ("V100", "A40")
"""GPUs whose sweeps ship with the package (Zeus NSDI '23)."""
BUNDLED_SOURCE = "zeus_nsdi23"
"""The :attr:`GPUTrace.source` of the bundled traces."""
POWER_COLUMNS = ("power_limit", "time_per_epoch", "average_power")
"""Columns every power-limit sweep CSV needs (W, s, W)."""
KEY_COLUMNS = ("dataset", "network", "batch_size", "optimizer")
"""Columns naming a sweep's workload; optional in a user trace (one sweep per file then)."""
TRAIN_COLUMNS = ("dataset", "network", "batch_size", "optimizer", "learning_rate", "run", "target_metric",
                 "target_epoch")  # fmt: skip
"""Columns of a training-path CSV (Zeus ``summary_train.csv``)."""
_POWER_FILES: Mapping[str, str] = MappingProxyType({"V100": "summary_power_v100.csv", "A40": "summary_power_a40.csv"})
_TRAIN_FILE = "summary_train.csv"


@dataclass(frozen=True)
class Workload:
    """One of the six workloads of the Zeus paper's evaluation (NSDI '23, §6.1).

    Attributes:
        dataset: Dataset name, also the workload's name (e.g. ``"imagenet"``).
        network: Model name as written in the traces (e.g. ``"resnet50"``).
        optimizer: Optimizer name as written in the traces (e.g. ``"adadelta"``).
        target_metric: Validation metric value that ends training (accuracy, WER, ...).
        max_epochs: Epoch budget of one training run.
        default_batch_size: The paper's default batch size (before any per-GPU cap).
        higher_is_better: False when a lower metric is better (librispeech WER).
    """

    dataset: str
    network: str
    optimizer: str
    target_metric: float
    max_epochs: int
    default_batch_size: int
    higher_is_better: bool = True


WORKLOADS: Mapping[str, Workload] = MappingProxyType(
    {
        w.dataset: w
        for w in (
            Workload("cifar100", "shufflenetv2", "adadelta", 0.6, 100, 1024),
            Workload("imagenet", "resnet50", "adadelta", 0.65, 100, 256),
            Workload("librispeech", "deepspeech2", "adamw", 40.0, 16, 192, higher_is_better=False),
            Workload("movielens-1m", "ncf", "adam", 0.41, 100, 1024),
            Workload("sentiment140", "bert_base_uncased", "adamw", 0.84, 10, 128),
            Workload("squad", "bert_base_uncased", "adamw", 84.0, 6, 32),
        )
    }
)


class WorkloadKey(NamedTuple):
    """Key of one power-limit sweep in ``summary_power_*.csv``."""

    dataset: str
    network: str
    batch_size: int
    optimizer: str


@dataclass(frozen=True, eq=False)
class PowerCurve:
    """A power-limit sweep of one workload on one GPU (Zeus NSDI '23 traces).

    Attributes:
        power_limit_W: Measured power limits, increasing, shape ``(n,)`` (W).
        time_per_epoch_s: Time per epoch at each limit, shape ``(n,)`` (s).
        average_power_W: Average GPU power at each limit, shape ``(n,)`` (W).
    """

    power_limit_W: np.ndarray
    time_per_epoch_s: np.ndarray
    average_power_W: np.ndarray
    idle_power_W: float | None = None
    """Idle power of the GPU (W) when the trace gives it (a user trace's ``idle_power`` column)."""

    @property
    def min_limit_W(self) -> float:
        """The lowest measured power limit (W)."""
        return float(self.power_limit_W[0])

    @property
    def max_limit_W(self) -> float:
        """The highest measured power limit (W)."""
        return float(self.power_limit_W[-1])


@dataclass(frozen=True)
class TrainPath:
    """One row of ``summary_train.csv``: when one run reached one target metric.

    Attributes:
        dataset, network, batch_size, optimizer: The configuration.
        learning_rate: Learning rate of the run.
        run: Run (seed) number; sampling a run gives one realistic training path.
        target_metric: The metric threshold of this row.
        target_epoch: Epoch at which validation reached ``target_metric``; None if never.
    """

    dataset: str
    network: str
    batch_size: int
    optimizer: str
    learning_rate: float
    run: int
    target_metric: float
    target_epoch: int | None


@dataclass(frozen=True, eq=False)
class GPUTrace:
    """Power-limit sweeps of one GPU model and the training paths that go with them.

    Attributes:
        gpu: The GPU model's name (``"V100"``, ``"RTX 6000"``, ...).
        curves: One read-only :class:`PowerCurve` per :class:`WorkloadKey`, in file order.
        train: Training paths (``summary_train.csv`` rows); empty when none were given.
        source: :data:`BUNDLED_SOURCE` for the package's traces, else the sweep file's path.
    """

    gpu: str
    curves: Mapping[WorkloadKey, PowerCurve]
    train: tuple[TrainPath, ...] = ()
    source: str = BUNDLED_SOURCE

    @property
    def bundled(self) -> bool:
        """True for the Zeus NSDI '23 traces shipped with the package."""
        return self.source == BUNDLED_SOURCE

    @property
    def label(self) -> str:
        """A short name of the source for device names: ``zeus_nsdi23`` or the file's name."""
        return self.source if self.bundled else Path(self.source).name


TraceLike = str | GPUTrace
"""A bundled GPU's name (``"V100"``, ``"A40"``) or a :class:`GPUTrace`."""
WorkloadLike = str | Workload
"""A workload's name (see :func:`get_workload`) or the :class:`Workload` itself."""


# -- lookup helpers ------------------------------------------------------------
def _model(x: Workload | WorkloadKey | TrainPath) -> tuple[str, str, str]:
    """``(dataset, network, optimizer)``: the training setup a sweep, a workload or a training path is of."""
    return x.dataset, x.network, x.optimizer


def normalize_gpu(gpu: str) -> GPUName:
    """Return the canonical name of a GPU model: ``"V100"``/``"A40"`` case-insensitively, else the name.

    Any model may be named (``"RTX 6000"``, ``"H100 SXM"``); runs of whitespace become one
    space. Whether a trace exists for it is :func:`resolve_trace`'s question.

    Raises:
        ValueError: ``gpu`` is empty.
    """
    name = " ".join(str(gpu).split())
    if not name:
        raise ValueError("the GPU name is empty")
    return name.upper() if name.upper() in GPUS else name


def resolve_trace(gpu: TraceLike) -> GPUTrace:
    """Return ``gpu`` itself when it is a :class:`GPUTrace`, else the bundled trace of that GPU.

    Raises:
        ValueError: No bundled trace for that GPU; the message lists the bundled ones and
            says how to give one's own (``virtual.trace``).
    """
    return gpu if isinstance(gpu, GPUTrace) else bundled_trace(gpu)


def _paper_workload(name: str) -> Workload:
    workload = WORKLOADS.get(str(name).strip().lower())
    if workload is None:
        raise ValueError(f"unknown workload {name!r}; valid workloads: {', '.join(WORKLOADS)}")
    return workload


def get_workload(name: WorkloadLike, trace: TraceLike | None = None) -> Workload:
    """Return a workload by name: a paper workload, or one of a user trace's sweeps.

    In a bundled trace (or with ``trace`` None) the name is a paper workload's dataset
    (case-insensitive). In a user trace it is a dataset of the file, or
    ``dataset/network/optimizer`` when the dataset has several sweeps; a paper workload
    keeps its target and epoch budget there, any other takes them from the trace's
    training paths (the highest target reached; ``nan`` and 1 epoch without paths) and
    its largest batch size as the default.

    Raises:
        ValueError: Unknown or ambiguous workload; the message lists the valid names.
    """
    if isinstance(name, Workload):
        return name
    if trace is None or resolve_trace(trace).bundled:
        return _paper_workload(name)
    gpu_trace = resolve_trace(trace)
    text = str(name).strip()
    parts = text.split("/")
    combos = list(dict.fromkeys(_model(k) for k in gpu_trace.curves))
    if len(parts) == 3:
        matches = [c for c in combos if c == tuple(parts)]
    else:
        matches = [c for c in combos if c[0].lower() == text.lower()]
    paper = WORKLOADS.get(text.lower())
    if paper is not None and _model(paper) in matches:
        return paper
    if len(matches) != 1:
        problem = "is ambiguous" if matches else "is not"
        raise ValueError(
            f"workload {name!r} {problem} in the trace {gpu_trace.source}; valid workloads: "
            f"{', '.join(available_workloads(gpu_trace))}"
        )
    return _user_workload(gpu_trace, matches[0])


def _user_workload(trace: GPUTrace, model: tuple[str, str, str]) -> Workload:
    paths = [p for p in trace.train if _model(p) == model]
    target = max((p.target_metric for p in paths), default=math.nan)
    epochs = [p.target_epoch for p in paths if p.target_metric == target and p.target_epoch is not None]
    sizes = [k.batch_size for k in trace.curves if _model(k) == model]
    return Workload(*model, target, max(epochs, default=1), max(sizes))


def available_workloads(gpu: TraceLike) -> list[str]:
    """Return the names of the workloads present in ``gpu``'s power trace (file order for a user trace).

    Raises:
        ValueError: No trace for that GPU.
    """
    trace = resolve_trace(gpu)
    present = list(dict.fromkeys(_model(k) for k in trace.curves))
    if trace.bundled:
        return [n for n, w in WORKLOADS.items() if _model(w) in present]
    per_dataset = Counter(dataset for dataset, _, _ in present)
    return [d if per_dataset[d] == 1 else f"{d}/{n}/{o}" for d, n, o in present]


def available_batch_sizes(gpu: TraceLike, workload: WorkloadLike) -> list[int]:
    """Return the batch sizes (increasing) of ``workload`` in ``gpu``'s power trace.

    Raises:
        ValueError: Unknown GPU or workload.
    """
    trace = resolve_trace(gpu)
    w = get_workload(workload, trace)
    return sorted(k.batch_size for k in trace.curves if _model(k) == _model(w))


def default_batch_size(gpu: TraceLike, workload: WorkloadLike) -> int:
    """Return the workload's default batch size on ``gpu``.

    The workload's default (a paper workload's, or a user sweep's largest), capped at
    the largest batch size present in that GPU's power trace (the largest present one
    not above the default).

    Raises:
        ValueError: Unknown GPU or workload, or no batch size of it in the trace.
    """
    trace = resolve_trace(gpu)
    w = get_workload(workload, trace)
    sizes = available_batch_sizes(trace, w)
    fitting = [b for b in sizes if b <= w.default_batch_size]
    if not fitting:
        raise ValueError(f"no batch size of {w.dataset} in the {trace.gpu} power trace")
    return fitting[-1]


def power_curve(gpu: TraceLike, workload: WorkloadLike, batch_size: int | None = None) -> PowerCurve:
    """Return the power-limit sweep of ``workload`` at ``batch_size`` on ``gpu``.

    Args:
        gpu: ``"V100"`` or ``"A40"`` (case-insensitive), or a :class:`GPUTrace`.
        workload: Workload name (its dataset, e.g. ``"imagenet"``) or :class:`Workload`.
        batch_size: Batch size; None picks :func:`default_batch_size`.

    Returns:
        The :class:`PowerCurve` (limits in W, time per epoch in s, power in W).

    Raises:
        ValueError: Unknown GPU, workload or batch size; the message lists valid ones.
    """
    trace = resolve_trace(gpu)
    w = get_workload(workload, trace)
    if batch_size is None:
        batch_size = default_batch_size(trace, w)
    curve = trace.curves.get(WorkloadKey(w.dataset, w.network, int(batch_size), w.optimizer))
    if curve is None:
        sizes = ", ".join(map(str, available_batch_sizes(trace, w)))
        raise ValueError(
            f"batch size {batch_size} of {w.dataset} is not in the {trace.gpu} power trace; valid batch sizes: {sizes}"
        )
    return curve


# -- interpolation (pure functions) --------------------------------------------
def _interp_clamped(curve: PowerCurve, values: np.ndarray, power_limit_W: float) -> float:
    if not math.isfinite(power_limit_W):
        raise ValueError(f"power limit must be finite, got {power_limit_W}")
    return float(np.interp(power_limit_W, curve.power_limit_W, values))


def time_per_epoch_s_at(curve: PowerCurve, power_limit_W: float) -> float:
    """Time per epoch (s) at ``power_limit_W``: linear between measured limits, clamped outside.

    Raises:
        ValueError: ``power_limit_W`` is not finite.
    """
    return _interp_clamped(curve, curve.time_per_epoch_s, power_limit_W)


def average_power_W_at(curve: PowerCurve, power_limit_W: float) -> float:
    """Average power (W) at ``power_limit_W``: linear between measured limits, clamped outside.

    Raises:
        ValueError: ``power_limit_W`` is not finite.
    """
    return _interp_clamped(curve, curve.average_power_W, power_limit_W)


def epoch_energy_J_at(curve: PowerCurve, power_limit_W: float) -> float:
    """Energy per epoch (J) = time per epoch × average power, both interpolated.

    Raises:
        ValueError: ``power_limit_W`` is not finite.
    """
    return time_per_epoch_s_at(curve, power_limit_W) * average_power_W_at(curve, power_limit_W)


# -- loading: bundled traces ---------------------------------------------------
def _read_rows(name: str) -> list[dict[str, str]]:
    path = files("zeus_callbacks").joinpath("data").joinpath("zeus_nsdi23").joinpath(name)
    return list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))


def _frozen(values: list[float]) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    array.flags.writeable = False
    return array


def _curves(grouped: dict[WorkloadKey, list[tuple[float, float, float]]], idle: dict) -> Mapping:
    curves = {}
    for key, points in grouped.items():
        points.sort()
        limits, times, powers = zip(*points, strict=True)
        curves[key] = PowerCurve(_frozen(list(limits)), _frozen(list(times)), _frozen(list(powers)), idle.get(key))
    return MappingProxyType(curves)


@functools.cache
def _bundled_trace(gpu: str) -> GPUTrace:
    grouped: dict[WorkloadKey, list[tuple[float, float, float]]] = {}
    for row in _read_rows(_POWER_FILES[gpu]):
        key = WorkloadKey(row["dataset"], row["network"], int(row["batch_size"]), row["optimizer"])
        point = (float(row["power_limit"]), float(row["time_per_epoch"]), float(row["average_power"]))
        grouped.setdefault(key, []).append(point)
    logger.debug("loaded %d power curves for %s", len(grouped), gpu)
    return GPUTrace(gpu, _curves(grouped, {}), load_train_trace())


def bundled_trace(gpu: str) -> GPUTrace:
    """Return the bundled trace of ``"V100"`` or ``"A40"`` (case-insensitive), with its training paths.

    Raises:
        ValueError: No bundled trace for that GPU; the message lists the bundled ones.
    """
    return _bundled_trace(known_bundled_gpu(gpu))


def known_bundled_gpu(gpu: str) -> str:
    """The bundled trace's name for ``gpu`` (case-insensitive), checked without reading a file.

    Raises:
        ValueError: No bundled trace for that GPU; the message lists the bundled ones.
    """
    name = normalize_gpu(gpu)
    if name not in _POWER_FILES:
        raise ValueError(
            f"unknown GPU {gpu!r}: the bundled Zeus traces cover {', '.join(GPUS)}; for another GPU give "
            "its own power-limit sweep (virtual.trace, or --trace; format in docs/backends.md)"
        )
    return name


def load_power_trace(gpu: TraceLike) -> dict[WorkloadKey, PowerCurve]:
    """Load a GPU's power-limit sweeps (Zeus NSDI '23, ``summary_power_{gpu}.csv``, or a user trace).

    Args:
        gpu: ``"V100"`` or ``"A40"`` (case-insensitive), or a :class:`GPUTrace`.

    Returns:
        A new dict from (dataset, network, batch_size, optimizer) to its
        :class:`PowerCurve`; the arrays are read-only and shared between calls.

    Raises:
        ValueError: Unknown GPU; the message lists the valid names.
    """
    return dict(resolve_trace(gpu).curves)


def _train_path(row: dict[str, str]) -> TrainPath:
    epoch = float(row["target_epoch"]) if row["target_epoch"].strip() else math.nan
    return TrainPath(
        dataset=row["dataset"],
        network=row["network"],
        batch_size=int(row["batch_size"]),
        optimizer=row["optimizer"],
        learning_rate=float(row["learning_rate"]),
        run=int(row["run"]),
        target_metric=float(row["target_metric"]),
        target_epoch=None if math.isnan(epoch) else int(epoch),
    )


@functools.lru_cache(maxsize=1)
def load_train_trace() -> tuple[TrainPath, ...]:
    """Load the training paths of the Zeus NSDI '23 traces (``summary_train.csv``).

    Returns:
        One :class:`TrainPath` per row, in file order; ``target_epoch`` is None where
        the run never reached ``target_metric`` (``nan`` in the file).
    """
    return tuple(_train_path(row) for row in _read_rows(_TRAIN_FILE))


# -- loading: user traces --------------------------------------------------------
def _read_csv(path: Path, required: tuple[str, ...], what: str) -> list[tuple[int, dict[str, str]]]:
    """Rows of a CSV with their line numbers, after checking its header names ``required``."""
    try:
        text = path.read_text(encoding="utf-8-sig")  # -sig: a spreadsheet's byte-order mark is no column name
    except FileNotFoundError:
        raise TraceFormatError(f"{what} not found: {path}") from None
    except OSError as exc:
        raise TraceFormatError(f"cannot read the {what} {path}: {exc.strerror}") from None
    except UnicodeError:
        raise TraceFormatError(f"{path} is not a text (UTF-8) CSV file") from None
    reader = csv.DictReader(io.StringIO(text))
    header = [name.strip() for name in reader.fieldnames or []]
    reader.fieldnames = header
    missing = [name for name in required if name not in header]
    if missing:
        raise TraceFormatError(
            f"{path}: no column {', '.join(map(repr, missing))}; a {what} needs the columns "
            f"{', '.join(required)} (see docs/backends.md)"
        )
    rows = [(reader.line_num, row) for row in reader if any((v or "").strip() for v in row.values())]
    if not rows:
        raise TraceFormatError(f"{path}: the {what} has no rows")
    return rows


def _number(path: Path, line: int, row: dict[str, str], column: str, *, positive: bool = True) -> float:
    raw = (row.get(column) or "").strip()
    try:
        value = float(raw)
    except ValueError:
        raise TraceFormatError(f"{path}, line {line}: column {column!r}: {raw!r} is not a number") from None
    if not math.isfinite(value) or (positive and value <= 0):
        raise TraceFormatError(f"{path}, line {line}: column {column!r}: {raw!r} must be a finite number > 0")
    return value


def _integer(path: Path, line: int, row: dict[str, str], column: str, *, positive: bool = True) -> int:
    value = _number(path, line, row, column, positive=positive)
    if value != int(value) or value < 0:
        raise TraceFormatError(
            f"{path}, line {line}: column {column!r}: {row[column]!r} is not a whole number{'' if positive else ' ≥ 0'}"
        )
    return int(value)


def _gpu_name(path: Path, rows: list[tuple[int, dict[str, str]]], gpu: str | None) -> str:
    if gpu is not None:
        return normalize_gpu(gpu)
    names = list(dict.fromkeys(" ".join((row.get("gpu") or "").split()) for _, row in rows))
    if "gpu" in rows[0][1] and any(names):
        if len(names) > 1:
            raise TraceFormatError(
                f"{path}: column 'gpu' names several GPUs ({', '.join(map(repr, names))}); one file holds one GPU model"
            )
        return normalize_gpu(names[0])
    return normalize_gpu(re.sub(r"^summary_power_", "", path.stem) or path.stem)


def read_train_trace(path: str | Path) -> tuple[TrainPath, ...]:
    """Read a training-path CSV in the Zeus ``summary_train.csv`` format.

    Args:
        path: The file; columns :data:`TRAIN_COLUMNS` (``target_epoch`` empty or ``nan``
            where the run never reached ``target_metric``).

    Returns:
        One :class:`TrainPath` per row, in file order.

    Raises:
        TraceFormatError: Missing or unreadable file, missing column, or a bad value; the
            message names the file, the line and the column.
    """
    path = Path(path)
    out = []
    for line, row in _read_csv(path, TRAIN_COLUMNS, "training-path trace"):
        _integer(path, line, row, "batch_size")
        _integer(path, line, row, "run", positive=False)
        for column in ("learning_rate", "target_metric"):
            _number(path, line, row, column, positive=False)
        epoch = (row["target_epoch"] or "").strip()
        if epoch and epoch.lower() != "nan":
            _integer(path, line, row, "target_epoch", positive=False)
        out.append(_train_path(row))
    return tuple(out)


def read_trace(path: str | Path, *, train_path: str | Path | None = None, gpu: str | None = None) -> GPUTrace:
    """Read a user's power-limit sweep (Zeus ``summary_power`` format) of any GPU.

    Columns (header row, any order, extra columns ignored): ``dataset``, ``network``,
    ``batch_size``, ``optimizer`` (the workload), ``power_limit`` (W), ``time_per_epoch``
    (s) and ``average_power`` (W); optional ``gpu`` (the model's name, one per file) and
    ``idle_power`` (W, one value per sweep). See ``docs/backends.md``.

    Args:
        path: The sweep CSV.
        train_path: An optional training-path CSV (:func:`read_train_trace`) for the simulator.
        gpu: The GPU model's name; default the ``gpu`` column, else the file name without
            ``summary_power_`` and its extension.

    Returns:
        The :class:`GPUTrace`; ``source`` is ``path``.

    Raises:
        TraceFormatError: Missing or unreadable file, missing column, a bad or repeated
            value; the message names the file (and the line and the column).
    """
    path = Path(path)
    rows = _read_csv(path, KEY_COLUMNS + POWER_COLUMNS, "power-limit trace")
    grouped: dict[WorkloadKey, list[tuple[float, float, float]]] = {}
    idle: dict[WorkloadKey, float] = {}
    for line, row in rows:
        key = WorkloadKey(
            row["dataset"].strip(), row["network"].strip(), _integer(path, line, row, "batch_size"),
            row["optimizer"].strip(),
        )  # fmt: skip
        for column in ("dataset", "network", "optimizer"):
            if not row[column].strip() or (column == "dataset" and "/" in row[column]):
                raise TraceFormatError(f"{path}, line {line}: column {column!r}: {row[column]!r} is not a name")
        point = tuple(_number(path, line, row, column) for column in POWER_COLUMNS)
        points = grouped.setdefault(key, [])
        if any(p[0] == point[0] for p in points):
            raise TraceFormatError(
                f"{path}, line {line}: column 'power_limit': {point[0]:g} W appears twice for {'/'.join(map(str, key))}"
            )
        points.append(point)  # type: ignore[arg-type]
        if (row.get("idle_power") or "").strip():
            value = _number(path, line, row, "idle_power")
            if idle.setdefault(key, value) != value:
                raise TraceFormatError(
                    f"{path}, line {line}: column 'idle_power': {value:g} W differs from {idle[key]:g} W given "
                    f"earlier for {'/'.join(map(str, key))}; give one idle power per sweep"
                )
    train = read_train_trace(train_path) if train_path is not None else ()
    trace = GPUTrace(_gpu_name(path, rows, gpu), _curves(grouped, idle), train, str(path))
    logger.debug("read %d power curves of %s from %s", len(grouped), trace.gpu, path)
    return trace


def with_gpu_name(trace: GPUTrace, gpu: str | None) -> GPUTrace:
    """``trace`` under another GPU name (None: unchanged)."""
    return trace if gpu is None else replace(trace, gpu=normalize_gpu(gpu))
