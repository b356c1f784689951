"""The `onnxruntime-optimized` backend: the logits-only graph (model.logits.onnx) at ORT_ENABLE_ALL.

This is the graph users ship: with no intermediate graph outputs, onnxruntime is free to fuse
(LayerNormalization, BiasGelu, FusedMatMul, ...; see docs/onnx.md). It is compared on `logits`,
and on `probs`, a float32 softmax of the logits computed here in NumPy; every other tap is
"not supported". float32 only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from parity_harness._backends.base import Backend, BackendOutput, Precision
from parity_harness._backends.onnx.graph import check_onnx_file, onnx_file, ort_runner, run_cases, softmax_f32
from parity_harness._core.errors import BackendFailed

if TYPE_CHECKING:
    from parity_harness._fixture.fixture import Fixture


class OnnxRuntimeOptimizedBackend(Backend):
    name: ClassVar[str] = "onnxruntime-optimized"
    description: ClassVar[str] = "model.logits.onnx on onnxruntime CPU at ORT_ENABLE_ALL (logits, probs)"
    precisions: ClassVar[tuple[Precision, ...]] = ("fp32",)
    requires: ClassVar[tuple[str, ...]] = ("onnxruntime", "onnx")
    install_hint: ClassVar[str] = "pip install 'parity-harness[onnx]'"
    runs_graph: ClassVar[bool] = True  # the fixture's ONNX graph, its weights embedded
    families: ClassVar[tuple[str, ...]] = ("gpt2", "llama")  # the graph is the family's reference, exported
    concurrent: ClassVar[bool] = True  # touches no process-wide state: may run beside another backend

    def supported_taps(self, fixture: Fixture) -> list[str]:
        return ["logits", "probs"]

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        if precision not in self.precisions:
            raise BackendFailed(f"{self.name}: computes in float32 only, not {precision}")
        path = onnx_file(fixture, "logits")
        check_onnx_file(path, fixture, "logits")
        out = run_cases(fixture, path, ["logits"], ort_runner(path, optimization="all"))
        for taps in out.values():
            taps["probs"] = softmax_f32(taps["logits"])
        return out
