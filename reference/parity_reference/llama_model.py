"""The Llama family's reference in PyTorch: RMSNorm, RoPE, SwiGLU and grouped-query attention.

Plain functions over a parameter dictionary keyed by Hugging Face Llama names, in dataflow order,
mirrored function by function by `parity_reference/llama_numpy.py`:

    rope_tables, rms_norm, apply_rope, expand_kv, attention, silu, mlp, block, unembed, forward

and, for incremental decoding from a grouped-query key/value cache (keys and values
[n_kv_heads, T, d_head] per block, keys after RoPE):

    prefill, attention_step, block_step, decode_step, decode

Every tap is recorded under its TransformerLens name for Llama (parity_reference/families/llama.json):
RMSNorm's `hook_scale` and `hook_normalized`, `attn.hook_rot_q` and `attn.hook_rot_k` (after the
rotation, before the scores), the gated MLP's `mlp.hook_pre` (the gate, before SiLU),
`mlp.hook_pre_linear` (the up projection) and `mlp.hook_post` (silu(gate) * up). `hook_k`, `hook_v`
and `hook_rot_k` keep their n_kv_heads heads; query head h reads key/value head h // (n_head // n_kv_heads).
The computation runs in the parameters' dtype; the RoPE tables are computed in float64 and rounded once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor

from parity_reference.llama_config import LlamaConfig, param_shapes

Taps = dict[str, Tensor]


def _record(taps: Taps | None, name: str, value: Tensor) -> None:
    if taps is not None:
        taps[name] = value


def rope_tables(n_pos: int, d_head: int, base: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and sin of every position's angle for each of the d_head/2 pairs, (T, d_head/2) each.

    Pair j turns by pos * base ** (-2j / d_head). Computed in float64, then rounded once to `dtype`.
    """
    pos = torch.arange(n_pos, dtype=torch.float64)[:, None]  # (T, 1)
    pair = torch.arange(0, d_head, 2, dtype=torch.float64)  # (dh/2,) = 2j
    inv_freq = torch.pow(torch.tensor(base, dtype=torch.float64), -pair / d_head)  # (dh/2,)
    angle = pos * inv_freq  # (T, dh/2)
    return torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)  # (T, dh/2) each


def rms_norm(x: Tensor, weight: Tensor, eps: float, taps: Taps | None, name: str) -> Tensor:
    """RMSNorm over the last axis: x / sqrt(mean(x^2) + eps), times the gain (no centering, no bias)."""
    scale = torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps)  # (T, 1)
    _record(taps, f"{name}.hook_scale", scale)
    normalized = x / scale  # (T, d)
    _record(taps, f"{name}.hook_normalized", normalized)
    return normalized * weight  # (T, d)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor, pairing: str) -> Tensor:
    """Rotate each pair of x's last axis by its position's angle; x (T, heads, dh), cos and sin (T, dh/2).

    "half" pairs column j with j + dh/2 (Hugging Face's `rotate_half`); "interleaved" pairs 2j with 2j + 1 (Meta).
    """
    c, s = cos[:, None, :], sin[:, None, :]  # (T, 1, dh/2): the same angle for every head
    if pairing == "half":
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]  # (T, heads, dh/2) each
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)  # (T, heads, dh)
    x1, x2 = x[..., 0::2], x[..., 1::2]  # (T, heads, dh/2) each: even and odd columns
    return torch.stack([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).flatten(-2)  # (T, heads, dh)


def expand_kv(kv: Tensor, n_rep: int) -> Tensor:
    """Key/value heads (Hkv, T, dh) to one per query head (H, T, dh): head h reads kv head h // n_rep."""
    return kv.repeat_interleave(n_rep, dim=-3)  # (H, T, dh)


def _linear(x: Tensor, params: Mapping[str, Tensor], name: str) -> Tensor:
    """nn.Linear: x @ W.T, plus the bias when the parameters have one."""
    out = x @ params[name + ".weight"].T  # (T, out)
    bias = params.get(name + ".bias")
    return out if bias is None else out + bias


def attention(
    x: Tensor, params: Mapping[str, Tensor], prefix: str, config: LlamaConfig, cos: Tensor, sin: Tensor,
    taps: Taps | None, name: str,
) -> Tensor:
    """Grouped-query self-attention with RoPE on the first RMSNorm's output; returns o_proj(z)."""
    T, H, Hkv, dh = x.shape[-2], config.n_head, config.n_kv_heads, config.d_head
    q = _linear(x, params, prefix + "q_proj").reshape(T, H, dh)  # (T, H, dh)
    k = _linear(x, params, prefix + "k_proj").reshape(T, Hkv, dh)  # (T, Hkv, dh)
    v = _linear(x, params, prefix + "v_proj").reshape(T, Hkv, dh)  # (T, Hkv, dh)
    _record(taps, f"{name}.hook_q", q)
    _record(taps, f"{name}.hook_k", k)
    _record(taps, f"{name}.hook_v", v)
    q = apply_rope(q, cos, sin, config.rope_pairing)  # (T, H, dh)
    k = apply_rope(k, cos, sin, config.rope_pairing)  # (T, Hkv, dh)
    _record(taps, f"{name}.hook_rot_q", q)
    _record(taps, f"{name}.hook_rot_k", k)
    qh = q.transpose(0, 1)  # (H, T, dh)
    kh = expand_kv(k.transpose(0, 1), config.n_rep)  # (H, T, dh)
    vh = expand_kv(v.transpose(0, 1), config.n_rep)  # (H, T, dh)
    scores = (qh @ kh.transpose(-2, -1)) / math.sqrt(dh)  # (H, T, T): query i, key j
    if config.causal:
        future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(diagonal=1)  # (T, T): j > i
        scores = scores.masked_fill(future, float("-inf"))  # (H, T, T)
    _record(taps, f"{name}.hook_attn_scores", scores)
    pattern = torch.softmax(scores, dim=-1)  # (H, T, T): over keys
    _record(taps, f"{name}.hook_pattern", pattern)
    z = (pattern @ vh).transpose(0, 1)  # (T, H, dh)
    _record(taps, f"{name}.hook_z", z)
    return _linear(z.reshape(T, H * dh), params, prefix + "o_proj")  # (T, d)


def silu(x: Tensor) -> Tensor:
    """SiLU (swish), x * sigmoid(x), written x / (1 + exp(-x))."""
    return x / (1.0 + torch.exp(-x))


def mlp(x: Tensor, params: Mapping[str, Tensor], prefix: str, taps: Taps | None, name: str) -> Tensor:
    """SwiGLU: down(silu(gate(x)) * up(x)), d -> d_mlp -> d, no biases."""
    pre = x @ params[prefix + "gate_proj.weight"].T  # (T, d_mlp): the gate, before SiLU
    _record(taps, f"{name}.hook_pre", pre)
    pre_linear = x @ params[prefix + "up_proj.weight"].T  # (T, d_mlp): the up projection
    _record(taps, f"{name}.hook_pre_linear", pre_linear)
    post = silu(pre) * pre_linear  # (T, d_mlp)
    _record(taps, f"{name}.hook_post", post)
    return post @ params[prefix + "down_proj.weight"].T  # (T, d)


def block(
    x: Tensor, params: Mapping[str, Tensor], i: int, config: LlamaConfig, cos: Tensor, sin: Tensor,
    taps: Taps | None,
) -> Tensor:
    """One Llama block: x + Attn(RMSNorm1(x)), then + MLP(RMSNorm2(.))."""
    p, name = f"model.layers.{i}.", f"blocks.{i}"
    _record(taps, f"{name}.hook_resid_pre", x)
    ln1 = rms_norm(x, params[p + "input_layernorm.weight"], config.rms_eps, taps, f"{name}.ln1")  # (T, d)
    attn_out = attention(ln1, params, p + "self_attn.", config, cos, sin, taps, f"{name}.attn")  # (T, d)
    _record(taps, f"{name}.hook_attn_out", attn_out)
    resid_mid = x + attn_out  # (T, d)
    _record(taps, f"{name}.hook_resid_mid", resid_mid)
    ln2 = rms_norm(resid_mid, params[p + "post_attention_layernorm.weight"], config.rms_eps, taps, f"{name}.ln2")
    mlp_out = mlp(ln2, params, p + "mlp.", taps, f"{name}.mlp")  # (T, d)
    _record(taps, f"{name}.hook_mlp_out", mlp_out)
    resid_post = resid_mid + mlp_out  # (T, d)
    _record(taps, f"{name}.hook_resid_post", resid_post)
    return resid_post


def unembed(x: Tensor, params: Mapping[str, Tensor], config: LlamaConfig, taps: Taps | None, name: str) -> Tensor:
    """Final RMSNorm, then scores against every token: lm_head.weight, or the embedding when tied."""
    ln = rms_norm(x, params["model.norm.weight"], config.rms_eps, taps, name)  # (T, d)
    head = params["model.embed_tokens.weight"] if config.tied else params["lm_head.weight"]  # (V, d)
    return ln @ head.T  # (T, V)


def forward(
    params: Mapping[str, Tensor], config: LlamaConfig, tokens: Tensor, taps: Taps | None = None,
    lens_rows: int | None = None,
) -> Tensor:
    """The whole pass: token ids (T,) -> logits (T, V). Fills `taps` in dataflow order if given.

    The dtype of the computation is the dtype of the parameters. `lens_rows`: `probs` and every
    `logit_lens.k` only for the last min(T, lens_rows) positions, as in `parity_reference.model.forward`.
    """
    T = tokens.shape[-1]
    if config.n_ctx < T:
        raise ValueError(f"sequence of {T} tokens is longer than the context ({config.n_ctx})")
    embed_table = params["model.embed_tokens.weight"]  # (V, d)
    x = embed_table[tokens]  # (T, d): the residual stream; positions enter through RoPE only
    _record(taps, "hook_embed", x)
    cos, sin = rope_tables(T, config.d_head, config.rope_base, embed_table.dtype)  # (T, dh/2) each
    streams = [x]  # stream k = input of block k; stream L = output of the last block
    for i in range(config.n_layer):
        x = block(x, params, i, config, cos, sin, taps)  # (T, d)
        streams.append(x)
    logits = unembed(x, params, config, taps, "ln_final")  # (T, V)
    _record(taps, "logits", logits)
    if taps is not None:
        last = slice(None) if lens_rows is None else slice(-lens_rows, None)  # the positions kept
        taps["probs"] = torch.softmax(logits[last], dim=-1)  # (T or rows, V)
        kept = [stream[last] for stream in streams]  # L + 1 of (T or rows, d)
        lens = unembed(torch.cat(kept, dim=-2), params, config, None, "")  # ((L + 1) * rows, V)
        rows = kept[0].shape[-2]
        for k in range(len(kept)):
            taps[f"logit_lens.{k}"] = torch.softmax(lens[k * rows:(k + 1) * rows], dim=-1)  # (T or rows, V)
    return logits


def run_with_taps(
    params: Mapping[str, Tensor], config: LlamaConfig, tokens: list[int], lens_rows: int | None = None
) -> Taps:
    """Every tap for one sequence, in the parameters' dtype, without autograd; each its own contiguous copy."""
    taps: Taps = {}
    with torch.no_grad():
        forward(params, config, torch.tensor(tokens, dtype=torch.int64), taps, lens_rows)
    return {name: t.clone(memory_format=torch.contiguous_format) for name, t in taps.items()}


def init_params(
    config: LlamaConfig, seed: int, dtype: torch.dtype = torch.float32, std: float = 0.02
) -> dict[str, Tensor]:
    """Seeded weights under their Hugging Face names: N(0, std) matrices and biases, RMSNorm gains N(1, std).

    Drawn in float64 from one generator in `param_shapes` order, then rounded once to `dtype`.
    """
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, Tensor] = {}
    for name, shape in param_shapes(config).items():
        noise = torch.randn(shape, generator=gen, dtype=torch.float64) * std
        out[name] = (1.0 + noise if name.endswith("norm.weight") else noise).to(dtype)
    return out


# -- incremental decoding: a grouped-query key/value cache, one new token per step ------------------
#
# The cache holds, for every block, the keys (after RoPE) and values of every position read so far,
# each [n_kv_heads, T, d_head]: the grouped heads, not one per query head. `prefill` fills it from the
# full forward over the prompt; each `decode_step` rotates the token at position T (the cache's length)
# by position T's angles, appends its keys and values, then lets its query read all T + 1 positions.

Cache = list[tuple[Tensor, Tensor]]  # per block: (keys (Hkv, T, dh), values (Hkv, T, dh))


def prefill(params: Mapping[str, Tensor], config: LlamaConfig, tokens: Tensor) -> tuple[Tensor, Cache]:
    """The prompt (T,) through the full forward: its last position's logits (V,) and every block's cache."""
    taps: Taps = {}
    logits = forward(params, config, tokens, taps)  # (T, V)
    cache = [
        (taps[f"blocks.{i}.attn.hook_rot_k"].transpose(0, 1), taps[f"blocks.{i}.attn.hook_v"].transpose(0, 1))
        for i in range(config.n_layer)
    ]  # (T, Hkv, dh) -> (Hkv, T, dh), keys and values
    return logits[-1], cache


def attention_step(
    x: Tensor, params: Mapping[str, Tensor], prefix: str, config: LlamaConfig, cos: Tensor, sin: Tensor,
    cache_k: Tensor, cache_v: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """Attention of one new position (x: (1, d); cos, sin: its angles (1, dh/2)) over the cache and itself.

    Returns o_proj(z) (1, d), and the keys and values with the new position appended, (Hkv, T + 1, dh) each.
    """
    H, Hkv, dh = config.n_head, config.n_kv_heads, config.d_head
    pos = cache_k.shape[-2]  # the new token's position: T positions are cached before it
    q = apply_rope(_linear(x, params, prefix + "q_proj").reshape(1, H, dh), cos, sin, config.rope_pairing)  # (1, H, dh)
    k = apply_rope(_linear(x, params, prefix + "k_proj").reshape(1, Hkv, dh), cos, sin, config.rope_pairing)
    v = _linear(x, params, prefix + "v_proj").reshape(1, Hkv, dh)  # (1, Hkv, dh)
    keys = torch.cat([cache_k, k.transpose(0, 1)], dim=-2)  # (Hkv, T + 1, dh): appended, then read
    values = torch.cat([cache_v, v.transpose(0, 1)], dim=-2)  # (Hkv, T + 1, dh)
    q_heads = q.transpose(0, 1)  # (H, 1, dh)
    step_scores = (q_heads @ expand_kv(keys, config.n_rep).transpose(-2, -1)) / math.sqrt(dh)  # (H, 1, T + 1)
    if config.causal:
        after = torch.arange(pos + 1, device=x.device) > pos  # (T + 1,): keys after the query's position (none)
        step_scores = step_scores.masked_fill(after, float("-inf"))  # (H, 1, T + 1)
    weights = torch.softmax(step_scores, dim=-1)  # (H, 1, T + 1): over keys
    z = (weights @ expand_kv(values, config.n_rep)).transpose(0, 1).reshape(1, H * dh)  # (1, H * dh)
    return _linear(z, params, prefix + "o_proj"), keys, values  # (1, d)


def block_step(
    x: Tensor, params: Mapping[str, Tensor], i: int, config: LlamaConfig, cos: Tensor, sin: Tensor,
    cache_k: Tensor, cache_v: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """Block i on one new position (x: (1, d)): the block's output (1, d) and its grown cache."""
    p = f"model.layers.{i}."
    ln1 = rms_norm(x, params[p + "input_layernorm.weight"], config.rms_eps, None, "")  # (1, d)
    attn_out, keys, values = attention_step(ln1, params, p + "self_attn.", config, cos, sin, cache_k, cache_v)
    mid = x + attn_out  # (1, d)
    ln2 = rms_norm(mid, params[p + "post_attention_layernorm.weight"], config.rms_eps, None, "")  # (1, d)
    return mid + mlp(ln2, params, p + "mlp.", None, ""), keys, values  # (1, d)


def decode_step(
    params: Mapping[str, Tensor], config: LlamaConfig, token: Tensor, cache: Cache
) -> tuple[Tensor, Cache]:
    """One new token (a (1,) tensor) at position T, the cache's length: its logits (V,) and the cache at T + 1."""
    pos = cache[0][0].shape[-2]  # T: positions already cached
    if pos + 1 > config.n_ctx:
        raise ValueError(f"position {pos} is past the context ({config.n_ctx})")
    embed_table = params["model.embed_tokens.weight"]  # (V, d)
    x = embed_table[token]  # (1, d)
    cos, sin = rope_tables(pos + 1, config.d_head, config.rope_base, embed_table.dtype)  # (T + 1, dh/2) each
    cos, sin = cos[pos:], sin[pos:]  # (1, dh/2): position T's row, the same numbers the full forward uses
    grown: Cache = []
    for i in range(config.n_layer):
        x, keys, values = block_step(x, params, i, config, cos, sin, *cache[i])  # (1, d)
        grown.append((keys, values))
    return unembed(x, params, config, None, "")[0], grown  # (V,)


def decode(
    params: Mapping[str, Tensor], config: LlamaConfig, prompt: list[int], steps: int, feed: list[int] | None = None
) -> list[tuple[Tensor, Cache]]:
    """Prefill the prompt, then `steps` decode steps: [(logits (V,), cache)] for steps 0 (prefill) .. `steps`.

    Step k (k >= 1) feeds `feed[k - 1]`, or without `feed` the greedy token (the first argmax of step k - 1).
    Without autograd; each tensor its own contiguous copy.
    """
    with torch.no_grad():
        logits, cache = prefill(params, config, torch.tensor(prompt, dtype=torch.int64))
        out = [(logits, cache)]
        for k in range(steps):
            token = feed[k] if feed is not None else int(torch.argmax(logits))
            logits, cache = decode_step(params, config, torch.tensor([token], dtype=torch.int64), cache)
            out.append((logits, cache))
    return [(lg.clone(), [(kk.contiguous().clone(), vv.contiguous().clone()) for kk, vv in c]) for lg, c in out]
