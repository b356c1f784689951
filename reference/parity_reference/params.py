"""Parameter counts: the seed's formula, and the same count taken from real PyTorch modules.

    python -m parity_reference.params

The seed's table, for V words, d numbers per list, L blocks, ctx learned positions and an MLP
d -> d_mlp -> d (d_mlp = 4d unless given):

    embeddings     V*d + ctx*d            (ctx*d = 0 with sinusoidal positions)
    attention      L*(4*d^2 + 4*d)        c_attn [d, 3d] + [3d], c_proj [d, d] + [d]
    MLP            L*(2*d*d_mlp + d_mlp + d)   = L*(8*d^2 + 5*d) when d_mlp = 4d
    norms          (4*L + 2)*d            two LayerNorms per block and ln_f, gain and bias each

The unembedding reuses `wte` (tied), so it adds nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from parity_reference.config import GPT2_SMALL, TOY, GPTConfig

if TYPE_CHECKING:
    from torch import nn

PARTS = ("embeddings", "attention", "mlp", "norms")


def breakdown(V: int, d: int, L: int, ctx: int, d_mlp: int | None = None) -> dict[str, int]:
    """The formula's count per part (see the module docstring); `ctx` = 0 for sinusoidal positions."""
    f = 4 * d if d_mlp is None else d_mlp
    return {
        "embeddings": V * d + ctx * d,
        "attention": L * (4 * d * d + 4 * d),
        "mlp": L * (2 * d * f + f + d),
        "norms": (4 * L + 2) * d,
    }


def n_params(V: int, d: int, L: int, ctx: int, d_mlp: int | None = None) -> int:
    """The seed's formula: V*d + ctx*d + L*(4d^2+4d) + L*(2*d*d_mlp + d_mlp + d) + (4L+2)*d."""
    return sum(breakdown(V, d, L, ctx, d_mlp).values())


def config_breakdown(config: GPTConfig) -> dict[str, int]:
    """The formula applied to a config: ctx counts only when positions are learned."""
    ctx = config.n_ctx if config.positions == "learned" else 0
    return breakdown(config.vocab_size, config.d_model, config.n_layer, ctx, config.d_mlp)


def part_of(name: str) -> str:
    """Which part of the table a parameter (Hugging Face name) belongs to."""
    if name in ("wte.weight", "wpe.weight"):
        return "embeddings"
    if ".attn." in name:
        return "attention"
    if ".mlp." in name:
        return "mlp"
    if name.startswith("ln_f.") or ".ln_1." in name or ".ln_2." in name:
        return "norms"
    raise ValueError(f"parameter {name!r} belongs to no part of the table")


def count_module(module: nn.Module) -> dict[str, int]:
    """Count a module's parameters, grouped by `part_of` their names."""
    counts = dict.fromkeys(PARTS, 0)
    for name, p in module.named_parameters():
        counts[part_of(name)] += p.numel()
    return counts


def count_config(config: GPTConfig, device: str = "cpu") -> dict[str, int]:
    """Build `parity_reference.model.GPT(config)` (random weights) and count its parameters by part.

    `device="meta"` builds the same modules with shapes only (no memory, instant): for tests.
    """
    import torch

    from parity_reference.model import GPT

    with torch.device(device):
        model = GPT(config)
    return count_module(model)


def block_breakdown(config: GPTConfig) -> dict[str, int]:
    """One block of a config, counted from modules: attention, MLP, the two LayerNorms."""
    import torch

    from parity_reference.model import BlockParams

    with torch.device("meta"):
        blk = BlockParams(config)
    counts = {"attention": 0, "mlp": 0, "norms": 0}
    for name, p in blk.named_parameters():
        counts[part_of("h.0." + name)] += p.numel()
    return counts


def _row(label: str, parts: dict[str, int]) -> str:
    cells = "".join(f"{parts[k]:>18,}" for k in PARTS)
    return f"{label:44s}{cells}{sum(parts.values()):>20,}"


def main() -> int:
    header = f"{'':44s}" + "".join(f"{k:>18s}" for k in PARTS) + f"{'total':>20s}"
    print(header)
    toy_learned = GPTConfig(**{**TOY.to_dict(), "positions": "learned"})
    for label, config in (
        ("toy, sinusoidal positions", TOY),
        (f"toy, learned positions (ctx={TOY.n_ctx})", toy_learned),
        ("GPT-2 small (ctx=1,024)", GPT2_SMALL),
    ):
        print(_row(f"{label}: formula", config_breakdown(config)))
        print(_row(f"{label}: counted", count_config(config)))
    blk = block_breakdown(GPT2_SMALL)
    print(
        f"\none GPT-2 small block (counted): attention {blk['attention']:,} + MLP {blk['mlp']:,} "
        f"+ two LNs {blk['norms']:,} = {sum(blk.values()):,}"
    )
    print("\nthe formula with GPT-2's vocabulary (50,257) and ctx = 2,048:")
    print(_row("d=768, L=12", breakdown(50257, 768, 12, 2048)))
    print(_row("d=12,288, L=96", breakdown(50257, 12288, 96, 2048)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
