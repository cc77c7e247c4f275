"""Looking at a path the user gave, when this user may not reach it.

`Path.exists()` raises PermissionError for a path under a folder this user may not search
(root reads everything; `nobody` does not): these say so in one line instead, naming the
folder in the way.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from .errors import FiConvertError, OutputError, SourceError

MODEL_FIX = "run as a user who may read the model folder, or change its permissions"
OUT_FIX = "choose an out-dir this user may write, or change its permissions"
OUTPUT_FIX = "run as a user who may read the output, or change its permissions"
# what `Path.exists()` takes for "not there"
_ABSENT = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EBADF)


def exists(path: Path, error: type[FiConvertError], fix: str) -> bool:
    """Whether `path` exists; `error` (with `fix`) where this user may not tell."""
    try:
        os.stat(path)
    except OSError as e:
        if e.errno in _ABSENT:
            return False
        raise error(denied(path, e, fix)) from None
    return True


def model_exists(path: Path) -> bool:
    return exists(path, SourceError, MODEL_FIX)


def out_exists(path: Path) -> bool:
    return exists(path, OutputError, OUT_FIX)


def denied(path: Path, e: OSError, fix: str) -> str:
    """`path: Permission denied (this user may not search /a/b); fix`."""
    blocked = unsearchable(path)
    why = f" (this user may not search {blocked})" if blocked else ""
    return f"{path}: {e.strerror}{why}; {fix}"


def unsearchable(path: Path) -> Path | None:
    """The first folder on the way to `path` that this user may not search (enter)."""
    for folder in reversed(path.absolute().parents):
        if not os.access(folder, os.X_OK):
            return folder
    return None


def model_error(e: OSError, where: str | Path) -> SourceError:
    """A model folder (or a file in it) that cannot be read, as one line."""
    path = Path(e.filename or where)
    if e.errno in (errno.EACCES, errno.EPERM):
        return SourceError(denied(path, e, MODEL_FIX))
    return SourceError(f"{path}: cannot read ({e.strerror}); check the model folder")
