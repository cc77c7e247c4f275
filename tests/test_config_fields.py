"""fi_convert/source.py and fi_convert/families.py (with families/*.json): every config.json field
fi-convert reads, given a value of the wrong kind (a string where a number is, a list where a
map is; in config.json or nested in its text_config), is one error line naming the field and the
file, never a traceback. The fields come from the family files (fi_convert/families/*.json), so
a field a new family file reads is covered by being added."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from fi_convert.families import FAMILY_DIR, SECTION_FIELDS, all_families
from fi_convert.testing.synthetic import FAMILIES, Spec, write_checkpoint

from .conftest import cli
from .test_errors import error_line

# a small checkpoint of each family file's family
SPECS = {
    "deepseek-v3": Spec(family="deepseek-v3", layers=2, experts=4, hidden=128, intermediate=128),
    "qwen3-moe": Spec(family="qwen3-moe", layers=2, experts=4, hidden=128, intermediate=128),
    "mixtral": Spec(family="mixtral", layers=2, experts=4, hidden=128, intermediate=128),
    "gpt-oss": Spec(
        family="gpt-oss", layers=2, experts=4, hidden=256, intermediate=128, quant="mxfp4"
    ),
}
# the families of the tensor forms (tests/family_forms_models.py): transformers writes them
# (Step-3: in the names vLLM's model reads)
SAVED = {
    "llama4": "llama4",
    "qwen3-vl-moe": "qwen3_vl_moe",
    "granite-moe": "granitemoe",
    "step3": "step3",
}
# values of every kind but the one each kind names
WRONG: dict[str, list] = {
    "integer": ["8", [8], {"value": 8}, True, 8.5],
    "number": ["7.0", [7.0], {"value": 7.0}, True, float("nan"), float("inf")],
    "string": [5, ["deepseek_v3"], {"value": "x"}, True],
    "list of strings": ["MixtralForCausalLM", [1], {"value": "x"}],
    "boolean": ["true", 1, [True], {"value": True}],
    "map": ["abc", [1, 2], 3, True],
}


def _family_fields() -> list[tuple[str, str, str]]:
    """(family, field, kind) for each field each family file of SPECS makes fi-convert read
    (the other families' fields are of the same kinds, read by the same code: one of each
    kind is in tests/test_families.py)."""
    out = []
    for path in sorted(FAMILY_DIR.glob("*.json")):
        d = json.loads(path.read_text())
        if d["name"] not in SPECS and d["name"] not in SAVED:
            continue
        fam = next(f for f in all_families() if f.name == d["name"])
        fields = {**SECTION_FIELDS, **fam.config_fields()}
        # the family file's own keys are what is read: none may be left out of config_fields
        read = {k for keys in d["config_keys"].values() for k in keys} | set(
            d.get("manifest_keys", ())
        )
        assert read <= fields.keys(), sorted(read - fields.keys())
        out += [(d["name"], field, kind) for field, kind in fields.items()]
    return out


FIELDS = _family_fields()
CASES = [
    pytest.param(fam, field, kind, bad, nested, id=f"{fam}-{'text_config.' * nested}{field}-{k}")
    for fam, field, kind in FIELDS
    for k, bad in enumerate(WRONG[kind])
    for nested in (False, True)
]


def _fields_of(fam: str) -> list[str]:
    return [field for f, field, _ in FIELDS if f == fam]


def test_every_family_has_a_checkpoint_to_mutate():
    assert {fam for fam, _, _ in FIELDS} == set(SPECS) | set(SAVED)
    assert set(SPECS) <= set(FAMILIES)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> dict[str, Path]:
    from . import family_forms_models as ffm

    base = tmp_path_factory.mktemp("config-fields")
    made = {name: write_checkpoint(base / name, spec) for name, spec in SPECS.items()}
    for name, kind in SAVED.items():
        made[name] = ffm.save_step3(base / name) if kind == "step3" else ffm.save(kind, base / name)
    return made


def _with_config(src: Path, dst: Path, edit) -> Path:
    """A copy of `src` (its files hard-linked) whose config.json is `edit`ed."""
    shutil.copytree(src, dst, copy_function=os.link)
    cfg = json.loads((src / "config.json").read_text())
    edit(cfg)
    (dst / "config.json").unlink()  # the link's other name is the pristine checkpoint's
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _put(field: str, value, nested: bool):
    def edit(cfg: dict) -> None:
        if nested:
            cfg.pop(field, None)
            cfg["text_config"] = {field: value}
        else:
            cfg[field] = value

    return edit


def _dry_run(model: Path):
    return cli("convert", model, model.parent / "out", "--dry-run")


@pytest.mark.parametrize(("fam", "field", "kind", "bad", "nested"), CASES)
def test_a_field_of_the_wrong_kind_is_one_line(pristine, tmp_path, fam, field, kind, bad, nested):
    model = _with_config(pristine[fam], tmp_path / "model", _put(field, bad, nested))
    name = f"text_config.{field}" if nested else field
    line = error_line(_dry_run(model), f"{model / 'config.json'}: {name} is ", f" {kind};")
    assert "fix that field" in line


@pytest.mark.parametrize("fam", sorted(SPECS))
def test_each_field_is_read_from_text_config_too(pristine, tmp_path, fam):
    """The control: each field moved into text_config with its own value still plans."""
    cfg = json.loads((pristine[fam] / "config.json").read_text())
    moved = [f for f in _fields_of(fam) if f in cfg]
    assert moved

    def edit(c: dict) -> None:
        c["text_config"] = {f: c.pop(f) for f in moved}

    res = _dry_run(_with_config(pristine[fam], tmp_path / "model", edit))
    assert res.exit_code == 0, res.output
    # and read there: an expert count the shards contradict is refused
    key = next(f for f in all_families() if f.name == fam).config_keys["num_experts"][0]

    def more(c: dict) -> None:
        edit(c)
        c["text_config"][key] += 1

    res = _dry_run(_with_config(pristine[fam], tmp_path / "more", more))
    error_line(res, "4 experts in the shards but config.json says 5")


@pytest.mark.parametrize("fam", sorted(SPECS))
def test_an_internvl_llm_config_is_read_as_text_config(pristine, tmp_path, fam):
    """InternVL's config.json (model_type internvl_chat) holds its language model's config in
    llm_config: the family is named there and its fields read there, and a field of the wrong
    kind there is one line naming llm_config.<field>."""

    def edit(c: dict) -> None:
        llm = {k: c.pop(k) for k in list(c) if k not in ("quantization_config",)}
        c.update(model_type="internvl_chat", architectures=["InternVLChatModel"], llm_config=llm)

    res = _dry_run(_with_config(pristine[fam], tmp_path / "model", edit))
    assert res.exit_code == 0, res.output
    key = next(f for f in all_families() if f.name == fam).config_keys["num_experts"][0]

    def wrong(c: dict) -> None:
        edit(c)
        c["llm_config"][key] = str(c["llm_config"][key])

    model = _with_config(pristine[fam], tmp_path / "wrong", wrong)
    error_line(_dry_run(model), f"{model / 'config.json'}: llm_config.{key} is ", "not an integer")


# DeepSeek-VL2's and DeepSeek-OCR's config.json (the servers' DeepseekVLV2Config): its
# DeepSeek-V2 language model's config in language_config
VL2 = dict(model_type="deepseek_vl_v2", architectures=["DeepseekVLV2ForCausalLM"])
OCR = dict(model_type="deepseek_vl_v2", architectures=["DeepseekOCRForCausalLM"])


def _language_config(top: dict):
    def edit(c: dict) -> None:
        language = {k: c.pop(k) for k in list(c) if k not in ("quantization_config",)}
        c.update(top, language_config=language | {"model_type": "deepseek_v2"})

    return edit


@pytest.mark.parametrize("top", [VL2, OCR], ids=["vl2", "ocr"])
def test_a_language_config_is_read_as_text_config(pristine, tmp_path, top):
    """DeepSeek-VL2's and DeepSeek-OCR's language model's config, in language_config, names
    the DeepSeek-V3 family (model_type deepseek_v2) and its fields are read there: a field of
    the wrong kind there is one line naming language_config.<field>. Neither server's class of
    them is proven here: an output for either server is refused in one line saying why."""
    edit = _language_config(top)
    key = next(f for f in all_families() if f.name == "deepseek-v3").config_keys["num_experts"][0]

    def wrong(c: dict) -> None:
        edit(c)
        c["language_config"][key] = str(c["language_config"][key])

    model = _with_config(pristine["deepseek-v3"], tmp_path / "wrong", wrong)
    error_line(_dry_run(model), f"{model / 'config.json'}: language_config.{key} is ", "an integer")
    model = _with_config(pristine["deepseek-v3"], tmp_path / "model", edit)
    arch = top["architectures"][0]
    for server in ("vllm", "sglang"):
        res = cli("convert", model, tmp_path / server, "--dry-run", "--server", server)
        line = error_line(res, f"({arch})" if server == "vllm" else "has not proven an output")
        assert "serve the checkpoint as it is" in line


@pytest.mark.parametrize("bad", WRONG["map"])
def test_text_config_that_is_no_map(pristine, tmp_path, bad):
    for fam in SPECS:
        edit = lambda c, bad=bad: c.update(text_config=bad)  # noqa: E731
        model = _with_config(pristine[fam], tmp_path / fam, edit)
        error_line(_dry_run(model), f"{model / 'config.json'}: text_config is ", "not a map")


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda c: c.update(quantization_config=["fp8"]), "quantization_config"),
        (lambda c: c.update(quantization_config="mxfp4"), "quantization_config"),
        (
            lambda c: c["quantization_config"].update(quant_method=4),
            "quantization_config.quant_method",
        ),
        (
            lambda c: c["quantization_config"].update(quant_algo=["MXFP4"]),
            "quantization_config.quant_algo",
        ),
    ],
)
def test_quantization_config_of_the_wrong_kind(pristine, tmp_path, edit, field):
    model = _with_config(pristine["gpt-oss"], tmp_path / "model", edit)
    error_line(_dry_run(model), "config.json", f" {field} is ")


@pytest.mark.parametrize(
    ("hq", "field"),
    [
        ({"quantization": "FP8"}, "quantization"),
        ({"quantization": {"quant_algo": 8}}, "quantization.quant_algo"),
        ({"quant_algo": ["FP8"]}, "quant_algo"),
    ],
)
def test_hf_quant_config_of_the_wrong_kind(pristine, tmp_path, hq, field):
    model = _with_config(pristine["mixtral"], tmp_path / "model", lambda c: None)
    (model / "hf_quant_config.json").write_text(json.dumps(hq))
    error_line(_dry_run(model), "hf_quant_config.json", f" {field} is ")


@pytest.mark.parametrize("fam", sorted(SPECS))
def test_absent_and_null_fields_are_not_read(pristine, tmp_path, fam):
    """null is JSON's absent: a family's fields set to null plan from the tensors alone."""
    fields = [f for f in _fields_of(fam) if f not in SECTION_FIELDS]

    def edit(c: dict) -> None:
        c.update(dict.fromkeys(fields), text_config=None)

    # (on CUTLASS: an absent norm_topk_prob is the config class's default, False, for Qwen3-MoE:
    # softmax routing without renormalizing, which vLLM runs BF16 on CUTLASS only)
    model = _with_config(pristine[fam], tmp_path / "model", edit)
    res = cli("convert", model, model.parent / "out", "--dry-run", "--backend", "cutlass")
    assert res.exit_code == 0, res.output
