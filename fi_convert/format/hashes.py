"""SHA-256 of files, hashed from the page cache through `mmap` (no copy into this process)."""

from __future__ import annotations

import hashlib
import mmap
import os
from pathlib import Path
from typing import Any


def hash_mapped(h: Any, fd: int, offset: int, nbytes: int) -> None:
    """Add bytes [offset, offset + nbytes) of `fd` to the hash `h`, from the page cache
    through `mmap` (no copy into this process)."""
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
    with mmap.mmap(
        fd, offset + nbytes - start, flags=flags, prot=mmap.PROT_READ, offset=start
    ) as m:
        view = memoryview(m)
        try:
            h.update(view[offset - start :])
        finally:
            view.release()


def sha256_file(path: Path, window: int = 1 << 28) -> str:
    """SHA-256 of a file, hashed from the page cache a window at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        for offset in range(0, size, window):
            hash_mapped(h, f.fileno(), offset, min(window, size - offset))
    return h.hexdigest()
