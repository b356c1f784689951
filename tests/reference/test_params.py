"""Parameter counts: the seed's formula against modules actually built, and the seed's numbers."""

from __future__ import annotations

import dataclasses
import math

import pytest

from parity_reference.config import GPT2_SMALL, TOY, param_shapes
from parity_reference.params import (
    block_breakdown,
    breakdown,
    config_breakdown,
    count_config,
    n_params,
    part_of,
)


def test_toy_numbers() -> None:
    assert breakdown(12, 8, 2, 0) == {"embeddings": 96, "attention": 576, "mlp": 1104, "norms": 80}
    assert n_params(12, 8, 2, 0) == 1856
    assert n_params(12, 8, 2, 0, d_mlp=32) == 1856


def test_formula_matches_modules_for_the_toy() -> None:
    assert count_config(TOY) == config_breakdown(TOY)
    assert sum(count_config(TOY).values()) == 1856
    learned = dataclasses.replace(TOY, positions="learned")
    assert count_config(learned) == config_breakdown(learned)
    assert sum(count_config(learned).values()) == 1856 + 16 * 8


def test_gpt2_small() -> None:
    counted = count_config(GPT2_SMALL, device="meta")  # the same modules, shapes only
    assert counted == config_breakdown(GPT2_SMALL)
    assert sum(counted.values()) == 124_439_808
    assert sum(math.prod(s) for s in param_shapes(GPT2_SMALL).values()) == 124_439_808
    assert block_breakdown(GPT2_SMALL) == {"attention": 2_362_368, "mlp": 4_722_432, "norms": 3_072}
    assert sum(block_breakdown(GPT2_SMALL).values()) == 7_087_872


def test_seed_numbers_with_context_2048() -> None:
    assert n_params(50257, 768, 12, 2048) == 125_226_240
    assert n_params(50257, 12288, 96, 2048) == 174_604_259_328


def test_d_mlp_changes_only_the_mlp() -> None:
    a, b = breakdown(12, 8, 2, 0), breakdown(12, 8, 2, 0, d_mlp=16)
    assert a["mlp"] - b["mlp"] == 2 * (2 * 8 * 16 + 16)
    assert {k: v for k, v in a.items() if k != "mlp"} == {k: v for k, v in b.items() if k != "mlp"}


def test_part_of() -> None:
    assert part_of("wpe.weight") == "embeddings"
    assert part_of("h.3.attn.c_proj.bias") == "attention"
    assert part_of("h.0.mlp.c_fc.weight") == "mlp"
    assert part_of("h.11.ln_2.bias") == "norms"
    with pytest.raises(ValueError, match="lm_head"):
        part_of("lm_head.weight")
