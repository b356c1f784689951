"""Model families as data: the GPT-2 table says exactly what the code derived from tap names before families.

The harness reads every tap's facts from `parity_reference/families/{family}.json`. The GPT-2 table is checked
against data written before it existed (the committed fixtures' manifests: every tap's name and shape) and
against the rules the harness used to derive from a tap's name, kept here as an independent statement of
them; the Llama table is checked against its reference in tests/families/llama/test_llama_reference.py, and its
own facts here.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from typing import Any

import pytest

from parity_harness._fixture.fixture import load_fixture
from parity_reference.config import GPTConfig
from parity_reference.families import CODE_ROLES, FamilyError, family_names, load_family, parse_family
from parity_reference.llama_config import LlamaConfig
from tests.helpers import REPO

# n_layer 1..4, different widths, both position kinds; every size >= 2 (the old name rule read a size-1 axis as
# "scale", so a config with d_head = 1 or d_model = 1 is one the name-based rule mislabels and the table does not).
GPT2_CONFIGS = [
    GPTConfig(),
    GPTConfig(n_layer=1, d_model=12, n_head=3, d_mlp=20, vocab_size=50),
    GPTConfig(n_layer=3, d_model=16, n_head=4, d_mlp=64, vocab_size=7, positions="learned"),
    GPTConfig(n_layer=4, d_model=24, n_head=6, d_mlp=40, vocab_size=30, n_ctx=8),
    GPTConfig(n_layer=2, d_model=6, n_head=2, d_mlp=6, vocab_size=6),  # d_mlp = vocab = d_model: only names tell
]
# The sub-layers `run_layer` returned before families (parity attribute), relative to "blocks.{i}.".
LAYER_TAPS = {
    "attn": ("ln1.hook_scale", "ln1.hook_normalized", "attn.hook_q", "attn.hook_k", "attn.hook_v",
             "attn.hook_attn_scores", "attn.hook_pattern", "attn.hook_z", "hook_attn_out", "hook_resid_mid"),
    "mlp": ("ln2.hook_scale", "ln2.hook_normalized", "mlp.hook_pre", "mlp.hook_post", "hook_mlp_out",
            "hook_resid_post"),
    "unembed": ("ln_final.hook_scale", "ln_final.hook_normalized", "logits"),
}


def axes_by_name_rule(tap: str, template: list[int | str], n_head: int, d_mlp: int, vocab: int) -> list[str]:
    """The axis names the judge derived from a tap's name and shape before families."""
    names: list[str] = []
    for i, size in enumerate(template):
        if size == "T":
            names.append("key_position" if "position" in names else "position")
        elif size == n_head and i < len(template) - 1:
            names.append("head")
        elif size == 1:
            names.append("scale")
        else:
            names.append("dim")
    if template[-1] == vocab and (tap in ("logits", "probs") or tap.startswith("logit_lens.")):
        names[-1] = "token"
    elif tap.endswith(("mlp.hook_pre", "mlp.hook_post")) and template[-1] == d_mlp:
        names[-1] = "neuron"
    return names


def range_by_name_rule(tap: str, d_model: int) -> tuple[float, float] | None:
    """The bounds the tolerances derived from a tap's name before families."""
    if tap.endswith("attn.hook_pattern") or tap == "probs" or tap.startswith("logit_lens."):
        return (0.0, 1.0)
    if tap.endswith("hook_normalized"):
        return (-math.sqrt(d_model - 1), math.sqrt(d_model - 1))
    return None


@pytest.fixture(scope="module")
def gpt2() -> Any:
    return load_family("gpt2")


@pytest.mark.parametrize("fixture", ["fixtures/toy", "fixtures/toy-stress", "tests/data/toy-avx512"])
def test_the_gpt2_table_reproduces_the_committed_manifests_taps(gpt2: Any, fixture: str) -> None:
    """Written before families: every tap's name, order and shape in the manifest equal the table's."""
    manifest = json.loads((REPO / fixture / "manifest.json").read_text())
    config = GPTConfig.from_dict(manifest["config"])
    assert gpt2.tap_names(config) == [t["name"] for t in manifest["taps"]]
    for t in manifest["taps"]:
        assert gpt2.shape_template(config, t["name"]) == t["shape"], t["name"]
    assert load_fixture(REPO / fixture).family == "gpt2"  # no "family" key: read as gpt2


@pytest.mark.parametrize("config", GPT2_CONFIGS, ids=lambda c: f"L{c.n_layer}-d{c.d_model}")
def test_the_gpt2_table_names_the_axes_as_the_judge_did(gpt2: Any, config: GPTConfig) -> None:
    for tap in gpt2.tap_names(config):
        template = gpt2.shape_template(config, tap)
        expected = axes_by_name_rule(tap, template, config.n_head, config.d_mlp, config.vocab_size)
        assert gpt2.axis_names(config, tap) == expected, tap


@pytest.mark.parametrize("config", GPT2_CONFIGS, ids=lambda c: f"L{c.n_layer}-d{c.d_model}")
def test_the_gpt2_table_knows_rows_bounds_and_layers(gpt2: Any, config: GPTConfig) -> None:
    for tap in gpt2.tap_names(config):
        assert gpt2.rows_axis(tap) == gpt2.shape_template(config, tap).index("T"), tap
        assert gpt2.value_range(config, tap) == range_by_name_rule(tap, config.d_model), tap
        expected = int(tap.split(".")[1]) if tap.startswith("blocks.") else None
        assert gpt2.layer_of(tap) == expected, tap
    for part, names in LAYER_TAPS.items():
        assert gpt2.sublayer_taps(part) == names, part


def test_the_llama_table_has_the_rotary_and_gated_taps_in_dataflow_order() -> None:
    llama = load_family("llama")
    config = LlamaConfig(n_layer=3, d_model=32, n_head=8, n_kv_heads=2, d_mlp=48, vocab_size=20)
    names = llama.tap_names(config)
    assert "hook_pos_embed" not in names
    block = [n.removeprefix("blocks.1.") for n in names if n.startswith("blocks.1.")]
    assert block[block.index("attn.hook_v") + 1:block.index("attn.hook_attn_scores")] == [
        "attn.hook_rot_q", "attn.hook_rot_k"]
    assert block[block.index("mlp.hook_pre"):block.index("mlp.hook_post") + 1] == [
        "mlp.hook_pre", "mlp.hook_pre_linear", "mlp.hook_post"]
    assert names[-4:] == ["logit_lens.0", "logit_lens.1", "logit_lens.2", "logit_lens.3"]
    assert llama.shape_template(config, "blocks.2.attn.hook_rot_k") == ["T", 2, 4]
    assert llama.shape_template(config, "blocks.2.attn.hook_k") == ["T", 2, 4]
    assert llama.shape_template(config, "blocks.2.attn.hook_z") == ["T", 8, 4]
    assert llama.axis_names(config, "blocks.2.attn.hook_rot_k") == ["position", "head", "dim"]
    assert llama.rows_axis("blocks.0.attn.hook_pattern") == 1
    assert llama.layer_of("blocks.2.mlp.hook_pre_linear") == 2
    assert llama.layer_of("logit_lens.3") is None
    assert llama.value_range(config, "blocks.0.ln1.hook_normalized") == (-32 ** 0.5, 32 ** 0.5)
    assert llama.value_range(config, "probs") == (0.0, 1.0)
    assert "mlp.hook_pre_linear" in llama.sublayer_taps("mlp")


def test_the_shipped_families() -> None:
    assert family_names() == ["gpt2", "llama"]


@pytest.mark.parametrize("name", ["gpt3", "../families/gpt2", "GPT2", ""])
def test_an_unknown_family_is_one_line(name: str) -> None:
    with pytest.raises(FamilyError) as info:
        load_family(name)
    assert "\n" not in str(info.value) and "unknown model family" in str(info.value)


def test_an_unknown_tap_is_one_line(gpt2: Any) -> None:
    for tap in ("blocks.x.hook_resid_pre", "blocks.01.hook_resid_pre", "attn.hook_rot_q", "blocks.0.attn.hook_rot_q"):
        with pytest.raises(FamilyError, match="is not a tap of the gpt2 family"):
            gpt2.spec(tap)


def _table(**changes: Any) -> dict[str, Any]:
    tap = {"name": "blocks.{i}.hook_resid_pre", "shape": ["T", "d_model"], "axes": ["position", "dim"],
           "rows": "position", "bounds": None, "layer": "i", "sublayer": None}
    data: dict[str, Any] = {"family": "x", "description": "", "config": "", "indices": {"i": "n_layer"},
                            "bounds": {"probability": ""}, "taps": [tap],
                            "code": {role: f"x_family.{role}" for role in CODE_ROLES},
                            "decoding": {"cache_keys": "attn.hook_k", "cache_values": "attn.hook_v",
                                         "cache_heads": "n_head"}}
    for key, value in changes.items():
        if key in tap:
            tap[key] = value
        else:
            data[key] = value
    return data


@pytest.mark.parametrize(("changes", "message"), [
    ({"shape": ["T", "width"]}, "shape entries must be symbols"),
    ({"axes": ["position"]}, "axes must name each of the 2 axes"),
    ({"axes": ["position", "position"]}, "an axis name appears twice"),
    ({"rows": "head"}, "rows must be one of its axes or null"),
    ({"bounds": "layernorm"}, "bounds must be one of ['probability'] or null"),
    ({"layer": None}, "a per-block tap must have layer \"i\""),
    ({"name": "blocks.{j}.hook_resid_pre"}, "at most one placeholder"),
    ({"sublayer": "ffn"}, "sublayer must be one of attn, mlp, unembed or null"),
    ({"indices": {"i": "n_layer * 2"}}, "indices must map a letter to a count"),
    ({"family": "y"}, "the table says it is family 'y'"),
    ({"taps": []}, "taps must be a non-empty list"),
    ({"code": {"torch": "x.torch"}}, "code must map exactly the roles torch, numpy, params"),
    ({"code": {role: "not a module name" for role in CODE_ROLES}}, "to dotted module names"),
    ({"decoding": {"cache_keys": "attn.hook_k"}}, "decoding must map exactly cache_keys, cache_values, cache_heads"),
])
def test_a_malformed_table_is_one_line(changes: dict[str, Any], message: str) -> None:
    parse_family("x", _table())  # the unchanged table is fine
    with pytest.raises(FamilyError) as info:
        parse_family("x", _table(**changes))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_taps_over_one_index_are_listed_together() -> None:
    data = _table()
    first = data["taps"][0]
    data["taps"] = [first, {**first, "name": "logits", "layer": None}, {**first, "name": "blocks.{i}.hook_z"}]
    with pytest.raises(FamilyError, match=r"the taps over \{i\} must be listed together"):
        parse_family("x", data)


def test_the_loader_is_pure_python() -> None:
    code = ("import sys, parity_reference.families as f; f.load_family('llama'); "
            "assert not {'torch', 'numpy'} & set(sys.modules), sorted({'torch', 'numpy'} & set(sys.modules))")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_typescript_model_reads_the_same_table() -> None:
    """ts_model/model/family-gpt2.ts is the table, generated: one source for Python and TypeScript."""
    from parity_reference.families import typescript_module

    written = (REPO / "ts_model" / "model" / "family-gpt2.ts").read_text(encoding="utf-8")
    assert written == typescript_module("gpt2"), "regenerate: python -m parity_reference.families --typescript gpt2"
    model_ts = (REPO / "ts_model" / "model" / "model.ts").read_text(encoding="utf-8")
    assert '"hook_resid_pre",' not in model_ts  # no hand-written copy of the tap list left
