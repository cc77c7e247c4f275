"""fi_convert/forms.py and the families of the forms it adds, on checkpoints transformers
writes (tests/family_forms_models.py): Llama-4 and Qwen3-VL-MoE as published (fused experts
stored transposed, [E, H, 2I] / [E, I, H]) convert at TP 1 and 2 and verify against
FlashInfer's own pipeline, and every expert tensor is read under its form's one reading,
against config.json's sizes: a tensor that fits no form is refused in one line naming what was
expected and what was found, never read under another reading."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from . import family_forms_models as ffm
from .conftest import cli
from .test_transformers_ckpts import the_error

MANIFEST = "fi-convert-manifest.json"
FAMILY = {
    "llama4": "llama4",
    "qwen3_vl_moe": "qwen3-vl-moe",
    "granitemoe": "granite-moe",
    "step3": "step3",
}
CASES = [(k, s, tp) for k in FAMILY for s in ("bf16", "mxfp8") for tp in (1, 2)]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """Each family's checkpoint as published, written once per module (on first use)."""
    base = tmp_path_factory.mktemp("family-forms")
    made: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in made:
            save = ffm.save_step3 if kind == "step3" else lambda root: ffm.save(kind, root)
            made[kind] = save(base / kind)
        return made[kind]

    return get


def _edit_config(src: Path, dst: Path, edit) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    edit(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize(
    ("kind", "scheme", "tp"), CASES, ids=[f"{k}-{s}-tp{t}" for k, s, t in CASES]
)
def test_published_checkpoint_converts_and_verifies_against_flashinfer(
    ckpt, tmp_path, kind, scheme, tp
):
    src, out = ckpt(kind), tmp_path / "out"
    res = cli("convert", src, out, "--scheme", scheme, "--tp-size", tp, "-q", "--json")
    assert res.exit_code == 0, res.output
    m = json.loads((out / MANIFEST).read_text())
    assert m["source"]["family"] == FAMILY[kind]
    # Llama-4: MoE every interleave_moe_layer_step (2) layers; Qwen3-VL-MoE: every layer
    assert len(m["layers"]) == {"llama4": 1, "qwen3_vl_moe": 2, "granitemoe": 2, "step3": 1}[kind]
    layer = m["layers"][ffm.spec(kind)["moe"]]
    assert (layer["num_experts"], layer["hidden_size"], layer["intermediate_size"]) == (4, 64, 128)
    res = cli("verify", out, "--source", src, "--full", "--against-flashinfer", "--json")
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["ok"] is True, report
    expected = tp * sum(len(x["tensors"]) for x in m["layers"].values())
    assert report["checked"]["tensors_vs_flashinfer"] == expected, report


@pytest.mark.parametrize("scheme", ["bf16", "fp8-tensor"])
def test_mixtral_named_gate_up_down_converts_and_verifies(tmp_path, scheme):
    """Mixtral's experts named gate_proj/up_proj/down_proj (W8A8 exports) read as w1/w3/w2."""
    src, out = ffm.save_mixtral_named(tmp_path / "src", scheme), tmp_path / "out"
    res = cli("convert", src, out, "--scheme", scheme, "--tp-size", 2, "-q")
    assert res.exit_code == 0, res.output
    assert json.loads((out / MANIFEST).read_text())["source"]["family"] == "mixtral"
    res = cli("verify", out, "--source", src, "--full", "--against-flashinfer", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["checked"]["tensors_vs_flashinfer"] > 0


def test_the_source_is_read_transposed(ckpt):
    """The converter's reading of one expert equals the tensor turned, for gate, up and down
    (independently of the layouts: the matrices as vLLM's FusedMoE holds them)."""
    import torch
    from safetensors import safe_open

    from fi_convert.source import find_family, open_checkpoint
    from fi_convert.st_io import SourceFiles

    src = ckpt("llama4")
    c = open_checkpoint(src)
    fam, layers = find_family(c)
    (layer,) = layers
    assert fam is not None and fam.name == "llama4" and layer.form.transposed == ("w13", "w2")
    prefix = layer.prefix
    index = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]

    def get(name):
        with safe_open(src / index[f"{prefix}.{name}"], "pt") as f:
            return f.get_tensor(f"{prefix}.{name}")

    gate_up, down = get("gate_up_proj"), get("down_proj")
    files = SourceFiles()
    try:
        for role, rows, cols, want in (
            ("w1", (8, 40), None, gate_up[1].T[8:40]),
            ("w3", (0, 24), None, gate_up[1].T[128 : 128 + 24]),
            ("w2", (0, 64), (100, 124), down[1].T[:, 100:124]),
        ):
            dst = torch.zeros(
                (1, rows[1] - rows[0], 64 if cols is None else 24), dtype=torch.bfloat16
            )
            layer.read(files, role, "weight", range(1, 2), rows, cols, dst)
            assert torch.equal(dst[0], want), role
    finally:
        files.close()


# ------------------------------------------------------------- one reading, checked


def test_transformers_orientation_where_h_equals_2i_is_refused_as_transposed(tmp_path):
    """transformers 5.20 writes Qwen3-VL-MoE's fused experts [E, 2I, H] / [E, H, I], which
    vLLM's and SGLang's loaders would turn. With H == 2I its gate_up_proj fits the published
    [E, H, 2I] as well: down_proj tells, and the checkpoint is refused, not misread."""
    src = ffm.save("qwen3_vl_moe", tmp_path / "model", published=False, moe_intermediate_size=32)
    line = the_error(cli("convert", src, tmp_path / "out"))
    assert line == (
        "error: model.language_model.layers.0.mlp.experts.down_proj: shape [4, 64, 32], "
        "expected [4, 32, 64] ([E, I, H] with E=4, H=64, I=32 from config.json); transposed? "
        "it is stored [E, H, I], which is not how Qwen3-VL-MoE checkpoints store it - check "
        "config.json's model_type and architectures, or export the experts as Qwen3-VL-MoE does"
    )
    assert not (tmp_path / "out").exists()


def test_the_published_form_under_a_family_that_reads_it_unturned_is_refused(ckpt, tmp_path):
    """Qwen3-MoE's fused form is transformers' [E, 2I, H]: the published Qwen3-VL-MoE
    tensors, declared Qwen3-MoE, are refused as transposed."""

    def edit(cfg):
        cfg.update(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"])

    model = _edit_config(ckpt("qwen3_vl_moe"), tmp_path / "model", edit)
    line = the_error(cli("inspect", model))
    assert line.startswith(
        "error: model.language_model.layers.0.mlp.experts.down_proj: shape [4, 128, 64], "
        "expected [4, 64, 128] ([E, H, I] with E=4, H=64, I=128 from config.json); transposed? "
        "it is stored [E, I, H], which is not how Qwen3-MoE checkpoints store it"
    )


def test_a_size_config_json_contradicts_is_refused(ckpt, tmp_path):
    def edit(cfg):
        cfg["text_config"]["intermediate_size"] = 40

    model = _edit_config(ckpt("llama4"), tmp_path / "model", edit)
    line = the_error(cli("convert", model, tmp_path / "out"))
    assert line == (
        "error: language_model.model.layers.1.feed_forward.experts.down_proj: shape [4, 128, 64], "
        "expected [4, 40, 64] ([E, I, H] with E=4, H=64, I=40 from config.json); the checkpoint "
        "and config.json disagree - download both again"
    )
    assert not (tmp_path / "out").exists()


def test_an_expert_count_config_json_contradicts_is_refused(ckpt, tmp_path):
    def edit(cfg):
        cfg["text_config"]["num_local_experts"] = 8

    model = _edit_config(ckpt("llama4"), tmp_path / "model", edit)
    line = the_error(cli("inspect", model))
    assert line == (
        f"error: {model}: language_model.model.layers.1.feed_forward.experts: 4 experts in the "
        "shards but config.json says 8; the checkpoint and its config disagree - download both "
        "again"
    )


def test_without_sizes_in_config_json_the_tensor_gives_them(ckpt, tmp_path):
    """A config.json without the experts' sizes: H and I are read off gate_up_proj under its
    form (transposed), and down_proj is checked against them."""

    def edit(cfg):
        del cfg["text_config"]["intermediate_size"]

    model = _edit_config(ckpt("llama4"), tmp_path / "model", edit)
    res = cli("inspect", model, "--json")
    assert res.exit_code == 0, res.output
    layer = json.loads(res.stdout)["layers"][ffm.MODELS["llama4"]["moe"]]
    assert (layer["hidden_size"], layer["intermediate_size"]) == (64, 128)
