"""The activation taps: TransformerLens hook names, shapes, and their dataflow order (pure Python).

One sequence, no batch axis. The taps are the GPT-2 family's table, `parity_reference/families/gpt2.json`
(read by `parity_reference.families`): this module asks it, so the tap list is written once. The order of
`tap_names` is the dataflow order: "the first diverging tap" always means the first in this list.
"""

from __future__ import annotations

from types import SimpleNamespace

from parity_reference.config import GPTConfig
from parity_reference.families import load_family

# Per-block taps, in dataflow order, relative to "blocks.{i}." (the table's rows with a layer).
BLOCK_TAPS = tuple(t.name.removeprefix("blocks.{i}.") for t in load_family("gpt2").taps if t.layer == "i")


def tap_names(n_layer: int) -> list[str]:
    """Every tap name for a model of `n_layer` blocks, in dataflow order."""
    return load_family("gpt2").tap_names(SimpleNamespace(n_layer=n_layer))


def tap_shape_template(config: GPTConfig, tap: str) -> list[int | str]:
    """A tap's shape with "T" standing for the sequence length, as stored in the manifest."""
    return load_family("gpt2").shape_template(config, tap)


def tap_shape(config: GPTConfig, tap: str, seq_len: int) -> tuple[int, ...]:
    """A tap's concrete shape for a sequence of `seq_len` tokens."""
    return tuple(seq_len if s == "T" else int(s) for s in tap_shape_template(config, tap))
