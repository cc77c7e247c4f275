"""Every key a manifest may hold, where it may hold it: the reader refuses any other (a key it
does not know is a damaged manifest, or one a newer fi-convert wrote, whose meaning it cannot
know). One table, by place; a new key is one word in it (and its line in docs/FORMAT.md §4).

It holds every key any fi-convert release of this `format_version` wrote, so that their
outputs still read (`target.vllm_versions` since the first; `server` since 2026-11-28; ...).
"""

from __future__ import annotations

# A place is the dotted path of the keys to a map; `*` stands for any key of a map keyed by
# names (layer prefixes, parameter names, file names, server names).
KNOWN_KEYS: dict[str, frozenset[str]] = {
    "": frozenset(
        {
            "format",
            "format_version",
            "fi_convert_version",
            "scheme",
            "backend",
            "tp_size",
            "server",
            "servers",
            "targets",
            "target",
            "expert_parallel",
            "source",
            "layers",
            "files",
        }
    ),
    # a server's target: its releases, FlashInfer's, and where it runs the scheme
    "target": frozenset(
        {
            "vllm",
            "vllm_versions",
            "vllm_releases",
            "vllm_releases_left_out",  # why proven releases cannot hold the bytes (2026-12-03)
            "sglang",
            "sglang_versions",
            "sglang_releases",
            "flashinfer",
            "flashinfer_layouts",
            "flashinfer_versions",
            "gpu_family",
        }
    ),
    "source": frozenset(
        {
            "model_type",
            "family",
            "fingerprint",
            "shards",
            "repo_id",
            "revision",
            "command",
            "routing",  # the family's FlashInfer routing method and activation (2026-12-03)
            "activation",
            "family_file",  # a user's family (--family), whole; checked as a family file
            "architectures",  # config.json's, which servers pick a model class by (2026-12-06)
        }
    ),
    "layers.*": frozenset(
        {
            "num_experts",
            "hidden_size",
            "intermediate_size",
            "intermediate_size_per_rank",
            "padded_hidden_size",
            "padded_intermediate_size_per_rank",
            "gated",  # false: non-gated experts (relu2_no_mul), w13 the up projection alone
            "weight_block_size",
            "activation_scheme",
            "source_format",
            "group_size",
            "w13_scale_2_differs_for_experts",
            "tp_split",
            "rows_per_rank",
            "swiglu_limit",  # gpt-oss's family records it (`manifest_keys`); SGLang's nvfp4
            "tensors",
        }
    ),
    "layers.*.tensors.*": frozenset(
        {
            "dtype",
            "shape_per_rank",
            "layout",
            "epilogue_tile_m",
            "block_k_bytes",
            "row_order",
            "gated_interleave",
            "packing",
            "block",
            "min",
            "pad",
            "rank0_only",
            "formula",
        }
    ),
    "layers.*.tensors.*.pad": frozenset({"hidden", "intermediate"}),
    "files.*": frozenset({"sha256", "size"}),
}
KNOWN_KEYS["targets.*"] = KNOWN_KEYS["target"]


def unknown_keys(manifest: dict) -> list[str]:
    """The dotted paths of the keys the table does not know, in the manifest's order."""
    out: list[str] = []
    _walk(manifest, "", "", out)
    return out


def _walk(node: object, place: str, path: str, out: list[str]) -> None:
    if not isinstance(node, dict) or place not in KNOWN_KEYS and not _named(place):
        return
    named = _named(place)
    for key, value in node.items():
        here = f"{path}.{key}" if path else str(key)
        if named:
            _walk(value, f"{place}.*" if place else "*", here, out)
        elif key not in KNOWN_KEYS[place]:
            out.append(here)
        else:
            _walk(value, f"{place}.{key}" if place else key, here, out)


def _named(place: str) -> bool:
    """Whether `place` is a map keyed by names (layers, tensors, files, targets)."""
    return any(k.startswith(place + ".*") for k in KNOWN_KEYS) and place not in KNOWN_KEYS
