"""A rank's whole read of an output into a server's model: the model is asked where its
non-expert tensors' bytes go (`dense.DenseLoad`), those ranges and the experts' are read in one
bulk read, and the model's `load_weights` runs over the non-expert tensors once every byte is
in place. A fault or an interrupt anywhere stops the readers and frees their memory, then goes
on.

The asking comes first, and the reader threads start with every request (`ORDER`), measured on
an H100 against the other orders (docs/speed.md, the sixth session): with the asking under the
experts' read, the asking, pure Python, ran slower beside 16 reader threads each taking the
interpreter's lock between its chunks (0.05-0.06 s instead of 0.01 s once, 20-41 ms instead of
3-6 with the lean loop); with the threads started ahead of the asking, the read's threads all
began within 0.6 ms (not 5-9), but starting them cost as much before the read."""

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


# The order of a load, a setting for the benches (`--alt-bulk
# set:fi_convert.format.whole_read:ORDER='ask-under-read'`): "ask-first" (the model asked, then
# the threads started with every request), "threads-ahead" (the reader threads started, the
# model asked, then every request at once), "ask-under-read" (the experts' read started, the
# model asked under it, its requests joining it).
ORDER = "ask-first"
ORDERS = ("ask-first", "threads-ahead", "ask-under-read")


def read_whole(
    bulk: BulkRead,
    add_experts: Callable[[BulkRead], None],
    dense_load: Callable[[], DenseLoad],
) -> WholeRead:
    """`dense_load` asks the model where its other tensors go; `add_experts` puts the
    experts' requests into `bulk` (not started)."""
    if ORDER not in ORDERS:
        raise ValueError(f"whole_read.ORDER {ORDER!r}: not one of {', '.join(ORDERS)}")
    dense: DenseLoad | None = None
    try:
        if ORDER == "ask-under-read":
            add_experts(bulk)
            moe_bytes = bulk.nbytes
            t1 = time.perf_counter()
            bulk.start(more=True)
            dense = dense_load()
        else:
            if ORDER == "threads-ahead":
                bulk.start(more=True)  # its threads, waiting for their work
            dense = dense_load()
            add_experts(bulk)
            moe_bytes = bulk.nbytes
            t1 = time.perf_counter()
        dense.add_to(bulk)
        if ORDER == "ask-first":
            bulk.start()
        else:
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
