"""The forward pass in mpmath at high precision: an independent truth for the float64 golden.

The same model as `parity_reference/model.py` (sinusoidal or learned positions, pre-LN blocks, the exact GELU
or GPT-2's tanh `gelu_new` as the config says, causal mask, tied unembedding), written on plain Python lists
of `mpmath.mpf`, with the float32 weights taken exactly. At 40 significant digits its own error is ~1e-40
relative, so the difference between a float64 result and `truth_taps` is the float64 result's error. It is
slow (pure Python, about 0.1-0.5 s per case of the toy), which is fine for a model with d_model 8: it is used
to measure the stress fixture's float64 error budget (parity_harness/_authoring/stress.py) and by a test on a
couple of cases, never by a backend. numpy.longdouble would not do: it is plain float64 on some platforms
(macOS arm64, Windows).

The pieces every family's truth shares (matrices of mpf, linear maps, softmax rows, the final norm's taps, the
logits and the logit lens: `_head_taps`) are here; a family's own truth is its authoring module's `truth_taps`
(the Llama family's: `_authoring/llama_family.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from parity_reference.config import GPTConfig

Vec = list[Any]  # a row of mpf
Mat = list[Vec]  # rows of mpf

DIGITS = 40


def _mat(a: np.ndarray, mp: Any) -> Mat:
    return [[mp.mpf(float(v)) for v in row] for row in np.asarray(a, dtype=np.float64).reshape(a.shape[0], -1)]


def _vec(a: np.ndarray, mp: Any) -> Vec:
    return [mp.mpf(float(v)) for v in np.asarray(a, dtype=np.float64).ravel()]


def _linear(x: Mat, w: Mat, b: Vec | None, mp: Any) -> Mat:
    """x (T, n) @ w (n, m) + b (m)."""
    cols = list(zip(*w, strict=True))  # m columns of n
    return [[mp.fsum(xi * wi for xi, wi in zip(row, col, strict=True)) + (b[j] if b is not None else 0)
             for j, col in enumerate(cols)] for row in x]


def _softmax_row(row: Vec, mp: Any) -> Vec:
    finite = [v for v in row if v != mp.ninf]
    top = max(finite)
    e = [mp.exp(v - top) if v != mp.ninf else mp.mpf(0) for v in row]
    total = mp.fsum(e)
    return [v / total for v in e]


def _layer_norm(x: Mat, weight: Vec, bias: Vec, eps: float, mp: Any) -> tuple[Mat, Mat, Mat]:
    """(output, scale (T, 1), normalized) with the biased variance."""
    out, scales, norms = [], [], []
    for row in x:
        mean = mp.fsum(row) / len(row)
        centered = [v - mean for v in row]
        scale = mp.sqrt(mp.fsum(c * c for c in centered) / len(row) + mp.mpf(eps))
        nrm = [c / scale for c in centered]
        scales.append([scale])
        norms.append(nrm)
        out.append([n * g + b for n, g, b in zip(nrm, weight, bias, strict=True)])
    return out, scales, norms


def _gelu(u: Any, activation: str, mp: Any) -> Any:
    """The config's activation of one value: the exact GELU u/2 (1 + erf(u / sqrt 2)), or GPT-2's gelu_new
    u/2 (1 + tanh(sqrt(2/pi) (u + 0.044715 u^3))) with its constants taken as written (decimal)."""
    if activation == "gelu_new":
        return u / 2 * (1 + mp.tanh(mp.sqrt(2 / mp.pi) * (u + mp.mpf("0.044715") * u ** 3)))
    return u / 2 * (1 + mp.erf(u / mp.sqrt(2)))


def truth_taps(weights: Mapping[str, np.ndarray], config: GPTConfig, tokens: Sequence[int],
               digits: int = DIGITS) -> dict[str, np.ndarray]:
    """Every tap of one sequence, computed at `digits` significant digits, rounded once to float64.

    Masked attention scores are -inf, as in the golden files.
    """
    import mpmath

    ctx = mpmath.mp.clone()
    ctx.dps = digits
    mp: Any = ctx
    d, H, dh, n = config.d_model, config.n_head, config.d_head, len(tokens)
    p = {k: np.asarray(v) for k, v in weights.items()}
    taps: dict[str, Mat] = {}
    shapes: dict[str, tuple[int, ...]] = {}

    def rec(name: str, value: Mat, shape: tuple[int, ...]) -> None:
        taps[name], shapes[name] = value, shape

    wte = _mat(p["wte.weight"], mp)
    embed = [list(wte[t]) for t in tokens]
    rec("hook_embed", embed, (n, d))
    if config.positions == "learned":
        pos = _mat(p["wpe.weight"][:n], mp)
    else:
        pos = [[mp.mpf(0)] * d for _ in range(n)]
        for t in range(n):
            for i in range(0, d, 2):
                angle = t * mp.power(10000, -mp.mpf(i) / d)
                pos[t][i], pos[t][i + 1] = mp.sin(angle), mp.cos(angle)
    rec("hook_pos_embed", pos, (n, d))
    x = [[a + b for a, b in zip(r1, r2, strict=True)] for r1, r2 in zip(embed, pos, strict=True)]
    streams = [x]
    for layer in range(config.n_layer):
        pre, name = f"h.{layer}.", f"blocks.{layer}"
        rec(f"{name}.hook_resid_pre", x, (n, d))
        ln1, s1, n1 = _layer_norm(x, _vec(p[pre + "ln_1.weight"], mp), _vec(p[pre + "ln_1.bias"], mp),
                                  config.ln_eps, mp)
        rec(f"{name}.ln1.hook_scale", s1, (n, 1))
        rec(f"{name}.ln1.hook_normalized", n1, (n, d))
        qkv = _linear(ln1, _mat(p[pre + "attn.c_attn.weight"], mp), _vec(p[pre + "attn.c_attn.bias"], mp), mp)
        q = [row[:d] for row in qkv]
        k = [row[d:2 * d] for row in qkv]
        v = [row[2 * d:] for row in qkv]
        rec(f"{name}.attn.hook_q", q, (n, H, dh))
        rec(f"{name}.attn.hook_k", k, (n, H, dh))
        rec(f"{name}.attn.hook_v", v, (n, H, dh))
        root = mp.sqrt(dh)
        scores: Mat = []  # (H * T) rows of T
        pattern: Mat = []
        for h in range(H):
            sl = slice(h * dh, (h + 1) * dh)
            for i in range(n):
                row = [mp.fsum(a * b for a, b in zip(q[i][sl], k[j][sl], strict=True)) / root
                       if not (config.causal and j > i) else mp.ninf for j in range(n)]
                scores.append(row)
                pattern.append(_softmax_row(row, mp))
        rec(f"{name}.attn.hook_attn_scores", scores, (H, n, n))
        rec(f"{name}.attn.hook_pattern", pattern, (H, n, n))
        z = [[mp.mpf(0)] * d for _ in range(n)]
        for h in range(H):
            for i in range(n):
                for e in range(dh):
                    z[i][h * dh + e] = mp.fsum(pattern[h * n + i][j] * v[j][h * dh + e] for j in range(n))
        rec(f"{name}.attn.hook_z", z, (n, H, dh))
        attn_out = _linear(z, _mat(p[pre + "attn.c_proj.weight"], mp), _vec(p[pre + "attn.c_proj.bias"], mp), mp)
        rec(f"{name}.hook_attn_out", attn_out, (n, d))
        mid = [[a + b for a, b in zip(r1, r2, strict=True)] for r1, r2 in zip(x, attn_out, strict=True)]
        rec(f"{name}.hook_resid_mid", mid, (n, d))
        ln2, s2, n2 = _layer_norm(mid, _vec(p[pre + "ln_2.weight"], mp), _vec(p[pre + "ln_2.bias"], mp),
                                  config.ln_eps, mp)
        rec(f"{name}.ln2.hook_scale", s2, (n, 1))
        rec(f"{name}.ln2.hook_normalized", n2, (n, d))
        hpre = _linear(ln2, _mat(p[pre + "mlp.c_fc.weight"], mp), _vec(p[pre + "mlp.c_fc.bias"], mp), mp)
        rec(f"{name}.mlp.hook_pre", hpre, (n, config.d_mlp))
        post = [[_gelu(u, config.activation, mp) for u in row] for row in hpre]
        rec(f"{name}.mlp.hook_post", post, (n, config.d_mlp))
        mlp_out = _linear(post, _mat(p[pre + "mlp.c_proj.weight"], mp), _vec(p[pre + "mlp.c_proj.bias"], mp), mp)
        rec(f"{name}.hook_mlp_out", mlp_out, (n, d))
        x = [[a + b for a, b in zip(r1, r2, strict=True)] for r1, r2 in zip(mid, mlp_out, strict=True)]
        rec(f"{name}.hook_resid_post", x, (n, d))
        streams.append(x)
    wte_t = [list(col) for col in zip(*wte, strict=True)]  # (d, V)
    lnf_w, lnf_b = _vec(p["ln_f.weight"], mp), _vec(p["ln_f.bias"], mp)

    def unembed(stream: Mat) -> tuple[Mat, Mat, Mat]:
        ln, scale, nrm = _layer_norm(stream, lnf_w, lnf_b, config.ln_eps, mp)
        return _linear(ln, wte_t, None, mp), scale, nrm

    _head_taps(rec, unembed, x, streams, config.vocab_size, mp)
    return {name: np.array([[float(v) for v in row] for row in value], dtype=np.float64).reshape(shapes[name])
            for name, value in taps.items()}


def _head_taps(rec: Callable[[str, Mat, tuple[int, ...]], None], unembed: Callable[[Mat], tuple[Mat, Mat, Mat]],
               x: Mat, streams: list[Mat], vocab: int, mp: Any) -> None:
    """The final norm's taps, the logits, probs and every stream's logit lens, for either family (`unembed`: the
    family's final norm and output layer, returning (logits, scale, normalized))."""
    n, d = len(x), len(x[0])
    logits, sf, nf = unembed(x)
    rec("ln_final.hook_scale", sf, (n, 1))
    rec("ln_final.hook_normalized", nf, (n, d))
    rec("logits", logits, (n, vocab))
    rec("probs", [_softmax_row(row, mp) for row in logits], (n, vocab))
    for k, stream in enumerate(streams):
        rec(f"logit_lens.{k}", [_softmax_row(row, mp) for row in unembed(stream)[0]], (n, vocab))


__all__ = ["DIGITS", "truth_taps"]
