"""The fp16 graph the `onnxruntime` backend runs: the fixture's fp32 all-taps graph converted to float16.

`fp16_graph(path)` reads `model.onnx` (the caller has already checked it and its weights against the
fixture: the check applies to this fp32 source, `weights.py`), converts it with the converter that ships
inside onnxruntime, `onnxruntime.transformers.float16.convert_float_to_float16` (no new dependency), and
returns the converted model's bytes, checked, serialized by `clean.graph_bytes` (no exporter metadata):

- `keep_io_types=False`: the input stays int64 token ids (the converter touches float32 only) and every
  output (every tap) becomes float16, so each tap leaves on the fp16 grid; the backend widens it to
  the float32 container (exact);
- `op_block_list=OP_BLOCK_LIST`, empty: no op of the graph stays in float32 (docs/backends.md,
  "onnxruntime in fp16", says why per op). The graph's float64 subgraph (the sinusoidal positions:
  Range, Mul, Sin, Cos) is not float32 and stays float64; its Cast to float32 becomes a Cast to float16;
- the result keeps the contract of the source (`check_onnx_model`: input `tokens`, the manifest's taps
  as outputs) and every output is float16; anything else is a BackendFailed naming the file.

Converted once per process and source graph: the cache is in memory, keyed by the sha256 of the
source file's bytes (never by its path). Conversion takes well under a second on the fixtures parity
ships, so there is no cross-run cache.

`onnxruntime.transformers/__init__.py` appends its own directory to `sys.path`; `sys.path` is restored
after the import so that nothing else in the process can import its modules by their bare names.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from parity_harness._core.errors import BackendFailed

if TYPE_CHECKING:
    from parity_harness._backends.onnx.graph import Runner

# Op types left in float32 by the converter: none (docs/backends.md, "onnxruntime in fp16").
OP_BLOCK_LIST: tuple[str, ...] = ()
FLOAT16 = 10  # onnx.TensorProto.FLOAT16

_converted: dict[str, bytes] = {}  # sha256 of the fp32 source graph's bytes -> the fp16 graph's bytes


def fp16_graph(path: Path, tap_names: Sequence[str]) -> bytes:
    """The fp16 conversion of the all-taps graph at `path` (serialized), converted once per content."""
    data = path.read_bytes()
    key = hashlib.sha256(data).hexdigest()
    if key not in _converted:
        _converted[key] = convert(data, path, tap_names)
    return _converted[key]


def convert(data: bytes, path: Path, tap_names: Sequence[str],
            edit: Callable[[Any], None] | None = None) -> bytes:
    """Convert the serialized fp32 graph `data` (read from `path`) to fp16 and check the result.

    `edit`, if given, changes the converted model in place before it is checked (the tests plant errors)."""
    import onnx

    from parity_harness._backends.onnx.clean import graph_bytes
    from parity_harness._backends.onnx.graph import check_onnx_model
    from parity_harness._backends.onnx.load import first_line
    from parity_harness._core.errors import FixtureError

    convert_float_to_float16 = _converter()
    try:
        model = convert_float_to_float16(onnx.load_from_string(data), keep_io_types=False,
                                         op_block_list=list(OP_BLOCK_LIST))
    except Exception as exc:  # the converter raises what onnx raises (shape inference, ...)
        raise BackendFailed(f"{path}: cannot convert the graph to fp16 ({first_line(exc)})") from None
    if edit is not None:
        edit(model)
    try:
        check_onnx_model(model, path, tap_names, "all_taps")
    except FixtureError as exc:
        raise BackendFailed(f"fp16 conversion of {exc}") from None
    wrong = [o.name for o in model.graph.output if o.type.tensor_type.elem_type != FLOAT16]
    if wrong:
        raise BackendFailed(f"{path}: the fp16 conversion left {len(wrong)} outputs not float16 ({wrong[:3]})")
    return graph_bytes(model)  # the one serializer of a graph parity makes (clean.py)


def _converter() -> Any:
    """onnxruntime's convert_float_to_float16, imported without leaving its directory on sys.path."""
    saved = list(sys.path)
    try:
        from onnxruntime.transformers.float16 import convert_float_to_float16
    finally:
        sys.path[:] = saved
    return convert_float_to_float16


def fp16_outputs(runner: Runner) -> Runner:
    """`runner`, refusing any output that is not float16 (a crash of that case: BackendFailed)."""
    import numpy as np

    def run(tokens: np.ndarray) -> list[np.ndarray]:
        values = runner(tokens)
        wrong = [i for i, v in enumerate(values) if np.asarray(v).dtype != np.float16]
        if wrong:
            raise TypeError(f"output #{wrong[0]} is {np.asarray(values[wrong[0]]).dtype}, not float16")
        return values

    return run
