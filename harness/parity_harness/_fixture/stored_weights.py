"""Stored weight formats: the fixture's weights as a GGUF file stores them (f16, q8_0, q4_0, q4_k).

`parity run --precision q8_0` means "the weights as q8_0 stores them, computed in float32": what a runtime
like llama.cpp is given. Judged against the fixture's own golden, a quantized model "fails" everywhere by an
amount that says nothing about the runtime; so parity judges it against the truth of the weights it was given:

- `gguf_tensors(fixture, fmt)`: every parameter in GGUF's layout and name (`GGUF_LAYOUT`: llama.cpp's names,
  nn.Linear's [out, in]; Llama's q/k rows permuted to llama.cpp's interleaved RoPE pairs, as its converter does),
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
import functools
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from parity_harness._core.errors import ParityError

if TYPE_CHECKING:
    from parity_harness._fixture.fixture import Fixture

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


# -- GGUF's layout: each family's parameter names and the transform into llama.cpp's layout and back ----------

Transform = Callable[[np.ndarray], np.ndarray]


def _same(x: np.ndarray) -> np.ndarray:
    return x


def _transpose(x: np.ndarray) -> np.ndarray:  # GPT-2's Conv1D [in, out] <-> GGUF's [out, in]
    return np.ascontiguousarray(x.T)


def interleave_rows(x: np.ndarray, heads: int) -> np.ndarray:
    """Llama's q/k rows from Hugging Face's half-split RoPE pairs (d, d + d_head/2) to llama.cpp's interleaved
    ones (2i, 2i + 1), head by head: convert_hf_to_gguf.py's `permute`. x: [heads * d_head, ...]."""
    return x.reshape(heads, 2, x.shape[0] // heads // 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)


def half_split_rows(x: np.ndarray, heads: int) -> np.ndarray:
    """The inverse of `interleave_rows`: llama.cpp's interleaved rows back to Hugging Face's half-split ones."""
    return x.reshape(heads, x.shape[0] // heads // 2, 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)


@dataclasses.dataclass(frozen=True)
class LayoutEntry:
    """One parameter: its GGUF name, and the transforms from Hugging Face's layout to GGUF's and back."""

    gguf: str
    to_gguf: Transform = _same
    from_gguf: Transform = _same


def gguf_layout(fixture: Fixture) -> dict[str, LayoutEntry]:
    """Every parameter of the fixture (Hugging Face name) -> its GGUF name and layout transforms; ParityError for a
    family llama.cpp's architectures do not cover."""
    config, names = fixture.model.config, list(fixture.model.param_shapes())
    if fixture.family == "llama":
        return {name: _llama_entry(name, config) for name in names}
    if fixture.family == "gpt2":
        return {name: _gpt2_entry(name) for name in names}
    raise ParityError(f"the {fixture.family} family has no GGUF layout (llama.cpp's gpt2 and llama only)")


_LLAMA_BLOCK = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
                "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                "mlp.down_proj": "ffn_down"}
_LLAMA_TOP = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


def _llama_entry(name: str, config: Any) -> LayoutEntry:
    stem, kind = name.rsplit(".", 1)  # kind: weight or bias
    if stem in _LLAMA_TOP:
        return LayoutEntry(f"{_LLAMA_TOP[stem]}.{kind}")
    _, _, layer, part = stem.split(".", 3)  # model.layers.{i}.{part}
    gguf = f"blk.{layer}.{_LLAMA_BLOCK[part]}.{kind}"
    heads = {"self_attn.q_proj": config.n_head, "self_attn.k_proj": config.n_kv_heads}.get(part)
    if heads is None or config.rope_pairing != "half":  # llama.cpp's `llama` RoPE pairs neighbours (2i, 2i + 1)
        return LayoutEntry(gguf)
    return LayoutEntry(gguf, functools.partial(interleave_rows, heads=heads),
                       functools.partial(half_split_rows, heads=heads))


_GPT2_BLOCK = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output", "ln_2": "ffn_norm",
               "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
_GPT2_TOP = {"wte": "token_embd", "wpe": "position_embd", "ln_f": "output_norm"}


def _gpt2_entry(name: str) -> LayoutEntry:
    stem, kind = name.rsplit(".", 1)
    if stem in _GPT2_TOP:
        return LayoutEntry(f"{_GPT2_TOP[stem]}.{kind}")
    _, layer, part = stem.split(".", 2)  # h.{i}.{part}
    conv1d = kind == "weight" and part in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
    return LayoutEntry(f"blk.{layer}.{_GPT2_BLOCK[part]}.{kind}", *((_transpose, _transpose) if conv1d else ()))


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
        raise ParityError("the stored weight formats need the gguf package: pip install 'parity-harness[llama-cpp]' "
                          "(or gguf==0.19.0)")


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
