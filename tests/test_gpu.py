"""fi_convert/schemes/, fi_convert/layout.py, fi_convert/bulk_read.py and
fi_convert/format/reader.py: the same conformance on CUDA (skipped without a GPU): conversion on
the GPU, FlashInfer's reference on the GPU, and FlashInfer's CUDA-only scale swizzle against our
index math.

Run on an H200: `pytest -m gpu tests/test_gpu.py` (see docs/development.md, "GPU tests").
"""

from __future__ import annotations

import re

import pytest
import torch

from fi_convert import Backend, Options, SchemeName, convert, load_moe_layer
from fi_convert import layout as L
from fi_convert.errors import FiConvertError
from fi_convert.servers.sglang.target import LAYOUTS as SGLANG_LAYOUTS
from fi_convert.servers.sglang.target import SGLANG_TARGET
from fi_convert.testing.synthetic import Spec, write_checkpoint
from fi_convert.verify import flashinfer_reference as ref
from tests.conftest import reader_threads
from tests.swizzle_shapes import SGLANG_SCALE_SHAPES, VLLM_SCALE_SHAPES

pytestmark = pytest.mark.gpu

CASES = [
    (Spec("deepseek-v3", experts=6, hidden=256, intermediate=512, shards=4), "fp8-block"),
    (Spec("qwen3-moe", layers=2, experts=5, hidden=128, intermediate=192), "bf16"),
    (Spec("mixtral", layers=2, experts=6, hidden=256, intermediate=320, shards=5), "bf16"),
    (Spec("qwen3-moe", layers=2, experts=5, hidden=320, intermediate=384, quant="mxfp8"), "mxfp8"),
    (Spec("qwen3-moe", layers=1, experts=3, hidden=160, intermediate=384), "mxfp8"),
    (
        Spec("mixtral", layers=2, experts=5, hidden=256, intermediate=200, quant="fp8-tensor"),
        "fp8-tensor",
    ),
    (Spec("qwen3-moe", layers=1, experts=3, hidden=128, intermediate=192), "fp8-tensor"),
    (Spec("deepseek-v3", experts=5, hidden=320, intermediate=384, quant="nvfp4"), "nvfp4"),
    (Spec("gpt-oss", layers=2, experts=3, hidden=320, intermediate=192), "mxfp4"),
    (Spec("gpt-oss", layers=1, experts=32, hidden=2880, intermediate=2880, shards=2), "mxfp4"),
]
COMBOS = [
    (case, tp, backend)
    for case, (_, scheme) in enumerate(CASES)
    for tp in (1, 2, 4)
    for backend in ("trtllm", "cutlass")
    if backend == "trtllm" or scheme != "mxfp8"
    if (scheme, tp, backend) != ("nvfp4", 4, "cutlass")  # I/tp 96: vLLM cannot pad it
]


@pytest.mark.parametrize("case,tp,backend", COMBOS)
def test_cuda_conversion_matches_reference_and_cpu(tmp_path, case, tp, backend):
    spec, scheme = CASES[case]
    src = write_checkpoint(tmp_path / "src", spec)
    # BF16 to fp8-tensor is an output vLLM 0.33 cannot serve: converted only on request
    opts = Options(SchemeName(scheme), Backend(backend), tp, allow_unservable=True)
    gpu, cpu = tmp_path / "gpu", tmp_path / "cpu"
    res = convert(src, gpu, opts, device="cuda")
    assert res.device.startswith("cuda")
    convert(src, cpu, opts, device="cpu")
    for f in sorted(p.name for p in cpu.iterdir()):
        assert (gpu / f).read_bytes() == (cpu / f).read_bytes(), f"{f}: CPU and CUDA differ"
    for prefix in res.manifest["layers"]:
        for rank in range(tp):
            got = load_moe_layer(gpu, prefix, tp_rank=rank, device="cuda")
            want = ref.expected(src, prefix, spec.experts, scheme, backend, tp, rank, "cuda")
            for name, t in want.items():
                assert ref.same_bytes(got[name], t), (prefix, rank, name)


# --server sglang: every layout SGLang 0.5.23 is written for, on a checkpoint that pads (the CPU
# bytes are the ones tests/test_sglang.py compares with SGLang's own processing)
SGLANG_CASES = [  # tests/test_sglang.py's checkpoints (SGLang needs H % 128 == 0 for FP4/FP8)
    (Spec("mixtral", layers=1, experts=7, hidden=128, intermediate=192), "bf16"),
    (Spec("deepseek-v3", experts=8, hidden=256, intermediate=512, shards=2), "fp8-block"),
    (Spec("deepseek-v3", experts=3, hidden=384, intermediate=192, quant="nvfp4"), "nvfp4"),
    # CUTLASS: the padded swizzles kept apart; TRT-LLM: refused (H % 128)
    (Spec("deepseek-v3", experts=3, hidden=336, intermediate=256, quant="nvfp4"), "nvfp4"),
    # a SwiGLU clamp: on TRT-LLM the block scales of the smaller-alpha half rescaled in float32
    # and rounded to E4M3 (the last expert's gate and up global scales differ)
    (
        Spec(
            "deepseek-v3",
            experts=5,
            hidden=256,
            intermediate=384,
            quant="nvfp4",
            config={"swiglu_limit": 10.0},
        ),
        "nvfp4",
    ),
    (Spec("qwen3-moe", layers=1, experts=3, hidden=384, intermediate=320, quant="mxfp8"), "mxfp8"),
    (Spec("gpt-oss", layers=2, experts=3, hidden=320, intermediate=192), "mxfp4"),
]
SGLANG_COMBOS = [
    (case, tp, backend)
    for case, (_, scheme) in enumerate(SGLANG_CASES)
    for tp in (1, 2)
    for backend in ("trtllm", "cutlass")
    if (scheme, backend) in SGLANG_LAYOUTS and not SGLANG_TARGET.refuses(scheme, backend)
]


@pytest.mark.parametrize("case,tp,backend", SGLANG_COMBOS)
def test_cuda_conversion_for_sglang_matches_cpu(tmp_path, case, tp, backend):
    spec, scheme = SGLANG_CASES[case]
    src = write_checkpoint(tmp_path / "src", spec)
    opts = Options(SchemeName(scheme), Backend(backend), tp, server="sglang")
    gpu, cpu = tmp_path / "gpu", tmp_path / "cpu"
    try:
        res = convert(src, gpu, opts, device="cuda")
    except FiConvertError as e:  # a checkpoint this layout refuses: refused on CPU alike
        with pytest.raises(FiConvertError, match=re.escape(str(e))):
            convert(src, cpu, opts, device="cpu")
        return
    assert res.device.startswith("cuda")
    convert(src, cpu, opts, device="cpu")
    for f in sorted(p.name for p in cpu.iterdir()):
        assert (gpu / f).read_bytes() == (cpu / f).read_bytes(), f"{f}: CPU and CUDA differ"


@pytest.mark.parametrize("m,ks", [(128, 4), (256, 8), (200, 7), (1024, 56), (96, 3)])
def test_swizzle_matches_block_scale_interleave(m, ks):
    from flashinfer import block_scale_interleave

    sf = torch.randint(1, 255, (m, ks), dtype=torch.uint8, device="cuda")
    want = block_scale_interleave(sf)
    flat = torch.cat([sf.reshape(-1), sf.new_zeros(1)])
    got = flat[L.swizzle_128x4_index(m, ks).cuda()]
    assert torch.equal(got.reshape(-1), want.reshape(-1))


@pytest.mark.parametrize("shape", sorted(SGLANG_SCALE_SHAPES))
def test_the_cpu_block_scale_interleave_of_the_sglang_tests_is_flashinfers(shape):
    """The CPU version SGLang's own processing runs in the CPU tests (tests/sglang_moe.py),
    against FlashInfer's CUDA function, on each scale shape those tests pass it."""
    from flashinfer import block_scale_interleave

    from tests.sglang_moe import _block_scale_interleave

    sf = torch.randint(0, 256, shape, dtype=torch.uint8)
    want = block_scale_interleave(sf.cuda()).cpu()
    assert torch.equal(_block_scale_interleave(sf).reshape(-1), want.reshape(-1))


@pytest.mark.parametrize("shape", sorted(VLLM_SCALE_SHAPES))
@pytest.mark.parametrize("dtype", [torch.uint8, torch.float8_e4m3fn])
def test_the_cpu_block_scale_interleave_of_the_vllm_tests_is_flashinfers(shape, dtype):
    """The CPU version vLLM's own processing runs in the CPU tests of every release
    (tests/vllm_moe.py `cpu_swizzle`), against FlashInfer's CUDA function, on each scale shape
    those tests pass it, batched over experts as vLLM passes it."""
    from flashinfer import block_scale_interleave

    from tests.vllm_moe import block_scale_interleave_cpu

    sf = torch.randint(0, 256, (3, *shape), dtype=torch.uint8).view(dtype)
    want = block_scale_interleave(sf.view(torch.uint8).cuda()).cpu()
    got = block_scale_interleave_cpu(sf).view(torch.uint8)
    assert torch.equal(got.reshape(-1), want.reshape(-1))


@pytest.mark.parametrize("m,ks", [(256, 8), (512, 4), (384, 12)])
def test_row_shuffle_then_swizzle_matches_shuffle_matrix_sf_a(m, ks):
    from flashinfer import shuffle_matrix_sf_a

    sf = torch.randint(1, 255, (m, ks), dtype=torch.uint8, device="cuda")
    want = shuffle_matrix_sf_a(sf, 128, 32)
    rows = L.shuffle_row_index(m, 128).cuda()
    flat = torch.cat([sf[rows].reshape(-1), sf.new_zeros(1)])
    got = flat[L.swizzle_128x4_index(m, ks).cuda()]
    assert torch.equal(got.reshape(-1), want.reshape(-1))


def test_cpu_dequantize_gives_the_gpu_bytes():
    """vLLM's `w.to(float16) * scale` (0-dim float32 scale) on CUDA == our CPU arithmetic;
    PyTorch's CPU evaluation of the same expression differs on many values."""
    from fi_convert.quant import fp8_dequantize_f16

    g = torch.Generator().manual_seed(0)
    w = (torch.randn(512, 512, generator=g) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    for s in torch.rand(8, generator=g) * 1e-2 + 1e-6:
        gpu = w.cuda().to(torch.float16) * s.cuda()
        assert torch.equal(fp8_dequantize_f16(w, s).view(torch.int16), gpu.cpu().view(torch.int16))
    cpu_literal = w.to(torch.float16) * s
    differ = (cpu_literal.view(torch.int16) != gpu.cpu().view(torch.int16)).float().mean().item()
    print(f"CPU literal vs GPU: {differ:.1%} of values differ")


def test_mx_quantize_same_on_cpu_and_cuda():
    from fi_convert.quant import mx_quantize

    x = torch.randn(256, 1024, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    x[0, :32] = 0
    x[1, :32] = 1e-30
    qc, sc = mx_quantize(x)
    qg, sg = mx_quantize(x.cuda())
    assert torch.equal(qc.view(torch.uint8), qg.cpu().view(torch.uint8))
    assert torch.equal(sc, sg.cpu())


@pytest.fixture(params=["driver", "torch"])
def copies(request, monkeypatch):
    """The readers' copies into the GPU: the CUDA driver's own calls (where its library
    loads, as here), or torch's (where it does not)."""
    from fi_convert import cuda_driver

    if request.param == "torch":
        monkeypatch.setattr(cuda_driver, "driver", lambda: None)
    else:
        assert cuda_driver.driver() is not None
    return request.param


def _used(bulk, copies: str) -> bool:
    """The read went the way `copies` says (a context for the driver's calls, or none)."""
    return bool(bulk._context) == (copies == "driver")


@pytest.mark.parametrize(("lead", "depth"), [(1, 2), (4, 4), (2, 4)])
def test_reads_into_cuda_equal_the_cpu_read(tmp_path, copies, monkeypatch, lead, depth):
    """The bulk read into a GPU (pinned buffers, each thread's own stream) gives the CPU
    read's bytes: a rank's slices (TP 2) and an EP rank's experts, every tensor of a layer in
    one read cut into 1 MiB chunks over 3 threads; then no pinned memory is held. Through the
    driver's calls and through torch's; each thread's first read a chunk long, or `lead`
    chunks into its `depth` buffers in a row (bulk_read.LEAD), whose copies must be over
    before they are read into again."""
    from fi_convert import bulk_read
    from fi_convert.bulk_read import MIN_CHUNK, BulkRead
    from fi_convert.format import reader as loader

    monkeypatch.setattr(bulk_read, "LEAD", lead)
    monkeypatch.setattr(bulk_read, "DEPTH", depth)

    spec = Spec("qwen3-moe", layers=1, experts=5, hidden=1024, intermediate=512)
    src = write_checkpoint(tmp_path / "src", spec)
    prefix = "model.layers.0.mlp.experts"
    for tp, how in [(1, [4, 0, 1]), (2, 1)]:
        out = tmp_path / f"out{tp}"
        convert(src, out, Options(SchemeName.BF16, tp_size=tp), device="cpu")
        with loader.OutputReader(out) as r:
            gpu = BulkRead("cuda", threads=3, chunk=MIN_CHUNK, host_memory=64 << 20)
            pairs = []
            for name in r.layer(prefix)["tensors"]:
                _, shape, dtype = r.info(prefix, name)
                if tp == 1:
                    shape = (len(how), *shape[1:])
                cpu, dev = torch.empty(shape, dtype=dtype), torch.empty(shape, dtype=dtype).cuda()
                read = r.read_experts_into if tp == 1 else r.read_into
                read(prefix, name, how, cpu)
                read(prefix, name, how, dev, gpu)
                pairs.append((name, cpu, dev))
            stats = gpu.run()
        assert stats.threads == 3 and stats.read_bytes > 3 * MIN_CHUNK and _used(gpu, copies)
        assert 0 < stats.pinned_peak <= 3 * depth * MIN_CHUNK and gpu.pinned_bytes == 0
        longest = max(j.size for j in gpu._jobs)  # (a lead job: longer than a chunk)
        assert longest <= lead * MIN_CHUNK and (lead == 1 or longest > MIN_CHUNK)
        for name, cpu, dev in pairs:
            assert torch.equal(dev.cpu().view(torch.uint8), cpu.view(torch.uint8)), name


def test_rows_a_stride_apart_into_cuda_equal_the_cpu_read(tmp_path, copies):
    """A row-parallel rank's columns (rows a stride apart: BulkRead.add_rows) read into a GPU
    (pinned buffers, one strided copy per chunk on each thread's stream) give the CPU read's
    bytes; rows longer than a chunk too."""
    import os

    from fi_convert.bulk_read import MIN_CHUNK, BulkRead

    path = tmp_path / "f"
    path.write_bytes(os.urandom(9 << 20))
    fd = os.open(path, os.O_RDONLY)
    try:
        for rows in [(500, 2048, 16384), (3, 3 << 19, 2 << 20)]:
            n, size, _ = rows
            cpu = torch.empty(n * size, dtype=torch.uint8)
            dev = torch.empty(n * size, dtype=torch.uint8, device="cuda")
            one = BulkRead("cpu", threads=3, chunk=MIN_CHUNK, staged=False)
            one.add_rows(path, fd, 777, rows, cpu)
            one.run()
            gpu = BulkRead("cuda", threads=3, chunk=MIN_CHUNK, host_memory=64 << 20)
            gpu.add_rows(path, fd, 777, rows, dev)
            gpu.run()
            assert torch.equal(dev.cpu(), cpu), rows
            assert _used(gpu, copies)
    finally:
        os.close(fd)


def test_load_moe_layer_on_cuda_equals_cpu(tmp_path):
    from fi_convert import load_moe_layer

    src = write_checkpoint(tmp_path / "src", Spec("deepseek-v3", layers=2, experts=6))
    out = tmp_path / "out"
    convert(src, out, Options(SchemeName.FP8_BLOCK, tp_size=2), device="cpu")
    for rank in (0, 1):
        cpu = load_moe_layer(out, "model.layers.1.mlp.experts", tp_rank=rank)
        gpu = load_moe_layer(out, "model.layers.1.mlp.experts", tp_rank=rank, device="cuda")
        assert cpu.keys() == gpu.keys()
        for k in cpu:
            assert gpu[k].is_cuda
            assert torch.equal(gpu[k].cpu().view(torch.uint8), cpu[k].view(torch.uint8))


@pytest.mark.parametrize("fault", [None, "eio", "cuda"])
def test_a_read_into_cuda_gives_its_pinned_memory_back(tmp_path, monkeypatch, fault):
    """After the read, or a fault in it (a file's, or a failed copy of the driver's), torch
    holds no more pinned memory than before (its cache of pinned blocks emptied too), and a
    block allocated ahead is the owner's to free."""
    import errno
    import os

    from fi_convert import bulk_read, cuda_driver
    from fi_convert.bulk_read import BulkRead, HostBuffers, ReadError

    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(24 << 20))
    fd = os.open(path, os.O_RDONLY)
    stats = torch.cuda.host_memory_stats
    torch._C._host_emptyCache()
    before = stats()["allocated_bytes.current"]
    if fault == "eio":

        def eio(*a):
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(bulk_read.os, "preadv", eio)
    if fault == "cuda":

        def failed(self, *a):
            raise cuda_driver.CudaError("the CUDA driver's cuMemcpyHtoDAsync failed (test)")

        monkeypatch.setattr(cuda_driver.Driver, "copy_to_device", failed)
    bulk = BulkRead("cuda", threads=2, host_memory="64MiB")
    dst = torch.empty(24 << 20, dtype=torch.uint8, device="cuda")
    bulk.add(path, fd, 0, dst)
    if fault:
        error = ReadError if fault == "eio" else cuda_driver.CudaError
        with pytest.raises(error, match="Input/output error|cuMemcpyHtoDAsync failed") as e:
            bulk.run()
        assert str(e.value).startswith(f"{path}: ") and "\n" not in str(e.value)
    else:
        assert bulk.run().pinned_peak == 2 * 2 * bulk_read.CHUNK
    bulk.wait_freed()
    assert bulk.pinned_bytes == 0 and stats()["allocated_bytes.current"] == before
    monkeypatch.undo()
    ahead = HostBuffers(32 << 20).allocate(background=True)
    again = BulkRead("cuda", threads=2, buffers=ahead)
    again.add(path, fd, 0, dst)
    again.run()
    assert ahead.held == 32 << 20  # still the owner's
    ahead.free(background=False)
    os.close(fd)
    assert stats()["allocated_bytes.current"] == before
    assert torch.equal(dst.cpu(), torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8))


@pytest.mark.parametrize("built", [True, False])
def test_what_a_load_sets_up_ahead_gives_its_pinned_memory_back(tmp_path, built):
    """`whole_read.Ahead` into a GPU: its block pinned and its readers started while the
    server builds the model; a read through it lands every byte; once closed, after the load
    or after a build that failed, no reader runs and torch holds no more pinned memory than
    before."""
    import os
    import types

    from fi_convert.format import whole_read

    path = tmp_path / "f.bin"
    data = os.urandom(24 << 20)
    path.write_bytes(data)
    stats = torch.cuda.host_memory_stats
    torch._C._host_emptyCache()
    before = stats()["allocated_bytes.current"]
    ahead = whole_read.Ahead("cuda")
    assert ahead.buffers is not None and ahead.buffers.pinned
    if built:
        reader = types.SimpleNamespace(bulk=None)  # (not asked: the read started ahead)
        bulk = whole_read.new_read(ahead, reader, torch.device("cuda"))
        assert bulk.started
        dst = torch.empty(24 << 20, dtype=torch.uint8, device="cuda")
        fd = os.open(path, os.O_RDONLY)
        bulk.add(path, fd, 0, dst)
        bulk.more()
        bulk.wait()
        os.close(fd)
        assert dst.cpu().numpy().tobytes() == data
    ahead.close()
    ahead.buffers.wait_freed()
    assert not reader_threads()
    assert stats()["allocated_bytes.current"] == before


@pytest.mark.parametrize("first", [None, "copy"])
def test_a_gpu_that_fails_under_the_reads_copies_is_one_line(tmp_path, monkeypatch, first):
    """torch's error for a GPU that faulted is many lines: where a reader's last wait for its
    copies meets it, the read's error is one line naming the copies and the fix; where the
    reader's own fault came first (a failed copy, naming the file), that one stands."""
    import os

    from fi_convert import cuda_driver
    from fi_convert.bulk_read import BulkRead, HostBuffers

    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(8 << 20))
    fd = os.open(path, os.O_RDONLY)

    def faulted(self):
        raise RuntimeError(
            "CUDA error: an illegal memory access was encountered\n"
            "CUDA kernel errors might be asynchronously reported at some other API call"
        )

    def failed(self, *a):
        raise cuda_driver.CudaError("the CUDA driver's cuMemcpyHtoDAsync failed (test)")

    block = HostBuffers(16 << 20).allocate()  # (the owner's: freed once the test is done)
    dst = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
    with monkeypatch.context() as mp:
        mp.setattr(torch.cuda.Stream, "synchronize", faulted)
        if first:
            mp.setattr(cuda_driver.Driver, "copy_to_device", failed)
        bulk = BulkRead("cuda", threads=2, buffers=block)
        bulk.add(path, fd, 0, dst)
        with pytest.raises(cuda_driver.CudaError) as e:
            bulk.run()
    os.close(fd)
    torch.cuda.synchronize()
    block.free(background=False)
    msg = str(e.value)
    assert "\n" not in msg
    if first:
        assert msg.startswith(f"{path}: ") and "cuMemcpyHtoDAsync failed" in msg
    else:
        assert msg.startswith(
            "the read's copies into the GPU failed (CUDA error: an illegal memory access was "
            "encountered); check the GPU"
        )
