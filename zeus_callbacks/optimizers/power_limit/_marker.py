"""The restore marker: the original power limits, written before the first change, read back after a crash.

A marker names each GPU by UUID (and index, for GPUs without one: the virtual GPU) and its owner
(PID, start time, boot id, host). Nobody restores or deletes a marker whose owner is alive; a
restore puts back the GPUs it sees, by UUID, and keeps the marker (rewritten to hold the rest)
until every GPU in it is back. See docs/reliability.md#the-restore-protocol.
"""

from __future__ import annotations

import json
import logging
import math
import re
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, NamedTuple

from zeus_callbacks._atomic_io import read_owned_text, write_json_atomic
from zeus_callbacks._distributed import launcher_env_int, launcher_world_size
from zeus_callbacks.errors import NotAMarker, UnsafeFile
from zeus_callbacks.optimizers.power_limit._actuator import ActuatorError, PowerLimitActuator
from zeus_callbacks.optimizers.power_limit._gpu_lock import GpuLock
from zeus_callbacks.optimizers.power_limit._owner import Owner

logger = logging.getLogger(__name__)


MARKER_NAME = "power_limit_restore.json"
"""Default restore-marker file name, under ``logging.log_dir``."""

MARKER_VERSION = 2
"""Version 2 adds GPU UUIDs and the owner's host, boot id and start time; version-1 markers still read."""


@dataclass(frozen=True)
class MarkerGpu:
    """One GPU of a marker.

    Attributes:
        index: The writer's device index (after its ``CUDA_VISIBLE_DEVICES``).
        uuid: The GPU's UUID, or None (a virtual GPU, a version-1 marker): then the index is used.
        original_limit_W: The limit to put back (W).
        name: The device's model name, for messages.
    """

    index: int
    uuid: str | None
    original_limit_W: float
    name: str | None = None


def write_marker(
    path: str | Path, backend: PowerLimitActuator, original_W: dict[int, float], *, owner: Owner | None = None
) -> None:
    """Write the restore marker (atomic, following no link): each GPU's index, UUID, name and original limit (W).

    Args:
        path: The marker file.
        backend: The backend the limits belong to.
        original_W: Device index → original limit (W).
        owner: The owning process; default this one.

    Raises:
        OSError: It cannot be written.
    """
    owner = owner or Owner.this_process()
    gpus = [
        {"index": i, "uuid": backend.device_uuid(i), "name": backend.device_name(i), "original_limit_W": limit}
        for i, limit in original_W.items()
    ]
    _write(Path(path), backend.name, owner, gpus)


def _write(path: Path, backend_name: str, owner: Owner, gpus: list[dict]) -> None:
    write_json_atomic(
        path,
        {"version": MARKER_VERSION, "pid": owner.pid, "owner": owner.as_json(), "backend": backend_name,
         "time": time.time(), "gpus": gpus},
    )  # fmt: skip


def host_label() -> str:
    """This host's name as marker file names carry it: ``socket.gethostname()``, ``[^A-Za-z0-9._-]`` → ``_``."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "unknown-host"


def _local_rank() -> int | None:
    """This process's local rank under a multi-process launcher (``WORLD_SIZE`` > 1), else None."""
    local_rank = launcher_env_int("LOCAL_RANK", -1)  # -1: not set
    return local_rank if local_rank >= 0 and launcher_world_size() > 1 else None


def marker_path(log_dir: str | Path, configured: str | Path | None = None) -> Path:
    """The restore-marker file of this process: ``configured`` or ``<log_dir>/power_limit_restore.json``.

    Under a multi-process launcher (``WORLD_SIZE`` > 1) each process gets its own file, named by host
    and local rank (``power_limit_restore.<host>.rank<LOCAL_RANK>.json``): local ranks repeat on
    every node, and nodes may share the log directory.
    """
    path = Path(configured) if configured else Path(log_dir) / MARKER_NAME
    local_rank = _local_rank()
    if local_rank is not None:
        path = path.with_name(f"{path.stem}.{host_label()}.rank{local_rank}{path.suffix}")
    return path


def marker_paths(log_dir: str | Path, configured: str | Path | None = None) -> list[Path]:
    """Where a run looks for the marker an earlier run in its place left.

    :func:`marker_path`, then, under a launcher, the name earlier versions gave a rank's
    marker (``power_limit_restore.rank<LOCAL_RANK>.json``, no host).

    An old-named marker may be another node's: :func:`restore_from_marker` matches its GPUs by
    UUID, and refuses one of another host that names GPUs without UUIDs.
    """
    path = marker_path(log_dir, configured)
    local_rank = _local_rank()
    if local_rank is None:
        return [path]
    base = Path(configured) if configured else Path(log_dir) / MARKER_NAME
    return [path, base.with_name(f"{base.stem}.rank{local_rank}{base.suffix}")]


def rank_marker_globs(base: Path) -> list[str]:
    """Glob patterns, in ``base``'s directory, of every rank's marker beside ``base`` (both names)."""
    return [f"{base.stem}.*.rank*{base.suffix}", f"{base.stem}.rank*{base.suffix}"]


class RestoreMarker(NamedTuple):
    """What a restore marker records.

    Attributes:
        limits_W: GPU index → original power limit (W), as the writer numbered its GPUs.
        pid: The process that wrote it, if recorded.
        gpus: Every GPU entry, with its UUID where recorded.
        owner: The writer (PID, host, boot id, start time; fields None in version-1 markers).
        backend: The writer's backend name, if recorded.
    """

    limits_W: dict[int, float]
    pid: int | None
    gpus: tuple[MarkerGpu, ...] = ()
    owner: Owner = Owner(None)
    backend: str | None = None


def read_marker(path: str | Path) -> RestoreMarker | None:
    """The limits a restore marker records, without touching the file.

    A marker is what :func:`write_marker` writes: a JSON object with a non-empty ``gpus``
    list of ``{"index": int ≥ 0, "uuid": str | null, "original_limit_W": number > 0}``
    (version 1 had no ``uuid``).

    Args:
        path: The marker file.

    Returns:
        The marker, or None when there is no file.

    Raises:
        NotAMarker: The path is a directory, unreadable, not JSON, or JSON of another shape
            (a torn marker included): nobody can tell what limit it held, so it is kept.
        UnsafeFile: The path is a symbolic link or another user's file: it is neither read nor
            acted on (another user could otherwise set this user's GPU limits).
    """
    path = Path(path)
    try:
        data = json.loads(read_owned_text(path))
    except FileNotFoundError:
        return None
    except UnsafeFile:
        raise
    except IsADirectoryError:
        raise NotAMarker(f"{path} is a directory, not a power-limit restore marker") from None
    except (OSError, ValueError) as exc:
        raise NotAMarker(f"{path} is not a power-limit restore marker (not readable JSON: {exc})") from exc
    gpus = data.get("gpus") if isinstance(data, dict) else None
    if not isinstance(gpus, list) or not gpus:
        raise NotAMarker(f'{path} is not a power-limit restore marker (no "gpus" list)')
    entries: list[MarkerGpu] = []
    for gpu in gpus:
        get = gpu.get if isinstance(gpu, dict) else (lambda _key: None)
        index, limit, uuid, name = get("index"), get("original_limit_W"), get("uuid"), get("name")
        if (
            isinstance(index, bool) or not isinstance(index, int) or index < 0
            or isinstance(limit, bool) or not isinstance(limit, (int, float)) or not math.isfinite(limit) or limit <= 0
            or not (uuid is None or isinstance(uuid, str))
        ):  # fmt: skip
            raise NotAMarker(
                f"{path} is not a valid power-limit restore marker (GPU entry {str(gpu)[:200]}: need an index ≥ 0, "
                "an original_limit_W > 0 and a uuid string or null)"
            )
        entries.append(MarkerGpu(index, uuid, float(limit), name if isinstance(name, str) else None))
    owner = Owner.from_json(data.get("owner")) if "owner" in data else Owner.from_json({"pid": data.get("pid")})
    backend = data.get("backend")
    return RestoreMarker(
        {g.index: g.original_limit_W for g in entries}, owner.pid, tuple(entries), owner,
        backend if isinstance(backend, str) else None,
    )  # fmt: skip


GpuAction = Literal["restored", "already", "clamped", "not_visible", "in_use", "failed"]
BACK: frozenset[str] = frozenset({"restored", "already", "clamped"})
"""Actions after which the GPU is back (at its original limit, or the nearest one it accepts)."""


@dataclass(frozen=True)
class GpuRestore:
    """What a restore did to one GPU of a marker.

    Attributes:
        gpu: The marker's entry.
        local_index: This process's index of that GPU, or None when it does not see it.
        action: ``restored`` (set to ``limit_W``), ``already`` (it was at it), ``clamped`` (the
            original is outside the device's range; set to the nearest end), ``not_visible``,
            ``in_use`` (a live run holds the GPU's profiling lock), ``failed`` (the backend refused).
        limit_W: The limit the GPU is at now (W) for the three "back" actions, else None.
        detail: Why, for the last three actions and for ``clamped``.
    """

    gpu: MarkerGpu
    local_index: int | None
    action: GpuAction
    limit_W: float | None = None
    detail: str = ""

    @property
    def back(self) -> bool:
        """True when the GPU is at its original limit (or the nearest one it accepts)."""
        return self.action in BACK

    def describe(self) -> str:
        """One line for people: ``GPU 0 (GPU-…): restored to 250 W``."""
        who = f"GPU {self.gpu.index}" + (f" ({self.gpu.uuid})" if self.gpu.uuid else "")
        if self.action == "restored":
            return f"{who}: power limit restored to {self.limit_W:.0f} W"
        if self.action == "already":
            return f"{who}: already at its original {self.limit_W:.0f} W"
        if self.action == "clamped":
            return f"{who}: {self.detail}; set to {self.limit_W:.0f} W"
        return f"{who}: not restored ({self.action.replace('_', ' ')}: {self.detail}); kept in the marker"


@dataclass(frozen=True)
class RestoreOutcome:
    """What :func:`restore_from_marker` did with one marker.

    Attributes:
        path: The marker file.
        owner: Its owner.
        refused: Why nothing was done (the owner is alive), or None.
        gpus: Per GPU, what was done (empty when refused).
        removed: True when the marker was deleted (every GPU in it is back).
    """

    path: Path
    owner: Owner
    refused: str | None = None
    gpus: list[GpuRestore] = field(default_factory=list)
    removed: bool = False

    @property
    def restored_W(self) -> dict[int, float]:
        """The marker's GPU index → the limit it is back at (W), for the GPUs that are back."""
        return {r.gpu.index: r.limit_W for r in self.gpus if r.back and r.limit_W is not None}

    @property
    def complete(self) -> bool:
        """True when nothing was refused and every GPU is back."""
        return self.refused is None and all(r.back for r in self.gpus)


def _local_index(gpu: MarkerGpu, uuids: dict[int, str | None]) -> int | None:
    if gpu.uuid is not None:
        return next((i for i, u in uuids.items() if u == gpu.uuid), None)
    # No UUID (virtual GPU, version-1 marker): the writer's index, if this process has it and
    # that GPU has no UUID either (a UUID-less entry must never land on a real, identified GPU
    # that another marker entry may name).
    return gpu.index if gpu.index in uuids and uuids[gpu.index] is None else None


def _restore_one(
    backend: PowerLimitActuator, gpu: MarkerGpu, index: int | None, owner: Owner, force: bool
) -> GpuRestore:
    if index is None:
        return GpuRestore(gpu, None, "not_visible", detail="this process does not see this GPU")
    lock = None
    if gpu.uuid is not None:
        try:
            lock = GpuLock(gpu.uuid)
            if not lock.try_acquire():
                lock = None
                if not force:
                    return GpuRestore(gpu, index, "in_use", detail="a live run holds this GPU's profiling lock")
        except OSError as exc:  # UnsafeFile included: without the lock nobody can tell who else changes it
            lock = None
            if not force:
                return GpuRestore(gpu, index, "in_use", detail=f"cannot take this GPU's profiling lock ({exc})")
    try:
        low, high = backend.power_limit_constraints_W(index)
        target = min(max(gpu.original_limit_W, low), high)
        action: GpuAction = "restored"
        detail = ""
        if target != gpu.original_limit_W:
            action = "clamped"
            detail = (f"the marker's {gpu.original_limit_W:.0f} W is outside the device's range "
                      f"[{low:.0f}, {high:.0f}] W")  # fmt: skip
            logger.warning("zeus-callbacks: GPU %d: %s; setting %.0f W", index, detail, target)
        if backend.power_limit_W(index) == target:
            action = "already" if action == "restored" else action
        else:
            backend.set_power_limit_W(index, target)
        if lock is not None:
            record = lock.read_record()
            if record is not None and record[1].same_process(owner):
                lock.clear_record()
        return GpuRestore(gpu, index, action, target, detail)
    except ActuatorError as exc:
        return GpuRestore(gpu, index, "failed", detail=str(exc))
    finally:
        if lock is not None:
            lock.release()


def restore_from_marker(path: str | Path, backend: PowerLimitActuator, *, force: bool = False) -> RestoreOutcome | None:
    """Put back the limits a run left changed (SIGKILL, power loss); delete the marker once every GPU is back.

    The protocol (docs/reliability.md#the-restore-protocol): a marker whose owner is alive is not
    touched (unless ``force``); each GPU is found by UUID among the GPUs this process sees (by
    index for GPUs without one); a GPU whose profiling lock a live run holds is left to that run;
    a limit outside the device's range is clamped with a warning; the marker is deleted only when
    every GPU in it is back, and otherwise rewritten to hold the GPUs still to restore.

    Args:
        path: The marker file (``<log_dir>/power_limit_restore.json`` by default).
        backend: An open backend.
        force: Restore even if the owner looks alive and holds the GPUs' profiling locks
            (``zeus-callbacks restore --force``); that owner puts the same limits back when it ends.

    Returns:
        What was done, per GPU; None when there is no marker.

    Raises:
        NotAMarker: The file is not a marker (or a torn one); it is kept byte for byte.
        UnsafeFile: The file is a link or another user's; it is not read or acted on.
        OSError: The marker could not be deleted or rewritten after the restore.
        BackendError: The marker holds real GPUs' limits but ``backend`` is the virtual GPU (no
            driver found here): restoring "onto" it would claim a restore that never happened.
    """
    path = Path(path)
    marker = read_marker(path)
    if marker is None:
        return None
    if backend.simulated and marker.backend not in (None, backend.name):
        vendor = {"nvml": "NVIDIA (NVML)", "amdsmi": "AMD (amdsmi)"}.get(marker.backend, marker.backend)
        raise ActuatorError(
            f"{path} holds the original limits of {vendor} GPUs, but no {vendor} driver is reachable here "
            "(only the virtual GPU); run `zeus-callbacks restore` on the machine with those GPUs"
        )
    host = marker.owner.host
    refused: str | None = None
    if not force and marker.owner.is_alive():
        refused = f"its owner ({marker.owner.describe()}) is alive: it restores its own limits when it ends"
    elif not force and host not in (None, socket.gethostname()) and any(g.uuid is None for g in marker.gpus):
        # GPUs without a UUID are matched by index: another host's GPU 0 is not ours.
        refused = f"it was written on host {host} for GPUs without a UUID: only that host can restore it"
    if refused is not None:
        reason = f"{refused}; `zeus-callbacks restore --force` overrides"
        logger.warning("zeus-callbacks: not restoring the power limits in %s: %s", path, reason)
        return RestoreOutcome(path, marker.owner, refused=reason)
    uuids = {i: backend.device_uuid(i) for i in range(backend.device_count())}
    results = [_restore_one(backend, gpu, _local_index(gpu, uuids), marker.owner, force) for gpu in marker.gpus]
    left = [r.gpu for r in results if not r.back]
    if not left:
        path.unlink(missing_ok=True)
    elif len(left) < len(results):  # nothing back: the file stays as it was (it may be another node's)
        _write(path, marker.backend or backend.name, marker.owner, [asdict(g) for g in left])
    outcome = RestoreOutcome(path, marker.owner, gpus=results, removed=not left)
    for r in results:
        (logger.warning if r.back else logger.error)(
            "zeus-callbacks: restore marker %s (left by %s): %s", path, marker.owner.describe(), r.describe()
        )
    return outcome
