"""fi-convert's cache folder (`${FI_CONVERT_CACHE:-~/.cache/fi-convert}`): what a load or a
proof found once, kept so that a restart does not find it again. An entry is written whole or
not at all, and a cache that cannot be written is skipped: it only saves time."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

CACHE_ENV = "FI_CONVERT_CACHE"


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "fi-convert")


def write_atomic(path: Path, data: bytes) -> bool:
    """`data` into `path` under a name of this process's, then renamed into place (a reader
    never sees half an entry; two processes writing the same one leave one whole); False where
    the cache cannot be written."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        return False
    return True
