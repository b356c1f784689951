"""The fp16-stress preset (`parity export --preset fp16-stress`): magnitudes fp16 holds, where the overflow-prone ways
of computing do not (parity_harness/_authoring/fp16_stress.py, docs/tolerances.md "The fp16-stress fixture").

- fast: its weights are seeded and carry what the module doc claims (squares that fit fp16 and sums of squares that
  do not, every logit's first term 2 exact, the later terms under half a bf16 ulp of it, rows whose softmax sums
  pass 2,048, an attention sink whose q.k passes 65,504 before the scale while every scaled score fits), computed
  from the weights by the float64 NumPy reference;
- full: every backend that declares fp16 or bf16 passes it in both (`parity run --precision fp16,bf16`, exit 0).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from parity_harness._authoring import fp16_stress
from parity_harness._authoring.presets import PRESETS, preset_names, preset_weights
from tests.helpers import run_cli

FP16_MAX = float(np.finfo(np.float16).max)


def _weights(seed: int) -> dict[str, np.ndarray]:
    return preset_weights(PRESETS[fp16_stress.PRESET], seed)


@pytest.fixture(scope="module")
def taps() -> dict[str, np.ndarray]:
    """The float64 NumPy reference's taps for one 16-token case of the seed-0 weights."""
    from parity_reference.numpy_model import forward

    weights = {k: v.astype(np.float64) for k, v in _weights(0).items()}
    tokens = [int(t) for t in np.random.Generator(np.random.PCG64(7)).integers(0, fp16_stress.VOCAB, 16)]
    return {k: np.asarray(v) for k, v in forward(weights, fp16_stress.CONFIG, tokens).items()}


def test_the_preset_is_registered_and_seeded() -> None:
    assert fp16_stress.PRESET in preset_names() and PRESETS[fp16_stress.PRESET].config == fp16_stress.CONFIG
    first, again, other = (_weights(s) for s in (0, 0, 1))
    assert all(np.array_equal(first[k], again[k]) for k in first)
    assert not np.array_equal(first["h.0.attn.c_attn.weight"], other["h.0.attn.c_attn.weight"])


def test_every_layernorm_input_has_squares_that_fit_and_sums_that_do_not(taps: dict[str, np.ndarray]) -> None:
    inputs = [taps[f"blocks.{i}.hook_resid_pre"] for i in range(2)] + [taps[f"blocks.{i}.hook_resid_mid"]
                                                                        for i in range(2)]
    for x in inputs:  # (T, d)
        centered = x - x.mean(axis=-1, keepdims=True)  # (T, d)
        assert float(np.max(x * x)) < FP16_MAX and float(np.max(centered * centered)) < FP16_MAX
        assert float(np.min(np.sum(x * x, axis=-1))) > FP16_MAX  # every row: a sum of squares in fp16 is inf
        assert float(np.min(np.sum(centered * centered, axis=-1))) > FP16_MAX


def test_every_logit_starts_with_an_exact_2_and_its_other_terms_are_under_half_a_bf16_ulp(
        taps: dict[str, np.ndarray]) -> None:
    w = _weights(0)
    ln = taps["ln_final.hook_normalized"] * w["ln_f.weight"] + w["ln_f.bias"]  # (T, d)
    wte = w["wte.weight"].astype(np.float64)  # (V, d)
    assert bool(np.all(ln[:, 0] == 16.0)) and bool(np.all(wte[:, 0] == 0.125))  # 16 x 0.125 = 2, exact on every grid
    half_ulp = 2.0 ** -7  # bf16 has 8 significant bits: its ulp in [2, 4) is 2^-6
    assert float(np.max(np.abs(ln[:, 3:])) * np.max(np.abs(wte[:, 3:]))) < half_ulp  # each term past dims 1, 2
    logits = taps["logits"]  # (T, V)
    assert bool(np.allclose(ln @ wte.T, logits, rtol=0, atol=1e-12))
    lost = ln[:, 3:] @ wte[:, 3:].T  # (T, V): what a running bf16 sum drops
    assert float(np.min(lost)) > 0.25 * float(np.max(np.abs(logits)))  # past bf16's tolerance, 32 eps M = 25% of M


def test_the_sinks_product_passes_65504_before_the_scale_and_its_scaled_score_fits(
        taps: dict[str, np.ndarray]) -> None:
    q, k = taps["blocks.0.attn.hook_q"], taps["blocks.0.attn.hook_k"]  # (T, H, dh) each
    product = np.einsum("ihe,jhe->hij", q, k)  # (H, T, T): q.k before the 1/sqrt(d_head) scale
    scores = taps["blocks.0.attn.hook_attn_scores"]  # (H, T, T)
    # every later query's product with key 0, in head 0 (query 0's own is ~58,000: its LayerNorm spreads over the sink)
    assert float(np.min(product[0, 1:, 0])) > FP16_MAX
    assert float(np.max(np.abs(scores[np.isfinite(scores)]))) < FP16_MAX / 8  # scaled (1/16), every score fits
    later = np.tril(np.ones_like(scores[0], dtype=bool), k=-1)[:, 1:]  # (T, T - 1): keys 1.. that a query sees
    assert float(np.max(np.abs(scores[0, :, 1:][later]))) < 16  # the other keys: far below the sink's ~4,460
    assert bool(np.allclose(taps["blocks.0.attn.hook_pattern"][0, :, 0], 1.0, rtol=0, atol=1e-12))  # one-hot
    assert float(np.max(np.abs(product[1]))) < FP16_MAX  # head 1 has no sink


def test_every_softmax_row_sums_past_where_a_running_fp16_sum_stops(taps: dict[str, np.ndarray]) -> None:
    for tap in ("probs", "logit_lens.0", "logit_lens.2"):
        p = taps[tap]  # (T, V)
        sums = np.sum(p / p.max(axis=-1, keepdims=True), axis=-1)  # (T,): exp(x - max) summed over 4,096
        assert float(np.min(sums)) > 1.9 * 2048  # a normalizer stuck at 2048 is off by 90%, past fp16's 3.1%


@pytest.mark.full
def test_every_declaring_backend_passes_it_in_fp16_and_bf16(tmp_path: Path) -> None:
    """pytorch, numpy (fp16), hf-transformers and onnxruntime (fp16) on the exported fixture, graphs included."""
    root = tmp_path / "fp16-stress"
    proc = run_cli("export", "--preset", "fp16-stress", "--fixture", str(root))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = tmp_path / "r.json"
    proc = run_cli("run", "--fixture", str(root), "--precision", "fp16,bf16", "--backends",
                   "pytorch,numpy,hf-transformers,onnxruntime", "--json", str(out), "-q")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    report = json.loads(out.read_text())
    ran = {(r["backend"], r["precision"]) for r in report["runs"] if r["status"] == "ran"}
    assert ran == {("pytorch", "fp16"), ("pytorch", "bf16"), ("numpy", "fp16"), ("hf-transformers", "fp16"),
                   ("hf-transformers", "bf16"), ("onnxruntime", "fp16")}
    assert report["passed"] is True and report["counts"]["failed"] == 0
