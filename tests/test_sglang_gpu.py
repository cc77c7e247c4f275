"""SGLang's SM90 CUTLASS MXFP4 layout (gpt-oss on `flashinfer_mxfp4` on Hopper) on CUDA, skipped
without a GPU: fi_convert.layout's SM90 functions against FlashInfer's own code on CUDA (the
weight interleave is a CUDA-only op, which tests/test_sglang.py ran on CPU as fi-convert's
version: this is where that version is checked), and the conversion on CUDA against the one on
CPU. Imports only torch, FlashInfer, fi_convert and the shapes list tests/swizzle_shapes.py.

The weight interleave: FlashInfer's public op, `flashinfer.fused_moe.
interleave_moe_weights_for_sm90_mixed_gemm`, lives in its CUTLASS fused-MoE module, which FlashInfer
JIT-compiles whole for the GPU's arch on first use (hundreds of CUTLASS kernels: far longer than
a test run) unless it is prebuilt; so the default check compiles FlashInfer's own kernel source
for it (`moe_gemm_mixed_utils.cu`, shipped in the wheel) alone with nvcc, called through ctypes,
calls it per expert as FlashInfer's binding does (`flashinfer_cutlass_fused_moe_binding.cu`),
and the check through the public op runs where FI_CONVERT_FULL_MOE_JIT=1 says the module may be
built (or is).

Run on an H200: `pytest -m gpu tests/test_sglang_gpu.py`.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from fi_convert import Backend, Options, SchemeName, convert
from fi_convert import layout as L
from fi_convert.testing.synthetic import Spec, write_checkpoint
from tests.swizzle_shapes import SGLANG_SM90_WEIGHT_SHAPES

pytestmark = pytest.mark.gpu

KERNEL_DIR = "nv_internal/tensorrt_llm/kernels/cutlass_kernels/moe_gemm"
# FlashInfer's binding's loop (interleave_moe_weights_for_sm90_mixed_gemm, quant_type 1: FP4:
# one launch of its kernel launcher per expert), as a C function; nothing else. On the default
# stream (the test synchronizes around it), so that no torch header or runtime is compiled in.
BINDING = r"""
#include <cstdint>
#include "moe_gemm_mixed_utils.h"

extern "C" int fi_interleave_fp4(uint8_t* src, uint8_t* dst, int64_t e, int64_t n, int64_t k) {
  int64_t const per = n * (k / 2);
  for (int64_t i = 0; i < e; ++i) {
    tensorrt_llm::kernels::cutlass_kernels::interleave_fp4_weights_for_sm90_mixed_gemm(
        src + i * per, dst + i * per, static_cast<int>(n), static_cast<int>(k), 0);
  }
  return static_cast<int>(cudaDeviceSynchronize());
}
"""


def _csrc() -> Path:
    import flashinfer

    return Path(flashinfer.__file__).parent / "data" / "csrc"


def _nvcc() -> str:
    from torch.utils.cpp_extension import CUDA_HOME

    found = shutil.which("nvcc") or (CUDA_HOME and str(Path(CUDA_HOME) / "bin" / "nvcc"))
    if not found or not Path(found).exists():
        pytest.fail("nvcc not found: FlashInfer's kernel source cannot be built here")
    return found


@pytest.fixture(scope="module")
def flashinfer_kernel(tmp_path_factory):
    """FlashInfer's SM90 FP4 weight-interleave kernel (its shipped source), built for this GPU
    with nvcc into a shared library, called through ctypes: [E, n, K/2] uint8 -> a new tensor."""
    build = tmp_path_factory.mktemp("fi-sm90-interleave")
    (build / "binding.cu").write_text(BINDING)
    src = _csrc() / KERNEL_DIR
    major, minor = torch.cuda.get_device_capability()
    arch = f"{major}{minor}"
    lib = build / "fi_sm90_interleave.so"
    cmd = [_nvcc(), "-shared", "-Xcompiler", "-fPIC", "-O2", "-std=c++17", f"-I{src}"]
    cmd += [f"-gencode=arch=compute_{arch},code=sm_{arch}", "-o", str(lib)]
    cmd += [str(build / "binding.cu"), str(src / "moe_gemm_mixed_utils.cu")]
    subprocess.run(cmd, check=True, capture_output=True)
    fn = ctypes.CDLL(str(lib)).fi_interleave_fp4
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int64] * 3
    fn.restype = ctypes.c_int

    def interleave(w: torch.Tensor) -> torch.Tensor:
        assert w.is_cuda and w.dtype == torch.uint8 and w.ndim == 3 and w.is_contiguous()
        out = torch.empty_like(w)
        torch.cuda.synchronize()
        e, n, kb = w.shape
        assert fn(w.data_ptr(), out.data_ptr(), e, n, 2 * kb) == 0  # cudaSuccess
        return out

    return interleave


def _shapes(h: int, i: int, tp: int) -> list[tuple[int, int, int]]:
    """(n, K/2 bytes, scale columns K/32) of w13 and w2 per expert on SGLang's SM90 path:
    I/TP padded to 128 (I_a), H to 256 (H_a); w13 [2*I_a, H_a/2], w2 [H_a, I_a/2]."""
    i_a, h_a = L.round_up(i // tp, 128), L.round_up(h, 256)
    return [(2 * i_a, h_a // 2, h_a // 32), (h_a, i_a // 2, i_a // 32)]


# the per-expert shapes SGLang's own processing passes FlashInfer's op in the CPU tests, where a
# CPU version stands in for it (tests/swizzle_shapes.py, 3 experts each), small ones, and
# gpt-oss-120b's (128 experts, H = I = 2880) at TP 1, 2 and 4 (SGLang's SM90 loader takes TP 1
# and 2 only: I/32 = 90; TP 4's shapes are checked all the same)
SHAPES = sorted(
    {(3, n, kb, kb // 16) for n, kb in SGLANG_SM90_WEIGHT_SHAPES}
    | {(2, 16, 32, 2), (1, 64, 64, 4), (4, 128, 96, 6)}
    | {(128, n, kb, kgs) for tp in (1, 2, 4) for n, kb, kgs in _shapes(2880, 2880, tp)}
)


def _random(e: int, n: int, cols: int, seed: int) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(0, 256, (e, n, cols), dtype=torch.uint8, device="cuda", generator=g)


@pytest.mark.parametrize(("e", "n", "kb", "kgs"), SHAPES)
def test_sm90_weight_interleave_matches_flashinfers_kernel(e, n, kb, kgs, flashinfer_kernel):
    w = _random(e, n, kb, n * kb + e)
    want = flashinfer_kernel(w)
    assert torch.equal(L.sm90_interleave_weights(w), want)
    assert not torch.equal(w, want)  # the kernel moves bytes here: the comparison can fail


@pytest.mark.skipif(
    os.environ.get("FI_CONVERT_FULL_MOE_JIT") != "1",
    reason="FlashInfer's public op JIT-builds its whole CUTLASS MoE: FI_CONVERT_FULL_MOE_JIT=1",
)
@pytest.mark.parametrize(("e", "n", "kb", "kgs"), SHAPES[:4])
def test_sm90_weight_interleave_matches_flashinfers_op(e, n, kb, kgs):
    from flashinfer.fused_moe import interleave_moe_weights_for_sm90_mixed_gemm

    w = _random(e, n, kb, n + kb + e)
    want = interleave_moe_weights_for_sm90_mixed_gemm(w, "fp4")
    assert torch.equal(L.sm90_interleave_weights(w), want)


@pytest.mark.parametrize(
    ("e", "n", "kb", "kgs"), [s for s in SHAPES if s[1] % 64 == 0 and s[3] % 4 == 0]
)
def test_sm90_scale_fold_matches_flashinfer(e, n, kb, kgs):
    from flashinfer.fused_moe import interleave_moe_scales_for_sm90_mixed_gemm

    s = _random(e, n, kgs, n + kgs + e)
    want = interleave_moe_scales_for_sm90_mixed_gemm(s, group_size=32)
    got = torch.empty_like(want)
    L.gather_flat(s, L.sm90_scale_fold_index(n, kgs), got)
    assert torch.equal(got, want)


def test_sm90_bit_step_on_cuda():
    """Each single set bit of a word, the sign bit included, lands where the CPU puts it
    (int32 shifts on CUDA)."""
    words = (torch.ones(32, dtype=torch.int64) << torch.arange(32)).to(torch.int32)
    cpu = L.sm90_fp4_bits_(words.clone())
    assert torch.equal(L.sm90_fp4_bits_(words.cuda()).cpu(), cpu)


SM90_CASES = [
    (Spec("gpt-oss", layers=2, experts=3, hidden=320, intermediate=192), (1, 2)),
    (Spec("gpt-oss", layers=2, experts=5, hidden=576, intermediate=384), (1, 2, 4)),
    (Spec("gpt-oss", layers=1, experts=32, hidden=2880, intermediate=2880, shards=2), (1, 2)),
]


@pytest.mark.parametrize(
    ("case", "tp"), [(c, tp) for c, (_, tps) in enumerate(SM90_CASES) for tp in tps]
)
def test_sm90_cuda_conversion_equals_cpu(tmp_path, case, tp):
    """`--scheme mxfp4 --backend cutlass --server sglang` converted on CUDA and on CPU: the same
    files, byte for byte."""
    spec = SM90_CASES[case][0]
    src = write_checkpoint(tmp_path / "src", spec)
    opts = Options(SchemeName.MXFP4, Backend.CUTLASS, tp, server="sglang")
    gpu, cpu = tmp_path / "gpu", tmp_path / "cpu"
    res = convert(src, gpu, opts, device="cuda")
    assert res.device.startswith("cuda")
    convert(src, cpu, opts, device="cpu")
    for f in sorted(p.name for p in cpu.iterdir()):
        assert (gpu / f).read_bytes() == (cpu / f).read_bytes(), f"{f}: CPU and CUDA differ"
