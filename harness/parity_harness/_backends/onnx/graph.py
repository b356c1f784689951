"""Read, validate and run the fixture's committed ONNX graphs, without torch.

Shared by the three ONNX backends and by `parity export --check`. A graph is trusted only after
`check_onnx_file`: the file parses, passes `onnx.checker`, is self-contained (no external data),
takes one input `tokens` (int64, [T]) and its outputs are exactly the manifest's taps in dataflow
order (the all-taps graph) or exactly `["logits"]` (the logits-only graph); and `onnx_file`, the
way every backend finds a graph, checks that it embeds exactly the fixture's weights
(parity_harness/_backends/onnx/weights.py). Every problem raises
`FixtureError` with one line naming the file. onnx and onnxruntime are imported inside functions.

Each verdict is reached once per process and graph file as the manifest hashes it (`load.file_key`):
`onnx_file` parses a graph it has not checked yet once, and while it holds the parsed graph it also
decides the contract `check_onnx_file` will report for that kind; the second backend on the same file
reads nothing. Verdicts are kept, not the parsed graphs (500 MB each at GPT-2 size); `onnx_model`
is for a caller that needs the graph itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from parity_harness._backends.onnx.load import FileKey, file_key, first_line
from parity_harness._backends.onnx.load import load_onnx as load_onnx  # re-exported: the graph helpers' reader
from parity_harness._core.errors import BackendFailed, FixtureError

if TYPE_CHECKING:
    from parity_harness._core.precision import BackendOutput
    from parity_harness._fixture.fixture import Fixture

OnnxGraph = Literal["all_taps", "logits"]
GRAPHS: tuple[OnnxGraph, ...] = ("all_taps", "logits")
GRAPH_FILES: dict[OnnxGraph, str] = {"all_taps": "model.onnx", "logits": "model.logits.onnx"}  # kind -> file name
# Pinned: the opset torch.onnx's dynamo exporter (torchlib) is written in, so no version converter
# runs; every op the model needs (Erf, Trilu, Softmax-13 semantics, ...) exists at 18; opset <= 17
# with the dynamo exporter writes an invalid model. See docs/onnx.md.
ONNX_OPSET = 18
INPUT_NAME = "tokens"  # int64 [T], 1 <= T <= n_ctx


def expected_outputs(tap_names: Sequence[str], graph: OnnxGraph) -> list[str]:
    """The graph output names of `graph`: every tap in dataflow order, or just `logits`."""
    if graph == "all_taps":
        return list(tap_names)
    if graph == "logits":
        return ["logits"]
    raise ValueError(f"unknown ONNX graph kind {graph!r} (expected one of {GRAPHS})")


def onnx_file(fixture: Fixture, graph: OnnxGraph) -> Path:
    """The fixture's committed graph of kind `graph`, its initializers checked against the fixture's
    weights (parity_harness/_backends/onnx/weights.py, once per file); FixtureError when the manifest lists none."""
    from parity_harness._backends.onnx.weights import check_graph_weights, weights_checked

    path = _listed_graph(fixture, graph)
    if not weights_checked(fixture, path):
        key = file_key(fixture, path)
        model = load_onnx(path, key)
        check_graph_weights(fixture, path, model)
        _contract(model, path, fixture, graph, key)  # what check_onnx_file will say: the graph is parsed now
    return path


def onnx_model(fixture: Fixture, graph: OnnxGraph) -> tuple[Path, Any]:
    """`onnx_file` and `check_onnx_file` in one parse, for a caller that runs the parsed graph itself:
    (the file, its onnx.ModelProto)."""
    from parity_harness._backends.onnx.weights import check_graph_weights

    path = _listed_graph(fixture, graph)
    key = file_key(fixture, path)
    model = load_onnx(path, key)
    check_graph_weights(fixture, path, model)
    verdict = _contract(model, path, fixture, graph, key)
    if verdict:
        raise FixtureError(verdict)
    return path, model


def _listed_graph(fixture: Fixture, graph: OnnxGraph) -> Path:
    """The path of the fixture's graph of kind `graph`; FixtureError when the manifest lists none or it is missing."""
    path = fixture.onnx_path(graph)
    if path is None:
        raise FixtureError(
            f"{fixture.manifest_path}: the fixture has no ONNX {graph!r} graph (files.onnx.{graph}); "
            "run `parity export` to write model.onnx and model.logits.onnx"
        )
    if not path.is_file():
        raise FixtureError(f"{path}: file not found; run `parity export`")
    return path


def output_difference(actual: Sequence[str], expected: Sequence[str]) -> str:
    """How two lists of output names differ, for one line: missing, extra, or order. Empty if equal."""
    if list(actual) == list(expected):
        return ""
    missing = [n for n in expected if n not in actual]
    extra = [n for n in actual if n not in expected]
    parts = []
    if missing:
        parts.append(f"missing {missing}")
    if extra:
        parts.append(f"extra {extra}")
    if not parts:
        dupes = sorted({n for n in actual if list(actual).count(n) > 1})
        first = next(i for i, (a, b) in enumerate(zip(actual, expected, strict=False)) if a != b)
        parts.append(
            f"repeated {dupes}"
            if dupes
            else f"wrong order from #{first}: {actual[first]!r}, expected {expected[first]!r}"
        )
    return "; ".join(parts)


def check_onnx_model(model: Any, path: Path, tap_names: Sequence[str], graph: OnnxGraph) -> None:
    """The input/output contract of a parsed graph (see the module docstring); FixtureError otherwise."""
    import onnx

    inputs = [i for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    if len(inputs) != 1 or inputs[0].name != INPUT_NAME:
        raise FixtureError(f"{path}: graph inputs are {[i.name for i in inputs]}, expected [{INPUT_NAME!r}]")
    tensor_type = inputs[0].type.tensor_type
    dims = tensor_type.shape.dim
    if tensor_type.elem_type != onnx.TensorProto.INT64 or len(dims) != 1:
        raise FixtureError(f"{path}: input {INPUT_NAME!r} must be int64 of shape [T]")
    actual = [o.name for o in model.graph.output]
    diff = output_difference(actual, expected_outputs(tap_names, graph))
    if diff:
        what = "the manifest's taps" if graph == "all_taps" else "['logits']"
        raise FixtureError(f"{path}: graph outputs do not match {what} ({diff})")


def check_onnx_file(path: Path, fixture: Fixture, outputs: OnnxGraph) -> None:
    """Refuse a graph file that is unreadable or whose outputs are not exactly what `outputs` promises.

    Decided once per process for a file the manifest hashes (and these taps): asked again, it reads nothing."""
    key = file_key(fixture, path)
    verdict = _contracts.get(_contract_key(key, fixture, outputs)) if key is not None else None
    if verdict is None:
        verdict = _contract(load_onnx(path, key), path, fixture, outputs, key)
    if verdict:
        raise FixtureError(verdict)


# The contract verdicts reached in this process: (file key, graph kind, the manifest's taps) -> the
# FixtureError's line, or "" when the graph keeps the contract.
_contracts: dict[tuple[FileKey, OnnxGraph, tuple[str, ...]], str] = {}


def _contract_key(key: FileKey, fixture: Fixture, outputs: OnnxGraph) -> tuple[FileKey, OnnxGraph, tuple[str, ...]]:
    return key, outputs, tuple(fixture.tap_names)


def _contract(model: Any, path: Path, fixture: Fixture, outputs: OnnxGraph, key: FileKey | None) -> str:
    """`check_onnx_model`'s verdict on the parsed `model` ("" or the line it raised), kept under `key`."""
    try:
        check_onnx_model(model, path, fixture.tap_names, outputs)
        verdict = ""
    except FixtureError as exc:
        verdict = str(exc)
    if key is not None:
        _contracts[_contract_key(key, fixture, outputs)] = verdict
    return verdict


def softmax_f32(logits: np.ndarray) -> np.ndarray:
    """Float32 softmax over the last axis, stable: exp(x - max) / sum."""
    x = logits.astype(np.float32, copy=False)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    out: np.ndarray = (e / e.sum(axis=-1, keepdims=True)).astype(np.float32, copy=False)
    return out


Runner = Callable[[np.ndarray], list[np.ndarray]]


def ort_runner(
    path: Path, optimization: Literal["disable", "basic", "extended", "all"] | None = None,
    model: bytes | None = None,
) -> Runner:
    """An onnxruntime CPU session on one thread; `optimization=None` keeps ORT's default (ORT_ENABLE_ALL).

    It runs the graph file at `path`, or `model` (a serialized graph made from it: the fp16 conversion),
    whose errors name `path`."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # one thread: the same reduction order every run
    options.inter_op_num_threads = 1
    options.log_severity_level = 4  # fatal only: a failing node is the ParityError parity raises, not a log line
    if optimization is not None:
        levels = {
            "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        }
        options.graph_optimization_level = levels[optimization]
    try:
        session = ort.InferenceSession(model if model is not None else str(path), sess_options=options,
                                       providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own exception types (Fail, InvalidGraph, ...)
        raise BackendFailed(f"{path}: onnxruntime cannot load the graph ({first_line(exc)})") from None

    def run(tokens: np.ndarray) -> list[np.ndarray]:
        return list(session.run(None, {INPUT_NAME: tokens}))

    return run


def reference_runner(model: Any) -> Runner:
    """The same graph under onnx.reference.ReferenceEvaluator (pure Python, NumPy kernels)."""
    from onnx.reference import ReferenceEvaluator

    evaluator = ReferenceEvaluator(model)

    def run(tokens: np.ndarray) -> list[np.ndarray]:
        return list(evaluator.run(None, {INPUT_NAME: tokens}))

    return run


def run_cases(fixture: Fixture, path: Path, names: Sequence[str], runner: Runner) -> BackendOutput:
    """Run every case through `runner`; {case: {output name: float32 array}}. BackendFailed on a crash."""
    out: BackendOutput = {}
    for case in fixture.cases:
        tokens = np.asarray(case.tokens, dtype=np.int64)
        try:
            values = runner(tokens)
        except Exception as exc:  # the runtimes raise many types; any crash is the backend's failure
            raise BackendFailed(
                f"{path}: case {case.name!r} (T={len(tokens)}) failed: {first_line(exc)}"
            ) from None
        if len(values) != len(names):
            raise BackendFailed(f"{path}: returned {len(values)} outputs, expected {len(names)}")
        out[case.name] = {
            n: np.asarray(v).astype(np.float32, copy=False) for n, v in zip(names, values, strict=True)
        }
    return out
