"""The model's configuration (pure Python, no torch) and the parameter table it implies.

The field names are the keys of the fixture manifest's `config` object, which the TypeScript
model and every other backend read as well.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

Positions = Literal["sinusoidal", "learned"]
Activation = Literal["gelu", "gelu_new"]
ACTIVATIONS: tuple[Activation, ...] = ("gelu", "gelu_new")


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 12  # V: words in the vocabulary, end-of-sentence "." included
    n_ctx: int = 16  # longest sequence the model reads (and rows of `wpe` when learned)
    d_model: int = 8  # d: width of the residual stream
    n_layer: int = 2  # L: number of transformer blocks
    n_head: int = 2  # H: attention heads per block; d_head = d_model // n_head
    d_mlp: int = 32  # width of the MLP's hidden layer, 4 * d_model in GPT-2
    positions: Positions = "sinusoidal"  # "sinusoidal" (2017 paper, no parameters) or "learned" (GPT-2's wpe)
    ln_eps: float = 1e-5  # LayerNorm epsilon, added to the biased variance
    causal: bool = True  # causal mask; False only for the lesson's unmasked experiment
    # the MLP's activation: "gelu", the exact erf GELU (the lesson's), or "gelu_new", GPT-2's own tanh
    # approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (transformers' NewGELUActivation).
    # A manifest leaves the key out for "gelu", so every fixture made before it keeps its bytes and seal.
    activation: Activation = "gelu"

    def __post_init__(self) -> None:
        if self.d_model % self.n_head:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_head={self.n_head}")
        if self.positions == "sinusoidal" and self.d_model % 2:
            raise ValueError(f"sinusoidal positions need an even d_model, got {self.d_model}")
        if self.positions not in ("sinusoidal", "learned"):
            raise ValueError(f"positions must be 'sinusoidal' or 'learned', got {self.positions!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be 'gelu' or 'gelu_new', got {self.activation!r}")
        for name in ("vocab_size", "n_ctx", "d_model", "n_layer", "n_head", "d_mlp"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_head

    def to_dict(self) -> dict[str, Any]:
        """The manifest's `config` object: every field, but `activation` only when it is not the default "gelu"."""
        data = asdict(self)
        if self.activation == "gelu":
            del data["activation"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GPTConfig:
        """Build a config from a manifest's `config` object; unknown or missing keys are errors, but `activation`
        may be left out (the exact GELU, "gelu")."""
        return cls(**checked_fields(cls, {"activation": "gelu", **data}))


def checked_fields(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """`data` when its keys are exactly the dataclass `cls`'s fields; ValueError naming the unknown or missing ones.
    Every family's config reads a manifest's `config` object through it."""
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown config keys: {', '.join(unknown)}")
    missing = sorted(known - set(data))
    if missing:
        raise ValueError(f"missing config keys: {', '.join(missing)}")
    return data


# The lesson's toy: 12 words, d = 8, 2 blocks of 2 heads, sinusoidal positions.
TOY = GPTConfig()

# GPT-2 small, the same code at full size (learned positions, context 1,024).
GPT2_SMALL = GPTConfig(
    vocab_size=50257, n_ctx=1024, d_model=768, n_layer=12, n_head=12, d_mlp=3072, positions="learned"
)


def param_shapes(config: GPTConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter under its Hugging Face GPT-2 name, with its shape, in dataflow order.

    Conv1D weights (`c_attn`, `c_proj`, `c_fc`) are stored [in, out] and used as `x @ W + b`:
    the transpose of `nn.Linear`'s [out, in].
    """
    d, f = config.d_model, config.d_mlp
    shapes: dict[str, tuple[int, ...]] = {"wte.weight": (config.vocab_size, d)}
    if config.positions == "learned":
        shapes["wpe.weight"] = (config.n_ctx, d)
    for i in range(config.n_layer):
        p = f"h.{i}."
        shapes[p + "ln_1.weight"] = (d,)
        shapes[p + "ln_1.bias"] = (d,)
        shapes[p + "attn.c_attn.weight"] = (d, 3 * d)
        shapes[p + "attn.c_attn.bias"] = (3 * d,)
        shapes[p + "attn.c_proj.weight"] = (d, d)
        shapes[p + "attn.c_proj.bias"] = (d,)
        shapes[p + "ln_2.weight"] = (d,)
        shapes[p + "ln_2.bias"] = (d,)
        shapes[p + "mlp.c_fc.weight"] = (d, f)
        shapes[p + "mlp.c_fc.bias"] = (f,)
        shapes[p + "mlp.c_proj.weight"] = (f, d)
        shapes[p + "mlp.c_proj.bias"] = (d,)
    shapes["ln_f.weight"] = (d,)
    shapes["ln_f.bias"] = (d,)
    return shapes
