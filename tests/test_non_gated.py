"""Non-gated experts (Nemotron-H, relu2_no_mul: w13 the up projection alone), outside the
servers' own code: the family schema's rule, the w13 row index against FlashInfer's own
permutation (pure PyTorch), the manifest's entry, verify, and what is refused, each a line.

The bytes against vLLM's own processing: tests/test_vllm.py (its FusedMoE layers),
tests/test_vllm_families.py (NemotronHForCausalLM), tests/test_vllm_release_proof.py.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch

from fi_convert import Backend, Options, SchemeName, convert
from fi_convert.families import FAMILY_DIR, check_family
from fi_convert.format import manifest as mf
from fi_convert.schemes.base import w13_index
from fi_convert.testing.synthetic import Spec, write_checkpoint
from tests.conftest import cli

SPEC = Spec("nemotron-h", layers=2, experts=3, hidden=128, intermediate=192, shards=2)
PREFIX = "backbone.layers.0.mixer.experts"


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("nemotron") / "src", SPEC)


@pytest.fixture(scope="module")
def fp8_src(tmp_path_factory):
    spec = Spec("nemotron-h", layers=1, experts=3, hidden=128, intermediate=200, quant="fp8-tensor")
    return write_checkpoint(tmp_path_factory.mktemp("nemotron-fp8") / "src", spec)


@pytest.fixture(scope="module")
def nvfp4_src(tmp_path_factory):
    spec = Spec("nemotron-h", layers=1, experts=3, hidden=256, intermediate=384, quant="nvfp4")
    return write_checkpoint(tmp_path_factory.mktemp("nemotron-nvfp4") / "src", spec)


def _family() -> dict:
    return json.loads((FAMILY_DIR / "nemotron_h.json").read_text())


def test_the_family_file_is_a_family():
    assert check_family(_family()) is None


def test_a_non_gated_form_needs_a_non_gated_activation_and_back():
    d = _family()
    d["activation"] = "silu"
    assert check_family(d) == (
        "forms[0].projections: maps to w1 and w2 only (a non-gated expert), but the "
        "activation silu is gated"
    )
    d = _family()
    d["forms"][0]["projections"] = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
    assert check_family(d).startswith("forms[0].projections: has a gate, but the activation")


def test_a_form_without_a_down_projection_is_refused():
    d = copy.deepcopy(_family())
    d["forms"][0]["projections"] = {"up_proj": "w1"}
    assert check_family(d).startswith("forms[0].projections: maps to ['w1'], not w1, w3, w2")


@pytest.mark.parametrize(("n", "padded"), [(128, 128), (96, 128), (192, 256), (48, 128)])
def test_the_trtllm_w13_index_is_flashinfers_non_gated_permutation(n, padded):
    """FlashInfer's own row permutation of a non-gated w13 (`_maybe_get_cached_w3_w1_permute_
    indices(..., is_gated_act_gemm=False)`, which vLLM 0.33's BF16 TRT-LLM conversion calls):
    the row shuffle alone, after padding to `padded` rows (the staged zero row at n)."""
    from flashinfer.fused_moe.core import _maybe_get_cached_w3_w1_permute_indices

    theirs = _maybe_get_cached_w3_w1_permute_indices(
        {}, torch.empty(padded, 64), 128, is_gated_act_gemm=False
    )
    padded_rows = torch.where(torch.arange(padded) < n, torch.arange(padded), n)
    assert torch.equal(w13_index(False, n, padded, interleave=True, tile=128), padded_rows[theirs])


def test_a_non_gated_w13_is_neither_swapped_nor_interleaved():
    assert torch.equal(w13_index(False, 64, 64, swap=True, interleave=True), torch.arange(64))
    gated = w13_index(True, 64, 64, swap=True)
    assert torch.equal(gated, torch.cat([torch.arange(64, 128), torch.arange(64)]))


@pytest.mark.parametrize(
    ("scheme", "backend", "w13", "i_p"),
    [
        ("bf16", "trtllm", [3, 2, 128, 64], 128),
        ("bf16", "cutlass", [3, 96, 128], 96),
        # I_r 192 -> 256 (128 per rank for non-gated experts)
        ("nvfp4", "trtllm", [3, 256, 128], 256),
        # w13's rows padded to the scale swizzle's 256; vLLM's MoE config keeps I_r 192
        ("nvfp4", "cutlass", [3, 256, 128], 192),
    ],
)
def test_the_manifest_says_non_gated_and_verify_passes(
    src, nvfp4_src, tmp_path, scheme, backend, w13, i_p
):
    out = tmp_path / "out"
    src = nvfp4_src if scheme == "nvfp4" else src
    convert(src, out, Options(SchemeName(scheme), Backend(backend), 2), device="cpu")
    m = mf.read(out)
    lay = m["layers"][PREFIX]
    assert lay["padded_intermediate_size_per_rank"] == i_p
    assert lay["gated"] is False
    t = lay["tensors"]["w13_weight"]
    assert (t["row_order"], t["gated_interleave"], t["shape_per_rank"]) == ("up", False, w13)
    assert m["source"]["activation"] == "relu2_no_mul"
    # every release ran non-gated experts in these schemes (make test-release) and holds them
    assert m["target"]["vllm_releases"] == ["0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0"]
    res = cli("verify", out, "--source", src)
    assert res.exit_code == 0, res.stderr
    res = cli("verify", out, "--source", src, "--against-flashinfer")
    assert res.exit_code == 1
    assert res.stderr.count("\n") == 1 and "holds non-gated experts" in res.stderr


def test_a_manifest_entry_claiming_gated_experts_is_not_what_fi_convert_writes(src, tmp_path):
    out = tmp_path / "out"
    convert(src, out, Options(SchemeName.BF16, Backend.TRTLLM, 1), device="cpu")
    path = out / "fi-convert-manifest.json"
    m = json.loads(path.read_text())
    m["layers"][PREFIX]["tensors"]["w13_weight"]["row_order"] = "up_gate"
    path.write_text(json.dumps(m))
    res = cli("verify", out)
    assert res.exit_code == 1 and "row_order" in res.stderr


def test_fp8_tensor_pads_a_non_gated_w13_to_128_on_cutlass_too(fp8_src, tmp_path):
    """vLLM 0.33 pads non-gated FP8 per-tensor experts to 128 (16 for gated ones), on both
    backends (prepare_fp8_moe_layer_for_fi)."""
    out = tmp_path / "out"
    convert(fp8_src, out, Options(SchemeName.FP8_TENSOR, Backend.CUTLASS, 1), device="cpu")
    lay = mf.read(out)["layers"][PREFIX]
    assert lay["padded_intermediate_size_per_rank"] == 256
    assert lay["tensors"]["w13_weight"]["shape_per_rank"] == [3, 256, 128]


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (  # (fi-convert's mxfp4 reads gpt-oss's fused MXFP4 experts only)
            ["--scheme", "mxfp4", "--backend", "cutlass"],
            "fi-convert writes no mxfp4 layout of non-gated (relu2_no_mul) experts yet; "
            "convert with --scheme bf16 or fp8-block or fp8-tensor or mxfp8 or nvfp4",
        ),
        (
            ["--scheme", "mxfp4"],
            "vLLM 0.33's FlashInfer TRT-LLM mxfp4 experts take no relu2_no_mul activation",
        ),
    ],
)
def test_what_is_not_written_for_non_gated_experts_is_one_line(src, tmp_path, args, why):
    res = cli("convert", src, tmp_path / "out", *args)
    assert res.exit_code == 1
    assert res.stderr.count("\n") == 1 and why in res.stderr, res.stderr
    assert not (tmp_path / "out" / "fi-convert-manifest.json").exists()
