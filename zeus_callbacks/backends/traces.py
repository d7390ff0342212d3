"""The public Zeus (NSDI '23) traces: power-limit sweeps and training paths.

Source: J. You, J.-W. Chung, M. Chowdhury, "Zeus: Understanding and Optimizing GPU
Energy Consumption of DNN Training", USENIX NSDI 2023; data files from the public
repository ml-energy/zeus (Apache-2.0), shipped in ``zeus_callbacks/data/zeus_nsdi23/``
(see ``zeus_callbacks/data/README.md``).

- ``summary_power_{v100,a40}.csv``: one row per (dataset, network, batch size,
  optimizer, power limit) with the measured time per epoch (s) and average power (W).
- ``summary_train.csv``: one row per (configuration, learning rate, run, target metric)
  with the epoch at which validation reached the target (``nan`` when it never did).

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
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.resources import files
from types import MappingProxyType
from typing import Literal, NamedTuple

import numpy as np

logger = logging.getLogger(__name__)

GPUName = Literal["V100", "A40"]
GPUS: tuple[GPUName, ...] = ("V100", "A40")
_POWER_FILES: Mapping[str, str] = MappingProxyType(
    {"V100": "summary_power_v100.csv", "A40": "summary_power_a40.csv"}
)
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


# -- lookup helpers ------------------------------------------------------------
def normalize_gpu(gpu: str) -> GPUName:
    """Return the canonical GPU name (``"V100"`` or ``"A40"``), case-insensitively.

    Raises:
        ValueError: ``gpu`` is not a traced GPU; the message lists the valid names.

    """
    for name in GPUS:
        if str(gpu).strip().upper() == name:
            return name
    raise ValueError(f"unknown GPU {gpu!r}; the Zeus traces cover {', '.join(GPUS)}")


def get_workload(name: str) -> Workload:
    """Return the paper workload named by its dataset (case-insensitive).

    Raises:
        ValueError: Unknown workload; the message lists the valid names.

    """
    workload = WORKLOADS.get(str(name).strip().lower())
    if workload is None:
        raise ValueError(f"unknown workload {name!r}; valid workloads: {', '.join(WORKLOADS)}")
    return workload


def available_workloads(gpu: str) -> list[str]:
    """Return the names of the paper workloads present in ``gpu``'s power trace.

    Raises:
        ValueError: Unknown GPU.

    """
    trace = load_power_trace(gpu)
    present = {(k.dataset, k.network, k.optimizer) for k in trace}
    return [n for n, w in WORKLOADS.items() if (w.dataset, w.network, w.optimizer) in present]


def available_batch_sizes(gpu: str, workload: str) -> list[int]:
    """Return the batch sizes (increasing) of ``workload`` in ``gpu``'s power trace.

    Raises:
        ValueError: Unknown GPU or workload.

    """
    w = get_workload(workload)
    return sorted(
        k.batch_size
        for k in load_power_trace(gpu)
        if (k.dataset, k.network, k.optimizer) == (w.dataset, w.network, w.optimizer)
    )


def default_batch_size(gpu: str, workload: str) -> int:
    """Return the workload's default batch size on ``gpu``.

    The paper default, capped at the largest batch size present in that GPU's power
    trace (the largest present one not above the default).

    Raises:
        ValueError: Unknown GPU or workload, or no batch size of it in the trace.

    """
    w = get_workload(workload)
    sizes = available_batch_sizes(gpu, workload)
    fitting = [b for b in sizes if b <= w.default_batch_size]
    if not fitting:
        raise ValueError(f"no batch size of {w.dataset} in the {normalize_gpu(gpu)} power trace")
    return fitting[-1]


def power_curve(gpu: str, workload: str, batch_size: int | None = None) -> PowerCurve:
    """Return the power-limit sweep of ``workload`` at ``batch_size`` on ``gpu``.

    Args:
        gpu: ``"V100"`` or ``"A40"`` (case-insensitive).
        workload: Workload name (its dataset, e.g. ``"imagenet"``).
        batch_size: Batch size; None picks :func:`default_batch_size`.

    Returns:
        The :class:`PowerCurve` (limits in W, time per epoch in s, power in W).

    Raises:
        ValueError: Unknown GPU, workload or batch size; the message lists valid ones.

    """
    w = get_workload(workload)
    if batch_size is None:
        batch_size = default_batch_size(gpu, workload)
    curve = load_power_trace(gpu).get(WorkloadKey(w.dataset, w.network, int(batch_size), w.optimizer))
    if curve is None:
        sizes = ", ".join(map(str, available_batch_sizes(gpu, workload)))
        raise ValueError(
            f"batch size {batch_size} of {w.dataset} is not in the {normalize_gpu(gpu)} power trace; "
            f"valid batch sizes: {sizes}"
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


# -- loading -------------------------------------------------------------------
def _read_rows(name: str) -> list[dict[str, str]]:
    path = files("zeus_callbacks").joinpath("data").joinpath("zeus_nsdi23").joinpath(name)
    return list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))


def _frozen(values: list[float]) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    array.flags.writeable = False
    return array


@functools.cache
def _load_power_trace(gpu: GPUName) -> Mapping[WorkloadKey, PowerCurve]:
    grouped: dict[WorkloadKey, list[tuple[float, float, float]]] = {}
    for row in _read_rows(_POWER_FILES[gpu]):
        key = WorkloadKey(row["dataset"], row["network"], int(row["batch_size"]), row["optimizer"])
        point = (float(row["power_limit"]), float(row["time_per_epoch"]), float(row["average_power"]))
        grouped.setdefault(key, []).append(point)
    curves = {}
    for key, points in grouped.items():
        points.sort()
        limits, times, powers = zip(*points, strict=True)
        curves[key] = PowerCurve(_frozen(list(limits)), _frozen(list(times)), _frozen(list(powers)))
    logger.debug("loaded %d power curves for %s", len(curves), gpu)
    return MappingProxyType(curves)


def load_power_trace(gpu: str) -> dict[WorkloadKey, PowerCurve]:
    """Load a GPU's power-limit sweeps (Zeus NSDI '23, ``summary_power_{gpu}.csv``).

    Args:
        gpu: ``"V100"`` or ``"A40"`` (case-insensitive).

    Returns:
        A new dict from (dataset, network, batch_size, optimizer) to its
        :class:`PowerCurve`; the arrays are read-only and shared between calls.

    Raises:
        ValueError: Unknown GPU; the message lists the valid names.

    """
    return dict(_load_power_trace(normalize_gpu(gpu)))


@functools.lru_cache(maxsize=1)
def load_train_trace() -> tuple[TrainPath, ...]:
    """Load the training paths of the Zeus NSDI '23 traces (``summary_train.csv``).

    Returns:
        One :class:`TrainPath` per row, in file order; ``target_epoch`` is None where
        the run never reached ``target_metric`` (``nan`` in the file).

    """
    paths = []
    for row in _read_rows(_TRAIN_FILE):
        epoch = float(row["target_epoch"])
        paths.append(
            TrainPath(
                dataset=row["dataset"],
                network=row["network"],
                batch_size=int(row["batch_size"]),
                optimizer=row["optimizer"],
                learning_rate=float(row["learning_rate"]),
                run=int(row["run"]),
                target_metric=float(row["target_metric"]),
                target_epoch=None if math.isnan(epoch) else int(epoch),
            )
        )
    return tuple(paths)
