"""The `onnxruntime-web-optimized` backend: the logits-only graph (model.logits.onnx) on onnxruntime-web.

The graph a web page would ship, at onnxruntime-web's full optimization level ('all', free to
fuse), on its WebAssembly backend in headless Chrome. As `onnxruntime-optimized` declares: `logits`,
and `probs` (a float32 softmax of the logits, in NumPy); every other tap is "not supported".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from parity_harness._backends.base import Backend, BackendOutput, Precision
from parity_harness._backends.browser import driver as browser
from parity_harness._backends.onnx.graph import softmax_f32
from parity_harness._core.errors import BackendFailed

if TYPE_CHECKING:
    from parity_harness._fixture.fixture import Fixture


class OnnxRuntimeWebOptimizedBackend(Backend):
    name: ClassVar[str] = "onnxruntime-web-optimized"
    description: ClassVar[str] = "model.logits.onnx on onnxruntime-web (WebAssembly) at level 'all' (logits, probs)"
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

    def supported_taps(self, fixture: Fixture) -> list[str]:
        return ["logits", "probs"]

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        if precision not in self.precisions:
            raise BackendFailed(f"{self.name}: computes in float32 only, not {precision}")
        out = browser.run_onnx_graph(self.name, fixture, "logits", "all")
        for taps in out.values():
            taps["probs"] = softmax_f32(taps["logits"])
        return out
