"""fi_convert/quant.py and the quantized schemes (fi_convert/schemes/): the arithmetic's edge cases
against independent implementations, detection and refusals for the quantized schemes."""

from __future__ import annotations

import pytest
import torch

from fi_convert import Options, SchemeMismatchError, SchemeName, make_plan
from fi_convert.quant import E4M3_MAX, fp8_dequantize_f16, fp8_quantize_static, mx_quantize
from fi_convert.testing.synthetic import Spec, write_checkpoint
from fi_convert.verify import flashinfer_reference as ref


def _blocks(*rows: list[float]) -> torch.Tensor:
    return torch.tensor([list(r) + [0.0] * (32 - len(r)) for r in rows], dtype=torch.float32)


@pytest.mark.parametrize(
    "name,x",
    [
        ("all zero", _blocks([0.0])),
        ("at E4M3 max", _blocks([448.0, -448.0, 1.0])),
        ("powers of two times max", _blocks([448.0 * 2**-10], [448.0 * 2**5], [-448.0 * 2**-60])),
        ("just above max", _blocks([448.0001, 3.0])),
        ("bf16 subnormals", _blocks([1e-39, -5e-40, 9.2e-41])),
        ("huge", _blocks([3e38, -1e38])),
        ("mixed magnitudes", _blocks([1e-6, 2.0, 1e3, -7.5])),
    ],
)
def test_mx_quantize_edge_cases_match_reference(name, x):
    x = x.to(torch.bfloat16)
    q, s = mx_quantize(x)
    rq, rs = ref.mx_quantize_ref(x)
    assert torch.equal(s, rs), name
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8)), name
    assert not torch.isnan(q.float()).any()


def test_mx_quantize_known_values():
    q, s = mx_quantize(_blocks([448.0, 1.0], [0.0]).to(torch.bfloat16))
    assert s.tolist() == [[127], [0]]  # 448 fits exactly at 2**0; an all-zero block gets 0
    assert q.float()[0, :2].tolist() == [448.0, 1.0]
    assert q.float()[1].abs().sum() == 0


def test_mx_quantize_random_matches_reference():
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(64, 1024, generator=g) * torch.logspace(-8, 8, 1024)).to(torch.bfloat16)
    q, s = mx_quantize(x)
    rq, rs = ref.mx_quantize_ref(x)
    assert torch.equal(s, rs) and torch.equal(q.view(torch.uint8), rq.view(torch.uint8))


def test_fp8_static_quantize_clamps_and_rounds_to_nearest_even():
    scale = torch.tensor(1.0)
    x = torch.tensor([500.0, -1e9, 448.0, 17.0, 19.0, 0.0])
    q = fp8_quantize_static(x, scale).float()
    # 17 lies between E4M3 16 and 18 (ties go to the even mantissa: 16); 19 -> 20 (even)
    assert q.tolist() == [448.0, -448.0, 448.0, 16.0, 20.0, 0.0]
    assert torch.equal(fp8_quantize_static(x, scale), ref.fp8_quant(x, scale))


def test_fp8_dequantize_uses_float16_scale():
    w = torch.tensor([1.0, 448.0, -3.0]).to(torch.float8_e4m3fn)
    s = torch.tensor(1.0 / 3.0)  # not exact in float16
    got = fp8_dequantize_f16(w, s)
    want = w.to(torch.float16) * s.to(torch.float16)
    assert got.dtype == torch.float16 and torch.equal(got, want)
    assert got[0].item() == float(torch.tensor(1 / 3).to(torch.float16))
    assert torch.finfo(torch.float8_e4m3fn).max == E4M3_MAX


@pytest.mark.parametrize(
    "quant,scheme",
    [
        ("mxfp8", "mxfp8"),
        ("mxfp8-ct", "mxfp8"),
        ("fp8-tensor", "fp8-tensor"),
        ("fp8-tensor-ct", "fp8-tensor"),
    ],
)
def test_auto_detects_quantized_schemes(tmp_path, quant, scheme):
    src = write_checkpoint(tmp_path / "m", Spec("qwen3-moe", layers=1, experts=2, quant=quant))
    # (compressed-tensors MXFP8: vLLM's plugin does not set up its method yet, see
    # servers/vllm/target.py SOURCES_NOT_YET; the scheme is detected all the same)
    plan = make_plan(src, Options(allow_unservable=True))
    assert plan.detected and plan.scheme.value == scheme


def test_mxfp8_refuses_block_fp8_source_and_cutlass(tmp_path):
    ds = write_checkpoint(tmp_path / "ds", Spec("deepseek-v3", layers=2, experts=4))
    with pytest.raises(SchemeMismatchError, match="lossy.*fp8-block"):
        make_plan(ds, Options(SchemeName.MXFP8))
    bf = write_checkpoint(tmp_path / "bf", Spec("qwen3-moe", layers=1, experts=2))
    why = "--backend cutlass: vLLM 0.33 has no FlashInfer CUTLASS MXFP8 path; use --backend "
    with pytest.raises(SchemeMismatchError, match=why + "trtllm"):
        make_plan(bf, Options(SchemeName.MXFP8, backend="cutlass"))


def test_fp8_tensor_refuses_block_fp8_source(tmp_path):
    ds = write_checkpoint(tmp_path / "ds", Spec("deepseek-v3", layers=2, experts=4))
    with pytest.raises(SchemeMismatchError, match="use --scheme fp8-block"):
        make_plan(ds, Options(SchemeName.FP8_TENSOR))


def test_bf16_to_fp8_tensor_all_zero_expert(tmp_path):
    """An all-zero expert gets the smallest normal float32 as its scale (vLLM would divide by
    0 and write NaN weights) and zero weights."""
    import json

    from safetensors.torch import load_file, save_file

    from fi_convert import convert, load_moe_layer

    src = write_checkpoint(tmp_path / "m", Spec("qwen3-moe", layers=1, experts=2, shards=1))
    shard = next(src.glob("*.safetensors"))
    t = load_file(shard)
    for p in ("gate_proj", "up_proj", "down_proj"):
        t[f"model.layers.0.mlp.experts.1.{p}.weight"].zero_()
    save_file(t, shard, metadata={"format": "pt"})
    opts = Options(SchemeName.FP8_TENSOR, allow_unservable=True)  # vLLM cannot serve it
    convert(src, tmp_path / "o", opts, device="cpu")
    got = load_moe_layer(tmp_path / "o", "model.layers.0.mlp.experts")
    assert got["w13_weight_scale"][1].item() == 2.0**-126
    assert got["w13_weight"][1].float().abs().sum() == 0
    m = json.loads((tmp_path / "o" / "fi-convert-manifest.json").read_text())
    assert m["layers"]["model.layers.0.mlp.experts"]["activation_scheme"] == "dynamic"


@pytest.mark.parametrize(
    "family,quant,scheme",
    [
        ("deepseek-v3", "nvfp4", "nvfp4"),
        ("qwen3-moe", "nvfp4-ct", "nvfp4"),
        ("gpt-oss", None, "mxfp4"),
    ],
)
def test_auto_detects_fp4_schemes(tmp_path, family, quant, scheme):
    src = write_checkpoint(tmp_path / "m", Spec(family, layers=2, experts=4, quant=quant))
    # (compressed-tensors NVFP4: not servable by vLLM's plugin yet, detected all the same)
    assert make_plan(src, Options(allow_unservable=True)).scheme.value == scheme


def _rewrite(src, drop=(), change=None):
    """Rewrite a checkpoint's shards without some tensors / with some replaced; fix the index."""
    import json

    from safetensors.torch import load_file, save_file

    index = src / "model.safetensors.index.json"
    wm = json.loads(index.read_text())
    for shard in src.glob("*.safetensors"):
        t = load_file(shard)
        for name in drop:
            t.pop(name, None)
            wm["weight_map"].pop(name, None)
        for name, value in (change or {}).items():
            if name in t:
                t[name] = value
        save_file(t, shard, metadata={"format": "pt"})
    index.write_text(json.dumps(wm))


def test_nvfp4_missing_global_scale_is_named(tmp_path):
    from fi_convert import SourceError

    src = write_checkpoint(tmp_path / "m", Spec("deepseek-v3", layers=2, experts=4, quant="nvfp4"))
    gone = "model.layers.1.mlp.experts.2.up_proj.weight_scale_2"
    _rewrite(src, drop=[gone])
    with pytest.raises(SourceError, match=r"experts\.2\.up_proj\.weight: no .*weight_scale_2"):
        make_plan(src, Options())


def test_nvfp4_scales_of_wrong_shape(tmp_path):
    from fi_convert import SourceError

    src = write_checkpoint(tmp_path / "m", Spec("deepseek-v3", layers=2, experts=4, quant="nvfp4"))
    name = "model.layers.1.mlp.experts.1.down_proj.weight_scale"
    bad = torch.zeros(256, 3, dtype=torch.float8_e4m3fn)
    _rewrite(src, change={name: bad})
    with pytest.raises(SourceError, match=rf"{name}: shape \[256, 3\], expected \[256, 16\]"):
        make_plan(src, Options())


def test_mxfp4_scales_of_wrong_shape(tmp_path):
    from fi_convert import SourceError

    src = write_checkpoint(tmp_path / "m", Spec("gpt-oss", layers=1, experts=2, hidden=128))
    name = "model.layers.0.mlp.experts.gate_up_proj_scales"
    _rewrite(src, change={name: torch.zeros(2, 512, 3, dtype=torch.uint8)})
    with pytest.raises(SourceError, match=rf"{name}: U8 \[2, 512, 3\], expected U8 \[2, 512, 4\]"):
        make_plan(src, Options())


def test_fp4_schemes_refuse_other_formats(tmp_path):
    bf = write_checkpoint(tmp_path / "bf", Spec("qwen3-moe", layers=1, experts=2))
    with pytest.raises(SchemeMismatchError, match="mxfp4 reads gpt-oss experts"):
        make_plan(bf, Options(SchemeName.MXFP4))
    go = write_checkpoint(tmp_path / "go", Spec("gpt-oss", layers=1, experts=2, hidden=128))
    with pytest.raises(SchemeMismatchError, match="--scheme mxfp4"):
        make_plan(go, Options(SchemeName.NVFP4))
    with pytest.raises(SchemeMismatchError, match="--scheme mxfp4"):
        make_plan(go, Options(SchemeName.BF16))


@pytest.mark.parametrize(
    "quant,name,bad,match",
    [
        (
            "fp8-block",
            "down_proj.weight_scale_inv",
            torch.float16,
            "dtype F16, this scheme needs F32",
        ),
        ("mxfp8", "up_proj.weight_scale", torch.float32, "UE8M0"),
        ("fp8-tensor", "gate_proj.weight_scale", torch.float16, "one float32"),
        ("nvfp4", "up_proj.weight_scale", torch.uint8, "NVFP4 block scales are E4M3"),
    ],
)
def test_scales_of_the_wrong_dtype_are_named(tmp_path, quant, name, bad, match):
    import json

    from safetensors import safe_open

    from fi_convert import FiConvertError

    fam = "deepseek-v3" if quant in ("fp8-block", "nvfp4") else "qwen3-moe"
    src = write_checkpoint(tmp_path / "m", Spec(fam, layers=2, experts=4, quant=quant))
    full = f"model.layers.1.mlp.experts.2.{name}"
    index = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
    shard = src / index[full]
    with safe_open(shard, "pt") as f:
        t = f.get_tensor(full)
    _rewrite(src, change={full: t.to(bad) if bad.is_floating_point else t.view(bad)})
    with pytest.raises(FiConvertError, match=match) as e:
        make_plan(src, Options())
    assert full in str(e.value)


@pytest.mark.parametrize("scale_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("scheme", ["auto", "fp8-tensor", "fp8-block", "mxfp8", "bf16"])
def test_compressed_tensors_block_fp8_is_refused_in_one_line_by_every_scheme(
    tmp_path_factory, scheme, scale_dtype
):
    """Laguna-XS.2-FP8's form (tests/quantized_checkpoints.py PUBLISHED: compressed-tensors FP8
    with the block strategy on the experts, a weight_scale per 128x128 block): no scheme reads
    it. At sizes of one block per weight its F32 scale looks like one per tensor, which
    fp8-tensor once read as such; config.json's strategy tells, and every scheme refuses it in
    one line naming the scale."""
    import torch

    from tests import quantized_checkpoints as qc

    from .conftest import cli
    from .test_errors import error_line

    root = tmp_path_factory.mktemp("ct-block")
    src = qc.write_published("laguna", root / "src", "fp8-block-ct", getattr(torch, scale_dtype))
    res = cli("convert", src, root / "out", "--scheme", scheme)
    line = error_line(res)
    assert "weight_scale: FP8 experts with a weight_scale per 128x128 block" in line
    assert "no scheme of fi-convert reads yet" in line and not (root / "out").exists()
