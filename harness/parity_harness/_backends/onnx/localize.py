"""The first divergence down to the op: which node of a graph, between the last agreeing taps and the first
diverging one, breaks.

A tap may hold a dozen ops (a LayerNorm's mean, centring, variance, eps, square root). `locate` takes the nodes
between the tensors that stand for the agreeing taps and the one that stands for the diverging tap (walking
back from it, stopping at those tensors, the graph's inputs and constants), and runs them in order, each node in
float64 (onnx.reference, on the inputs the runtime computed) beside what the runtime computed, and each output
sought among the reference graph's tensors (the fixture's own export, run on the same case):

- a node whose runtime output is off its float64 recomputation beyond float32's rounding (c * eps32 * M, c 64,
  the fp32 per-tap rule's) is a runtime's kernel that breaks: named with the size;
- else the first node whose output the reference graph computes nowhere (any layout, within that rounding) is
  where the graph itself departs from the model: named with its op, its inputs and the constants among them
  (the eps an Add adds, a weight that differs from the fixture's);
- when every node agrees with the reference, the graph lacks a node the reference has: the tensor standing for the
  tap is named, and the reference's own node for the tap beside it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from parity_harness._backends.onnx.match import _best, distance

C_NODE = 64.0  # a node's float32 output may be this many eps32 * M off its float64 recomputation
EPS32 = 2.0**-23


@dataclasses.dataclass(frozen=True)
class OpBreak:
    """Where a tap's divergence starts inside the graph: the node, its op, inputs and constants, and the size."""

    node: str
    op: str
    inputs: tuple[str, ...]  # each input: "name [shape]" or "name = constant"
    size: float  # the largest |difference| that breaks: runtime vs float64, or vs the nearest reference tensor
    kind: str  # "kernel" (runtime vs float64), "graph" (no reference tensor), "missing" (every node agrees)
    reference: str = ""  # for "missing": the reference graph's node computing the tap

    def line(self) -> str:
        inputs = ", ".join(self.inputs)
        if self.kind == "kernel":
            return (f"node {self.node} ({self.op}; inputs {inputs}) computes {self.size:.2g} off its own float64 "
                    "recomputation from the same inputs: the runtime's kernel")
        if self.kind == "graph":
            return (f"node {self.node} ({self.op}; inputs {inputs}) is the first whose output the reference graph "
                    f"computes nowhere (nearest {self.size:.2g} away): the graph departs from the model there")
        return (f"every node up to {self.node} ({self.op}; inputs {inputs}) agrees with the reference graph: the "
                f"graph lacks a node the reference computes the tap with ({self.reference})")


def region(model: Any, target: str, stops: set[str]) -> list[Any]:
    """The nodes the tensor `target` is computed from, back to `stops` (agreeing taps' tensors), the graph's
    inputs and constants, in the graph's (topological) order."""
    made_by = {out: node for node in model.graph.node for out in node.output}
    constants = {t.name for t in model.graph.initializer}
    wanted: set[int] = set()
    todo = [target]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or name in stops or name in constants or name not in made_by:
            continue
        seen.add(name)
        node = made_by[name]
        if node.op_type == "Constant":
            continue
        wanted.add(id(node))
        todo.extend(node.input)
    return [node for node in model.graph.node if id(node) in wanted]


def _describe(name: str, values: Mapping[str, np.ndarray], constants: Mapping[str, np.ndarray]) -> str:
    if name in constants and constants[name].size <= 4:
        return f"{name} = {np.array2string(constants[name].ravel(), precision=6)}"
    value = constants.get(name, values.get(name))
    return f"{name} {list(value.shape)}" if value is not None else name


def constants_of(model: Any) -> dict[str, np.ndarray]:
    """Initializers and Constant nodes' values, by tensor name."""
    from onnx import numpy_helper

    out = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    out[node.output[0]] = numpy_helper.to_array(attr.t)
    return out


def _float64_node(node: Any, inputs: Sequence[np.ndarray | None]) -> list[np.ndarray] | None:
    """The node run alone by onnx.reference, float inputs in float64; None when it cannot run so."""
    from onnx.reference import ReferenceEvaluator

    feeds = {}
    for name, value in zip(node.input, inputs, strict=True):
        if not name:
            continue
        if value is None:
            return None
        feeds[name] = value.astype(np.float64) if value.dtype.kind == "f" else value
    try:
        return [np.asarray(v) for v in ReferenceEvaluator(node).run(None, feeds)]
    except Exception:  # an op onnx.reference cannot run in float64 (a float32-only attribute): no verdict here
        return None


def run_exposed(model: Any, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every float tensor of `model` (match.expose_all) on `feeds`, by onnxruntime's CPU on one thread with graph
    optimizations off (each node's tensor the one the graph says)."""
    import onnxruntime as ort

    from parity_harness._backends.onnx.match import expose_all

    exposed, _ = expose_all(model)
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 4  # fatal only: a failing node is the ParityError parity raises
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(exposed.SerializeToString(), sess_options=options,
                                   providers=["CPUExecutionProvider"])
    values = session.run(None, dict(feeds))
    return {o.name: np.asarray(v) for o, v in zip(session.get_outputs(), values, strict=True)}


def locate_in_own_graph(model: Any, tokens: Sequence[int], taps: Sequence[str], tap: str) -> str | None:
    """For a backend running the fixture's own all-taps graph (its outputs named as the taps): the node between the
    taps before `tap` and `tap` whose output onnxruntime computes off its float64 recomputation, one line; None
    when every node's kernel agrees (the graph is the reference, so nothing else can be told apart)."""
    values = run_exposed(model, {model.graph.input[0].name: np.asarray(tokens, dtype=np.int64)})
    place = list(taps).index(tap)
    where = locate(model, values, tap, set(taps[:place]), {}, "")
    if where is None or where.kind != "kernel":
        return None
    return f"in the graph (onnxruntime's CPU kernels, run node by node), {where.line()}"


def locate(model: Any, values: Mapping[str, np.ndarray], target: str, stops: set[str],
           reference: Mapping[str, np.ndarray], reference_node: str) -> OpBreak | None:
    """The node where the divergence at tensor `target` starts (see the module docstring), or None when the
    region is empty (the tensor is an agreeing tap's or a graph input)."""
    nodes = region(model, target, stops)
    if not nodes:
        return None
    constants = constants_of(model)
    names = list(reference)
    for node in nodes:
        inputs = [values.get(n, constants.get(n)) if n else None for n in node.input]
        outputs = [values.get(n) for n in node.output]
        described = tuple(_describe(n, values, constants) for n in node.input if n)
        label = node.name or node.output[0]
        exact = _float64_node(node, inputs)
        for got, want in zip(outputs, exact or [], strict=False):
            if got is None or got.dtype.kind != "f" or want.shape != got.shape:
                continue
            magnitude = float(np.max(np.abs(want[np.isfinite(want)]), initial=0.0))
            off = distance(got, want)
            if off > C_NODE * EPS32 * max(magnitude, 1e-30):
                return OpBreak(label, node.op_type, described, off, "kernel")
        out = outputs[0]
        if not reference or out is None or out.dtype.kind != "f" or not out.size:
            continue  # no reference graph: the kernels alone are checked
        magnitude = float(np.max(np.abs(out[np.isfinite(out)]), initial=0.0))
        best = _best(reference, names, out.astype(np.float64))
        nearest = best[0][0] if best is not None else float("inf")
        if not nearest <= C_NODE * EPS32 * max(magnitude, 1e-30) + 1e-7:
            return OpBreak(label, node.op_type, described, nearest, "graph")
    last = nodes[-1]
    return OpBreak(last.name or last.output[0], last.op_type,
                   tuple(_describe(n, values, constants) for n in last.input if n), 0.0, "missing", reference_node)
