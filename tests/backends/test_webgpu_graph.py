"""The `onnxruntime-webgpu` backend's float32 rewrite of model.onnx, checked without a browser.

model.onnx computes the sinusoid position table in float64; onnxruntime-web's WebGPU build cannot
load a float64 Cast (docs/browser.md, "WebGPU"), so the backend rewrites that part to float32 and
runs it on the CPU provider. These tests pin what the rewrite touches and that, on onnxruntime's
CPU provider (Python), the rewritten graph still agrees with the float32 golden at the existing
tolerance: a rewrite that changed more than the precision of the table would fail here.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from parity_harness._backends.browser.onnxruntime_webgpu_backend import float32_graph

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

TABLE_OPS = {"Cast", "Range", "Unsqueeze", "Mul", "Expand", "Sin", "Cos", "Shape", "Transpose", "ScatterND"}


def test_the_rewrite_leaves_no_float64_and_touches_only_the_position_table(toy_dir: Path) -> None:
    model = onnx.load(str(toy_dir / "model.onnx"))
    before = len(model.graph.node)
    touched = float32_graph(model)
    assert len(model.graph.node) == before  # no node added or removed
    by_name = {n.name: n for n in model.graph.node}
    assert {by_name[n].op_type for n in touched} == TABLE_OPS
    assert "node_sin" in touched and "node_cos" in touched and "node__to_copy" in touched
    onnx.checker.check_model(model)
    inferred = onnx.shape_inference.infer_shapes(model).graph
    double = onnx.TensorProto.DOUBLE
    assert all(v.type.tensor_type.elem_type != double for v in [*inferred.value_info, *inferred.output])
    assert all(t.data_type != double for t in model.graph.initializer)
    assert all(a.i != double for n in model.graph.node if n.op_type == "Cast" for a in n.attribute if a.name == "to")
    assert float32_graph(model) == []  # nothing left to rewrite


def test_the_rewritten_graph_agrees_with_the_float32_golden_on_the_cpu(toy_dir: Path, tmp_path: Path) -> None:
    from parity_harness._fixture.fixture import load_fixture, read_safetensors

    model = onnx.load(str(toy_dir / "model.onnx"))
    float32_graph(model)
    path = tmp_path / "model.float32.onnx"
    onnx.save(model, str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    fixture = load_fixture(toy_dir)
    manifest = json.loads((toy_dir / "manifest.json").read_text())
    tol = manifest["tolerances"]["fp32"]
    golden = read_safetensors(toy_dir / manifest["files"]["golden"]["fp32"])
    names = [o.name for o in session.get_outputs()]
    for case in fixture.cases:
        outs = dict(zip(names, session.run(None, {"tokens": np.asarray(case.tokens, dtype=np.int64)}), strict=True))
        for tap in ("hook_pos_embed", "logits"):
            expected = golden[f"{case.name}/{tap}"]
            assert np.allclose(outs[tap], expected, atol=tol["atol"], rtol=tol["rtol"]), (case.name, tap)
