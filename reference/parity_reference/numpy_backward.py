"""The reference's backward and training step by hand, in plain NumPy: the worked example of a training port.

`parity_reference/numpy_model.py` computes the forward; this module computes the gradient of the loss
(parity_reference/training.py: the mean next-token cross-entropy of one case) with respect to every tap on the
loss's path and every parameter, one function per forward step, walking the forward backwards:

    cross_entropy_backward, unembed_backward, layer_norm_backward, mlp_backward, gelu_backward,
    gelu_new_backward, attention_backward, softmax_backward, block_backward, backward

then the training step: `batch_backward` (one batch's loss and every parameter's gradient), `adamw_step` (one
parameter's AdamW update, torch.optim.AdamW's arithmetic) and `train` (the steps, recorded as the goldens
record them). The TypeScript port (ts_model/model/backward.ts) mirrors these functions, names and order.

Each step's backward takes the gradient of its output (`d...`, the adjoint) and the forward's values it needs,
read from the forward's taps (numpy_model.forward records every one) or recomputed with numpy_model's own
arithmetic (LayerNorm's output, from its `hook_normalized` tap), so nothing is stored twice. Tap gradients are
written into `grads` under `"{tap}.grad"` as they are reached; parameter gradients under `"{name}.grad"`.

Every array op runs in the parameters' dtype (float32 or float64): Python scalars are cast to it by NumPy's
promotion rules (NEP 50), and the exact GELU's erf is taken in float64 and rounded, as the forward does.
`batch_backward` and `train` work for any family whose backward module has this module's `backward` signature
(the Llama family's, parity_reference/llama_numpy_backward.py, passes itself as `family`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

import numpy as np

from parity_reference import numpy_model as nm
from parity_reference.config import GPTConfig, param_shapes
from parity_reference.training import TrainingSpec, backward_names, grad_name, predicted_cells, step_key

Params = dict[str, np.ndarray]
Taps = dict[str, np.ndarray]
Grads = dict[str, np.ndarray]

# math.erf on every element (NumPy has none; scipy is not a dependency), as numpy_model.py's forward takes it.
_erf = np.frompyfunc(math.erf, 1, 1)


def cross_entropy_backward(logits: np.ndarray, tokens: Sequence[int],
                           count: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The loss and its gradient with respect to the logits (T, V).

    loss = sum over t < T - 1 of (logsumexp(z_t) - z_t[tokens[t + 1]]), divided by `count` (by default the
    case's T - 1 predicted cells: its mean; a batch passes its total). dloss/dz_t = (softmax(z_t) - onehot) / count
    on the predicted rows; the last row predicts nothing: its gradient is 0.
    """
    dtype = logits.dtype.type
    n = predicted_cells(len(tokens))
    denom = dtype(n if count is None else count)
    rows, targets = np.arange(n), np.asarray(tokens[1:], dtype=np.int64)  # (T-1,) each
    z = logits[:-1]  # (T-1, V)
    shifted = z - z.max(axis=-1, keepdims=True)  # (T-1, V)
    e = np.exp(shifted)  # (T-1, V)
    total = e.sum(axis=-1, keepdims=True)  # (T-1, 1)
    loss = np.asarray((np.log(total[:, 0]) - shifted[rows, targets]).sum() / denom, dtype=dtype)  # ()
    dlogits = np.zeros_like(logits)  # (T, V)
    dlogits[:-1] = e / total  # (T-1, V): softmax
    dlogits[rows, targets] -= dtype(1.0)  # (T-1, V): minus the one-hot target
    dlogits[:-1] /= denom  # (T-1, V)
    return loss, dlogits


def unembed_backward(dlogits: np.ndarray, params: Params, config: GPTConfig, taps: Taps,
                     grads: Grads) -> tuple[np.ndarray, np.ndarray]:
    """logits = LN_f(x) @ wte^T: the gradient of the last stream x (T, d) and the unembedding's share of wte's.

    dln = dlogits @ wte; dwte (this use) = dlogits^T @ ln; then LN_f's backward. The embedding is tied: the caller
    (`backward`) adds this share to the lookup's.
    """
    weight, bias = params["ln_f.weight"], params["ln_f.bias"]  # (d,) each
    ln = taps["ln_final.hook_normalized"] * weight + bias  # (T, d): LN_f's output, as the forward computed it
    wte = params["wte.weight"]  # (V, d)
    dhead = dlogits.T @ ln  # (V, d)
    dln = dlogits @ wte  # (T, d)
    dx, dweight, dbias, dnormalized, dscale = layer_norm_backward(
        dln, weight, taps["ln_final.hook_scale"], taps["ln_final.hook_normalized"])  # (T, d), ...
    grads[grad_name("ln_final.hook_normalized")] = dnormalized  # (T, d)
    grads[grad_name("ln_final.hook_scale")] = dscale  # (T, 1)
    grads[grad_name("ln_f.weight")], grads[grad_name("ln_f.bias")] = dweight, dbias  # (d,) each
    return dx, dhead


def layer_norm_backward(dout: np.ndarray, weight: np.ndarray, scale: np.ndarray,
                        normalized: np.ndarray) -> tuple[np.ndarray, ...]:
    """out = n * w + b with n = (x - mean) / s, s = sqrt(var + eps): (dx, dweight, dbias, dn, ds).

    dn = dout * w; dw = sum_t dout * n; db = sum_t dout; ds = -sum_j dn_j n_j / s (the adjoint of the scale tap,
    through n = centered / s); dx = (dn - mean(dn) - n * mean(dn * n)) / s. `mean(dn)` is the mean's term: the
    gradient through x's mean, which every x_j shares.
    """
    dn = dout * weight  # (T, d)
    dweight = (dout * normalized).sum(axis=0)  # (d,)
    dbias = dout.sum(axis=0)  # (d,)
    dn_n = dn * normalized  # (T, d)
    dscale = -dn_n.sum(axis=-1, keepdims=True) / scale  # (T, 1)
    dx = (dn - dn.mean(axis=-1, keepdims=True) - normalized * dn_n.mean(axis=-1, keepdims=True)) / scale  # (T, d)
    return dx, dweight, dbias, dn, dscale


def mlp_backward(dout: np.ndarray, x: np.ndarray, params: Params, prefix: str, config: GPTConfig, taps: Taps,
                 name: str, grads: Grads) -> np.ndarray:
    """out = act(x @ W_fc + b_fc) @ W_proj + b_proj: the gradient of the MLP's input x (T, d).

    dpost = dout @ W_proj^T; dW_proj = post^T @ dout; dpre = act'(pre) * dpost; dW_fc = x^T @ dpre;
    dx = dpre @ W_fc^T; each bias's gradient sums its output's gradient over positions.
    """
    pre, post = taps[f"{name}.hook_pre"], taps[f"{name}.hook_post"]  # (T, d_mlp) each
    w_proj = params[prefix + "c_proj.weight"]  # (d_mlp, d)
    grads[grad_name(prefix + "c_proj.weight")] = post.T @ dout  # (d_mlp, d)
    grads[grad_name(prefix + "c_proj.bias")] = dout.sum(axis=0)  # (d,)
    dpost = dout @ w_proj.T  # (T, d_mlp)
    grads[grad_name(f"{name}.hook_post")] = dpost
    dpre = gelu_new_backward(pre, dpost) if config.activation == "gelu_new" else gelu_backward(pre, dpost)
    grads[grad_name(f"{name}.hook_pre")] = dpre  # (T, d_mlp)
    w_fc = params[prefix + "c_fc.weight"]  # (d, d_mlp)
    grads[grad_name(prefix + "c_fc.weight")] = x.T @ dpre  # (d, d_mlp)
    grads[grad_name(prefix + "c_fc.bias")] = dpre.sum(axis=0)  # (d_mlp,)
    dx: np.ndarray = dpre @ w_fc.T  # (T, d)
    return dx


def gelu_backward(x: np.ndarray, dout: np.ndarray) -> np.ndarray:
    """The exact GELU, x Phi(x): its derivative Phi(x) + x phi(x), with Phi = (1 + erf(x / sqrt 2)) / 2 and
    phi(x) = exp(-x^2 / 2) / sqrt(2 pi) (the normal's CDF and density); erf in float64, rounded, as the forward."""
    dtype = x.dtype.type
    u = (x / dtype(math.sqrt(2.0))).astype(np.float64)  # like x: scaled in x's dtype, as the forward does
    erf = np.asarray(_erf(u), dtype=np.float64).astype(x.dtype)  # like x
    cdf = dtype(0.5) * (dtype(1.0) + erf)  # like x
    pdf = np.exp(dtype(-0.5) * x * x) / dtype(math.sqrt(2.0 * math.pi))  # like x
    out: np.ndarray = dout * (cdf + x * pdf)  # like x
    return out


def gelu_new_backward(x: np.ndarray, dout: np.ndarray) -> np.ndarray:
    """GPT-2's tanh GELU, x/2 (1 + tanh(u)) with u = c (x + a x^3), c = sqrt(2/pi), a = 0.044715: its derivative
    (1 + tanh u) / 2 + x/2 (1 - tanh^2 u) c (1 + 3 a x^2)."""
    dtype = x.dtype.type
    c, a = dtype(math.sqrt(2.0 / math.pi)), dtype(0.044715)
    th = np.tanh(c * (x + a * np.power(x, 3)))  # like x
    slope = dtype(0.5) * (dtype(1.0) + th) + dtype(0.5) * x * (dtype(1.0) - th * th) * c * (
        dtype(1.0) + dtype(3.0) * a * x * x)  # like x
    out: np.ndarray = dout * slope  # like x
    return out


def attention_backward(dout: np.ndarray, x: np.ndarray, params: Params, prefix: str, config: GPTConfig,
                       taps: Taps, name: str, grads: Grads) -> np.ndarray:
    """Multi-head attention on LN1's output x (T, d): the gradient of x, and of every tap and weight on the way.

    c_proj: dz = dout @ W_proj^T. z = pattern @ v per head: dpattern = dz @ v^T, dv = pattern^T @ dz. The softmax:
    dscores (`softmax_backward`; 0 at masked cells, whose probability is 0). scores = q k^T / sqrt(dh):
    dq = dscores k / sqrt(dh), dk = dscores^T q / sqrt(dh). q, k, v are column blocks of x @ W_attn + b_attn:
    dW_attn = x^T @ [dq dk dv], dx = [dq dk dv] @ W_attn^T.
    """
    T, d, H, dh = x.shape[0], config.d_model, config.n_head, config.d_head
    q, k, v, z = (taps[f"{name}.hook_{t}"] for t in ("q", "k", "v", "z"))  # (T, H, dh) each
    pattern = taps[f"{name}.hook_pattern"]  # (H, T, T)
    w_proj = params[prefix + "c_proj.weight"]  # (d, d)
    grads[grad_name(prefix + "c_proj.weight")] = z.reshape(T, d).T @ dout  # (d, d)
    grads[grad_name(prefix + "c_proj.bias")] = dout.sum(axis=0)  # (d,)
    dz = (dout @ w_proj.T).reshape(T, H, dh)  # (T, H, dh)
    grads[grad_name(f"{name}.hook_z")] = dz
    dzh = dz.transpose(1, 0, 2)  # (H, T, dh)
    dpattern = dzh @ v.transpose(1, 2, 0)  # (H, T, T): dz_i . v_j, every cell (masked ones too)
    grads[grad_name(f"{name}.hook_pattern")] = dpattern
    dvh = pattern.transpose(0, 2, 1) @ dzh  # (H, T, dh)
    dscores = softmax_backward(pattern, dpattern)  # (H, T, T)
    grads[grad_name(f"{name}.hook_attn_scores")] = dscores
    dqk = dscores / x.dtype.type(math.sqrt(dh))  # (H, T, T): through scores = q k^T / sqrt(dh)
    dqh = dqk @ k.transpose(1, 0, 2)  # (H, T, dh)
    dkh = dqk.transpose(0, 2, 1) @ q.transpose(1, 0, 2)  # (H, T, dh)
    dq, dk, dv = dqh.transpose(1, 0, 2), dkh.transpose(1, 0, 2), dvh.transpose(1, 0, 2)  # (T, H, dh) each
    grads[grad_name(f"{name}.hook_q")], grads[grad_name(f"{name}.hook_k")] = dq, dk
    grads[grad_name(f"{name}.hook_v")] = dv
    dqkv = np.concatenate([dq.reshape(T, d), dk.reshape(T, d), dv.reshape(T, d)], axis=-1)  # (T, 3d)
    w_attn = params[prefix + "c_attn.weight"]  # (d, 3d)
    grads[grad_name(prefix + "c_attn.weight")] = x.T @ dqkv  # (d, 3d)
    grads[grad_name(prefix + "c_attn.bias")] = dqkv.sum(axis=0)  # (3d,)
    dx: np.ndarray = dqkv @ w_attn.T  # (T, d)
    return dx


def softmax_backward(probs: np.ndarray, dprobs: np.ndarray) -> np.ndarray:
    """p = softmax(s) over the last axis, from its OUTPUT p: ds = p * (dp - sum_j dp_j p_j). A cell with p = 0
    (a masked score, -inf) gets exactly 0."""
    out: np.ndarray = probs * (dprobs - (dprobs * probs).sum(axis=-1, keepdims=True))  # like p
    return out


def block_backward(dout: np.ndarray, params: Params, i: int, config: GPTConfig, taps: Taps,
                   grads: Grads) -> np.ndarray:
    """One pre-LN block, resid_post = mid + MLP(LN2(mid)), mid = x + Attn(LN1(x)): the gradient of its input x.

    Each residual add passes its gradient to both terms: dmid = dout + LN2's backward of the MLP's; dx = dmid +
    LN1's backward of the attention's.
    """
    p, name = f"h.{i}.", f"blocks.{i}"
    grads[grad_name(f"{name}.hook_resid_post")] = dout  # (T, d)
    grads[grad_name(f"{name}.hook_mlp_out")] = dout  # (T, d)
    w2, b2 = params[p + "ln_2.weight"], params[p + "ln_2.bias"]  # (d,) each
    ln2 = taps[f"{name}.ln2.hook_normalized"] * w2 + b2  # (T, d): the MLP's input, as the forward computed it
    dln2 = mlp_backward(dout, ln2, params, p + "mlp.", config, taps, f"{name}.mlp", grads)  # (T, d)
    dx2, dw2, db2, dn2, ds2 = layer_norm_backward(dln2, w2, taps[f"{name}.ln2.hook_scale"],
                                                  taps[f"{name}.ln2.hook_normalized"])  # (T, d), ...
    grads[grad_name(f"{name}.ln2.hook_normalized")], grads[grad_name(f"{name}.ln2.hook_scale")] = dn2, ds2
    grads[grad_name(p + "ln_2.weight")], grads[grad_name(p + "ln_2.bias")] = dw2, db2
    dmid = dout + dx2  # (T, d)
    grads[grad_name(f"{name}.hook_resid_mid")] = dmid
    grads[grad_name(f"{name}.hook_attn_out")] = dmid
    w1, b1 = params[p + "ln_1.weight"], params[p + "ln_1.bias"]  # (d,) each
    ln1 = taps[f"{name}.ln1.hook_normalized"] * w1 + b1  # (T, d): the attention's input
    dln1 = attention_backward(dmid, ln1, params, p + "attn.", config, taps, f"{name}.attn", grads)  # (T, d)
    dx1, dw1, db1, dn1, ds1 = layer_norm_backward(dln1, w1, taps[f"{name}.ln1.hook_scale"],
                                                  taps[f"{name}.ln1.hook_normalized"])  # (T, d), ...
    grads[grad_name(f"{name}.ln1.hook_normalized")], grads[grad_name(f"{name}.ln1.hook_scale")] = dn1, ds1
    grads[grad_name(p + "ln_1.weight")], grads[grad_name(p + "ln_1.bias")] = dw1, db1
    dx: np.ndarray = dmid + dx1  # (T, d)
    grads[grad_name(f"{name}.hook_resid_pre")] = dx
    return dx


def backward(params: Params, config: GPTConfig, tokens: Sequence[int],
             count: int | None = None) -> tuple[np.ndarray, Grads]:
    """One case: its loss (shape []) and every gradient of training.backward_names, in that order.

    The forward (numpy_model.forward) records every tap; the backward walks it from the loss to the embedding.
    The embedding is tied: wte's gradient is the sum of its two uses, the unembedding's (dlogits^T @ LN_f's
    output) and the lookup's (each position's stream gradient added to its token's row). `count` divides the
    summed cross-entropy (default: the case's T - 1 cells; `batch_backward` passes the batch's total).
    """
    tokens = list(tokens)
    T = len(tokens)
    taps = nm.forward(params, config, tokens, lens_rows=1)  # every tap (probs and the lens: one row, unused)
    grads: Grads = {}
    loss, dlogits = cross_entropy_backward(taps["logits"], tokens, count)  # (), (T, V)
    grads[grad_name("logits")] = dlogits
    dx, dhead = unembed_backward(dlogits, params, config, taps, grads)  # (T, d), (V, d)
    for i in reversed(range(config.n_layer)):
        dx = block_backward(dx, params, i, config, taps, grads)  # (T, d)
    grads[grad_name("hook_pos_embed")] = dx  # x = embed + pos_embed: both get the stream's gradient
    grads[grad_name("hook_embed")] = dx
    if config.positions == "learned":
        dwpe = np.zeros_like(params["wpe.weight"])  # (n_ctx, d): rows past T get nothing
        dwpe[:T] = dx
        grads[grad_name("wpe.weight")] = dwpe
    dlookup = np.zeros_like(params["wte.weight"])  # (V, d)
    np.add.at(dlookup, np.asarray(tokens, dtype=np.int64), dx)  # a repeated token's rows add up
    grads[grad_name("wte.weight")] = dhead + dlookup  # (V, d): tied, both uses
    names = backward_names(list(taps), list(param_shapes(config)))
    return loss, {name: grads[name] for name in names}


def batch_backward(params: Params, config: Any, batch: Sequence[Sequence[int]], grads: Grads | None = None,
                   family: ModuleType | None = None) -> tuple[np.ndarray, Grads]:
    """The batch's loss (one mean over all its predicted cells) and every parameter's gradient, by name.

    Each case's backward divides its summed cross-entropy by the batch's total count, so the batch's loss and
    gradients are plain sums over its cases. The gradients are ADDED to `grads` (as torch adds into `.grad`):
    `train` passes a fresh zero per step. `family`: the family's backward module (its `backward` and its
    config's parameters); by default this one (GPT-2).
    """
    if family is None and not isinstance(config, GPTConfig):
        raise TypeError(f"batch_backward: pass the family's backward module as `family` for a {type(config).__name__}")
    case_backward = backward if family is None else family.backward
    total = sum(predicted_cells(len(t)) for t in batch)
    if grads is None:
        grads = {name: np.zeros_like(p) for name, p in params.items()}
    loss = None
    for tokens in batch:
        part, case = case_backward(params, config, tokens, count=total)  # (), {name: grad}
        loss = part if loss is None else loss + part  # ()
        for name in params:  # each case gradient dropped once summed: the case's and the sum not both held
            grads[name] = grads[name] + case.pop(grad_name(name))  # like the parameter
        del case
    assert loss is not None
    return np.asarray(loss), grads


def adamw_step(p: np.ndarray, g: np.ndarray, m: np.ndarray, v: np.ndarray, t: int, lr: float,
               spec: TrainingSpec, decays: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One AdamW update of one parameter at step t (1-based): the new (p, m, v), torch.optim.AdamW's arithmetic.

    p <- p (1 - lr wd) where it decays; m <- m + (1 - b1)(g - m) (torch's lerp, = b1 m + (1 - b1) g);
    v <- b2 v + (1 - b2) g^2; p <- p - (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps).
    """
    b1, b2 = spec.betas
    if decays:
        p = p * (1.0 - lr * spec.weight_decay)  # like p: decoupled weight decay
    m = m + (1.0 - b1) * (g - m)  # like p
    v = v * b2 + (1.0 - b2) * g * g  # like p
    step_size = lr / (1.0 - b1**t)  # a Python float (float64), as torch computes it
    denom = np.sqrt(v) / (1.0 - b2**t) ** 0.5 + spec.eps  # like p
    p = p + (-step_size) * m / denom  # like p
    return p, m, v


def train(params: Mapping[str, np.ndarray], config: Any, batch: Sequence[Sequence[int]], spec: TrainingSpec,
          family: ModuleType | None = None) -> dict[str, np.ndarray]:
    """`spec.steps` steps of AdamW on `batch` from `params` (not modified): the records training.train_names lists.

    Step s: a fresh (zero) gradient; the batch's loss and gradients; the global gradient norm
    sqrt(sum over parameters of sum g^2), before the update; then each parameter's AdamW update with lr[s - 1]
    and t = s, weight decay where `spec.decays(name)`.
    """
    current = dict(params)  # adamw_step makes new arrays (never writes in place): the caller's stay as given
    # AdamW's state, zero until a parameter's first update: made then, not held through step 1's backward
    m: dict[str, np.ndarray] = {}
    v: dict[str, np.ndarray] = {}
    out: dict[str, np.ndarray] = {}
    for s in range(1, spec.steps + 1):
        grads = {name: np.zeros_like(p) for name, p in current.items()}  # zeroed every step
        loss, grads = batch_backward(current, config, batch, grads, family)
        sq = None
        for g in grads.values():
            part = (g * g).sum()  # ()
            sq = part if sq is None else sq + part
        assert sq is not None
        norm = np.asarray(np.sqrt(sq))  # ()
        for name in current:
            m0 = m[name] if name in m else np.zeros_like(current[name])
            v0 = v[name] if name in v else np.zeros_like(current[name])
            current[name], m[name], v[name] = adamw_step(current[name], grads[name], m0, v0, s,
                                                          spec.lr[s - 1], spec, spec.decays(name))
            del m0, v0
            if s == spec.steps:  # nothing reads them again: dropped as the last step goes
                del m[name], v[name], grads[name]
        out[step_key(s, "loss")] = loss
        out[step_key(s, "grad_norm")] = norm
        for name, p in current.items():
            out[step_key(s, name)] = p
    return out


__all__ = [
    "adamw_step", "attention_backward", "backward", "batch_backward", "block_backward", "cross_entropy_backward",
    "gelu_backward", "gelu_new_backward", "layer_norm_backward", "mlp_backward", "softmax_backward", "train",
    "unembed_backward",
]
