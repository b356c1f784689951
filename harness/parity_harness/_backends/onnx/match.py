"""Any ONNX graph's tensors matched to parity's taps: by a name map the user gives, or by value.

A graph from optimum, a vendor toolchain or a user's own export names its tensors `/h.0/mlp/act/Erf_output_0`,
not `blocks.0.mlp.hook_post`. `expose_all` makes every float tensor a node computes an output of the graph (their
types from ONNX shape inference), so one run gives them all; `match_taps` then finds, for each tap in dataflow
order, the tensor that stands for it:

- by value (the default): among the tensors computed no earlier than the previous tap's (in the graph's
  topological order), the one whose values, read in the tap's layout (`as_tap`: leading unit axes dropped, any
  order of up to four axes, then the tap's shape), are nearest the tap's golden. It is the tap's tensor when it
  agrees within the tap's tolerance; when none does, the nearest is still taken if it is near (`NEAR`: within a
  tenth of the tap's largest value on every cell the golden holds finite), so a graph with a bug is judged, and
  fails, at the tap it broke; then a tap left between two found ones takes the nearest tensor between theirs
  (holding the causal mask first) when it is within the tap's largest value; a tap with no such tensor is one
  the graph does not compute ("not supported");
- by name: `name_map` {tap: tensor name}, every name checked against the graph.

The graph's declared outputs keep their place: one named like a tap (`logits`) always stands for it, so a graph
that breaks everywhere can never pass by matching nothing.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

NEAR = 0.1  # a tensor within this share of the tap's largest |value| may stand for it, agreeing or not
FLOAT_TYPES = (1, 10, 11, 16)  # onnx.TensorProto FLOAT, FLOAT16, DOUBLE, BFLOAT16


@dataclasses.dataclass(frozen=True)
class TapSource:
    """The tensor that stands for a tap: its name, the node that computes it, its layout, and how it was found."""

    tensor: str
    node: str  # the node whose output it is ("" for a graph input)
    op: str
    permutation: tuple[int, ...]  # the axes of the squeezed tensor, in the tap's order
    how: str  # "value" (agrees within tolerance), "nearest" (near, but off), "name" (the user's map), "output"
    drop: tuple[int, ...] = ()  # the unit axes dropped first (a batch of one), found on the matching case


def expose_all(model: Any) -> tuple[Any, list[str]]:
    """A copy of the graph with every float tensor a node computes as an output, and their names in topological
    order (the graph's node order, which ONNX requires topological)."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    types = {v.name: v for v in [*inferred.graph.value_info, *inferred.graph.output]}
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    present = {o.name for o in exposed.graph.output}
    order: list[str] = []
    for node in model.graph.node:
        for name in node.output:
            info = types.get(name)
            if not name or info is None or info.type.tensor_type.elem_type not in FLOAT_TYPES:
                continue
            order.append(name)
            if name not in present:
                exposed.graph.output.append(info)
                present.add(name)
    return exposed, order


def producers(model: Any) -> dict[str, tuple[str, str]]:
    """{tensor: (node name, op type)} for every node output."""
    out: dict[str, tuple[str, str]] = {}
    for k, node in enumerate(model.graph.node):
        for name in node.output:
            out[name] = (node.name or f"node_{k}", node.op_type)
    return out


def unit_axes(value: np.ndarray) -> tuple[int, ...]:
    """The axes of size 1 (all but one, for a tensor of one element)."""
    axes = tuple(k for k, n in enumerate(value.shape) if n == 1)
    return axes[:-1] if len(axes) == value.ndim and axes else axes


def as_tap(value: np.ndarray, shape: tuple[int, ...], permutation: tuple[int, ...],
           drop: tuple[int, ...] | None = None) -> np.ndarray | None:
    """`value` read in a tap's layout: its unit axes `drop` (by default every one) dropped, the rest permuted,
    reshaped to `shape`; None if it cannot be."""
    axes = unit_axes(value) if drop is None else drop
    if value.size != int(np.prod(shape)) or any(a >= value.ndim or value.shape[a] != 1 for a in axes):
        return None
    squeezed = np.squeeze(value, axis=axes) if axes else value
    if len(permutation) != squeezed.ndim:
        return None
    return np.transpose(squeezed, permutation).reshape(shape)


MASK_SENTINEL = -1e4  # at or below it, a masked score: -1e4 (the original GPT-2's), float32's min (transformers')
MASKED_TAP = "hook_attn_scores"  # the one tap whose golden holds -inf (the causal mask's cells)


def read_mask(tap: str, value: np.ndarray) -> np.ndarray:
    """A graph's scores with the mask as the model defines it: a cell at or below `MASK_SENTINEL` read as -inf.

    Exporters mask with a large finite negative instead of -inf (transformers adds float32's min); softmax gives
    both exactly 0. Read this way, a missing or shifted mask still fails: its cells are finite where the golden is
    -inf, or -inf where the golden is finite (an infinity mismatch)."""
    if not tap.endswith(MASKED_TAP):
        return value
    with np.errstate(invalid="ignore"):
        return np.where(value <= MASK_SENTINEL, np.float32(-np.inf), value).astype(value.dtype, copy=False)


def _permutations(value: np.ndarray) -> list[tuple[int, ...]]:
    ndim = value.ndim - len(unit_axes(value))
    return list(itertools.permutations(range(ndim))) if ndim <= 4 else [tuple(range(ndim))]


def scored(candidate: np.ndarray, golden: np.ndarray) -> tuple[bool, float]:
    """(whether the candidate holds the golden's -inf cells, the causal mask, as -inf or below -1e4; the largest
    |candidate - golden| over the cells the golden holds finite, inf where the candidate is not finite there)."""
    golden = np.asarray(golden, dtype=np.float64)
    candidate = np.asarray(candidate, dtype=np.float64)
    finite = np.isfinite(golden)
    masked = np.isneginf(golden)
    holds_mask = bool(not masked.any() or np.all(candidate[masked] <= MASK_SENTINEL))
    if not np.all(np.isfinite(candidate[finite])):
        return holds_mask, float("inf")
    return holds_mask, float(np.max(np.abs(candidate[finite] - golden[finite]))) if finite.any() else 0.0


def distance(candidate: np.ndarray, golden: np.ndarray) -> float:
    """`scored`'s error, inf when the candidate does not hold the golden's mask."""
    holds_mask, error = scored(candidate, golden)
    return error if holds_mask else float("inf")


def match_taps(values: Mapping[str, np.ndarray], order: Sequence[str], taps: Sequence[str],
               goldens: Mapping[str, np.ndarray], atols: Mapping[str, float], outputs: Sequence[str],
               sources: Mapping[str, tuple[str, str]]) -> dict[str, TapSource]:
    """{tap: its tensor} for one case's values (every exposed tensor by name), taps in dataflow order."""
    position = {name: k for k, name in enumerate(order)}
    found: dict[str, TapSource] = {}
    start = 0
    for tap in taps:  # first pass: the taps some tensor agrees with, or comes near
        golden = goldens.get(tap)
        if golden is None:
            continue
        magnitude = float(np.max(np.abs(golden[np.isfinite(golden)]), initial=0.0))
        if tap in outputs:  # a declared output named as the tap stands for it, whatever its values
            best = _best(values, [tap], golden)
            if best is not None:
                found[tap] = _source(tap, best[0][1], sources, "output", values)
                start = max(start, position.get(tap, start))
            continue
        best = _best(values, order[start:], golden)
        if best is None:
            continue
        (error, permutation), name = best[0], best[1]
        agrees = error <= atols[tap] and scored(_read(values[name], golden, permutation), golden)[0]
        how = "value" if agrees else "nearest" if error <= NEAR * max(magnitude, 1e-30) else ""
        if how:
            found[tap] = _source(name, permutation, sources, how, values)
            start = position[name]
    _fill_gaps(found, values, order, taps, goldens, sources, position)
    return found


def _read(value: np.ndarray, golden: np.ndarray, permutation: tuple[int, ...]) -> np.ndarray:
    read = as_tap(value, golden.shape, permutation)
    return read if read is not None else np.full(golden.shape, np.nan)


def _fill_gaps(found: dict[str, TapSource], values: Mapping[str, np.ndarray], order: Sequence[str],
               taps: Sequence[str], goldens: Mapping[str, np.ndarray], sources: Mapping[str, tuple[str, str]],
               position: Mapping[str, int]) -> None:
    """Second pass: a tap left between two found ones (a graph broken there is off by more than `NEAR`) takes the
    tensor between their tensors, in topological order, that comes nearest it, holding its mask first, when it is
    within the tap's largest value: so the judge fails the graph at the tap it broke, not at the next one found."""
    for k, tap in enumerate(taps):
        golden = goldens.get(tap)
        if tap in found or golden is None:
            continue
        before = [found[t].tensor for t in taps[:k] if t in found]
        after = [found[t].tensor for t in taps[k + 1:] if t in found]
        lo = position.get(before[-1], -1) + 1 if before else 0
        hi = position.get(after[0], len(order)) if after else len(order)
        magnitude = float(np.max(np.abs(golden[np.isfinite(golden)]), initial=0.0))
        best: tuple[tuple[bool, float], str, tuple[int, ...]] | None = None
        for name in order[lo:hi]:
            value = values.get(name)
            if value is None or value.size != golden.size:
                continue
            for permutation in _permutations(value):
                read = as_tap(value, golden.shape, permutation)
                if read is None:
                    continue
                holds_mask, error = scored(read, golden)
                key = (not holds_mask, error)
                if best is None or key < best[0]:
                    best = (key, name, permutation)
        if best is not None and best[0][1] <= max(magnitude, 1e-30):
            found[tap] = _source(best[1], best[2], sources, "nearest", values)


def _best(values: Mapping[str, np.ndarray], names: Sequence[str],
          golden: np.ndarray) -> tuple[tuple[float, tuple[int, ...]], str] | None:
    best: tuple[tuple[float, tuple[int, ...]], str] | None = None
    best_key = (True, float("inf"))
    finite = bool(np.all(np.isfinite(golden)))
    ordered = np.sort(np.asarray(golden, dtype=np.float64), axis=None) if finite else None
    for name in names:
        value = values.get(name)
        if value is None or value.size != golden.size:
            continue
        if ordered is not None:  # no pairing of the cells comes nearer than the sorted one: a cheap lower bound
            bound = float(np.max(np.abs(np.sort(np.asarray(value, dtype=np.float64), axis=None) - ordered)))
            if not bound <= (best[0][0] if best is not None and not best_key[0] else float("inf")):
                continue
        for permutation in _permutations(value):
            read = as_tap(value, golden.shape, permutation)
            if read is None:
                continue
            holds_mask, error = scored(read, golden)  # a tensor holding the causal mask comes first
            key = (not holds_mask, error)
            if best is None or key < best_key:
                best, best_key = ((error, permutation), name), key
    return best


def _source(name: str, permutation: tuple[int, ...], sources: Mapping[str, tuple[str, str]], how: str,
            values: Mapping[str, np.ndarray]) -> TapSource:
    node, op = sources.get(name, ("", "input"))
    return TapSource(name, node, op, permutation, how, unit_axes(values[name]))
