"""The SGLang plugin under expert parallelism (fi_convert/servers/sglang/experts.py
`local_experts`, checks.py `check_expert_parallel`), with SGLang 0.5.23's own code as the
authority on CPU (tests/sglang_moe.py: its FusedMoE built as rank r of `--tp N --ep-size N`, the
ranks and sizes as SGLang derives them from its ServerArgs: MoE EP size N, EP rank r, MoE TP
size 1).

A `--tp-size 1` output serves every EP size that divides the expert count: SGLang gives EP
rank r the experts [r*E/N, (r+1)*E/N) whole, with the bytes of TP 1. For each EP size (2, 4)
and each rank, for BF16 (TRT-LLM, padded and not, and CUTLASS) and DeepSeek FP8 block
(TRT-LLM):
(a) the parameters SGLang holds after its own EP loading and processing of the source equal
    the output's slices of that rank's experts, byte for byte;
(b) the plugin's path (install: only the rank's experts read, into the parameters SGLang
    allocated; finish: kernel setup) leaves the layer as SGLang's own path does: every
    parameter, every attribute of the layer, its method and runner, every parameter's
    attributes.
Negative controls: another rank's experts are caught; the refusals (schemes not proven under
EP, a TP split, a MoE TP size other than 1, EPLB, redundant experts, another placement, an
expert count the EP size does not divide) are one line naming the fix.
"""

from __future__ import annotations

import contextlib
import json
import types
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
import torch

from fi_convert import Backend, Options, SchemeName, convert
from fi_convert.format.names import MANIFEST_NAME
from fi_convert.format.reader import OutputReader
from fi_convert.servers.sglang import checks, experts, target
from fi_convert.servers.sglang.checks import PluginError
from fi_convert.testing.synthetic import Spec, write_checkpoint
from tests import sglang_moe as sm
from tests import test_sglang_plugin as tp

QWEN, MIXTRAL = tp.QWEN, tp.MIXTRAL
CASES = {
    # 8 experts (4 and 2 per rank); I 192: TRT-LLM pads it to 256
    "qwen3": (Spec("qwen3-moe", layers=1, experts=8, hidden=128, intermediate=192), QWEN),
    # 8 experts, I 512, two shards
    "mixtral": (
        Spec("mixtral", layers=1, experts=8, hidden=128, intermediate=512, shards=2),
        MIXTRAL,
    ),
    # DeepSeek FP8 128x128 block (fp8-block), 8 experts
    "deepseek": tp.CASES["deepseek"],
    # ModelOpt NVFP4 (its input scales global parameters in SGLang), 8 experts, I 384
    "nvfp4": (
        Spec("deepseek-v3", layers=2, experts=8, hidden=256, intermediate=384, quant="nvfp4"),
        "model.layers.1.mlp.experts",
    ),
    # ... with DeepSeek's SwiGLU clamp (TRT-LLM rescales the block scales of experts whose up
    # global scale is not the gate's: test_sglang_plugin's CLAMP_UP)
    "nvfp4-clamp": (
        Spec(
            "deepseek-v3",
            layers=2,
            experts=8,
            hidden=256,
            intermediate=384,
            quant="nvfp4",
            config={"swiglu_limit": 10.0},
        ),
        "model.layers.1.mlp.experts",
    ),
    # ModelOpt MXFP8, 8 experts, I 320 (padded to 384)
    "mxfp8": (
        Spec("qwen3-moe", layers=1, experts=8, hidden=384, intermediate=320, quant="mxfp8"),
        QWEN,
    ),
    # gpt-oss MXFP4 (flashinfer_mxfp4): SM100 (TRT-LLM), H 320 (padded to 512); SM90, H 576
    "gpt-oss": (
        Spec("gpt-oss", layers=2, experts=8, hidden=320, intermediate=192),
        "model.layers.1.mlp.experts",
    ),
    # ModelOpt FP8 per-tensor, 4 experts (refused under EP: its scales)
    "fp8-tensor": (
        Spec("qwen3-moe", layers=1, experts=4, hidden=128, intermediate=256, quant="fp8-tensor"),
        QWEN,
    ),
    "gpt-oss-h576": (
        Spec("gpt-oss", layers=2, experts=8, hidden=576, intermediate=384),
        "model.layers.1.mlp.experts",
    ),
}
PAIRS = [("qwen3", "trtllm"), ("qwen3", "cutlass"), ("mixtral", "trtllm"), ("deepseek", "trtllm")]
PAIRS += [("nvfp4", "trtllm"), ("nvfp4", "cutlass"), ("nvfp4-clamp", "trtllm")]
PAIRS += [("mxfp8", "trtllm")]
PAIRS += [("gpt-oss", "trtllm"), ("gpt-oss-h576", "cutlass")]
# (case, backend, EP size, MoE TP size): --tp ep*moe_tp --ep-size ep; MoE TP 2 where SGLang
# allows --ep-size other than --tp (not flashinfer_cutlass; gpt-oss's SM90 runs on
# flashinfer_mxfp4)
PARAMS = [(case, backend, ep, 1) for case, backend in PAIRS for ep in (2, 4)]
PARAMS += [(c, b, 2, 2) for c, b in PAIRS if b == "trtllm" or c == "gpt-oss-h576"]


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("sgl-ep-src")
    done: dict = {}

    def get(case: str) -> Path:
        if case not in done:
            done[case] = write_checkpoint(root / case, CASES[case][0])
            if case == "nvfp4-clamp":  # on rank 0 and on rank 1 of EP 2
                sm.set_up_scales(done[case], CASES[case][1], {1: 1.3, 6: 0.7})
        return done[case]

    return get


@pytest.fixture(scope="module")
def outputs(tmp_path_factory, sources):
    """fi-convert's --server sglang output of (case, backend) at --tp-size `tp` (1: every EP
    size)."""
    root = tmp_path_factory.mktemp("sgl-ep-out")
    done: dict = {}

    def get(case: str, backend: str, tp_size: int = 1) -> Path:
        key = (case, backend, tp_size)
        if key not in done:
            out = root / "-".join(map(str, key))
            opts = Options(SchemeName.AUTO, Backend(backend), tp_size, server="sglang")
            convert(sources(case), out, opts, device="cpu")
            done[key] = out
        return done[key]

    return get


def sglang_layer(case, backend, ep, rank, ckpt, moe_tp=1):
    """SGLang's own layer of rank `rank` of `--tp ep*moe_tp --ep-size ep`, loaded and
    processed (EP rank rank // moe_tp, MoE TP rank rank % moe_tp)."""
    layer = sm.build(tp.sgl(case, backend), ep * moe_tp, rank, ckpt, CASES[case][1], ep=ep)
    n = layer.num_experts // ep
    want = (ep, rank // moe_tp, moe_tp, rank % moe_tp)
    assert (layer.moe_ep_size, layer.moe_ep_rank, layer.moe_tp_size, layer.moe_tp_rank) == want
    assert layer.num_local_experts == n < layer.num_experts
    assert layer.w13_weight.shape[0] == n
    return layer


def plugin_layer(case, backend, ep, rank, ckpt, out, moe_tp=1, **kw):
    """SGLang's layer of the rank, the output's experts installed by the plugin's path
    (`ids`: the negative control, the experts read instead of the rank's)."""
    prefix = CASES[case][1]
    ctx = sm.sglang_context(tp.sgl(case, backend), ep * moe_tp, rank, ep)
    with ctx, tp.platform(case, backend):
        layer = sm.make_layer(prefix, ckpt)
        before = {n: p.data.data_ptr() for n, p in layer.named_parameters()}
        with OutputReader(out) as reader:
            checks.check_layer(reader.manifest, str(out), prefix, layer)
            if "ids" in kw:
                with mock.patch.object(experts, "local_experts", lambda *a: kw["ids"]):
                    experts.install(layer, reader, prefix, layer.moe_tp_rank)
            else:
                experts.install(layer, reader, prefix, layer.moe_tp_rank)
        experts.finish(layer)
    return layer, before


@pytest.mark.parametrize(("case", "backend", "ep", "moe_tp"), PARAMS)
def test_sglangs_own_ep_layer_holds_the_outputs_expert_slices(
    case, backend, ep, moe_tp, sources, outputs
):
    """Each tensor of one row per expert: the rank's rows; the parameters SGLang keeps for
    every expert on every rank (`_sglang_require_global_experts`: NVFP4's input scales): the
    whole tensor (their processing's reductions over experts give the output's values)."""
    ckpt, out, prefix = sources(case), outputs(case, backend, moe_tp), CASES[case][1]
    for rank in range(ep * moe_tp):
        layer = sglang_layer(case, backend, ep, rank, ckpt, moe_tp)
        n, held = layer.num_local_experts, sm.params(layer)
        e0, t = layer.moe_ep_rank * n, layer.moe_tp_rank
        with OutputReader(out) as reader:
            names = list(reader.layer(prefix)["tensors"])
            assert names and set(names) <= set(held)
            whole = set()
            for name in names:
                _, shape, dtype = reader.info(prefix, name)
                glob = getattr(layer._parameters[name], "_sglang_require_global_experts", False)
                if glob or not shape or shape[0] != layer.num_experts:
                    whole.add(name)
                    want = torch.empty(shape, dtype=dtype)
                    reader.read_into(prefix, name, t, want)
                else:
                    want = torch.empty((n, *shape[1:]), dtype=dtype)
                    reader.read_experts_into(prefix, name, range(e0, e0 + n), want, tp_rank=t)
                assert tp._u8(held[name].contiguous()).equal(tp._u8(want)), (name, rank)
        # NVFP4: the input scales and their inverse maxima over all experts, the same values
        # on every EP rank (the output's)
        nvfp4 = {"w13_input_scale", "w2_input_scale", "w13_input_scale_quant"}
        nvfp4 |= {"w2_input_scale_quant"}
        assert whole == (nvfp4 if case.startswith("nvfp4") else set())


@pytest.mark.parametrize(("case", "backend", "ep", "moe_tp"), PARAMS)
def test_plugin_under_ep_leaves_the_layer_as_sglangs_own(
    case, backend, ep, moe_tp, sources, outputs
):
    ckpt, out = sources(case), outputs(case, backend, moe_tp)
    m = json.loads((out / MANIFEST_NAME).read_text())
    checks.check_manifest(
        m,
        str(out),
        tp_size=moe_tp,
        ep_size=ep,
        moe_runner_backend=sm.BACKEND[tp.sgl(case, backend)],
        sglang_version="0.5.23",
    )
    for rank in range(ep * moe_tp):
        theirs = sglang_layer(case, backend, ep, rank, ckpt, moe_tp)
        ours, before = plugin_layer(case, backend, ep, rank, ckpt, out, moe_tp)
        assert tp.differing(sm.params(theirs), sm.params(ours)) == [], rank
        diff = tp.state_diff(sm.layer_state(ours), sm.layer_state(theirs))
        assert diff == [], f"EP rank {rank}: attributes differ from SGLang's: {diff}"
        assert tp.param_attrs(ours) == tp.param_attrs(theirs)
        assert dispatcher_state(ours) == dispatcher_state(theirs)  # its EP ranks, quant config
        # read in place: the parameters SGLang allocated for the rank's experts (but where
        # its processing makes new ones: test_sglang_plugin's `fresh_storage`)
        fresh = tp.fresh_storage(case, backend)
        now = {n: p.data.data_ptr() for n, p in ours.named_parameters() if n not in fresh}
        assert now == {n: v for n, v in before.items() if n not in fresh}


def test_fp8_tensor_scales_under_ep_are_each_ranks_own(sources, outputs):
    """Why ModelOpt FP8 is refused under EP, by SGLang's own EP processing: its activation
    scales (the max over the experts a rank loads) differ by rank and from the output's (the
    max over all), while its weights are the output's slices."""
    case, backend = "fp8-tensor", "trtllm"
    ckpt, out, prefix = sources(case), outputs(case, backend), CASES[case][1]
    with OutputReader(out) as reader:
        _, shape, dtype = reader.info(prefix, "w13_input_scale")
        output_max = torch.empty(shape, dtype=dtype)
        reader.read_into(prefix, "w13_input_scale", 0, output_max)
    held = [sglang_layer(case, backend, 2, r, ckpt).w13_input_scale.data for r in (0, 1)]
    assert not torch.equal(held[0], held[1])
    assert max(held[0], held[1]).equal(output_max)  # one rank holds the global max
    assert not (held[0].equal(output_max) and held[1].equal(output_max))


def dispatcher_state(layer) -> dict:
    """What the layer's token dispatcher holds (its EP size, rank and local expert counts as
    SGLang set them, the quantization config processing gives it): plain values as they are,
    tensors as bytes, the rest by type."""
    state = {}
    for k, v in sorted(vars(layer.dispatcher).items()):
        if isinstance(v, torch.Tensor):
            state[k] = (str(v.dtype), tuple(v.shape), sm._bytes(v))
        elif isinstance(v, (int, float, str, bool, type(None))):
            state[k] = v
        elif isinstance(v, dict):
            state[k] = {
                kk: sm._bytes(vv) if isinstance(vv, torch.Tensor) else repr(vv)
                for kk, vv in v.items()
            }
        else:
            state[k] = type(v).__name__
    assert state.get("moe_ep_size") == layer.moe_ep_size, state
    return state


def test_control_another_ranks_experts_are_caught(sources, outputs):
    """EP rank 1 of 2 read with rank 0's experts (0..3): other bytes than SGLang's own, in the
    weights (and the scales), the state alone does not tell."""
    case, backend = "deepseek", "trtllm"
    ckpt, out = sources(case), outputs(case, backend)
    theirs = sglang_layer(case, backend, 2, 1, ckpt)
    ours, _ = plugin_layer(case, backend, 2, 1, ckpt, out, ids=[0, 1, 2, 3])
    assert tp.differing(sm.params(theirs), sm.params(ours)) == [
        "w13_weight",
        "w2_weight",
        "w13_weight_scale_inv",
        "w2_weight_scale_inv",
    ]
    assert tp.state_diff(sm.layer_state(ours), sm.layer_state(theirs)) == []
    ok, _ = plugin_layer(case, backend, 2, 1, ckpt, out, ids=[4, 5, 6, 7])  # the control
    assert tp.differing(sm.params(theirs), sm.params(ok)) == []


def test_the_rank_reads_only_its_experts(sources, outputs):
    """The plugin reads the rank's experts' byte ranges only (one span per tensor: they are
    consecutive), not the whole layer."""
    case, backend, ep = "qwen3", "cutlass", 4
    ckpt, out = sources(case), outputs(case, backend)
    seen: list[tuple[str, list[int]]] = []
    real = OutputReader.read_experts_into

    def spy(self, prefix, name, ids, dst, bulk=None, tp_rank=None):
        seen.append((name, list(ids), tp_rank))
        return real(self, prefix, name, ids, dst, bulk, tp_rank)

    whole = AssertionError("read_into: a TP rank's whole slice")
    with (
        mock.patch.object(OutputReader, "read_experts_into", spy),
        mock.patch.object(OutputReader, "read_into", side_effect=whole),
    ):
        plugin_layer(case, backend, ep, 3, ckpt, out)
    assert seen == [("w13_weight", [6, 7], 0), ("w2_weight", [6, 7], 0)]


def test_a_placement_other_than_the_rank_slots_is_refused(sources, outputs):
    """Where SGLang has an expert location (a server builds one), the logical experts it puts
    in the rank's physical slots must be the rank's experts: the trivial placement passes, a
    permuted one is refused at install."""
    case, backend = "qwen3", "trtllm"
    ckpt, out, prefix = sources(case), outputs(case, backend), CASES[case][1]
    where = "sglang.srt.eplb.expert_location.get_global_expert_location_metadata"
    for row, ok in ((list(range(8)), True), ([1, 0, 2, 3, 4, 5, 6, 7], False)):
        meta = types.SimpleNamespace(physical_to_logical_map=torch.tensor([row]))
        with sm.sglang_context(backend, 2, 0, 2):
            layer = sm.make_layer(prefix, ckpt)
            with mock.patch(where, return_value=meta), OutputReader(out) as reader:
                if ok:
                    experts.install(layer, reader, prefix, 0)
                    continue
                with pytest.raises(PluginError) as e:
                    experts.install(layer, reader, prefix, 0)
        msg = str(e.value)
        assert msg.startswith("fi-convert: ") and "\n" not in msg
        assert "places logical experts [1, 0, 2, 3] in EP rank 0's slots, not [0, 1, 2, 3]" in msg
        assert "start SGLang without --init-expert-location and --enable-eplb" in msg


# ---- the refusals, before anything loads ----


def _manifest(outputs, case="qwen3", backend="trtllm", tp_size=1):
    return json.loads((outputs(case, backend, tp_size) / MANIFEST_NAME).read_text())


def _check(m, **kw):
    args = dict(tp_size=1, ep_size=2, moe_runner_backend="flashinfer_trtllm")
    checks.check_manifest(m, "OUT", sglang_version="0.5.23", **(args | kw))


def test_a_tp1_output_of_the_proven_schemes_passes(outputs):
    for case, backend in PAIRS:
        m = _manifest(outputs, case, backend)
        for ep in (2, 4, 8):
            _check(m, ep_size=ep, moe_runner_backend=sm.BACKEND[tp.sgl(case, backend)])


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (
            dict(scheme="fp8-tensor"),
            "does not load fp8-tensor experts under expert parallelism (--ep-size 2): its "
            "activation scales are the max over all experts, and under EP SGLang takes the max "
            "over each rank's own; start SGLang with --ep-size 1",
        ),
        (
            dict(tp_size=2),
            "converted for tensor-parallel size 2, and under expert parallelism SGLang's MoE TP "
            "size is 1 (--tp / --ep-size); start SGLang with --tp 4 --ep-size 2, or convert "
            "again with --tp-size 1",
        ),
        (dict(moe_tp=2), "SGLang's MoE TP size is 2 (--tp / --ep-size); start SGLang with --tp 2"),
        (dict(eplb=True), "start SGLang without --enable-eplb"),
        (dict(redundant=8), "(--ep-num-redundant-experts 8); start SGLang without it"),
        (dict(placement="/tmp/x.json"), "start SGLang without --init-expert-location"),
        (dict(ep_size=3), "has 8 experts, which --ep-size 3 does not divide"),
        (dict(moe_dp_size=2), "(--moe-dp-size 2) yet; start SGLang with --moe-dp-size 1"),
        (dict(a2a="deepep"), "(--moe-a2a-backend deepep) yet; start SGLang without"),
    ],
)
def test_ep_refusals_name_the_fix(outputs, change, words):
    m = _manifest(outputs)
    for key in ("scheme", "tp_size"):
        if key in change:
            m = m | {key: change.pop(key)}
    if "moe_tp" in change:
        change["tp_size"] = change.pop("moe_tp")
    with pytest.raises(PluginError) as e:
        _check(m, **change)
    msg = str(e.value)
    assert msg.startswith("fi-convert: OUT: ") and "\n" not in msg
    assert words in msg


def test_an_expert_count_ep_does_not_divide_names_the_sizes_that_do(outputs):
    m = _manifest(outputs)
    with pytest.raises(PluginError, match=r"one of \[2, 4, 8\], or --ep-size 1"):
        _check(m, ep_size=3)
    with pytest.raises(PluginError, match="which --ep-size 16 does not divide"):
        _check(m, ep_size=16)


def test_a_layer_sglang_split_otherwise_is_refused(outputs):
    """The layers SGLang built under EP, against the output's: the control passes; another
    local expert count, a MoE TP split, or a TP-split output are refused."""
    m = _manifest(outputs)
    layer = tp._layer(num_experts=8, num_local_experts=4, moe_ep_size=2, moe_tp_size=1)
    layer.intermediate_size_per_partition = 256
    checks.check_layers(m, "OUT", {QWEN: layer})  # the control
    for change, words in (
        (dict(num_local_experts=8), "has 8 experts in the output and 8 (8 on this rank)"),
        (dict(moe_tp_size=2), "SGLang's MoE TP size is 2 (--tp / --ep-size)"),
    ):
        bad = types.SimpleNamespace(**(vars(layer) | change))
        with pytest.raises(PluginError, match=words.replace("(", r"\(").replace(")", r"\)")):
            checks.check_layers(m, "OUT", {QWEN: bad})
    with pytest.raises(PluginError, match="convert again with --tp-size 1"):
        checks.check_layers(m | {"tp_size": 2}, "OUT", {QWEN: layer})


def test_the_facts_say_where_ep_is_served(outputs):
    m = _manifest(outputs)
    assert target.SGLANG_TARGET.ep_schemes == ("bf16", "fp8-block", "nvfp4", "mxfp8", "mxfp4")
    assert set(target.SGLANG_TARGET.ep_schemes) | {"fp8-tensor"} == {s for s, _ in target.METHODS}
    assert m["expert_parallel"] == target.EP_NOTE
    assert target.SGLANG_TARGET.ep_note("fp8-tensor", {}).startswith("EP size 1: activation")
    line = target.SGLANG_TARGET.serve_command("DIR", "fp8-block", "trtllm", 1, ep=8)
    assert line.endswith("--moe-runner-backend flashinfer_trtllm --tp 8 --ep-size 8")
    card = "\n".join(target.SGLANG_TARGET.card_section(m, "acme/x"))
    assert "--tp 8 --ep-size 8" in card and "redundant experts (EPLB)" in card
    card = "\n".join(target.SGLANG_TARGET.card_section(m | {"tp_size": 2}, "acme/x"))
    assert "--tp 2 --disable" not in card and "--tp 16 --ep-size 8" in card
    card = "\n".join(target.SGLANG_TARGET.card_section(m | {"scheme": "fp8-tensor"}, "acme/x"))
    assert "--ep-size" not in card and "expert parallelism, or a GPU" in card  # no EP line


def test_an_older_outputs_note_is_still_a_field_fi_convert_wrote(outputs):
    """SGLang outputs written before the plugin served EP say "EP size 1" in `expert_parallel`
    (they serve under EP as well): the manifest check accepts that note, and only for SGLang."""
    from fi_convert.manifest import check_fields

    m = _manifest(outputs)
    assert check_fields(m) == []
    assert check_fields(m | {"expert_parallel": target.NO_EP_NOTE}) == []
    assert any("expert_parallel" in p for p in check_fields(m | {"expert_parallel": "any"}))
    vllm = _manifest(outputs) | {"server": "vllm", "target": {}}
    assert any(
        p.startswith("expert_parallel")
        for p in check_fields(vllm | {"expert_parallel": target.NO_EP_NOTE})
    )


# ---- the loader, whole models, and the launch line ----


@pytest.fixture(scope="module")
def hf_outputs(tmp_path_factory):
    """A transformers-written Qwen3-MoE (8 experts, two MoE layers) and its --server sglang
    outputs at --tp-size 1 and 2 (tests/hf_checkpoints.py)."""
    from tests import hf_checkpoints

    root = tmp_path_factory.mktemp("sgl-ep-hf")
    src = hf_checkpoints.save("qwen3_moe", root / "src")
    outs = {}
    for tp_size in (1, 2):
        outs[tp_size] = root / f"out-{tp_size}"
        opts = Options(SchemeName.AUTO, Backend("trtllm"), tp_size, server="sglang")
        convert(src, outs[tp_size], opts, device="cpu")
    return src, outs


@contextlib.contextmanager
def expert_location(src: Path, mapping: object = None) -> Iterator[object]:
    """SGLang's expert location, as its model runner sets it before it loads a model
    (`compute_initial_expert_location_metadata` of the model config, for this EP rank: trivial
    without --init-expert-location; with `mapping`, its `init_by_mapping` of that
    physical-to-logical map, as `--init-expert-location` gives one); none again after."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.eplb import expert_location as el
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(model_path=str(src), moe_runner_backend="flashinfer_trtllm")
    mc, rank = ModelConfig.from_server_args(args), get_parallel().moe_ep_rank
    if mapping is None:
        meta = el.compute_initial_expert_location_metadata(model_config=mc, moe_ep_rank=rank)
    else:
        meta = el.ExpertLocationMetadata.init_by_mapping(mc, mapping, moe_ep_rank=rank)
    el.set_global_expert_location_metadata(meta, allow_overwrite=True)
    try:
        yield meta
    finally:
        el.set_global_expert_location_metadata(None, allow_overwrite=True)


@pytest.mark.parametrize(
    ("tp_size", "rank", "located"),
    [(2, 0, False), (2, 1, False), (4, 0, False), (4, 1, False), (4, 2, False), (4, 3, False)]
    + [(2, 1, True), (4, 3, True)],
)
def test_a_whole_model_under_ep_equals_sglangs_default_load(
    tp_size, rank, located, hf_outputs, monkeypatch
):
    """SGLang's get_model_loader, rank `rank` of --tp `tp_size` --ep-size 2 (MoE TP size 1 and
    2): the plugin's loader (its checks of the running SGLang, the rank's experts of the
    output of the MoE TP size, the dense tensors by SGLang's own loaders at TP rank `rank`)
    against SGLang's default load of the source; `located`: with SGLang's expert location set
    as its model runner sets it (SGLang's weight loader then places experts by it)."""
    monkeypatch.setenv("FI_CONVERT_SGLANG_TEST_CPU", "1")  # no GPU here: skip its checks
    src, outs = hf_outputs
    moe_tp = tp_size // 2
    with sm.sglang_context("trtllm", tp_size, rank, 2):
        from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE

        reg = _registered()
        with expert_location(src) if located else contextlib.nullcontext() as meta:
            assert (meta is not None) is located
            ours = tp._model(reg, outs[moe_tp], "fi-convert", "trtllm")
            theirs = tp._model(reg, src, "auto", "trtllm")
    p, q = dict(ours.named_parameters()), dict(theirs.named_parameters())
    assert sorted(p) == sorted(q)
    assert tp.differing(q, p) == []
    moe = [m for m in theirs.modules() if isinstance(m, FusedMoE)]
    ranks = (rank // moe_tp, 4, moe_tp, rank % moe_tp)
    assert len(moe) == 2
    assert all(
        (m.moe_ep_rank, m.num_local_experts, m.moe_tp_size, m.moe_tp_rank) == ranks for m in moe
    )
    for name, m in theirs.named_modules():
        if isinstance(m, FusedMoE):
            assert sm.layer_state(ours.get_submodule(name)) == sm.layer_state(m)


def test_control_a_placement_sglang_loads_by_is_refused(hf_outputs, monkeypatch):
    """SGLang's expert location with logical experts 0 and 1 swapped (as --init-expert-location
    would give it): SGLang's own load puts expert 1's bytes in rank 0's first slot (so its
    location is used), and the plugin refuses the output rather than load expert 0 there."""
    monkeypatch.setenv("FI_CONVERT_SGLANG_TEST_CPU", "1")
    src, outs = hf_outputs
    swapped = [[1, 0, 2, 3, 4, 5, 6, 7]] * 2  # (layers, physical experts)
    with sm.sglang_context("trtllm", 2, 0, 2):
        reg = _registered()
        with expert_location(src, swapped):
            theirs = tp._model(reg, src, "auto", "trtllm")
            with pytest.raises(PluginError) as e:
                tp._model(reg, outs[1], "fi-convert", "trtllm")
        plain = tp._model(reg, src, "auto", "trtllm")
    w13 = "model.layers.0.mlp.experts.w13_weight"
    got, want = theirs.get_parameter(w13), plain.get_parameter(w13)
    assert torch.equal(got[0], want[1]) and torch.equal(got[1], want[0])
    msg = str(e.value)
    assert "places logical experts [1, 0, 2, 3] in EP rank 0's slots, not [0, 1, 2, 3]" in msg
    assert msg.startswith("fi-convert: ") and "\n" not in msg


def test_the_loader_refuses_a_tp_split_output_under_ep(hf_outputs, monkeypatch):
    monkeypatch.setenv("FI_CONVERT_SGLANG_TEST_CPU", "1")
    _, outs = hf_outputs
    with sm.sglang_context("trtllm", 2, 0, 2):
        reg = _registered()
        with pytest.raises(PluginError, match="convert again with --tp-size 1") as e:
            tp._model(reg, outs[2], "fi-convert", "trtllm")
    assert "\n" not in str(e.value)


def _registered():
    """fi-convert's plugin registered and SGLang's hooks applied (test_sglang_plugin's
    `registered`), inside the caller's SGLang context."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    from fi_convert.servers.sglang import register

    register()
    HookRegistry.apply_hooks()
    return HookRegistry


@pytest.mark.parametrize(
    ("tp_size", "ep", "words"),
    [
        (1, "--tp 2 --ep-size 2", None),
        (2, "--tp 4 --ep-size 2", None),
        (1, "--tp 4 --ep-size 2", "MoE TP size is 2 (--tp / --ep-size); start SGLang with --tp 2"),
        (2, "--tp 2 --ep-size 2", "start SGLang with --tp 4 --ep-size 2, or convert again with"),
        (1, "--tp 2 --ep-size 2 --enable-eplb", "start SGLang without --enable-eplb"),
    ],
)
def test_the_launch_line_with_ep_is_checked_before_anything_starts(hf_outputs, tp_size, ep, words):
    """SGLang's own argument parser and resolution, then its check_server_args (the launcher
    runs it before any scheduler process starts)."""
    _, outs = hf_outputs
    with sm.sglang_context("trtllm", 1, 0):
        from sglang.srt.server_args import prepare_server_args

        _registered()
        line = f"--model-path {outs[tp_size]} --load-format fi-convert --device cpu {ep}"
        args = prepare_server_args([*line.split(), "--moe-runner-backend", "flashinfer_trtllm"])
        args.resolve_once()
        if words is None:
            args.check_server_args()
            return
        with pytest.raises(PluginError, match=words.replace("(", r"\(").replace(")", r"\)")):
            args.check_server_args()
