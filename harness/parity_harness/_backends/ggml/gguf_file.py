"""A fixture's model as a GGUF file, in the architecture llama.cpp knows: `llama` or `gpt2`.

The hyperparameters are the fixture's config under llama.cpp's keys; the tensors are `stored_weights.gguf_tensors`
(GGUF's names and layout, each in the type its storage format gives it); the vocabulary is a "none" tokenizer of
the fixture's size (parity feeds token ids, never text). A GPT-2 fixture with sinusoidal positions gets them as
llama.cpp's learned position table (`position_embd`, float32, the reference's own table). The bytes depend on
the fixture and the format only, and the file is written to a temporary name and renamed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from parity_harness._fixture.stored_weights import GGML_TYPE, StoredTensor, gguf_tensors

if TYPE_CHECKING:
    from parity_harness._fixture.fixture import Fixture

ARCHITECTURE = {"llama": "llama", "gpt2": "gpt2"}  # parity's family -> llama.cpp's architecture


def model_tensors(fixture: Fixture, fmt: str) -> dict[str, StoredTensor]:
    """What the file holds: every parameter (`gguf_tensors`), and a sinusoidal GPT-2's position table."""
    tensors = gguf_tensors(fixture, fmt)
    config: Any = fixture.model.config  # GPT-2's (positions) here
    if fixture.family == "gpt2" and config.positions == "sinusoidal":
        from parity_reference.numpy_model import sinusoidal_positions

        table = sinusoidal_positions(config.n_ctx, config.d_model, np.float32)  # (n_ctx, d)
        tensors["position_embd.weight"] = StoredTensor("f32", table.shape, table)
    return tensors


def _hyperparameters(writer: Any, fixture: Fixture) -> None:
    config: Any = fixture.model.config  # either family's: the keys below are read per family
    writer.add_context_length(config.n_ctx)
    writer.add_embedding_length(config.d_model)
    writer.add_block_count(config.n_layer)
    writer.add_feed_forward_length(config.d_mlp)
    writer.add_head_count(config.n_head)
    writer.add_vocab_size(config.vocab_size)
    if fixture.family == "llama":
        writer.add_head_count_kv(config.n_kv_heads)
        writer.add_layer_norm_rms_eps(config.rms_eps)
        writer.add_rope_freq_base(config.rope_base)
        writer.add_rope_dimension_count(config.d_model // config.n_head)
    else:
        writer.add_layer_norm_eps(config.ln_eps)
    writer.add_tokenizer_model("none")  # token ids are fed directly: no tokenizer, `vocab_size` dummy tokens


def write_gguf(fixture: Fixture, fmt: str, path: Path, tensors: dict[str, StoredTensor] | None = None) -> Path:
    """Write the fixture's model in storage format `fmt` ("f32", "f16", "q8_0", ...) to `path` (a temporary name,
    then renamed); `tensors` overrides what `model_tensors` would give (a test plants a bug in them)."""
    import gguf

    tensors = model_tensors(fixture, fmt) if tensors is None else tensors
    partial = path.with_name(path.name + ".partial")
    writer = gguf.GGUFWriter(partial, ARCHITECTURE[fixture.family])
    try:
        writer.add_name("parity fixture")
        _hyperparameters(writer, fixture)
        for name, tensor in tensors.items():
            if tensor.kind in ("f32", "f16"):
                writer.add_tensor(name, tensor.data)
            else:
                writer.add_tensor(name, tensor.data, raw_dtype=gguf.GGMLQuantizationType[GGML_TYPE[tensor.kind]])
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    os.replace(partial, path)
    return path
