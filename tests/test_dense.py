"""fi_convert/format/dense.py: an output's other tensors, read ahead in batches by parallel
threads, for a server's own weight loading."""

from __future__ import annotations

import threading

import pytest
import torch
from safetensors import safe_open

from fi_convert import Backend, Options, SchemeName, convert
from fi_convert.bulk_read import ReadError
from fi_convert.format.dense import DenseTensors
from fi_convert.format.reader import OutputReader
from fi_convert.synthetic import Spec, write_checkpoint

SPEC = Spec("deepseek-v3", layers=3, dense_layers=1, experts=8, quant="fp8-block", vocab=512)


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    src = write_checkpoint(tmp_path_factory.mktemp("dense-src") / "ds", SPEC)
    out = tmp_path_factory.mktemp("dense-out") / "ds-fi"
    convert(src, out, Options(SchemeName.FP8_BLOCK, Backend.TRTLLM, 2), device="cpu")
    return out


def _safetensors_own(out) -> dict[str, torch.Tensor]:
    """Every non-expert tensor of the output, as safetensors itself loads it."""
    with OutputReader(out) as reader:
        want = {}
        for shard in reader.shards():
            with safe_open(out / shard, framework="pt") as f:
                for name in f.keys():  # noqa: SIM118
                    if not reader.is_expert_tensor(name):
                        want[name] = f.get_tensor(name)
    return want


def _threads_left() -> list[str]:
    return [
        t.name
        for t in threading.enumerate()
        if t.name.startswith(("fi-convert-dense", "fi-convert-read"))
    ]


@pytest.mark.parametrize("batch_bytes", [1, 64 << 10, 256 << 20])
def test_every_other_tensor_as_safetensors_loads_it(out, batch_bytes):
    want = _safetensors_own(out)
    assert len(want) > 10 and any(t.dtype == torch.float8_e4m3fn for t in want.values())
    with OutputReader(out) as reader:
        others = DenseTensors(reader, batch_bytes=batch_bytes, threads=3)
        got = dict(iter(others))
    assert got.keys() == want.keys()
    for name, t in want.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape, name
        assert torch.equal(got[name].view(torch.uint8), t.view(torch.uint8)), name
    assert others.nbytes == sum(t.numel() * t.element_size() for t in want.values())
    assert _threads_left() == []


def test_leaving_early_stops_the_reads(out):
    with OutputReader(out) as reader:
        others = DenseTensors(reader, batch_bytes=1)
        it = iter(others)
        next(it)
        with pytest.raises(RuntimeError, match="the model's loader failed"):
            for _name, _t in it:
                raise RuntimeError("the model's loader failed")
        others.close()  # again: nothing to do
    assert _threads_left() == []


def test_closed_before_any_read_stops_the_reader(out):
    with OutputReader(out) as reader:
        DenseTensors(reader, batch_bytes=1).close()
    assert _threads_left() == []


def test_a_shard_truncated_after_the_headers_is_one_line(out, tmp_path):
    import shutil

    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    with OutputReader(copy) as reader:
        others = DenseTensors(reader, batch_bytes=1)  # headers read, files open
        shard = copy / reader.shards()[-1]
        with open(shard, "r+b") as f:
            f.truncate(shard.stat().st_size // 2)
        with pytest.raises(ReadError) as e:
            dict(iter(others))
    msg = str(e.value)
    assert str(shard) in msg and "\n" not in msg and "again" in msg
    assert e.value.__traceback__ is not None and e.value.__context__ is None
    assert _threads_left() == []
