"""fi_convert/cuda_driver.py: the driver calls' results read as the driver gives them, on a
stand-in for the driver's library (the calls themselves run on the GPU machine: test_gpu.py's
reads into a GPU go through them)."""

from __future__ import annotations

import ctypes
import types

import pytest

from fi_convert import cuda_driver
from fi_convert.cuda_driver import CUDA_ERROR_NOT_READY, CUDA_SUCCESS, CudaError, Driver

NAMES = {1: b"CUDA_ERROR_INVALID_VALUE", 700: b"CUDA_ERROR_ILLEGAL_ADDRESS"}


class FakeLibrary:
    """The driver's functions, each answering `results[name]` (success if unset) and
    counting its calls."""

    def __init__(self, results: dict[str, int] | None = None) -> None:
        self.results = results or {}
        self.calls: list[str] = []
        for name in (
            "cuCtxGetCurrent",
            "cuCtxSetCurrent",
            "cuMemcpyHtoDAsync_v2",
            "cuMemcpy2DAsync_v2",
            "cuEventCreate",
            "cuEventRecord",
            "cuEventQuery",
            "cuEventDestroy_v2",
            "cuEventSynchronize",
        ):
            setattr(self, name, self._call(name))
        self.cuGetErrorName = lambda result, ref: self._error_name(result, ref)

    def _call(self, name: str):
        def fn(*args):
            self.calls.append(name)
            self.args = args
            return self.results.get(name, CUDA_SUCCESS)

        return fn

    def _error_name(self, result, ref):
        if result not in NAMES:
            return 1  # the driver's CUDA_ERROR_INVALID_VALUE for a code it does not know
        ref._obj.value = NAMES[result]
        return CUDA_SUCCESS


def test_rows_a_stride_apart_are_one_2d_copy_from_the_host_to_the_device():
    """The copy's description as the driver reads it (CUDA_MEMCPY2D): 3 rows of 1024 bytes,
    8192 apart in pinned memory, one after another on the device."""
    lib = FakeLibrary()
    Driver(lib, lib).copy_rows_to_device(0xDEAD0000, 0x7F0000001000, 3, 1024, 8192, 0x42)
    described, stream = lib.args
    p = described._obj
    assert lib.calls == ["cuMemcpy2DAsync_v2"] and stream == 0x42
    assert (p.srcMemoryType, p.srcHost, p.srcPitch, p.srcXInBytes, p.srcY) == (
        cuda_driver.CU_MEMORYTYPE_HOST,
        0x7F0000001000,
        8192,
        0,
        0,
    )
    assert (p.dstMemoryType, p.dstDevice, p.dstPitch, p.dstXInBytes, p.dstY) == (
        cuda_driver.CU_MEMORYTYPE_DEVICE,
        0xDEAD0000,
        1024,
        0,
        0,
    )
    assert (p.WidthInBytes, p.Height) == (1024, 3)
    # the driver's layout of the struct (cuda.h, CUDA_MEMCPY2D_v2): 16 fields, 128 bytes
    assert ctypes.sizeof(cuda_driver.Memcpy2D) == 128


def test_a_buffer_whose_copy_is_done_is_not_waited_for():
    lib = FakeLibrary()
    Driver(lib, lib).wait(1)
    assert lib.calls == ["cuEventQuery"]


def test_a_buffer_whose_copy_runs_is_waited_for():
    lib = FakeLibrary({"cuEventQuery": CUDA_ERROR_NOT_READY})
    Driver(lib, lib).wait(1)
    assert lib.calls == ["cuEventQuery", "cuEventSynchronize"]


@pytest.mark.parametrize(
    "call,result,message",
    [
        ("cuMemcpyHtoDAsync_v2", 1, "cuMemcpyHtoDAsync failed (CUDA_ERROR_INVALID_VALUE)"),
        ("cuMemcpy2DAsync_v2", 1, "cuMemcpy2DAsync failed (CUDA_ERROR_INVALID_VALUE)"),
        ("cuEventRecord", 700, "cuEventRecord failed (CUDA_ERROR_ILLEGAL_ADDRESS)"),
        ("cuEventQuery", 700, "cuEventQuery failed (CUDA_ERROR_ILLEGAL_ADDRESS)"),
        ("cuEventSynchronize", 700, "cuEventSynchronize failed (CUDA_ERROR_ILLEGAL_ADDRESS)"),
        ("cuEventCreate", 999, "cuEventCreate failed (error 999)"),
    ],
)
def test_a_failed_call_is_one_line_naming_it_and_the_error(call, result, message):
    results = {call: result}
    if call == "cuEventSynchronize":
        results["cuEventQuery"] = CUDA_ERROR_NOT_READY
    lib = FakeLibrary(results)
    drv = Driver(lib, lib)
    with pytest.raises(CudaError) as e:
        if call == "cuMemcpyHtoDAsync_v2":
            drv.copy_to_device(1 << 32, 4096, 16, 0)
        elif call == "cuMemcpy2DAsync_v2":
            drv.copy_rows_to_device(1 << 32, 4096, 2, 16, 32, 0)
        elif call == "cuEventRecord":
            drv.record(1, 0)
        elif call == "cuEventCreate":
            drv.event()
        else:
            drv.wait(1)
    assert str(e.value) == (
        f"the CUDA driver's {message}; check the GPU (nvidia-smi: its errors, its memory), "
        "then try again"
    )


def test_without_the_drivers_library_reads_go_through_torch(monkeypatch):
    """No library, no driver: BulkRead then copies through torch (`_driver_context` 0)."""
    monkeypatch.setattr(cuda_driver, "LIBRARY", "libfi-convert-no-such-library.so.1")
    cuda_driver._driver.cache_clear()
    try:
        assert cuda_driver.driver() is None
    finally:
        cuda_driver._driver.cache_clear()


@pytest.mark.parametrize("hold", [True, False])
def test_the_calls_that_only_enqueue_keep_the_lock_unless_told_not_to(monkeypatch, hold):
    """`HOLD` (a bench's setting): the enqueueing calls through a library binding that keeps
    the interpreter's lock (PyDLL), or one that gives it up (CDLL); the wait always gives it
    up."""
    made = []

    class Lib:
        def __init__(self, kind):
            self.kind = kind
            made.append(kind)

        def __getattr__(self, name):
            return types.SimpleNamespace()

    monkeypatch.setattr(cuda_driver.ctypes, "PyDLL", lambda path: Lib("PyDLL"))
    monkeypatch.setattr(cuda_driver.ctypes, "CDLL", lambda path: Lib("CDLL"))
    monkeypatch.setattr(cuda_driver, "HOLD", hold)
    cuda_driver._driver.cache_clear()
    try:
        drv = cuda_driver.driver()
        assert drv._held.kind == ("PyDLL" if hold else "CDLL") and drv._free.kind == "CDLL"
    finally:
        cuda_driver._driver.cache_clear()
