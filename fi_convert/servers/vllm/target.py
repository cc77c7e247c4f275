"""Every fact about vLLM that the converter needs: the releases an output targets, where vLLM
runs each backend, what it cannot serve and why, and its serve line. It imports no vLLM, and
only the core's `target` interface: the converter reads it through `fi_convert.servers`, the
plugin beside it imports it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ...families import served_architectures
from ...target import VLLM_LAYOUT, Layout, Refusal, release_rows
from .. import architectures as arch_facts
from . import releases
from . import routing as routing_facts

NOTE = (
    "MoE experts pre-shuffled into FlashInfer kernel layouts by fi-convert: serve with "
    "`vllm serve DIR --load-format fi-convert` (fi-convert's vLLM plugin: fi-convert installed "
    "with its vllm extra)"
)

MOE_BACKEND_FLAG = {"trtllm": "flashinfer_trtllm", "cutlass": "flashinfer_cutlass"}
# mxfp4/cutlass is vLLM's MXFP8-activation CUTLASS path, which vLLM picks from this override
MXFP8_ACTIVATION = """--quantization-config '{"moe": {"activation": "mxfp8"}}'"""


# Schemes whose experts fi-convert's vLLM plugin serves under expert parallelism, from a
# --tp-size 1 output at any EP size (servers.vllm.checks says why the others are refused).
EP_SCHEMES = ("bf16", "fp8-block")


# What an output targets: the vLLM and FlashInfer releases whose load-time processing gives its
# bytes, and the GPUs where vLLM runs its backend. Beside these, `vllm_releases` (and
# `vllm_releases_left_out`) from the output's layers: `VllmTarget.release_fields`.
TARGET = {
    "vllm": releases.REFERENCE,  # the release the bytes are computed as
    "flashinfer": "0.7.2.post1",
    "flashinfer_layouts": "0.6.18-0.7.4",
    # The vLLM releases a plugin that reads no `vllm_releases` (fi-convert before it) serves
    # the output with: the one it was proven on. This fi-convert's plugin reads the list.
    "vllm_versions": "==" + releases.REFERENCE,
    "flashinfer_versions": ">=0.6.18,<0.7.5",
}
# Where vLLM 0.33 runs each FlashInfer backend and scheme: TRT-LLM on the SM10x family only
# (is_device_capability_family(100)); CUTLASS (FlashInferExperts._supports_current_device and
# _supports_quant_scheme) on SM90, SM10x and SM12x, never SM11x: block FP8 on SM90 only, NVFP4
# and MXFP4 x MXFP8 on SM100 and later ("sm100+": SM10x, SM12x), BF16 and static per-tensor
# FP8 on SM90 and later ("sm90+": SM90, SM10x, SM12x). vLLM has no CUTLASS MXFP8 path.
# Sources whose MoE method (the one vLLM builds from the output's quantization config, the
# source's) the plugin does not set up yet (checks.NOT_YET): an output of them would not load.
SOURCES_NOT_YET: dict[tuple[str, str | None], str] = {
    ("fp8-tensor", "fp8"): (
        "an FP8 (quant_method fp8) per-tensor source: vLLM 0.33 reads it with Fp8MoEMethod, "
        "whose FlashInfer per-tensor kernel setup fi-convert's vLLM plugin does not build yet "
        "(it builds ModelOpt FP8's and compressed-tensors W8A8 FP8's), so it would refuse the "
        "output"
    ),
    ("nvfp4", "compressed-tensors"): (
        "a compressed-tensors NVFP4 source: vLLM 0.33 reads it with "
        "CompressedTensorsW4A4Nvfp4MoEMethod, whose kernel setup fi-convert's vLLM plugin does "
        "not build yet (it builds ModelOpt NVFP4's), so it would refuse the output"
    ),
    ("mxfp8", "compressed-tensors"): (
        "a compressed-tensors MXFP8 source: vLLM 0.33 reads it with "
        "CompressedTensorsW8A8Mxfp8MoEMethod, whose kernel setup fi-convert's vLLM plugin does "
        "not build yet (it builds ModelOpt MXFP8's), so it would refuse the output"
    ),
}
# what serves instead, for each scheme of SOURCES_NOT_YET
SOURCES_THAT_SERVE = {
    "fp8-tensor": "a ModelOpt or compressed-tensors FP8 source",
    "nvfp4": "a ModelOpt NVFP4 source",
    "mxfp8": "a ModelOpt MXFP8 source",
}
# Architectures of a family that vLLM 0.33 serves through its generic Transformers backend
# (registry: ("transformers", "TransformersMoEForCausalLM")), whose MoE layer routes with the
# model's own router function where its MoEBlockFuser does not take the block over
# (models/transformers/moe.py: custom_routing_function, so CustomRoutingRouter says Custom
# routing), whatever the family's router computes: vLLM runs them on the kernels that take
# Custom routing (tests/test_vllm_families.py: Hunyuan-A13B, Kolibri1). Where the fuser takes
# the block over (FlexOlmo's and Mellum's softmax routers), vLLM routes it itself as the
# family's routing data says, and that family is not listed here
TRANSFORMERS_BACKEND = {
    "HunYuanMoEV1ForCausalLM": "Hunyuan-A13B",
    "Kolibri1ForCausalLM": "Kolibri1",
}
# Architectures of a family that vLLM 0.33's registry has no model class for (SGLang alone
# serves them: its own model classes prove those families), by title: fi-convert writes no vLLM
# output of them (vLLM would not build the model, or would take its Transformers backend)
NO_MODEL_CLASS: dict[str, str] = {
    "SDARMoeForCausalLM": "SDAR MoE",
    "LLaDA2MoeModelLM": "LLaDA 2 MoE",
    "XllmForCausalLM": "Xllm",
    "IQuestQ1ForCausalLM": "IQuest Q1",
    "DotsVLMForCausalLM": "dots.vlm",
    "GigaChat35ForCausalLM": "GigaChat 3.5",
    # (vLLM's registry lists Grok-1's two names among the classes it dropped, in 0.24)
    "Grok1ForCausalLM": "Grok-1",
    "Grok1ModelForCausalLM": "Grok-1",
    # (0.34's registry lists ZayaForCausalLM; 0.30 to 0.33 have none)
    "ZayaForCausalLM": "ZAYA1",
}
# Architectures vLLM 0.33 has a model class for, over a language model a family takes (by its
# language_config), whose output fi-convert has not proven against vLLM's own load, by title and
# why that load is not run here (read from vLLM's model code): fi-convert writes no vLLM output
NOT_PROVEN: dict[str, tuple[str, str]] = {
    "DeepseekVLV2ForCausalLM": (
        "DeepSeek-VL2",
        "its model (models/deepseek_vl2.py) builds its vision tower with timm "
        "(vit_so400m_patch14_siglip_384), which fi-convert's tests do not install",
    ),
    "DeepseekOCRForCausalLM": (
        "DeepSeek-OCR",
        "its model (models/deepseek_ocr.py) builds SAM ViT-B and CLIP-L towers of a fixed size "
        "whatever config.json says, and reads its image token from the checkpoint's tokenizer",
    ),
    # MiniMax-M3's text model alone (families/minimax_m3.json names it): vLLM 0.33's config
    # registry holds its own MiniMaxM3Config for model_type minimax_m3_vl (the published whole
    # model, proven: tests/test_vllm_families.py), none for the text model's, whose config.json
    # transformers 5.20's MiniMaxM3VLTextConfig reads (seen: hidden_act silu, no moe_layer_freq)
    "MiniMaxM3SparseForCausalLM": (
        "MiniMax-M3's text model",
        "no checkpoint of it alone is published, and vLLM reads its config.json with "
        "transformers 5.20's MiniMaxM3VLTextConfig (its own config class is for the whole "
        "model, minimax_m3_vl), which rewrites hidden_act swigluoai to silu, which vLLM's "
        "MiniMaxM3MLP refuses",
    ),
}
# Architectures whose vLLM 0.33 model class builds its experts with a MoE method of its own whose
# kernel setup the plugin cannot run on converted experts, by architecture: (title, why). No
# family file names them; a user's family file (--family) would plan them, so they are refused
# before anything is written. Muse Spark (vllm/models/muse_spark/nvidia/muse_moe_runner.py):
# MuseSparkRoutedExperts gives every layer but ModelOpt NVFP4 ones MuseSparkUnquantizedFusedMoE
# (an FP8 output's experts too), which takes TRT-LLM on SM100 whatever --moe-backend says and
# Triton on SM90; its _setup_kernel hooks the post-expert RMSNorm (MusePostExpertFinalize) into
# the experts after UnquantizedFusedMoEMethod._setup_kernel has converted the weights, and
# vLLM's pre-processed mode (UnquantizedFusedMoEMethod.process_weights_after_loading under
# weights_already_processed, the plugin's kernel-only setup) builds the kernel alone, without
# _setup_kernel: running that instead would convert the converted experts again
OWN_MOE_METHOD: dict[str, tuple[str, str]] = {
    "MuseSparkForConditionalGeneration": (
        "Muse Spark",
        "its experts run on vLLM 0.33's own MoE methods for it, MuseSparkUnquantizedFusedMoE "
        "(every layer but ModelOpt NVFP4 ones), which takes FlashInfer's TRT-LLM kernels "
        "whatever the backend and hooks a post-expert RMSNorm into them in its _setup_kernel, "
        "after converting the checkpoint's weights: vLLM's pre-processed mode, which "
        "fi-convert's vLLM plugin runs on converted experts, skips both; and "
        "MuseSparkModelOptNvFp4FusedMoE, which converts the weights in every mode",
    ),
}
# Architectures whose vLLM 0.33 model runs some MoE layers with an activation no FlashInfer MoE
# kernel lists, by architecture: what vLLM does with them. Step-3.5 (models/step3p5.py: a
# layer with a swiglu_limits entry runs swiglustep) and Step-3.7 (models/step3p7.py: its
# language model built through vLLM's registry from text_config, Step-3.5's). The Step-3.5
# family (families/step3p5.json) plans to these lines for vLLM, and a user's family file of
# Step-3.7 (--family); SGLang refuses both for its own reason (servers/sglang/target.py)
NO_FLASHINFER_ACTIVATION: dict[str, str] = {
    "Step3p5ForCausalLM": "runs Step-3.5's (Step3p5ForCausalLM) MoE layers",
    "Step3p7ForConditionalGeneration": (
        "builds Step-3.7's (Step3p7ForConditionalGeneration) language model as Step-3.5's "
        "(models/step3p7.py) and runs its MoE layers"
    ),
}
GPU_FAMILY = {
    ("trtllm", None): "sm100",
    ("cutlass", "fp8-block"): "sm90",
    ("cutlass", "nvfp4"): "sm100+",
    ("cutlass", "mxfp4"): "sm100+",  # FLASHINFER_CUTLASS_MXFP4_MXFP8
    ("cutlass", None): "sm90+",  # bf16, fp8-tensor
}


# The backends vLLM 0.33 has no FlashInfer path for, by (scheme, backend), where a scheme has
# none of that layout for it; any other such pair: "vLLM has no such path".
NO_PATH = {
    ("mxfp8", "cutlass"): "vLLM 0.33 has no FlashInfer CUTLASS MXFP8 path",
}


class VllmTarget:
    """vLLM 0.33 as a `fi_convert.target.ServerTarget`."""

    name = "vllm"
    label = "vLLM"
    versions = TARGET
    ep_schemes = EP_SCHEMES

    def marker_note(self, scheme: str, backend: str, tp: int) -> str:
        return NOTE

    def no_path(self, scheme: str, backend: str) -> str:
        return NO_PATH.get((scheme, backend), "vLLM has no such path")

    def refuses(self, scheme: str, backend: str) -> str | None:
        return None  # every scheme's layout on each of its backends is vLLM's

    def refuses_source(
        self,
        scheme: str,
        backend: str,
        quant_method: str | None,
        architectures: Sequence[str] = (),
        config: Mapping | None = None,
    ) -> str | None:
        # (each scheme's source formats: unservable() refuses the plugin's gaps; config.json's
        # fields refuse nothing of vLLM's: a latent Kimi Linear is its KimiLinearForCausalLM's)
        own = next((a for a in architectures if a in OWN_MOE_METHOD), None)
        if own:
            title, own_why = OWN_MOE_METHOD[own]
            return (
                f"vLLM 0.33 cannot serve a converted {title} ({own}): {own_why}; serve the "
                "checkpoint as it is"
            )
        swiglustep = next((a for a in architectures if a in NO_FLASHINFER_ACTIVATION), None)
        if swiglustep:
            return (
                f"vLLM 0.33 {NO_FLASHINFER_ACTIVATION[swiglustep]} that have a swiglu_limits "
                "entry with its swiglustep activation (models/step3p5.py), which no FlashInfer "
                "MoE kernel lists (TRT-LLM's and CUTLASS's _supports_activation); serve the "
                "checkpoint as it is"
            )
        absent = next((a for a in architectures if a in NO_MODEL_CLASS), None)
        if absent:
            return (
                f"vLLM 0.33 has no model class for {NO_MODEL_CLASS[absent]} ({absent}); "
                "convert with --server sglang"
            )
        # the server picks its model class by config.json's own architectures (those of a
        # wrapper's language model aside), as the output's manifest records them
        unserved = arch_facts.unserved("vllm", served_architectures(dict(config or {})))
        if unserved:  # (a wrapper over a family's language model, of a class no release has)
            return (
                f"no vLLM release serves its model ({unserved}), so none could serve its "
                "output; see whether SGLang does (inspect --server sglang), or serve the "
                "checkpoint as it is"
            )
        unproven = next((a for a in architectures if a in NOT_PROVEN), None)
        if unproven:
            title, reason = NOT_PROVEN[unproven]
            return (
                f"fi-convert has not proven an output of {title} ({unproven}) against vLLM "
                f"0.33's own load: {reason}; serve the checkpoint as it is"
            )
        arch = next((a for a in architectures if a in TRANSFORMERS_BACKEND), None)
        why = arch and routing_facts.refuses_moe(scheme, backend, "Custom", "silu", None)
        if not (arch and why):
            return None
        return (
            f"vLLM 0.33 serves {TRANSFORMERS_BACKEND[arch]} ({arch}) through its generic "
            "Transformers backend (TransformersMoEForCausalLM), which routes its experts with "
            f"the model's own router function: {why}"
        )

    def refuses_moe(
        self, scheme: str, backend: str, routing: str, activation: str, swiglu_limit: float | None
    ) -> str | None:
        return routing_facts.refuses_moe(scheme, backend, routing, activation, swiglu_limit)

    def moe_kernel(self, scheme: str, backend: str, routing: str) -> str:
        return routing_facts.kernel(scheme, backend, routing)

    def layout(self, scheme: str, backend: str) -> Layout:
        return VLLM_LAYOUT

    def unservable(
        self,
        scheme: str,
        backend: str,
        layers: Sequence[Mapping],
        quant_method: str | None = None,
    ) -> Refusal | None:
        """Why vLLM 0.33 cannot serve this output as planned (fi-convert's plugin refuses it),
        or None. A source whose MoE method the plugin does not set up (SOURCES_NOT_YET); FP8
        per-tensor experts without static activation scales: vLLM's FlashInfer FP8 per-tensor
        kernels (TRT-LLM and CUTLASS) take only static ones."""
        why = SOURCES_NOT_YET.get((scheme, quant_method))
        if why:
            return Refusal(why, SOURCES_THAT_SERVE[scheme])
        if scheme != "fp8-tensor":
            return None
        dynamic = [lay for lay in layers if lay.get("activation_scheme") == "dynamic"]
        if not dynamic:
            return None
        bf16 = str(dynamic[0].get("source_format", "")).startswith("bf16")
        src = "the experts are BF16" if bf16 else "the experts have no input_scale"
        why = (
            f"{src}, so the output has no static activation scales, which vLLM 0.33's "
            "FlashInfer FP8 per-tensor kernels need (fi-convert's vLLM plugin refuses such an "
            "output)"
        )
        return Refusal(why, "a source with static activation scales (ModelOpt FP8)")

    def gpu_family(self, backend: str, scheme: str) -> str:
        return GPU_FAMILY.get((backend, scheme)) or GPU_FAMILY[(backend, None)]

    def release_fields(self, m: Mapping) -> dict:
        """`vllm_releases`: the releases proven to hold the bytes of an output's layers (`m`:
        its scheme, backend and layer entries; releases.py); `vllm_releases_left_out`, where
        proven releases cannot, why."""
        fields: dict[str, object] = {"vllm_releases": releases.proven_for(m)}
        why = releases.left_out(m)
        if why:
            fields["vllm_releases_left_out"] = why
        return fields

    def ep_note(self, scheme: str, layers: Mapping[str, dict]) -> str:
        # FP8 per-tensor activation scales are a max over experts, which vLLM takes over a
        # rank's local experts under EP; NVFP4 on FlashInfer uses the global max (use_global_sf)
        static = any(lay.get("activation_scheme") == "static" for lay in layers.values())
        if scheme == "fp8-tensor" and static:
            return (
                "EP size 1: activation scales are the max over all experts; under EP vLLM "
                "takes the max over a rank's local experts"
            )
        return "any EP size: ranks take whole experts, whose bytes do not change"

    def serve_command(self, where: str, scheme: str, backend: str, tp: int, ep: int = 0) -> str:
        """The `vllm serve` line for an output (a folder or a Hub repo id) with fi-convert's
        plugin; with `ep`, on that many GPUs with expert parallelism (a tp 1 output of
        `ep_schemes`)."""
        cmd = f"vllm serve {where} --load-format fi-convert -tp {ep or tp} "
        if ep:
            cmd += "--enable-expert-parallel "
        cmd += f"--moe-backend {MOE_BACKEND_FLAG.get(backend, backend)}"
        if (scheme, backend) == ("mxfp4", "cutlass"):
            cmd += " " + MXFP8_ACTIVATION
        return cmd

    def card_rows(self, target: Mapping) -> list[str]:
        rows = release_rows(self.label, target.get("vllm"), target)
        listed = target.get("vllm_releases")
        if listed:
            rows.insert(1, f"| vLLM releases that serve it | {', '.join(listed)} |")
        return rows

    def card_section(self, m: Mapping, repo_id: str) -> list[str]:
        """The model card's lines on serving the output (a Hub repo) with fi-convert's plugin."""
        scheme, backend, tp, t = m["scheme"], m["backend"], m["tp_size"], m["target"]
        version = m["fi_convert_version"]
        lines = [
            f"**vLLM.** The expert bytes are those vLLM {t.get('vllm')} with FlashInfer "
            f"{t.get('flashinfer')} holds after `process_weights_after_loading`. Serve it with "
            "fi-convert's vLLM plugin, which loads them straight into the MoE layers and runs "
            f"kernel setup only. fi-convert is not on PyPI: install fi-convert {version} with "
            'its `vllm` extra from a clone of its repository (`pip install ".[vllm]"`) or '
            "from its wheel (`make wheel`, then `pip install "
            f'"dist/fi_convert-{version}-py3-none-any.whl[vllm]"`), then:',
            "",
            "```",
            self.serve_command(repo_id, scheme, backend, tp),
            "```",
            "",
        ]
        if tp == 1 and scheme in self.ep_schemes:
            lines += [
                "With expert parallelism (each GPU holds whole experts; any number of GPUs, "
                "here 8):",
                "",
                "```",
                self.serve_command(repo_id, scheme, backend, tp, ep=8),
                "```",
                "",
            ]
        return [
            *lines,
            f"It serves on vLLM {served(t)} (each proven with that release's own code); "
            f"{t.get('vllm_releases_left_out') or 'no other vLLM release is proven'}. The plugin "
            "refuses, before loading anything, another vLLM release, another TP size, another "
            f"MoE backend, or a GPU outside the {t.get('gpu_family')} family. Stock `vllm serve` "
            "without `--load-format fi-convert` must not be used on this repo.",
            "",
        ]


def served(target: Mapping) -> str:
    """The releases an output's target lists, in words ("0.30.0, 0.31.0 or 0.34.0")."""
    listed = list(target.get("vllm_releases") or [target.get("vllm")])
    return " or ".join([", ".join(listed[:-1]), listed[-1]] if len(listed) > 1 else listed)


VLLM = VllmTarget()
