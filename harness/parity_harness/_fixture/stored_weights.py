"""Stored weight formats: the fixture's weights as a GGUF file stores them (f16, q8_0, q4_0, q4_k).

`parity run --precision q8_0` means "the weights as q8_0 stores them, computed in float32": what a runtime
like llama.cpp is given. Judged against the fixture's own golden, a quantized model "fails" everywhere by an
amount that says nothing about the runtime; so parity judges it against the truth of the weights it was given:

- `gguf_tensors(fixture, fmt)`: every parameter in GGUF's layout and name (`gguf_layout.py`, from the family's
  `gguf` module: llama.cpp's names, nn.Linear's [out, in], rows permuted where llama.cpp's converter does),
  each stored in the type `storage_type` picks, quantized by the `gguf` package's reference code (`q4_k`:
  parity's own quantizer, `q4_k.py`, since `gguf` has none), as the bytes the file holds;
- `stored_weights(fixture, fmt)`: those same bytes dequantized by the `gguf` package's reference code, back under
  Hugging Face names and layout: the float32 weights the goldens of the format are computed from
  (`stored_goldens.py`), exactly the numbers the runtime's file holds.

`storage_type` is llama.cpp's own rule (llama-quant.cpp, `tensor_type_fallback`): 1-D tensors (norm gains,
biases) stay F32; a matrix is stored in the format when the format's blocks divide its rows (32 values for
q8_0 and q4_0, 256 for q4_k), else q4_k falls back to q5_0, and what still does not divide is stored F16.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from parity_harness._core.errors import ParityError
from parity_harness._fixture.gguf_layout import LayoutEntry, gguf_layout, half_split_rows, interleave_rows

if TYPE_CHECKING:
    from parity_harness._fixture.fixture import Fixture

__all__ = ["STORED_FORMATS", "LayoutEntry", "StoredTensor", "dequantized", "gguf_layout", "gguf_tensors",
           "half_split_rows", "interleave_rows", "is_stored", "storage_summary", "storage_type", "store",
           "stored_weights"]

StoredFormat = Literal["f16", "q8_0", "q4_0", "q4_k"]
STORED_FORMATS: tuple[StoredFormat, ...] = ("f16", "q8_0", "q4_0", "q4_k")
# The GGML type of each format (gguf.GGMLQuantizationType's names), and the values one block holds.
GGML_TYPE: dict[str, str] = {"f32": "F32", "f16": "F16", "q8_0": "Q8_0", "q4_0": "Q4_0", "q5_0": "Q5_0",
                             "q4_k": "Q4_K"}
BLOCK: dict[str, int] = {"f32": 1, "f16": 1, "q8_0": 32, "q4_0": 32, "q5_0": 32, "q4_k": 256}
FALLBACK: dict[str, str] = {"q4_k": "q5_0"}  # llama.cpp's: a 256-block type whose blocks do not fit a row


def is_stored(precision: str) -> bool:
    """True for a stored weight format (computed in float32 from weights as the format stores them)."""
    return precision in STORED_FORMATS


def storage_type(fmt: str, shape: tuple[int, ...]) -> str:
    """The type a tensor of GGUF layout `shape` ([rows, row length]) is stored in under format `fmt`: "f32" for
    1-D tensors, else the format if its blocks divide the row length, else its fallback, else "f16"."""
    if len(shape) < 2:
        return "f32"
    for kind in (fmt, FALLBACK.get(fmt)):
        if kind is not None and shape[-1] % BLOCK[kind] == 0:
            return kind
    return "f16"


# -- the bytes and their dequantization ----------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class StoredTensor:
    """One tensor as the GGUF file holds it: its type ("f32", "f16", "q8_0", ...), its GGUF-layout shape, and
    its data (float32 or float16 values, or the quantized blocks as uint8 rows)."""

    kind: str
    shape: tuple[int, ...]
    data: np.ndarray


def _ggml_type(kind: str) -> Any:
    import gguf

    return gguf.GGMLQuantizationType[GGML_TYPE[kind]]


def store(array: np.ndarray, kind: str) -> StoredTensor:
    """A float32 GGUF-layout array stored as `kind`: float32, float16, or quantized blocks (`gguf.quants`;
    q4_k: `q4_k.quantize_q4_k`)."""
    if kind == "f32":
        return StoredTensor(kind, array.shape, np.ascontiguousarray(array, dtype=np.float32))
    if kind == "q4_k":
        from parity_harness._fixture.q4_k import quantize_q4_k

        return StoredTensor(kind, array.shape, quantize_q4_k(np.ascontiguousarray(array, dtype=np.float32)))
    from gguf.quants import quantize

    return StoredTensor(kind, array.shape, quantize(np.ascontiguousarray(array, dtype=np.float32), _ggml_type(kind)))


def dequantized(tensor: StoredTensor) -> np.ndarray:
    """The float32 values a stored tensor holds: the `gguf` package's reference dequantization of its bytes."""
    if tensor.kind == "f32":
        return tensor.data
    if tensor.kind == "f16":
        return tensor.data.astype(np.float32)
    from gguf.quants import dequantize

    return np.asarray(dequantize(tensor.data, _ggml_type(tensor.kind)), dtype=np.float32).reshape(tensor.shape)


def _require_gguf() -> None:
    """ParityError (one line) when the `gguf` package, which quantizes and dequantizes, is not installed."""
    import importlib.util

    if importlib.util.find_spec("gguf") is None:
        raise ParityError("the stored weight formats need the gguf package: pip install gguf==0.19.0")


def gguf_tensors(fixture: Fixture, fmt: str) -> dict[str, StoredTensor]:
    """Every parameter as a GGUF file of format `fmt` stores it ("f32": the fixture's float32 weights), by GGUF
    name, in the fixture's parameter order. ParityError when the `gguf` package is missing."""
    if fmt != "f32":
        _require_gguf()
    layout, weights = gguf_layout(fixture), fixture.weights()
    out: dict[str, StoredTensor] = {}
    for name, entry in layout.items():
        array = entry.to_gguf(np.asarray(weights[name], dtype=np.float32))  # GGUF layout: [rows, row length]
        out[entry.gguf] = store(array, "f32" if fmt == "f32" else storage_type(fmt, array.shape))
    return out


def stored_weights(fixture: Fixture, fmt: str) -> dict[str, np.ndarray]:
    """The float32 weights, under Hugging Face names and layout, that a GGUF file of format `fmt` holds: every
    tensor quantized (`gguf_tensors`) and dequantized by the `gguf` package's reference code."""
    layout, tensors = gguf_layout(fixture), gguf_tensors(fixture, fmt)
    return {name: np.ascontiguousarray(entry.from_gguf(dequantized(tensors[entry.gguf])))
            for name, entry in layout.items()}


def storage_summary(tensors: Mapping[str, StoredTensor]) -> dict[str, int]:
    """How many tensors each type holds ({"q8_0": 14, "f32": 17}), for the report's line on a stored format."""
    counts: dict[str, int] = {}
    for tensor in tensors.values():
        counts[tensor.kind] = counts.get(tensor.kind, 0) + 1
    return dict(sorted(counts.items()))
