"""The `transformerlens` backend: TransformerLens' `HookedTransformer`, every tap read from its own hooks.

The model is built from the fixture's config (`HookedTransformerConfig`: pre-LayerNorm "LN", `act_fn` the
config's `activation`: "gelu", the exact GELU, or "gelu_new", GPT-2's tanh GELU, TransformerLens' own; causal
or bidirectional attention, `eps` = ln_eps, `dtype` float32 or float64, no random initialization) and given
the fixture's Hugging Face GPT-2 weights converted here to TransformerLens' layout (W_Q/W_K/W_V [H, d,
d_head], W_O [H, d_head, d], W_in, W_out, ...), the same split
`transformer_lens.pretrained.weight_conversions.gpt2` does. Positions: TransformerLens has no sinusoidal
option, so a sinusoidal fixture's table (parity_reference.model's, computed in float64 and rounded once to the
dtype) is loaded as `W_pos`; a learned one's `wpe` is. Embeddings are tied: `W_U` is `W_E` transposed, `b_U`
zero.

The weights are set with `load_state_dict`, never `load_and_process_state_dict`: TransformerLens'
weight processing (`ProcessWeights.process_weights`) casts every non-float32 tensor to float32 and
back, even with fold_ln, centering and value-bias folding all off, so float64 would be float32 in
disguise (docs/backends.md, "transformerlens", shows it with one command). They are assigned, not
copied; after loading, every parameter is checked to be the very tensor given, in the precision's dtype.

Taps come from `run_with_cache`: TransformerLens' hook names are parity's tap names, and their
shapes (batch axis dropped) are the spec's. `logits` is the model's output, `probs` its softmax, and
the logit lens runs each block's input (and the last block's output) through the model's own
`ln_final` and `unembed`. Every tap is supported.

A Llama fixture (family "llama") gets TransformerLens' own Llama: `normalization_type="RMS"` (final_rms),
`positional_embedding_type="rotary"` (rotary_base, `rotary_adjacent_pairs` for interleaved pairing), a
SiLU-gated MLP and grouped-query attention (`n_key_value_heads`), its weights split as
`transformer_lens.pretrained.weight_conversions.llama` splits them (`tl_llama_state_dict`). TransformerLens'
hook names are the family's taps too (`attn.hook_rot_q`/`hook_rot_k`, `mlp.hook_pre_linear`, RMSNorm's
`hook_scale`/`hook_normalized`), so every tap is read from its hooks again.

TransformerLens' warnings, log records and prints are kept off the terminal (`silenced`,
parity_harness/_backends/quiet.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from parity_harness._backends.base import Backend, BackendOutput, Precision
from parity_harness._backends.quiet import silenced
from parity_harness._core.errors import BackendFailed, FixtureError

if TYPE_CHECKING:
    import torch

    from parity_harness._fixture.fixture import Fixture
    from parity_reference.config import GPTConfig


def tl_config(config: GPTConfig, dtype: torch.dtype) -> Any:
    """TransformerLens' HookedTransformerConfig for a parity config: pre-LN, the config's activation ("gelu" or
    "gelu_new": TransformerLens' names are parity's), no initialization."""
    with silenced():
        from transformer_lens import HookedTransformerConfig

    return HookedTransformerConfig(
        n_layers=config.n_layer, d_model=config.d_model, n_ctx=config.n_ctx, d_head=config.d_head,
        n_heads=config.n_head, d_mlp=config.d_mlp, d_vocab=config.vocab_size, d_vocab_out=config.vocab_size,
        act_fn=config.activation, eps=config.ln_eps, normalization_type="LN", positional_embedding_type="standard",
        attention_dir="causal" if config.causal else "bidirectional", use_attn_scale=True,
        init_weights=False, dtype=dtype, device="cpu", default_prepend_bos=False, tokenizer_name=None,
    )


def tl_state_dict(weights: dict[str, np.ndarray], config: GPTConfig, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The fixture's GPT-2 weights in TransformerLens' names and layout, each cast once to `dtype`.

    Consumes `weights` (each array popped as it is converted). Only reshapes and transposes: no value
    changes, so the float64 tensors are exactly the float32 weights upcast.
    """
    import torch

    from parity_reference.model import sinusoidal_positions

    H, d, dh = config.n_head, config.d_model, config.d_head

    def take(name: str) -> torch.Tensor:
        return torch.tensor(weights.pop(name), dtype=dtype)

    wte = take("wte.weight")  # (V, d)
    # Tied: W_U is W_E^T, a view of the same memory, not a copy. TransformerLens' Unembed computes
    # F.linear(x, W_U.T.contiguous()): with W_U a transposed view, W_U.T is W_E itself and contiguous, so
    # each call reads the table in place; a contiguous W_U (d, V) made it copy 50,257 x 768 values on every
    # unembedding (then 14 per case at GPT-2 size, the logits and 13 lens streams, ~8 s of a float64 run; the
    # lens streams now share one call).
    state: dict[str, torch.Tensor] = {"embed.W_E": wte, "unembed.b_U": torch.zeros(config.vocab_size, dtype=dtype)}
    if config.positions == "learned":
        state["pos_embed.W_pos"] = take("wpe.weight")  # (n_ctx, d)
    else:  # TransformerLens has no sinusoidal positions: the table, computed in float64, rounded once
        state["pos_embed.W_pos"] = sinusoidal_positions(config.n_ctx, config.d_model, dtype)  # (n_ctx, d)
    for i in range(config.n_layer):
        h, b = f"h.{i}.", f"blocks.{i}."
        state[b + "ln1.w"], state[b + "ln1.b"] = take(h + "ln_1.weight"), take(h + "ln_1.bias")
        w_q, w_k, w_v = torch.split(take(h + "attn.c_attn.weight"), d, dim=1)  # 3 x (d, d): Conv1D, x @ W
        for key, w in (("W_Q", w_q), ("W_K", w_k), ("W_V", w_v)):
            state[b + "attn." + key] = w.reshape(d, H, dh).permute(1, 0, 2).contiguous()  # (H, d, dh)
        b_q, b_k, b_v = take(h + "attn.c_attn.bias").reshape(3, H, dh)  # 3 x (H, dh)
        state[b + "attn.b_Q"], state[b + "attn.b_K"], state[b + "attn.b_V"] = b_q, b_k, b_v
        state[b + "attn.W_O"] = take(h + "attn.c_proj.weight").reshape(H, dh, d)  # (H, dh, d)
        state[b + "attn.b_O"] = take(h + "attn.c_proj.bias")  # (d,)
        state[b + "ln2.w"], state[b + "ln2.b"] = take(h + "ln_2.weight"), take(h + "ln_2.bias")
        state[b + "mlp.W_in"], state[b + "mlp.b_in"] = take(h + "mlp.c_fc.weight"), take(h + "mlp.c_fc.bias")
        state[b + "mlp.W_out"], state[b + "mlp.b_out"] = take(h + "mlp.c_proj.weight"), take(h + "mlp.c_proj.bias")
    state["ln_final.w"], state["ln_final.b"] = take("ln_f.weight"), take("ln_f.bias")
    state = {k: v.contiguous() for k, v in state.items()}
    state["unembed.W_U"] = state["embed.W_E"].T  # (d, V), strides (1, d): the view described above
    return state


def tl_model(weights: dict[str, np.ndarray], config: Any, precision: Precision, family: str = "gpt2") -> Any:
    """A HookedTransformer in eval mode holding exactly the fixture's weights in the precision's dtype.

    Loaded with `load_state_dict(assign=True)`, not `load_and_process_state_dict` (which rounds float64
    through float32); then every parameter is checked to be the very tensor given (its dtype, shape and
    memory), so it holds the converted weights bit for bit.
    """
    import torch

    dtype = torch.float32 if precision == "fp32" else torch.float64
    llama = family == "llama"
    state = (tl_llama_state_dict if llama else tl_state_dict)(weights, config, dtype)
    with silenced():
        from transformer_lens import HookedTransformer

        model = HookedTransformer((tl_llama_config if llama else tl_config)(config, dtype), move_to_device=True)
    params = dict(model.named_parameters())
    if set(params) != set(state):
        missing, extra = sorted(set(params) - set(state)), sorted(set(state) - set(params))
        raise BackendFailed(f"TransformerLens' parameters differ from the converted weights: "
                            f"unfilled {missing[:3]}, unknown {extra[:3]}")
    with torch.no_grad():
        # assign: each parameter becomes the tensor given (no copy into the freshly made one); buffers keep theirs
        model.load_state_dict(state, strict=False, assign=True)
    for name, p in model.named_parameters():
        given = state[name]
        if p.dtype != dtype or p.shape != given.shape or p.data_ptr() != given.data_ptr():
            raise BackendFailed(f"TransformerLens changed parameter {name!r} while loading it ({p.dtype})")
    return model.eval()


def tl_llama_config(config: Any, dtype: torch.dtype) -> Any:
    """TransformerLens' HookedTransformerConfig for a parity LlamaConfig: RMSNorm, rotary, SiLU-gated MLP, GQA."""
    with silenced():
        from transformer_lens import HookedTransformerConfig

    return HookedTransformerConfig(
        n_layers=config.n_layer, d_model=config.d_model, n_ctx=config.n_ctx, d_head=config.d_head,
        n_heads=config.n_head, n_key_value_heads=config.n_kv_heads, d_mlp=config.d_mlp, d_vocab=config.vocab_size,
        d_vocab_out=config.vocab_size, act_fn="silu", eps=config.rms_eps, normalization_type="RMS", final_rms=True,
        positional_embedding_type="rotary", rotary_dim=config.d_head, rotary_base=config.rope_base,
        rotary_adjacent_pairs=config.rope_pairing == "interleaved", gated_mlp=True,
        attention_dir="causal" if config.causal else "bidirectional", use_attn_scale=True,
        original_architecture="LlamaForCausalLM", init_weights=False, dtype=dtype, device="cpu",
        default_prepend_bos=False, tokenizer_name=None,
    )


def tl_llama_state_dict(weights: dict[str, np.ndarray], config: Any, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The fixture's Llama weights (Hugging Face names) in TransformerLens' names and layout, each cast once to
    `dtype`: the split `transformer_lens.pretrained.weight_conversions.llama` makes, with the key/value heads
    under GQA's `_W_K`/`_W_V`, and the attention biases when the fixture has them (zeros otherwise, as there).
    Consumes `weights`; only reshapes and transposes."""
    import torch

    H, Hkv, d, dh = config.n_head, config.n_kv_heads, config.d_model, config.d_head

    def take(name: str) -> torch.Tensor:
        return torch.tensor(weights.pop(name), dtype=dtype)

    def zeros(*shape: int) -> torch.Tensor:
        return torch.zeros(*shape, dtype=dtype)

    wte = take("model.embed_tokens.weight")  # (V, d)
    state: dict[str, torch.Tensor] = {"embed.W_E": wte, "unembed.b_U": zeros(config.vocab_size)}
    for i in range(config.n_layer):
        h, b = f"model.layers.{i}.", f"blocks.{i}."
        state[b + "ln1.w"] = take(h + "input_layernorm.weight")
        for key, proj, heads in (("W_Q", "q_proj", H), ("_W_K", "k_proj", Hkv), ("_W_V", "v_proj", Hkv)):
            w = take(h + f"self_attn.{proj}.weight")  # (heads * dh, d): nn.Linear, x @ W.T
            state[b + "attn." + key] = w.reshape(heads, dh, d).permute(0, 2, 1)  # (heads, d, dh)
            bias = h + f"self_attn.{proj}.bias"
            state[b + "attn." + key.replace("W", "b")] = take(bias).reshape(heads, dh) if bias in weights \
                else zeros(heads, dh)
        state[b + "attn.W_O"] = take(h + "self_attn.o_proj.weight").reshape(d, H, dh).permute(1, 2, 0)  # (H, dh, d)
        bias = h + "self_attn.o_proj.bias"
        state[b + "attn.b_O"] = take(bias) if bias in weights else zeros(d)
        state[b + "ln2.w"] = take(h + "post_attention_layernorm.weight")
        state[b + "mlp.W_in"] = take(h + "mlp.up_proj.weight").T  # (d, d_mlp)
        state[b + "mlp.W_gate"] = take(h + "mlp.gate_proj.weight").T  # (d, d_mlp)
        state[b + "mlp.W_out"] = take(h + "mlp.down_proj.weight").T  # (d_mlp, d)
        state[b + "mlp.b_in"], state[b + "mlp.b_out"] = zeros(config.d_mlp), zeros(d)
    state["ln_final.w"] = take("model.norm.weight")
    state = {k: v.contiguous() for k, v in state.items()}
    # Untied: lm_head (V, d) transposed; tied: W_E's transposed view (as the GPT-2 branch, no copy per unembedding).
    state["unembed.W_U"] = (state["embed.W_E"] if config.tied else take("lm_head.weight").contiguous()).T  # (d, V)
    return state


class TransformerLensBackend(Backend):
    name: ClassVar[str] = "transformerlens"
    description: ClassVar[str] = ("TransformerLens' HookedTransformer (the fixture's GELU, unprocessed weights), "
                                  "taps from hooks")
    precisions: ClassVar[tuple[Precision, ...]] = ("fp32", "fp64")
    requires: ClassVar[tuple[str, ...]] = ("torch", "transformer_lens")
    install_hint: ClassVar[str] = "pip install 'parity-harness[transformerlens]'"
    streams: ClassVar[bool] = True
    concurrent: ClassVar[bool] = True  # changes nothing another backend computes with; it only silences output
    families: ClassVar[tuple[str, ...]] = ("gpt2", "llama")

    def run(self, fixture: Fixture, precision: Precision) -> BackendOutput:
        return dict(self.run_cases(fixture, precision))

    def run_cases(self, fixture: Fixture, precision: Precision) -> Iterator[tuple[str, dict[str, np.ndarray]]]:
        import torch

        config: Any = fixture.model.config  # the family's config (GPTConfig, LlamaConfig)
        weights = fixture.weights()
        fixture.release_weights()  # a GPT-2-sized fixture: only this dict holds the float32 copy now
        # Pops each array as it converts it. GPT-2 keeps the three-argument call (a test swaps in its own loader).
        model = (tl_model(weights, config, precision) if fixture.family == "gpt2"
                 else tl_model(weights, config, precision, fixture.family))
        wanted = self.supported_taps(fixture)
        hooks = set(wanted) - {"logits", "probs"} - {f"logit_lens.{k}" for k in range(config.n_layer + 1)}
        lens_rows = fixture.lens_rows()
        last = slice(None) if lens_rows is None else slice(-lens_rows, None)
        for case in fixture.cases:
            # Bad input is one clear line (a ParityError), never TransformerLens' IndexError.
            if not 1 <= len(case.tokens) <= config.n_ctx:
                raise FixtureError(f"case {case.name!r}: {len(case.tokens)} tokens, expected 1 to {config.n_ctx}")
            bad = [t for t in case.tokens if not 0 <= t < config.vocab_size]
            if bad:
                raise FixtureError(f"case {case.name!r}: token id {bad[0]} out of range [0, {config.vocab_size})")
            tokens = torch.tensor([list(case.tokens)], dtype=torch.int64)  # (1, T)
            with silenced(), torch.no_grad():
                logits, cache = model.run_with_cache(tokens, return_type="logits", names_filter=lambda n: n in hooks)
                taps: dict[str, torch.Tensor] = {name: cache[name][0] for name in hooks}  # batch axis dropped
                taps["logits"] = logits[0]  # (T, V)
                taps["probs"] = torch.softmax(logits[0, last], dim=-1)  # (rows, V)
                # The logit lens: each block's input, and the last block's output, through TL's ln_final, unembed.
                # Every stream's rows in one product: the (d, V) table is read once, not once per stream.
                streams = cache.accumulated_resid(incl_mid=False)[:, 0, last]  # (L + 1, rows, d)
                kept = streams.reshape(1, -1, streams.shape[-1])  # (1, (L + 1) * rows, d)
                lens = model.unembed(model.ln_final(kept))[0].reshape(streams.shape[0], streams.shape[1], -1)
                for k in range(config.n_layer + 1):
                    taps[f"logit_lens.{k}"] = torch.softmax(lens[k], dim=-1)  # (rows, V)
            yield case.name, {tap: taps[tap].detach().contiguous().numpy().copy() for tap in wanted}
