"""The `onnxruntime-webgpu` backend: the all-taps graph (model.onnx) on onnxruntime-web's WebGPU provider.

In the same headless Chrome as the other browser backends (docs/browser.md, "WebGPU"). On a machine
without a GPU, Chromium's adapter is SwiftShader (Vulkan on the CPU; `--enable-unsafe-webgpu`,
chrome.mts); with a GPU and PARITY_CHROME, whatever adapter that browser offers. Every tap, as
`onnxruntime` declares them; float32 only (WebGPU has no float64, and the graph is float32).

One change to the graph, made here before it is served: model.onnx computes the sinusoid position
table in float64 (Range, Sin, Cos, ScatterND, then a Cast to float32 at `hook_pos_embed`). WGSL has
no f64, and onnxruntime-web 1.30's WebGPU build has no CPU kernel for Cast(13) to double either
("Could not find an implementation for Cast(13) node with name 'node_Cast_9'"), so model.onnx does
not load there at all. `float32_graph` turns every float64 tensor of the graph into float32 (the
Casts to double, the double initializers, the recorded types); nothing else changes. This is what
the openvino backend does to the same nodes on its own; the fp32 tier measures the difference
(docs/browser.md). The nodes that have no WebGPU kernel run on onnxruntime's CPU provider; the
page reports them and the first run in a process names them once on stderr.

It runs only when named (`by_default = False`): on SwiftShader, a GPU emulated on the CPU, the toy's 12
cases take 12-25 s (shaders compiled per sequence length) where the WebAssembly backend takes 1 s, and the
default `parity run` is a gate of seconds. `parity run --backends onnxruntime-webgpu` runs it.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from parity_harness._backends.base import Backend, BackendOutput, Precision
from parity_harness._backends.browser import driver as browser
from parity_harness._backends.onnx.clean import graph_bytes
from parity_harness._backends.onnx.graph import expected_outputs, load_onnx, onnx_file
from parity_harness._backends.onnx.load import file_key
from parity_harness._core.errors import BackendFailed

if TYPE_CHECKING:
    from parity_harness._fixture.fixture import Fixture


def float32_graph(model: Any) -> list[str]:
    """Rewrite `model` (an onnx ModelProto) in place so that no tensor is float64; the names of the
    nodes that read or wrote a float64 tensor (in the graph as it was).

    Casts to DOUBLE become casts to FLOAT, DOUBLE initializers and Constant values become FLOAT (their
    values rounded once), and DOUBLE entries of value_info/outputs become FLOAT. A float64 graph input
    is refused (the graph takes int64 tokens only).
    """
    from onnx import TensorProto, numpy_helper, shape_inference

    double, single = TensorProto.DOUBLE, TensorProto.FLOAT
    graph = model.graph
    inferred = shape_inference.infer_shapes(model).graph
    kinds = {v.name: v.type.tensor_type.elem_type for v in [*inferred.value_info, *inferred.output, *inferred.input]}
    kinds.update({t.name: t.data_type for t in graph.initializer})
    touched = [n.name for n in graph.node if any(kinds.get(x) == double for x in [*n.input, *n.output])]
    if any(i.type.tensor_type.elem_type == double for i in graph.input):
        raise BackendFailed("onnxruntime-webgpu: the graph has a float64 input; WebGPU cannot take it")
    for i, init in enumerate(graph.initializer):
        if init.data_type == double:
            value = numpy_helper.to_array(init).astype(np.float32)  # shape kept: the same tensor in float32
            graph.initializer[i].CopyFrom(numpy_helper.from_array(value, init.name))
    for node in graph.node:
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i == double:
                attr.i = single
            elif node.op_type == "Constant" and attr.name == "value" and attr.t.data_type == double:
                value = numpy_helper.to_array(attr.t).astype(np.float32)
                attr.t.CopyFrom(numpy_helper.from_array(value, attr.t.name))
    for info in [*graph.value_info, *graph.output]:
        if info.type.tensor_type.elem_type == double:
            info.type.tensor_type.elem_type = single
    return touched


class OnnxRuntimeWebGpuBackend(Backend):
    name: ClassVar[str] = "onnxruntime-webgpu"
    description: ClassVar[str] = "model.onnx (every tap; its float64 positions in float32) on onnxruntime-web WebGPU"
    precisions: ClassVar[tuple[Precision, ...]] = ("fp32",)
    requires: ClassVar[tuple[str, ...]] = ("onnx",)  # to check the graph's weights and rewrite its float64 part
    install_hint: ClassVar[str] = f"{browser.INSTALL_HINT}; pip install 'parity-harness[onnx]'"
    concurrent: ClassVar[bool] = True  # one browser session for the run, behind its lock; no process-wide state
    out_of_process: ClassVar[bool] = True  # the browser computes: a side lane on a small fixture (_run/lanes.py)
    runs_graph: ClassVar[bool] = True  # the fixture's ONNX graph, its weights embedded
    by_default: ClassVar[bool] = False  # SwiftShader takes 12-25 s on the toy: run when named

    def declines(self, fixture: Fixture) -> str | None:
        return browser.declines_big(fixture)

    def missing_dependencies(self) -> list[str]:
        return [*super().missing_dependencies(), *browser.missing(("onnxruntime-web",))]

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        if precision not in self.precisions:
            raise BackendFailed(f"{self.name}: computes in float32 only, not {precision}")
        path = onnx_file(fixture, "all_taps")  # FixtureError (exit 2) when missing; weights checked
        names = expected_outputs(fixture.tap_names, "all_taps")
        model = load_onnx(path, file_key(fixture, path))  # onnx_file has run onnx.checker on it
        on_cpu = float32_graph(model)  # the position table: on the CPU provider, as the openvino backend computes it
        with tempfile.TemporaryDirectory(prefix="parity-webgpu-") as tmp:
            graph_file = Path(tmp) / "model.float32.onnx"
            graph_file.write_bytes(graph_bytes(model))  # the one serializer of a graph parity writes (clean.py)
            argv = ["all_taps", "all", "webgpu", str(graph_file), ",".join(on_cpu)]
            tensors, metadata = browser.run_to_file(self.name, "onnxruntime-web", fixture.root, argv)
        adapter = json.loads(metadata.get("webgpu_adapter", "{}"))
        cpu_nodes = json.loads(metadata.get("cpu_nodes", "[]"))
        ops = sorted({n.split(" ", 1)[0] for n in cpu_nodes})
        browser.say_once(
            f"{self.name}: WebGPU adapter {adapter.get('vendor') or '?'}/{adapter.get('architecture') or '?'}"
            f" (fallback adapter: {adapter.get('isFallbackAdapter')}); on the CPU provider: the {len(on_cpu)} nodes"
            f" of the float64 position table, and {len(cpu_nodes)} without a WebGPU kernel"
            f" ({', '.join(ops) or 'none'})")
        return browser.graph_outputs(self.name, fixture, path.name, names, tensors)
