"""The `jax` backend: both model families written in jax.numpy, with an autodiff of their own (`jax.grad`).

An implementation parity's authors wrote a second time, in another framework: the GPT-2 family (learned or
sinusoidal positions, the exact GELU or gelu_new, causal or not) and the Llama family (RMSNorm, RoPE in either
pairing, grouped-query attention, SwiGLU, tied or untied, with or without attention biases), every tap of the
family's table, in float32 and float64. It copies no code from parity_reference/model.py, llama_model.py or
their NumPy twins; it follows their arithmetic, in their order.

The backward (issue 39, parity_reference/training.py) is JAX's own reverse mode, independent of torch
autograd: one `jax.value_and_grad` call per case gives the loss, every parameter's gradient and every tap's
adjoint, by the probe method: the forward takes a dict of zero arrays, one per tap on the loss's path, added to
the tap's value where it is recorded (x + 0 is x, so the forward is unchanged), and the gradient with respect
to a probe is the adjoint of that node. A tap recorded twice on the same tensor (block i's resid_post is block
i + 1's resid_pre; the Llama embedding is block 0's resid_pre) gets two probes in a row, and through an
addition their gradients are equal. The training step is AdamW in jax.numpy with torch.optim.AdamW's
arithmetic, operation for operation (no optax).

float64: `jax_enable_x64` is switched on once, when this module first imports jax, so that float64 arrays
exist at all; every array this module makes has an explicit dtype, so float32 computes in float32 either way.
Every computation is jit-compiled (XLA on the CPU, the same numbers every run), on cases padded to a bucket
(`padded_length`) so that one program serves every case of the toy: compiling one per case length made the
toy's forward take seconds per length.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, cast

import numpy as np

from parity_harness._backends.base import Backend, BackendOutput, Precision
from parity_harness._core.errors import BackendFailed, FixtureError
from parity_harness._core.resources import user_cache_dir
from parity_reference.training import TrainingSpec, backward_names, grad_name, has_backward, step_key

if TYPE_CHECKING:
    from parity_harness._fixture.fixture import Fixture

Array = Any  # a jax.Array (jax is imported lazily, inside the methods)
Params = dict[str, Array]
Taps = dict[str, Array]
Probes = Mapping[str, Array]

COMPUTE: dict[str, type[np.floating[Any]]] = {"fp32": np.float32, "fp64": np.float64}


@functools.cache
def _jax() -> Any:
    """jax, imported once, on the CPU, with float64 enabled (every array below names its dtype), and XLA's compiled
    programs kept in parity's cache (`$XDG_CACHE_HOME/parity/jax`, as torch-compile keeps inductor's): a later run
    loads them instead of compiling again (the toy's padded forward and backward: seconds each). A cache directory
    that cannot be made leaves jax compiling every run, nothing else."""
    import jax

    jax.config.update("jax_platforms", "cpu")  # type: ignore[no-untyped-call]
    jax.config.update("jax_enable_x64", True)  # type: ignore[no-untyped-call]
    cache = user_cache_dir("jax")
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError:
        return jax
    jax.config.update("jax_compilation_cache_dir", str(cache))  # type: ignore[no-untyped-call]
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # type: ignore[no-untyped-call]
    return jax


def _jnp() -> Any:
    _jax()
    import jax.numpy as jnp

    return jnp


def _tap(taps: Taps, probes: Probes | None, name: str, value: Array) -> Array:
    """Record `value` as tap `name`, plus its zero probe when one is given: what flows on is what was recorded."""
    if probes is not None and name in probes:
        value = value + probes[name]
    taps[name] = value
    return value


def _softmax(x: Array) -> Array:
    """softmax over the last axis: exp(x - max) / sum; the max is a constant to autodiff (it cancels)."""
    jax, jnp = _jax(), _jnp()
    shifted = x - jax.lax.stop_gradient(jnp.max(x, axis=-1, keepdims=True))  # like x
    e = jnp.exp(shifted)  # like x; 0 where x is -inf (a masked key)
    return e / jnp.sum(e, axis=-1, keepdims=True)  # like x


def _mask(scores: Array, causal: bool, length: Array) -> Array:
    """Scores (H, n, n) with the keys a query may not read set to -inf: every key after it (j > i) when causal,
    else the padding's (j >= length). Causal, a query of the sequence (i < length) never reads the padding."""
    jnp = _jnp()
    n = scores.shape[-1]
    key = jnp.arange(n, dtype=jnp.int32)  # (n,)
    hidden = key[None, :] > key[:, None] if causal else jnp.broadcast_to(key[None, :] >= length, (n, n))  # (n, n)
    return jnp.where(hidden, jnp.asarray(-jnp.inf, dtype=scores.dtype), scores)  # (H, n, n)


def _read_outs(logits: Array, streams: list[Array], unembed: Callable[[Array], Array], taps: Taps,
               length: Array, rows: int | None) -> None:
    """probs and the logit lens (off the loss's path): of the `rows` positions before `length` (the fixture's
    rows), or of every position when `rows` is None (the harness's slice [:T] then keeps the sequence's)."""
    jax, jnp = _jax(), _jnp()
    if rows is None:
        kept = streams  # L + 1 of (n, d)
        taps["probs"] = _softmax(logits)  # (n, V)
    else:
        kept = [jax.lax.dynamic_slice_in_dim(s, length - rows, rows, axis=0) for s in streams]  # (rows, d) each
        taps["probs"] = _softmax(jax.lax.dynamic_slice_in_dim(logits, length - rows, rows, axis=0))  # (rows, V)
    n = kept[0].shape[0]
    lens = unembed(jnp.concatenate(kept, axis=0))  # ((L + 1) * n, V): every stream read as the last
    for k in range(len(kept)):
        taps[f"logit_lens.{k}"] = _softmax(lens[k * n:(k + 1) * n])  # (n, V)


# -- the GPT-2 family ------------------------------------------------------------------------------------------


def _sinusoidal(T: int, d: int, dtype: Any) -> Array:
    """The 2017 paper's positions (sin on even columns, cos on odd), in float64, rounded once to `dtype`."""
    jnp = _jnp()
    pos = jnp.arange(T, dtype=jnp.float64)[:, None]  # (T, 1)
    pair = jnp.arange(0, d, 2, dtype=jnp.float64)  # (d/2,) = 2i
    angle = pos * jnp.power(jnp.float64(10000.0), -pair / d)  # (T, d/2)
    table = jnp.stack([jnp.sin(angle), jnp.cos(angle)], axis=-1).reshape(T, d)  # (T, d): sin, cos interleaved
    return table.astype(dtype)  # (T, d)


def _layer_norm(x: Array, w: Array, b: Array, eps: float, taps: Taps, probes: Probes | None, name: str) -> Array:
    """LayerNorm with the biased variance; taps `{name}.hook_scale` (T, 1) and `{name}.hook_normalized` (T, d)."""
    jnp = _jnp()
    centered = x - jnp.mean(x, axis=-1, keepdims=True)  # (T, d)
    scale = jnp.sqrt(jnp.mean(centered * centered, axis=-1, keepdims=True) + eps)  # (T, 1)
    scale = _tap(taps, probes, f"{name}.hook_scale", scale)
    normalized = _tap(taps, probes, f"{name}.hook_normalized", centered / scale)  # (T, d)
    return normalized * w + b  # (T, d)


def _gelu(x: Array, activation: str) -> Array:
    """The exact GELU x/2 (1 + erf(x / sqrt 2)), or GPT-2's tanh approximation `gelu_new`."""
    jax, jnp = _jax(), _jnp()
    if activation == "gelu_new":
        return 0.5 * x * (1.0 + jnp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * (x * x * x))))  # like x
    return 0.5 * x * (1.0 + jax.lax.erf(x / math.sqrt(2.0)))  # like x


def _gpt2_attention(x: Array, p: Params, prefix: str, config: Any, length: Array, taps: Taps,
                    probes: Probes | None, name: str) -> Array:
    """Multi-head self-attention on LN1's output: c_proj(z) + its bias."""
    jnp = _jnp()
    T, d, H, dh = x.shape[0], config.d_model, config.n_head, config.d_head
    qkv = x @ p[prefix + "c_attn.weight"] + p[prefix + "c_attn.bias"]  # (T, 3d): Conv1D, x @ W + b
    q = _tap(taps, probes, f"{name}.hook_q", qkv[:, :d].reshape(T, H, dh))  # (T, H, dh)
    k = _tap(taps, probes, f"{name}.hook_k", qkv[:, d:2 * d].reshape(T, H, dh))  # (T, H, dh)
    v = _tap(taps, probes, f"{name}.hook_v", qkv[:, 2 * d:].reshape(T, H, dh))  # (T, H, dh)
    qh, kh, vh = (jnp.transpose(t, (1, 0, 2)) for t in (q, k, v))  # (H, T, dh) each
    scores = _mask((qh @ jnp.transpose(kh, (0, 2, 1))) / math.sqrt(dh), config.causal, length)  # (H, T, T)
    scores = _tap(taps, probes, f"{name}.hook_attn_scores", scores)
    pattern = _tap(taps, probes, f"{name}.hook_pattern", _softmax(scores))  # (H, T, T): over keys
    z = _tap(taps, probes, f"{name}.hook_z", jnp.transpose(pattern @ vh, (1, 0, 2)))  # (T, H, dh)
    return z.reshape(T, d) @ p[prefix + "c_proj.weight"] + p[prefix + "c_proj.bias"]  # (T, d)


def _gpt2_forward(p: Params, config: Any, tokens: Array, length: Array, probes: Probes | None,
                  rows: int | None, read_outs: bool) -> tuple[Array, Taps]:
    """Token ids (T,), the sequence's `length` first -> logits (T, V) and every tap, in dataflow order (the
    read-outs only when `read_outs`, of `rows` positions: `_read_outs`)."""
    taps: Taps = {}
    T, wte = tokens.shape[0], p["wte.weight"]  # wte (V, d)
    embed = _tap(taps, probes, "hook_embed", wte[tokens])  # (T, d)
    pos = p["wpe.weight"][:T] if config.positions == "learned" else _sinusoidal(T, config.d_model, wte.dtype)
    pos = _tap(taps, probes, "hook_pos_embed", pos)  # (T, d)
    x = embed + pos  # (T, d): the residual stream
    streams = [x]
    for i in range(config.n_layer):
        h, name = f"h.{i}.", f"blocks.{i}"
        x = _tap(taps, probes, f"{name}.hook_resid_pre", x)  # (T, d)
        ln1 = _layer_norm(x, p[h + "ln_1.weight"], p[h + "ln_1.bias"], config.ln_eps, taps, probes, f"{name}.ln1")
        attn_out = _gpt2_attention(ln1, p, h + "attn.", config, length, taps, probes, f"{name}.attn")  # (T, d)
        attn_out = _tap(taps, probes, f"{name}.hook_attn_out", attn_out)
        mid = _tap(taps, probes, f"{name}.hook_resid_mid", x + attn_out)  # (T, d)
        ln2 = _layer_norm(mid, p[h + "ln_2.weight"], p[h + "ln_2.bias"], config.ln_eps, taps, probes,
                          f"{name}.ln2")  # (T, d)
        pre = _tap(taps, probes, f"{name}.mlp.hook_pre", ln2 @ p[h + "mlp.c_fc.weight"] + p[h + "mlp.c_fc.bias"])
        post = _tap(taps, probes, f"{name}.mlp.hook_post", _gelu(pre, config.activation))  # (T, d_mlp)
        mlp_out = post @ p[h + "mlp.c_proj.weight"] + p[h + "mlp.c_proj.bias"]  # (T, d)
        mlp_out = _tap(taps, probes, f"{name}.hook_mlp_out", mlp_out)
        x = _tap(taps, probes, f"{name}.hook_resid_post", mid + mlp_out)  # (T, d)
        streams.append(x)

    def unembed(s: Array, record: Taps, pr: Probes | None, name: str) -> Array:
        ln = _layer_norm(s, p["ln_f.weight"], p["ln_f.bias"], config.ln_eps, record, pr, name)  # (n, d)
        return ln @ wte.T  # (n, V): tied embeddings

    logits = _tap(taps, probes, "logits", unembed(x, taps, probes, "ln_final"))  # (T, V)
    if read_outs:
        _read_outs(logits, streams, lambda s: unembed(s, {}, None, ""), taps, length, rows)
    return logits, taps


# -- the Llama family ------------------------------------------------------------------------------------------


def _rope_tables(T: int, dh: int, base: float, dtype: Any) -> tuple[Array, Array]:
    """cos and sin (T, dh/2) of position * base ** (-2j / dh), in float64, each rounded once to `dtype`."""
    jnp = _jnp()
    pos = jnp.arange(T, dtype=jnp.float64)[:, None]  # (T, 1)
    pair = jnp.arange(0, dh, 2, dtype=jnp.float64)  # (dh/2,) = 2j
    angle = pos * jnp.power(jnp.float64(base), -pair / dh)  # (T, dh/2)
    return jnp.cos(angle).astype(dtype), jnp.sin(angle).astype(dtype)  # (T, dh/2) each


def _rope(x: Array, cos: Array, sin: Array, pairing: str) -> Array:
    """Turn each pair of x's (T, heads, dh) last axis: "half" pairs j with j + dh/2, "interleaved" 2j with 2j+1."""
    jnp = _jnp()
    c, s = cos[:, None, :], sin[:, None, :]  # (T, 1, dh/2): one angle for every head
    if pairing == "half":
        half = x.shape[-1] // 2
        a, b = x[..., :half], x[..., half:]  # (T, heads, dh/2) each
        return jnp.concatenate([a * c - b * s, b * c + a * s], axis=-1)  # (T, heads, dh)
    a, b = x[..., 0::2], x[..., 1::2]  # (T, heads, dh/2) each: even and odd columns
    return jnp.stack([a * c - b * s, b * c + a * s], axis=-1).reshape(x.shape)  # (T, heads, dh)


def _rms_norm(x: Array, w: Array, eps: float, taps: Taps, probes: Probes | None, name: str) -> Array:
    """x / sqrt(mean(x^2) + eps) * gain; taps `{name}.hook_scale` (T, 1) and `{name}.hook_normalized` (T, d)."""
    jnp = _jnp()
    scale = _tap(taps, probes, f"{name}.hook_scale", jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps))
    return _tap(taps, probes, f"{name}.hook_normalized", x / scale) * w  # (T, d)


def _linear(x: Array, p: Params, name: str) -> Array:
    """nn.Linear: x @ W.T, plus the bias when there is one."""
    out = x @ p[name + ".weight"].T  # (T, out)
    return out + p[name + ".bias"] if name + ".bias" in p else out


def _llama_attention(x: Array, p: Params, prefix: str, config: Any, cos: Array, sin: Array, length: Array,
                     taps: Taps, probes: Probes | None, name: str) -> Array:
    """Grouped-query attention with RoPE on the first RMSNorm's output: o_proj(z)."""
    jnp = _jnp()
    T, H, Hkv, dh = x.shape[0], config.n_head, config.n_kv_heads, config.d_head
    q = _tap(taps, probes, f"{name}.hook_q", _linear(x, p, prefix + "q_proj").reshape(T, H, dh))  # (T, H, dh)
    k = _tap(taps, probes, f"{name}.hook_k", _linear(x, p, prefix + "k_proj").reshape(T, Hkv, dh))  # (T, Hkv, dh)
    v = _tap(taps, probes, f"{name}.hook_v", _linear(x, p, prefix + "v_proj").reshape(T, Hkv, dh))  # (T, Hkv, dh)
    q = _tap(taps, probes, f"{name}.hook_rot_q", _rope(q, cos, sin, config.rope_pairing))  # (T, H, dh)
    k = _tap(taps, probes, f"{name}.hook_rot_k", _rope(k, cos, sin, config.rope_pairing))  # (T, Hkv, dh)
    n_rep = H // Hkv
    qh = jnp.transpose(q, (1, 0, 2))  # (H, T, dh)
    kh = jnp.repeat(jnp.transpose(k, (1, 0, 2)), n_rep, axis=0)  # (H, T, dh): head h reads kv head h // n_rep
    vh = jnp.repeat(jnp.transpose(v, (1, 0, 2)), n_rep, axis=0)  # (H, T, dh)
    scores = _mask((qh @ jnp.transpose(kh, (0, 2, 1))) / math.sqrt(dh), config.causal, length)  # (H, T, T)
    scores = _tap(taps, probes, f"{name}.hook_attn_scores", scores)
    pattern = _tap(taps, probes, f"{name}.hook_pattern", _softmax(scores))  # (H, T, T)
    z = _tap(taps, probes, f"{name}.hook_z", jnp.transpose(pattern @ vh, (1, 0, 2)))  # (T, H, dh)
    return _linear(z.reshape(T, H * dh), p, prefix + "o_proj")  # (T, d)


def _llama_forward(p: Params, config: Any, tokens: Array, length: Array, probes: Probes | None,
                   rows: int | None, read_outs: bool) -> tuple[Array, Taps]:
    """Token ids (T,), the sequence's `length` first -> logits (T, V) and every tap of the Llama table."""
    jnp = _jnp()
    taps: Taps = {}
    T, table = tokens.shape[0], p["model.embed_tokens.weight"]  # table (V, d)
    x = _tap(taps, probes, "hook_embed", table[tokens])  # (T, d): positions enter through RoPE only
    cos, sin = _rope_tables(T, config.d_head, config.rope_base, table.dtype)  # (T, dh/2) each
    streams = [x]
    for i in range(config.n_layer):
        h, name = f"model.layers.{i}.", f"blocks.{i}"
        x = _tap(taps, probes, f"{name}.hook_resid_pre", x)  # (T, d)
        ln1 = _rms_norm(x, p[h + "input_layernorm.weight"], config.rms_eps, taps, probes, f"{name}.ln1")
        attn_out = _llama_attention(ln1, p, h + "self_attn.", config, cos, sin, length, taps, probes,
                                    f"{name}.attn")
        attn_out = _tap(taps, probes, f"{name}.hook_attn_out", attn_out)  # (T, d)
        mid = _tap(taps, probes, f"{name}.hook_resid_mid", x + attn_out)  # (T, d)
        ln2 = _rms_norm(mid, p[h + "post_attention_layernorm.weight"], config.rms_eps, taps, probes, f"{name}.ln2")
        gate = _tap(taps, probes, f"{name}.mlp.hook_pre", ln2 @ p[h + "mlp.gate_proj.weight"].T)  # (T, d_mlp)
        up = _tap(taps, probes, f"{name}.mlp.hook_pre_linear", ln2 @ p[h + "mlp.up_proj.weight"].T)  # (T, d_mlp)
        post = _tap(taps, probes, f"{name}.mlp.hook_post", gate / (1.0 + jnp.exp(-gate)) * up)  # (T, d_mlp)
        mlp_out = _tap(taps, probes, f"{name}.hook_mlp_out", post @ p[h + "mlp.down_proj.weight"].T)  # (T, d)
        x = _tap(taps, probes, f"{name}.hook_resid_post", mid + mlp_out)  # (T, d)
        streams.append(x)
    head = table if config.tied else p["lm_head.weight"]  # (V, d)

    def unembed(s: Array, record: Taps, pr: Probes | None, name: str) -> Array:
        return _rms_norm(s, p["model.norm.weight"], config.rms_eps, record, pr, name) @ head.T  # (n, V)

    logits = _tap(taps, probes, "logits", unembed(x, taps, probes, "ln_final"))  # (T, V)
    if read_outs:
        _read_outs(logits, streams, lambda s: unembed(s, {}, None, ""), taps, length, rows)
    return logits, taps


FORWARDS: dict[str, Callable[..., tuple[Array, Taps]]] = {"gpt2": _gpt2_forward, "llama": _llama_forward}


# -- the loss ----------------------------------------------------------------------------------------------------


def _cross_entropy_sum(logits: Array, tokens: Array, length: Array) -> Array:
    """Sum over the length - 1 predicted cells (position t predicts token t + 1) of -log softmax(logits[t])[token]:
    shape (). The padding's rows (t >= length - 1) add exact zeros."""
    jax, jnp = _jax(), _jnp()
    z = logits[:-1]  # (n-1, V)
    shifted = z - jax.lax.stop_gradient(jnp.max(z, axis=-1, keepdims=True))  # (n-1, V)
    log_probs = shifted - jnp.log(jnp.sum(jnp.exp(shifted), axis=-1, keepdims=True))  # (n-1, V)
    picked = jnp.take_along_axis(log_probs, tokens[1:, None], axis=-1)[:, 0]  # (n-1,)
    predicted = jnp.arange(picked.shape[0], dtype=jnp.int32) < length - 1  # (n-1,)
    return -jnp.sum(jnp.where(predicted, picked, jnp.zeros_like(picked)))  # ()


# -- compiled once per model and padded length -------------------------------------------------------------------
#
# jax compiles one program per shape. Every case is padded to its bucket (`padded_length`: n_ctx on the toy, so one
# program for every case), with token 0; what the padding computes never reaches the sequence's positions: a
# causal query reads no later key, a non-causal one is kept from the padding's keys (`_mask`), every other step
# is row by row, and the loss counts only the sequence's cells. The taps are cut back to the sequence (`_cut`).


def padded_length(T: int, n_ctx: int) -> int:
    """The bucket of a T-token case: the next power of two from 16, at most n_ctx."""
    return min(n_ctx, max(16, 1 << (T - 1).bit_length()))


@functools.cache
def _forward_fn(family: str, config: Any, rows: int | None) -> Callable[[Params, Array, Array], Taps]:
    """The whole forward, every tap, jit-compiled: (params, token ids [n], length) -> {tap: array}."""
    forward = FORWARDS[family]
    return cast(Callable[[Params, Array, Array], Taps],
                _jax().jit(lambda p, ids, length: forward(p, config, ids, length, None, rows, True)[1]))


GradFn = Callable[[Params, Array, Array], tuple[Array, Params, Taps]]


@functools.cache
def _case_grad_fn(family: str, config: Any, on_path: tuple[str, ...]) -> GradFn:
    """One case's loss, the gradient of every parameter and the adjoint of every tap of `on_path` (the probe
    method), from one jax.value_and_grad, jit-compiled: (params, token ids [n], length) -> (loss, params', taps')."""
    jax, jnp, forward = _jax(), _jnp(), FORWARDS[family]

    def loss_of(p: Params, probes: Probes, ids: Array, length: Array) -> Array:
        logits, _ = forward(p, config, ids, length, probes, None, False)  # (n, V)
        return _cross_entropy_sum(logits, ids, length) / (length - 1).astype(logits.dtype)  # (): the mean

    def case_grad(p: Params, ids: Array, length: Array) -> tuple[Array, Params, Taps]:
        shapes = jax.eval_shape(lambda q: forward(q, config, ids, length, None, None, False)[1], p)  # {tap: shape}
        missing = [t for t in on_path if t not in shapes]
        if missing:
            raise BackendFailed(f"backend 'jax': its forward records no tap {missing[0]!r}")
        probes = {t: jnp.zeros(shapes[t].shape, dtype=shapes[t].dtype) for t in on_path}  # x + 0 is x
        loss, (g_params, g_probes) = jax.value_and_grad(loss_of, argnums=(0, 1))(p, probes, ids, length)
        return loss, g_params, g_probes

    return cast(GradFn, jax.jit(case_grad))


PartFn = Callable[[Params, Array, Array, Array], tuple[tuple[Array, Array], Params]]


@functools.cache
def _part_grad_fn(family: str, config: Any) -> PartFn:
    """A batch case's part: (params, ids [n], length, the batch's cell count) -> ((its summed cross-entropy / count,
    its summed cross-entropy), the gradient of the first): the batch loss is the sum of the parts, its gradient
    the sum of theirs. jit-compiled."""
    jax, forward = _jax(), FORWARDS[family]

    def part(p: Params, ids: Array, length: Array, total: Array) -> tuple[Array, Array]:
        ce = _cross_entropy_sum(forward(p, config, ids, length, None, None, False)[0], ids, length)  # ()
        return ce / total, ce

    return cast(PartFn, jax.jit(jax.value_and_grad(part, has_aux=True)))


StepFn = Callable[[list[Array], list[Params], Array, Params, Params, Params, Mapping[str, Array]],
                  tuple[Array, Array, Params, Params, Params]]


@functools.cache
def _step_fn(decaying: frozenset[str]) -> StepFn:
    """One training step from the batch's parts, jit-compiled: the batch loss (the cases' summed cross-entropies
    added in order, over the count), the global gradient norm sqrt(sum over parameters, in order, of sum g^2) of the
    parts' gradients summed in order, both before the update, then AdamW (`adamw_step`): (loss, norm, p, m, v)."""
    jnp = _jnp()

    def step(ces: list[Array], grads: list[Params], total: Array, p: Params, m: Params, v: Params,
             c: Mapping[str, Array]) -> tuple[Array, Array, Params, Params, Params]:
        loss = ces[0]
        for ce in ces[1:]:
            loss = loss + ce
        summed = dict(grads[0])
        for g in grads[1:]:
            summed = {k: summed[k] + g[k] for k in summed}
        sq = jnp.zeros((), dtype=loss.dtype)  # ()
        for k in summed:
            sq = sq + jnp.sum(summed[k] * summed[k])
        return (loss / total, jnp.sqrt(sq), *adamw_step(p, summed, m, v, c, decaying))

    return cast(StepFn, _jax().jit(step))


def _cut(tap: str, x: np.ndarray, T: int) -> np.ndarray:
    """A tap of the padded sequence cut back to its T positions: both position axes of the attention's (H, n, n)."""
    return x[:, :T, :T] if tap.endswith((".hook_attn_scores", ".hook_pattern")) else x[:T]


class JaxBackend(Backend):
    """Both families in jax.numpy, float32 and float64; the backward by jax.grad, training by AdamW in jax."""

    name: ClassVar[str] = "jax"
    description: ClassVar[str] = ("both model families in jax.numpy (float32, float64), the backward by jax.grad "
                                  "and AdamW written in jax.numpy")
    precisions: ClassVar[tuple[Precision, ...]] = ("fp32", "fp64")
    requires: ClassVar[tuple[str, ...]] = ("jax", "jaxlib")
    install_hint: ClassVar[str] = "pip install 'parity-harness[jax]'"
    families: ClassVar[tuple[str, ...]] = ("gpt2", "llama")
    concurrent: ClassVar[bool] = False  # it switches on jax's process-wide float64 flag

    def import_requirements(self) -> None:
        _jax()

    # -- the forward ---------------------------------------------------------------------------------------------

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        params = self._params(fixture, precision)
        lens_rows, wanted = fixture.lens_rows(), self.supported_taps(fixture)
        out: BackendOutput = {}
        for case in fixture.cases:
            ids, length, T = self._tokens(fixture, case.name, case.tokens, 1)
            rows = None if lens_rows is None else min(lens_rows, T)  # the read-outs' positions, as the fixture keeps
            taps = _forward_fn(fixture.family, fixture.model.config, rows)(params, ids, length)
            # The read-outs kept to the fixture's rows are already the sequence's; every other tap is cut to it.
            out[case.name] = {tap: self._array(taps[tap] if rows is not None and not has_backward(tap)
                                               else _cut(tap, np.asarray(taps[tap]), T), precision) for tap in wanted}
        return out

    # -- the backward and the training step ----------------------------------------------------------------------

    def supports_grad(self, fixture: Fixture) -> bool:
        return fixture.family in FORWARDS

    def grad(self, fixture: Fixture, precision: Precision) -> dict[str, dict[str, np.ndarray]]:
        params = self._params(fixture, precision)
        on_path = tuple(t for t in fixture.tap_names if has_backward(t))
        names = backward_names(fixture.tap_names, list(params))
        case_grad = _case_grad_fn(fixture.family, fixture.model.config, on_path)
        out: dict[str, dict[str, np.ndarray]] = {}
        for name, (ids, length, T) in self._batch(fixture).items():
            loss, g_params, g_probes = case_grad(params, ids, length)
            grads = {grad_name(t): self._array(_cut(t, np.asarray(g_probes[t]), T), precision) for t in on_path}
            grads |= {grad_name(k): self._array(g, precision) for k, g in g_params.items()}
            out[name] = {"loss": self._array(loss, precision)} | {n: grads[n] for n in names}
        return out

    def train(self, fixture: Fixture, precision: Precision) -> dict[str, np.ndarray]:
        jnp = _jnp()
        spec = self._spec(fixture)
        params = self._params(fixture, precision)
        dtype = COMPUTE[precision]
        batch = list(self._batch(fixture).values())
        total = jnp.asarray(sum(T - 1 for _, _, T in batch), dtype=dtype)  # every predicted cell of the batch
        part = _part_grad_fn(fixture.family, fixture.model.config)
        step = _step_fn(frozenset(k for k in params if spec.decays(k)))
        m = {k: jnp.zeros_like(w) for k, w in params.items()}
        v = {k: jnp.zeros_like(w) for k, w in params.items()}
        out: dict[str, np.ndarray] = {}
        for s in range(1, spec.steps + 1):
            parts = [part(params, ids, length, total) for ids, length, _ in batch]  # ((ce / total, ce), grads)
            loss, norm, params, m, v = step([ce for (_, ce), _ in parts], [g for _, g in parts], total, params, m, v,
                                            adamw_scalars(spec, s, dtype))
            out[step_key(s, "loss")] = self._array(loss, precision)
            out[step_key(s, "grad_norm")] = self._array(norm, precision)
            for k, p in params.items():
                out[step_key(s, k)] = self._array(p, precision)
        return out

    # -- helpers -------------------------------------------------------------------------------------------------

    def _params(self, fixture: Fixture, precision: Precision) -> Params:
        if precision not in COMPUTE:
            raise BackendFailed(f"backend 'jax' computes in fp32 and fp64, not {precision}")
        jnp = _jnp()
        dtype = COMPUTE[precision]
        # fixture.weights() checks names, shapes and finiteness (FixtureError otherwise): float32, upcast for fp64.
        return {k: jnp.asarray(np.asarray(w, dtype=dtype)) for k, w in fixture.weights().items()}

    def _batch(self, fixture: Fixture) -> dict[str, tuple[Array, Array, int]]:
        """The training cases {case: (padded token ids, length, T)}, in the spec's order, each of 2 to n_ctx ids."""
        tokens_of = {c.name: c.tokens for c in fixture.cases}
        out: dict[str, tuple[Array, Array, int]] = {}
        for name in self._spec(fixture).cases:
            if name not in tokens_of:
                raise FixtureError(f"training case {name!r} is not a case of the fixture")
            out[name] = self._tokens(fixture, name, tokens_of[name], 2)
        return out

    def _tokens(self, fixture: Fixture, case: str, tokens: Sequence[int], at_least: int) -> tuple[Array, Array, int]:
        """The case's token ids, checked (1, or 2 to predict, to n_ctx ids, each in range), padded with 0 to their
        bucket: (int32 ids [n], its length T as an int32 scalar, T)."""
        config = fixture.model.config
        ids = list(tokens)
        T = len(ids)
        if not at_least <= T <= config.n_ctx:
            raise FixtureError(f"case {case!r}: {T} tokens, expected {at_least} to {config.n_ctx}")
        bad = [t for t in ids if not 0 <= t < config.vocab_size]
        if bad:
            raise FixtureError(f"case {case!r}: token id {bad[0]} out of range [0, {config.vocab_size})")
        jnp = _jnp()
        padded = np.zeros(padded_length(T, config.n_ctx), dtype=np.int32)  # (n,)
        padded[:T] = ids
        return jnp.asarray(padded), jnp.asarray(T, dtype=jnp.int32), T

    def _spec(self, fixture: Fixture) -> TrainingSpec:
        spec = fixture.training()
        if spec is None:
            raise FixtureError("the fixture has no training section: no gradient or training step to compute")
        return spec

    @staticmethod
    def _array(x: Array, precision: Precision) -> np.ndarray:
        """A plain, writable NumPy array of the precision's dtype (a jax array is neither)."""
        out = np.array(x)
        if out.dtype != COMPUTE[precision]:
            raise BackendFailed(f"backend 'jax' computed a {out.dtype} array in {precision}")
        return out


def adamw_scalars(spec: TrainingSpec, step: int, dtype: Any) -> dict[str, Array]:
    """Step `step`'s (1-based) scalars of torch.optim.AdamW, computed in Python floats (float64) as torch does,
    then rounded to the parameters' dtype, as torch rounds a Python number it multiplies a tensor by."""
    jnp = _jnp()
    lr, (b1, b2) = spec.lr[step - 1], spec.betas
    values = {"decay": 1 - lr * spec.weight_decay, "one_minus_b1": 1 - b1, "b2": b2, "one_minus_b2": 1 - b2,
              "bias2_sqrt": (1 - b2**step) ** 0.5, "eps": spec.eps, "neg_step_size": -(lr / (1 - b1**step))}
    return {k: jnp.asarray(x, dtype=dtype) for k, x in values.items()}


def adamw_step(params: Params, grads: Params, m: Params, v: Params, c: Mapping[str, Array],
               decaying: frozenset[str]) -> tuple[Params, Params, Params]:
    """One step of torch.optim.AdamW (single-tensor, not fused), its arithmetic in its order (`c`: adamw_scalars):

        p <- p * (1 - lr * wd)                          (a parameter in `decaying`)
        m <- m + (1 - b1) (g - m)                       (lerp, weight < 0.5)
        v <- v * b2;  v <- v + ((1 - b2) g) g           (mul_, addcmul_)
        p <- p + (-lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps)    (addcdiv_: (value m) / denom)
    """
    jnp = _jnp()
    new_p, new_m, new_v = {}, {}, {}
    for k, p in params.items():
        g = grads[k]  # like p
        if k in decaying:
            p = p * c["decay"]
        mk = m[k] + c["one_minus_b1"] * (g - m[k])  # like p
        vk = v[k] * c["b2"]
        vk = vk + (c["one_minus_b2"] * g) * g  # like p
        denom = jnp.sqrt(vk) / c["bias2_sqrt"] + c["eps"]  # like p
        new_p[k] = p + (c["neg_step_size"] * mk) / denom
        new_m[k], new_v[k] = mk, vk
    return new_p, new_m, new_v


__all__ = ["FORWARDS", "JaxBackend", "adamw_scalars", "adamw_step"]
