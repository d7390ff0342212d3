"""Files in shared directories: atomic writes that follow no link, reads that trust only our own files.

A log directory may be shared with other users (a group project directory, ``/tmp``). Every file
this package writes there goes through :func:`atomic_output`: a temp file created next to the
target with ``O_CREAT | O_EXCL | O_NOFOLLOW`` (``tempfile.mkstemp``), so a link planted at any
name is never followed; permissions ``0o666`` less the process's umask, like any ``open()``; then
``os.replace``, which replaces a link at the target instead of writing through it. Every file it
reads back to act on (restore marker, profile cache, JSON store) goes through
:func:`read_owned_text`, which opens with ``O_NOFOLLOW`` and refuses a file owned by another
user. See docs/shared-clusters.md#files-in-shared-directories.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from zeus_callbacks.errors import UnsafeFile


def current_umask() -> int:
    """The process's umask (``/proc/self/status`` where the kernel shows it, else set-and-restore)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # not thread-safe, hence only the fallback
    os.umask(mask)
    return mask


def file_mode() -> int:
    """Permission bits of a new file: ``0o666`` less the umask (what ``open(path, "w")`` gives)."""
    return 0o666 & ~current_umask()


@contextlib.contextmanager
def atomic_output(path: str | Path, mode: str = "w") -> Iterator[IO[Any]]:
    """Yield a file (``mode`` ``"w"``: UTF-8 text, or ``"wb"``) whose contents replace ``path`` when the block ends.

    The temp file lies in ``path``'s directory (created if missing) so that the rename is atomic; it is
    ``fsync``-ed before. On any exception it is removed and ``path`` is unchanged.

    Raises:
        OSError: The directory or file cannot be written (the old file, if any, is unchanged).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:  # name the file asked for, not the random temp name a user never chose
        raise type(exc)(exc.errno, exc.strerror, str(path)) from exc
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` atomically (see :func:`atomic_output`).

    Raises:
        OSError: The directory or file cannot be written (the old file, if any, is unchanged).
        TypeError: ``data`` is not JSON-serialisable (the old file is unchanged).
    """
    with atomic_output(path) as fh:
        json.dump(data, fh, indent=1)


def ownership_problem(path: str | Path) -> str | None:
    """Why ``path`` must not be trusted, or None (also None when it does not exist).

    A file is trusted when it is not a symbolic link and is owned by this process's effective
    user. Root trusts only its own files too: a root-owned restore marker cannot be planted by
    another user, but one of theirs could set root's GPU limits.
    """
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):  # nothing there (a parent is a file): the opener says why
        return None
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link"
    if st.st_uid != os.geteuid():
        return f"{path} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    return None


def read_owned_text(path: str | Path) -> str:
    """The text of ``path``, opened without following a link and only when this user owns it.

    Raises:
        FileNotFoundError: No such file.
        UnsafeFile: ``path`` is a symbolic link or another user's file (nothing was read).
        OSError: Any other read failure (a directory: ``IsADirectoryError``).
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        if os.path.islink(path):
            raise UnsafeFile(f"{path} is a symbolic link; it is not followed") from exc
        raise
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(f"{path} is a directory")
        if st.st_uid != os.geteuid():
            raise UnsafeFile(f"{path} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()}); ignored")
        return fh.read().decode("utf-8")
