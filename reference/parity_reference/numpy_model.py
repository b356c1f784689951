"""The reference model in plain NumPy: the whole forward pass and incremental decoding, every tap.

It mirrors `parity_reference/model.py` function by function, in the same order and with the same names,
in the spirit of the lesson's NumPy snippet: short, commented, nothing clever. The `numpy` backend
runs it (parity_harness/_backends/numpy_backend.py), and parity's core uses it as its oracle where torch
may be absent (`parity check-backend`'s derived fixtures, the stress fixture's search for hard cases).

Everything is computed in the dtype of the parameters it is given: every intermediate stays in
it. Two details keep float64 at round-off:
- positions are computed in float64 and rounded once to the dtype, as the reference does;
- the exact GELU needs erf, which NumPy lacks: `math.erf` (correctly rounded to float64) is
  applied element by element in float64, then cast. scipy would do it too, but is not a dependency.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from parity_reference.config import GPTConfig

Params = dict[str, np.ndarray]
Taps = dict[str, np.ndarray]

# math.erf applied to every element of an array: NumPy has no erf, and scipy is not a dependency.
# (A Python-level loop: fine for a toy model.)
_erf = np.frompyfunc(math.erf, 1, 1)


def sinusoidal_positions(n_pos: int, d_model: int, dtype: Any) -> np.ndarray:
    """The 2017 paper's positions: sin on even columns, cos on odd; float64, then rounded once to `dtype`."""
    pos = np.arange(n_pos, dtype=np.float64)[:, None]  # (T, 1)
    pair = np.arange(0, d_model, 2, dtype=np.float64)  # (d/2,) = 2i
    inv_freq = np.power(10000.0, -pair / d_model)  # (d/2,)
    angle = pos * inv_freq  # (T, d/2)
    table = np.zeros((n_pos, d_model), dtype=np.float64)  # (T, d)
    table[:, 0::2] = np.sin(angle)
    table[:, 1::2] = np.cos(angle)
    return table.astype(dtype)  # (T, d)


def layer_norm(
    x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float, taps: Taps, name: str
) -> np.ndarray:
    """LayerNorm over the last axis with the biased variance (divide by d, not d - 1)."""
    mean = x.mean(axis=-1, keepdims=True)  # (T, 1)
    centered = x - mean  # (T, d)
    var = (centered * centered).mean(axis=-1, keepdims=True)  # (T, 1)
    scale = np.sqrt(var + x.dtype.type(eps))  # (T, 1)
    taps[f"{name}.hook_scale"] = scale
    normalized = centered / scale  # (T, d)
    taps[f"{name}.hook_normalized"] = normalized
    out: np.ndarray = normalized * weight + bias  # (T, d)
    return out


def gelu(x: np.ndarray) -> np.ndarray:
    """The exact GELU, x/2 * (1 + erf(x / sqrt(2))); erf is taken in float64, then cast to x's dtype."""
    u = (x / math.sqrt(2.0)).astype(np.float64)  # like x: scaled in x's dtype, as the reference does
    erf = np.asarray(_erf(u), dtype=np.float64).astype(x.dtype)  # like x
    out: np.ndarray = 0.5 * x * (1.0 + erf)  # like x
    return out


def gelu_new(x: np.ndarray) -> np.ndarray:
    """GPT-2's own activation, the tanh approximation x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))), in x's
    dtype (NumPy has tanh), as transformers' `NewGELUActivation` writes it."""
    inner = x.dtype.type(math.sqrt(2.0 / math.pi)) * (x + x.dtype.type(0.044715) * np.power(x, 3))  # like x
    out: np.ndarray = 0.5 * x * (1.0 + np.tanh(inner))  # like x
    return out


def softmax(z: np.ndarray) -> np.ndarray:
    """Softmax over the last axis; -inf cells (the causal mask) get exactly 0."""
    e = np.exp(z - z.max(axis=-1, keepdims=True))  # like z; exp(-inf) = 0
    out: np.ndarray = e / e.sum(axis=-1, keepdims=True)  # like z
    return out


def attention(
    x: np.ndarray, params: Params, prefix: str, config: GPTConfig, taps: Taps, name: str
) -> np.ndarray:
    """Multi-head self-attention on LN1's output; returns c_proj(z) with its bias."""
    T, d, H, dh = x.shape[0], config.d_model, config.n_head, config.d_head
    qkv = x @ params[prefix + "c_attn.weight"] + params[prefix + "c_attn.bias"]  # (T, 3d), Conv1D: x @ W
    q, k, v = qkv[:, :d], qkv[:, d : 2 * d], qkv[:, 2 * d :]  # 3 x (T, d)
    q = q.reshape(T, H, dh)  # (T, H, dh)
    k = k.reshape(T, H, dh)  # (T, H, dh)
    v = v.reshape(T, H, dh)  # (T, H, dh)
    taps[f"{name}.hook_q"], taps[f"{name}.hook_k"], taps[f"{name}.hook_v"] = q, k, v
    qh, kh, vh = q.transpose(1, 0, 2), k.transpose(1, 0, 2), v.transpose(1, 0, 2)  # (H, T, dh) each
    scores = (qh / x.dtype.type(math.sqrt(dh))) @ kh.transpose(0, 2, 1)  # (H, T, T): query i (scaled first), key j
    if config.causal:
        future = np.triu(np.ones((T, T), dtype=bool), k=1)  # (T, T): key j > query i
        scores[:, future] = -np.inf  # (H, T, T): no peeking at the future
    taps[f"{name}.hook_attn_scores"] = scores
    pattern = softmax(scores)  # (H, T, T): over keys
    taps[f"{name}.hook_pattern"] = pattern
    z = (pattern @ vh).transpose(1, 0, 2)  # (T, H, dh)
    taps[f"{name}.hook_z"] = z
    z_flat = z.reshape(T, d)  # (T, d): heads side by side
    out: np.ndarray = z_flat @ params[prefix + "c_proj.weight"] + params[prefix + "c_proj.bias"]  # (T, d)
    return out


def mlp(x: np.ndarray, params: Params, prefix: str, config: GPTConfig, taps: Taps, name: str) -> np.ndarray:
    """The position-wise network d -> d_mlp -> d with the config's activation: the exact GELU, or gelu_new."""
    pre = x @ params[prefix + "c_fc.weight"] + params[prefix + "c_fc.bias"]  # (T, d_mlp)
    taps[f"{name}.hook_pre"] = pre
    post = gelu_new(pre) if config.activation == "gelu_new" else gelu(pre)  # (T, d_mlp)
    taps[f"{name}.hook_post"] = post
    out: np.ndarray = post @ params[prefix + "c_proj.weight"] + params[prefix + "c_proj.bias"]  # (T, d)
    return out


def block(x: np.ndarray, params: Params, i: int, config: GPTConfig, taps: Taps) -> np.ndarray:
    """One pre-LN GPT-2 block: x + Attn(LN1(x)), then + MLP(LN2(.))."""
    p, name = f"h.{i}.", f"blocks.{i}"
    taps[f"{name}.hook_resid_pre"] = x
    ln1 = layer_norm(
        x, params[p + "ln_1.weight"], params[p + "ln_1.bias"], config.ln_eps, taps, f"{name}.ln1"
    )
    attn_out = attention(ln1, params, p + "attn.", config, taps, f"{name}.attn")  # (T, d)
    taps[f"{name}.hook_attn_out"] = attn_out
    resid_mid = x + attn_out  # (T, d)
    taps[f"{name}.hook_resid_mid"] = resid_mid
    ln2 = layer_norm(
        resid_mid, params[p + "ln_2.weight"], params[p + "ln_2.bias"], config.ln_eps, taps, f"{name}.ln2"
    )
    mlp_out = mlp(ln2, params, p + "mlp.", config, taps, f"{name}.mlp")  # (T, d)
    taps[f"{name}.hook_mlp_out"] = mlp_out
    resid_post: np.ndarray = resid_mid + mlp_out  # (T, d)
    taps[f"{name}.hook_resid_post"] = resid_post
    return resid_post


def unembed(x: np.ndarray, params: Params, config: GPTConfig, taps: Taps, name: str) -> np.ndarray:
    """Final LayerNorm, then scores against every word: tied embeddings, logits = LN_f(x) @ wte^T."""
    ln = layer_norm(x, params["ln_f.weight"], params["ln_f.bias"], config.ln_eps, taps, name)  # (T, d)
    logits: np.ndarray = ln @ params["wte.weight"].T  # (T, V)
    return logits


def forward(params: Params, config: GPTConfig, tokens: list[int], lens_rows: int | None = None) -> Taps:
    """The whole pass for one sequence: every tap, in dataflow order, in the parameters' dtype.

    `lens_rows`: `probs` and the logit lens for the last min(T, lens_rows) positions only (the
    fixture's "rows" of those taps, docs/fixture-format.md); None: every position.
    """
    taps: Taps = {}
    T = len(tokens)
    wte = params["wte.weight"]  # (V, d)
    embed = wte[np.asarray(tokens, dtype=np.int64)]  # (T, d)
    taps["hook_embed"] = embed
    if config.positions == "learned":
        pos_embed = params["wpe.weight"][:T]  # (T, d)
    else:
        pos_embed = sinusoidal_positions(T, config.d_model, wte.dtype)  # (T, d)
    taps["hook_pos_embed"] = pos_embed
    x = embed + pos_embed  # (T, d): the residual stream
    streams = [x]  # stream k = input of block k; stream L = output of the last block
    for i in range(config.n_layer):
        x = block(x, params, i, config, taps)  # (T, d)
        streams.append(x)
    logits = unembed(x, params, config, taps, "ln_final")  # (T, V)
    taps["logits"] = logits
    last = slice(None) if lens_rows is None else slice(-lens_rows, None)  # the positions kept
    taps["probs"] = softmax(logits[last])  # (T or rows, V)
    # The logit lens: read stream k as if it were the last. Every stream's rows in one product, so the (V, d)
    # table is read once, not once per stream (row by row, the same LayerNorm and dot products).
    kept = [stream[last] for stream in streams]  # L + 1 of (T or rows, d)
    lens = unembed(np.concatenate(kept), params, config, {}, "")  # ((L + 1) * rows, V)
    for k, part in enumerate(np.split(lens, len(kept))):
        taps[f"logit_lens.{k}"] = softmax(part)  # (T or rows, V)
    return taps


# -- incremental decoding: a key/value cache, keys and values [H, T, d_head] per block ---------------

Cache = list[tuple[np.ndarray, np.ndarray]]  # per block: (keys (H, T, dh), values (H, T, dh))


def prefill(params: Params, config: GPTConfig, tokens: list[int]) -> tuple[np.ndarray, Cache]:
    """The prompt through the full forward: its last position's logits (V,) and every block's cache."""
    taps = forward(params, config, tokens)
    cache = [
        (taps[f"blocks.{i}.attn.hook_k"].transpose(1, 0, 2), taps[f"blocks.{i}.attn.hook_v"].transpose(1, 0, 2))
        for i in range(config.n_layer)
    ]  # (T, H, dh) -> (H, T, dh), keys and values
    return taps["logits"][-1], cache


def attention_step(
    x: np.ndarray, params: Params, prefix: str, config: GPTConfig, cache_k: np.ndarray, cache_v: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Attention of one new position (x: (1, d)) over the cached positions and itself; c_proj(z), grown cache."""
    d, H, dh = config.d_model, config.n_head, config.d_head
    pos = cache_k.shape[1]  # the new token's position: T positions are cached before it
    qkv = x @ params[prefix + "c_attn.weight"] + params[prefix + "c_attn.bias"]  # (1, 3d), Conv1D: x @ W
    q, k, v = qkv[:, :d], qkv[:, d : 2 * d], qkv[:, 2 * d :]  # 3 x (1, d)
    q_heads = q.reshape(1, H, dh).transpose(1, 0, 2)  # (H, 1, dh)
    keys = np.concatenate([cache_k, k.reshape(1, H, dh).transpose(1, 0, 2)], axis=1)  # (H, T + 1, dh)
    values = np.concatenate([cache_v, v.reshape(1, H, dh).transpose(1, 0, 2)], axis=1)  # (H, T + 1, dh)
    step_scores = (q_heads / x.dtype.type(math.sqrt(dh))) @ keys.transpose(0, 2, 1)  # (H, 1, T + 1)
    if config.causal:
        after = np.arange(pos + 1) > pos  # (T + 1,): keys after the query's position (none)
        step_scores[:, :, after] = -np.inf  # (H, 1, T + 1)
    weights = softmax(step_scores)  # (H, 1, T + 1): over keys
    z = (weights @ values).transpose(1, 0, 2).reshape(1, d)  # (1, d): heads side by side
    out: np.ndarray = z @ params[prefix + "c_proj.weight"] + params[prefix + "c_proj.bias"]  # (1, d)
    return out, keys, values


def block_step(
    x: np.ndarray, params: Params, i: int, config: GPTConfig, cache_k: np.ndarray, cache_v: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Block i on one new position (x: (1, d)): the block's output (1, d) and its grown cache."""
    p = f"h.{i}."
    ln1 = layer_norm(x, params[p + "ln_1.weight"], params[p + "ln_1.bias"], config.ln_eps, {}, "")  # (1, d)
    attn_out, keys, values = attention_step(ln1, params, p + "attn.", config, cache_k, cache_v)  # (1, d)
    mid = x + attn_out  # (1, d)
    ln2 = layer_norm(mid, params[p + "ln_2.weight"], params[p + "ln_2.bias"], config.ln_eps, {}, "")  # (1, d)
    out: np.ndarray = mid + mlp(ln2, params, p + "mlp.", config, {}, "")  # (1, d)
    return out, keys, values


def decode_step(params: Params, config: GPTConfig, token: int, cache: Cache) -> tuple[np.ndarray, Cache]:
    """One new token at position T, the cache's length: its logits (V,) and the cache at T + 1."""
    pos = cache[0][0].shape[1]  # T: positions already cached
    if pos + 1 > config.n_ctx:
        raise ValueError(f"position {pos} is past the context ({config.n_ctx})")
    if not 0 <= token < config.vocab_size:
        raise ValueError(f"token id {token} out of range [0, {config.vocab_size})")
    wte = params["wte.weight"]  # (V, d)
    embed = wte[[token]]  # (1, d)
    if config.positions == "learned":
        pos_embed = params["wpe.weight"][pos : pos + 1]  # (1, d)
    else:
        pos_embed = sinusoidal_positions(pos + 1, config.d_model, wte.dtype)[pos:]  # (1, d): position T's row
    x = embed + pos_embed  # (1, d)
    grown: Cache = []
    for i in range(config.n_layer):
        x, keys, values = block_step(x, params, i, config, *cache[i])  # (1, d)
        grown.append((keys, values))
    return unembed(x, params, config, {}, "")[0], grown  # (V,)


def decode(
    params: Params, config: GPTConfig, prompt: list[int], steps: int, feed: list[int] | None = None
) -> list[tuple[np.ndarray, Cache]]:
    """Prefill, then `steps` decode steps feeding `feed`, or the greedy token (first argmax) without it."""
    logits, cache = prefill(params, config, prompt)
    out = [(logits, cache)]
    for k in range(steps):
        token = feed[k] if feed is not None else int(np.argmax(logits))
        logits, cache = decode_step(params, config, token, cache)
        out.append((logits, cache))
    return out
