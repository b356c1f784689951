"""The `onnxruntime` backend: the fixture's all-taps graph (model.onnx) under onnxruntime's CPU provider.

Default session options (ORT's default graph optimization, ORT_ENABLE_ALL, which cannot fuse away
a node whose output is a graph output), one intra-op thread for a deterministic reduction order.
No fp64: onnxruntime has no float64 Erf kernel, so there is no float64 ONNX path.

fp16: the same graph converted to float16 (`fp16.py`: every op, weights and outputs in float16, the
input int64), its float16 taps widened to float32 (exact). onnxruntime's CPU provider has no float16
kernel for the graph's arithmetic on x86 and runs those ops in float32 between Casts it inserts
(docs/backends.md, "onnxruntime in fp16"); what is checked is the fp16 graph as ORT CPU runs it.
No bf16: ORT CPU has no bfloat16 kernel for Add, MatMul, ... and does not fall back (the session fails).
Decoding is fp32 only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from parity_harness._backends.base import Backend, BackendOutput, Precision
from parity_harness._backends.onnx.graph import check_onnx_file, expected_outputs, onnx_file, ort_runner, run_cases
from parity_harness._core.errors import BackendFailed

if TYPE_CHECKING:
    from parity_harness._fixture.decoding import DecodeOutput, DecodeRequest
    from parity_harness._fixture.fixture import Fixture


class OnnxRuntimeBackend(Backend):
    name: ClassVar[str] = "onnxruntime"
    description: ClassVar[str] = "model.onnx (every tap a graph output) on onnxruntime CPU, one thread; fp16: converted"
    precisions: ClassVar[tuple[Precision, ...]] = ("fp32", "fp16")
    requires: ClassVar[tuple[str, ...]] = ("onnxruntime", "onnx")
    install_hint: ClassVar[str] = "pip install 'parity-harness[onnx]'"
    runs_graph: ClassVar[bool] = True  # the fixture's ONNX graph, its weights embedded
    families: ClassVar[tuple[str, ...]] = ("gpt2", "llama")  # the graph is the family's reference, exported
    concurrent: ClassVar[bool] = True  # touches no process-wide state: may run beside another backend

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        if precision not in self.precisions:
            raise BackendFailed(f"{self.name}: computes in float32 and fp16 only, not {precision}")
        path = onnx_file(fixture, "all_taps")  # the fp32 source, its weights checked against the fixture's
        check_onnx_file(path, fixture, "all_taps")
        names = expected_outputs(fixture.tap_names, "all_taps")
        if precision == "fp32":
            return run_cases(fixture, path, names, ort_runner(path))
        from parity_harness._backends.onnx.fp16 import fp16_graph, fp16_outputs

        return run_cases(fixture, path, names, fp16_outputs(ort_runner(path, model=fp16_graph(path, names))))

    def locate_op(self, fixture: Fixture, precision: Precision, case: str, tap: str) -> str | None:
        """fp32: the node between the taps before `tap` and `tap` whose onnxruntime kernel is off its float64
        recomputation (localize.py); the graph is the fixture's own, so a node that departs from the model cannot
        be one of its nodes. None in fp16 (its converted graph) or when every kernel agrees."""
        if precision != "fp32":
            return None
        from parity_harness._backends.onnx.load import load_onnx
        from parity_harness._backends.onnx.localize import locate_in_own_graph

        model = load_onnx(onnx_file(fixture, "all_taps"))
        return locate_in_own_graph(model, fixture.case(case).tokens, expected_outputs(fixture.tap_names, "all_taps"),
                                   tap)

    def supports_decoding(self, fixture: Fixture) -> bool:
        """With the fixture's decoder-with-past graph (model.decode.onnx), of either family; prefill by model.onnx."""
        from parity_harness._backends.onnx.decode import decode_graph

        return decode_graph(fixture) is not None

    def decode(
        self, fixture: Fixture, precision: Precision, requests: list[DecodeRequest] | None = None
    ) -> DecodeOutput:
        from parity_harness._backends.onnx.decode import ort_decode
        from parity_harness._fixture.decoding import requests_for

        if precision != "fp32":
            raise BackendFailed(f"{self.name}: decodes in float32 only, not {precision}")
        return ort_decode(fixture, requests_for(fixture, requests))
