"""The `onnx-reference` backend: the all-taps graph under `onnx.reference.ReferenceEvaluator`.

The ONNX specification's own Python implementation (NumPy kernels), no onnxruntime: when the
`onnxruntime` backend disagrees and this one agrees, the bug is in the runtime; when both
disagree the same way, it is in the exported graph. float32 only (its Erf is float32 as well).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from parity_harness._backends.base import Backend, BackendOutput, Precision
from parity_harness._backends.onnx.graph import expected_outputs, onnx_model, reference_runner, run_cases
from parity_harness._core.errors import BackendFailed
from parity_harness._fixture.fixture import too_big

if TYPE_CHECKING:
    from parity_harness._fixture.fixture import Fixture


ONNX_REFERENCE_LIMIT = 10_000_000  # parameters; GPT-2 small has 124,439,808


class OnnxReferenceBackend(Backend):
    name: ClassVar[str] = "onnx-reference"
    description: ClassVar[str] = "model.onnx under onnx.reference.ReferenceEvaluator (pure Python)"
    precisions: ClassVar[tuple[Precision, ...]] = ("fp32",)
    requires: ClassVar[tuple[str, ...]] = ("onnx",)
    install_hint: ClassVar[str] = "pip install 'parity-harness[onnx]'"
    runs_graph: ClassVar[bool] = True  # the fixture's ONNX graph, its weights embedded
    families: ClassVar[tuple[str, ...]] = ("gpt2", "llama")  # the graph is the family's reference, exported
    concurrent: ClassVar[bool] = True  # touches no process-wide state: may run beside another backend

    def declines(self, fixture: Fixture) -> str | None:
        return too_big(fixture, ONNX_REFERENCE_LIMIT, "onnx.reference evaluates the graph in pure Python "
                       "(NumPy kernels, one node at a time): minutes per case at this size")

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        if precision not in self.precisions:
            raise BackendFailed(f"{self.name}: computes in float32 only, not {precision}")
        path, model = onnx_model(fixture, "all_taps")  # parsed once; its weights and contract checked
        return run_cases(
            fixture, path, expected_outputs(fixture.tap_names, "all_taps"), reference_runner(model)
        )
