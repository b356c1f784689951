"""The activation taps: TransformerLens hook names, shapes, and their dataflow order (pure Python).

One sequence, no batch axis. The order of `tap_names` is the dataflow order: "the first
diverging tap" always means the first in this list.
"""

from __future__ import annotations

from parity_reference.config import GPTConfig

# Per-block taps, in dataflow order, relative to "blocks.{i}.".
BLOCK_TAPS = (
    "hook_resid_pre",
    "ln1.hook_scale",
    "ln1.hook_normalized",
    "attn.hook_q",
    "attn.hook_k",
    "attn.hook_v",
    "attn.hook_attn_scores",
    "attn.hook_pattern",
    "attn.hook_z",
    "hook_attn_out",
    "hook_resid_mid",
    "ln2.hook_scale",
    "ln2.hook_normalized",
    "mlp.hook_pre",
    "mlp.hook_post",
    "hook_mlp_out",
    "hook_resid_post",
)


def tap_names(n_layer: int) -> list[str]:
    """Every tap name for a model of `n_layer` blocks, in dataflow order."""
    names = ["hook_embed", "hook_pos_embed"]
    for i in range(n_layer):
        names += [f"blocks.{i}.{t}" for t in BLOCK_TAPS]
    names += ["ln_final.hook_scale", "ln_final.hook_normalized", "logits", "probs"]
    names += [f"logit_lens.{k}" for k in range(n_layer + 1)]
    return names


def tap_shape_template(config: GPTConfig, tap: str) -> list[int | str]:
    """A tap's shape with "T" standing for the sequence length, as stored in the manifest."""
    d, h, dh, f, v = config.d_model, config.n_head, config.d_head, config.d_mlp, config.vocab_size
    leaf = tap.split(".", 2)[-1] if tap.startswith("blocks.") else tap
    if tap.startswith("logit_lens.") or tap in ("logits", "probs"):
        return ["T", v]
    if leaf.endswith("hook_scale"):
        return ["T", 1]
    if leaf in ("attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_z"):
        return ["T", h, dh]
    if leaf in ("attn.hook_attn_scores", "attn.hook_pattern"):
        return [h, "T", "T"]
    if leaf in ("mlp.hook_pre", "mlp.hook_post"):
        return ["T", f]
    return ["T", d]


def tap_shape(config: GPTConfig, tap: str, seq_len: int) -> tuple[int, ...]:
    """A tap's concrete shape for a sequence of `seq_len` tokens."""
    return tuple(seq_len if s == "T" else int(s) for s in tap_shape_template(config, tap))
