"""The GPT-2 family's GGUF layout: llama.cpp's `gpt2` architecture's tensor names, Conv1D weights transposed.

The family table's `gguf` module (parity_harness/_fixture/gguf_layout.py reads it). The tied unembedding has no
tensor of its own: llama.cpp's `gpt2` graph reads `token_embd` when `output` is absent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from parity_harness._fixture.gguf_layout import LayoutEntry, transpose

BLOCK = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output", "ln_2": "ffn_norm",
         "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
TOP = {"wte": "token_embd", "wpe": "position_embd", "ln_f": "output_norm"}
CONV1D = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")  # [in, out]: transposed to GGUF's [out, in]


def entry(name: str) -> LayoutEntry:
    """One parameter's GGUF name and transforms."""
    stem, kind = name.rsplit(".", 1)  # kind: weight or bias
    if stem in TOP:
        return LayoutEntry(f"{TOP[stem]}.{kind}")
    _, layer, part = stem.split(".", 2)  # h.{i}.{part}
    gguf = f"blk.{layer}.{BLOCK[part]}.{kind}"
    return LayoutEntry(gguf, transpose, transpose) if kind == "weight" and part in CONV1D else LayoutEntry(gguf)


def layout(config: Any, names: Sequence[str]) -> dict[str, LayoutEntry]:
    """Every parameter's entry, in the order given."""
    return {name: entry(name) for name in names}
