"""The Llama family's configuration (pure Python, no torch) and the parameter table it implies.

RMSNorm, rotary positions (RoPE), a SwiGLU MLP, grouped-query attention, optional attention biases and a
tied or untied unembedding. Every field that a classic Llama porting bug gets wrong is a field here: the
RoPE pairing (Meta's interleaved pairs vs Hugging Face's half split), the RoPE base, the RMSNorm eps, the
biases, the tying. The parameter names are Hugging Face `LlamaForCausalLM`'s.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

RopePairing = Literal["half", "interleaved"]


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int = 12  # V: tokens in the vocabulary
    n_ctx: int = 16  # longest sequence the model reads (RoPE tables are computed for any length)
    d_model: int = 16  # d: width of the residual stream
    n_layer: int = 2  # L: number of blocks
    n_head: int = 4  # H: query heads per block; d_head = d_model // n_head
    n_kv_heads: int = 2  # key/value heads; query head h reads kv head h // (n_head // n_kv_heads)
    d_mlp: int = 32  # width of the SwiGLU's gate and up projections
    rms_eps: float = 1e-5  # RMSNorm epsilon, added to the mean square
    rope_base: float = 10000.0  # RoPE's theta: pair j turns at base ** (-2j / d_head) radians per position
    rope_pairing: RopePairing = "half"  # "half": (j, j + d_head/2), Hugging Face; "interleaved": (2j, 2j+1), Meta
    bias: bool = False  # biases on q, k, v and o (Hugging Face's attention_bias)
    tied: bool = False  # logits read the embedding (True) or lm_head.weight (False)
    causal: bool = True  # causal mask

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_ctx", "d_model", "n_layer", "n_head", "n_kv_heads", "d_mlp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.d_model % self.n_head:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_head={self.n_head}")
        if self.n_kv_heads > self.n_head or self.n_head % self.n_kv_heads:
            raise ValueError(f"n_head={self.n_head} is not a multiple of n_kv_heads={self.n_kv_heads}")
        if self.d_head % 2:
            raise ValueError(f"RoPE needs an even d_head, got {self.d_head}")
        for name in ("rms_eps", "rope_base"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if self.rms_eps < 0:
            raise ValueError(f"rms_eps must be >= 0, got {self.rms_eps!r}")
        if self.rope_base <= 1:
            raise ValueError(f"rope_base must be above 1, got {self.rope_base!r}")
        if self.rope_pairing not in ("half", "interleaved"):
            raise ValueError(f"rope_pairing must be 'half' or 'interleaved', got {self.rope_pairing!r}")
        for name in ("bias", "tied", "causal"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_head

    @property
    def n_rep(self) -> int:
        """Query heads per key/value head."""
        return self.n_head // self.n_kv_heads

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LlamaConfig:
        """Build a config from a manifest's `config` object; unknown or missing keys are errors."""
        from parity_reference.config import checked_fields

        return cls(**checked_fields(cls, data))


# The toy Llama: d_model 16, 2 blocks of 4 query heads sharing 2 key/value heads, untied, half pairing.
TOY_LLAMA = LlamaConfig()


def param_shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter under its Hugging Face Llama name, with its shape, in dataflow order.

    Linear weights are `nn.Linear`'s [out, in], used as `x @ W.T + b`.
    """
    d, f, dh = config.d_model, config.d_mlp, config.d_head
    q_out, kv_out = config.n_head * dh, config.n_kv_heads * dh
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (config.vocab_size, d)}
    for i in range(config.n_layer):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (d,)
        for proj, out in (("q_proj", q_out), ("k_proj", kv_out), ("v_proj", kv_out)):
            shapes[p + f"self_attn.{proj}.weight"] = (out, d)
            if config.bias:
                shapes[p + f"self_attn.{proj}.bias"] = (out,)
        shapes[p + "self_attn.o_proj.weight"] = (d, q_out)
        if config.bias:
            shapes[p + "self_attn.o_proj.bias"] = (d,)
        shapes[p + "post_attention_layernorm.weight"] = (d,)
        shapes[p + "mlp.gate_proj.weight"] = (f, d)
        shapes[p + "mlp.up_proj.weight"] = (f, d)
        shapes[p + "mlp.down_proj.weight"] = (d, f)
    shapes["model.norm.weight"] = (d,)
    if not config.tied:
        shapes["lm_head.weight"] = (config.vocab_size, d)
    return shapes
