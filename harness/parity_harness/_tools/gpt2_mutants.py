"""The GPT-2 family's mutants: porting bugs of the TypeScript port (ts_model/model/model.ts) and of the torch
reference (parity_reference/model.py), named in the family's table (`code.mutants`, families/gpt2.json).

`MUTANTS`, in catalog order: the toy's porting bugs (the forward pass, then incremental decoding), the stability
bugs (`STABILITY`, caught_on "stress": invisible on fixtures/toy, caught on fixtures/toy-stress) and the
reduced-precision bugs (`REDUCED`, caught_on "probe": a half fast path caught in fp16 on the fp16-probe fixture, and
the fp16 KV cache of an fp32 model, a decoding mutant of the toy), then `FP16_STRESS` (caught_on "fp16-stress":
overflow and accumulation in the precision, the same code passing in fp32 and fp64 on the fp16-stress fixture and
caught in fp16 or bf16 there). What each field means, and how the selftest runs them:
parity_harness/_tools/mutants.py and docs/selftest.md.
"""

from __future__ import annotations

from parity_harness._core.precision import Precision
from parity_harness._tools.mutants import CaughtOn, Mutant

FAMILY = "gpt2"
TITLE = "GPT-2"  # how the selftest names the family's mutants
FIXTURE = "toy"  # the committed fixture its mutants are caught on (the toy itself; stress and probe: their own)


def _ts(name: str, patches: tuple[tuple[str, str], ...], description: str, tap: str, fp64_only: bool = False,
        step: int | None = None, caught_on: CaughtOn = "toy") -> Mutant:
    return Mutant(name, "typescript", "model/model.ts", patches, description, tap, fp64_only, step, caught_on,
                  family=FAMILY)


def _py(name: str, patches: tuple[tuple[str, str], ...], description: str, tap: str, fp64_only: bool = False,
        step: int | None = None, caught_on: CaughtOn = "toy", precision: Precision | None = None) -> Mutant:
    return Mutant(name, "reference", "model.py", patches, description, tap, fp64_only, step, caught_on, precision,
                  family=FAMILY)


_TS_MASK = "scores.data[(h * T + i) * T + j] = config.causal && j > i ? -Infinity : dot / rootDh;"
_TS_GELU = "out.data[i] = 0.5 * v * (1.0 + erf(v / Math.SQRT2));"
_TS_ANGLE = "const angle = pos * invFreq[i];"
# The erf polynomial ports often use (Abramowitz & Stegun 7.1.26, |error| <= 1.5e-7), written once:
# erf(a) ~ 1 - poly(t) * exp(-a^2) with t = 1 / (1 + P * a); the same text is TypeScript and Python.
_AS_P = "0.3275911"
_AS_POLY = "((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t"
_TS_IMPORTS = 'import { erf } from "./erf.ts";'  # where a mutant adds a function (declarations are hoisted)
_TS_ERF_AS = f'''{_TS_IMPORTS}

/** Abramowitz & Stegun 7.1.26: |error| <= 1.5e-7 (the mutant's erf). */
function erfAS(x: number): number {{
  const a = Math.abs(x);
  const t = 1 / (1 + {_AS_P} * a);
  const poly = {_AS_POLY};
  return Math.sign(x) * (1 - poly * Math.exp(-a * a));
}}'''
_PY_ERF_AS = f'''    u = (x / math.sqrt(2.0)).abs()  # Abramowitz & Stegun 7.1.26: |error| <= 1.5e-7
    t = 1.0 / (1.0 + {_AS_P} * u)
    poly = {_AS_POLY}
    return 0.5 * x * (1.0 + torch.sign(x) * (1.0 - poly * torch.exp(-u * u)))'''
_PY_UNTIED = '''def _untied_lm_head(wte: Tensor) -> Tensor:
    """A separate output layer, freshly initialized because the checkpoint has no lm_head.weight."""
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(wte.shape, generator=gen, dtype=torch.float64) * 0.02).to(wte.dtype)


def unembed('''

# -- the stability bugs: exact on the toy, broken by the stress fixture's magnitudes ----------------
_TS_SOFTMAX_EXP = "const e = Math.exp(x.data[row + j] - max);"
_TS_PATTERN = "const pattern = softmax(scores);"
_TS_ADDITIVE_MASK = """// An additive mask inside the softmax: masked cells get dot / rootDh - 1e4 (the tap keeps -inf).
  const maskedScores: Tensor = { shape: scores.shape, data: scores.data.slice() }; // (H, T, T)
  for (let h = 0; h < H; h++) {
    for (let i = 0; i < T; i++) {
      for (let j = i + 1; config.causal && j < T; j++) {
        let dot = 0;
        for (let e = 0; e < dh; e++) dot += q.data[(i * H + h) * dh + e] * k.data[(j * H + h) * dh + e];
        maskedScores.data[(h * T + i) * T + j] = dot / rootDh - 1e4;
      }
    }
  }
  const pattern = softmax(maskedScores);"""
_TS_ERF_SERIES = _TS_IMPORTS + """

/** erf by its series of positive terms, Abramowitz & Stegun 7.1.6 (the mutant's erf):
 *  erf z = 2/sqrt(pi) e^{-z^2} sum_n 2^n z^{2n+1} / (1 3 5 ... (2n+1)); the sum overflows past z^2 = 709.8. */
function erfSeries(z: number): number {
  let term = z;
  let sum = z;
  for (let n = 1; Math.abs(term) > 1e-17 * Math.abs(sum); n++) {
    term *= (2 * z * z) / (2 * n + 1);
    sum += term;
  }
  return (2 / Math.sqrt(Math.PI)) * Math.exp(-z * z) * sum;
}"""
_PY_PATTERN = "pattern = torch.softmax(scores, dim=-1)"
_PY_LN_VAR = "var = (centered * centered).mean(dim=-1, keepdim=True)"
_PY_ERF_SERIES = """    z = (x / math.sqrt(2.0)).double()  # erf by its series of positive terms (A&S 7.1.6), in float64
    term, total, n = z, z, 0
    while bool((term.abs() > 1e-17 * total.abs()).any()):  # inf and NaN compare false: the loop ends
        n += 1
        term = term * (2.0 * z * z) / (2 * n + 1)
        total = total + term
    return 0.5 * x * (1.0 + (2.0 / math.sqrt(math.pi) * torch.exp(-z * z) * total).to(x.dtype))"""

STABILITY: tuple[Mutant, ...] = (
    _ts("ts-softmax-no-max", ((_TS_SOFTMAX_EXP, "const e = Math.exp(x.data[row + j]);"),),
        "softmax without subtracting the row max: exp overflows past 709.8 (inf / inf = NaN)",
        "blocks.0.attn.hook_pattern", caught_on="stress"),
    _ts("ts-ln-one-pass-variance", (
        ("sq += centered[j] * centered[j];", "sq += x.data[t * d + j] * x.data[t * d + j];"),
        ("const s = Math.sqrt(sq / d + eps);", "const s = Math.sqrt(sq / d - mean * mean + eps);"),
    ), "LayerNorm variance as E[x^2] - E[x]^2: cancellation when |mean| >> std", "blocks.0.ln1.hook_scale",
        fp64_only=True, caught_on="stress"),
    _ts("ts-additive-mask", ((_TS_PATTERN, _TS_ADDITIVE_MASK),),
        "causal mask added as -1e4 inside the softmax (the scores tap keeps -inf): leaks past a 1e4 score gap",
        "blocks.0.attn.hook_pattern", caught_on="stress"),
    _ts("ts-erf-series", (
        (_TS_IMPORTS, _TS_ERF_SERIES),
        (_TS_GELU, "out.data[i] = 0.5 * v * (1.0 + erfSeries(v / Math.SQRT2));"),
    ), "erf by the positive series A&S 7.1.6: exact to 1e-14, then inf * 0 = NaN for |x| > 37.7",
        "blocks.0.mlp.hook_post", caught_on="stress"),
    _py("py-softmax-no-max", ((_PY_PATTERN, "pattern = torch.exp(scores) / torch.exp(scores).sum(dim=-1, "
                                            "keepdim=True)"),),
        "softmax without subtracting the row max: exp overflows past 88.7 in float32, 709.8 in float64",
        "blocks.0.attn.hook_pattern", caught_on="stress"),
    _py("py-ln-one-pass-variance", ((_PY_LN_VAR, "var = (x * x).mean(dim=-1, keepdim=True) - mean * mean"),),
        "LayerNorm variance as E[x^2] - E[x]^2: cancellation when |mean| >> std", "blocks.0.ln1.hook_scale",
        caught_on="stress"),
    _py("py-additive-mask", ((_PY_PATTERN, "pattern = torch.softmax(torch.where(future, (qh @ kh.transpose(-2, -1)) "
                                           "/ math.sqrt(dh) - 1e4, scores), dim=-1)"),),
        "causal mask added as -1e4 inside the softmax (the scores tap keeps -inf): leaks past a 1e4 score gap",
        "blocks.0.attn.hook_pattern", caught_on="stress"),
    _py("py-erf-series", (("    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))", _PY_ERF_SERIES),),
        "erf by the positive series A&S 7.1.6 (in float64): exact to 1e-14, then inf * 0 = NaN for |x| > 37.7",
        "blocks.0.mlp.hook_post", caught_on="stress"),
)

# -- reduced precision: a half fast path, caught in fp16 on the probe fixture, invisible in fp32 and fp64 --------
_PY_HALF = "(torch.float16, torch.bfloat16)"
_PY_SOFTMAX_FP16_SUM = f'''def _softmax(x: Tensor) -> Tensor:
    """Softmax over the last axis; half dtypes: exp(x - max) summed by a running accumulator in the dtype."""
    if x.dtype not in {_PY_HALF}:
        return torch.softmax(x, dim=-1)
    e = torch.exp(x - x.amax(dim=-1, keepdim=True))  # (..., n)
    total = torch.zeros_like(e[..., :1])  # (..., 1)
    for j in range(e.shape[-1]):
        total = total + e[..., j : j + 1]  # each add rounded: a fp16 sum stagnates at 2048
    return e / total


def gelu('''
_PY_LN_VAR_FP16_SUM = f"""if x.dtype in {_PY_HALF}:  # the half fast path: a running sum in the dtype
        sq = centered * centered  # (T, d)
        total = torch.zeros_like(sq[..., :1])  # (T, 1)
        for j in range(sq.shape[-1]):
            total = total + sq[..., j : j + 1]  # (T, 1): 40000 + 40000 is inf in fp16
        var = total / sq.shape[-1]  # (T, 1)
    else:
        var = (centered * centered).mean(dim=-1, keepdim=True)"""
_PY_GELU_BF16 = """    if x.dtype == torch.float16:  # the half fast path: the bf16 kernel
        xb = x.to(torch.bfloat16)
        return (0.5 * xb * (1.0 + torch.erf(xb / math.sqrt(2.0)))).to(torch.float16)
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))"""
_PY_KV_FP16 = '''def _stored_fp16(t: Tensor) -> Tensor:
    """A tensor through a float16 cache buffer: written in fp16, read back in t's dtype."""
    return t.to(torch.float16).to(t.dtype)


def prefill('''
_PY_PREFILL_K = 'taps[f"blocks.{i}.attn.hook_k"].transpose(-3, -2), taps[f"blocks.{i}.attn.hook_v"].transpose(-3, -2)'

REDUCED: tuple[Mutant, ...] = (
    _py("py-rp-softmax-fp16-sum", (
        ("def gelu(", _PY_SOFTMAX_FP16_SUM),
        ("pattern = torch.softmax(scores, dim=-1)", "pattern = _softmax(scores)"),
        ('taps["probs"] = torch.softmax(logits[..., last, :], dim=-1)',
         'taps["probs"] = _softmax(logits[..., last, :])'),
        ('taps[f"logit_lens.{k}"] = torch.softmax(lens[..., k * rows:(k + 1) * rows, :], dim=-1)',
         'taps[f"logit_lens.{k}"] = _softmax(lens[..., k * rows:(k + 1) * rows, :])'),
    ), "softmax accumulated in fp16 (a running half sum of exp(x - max)): stagnates at 2048, off ~2x over "
       "4,096 flat logits", "probs", caught_on="probe", precision="fp16"),
    _py("py-rp-ln-var-fp16-sum", ((_PY_LN_VAR, _PY_LN_VAR_FP16_SUM),),
        "LayerNorm variance accumulated in fp16 (a running half sum of the centered squares): two squares of "
        "40,000 overflow", "blocks.0.ln1.hook_scale", caught_on="probe", precision="fp16"),
    _py("py-rp-gelu-bf16", (("    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))", _PY_GELU_BF16),),
        "GELU computed in bf16 in an fp16 run (input and output rounded to bf16): under the tolerance, on "
        "bf16's grid", "blocks.0.mlp.hook_post", caught_on="probe", precision="fp16"),
    _py("py-rp-kv-cache-fp16", (
        ("def prefill(", _PY_KV_FP16),
        (_PY_PREFILL_K, '_stored_fp16(taps[f"blocks.{i}.attn.hook_k"].transpose(-3, -2)), '
                        '_stored_fp16(taps[f"blocks.{i}.attn.hook_v"].transpose(-3, -2))'),
        ("keys = torch.cat([cache_k, k.reshape(1, H, dh).transpose(0, 1)], dim=-2)",
         "keys = torch.cat([cache_k, _stored_fp16(k.reshape(1, H, dh).transpose(0, 1))], dim=-2)"),
        ("values = torch.cat([cache_v, v.reshape(1, H, dh).transpose(0, 1)], dim=-2)",
         "values = torch.cat([cache_v, _stored_fp16(v.reshape(1, H, dh).transpose(0, 1))], dim=-2)"),
    ), "KV cache stored in fp16 while the model computes in fp32 (written in fp16, read back): decoding only",
        "blocks.0.attn.cache_k", step=0),
)

# -- reduced precision on the fp16-stress fixture: overflow and accumulation in the precision, the same code ------
#    passing in fp32 and fp64 there (parity_harness/_authoring/fp16_stress.py, docs/selftest.md)
_PY_LOGITS = '    return ln @ params["wte.weight"].T'
_PY_SOFTMAX_DTYPE_SUM = '''def _softmax(x: Tensor) -> Tensor:
    """Softmax over the last axis, its normalizer a running sum in x's own dtype (a hand-written kernel)."""
    e = torch.exp(x - x.amax(dim=-1, keepdim=True))  # (..., n)
    total = torch.zeros_like(e[..., :1])  # (..., 1): the accumulator has the input's dtype
    for j in range(e.shape[-1]):
        total = total + e[..., j : j + 1]  # (..., 1): fp16 stagnates at 2048, where its ulp is 2
    return e / total


def gelu('''
_PY_LOGITS_DTYPE_SUM = '''    w = params["wte.weight"]  # (V, d)
    out = torch.zeros(*ln.shape[:-1], w.shape[0], dtype=ln.dtype)  # (T, V): the accumulator has the dtype
    for i in range(ln.shape[-1]):
        out = out + ln[..., i : i + 1] * w[:, i]  # (T, V): a running sum over d, rounded at each add
    return out'''

FP16_STRESS: tuple[Mutant, ...] = (
    _py("py-fs-ln-one-pass-sum", ((_PY_LN_VAR, "var = (x * x).sum(dim=-1, keepdim=True) / x.shape[-1] - mean * mean"),),
        "LayerNorm variance in one pass, sum(x^2) / d - mean^2: the sum of squares stored in the dtype, 125,000 to "
        "187,500 > 65,504 in fp16 (each square, 62,500, fits)", "blocks.0.ln1.hook_scale", caught_on="fp16-stress",
        precision="fp16"),
    _py("py-fs-softmax-dtype-sum", (
        ("def gelu(", _PY_SOFTMAX_DTYPE_SUM),
        ("pattern = torch.softmax(scores, dim=-1)", "pattern = _softmax(scores)"),
        ('taps["probs"] = torch.softmax(logits[..., last, :], dim=-1)',
         'taps["probs"] = _softmax(logits[..., last, :])'),
        ('taps[f"logit_lens.{k}"] = torch.softmax(lens[..., k * rows:(k + 1) * rows, :], dim=-1)',
         'taps[f"logit_lens.{k}"] = _softmax(lens[..., k * rows:(k + 1) * rows, :])'),
    ), "softmax normalizer a running sum in the input's dtype: in fp16 it stagnates at 2048 over 4,096 flat "
       "logits", "probs", caught_on="fp16-stress", precision="fp16"),
    _py("py-fs-logits-dtype-sum", ((_PY_LOGITS, _PY_LOGITS_DTYPE_SUM),),
        "the logits' product ln @ wte^T as a running sum over d in the dtype: in bf16 every term after the first "
        "(2) is under half an ulp and lost", "logits", caught_on="fp16-stress", precision="bf16"),
    _py("py-fs-scores-scaled-after", (("scores = (qh / math.sqrt(dh)) @ kh.transpose(-2, -1)",
                                       "scores = (qh @ kh.transpose(-2, -1)) / math.sqrt(dh)"),),
        "scores scaled after the product, (q @ k^T) / sqrt(d_head): in fp16 the sink's product, ~71,360, is inf "
        "before the scale (its scaled score, ~4,460, fits)", "blocks.0.attn.hook_attn_scores",
        caught_on="fp16-stress", precision="fp16"),
)

MUTANTS: tuple[Mutant, ...] = (
    # -- TypeScript port (float64 only: the fp64 tier and the fp64-vs-fp32 comparison) ------------
    _ts("ts-no-causal-mask", ((_TS_MASK, "scores.data[(h * T + i) * T + j] = dot / rootDh;"),),
        "no causal mask: every query sees future keys", "blocks.0.attn.hook_attn_scores"),
    _ts("ts-mask-off-by-one", (("config.causal && j > i ?", "config.causal && j > i + 1 ?"),),
        "mask off by one: query i also sees key i+1", "blocks.0.attn.hook_attn_scores"),
    _ts("ts-scale-sqrt-d-model", (("const rootDh = Math.sqrt(dh);", "const rootDh = Math.sqrt(d);"),),
        "scores scaled by 1/sqrt(d_model) instead of 1/sqrt(d_head)", "blocks.0.attn.hook_attn_scores"),
    _ts("ts-qk-swapped", (("dot += q.data[(i * H + h) * dh + e] * k.data[(j * H + h) * dh + e];",
                           "dot += k.data[(i * H + h) * dh + e] * q.data[(j * H + h) * dh + e];"),),
        "q and k swapped in the scores (k_i . q_j: the transpose; invisible for T = 1)",
        "blocks.0.attn.hook_attn_scores"),
    _ts("ts-heads-wrong-order", (
        ("for (let c = 0; c < d; c++) {",
         "for (let c = 0; c < d; c++) {\n      const src = (c % dh) * H + Math.floor(c / dh); // read as [dh, H]"),
        ("q.data[t * d + c] = qkv.data[t * 3 * d + c];", "q.data[t * d + c] = qkv.data[t * 3 * d + src];"),
        ("k.data[t * d + c] = qkv.data[t * 3 * d + d + c];", "k.data[t * d + c] = qkv.data[t * 3 * d + d + src];"),
        ("v.data[t * d + c] = qkv.data[t * 3 * d + 2 * d + c];",
         "v.data[t * d + c] = qkv.data[t * 3 * d + 2 * d + src];"),
    ), "heads split in the wrong order: columns read as [d_head, H] instead of [H, d_head]",
        "blocks.0.attn.hook_q"),
    _ts("ts-ln-unbiased-variance",
        (("const s = Math.sqrt(sq / d + eps);", "const s = Math.sqrt(sq / (d - 1) + eps);"),),
        "LayerNorm variance divided by d - 1 (unbiased) instead of d", "blocks.0.ln1.hook_scale"),
    _ts("ts-gelu-tanh", ((_TS_GELU, "out.data[i] = 0.5 * v * (1.0 + Math.tanh(Math.sqrt(2 / Math.PI) * "
                                    "(v + 0.044715 * v * v * v)));"),),
        "tanh-approximated GELU (GPT-2's gelu_new) instead of the exact erf GELU", "blocks.0.mlp.hook_post"),
    _ts("ts-erf-polynomial", (
        (_TS_IMPORTS, _TS_ERF_AS),
        (_TS_GELU, "out.data[i] = 0.5 * v * (1.0 + erfAS(v / Math.SQRT2));"),
    ), "erf by the Abramowitz-Stegun 7.1.26 polynomial (error 1.5e-7)", "blocks.0.mlp.hook_post", fp64_only=True),
    _ts("ts-positions-float32", (
        ("invFreq[i] = Math.pow(10000, -(2 * i) / dModel);",
         "invFreq[i] = Math.fround(Math.pow(10000, Math.fround(-(2 * i) / dModel)));"),
        (_TS_ANGLE, "const angle = Math.fround(pos * invFreq[i]);"),
        ("= Math.sin(angle);", "= Math.fround(Math.sin(angle));"),
        ("= Math.cos(angle);", "= Math.fround(Math.cos(angle));"),
    ), "sinusoidal positions computed in float32 (Math.fround at each step)", "hook_pos_embed", fp64_only=True),
    _ts("ts-positions-shifted", ((_TS_ANGLE, "const angle = (pos + 1) * invFreq[i];"),),
        "positions counted from 1 instead of 0", "hook_pos_embed"),
    _ts("ts-float32-accumulation", (
        *((f"od[r{i} + j] += x{i} * wkj;", f"od[r{i} + j] = Math.fround(od[r{i} + j] + x{i} * wkj);")
          for i in range(4)),  # linearColumns' four-row tile
        ("for (let j = j0; j < j1; j++) od[row + j] += xk * wd[wrow + j]!;",  # and its remaining rows
         "for (let j = j0; j < j1; j++) od[row + j] = Math.fround(od[row + j] + xk * wd[wrow + j]!);"),
        ("for (let j = 0; j < m; j++) od[r + j] += bd[j]!;",  # linear's bias
         "for (let j = 0; j < m; j++) od[r + j] = Math.fround(od[r + j] + bd[j]!);"),
    ), "Conv1D (x @ W + b) accumulated in float32, as with a Float32Array buffer", "blocks.0.attn.hook_q",
        fp64_only=True),
    _ts("ts-final-ln-unused", (('return linearTransposed(ln, param(params, "wte.weight"));',
                                'return linearTransposed(x, param(params, "wte.weight"));'),),
        "final LayerNorm computed but not applied: logits read the raw residual stream", "logits"),
    # -- Python mutants of the reference (float32 and float64: all three comparisons) ------------
    _py("py-post-ln", (
        ('    ln1 = layer_norm(x, params[p + "ln_1.weight"], params[p + "ln_1.bias"], config.ln_eps, taps, '
         'f"{name}.ln1")\n    attn_out = attention(ln1,', "    attn_out = attention(x,"),
        ("    resid_mid = x + attn_out",
         '    resid_mid = layer_norm(x + attn_out, params[p + "ln_1.weight"], params[p + "ln_1.bias"], '
         'config.ln_eps, taps, f"{name}.ln1")'),
        ('    ln2 = layer_norm(\n        resid_mid, params[p + "ln_2.weight"], params[p + "ln_2.bias"], '
         'config.ln_eps, taps, f"{name}.ln2"\n    )\n    mlp_out = mlp(ln2,', "    mlp_out = mlp(resid_mid,"),
        ("    resid_post = resid_mid + mlp_out",
         '    resid_post = layer_norm(resid_mid + mlp_out, params[p + "ln_2.weight"], params[p + "ln_2.bias"], '
         'config.ln_eps, taps, f"{name}.ln2")'),
    ), "post-LN (x = LN(x + Attn(x))) instead of GPT-2's pre-LN", "blocks.0.ln1.hook_scale"),
    _py("py-gelu-relu", (("    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))", "    return torch.relu(x)"),),
        "ReLU instead of GELU", "blocks.0.mlp.hook_post"),
    _py("py-erf-polynomial", (("    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))", _PY_ERF_AS),),
        "erf by the Abramowitz-Stegun 7.1.26 polynomial (error 1.5e-7)", "blocks.0.mlp.hook_post", fp64_only=True),
    _py("py-ln-eps", (("scale = torch.sqrt(var + eps)", "scale = torch.sqrt(var + 1e-6)"),),
        "LayerNorm eps 1e-6 instead of the config's 1e-5", "blocks.0.ln1.hook_scale"),
    _py("py-no-conv1d-transpose", (('out: Tensor = z_flat @ params[prefix + "c_proj.weight"] +',
                                    'out: Tensor = z_flat @ params[prefix + "c_proj.weight"].T +'),),
        "attention c_proj weight used as nn.Linear [out, in], without the Conv1D transpose",
        "blocks.0.hook_attn_out"),
    _py("py-softmax-wrong-axis",
        (("pattern = torch.softmax(scores, dim=-1)", "pattern = torch.softmax(scores, dim=-2)"),),
        "attention softmax over queries instead of keys", "blocks.0.attn.hook_pattern"),
    _py("py-untied-output", (
        ("def unembed(", _PY_UNTIED),
        ('    return ln @ params["wte.weight"].T', '    return ln @ _untied_lm_head(params["wte.weight"]).T'),
    ), "untied output layer: a fresh lm_head instead of wte^T", "logits"),
    # -- incremental decoding (KV cache): the forward pass is untouched; caught by the decoding check
    #    at a step (0 = the prefill) and a decoding tap ---------------------------------------------
    _ts("ts-decode-position-not-offset", (("sinusoidalPositions(pos + 1, d).data.slice(pos * d)",
                                           "sinusoidalPositions(1, d).data.slice(0)"),),
        "incremental mode: the new token's position not offset by the cache length (always position 0)",
        "blocks.0.attn.cache_k", step=1),
    _ts("ts-decode-cache-appended-after-use", (
        ("const T = pos + 1;", "const T = pos;"),
        ("keys.data[kj + e]", "cache.k.data[kj + e]"),
        ("values.data[cacheOffset(h, j, T, H, dh) + e]", "cache.v.data[cacheOffset(h, j, T, H, dh) + e]"),
    ), "cache appended after use (off by one): the new token's query does not see its own key and value",
        "blocks.1.attn.cache_k", step=1),
    _ts("ts-decode-mask-single-query", (("config.causal && j > pos ?", "config.causal && j > 0 ?"),),
        "mask wrong for a single-token query: the square mask's first row, so it sees key 0 only",
        "blocks.1.attn.cache_k", step=1),
    _ts("ts-decode-cache-transposed", (("return (h * T + t) * dh;", "return (t * H + h) * dh;"),),
        "cache stored positions x heads [T, H, d_head] (transposed), read back consistently: the logits "
        "agree, the cache does not", "blocks.0.attn.cache_k", step=0),
    _ts("ts-decode-position-off-by-one", (("sinusoidalPositions(pos + 1, d).data.slice(pos * d)",
                                           "sinusoidalPositions(pos + 2, d).data.slice((pos + 1) * d)"),),
        "incremental mode: the new token encoded one position late (position T + 1 instead of T)",
        "blocks.0.attn.cache_k", step=1),
    _py("py-decode-stale-cache", (("    return out, keys, values", "    return out, cache_k, cache_v"),),
        "incremental mode: the grown cache not returned, so every step keeps the prefill's (a stale cache)",
        "blocks.0.attn.cache_k", step=1),
    _py("py-decode-position-not-offset", (("sinusoidal_positions(pos + 1, config.d_model, wte.dtype)[pos:]",
                                           "sinusoidal_positions(1, config.d_model, wte.dtype)"),),
        "incremental mode: the new token's position not offset by the cache length (always position 0)",
        "blocks.0.attn.cache_k", step=1),
    # -- numerical stability: invisible on fixtures/toy, caught on fixtures/toy-stress ----------------
    *STABILITY,
    # -- reduced precision: caught in fp16 on the probe fixture (the KV cache: by the decoding check) --
    *REDUCED,
    # -- reduced precision: overflow and accumulation, caught in fp16 or bf16 on the fp16-stress fixture ----------
    *FP16_STRESS,
)
