"""An output's other tensors (attention, embeddings, dense MLPs, shared experts, norms): every
tensor that is not a converted MoE tensor, for a server's own weight loading.

They are read in batches by parallel threads straight into host tensors (no memory map, no
page faults in the caller's thread), the next batch while the caller hands this one to the
model: a server's `load_weights` then only copies them to the device, as it does with its
default loader's tensors.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from pathlib import Path

import torch

from .. import dtypes
from ..bulk_read import BulkRead, default_threads
from ..st_io import TensorInfo
from .reader import OutputReader

BATCH_BYTES = 256 << 20  # a batch in host memory; at most three are alive at once


class DenseTensors:
    """Iterate (name, host tensor) over the output's other tensors, shard by shard in file
    order; `close()` (or leaving the iteration early) stops the reads and waits for them."""

    def __init__(
        self,
        reader: OutputReader,
        *,
        batch_bytes: int = BATCH_BYTES,
        threads: int | None = None,
    ) -> None:
        self.nbytes = 0  # delivered so far
        # headers read and files opened here, in the caller's thread
        self._batches = [
            [(info, reader.fd(info.file)) for info in batch]
            for batch in _batches(_other_tensors(reader), batch_bytes)
        ]
        self._threads = threads or max(1, default_threads() // 2)  # beside the MoE read
        self._ready: queue.SimpleQueue = queue.SimpleQueue()
        self._slots = threading.Semaphore(2)  # batches read ahead of the one in use
        self._stop = threading.Event()
        self._bulk: BulkRead | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._produce, name="fi-convert-dense")
        self._thread.start()

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        try:
            while (batch := self._ready.get()) is not None:
                if isinstance(batch, BaseException):
                    raise batch
                for name, t in batch:
                    self.nbytes += t.numel() * t.element_size()
                    yield name, t
                del batch
                self._slots.release()
        finally:
            self.close()

    def close(self) -> None:
        """Stop the reads (the one under way after its current chunks) and wait for them."""
        self._stop.set()
        with self._lock:
            if self._bulk is not None:
                self._bulk.abort()
        self._slots.release()  # a reader waiting for a slot sees the stop
        self._thread.join()

    def _produce(self) -> None:
        try:
            for batch in self._batches:
                self._slots.acquire()
                if self._stop.is_set():
                    return
                out: list[tuple[str, torch.Tensor]] = []
                bulk = BulkRead("cpu", threads=self._threads)
                for info, fd in batch:
                    t = torch.empty(info.shape, dtype=dtypes.to_torch(info.dtype))
                    bulk.add(info.file, fd, info.start, t)
                    out.append((info.name, t))
                with self._lock:
                    if self._stop.is_set():
                        return
                    self._bulk = bulk
                    bulk.start()
                try:
                    bulk.wait()
                except BaseException:
                    bulk.abort()  # (wait stops its threads itself; again, at no cost)
                    raise
                finally:
                    with self._lock:
                        self._bulk = None
                self._ready.put(out)
            self._ready.put(None)
        except BaseException as e:  # the consumer raises it (the first fault ends the load)
            e.__context__ = e.__cause__ = None
            self._ready.put(e.with_traceback(None))


def _other_tensors(reader: OutputReader) -> Iterator[TensorInfo]:
    for shard in reader.shards():
        infos = reader.header(shard)
        for info in sorted(infos.values(), key=lambda i: i.start):
            if not reader.is_expert_tensor(info.name):
                yield info


def _batches(infos: Iterator[TensorInfo], batch_bytes: int) -> Iterator[list[TensorInfo]]:
    batch: list[TensorInfo] = []
    size = 0
    for info in infos:
        if batch and size + info.nbytes > batch_bytes:
            yield batch
            batch, size = [], 0
        batch.append(info)
        size += info.nbytes
    if batch:
        yield batch


def other_tensors(root: str | Path) -> list[str]:
    """The names of an output folder's other tensors (tests, tools)."""
    with OutputReader(root) as reader:
        return [i.name for i in _other_tensors(reader)]
