"""Check that an ONNX graph embeds exactly the fixture's weights, before any of its numbers are compared.

The graphs carry their own copy of the weights (initializers), so a fixture could ship a
`model.onnx` made from other weights than `weights.safetensors`; only the numbers would catch it,
and not at all on a tap the graph does not output. `check_graph_weights` compares them, once per
graph file and weights file (by the sha256 the manifest holds and the fixture checked at load):

- an initializer named as a parameter (`parameter_name`: the exporter's buffer name, `.` -> `__`)
  must equal that parameter exactly, in the initializer's dtype;
- any other float initializer with a parameter's shape (or a 2-D parameter's transposed shape: the
  tied unembedding, which the exporter folds into a transposed copy) is a copy of one of the
  parameters of that shape and must equal one exactly;
- every parameter must be in the graph, by content: the exporter keeps one initializer for
  identical tensors (the zero biases of a freshly initialized model share one).

"Exactly" is value for value in the graph's dtype (-0.0 equals 0.0), through a digest of each
tensor, so the check reads every initializer once.

A mismatch is a FixtureError naming the graph file and the parameter (exit 2). Every ONNX graph a
backend runs goes through it: `onnx_graph.onnx_file` (all-taps, logits-only; the onnxruntime,
onnx-reference and onnxruntime-web backends, `parity export --check`) and `onnx_decode.ort_decode`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from parity_harness._core.errors import FixtureError

if TYPE_CHECKING:
    from parity_harness._fixture.fixture import Fixture

# (graph file, its sha256, weights file's sha256) already checked in this process.
_checked: set[tuple[str, str, str]] = set()


def parameter_name(key: str) -> str:
    """The initializer name the exporter gives parameter `key` (_authoring/onnx_export.py: a buffer name has no '.')."""
    return key.replace(".", "__")


def graph_weight_problem(model: Any, weights: dict[str, np.ndarray]) -> str | None:
    """Why `model`'s initializers are not exactly `weights` (see the module docstring), or None.

    Equal parameters may share one initializer (the exporter keeps one copy of identical tensors:
    every zero bias of a freshly initialized model), so "in the graph" is by content."""
    from onnx import numpy_helper

    by_name = {parameter_name(k): k for k in weights}
    keys = _ParameterKeys(weights)
    present: set[tuple[str, tuple[int, ...], bytes]] = set()
    for init in model.graph.initializer:
        try:
            value = numpy_helper.to_array(init)
        except Exception as exc:  # a malformed tensor (wrong data length, unknown type): the graph is unusable
            return f"initializer {init.name!r} cannot be read ({type(exc).__name__})"
        if not np.issubdtype(value.dtype, np.floating):
            if init.name in by_name:
                return f"initializer {init.name!r} is {value.dtype}, not a copy of parameter {by_name[init.name]!r}"
            continue
        key = content_key(value)
        present.add(key)
        if init.name in by_name:
            name = by_name[init.name]
            if key not in keys.of(name, value.dtype):
                return f"initializer {init.name!r} differs from parameter {name!r}"
            continue
        candidates = keys.shaped(value.shape)
        if not candidates:
            continue  # a constant of the graph (frequencies, scalars), not a copy of a parameter
        if not any(key in keys.of(k, value.dtype) for k in candidates):
            which = f"parameter {candidates[0]!r}" if len(candidates) == 1 else \
                f"every parameter of its shape ({', '.join(candidates[:3])}{', ...' if len(candidates) > 3 else ''})"
            return (f"initializer {init.name!r} {list(value.shape)} differs from {which} (or its transpose)")
    dtypes: dict[tuple[int, ...], set[str]] = {}  # shape -> the float dtypes of the graph's tensors of that shape
    for dtype, shape, _ in present:
        dtypes.setdefault(shape, set()).add(dtype)
    for name, w in weights.items():
        seen = dtypes.get(w.shape, set()) | (dtypes.get(w.shape[::-1], set()) if w.ndim == 2 else set())
        if not any(keys.of(name, np.dtype(d)) & present for d in seen):
            return f"parameter {name!r} is not in the graph"
    return None


def content_key(value: np.ndarray) -> tuple[str, tuple[int, ...], bytes]:
    """dtype, shape and a digest of the values (-0.0 counted as 0.0): equal keys are equal tensors."""
    data = np.ascontiguousarray(value) + value.dtype.type(0)  # -0.0 + 0.0 is 0.0; a copy, not a view
    return value.dtype.str, tuple(value.shape), hashlib.blake2b(data.tobytes(), digest_size=32).digest()


class _ParameterKeys:
    """The content keys of each parameter and of its transpose, per dtype, computed when first asked."""

    def __init__(self, weights: dict[str, np.ndarray]) -> None:
        self.weights = weights
        self._keys: dict[tuple[str, str], set[tuple[str, tuple[int, ...], bytes]]] = {}

    def shaped(self, shape: tuple[int, ...]) -> list[str]:
        """The parameters of that shape, or whose transpose has it (a 2-D parameter)."""
        return [k for k, w in self.weights.items() if w.shape == shape or (w.ndim == 2 and w.shape[::-1] == shape)]

    def of(self, name: str, dtype: np.dtype) -> set[tuple[str, tuple[int, ...], bytes]]:
        """The keys parameter `name` has as a tensor of `dtype` (the graph's): itself, and its transpose."""
        cache = (name, dtype.str)
        if cache not in self._keys:
            w = self.weights[name].astype(dtype)
            self._keys[cache] = {content_key(w)} | ({content_key(np.ascontiguousarray(w.T))} if w.ndim == 2 else set())
        return self._keys[cache]


def check_graph_weights(fixture: Fixture, path: Path, model: Any = None) -> None:
    """Refuse `path` (FixtureError) when its initializers are not exactly the fixture's weights.

    Done once per graph file and weights file in a process; `model` (a loaded onnx.ModelProto) saves
    parsing the file again."""
    from parity_harness._backends.onnx.load import load_onnx

    hashes = fixture.manifest.get("sha256", {})
    key = (str(path.resolve()), str(hashes.get(path.name, "")), str(hashes.get(fixture.weights_path.name, "")))
    if key in _checked:
        return
    problem = graph_weight_problem(model if model is not None else load_onnx(path), fixture.weights())
    if problem is not None:
        raise FixtureError(f"{path}: {problem}: the graph does not embed the weights of {fixture.weights_path.name}; "
                           "regenerate it with `parity export`")
    _checked.add(key)
