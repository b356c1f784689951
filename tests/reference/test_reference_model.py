"""Reference model contracts: taps (names, shapes, order), causal mask, precision, positions, weights I/O."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from parity_reference.config import TOY, GPTConfig, param_shapes
from parity_reference.model import (
    GPT,
    WeightsError,
    load_weights,
    run_with_taps,
    save_weights,
    sinusoidal_positions,
)
from parity_reference.taps import tap_names, tap_shape

TOKENS = [0, 1, 4, 7, 1, 6, 0, 2, 3, 5, 8, 1, 10, 11, 9, 0]  # n_ctx = 16 tokens, every word


def random_params(config: GPTConfig, seed: int = 0, std: float = 0.5) -> dict[str, Tensor]:
    """Weights far from GPT-2's tiny init (std 0.02), so that every tap carries real signal."""
    g = torch.Generator().manual_seed(seed)
    params = {name: torch.randn(shape, generator=g) * std for name, shape in param_shapes(config).items()}
    for name, value in params.items():
        if name.endswith(("ln_1.weight", "ln_2.weight")) or name == "ln_f.weight":
            value += 1.0  # LayerNorm gains around 1
    return params


@pytest.mark.parametrize(
    "config", [TOY, dataclasses.replace(TOY, positions="learned")], ids=["sin", "learned"]
)
@pytest.mark.parametrize("T", [1, TOY.n_ctx])
def test_tap_names_order_and_shapes(config: GPTConfig, T: int) -> None:
    taps = run_with_taps(random_params(config), config, TOKENS[:T])
    assert list(taps) == tap_names(config.n_layer)
    for name, value in taps.items():
        assert tuple(value.shape) == tap_shape(config, name, T), name
        assert value.dtype == torch.float32, name


def test_batched_forward_matches_single_sequences() -> None:
    model = GPT(TOY)
    batch = torch.tensor([TOKENS[:8], TOKENS[8:]])  # (2, 8)
    with torch.no_grad():
        logits = model(batch)  # (2, 8, V)
        for row in range(2):
            torch.testing.assert_close(logits[row], model(batch[row]), rtol=0, atol=1e-6)


def _earlier_part(name: str, value: Tensor, k: int) -> Tensor:
    """The part of a tap that may only depend on tokens before position k."""
    if name.endswith(("hook_attn_scores", "hook_pattern")):
        return value[:, :k, :]  # (H, k, T): query rows < k, every key column (later ones are masked)
    return value[:k]  # (k, ...): rows are positions


@pytest.mark.parametrize("k", [1, 5, 15])
def test_causal_mask_earlier_positions_unchanged(k: int) -> None:
    params = random_params(TOY, seed=1)
    other = list(TOKENS)
    other[k] = (other[k] + 5) % TOY.vocab_size
    a, b = run_with_taps(params, TOY, TOKENS), run_with_taps(params, TOY, other)
    for name in a:
        if name == "hook_pos_embed":
            continue
        assert torch.equal(_earlier_part(name, a[name], k), _earlier_part(name, b[name], k)), name
    # and the change is visible from position k on, so the comparison above is not vacuous
    assert not torch.equal(a["logits"][k:], b["logits"][k:])
    # the masked cells are -inf in the scores and 0 in the pattern
    future = torch.ones(16, 16, dtype=torch.bool).triu(1)
    assert torch.isneginf(a["blocks.1.attn.hook_attn_scores"][:, future]).all()
    assert (a["blocks.1.attn.hook_pattern"][:, future] == 0).all()


def test_unmasked_model_leaks_the_future() -> None:
    """The same check fails without the mask: the test above can tell the difference."""
    config = dataclasses.replace(TOY, causal=False)
    params = random_params(config, seed=1)
    other = list(TOKENS)
    other[5] = (other[5] + 5) % config.vocab_size
    a, b = run_with_taps(params, config, TOKENS), run_with_taps(params, config, other)
    assert not torch.equal(a["logits"][:5], b["logits"][:5])
    assert torch.isfinite(a["blocks.0.attn.hook_attn_scores"]).all()


def test_float32_and_float64_agree() -> None:
    p32 = random_params(TOY, seed=2)
    p64 = {k: v.to(torch.float64) for k, v in p32.items()}
    t32, t64 = run_with_taps(p32, TOY, TOKENS), run_with_taps(p64, TOY, TOKENS)
    worst = 0.0
    for name in t32:
        assert t64[name].dtype == torch.float64, name
        a, b = t32[name].to(torch.float64), t64[name]
        assert torch.equal(torch.isneginf(a), torch.isneginf(b)), name
        finite = torch.isfinite(b)
        assert torch.isfinite(a[finite]).all(), name
        err = float((a[finite] - b[finite]).abs().max())
        worst = max(worst, err)
        assert err < 1e-5, f"{name}: max abs error {err:.3g}"
    assert worst > 0.0  # the two really were computed in different precisions


def test_logit_lens_last_equals_probs() -> None:
    taps = run_with_taps(random_params(TOY, seed=3), TOY, TOKENS)
    assert torch.equal(taps[f"logit_lens.{TOY.n_layer}"], taps["probs"])
    assert not torch.equal(taps["logit_lens.0"], taps["probs"])
    torch.testing.assert_close(taps["probs"], torch.softmax(taps["logits"], -1), rtol=0, atol=0)
    torch.testing.assert_close(taps["probs"].sum(-1), torch.ones(len(TOKENS)), rtol=0, atol=1e-6)


def test_sinusoidal_positions_against_the_formula() -> None:
    n, d = 16, 8
    table = sinusoidal_positions(n, d, torch.float64)  # (n, d)
    for pos in range(n):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert abs(float(table[pos, 2 * i]) - math.sin(angle)) < 1e-12
            assert abs(float(table[pos, 2 * i + 1]) - math.cos(angle)) < 1e-12
    taps = run_with_taps(random_params(TOY), TOY, TOKENS)
    assert torch.equal(taps["hook_pos_embed"], sinusoidal_positions(n, d, torch.float64).to(torch.float32))


def test_learned_positions_use_wpe() -> None:
    config = dataclasses.replace(TOY, positions="learned")
    params = random_params(config)
    taps = run_with_taps(params, config, TOKENS[:7])
    assert torch.equal(taps["hook_pos_embed"], params["wpe.weight"][:7])


def test_weights_round_trip(tmp_path: Path) -> None:
    params = GPT(TOY).params()
    path = tmp_path / "w.safetensors"
    save_weights(params, path)
    loaded = load_weights(path, TOY)
    assert list(loaded) == list(param_shapes(TOY))
    for name, value in params.items():
        assert loaded[name].dtype == torch.float32
        assert torch.equal(loaded[name], value.detach()), name
    as64 = load_weights(path, TOY, torch.float64)
    assert all(v.dtype == torch.float64 for v in as64.values())


def _write(path: Path, tensors: dict[str, Tensor]) -> Path:
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    return path


@pytest.fixture
def good(tmp_path: Path) -> dict[str, Tensor]:
    path = tmp_path / "good.safetensors"
    save_weights(GPT(TOY).params(), path)
    return load_file(str(path))


def test_refuses_missing_tensor(tmp_path: Path, good: dict[str, Tensor]) -> None:
    del good["h.1.mlp.c_fc.bias"]
    with pytest.raises(WeightsError, match=r"missing tensor 'h\.1\.mlp\.c_fc\.bias'"):
        load_weights(_write(tmp_path / "x.safetensors", good), TOY)


def test_refuses_extra_tensor(tmp_path: Path, good: dict[str, Tensor]) -> None:
    good["h.2.ln_1.weight"] = torch.ones(8)
    with pytest.raises(WeightsError, match=r"unexpected tensor.*'h\.2\.ln_1\.weight'"):
        load_weights(_write(tmp_path / "x.safetensors", good), TOY)


def test_refuses_wrong_shape(tmp_path: Path, good: dict[str, Tensor]) -> None:
    good["h.0.attn.c_attn.weight"] = good["h.0.attn.c_attn.weight"].T  # nn.Linear layout [out, in]
    with pytest.raises(
        WeightsError, match=r"'h\.0\.attn\.c_attn\.weight' has shape \[24, 8\], expected \[8, 24\]"
    ):
        load_weights(_write(tmp_path / "x.safetensors", good), TOY)


def test_refuses_nan(tmp_path: Path, good: dict[str, Tensor]) -> None:
    good["ln_f.bias"][3] = float("nan")
    with pytest.raises(WeightsError, match=r"'ln_f\.bias' has non-finite"):
        load_weights(_write(tmp_path / "x.safetensors", good), TOY)


def test_refuses_truncated_file(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    save_weights(GPT(TOY).params(), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(WeightsError, match="not a readable safetensors file"):
        load_weights(path, TOY)


def test_refuses_missing_file(tmp_path: Path) -> None:
    with pytest.raises(WeightsError, match=r"nope\.safetensors"):
        load_weights(tmp_path / "nope.safetensors", TOY)
