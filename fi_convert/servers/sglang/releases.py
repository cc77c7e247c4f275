"""Which SGLang releases hold an output's bytes, as the tests proved them: each release's own
MoE code (its FusedMoE, weight loader and `process_weights_after_loading`, on CPU) against
fi-convert's `--server sglang` output, for every scheme, backend, TP size and rank of
tests/test_sglang.py (and of non-gated experts, tests/test_sglang_non_gated.py), and the
plugin's load in that release (tests/test_sglang_plugin.py, test_sglang_models.py,
test_sglang_ep.py, test_sglang_families.py, test_sglang_family_forms.py,
test_sglang_updates.py; the load-time proof, test_sglang_release_proof.py), run in a venv of
each release (scripts/release_env.sh; docs/development.md says where CI runs which).

The table is data: per scheme and backend, the releases proven for any shape, and the releases
proven only where each layer's shape meets a condition (a layer entry of the manifest: its
padded sizes, its SwiGLU clamp). `proven_for(manifest)` reads the table for an output; the
converter writes its answer into the manifest (`target.sglang_releases`), and the plugin
accepts a release that the manifest lists or that this table proves for the layout the output
holds (an output written before the list existed: `sglang_versions` "==0.5.23"). Imports no
SGLang.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from packaging.version import Version

from .. import architectures

# Every SGLang release that some output's bytes are proven for, oldest first
PROVEN: tuple[str, ...] = ("0.5.20", "0.5.21", "0.5.22", "0.5.23")
RELEASES_FIELD = "sglang_releases"  # the manifest target's list of them
VERSIONS_FIELD = "sglang_versions"  # ... and the PEP 440 range that admits exactly those


def _int(value: object) -> int:
    """A layer entry's size, or -1 where it is not an integer (no condition holds on it)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else -1


@dataclass(frozen=True)
class Condition:
    """A fact about one layer entry of the manifest that a row of the table needs."""

    says: str  # for the docs: what every layer must be
    holds: Callable[[Mapping], bool]


CONDITIONS: dict[str, Condition] = {
    # SGLang 0.5.20-0.5.22's FusedMoE pads I/TP to 128 for every FlashInfer TRT-LLM method and
    # shards I by it; 0.5.23's ModelOpt NVFP4 pads to 64: the same rows where the two agree
    "i_p_128": Condition(
        "I/TP padded to a multiple of 128 (I/TP a multiple of 128, or above 64 past one)",
        lambda layer: _int(layer.get("padded_intermediate_size_per_rank")) % 128 == 0,
    ),
    # ... and before 0.5.23 a SwiGLU clamp does not rescale the w13 block scales nor tie the
    # alphas (nor make gemm1_clamp_limit a parameter)
    "no_clamp": Condition(
        "no SwiGLU clamp (config.json swiglu_limit)",
        lambda layer: layer.get("swiglu_limit") is None,
    ),
}
# Non-gated experts (Nemotron-H's relu2_no_mul: a layer entry's `gated: false`) are proven on
# these releases only, whatever the rows say: tests/test_sglang_non_gated.py, run in each
# release's venv (2026-12-03), found BF16 (both runners) and ModelOpt FP8 on CUTLASS the same
# bytes on every release, and the plugin's path leaving each as its own; ModelOpt FP8 on
# TRT-LLM runs Triton before 0.5.23, as for gated experts (its row above)
NON_GATED_RELEASES = PROVEN


@dataclass(frozen=True)
class Row:
    """The releases whose own processing gives a scheme's bytes on a backend (for the layers
    that meet every condition in `when`)."""

    scheme: str
    backend: str
    releases: tuple[str, ...]
    when: tuple[str, ...] = ()


# What tests/test_sglang.py and the plugin's tests proved, per release (2026-12-03)
TABLE: tuple[Row, ...] = (
    Row("bf16", "trtllm", PROVEN),
    Row("bf16", "cutlass", PROVEN),
    Row("fp8-block", "trtllm", PROVEN),
    Row("fp8-tensor", "trtllm", ("0.5.23",)),
    Row("fp8-tensor", "cutlass", PROVEN),
    Row("mxfp8", "trtllm", PROVEN),
    Row("mxfp4", "trtllm", PROVEN),
    Row("mxfp4", "cutlass", PROVEN),
    Row("nvfp4", "cutlass", PROVEN),
    Row("nvfp4", "trtllm", ("0.5.23",)),
)

# Why a release is left out of a scheme's outputs (where no row lists it, or a row's condition
# fails): "other bytes" (its own processing holds other bytes) or "not served" (it runs the
# layer otherwise, so the plugin cannot load the output there); the docs' table says it
LEFT_OUT: dict[tuple[str, str], tuple[str, str]] = {
    ("nvfp4", "trtllm"): (
        "other bytes",
        "SGLang 0.5.20-0.5.22 hold the gate and up global scales in the other order, so their "
        "w13_weight_scale_2, alphas and g1_scale_c are other values where a checkpoint's gate "
        "and up global scales differ (every checkpoint tested); they pad I/TP to 128 where "
        "0.5.23 pads it to 64 (other weights where I/TP % 128 is in (0, 64]), and apply no "
        "SwiGLU clamp to the block scales",
    ),
    ("fp8-tensor", "trtllm"): (
        "not served",
        "SGLang 0.5.20-0.5.22's ModelOpt FP8 method builds a Triton MoE runner on "
        "flashinfer_trtllm (its FlashInfer TRT-LLM path is a branch of apply() for a bypassed "
        "TopK, not the layer's runner), so the plugin refuses to load into it; the bytes it "
        "holds are 0.5.23's",
    ),
}


# Why fi-convert's SGLang plugin does not load a layout into a release that holds its bytes, per
# (scheme, backend) and release; the docs' table says it. None today: its load and kernel setup
# read each release's differences from the release (older_releases.py), and leave every layout
# as each release's own processing does (tests/test_sglang_plugin.py, test_sglang_models.py and
# test_sglang_ep.py, run in each release's venv, 2026-12-03).
PLUGIN_WHY: dict[tuple[str, str, str], str] = {}


def _bytes_releases(scheme: str, backend: str) -> tuple[str, ...]:
    """The releases some row of the table lists for the layout, oldest first."""
    rows = [r for r in TABLE if (r.scheme, r.backend) == (scheme, backend)]
    return tuple(sorted({rel for r in rows for rel in r.releases}, key=Version))


# The releases the plugin loads each layout into: those that hold its bytes, but where
# PLUGIN_WHY says why not. The plugin refuses the others (checks.check_plugin_release).
PLUGIN: dict[tuple[str, str], tuple[str, ...]] = {
    (row.scheme, row.backend): tuple(
        r
        for r in _bytes_releases(row.scheme, row.backend)
        if (row.scheme, row.backend, r) not in PLUGIN_WHY
    )
    for row in TABLE
}


def plugin_specifier() -> str:
    """The range of releases the plugin loads some layout into: what fi-convert's `sglang`
    extra installs (pyproject.toml)."""
    return specifier(sorted({r for rs in PLUGIN.values() for r in rs}, key=Version))


def plugin_releases(scheme: str, backend: str) -> tuple[str, ...]:
    """The releases the plugin is proven to load the layout into."""
    return PLUGIN.get((scheme, backend), ())


def _layers(manifest: Mapping) -> Sequence[Mapping]:
    """The manifest's layer entries (a damaged one's: those that are maps)."""
    layers = manifest.get("layers")
    found = layers.values() if isinstance(layers, Mapping) else ()
    return [layer for layer in found if isinstance(layer, Mapping)]


def holds(row: Row, layers: Sequence[Mapping]) -> bool:
    """Whether every layer meets every condition of the row."""
    return all(CONDITIONS[c].holds(layer) for c in row.when for layer in layers)


def proven_for(manifest: Mapping) -> list[str]:
    """The SGLang releases that serve the output `manifest` describes: those proven to hold
    its bytes (its scheme, backend and layer entries) and that have a model class for its
    source's architecture, where the manifest records it (`source.architectures`:
    architectures.json), oldest first; none for a layout the table lacks."""
    return architectures.narrowed("sglang", manifest, bytes_proven_for(manifest))


def bytes_proven_for(manifest: Mapping) -> list[str]:
    """The SGLang releases proven to hold the bytes of the output (its layout alone)."""
    scheme, backend, layers = manifest.get("scheme"), manifest.get("backend"), _layers(manifest)
    found = {
        r
        for row in TABLE
        if (row.scheme, row.backend) == (scheme, backend) and holds(row, layers)
        for r in row.releases
    }
    if any(layer.get("gated") is False for layer in layers):
        found &= set(NON_GATED_RELEASES)
    return sorted(found, key=Version)


def specifier(releases: Sequence[str]) -> str:
    """The PEP 440 range that admits exactly `releases` of PROVEN (">=first,<=last", with "!="
    for the proven releases between them that are left out)."""
    if not releases:
        return "<0"  # no release
    lo, hi = min(releases, key=Version), max(releases, key=Version)
    holes = [r for r in PROVEN if Version(lo) < Version(r) < Version(hi) and r not in releases]
    if lo == hi:
        return f"=={lo}"
    return ",".join([f">={lo}", f"<={hi}", *(f"!={r}" for r in holes)])


def release_fields(manifest: Mapping) -> dict:
    """The manifest target's fields that name the releases: the list and its range."""
    releases = proven_for(manifest)
    return {RELEASES_FIELD: releases, VERSIONS_FIELD: specifier(releases)}


def support_table(refused: Mapping[tuple[str, str], str]) -> str:
    """The docs' support table (docs/sglang.md, scripts/sglang_support_table.py): release x
    scheme/backend, each cell proven (the release's bytes, and the plugin loads them there),
    same bytes but no plugin load, other bytes or not served (a note says why), or refused
    (fi-convert writes no such SGLang output: `refused`, the target's NO_FLASHINFER)."""
    pairs = sorted({(r.scheme, r.backend) for r in TABLE} | set(refused))
    notes: list[str] = []
    lines = ["| scheme / backend | " + " | ".join(PROVEN) + " |"]
    lines.append("|---|" + "---|" * len(PROVEN))
    for scheme, backend in pairs:
        cells = [_cell(scheme, backend, r, refused, notes) for r in PROVEN]
        lines.append(f"| `{scheme}` / {backend} | " + " | ".join(cells) + " |")
    lines += ["", *(f"{i}. {n}" for i, n in enumerate(notes, 1))]
    archs = architectures.table("sglang", PROVEN)
    return "\n".join(lines + (["", *archs] if archs else [])) + "\n"


def _cell(scheme: str, backend: str, release: str, refused: Mapping, notes: list[str]) -> str:
    if (scheme, backend) in refused:
        return "refused" + _note(f"`{scheme}` / {backend}: {refused[scheme, backend]}", notes)
    rows = [r for r in TABLE if (r.scheme, r.backend) == (scheme, backend)]
    loads = release in plugin_releases(scheme, backend)
    why = PLUGIN_WHY.get((scheme, backend, release), "its load there is not proven")
    why = f"`{scheme}` / {backend} on {release}: {why}"
    if any(release in r.releases and not r.when for r in rows):
        return "proven" if loads else "same bytes, no plugin" + _note(why, notes)
    where = [r for r in rows if release in r.releases]
    if where:
        says = "; ".join(CONDITIONS[c].says for r in where for c in r.when)
        cell = "same bytes where every layer has " + says
        return cell if loads else cell + ", no plugin" + _note(why, notes)
    kind, why = LEFT_OUT[scheme, backend]
    return kind + _note(f"`{scheme}` / {backend}: {why}", notes)


def _note(text: str, notes: list[str]) -> str:
    """A footnote's mark, the note added once."""
    if text not in notes:
        notes.append(text)
    return f" ({notes.index(text) + 1})"
