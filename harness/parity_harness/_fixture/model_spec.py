"""A fixture's model: its family's table and its config, the one place a tap's facts are read from.

The manifest names a family (`"family"`, absent in the GPT-2 fixtures written before families: "gpt2") and that
family's `config`. The family's table (`parity_reference/families/{family}.json`, `parity_reference.families`)
gives each tap's name, shape, axes, the axis `rows` cuts, its bounds and its layer; nothing here re-derives a
fact from a tap's name. The config class is the family's (`GPTConfig`, `LlamaConfig`), built from the
manifest's `config` object by its own `from_dict`, and its module's `param_shapes` gives the weights' names.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from parity_reference.families import Family, FamilyError, family_names, load_family

if TYPE_CHECKING:
    from parity_reference.families import ModelConfig

DEFAULT_FAMILY = "gpt2"  # a manifest without "family" (every fixture written before families)


@cache
def family(name: str) -> Family:
    """A built-in family's table; FamilyError (one line) for an unknown name."""
    if name not in family_names():
        raise FamilyError(f"unknown model family {name!r} (built in: {', '.join(family_names())})")
    return load_family(name)


def config_from(family_name: str, raw: Mapping[str, Any]) -> ModelConfig:
    """The family's config class built from a manifest's `config` object; TypeError/ValueError when it is wrong."""
    module, _, cls = family(family_name).config.rpartition(".")
    config_class = getattr(importlib.import_module(module), cls)
    config: ModelConfig = config_class.from_dict(dict(raw))
    return config


@dataclass(frozen=True)
class ModelSpec:
    """A family and a config: every question the harness asks about a tap, a weight or a decoding step."""

    family: Family
    config: ModelConfig

    @property
    def name(self) -> str:
        return self.family.name

    def tap_names(self) -> list[str]:
        return self.family.tap_names(self.config)

    def shape_template(self, tap: str) -> list[int | str]:
        return self.family.shape_template(self.config, tap)

    def tap_shape(self, tap: str, seq_len: int) -> tuple[int, ...]:
        return tuple(seq_len if s == "T" else int(s) for s in self.shape_template(tap))

    def axis_names(self, tap: str) -> list[str]:
        return self.family.axis_names(self.config, tap)

    def rows_axis(self, tap: str) -> int | None:
        return self.family.rows_axis(tap)

    def value_range(self, tap: str) -> tuple[float, float] | None:
        return self.family.value_range(self.config, tap)

    def layer_taps(self, layer: str) -> list[str]:
        """The full tap names `run_layer(..., layer, ...)` returns: "blocks.{i}.attn", "blocks.{i}.mlp", "unembed"."""
        if layer == "unembed":
            return list(self.family.sublayer_taps("unembed"))
        block, _, part = layer.rpartition(".")
        return [f"{block}.{t}" for t in self.family.sublayer_taps(part)]

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """The weights under Hugging Face names, in order, with their shapes (the config module's table)."""
        shapes: dict[str, tuple[int, ...]] = importlib.import_module(type(self.config).__module__).param_shapes(
            self.config)
        return shapes

    def decode_tap_names(self) -> list[str]:
        return decode_tap_names(self.config.n_layer)

    def decode_tap_shape(self, tap: str, n_pos: int) -> tuple[int, ...]:
        """[cache heads, T, d_head] for a cache tap holding T positions (the family's `cache_heads`: n_head, or
        n_kv_heads with grouped-query attention), [V] for the logits."""
        if tap == "logits":
            return (self.config.vocab_size,)
        return (int(getattr(self.config, self.family.decoding["cache_heads"])), n_pos, self.config.d_head)

    def cache_sources(self) -> tuple[str, str]:
        """The forward taps the decoding cache holds, relative to "blocks.{i}.": keys, values."""
        return self.family.decoding["cache_keys"], self.family.decoding["cache_values"]

    def code(self, role: str) -> Any:
        """The family's module for a role (`parity_reference.families.CODE_ROLES`): "torch", "authoring", ..."""
        return self.family.module(role)


def decode_tap_names(n_layer: int) -> list[str]:
    """The taps of one decoding step, in dataflow order: each block's cache keys and values, then logits."""
    names: list[str] = []
    for i in range(n_layer):
        names += [f"blocks.{i}.attn.cache_k", f"blocks.{i}.attn.cache_v"]
    return [*names, "logits"]


def model_spec(family_name: str, config: ModelConfig) -> ModelSpec:
    return ModelSpec(family(family_name), config)
