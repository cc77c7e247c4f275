"""A rank's whole read of an output into a server's model, in the order that keeps the disk
busy: the experts' byte ranges start reading at once (where they go needs no asking); while
they are read, the model is asked where its other tensors' bytes go (`dense.DenseLoad`, pure
Python: at tensor parallelism a few milliseconds per hundred tensors), and those ranges join the
same read; once every byte is in place, the model's `load_weights` runs over the other tensors.
A fault or an interrupt anywhere stops the readers and frees their memory, then goes on."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from ..bulk_read import BulkRead, ReadStats
from .dense import DenseLoad


@dataclass
class WholeRead:
    moe_bytes: int  # the experts' bytes of the read
    stats: ReadStats  # the read's (experts and the directly read other bytes)
    dense: DenseLoad
    read_started: float  # perf_counter() as the read started, and as it ended
    read_ended: float


def read_whole(
    bulk: BulkRead,
    add_experts: Callable[[BulkRead], None],
    dense_load: Callable[[], DenseLoad],
) -> WholeRead:
    """`add_experts` puts the experts' requests into `bulk` (not started); `dense_load` asks
    the model where its other tensors go (run while the experts are read)."""
    dense: DenseLoad | None = None
    try:
        add_experts(bulk)
        moe_bytes = bulk.nbytes
        t1 = time.perf_counter()
        bulk.start(more=True)
        dense = dense_load()
        dense.add_to(bulk)
        bulk.more()
        dense.prefetch()
        stats = bulk.wait()
        t2 = time.perf_counter()
        dense.finish()
    except BaseException:
        bulk.abort()
        if dense is not None:
            dense.abort()
        raise
    return WholeRead(moe_bytes, stats, dense, t1, t2)
