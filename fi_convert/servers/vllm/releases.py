"""The vLLM releases whose own load-time processing holds an output's bytes, as this fi-convert
proved them: each release's own MoE layers, weight loading and `process_weights_after_loading`
compared byte for byte with fi-convert's output, and the plugin's own load and kernel setup
leaving each release's layer as its own path does (tests/test_vllm.py, tests/test_vllm_plugin.py
and tests/test_vllm_ep.py run in each release's venv: `make test-release RELEASE=X`,
docs/development.md). Pure data and functions of a manifest: it imports no vLLM.

An output is proven for a release when every one of its MoE layers is: its scheme and backend
are in the table, and the layer's per-rank sizes meet the row's condition. No release needs
bytes other than those fi-convert writes for vLLM 0.33 (`--server vllm` is every release); a
release that did would be a target of its own here (`--server vllm==X`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from packaging.version import Version

from .. import architectures

# Every release proven, oldest first. 0.33.0 is the release the bytes are made as (target.py).
PROVEN: tuple[str, ...] = ("0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0")
ALL = PROVEN
# The release fi-convert's bytes are computed as: every output is proven for it.
REFERENCE = "0.33.0"


def _mxfp8_aligned(layer: Mapping) -> bool:
    """H a multiple of 256 and I per rank of 128: nothing for vLLM to pad before the scales'
    swizzle."""
    return layer["hidden_size"] % 256 == 0 and layer["intermediate_size_per_rank"] % 128 == 0


def _any(layer: Mapping) -> bool:
    return True


@dataclass(frozen=True)
class Row:
    """Releases proven for a scheme on a backend, for the layers that meet `when`."""

    scheme: str
    backend: str
    releases: tuple[str, ...]
    when: Callable[[Mapping], bool] = _any
    shapes: str = "any size"  # `when` in words, for the docs and `inspect`
    why: str = ""  # why the releases left out do not serve these bytes
    # the support table's word for a release left out: "fails" (its own processing fails on
    # these sizes), "not proven" (no test of it has run)
    left_out_as: str = "not proven"


MXFP8_UNALIGNED = (
    "vLLM 0.30-0.32 do not pad H to 256 and I per rank to 128 before the scale swizzle, and "
    "their own processing fails on these sizes"
)

# The first row of a scheme and backend whose condition a layer meets gives its releases. Gated
# and non-gated experts (Nemotron-H's relu2_no_mul, w13 the up projection alone) alike: every
# release ran both (tests/test_vllm.py, test_vllm_scales.py), with the same outcome.
TABLE: tuple[Row, ...] = (
    Row("bf16", "trtllm", ALL),
    Row("bf16", "cutlass", ALL),
    Row("fp8-block", "trtllm", ALL),
    Row("fp8-block", "cutlass", ALL),
    Row("fp8-tensor", "trtllm", ALL),
    Row("fp8-tensor", "cutlass", ALL),
    Row("nvfp4", "trtllm", ALL),
    Row("nvfp4", "cutlass", ALL),
    Row("mxfp8", "trtllm", ALL, _mxfp8_aligned, "H % 256 == 0 and I per rank % 128 == 0"),
    Row(
        "mxfp8",
        "trtllm",
        ("0.33.0", "0.34.0"),
        shapes="other sizes",
        why=MXFP8_UNALIGNED,
        left_out_as="fails",
    ),
    Row("mxfp4", "trtllm", ALL),
    Row("mxfp4", "cutlass", ALL),
)


def row_for(scheme: str, backend: str, layer: Mapping) -> Row | None:
    """The table's row for one layer of a scheme and backend (its manifest entry), or None."""
    for row in TABLE:
        if (row.scheme, row.backend) == (scheme, backend) and row.when(layer):
            return row
    return None


def rows_for(manifest: Mapping) -> list[Row]:
    """The rows of an output's layers (one per distinct row, in layer order); [] when a layer
    has none or the layers cannot be read."""
    scheme, backend = manifest.get("scheme"), manifest.get("backend")
    layers = manifest.get("layers")
    if not isinstance(layers, Mapping) or not layers:
        return []
    rows: list[Row] = []
    try:
        for layer in layers.values():
            row = row_for(str(scheme), str(backend), layer)
            if row is None:
                return []
            if row not in rows:
                rows.append(row)
    except (KeyError, TypeError):  # a layer without its sizes: nothing proven
        return []
    return rows


def bytes_proven_for(manifest: Mapping) -> list[str]:
    """The releases whose own processing holds the output's bytes (its scheme, backend and
    every layer's per-rank sizes), oldest first; [] for an output this fi-convert proves for
    no release."""
    rows = rows_for(manifest)
    if not rows:
        return []
    common = set.intersection(*(set(r.releases) for r in rows))
    return sorted(common, key=Version)


def proven_for(manifest: Mapping) -> list[str]:
    """The releases that serve the output: those that hold its bytes and whose registry has a
    model class for the source's architecture, where the manifest records it
    (`source.architectures`; architectures.json)."""
    return architectures.narrowed("vllm", manifest, bytes_proven_for(manifest))


def left_out(manifest: Mapping) -> str:
    """Why the proven releases the output's bytes do not fit, or that have no model class for
    its architecture, are left out ("" for none)."""
    whys = list(dict.fromkeys(r.why for r in rows_for(manifest) if r.why))
    arch = architectures.why_left_out("vllm", manifest, bytes_proven_for(manifest))
    return "; ".join(whys + [arch] if arch else whys)


# ---------------------------------------------------------------- the docs' support table

# Scheme and backend pairs fi-convert writes no vLLM output of, and why (the table's last rows).
NO_OUTPUT = {("mxfp8", "cutlass"): "vLLM has no FlashInfer CUTLASS MXFP8 path"}
TABLE_BEGIN = "<!-- support table: generated by scripts/support_table.py from releases.py -->"
TABLE_END = "<!-- end of the support table -->"


def support_table() -> str:
    """docs/serving.md's support table (release x scheme x backend: proven, or not and why),
    made from TABLE and NO_OUTPUT; scripts/support_table.py writes it into the page."""
    head = ["scheme", "backend", "sizes", *PROVEN]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes: list[str] = []

    def note(why: str) -> int:
        if why not in notes:
            notes.append(why)
        return notes.index(why) + 1

    for row in TABLE:
        mark = f"{row.left_out_as} ({note(row.why)})" if row.why else row.left_out_as
        cells = ["proven" if r in row.releases else mark for r in PROVEN]
        lines.append(f"| {row.scheme} | {row.backend} | {row.shapes} | " + " | ".join(cells) + " |")
    for (scheme, backend), why in NO_OUTPUT.items():
        cells = [f"no output ({note(why)})"] * len(PROVEN)
        lines.append(f"| {scheme} | {backend} | any size | " + " | ".join(cells) + " |")
    lines += ["", *(f"({k}) {why}." for k, why in enumerate(notes, 1))]
    archs = architectures.table("vllm", PROVEN)
    lines += ["", *archs] if archs else []
    return "\n".join([TABLE_BEGIN, "", *lines, "", TABLE_END])
