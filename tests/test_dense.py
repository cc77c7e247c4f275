"""fi_convert/format/dense.py: an output's other tensors, for a server's own weight loading."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from fi_convert import Backend, Options, SchemeName, convert
from fi_convert.bulk_read import ReadError
from fi_convert.format.dense import OtherTensors
from fi_convert.format.reader import OutputReader
from fi_convert.testing.synthetic import Spec, write_checkpoint

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


def test_every_other_tensor_as_safetensors_loads_it(out):
    want = _safetensors_own(out)
    assert len(want) > 10 and any(t.dtype == torch.float8_e4m3fn for t in want.values())
    with OutputReader(out) as reader:
        assert not any(reader.is_expert_tensor(n) for n in want)
        assert any(reader.is_expert_tensor(f"{p}.w13_weight") for p in reader.layers)
        others = OtherTensors(reader)
        got = dict(iter(others))
    assert got.keys() == want.keys()
    for name, t in want.items():
        assert torch.equal(got[name].view(torch.uint8), t.view(torch.uint8)), name
    assert others.nbytes == sum(t.numel() * t.element_size() for t in want.values())


def test_a_shard_truncated_after_the_headers_is_one_line(out, tmp_path):
    import shutil

    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    with OutputReader(copy) as reader:
        shard = copy / reader.shards()[-1]
        with open(shard, "r+b") as f:
            f.truncate(shard.stat().st_size // 2)
        with pytest.raises(ReadError) as e:
            dict(iter(OtherTensors(reader)))
    msg = str(e.value)
    assert str(shard) in msg and "\n" not in msg and "again" in msg
    assert e.value.__cause__ is None and e.value.__suppress_context__
