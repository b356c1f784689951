"""The arithmetic of `parity attribute` (docs/attribution.md): errors in eps units, and the fp32 set to keep.

Pure NumPy, no backend: `parity_harness._tools.attribute` runs the layers and hands the numbers here.

- `units`: an error in eps units of a precision, `max |actual - golden| / (eps * M_tap)`, the unit of
  the reduced-precision rule (docs/tolerances.md); a non-finite cell where the golden is finite is inf.
- `round_to`: a float64 array rounded to fp16 or bf16 (round to nearest even), returned as float32
  holding those values: the teacher-forced input of a layer.
- the prediction: each layer's error, propagated exactly (float64) to the logits, is a vector `delta`
  per case; to first order the logits error of a run that keeps a set S of layers in fp32 is
  `max |sum of delta over the layers not in S|` (`predict`), so cancellations between layers count.
  `recommend` finds the smallest S whose prediction meets a target: exhaustively up to
  `EXHAUSTIVE` layers, then greedily (the layer that lowers the prediction most, one at a time).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence

import numpy as np

EXHAUSTIVE = 3  # sets of up to this many layers are all tried; beyond, the set grows greedily

Deltas = Mapping[str, Sequence[np.ndarray]]  # layer -> one logits-error array [T, V] per case


def units(actual: np.ndarray, golden: np.ndarray, eps: float, magnitude: float) -> float:
    """max |actual - golden| / (eps * magnitude); inf when a cell is non-finite where the golden is finite."""
    diff = np.abs(actual.astype(np.float64) - golden.astype(np.float64))  # like golden
    if not np.isfinite(diff).all():
        return math.inf
    return float(diff.max(initial=0.0)) / (eps * magnitude) if magnitude > 0 else 0.0


def round_to(x: np.ndarray, precision: str) -> np.ndarray:
    """`x` rounded to fp16 or bf16 (nearest, ties to even), as a float32 array of those values."""
    f = np.asarray(x, dtype=np.float64).astype(np.float32)  # like x
    if precision == "fp16":
        with np.errstate(over="ignore"):
            return f.astype(np.float16).astype(np.float32)  # like x
    if precision != "bf16":
        raise ValueError(f"round_to: not a reduced precision: {precision!r}")
    bits = f.view(np.uint32).astype(np.uint64)  # like x
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # like x: to nearest even on the low 16 bits
    out: np.ndarray = np.where(np.isfinite(f), rounded.astype(np.uint32).view(np.float32), f)  # like x
    return out


def predict(deltas: Deltas, kept: Sequence[str], scale: float) -> float:
    """The predicted logits error, in units (`scale` = eps * M_logits), with the layers `kept` in fp32."""
    rest = [layer for layer in deltas if layer not in kept]
    n_cases = len(next(iter(deltas.values()))) if deltas else 0
    worst = 0.0
    for c in range(n_cases):
        total = sum((deltas[layer][c] for layer in rest), np.zeros_like(next(iter(deltas.values()))[c]))  # [T, V]
        if not np.isfinite(total).all():
            return math.inf
        worst = max(worst, float(np.abs(total).max(initial=0.0)))
    return worst / scale


def recommend(deltas: Deltas, target: float, scale: float) -> tuple[list[str], float]:
    """The smallest set of layers to keep in fp32 whose predicted logits error meets `target` (in units),
    in dataflow order, and that prediction (the lowest among the sets of that size when all are tried)."""
    layers = list(deltas)
    mandatory = [layer for layer in layers if not all(np.isfinite(d).all() for d in deltas[layer])]
    free = [layer for layer in layers if layer not in mandatory]
    for size in range(0, min(EXHAUSTIVE, len(free)) + 1):
        best: tuple[float, list[str]] | None = None
        for combo in itertools.combinations(free, size):
            kept = mandatory + list(combo)
            value = predict(deltas, kept, scale)
            if value <= target and (best is None or value < best[0]):
                best = (value, kept)
        if best is not None:
            return [layer for layer in layers if layer in best[1]], best[0]
    kept = list(mandatory)
    value = predict(deltas, kept, scale)
    while value > target and len(kept) < len(layers):
        value, pick = min((predict(deltas, [*kept, layer], scale), layer) for layer in layers if layer not in kept)
        kept.append(pick)
    return [layer for layer in layers if layer in kept], value


def alone(deltas: Deltas, layer: str, scale: float) -> float:
    """One layer's own contribution to the logits error, in units: max |delta| over its cases."""
    worst = 0.0
    for d in deltas[layer]:
        if not np.isfinite(d).all():
            return math.inf
        worst = max(worst, float(np.abs(d).max(initial=0.0)))
    return worst / scale
