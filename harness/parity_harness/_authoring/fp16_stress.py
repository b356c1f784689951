"""`parity export --preset fp16-stress`: a GPT-2 fixture at magnitudes fp16 holds, where the overflow-prone ways fail.

The toy-stress fixture is beyond fp16 and bf16 by construction (a residual stream of 1000 + O(0.1): docs/tolerances.md).
This one stays inside fp16's range (largest finite 65,504) so that an honest port passes in fp16 and bf16, and is
built, deliberately, so that the ways of computing that leave the range, or accumulate in the precision, do not.
GPT-2's shape at V 4,096, d 512, 2 blocks of 2 heads, d_mlp 64, context 16; GPT-2's initialization
(`presets.init_weights`, the seed), then four changes:

- **Outlier dims of the residual stream.** +`OUTLIER` on dim 1 and -`OUTLIER` on dim 2 of every row of `wpe` (the
  learned positions): every LayerNorm's input carries +-250 there, so its squares are at most ~62,500 (under
  65,504: an honest square fits, and torch's and NumPy's fp16 means accumulate in float32) and their sum over d is
  ~125,000 (over it: a sum of squares stored in fp16 is inf, so a one-pass variance sum(x^2)/d - mean^2 overflows).
- **Logits of 512 positive terms after a first one of 2.** ln_f's dim 0 has gain 0 and bias `LEAD_BIAS` (16) and
  wte's dim 0 is `LEAD_WTE` (0.125) for every word: every logit's first term is 2, exact on every grid; ln_f's other
  dims have bias `TERM_BIAS` (1) and wte there `TERM_WTE` x (1 + `TERM_SPREAD` u) (0.003 to 0.00375), so the other
  terms are positive and under half an ulp of 2 in bf16 (2^-7). The logits are ~3.7 (fp16 and bf16 round them
  finely enough), an honest product (float32 accumulation, one rounding) is exact to bf16's ulp, and a running bf16
  sum over d in dim order stops at 2 and loses the other 1.7 (46% of the largest logit; bf16's tolerance, c = 32,
  is 25%). A sum of 16 terms cannot do that without cancellation, which no fp32 backend passes: hence d = 512.
- **A flat vocabulary of `VOCAB`.** The logits of a row lie within 0.05 of each other, so every probability is
  ~1/4,096 and a softmax's normalizer ~4,000, past 2,048 where a running fp16 sum stops (its ulp is 2 there: adding
  ~1 rounds away).
- **An attention sink whose product q.k passes 65,504 before the scale.** +`SINK` on dim 3 of wpe's row 0 (the
  first position only), and block 0's c_attn maps dim 1 (the +250 of every position) to head 0's first query
  dimension and dim 3 to its first key dimension, each with weight `QK_GAIN` (18.5): every later query's product
  with key 0 is ~71,360, past 65,504 (query 0's own, ~58,000), while its scaled score (1/sqrt(d_head) = 1/16)
  is ~4,460 and the other keys' are under 7: head 0 attends to key 0 alone (a one-hot pattern, as attention
  sinks in trained models). Scaling q before the product (the reference, parity's graphs) keeps every value in
  range, with the same bits in fp32 and fp64 (a power of two); a product computed in fp16 first is inf there.
  ln_f's gain on dim 3 is 0, so the sink leaves the logits' terms as they are below.

Not committed (about 23 MB without the ONNX graphs, 56 MB with them): `parity export --preset fp16-stress --fixture
DIR`, seeded, the same on every machine; the selftest makes it in its temporary directory without the graphs
(`presets.export_preset(..., with_onnx=False)`).
"""

from __future__ import annotations

import numpy as np

from parity_reference.config import GPTConfig

PRESET = "fp16-stress"
VOCAB = 4096
D_MODEL = 512  # a logit is a sum of 512 terms: enough for a running bf16 sum to lose half of it (module doc)
CONFIG = GPTConfig(vocab_size=VOCAB, n_ctx=16, d_model=D_MODEL, n_layer=2, n_head=2, d_mlp=64, positions="learned")
LENGTHS = (1, 5, 16)  # one case per length, as the probe
OUTLIER = 250.0  # wpe dim 1 gets +250, dim 2 -250 at every position
SINK, QK_GAIN = 250.0, 18.5  # wpe[0, 3] += 250; block 0's c_attn: dim 1 -> q[head 0, 0], dim 3 -> k[head 0, 0]
LEAD_BIAS, LEAD_WTE = 16.0, 0.125  # ln_f dim 0: gain 0, bias 16; wte dim 0: 0.125 (every logit's first term is 2)
TERM_BIAS, TERM_WTE, TERM_SPREAD = 1.0, 0.003, 0.25  # ln_f dims 1..d-1: bias 1; wte there 0.003 x (1 + 0.25 u)
WHAT = ("+-250 outlier dims (fp16 squares fit, their sum does not), an attention sink whose q.k passes 65,504 "
        "before the scale, a flat vocabulary of 4,096, logits of 512 positive terms after a first one of 2: where "
        "overflow and accumulation in fp16 and bf16 show")
WEIGHTS_NOTE = ("parity_harness._authoring.presets.init_weights: N(0, 0.02), residual projections 0.02/sqrt(2 "
                f"n_layer), PCG64(seed); then parity_harness._authoring.fp16_stress.stress_weights: wpe dims 1, 2 "
                f"+-{OUTLIER:g}; wpe[0, 3] +{SINK:g}; h.0.attn.c_attn.weight[1, 0] and [3, d] {QK_GAIN:g}, "
                "ln_f dim 3 gain 0; "
                f"ln_f dim 0 gain 0, bias {LEAD_BIAS:g}, other dims bias {TERM_BIAS:g}; wte dim 0 {LEAD_WTE:g}, "
                f"other dims {TERM_WTE:g} x (1 + {TERM_SPREAD:g} u), u ~ U[0, 1) from PCG64(seed + 2)")


def stress_weights(weights: dict[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    """The fixture's float32 weights: `weights`, GPT-2's initialization for the seed (`presets.init_weights`, which
    calls this through `Preset.build`), changed in place as the module doc says."""
    weights["wpe.weight"][:, 1] += np.float32(OUTLIER)  # (n_ctx,)
    weights["wpe.weight"][:, 2] -= np.float32(OUTLIER)  # (n_ctx,)
    weights["wpe.weight"][0, 3] += np.float32(SINK)  # position 0 only: the key every query finds
    weights["h.0.attn.c_attn.weight"][1, 0] = np.float32(QK_GAIN)  # q[head 0, 0] <- dim 1 (+250 everywhere)
    weights["h.0.attn.c_attn.weight"][3, D_MODEL] = np.float32(QK_GAIN)  # k[head 0, 0] <- dim 3 (the sink)
    weights["ln_f.weight"][3] = np.float32(0.0)  # the sink's dim out of the logits
    weights["ln_f.weight"][0] = np.float32(0.0)
    weights["ln_f.bias"][0] = np.float32(LEAD_BIAS)
    weights["ln_f.bias"][1:] = np.float32(TERM_BIAS)  # (d - 1,)
    u = np.random.Generator(np.random.PCG64(seed + 2)).random((VOCAB, D_MODEL - 1), dtype=np.float32)  # (V, d - 1)
    weights["wte.weight"][:, 0] = np.float32(LEAD_WTE)  # (V,)
    weights["wte.weight"][:, 1:] = (np.float32(TERM_WTE) * (1 + np.float32(TERM_SPREAD) * u)).astype(np.float32)
    return weights


__all__ = ["CONFIG", "LEAD_BIAS", "LEAD_WTE", "OUTLIER", "PRESET", "QK_GAIN", "SINK", "VOCAB", "stress_weights"]
