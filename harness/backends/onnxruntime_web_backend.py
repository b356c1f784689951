"""The `onnxruntime-web` backend: the all-taps graph (model.onnx) on onnxruntime-web in headless Chrome.

onnxruntime-web's WebAssembly backend, one thread, at its default graph optimization level
('all', which cannot fuse away a node whose output is a graph output), in the same browser as
`typescript-browser` (harness/browser.py, docs/browser.md). Every tap, as `onnxruntime` declares
them; float32 only. WebGPU: where the headless browser has no adapter (here: none) it is "not
supported", said once per process; parity checks the WebAssembly backend.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from harness import browser
from harness.backends.base import Backend, BackendOutput, Precision
from harness.errors import BackendFailed
from harness.onnx_graph import OnnxGraph, expected_outputs, onnx_file

if TYPE_CHECKING:
    from harness.fixture import Fixture

_said: set[str] = set()


def say_once(message: str) -> None:
    """Print a note on stderr the first time it comes up in this process."""
    if message not in _said:
        _said.add(message)
        print(f"parity: {message}", file=sys.stderr, flush=True)


def run_graph(backend: Backend, fixture: Fixture, graph: OnnxGraph, optimization: str) -> BackendOutput:
    """Every case through one of the fixture's graphs on onnxruntime-web: {case: {output: float32}}."""
    path = onnx_file(fixture, graph)  # FixtureError (exit 2) when the manifest lists no such graph
    names = expected_outputs(fixture.tap_names, graph)
    tensors, metadata = browser.run_to_file(backend.name, "onnxruntime-web", fixture.root, [graph, optimization])
    webgpu = metadata.get("webgpu", "not reported")
    if webgpu != "adapter":
        say_once(f"onnxruntime-web: WebGPU not supported in this headless browser ({webgpu}); "
                 "parity checks the WebAssembly backend")
    out: BackendOutput = {}
    for case in fixture.cases:
        out[case.name] = {}
        for name in names:
            value = tensors.get(f"{case.name}/{name}")
            if value is None:
                raise BackendFailed(f"{backend.name}: {path.name} gave no output {name!r} for case {case.name!r}")
            out[case.name][name] = np.asarray(value, dtype=np.float32)
    return out


class OnnxRuntimeWebBackend(Backend):
    name: ClassVar[str] = "onnxruntime-web"
    description: ClassVar[str] = "model.onnx (every tap) on onnxruntime-web's WebAssembly backend in headless Chrome"
    precisions: ClassVar[tuple[Precision, ...]] = ("fp32",)
    install_hint: ClassVar[str] = browser.INSTALL_HINT

    def declines(self, fixture: Fixture) -> str | None:
        return browser.declines_big(fixture)

    def missing_dependencies(self) -> list[str]:
        return browser.missing(("onnxruntime-web",))

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        if precision not in self.precisions:
            raise BackendFailed(f"{self.name}: computes in float32 only, not {precision}")
        return run_graph(self, fixture, "all_taps", "all")
