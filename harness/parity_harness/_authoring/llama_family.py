"""The Llama family's authoring code: what making a Llama fixture needs beyond its reference (the family table's
`authoring` module, `parity_reference/families/llama.json`).

- `graph_constants` and `constants_in_use`: the ONNX graphs hold the RoPE tables as two constants
  (`ROPE_CONSTANTS`, (n_ctx, d_head/2) each, made by the reference's own `rope_tables` in float64 and rounded
  once to float32), and while tracing, `llama_model.rope_tables(n, ...)` returns their first n rows (the numbers
  `rope_tables(n, ...)` gives: each angle is pos * inv_freq, whatever n). Without them the graph would compute
  float64 Cos and Sin itself, which OpenVINO computes in float32.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from parity_harness._backends.onnx.weights import ROPE_CONSTANTS

if TYPE_CHECKING:
    from parity_reference.llama_config import LlamaConfig


def graph_constants(config: LlamaConfig) -> dict[str, Any]:
    """The RoPE tables (float32 tensors, (n_ctx, d_head/2) each) an exported graph holds as constants."""
    import torch

    from parity_reference import llama_model

    cos_table, sin_table = llama_model.rope_tables(config.n_ctx, config.d_head, config.rope_base, torch.float32)
    return {ROPE_CONSTANTS[0]: cos_table, ROPE_CONSTANTS[1]: sin_table}


@contextlib.contextmanager
def constants_in_use(constants: Mapping[str, Any]) -> Iterator[None]:
    """While tracing: `llama_model.rope_tables(n, ...)` returns the first n rows of the graph's constant tables
    (in the computation's dtype), so the graph reads constants instead of computing Cos and Sin."""
    from parity_reference import llama_model

    cos_table, sin_table = constants[ROPE_CONSTANTS[0]], constants[ROPE_CONSTANTS[1]]
    original = llama_model.rope_tables

    def tables(n_pos: int, d_head: int, base: float, dtype: Any) -> tuple[Any, Any]:
        return cos_table[:n_pos].to(dtype), sin_table[:n_pos].to(dtype)

    llama_model.rope_tables = tables  # type: ignore[assignment]
    try:
        yield
    finally:
        llama_model.rope_tables = original  # type: ignore[assignment]
