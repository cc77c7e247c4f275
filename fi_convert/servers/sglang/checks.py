"""The checks the SGLang plugin runs before it loads anything: pure functions of the manifest,
of the server's arguments and of the layers SGLang built, tested without SGLang. Every refusal
is one line that starts with "fi-convert: ", names the output and says what to do."""

from __future__ import annotations

import re
from collections.abc import Collection
from importlib import metadata
from pathlib import Path
from typing import Any

from packaging.version import Version

from ...errors import FiConvertError
from ...format import manifest as mf
from ...format.names import servers_of, target_of
from . import older_releases, releases
from .target import (
    EP_REFUSED,
    EP_SCHEMES,
    GPU_FAMILY,
    LOAD_FORMAT,
    METHODS,
    SGLANG,
    launch_command,
    server_of,
)
from .target import (
    moe_runner_backend as runner_for,
)

PREFIX = "fi-convert: "


class PluginError(ValueError):
    """An fi-convert output that this SGLang must not load; the message is one line."""

    def __init__(self, msg: str) -> None:
        super().__init__(PREFIX + msg)


class UnlistedRelease(PluginError):
    """The installed SGLang is a release the output does not list: the plugin proves it on the
    output's layer shapes with SGLang's own code before it loads (`proof.py`), or refuses."""

    def __init__(self, msg: str, *, release: str, listed: str) -> None:
        super().__init__(msg)
        self.release, self.listed = release, listed


def sglang_version() -> str:
    return installed("sglang") or "0"


def installed(dist: str) -> str | None:
    """The installed version of a distribution, or None."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def read_output(root: Path) -> dict:
    """The output's manifest, read and checked for form (a refusal when it is not one)."""
    try:
        return mf.read(root)
    except FiConvertError as e:
        raise PluginError(str(e)) from None


def local_output(
    model_path: str, *, revision: str | None, cache: str | None, manifest_only: bool = False
) -> Path:
    """`model_path` when it is a folder; else the Hub repo it names, fetched (the manifest, and
    unless `manifest_only` the files it lists, at `revision`, into `cache` (SGLang's
    --download-dir) or the Hugging Face cache; hub/fetch.py)."""
    if Path(model_path).is_dir():
        return Path(model_path)
    from ...hub.fetch import fetch_output

    try:
        return fetch_output(model_path, revision=revision, cache=cache, manifest_only=manifest_only)
    except FiConvertError as e:
        raise PluginError(str(e)) from None


def output_name(model_path: str, root: Path) -> str:
    """How refusals name the output: its folder, or the repo id it was fetched from."""
    return str(root) if Path(model_path).is_dir() else model_path


def check_manifest(
    manifest: dict,
    root: str,
    *,
    tp_size: int,
    moe_runner_backend: str,
    sglang_version: str,
    ep_size: int = 1,
    eplb: bool = False,
    redundant: int = 0,
    placement: str = "trivial",
    moe_dp_size: int = 1,
    a2a: str = "none",
    release_proven: bool = False,
) -> None:
    """The checks that need no GPU and no model: the output's server, what the plugin loads,
    the SGLang version, the MoE runner backend flag, TP (`tp_size`: SGLang's MoE TP size), EP
    and EPLB (`redundant`: --ep-num-redundant-experts, `placement`: --init-expert-location).
    An SGLang release the output does not list is `UnlistedRelease`, unless `release_proven`
    (the load-time proof passed on it)."""
    server = server_of(manifest)
    scheme, backend = manifest["scheme"], manifest["backend"]
    if SGLANG not in servers_of(manifest):
        raise PluginError(
            f"{root}: converted for {server}, whose layouts differ from SGLang's; serve it with "
            f"{server} (`vllm serve {root} --load-format {LOAD_FORMAT}`), or convert the source "
            "again for SGLang (--server sglang)"
        )
    if (scheme, backend) not in METHODS:
        ok = ", ".join(f"{s}/{b}" for s, b in sorted(METHODS))
        raise PluginError(
            f"{root}: the SGLang plugin does not load {scheme}/{backend} outputs yet (it loads "
            f"{ok}); serve the source checkpoint with SGLang's own loader"
        )
    if not release_proven:
        check_release(manifest, root, sglang_version)
    want = runner_for(scheme, backend)
    if moe_runner_backend != want:
        raise PluginError(
            f"{root}: converted for FlashInfer {backend}, SGLang was started with "
            f"--moe-runner-backend {moe_runner_backend}; pass --moe-runner-backend {want}"
        )
    check_expert_parallel(
        manifest,
        root,
        ep_size=ep_size,
        moe_tp_size=tp_size,
        eplb=eplb,
        redundant=redundant,
        placement=placement,
        moe_dp_size=moe_dp_size,
        a2a=a2a,
    )
    if manifest["tp_size"] != tp_size:
        raise PluginError(
            f"{root}: converted for tensor-parallel size {manifest['tp_size']}, SGLang runs "
            f"{tp_size}; pass --tp {manifest['tp_size']} or convert again with --tp-size {tp_size}"
        )


def listed_releases(manifest: dict) -> list[str]:
    """The releases an output's manifest lists for SGLang (`target.sglang_releases`; an output
    written before the list existed lists none, only its range `sglang_versions`)."""
    got = target_of(manifest, SGLANG).get(releases.RELEASES_FIELD)
    return [str(r) for r in got] if isinstance(got, list) else []


def serving_releases(manifest: dict) -> list[str]:
    """The releases the plugin serves an output on: those its manifest lists, and those this
    fi-convert proves for the layout it holds (its scheme, backend and layers), oldest first."""
    return sorted({*listed_releases(manifest), *releases.proven_for(manifest)}, key=Version)


def check_release(manifest: dict, root: str, sglang_version: str) -> None:
    """The installed SGLang: a release that holds the output's bytes, into which the plugin
    loads the output's layout."""
    check_releases_bytes(manifest, root, sglang_version)
    check_plugin_release(manifest, root, sglang_version)


def check_releases_bytes(manifest: dict, root: str, sglang_version: str) -> None:
    """The installed SGLang against the releases that hold the output's bytes: one the manifest
    lists, or in its range (`sglang_versions`, as an older fi-convert wrote it), or one this
    fi-convert proves for the output's layout; else `UnlistedRelease`, naming them."""
    ok = serving_releases(manifest)
    spec = target_of(manifest, SGLANG).get(releases.VERSIONS_FIELD)
    if sglang_version in ok or (
        isinstance(spec, str)
        and bool(spec)
        and mf.version_in(spec, sglang_version, "SGLang", root, PluginError)
    ):
        return
    names = ", ".join(ok) or (str(spec) if spec else "none")
    raise UnlistedRelease(
        f"{root}: its bytes are proven for SGLang {names}, this is SGLang {sglang_version}, "
        f"whose layout may differ; install SGLang {ok[-1] if ok else names}, or convert "
        "again with an fi-convert that proves this release",
        release=sglang_version,
        listed=names,
    )


def check_plugin_release(manifest: dict, root: str, sglang_version: str) -> None:
    """A proven release that holds the output's bytes, into which this plugin's load is not
    proven for the layout (releases.PLUGIN): refused, naming where it loads. (A release newer
    than every proven one, listed by a newer fi-convert, is left to that proof.)"""
    scheme, backend = manifest["scheme"], manifest["backend"]
    loads = releases.plugin_releases(scheme, backend)
    if sglang_version not in releases.PROVEN or sglang_version in loads:
        return
    where = ", ".join(loads) or "no release"
    raise PluginError(
        f"{root}: SGLang {sglang_version} holds its bytes, but this fi-convert's plugin loads "
        f"{scheme}/{backend} outputs into SGLang {where} only (it follows their processing); "
        f"install SGLang {loads[-1] if loads else where}, or serve the source with SGLang's "
        "own loader"
    )


def check_expert_parallel(
    manifest: dict,
    root: str,
    *,
    ep_size: int,
    moe_tp_size: int,
    eplb: bool,
    redundant: int = 0,
    placement: str = "trivial",
    moe_dp_size: int = 1,
    a2a: str = "none",
) -> None:
    """Expert parallelism as the plugin serves it: EP_SCHEMES (target.py) from an output of
    SGLang's MoE TP size (--tp / --ep-size: a --tp-size 1 output with --ep-size equal to
    --tp), each EP rank holding the experts [r*E/N, (r+1)*E/N) (of its MoE TP rank's split), as
    SGLang's own EP loading and processing leaves them (tests/test_sglang_ep.py). Refused:
    EPLB and redundant experts, a placement other than SGLang's trivial one, the schemes not
    proven under EP, MoE data parallelism (`moe_dp_size`) and an all-to-all backend (`a2a`:
    --moe-a2a-backend, whose dispatchers and runners were not run under EP), an output of
    another TP size, an expert count the EP size does not divide (SGLang's FusedMoE asserts
    it)."""
    if eplb:
        raise PluginError(
            f"{root}: the SGLang plugin does not load redundant experts (EPLB); start SGLang "
            "without --enable-eplb"
        )
    if ep_size == 1:
        return
    scheme = manifest["scheme"]
    if scheme not in EP_SCHEMES:
        why = EP_REFUSED.get(scheme, "not proven yet")
        raise PluginError(
            f"{root}: the SGLang plugin does not load {scheme} experts under expert "
            f"parallelism (--ep-size {ep_size}): {why}; start SGLang with --ep-size 1"
        )
    if redundant:
        raise PluginError(
            f"{root}: the SGLang plugin does not load redundant experts "
            f"(--ep-num-redundant-experts {redundant}); start SGLang without it"
        )
    if placement != "trivial":
        raise PluginError(
            f"{root}: the SGLang plugin loads experts in SGLang's trivial placement only "
            f"(--init-expert-location {placement}); start SGLang without --init-expert-location"
        )
    if a2a != "none":
        raise PluginError(
            f"{root}: the SGLang plugin does not load experts for an all-to-all MoE backend "
            f"(--moe-a2a-backend {a2a}) yet; start SGLang without --moe-a2a-backend"
        )
    if moe_dp_size != 1:
        raise PluginError(
            f"{root}: the SGLang plugin does not load experts under expert parallelism with MoE "
            f"data parallelism (--moe-dp-size {moe_dp_size}) yet; start SGLang with "
            "--moe-dp-size 1"
        )
    tp = manifest["tp_size"]
    if moe_tp_size != tp:
        raise PluginError(
            f"{root}: converted for tensor-parallel size {tp}, and under expert parallelism "
            f"SGLang's MoE TP size is {moe_tp_size} (--tp / --ep-size); start "
            f"SGLang with --tp {tp * ep_size} --ep-size {ep_size}, or convert again with "
            f"--tp-size {moe_tp_size}"
        )
    check_expert_counts(manifest, root, ep_size)


def check_expert_counts(manifest: dict, root: str, ep_size: int) -> None:
    """Each layer's expert count divisible by the EP size, as SGLang's FusedMoE requires (it
    gives each EP rank E/N experts)."""
    for prefix, meta in manifest["layers"].items():
        n = meta["num_experts"]
        if n % ep_size:
            fits = [d for d in range(2, n + 1) if n % d == 0]
            raise PluginError(
                f"{root}: layer {prefix} has {n} experts, which --ep-size {ep_size} does not "
                f"divide (SGLang gives each EP rank E/N experts); start SGLang with --tp and "
                f"--ep-size one of {fits or [1]}, or --ep-size 1"
            )


def check_device(
    manifest: dict,
    root: str,
    *,
    flashinfer_version: str | None,
    capability: tuple[int, int] | None,
) -> None:
    """The checks of the machine: a GPU of the backend's family, and FlashInfer's version."""
    scheme, backend = manifest["scheme"], manifest["backend"]
    family = GPU_FAMILY.get((scheme, backend), "")
    check_gpu(family, backend, capability, root)
    spec = target_of(manifest, SGLANG).get("flashinfer_versions", "")
    if flashinfer_version is None:
        raise PluginError(
            f"{root}: FlashInfer is not installed, and its MoE kernels run these layouts; "
            f"install flashinfer-python in {spec}"
        )
    if not spec or not mf.version_in(spec, flashinfer_version, "FlashInfer", root, PluginError):
        raise PluginError(
            f"{root}: converted for FlashInfer {spec or '(no version range)'}, this is "
            f"FlashInfer {flashinfer_version}; install flashinfer-python in {spec or 'range'}"
        )


def check_gpu(family: str, backend: str, capability: tuple[int, int] | None, root: str) -> None:
    if capability is None:
        raise PluginError(
            f"{root}: FlashInfer's MoE kernels need a CUDA GPU, and there is none here; serve "
            f"this output on a GPU of the family {family}"
        )
    major, sm = capability[0], capability[0] * 10 + capability[1]
    need = {
        "sm100": (major == 10, "an SM100-family (Blackwell B200/GB200/B300) GPU"),
        "sm90": (sm == 90, "an SM90 (Hopper H100/H200) GPU"),
        "sm90+": (sm == 90 or major in (10, 12), "an SM90, SM10x or SM12x GPU"),
        "sm100+": (major in (10, 12), "an SM10x or SM12x (Blackwell) GPU"),
    }.get(family)
    if need is not None and not need[0]:
        raise PluginError(
            f"{root}: {backend} outputs of this scheme need {need[1]} (gpu_family {family}), "
            f"this GPU is SM{sm}; serve it there, or convert for another --backend"
        )


def nextn_layers(manifest: dict, config: Any) -> set[str]:
    """The output's MoE layers that SGLang's model does not build: the multi-token-prediction
    (NextN) layers a DeepSeek-V3/R1 checkpoint ships after its decoder layers (`model.layers.61`
    of 61), which SGLang's loader skips for the model it serves (it reads them only into a
    speculative draft model), by its own rule: the config has `num_nextn_predict_layers` and the
    layer's index is at least `num_hidden_layers`."""
    hidden = getattr(config, "num_hidden_layers", None)
    if not getattr(config, "num_nextn_predict_layers", 0) or not isinstance(hidden, int):
        return set()
    return {
        prefix
        for prefix in manifest["layers"]
        if (m := _LAYER.match(prefix)) is not None and int(m.group(1)) >= hidden
    }


_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def check_layers(
    manifest: dict, root: str, layers: dict[str, Any], skipped: Collection[str] = ()
) -> None:
    """The MoE layers SGLang built (keyed by checkpoint prefix) against the output's: the same
    layers (but for `skipped`, those SGLang does not build: `nextn_layers`), each with the
    output's method, backend, experts, split and sizes."""
    missing = sorted(set(manifest["layers"]) - set(layers) - set(skipped))
    extra = sorted(set(layers) - set(manifest["layers"]))
    if missing or extra:
        which = f"has no MoE layer {missing[0]}" if missing else f"has a MoE layer {extra[0]} not"
        raise PluginError(
            f"{root}: the model SGLang built {which} in the output; serve the output with its "
            "own config.json (converted from another model?)"
        )
    for prefix, layer in layers.items():
        check_layer(manifest, root, prefix, layer)


def check_layer(manifest: dict, root: str, prefix: str, layer: Any) -> None:
    """One FusedMoE layer SGLang built against the output's description of it."""
    scheme, backend = manifest["scheme"], manifest["backend"]
    meta = manifest["layers"][prefix]
    method = type(layer.quant_method).__name__
    if method != METHODS[scheme, backend]:
        raise PluginError(
            f"{root}: layer {prefix}: SGLang built {method} for it, which does not load "
            f"{scheme} outputs; keep the source's config.json and quantization config as "
            "converted"
        )
    if scheme == "mxfp8" and not getattr(layer.quant_method, "use_mxfp8", True):
        raise PluginError(
            f"{root}: layer {prefix}: SGLang built block or per-tensor FP8 for it, the output is "
            "mxfp8; keep the source's quantization config (MXFP8) as converted"
        )
    if scheme == "fp8-block" and not getattr(layer.quant_method, "block_quant", True):
        raise PluginError(
            f"{root}: layer {prefix}: SGLang built per-tensor FP8 for it, the output is "
            "fp8-block; keep the source's quantization config (weight_block_size) as converted"
        )
    got = runner_of(layer)
    if method == "ModelOptFp8MoEMethod" and backend == "trtllm" and got == "triton":
        raise PluginError(
            f"{root}: layer {prefix}: SGLang's model class declares no routing method for it, "
            "so ModelOptFp8MoEMethod runs it on Triton, not FlashInfer TRT-LLM; convert the "
            "source with --backend cutlass (--moe-runner-backend flashinfer_cutlass)"
        )
    if got != runner_for(scheme, backend):
        raise PluginError(
            f"{root}: layer {prefix}: SGLang runs it on its {got} MoE runner, the output is "
            f"for FlashInfer {backend}; pass --moe-runner-backend {runner_for(scheme, backend)}"
        )
    if getattr(layer, "num_fused_shared_experts", 0):
        raise PluginError(
            f"{root}: layer {prefix}: SGLang fused {layer.num_fused_shared_experts} shared "
            "expert(s) into it, which the output does not hold; start SGLang with "
            "--disable-shared-experts-fusion"
        )
    check_expert_parallel(
        manifest, root, ep_size=layer.moe_ep_size, moe_tp_size=layer.moe_tp_size, eplb=False
    )
    local = meta["num_experts"] // layer.moe_ep_size
    if layer.num_experts != meta["num_experts"] or layer.num_local_experts != local:
        raise PluginError(
            f"{root}: layer {prefix} has {meta['num_experts']} experts in the output and "
            f"{layer.num_experts} ({layer.num_local_experts} on this rank) in the model SGLang "
            "built; serve the output with its own config.json (converted from another model?)"
        )
    if layer.moe_tp_size != manifest["tp_size"]:
        raise PluginError(
            f"{root}: converted for tensor-parallel size {manifest['tp_size']}, and SGLang "
            f"split {prefix} over {layer.moe_tp_size} ranks; "
            + launch_command(root, scheme, backend, manifest["tp_size"])
        )
    check_clamp(root, prefix, meta, layer)
    sizes = allocated_sizes(layer)
    want = (meta["padded_hidden_size"], meta["padded_intermediate_size_per_rank"])
    if sizes != want:
        raise PluginError(
            f"{root}: layer {prefix}: SGLang allocated hidden and intermediate sizes per rank "
            f"{sizes}, the output holds {want} (converted for another server's padding?); "
            "convert the source again for SGLang"
        )


def runner_of(layer: Any) -> str:
    """The MoE runner SGLang runs a layer on: the layer's own `runner_backend` (SGLang 0.5.23
    sets it per layer, from its quant method), else the backend of the runner its quant method
    created (0.5.20-0.5.22: `quant_method.runner`)."""
    got = getattr(layer, "runner_backend", None)
    if got is None:
        got = getattr(getattr(layer.quant_method, "runner", None), "runner_backend", None)
    return str(getattr(got, "value", got))


def check_clamp(root: str, prefix: str, meta: dict, layer: Any) -> None:
    """The SwiGLU clamp an NVFP4 TRT-LLM output was converted with (its layer entry's
    `swiglu_limit`: SGLang's processing rescales block scales and alphas by it) against the one
    SGLang gives the layer (`gemm1_clamp_limit or swiglu_limit` of its runner config, as its
    processing takes it); other outputs' bytes do not depend on it."""
    if not _is_nvfp4_trtllm(layer):
        return
    cfg = layer.moe_runner_config
    got = cfg.gemm1_clamp_limit or cfg.swiglu_limit
    want = meta.get("swiglu_limit")
    if (None if got is None else float(got)) != want:
        raise PluginError(
            f"{root}: layer {prefix}: converted with SwiGLU clamp limit {want}, and SGLang gives "
            f"the layer {got} (its block scales depend on it); convert the source again with "
            "its own config.json, or serve the output with the config.json it was converted with"
        )


def _is_nvfp4_trtllm(layer: Any) -> bool:
    method = layer.quant_method
    nvfp4 = type(method).__name__ == "ModelOptNvFp4FusedMoEMethod"
    return nvfp4 and older_releases.nvfp4_trtllm_layout(method)


# Methods that pad the sizes FusedMoE gives them again, and allocate by their own: SGLang's
# MXFP4 method pads I per rank to 128 on flashinfer_mxfp4 (FusedMoE keeps it unpadded)
OWN_SIZES = ("Mxfp4MoEMethod",)


# Methods whose processing pads I per rank again, to a multiple of this, where FusedMoE did not:
# ModelOpt FP8 on flashinfer_cutlass pads each half of w13 and w2's columns to 16
PROCESS_PADDED = {("ModelOptFp8MoEMethod", "flashinfer_cutlass"): 16}


def allocated_sizes(layer: Any) -> tuple[int, int]:
    """The hidden size and intermediate size per rank SGLang allocated the layer's experts by
    (and its processing pads them to; gpt-oss MXFP4 on SM90: pads them to after loading, as its
    processing's new tensors)."""
    method = layer.quant_method
    if type(method).__name__ in OWN_SIZES:
        if getattr(method, "_fi_kernel", None) == "cutlass_sm90":
            return method._padded_hidden, method._padded_intermediate
        return method.hidden_size, method.intermediate_size_per_partition
    runner = runner_of(layer)
    align = PROCESS_PADDED.get((type(method).__name__, runner), 1)
    i = layer.intermediate_size_per_partition
    return layer.hidden_size, -(-i // align) * align
