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
from . import hf_checkpoints as hf
from .conftest import cli
from .test_transformers_ckpts import the_error

MANIFEST = "fi-convert-manifest.json"
FAMILY = {
    "llama4": "llama4",
    "qwen3_vl_moe": "qwen3-vl-moe",
    "granitemoe": "granite-moe",
    "step3": "step3",
    "dbrx": "dbrx",
    "aria": "aria",
}
# each kind's (experts, H, I) as its checkpoint has them
SIZES = {"dbrx": (4, 64, 256)}
CASES = [(k, s, tp) for k in FAMILY for s in ("bf16", "mxfp8") for tp in (1, 2)]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """Each family's checkpoint as published, written once per module (on first use)."""
    base = tmp_path_factory.mktemp("family-forms")
    made: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in made:
            if kind == "dbrx":
                made[kind] = hf.save("dbrx", base / kind)
            else:
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
    layers = {"llama4": 1, "qwen3_vl_moe": 2, "granitemoe": 2, "step3": 1, "dbrx": 2, "aria": 2}
    assert len(m["layers"]) == layers[kind]
    layer = m["layers"][ffm.spec(kind)["moe"]]
    sizes = (layer["num_experts"], layer["hidden_size"], layer["intermediate_size"])
    assert sizes == SIZES.get(kind, (4, 64, 128))
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


# ------------------------------------------------------------- the flat form (DBRX)


def _tensor(src: Path, name: str):
    from safetensors import safe_open

    index = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
    with safe_open(src / index[name], "pt") as f:
        return f.get_tensor(name)


def test_the_flat_form_is_read_one_expert_at_a_time(ckpt):
    """DBRX's [E*I, H] w1 and v1 are read as rows [e*I, (e+1)*I), its w2 (each expert's [I, H]
    stored turned) as those rows turned: gate, up and down of expert 2 as the tensors hold them."""
    import torch

    from fi_convert.source import find_family, open_checkpoint
    from fi_convert.st_io import SourceFiles

    src = ckpt("dbrx")
    fam, layers = find_family(open_checkpoint(src))
    assert fam is not None and fam.name == "dbrx"
    layer = layers[1]
    assert (layer.form.kind, layer.form.transposed) == ("flat", ("w2",))
    assert layer.proj_shape("w1", "weight") == (256, 64)
    assert layer.proj_shape("w2", "weight") == (64, 256)
    w1, v1, w2 = (_tensor(src, f"{layer.prefix}.mlp.{n}") for n in ("w1", "v1", "w2"))
    e, i = 2, 256
    files = SourceFiles()
    try:
        for role, rows, cols, want in (
            ("w1", (8, 40), None, w1[e * i + 8 : e * i + 40]),
            ("w3", (0, 24), None, v1[e * i : e * i + 24]),
            ("w2", (0, 64), (100, 124), w2[e * i : (e + 1) * i].T[:, 100:124]),
        ):
            width = 64 if cols is None else cols[1] - cols[0]
            dst = torch.zeros((1, rows[1] - rows[0], width), dtype=torch.bfloat16)
            layer.read(files, role, "weight", range(e, e + 1), rows, cols, dst)
            assert torch.equal(dst[0], want), role
    finally:
        files.close()


def _rewrite(src: Path, dst: Path, name: str, turn) -> Path:
    """A copy of `src` with tensor `name` replaced by `turn(tensor)`."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    shard = json.loads((dst / "model.safetensors.index.json").read_text())["weight_map"][name]
    tensors = load_file(dst / shard)
    tensors[name] = turn(tensors[name]).contiguous()
    save_file(tensors, dst / shard, metadata={"format": "pt"})
    return dst


def test_a_flat_w2_stored_unturned_is_refused_as_transposed(ckpt, tmp_path):
    """DBRX's w2 holds each expert's down projection [I, H] (turned): one stored [H, I] per
    expert ([E*H, I]) is refused in one line, not read under the other reading."""
    name = "transformer.blocks.0.ffn.experts.mlp.w2"
    model = _rewrite(
        ckpt("dbrx"),
        tmp_path / "model",
        name,
        lambda t: t.reshape(4, 256, 64).transpose(1, 2).reshape(4 * 64, 256),
    )
    line = the_error(cli("convert", model, tmp_path / "out"))
    assert line == (
        f"error: {name}: shape [256, 256], expected [1024, 64] ([E*I, H] with E=4, H=64, I=256 "
        "from config.json); transposed? it is stored [E*H, I], which is not how DBRX "
        "checkpoints store it - check config.json's model_type and architectures, or export "
        "the experts as DBRX does"
    )
    assert not (tmp_path / "out").exists()


def test_a_flat_tensor_of_another_size_is_refused(ckpt, tmp_path):
    """A flat w1 whose rows are not E experts of config.json's I: one line naming both."""
    name = "transformer.blocks.1.ffn.experts.mlp.v1"
    model = _rewrite(ckpt("dbrx"), tmp_path / "model", name, lambda t: t[:-64])
    line = the_error(cli("inspect", model))
    assert line == (
        f"error: {name}: shape [960, 64], expected [1024, 64] ([E*I, H] with E=4, H=64, "
        "I=256 from config.json); the checkpoint and config.json disagree - download both again"
    )


def test_a_flat_form_without_an_expert_count_in_config_json_is_refused(ckpt, tmp_path):
    """A flat tensor does not say how many experts it holds: without config.json's count it
    is refused, not guessed."""

    def edit(cfg):
        del cfg["ffn_config"]["moe_num_experts"]

    model = _edit_config(ckpt("dbrx"), tmp_path / "model", edit)
    line = the_error(cli("inspect", model))
    assert line == (
        "error: transformer.blocks.0.ffn.experts.mlp.w1: DBRX stores the experts one after "
        "another in one tensor, and config.json gives no expert count "
        "(ffn_config.moe_num_experts); restore the model's config.json"
    )


def test_arias_fc1_is_read_gate_first(ckpt):
    """Aria's fc1 [E, H, 2I]: transformers' Aria chunks x @ fc1[e] into (gate, up), vLLM's
    loader takes its first I columns as w1: fi-convert reads w1 (gate) from columns [0, I),
    w3 (up) from [I, 2I), and w2 from fc2 [E, I, H] turned."""
    import torch

    from fi_convert.source import find_family, open_checkpoint
    from fi_convert.st_io import SourceFiles

    src = ckpt("aria")
    fam, layers = find_family(open_checkpoint(src))
    assert fam is not None and fam.name == "aria"
    layer = layers[1]
    fc1, fc2 = (_tensor(src, f"{layer.prefix}.{n}.weight") for n in ("fc1", "fc2"))
    e, i = 3, 128
    files = SourceFiles()
    try:
        for role, want in (
            ("w1", fc1[e].T[:i]),
            ("w3", fc1[e].T[i:]),
            ("w2", fc2[e].T),
        ):
            dst = torch.zeros((1, *want.shape), dtype=torch.bfloat16)
            layer.read(files, role, "weight", range(e, e + 1), (0, want.shape[0]), None, dst)
            assert torch.equal(dst[0], want), role
    finally:
        files.close()


@pytest.mark.parametrize(("scheme", "backend"), [("bf16", "cutlass"), ("mxfp8", "trtllm")])
def test_jamba_converts_and_verifies_against_flashinfer(tmp_path, scheme, backend):
    """Jamba's feed_forward.experts.E.*_proj (transformers' JambaForCausalLM, Mamba layers
    beside them), on the backends vLLM runs its Default routing on."""
    src, out = hf.save("jamba", tmp_path / "src"), tmp_path / "out"
    res = cli("convert", src, out, "--scheme", scheme, "--backend", backend, "--tp-size", 2, "-q")
    assert res.exit_code == 0, res.output
    m = json.loads((out / MANIFEST).read_text())
    assert m["source"]["family"] == "jamba" and list(m["layers"]) == [
        "model.layers.1.feed_forward.experts"
    ]
    res = cli("verify", out, "--source", src, "--full", "--against-flashinfer", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["checked"]["tensors_vs_flashinfer"] > 0


# ------------------------------------------------- expert sets (ERNIE-4.5-VL's text and vision)


@pytest.mark.parametrize(("scheme", "backend"), [("bf16", "cutlass"), ("mxfp8", "trtllm")])
def test_ernie_vl_converts_both_expert_sets_and_verifies(tmp_path, scheme, backend):
    """ERNIE-4.5-VL's layer of 2N experts is two MoE layers, text_experts (the first N, I
    moe_intermediate_size[0]) and vision_experts (the next N, I [1]); both converted, TP 2,
    and checked against FlashInfer's pipeline on the source's experts E and N + E."""
    src, out = ffm.save_ernie45_vl(tmp_path / "src"), tmp_path / "out"
    res = cli("convert", src, out, "--scheme", scheme, "--backend", backend, "--tp-size", 2, "-q")
    assert res.exit_code == 0, res.output
    m = json.loads((out / MANIFEST).read_text())
    assert m["source"]["family"] == "ernie4.5-vl-moe"
    sizes = {
        p: (x["num_experts"], x["hidden_size"], x["intermediate_size"])
        for p, x in m["layers"].items()
    }
    assert sizes == {
        "model.layers.1.mlp.text_experts": (4, 64, 128),
        "model.layers.1.mlp.vision_experts": (4, 64, 64),
    }
    res = cli("verify", out, "--source", src, "--full", "--against-flashinfer", "--json")
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["ok"] is True, report
    assert report["checked"]["tensors_vs_flashinfer"] == 2 * sum(
        len(x["tensors"]) for x in m["layers"].values()
    )


def test_the_vision_set_is_read_from_the_experts_after_the_text_ones(tmp_path):
    """vision_experts' expert e is the checkpoint's mlp.experts.(N + e)."""
    import torch

    from fi_convert.source import find_family, open_checkpoint
    from fi_convert.st_io import SourceFiles

    src = ffm.save_ernie45_vl(tmp_path / "src")
    _, layers = find_family(open_checkpoint(src))
    vision = next(x for x in layers if x.prefix.endswith(".vision_experts"))
    want = _tensor(src, "model.layers.1.mlp.experts.5.up_proj.weight")  # N = 4: vision's 1
    dst = torch.zeros((1, *want.shape), dtype=torch.bfloat16)
    files = SourceFiles()
    try:
        vision.read(files, "w3", "weight", range(1, 2), (0, want.shape[0]), None, dst)
    finally:
        files.close()
    assert torch.equal(dst[0], want)


def test_expert_sets_without_counts_in_config_json_are_refused(tmp_path):
    src = ffm.save_ernie45_vl(tmp_path / "src")

    def edit(cfg):
        del cfg["moe_num_experts"]

    model = _edit_config(src, tmp_path / "model", edit)
    assert the_error(cli("inspect", model)) == (
        "error: model.layers.1.mlp.experts.0.gate_proj.weight: ERNIE-4.5-VL's experts are 2 "
        "sets one after another, and config.json gives no expert count per set "
        "(moe_num_experts); restore the model's config.json"
    )


def test_an_expert_set_config_json_sizes_otherwise_is_refused(tmp_path):
    """config.json's vision intermediate size (the set's entry of moe_intermediate_size)
    against the vision experts' tensors: one line."""
    src = ffm.save_ernie45_vl(tmp_path / "src")

    def edit(cfg):
        cfg["moe_intermediate_size"] = [128, 96]

    model = _edit_config(src, tmp_path / "model", edit)
    line = the_error(cli("inspect", model))
    assert line.startswith("error: model.layers.1.mlp.experts.4.")
    assert "expected" in line and "I=96 from config.json" in line


def test_an_expert_set_size_of_the_wrong_kind_is_one_line(tmp_path):
    src = ffm.save_ernie45_vl(tmp_path / "src")

    def edit(cfg):
        cfg["moe_intermediate_size"] = [128, "64"]

    model = _edit_config(src, tmp_path / "model", edit)
    line = the_error(cli("inspect", model))
    assert 'moe_intermediate_size is [128, "64"], not an integer or list of integers' in line


def test_a_mistral_format_checkpoint_converts_inspects_and_verifies(tmp_path):
    """Mistral Large 3 as published, in Mistral's own format (tests/mistral_checkpoints.py:
    params.json, consolidated shards, layers.L.experts.E.w1): inspected as Mistral Large 3,
    converted, and verified against its source; the output keeps params.json, its
    quantization marked (stock vLLM refuses it), and not the consolidated index, whose
    shards it has not."""
    from . import mistral_checkpoints as mistral

    src = mistral.write(tmp_path / "src")
    out = tmp_path / "out"
    res = cli("inspect", src)
    assert res.exit_code == 0, res.output
    assert "mistral-large-3" in res.stdout or "Mistral Large 3" in res.stdout
    res = cli("convert", src, out, "--scheme", "bf16", "--tp-size", "2")
    assert res.exit_code == 0, res.output
    params = json.loads((out / "params.json").read_text())
    assert params["quantization"]["quant_method"] == "fi-convert"
    assert params["quantization"]["source_quantization_config"] is None
    assert not (out / "config.json").exists()
    assert not (out / "consolidated.safetensors.index.json").exists()
    assert (out / "tekken.json").read_bytes() == (src / "tekken.json").read_bytes()
    res = cli("verify", out, "--source", src)
    assert res.exit_code == 0, res.output


def test_a_mistral_format_fp8_checkpoint_is_fp8_tensor_which_no_plugin_loads_yet(tmp_path):
    """Mistral's FP8 format (quantization.qformat_weight fp8_e4m3, per-tensor qscale_weight
    and qscale_act) is read as fp8-tensor, vLLM's `fp8` method: vLLM builds its Fp8MoEMethod
    for such experts, which fi-convert's plugin does not set up yet, so `inspect` and convert
    refuse it in one line naming that (and SGLang refuses the family), writing nothing."""
    from . import mistral_checkpoints as mistral

    src = mistral.write(tmp_path / "src", "fp8")
    out = tmp_path / "out"
    for args in (("convert", src, out, "--scheme", "auto"), ("inspect", src)):
        line = the_error(cli(*args))
        assert line.startswith("error: --scheme fp8-tensor --backend trtllm: an FP8 (quant_meth")
        assert "Fp8MoEMethod" in line and "--allow-unservable converts it anyway" in line
    line = the_error(cli("convert", src, out, "--server", "sglang"))
    assert "Mistral Large 3" in line
    assert not out.exists()


def test_a_params_json_without_a_field_fi_convert_needs_is_refused_naming_it(tmp_path):
    from . import mistral_checkpoints as mistral

    src = mistral.write(tmp_path / "src")
    params = json.loads((src / "params.json").read_text())
    del params["moe"]["expert_hidden_dim"]
    (src / "params.json").write_text(json.dumps(params))
    line = the_error(cli("convert", src, tmp_path / "out"))
    assert line.startswith(f"error: {src / 'params.json'}: no 'moe.expert_hidden_dim' (the ")
    assert "restore the model's params.json" in line
    assert not (tmp_path / "out").exists()


def test_consolidated_shards_named_otherwise_are_refused_naming_a_tensor(tmp_path):
    """params.json says Mistral Large 3, but the consolidated shards' experts are named as
    an HF export names them: refused naming the first such tensor and Mistral's naming."""
    from safetensors.torch import load_file, save_file

    from . import mistral_checkpoints as mistral

    src = mistral.write(tmp_path / "src", shards=1)
    shard = src / "consolidated-00001-of-00001.safetensors"
    renamed = {
        n.replace(".experts.", ".mlp.experts.").replace(".w1.", ".gate_proj."): t
        for n, t in load_file(shard).items()
    }
    save_file(renamed, shard)
    index = json.loads((src / "consolidated.safetensors.index.json").read_text())
    index["weight_map"] = {n: shard.name for n in renamed}
    (src / "consolidated.safetensors.index.json").write_text(json.dumps(index))
    line = the_error(cli("convert", src, tmp_path / "out"))
    assert line.startswith("error: layers.1.mlp.experts.0.gate_proj.weight: ")
    assert "is Mistral Large 3's, whose experts are named" in line
    assert not (tmp_path / "out").exists()


def test_hunyuan_reads_its_experts_size_from_the_layers_entry(tmp_path):
    """Hunyuan-A13B's config.json gives moe_intermediate_size per decoder layer (a list, as
    published): each MoE layer's size is the entry of its own layer, so a list that gives
    layer 1 another size than its tensors (layer 0's agreeing) is one line naming layer 1's
    tensor."""
    src = hf.save("hunyuan_v1_moe", tmp_path / "src")
    inspected = cli("inspect", src, "--server", "sglang")
    assert inspected.exit_code == 0, inspected.output
    assert "Hunyuan-A13B" in inspected.output

    def edit(cfg):
        cfg["moe_intermediate_size"] = [96, 64]

    model = _edit_config(src, tmp_path / "model", edit)
    line = the_error(cli("convert", model, tmp_path / "out", "--server", "sglang"))
    assert line == (
        "error: model.layers.1.mlp.experts.0.down_proj.weight: shape [64, 96], expected "
        "[64, 64] ([H, I] with E=4, H=64, I=64 from config.json); the checkpoint and "
        "config.json disagree - download both again"
    )
    assert not (tmp_path / "out").exists()


def test_hunyuan_per_layer_size_of_the_wrong_kind_is_one_line(tmp_path):
    src = hf.save("hunyuan_v1_moe", tmp_path / "src")

    def edit(cfg):
        cfg["moe_intermediate_size"] = [96, "96"]

    model = _edit_config(src, tmp_path / "model", edit)
    line = the_error(cli("inspect", model, "--server", "sglang"))
    assert 'moe_intermediate_size is [96, "96"], not an integer or list of integers' in line


def test_hunyuan_for_vllm_on_trtllm_is_refused_at_plan_time_in_one_line(tmp_path):
    """vLLM 0.33 serves HunYuanMoEV1ForCausalLM through its generic Transformers backend,
    whose router for it is the model's own function (Custom routing): its monolithic TRT-LLM
    BF16 kernels take none, so a vLLM output on TRT-LLM is refused in one line, and CUTLASS's
    is written (tests/test_vllm_families.py proves it)."""
    src = hf.save("hunyuan_v1_moe", tmp_path / "src")
    line = the_error(cli("convert", src, tmp_path / "out", "--server", "vllm"))
    assert "generic Transformers backend" in line and "use --backend cutlass" in line
    assert not (tmp_path / "out").exists()
    args = ("--server", "vllm", "--backend", "cutlass", "--device", "cpu")
    res = cli("convert", src, tmp_path / "cutlass", *args)
    assert res.exit_code == 0, res.stdout + res.stderr


def test_a_puzzle_layers_own_size_is_checked_and_named(tmp_path):
    """Nemotron-H Puzzle's block_configs gives each layer its own expert count and size
    (families.Family.layer_configs): a layer's map that contradicts its tensors is one line
    naming the layer's tensor and the size read (layer 1's agreeing)."""
    from . import remote_code_checkpoints as rc

    src = rc.save_nemotron_h_puzzle(tmp_path / "src")

    def edit(cfg):
        cfg["block_configs"][2]["moe_intermediate_size"] = 96

    model = _edit_config(src, tmp_path / "model", edit)
    line = the_error(cli("convert", model, tmp_path / "out"))
    assert line == (
        "error: backbone.layers.2.mixer.experts.0.down_proj.weight: shape [64, 64], expected "
        "[64, 96] ([H, I] with E=3, H=64, I=96 from config.json); the checkpoint and "
        "config.json disagree - download both again"
    )
    assert not (tmp_path / "out").exists()


# ------------------------------------------------- the per-expert fused form (ZAYA1)


@pytest.fixture(scope="module")
def zaya(tmp_path_factory):
    """A tiny ZAYA1 checkpoint in the original layout SGLang's ZayaForCausalLM reads
    (tests/sglang_only_checkpoints.py): per expert, linear_fc1 [2I, H] ([gate; up]) and
    linear_fc2 [H, I], I = ffn_hidden_size / 2 = 128, H = 64, 4 experts."""
    from tests import sglang_only_checkpoints as so

    return so.save_zaya(tmp_path_factory.mktemp("zaya") / "src")


ZAYA_EXPERTS = "model.layers.1.zaya_block.experts"


def test_the_per_expert_fused_form_is_read_half_by_half(zaya):
    """ZAYA1's linear_fc1 is read as SGLang's load_weights splits it: its first I rows the
    gate (w1), the next I the up projection (w3); linear_fc2 is w2 as stored."""
    import torch

    from fi_convert.source import find_family, open_checkpoint
    from fi_convert.st_io import SourceFiles

    fam, layers = find_family(open_checkpoint(zaya))
    assert fam is not None and fam.name == "zaya"
    (layer,) = layers
    assert (layer.prefix, layer.form.kind, layer.num_experts) == (
        ZAYA_EXPERTS,
        "per_expert_fused",
        4,
    )
    assert (layer.hidden_size, layer.intermediate_size, layer.routing) == (64, 128, "Custom")
    assert layer.proj_shape("w1", "weight") == layer.proj_shape("w3", "weight") == (128, 64)
    assert layer.proj_shape("w2", "weight") == (64, 128)
    e, i = 2, 128
    fc1, fc2 = (
        _tensor(zaya, f"{ZAYA_EXPERTS}.local_experts.{e}.{n}.weight")
        for n in ("linear_fc1", "linear_fc2")
    )
    files = SourceFiles()
    try:
        for role, rows, cols, want in (
            ("w1", (8, 40), None, fc1[8:40]),
            ("w3", (0, 24), None, fc1[i : i + 24]),
            ("w3", (100, 128), (16, 48), fc1[i + 100 : 2 * i, 16:48]),
            ("w2", (0, 64), (100, 124), fc2[:, 100:124]),
        ):
            width = 64 if cols is None else cols[1] - cols[0]
            dst = torch.zeros((1, rows[1] - rows[0], width), dtype=torch.bfloat16)
            layer.read(files, role, "weight", range(e, e + 1), rows, cols, dst)
            assert torch.equal(dst[0], want), role
    finally:
        files.close()


def test_a_per_expert_fused_form_stored_turned_is_read_by_columns(tmp_path):
    """A per_expert_fused form whose roles are stored [in, out] (`transposed`: w13 [H, 2I],
    w2 [I, H]) reads the gate from columns [0, I), the up projection from [I, 2I), each turned;
    its shapes in letters are the turned ones."""
    import re

    import torch
    from safetensors.torch import save_file

    from fi_convert import forms
    from fi_convert.families import Form
    from fi_convert.source import read_span_into
    from fi_convert.st_io import SourceFiles, read_header

    h, i = 64, 48
    fc1 = torch.randn(h, 2 * i).to(torch.bfloat16)
    save_file({"fc1": fc1}, tmp_path / "m.safetensors")
    info = read_header(tmp_path / "m.safetensors")[0]["fc1"]
    form = Form(
        "per_expert_fused", re.compile(""), {"fc1": "w13", "fc2": "w2"}, None, ("w13", "w2")
    )
    assert forms.dims(form, "w3") == ("H", "2I") and forms.dims(form, "w2") == ("I", "H")
    files = SourceFiles()
    try:
        for role, rows, want in (("w1", (4, 20), fc1.T[4:20]), ("w3", (0, 48), fc1.T[i:])):
            s = forms.span(form, role, info, 3, rows, None)
            dst = torch.zeros((rows[1] - rows[0], h), dtype=torch.bfloat16)
            read_span_into(files, s, dst)
            assert torch.equal(dst, want), role
    finally:
        files.close()


def _zaya_sizes(src: Path) -> tuple[int, int, int]:
    res = cli("inspect", src, "--server", "sglang", "--json")
    assert res.exit_code == 0, res.output
    layer = json.loads(res.stdout)["layers"][ZAYA_EXPERTS]
    return layer["num_experts"], layer["hidden_size"], layer["intermediate_size"]


def test_zayas_intermediate_size_is_half_the_ffn_hidden_size(zaya, tmp_path):
    """The family reads I as half of ffn_hidden_size (`size_multiples`), or of the MoE layer's
    entry of ffn_hidden_size_list (`layer_keys`; SGLang takes the list's first non-zero entry
    where config.json has one), or, where config.json gives neither, half of linear_fc1's rows."""
    assert _zaya_sizes(zaya) == (4, 64, 128)

    def listed(cfg):
        del cfg["ffn_hidden_size"]
        cfg["ffn_hidden_size_list"] = [0, 256]

    assert _zaya_sizes(_edit_config(zaya, tmp_path / "listed", listed)) == (4, 64, 128)

    def neither(cfg):
        del cfg["ffn_hidden_size"]

    assert _zaya_sizes(_edit_config(zaya, tmp_path / "neither", neither)) == (4, 64, 128)


def test_a_zaya_size_config_json_contradicts_is_refused(zaya, tmp_path):
    """ffn_hidden_size 192 says I = 96: linear_fc1 [256, 64] fits no reading of it, and is
    refused naming the shape its form reads and the one found."""
    model = _edit_config(zaya, tmp_path / "model", lambda cfg: cfg.update(ffn_hidden_size=192))
    line = the_error(cli("convert", model, tmp_path / "out", "--server", "sglang"))
    assert line == (
        f"error: {ZAYA_EXPERTS}.local_experts.0.linear_fc1.weight: shape [256, 64], expected "
        "[192, 64] ([2I, H] with E=4, H=64, I=96 from config.json); the checkpoint and "
        "config.json disagree - download both again"
    )
    listed = _edit_config(
        zaya, tmp_path / "listed", lambda cfg: cfg.update(ffn_hidden_size_list=[0, 192])
    )
    line = the_error(cli("inspect", listed, "--server", "sglang"))
    assert "expected [192, 64] ([2I, H] with E=4, H=64, I=96 from config.json)" in line
    assert not (tmp_path / "out").exists()


def test_an_ffn_hidden_size_of_no_whole_half_is_one_line(zaya, tmp_path):
    """An odd ffn_hidden_size holds no whole I (SGLang would build I = 127 and fail on the
    tensors): refused naming the field, as config.json's other malformed fields are."""
    model = _edit_config(zaya, tmp_path / "model", lambda cfg: cfg.update(ffn_hidden_size=255))
    line = the_error(cli("inspect", model, "--server", "sglang"))
    assert line == (
        f"error: {model}/config.json: ffn_hidden_size is 255, not a multiple of 2 (ZAYA1 reads "
        "1/2 of it); fix that field or restore the model's config.json"
    )


def test_a_zaya_linear_fc1_stored_turned_is_refused_as_transposed(zaya, tmp_path):
    """One expert's linear_fc1 stored [H, 2I]: refused in one line, not read as [2I, H]."""
    name = f"{ZAYA_EXPERTS}.local_experts.3.linear_fc1.weight"
    model = _rewrite(zaya, tmp_path / "model", name, lambda t: t.T)
    line = the_error(cli("inspect", model, "--server", "sglang"))
    assert line == (
        f"error: {name}: shape [64, 256], expected [256, 64] ([2I, H] with E=4, H=64, I=128 "
        "from config.json); transposed? it is stored [H, 2I], which is not how ZAYA1 "
        "checkpoints store it - check config.json's model_type and architectures, or export "
        "the experts as ZAYA1 does"
    )


def test_a_zaya_expert_without_its_linear_fc2_is_refused(zaya, tmp_path):
    from safetensors.torch import load_file, save_file

    model = tmp_path / "model"
    shutil.copytree(zaya, model)
    name = f"{ZAYA_EXPERTS}.local_experts.2.linear_fc2.weight"
    index = json.loads((model / "model.safetensors.index.json").read_text())
    shard = index["weight_map"].pop(name)
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    tensors = load_file(model / shard)
    del tensors[name]
    save_file(tensors, model / shard, metadata={"format": "pt"})
    line = the_error(cli("inspect", model, "--server", "sglang"))
    assert line == (
        f"error: {model}: {ZAYA_EXPERTS}.2: no w2, linear_fc2 weight; the checkpoint is "
        "incomplete - download it again"
    )


def test_transformers_native_zaya_is_refused_naming_the_checkpoint_sglang_reads(tmp_path):
    """transformers 5.20's own ZAYA1 (save_pretrained: folded layers, fused mlp.experts.
    gate_up_proj / down_proj, model_type zaya as well) is not what SGLang 0.5.23's
    ZayaForCausalLM reads (its load_weights matches only zaya_block.experts.local_experts.E.
    linear_fc1/2): refused in one line naming the original checkpoints, nothing written."""
    src = hf.save("zaya", tmp_path / "native")
    for args in (("inspect", src, "--server", "sglang"), ("convert", src, tmp_path / "out")):
        line = the_error(cli(*args))
        assert line.startswith(
            "error: model.layers.0.mlp.experts.gate_up_proj: transformers' native ZAYA1 form"
        )
        assert line.endswith(
            "convert the original checkpoint (Zyphra/ZAYA1-8B-legacy, Zyphra/ZAYA1-base)"
        )
    assert not (tmp_path / "out").exists()


def test_inklings_w13_is_read_gate_from_its_even_rows_and_up_from_its_odd(tmp_path):
    """Inkling's mlp.experts.w13_weight [E, 2I, H] holds gate and up rows interleaved, [g0, u0,
    g1, u1, ...] (the family's `interleaved` form, as both servers' loaders de-interleave it):
    w1 (gate) is read from its even rows, w3 (up) from its odd ones, a TP rank's rows [a, b)
    of each from rows 2a (+1) on, every other row, columns as asked; w2 from w2_weight."""
    import torch

    from fi_convert.source import find_family, open_checkpoint
    from fi_convert.st_io import SourceFiles

    src = hf.save("inkling", tmp_path / "src")
    fam, layers = find_family(open_checkpoint(src))
    assert fam is not None and fam.name == "inkling"
    (layer,) = layers
    assert (layer.num_experts, layer.hidden_size, layer.intermediate_size) == (4, 64, 32)
    w13, w2 = (_tensor(src, f"{layer.prefix}.{n}_weight") for n in ("w13", "w2"))
    e = 2
    files = SourceFiles()
    try:
        for role, rows, cols, want in (
            ("w1", (0, 32), None, w13[e, 0::2]),
            ("w3", (0, 32), None, w13[e, 1::2]),
            ("w1", (16, 32), (8, 40), w13[e, 32::2, 8:40]),  # rank 1 of 2, some columns
            ("w3", (16, 32), None, w13[e, 33::2]),
            ("w2", (0, 64), (16, 32), w2[e, :, 16:32]),
        ):
            dst = torch.zeros((1, *want.shape), dtype=torch.bfloat16)
            layer.read(files, role, "weight", range(e, e + 1), rows, cols, dst)
            assert torch.equal(dst[0], want), (role, rows, cols)
    finally:
        files.close()
    assert not torch.equal(w13[e, 0::2], w13[e, :32])  # (the halves would read other rows)


def test_an_inkling_size_config_json_contradicts_is_refused(tmp_path):
    """The interleaved fused tensor's shape is checked as the fused form's: [E, 2I, H] with
    config.json's I (text_config.intermediate_size, the experts' width beside
    dense_intermediate_size)."""

    def edit(cfg):
        cfg["text_config"]["intermediate_size"] = 48

    model = _edit_config(hf.save("inkling", tmp_path / "src"), tmp_path / "model", edit)
    line = the_error(cli("inspect", model))
    assert line.startswith(
        "error: model.llm.layers.1.mlp.experts.w13_weight: shape [4, 64, 64], expected "
        "[4, 96, 64] ([E, 2I, H] with E=4, H=64, I=48 from config.json)"
    ), line


@pytest.mark.parametrize("tp", [1, 2])
def test_inkling_converts_and_verifies_against_flashinfer(tmp_path, tp):
    """Inkling's interleaved fused experts on CUTLASS (its Custom routing): `verify
    --against-flashinfer` de-interleaves them as vLLM's InklingMoE.load_expert_weight does,
    then runs vLLM's pipeline with FlashInfer's functions; every rank's tensors agree."""
    src, out = hf.save("inkling", tmp_path / "src"), tmp_path / "out"
    res = cli("convert", src, out, "--backend", "cutlass", "--tp-size", tp, "-q")
    assert res.exit_code == 0, res.output
    assert json.loads((out / MANIFEST).read_text())["source"]["family"] == "inkling"
    res = cli("verify", out, "--source", src, "--full", "--against-flashinfer", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["checked"]["tensors_vs_flashinfer"] == 2 * tp


def test_a_source_tensor_of_an_outputs_name_beside_the_experts_is_refused(tmp_path):
    """An output's expert tensor may take the name of its layer's own source tensor (Inkling's
    mlp.experts.w13_weight, above), never another's: a per-expert checkpoint that also holds a
    `...mlp.experts.w13_weight` of its own is refused in one line, nothing written."""
    import torch
    from safetensors.torch import load_file, save_file

    src = shutil.copytree(hf.save("olmoe", tmp_path / "o"), tmp_path / "src")
    index_path = src / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    name = "model.layers.0.mlp.experts.w13_weight"
    shard = index["weight_map"]["model.layers.0.mlp.experts.0.gate_proj.weight"]
    tensors = load_file(src / shard) | {name: torch.zeros(2, 2, dtype=torch.bfloat16)}
    save_file(tensors, src / shard, metadata={"format": "pt"})
    index["weight_map"][name] = shard
    index_path.write_text(json.dumps(index))
    line = the_error(cli("convert", src, tmp_path / "out", "--backend", "cutlass", "-q"))
    assert line == f"error: {src}: already holds {name}; is it converted?", line
    assert not (tmp_path / "out").exists()
