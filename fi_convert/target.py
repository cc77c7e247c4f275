"""The server an output is for, as the core sees it: what the core asks of one, never how.

Every fact about a server (the releases whose load-time processing gives an output's bytes,
the GPUs it runs each backend on, what it cannot serve and why, its serve line) lives in that
server's package, in a facts module that imports no server (`fi_convert/servers/<name>/
target.py`), registered by name in `fi_convert/servers/__init__.py`. The core takes a
`ServerTarget` object (`Options.server` names it, `Plan.target` holds it) and never imports a
server's package: `fi_convert.server_lookup` looks the name up in the registry when asked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import NamedTuple, Protocol

DEFAULT = "vllm"


@dataclass(frozen=True)
class Layout:
    """Where servers lay out a scheme's bytes differently, as the variant one server's
    load-time processing gives: the server states which variant it needs for a scheme and
    backend (`ServerTarget.layout`), the scheme implements the mechanics of each (a scheme
    lists the variants it implements in `Scheme.variants`; planning refuses any other).
    The defaults are vLLM 0.33's."""

    # How the intermediate size I is split over TP ranks where it is padded per rank to I_p:
    # False, split evenly (I/TP rows each) and then padded (vLLM); True, rank r takes rows
    # [r*I_p, (r+1)*I_p) of I, as many as there are, and zeros after (SGLang on TRT-LLM)
    shard_padded: bool = False
    # fp8-block on TRT-LLM: row shuffle (tile 64) and BlockMajorK (vLLM); False: MajorK as
    # loaded (SGLang)
    shuffled: bool = True
    # fp8-block: block scales clamped to >= 1e-10 (vLLM); False: as loaded (SGLang)
    clamped: bool = True
    # mxfp4: the scale padding (rows and columns past the checkpoint's) holds UE8M0 1.0 (byte
    # 127: SGLang allocates its scales so and loads into them); False: 0 (vLLM)
    unit_scale_pad: bool = False
    # mxfp4: the biases are named as the server's parameters are: w13_weight_bias and
    # w2_weight_bias (SGLang); False: w13_bias and w2_bias (vLLM)
    weight_bias_names: bool = False
    # nvfp4 and mxfp8 on TRT-LLM: H padded to 256 (vLLM); False: H as is (SGLang)
    hidden_padded: bool = True
    # mxfp8: the scale padding holds 0 (SGLang allocates its scales zero-filled); False: UE8M0
    # 1.0, byte 127 (vLLM)
    zero_scale_pad: bool = False
    # mxfp8: the block scales named w13_weight_scale_inv and w2_weight_scale_inv (SGLang's
    # block-FP8 method's names); False: w13_weight_scale and w2_weight_scale (vLLM)
    scale_inv_names: bool = False
    # nvfp4: the global and input scales as vLLM holds them (w1's global scale, the input
    # scales' max, folded into the weight scales); True: as SGLang holds them (gate and up
    # global scales kept apart, each expert's input scales as loaded, the alphas and the
    # inverse input scales beside them)
    split_scales: bool = False
    # nvfp4 on CUTLASS: where the 128x4 swizzle pads a block scale (w2's rows where H % 128,
    # w13's columns where H % 64), the padded swizzle is a parameter of its own,
    # `w*_blockscale_swizzled`, beside `w*_weight_scale` as loaded (SGLang: its
    # `alias_or_bind_derived_param` cannot write the larger swizzle in place); False: the
    # padded swizzle is `w*_weight_scale` (vLLM; SGLang too where nothing is padded)
    swizzle_apart: bool = False
    # fp8-tensor on TRT-LLM: I per rank padded to 128 (SGLang's FusedMoE pads it so on
    # flashinfer_trtllm); False: to 16 per half (vLLM)
    pad_i_128: bool = False
    # fp8-tensor on CUTLASS: w13 rows [gate; up] as loaded (SGLang's ModelOpt FP8 method passes
    # them so); False: [up; gate] (vLLM)
    gate_up_rows: bool = False
    # fp8-tensor: the scalars as SGLang holds them: w13's activation scale the max over experts
    # of the one of w1's and w3's its loader reads last, the TRT-LLM output1 product
    # g1 * float32(1 / a2), the CUTLASS products under its names (fc1_dequant, fc2_quant,
    # fc2_dequant, fc1_input_dequant); False: vLLM's (max over w1 and w3, g1 / a2, g1_alphas ...)
    sglang_scalars: bool = False
    # mxfp4 on CUTLASS: SGLang's SM90 layout for FlashInfer's mixed-input (BF16 x MXFP4) MoE
    # GEMM: I/TP unpadded by the loader (it needs I/32 % TP == 0), w13 [up; gate] halves each
    # padded to round_up(I/TP, 128), H to 256; weights byte- and bit-interleaved, scales folded
    # in 64x128 blocks, scale padding UE8M0 1.0 (127) in H's tail and 0 in I's, BF16 biases;
    # False: vLLM's SM100 CUTLASS MXFP4 x MXFP8 layout
    sm90_mixed: bool = False

    def variants(self) -> frozenset[str]:
        """The fields that differ from vLLM's layout: what the scheme must implement."""
        base = Layout()
        return frozenset(
            f.name for f in fields(self) if getattr(self, f.name) != getattr(base, f.name)
        )


VLLM_LAYOUT = Layout()


class Refusal(NamedTuple):
    """Why a server cannot serve an output as planned, and the source it would serve instead
    (for the line that refuses it)."""

    why: str
    instead: str


class ServerTarget(Protocol):
    @property
    def name(self) -> str:
        """Its name in the registry (and, with `--server`, on the command line)."""
        ...

    @property
    def label(self) -> str:
        """Its name as people write it ("vLLM")."""
        ...

    @property
    def versions(self) -> Mapping[str, str]:
        """The manifest's `target` (beside `gpu_family`): the releases whose load-time
        processing gives the output's bytes, and the version specifiers a loader accepts."""
        ...

    @property
    def ep_schemes(self) -> tuple[str, ...]:
        """The schemes it serves from a tp 1 output at any EP size."""
        ...

    def marker_note(self, scheme: str, backend: str, tp: int) -> str:
        """The output config.json's note: how to serve the output."""
        ...

    def no_path(self, scheme: str, backend: str) -> str:
        """Why it has no path for a backend the scheme does not implement."""
        ...

    def refuses(self, scheme: str, backend: str) -> str | None:
        """Why fi-convert writes no output of this scheme and backend (one the scheme has) for
        it: no FlashInfer path of its own, or a layout not done yet; None when it writes one."""
        ...

    def refuses_source(
        self,
        scheme: str,
        backend: str,
        quant_method: str | None,
        architectures: Sequence[str] = (),
        config: Mapping | None = None,
    ) -> str | None:
        """Why fi-convert writes no output of this scheme and backend for it from a source of
        this `quantization_config.quant_method` and config.json `architectures` (the model
        classes a server picks by them; another method or runner of the server's reads it, or
        it is not proven), or from this `config` (config.json: a field the server's model
        class ignores or refuses, SGLang's Kimi Linear's routed_expert_hidden_size), or None."""
        ...

    def refuses_moe(
        self, scheme: str, backend: str, routing: str, activation: str, swiglu_limit: float | None
    ) -> str | None:
        """Why it would not run this scheme on this backend for a model whose router is
        `routing` (a FlashInfer routing method, `families.ROUTING_METHODS`), whose experts run
        `activation`, with this SwiGLU clamp (None: none), or None where it would."""
        ...

    def moe_kernel(self, scheme: str, backend: str, routing: str) -> str:
        """Which of its kernels runs the scheme on the backend for this routing method."""
        ...

    def layout(self, scheme: str, backend: str) -> Layout:
        """The layout variant its load-time processing gives the scheme on the backend."""
        ...

    def unservable(
        self,
        scheme: str,
        backend: str,
        layers: Sequence[Mapping],
        quant_method: str | None = None,
    ) -> Refusal | None:
        """Why it cannot serve this output as planned (a scheme and backend it has; each
        layer's entry in the manifest, `LayerPlan.info`; the source's quantization method),
        or None."""
        ...

    def gpu_family(self, backend: str, scheme: str) -> str:
        """The GPUs where it runs the scheme with the backend (the manifest's `gpu_family`)."""
        ...

    # A server may also have `release_fields(m) -> dict` (`m`: the output's scheme, backend
    # and layer entries): the `target` fields that depend on the output's layers (the releases
    # proven for their sizes, `vllm_releases`, `sglang_releases`); see `release_fields` below.
    # And `former_targets`: targets older fi-convert releases wrote, which `verify` accepts.

    def ep_note(self, scheme: str, layers: Mapping[str, dict]) -> str:
        """The manifest's `expert_parallel`: the EP sizes the output serves as converted."""
        ...

    def serve_command(self, where: str, scheme: str, backend: str, tp: int, ep: int = 0) -> str:
        """Its command line that serves an output (a folder or a Hub repo id); with `ep`, on
        that many GPUs with expert parallelism."""
        ...

    def card_rows(self, target: Mapping) -> list[str]:
        """The model card's table rows of the releases the output targets (the manifest's
        `target`)."""
        ...

    def card_section(self, m: Mapping, repo_id: str) -> list[str]:
        """The model card's lines on serving the output (manifest `m`) from the Hub repo."""
        ...


def release_fields(
    server: ServerTarget,
    scheme: str,
    backend: str,
    layers: Mapping[str, Mapping],
    architectures: Sequence[str] | None = None,
) -> dict:
    """The `target` fields a server derives from the output's layers (the releases whose own
    processing is proven to hold their bytes) and its source's architectures (config.json's:
    of those, the releases with a model class for it; None, an output that records none: not
    narrowed); {} for a server that lists none."""
    fields = getattr(server, "release_fields", None)
    m: dict = {"scheme": scheme, "backend": backend, "layers": layers}
    if architectures is not None:
        m["source"] = {"architectures": list(architectures)}
    return {} if fields is None else dict(fields(m))


def release_rows(label: str, release: object, target: Mapping) -> list[str]:
    """A server's `card_rows`: its release and FlashInfer's (the manifest's `target`)."""
    return [
        f"| target {label} | {release} |",
        f"| target FlashInfer | {target.get('flashinfer')} (layouts of "
        f"{target.get('flashinfer_layouts')}) |",
    ]
