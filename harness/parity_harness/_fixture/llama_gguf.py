"""The Llama family's GGUF layout: llama.cpp's `llama` architecture's tensor names, q/k rows interleaved.

The family table's `gguf` module (parity_harness/_fixture/gguf_layout.py reads it). llama.cpp's `llama` RoPE pairs
neighbouring dims (2i, 2i + 1); a fixture with Hugging Face's half-split pairing gets its q and k rows permuted,
as llama.cpp's converter does (`interleave_rows`), and a backend permutes the taps back.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from parity_harness._fixture.gguf_layout import LayoutEntry, half_split_rows, interleave_rows

BLOCK = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
TOP = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


def entry(name: str, config: Any) -> LayoutEntry:
    """One parameter's GGUF name and transforms."""
    stem, kind = name.rsplit(".", 1)  # kind: weight or bias
    if stem in TOP:
        return LayoutEntry(f"{TOP[stem]}.{kind}")
    _, _, layer, part = stem.split(".", 3)  # model.layers.{i}.{part}
    gguf = f"blk.{layer}.{BLOCK[part]}.{kind}"
    heads = {"self_attn.q_proj": config.n_head, "self_attn.k_proj": config.n_kv_heads}.get(part)
    if heads is None or config.rope_pairing != "half":
        return LayoutEntry(gguf)
    return LayoutEntry(gguf, functools.partial(interleave_rows, heads=heads),
                       functools.partial(half_split_rows, heads=heads))


def layout(config: Any, names: Sequence[str]) -> dict[str, LayoutEntry]:
    """Every parameter's entry, in the order given."""
    return {name: entry(name, config) for name in names}
