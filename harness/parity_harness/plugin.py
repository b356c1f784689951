"""The stable surface for backend plugins: every name a plugin may import from parity, in one place.

A plugin (docs/adding-a-backend.md) imports from here, and only from here:

    from parity_harness.plugin import Backend, BackendOutput, Fixture, FixtureError, Precision, tap_shape

These names keep their meaning across parity's minor versions; every other module of `harness` is
internal and may move (its layout is described in docs/architecture.md, not promised). Importing this
module is cheap: numpy and parity's core only, no torch, no onnxruntime (the ONNX helpers import them
when called).

The groups:

- the contract: `Backend` (subclass it), `BackendOutput`, `Precision`, `PRECISIONS`, `DTYPES`,
  `module_available` (for `missing_dependencies`);
- the fixture a backend is handed: `Fixture` (its `config`, `cases`, `tap_names`, `weights()`,
  `lens_rows()`, `onnx_path()`), `Case`, `too_big` (a `declines` reason by parameter count),
  `read_safetensors` (a file's tensors as numpy arrays, FixtureError naming it when unreadable);
- decoding: `DecodeRequest`, `DecodeOutput`, `requests_for` (the requests, or the fixture's own),
  `steps_to_output` (per-step logits and caches to the output's `step{k}/{tap}` keys);
- the model's shapes and parameters: `GPTConfig`, `param_shapes` (Hugging Face names and shapes),
  `sinusoidal_positions` (the position table), `tap_names`, `tap_shape`, `tap_shape_template`;
- the ONNX graph runner, for a plugin that runs the fixture's graphs on another runtime (set
  `runs_graph = True`; docs/adding-a-backend.md walks through one): `onnx_file` (finds a graph of kind
  "all_taps" or "logits", FixtureError when the manifest lists none, and checks that it embeds the
  fixture's weights), `check_onnx_file` (the file parses, is self-contained, takes one int64 input
  `INPUT_NAME` and outputs exactly `expected_outputs`), `expected_outputs` (the graph's output names),
  `run_cases` (every case through a runner: a function from int64 tokens [T] to the graph's outputs,
  a runtime's failure made BackendFailed), `ort_runner` (an onnxruntime session as a runner),
  `softmax_f32`, `INPUT_NAME`;
- running beside other backends (`concurrent = True`): `silenced`, the one way to keep a library's warnings,
  log records and prints off the terminal while its code runs (counted, so two threads cannot undo each other);
- errors, each one line and exit 2: `ParityError`, `FixtureError` (bad input: raise it for an
  out-of-range token), `BackendFailed`, `BackendUnavailable`.
"""

from __future__ import annotations

from parity_harness._backends.base import PRECISIONS, Backend, BackendOutput, Precision, module_available
from parity_harness._backends.onnx.graph import (
    INPUT_NAME,
    check_onnx_file,
    expected_outputs,
    onnx_file,
    ort_runner,
    run_cases,
    softmax_f32,
)
from parity_harness._backends.quiet import silenced
from parity_harness._core.errors import BackendFailed, BackendUnavailable, FixtureError, ParityError
from parity_harness._core.precision import DTYPES
from parity_harness._fixture.decoding import DecodeOutput, DecodeRequest, requests_for, steps_to_output
from parity_harness._fixture.fixture import Case, Fixture, read_safetensors, too_big
from parity_reference.config import GPTConfig, param_shapes
from parity_reference.numpy_model import sinusoidal_positions
from parity_reference.taps import tap_names, tap_shape, tap_shape_template

__all__ = [
    "DTYPES",
    "INPUT_NAME",
    "PRECISIONS",
    "Backend",
    "BackendFailed",
    "BackendOutput",
    "BackendUnavailable",
    "Case",
    "DecodeOutput",
    "DecodeRequest",
    "Fixture",
    "FixtureError",
    "GPTConfig",
    "ParityError",
    "Precision",
    "check_onnx_file",
    "expected_outputs",
    "module_available",
    "onnx_file",
    "ort_runner",
    "param_shapes",
    "read_safetensors",
    "requests_for",
    "run_cases",
    "silenced",
    "sinusoidal_positions",
    "softmax_f32",
    "steps_to_output",
    "tap_names",
    "tap_shape",
    "tap_shape_template",
    "too_big"
]
