"""`parity run --onnx FILE`: any ONNX graph of the fixture's model with no plugin, its tensors matched to the taps
by value (parity_harness/_backends/onnx/match.py), and the first divergence down to the op (localize.py).

- the toy's own model.logits.onnx passes, 39 of its 43 taps found by value (all but probs and the lens);
- a graph exported by torch.onnx.export in its TorchScript mode (other names, other node layout) passes with
  the same 39 taps (full set: the export takes ~20 s);
- five planted bugs, found with no name map, each at its tap and node: a block-1 MLP weight +1e-3 (the MatMul
  with it), LayerNorm eps 1e-3 (the Add of the constant), the causal mask removed (no node departs, the
  reference's Where named), the tanh GELU (the Mul where the approximation starts), the attention scale
  1/sqrt(d_model) (the Div with its constant) (full set: ~5-8 s each);
- a name map works, and one naming a tensor the graph lacks is one line;
- every refusal of --onnx is the same line from the CLI, the API and the pytest plugin;
- the kernel check: a node whose output is off its float64 recomputation is named as the runtime's kernel.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from parity_harness import api
from parity_harness._core.errors import ParityError
from tests.helpers import REPO, plugin_args, run_cli

pytest.importorskip("onnx", reason="the onnx extra is not installed (PARITY_REQUIRE_ALL_BACKENDS=1 fails instead)")
pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")

import onnx
from onnx import helper, numpy_helper

TOY = REPO / "fixtures" / "toy"
LOGITS = TOY / "model.logits.onnx"
NOT_IN_A_LOGITS_GRAPH = {"probs", "logit_lens.0", "logit_lens.1", "logit_lens.2"}


def _add_constant(model: onnx.ModelProto, name: str, value: float) -> str:
    model.graph.initializer.append(numpy_helper.from_array(np.asarray(value, dtype=np.float32), name))
    return name


def _scalar_input(model: onnx.ModelProto, op: str, value: float) -> tuple[onnx.NodeProto, int]:
    from parity_harness._backends.onnx.localize import constants_of

    constants = constants_of(model)
    for node in model.graph.node:
        for k, name in enumerate(node.input):
            if node.op_type == op and name in constants and constants[name].size == 1 \
                    and math.isclose(float(constants[name].ravel()[0]), value, rel_tol=1e-5):
                return node, k
    raise AssertionError(f"no {op} of the constant {value} in the graph")


def plant_weight(model: onnx.ModelProto) -> None:
    for t in model.graph.initializer:
        if "1" in t.name and "c_fc" in t.name and "weight" in t.name:
            w = numpy_helper.to_array(t).copy()
            w[0, 0] += 1e-3
            t.CopyFrom(numpy_helper.from_array(w, t.name))
            return
    raise AssertionError("no block-1 MLP weight")


def plant_eps(model: onnx.ModelProto) -> None:
    node, k = _scalar_input(model, "Add", 1e-5)  # the first LayerNorm's eps, in a constant of its own
    node.input[k] = _add_constant(model, "planted_eps", 1e-3)


def plant_mask(model: onnx.ModelProto) -> None:
    where = next(n for n in model.graph.node if n.op_type == "Where")
    for node in model.graph.node:
        node.input[:] = [where.input[2] if name == where.output[0] else name for name in node.input]
    model.graph.node.remove(where)


def plant_gelu(model: onnx.ModelProto) -> None:
    """erf(x / sqrt 2) replaced by tanh(sqrt(2/pi) (x + 0.044715 x^3)): GPT-2's tanh GELU, its first node x * x."""
    nodes = list(model.graph.node)
    made_by = {out: n for n in nodes for out in n.output}
    place, erf = next((k, n) for k, n in enumerate(nodes) if n.op_type == "Erf")
    x = made_by[erf.input[0]].input[0]
    c = _add_constant(model, "planted_c", 0.044715)
    s = _add_constant(model, "planted_s", math.sqrt(2 / math.pi))
    new = [helper.make_node("Mul", [x, x], ["planted_x2"], name="planted_x2"),
           helper.make_node("Mul", ["planted_x2", x], ["planted_x3"], name="planted_x3"),
           helper.make_node("Mul", ["planted_x3", c], ["planted_cx3"], name="planted_cx3"),
           helper.make_node("Add", [x, "planted_cx3"], ["planted_inner"], name="planted_inner"),
           helper.make_node("Mul", ["planted_inner", s], ["planted_arg"], name="planted_arg"),
           helper.make_node("Tanh", ["planted_arg"], [erf.output[0]], name="planted_tanh")]
    model.graph.node.remove(erf)
    for k, node in enumerate(new):
        model.graph.node.insert(place + k, node)


def plant_scale(model: onnx.ModelProto) -> None:
    node, k = _scalar_input(model, "Div", 2.0)  # scores / sqrt(d_head), d_head 4
    node.input[k] = _add_constant(model, "planted_scale", math.sqrt(8.0))  # / sqrt(d_model)


# (bug, its planting, the tap, words the first divergence's op line holds)
PLANTED = [
    ("mlp-weight", plant_weight, "blocks.1.mlp.hook_pre", ["(MatMul;", "c_fc__weight [8, 32]",
                                                            "the graph departs from the model there"]),
    ("layernorm-eps", plant_eps, "blocks.0.ln1.hook_scale", ["node_add_63 (Add;", "planted_eps = [0.001]"]),
    ("mask-removed", plant_mask, "blocks.0.attn.hook_attn_scores", ["agrees with the reference graph",
                                                                     "(Where node_masked_fill)"]),
    ("tanh-gelu", plant_gelu, "blocks.0.mlp.hook_post", ["node planted_x2 (Mul;"]),
    ("attention-scale", plant_scale, "blocks.0.attn.hook_attn_scores", ["(Div;", "planted_scale = [2.828427]"]),
]


def broken_graph(tmp_path: Path, plant: object) -> Path:
    model = onnx.load(str(LOGITS))
    plant(model)  # type: ignore[operator]
    onnx.checker.check_model(model)
    path = tmp_path / "broken.onnx"
    onnx.save(model, str(path))
    return path


def test_the_toys_own_logits_graph_passes_with_every_tap_it_computes_found_by_value() -> None:
    report = api.run(None, TOY, "fp32", onnx=LOGITS)
    assert report.passed, api.render(report, "text")
    sources = report.sources["onnx-file"]
    assert {t for t, text in sources.items() if not text} == NOT_IN_A_LOGITS_GRAPH
    assert all(text.endswith("value)") or text.endswith("output)") for text in sources.values() if text)
    assert sources["logits"].startswith("logits ")  # the declared output stands for its tap
    assert report.taps_compared()["onnx-file"] == (39, 43)


def test_a_llama_fixtures_own_logits_graph_passes_and_its_cases_are_checked_in_its_family() -> None:
    """onnx-file on the Llama family: its tokens checked against the family's config (a GPT-2-only read of the
    config refused every Llama fixture)."""
    llama = REPO / "fixtures" / "toy-llama"
    report = api.run(None, llama, "fp32", onnx=llama / "model.logits.onnx")
    assert report.passed, api.render(report, "text")
    assert report.taps_compared()["onnx-file"] == (44, 48)


def test_a_name_map_names_the_tensors_and_a_missing_tensor_is_one_line(tmp_path: Path) -> None:
    mapping = {"blocks.0.ln1.hook_scale": "sqrt", "logits": "logits"}
    report = api.run(None, TOY, "fp32", onnx=LOGITS, onnx_map=mapping)
    assert report.passed
    assert report.taps_compared()["onnx-file"] == (2, 43)
    assert report.sources["onnx-file"]["blocks.0.ln1.hook_scale"].endswith("name)")
    bad = tmp_path / "map.json"
    bad.write_text(json.dumps({"logits": "no_such_tensor"}))
    with pytest.raises(ParityError, match="computes no float tensor named 'no_such_tensor'"):
        api.run(None, TOY, "fp32", onnx=LOGITS, onnx_map=bad)


@pytest.mark.full  # a graph and a localization per bug, 5-8 s each: CI runs the full set
@pytest.mark.parametrize(("bug", "plant", "tap", "words"), PLANTED, ids=[p[0] for p in PLANTED])
def test_a_planted_graph_bug_is_found_at_its_tap_and_node(tmp_path: Path, bug: str, plant: object, tap: str,
                                                           words: list[str]) -> None:
    report = api.run(None, TOY, "fp32", onnx=broken_graph(tmp_path, plant))
    assert not report.passed
    first = next(d for d in report.divergences if d.backend == "onnx-file")
    assert first.tap == tap, (bug, first.tap, first.message)
    assert first.op.startswith("in the graph, "), first.op
    for word in words:
        assert word in first.op, (bug, word, first.op)


@pytest.mark.full  # torch.onnx.export in TorchScript mode: ~20 s
def test_a_torchscript_export_is_mapped_by_value_and_passes(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="the torch extra is not installed")
    from parity_harness._fixture.fixture import load_fixture
    from parity_reference.model import GPT

    fixture = load_fixture(TOY)
    model = GPT(fixture.config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(torch.from_numpy(fixture.weights()[name]))
    path = tmp_path / "torchscript.onnx"
    tokens = torch.tensor(fixture.cases[1].tokens)
    torch.onnx.export(model.eval(), (tokens,), str(path), dynamo=False, input_names=["input_ids"],
                      output_names=["logits"], dynamic_axes={"input_ids": {0: "T"}, "logits": {0: "T"}},
                      opset_version=17)
    names = {node.output[0] for node in onnx.load(str(path)).graph.node}
    assert "/Split_output_0" in names and "blocks.0.attn.hook_q" not in names  # TorchScript's names, not parity's
    report = api.run(None, TOY, "fp32", onnx=path)
    assert report.passed, api.render(report, "text")
    found = [t for t, text in report.sources["onnx-file"].items() if text]
    assert len(found) >= 36 and set(found) >= {"blocks.0.attn.hook_z", "blocks.1.mlp.hook_post", "logits"}


@pytest.mark.full  # a checkpoint, --from-hf, and two torch.onnx.export(dynamo=True) of transformers' GPT-2: ~40 s
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_a_users_export_of_a_hugging_face_checkpoint_passes(tmp_path: Path, attention: str) -> None:
    """Issue 41: the same works for a user's ONNX export of a checkpoint imported with --from-hf. transformers masks
    with float32's min, not -inf (read as the mask: match.read_mask); its sdpa graph scales q and k by the square
    root of 1/sqrt(d_head) each; the exporter folds the zero biases. 34 taps: a fused LayerNormalization leaves no
    hook_scale."""
    torch = pytest.importorskip("torch", reason="the torch extra is not installed")
    transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2, n_inner=64)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "ckpt", safe_serialization=True)
    proc = run_cli("export", "--from-hf", str(tmp_path / "ckpt"), "--fixture", str(tmp_path / "fixture"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    model = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "ckpt", attn_implementation=attention).eval()

    class Logits(torch.nn.Module):  # type: ignore[name-defined,misc]  # torch from importorskip
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, input_ids: object) -> object:
            return self.inner(input_ids=input_ids, use_cache=False).logits

    path = tmp_path / f"{attention}.onnx"
    torch.onnx.export(Logits(), (torch.arange(8).reshape(1, 8),), str(path), input_names=["input_ids"],
                      output_names=["logits"], opset_version=18, dynamo=True, external_data=False,
                      dynamic_shapes={"input_ids": {1: torch.export.Dim("T", min=1, max=16)}})
    report = api.run(None, tmp_path / "fixture", "fp32", onnx=path)
    assert report.passed, api.render(report, "text")
    found = {t for t, text in report.sources["onnx-file"].items() if text}
    assert len(found) >= 34 and {"blocks.0.attn.hook_attn_scores", "blocks.1.mlp.hook_post", "logits"} <= found
    assert "non-constant weight tensors; its 4 constant ones (all 0)" in api.render(report, "text")


def test_a_mask_sentinel_is_read_as_the_mask_and_a_wrong_mask_still_fails() -> None:
    from parity_harness._backends.onnx.match import read_mask

    golden = np.array([[0.5, -np.inf], [0.25, 0.75]], dtype=np.float32)  # (query, key): the causal mask
    sentinel = np.array([[0.5, np.finfo(np.float32).min], [0.25, 0.75]], dtype=np.float32)
    assert np.array_equal(read_mask("blocks.0.attn.hook_attn_scores", sentinel), golden)
    assert np.array_equal(read_mask("blocks.0.attn.hook_attn_scores", np.where(golden < 0, -1e4, golden)), golden)
    assert read_mask("blocks.0.attn.hook_q", sentinel)[0, 1] == np.finfo(np.float32).min  # other taps as they are
    missing = np.array([[0.5, 0.1], [0.25, 0.75]], dtype=np.float32)  # no mask: finite where the golden is -inf
    assert np.isfinite(read_mask("blocks.0.attn.hook_attn_scores", missing)[0, 1])
    shifted = np.array([[0.5, 0.1], [np.finfo(np.float32).min, 0.75]], dtype=np.float32)
    assert np.isneginf(read_mask("blocks.0.attn.hook_attn_scores", shifted)[1, 0])  # -inf where the golden is finite


def test_a_node_off_its_float64_recomputation_is_named_as_the_runtimes_kernel() -> None:
    from parity_harness._backends.onnx.localize import locate, run_exposed

    model = onnx.load(str(LOGITS))
    tokens = np.asarray(TOY_TOKENS, dtype=np.int64)
    values = run_exposed(model, {"tokens": tokens})
    values["sqrt"] = values["sqrt"] * np.float32(1.001)  # as a Sqrt kernel 0.1% off would compute it
    where = locate(model, values, "div_1", {"add_47"}, {}, "")
    assert where is not None and where.kind == "kernel" and where.node == "node_sqrt", where
    assert "the runtime's kernel" in where.line()
    untouched = run_exposed(model, {"tokens": tokens})
    assert locate(model, untouched, "div_1", {"add_47"}, {}, "").kind == "missing"  # type: ignore[union-attr]


TOY_TOKENS = [0, 1, 4, 7, 1, 6, 0]

# (id, CLI args, API kwargs, words of the one line)
REFUSALS = [
    ("no-such-file", ["--onnx", "missing.onnx"], {"onnx": "missing.onnx"}, "no such ONNX file"),
    ("map-without-graph", ["--onnx-map", "map.json"], {"onnx_map": "map.json"}, "give it with onnx"),
    ("map-not-json", ["--onnx", str(LOGITS), "--onnx-map", "notjson.json"],
     {"onnx": str(LOGITS), "onnx_map": "notjson.json"}, "notjson.json"),
]


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "map.json").write_text(json.dumps({"logits": "logits"}))
    (tmp_path / "notjson.json").write_text("{not json")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(("case", "args", "kwargs", "needle"), REFUSALS, ids=[r[0] for r in REFUSALS])
def test_each_refusal_is_one_line_from_the_cli_and_the_api(in_tmp: Path, case: str, args: list[str],
                                                           kwargs: dict[str, str], needle: str) -> None:
    proc = run_cli("run", "-q", "--fixture", str(TOY), *args)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and needle in lines[0], (proc.returncode, proc.stderr)
    assert "PASS" not in proc.stdout
    with pytest.raises(ParityError, match=needle.replace(".", r"\.")):
        api.run(None, TOY, "fp32", **kwargs)  # type: ignore[arg-type]


PLUGIN_TEST = '''
import pytest


@pytest.mark.parametrize("kwargs", {kwargs!r})
def test_refused(parity, kwargs):
    parity.assert_agrees(None, precision="fp32", **kwargs)
'''


@pytest.mark.full  # a pytest subprocess (~10 s): CI runs the full set
def test_the_pytest_plugin_refuses_the_same(in_tmp: Path) -> None:
    (in_tmp / "test_gate.py").write_text(PLUGIN_TEST.format(kwargs=[r[2] for r in REFUSALS]))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *plugin_args(), "-q",
                           "--parity-fixture", str(TOY)], cwd=in_tmp, capture_output=True, text=True,
                          timeout=300, check=False, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])})
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    for _, _, _, needle in REFUSALS:
        assert needle in proc.stdout, (needle, proc.stdout[-3000:])
    assert "3 failed" in proc.stdout
