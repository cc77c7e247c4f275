"""fi-convert's stand-in for vLLM's FlashAttention extension, which scripts/carry_for_device.sh
leaves behind: vLLM's CUDA attention modules import its package as vLLM's MoE modules import,
and the package refuses to import without an extension. Its ops stay missing
(`torch.ops._vllm_fa2_C`): nothing the GPU tests run calls them."""
