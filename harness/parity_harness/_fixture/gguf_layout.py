"""GGUF's layout of a fixture's parameters: llama.cpp's tensor names, and the transforms into its layout and back.

Each model family's table names a `gguf` module (`gpt2_gguf.py`, `llama_gguf.py`) whose `layout(config, names)`
maps every parameter (Hugging Face name) to a `LayoutEntry`: its GGUF name, and the transforms from Hugging Face's
layout to GGUF's ([rows, row length], the row the axis a quantization block runs along) and back. The transforms
shared by the families live here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from parity_harness._fixture.fixture import Fixture

Transform = Callable[[np.ndarray], np.ndarray]


def same(x: np.ndarray) -> np.ndarray:
    """No change: the parameter is in GGUF's layout already (nn.Linear's [out, in], a vector)."""
    return x


def transpose(x: np.ndarray) -> np.ndarray:
    """A Conv1D weight [in, out] <-> GGUF's [out, in] (its own inverse)."""
    return np.ascontiguousarray(x.T)


def interleave_rows(x: np.ndarray, heads: int) -> np.ndarray:
    """Rows of a RoPE'd projection from Hugging Face's half-split pairs (i, i + d_head/2) to llama.cpp's interleaved
    ones (2i, 2i + 1), head by head: convert_hf_to_gguf.py's `permute`. x: [heads * d_head, ...]."""
    return x.reshape(heads, 2, x.shape[0] // heads // 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)


def half_split_rows(x: np.ndarray, heads: int) -> np.ndarray:
    """The inverse of `interleave_rows`: llama.cpp's interleaved rows back to Hugging Face's half-split ones."""
    return x.reshape(heads, x.shape[0] // heads // 2, 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)


@dataclasses.dataclass(frozen=True)
class LayoutEntry:
    """One parameter: its GGUF name, and the transforms from Hugging Face's layout to GGUF's and back."""

    gguf: str
    to_gguf: Transform = same
    from_gguf: Transform = same


def gguf_layout(fixture: Fixture) -> dict[str, LayoutEntry]:
    """Every parameter of the fixture (Hugging Face name) -> its GGUF name and layout transforms, from the family's
    `gguf` module."""
    names = list(fixture.model.param_shapes())
    layout: dict[str, LayoutEntry] = fixture.model.family.module("gguf").layout(fixture.model.config, names)
    return layout
