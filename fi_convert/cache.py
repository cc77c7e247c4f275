"""fi-convert's cache folder (`${FI_CONVERT_CACHE:-~/.cache/fi-convert}`): what a load or a
proof found once, kept so that a restart does not find it again. An entry is written whole or
not at all, and a cache that cannot be written is skipped: it only saves time."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

CACHE_ENV = "FI_CONVERT_CACHE"


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "fi-convert")


def write_atomic(path: Path, data: bytes) -> bool:
    """`data` into `path` under a temporary name of its own, then renamed into place (a reader
    never sees half an entry; two writers of the same one, processes or threads, leave one
    whole); False where the cache cannot be written."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException as e:  # (Ctrl-C too: no temporary file is left behind)
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if isinstance(e, OSError):
            return False
        raise
    return True
