"""fi_convert/format/keys.py and format/manifest.py's `read`: every key the reader meets is one
it knows. A key it does not know is refused in one line naming it (and, for a manifest a newer
fi-convert wrote, that version and to upgrade); no single-bit flip of any key of a real manifest
passes `verify`; the keys earlier releases wrote still read."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from fi_convert import FiConvertError, Options, convert
from fi_convert.format import manifest as fm
from fi_convert.format.keys import KNOWN_KEYS, unknown_keys
from fi_convert.testing.synthetic import Spec, write_checkpoint
from fi_convert.verify import verify

from .conftest import cli

MANIFEST = "fi-convert-manifest.json"

# real manifests with many keys: nvfp4 (scale keys, pad, group_size, the differing experts),
# gpt-oss mxfp4 for SGLang (swiglu_limit, rows_per_rank, rank0_only, pad as a map), and an
# output for both servers (servers, targets)
CASES = {
    "nvfp4": (Spec("deepseek-v3", layers=2, experts=3, hidden=128, intermediate=128, quant="nvfp4"),
              Options("nvfp4", "trtllm", 2)),
    "mxfp4-sglang": (Spec("gpt-oss", layers=1, experts=3, hidden=128, intermediate=192),
                     Options("mxfp4", "cutlass", 2, server="sglang")),
    "bf16-both": (Spec("qwen3-moe", layers=1, experts=3, hidden=128, intermediate=128),
                  Options("bf16", "cutlass", 1, server="vllm,sglang")),
}  # fmt: skip


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("keys")
    made: dict[str, Path] = {}

    def get(case: str) -> Path:
        if case not in made:
            spec, opts = CASES[case]
            src = write_checkpoint(root / case / "src", spec)
            convert(src, root / case / "out", opts, device="cpu")
            made[case] = root / case / "out"
        return made[case]

    return get


def _copy(out: Path, tmp_path: Path) -> tuple[Path, dict]:
    dst = tmp_path / "out"
    shutil.copytree(out, dst, copy_function=os.link)
    m = json.loads((dst / MANIFEST).read_text())
    (dst / MANIFEST).unlink()  # never write through the link into the fixture
    return dst, m


def _write(dst: Path, m: dict) -> None:
    (dst / MANIFEST).unlink(missing_ok=True)
    (dst / MANIFEST).write_text(json.dumps(m, indent=2, sort_keys=True) + "\n")


def _passes(dst: Path) -> bool:
    try:
        return verify(dst).ok
    except FiConvertError:
        return False


def _key_paths(node: object, path: tuple = ()) -> Iterator[tuple]:
    """The path of every key of every map in the manifest."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield (*path, k)
            yield from _key_paths(v, (*path, k))


def _renamed(m: dict, path: tuple, new: str) -> dict:
    """`m` with the key at `path` renamed to `new` (in place of the old, order kept)."""
    out = json.loads(json.dumps(m))
    parent = out
    for k in path[:-1]:
        parent = parent[k]
    items = [(new if k == path[-1] else k, v) for k, v in parent.items()]
    parent.clear()
    parent.update(items)
    return out


def _place(path: tuple) -> tuple:
    """Where a key sits, as the table names places: names of layers, tensors, files and
    targets are `*`."""
    out: list[str] = []
    for k in path:
        named = ".".join(out) in ("layers", "layers.*.tensors", "files", "targets")
        out.append("*" if named else k)
    return tuple(out)


@pytest.mark.parametrize("case", sorted(CASES))
def test_no_single_bit_flip_of_a_key_passes_verify(outputs, tmp_path, case):
    dst, m = _copy(outputs(case), tmp_path)
    _write(dst, m)
    assert verify(dst).ok
    seen: set[tuple] = set()
    flips, passed = 0, []
    for path in _key_paths(m):
        # one of each: each key at each place (one layer's, one tensor's, one file's ...),
        # and one name of each map (a layer prefix, a parameter, a file, a server)
        place = _place(path) if _place(path)[-1] == "*" else (*_place(path), path[-1])
        if place in seen:
            continue
        seen.add(place)
        for i, ch in enumerate(path[-1]):
            for bit in range(8):
                new = path[-1][:i] + chr(ord(ch) ^ (1 << bit)) + path[-1][i + 1 :]
                _write(dst, _renamed(m, path, new))
                flips += 1
                if _passes(dst):
                    passed.append(".".join((*path[:-1], new)))
    assert flips > 1000 and passed == [], passed


@pytest.mark.parametrize(
    ("where", "key"),
    [
        ((), "sesver"),  # the issue's flip of "server"
        (("target",), "vllm_versionz"),
        (("source",), "famil"),
        (("layers", 0), "num_expertz"),
        (("layers", 0, "tensors", 0), "layoux"),
        (("files", 0), "sha257"),
    ],
)
def test_an_unknown_key_is_refused_naming_it(outputs, tmp_path, where, key):
    dst, m = _copy(outputs("nvfp4"), tmp_path)
    node, path = m, []
    for step in where:
        name = sorted(node)[step] if isinstance(step, int) else step
        node, path = node[name], [*path, name]
    node[key] = 1
    _write(dst, m)
    dotted = ".".join([*path, key])
    want = (
        f"{dst / MANIFEST}: key {dotted!r} is not one fi-convert writes; the manifest is "
        "damaged, convert again"
    )
    with pytest.raises(FiConvertError) as e:
        fm.read(dst)
    assert str(e.value) == want
    r = cli("verify", dst)
    assert r.exit_code == 1 and r.stderr.strip() == f"error: {want}", r.stderr


def test_a_key_of_a_newer_fi_convert_says_which_wrote_it_and_to_upgrade(outputs, tmp_path):
    dst, m = _copy(outputs("nvfp4"), tmp_path)
    m["fi_convert_version"] = "9.3.0"
    m["target"]["blackwell_ultra"] = True
    _write(dst, m)
    with pytest.raises(FiConvertError) as e:
        fm.read(dst)
    assert str(e.value) == (
        f"{dst / MANIFEST}: key 'target.blackwell_ultra' is not one this fi-convert (0.1.0) "
        "knows; fi-convert 9.3.0, a newer release, wrote the manifest: upgrade fi-convert to "
        "read it"
    )


def test_a_newer_format_version_says_which_fi_convert_wrote_it(outputs, tmp_path):
    dst, m = _copy(outputs("nvfp4"), tmp_path)
    m["format_version"], m["fi_convert_version"] = 3, "1.4.0"
    _write(dst, m)
    with pytest.raises(FiConvertError) as e:
        fm.read(dst)
    assert str(e.value) == (
        f"{dst / MANIFEST}: format version 3, written by fi-convert 1.4.0; this fi-convert "
        "(0.1.0) reads format version 2: upgrade fi-convert to read it"
    )


# Keys fi-convert releases of format_version 2 wrote (`git log -p -- fi_convert/manifest.py
# fi_convert/format/ fi_convert/servers/*/target.py`, docs/FORMAT.md), by place, and the keys
# other work adds (`target.vllm_releases`, `target.sglang_releases`).
HISTORICAL = {
    "": {"format", "format_version", "fi_convert_version", "scheme", "backend", "tp_size",
         "server", "servers", "targets", "target", "expert_parallel", "source", "layers",
         "files"},
    "target": {"vllm", "vllm_versions", "sglang", "sglang_versions", "flashinfer",
               "flashinfer_layouts", "flashinfer_versions", "gpu_family", "vllm_releases",
               "sglang_releases"},
    "source": {"model_type", "family", "fingerprint", "shards", "repo_id", "revision",
               "command"},
    "layers.*": {"num_experts", "hidden_size", "intermediate_size", "intermediate_size_per_rank",
                 "padded_hidden_size", "padded_intermediate_size_per_rank", "weight_block_size",
                 "activation_scheme", "source_format", "group_size",
                 "w13_scale_2_differs_for_experts", "tp_split", "rows_per_rank", "swiglu_limit",
                 "tensors"},
    "layers.*.tensors.*": {"dtype", "shape_per_rank", "layout", "epilogue_tile_m",
                           "block_k_bytes", "row_order", "gated_interleave", "packing", "block",
                           "min", "pad", "rank0_only", "formula"},
    "files.*": {"sha256", "size"},
}  # fmt: skip


def test_every_key_earlier_releases_wrote_is_known():
    for place, keys in HISTORICAL.items():
        assert keys <= KNOWN_KEYS[place], (place, keys - KNOWN_KEYS[place])
    assert KNOWN_KEYS["targets.*"] == KNOWN_KEYS["target"]


def test_an_output_from_before_the_server_field_still_verifies(outputs, tmp_path):
    dst, m = _copy(outputs("nvfp4"), tmp_path)
    del m["server"]  # outputs before 2026-11-28: a vLLM output
    _write(dst, m)
    assert verify(dst).ok


def test_every_key_a_conversion_writes_is_known(outputs):
    for case in CASES:
        m = json.loads((outputs(case) / MANIFEST).read_text())
        assert unknown_keys(m) == [], case


def test_the_table_walks_names_as_names():
    m = {
        "layers": {"a.b": {"tensors": {"w": {"pad": {"hidden": 1, "x": 2}}}, "y": 1}},
        "files": {"f": {"sha256": "", "z": 0}},
        "targets": {"vllm": {"vllm": "0", "q": 1}},
        "source": {"family": "x", "w": 0},
    }
    assert unknown_keys(m) == [
        "layers.a.b.tensors.w.pad.x",
        "layers.a.b.y",
        "files.f.z",
        "targets.vllm.q",
        "source.w",
    ]


def test_the_keys_a_family_records_per_layer_are_known():
    from fi_convert.families import all_families

    for family in all_families():
        assert set(family.manifest_keys) <= KNOWN_KEYS["layers.*"], family.name
