"""The few CUDA driver calls a reader thread makes per chunk, without torch.

A reader thread of a read into a GPU copies each chunk from its pinned buffer to the chunk's
destinations and records an event after it. Through torch each of those calls parses its
arguments, goes through the dispatcher, makes a tensor view of the buffer, and gives up the
interpreter's lock and waits to take it back beside 15 other readers. On an H100 (2026-12-06)
that made `BulkRead` 1.41 times a plain copy loop's time at 4 MiB chunks, and 1.15 with the view
alone left out (docs/speed.md). These calls go straight to the driver: an asynchronous copy from
pinned memory, an event's record and query only enqueue or look, so they keep the interpreter's
lock (a `PyDLL` call); only the wait for an event gives it up. Destinations and sources are plain
addresses.

`driver()` is None where the driver library cannot be loaded: the reader then goes through torch.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

from .errors import FiConvertError

CUDA_SUCCESS = 0
CUDA_ERROR_NOT_READY = 600
CU_EVENT_DISABLE_TIMING = 2
CU_MEMORYTYPE_HOST, CU_MEMORYTYPE_DEVICE = 1, 2
LIBRARY = "libcuda.so.1"


class Memcpy2D(ctypes.Structure):
    """The driver's CUDA_MEMCPY2D: a copy of `Height` rows of `WidthInBytes`, each `srcPitch`
    bytes after the last in the source and `dstPitch` in the destination."""

    _fields_ = [
        ("srcXInBytes", ctypes.c_size_t),
        ("srcY", ctypes.c_size_t),
        ("srcMemoryType", ctypes.c_int),
        ("srcHost", ctypes.c_void_p),
        ("srcDevice", ctypes.c_uint64),
        ("srcArray", ctypes.c_void_p),
        ("srcPitch", ctypes.c_size_t),
        ("dstXInBytes", ctypes.c_size_t),
        ("dstY", ctypes.c_size_t),
        ("dstMemoryType", ctypes.c_int),
        ("dstHost", ctypes.c_void_p),
        ("dstDevice", ctypes.c_uint64),
        ("dstArray", ctypes.c_void_p),
        ("dstPitch", ctypes.c_size_t),
        ("WidthInBytes", ctypes.c_size_t),
        ("Height", ctypes.c_size_t),
    ]


class CudaError(FiConvertError):
    """A CUDA driver call failed; names the call and the error."""


class Driver:
    """The driver's calls, bound once: `held` keeps the interpreter's lock through the call,
    `free` gives it up (a wait)."""

    def __init__(self, held: Any, free: Any) -> None:
        self._held, self._free = held, free
        u64, p, size = ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t
        self._sig(held, "cuCtxGetCurrent", ctypes.POINTER(p))
        self._sig(held, "cuCtxSetCurrent", p)
        self._sig(held, "cuMemcpyHtoDAsync_v2", u64, p, size, p)
        self._sig(held, "cuMemcpy2DAsync_v2", ctypes.POINTER(Memcpy2D), p)
        self._sig(held, "cuEventCreate", ctypes.POINTER(p), ctypes.c_uint)
        self._sig(held, "cuEventRecord", p, p)
        self._sig(held, "cuEventQuery", p)
        self._sig(held, "cuEventDestroy_v2", p)
        self._sig(held, "cuGetErrorName", ctypes.c_int, ctypes.POINTER(ctypes.c_char_p))
        self._sig(free, "cuEventSynchronize", p)

    @staticmethod
    def _sig(lib: Any, name: str, *args: Any) -> None:
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = list(args), ctypes.c_int

    def _check(self, result: int, call: str) -> None:
        if result != CUDA_SUCCESS:
            raise CudaError(
                f"the CUDA driver's {call} failed ({self.error_name(result)}); check the GPU "
                "(nvidia-smi: its errors, its memory), then try again"
            )

    def error_name(self, result: int) -> str:
        name = ctypes.c_char_p()
        if self._held.cuGetErrorName(result, ctypes.byref(name)) != CUDA_SUCCESS or not name.value:
            return f"error {result}"
        return name.value.decode()

    def current_context(self) -> int:
        """The calling thread's current context (0: none)."""
        ctx = ctypes.c_void_p()
        self._check(self._held.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
        return ctx.value or 0

    def set_context(self, ctx: int) -> None:
        self._check(self._held.cuCtxSetCurrent(ctypes.c_void_p(ctx)), "cuCtxSetCurrent")

    def copy_to_device(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        """Enqueue a copy of `nbytes` from pinned host address `src` to device address `dst`
        on `stream`."""
        result = self._held.cuMemcpyHtoDAsync_v2(dst, src, nbytes, stream)
        if result != CUDA_SUCCESS:
            self._check(result, "cuMemcpyHtoDAsync")

    def copy_rows_to_device(
        self, dst: int, src: int, rows: int, size: int, stride: int, stream: int
    ) -> None:
        """Enqueue a copy of `rows` rows of `size` bytes, `stride` apart from pinned host
        address `src`, to device address `dst`, one after another, on `stream` (one copy of
        the copy engine's: nothing gathered on the host)."""
        p = Memcpy2D(
            srcMemoryType=CU_MEMORYTYPE_HOST,
            srcHost=src,
            srcPitch=stride,
            dstMemoryType=CU_MEMORYTYPE_DEVICE,
            dstDevice=dst,
            dstPitch=size,
            WidthInBytes=size,
            Height=rows,
        )
        self._check(self._held.cuMemcpy2DAsync_v2(ctypes.byref(p), stream), "cuMemcpy2DAsync")

    def event(self) -> int:
        ev = ctypes.c_void_p()
        self._check(
            self._held.cuEventCreate(ctypes.byref(ev), CU_EVENT_DISABLE_TIMING), "cuEventCreate"
        )
        return ev.value or 0

    def record(self, event: int, stream: int) -> None:
        result = self._held.cuEventRecord(event, stream)
        if result != CUDA_SUCCESS:
            self._check(result, "cuEventRecord")

    def done(self, event: int) -> bool:
        """Whether the work before `event` is done (a look, keeping the lock)."""
        result = self._held.cuEventQuery(event)
        if result not in (CUDA_SUCCESS, CUDA_ERROR_NOT_READY):
            self._check(result, "cuEventQuery")
        return result == CUDA_SUCCESS

    def wait(self, event: int) -> None:
        """Until the work before `event` is done: a look first (keeping the lock), and only if
        it is not done yet a wait (giving it up)."""
        result = self._held.cuEventQuery(event)
        if result == CUDA_ERROR_NOT_READY:
            result = self._free.cuEventSynchronize(event)
            call = "cuEventSynchronize"
        else:
            call = "cuEventQuery"
        if result != CUDA_SUCCESS:
            self._check(result, call)

    def destroy(self, event: int) -> None:
        self._check(self._held.cuEventDestroy_v2(event), "cuEventDestroy")


# Whether the calls that only enqueue or look keep the interpreter's lock (a bench's setting,
# `--alt-bulk NAME=set:fi_convert.cuda_driver:HOLD=False`: every call gives it up)
HOLD = True


def driver() -> Driver | None:
    """The process's CUDA driver (the one torch loaded), or None where it cannot be loaded."""
    return _driver(HOLD)


@functools.cache
def _driver(hold: bool) -> Driver | None:
    try:
        return Driver((ctypes.PyDLL if hold else ctypes.CDLL)(LIBRARY), ctypes.CDLL(LIBRARY))
    except (OSError, AttributeError):
        return None
