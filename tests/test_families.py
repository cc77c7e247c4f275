"""fi_convert/families.py and families/*.json: every family file is a valid family; the routing
method and activation each family gives, and the schemes and backends each server refuses for
them (with the server's reason); a model of no known family (one line naming it and how to add
one); a user's family file (`--family FILE.json`): each malformed field one line, and an output
converted with it verified from the family the manifest records; families no server runs on
FlashInfer refused with the server's reason; sizes config.json gives checked against the
tensors. The servers' own model code proves the new families in tests/test_sglang_families.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fi_convert.families import FAMILY_DIR, all_families, check_family, load_file
from fi_convert.servers.vllm.routing import refuses_moe
from tests import hf_checkpoints as hf

from .conftest import cli
from .test_errors import error_line

FILES = sorted(FAMILY_DIR.glob("*.json"))


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """transformers' checkpoint of each kind (tests/hf_checkpoints.py), written on first use."""
    base = tmp_path_factory.mktemp("families")
    made: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in made:
            made[kind] = hf.save(kind, base / kind)
        return made[kind]

    return get


def _copy(src: Path, dst: Path, **config: object) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps(cfg | config))
    return dst


# ------------------------------------------------------------------ the shipped family files


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_every_family_file_holds_a_family(path):
    d = json.loads(path.read_text())
    assert check_family(d) is None
    fam = load_file(path)
    assert fam.name == d["name"] and fam.own


def test_names_and_architectures_are_each_one_familys():
    fams = all_families()
    names = [f.name for f in fams]
    assert len(names) == len(set(names))
    for key in ("model_types", "architectures"):
        seen = [x for f in fams for x in getattr(f, key)]
        assert len(seen) == len(set(seen)), key


# the routing method each family's router is (vLLM 0.33's get_routing_method_type on the
# config its model builds the router from), for the config transformers writes or a released one
ROUTING = [
    ("glm4-moe", {"norm_topk_prob": True}, "DeepSeekV3"),
    ("minimax-m2", {"scoring_func": "sigmoid", "use_routing_bias": True}, "MiniMax2"),
    ("ernie4.5-moe", {}, "Unspecified"),
    ("olmoe", {}, "Default"),
    ("phimoe", {}, "Custom"),
    ("qwen3-moe", {"norm_topk_prob": True}, "RenormalizeNaive"),
    ("qwen3-moe", {"norm_topk_prob": False}, "Default"),
    ("deepseek-v3", {"scoring_func": "sigmoid", "topk_method": "noaux_tc"}, "DeepSeekV3"),
    ("deepseek-v3", {"topk_method": "greedy", "norm_topk_prob": False}, "Default"),
    (
        "bailing-moe-v2",
        {"score_function": "sigmoid", "moe_router_enable_expert_bias": True, "n_group": 8},
        "DeepSeekV3",
    ),  # fmt: skip
    ("cohere2-moe", {"expert_selection_fn": "sigmoid"}, "SigmoidRenorm"),
    ("qwen3-omni-moe", {"thinker_config": {"text_config": {"norm_topk_prob": False}}}, "Default"),
    ("deepseek-v4", {}, "DeepseekV4"),
    ("dbrx", {}, "RenormalizeNaive"),  # DbrxMoE: softmax, renormalize=True
    ("aria", {}, "RenormalizeNaive"),  # AriaTextMoELayer: FusedMoEFactory's defaults
    ("jamba", {}, "Default"),  # JambaMoE: renormalize=False
    ("ernie4.5-vl-moe", {}, "Unspecified"),  # softmax + e_score_correction_bias, both sets
    ("glm4v-moe", {"text_config": {"norm_topk_prob": True}}, "DeepSeekV3"),  # GLM-4.5's MoE
    ("bailing-moe", {"norm_topk_prob": True}, "RenormalizeNaive"),  # Ling-lite: no bias, groups
    ("longcat-flash", {}, "Unspecified"),  # ZeroExpertRouter (routing_method_type Unspecified)
    ("bailing-moe-v2.5", {}, "DeepSeekV3"),  # its config class's defaults: sigmoid, bias, 8 groups
    ("bailing-moe-v3", {}, "DeepSeekV3"),  # vLLM's BailingMoeV3MoE: fixed
]


@pytest.mark.parametrize(("name", "config", "method"), ROUTING)
def test_each_familys_routing_method(name, config, method):
    fam = next(f for f in all_families() if f.name == name)
    assert fam.moe.routing(config) == method


def test_vllms_refusals_by_routing_name_its_reason():
    # TRT-LLM's monolithic kernels take DeepSeekV3; BF16 and FP8 per-tensor have no modular ones
    assert refuses_moe("bf16", "trtllm", "DeepSeekV3", "silu", None) is None
    for scheme in ("bf16", "fp8-tensor"):
        why = refuses_moe(scheme, "trtllm", "Unspecified", "silu", None)
        assert why and "monolithic TRT-LLM" in why and why.endswith("use --backend cutlass")
        assert refuses_moe(scheme, "cutlass", "Unspecified", "silu", None) is None
    # the others run modular TRT-LLM experts under TP
    for scheme in ("fp8-block", "mxfp8", "nvfp4", "mxfp4"):
        assert refuses_moe(scheme, "trtllm", "Default", "silu", None) is None
    assert "swiglu_limit" in str(refuses_moe("fp8-tensor", "trtllm", "DeepSeekV3", "silu", 7.0))
    assert "no gelu_tanh activation" in str(
        refuses_moe("bf16", "trtllm", "Custom", "gelu_tanh", None)
    )


def test_inspect_says_each_schemes_refusal_by_routing(ckpt):
    """ERNIE-4.5's softmax + bias router (Unspecified): vLLM runs BF16 on CUTLASS only."""
    res = cli("inspect", ckpt("ernie4_5_moe"), "--backend", "cutlass", "--json")
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert (s["family"], s["routing"], s["activation"]) == ("ernie4.5-moe", "Unspecified", "silu")
    ok = {(c["scheme"], c["backend"]): c for c in s["choices"]}
    assert ok["bf16", "cutlass"]["ok"]
    assert "vLLM 0.33's monolithic TRT-LLM bf16 experts" in ok["bf16", "trtllm"]["why_not"]
    assert ok["mxfp8", "trtllm"]["ok"]  # modular TRT-LLM MXFP8
    res = cli("convert", ckpt("ernie4_5_moe"), ckpt("ernie4_5_moe").parent / "o", "--dry-run")
    line = error_line(res, "--scheme bf16 --backend trtllm --server vllm: the model's router")
    assert line.endswith("; servable for vllm instead: --scheme bf16 (cutlass), mxfp8 (trtllm)")


def test_jamba_runs_bf16_and_fp8_tensor_on_cutlass_only(ckpt, tmp_path):
    """Jamba's softmax router without renormalization (Default): vLLM 0.33's monolithic
    TRT-LLM kernels take no Default routing, and BF16 and FP8 per tensor have no modular TRT-LLM
    path under TP; the modular ones of the other schemes take it. SGLang 0.5.23 has no Jamba."""
    res = cli("inspect", ckpt("jamba"), "--backend", "cutlass", "--json")
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert (s["family"], s["routing"], s["activation"]) == ("jamba", "Default", "silu")
    ok = {(c["scheme"], c["backend"]): c for c in s["choices"]}
    assert ok["bf16", "cutlass"]["ok"] and ok["mxfp8", "trtllm"]["ok"]
    why = ok["bf16", "trtllm"]["why_not"]
    assert why.startswith(
        "the model's router is Default routing, which vLLM 0.33's monolithic TRT-LLM bf16 "
        "experts do not take"
    )
    line = error_line(cli("convert", ckpt("jamba"), tmp_path / "o", "--server", "sglang"))
    assert line == (
        "error: --scheme bf16 --backend trtllm --server sglang: SGLang 0.5.23 has no model "
        "class for Jamba (JambaForCausalLM); or convert for vLLM (--server vllm)"
    )


def test_glm_plans_on_every_backend_and_says_its_kernel(ckpt):
    res = cli("inspect", ckpt("glm4_moe"), "--json")
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert (s["family"], s["routing"]) == ("glm4-moe", "DeepSeekV3")
    assert s["kernel"].startswith("TRT-LLM monolithic")


# ---------------------------------------------------------------- a family fi-convert lacks


def test_a_model_of_no_known_family_is_one_line(ckpt, tmp_path):
    model = _copy(
        ckpt("glm4_moe"), tmp_path / "m", model_type="glm9_moe", architectures=["Glm9ForCausalLM"]
    )
    line = error_line(cli("convert", model, tmp_path / "out"))
    assert line.startswith(
        f"error: {model}/config.json: Glm9ForCausalLM (model_type glm9_moe) is no model family "
        "fi-convert knows (afmoe, aria, axk1, bailing-moe, bailing-moe-v2, "
    )
    assert "describe it in a family file and pass --family FILE.json" in line
    # DeepSeek-V3, GLM-4.5 and GLM-4.5V (its language model) name experts alike, and GLM's MoE
    # layers as DeepSeek's
    assert line.endswith(
        "its experts are named as DeepSeek-V3's or GLM-4.5's or GLM-4.5V's "
        "(model.layers.1.mlp.experts.0.gate_proj.weight): start from that file"
    )
    assert "fi_convert/families/" not in line
    assert not (tmp_path / "out").exists()


def _user_family(tmp_path: Path, **edit: object) -> Path:
    d = json.loads((FAMILY_DIR / "glm4_moe.json").read_text())
    d.update(name="glm9-moe", title="GLM-9", model_types=["glm9_moe"], architectures=[])
    d.update(edit)
    p = tmp_path / "glm9.json"
    p.write_text(json.dumps(d))
    return p


def test_a_users_family_file_converts_and_verifies(ckpt, tmp_path):
    model = _copy(ckpt("glm4_moe"), tmp_path / "m", model_type="glm9_moe", architectures=[])
    fam, out = _user_family(tmp_path), tmp_path / "out"
    res = cli("inspect", model, "--family", fam, "--json")
    assert res.exit_code == 0, res.output
    assert (json.loads(res.stdout)["family"], json.loads(res.stdout)["routing"]) == (
        "glm9-moe",
        "DeepSeekV3",
    )
    res = cli("convert", model, out, "--family", fam, "--tp-size", 2, "-q")
    assert res.exit_code == 0, res.output
    src = json.loads((out / "fi-convert-manifest.json").read_text())["source"]
    assert src["family"] == "glm9-moe"
    assert src["family_file"] == json.loads(fam.read_text())
    assert (src["routing"], src["activation"]) == ("DeepSeekV3", "silu")
    fam.unlink()  # verify reads the family the output records
    res = cli("verify", out, "--source", model)
    assert res.exit_code == 0, res.output
    # the control: a family file changed in the manifest (another routing) is caught
    m = json.loads((out / "fi-convert-manifest.json").read_text())
    m["source"]["family_file"]["routing"] = {"scoring": "softmax"}
    (out / "fi-convert-manifest.json").write_text(json.dumps(m))
    res = cli("verify", out, "--source", model)
    assert res.exit_code == 1


def test_a_users_family_of_per_expert_fused_experts_and_a_halved_size_converts(tmp_path):
    """A family file of its own with the per_expert_fused form and `size_multiples` (ZAYA1's,
    under another model_type) converts; the output records it, and verify reads the sizes back
    through it: the size read whole (the multiple taken out of the recorded file) is caught."""
    from tests import sglang_only_checkpoints as so

    model = _copy(so.save_zaya(tmp_path / "src"), tmp_path / "m", model_type="zaya9")
    cfg = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(cfg | {"architectures": []}))
    d = json.loads((FAMILY_DIR / "zaya.json").read_text())
    d.update(name="zaya9", title="ZAYA9", model_types=["zaya9"], architectures=[])
    fam, out = tmp_path / "zaya9.json", tmp_path / "out"
    fam.write_text(json.dumps(d))
    res = cli("convert", model, out, "--family", fam, "--server", "sglang", "--tp-size", 2, "-q")
    assert res.exit_code == 0, res.output
    m = json.loads((out / "fi-convert-manifest.json").read_text())
    assert m["source"]["family_file"] == d
    assert m["layers"]["model.layers.1.zaya_block.experts"]["intermediate_size"] == 128
    fam.unlink()
    res = cli("verify", out, "--source", model)
    assert res.exit_code == 0, res.output
    del m["source"]["family_file"]["size_multiples"]
    (out / "fi-convert-manifest.json").write_text(json.dumps(m))
    res = cli("verify", out, "--source", model)
    assert res.exit_code == 1 and "intermediate_size is 128, config.json says 256" in res.output


# a per-expert pattern (the `expert` group) of GLM's names
PER_EXPERT = (
    "^(?P<prefix>.*\\.mlp\\.experts)\\.(?P<expert>\\d+)\\.(?P<proj>\\w+)\\.(?P<param>\\w+)$"
)
BAD = [
    ({"name": "GLM 9"}, 'name: missing or not a lower-case name (e.g. "glm4-moe")'),
    ({"model_types": "glm9_moe"}, "model_types: not a list of strings"),
    ({"model_types": [], "architectures": []}, "model_types: the family names no model_type"),
    ({"config_keys": {"num_experts": ["n"], "intermediate_size": ["i"]}},
     "config_keys.hidden_size: missing or not a list of config.json keys"),
    ({"forms": []}, "forms: missing or not a list of expert forms"),
    ({"forms": [{"kind": "per_expert", "pattern": "(", "projections": {}}]},
     "forms[0].pattern: not a regular expression (missing ), unterminated subpattern"),
    ({"forms": [{"kind": "per_expert", "pattern": "^(?P<prefix>.*)\\.(?P<proj>\\w+)$",
                 "projections": {"gate_proj": "w1"}}]},
     "forms[0].pattern: no named group 'expert' (?P<...>)"),
    ({"forms": [{"kind": "fused", "pattern": "^(?P<prefix>.*)\\.(?P<proj>\\w+)$",
                 "projections": {"gate_up_proj": "w13"}}]},
     "forms[0].projections: maps to ['w13'], not w1, w3, w2 or w13, w2"),
    ({"routing": {"scoring": "tanh"}}, "routing.scoring: not one of softmax, sigmoid, "),
    ({"routing": {"renormalize": {"key": 3}}}, "routing.renormalize: not {\"key\": a config.json"),
    ({"routing": {"method": "Fancy"}}, "routing.method: not one of Default, Renormalize, "),
    ({"activation": "tanh"}, "activation: not one of silu, gelu_tanh, relu2_no_mul"),
    ({"experts": 4}, "experts: not a family field (fields: activation, activation_key, "),
    ({"activation_key": {"key": "hidden_act"}},
     'activation_key: not {"key": a config.json field, "refuse": why another is, '
     '"activations": the ones it may give (optional)}'),
    ({"activation_key": {"key": "hidden_act", "refuse": "no", "activations": "situ"}},
     "activation_key.activations: not a list of activations (silu, gelu_tanh, "),
    ({"activation_key": {"key": "hidden_act", "refuse": "no", "activations": ["situ", "tanh"]}},
     "activation_key.activations: not a list of activations (silu, gelu_tanh, "),
    ({"activation_key": {"key": "hidden_act", "refuse": "no", "activations": ["situ"]}},
     "activation_key.activations: does not list the family's activation silu"),
    ({"activation_key": {"key": "hidden_act", "refuse": "no",
                         "activations": ["silu", "relu2_no_mul"]}},
     "activation_key.activations: relu2_no_mul is non-gated, the family's activation silu is "
     "not"),
    ({"forms": [{"kind": "flat", "pattern": "^(?P<prefix>.*)\\.(?P<proj>\\w+)$",
                 "projections": {"w1": "w1", "v1": "w3", "w2": "w2"}, "transposed": ["w13"]}]},
     "forms[0].transposed: not a list of the form's roles (w1, w3, w2, w13) stored [in, out]"),
    ({"forms": [{"kind": "flattened", "pattern": "^(?P<prefix>.*)\\.(?P<proj>\\w+)$",
                 "projections": {"w1": "w1", "v1": "w3", "w2": "w2"}}]},
     "forms[0].kind: not one of 'per_expert', 'fused', 'stacked', 'flat'"),
    ({"forms": [{"kind": "fused", "pattern": "^(?P<prefix>.*)\\.(?P<proj>\\w+)$",
                 "projections": {"gate_up_proj": "w13", "down_proj": "w2"},
                 "expert_sets": [".text_experts", ".vision_experts"]}]},
     "forms[0].expert_sets: not a list of two or more MoE modules (appended to the prefix) of "
     "a per_expert form"),
    ({"forms": [{"kind": "per_expert_fused", "pattern": PER_EXPERT,
                 "projections": {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}}]},
     "forms[0].projections: maps to ['w1', 'w2', 'w3'], but a per_expert_fused form holds one "
     "w13 ([gate; up]) and one w2 per expert"),
    ({"forms": [{"kind": "per_expert", "pattern": PER_EXPERT,
                 "projections": {"gate_up_proj": "w13", "down_proj": "w2"}}]},
     "forms[0].projections: maps to w13, but a per_expert form keeps w1, w3 and w2 apart (one "
     '[gate; up] tensor per expert is kind "per_expert_fused")'),
    ({"forms": [{"kind": "per_expert_fused", "pattern": "^(?P<prefix>.*)\\.(?P<proj>\\w+)$",
                 "projections": {"linear_fc1": "w13", "linear_fc2": "w2"}}]},
     "forms[0].pattern: no named group 'expert' (?P<...>)"),
    ({"forms": [{"kind": "per_expert", "pattern": PER_EXPERT, "transposed": ["w2"],
                 "projections": {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}}]},
     "forms[0].transposed: a per_expert form's matrices are read as stored, [out, in] "
     "(nn.Linear's); one stored [in, out] is not read turned"),
    ({"size_multiples": [2]},
     "size_multiples: not a map of config.json fields to the multiple each holds"),
    ({"size_multiples": {"ffn_hidden_size": 2}},
     "size_multiples.ffn_hidden_size: not a field config_keys reads"),
    ({"size_multiples": {"moe_intermediate_size": 1}},
     "size_multiples.moe_intermediate_size: not a whole number of 2 or more"),
    ({"size_multiples": {"moe_intermediate_size": "2"}},
     "size_multiples.moe_intermediate_size: not a whole number of 2 or more"),
    ({"forms": [{"kind": "fused", "pattern": "^(?P<prefix>.*)\\.(?P<proj>\\w+)$",
                 "projections": {"w13": "w13", "w2": "w2"}, "interleaved": "yes"}]},
     "forms[0].interleaved: not true or false (w13's gate and up rows interleaved)"),
    ({"forms": [{"kind": "stacked", "pattern": "^(?P<prefix>.*)\\.(?P<proj>\\w+)$",
                 "projections": {"w1": "w1", "w3": "w3", "w2": "w2"}, "interleaved": True}]},
     "forms[0].interleaved: only a fused form's w13 holds gate and up rows interleaved (kind "
     "is 'stacked')"),
    ({"forms": [{"kind": "fused", "pattern": "^(?P<prefix>.*)\\.(?P<proj>\\w+)$",
                 "projections": {"w13": "w13", "w2": "w2"}, "transposed": ["w13"],
                 "interleaved": True}]},
     "forms[0].interleaved: w13's rows interleave only where it is stored [out, in], not turned"),
]  # fmt: skip


@pytest.mark.parametrize(("edit", "words"), BAD, ids=[w.split(":")[0] for _, w in BAD])
def test_each_malformed_field_of_a_family_file_is_one_line(ckpt, tmp_path, edit, words):
    fam = _user_family(tmp_path, **edit)
    line = error_line(cli("inspect", ckpt("glm4_moe"), "--family", fam))
    assert line.startswith(f"error: {fam}: {words}"), line
    assert line.endswith("; fix the family file (docs/architecture.md)")


def test_a_family_file_that_is_no_json_is_one_line(ckpt, tmp_path):
    fam = tmp_path / "f.json"
    fam.write_text("{'name': 1}")
    line = error_line(cli("inspect", ckpt("glm4_moe"), "--family", fam))
    assert line.startswith(f"error: {fam}: not JSON (")
    line = error_line(cli("inspect", ckpt("glm4_moe"), "--family", tmp_path / "none.json"))
    assert line.startswith(f"error: {tmp_path / 'none.json'}: cannot read the family file")


def test_a_users_family_field_of_the_wrong_kind_is_one_line(ckpt, tmp_path):
    model = _copy(ckpt("glm4_moe"), tmp_path / "m", model_type="glm9_moe", norm_topk_prob="yes")
    line = error_line(cli("inspect", model, "--family", _user_family(tmp_path)))
    assert line == (
        f'error: {model}/config.json: norm_topk_prob is "yes", not a boolean; fix that field '
        "or restore the model's config.json"
    )


def test_a_per_layer_clamp_of_the_wrong_kind_is_one_line(tmp_path):
    """Ling 3's expert_swiglu_limit_list (a clamp limit per decoder layer, `clamp_keys` and
    `layer_keys`): a list entry that is no number is one line naming the field."""
    from tests import remote_code_checkpoints as rc

    src = rc.save_ling3(tmp_path / "src")
    model = _copy(src, tmp_path / "m", expert_swiglu_limit_list=[0, "7", 7.0])
    line = error_line(cli("inspect", model))
    assert line == (
        f'error: {model}/config.json: expert_swiglu_limit_list is [0, "7", 7.0], not a number '
        "or list of numbers; fix that field or restore the model's config.json"
    )


# ------------------------------------------------------- what config.json says, and refusals


def test_a_size_config_json_contradicts_is_one_line(ckpt, tmp_path):
    model = _copy(ckpt("glm4_moe"), tmp_path / "m", moe_intermediate_size=96)
    line = error_line(cli("inspect", model))
    assert line == (
        "error: model.layers.1.mlp.experts.0.down_proj.weight: shape [64, 128], expected "
        "[64, 96] ([H, I] with E=4, H=64, I=96 from config.json); the checkpoint and "
        "config.json disagree - download both again"
    )


@pytest.mark.parametrize(
    ("model_type", "arch", "words"),
    [
        ("deepseek_v4", "DeepseekV4ForCausalLM", "DeepSeek-V4: vLLM 0.33 routes DeepSeek-V4's"),
        ("minicpm", "MiniCPMForCausalLM", "MiniCPM-MoE: vLLM 0.33's MiniCPM-MoE calls its"),
        ("step5", "Step5ForCausalLM", "Step-5: vLLM 0.33 runs Step-5's MoE layers that have"),
    ],
)
def test_a_family_no_server_runs_on_flashinfer_is_refused_with_its_reason(
    ckpt, tmp_path, model_type, arch, words
):
    model = _copy(
        ckpt("glm4_moe"),
        tmp_path / "m",
        model_type=model_type,
        architectures=[arch],
        n_routed_experts=4,
        num_experts=4,
        moe_num_experts=4,
    )
    line = error_line(cli("convert", model, tmp_path / "out"))
    assert line.startswith(f"error: {model}/config.json: {words}")
    assert line.endswith("; serve the checkpoint as it is")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("server", "words"),
    [
        (
            "vllm",
            "vLLM 0.33 runs Step-3.5's (Step3p5ForCausalLM) MoE layers that have a swiglu_limits "
            "entry with its swiglustep activation (models/step3p5.py), which no FlashInfer MoE "
            "kernel lists",
        ),
        (
            "sglang",
            "SGLang 0.5.23's Step-3.5 load_weights (models/step3p5.py) asserts that it filled "
            "every parameter, the experts' w13 and w2 among them",
        ),
    ],
)
@pytest.mark.parametrize("backend", ["trtllm", "cutlass"])
def test_step3p5_is_refused_for_each_server_with_that_servers_reason(
    ckpt, tmp_path, server, words, backend
):
    """Step-3.5 (Step3p5ForCausalLM) is recognized (its experts model.layers.L.moe.experts.E.
    {gate,up,down}_proj, as vLLM's and SGLang's models read them: GLM-4.5's tiny checkpoint
    under those names and Step-3.5's config keys) and refused when planned, for each server with
    its own reason (servers/<name>/target.py; `inspect` says the same): vLLM runs its clamped
    layers as swiglustep, which no FlashInfer kernel lists; SGLang runs them as silu experts
    with gemm1_clamp_limit, and its
    load_weights asserts that it filled every expert itself (test_sglang_families.py:
    test_sglangs_step3p5_load_asserts_it_filled_the_experts). One line; nothing is written."""
    model = _copy(
        ckpt("glm4_moe"),
        tmp_path / "m",
        model_type="step3p5",
        architectures=["Step3p5ForCausalLM"],
        moe_num_experts=4,
    )
    hf._rename_tensors(model, lambda n: n.replace(".mlp.experts.", ".moe.experts."))
    out = tmp_path / "out"
    args = ("--server", server, "--backend", backend)
    line = error_line(cli("convert", model, out, *args))
    assert line.startswith(f"error: --scheme bf16 --backend {backend} --server {server}: {words}")
    assert line.endswith("; serve the checkpoint as it is")
    assert not out.exists()
    assert error_line(cli("inspect", model, *args)) == line


@pytest.mark.parametrize(
    ("server", "backend", "words", "end"),
    [
        (
            "vllm",
            "trtllm",
            "vLLM 0.33's FlashInfer TRT-LLM bf16 experts take no swigluoai_uninterleave activation",
            "; servable for vllm instead: --scheme bf16 (cutlass), mxfp8 (trtllm)",
        ),
        (
            "sglang",
            "trtllm",
            "SGLang 0.5.23 runs these experts as silu with SwiGLU-OAI's alpha and clamp "
            "(gemm1_alpha, gemm1_clamp_limit: models/minimax_m3.py), which its TRT-LLM BF16 "
            "runner has no field for",
            "; servable for sglang instead: --scheme bf16 (cutlass); or convert for vLLM "
            "(--server vllm)",
        ),
    ],
)
def test_minimax_m3_is_found_and_refused_where_its_server_does_not_run_it(
    ckpt, tmp_path, server, backend, words, end
):
    """MiniMax-M3 (transformers' own tiny MiniMaxM3SparseForConditionalGeneration, written with
    the published names and its text_config's published keys): the family finds its MoE layer
    (language_model.model.layers.1.block_sparse_moe.experts, sizes from text_config); neither
    server's TRT-LLM BF16 kernel takes its experts: vLLM's lists no swigluoai_uninterleave
    (servers/vllm/routing.py), SGLang's runner has no field for the alpha and clamp it builds
    them with (servers/sglang/target.py): one line each, naming the server's reason and the
    CUTLASS output, which each server's own class proves (tests/test_vllm_families.py,
    tests/test_sglang_families.py); nothing is written."""
    model = ckpt("minimax_m3")
    out = tmp_path / "out"
    line = error_line(cli("convert", model, out, "--server", server, "--backend", backend))
    assert line.startswith(f"error: --scheme bf16 --backend {backend} --server {server}: {words}")
    assert line.endswith(end)
    assert not out.exists()
    assert error_line(cli("inspect", model, "--server", server, "--backend", backend)) == line
    from fi_convert.source import find_family, open_checkpoint

    fam, layers = find_family(open_checkpoint(model))
    assert fam is not None and fam.name == "minimax-m3"
    assert [x.prefix for x in layers] == ["language_model.model.layers.1.block_sparse_moe.experts"]
    assert (layers[0].routing, layers[0].activation, layers[0].swiglu_limit) == (
        "MiniMax2",
        "swigluoai_uninterleave",
        7.0,
    )


@pytest.mark.parametrize(
    ("server", "words"),
    [
        (
            "vllm",
            "fi-convert has not proven an output of MiniMax-M3's text model "
            "(MiniMaxM3SparseForCausalLM) against vLLM 0.33's own load: no checkpoint of it alone "
            "is published, and vLLM reads its config.json with transformers 5.20's "
            "MiniMaxM3VLTextConfig",
        ),
        ("sglang", "SGLang 0.5.23 has a model class for MiniMax-M3's text model"),
    ],
)
def test_minimax_m3s_text_model_alone_is_refused_for_each_server(ckpt, tmp_path, server, words):
    """MiniMax-M3's text model alone (MiniMaxM3SparseForCausalLM, config.json the published
    model's text_config): no checkpoint of it is published; vLLM reads such a config.json with
    transformers' class, which its model refuses (test_vllm_families.py:
    test_vllms_minimax_m3_text_model_reads_a_config_its_mlp_refuses), and SGLang's load of it is
    not proven: one line each, nothing written."""
    model = shutil.copytree(ckpt("minimax_m3"), tmp_path / "m")
    text = json.loads((model / "config.json").read_text())["text_config"]
    (model / "config.json").write_text(
        json.dumps(text | {"architectures": ["MiniMaxM3SparseForCausalLM"]})
    )
    out = tmp_path / "out"
    line = error_line(cli("convert", model, out, "--server", server, "--backend", "cutlass"))
    assert line.startswith(f"error: --scheme bf16 --backend cutlass --server {server}: {words}")
    assert line.endswith("; serve the checkpoint as it is")
    assert not out.exists()


_OAI = "swigluoai_uninterleave"


@pytest.mark.parametrize(
    ("scheme", "backend", "why"),
    [
        ("bf16", "trtllm", "vLLM 0.33's FlashInfer TRT-LLM bf16 experts take no " + _OAI),
        ("bf16", "cutlass", None),
        ("fp8-block", "trtllm", None),
        ("fp8-tensor", "trtllm", "the model's experts clamp their SwiGLU (swiglu_limit)"),
        ("fp8-tensor", "cutlass", None),
        ("mxfp8", "trtllm", None),
        ("nvfp4", "trtllm", None),
        ("nvfp4", "cutlass", None),
        ("mxfp4", "trtllm", "vLLM 0.33's FlashInfer TRT-LLM mxfp4 experts take no " + _OAI),
    ],
)
def test_vllm_runs_swigluoai_uninterleave_on_the_kernels_that_list_it(scheme, backend, why):
    """SwiGLU-OAI on [gate; up] halves (MiniMax-M3's experts, clamped at 7.0, MiniMax2 routing)
    on the FlashInfer kernels whose _supports_activation lists it in vLLM 0.33 (TRT-LLM FP8 and
    NVFP4, CUTLASS; not TRT-LLM BF16 nor MXFP4), the clamp on TRT-LLM FP8 for block FP8 and
    MXFP8 only (servers/vllm/routing.py)."""
    said = refuses_moe(scheme, backend, "MiniMax2", _OAI, 7.0)
    assert said == why if why is None else said.startswith(why)


@pytest.mark.parametrize(
    ("scheme", "backend", "why"),
    [
        ("bf16", "cutlass", None),
        ("fp8-tensor", "cutlass", None),
        ("nvfp4", "cutlass", None),
        ("bf16", "trtllm", "which its TRT-LLM BF16 runner has no field for"),
        ("fp8-tensor", "trtllm", "which its TRT-LLM FP8 per-tensor methods do not hand"),
        ("fp8-block", "trtllm", "fi-convert has not proven its TRT-LLM fp8-block runner"),
        ("nvfp4", "trtllm", "fi-convert has not proven its TRT-LLM nvfp4 runner"),
    ],
)
def test_sglang_runs_swigluoai_uninterleave_as_silu_with_its_parameters_on_cutlass(
    scheme, backend, why
):
    """SGLang 0.5.23 builds MiniMax-M3's experts as silu with gemm1_alpha and gemm1_clamp_limit,
    which its CUTLASS runner takes per expert; its TRT-LLM BF16 runner has no field for them,
    its TRT-LLM FP8 per-tensor methods do not hand them to their kernel, and its other TRT-LLM
    runners are not proven with them (servers/sglang/target.py): one line each, naming
    --backend cutlass."""
    from fi_convert.servers.sglang.target import SGLANG_TARGET

    said = SGLANG_TARGET.refuses_moe(scheme, backend, "MiniMax2", _OAI, 7.0)
    if why is None:
        assert said is None
    else:
        assert why in said and said.endswith("; use --backend cutlass")


# a user's family file for Muse Spark (no family file names it): transformers' expert names
MUSE_SPARK = {
    "name": "muse-spark",
    "title": "Muse Spark",
    "model_types": ["muse_spark"],
    "architectures": ["MuseSparkForConditionalGeneration"],
    "config_keys": {
        "num_experts": ["num_local_experts"],
        "intermediate_size": ["moe_intermediate_size"],
        "hidden_size": ["moe_hidden_size"],
    },
    "routing": {"scoring": "sigmoid", "bias": True, "renormalize": True},
    "activation": "silu",
    "forms": [
        {
            "kind": "fused",
            "pattern": r"^(?P<prefix>.*\.mlp\.experts)\.(?P<proj>gate_up_proj|down_proj)$",
            "projections": {"gate_up_proj": "w13", "down_proj": "w2"},
        }
    ],
}


@pytest.mark.parametrize("backend", ["trtllm", "cutlass"])
def test_a_users_muse_spark_family_is_refused_for_vllm_with_its_reason(ckpt, tmp_path, backend):
    """A user's family file naming Muse Spark's experts (transformers' tiny model) finds its
    layers, and a vLLM output is refused in one line before anything is written, with vLLM's
    reason
    (servers/vllm/target.py OWN_MOE_METHOD; test_vllm_families.py reads it from vLLM's code)."""
    fam = tmp_path / "muse.json"
    fam.write_text(json.dumps(MUSE_SPARK))
    model = ckpt("muse_spark")
    out = tmp_path / "out"
    line = error_line(cli("convert", model, out, "--family", fam, "--backend", backend))
    assert line.startswith(
        f"error: --scheme bf16 --backend {backend} --server vllm: vLLM 0.33 cannot serve a "
        "converted Muse Spark (MuseSparkForConditionalGeneration): its experts run on vLLM "
        "0.33's own MoE methods for it, MuseSparkUnquantizedFusedMoE"
    )
    assert line.endswith("; serve the checkpoint as it is")
    assert not out.exists()


@pytest.mark.parametrize(
    ("server", "words"),
    [
        (
            "vllm",
            "vLLM 0.33 builds Step-3.7's (Step3p7ForConditionalGeneration) language model as "
            "Step-3.5's (models/step3p7.py) and runs its MoE layers that have a swiglu_limits "
            "entry with its swiglustep activation",
        ),
        (
            "sglang",
            "SGLang 0.5.23's Step-3.7 (models/step3p7.py) loads its language model with "
            "Step-3.5's load_weights (models/step3p5.py), which asserts that it filled every",
        ),
    ],
)
def test_step3p7_from_a_users_family_file_is_refused_with_each_servers_reason(
    ckpt, tmp_path, server, words
):
    """Step-3.7 (Step3p7ForConditionalGeneration: Step-3.5's language model, its experts packed
    per projection as transformers writes them) has no family file; a user's own that reads
    it is refused when planned, for each server with that server's reason (vLLM's swiglustep
    layers, servers/vllm/target.py; SGLang's load_weights, which asserts it filled the experts:
    test_sglang_families.py reads it from SGLang's code), in one line; nothing is written."""
    fam = tmp_path / "step3p7.json"
    fam.write_text(json.dumps(hf.STEP3P7_FAMILY))
    out = tmp_path / "out"
    args = ("--family", fam, "--server", server, "--backend", "cutlass")
    line = error_line(cli("convert", ckpt("step3p7"), out, *args))
    assert line.startswith(f"error: --scheme bf16 --backend cutlass --server {server}: {words}")
    assert line.endswith("; serve the checkpoint as it is")
    assert not out.exists()


def test_the_docs_families_table_is_the_generated_one():
    """docs/converting.md's table of families is scripts/families_table.py's, from the family
    files and the servers' facts (run the script after changing either)."""
    import runpy

    script = runpy.run_path(str(Path(__file__).parents[1] / "scripts" / "families_table.py"))
    text = script["DOC"].read_text()
    assert script["rewritten"](text) == text
    for fam in all_families():
        assert f"| {fam.title} |" in text
    assert "| ERNIE-4.5-MoE | `Ernie4_5_MoeForCausalLM` |" in text
    assert "Unspecified | silu | bf16 (cutlass), fp8-block (trtllm, cutlass)" in text


def test_architecture_mds_glm_example_is_the_glm_family_file():
    """docs/architecture.md shows adding a family with GLM-4.5's file: the example is a valid
    family, and each field it shows is the shipped file's."""
    import re

    doc = (Path(__file__).parents[1] / "docs" / "architecture.md").read_text()
    example = json.loads(re.search(r"```json\n(.*?)\n```", doc, re.S)[1])
    assert check_family(example) is None
    shipped = json.loads((FAMILY_DIR / "glm4_moe.json").read_text())
    for key, value in example.items():
        if key == "checkpoints":
            assert set(value) <= set(shipped[key])
        else:
            assert value == shipped[key], key


# Kimi Linear's situ experts (hidden_act situ): each server's reason, read from its code (vLLM
# 0.33's KimiLinearForCausalLM builds them, Kimi K3's language model: servers/vllm/routing.py;
# SGLang 0.5.23's KimiMoE raises on any hidden_act but silu: servers/sglang/target.py
# CONFIG_REFUSED), neither followed by a hint to convert for the other server
KIMI_LINEAR_SITU = [
    ("vllm", "trtllm", "vLLM 0.33's FlashInfer TRT-LLM bf16 experts take no situ activation"),
    ("vllm", "cutlass", "vLLM 0.33's FlashInfer CUTLASS bf16 experts take no situ activation"),
    ("sglang", "trtllm", "SGLang 0.5.23's Kimi Linear (models/kimi_linear.py KimiMoE) raises on "
     "any hidden_act but silu (\"Only silu is supported for now\"): it builds no situ experts "
     "(config.json's hidden_act is 'situ'); serve the checkpoint as it is"),
    ("sglang", "cutlass", "SGLang 0.5.23's Kimi Linear (models/kimi_linear.py KimiMoE) raises on "
     "any hidden_act but silu (\"Only silu is supported for now\"): it builds no situ experts "
     "(config.json's hidden_act is 'situ'); serve the checkpoint as it is"),
]  # fmt: skip


@pytest.mark.parametrize(("server", "backend", "why"), KIMI_LINEAR_SITU)
def test_kimi_linears_situ_experts_are_refused_with_each_servers_reason(
    ckpt, tmp_path, server, backend, why
):
    """Kimi Linear's config.json says its experts' activation (hidden_act): silu converts,
    situ (its SiTU experts) is refused in one line with each server's own reason (it was one
    line for both), before anything is written."""
    src = ckpt("kimi_linear")
    assert cli("inspect", src, "--json").exit_code == 0
    model = _copy(src, tmp_path / "m", hidden_act="situ", activation_situ_beta=1.0)
    out = tmp_path / "out"
    line = error_line(cli("convert", model, out, "--backend", backend, "--server", server))
    assert line == f"error: --scheme bf16 --backend {backend} --server {server}: {why}", line
    assert not out.exists()


def test_kimi_linears_experts_of_another_activation_are_refused(ckpt, tmp_path):
    """A hidden_act neither server's Kimi Linear builds (gelu) is refused in one line for the
    family, whatever the server, nothing written."""
    model = _copy(ckpt("kimi_linear"), tmp_path / "m", hidden_act="gelu")
    for server in ("vllm", "sglang"):
        line = error_line(cli("convert", model, tmp_path / "out", "--server", server))
        assert line == (
            f"error: {model}/config.json: Kimi Linear: config.json's hidden_act is 'gelu': Kimi "
            "Linear's experts are silu or situ alone (vLLM 0.33's KimiMLP raises on any other "
            "hidden_act, SGLang 0.5.23's KimiMoE on any but silu); fix config.json"
        ), line
        assert not (tmp_path / "out").exists()


def test_kimi_k3_is_its_own_family_not_its_text_configs(tmp_path, monkeypatch):
    """Kimi K3's config.json (model_type kimi_k3, KimiK3ForConditionalGeneration) holds a Kimi
    Linear text_config (model_type kimi_linear): it was taken as Kimi Linear, whose hidden size
    is hidden_size, so its latent experts ([I, routed_expert_hidden_size]) were refused as a
    checkpoint that disagrees with its config.json ("download both again", seen on c93ce43).
    Kimi K3's family reads routed_expert_hidden_size first, whatever order the family files
    are read in: a family config.json's own model_type names comes before one its text_config's
    names. Without a latent MoE, the hidden size is hidden_size."""
    from fi_convert import families

    src = hf.save("kimi_k3", tmp_path / "k3")
    res = cli("inspect", src, "--json")
    assert res.exit_code == 0, res.output
    info = json.loads(res.stdout)
    layer = info["layers"]["language_model.layers.1.block_sparse_moe.experts"]
    assert (info["family"], info["routing"], info["activation"]) == (
        "kimi-k3",
        "DeepSeekV3",
        "silu",
    )
    assert (layer["hidden_size"], layer["intermediate_size"]) == (hf.KIMI_K3_LATENT, 512)
    assert hf.KIMI_K3_LATENT != hf.KIMI_K3_HIDDEN
    config = json.loads((src / "config.json").read_text())
    ordered = families.all_families()
    monkeypatch.setattr(families, "all_families", lambda: ordered[::-1])
    assert [f.name for f in families.declared(config)] == ["kimi-k3", "kimi-linear"]
    plain = hf._save_kimi_k3(tmp_path / "plain", latent=None)
    res = cli("inspect", plain, "--json")
    assert res.exit_code == 0, res.output
    layer = json.loads(res.stdout)["layers"]["language_model.layers.1.block_sparse_moe.experts"]
    assert layer["hidden_size"] == hf.KIMI_K3_HIDDEN


# Kimi K3's situ experts (hidden_act situ, SiTU's betas in text_config): each server's reason,
# by scheme and backend, read from its code (servers/vllm/routing.py SITU_WHY, servers/sglang/
# target.py SITU_FP4_WHY and its runners' activations)
K3_SITU = [
    ("vllm", "bf16", "trtllm", "vLLM 0.33's FlashInfer TRT-LLM bf16 experts take no situ"),
    ("vllm", "bf16", "cutlass", "vLLM 0.33's FlashInfer CUTLASS bf16 experts take no situ"),
    ("sglang", "bf16", "trtllm", "SGLang 0.5.23's flashinfer_trtllm MoE runner takes no situ "
     "experts in bf16 (it takes silu, relu2_no_mul)"),
    ("sglang", "bf16", "cutlass", "SGLang 0.5.23's flashinfer_cutlass MoE runner takes no situ "
     "experts in bf16 (it takes silu, gelu_tanh, relu2_no_mul, swigluoai_uninterleave)"),
]  # fmt: skip


@pytest.mark.parametrize(("server", "scheme", "backend", "why"), K3_SITU)
def test_kimi_k3s_situ_experts_are_refused_with_each_servers_reason(
    ckpt, tmp_path, server, scheme, backend, why
):
    """hidden_act situ: Kimi K3's experts are SiTU ones; each server refuses them in one line
    with its own reason, before anything is written (silu: converted, above)."""
    text = {"hidden_act": "situ", "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0}
    model = ckpt("kimi_k3")
    cfg = json.loads((model / "config.json").read_text())
    model = _copy(model, tmp_path / "m", text_config=cfg["text_config"] | text)
    out = tmp_path / "out"
    args = ("--scheme", scheme, "--backend", backend, "--server", server)
    line = error_line(cli("convert", model, out, *args))
    assert line.startswith("error: ") and why in line, line
    assert not out.exists()


def test_kimi_k3s_situ_on_fp4_trtllm_is_each_servers_own_reason():
    """Where each server does run situ experts on FlashInfer (TRT-LLM FP4, with kernel
    arguments of their own), the refusal says so, not that the kernel takes none."""
    from fi_convert.server_lookup import resolve

    vllm = resolve("vllm").refuses_moe("nvfp4", "trtllm", "DeepSeekV3", "situ", None)
    assert vllm.startswith("vLLM 0.33's TRT-LLM nvfp4 experts run situ experts only where")
    sglang = resolve("sglang").refuses_moe("nvfp4", "trtllm", "DeepSeekV3", "situ", None)
    assert sglang.startswith("SGLang 0.5.23's TRT-LLM FP4 MoE runner runs situ experts")
    assert resolve("sglang").refuses_moe("mxfp4", "cutlass", "DeepSeekV3", "situ", None)
    for server in ("vllm", "sglang"):
        assert resolve(server).refuses_moe("bf16", "trtllm", "DeepSeekV3", "silu", None) is None


def test_kimi_k3s_experts_of_another_activation_are_refused(ckpt, tmp_path):
    model = ckpt("kimi_k3")
    cfg = json.loads((model / "config.json").read_text())
    model = _copy(model, tmp_path / "m", text_config=cfg["text_config"] | {"hidden_act": "gelu"})
    line = error_line(cli("convert", model, tmp_path / "out"))
    assert line == (
        f"error: {model}/config.json: Kimi K3: config.json's hidden_act is 'gelu': Kimi K3's "
        "experts are silu or situ alone (vLLM 0.33's KimiMLP and SGLang 0.5.23's KimiK3MLP "
        "raise on any other hidden_act); fix config.json"
    )


def test_the_families_table_takes_what_the_plan_takes_for_a_clamped_family(ckpt, tmp_path):
    """The table's schemes and backends are the plan's for a checkpoint whose config.json is
    the public checkpoints' (released_config), from the same facts: HY v4's experts clamp their
    SwiGLU (swiglu_limit, 10.0 as transformers writes it), which vLLM 0.33's TRT-LLM FP8
    per-tensor experts do not apply, so the plan refuses fp8-tensor on trtllm for vLLM and the
    table does not list it (it once did: it read no clamp); vLLM's CUTLASS takes it, and
    SGLang's TRT-LLM too."""
    import runpy

    from fi_convert import Backend, Options, SchemeMismatchError, SchemeName
    from fi_convert.plan import make_plan
    from fi_convert.server_lookup import resolve

    script = runpy.run_path(str(Path(__file__).parents[1] / "scripts" / "families_table.py"))
    (fam,) = [f for f in all_families() if f.name == "hunyuan-v4"]
    src = _per_expert(ckpt("hy_v4"), tmp_path / "hy_v4")  # (fp8-tensor reads per-expert ones)
    config = json.loads((src / "config.json").read_text())
    assert config["swiglu_limit"] == fam.source["released_config"]["swiglu_limit"] == 10.0
    cells = {s: script["served"](fam, s) for s in ("vllm", "sglang")}
    assert "fp8-tensor (cutlass)," in cells["vllm"]
    assert "fp8-tensor (trtllm, cutlass)," in cells["sglang"]
    fp8 = Options(SchemeName.FP8_TENSOR, Backend.TRTLLM, 1, allow_unservable=True)
    with pytest.raises(SchemeMismatchError, match="swiglu_limit"):
        make_plan(src, fp8)
    fp8 = Options(SchemeName.FP8_TENSOR, Backend.CUTLASS, 1, allow_unservable=True)
    assert make_plan(src, fp8).layers
    # (SGLang plans fp8-tensor from a ModelOpt FP8 source, the table's; its TRT-LLM FP8
    # experts take the clamp)
    assert resolve("sglang").refuses_moe("fp8-tensor", "trtllm", "DeepSeekV3", "silu", 10.0) is None


def _per_expert(src: Path, dst: Path) -> Path:
    """A copy of a checkpoint of fused experts (`experts.gate_up_proj` [E, 2I, H], `experts.
    down_proj` [E, H, I]) with each expert's own `experts.E.{gate,up,down}_proj.weight`."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    for shard in sorted(set(index["weight_map"].values())):
        out = {}
        for name, t in load_file(dst / shard).items():
            stem, _, proj = name.rpartition(".")
            if not stem.endswith(".experts") or proj not in ("gate_up_proj", "down_proj"):
                out[name] = t
                continue
            parts = {"gate_proj": t.chunk(2, 1)[0], "up_proj": t.chunk(2, 1)[1]}
            for e in range(t.shape[0]):
                for p, w in (parts if proj == "gate_up_proj" else {"down_proj": t}).items():
                    out[f"{stem}.{e}.{p}.weight"] = w[e].contiguous()
        save_file(out, dst / shard, metadata={"format": "pt"})
        index["weight_map"] = {n: s for n, s in index["weight_map"].items() if s != shard}
        index["weight_map"] |= dict.fromkeys(out, shard)
    (dst / "model.safetensors.index.json").write_text(json.dumps(index))
    return dst


def test_the_families_table_lists_no_scheme_that_reads_none_of_a_familys_forms(ckpt):
    """fp8-tensor and nvfp4 read per-expert tensors only (`Scheme.form_kinds`), as the plan
    refuses them for DBRX's flat experts; so the table lists neither for a family with no
    per-expert form (DBRX, Aria, Granite-MoE, Step-3: it once listed both)."""
    import runpy

    from fi_convert import Backend, Options, SchemeName
    from fi_convert.errors import FiConvertError
    from fi_convert.plan import make_plan
    from fi_convert.schemes import REGISTRY

    script = runpy.run_path(str(Path(__file__).parents[1] / "scripts" / "families_table.py"))
    narrow = {s.value for s, scheme in REGISTRY.items() if scheme.form_kinds is not None}
    assert narrow == {"fp8-tensor", "nvfp4"}
    unlisted = [f for f in all_families() if not any(x.kind == "per_expert" for x in f.forms)]
    assert {"dbrx", "aria", "granite-moe", "step3"} <= {f.name for f in unlisted}
    for fam in unlisted:
        for server in ("vllm", "sglang"):
            cell = script["served"](fam, server)
            assert not any(f"{s} (" in cell for s in narrow), (fam.name, server, cell)
    src = ckpt("dbrx")
    for scheme in (SchemeName.FP8_TENSOR, SchemeName.NVFP4):
        opts = Options(scheme, Backend.CUTLASS, 1, allow_unservable=True)
        with pytest.raises(FiConvertError, match="reads per-expert tensors only"):
            make_plan(src, opts)
