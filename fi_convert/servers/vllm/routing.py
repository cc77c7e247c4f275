"""Which FlashInfer MoE kernels vLLM 0.33 runs a model's experts on, by the routing method its
router has and the experts' activation (read from vLLM 0.33.0's fused_moe/experts/ and
oracles; shared/reference/families.md "How the backend is chosen").

vLLM's oracle takes, for `--moe-backend flashinfer_trtllm`, the monolithic TRT-LLM experts when
their `_supports_routing_method` lists the model's routing method, else the modular ones where
they run under plain TP (FP8 block, MXFP8, NVFP4, MXFP4: the same weight conversion, so the
same bytes); BF16's modular class needs all2all EP kernels and FP8 per-tensor has none, so
those refuse a routing outside the list. CUTLASS (FlashInferExperts) is modular: any routing.
"""

from __future__ import annotations

_MONO = ("DeepSeekV3", "Llama4", "Renormalize", "RenormalizeNaive", "SigmoidRenorm", "MiniMax2")
# the routing methods of each scheme's monolithic TRT-LLM experts (experts/trtllm_*_moe.py)
MONOLITHIC = {
    "bf16": (*_MONO, "Sigmoid"),  # trtllm_bf16_moe.py:258-271
    "fp8-tensor": (*_MONO, "Sigmoid"),  # trtllm_fp8_moe.py:421-431
    "fp8-block": tuple(m for m in (*_MONO, "Sigmoid") if m != "Llama4"),  # :410-419
    "mxfp8": tuple(m for m in (*_MONO, "Sigmoid") if m != "Llama4"),
    "nvfp4": (*_MONO, "Sigmoid"),  # trtllm_nvfp4_moe.py:494-508
    "mxfp4": ("DeepSeekV3", "Renormalize", "RenormalizeNaive"),  # trtllm_mxfp4_moe.py:186-195
}
# schemes whose modular TRT-LLM experts run under plain TP (any routing method)
MODULAR = ("fp8-block", "mxfp8", "nvfp4", "mxfp4")
MODULAR_WHY = {
    "bf16": "its modular TRT-LLM BF16 experts run only with all2all EP kernels "
    "(trtllm_bf16_moe.py:138-146)",
    "fp8-tensor": "it has no modular TRT-LLM FP8 per-tensor experts (trtllm_fp8_moe.py:213-222 "
    "take block FP8 and MXFP8 only)",
}
# the activations each backend's experts take (_supports_activation). SwiGLU-OAI on [gate; up]
# halves (swigluoai_uninterleave, MiniMax-M3's) is listed by the TRT-LLM FP8 experts
# (trtllm_fp8_moe.py: per tensor, block FP8, MXFP8), the TRT-LLM NVFP4 ones and CUTLASS
# (flashinfer_cutlass_moe.py), not by TRT-LLM BF16 (trtllm_bf16_moe.py) nor MXFP4; its alpha,
# beta and clamp are kernel arguments, and vLLM's FlashInfer weight processing asks only
# whether the activation is gated (oracle/unquantized.py, prepare_fp8_moe_layer_for_fi,
# prepare_nvfp4_moe_layer_for_fi_or_cutlass: is_gated, the [up; gate] swap): silu's bytes
_OAI = "swigluoai_uninterleave"
ACTIVATIONS = {
    ("trtllm", "bf16"): ("silu", "relu2_no_mul"),
    ("trtllm", "fp8-tensor"): ("silu", "relu2_no_mul", _OAI),
    ("trtllm", "fp8-block"): ("silu", "relu2_no_mul", _OAI),
    ("trtllm", "mxfp8"): ("silu", "relu2_no_mul", _OAI),
    ("trtllm", "nvfp4"): ("silu", "relu2_no_mul", "gelu_tanh", _OAI),
    ("trtllm", "mxfp4"): ("silu", "swigluoai"),
}
CUTLASS_ACTIVATIONS = ("silu", "gelu_tanh", "relu2_no_mul", "swigluoai", _OAI)
# SiTU (Kimi K3's situ experts, MoEActivation.SITU): vLLM's TRT-LLM NVFP4 and MXFP4 experts
# list it where the installed FlashInfer has ActivationType.Situ (trtllm_nvfp4_moe.py,
# trtllm_mxfp4_moe.py _supports_activation: has_flashinfer_situ_activation), with the SiTU betas
# as kernel arguments (activation_situ_beta > 0 asserted); no other FlashInfer experts of the
# schemes fi-convert writes list it (its CuteDSL NVFP4 experts are no backend fi-convert writes)
SITU = {("trtllm", "nvfp4"), ("trtllm", "mxfp4")}
SITU_WHY = (
    "vLLM 0.33's TRT-LLM {scheme} experts run situ experts only where the installed FlashInfer "
    "has ActivationType.Situ (has_flashinfer_situ_activation), its betas passed to the kernel; "
    "fi-convert has not proven an output of situ experts against them: serve the checkpoint as "
    "it is"
)
# routing methods no FlashInfer kernel is given at all (fused_moe/config.py:128-131)
NO_FLASHINFER = ("DeepseekV4",)
# the SwiGLU clamp: TRT-LLM FP8 applies it for block FP8 and MXFP8 only (trtllm_fp8_moe.py:86-104)
CLAMP_REFUSED = {("trtllm", "fp8-tensor")}


def refuses_moe(
    scheme: str, backend: str, routing: str, activation: str, swiglu_limit: float | None
) -> str | None:
    """Why vLLM 0.33 would not run this scheme on this FlashInfer backend for a model whose
    router is `routing` (a FlashInfer routing method) and whose experts run `activation`, or
    None where it would."""
    if routing in NO_FLASHINFER:
        return f"vLLM 0.33 passes {routing} routing to no FlashInfer MoE kernel"
    kind = "CUTLASS" if backend == "cutlass" else "TRT-LLM"
    if activation == "situ" and (backend, scheme) in SITU:
        return SITU_WHY.format(scheme=scheme)
    takes = CUTLASS_ACTIVATIONS if backend == "cutlass" else ACTIVATIONS.get((backend, scheme), ())
    if activation not in takes:
        return f"vLLM 0.33's FlashInfer {kind} {scheme} experts take no {activation} activation"
    if swiglu_limit is not None and (backend, scheme) in CLAMP_REFUSED:
        return (
            "the model's experts clamp their SwiGLU (swiglu_limit), which vLLM 0.33's TRT-LLM "
            "FP8 experts apply for block FP8 and MXFP8 only; use --backend cutlass"
        )
    if backend != "trtllm" or routing in MONOLITHIC[scheme] or scheme in MODULAR:
        return None
    return (
        f"the model's router is {routing} routing, which vLLM 0.33's monolithic TRT-LLM "
        f"{scheme} experts do not take, and {MODULAR_WHY[scheme]}; use --backend cutlass"
    )


def kernel(scheme: str, backend: str, routing: str) -> str:
    """Which of vLLM 0.33's FlashInfer kernels runs the scheme on the backend for this routing
    method (where `refuses_moe` lets it): what `inspect` says."""
    if backend == "cutlass":
        return "CUTLASS (FlashInferExperts, modular: routing in vLLM)"
    if routing in MONOLITHIC.get(scheme, ()):
        return f"TRT-LLM monolithic (routing {routing} in the kernel)"
    return f"TRT-LLM modular ({routing} routing computed by vLLM)"
