"""The `openvino` backend: the fixture's all-taps graph (model.onnx) on OpenVINO's CPU plugin, float32.

OpenVINO reads the ONNX file itself (its ONNX frontend) and compiles it for the CPU plugin with:

- INFERENCE_PRECISION_HINT = f32: without it the plugin runs matmuls in bfloat16 on CPUs that have
  AVX-512 BF16 or AMX (its default there is bf16), which fails the 1e-5 tier;
- EXECUTION_MODE_HINT = ACCURACY: no precision-lowering transformation of its own choosing;
- INFERENCE_NUM_THREADS = 1, NUM_STREAMS = 1: one thread, the same reduction order every run;
- DYNAMIC_QUANTIZATION_GROUP_SIZE = 0: no dynamic quantization of matmul activations;
- CPU_DENORMALS_OPTIMIZATION = False: subnormals are kept, not flushed to zero.

Token ids are checked here, before anything is compiled: the CPU plugin's Gather reads past the
embedding table for an id >= vocab_size (garbage numbers, no error; a large id crashes the process),
and wraps a negative id as ONNX allows. Its float64 sin/cos (the positions) are computed in float32,
which the fp32 tier cannot see (docs/backends.md, "openvino"). Decoding uses model.decode.onnx, the
prefill by model.onnx, as the onnxruntime backend does. openvino is imported inside the runners only.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from parity_harness._backends.base import Backend, BackendOutput, Precision, checked_tokens
from parity_harness._backends.onnx.graph import (
    INPUT_NAME,
    Runner,
    check_onnx_file,
    expected_outputs,
    onnx_file,
    run_cases,
)
from parity_harness._core.errors import BackendFailed

if TYPE_CHECKING:
    from parity_harness._fixture.decoding import DecodeOutput, DecodeRequest
    from parity_harness._fixture.fixture import Fixture

# The compile properties (module docstring): float32 everywhere, one thread, nothing approximated.
CPU_PROPERTIES: dict[str, str] = {
    "INFERENCE_PRECISION_HINT": "f32",
    "EXECUTION_MODE_HINT": "ACCURACY",
    "INFERENCE_NUM_THREADS": "1",
    "NUM_STREAMS": "1",
    "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0",
    "CPU_DENORMALS_OPTIMIZATION": "NO",
}


def check_tokens(what: str, tokens: Sequence[int], vocab_size: int, n_ctx: int) -> None:
    """base.check_tokens, saying what OpenVINO would do with an id out of range."""
    checked_tokens(what, tokens, vocab_size, n_ctx, "OpenVINO would read past the embedding table")


def import_openvino() -> Any:
    """`import openvino`, without its telemetry.

    Importing openvino imports its model converter (`openvino.tools.ovc`), which, when the package
    `openvino_telemetry` is installed (pip installs it with openvino) and the user never answered its opt-in,
    writes a client id under ~/intel/ and sends an "import" event to Google Analytics from a forked process.
    parity never sends anything anywhere, and a fork from a thread of its own can deadlock a process whose
    other threads are importing or computing (`parity run` runs backends side by side). While openvino is first
    imported, `openvino_telemetry` is made unimportable (a None entry in sys.modules, Python's documented way),
    so openvino takes its own no-op stub (`openvino.tools.ovc.telemetry_stub`); the entry is removed after.
    An openvino imported before is returned as it is.
    """
    import sys

    blocked = "openvino_telemetry" not in sys.modules
    if blocked:
        sys.modules["openvino_telemetry"] = None  # type: ignore[assignment]
    try:
        import openvino
    finally:
        if blocked and sys.modules.get("openvino_telemetry", 0) is None:
            del sys.modules["openvino_telemetry"]
    return openvino


def _compile(path: Path) -> Any:
    """The graph compiled for the CPU plugin with CPU_PROPERTIES; BackendFailed when OpenVINO refuses it."""
    ov = import_openvino()

    core = ov.Core()
    try:
        return core.compile_model(core.read_model(str(path)), "CPU", dict(CPU_PROPERTIES))
    except Exception as exc:  # OpenVINO raises RuntimeError and its own types for an unusable graph
        text = str(exc).strip().splitlines()
        raise BackendFailed(f"{path}: OpenVINO cannot compile the graph ({text[0] if text else type(exc).__name__})"
                            ) from None


def ov_runner(path: Path, names: Sequence[str]) -> Runner:
    """tokens (T,) int64 -> the graph's outputs `names`, in that order, from one compiled CPU model."""
    compiled = _compile(path)
    ports = [compiled.output(name) for name in names]  # a missing name raises here, before any case
    request = compiled.create_infer_request()

    def run(tokens: np.ndarray) -> list[np.ndarray]:
        result = request.infer({INPUT_NAME: tokens})
        return [np.array(result[port], copy=True) for port in ports]  # copies: the request reuses its buffers

    return run


class OpenVinoBackend(Backend):
    name: ClassVar[str] = "openvino"
    description: ClassVar[str] = "model.onnx (every tap a graph output) on OpenVINO's CPU plugin, f32, one thread"
    precisions: ClassVar[tuple[Precision, ...]] = ("fp32",)
    requires: ClassVar[tuple[str, ...]] = ("openvino", "onnx")
    install_hint: ClassVar[str] = "pip install 'parity-harness[openvino]'"
    runs_graph: ClassVar[bool] = True  # the fixture's ONNX graph, its weights embedded
    families: ClassVar[tuple[str, ...]] = ("gpt2", "llama")  # the graph is the family's reference, exported
    concurrent: ClassVar[bool] = True  # touches no process-wide state: may run beside another backend

    def import_requirements(self) -> None:
        """openvino without its telemetry (`import_openvino`), then onnx."""
        import_openvino()
        import onnx  # noqa: F401

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        if precision not in self.precisions:
            raise BackendFailed(f"{self.name}: computes in float32 only, not {precision}")
        config = fixture.model.config
        for case in fixture.cases:  # every case before anything runs: a bad id is never fed to OpenVINO
            check_tokens(f"case {case.name!r}", case.tokens, config.vocab_size, config.n_ctx)
        path = onnx_file(fixture, "all_taps")
        check_onnx_file(path, fixture, "all_taps")
        names = expected_outputs(fixture.tap_names, "all_taps")
        try:
            runner = ov_runner(path, names)
        except BackendFailed:
            raise
        except Exception as exc:  # a graph output OpenVINO does not know by that name
            raise BackendFailed(f"{path}: OpenVINO: {str(exc).strip().splitlines()[0]}") from None
        return run_cases(fixture, path, names, runner)

    def supports_decoding(self, fixture: Fixture) -> bool:
        """With the fixture's decoder-with-past graph (model.decode.onnx), of either family; prefill by model.onnx."""
        from parity_harness._backends.onnx.decode import decode_graph

        return decode_graph(fixture) is not None

    def decode(
        self, fixture: Fixture, precision: Precision, requests: list[DecodeRequest] | None = None
    ) -> DecodeOutput:
        from parity_harness._fixture.decoding import requests_for

        if precision not in self.precisions:
            raise BackendFailed(f"{self.name}: computes in float32 only, not {precision}")
        return _ov_decode(fixture, requests_for(fixture, requests))


def _ov_decode(fixture: Fixture, requests: list[DecodeRequest]) -> DecodeOutput:
    """Prefill by model.onnx (hook_k, hook_v, logits), then one model.decode.onnx step per token."""
    from parity_harness._backends.onnx.decode import checked_decode_graph, decode_steps, input_names, output_names

    config = fixture.model.config
    for req in requests:  # the prompt and every fed token, before anything runs
        check_tokens(f"prompt {req.name!r}", req.prompt, config.vocab_size, config.n_ctx)
        if req.feed is not None:
            check_tokens(f"prompt {req.name!r} (fed tokens)", req.feed, config.vocab_size, config.n_ctx)
    path = checked_decode_graph(fixture)  # its contract, and the step graph's own copy of the weights
    full = onnx_file(fixture, "all_taps")
    check_onnx_file(full, fixture, "all_taps")
    names = expected_outputs(fixture.tap_names, "all_taps")
    prefill = ov_runner(full, names)
    step = _compile(path)
    step_inputs, step_outputs = input_names(config.n_layer), [step.output(n) for n in output_names(config.n_layer)]
    request = step.create_infer_request()

    def run_step(token: np.ndarray, cache: list[tuple[np.ndarray, np.ndarray]]) -> list[np.ndarray]:
        feeds: dict[str, np.ndarray] = {step_inputs[0]: token}
        for i, (key, value) in enumerate(cache):
            feeds[step_inputs[1 + 2 * i]] = np.ascontiguousarray(key, dtype=np.float32)
            feeds[step_inputs[2 + 2 * i]] = np.ascontiguousarray(value, dtype=np.float32)
        result = request.infer(feeds)
        return [np.array(result[port], dtype=np.float32, copy=True) for port in step_outputs]

    # OpenVINO reads past its buffers instead of raising: a step past the context is refused first.
    return decode_steps(config, path, requests, names, prefill, run_step, refuse_past_context=True)
