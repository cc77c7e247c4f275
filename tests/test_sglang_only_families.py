"""MoE families only SGLang 0.5.23 has a model class for, proven by its own model classes on
CPU: a tiny checkpoint in the family's names (tests/sglang_only_checkpoints.py) is loaded by
SGLang's `get_model_loader` twice, the plugin's load of fi-convert's output (`--server sglang`)
and SGLang's default load of the source (its model class's `load_weights`, expert mapping and
FusedMoE processing): every parameter, buffer and tensor a module holds, and each MoE layer's
state, must be equal, in BF16 on both FlashInfer runners, at TP 1 and 2, every rank. vLLM 0.33
has no model class for them: fi-convert refuses a vLLM output of each, in one line.

SDAR MoE (SDARMoeForCausalLM: Qwen3-MoE's layers, a block-diffusion language model), LLaDA 2
MoE (LLaDA2MoeModelLM: Ling 2.0's layout, a diffusion language model), Xllm (XllmForCausalLM:
sigmoid scores with a correction bias, a shared expert), IQuest Q1 (IQuestQ1ForCausalLM: fused
experts mlp.experts.fc / proj; its load_weights refuses a load that leaves a parameter unfilled,
and takes the converted layers' parameters, which the plugin fills itself, as SGLang's
`_skip_weight_check` marks them: test_iquest_q1s_own_check_sees_every_parameter_filled),
GigaChat 3.5 (GigaChat35ForCausalLM: DeepSeek-V3's MoE beside a Gated-Delta-Net layer and a
gated MLA one, gated norms; its MLA's rotary embedding asks the platform for its device when
built: "cpu" here), Grok-1 (Grok1ForCausalLM, config.json under model_type git as Grok-2's: gelu
experts, its router's softcapped logits through SGLang's custom_routing_function; on CUTLASS
alone: test_grok1_on_sglangs_trtllm_bf16_runner_is_refused; its load_weights' own check that
every parameter is filled, which the plugin makes with the converted layers counted:
test_grok1s_own_check_sees_the_converted_layers_filled; vLLM dropped its class in 0.24), ZAYA1
(ZayaForCausalLM, Zyphra's original layout: CCA attention layers between MoE layers whose
experts are per expert with gate and up in one linear_fc1, ffn_hidden_size = 2I; its attention
asserts that the attention TP group is the TP group, set so for its build: ATTN_TP).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from unittest import mock

import pytest

from fi_convert.format.manifest import read
from tests import remote_code_checkpoints as rc
from tests import sglang_only_checkpoints as so
from tests.test_sglang_models import _convert, _differences, _moe, _no_gpu  # noqa: F401
from tests.test_sglang_plugin import registered  # noqa: F401

pytestmark = pytest.mark.usefixtures("registered")

# family: (the source's writer, the MoE layers SGLang builds)
FAMILIES = {
    "sdar_moe": (so.save_sdar_moe, [f"model.layers.{i}.mlp.experts" for i in (0, 1)]),
    "llada2_moe": (so.save_llada2, ["model.layers.1.mlp.experts"]),  # layer 0 dense
    "xllm": (so.save_xllm, ["model.layers.1.mlp.experts"]),  # layer 0 dense
    "iquest_q1": (so.save_iquest_q1, ["model.layers.1.mlp.experts"]),  # layer 0 dense
    "gigachat35": (so.save_gigachat35, ["model.layers.1.mlp.experts"]),  # layer 0 dense
    "grok1": (so.save_grok1, [f"model.layers.{i}.block_sparse_moe.experts" for i in (0, 1)]),
    "zaya": (so.save_zaya, ["model.layers.1.zaya_block.experts"]),  # layer 0 attention
}
# families whose SGLang model builds a rotary embedding that asks the platform for its device
# (GigaChat 3.5's MLA: DeepSeek's yarn rotary embedding): "cpu" here
ROPE_ON_CPU = {"gigachat35"}
ROPE = "sglang.srt.layers.rotary_embedding.rope_variant"
# families whose SGLang model asserts that the attention TP group is the TP group (ZAYA1's
# head-parallel CCA: no DP attention), as `--tp N` without DP attention has them: the one-process
# context here builds one attention TP group of one process, so its size and rank are set to the
# TP rank's for the build
ATTN_TP = {"zaya"}


@pytest.fixture(autouse=True)
def _sglangs_loader_kept():
    """Grok-1's model, built at TP > 1, replaces SGLang's DefaultModelLoader._prepare_weights
    for the whole process (models/grok.py: its reader of presharded *-TP-NNN files, which falls
    back to SGLang's own where there are none): put back after each test."""
    from sglang.srt.model_loader.loader import DefaultModelLoader

    kept = DefaultModelLoader.__dict__["_prepare_weights"]
    with mock.patch.object(DefaultModelLoader, "_prepare_weights", kept):
        yield


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Each family's source, written once; transformers' copies of remote code kept in a
    temporary folder meanwhile."""
    root, made = tmp_path_factory.mktemp("sgl-only-src"), {}
    with rc.modules_cache(root / "hf-modules"):

        def get(kind: str) -> Path:
            if kind not in made:
                made[kind] = FAMILIES[kind][0](root / kind)
            return made[kind]

        yield get


# families whose experts SGLang's TRT-LLM BF16 runner does not take (Grok-1's gelu: silu and
# relu2 only; test_grok1_on_sglangs_trtllm_bf16_runner_is_refused): CUTLASS alone
CUTLASS_ONLY = {"grok1"}


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize(
    ("kind", "backend"),
    [
        (k, b)
        for k in sorted(FAMILIES)
        for b in ("trtllm", "cutlass")
        if b == "cutlass" or k not in CUTLASS_ONLY
    ],
)
def test_the_output_equals_sglangs_default_load(sources, tmp_path, kind, backend, tp):
    from tests import sglang_moe as sm
    from tests.test_sglang_plugin import _model

    src, layers = sources(kind), FAMILIES[kind][1]
    out = _convert(src, tmp_path / "out", "bf16", backend, tp)
    assert sorted(read(out)["layers"]) == layers
    for rank in range(tp):
        rope = mock.patch(f"{ROPE}.get_device", lambda: "cpu")  # (imported in the context)
        with (
            sm.sglang_context(backend, tp, rank),
            rope if kind in ROPE_ON_CPU else contextlib.nullcontext(),
            _attn_tp(tp, rank) if kind in ATTN_TP else contextlib.nullcontext(),
        ):
            ours = _model(None, out, "fi-convert", backend, trust_remote_code=True)
            theirs = _model(None, src, "auto", backend, trust_remote_code=True)
        assert type(theirs).__name__ == type(ours).__name__ == _architecture(src)
        moe = _moe(theirs)
        assert sorted(moe) == layers
        assert {(m.moe_tp_size, m.moe_tp_rank) for m in moe.values()} == {(tp, rank)}
        assert _differences(ours, theirs) == ([], {}), f"rank {rank} of {tp}"


@contextlib.contextmanager
def _attn_tp(tp: int, rank: int):
    """The attention TP group's size and rank as `--tp tp` without DP attention has them (call
    inside sglang_context)."""
    from sglang.srt.runtime_context import get_parallel

    with get_parallel().override(attn_tp_size=tp, attn_tp_rank=rank):
        yield


def _architecture(src: Path) -> str:
    """config.json's architecture: SGLang's own model class of that name (not its
    Transformers backend)."""
    return json.loads((src / "config.json").read_text())["architectures"][0]


@pytest.mark.parametrize("kind", sorted(FAMILIES))
def test_a_vllm_output_is_refused_in_one_line(sources, tmp_path, kind):
    """vLLM 0.33's registry has no model class for the family's architecture: fi-convert
    writes no vLLM output of it (planned and refused before anything is written)."""
    from fi_convert import Backend, Options, SchemeName, convert
    from fi_convert.errors import SchemeMismatchError

    src = sources(kind)
    with pytest.raises(SchemeMismatchError, match="vLLM 0.33 has no model class for") as e:
        convert(src, tmp_path / "out", Options(SchemeName.BF16, Backend.CUTLASS, 1), device="cpu")
    assert "\n" not in str(e.value) and str(e.value).endswith("convert with --server sglang")
    assert not (tmp_path / "out").exists()


def test_iquest_q1s_own_check_sees_every_parameter_filled(sources, tmp_path):
    """IQuest Q1's load_weights ends in check_all_params_loaded, which refuses a load that
    fills not every parameter: handed the non-expert tensors alone (how the plugin calls it),
    SGLang's own model refuses; the plugin marks the converted layers' parameters meanwhile
    (`_skip_weight_check`, SGLang's mark of a parameter no checkpoint tensor fills), and no
    mark is left after its load."""
    from safetensors.torch import load_file

    from tests import sglang_moe as sm
    from tests.test_sglang_plugin import _model

    src = sources("iquest_q1")
    out = _convert(src, tmp_path / "out", "bf16", "trtllm", 1)
    tensors = {}
    for shard in sorted(src.glob("*.safetensors")):
        tensors |= load_file(shard)
    others = [(n, t) for n, t in tensors.items() if ".mlp.experts." not in n]
    with sm.sglang_context("trtllm", 1, 0):
        theirs = _model(None, src, "auto", "trtllm")
        ours = _model(None, out, "fi-convert", "trtllm")
    with pytest.raises(ValueError, match="2 parameters were not found in the checkpoint"):
        theirs.load_weights(others)
    assert not [n for n, p in ours.named_parameters() if hasattr(p, "_skip_weight_check")]


def test_an_sglang_refusal_names_no_vllm_output_for_them(sources):
    """Where SGLang refuses a scheme for such a family, the line names SGLang's schemes and no
    vLLM output (vLLM has no model class for it: the line named one before)."""
    from fi_convert import Backend, Options, SchemeName, make_plan
    from fi_convert.errors import SchemeMismatchError

    opts = Options(SchemeName.FP8_TENSOR, Backend.TRTLLM, 1, server="sglang")
    with pytest.raises(SchemeMismatchError) as e:
        make_plan(sources("sdar_moe"), opts)
    assert str(e.value).endswith("servable for sglang instead: --scheme bf16 (trtllm, cutlass)")


def test_grok1_on_sglangs_trtllm_bf16_runner_is_refused(sources, tmp_path):
    """Why Grok-1 has no TRT-LLM case: SGLang's Grok1MoE builds FusedMoE with gelu experts
    (models/grok.py; SGLang's gelu is the tanh GELU, gelu_tanh), which its FlashInfer TRT-LLM
    BF16 runner does not take (silu and relu2 alone): refused at plan time in one line naming
    the runner, nothing written; its routing (softcapped logits, SGLang's
    custom_routing_function: a standard top-k output any runner takes) is not the reason."""
    import inspect

    from sglang.srt.models import grok

    from fi_convert.errors import SchemeMismatchError

    assert 'activation="gelu"' in inspect.getsource(grok.Grok1MoE.__init__)
    with pytest.raises(
        SchemeMismatchError, match="flashinfer_trtllm MoE runner takes no gelu_t"
    ) as e:
        _convert(sources("grok1"), tmp_path / "out", "bf16", "trtllm", 1)
    assert "\n" not in str(e.value) and not (tmp_path / "out").exists()


def test_grok1s_own_check_sees_the_converted_layers_filled(sources, tmp_path):
    """Grok-1's load_weights checks itself that it filled every parameter but scales
    (check_hit_names), not reading SGLang's `_skip_weight_check` mark: handed the non-expert
    tensors alone (how the plugin calls it), SGLang's own model refuses. The plugin runs it with
    that check off and makes the same check after, the converted layers' parameters counted as
    filled: a non-expert tensor missing is still refused, in one line; and nothing of it is left
    on the model after."""
    from safetensors.torch import load_file

    from fi_convert.servers.sglang.checks import PluginError
    from fi_convert.servers.sglang.loader import _own_check_counting
    from tests import sglang_moe as sm
    from tests.test_sglang_plugin import _model

    src = sources("grok1")
    tensors = {}
    for shard in sorted(src.glob("*.safetensors")):
        tensors |= load_file(shard)
    others = [(n, t) for n, t in tensors.items() if ".block_sparse_moe.experts." not in n]
    with sm.sglang_context("cutlass", 1, 0):
        model = _model(None, src, "auto", "cutlass")
    with pytest.raises(ValueError, match="some weights are missing"):
        model.load_weights(others)
    filled = {id(p) for m in _moe(model).values() for p in m.parameters()}
    with _own_check_counting(model, filled):
        model.load_weights(others)
        with pytest.raises(PluginError, match="filled no model.norm.weight") as e:
            model.load_weights([(n, t) for n, t in others if n != "model.norm.weight"])
    assert "\n" not in str(e.value) and "load_weights" not in vars(model)
    assert str(e.value).endswith("; convert again from the whole checkpoint")
