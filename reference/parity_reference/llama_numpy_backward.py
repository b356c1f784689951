"""The Llama family's backward by hand, in plain NumPy: parity_reference/llama_numpy.py's forward, walked backwards.

The same design as GPT-2's (parity_reference/numpy_backward.py, the one to read first): one function per forward
step, each taking its output's gradient and the forward's taps, writing every tap's and parameter's gradient
into `grads` under `"{name}.grad"`:

    rms_norm_backward, rope_backward, silu_backward, mlp_backward, attention_backward, block_backward,
    unembed_backward, backward

The loss's gradient (`cross_entropy_backward`), the softmax's (`softmax_backward`) and the training step
(`batch_backward`, `adamw_step`, `train`) are GPT-2's, shared: `batch_backward` and `train` take this module as
their `family` and call its `backward`. What differs from GPT-2: RMSNorm (no centering, no bias), RoPE on q and k
(its adjoint is the rotation by the opposite angle), grouped-query attention (the adjoint of `expand_kv`, which
copies each key/value head to `n_rep` query heads, sums those copies back), SwiGLU, optional attention biases,
and the unembedding's head: `lm_head.weight` of its own, or the embedding when tied (then the embedding's
gradient sums both uses, as GPT-2's). Every array op runs in the parameters' dtype.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from parity_reference import llama_numpy as ln
from parity_reference.llama_config import LlamaConfig, param_shapes
from parity_reference.numpy_backward import (
    Grads,
    Params,
    Taps,
    adamw_step,
    batch_backward,
    cross_entropy_backward,
    softmax_backward,
    train,
)
from parity_reference.training import backward_names, grad_name


def rms_norm_backward(dout: np.ndarray, weight: np.ndarray, scale: np.ndarray,
                      normalized: np.ndarray) -> tuple[np.ndarray, ...]:
    """out = n * w with n = x / s, s = sqrt(mean(x^2) + eps): (dx, dweight, dn, ds).

    dn = dout * w; dw = sum_t dout * n; ds = -sum_j dn_j n_j / s (the scale tap's adjoint, through n = x / s);
    dx = (dn - n * mean(dn * n)) / s: no mean's term, RMSNorm does not center.
    """
    dn = dout * weight  # (T, d)
    dweight = (dout * normalized).sum(axis=0)  # (d,)
    dn_n = dn * normalized  # (T, d)
    dscale = -dn_n.sum(axis=-1, keepdims=True) / scale  # (T, 1)
    dx = (dn - normalized * dn_n.mean(axis=-1, keepdims=True)) / scale  # (T, d)
    return dx, dweight, dn, dscale


def rope_backward(dout: np.ndarray, cos: np.ndarray, sin: np.ndarray, pairing: str) -> np.ndarray:
    """RoPE turns each pair (a, b) by its position's angle: (a c - b s, b c + a s). A rotation's adjoint is its
    inverse, the turn by minus the angle: (da, db) = (dy1 c + dy2 s, dy2 c - dy1 s), pairs as the forward pairs them
    ("half": j with j + dh/2; "interleaved": 2j with 2j + 1). dout (T, heads, dh); cos, sin (T, dh/2)."""
    c, s = cos[:, None, :], sin[:, None, :]  # (T, 1, dh/2): the same angle for every head
    if pairing == "half":
        half = dout.shape[-1] // 2
        d1, d2 = dout[..., :half], dout[..., half:]  # (T, heads, dh/2) each
        return np.concatenate([d1 * c + d2 * s, d2 * c - d1 * s], axis=-1)  # (T, heads, dh)
    d1, d2 = dout[..., 0::2], dout[..., 1::2]  # (T, heads, dh/2) each: even and odd columns
    return np.stack([d1 * c + d2 * s, d2 * c - d1 * s], axis=-1).reshape(dout.shape)  # (T, heads, dh)


def silu_backward(x: np.ndarray, dout: np.ndarray) -> np.ndarray:
    """SiLU, x sigma(x): its derivative sigma(x) (1 + x (1 - sigma(x))), sigma(x) = 1 / (1 + exp(-x)) (0 where
    exp(-x) overflows, and then so is the derivative)."""
    one = x.dtype.type(1.0)
    with np.errstate(over="ignore"):
        sig = one / (one + np.exp(-x))  # like x
    out: np.ndarray = dout * (sig * (one + x * (one - sig)))  # like x
    return out


def _linear_backward(dout: np.ndarray, x: np.ndarray, params: Params, name: str, grads: Grads) -> np.ndarray:
    """out = x @ W^T (+ b): dW = dout^T @ x, db = sum_t dout (when there is a bias); returns dx = dout @ W."""
    grads[grad_name(name + ".weight")] = dout.T @ x  # (out, in)
    if name + ".bias" in params:
        grads[grad_name(name + ".bias")] = dout.sum(axis=0)  # (out,)
    dx: np.ndarray = dout @ params[name + ".weight"]  # (T, in)
    return dx


def mlp_backward(dout: np.ndarray, x: np.ndarray, params: Params, prefix: str, taps: Taps, name: str,
                 grads: Grads) -> np.ndarray:
    """SwiGLU, out = down(silu(gate x) * up x): the gradient of its input x (T, d).

    dpost = dout @ W_down; dpre_linear = dpost * silu(pre); dpre = silu'(pre) * dpost * pre_linear;
    dx = dpre @ W_gate + dpre_linear @ W_up.
    """
    pre, pre_linear = taps[f"{name}.hook_pre"], taps[f"{name}.hook_pre_linear"]  # (T, d_mlp) each
    dpost = _linear_backward(dout, taps[f"{name}.hook_post"], params, prefix + "down_proj", grads)  # (T, d_mlp)
    grads[grad_name(f"{name}.hook_post")] = dpost
    dpre_linear = dpost * ln.silu(pre)  # (T, d_mlp): silu(pre) recomputed with the forward's arithmetic
    grads[grad_name(f"{name}.hook_pre_linear")] = dpre_linear
    dpre = silu_backward(pre, dpost * pre_linear)  # (T, d_mlp)
    grads[grad_name(f"{name}.hook_pre")] = dpre
    dx = _linear_backward(dpre, x, params, prefix + "gate_proj", grads)  # (T, d)
    out: np.ndarray = dx + _linear_backward(dpre_linear, x, params, prefix + "up_proj", grads)  # (T, d)
    return out


def attention_backward(dout: np.ndarray, x: np.ndarray, params: Params, prefix: str, config: LlamaConfig,
                       cos: np.ndarray, sin: np.ndarray, taps: Taps, name: str, grads: Grads) -> np.ndarray:
    """Grouped-query attention with RoPE on the first RMSNorm's output x (T, d): the gradient of x.

    As GPT-2's (dz, then dpattern = dz v^T and dv = pattern^T dz, the softmax, the 1/sqrt(dh) scale, dq = dscores k,
    dk = dscores^T q), then: expand_kv's adjoint sums the n_rep query heads that read each key/value head; RoPE's
    adjoint turns dq and dk back (`rope_backward`); q, k, v are three projections of x, whose gradients add.
    """
    T, H, Hkv, dh, n_rep = x.shape[0], config.n_head, config.n_kv_heads, config.d_head, config.n_rep
    z, pattern = taps[f"{name}.hook_z"], taps[f"{name}.hook_pattern"]  # (T, H, dh), (H, T, T)
    rot_q, rot_k, v = taps[f"{name}.hook_rot_q"], taps[f"{name}.hook_rot_k"], taps[f"{name}.hook_v"]
    dz = _linear_backward(dout, z.reshape(T, H * dh), params, prefix + "o_proj", grads).reshape(T, H, dh)
    grads[grad_name(f"{name}.hook_z")] = dz  # (T, H, dh)
    dzh = dz.transpose(1, 0, 2)  # (H, T, dh)
    vh = ln.expand_kv(v.transpose(1, 0, 2), n_rep)  # (H, T, dh)
    dpattern = dzh @ vh.transpose(0, 2, 1)  # (H, T, T)
    grads[grad_name(f"{name}.hook_pattern")] = dpattern
    dvh = pattern.transpose(0, 2, 1) @ dzh  # (H, T, dh): one per query head
    dscores = softmax_backward(pattern, dpattern)  # (H, T, T)
    grads[grad_name(f"{name}.hook_attn_scores")] = dscores
    dqk = dscores / x.dtype.type(math.sqrt(dh))  # (H, T, T): through scores = q k^T / sqrt(dh)
    kh = ln.expand_kv(rot_k.transpose(1, 0, 2), n_rep)  # (H, T, dh)
    dqh = dqk @ kh  # (H, T, dh)
    dkh = dqk.transpose(0, 2, 1) @ rot_q.transpose(1, 0, 2)  # (H, T, dh): one per query head
    dk_heads = dkh.reshape(Hkv, n_rep, T, dh).sum(axis=1)  # (Hkv, T, dh): expand_kv's adjoint
    dv_heads = dvh.reshape(Hkv, n_rep, T, dh).sum(axis=1)  # (Hkv, T, dh)
    drot_q, drot_k = dqh.transpose(1, 0, 2), dk_heads.transpose(1, 0, 2)  # (T, H, dh), (T, Hkv, dh)
    grads[grad_name(f"{name}.hook_rot_q")], grads[grad_name(f"{name}.hook_rot_k")] = drot_q, drot_k
    dq = rope_backward(drot_q, cos, sin, config.rope_pairing)  # (T, H, dh)
    dk = rope_backward(drot_k, cos, sin, config.rope_pairing)  # (T, Hkv, dh)
    dv = dv_heads.transpose(1, 0, 2)  # (T, Hkv, dh)
    grads[grad_name(f"{name}.hook_q")], grads[grad_name(f"{name}.hook_k")] = dq, dk
    grads[grad_name(f"{name}.hook_v")] = dv
    dx = _linear_backward(dq.reshape(T, H * dh), x, params, prefix + "q_proj", grads)  # (T, d)
    dx = dx + _linear_backward(dk.reshape(T, Hkv * dh), x, params, prefix + "k_proj", grads)  # (T, d)
    out: np.ndarray = dx + _linear_backward(dv.reshape(T, Hkv * dh), x, params, prefix + "v_proj", grads)  # (T, d)
    return out


def block_backward(dout: np.ndarray, params: Params, i: int, config: LlamaConfig, cos: np.ndarray,
                   sin: np.ndarray, taps: Taps, grads: Grads) -> np.ndarray:
    """One Llama block, resid_post = mid + MLP(RMSNorm2(mid)), mid = x + Attn(RMSNorm1(x)): the gradient of x."""
    p, name = f"model.layers.{i}.", f"blocks.{i}"
    grads[grad_name(f"{name}.hook_resid_post")] = dout  # (T, d)
    grads[grad_name(f"{name}.hook_mlp_out")] = dout  # (T, d)
    w2 = params[p + "post_attention_layernorm.weight"]  # (d,)
    ln2 = taps[f"{name}.ln2.hook_normalized"] * w2  # (T, d): the MLP's input, as the forward computed it
    dln2 = mlp_backward(dout, ln2, params, p + "mlp.", taps, f"{name}.mlp", grads)  # (T, d)
    dx2, dw2, dn2, ds2 = rms_norm_backward(dln2, w2, taps[f"{name}.ln2.hook_scale"],
                                           taps[f"{name}.ln2.hook_normalized"])  # (T, d), ...
    grads[grad_name(f"{name}.ln2.hook_normalized")], grads[grad_name(f"{name}.ln2.hook_scale")] = dn2, ds2
    grads[grad_name(p + "post_attention_layernorm.weight")] = dw2
    dmid = dout + dx2  # (T, d)
    grads[grad_name(f"{name}.hook_resid_mid")] = dmid
    grads[grad_name(f"{name}.hook_attn_out")] = dmid
    w1 = params[p + "input_layernorm.weight"]  # (d,)
    ln1 = taps[f"{name}.ln1.hook_normalized"] * w1  # (T, d): the attention's input
    dln1 = attention_backward(dmid, ln1, params, p + "self_attn.", config, cos, sin, taps, f"{name}.attn",
                              grads)  # (T, d)
    dx1, dw1, dn1, ds1 = rms_norm_backward(dln1, w1, taps[f"{name}.ln1.hook_scale"],
                                           taps[f"{name}.ln1.hook_normalized"])  # (T, d), ...
    grads[grad_name(f"{name}.ln1.hook_normalized")], grads[grad_name(f"{name}.ln1.hook_scale")] = dn1, ds1
    grads[grad_name(p + "input_layernorm.weight")] = dw1
    dx: np.ndarray = dmid + dx1  # (T, d)
    grads[grad_name(f"{name}.hook_resid_pre")] = dx
    return dx


def unembed_backward(dlogits: np.ndarray, params: Params, config: LlamaConfig, taps: Taps,
                     grads: Grads) -> tuple[np.ndarray, np.ndarray]:
    """logits = RMSNorm_f(x) @ head^T: the gradient of the last stream x (T, d) and the head's, dlogits^T @ ln
    (the caller files it under lm_head.weight, or adds it to the embedding's when tied)."""
    weight = params["model.norm.weight"]  # (d,)
    normed = taps["ln_final.hook_normalized"] * weight  # (T, d): the final norm's output
    head = params["model.embed_tokens.weight"] if config.tied else params["lm_head.weight"]  # (V, d)
    dhead = dlogits.T @ normed  # (V, d)
    dx, dweight, dn, dscale = rms_norm_backward(dlogits @ head, weight, taps["ln_final.hook_scale"],
                                                taps["ln_final.hook_normalized"])  # (T, d), ...
    grads[grad_name("ln_final.hook_normalized")], grads[grad_name("ln_final.hook_scale")] = dn, dscale
    grads[grad_name("model.norm.weight")] = dweight
    return dx, dhead


def backward(params: Params, config: LlamaConfig, tokens: Sequence[int],
             count: int | None = None) -> tuple[np.ndarray, Grads]:
    """One case: its loss (shape []) and every gradient of training.backward_names, in that order.

    The embedding's gradient is the lookup's (each position's stream gradient added to its token's row), plus the
    head's when tied. hook_embed is the stream itself (block 0's resid_pre): the same gradient. `count`: as GPT-2's.
    """
    tokens = list(tokens)
    taps = ln.forward(params, config, tokens, lens_rows=1)  # every tap (probs and the lens: one row, unused)
    embed = params["model.embed_tokens.weight"]  # (V, d)
    cos, sin = ln.rope_tables(len(tokens), config.d_head, config.rope_base, embed.dtype)  # (T, dh/2) each
    grads: Grads = {}
    loss, dlogits = cross_entropy_backward(taps["logits"], tokens, count)  # (), (T, V)
    grads[grad_name("logits")] = dlogits
    dx, dhead = unembed_backward(dlogits, params, config, taps, grads)  # (T, d), (V, d)
    for i in reversed(range(config.n_layer)):
        dx = block_backward(dx, params, i, config, cos, sin, taps, grads)  # (T, d)
    grads[grad_name("hook_embed")] = dx
    dlookup = np.zeros_like(embed)  # (V, d)
    np.add.at(dlookup, np.asarray(tokens, dtype=np.int64), dx)  # a repeated token's rows add up
    if config.tied:
        grads[grad_name("model.embed_tokens.weight")] = dhead + dlookup  # (V, d): both uses
    else:
        grads[grad_name("model.embed_tokens.weight")] = dlookup  # (V, d)
        grads[grad_name("lm_head.weight")] = dhead  # (V, d)
    names = backward_names(list(taps), list(param_shapes(config)))
    return loss, {name: grads[name] for name in names}


__all__ = [
    "adamw_step", "attention_backward", "backward", "batch_backward", "block_backward", "cross_entropy_backward",
    "mlp_backward", "rms_norm_backward", "rope_backward", "silu_backward", "softmax_backward", "train",
    "unembed_backward",
]
