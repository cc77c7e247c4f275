"""fi_convert/verify/output.py and fi_convert/manifest.py: `fi-convert verify` proves the manifest
itself: each field a loader sets its kernels up from against the values fi-convert writes, the
shards, config.json and the scheme's own plan for the recorded sizes; files the manifest does
not list are reported; no edit of the manifest or the index makes it crash."""

from __future__ import annotations

import copy
import json
import os
import random
import shutil

import pytest

from fi_convert import FiConvertError, Options, convert
from fi_convert.schemes import REGISTRY
from fi_convert.testing.synthetic import Spec, write_checkpoint
from fi_convert.verify import verify
from fi_convert.verify.output import Report

from .conftest import cli

MANIFEST = "fi-convert-manifest.json"
INDEX = "model.safetensors.index.json"

# name: (spec, scheme, backend, tp); every scheme, both backends where there are two, TP 1-4,
# padded and unpadded sizes, per-expert and fused experts, and the BF16 sources that fp8-tensor
# and mxfp8 quantize
CASES = {
    "bf16-trtllm-tp2": (
        Spec("qwen3-moe", layers=2, experts=3, hidden=128, intermediate=192),
        "bf16",
        "trtllm",
        2,
    ),
    "bf16-cutlass-tp1": (
        Spec("qwen3-moe-fused", layers=1, experts=3, hidden=128, intermediate=192),
        "bf16",
        "cutlass",
        1,
    ),
    "fp8-block-trtllm-tp2": (
        Spec("deepseek-v3", layers=2, experts=4, hidden=256, intermediate=256),
        "fp8-block",
        "trtllm",
        2,
    ),
    "fp8-block-cutlass-tp1": (
        Spec("deepseek-v3", layers=2, experts=4, hidden=256, intermediate=256),
        "fp8-block",
        "cutlass",
        1,
    ),
    "fp8-tensor-trtllm-tp2": (
        Spec("mixtral", layers=1, experts=3, hidden=128, intermediate=200, quant="fp8-tensor"),
        "fp8-tensor",
        "trtllm",
        2,
    ),
    "fp8-tensor-cutlass-tp1": (
        Spec("qwen3-moe", layers=1, experts=3, hidden=128, intermediate=128, quant="fp8-tensor"),
        "fp8-tensor",
        "cutlass",
        1,
    ),
    "fp8-tensor-from-bf16-tp1": (
        Spec("qwen3-moe", layers=1, experts=3, hidden=128, intermediate=192),
        "fp8-tensor",
        "trtllm",
        1,
    ),
    "mxfp8-trtllm-tp2": (
        Spec("qwen3-moe", layers=1, experts=3, hidden=128, intermediate=128, quant="mxfp8"),
        "mxfp8",
        "trtllm",
        2,
    ),
    "mxfp8-from-bf16-tp1": (
        Spec("qwen3-moe", layers=1, experts=3, hidden=160, intermediate=192),
        "mxfp8",
        "trtllm",
        1,
    ),
    "nvfp4-trtllm-tp2": (
        Spec("deepseek-v3", layers=2, experts=4, hidden=256, intermediate=256, quant="nvfp4"),
        "nvfp4",
        "trtllm",
        2,
    ),
    "nvfp4-cutlass-tp1": (
        Spec("qwen3-moe", layers=1, experts=3, hidden=128, intermediate=128, quant="nvfp4-ct"),
        "nvfp4",
        "cutlass",
        1,
    ),
    "mxfp4-trtllm-tp2": (
        Spec("gpt-oss", layers=1, experts=3, hidden=320, intermediate=192),
        "mxfp4",
        "trtllm",
        2,
    ),
    "mxfp4-cutlass-tp4": (
        Spec("gpt-oss", layers=1, experts=3, hidden=128, intermediate=192),
        "mxfp4",
        "cutlass",
        4,
    ),
}


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """Each case converted once, on first use."""
    root = tmp_path_factory.mktemp("vm")
    made: dict = {}

    def get(case: str):
        if case not in made:
            spec, scheme, backend, tp = CASES[case]
            src = write_checkpoint(root / case / "src", spec)
            opts = Options(scheme, backend, tp, allow_unservable=True)  # fp8-tensor from BF16
            convert(src, root / case / "out", opts, device="cpu")
            made[case] = root / case / "out"
        return made[case]

    return get


def _linked(out, tmp_path, name="out"):
    """A copy of `out` whose files are hard links (fast), but for a fresh manifest."""
    dst = tmp_path / name
    shutil.copytree(out, dst, copy_function=os.link)
    m = json.loads((dst / MANIFEST).read_text())
    (dst / MANIFEST).unlink()  # never write through the link into the fixture
    return dst, m


def _write(dst, m) -> None:
    (dst / MANIFEST).unlink(missing_ok=True)
    (dst / MANIFEST).write_text(json.dumps(m, indent=2, sort_keys=True) + "\n")


def _cli(out):
    r = cli("verify", out)
    assert "Traceback" not in r.output, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert all(ln.startswith(("mismatch: ", "error: ")) for ln in lines), r.stderr
    return r, lines


def _first_layer(m) -> dict:
    return m["layers"][sorted(m["layers"])[0]]


# ---------------------------------------------------------------- clean outputs pass


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_clean_output_of_every_scheme_passes(outputs, case):
    out = outputs(case)
    rep = verify(out)
    assert rep.ok, rep.problems
    m = json.loads((out / MANIFEST).read_text())
    assert rep.checked["layers_replanned"] == len(m["layers"])


def test_every_scheme_has_stand_ins():
    for scheme in REGISTRY.values():
        assert scheme.stand_in_layers("model.layers.1.mlp.experts", 4, 256, 256), scheme.name


# ---------------------------------------------------------------- flipped fields fail


def _layout_flip(m):
    t = _first_layer(m)["tensors"]["w13_weight"]
    t["layout"] = "MajorK" if t["layout"] == "BlockMajorK" else "BlockMajorK"
    return "w13_weight.layout"


def _other_backend(m):
    """A valid name, the wrong one: its target, layouts or the scheme's backends say so."""
    m["backend"] = "cutlass" if m["backend"] == "trtllm" else "trtllm"
    return ""


def _bump(key):
    def edit(m):
        _first_layer(m)[key] += 1
        return key

    return edit


def _tensor_key(pname, key, value):
    def edit(m):
        _first_layer(m)["tensors"][pname][key] = value(_first_layer(m)["tensors"][pname][key])
        return f"{pname}.{key}"

    return edit


def _drop_last_tensor(m):
    tensors = _first_layer(m)["tensors"]
    name = sorted(tensors)[-1]
    del tensors[name]
    return f"tensor {name} is missing"


def _other_scheme(m):
    m["scheme"] = "bf16" if m["scheme"] != "bf16" else "fp8-block"
    return ""


def _gpu_family(m):
    m["target"]["gpu_family"] = "sm90" if m["target"]["gpu_family"] != "sm90" else "sm100"
    return "target.gpu_family"


def _expert_parallel(m):
    m["expert_parallel"] = "any EP size, trust me"
    return "expert_parallel"


def _version_float(m):
    m["format_version"] = 2.0
    return "format_version"


def _bool_as_int(m):
    t = _first_layer(m)["tensors"]["w13_weight"]
    t["gated_interleave"] = int(t["gated_interleave"])
    return "w13_weight.gated_interleave"


def _extra_field(m):
    _first_layer(m)["tensors"]["w2_weight"]["transposed"] = True
    return "w2_weight.transposed' is not one fi-convert writes"  # the reader refuses it


def _fewer_experts(m):
    _first_layer(m)["num_experts"] -= 1
    return "num_experts"


FLIPS = {
    # the three of the issue
    "backend garbled": lambda m: m.update(backend="trtlIm") or "backend",
    "padded I off by one": _bump("padded_intermediate_size_per_rank"),
    "layout BlockMajorK<->MajorK": _layout_flip,
    # and more
    "backend the other one": _other_backend,
    "padded H off by one": _bump("padded_hidden_size"),
    "I per rank off by one": _bump("intermediate_size_per_rank"),
    "row order": _tensor_key("w13_weight", "row_order", lambda v: "rows"),
    "gated interleave": _tensor_key("w13_weight", "gated_interleave", lambda v: not v),
    "epilogue tile": _tensor_key("w2_weight", "epilogue_tile_m", lambda v: 64 if v != 64 else 128),
    "a tensor left out": _drop_last_tensor,
    "scheme": _other_scheme,
    "gpu family": _gpu_family,
    "expert parallel note": _expert_parallel,
    "format version 2.0": _version_float,
    "a bool as 0/1": _bool_as_int,
    "a field no scheme writes": _extra_field,
    "experts": _fewer_experts,
}


@pytest.mark.parametrize("flip", list(FLIPS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_flipped_manifest_field_fails(outputs, tmp_path, case, flip):
    dst, m = _linked(outputs(case), tmp_path)
    words = FLIPS[flip](m)
    _write(dst, m)
    try:
        rep = verify(dst)
    except FiConvertError as e:  # a manifest the reader refuses: one line
        rep = Report(problems=[str(e)])
    assert not rep.ok, f"{case}: {flip} passed"
    assert all("\n" not in p for p in rep.problems)
    assert any(words in p for p in rep.problems), rep.problems


def test_the_issue_flips_fail_on_the_command_line(outputs, tmp_path):
    out = outputs("bf16-trtllm-tp2")
    for flip in ("backend garbled", "padded I off by one", "layout BlockMajorK<->MajorK"):
        dst, m = _linked(out, tmp_path, flip.replace(" ", "_"))
        FLIPS[flip](m)
        _write(dst, m)
        r, lines = _cli(dst)
        assert r.exit_code == 1 and lines, (flip, r.output)
    # one line per problem, naming the manifest, the layer and field, and what is wrong
    assert lines == [
        f"mismatch: {dst / MANIFEST}: layer model.layers.0.mlp.experts: w13_weight.layout is "
        '"MajorK"; bf16/trtllm at tp 2 gives "BlockMajorK"'
    ]


def _source_bound_edit(key: str, value):
    """Another value of the form plain verify checks: it cannot see the edit."""
    if key == "family":  # one whose router and activation are the same under this config.json
        return "qwen3-moe" if value != "qwen3-moe" else "deepseek-v3"
    if isinstance(value, int):
        return value + 1
    if key == "fingerprint":
        return ("0" if value[0] != "0" else "1") + value[1:]
    return value + "-edited"


# the manifest's fields that only the source proves: each key of `source` but the model_type
# (which config.json shows), and the version of the fi-convert that wrote it
SOURCE_BOUND = ["fi_convert_version", "source.family", "source.fingerprint", "source.shards"]


@pytest.mark.parametrize("field", SOURCE_BOUND)
def test_a_source_bound_field_edited_fails_only_with_source(outputs, tmp_path, field):
    out = outputs("bf16-trtllm-tp2")
    dst, m = _linked(out, tmp_path)
    section, _, key = field.rpartition(".")
    where = m[section] if section else m
    where[key] = _source_bound_edit(key, where[key])
    _write(dst, m)
    assert verify(dst).ok  # the files cannot prove it
    r = cli("verify", dst, "--source", out.parent / "src")
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == 1 and len(lines) == 1, r.output
    assert lines[0].startswith(f"mismatch: {dst / MANIFEST}: {field} is "), lines


# the fields of `source` plain verify proves from config.json and the family
FAMILY_BOUND = ["source.routing", "source.activation"]


def test_every_source_bound_field_is_covered(outputs):
    """A field build() adds to `source` is one that only --source proves: it needs a case."""
    m = json.loads((outputs("bf16-trtllm-tp2") / MANIFEST).read_text())
    from_config = {"source.model_type", "source.architectures"}  # the output's config.json's
    fields = {f"source.{k}" for k in m["source"]} - {*from_config, *FAMILY_BOUND}
    assert fields <= set(SOURCE_BOUND)


def test_the_architectures_are_proven_from_config_json(outputs, tmp_path):
    dst, m = _linked(outputs("bf16-trtllm-tp2"), tmp_path)
    m["source"]["architectures"] = ["Kolibri1ForCausalLM"]
    _write(dst, m)
    r, lines = _cli(dst)
    assert r.exit_code == 1 and any(
        ln.startswith(f"mismatch: {dst / MANIFEST}: source.architectures is ") for ln in lines
    ), r.output


@pytest.mark.parametrize("field", FAMILY_BOUND)
def test_the_familys_routing_and_activation_are_proven_from_config_json(outputs, tmp_path, field):
    dst, m = _linked(outputs("bf16-trtllm-tp2"), tmp_path)
    key = field.rpartition(".")[2]
    m["source"][key] = "Custom" if key == "routing" else "gelu_tanh"
    _write(dst, m)
    r, lines = _cli(dst)
    assert r.exit_code == 1 and len(lines) == 1, r.output
    assert lines[0].startswith(f"mismatch: {dst / MANIFEST}: {field} is "), lines
    assert "'s experts under config.json give " in lines[0]


SCHEME_FLIPS = {
    "fp8-block-trtllm-tp2": [
        ("weight_block_size", lambda lay: lay.update(weight_block_size=[128, 64])),
        (
            "w13_weight_scale_inv.min",
            lambda lay: lay["tensors"]["w13_weight_scale_inv"].update(min=1e-9),
        ),
        (
            "w2_weight.block_k_bytes",
            lambda lay: lay["tensors"]["w2_weight"].update(block_k_bytes=64),
        ),
    ],
    "fp8-tensor-trtllm-tp2": [
        ("activation_scheme", lambda lay: lay.update(activation_scheme="dynamic")),
        ("source_format", lambda lay: lay.update(source_format="fp8 per-channel")),
    ],
    "fp8-tensor-from-bf16-tp1": [
        ("activation_scheme", lambda lay: lay.update(activation_scheme="static")),
    ],
    "mxfp8-trtllm-tp2": [
        ("w13_weight_scale.pad", lambda lay: lay["tensors"]["w13_weight_scale"].update(pad=0)),
    ],
    "nvfp4-trtllm-tp2": [
        (
            "w13_scale_2_differs_for_experts",
            lambda lay: lay.update(w13_scale_2_differs_for_experts=[4]),
        ),
        (
            "w13_scale_2_differs_for_experts",
            lambda lay: lay.update(w13_scale_2_differs_for_experts=[3, 1]),
        ),
        ("group_size", lambda lay: lay.update(group_size=32)),
        ("w13_weight.packing", lambda lay: lay["tensors"]["w13_weight"].pop("packing")),
    ],
    "nvfp4-cutlass-tp1": [
        (
            "w13_weight_scale.layout",
            lambda lay: lay["tensors"]["w13_weight_scale"].update(layout="row_major_blocks"),
        ),
    ],
    "mxfp4-trtllm-tp2": [
        ("rows_per_rank", lambda lay: lay.update(rows_per_rank=[96, 95])),
        ("rows_per_rank", lambda lay: lay.update(rows_per_rank=[128, 64])),
        ("swiglu_limit", lambda lay: lay.update(swiglu_limit=8.0)),
        ("w2_bias.rank0_only", lambda lay: lay["tensors"]["w2_bias"].pop("rank0_only")),
        ("w13_bias.row_order", lambda lay: lay["tensors"]["w13_bias"].update(row_order="up_gate")),
    ],
    "mxfp4-cutlass-tp4": [
        ("rows_per_rank", lambda lay: lay.update(rows_per_rank=[64, 64, 32, 32])),
        ("w13_bias is BF16", lambda lay: lay["tensors"]["w13_bias"].update(dtype="F32")),
    ],
}


@pytest.mark.parametrize(
    "case,k", [(c, k) for c, flips in SCHEME_FLIPS.items() for k in range(len(flips))]
)
def test_a_flipped_scheme_field_fails(outputs, tmp_path, case, k):
    words, edit = SCHEME_FLIPS[case][k]
    dst, m = _linked(outputs(case), tmp_path)
    before = copy.deepcopy(m)
    edit(_first_layer(m))
    assert m != before
    _write(dst, m)
    rep = verify(dst)
    assert any(words in p for p in rep.problems), rep.problems


def test_a_hidden_size_the_shapes_cannot_show_is_checked_against_config(outputs, tmp_path):
    """nvfp4/trtllm pads H to 256: H 240 gives the same shapes as 256; config.json says 256."""
    dst, m = _linked(outputs("nvfp4-trtllm-tp2"), tmp_path)
    for lay in m["layers"].values():
        lay["hidden_size"] = 240
    _write(dst, m)
    rep = verify(dst)
    assert rep.problems and all(
        "hidden_size is 240, config.json says 256" in p for p in rep.problems
    )


def test_a_layer_left_out_of_the_manifest_is_found_in_the_shards(outputs, tmp_path):
    dst, m = _linked(outputs("fp8-block-trtllm-tp2"), tmp_path)
    gone = sorted(m["layers"])[-1]
    del m["layers"][gone]
    _write(dst, m)
    rep = verify(dst)
    assert any(f"holds {gone}.w13_weight, converted experts of a layer" in p for p in rep.problems)


def test_config_json_must_keep_the_mark(outputs, tmp_path):
    """A manifest re-signed over a config.json without the mark: stock vLLM would load it."""
    import hashlib

    dst, m = _linked(outputs("bf16-cutlass-tp1"), tmp_path)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["quantization_config"] = None
    data = json.dumps(cfg).encode()
    (dst / "config.json").unlink()
    (dst / "config.json").write_bytes(data)
    m["files"]["config.json"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    _write(dst, m)
    rep = verify(dst)
    assert rep.problems == [
        f"{dst / 'config.json'}: quantization_config is not fi-convert's mark, so a stock server "
        "would load the layouts as the source's weights; convert again"
    ]


# ---------------------------------------------------------------- files the manifest lacks


def test_files_the_manifest_does_not_list_are_reported(outputs, tmp_path):
    dst, m = _linked(outputs("mxfp8-trtllm-tp2"), tmp_path)
    _write(dst, m)
    (dst / "model-00009-of-00009.safetensors").write_bytes(b"stale")
    (dst / "sub" / "deeper").mkdir(parents=True)
    (dst / "sub" / "deeper" / "notes.txt").write_text("x")
    (dst / "config.json.fi-convert-tmp").write_text("{}")
    os.symlink(tmp_path, dst / "linked")
    # reported as such: a run's state folder; not reported: what a Hub download adds
    (dst / ".fi-convert").mkdir()
    (dst / ".fi-convert" / "state.json").write_text("{}")
    (dst / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    (dst / ".cache" / "huggingface" / "download").mkdir(parents=True)
    (dst / ".cache" / "huggingface" / "download" / "config.json.metadata").write_text("x")
    rep = verify(dst)
    said = "in the folder, but the manifest does not list it; remove it (or convert again)"
    assert not rep.ok and rep.problems == []  # what the manifest lists is intact
    state = (
        f"{dst / '.fi-convert'}: a conversion's state folder, which a finished output does not "
        "hold (a run was killed after its manifest, or one is writing here); run the "
        "conversion's command again, which removes it (or remove it)"
    )
    assert rep.unlisted == [state] + [
        f"{dst / name}: {said}"
        for name in (
            "config.json.fi-convert-tmp",
            "linked",
            "model-00009-of-00009.safetensors",
            "sub/deeper/notes.txt",
        )
    ]


@pytest.mark.parametrize(
    ("names", "ok"),
    [
        (["progress.json"], True),  # a streamed conversion's record, in a download of its repo
        (["progress-1-of-2.json", "progress-2-of-2.json"], True),
        (["progress.json", "lock"], False),  # a local run's lock beside it
        (["state.json"], False),
        ([], False),
    ],
)
def test_only_a_streamed_repos_progress_records_pass_in_the_state_folder(
    outputs, tmp_path, names, ok
):
    dst, m = _linked(outputs("mxfp8-trtllm-tp2"), tmp_path)
    _write(dst, m)
    (dst / ".fi-convert").mkdir()
    for name in names:
        (dst / ".fi-convert" / name).write_text("{}")
    rep = verify(dst)
    assert rep.ok is ok, rep.unlisted
    assert rep.problems == [] and len(rep.unlisted) == (0 if ok else 1)


def test_a_file_left_out_of_the_manifest_is_reported(outputs, tmp_path):
    dst, m = _linked(outputs("mxfp8-trtllm-tp2"), tmp_path)
    del m["files"]["tokenizer.json"]
    _write(dst, m)
    line = (
        f"{dst / 'tokenizer.json'}: in the folder, but the manifest does not list it; remove it "
        "(or convert again)"
    )
    assert verify(dst).unlisted == [line]
    r, lines = _cli(dst)
    assert r.exit_code == 1 and lines == [f"mismatch: {line}"]
    r = cli("verify", dst, "--json")
    assert r.exit_code == 1 and json.loads(r.stdout)["problems"] == [line]


@pytest.mark.parametrize("name", ["../outside.txt", "/etc/hostname", "a//b", ".hidden", MANIFEST])
def test_a_file_name_outside_the_folder_is_never_read(outputs, tmp_path, name, monkeypatch):
    from fi_convert.format import manifest as mf

    read: list = []
    real = mf.sha256_file
    monkeypatch.setattr(mf, "sha256_file", lambda p, **kw: read.append(p) or real(p, **kw))
    (tmp_path / "outside.txt").write_text("secret")
    dst, m = _linked(outputs("mxfp8-trtllm-tp2"), tmp_path)
    m["files"][name] = {"sha256": "0" * 64, "size": 6}
    _write(dst, m)
    rep = verify(dst)
    assert any(f"files lists {name!r}" in p for p in rep.problems), rep.problems
    assert all(p.parent == dst for p in read), read


# ---------------------------------------------------------------- never a traceback


INDEX_DAMAGE = {  # the index as damaged
    "weight_map value not a name": lambda d: d["weight_map"].update({"x": 5}) or d,
    "weight_map value a list": lambda d: d["weight_map"].update({"x": ["a"]}) or d,
    "metadata a list": lambda d: d.update(metadata=[1]) or d,
    "total_size a string": lambda d: d.update(metadata={"total_size": "1"}) or d,
    "index a list": lambda d: [d],
    "a shard of another folder": lambda d: d["weight_map"].update({"x": "../s.safetensors"}) or d,
}


@pytest.mark.parametrize("damage", list(INDEX_DAMAGE))
def test_a_garbled_index_is_mismatches_not_a_traceback(outputs, tmp_path, damage):
    import hashlib

    dst, m = _linked(outputs("bf16-trtllm-tp2"), tmp_path)
    d = INDEX_DAMAGE[damage](json.loads((dst / INDEX).read_text()))
    data = json.dumps(d).encode()
    (dst / INDEX).unlink()
    (dst / INDEX).write_bytes(data)
    m["files"][INDEX] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    _write(dst, m)
    r, lines = _cli(dst)
    assert r.exit_code == 1 and lines


def test_a_shard_missing_or_corrupt_is_a_line_each(outputs, tmp_path):
    dst, m = _linked(outputs("fp8-block-trtllm-tp2"), tmp_path)
    _write(dst, m)
    shards = sorted(n for n in m["files"] if n.endswith(".safetensors"))
    (dst / shards[0]).unlink()
    (dst / shards[-1]).unlink()
    (dst / shards[-1]).write_bytes(b"\xff" * 16)
    r, lines = _cli(dst)
    assert r.exit_code == 1
    assert any(f"{shards[0]}: missing" in ln for ln in lines)
    assert any(shards[-1] in ln and "corrupt" in ln for ln in lines), lines


# Fields verify cannot prove without the source: any value of the right form passes.
UNPROVABLE = [
    ("fi_convert_version",),
    ("source", "shards"),
    ("layers", "*", "w13_scale_2_differs_for_experts"),
    # removed (or renamed) from a vLLM output, it is an output without the field: vLLM's, the
    # same output (docs/FORMAT.md); any other value fails
    ("server",),
    # ... and removed from `source`, an output written before source.architectures (its
    # release lists judged by its layout alone: a list narrowed by the architecture fails)
    ("source", "architectures"),
]
VALUES = [None, True, False, 0, -1, 7, 2.5, 1e308, 2**70, "", "x", [], [0], [1, "a"], {}, {"k": 1}]


def _paths(v, path=()):
    yield path
    if isinstance(v, dict):
        for k in v:
            yield from _paths(v[k], (*path, k))
    elif isinstance(v, list):
        for k in range(len(v)):
            yield from _paths(v[k], (*path, k))


def _mutate(m, rnd: random.Random):
    """One random edit: a value replaced, a key removed or renamed, a list item dropped."""
    path = rnd.choice([p for p in _paths(m) if p])
    parent = m
    for k in path[:-1]:
        parent = parent[k]
    key = path[-1]
    how = rnd.choice(["replace", "replace", "remove", "rename"])
    if how == "replace":
        parent[key] = copy.deepcopy(rnd.choice(VALUES))
    elif how == "remove":
        del parent[key]
    elif isinstance(parent, dict):
        parent[key + rnd.choice(["x", " ", "\n"])] = parent.pop(key)
    else:
        parent.insert(0, parent.pop(key))
    return path


FUZZED = ["bf16-trtllm-tp2", "fp8-tensor-trtllm-tp2", "nvfp4-trtllm-tp2", "mxfp4-cutlass-tp4"]


@pytest.mark.parametrize("case", FUZZED)
def test_seeded_fuzz_of_manifest_edits(outputs, tmp_path, case):
    """No edit makes verify traceback; every edit of a field it can prove fails it."""
    dst, clean = _linked(outputs(case), tmp_path)
    rnd = random.Random(f"fi-convert-{case}")
    passed = []
    for _ in range(50):
        m = copy.deepcopy(clean)
        path = _mutate(m, rnd)
        if m == clean:
            continue
        _write(dst, m)
        r, lines = _cli(dst)
        assert r.exit_code in (0, 1), (path, r.output)
        if r.exit_code == 0:
            generic = tuple(
                "*" if k == 1 and path[0] == "layers" else p for k, p in enumerate(path)
            )
            passed.append(generic)
            assert any(generic[: len(u)] == u for u in UNPROVABLE), (path, r.output)
    assert len(passed) < 10


@pytest.mark.parametrize("case", FUZZED[:2])
def test_seeded_fuzz_of_index_edits(outputs, tmp_path, case):
    """The index edited (and signed in the manifest, as a converter bug would): never a
    traceback, and every edit that changes it fails."""
    import hashlib

    dst, m = _linked(outputs(case), tmp_path)
    _write(dst, m)
    clean = json.loads((dst / INDEX).read_text())
    rnd = random.Random(f"fi-convert-index-{case}")
    for _ in range(25):
        d = copy.deepcopy(clean)
        path = _mutate(d, rnd)
        if d == clean:
            continue
        data = json.dumps(d).encode()
        (dst / INDEX).unlink()
        (dst / INDEX).write_bytes(data)
        m["files"][INDEX] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
        _write(dst, m)
        r, lines = _cli(dst)
        assert r.exit_code == 1 and lines, (path, r.output)
