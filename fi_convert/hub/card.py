"""The model card (README.md) of a pushed output, and the manifest as uploaded beside it."""

from __future__ import annotations

import hashlib
import json
import re

from ..format import manifest as mf
from ..format.names import MANIFEST_NAME, servers_of, target_of
from ..server_lookup import resolve
from ..target import DEFAULT
from .common import LIBRARY

CARD_NAME = "README.md"


def upload_manifest(manifest: dict, card: bytes) -> bytes:
    """The manifest as uploaded: the local one with README.md being the model card."""
    m = dict(manifest)
    m["files"] = dict(m["files"])
    m["files"][CARD_NAME] = {"sha256": hashlib.sha256(card).hexdigest(), "size": len(card)}
    m["files"] = {k: m["files"][k] for k in sorted(m["files"])}
    return (json.dumps(m, indent=2, sort_keys=True) + "\n").encode()


def _front_matter(text: str | None) -> dict:
    if not text:
        return {}
    match = re.match(r"^---\s*\n(.*?)\n---\s*(\n|$)", text, re.DOTALL)
    if not match:
        return {}
    import yaml

    try:
        d = yaml.safe_load(match.group(1))
    except yaml.YAMLError:
        return {}
    return d if isinstance(d, dict) else {}


def model_card(
    manifest: dict,
    *,
    repo_id: str,
    base_model: str | None = None,
    base_revision: str | None = None,
    source_card: str | None = None,
) -> str:
    """README.md for the pushed repo: Hub metadata, how it was made, what it holds, how to load
    it. Deterministic (no dates), so a second push of the same folder changes nothing."""
    from huggingface_hub import ModelCardData

    m = manifest
    scheme, backend, tp = m["scheme"], m["backend"], m["tp_size"]
    src = _front_matter(source_card)
    data = ModelCardData(
        base_model=base_model,
        # Valid values are adapter, merge, quantized and finetune. These are the base model's
        # own weights, untrained, complete and unmerged, re-laid out (and for some schemes
        # requantized) for one runtime: the Hub's "quantized" covers exactly such format
        # conversions of a base model (GGUF, AWQ, MLX...). "adapter" would claim a LoRA-style
        # add-on that needs the base weights; "finetune" would claim training.
        base_model_relation="quantized" if base_model else None,
        # "fi-convert", not "vllm": the expert tensors are in FlashInfer's kernel layouts,
        # which only a loader that reads the manifest (fi_convert.load_moe_layer, fi-convert's
        # vLLM plugin) can use. Stock `vllm serve` without --load-format fi-convert cannot,
        # so the Hub's vLLM snippet would mislead.
        library_name=LIBRARY,
        tags=["fi-convert", "flashinfer", "moe", scheme, backend, f"tp{tp}"],
        license=src.get("license"),
        license_name=src.get("license_name"),
        license_link=src.get("license_link"),
        pipeline_tag=src.get("pipeline_tag"),
    )
    return f"---\n{data.to_yaml()}\n---\n\n{_card_body(m, repo_id, base_model, base_revision)}"


def _card_body(m: dict, repo_id: str, base_model: str | None, base_revision: str | None) -> str:
    scheme, backend, tp = m["scheme"], m["backend"], m["tp_size"]
    t, s = m["target"], m["source"]
    servers = [resolve(n) for n in servers_of(m)]
    named = [x.name for x in servers]
    held = " and ".join(x.label for x in servers) + (" holds" if len(servers) == 1 else " hold")
    layers: dict = m["layers"]
    first = next(iter(layers)) if layers else "model.layers.N.mlp.experts"
    src = f"[{base_model}](/{base_model})" if base_model else "a Mixture-of-Experts checkpoint"
    at = f" at commit `{base_revision}`" if base_revision else ""
    source_arg = base_model or "MODEL_DIR"
    rev = f" --revision {base_revision}" if base_revision and base_model else ""
    files = len(set(m["files"]) | {CARD_NAME})
    shards = [f for n, f in m["files"].items() if n.endswith(".safetensors")]
    weights = f"{sum(f['size'] for f in shards):,} bytes in {len(shards)} shard(s)"
    lines = [
        f"# {repo_id.split('/')[-1]}",
        "",
        f"The weights of {src}{at}, with every MoE layer's routed experts converted offline by "
        f"fi-convert into the byte layouts of FlashInfer's fused-MoE kernels (scheme `{scheme}`, "
        f"{backend} backend, tensor-parallel size {tp}). A server loads these pre-shuffled "
        "tensors straight into the kernel instead of stacking, padding, interleaving, "
        "shuffling and swizzling them at every start. All other tensors are the source's, "
        "byte for byte.",
        "",
        "## How it was made",
        "",
        "```",
        f"fi-convert {source_arg}{rev} OUT_DIR --scheme {scheme} --backend {backend} "
        f"--tp-size {tp}" + (f" --server {','.join(named)}" if named != [DEFAULT] else ""),
        "fi-convert verify OUT_DIR",
        f"fi-convert push OUT_DIR {repo_id}",
        "```",
        "",
        "| | |",
        "|---|---|",
        f"| fi-convert | {m['fi_convert_version']} (manifest format {m['format_version']}) |",
        f"| scheme | `{scheme}` |",
        f"| backend | `{backend}` (GPU family `{t.get('gpu_family')}`) |",
        f"| tensor-parallel size | {tp} (every rank's tensors are stored) |",
        f"| expert parallelism | {m.get('expert_parallel', '')} |",
        *(row for x in servers for row in x.card_rows(target_of(m, x.name))),
        f"| source | model type `{s.get('model_type')}`, family `{s.get('family')}`, "
        f"{s.get('shards')} shard(s), fingerprint `{str(s.get('fingerprint'))[:16]}` |",
        "",
        "## What it holds",
        "",
    ]
    for names, count, lay in mf.layer_groups(layers):
        lines.append(
            f"- {count} MoE layer(s), `{names}`: {lay.get('num_experts')} experts, hidden "
            f"{lay.get('hidden_size')} (padded {lay.get('padded_hidden_size')}), intermediate "
            f"{lay.get('intermediate_size')} = {lay.get('intermediate_size_per_rank')} per rank "
            f"(padded {lay.get('padded_intermediate_size_per_rank')})"
        )
    lines += ["", "| tensor | dtype | shape per rank | layout |", "|---|---|---|---|"]
    for name, ten in (layers.get(first) or {}).get("tensors", {}).items():
        tile = f", tile {ten['epilogue_tile_m']}" if ten.get("epilogue_tile_m") else ""
        lines.append(
            f"| `{name}` | {ten.get('dtype')} | {ten.get('shape_per_rank')} | "
            f"{ten.get('layout')}{tile} |"
        )
    lines += [
        "",
        f"Each tensor is stored under the layer's prefix (e.g. `{first}.w13_weight`) with the "
        f"TP rank as its leading dimension ({weights}). `{MANIFEST_NAME}` lists all {files} "
        "files with their SHA-256s, this card included; `fi-convert verify` on a download "
        "checks them all.",
        "",
        "## How to load it",
        "",
        "```python",
        "from huggingface_hub import snapshot_download",
        "from fi_convert import load_moe_layer, read_manifest",
        "",
        f'path = snapshot_download("{repo_id}")',
        "manifest = read_manifest(path)  # scheme, backend, tp_size, padded sizes per layer",
        f't = load_moe_layer(path, "{first}", tp_rank=0, device="cuda",',
        f'                   scheme="{scheme}", backend="{backend}")',
        f"t['w13_weight'].shape  # as {held} it after process_weights_after_loading",
        "```",
        "",
        *(
            line
            for x in servers
            for line in x.card_section({**m, "target": target_of(m, x.name)}, repo_id)
        ),
    ]
    return "\n".join(lines)
