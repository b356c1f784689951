"""The Llama family's reference in plain NumPy: the whole forward pass and incremental decoding, every tap.

It mirrors `parity_reference/llama_model.py` function by function, in the same order and with the same
names. Everything is computed in the dtype of the parameters it is given; the RoPE tables are
computed in float64 and rounded once, as the PyTorch reference does.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from parity_reference.llama_config import LlamaConfig

Params = dict[str, np.ndarray]
Taps = dict[str, np.ndarray]


def rope_tables(n_pos: int, d_head: int, base: float, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of every position's angle for each pair, (T, d_head/2) each; float64, rounded once."""
    pos = np.arange(n_pos, dtype=np.float64)[:, None]  # (T, 1)
    pair = np.arange(0, d_head, 2, dtype=np.float64)  # (dh/2,) = 2j
    inv_freq = np.power(np.float64(base), -pair / d_head)  # (dh/2,)
    angle = pos * inv_freq  # (T, dh/2)
    return np.cos(angle).astype(dtype), np.sin(angle).astype(dtype)  # (T, dh/2) each


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float, taps: Taps, name: str) -> np.ndarray:
    """RMSNorm over the last axis: x / sqrt(mean(x^2) + eps), times the gain (no centering, no bias)."""
    scale = np.sqrt((x * x).mean(axis=-1, keepdims=True) + x.dtype.type(eps))  # (T, 1)
    taps[f"{name}.hook_scale"] = scale
    normalized = x / scale  # (T, d)
    taps[f"{name}.hook_normalized"] = normalized
    out: np.ndarray = normalized * weight  # (T, d)
    return out


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, pairing: str) -> np.ndarray:
    """Rotate each pair of x's last axis by its position's angle; x (T, heads, dh), cos and sin (T, dh/2).

    "half" pairs column j with j + dh/2 (Hugging Face's `rotate_half`); "interleaved" pairs 2j with 2j + 1 (Meta).
    """
    c, s = cos[:, None, :], sin[:, None, :]  # (T, 1, dh/2): the same angle for every head
    if pairing == "half":
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]  # (T, heads, dh/2) each
        return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)  # (T, heads, dh)
    x1, x2 = x[..., 0::2], x[..., 1::2]  # (T, heads, dh/2) each: even and odd columns
    return np.stack([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).reshape(x.shape)  # (T, heads, dh)


def expand_kv(kv: np.ndarray, n_rep: int) -> np.ndarray:
    """Key/value heads (Hkv, T, dh) to one per query head (H, T, dh): head h reads kv head h // n_rep."""
    return np.repeat(kv, n_rep, axis=-3)  # (H, T, dh)


def _linear(x: np.ndarray, params: Params, name: str) -> np.ndarray:
    """nn.Linear: x @ W.T, plus the bias when the parameters have one."""
    out: np.ndarray = x @ params[name + ".weight"].T  # (T, out)
    bias = params.get(name + ".bias")
    return out if bias is None else out + bias


def softmax(z: np.ndarray) -> np.ndarray:
    """Softmax over the last axis; -inf cells (the causal mask) get exactly 0."""
    e = np.exp(z - z.max(axis=-1, keepdims=True))  # like z; exp(-inf) = 0
    out: np.ndarray = e / e.sum(axis=-1, keepdims=True)  # like z
    return out


def attention(
    x: np.ndarray, params: Params, prefix: str, config: LlamaConfig, cos: np.ndarray, sin: np.ndarray,
    taps: Taps, name: str,
) -> np.ndarray:
    """Grouped-query self-attention with RoPE on the first RMSNorm's output; returns o_proj(z)."""
    T, H, Hkv, dh = x.shape[0], config.n_head, config.n_kv_heads, config.d_head
    q = _linear(x, params, prefix + "q_proj").reshape(T, H, dh)  # (T, H, dh)
    k = _linear(x, params, prefix + "k_proj").reshape(T, Hkv, dh)  # (T, Hkv, dh)
    v = _linear(x, params, prefix + "v_proj").reshape(T, Hkv, dh)  # (T, Hkv, dh)
    taps[f"{name}.hook_q"], taps[f"{name}.hook_k"], taps[f"{name}.hook_v"] = q, k, v
    q = apply_rope(q, cos, sin, config.rope_pairing)  # (T, H, dh)
    k = apply_rope(k, cos, sin, config.rope_pairing)  # (T, Hkv, dh)
    taps[f"{name}.hook_rot_q"], taps[f"{name}.hook_rot_k"] = q, k
    qh = q.transpose(1, 0, 2)  # (H, T, dh)
    kh = expand_kv(k.transpose(1, 0, 2), config.n_rep)  # (H, T, dh)
    vh = expand_kv(v.transpose(1, 0, 2), config.n_rep)  # (H, T, dh)
    scores = (qh @ kh.transpose(0, 2, 1)) / x.dtype.type(math.sqrt(dh))  # (H, T, T): query i, key j
    if config.causal:
        future = np.triu(np.ones((T, T), dtype=bool), k=1)  # (T, T): key j > query i
        scores[:, future] = -np.inf  # (H, T, T)
    taps[f"{name}.hook_attn_scores"] = scores
    pattern = softmax(scores)  # (H, T, T): over keys
    taps[f"{name}.hook_pattern"] = pattern
    z = (pattern @ vh).transpose(1, 0, 2)  # (T, H, dh)
    taps[f"{name}.hook_z"] = z
    return _linear(z.reshape(T, H * dh), params, prefix + "o_proj")  # (T, d)


def silu(x: np.ndarray) -> np.ndarray:
    """SiLU (swish), x * sigmoid(x), written x / (1 + exp(-x)); exp's overflow to inf gives -0, as in torch."""
    with np.errstate(over="ignore"):
        out: np.ndarray = x / (x.dtype.type(1.0) + np.exp(-x))  # like x
    return out


def mlp(x: np.ndarray, params: Params, prefix: str, taps: Taps, name: str) -> np.ndarray:
    """SwiGLU: down(silu(gate(x)) * up(x)), d -> d_mlp -> d, no biases."""
    pre = x @ params[prefix + "gate_proj.weight"].T  # (T, d_mlp): the gate, before SiLU
    taps[f"{name}.hook_pre"] = pre
    pre_linear = x @ params[prefix + "up_proj.weight"].T  # (T, d_mlp): the up projection
    taps[f"{name}.hook_pre_linear"] = pre_linear
    post = silu(pre) * pre_linear  # (T, d_mlp)
    taps[f"{name}.hook_post"] = post
    out: np.ndarray = post @ params[prefix + "down_proj.weight"].T  # (T, d)
    return out


def block(
    x: np.ndarray, params: Params, i: int, config: LlamaConfig, cos: np.ndarray, sin: np.ndarray, taps: Taps
) -> np.ndarray:
    """One Llama block: x + Attn(RMSNorm1(x)), then + MLP(RMSNorm2(.))."""
    p, name = f"model.layers.{i}.", f"blocks.{i}"
    taps[f"{name}.hook_resid_pre"] = x
    ln1 = rms_norm(x, params[p + "input_layernorm.weight"], config.rms_eps, taps, f"{name}.ln1")  # (T, d)
    attn_out = attention(ln1, params, p + "self_attn.", config, cos, sin, taps, f"{name}.attn")  # (T, d)
    taps[f"{name}.hook_attn_out"] = attn_out
    resid_mid = x + attn_out  # (T, d)
    taps[f"{name}.hook_resid_mid"] = resid_mid
    ln2 = rms_norm(resid_mid, params[p + "post_attention_layernorm.weight"], config.rms_eps, taps, f"{name}.ln2")
    mlp_out = mlp(ln2, params, p + "mlp.", taps, f"{name}.mlp")  # (T, d)
    taps[f"{name}.hook_mlp_out"] = mlp_out
    resid_post: np.ndarray = resid_mid + mlp_out  # (T, d)
    taps[f"{name}.hook_resid_post"] = resid_post
    return resid_post


def unembed(x: np.ndarray, params: Params, config: LlamaConfig, taps: Taps, name: str) -> np.ndarray:
    """Final RMSNorm, then scores against every token: lm_head.weight, or the embedding when tied."""
    ln = rms_norm(x, params["model.norm.weight"], config.rms_eps, taps, name)  # (T, d)
    head = params["model.embed_tokens.weight"] if config.tied else params["lm_head.weight"]  # (V, d)
    logits: np.ndarray = ln @ head.T  # (T, V)
    return logits


def forward(params: Params, config: LlamaConfig, tokens: list[int], lens_rows: int | None = None) -> Taps:
    """The whole pass for one sequence: every tap, in dataflow order, in the parameters' dtype.

    `lens_rows`: `probs` and the logit lens for the last min(T, lens_rows) positions only; None: every position.
    """
    taps: Taps = {}
    T = len(tokens)
    if config.n_ctx < T:
        raise ValueError(f"sequence of {T} tokens is longer than the context ({config.n_ctx})")
    embed_table = params["model.embed_tokens.weight"]  # (V, d)
    x = embed_table[np.asarray(tokens, dtype=np.int64)]  # (T, d): the residual stream; positions enter through RoPE
    taps["hook_embed"] = x
    cos, sin = rope_tables(T, config.d_head, config.rope_base, embed_table.dtype)  # (T, dh/2) each
    streams = [x]  # stream k = input of block k; stream L = output of the last block
    for i in range(config.n_layer):
        x = block(x, params, i, config, cos, sin, taps)  # (T, d)
        streams.append(x)
    logits = unembed(x, params, config, taps, "ln_final")  # (T, V)
    taps["logits"] = logits
    last = slice(None) if lens_rows is None else slice(-lens_rows, None)  # the positions kept
    taps["probs"] = softmax(logits[last])  # (T or rows, V)
    kept = [stream[last] for stream in streams]  # L + 1 of (T or rows, d)
    lens = unembed(np.concatenate(kept), params, config, {}, "")  # ((L + 1) * rows, V)
    for k, part in enumerate(np.split(lens, len(kept))):
        taps[f"logit_lens.{k}"] = softmax(part)  # (T or rows, V)
    return taps


# -- incremental decoding: a grouped-query key/value cache, keys (after RoPE) and values [n_kv_heads, T, d_head] --

Cache = list[tuple[np.ndarray, np.ndarray]]  # per block: (keys (Hkv, T, dh), values (Hkv, T, dh))


def prefill(params: Params, config: LlamaConfig, tokens: list[int]) -> tuple[np.ndarray, Cache]:
    """The prompt through the full forward: its last position's logits (V,) and every block's cache."""
    taps = forward(params, config, tokens)
    cache = [
        (taps[f"blocks.{i}.attn.hook_rot_k"].transpose(1, 0, 2), taps[f"blocks.{i}.attn.hook_v"].transpose(1, 0, 2))
        for i in range(config.n_layer)
    ]  # (T, Hkv, dh) -> (Hkv, T, dh), keys and values
    return taps["logits"][-1], cache


def attention_step(
    x: np.ndarray, params: Params, prefix: str, config: LlamaConfig, cos: np.ndarray, sin: np.ndarray,
    cache_k: np.ndarray, cache_v: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Attention of one new position (x: (1, d); cos, sin: (1, dh/2)) over the cache and itself; o_proj(z), cache."""
    H, Hkv, dh = config.n_head, config.n_kv_heads, config.d_head
    pos = cache_k.shape[1]  # the new token's position: T positions are cached before it
    q = apply_rope(_linear(x, params, prefix + "q_proj").reshape(1, H, dh), cos, sin, config.rope_pairing)  # (1, H, dh)
    k = apply_rope(_linear(x, params, prefix + "k_proj").reshape(1, Hkv, dh), cos, sin, config.rope_pairing)
    v = _linear(x, params, prefix + "v_proj").reshape(1, Hkv, dh)  # (1, Hkv, dh)
    keys = np.concatenate([cache_k, k.transpose(1, 0, 2)], axis=1)  # (Hkv, T + 1, dh): appended, then read
    values = np.concatenate([cache_v, v.transpose(1, 0, 2)], axis=1)  # (Hkv, T + 1, dh)
    q_heads = q.transpose(1, 0, 2)  # (H, 1, dh)
    step_scores = (q_heads @ expand_kv(keys, config.n_rep).transpose(0, 2, 1)) / x.dtype.type(math.sqrt(dh))
    if config.causal:  # step_scores: (H, 1, T + 1)
        after = np.arange(pos + 1) > pos  # (T + 1,): keys after the query's position (none)
        step_scores[:, :, after] = -np.inf  # (H, 1, T + 1)
    weights = softmax(step_scores)  # (H, 1, T + 1): over keys
    z = (weights @ expand_kv(values, config.n_rep)).transpose(1, 0, 2).reshape(1, H * dh)  # (1, H * dh)
    return _linear(z, params, prefix + "o_proj"), keys, values  # (1, d)


def block_step(
    x: np.ndarray, params: Params, i: int, config: LlamaConfig, cos: np.ndarray, sin: np.ndarray,
    cache_k: np.ndarray, cache_v: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Block i on one new position (x: (1, d)): the block's output (1, d) and its grown cache."""
    p = f"model.layers.{i}."
    ln1 = rms_norm(x, params[p + "input_layernorm.weight"], config.rms_eps, {}, "")  # (1, d)
    attn_out, keys, values = attention_step(ln1, params, p + "self_attn.", config, cos, sin, cache_k, cache_v)
    mid = x + attn_out  # (1, d)
    ln2 = rms_norm(mid, params[p + "post_attention_layernorm.weight"], config.rms_eps, {}, "")  # (1, d)
    out: np.ndarray = mid + mlp(ln2, params, p + "mlp.", {}, "")  # (1, d)
    return out, keys, values


def decode_step(params: Params, config: LlamaConfig, token: int, cache: Cache) -> tuple[np.ndarray, Cache]:
    """One new token at position T, the cache's length: its logits (V,) and the cache at T + 1."""
    pos = cache[0][0].shape[1]  # T: positions already cached
    if pos + 1 > config.n_ctx:
        raise ValueError(f"position {pos} is past the context ({config.n_ctx})")
    if not 0 <= token < config.vocab_size:
        raise ValueError(f"token id {token} out of range [0, {config.vocab_size})")
    embed_table = params["model.embed_tokens.weight"]  # (V, d)
    x = embed_table[[token]]  # (1, d)
    cos, sin = rope_tables(pos + 1, config.d_head, config.rope_base, embed_table.dtype)  # (T + 1, dh/2) each
    cos, sin = cos[pos:], sin[pos:]  # (1, dh/2): position T's row, the same numbers the full forward uses
    grown: Cache = []
    for i in range(config.n_layer):
        x, keys, values = block_step(x, params, i, config, cos, sin, *cache[i])  # (1, d)
        grown.append((keys, values))
    return unembed(x, params, config, {}, "")[0], grown  # (V,)


def decode(
    params: Params, config: LlamaConfig, prompt: list[int], steps: int, feed: list[int] | None = None
) -> list[tuple[np.ndarray, Cache]]:
    """Prefill, then `steps` decode steps feeding `feed`, or the greedy token (first argmax) without it."""
    logits, cache = prefill(params, config, prompt)
    out = [(logits, cache)]
    for k in range(steps):
        token = feed[k] if feed is not None else int(np.argmax(logits))
        logits, cache = decode_step(params, config, token, cache)
        out.append((logits, cache))
    return out
