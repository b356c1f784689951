"""The `onnxruntime-web` backend: the all-taps graph (model.onnx) on onnxruntime-web in headless Chrome.

onnxruntime-web's WebAssembly backend, one thread, at its default graph optimization level
('all', which cannot fuse away a node whose output is a graph output), in the same browser as
`typescript-browser` (parity_harness/_backends/browser/driver.py, docs/browser.md). Every tap, as `onnxruntime` declares
them; float32 only. onnxruntime-web's WebGPU provider is the `onnxruntime-webgpu` backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from parity_harness._backends.base import Backend, BackendOutput, Precision
from parity_harness._backends.browser import driver as browser
from parity_harness._core.errors import BackendFailed

if TYPE_CHECKING:
    from parity_harness._fixture.fixture import Fixture

class OnnxRuntimeWebBackend(Backend):
    name: ClassVar[str] = "onnxruntime-web"
    description: ClassVar[str] = "model.onnx (every tap) on onnxruntime-web's WebAssembly backend in headless Chrome"
    precisions: ClassVar[tuple[Precision, ...]] = ("fp32",)
    requires: ClassVar[tuple[str, ...]] = ("onnx",)  # to check the graph's weights (_backends/onnx/weights.py)
    install_hint: ClassVar[str] = f"{browser.INSTALL_HINT}; pip install 'parity-harness[onnx]'"
    concurrent: ClassVar[bool] = True  # one browser session for the run, behind its lock; no process-wide state
    out_of_process: ClassVar[bool] = True  # the browser computes: a side lane on a small fixture (_run/lanes.py)
    runs_graph: ClassVar[bool] = True  # the fixture's ONNX graph, its weights embedded

    def declines(self, fixture: Fixture) -> str | None:
        return browser.declines_big(fixture)

    def missing_dependencies(self) -> list[str]:
        return [*super().missing_dependencies(), *browser.missing(("onnxruntime-web",))]

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        if precision not in self.precisions:
            raise BackendFailed(f"{self.name}: computes in float32 only, not {precision}")
        return browser.run_onnx_graph(self.name, fixture, "all_taps", "all")
