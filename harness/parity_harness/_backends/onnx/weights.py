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
  identical tensors (the zero biases of a freshly initialized model share one);
- the parameters are the fixture's family's (`fixture.model.param_shapes()`: GPT-2's or Llama's); the Llama
  graph's RoPE tables (`ROPE_CONSTANTS`, `rope_cos` and `rope_sin`) are constants of the graph, not parameters.

"Exactly" is value for value in the graph's dtype (-0.0 equals 0.0), through a digest of each
tensor (`content_key`, over the array's own bytes), so the check reads every initializer once; a
parameter's transpose is digested only when the parameter's own digest matched nothing, and the
parameters' digests are kept per weights file, so a second graph of the same weights reads none.

A mismatch is a FixtureError naming the graph file and the parameter (exit 2). Every ONNX graph a
backend runs goes through it: `graph.onnx_file` and `graph.onnx_model` (all-taps, logits-only; every
ONNX backend, `parity export --check`) and `decode.checked_decode_graph` (the decode graph).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from parity_harness._core.errors import FixtureError

if TYPE_CHECKING:
    from parity_harness._fixture.fixture import Fixture

# The graph's own constants that are not parameters: the Llama export's RoPE tables (n_ctx, d_head/2), which a
# parameter's shape may equal; they are never taken for a copy of one (_authoring/onnx_export.py).
ROPE_CONSTANTS = ("rope_cos", "rope_sin")

# (graph file resolved, its sha256, the weights file's sha256) already checked in this process.
_checked: set[tuple[str, str, str]] = set()


def parameter_name(key: str) -> str:
    """The initializer name the exporter gives parameter `key` (_authoring/onnx_export.py: a buffer name has no '.')."""
    return key.replace(".", "__")


def graph_weight_problem(model: Any, weights: dict[str, np.ndarray]) -> str | None:
    """Why `model`'s initializers are not exactly `weights` (see the module docstring), or None.

    Equal parameters may share one initializer (the exporter keeps one copy of identical tensors:
    every zero bias of a freshly initialized model), so "in the graph" is by content."""
    keys = _ParameterKeys({k: w.shape for k, w in weights.items()})
    keys.read_from(lambda: weights)
    return _weight_problem(model, keys)


def _weight_problem(model: Any, keys: _ParameterKeys) -> str | None:
    """`graph_weight_problem` with the parameters' keys (`_ParameterKeys`), which may be known already."""
    from onnx import numpy_helper

    by_name = {parameter_name(k): k for k in keys.shapes}
    present: set[Key] = set()
    for init in model.graph.initializer:
        try:
            value = numpy_helper.to_array(init)
        except Exception as exc:  # a malformed tensor (wrong data length, unknown type): the graph is unusable
            return f"initializer {init.name!r} cannot be read ({type(exc).__name__})"
        if not np.issubdtype(value.dtype, np.floating):
            if init.name in by_name:
                return f"initializer {init.name!r} is {value.dtype}, not a copy of parameter {by_name[init.name]!r}"
            continue
        if init.name in ROPE_CONSTANTS:
            continue  # the Llama graph's RoPE tables, not a copy of a parameter
        key = content_key(value)
        present.add(key)
        if init.name in by_name:
            name = by_name[init.name]
            if not keys.matches([name], value.dtype, {key}):
                return f"initializer {init.name!r} differs from parameter {name!r}"
            continue
        candidates = keys.shaped(value.shape)
        if not candidates:
            continue  # a constant of the graph (frequencies, scalars), not a copy of a parameter
        if not keys.matches(candidates, value.dtype, {key}):
            which = f"parameter {candidates[0]!r}" if len(candidates) == 1 else \
                f"every parameter of its shape ({', '.join(candidates[:3])}{', ...' if len(candidates) > 3 else ''})"
            return (f"initializer {init.name!r} {list(value.shape)} differs from {which} (or its transpose)")
    dtypes: dict[tuple[int, ...], set[str]] = {}  # shape -> the float dtypes of the graph's tensors of that shape
    for dtype, shape, _ in present:
        dtypes.setdefault(shape, set()).add(dtype)
    for name, shape in keys.shapes.items():
        seen = dtypes.get(shape, set()) | (dtypes.get(shape[::-1], set()) if len(shape) == 2 else set())
        if not any(keys.matches([name], np.dtype(d), present) for d in seen):
            return f"parameter {name!r} is not in the graph"
    return None


Key = tuple[str, tuple[int, ...], bytes]  # dtype, shape, digest: `content_key`


def content_key(value: np.ndarray) -> Key:
    """dtype, shape and a digest of the values (-0.0 counted as 0.0): equal keys are equal tensors.

    The digest (sha256: twice blake2b's speed where the CPU has SHA instructions) reads the array's own
    bytes, no copy when it is contiguous; only an array holding a -0.0 or a NaN is first copied as
    `value + 0`, which makes -0.0 into 0.0 and leaves every other number as it is."""
    data = _normalized(np.ascontiguousarray(value))
    return value.dtype.str, tuple(value.shape), hashlib.sha256(_as_bytes(data)).digest()


def transposed_key(value: np.ndarray) -> Key:
    """`content_key(value.T)` of a 2-D array, its transpose copied a block of rows at a time, not whole."""
    data = _normalized(np.ascontiguousarray(value)).T
    rows = max(1, _BLOCK_BYTES // max(1, data.shape[1] * data.itemsize))
    block = np.empty((min(rows, data.shape[0]), data.shape[1]), dtype=data.dtype)
    digest = hashlib.sha256()
    for start in range(0, data.shape[0], rows):
        part = block[: min(rows, data.shape[0] - start)]
        np.copyto(part, data[start : start + len(part)])
        digest.update(_as_bytes(part))
    return value.dtype.str, tuple(data.shape), digest.digest()


_BLOCK_BYTES = 4 << 20  # the transpose's working block: a few MB, reused
# itemsize -> the signed integer of that size and its minimum, whose bits are a float's -0.0 (the sign bit alone)
_SIGN_BIT: dict[int, tuple[type[np.signedinteger[Any]], int]] = {
    2: (np.int16, -(1 << 15)), 4: (np.int32, -(1 << 31)), 8: (np.int64, -(1 << 63))}


def _normalized(data: np.ndarray) -> np.ndarray:
    """`data` (contiguous) itself, or `data + 0` when it holds a -0.0 or a NaN (what the sum would change).

    Found without a temporary: -0.0 is the minimum of the same bytes read as signed integers, and a NaN
    makes the array's minimum NaN."""
    if data.size == 0 or not np.issubdtype(data.dtype, np.floating):
        return data  # nothing that `+ 0` would change
    signed = _SIGN_BIT.get(data.dtype.itemsize) if data.dtype.isnative else None
    if signed is not None and int(data.view(signed[0]).min()) != signed[1] and not np.isnan(data.min()):
        return data
    summed: np.ndarray = data + data.dtype.type(0)
    return summed


def _as_bytes(data: np.ndarray) -> memoryview:
    """The bytes of a contiguous array, without copying them."""
    return data.reshape(-1).view(np.uint8).data


class _ParameterKeys:
    """The content keys of each parameter, per dtype, and of its transpose (a 2-D one), each computed when first
    needed: a parameter's transpose only when its own key did not match. The arrays come from the reader given
    to `read_from`, only when a key is missing; `let_go` forgets both and keeps the keys, for the next graph of
    the same weights."""

    def __init__(self, shapes: dict[str, tuple[int, ...]]) -> None:
        self.shapes = shapes  # every parameter's shape, in the weights' order
        self._read: Callable[[], dict[str, np.ndarray]] | None = None
        self._weights: dict[str, np.ndarray] | None = None
        self._direct: dict[tuple[str, str], Key] = {}
        self._transposed: dict[tuple[str, str], Key | None] = {}

    def read_from(self, read: Callable[[], dict[str, np.ndarray]]) -> None:
        self._read = read

    def let_go(self) -> None:
        """Forget the arrays and their reader (neither is kept past one check); keep the keys."""
        self._weights, self._read = None, None

    def read(self) -> None:
        """The arrays, read now (and checked, by `Fixture.weights`), if they are not already."""
        if self._weights is None:
            if self._read is None:
                raise RuntimeError("_ParameterKeys: no reader for the weights (read_from)")
            self._weights = self._read()

    def shaped(self, shape: tuple[int, ...]) -> list[str]:
        """The parameters of that shape, or whose transpose has it (a 2-D parameter)."""
        return [k for k, s in self.shapes.items() if s == shape or (len(s) == 2 and s[::-1] == shape)]

    def matches(self, names: list[str], dtype: np.dtype, keys: set[Key]) -> bool:
        """Whether one of parameters `names`, as a tensor of `dtype` (the graph's), or its transpose, has a key
        in `keys`. Every direct key is tried before any transpose."""
        return any(self.direct(n, dtype) in keys for n in names) or any(
            self.transposed(n, dtype) in keys for n in names)

    def direct(self, name: str, dtype: np.dtype) -> Key:
        cache = (name, dtype.str)
        if cache not in self._direct:
            self._direct[cache] = content_key(self._array(name).astype(dtype, copy=False))
        return self._direct[cache]

    def transposed(self, name: str, dtype: np.dtype) -> Key | None:
        cache = (name, dtype.str)
        if cache not in self._transposed:
            two_d = len(self.shapes[name]) == 2
            self._transposed[cache] = transposed_key(self._array(name).astype(dtype, copy=False)) if two_d else None
        return self._transposed[cache]

    def _array(self, name: str) -> np.ndarray:
        self.read()
        assert self._weights is not None
        return self._weights[name]


# (The weights file's sha256 as the manifest holds it, the config's parameter shapes) -> the parameters' keys
# computed so far in this process: the second graph of the same weights reads and digests no parameter again.
_parameter_keys: dict[tuple[str, tuple[tuple[str, tuple[int, ...]], ...]], _ParameterKeys] = {}


def weights_checked(fixture: Fixture, path: Path) -> bool:
    """Whether `check_graph_weights(fixture, path)` already passed in this process (it would do nothing)."""
    key = _check_key(fixture, path)
    return key is not None and key in _checked


def check_graph_weights(fixture: Fixture, path: Path, model: Any = None) -> None:
    """Refuse `path` (FixtureError) when its initializers are not exactly the fixture's weights.

    Done once per graph file and weights file in a process (by the sha256 the manifest holds for each;
    a file the manifest does not hash is checked every time); `model` (`path` loaded as an
    onnx.ModelProto) saves parsing the file again. The parameters' digests are kept per weights file, so
    the weights are read only for the first graph; a GPT-2-sized copy of them is let go after the check
    (`Fixture.release_weights`)."""
    from parity_harness._backends.onnx.load import file_key, load_onnx

    key = _check_key(fixture, path)
    if key is not None and key in _checked:
        return
    if model is None:
        model = load_onnx(path, file_key(fixture, path))
    shapes = fixture.model.param_shapes()  # the family's weights: names, order, shapes (Fixture.weights checks them)
    cache = (key[2], tuple(shapes.items())) if key is not None else None
    known = _parameter_keys.get(cache) if cache is not None else None
    keys = known if known is not None else _ParameterKeys(shapes)
    keys.read_from(fixture.weights)
    try:
        if known is None:
            keys.read()  # the weights read and checked before the graph is looked at, as the first time always was
        problem = _weight_problem(model, keys)
    finally:
        keys.let_go()
        fixture.release_weights()
    if cache is not None:
        _parameter_keys[cache] = keys
    if problem is not None:
        raise FixtureError(f"{path}: {problem}: the graph does not embed the weights of {fixture.weights_path.name}; "
                           "regenerate it with `parity export`")
    if key is not None:
        _checked.add(key)


def _check_key(fixture: Fixture, path: Path) -> tuple[str, str, str] | None:
    """(graph file, its sha256, the weights file's sha256) as the manifest holds them; None if it does not hash both."""
    from parity_harness._backends.onnx.load import file_key

    graph, weights = file_key(fixture, path), file_key(fixture, fixture.weights_path)
    return None if graph is None or weights is None else (*graph, weights[1])
