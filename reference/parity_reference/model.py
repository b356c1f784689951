"""The reference GPT-2-style transformer in PyTorch: the model every other backend is checked against.

One readable file in dataflow order, in the spirit of nanoGPT's `model.py`. The forward pass is a
set of plain functions over a parameter dictionary keyed by Hugging Face GPT-2 names, so that
`ts_model/model/model.ts` can mirror it function by function:

    sinusoidal_positions, layer_norm, gelu, gelu_new, attention, mlp, block, unembed, forward

and, for incremental decoding from a key/value cache (keys and values [H, T, d_head] per block):

    prefill, attention_step, block_step, decode_step, decode

`GPT` is only the trainable container of those parameters. Every activation ("tap") of
docs/spec.md (section 2) is recorded under its TransformerLens name when a `taps` dict is passed;
shapes below are for one sequence of T tokens (a leading batch axis also works, for training).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor, nn

from parity_reference.config import GPTConfig, param_shapes
from parity_reference.tensor_check import WEIGHTS, Expected, TensorCheckError, check_table, check_values

Taps = dict[str, Tensor]


def _record(taps: Taps | None, name: str, value: Tensor) -> None:
    if taps is not None:
        taps[name] = value


def sinusoidal_positions(n_pos: int, d_model: int, dtype: torch.dtype) -> Tensor:
    """The 2017 paper's positions: sin on even columns, cos on odd, wavelengths 2*pi .. 10000*2*pi.

    Always computed in float64, then rounded once to `dtype`.
    """
    pos = torch.arange(n_pos, dtype=torch.float64)[:, None]  # (T, 1)
    pair = torch.arange(0, d_model, 2, dtype=torch.float64)  # (d/2,) = 2i
    inv_freq = torch.pow(torch.tensor(10000.0, dtype=torch.float64), -pair / d_model)  # (d/2,)
    angle = pos * inv_freq  # (T, d/2)
    table = torch.zeros(n_pos, d_model, dtype=torch.float64)  # (T, d)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle)
    return table.to(dtype)


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float, taps: Taps | None, name: str) -> Tensor:
    """LayerNorm over the last axis with the biased variance (divide by d, not d - 1)."""
    mean = x.mean(dim=-1, keepdim=True)  # (T, 1)
    centered = x - mean  # (T, d)
    var = (centered * centered).mean(dim=-1, keepdim=True)  # (T, 1)
    scale = torch.sqrt(var + eps)  # (T, 1)
    _record(taps, f"{name}.hook_scale", scale)
    normalized = centered / scale  # (T, d)
    _record(taps, f"{name}.hook_normalized", normalized)
    return normalized * weight + bias  # (T, d)


def gelu(x: Tensor) -> Tensor:
    """The exact GELU, x * Phi(x) = x/2 * (1 + erf(x / sqrt(2))), not the tanh approximation."""
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def gelu_new(x: Tensor) -> Tensor:
    """GPT-2's own activation, the tanh approximation x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))).

    Written as transformers' `NewGELUActivation` writes it (`torch.pow(x, 3.0)`), so the two agree to round-off.
    """
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def attention(
    x: Tensor, params: Mapping[str, Tensor], prefix: str, config: GPTConfig, taps: Taps | None, name: str
) -> Tensor:
    """Multi-head self-attention on LN1's output; returns c_proj(z) with its bias."""
    T, d, H, dh = x.shape[-2], config.d_model, config.n_head, config.d_head
    qkv = x @ params[prefix + "c_attn.weight"] + params[prefix + "c_attn.bias"]  # (T, 3d), Conv1D: x @ W
    q, k, v = torch.split(qkv, d, dim=-1)  # 3 x (T, d)
    q = q.reshape(*q.shape[:-1], H, dh)  # (T, H, dh)
    k = k.reshape(*k.shape[:-1], H, dh)  # (T, H, dh)
    v = v.reshape(*v.shape[:-1], H, dh)  # (T, H, dh)
    _record(taps, f"{name}.hook_q", q)
    _record(taps, f"{name}.hook_k", k)
    _record(taps, f"{name}.hook_v", v)
    qh, kh, vh = q.transpose(-3, -2), k.transpose(-3, -2), v.transpose(-3, -2)  # (H, T, dh) each
    # q scaled before the product: in fp16 the product q.k can pass 65,504 where the scaled score does not (the
    # same bits in fp32 and fp64 when sqrt(d_head) is a power of two, as for d_head 4, 16, 64, 256).
    scores = (qh / math.sqrt(dh)) @ kh.transpose(-2, -1)  # (H, T, T): query i, key j
    if config.causal:
        future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(diagonal=1)  # (T, T): j > i
        scores = scores.masked_fill(future, float("-inf"))  # (H, T, T)
    _record(taps, f"{name}.hook_attn_scores", scores)
    pattern = torch.softmax(scores, dim=-1)  # (H, T, T): over keys
    _record(taps, f"{name}.hook_pattern", pattern)
    z = (pattern @ vh).transpose(-3, -2)  # (T, H, dh)
    _record(taps, f"{name}.hook_z", z)
    z_flat = z.reshape(*z.shape[:-2], d)  # (T, d): heads side by side
    out: Tensor = z_flat @ params[prefix + "c_proj.weight"] + params[prefix + "c_proj.bias"]  # (T, d)
    return out


def mlp(
    x: Tensor, params: Mapping[str, Tensor], prefix: str, config: GPTConfig, taps: Taps | None, name: str
) -> Tensor:
    """The position-wise network d -> d_mlp -> d with the config's activation: the exact GELU, or gelu_new."""
    pre = x @ params[prefix + "c_fc.weight"] + params[prefix + "c_fc.bias"]  # (T, d_mlp)
    _record(taps, f"{name}.hook_pre", pre)
    post = gelu_new(pre) if config.activation == "gelu_new" else gelu(pre)  # (T, d_mlp)
    _record(taps, f"{name}.hook_post", post)
    return post @ params[prefix + "c_proj.weight"] + params[prefix + "c_proj.bias"]  # (T, d)


def block(x: Tensor, params: Mapping[str, Tensor], i: int, config: GPTConfig, taps: Taps | None) -> Tensor:
    """One pre-LN GPT-2 block: x + Attn(LN1(x)), then + MLP(LN2(.))."""
    p, name = f"h.{i}.", f"blocks.{i}"
    _record(taps, f"{name}.hook_resid_pre", x)
    ln1 = layer_norm(x, params[p + "ln_1.weight"], params[p + "ln_1.bias"], config.ln_eps, taps, f"{name}.ln1")
    attn_out = attention(ln1, params, p + "attn.", config, taps, f"{name}.attn")  # (T, d)
    _record(taps, f"{name}.hook_attn_out", attn_out)
    resid_mid = x + attn_out  # (T, d)
    _record(taps, f"{name}.hook_resid_mid", resid_mid)
    ln2 = layer_norm(
        resid_mid, params[p + "ln_2.weight"], params[p + "ln_2.bias"], config.ln_eps, taps, f"{name}.ln2"
    )
    mlp_out = mlp(ln2, params, p + "mlp.", config, taps, f"{name}.mlp")  # (T, d)
    _record(taps, f"{name}.hook_mlp_out", mlp_out)
    resid_post = resid_mid + mlp_out  # (T, d)
    _record(taps, f"{name}.hook_resid_post", resid_post)
    return resid_post


def unembed(x: Tensor, params: Mapping[str, Tensor], config: GPTConfig, taps: Taps | None, name: str) -> Tensor:
    """Final LayerNorm, then scores against every word: tied embeddings, logits = LN_f(x) @ wte^T."""
    ln = layer_norm(x, params["ln_f.weight"], params["ln_f.bias"], config.ln_eps, taps, name)  # (T, d)
    return ln @ params["wte.weight"].T  # (T, V)


def forward(
    params: Mapping[str, Tensor], config: GPTConfig, tokens: Tensor, taps: Taps | None = None,
    lens_rows: int | None = None,
) -> Tensor:
    """The whole pass: token ids (T,) -> logits (T, V). Fills `taps` in dataflow order if given.

    The dtype of the computation is the dtype of the parameters. `lens_rows`: `probs` and every
    `logit_lens.k` only for the last min(T, lens_rows) positions (a [T, V] tap per stream does not
    scale to GPT-2's vocabulary; docs/fixture-format.md, "rows"); None computes every position.
    """
    T = tokens.shape[-1]
    if config.n_ctx < T:
        raise ValueError(f"sequence of {T} tokens is longer than the context ({config.n_ctx})")
    wte = params["wte.weight"]  # (V, d)
    embed = wte[tokens]  # (T, d)
    _record(taps, "hook_embed", embed)
    if config.positions == "learned":
        pos_embed = params["wpe.weight"][:T]  # (T, d)
    else:
        pos_embed = sinusoidal_positions(T, config.d_model, wte.dtype)  # (T, d)
    _record(taps, "hook_pos_embed", pos_embed)
    x = embed + pos_embed  # (T, d): the residual stream
    streams = [x]  # stream k = input of block k; stream L = output of the last block
    for i in range(config.n_layer):
        x = block(x, params, i, config, taps)  # (T, d)
        streams.append(x)
    logits = unembed(x, params, config, taps, "ln_final")  # (T, V)
    _record(taps, "logits", logits)
    if taps is not None:
        last = slice(None) if lens_rows is None else slice(-lens_rows, None)  # the positions kept
        taps["probs"] = torch.softmax(logits[..., last, :], dim=-1)  # (T or rows, V)
        # The logit lens: read stream k as if it were the last. Every stream's rows in one product, so the
        # (V, d) table is read once, not once per stream (row by row, the same LayerNorm and dot products).
        kept = [stream[..., last, :] for stream in streams]  # L + 1 of (T or rows, d)
        lens = unembed(torch.cat(kept, dim=-2), params, config, None, "")  # ((L + 1) * rows, V)
        rows = kept[0].shape[-2]
        for k in range(len(kept)):
            taps[f"logit_lens.{k}"] = torch.softmax(lens[..., k * rows:(k + 1) * rows, :], dim=-1)  # (T or rows, V)
    return logits


class _LayerNormParams(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))


class _Conv1DParams(nn.Module):
    """GPT-2's Conv1D: weight stored [in, out] and used as x @ W + b (nn.Linear stores [out, in])."""

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_in, d_out))
        self.bias = nn.Parameter(torch.zeros(d_out))


class _AttnParams(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_attn = _Conv1DParams(config.d_model, 3 * config.d_model)
        self.c_proj = _Conv1DParams(config.d_model, config.d_model)


class _MLPParams(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = _Conv1DParams(config.d_model, config.d_mlp)
        self.c_proj = _Conv1DParams(config.d_mlp, config.d_model)


class BlockParams(nn.Module):
    """One block's parameters under GPT-2's names (ln_1, attn, ln_2, mlp); parity_reference/params.py counts them."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = _LayerNormParams(config.d_model)
        self.attn = _AttnParams(config)
        self.ln_2 = _LayerNormParams(config.d_model)
        self.mlp = _MLPParams(config)


class GPT(nn.Module):
    """The parameters under Hugging Face GPT-2 names (`wte.weight`, `h.0.attn.c_attn.weight`, ...)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.d_model)
        if config.positions == "learned":
            self.wpe = nn.Embedding(config.n_ctx, config.d_model)
        self.h = nn.ModuleList(BlockParams(config) for _ in range(config.n_layer))
        self.ln_f = _LayerNormParams(config.d_model)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """GPT-2's initialization: N(0, 0.02) for matrices, zeros for biases, ones for LayerNorm gains."""
        for name, p in self.named_parameters():
            if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
                nn.init.ones_(p)
            elif name.endswith(".bias"):
                nn.init.zeros_(p)
            else:
                nn.init.normal_(p, mean=0.0, std=0.02)

    def params(self) -> dict[str, Tensor]:
        return dict(self.named_parameters())

    def forward(self, tokens: Tensor, taps: Taps | None = None) -> Tensor:
        return forward(self.params(), self.config, tokens, taps)


def run_with_taps(
    params: Mapping[str, Tensor], config: GPTConfig, tokens: list[int], lens_rows: int | None = None
) -> Taps:
    """Every tap for one sequence, computed in the parameters' dtype, without autograd.

    `lens_rows`: as in `forward` (probs and the logit lens for the last positions only).

    Each tap is its own contiguous copy: some taps are strided views (q, k, v of one matmul), which
    `safetensors.numpy.save_file` would copy as a raw buffer, strides ignored; and some are the same
    tensor (block i's resid_post is block i+1's resid_pre), which `safetensors.torch` refuses.
    """
    taps: Taps = {}
    with torch.no_grad():
        forward(params, config, torch.tensor(tokens, dtype=torch.int64), taps, lens_rows)
    return {name: t.clone(memory_format=torch.contiguous_format) for name, t in taps.items()}


# -- incremental decoding: a key/value cache, one new token per step --------------------------------
#
# The cache holds, for every block, the keys and values of every position read so far, each
# [H, T, d_head] (heads first: the layout attention reads them in). `prefill` fills it from the
# full forward over the prompt; each `decode_step` adds the token at position T (the cache's
# length), appends its keys and values, then lets its query read all T + 1 positions.

Cache = list[tuple[Tensor, Tensor]]  # per block: (keys (H, T, dh), values (H, T, dh))


def prefill(params: Mapping[str, Tensor], config: GPTConfig, tokens: Tensor) -> tuple[Tensor, Cache]:
    """The prompt (T,) through the full forward: its last position's logits (V,) and every block's cache."""
    taps: Taps = {}
    logits = forward(params, config, tokens, taps)  # (T, V)
    cache = [
        (taps[f"blocks.{i}.attn.hook_k"].transpose(-3, -2), taps[f"blocks.{i}.attn.hook_v"].transpose(-3, -2))
        for i in range(config.n_layer)
    ]  # (T, H, dh) -> (H, T, dh), keys and values
    return logits[-1], cache


def attention_step(
    x: Tensor, params: Mapping[str, Tensor], prefix: str, config: GPTConfig, cache_k: Tensor, cache_v: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Attention of one new position (x: LN1's output, (1, d)) over the cached positions and itself.

    Returns c_proj(z) with its bias (1, d), and the keys and values with the new position appended,
    (H, T + 1, dh) each: the block's cache after this step.
    """
    d, H, dh = config.d_model, config.n_head, config.d_head
    pos = cache_k.shape[-2]  # the new token's position: T positions are cached before it
    qkv = x @ params[prefix + "c_attn.weight"] + params[prefix + "c_attn.bias"]  # (1, 3d), Conv1D: x @ W
    q, k, v = torch.split(qkv, d, dim=-1)  # 3 x (1, d)
    q_heads = q.reshape(1, H, dh).transpose(0, 1)  # (H, 1, dh)
    keys = torch.cat([cache_k, k.reshape(1, H, dh).transpose(0, 1)], dim=-2)  # (H, T + 1, dh): appended, then read
    values = torch.cat([cache_v, v.reshape(1, H, dh).transpose(0, 1)], dim=-2)  # (H, T + 1, dh)
    step_scores = (q_heads / math.sqrt(dh)) @ keys.transpose(-2, -1)  # (H, 1, T + 1): the query (scaled), every key
    if config.causal:
        after = torch.arange(pos + 1, device=x.device) > pos  # (T + 1,): keys after the query's position (none)
        step_scores = step_scores.masked_fill(after, float("-inf"))  # (H, 1, T + 1)
    weights = torch.softmax(step_scores, dim=-1)  # (H, 1, T + 1): over keys
    z = (weights @ values).transpose(0, 1).reshape(1, d)  # (1, d): heads side by side
    out = z @ params[prefix + "c_proj.weight"] + params[prefix + "c_proj.bias"]  # (1, d)
    return out, keys, values


def block_step(
    x: Tensor, params: Mapping[str, Tensor], i: int, config: GPTConfig, cache_k: Tensor, cache_v: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Block i on one new position (x: (1, d)): the block's output (1, d) and its grown cache."""
    p = f"h.{i}."
    ln1 = layer_norm(x, params[p + "ln_1.weight"], params[p + "ln_1.bias"], config.ln_eps, None, "")  # (1, d)
    attn_out, keys, values = attention_step(ln1, params, p + "attn.", config, cache_k, cache_v)  # (1, d)
    mid = x + attn_out  # (1, d)
    ln2 = layer_norm(mid, params[p + "ln_2.weight"], params[p + "ln_2.bias"], config.ln_eps, None, "")  # (1, d)
    return mid + mlp(ln2, params, p + "mlp.", config, None, ""), keys, values  # (1, d)


def decode_step(params: Mapping[str, Tensor], config: GPTConfig, token: Tensor, cache: Cache) -> tuple[Tensor, Cache]:
    """One new token (a (1,) tensor) at position T, the cache's length: its logits (V,) and the cache at T + 1."""
    pos = cache[0][0].shape[-2]  # T: positions already cached
    if pos + 1 > config.n_ctx:
        raise ValueError(f"position {pos} is past the context ({config.n_ctx})")
    wte = params["wte.weight"]  # (V, d)
    embed = wte[token]  # (1, d)
    if config.positions == "learned":
        pos_embed = params["wpe.weight"][pos : pos + 1]  # (1, d)
    else:
        pos_embed = sinusoidal_positions(pos + 1, config.d_model, wte.dtype)[pos:]  # (1, d): position T's row
    x = embed + pos_embed  # (1, d)
    grown: Cache = []
    for i in range(config.n_layer):
        x, keys, values = block_step(x, params, i, config, *cache[i])  # (1, d)
        grown.append((keys, values))
    return unembed(x, params, config, None, "")[0], grown  # (V,)


def decode(
    params: Mapping[str, Tensor], config: GPTConfig, prompt: list[int], steps: int, feed: list[int] | None = None
) -> list[tuple[Tensor, Cache]]:
    """Prefill the prompt, then `steps` decode steps: [(logits (V,), cache)] for steps 0 (prefill) .. `steps`.

    Step k (k >= 1) feeds `feed[k - 1]`, or without `feed` the greedy token: the argmax of step
    k - 1's logits (the first one on a tie). Without autograd; each tensor its own contiguous copy.
    """
    with torch.no_grad():
        logits, cache = prefill(params, config, torch.tensor(prompt, dtype=torch.int64))
        out = [(logits, cache)]
        for k in range(steps):
            token = feed[k] if feed is not None else int(torch.argmax(logits))
            logits, cache = decode_step(params, config, torch.tensor([token], dtype=torch.int64), cache)
            out.append((logits, cache))
    return [(lg.clone(), [(kk.contiguous().clone(), vv.contiguous().clone()) for kk, vv in c]) for lg, c in out]


class WeightsError(TensorCheckError):
    """A weights file that cannot be used: unreadable, or a tensor missing, extra, mis-typed, mis-shaped or
    non-finite (the message of parity_reference/tensor_check.py, which every reader of weights uses)."""


def save_weights(params: Mapping[str, Tensor], path: str | Path) -> None:
    """Write the parameters as float32 safetensors under their Hugging Face names."""
    from safetensors.torch import save_file

    save_file({k: v.detach().to(torch.float32).contiguous() for k, v in params.items()}, str(path))


FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")  # the safetensors dtypes `load_weights` takes and casts


def load_weights(path: str | Path, config: GPTConfig, dtype: torch.dtype = torch.float32) -> dict[str, Tensor]:
    """Read and check a safetensors weights file, one tensor at a time; the tensors are cast to `dtype`.

    The check is the one every reader of weights makes (parity_reference/tensor_check.py): every parameter
    present, a floating-point dtype (`FLOAT_DTYPES`), its shape, nothing extra (from the header, before any
    tensor is read), then each tensor finite. Accepts a Hugging Face GPT2LMHeadModel file too: a leading
    `transformer.` is dropped, and `lm_head.weight` is dropped when it equals `wte.weight` (tied).
    """
    from safetensors import SafetensorError, safe_open

    expected = param_shapes(config)
    table = {name: Expected(FLOAT_DTYPES, shape) for name, shape in expected.items()}
    try:
        with safe_open(str(path), framework="pt") as f:
            keys = {key.removeprefix("transformer."): key for key in f.keys()}  # noqa: SIM118 (not a mapping)
            found = {name: (str(f.get_slice(key).get_dtype()), tuple(f.get_slice(key).get_shape()))
                     for name, key in keys.items()}
            if "lm_head.weight" in keys and "wte.weight" in keys and torch.equal(
                    f.get_tensor(keys["lm_head.weight"]), f.get_tensor(keys["wte.weight"])):
                del found["lm_head.weight"]  # tied
            check_table(path, found, table, WEIGHTS)
            params: dict[str, Tensor] = {}
            for name in expected:
                t = f.get_tensor(keys[name])  # one tensor of the file at a time
                check_values(path, name, (t.float() if t.dtype == torch.bfloat16 else t).numpy(), WEIGHTS)
                params[name] = t.to(dtype)
    except TensorCheckError as exc:
        raise WeightsError(str(exc)) from None
    except (SafetensorError, OSError, ValueError) as exc:
        raise WeightsError(f"{path}: not a readable safetensors file ({exc})") from None
    return params
